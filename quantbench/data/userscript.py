"""Importing the user's own Python files (data loaders, metric scripts) with one-line errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from quantbench.errors import QuantbenchError, first_line


def load_user_object(path: Path, name: str, what: str) -> Any:
    """``name`` from the Python file ``path`` (``what`` names the file's role in messages, e.g.
    "data-loader script"); a missing file, a failing import or a missing name is one line."""
    module = _import(path, what)
    target = getattr(module, name, None)
    if target is None:
        raise QuantbenchError(f"{path}: defines no {name!r} (use {path}:NAME)")
    return target


def _import(path: Path, what: str) -> ModuleType:
    if not path.is_file():
        raise QuantbenchError(f"{path}: {what} not found")
    tag = "".join(c if c.isalnum() else "_" for c in what)
    spec = importlib.util.spec_from_file_location(f"quantbench_{tag}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise QuantbenchError(f"{path}: cannot import the {what} (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's script failed
        raise QuantbenchError(
            f"{path}: {what} failed on import: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    return module
