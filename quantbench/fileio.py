"""Atomic output files: write to a temporary file beside the target, then rename.

A crash or Ctrl-C never leaves a half-written table, model or report behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from quantbench.errors import QuantbenchError

#: every file this process has put in place, in order (what an interrupted run did write)
_WRITTEN: list[Path] = []


def written_files() -> list[Path]:
    """The files written so far by this process (an interrupt's message names them)."""
    return list(_WRITTEN)


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Fail early, before any work, when the output's folder does not exist."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise QuantbenchError(
            f"{target}: output folder {parent} does not exist; create it or choose another path"
        )
    if target.is_dir():
        raise QuantbenchError(f"{target}: is a folder; give a file name")
    return target


def check_not_an_input(output: str | os.PathLike[str] | None, *inputs: object) -> None:
    """Fail early when ``output`` is one of this command's own input files (``-o`` or
    ``--save-stats`` naming the model, the data, a table...): writing it would destroy the
    input. ``inputs`` may hold anything a command takes; only existing files are compared."""
    if output is None or not Path(output).is_file():
        return
    for given in inputs:
        file = isinstance(given, (str, os.PathLike)) and Path(given).is_file()
        if file and os.path.samefile(output, given):  # type: ignore[arg-type]
            raise QuantbenchError(
                f"{output}: is also an input of this command ({given}); writing it would "
                "destroy that input: choose another output path"
            )


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` on success."""
    target = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are shared files
        os.replace(tmp_path, target)
        _WRITTEN.append(target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))
