"""The tables of a GPU pass on the host's idle cores: worker processes started beside inference.

With a GPU provider the host's cores wait while the GPU infers, then ``--method all``'s seven
tables and the clip check of a large model cost a few tenths of a second on one of them
(ResNet-50: 123 tensors, 0.35-0.44 s on the H200's host, GIL-bound NumPy on 2,048-bin
histograms, so threads do not help). Every calibrator's amax depends on its own tensor alone (a
vectorised twin gives exactly the one-at-a-time amax, by the registry's contract), and so does a
tensor's clip flag; so fresh Python processes, started when the pass starts and warmed up
(imports, SciPy, mse's step matrix) while the GPU works, each build the tables and flags of a
contiguous slice of the tensors, and the slices joined in order are the one-process tables and
flags, entry for entry (tested).

Fresh processes (``python -m quantbench.tableworkers``), not forks: a fork of the process that
holds the GPU context and onnxruntime made the same tables slower, not faster (measured on the
H200: 0.52-1.07 s), and fresh workers never run a user's ``__main__`` again, as
multiprocessing's spawn would. A worker that cannot start, dies or answers wrongly costs only
speed: the tables are then built here. The protocol is pickles over the worker's stdin/stdout.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import struct
import subprocess
import sys
from dataclasses import replace
from typing import IO, Any

from quantbench import calibrators as registry
from quantbench.clipguard import ClipFlag, clip_flags
from quantbench.stats import StatsFile, settled
from quantbench.table import CalibrationTable, TableEntry
from quantbench.table.build import build_table

#: tensors x methods per worker: below about this much (~0.1 s of tables) a worker does not pay
WORK_PER_WORKER = 100
MAX_WORKERS = 8

TablesAndFlags = tuple[dict[str, CalibrationTable], dict[str, list[ClipFlag]]]
#: one slice's table entries and clip flags, by method
SliceResult = tuple[dict[str, dict[str, TableEntry]], dict[str, list[ClipFlag]]]
_LENGTH = struct.Struct("<Q")
#: what a worker writes once warm
READY = b"R"


def build_here(stats: StatsFile, methods: list[str], clip_warn: float) -> TablesAndFlags:
    """Each method's table of ``stats`` and the tensors it clips beyond ``clip_warn``
    (:func:`~quantbench.clipguard.clip_flags`, knowing the other tables), in this process."""
    with settled():  # every table and the clip check read each tensor's histograms once
        tables = {m: build_table(stats, m) for m in methods}
        flags = {m: clip_flags(stats, t, clip_warn, known=tables) for m, t in tables.items()}
    return tables, flags


def portable(method: str) -> bool:
    """Whether a fresh process has ``method`` too: a built-in calibrator (one registered by a
    caller's own code exists only in this process)."""
    spec, _ = registry.parse_method(method)
    return spec.fn.__module__.startswith(f"{registry.__name__}.")


def worker_count(tensors: int, methods: int, cores: int | None = None) -> int:
    """How many workers the tables of ``tensors`` x ``methods`` pay for (1: build them here),
    leaving one core to this process."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
    return max(1, min(cores - 1, MAX_WORKERS, tensors, tensors * methods // WORK_PER_WORKER))


class TableWorkers:
    """Worker processes for ``methods``' tables of ``tensors`` tensors: none until
    :meth:`start` (when inference starts), all gone when the ``with`` block ends."""

    def __init__(self, methods: list[str], tensors: int):
        self.methods = methods
        self.tensors = tensors
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> TableWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Starts the workers now, so that they warm up while this process infers, where they
        pay: enough tensors x methods, spare cores, and only built-in calibrators."""
        if self.processes or not self.methods or not all(portable(m) for m in self.methods):
            return
        count = worker_count(self.tensors, len(self.methods))
        if count < 2:
            return
        # the worker imports this quantbench, wherever this process found it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-m", "quantbench.tableworkers", *self.methods]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        try:
            for _ in range(count):
                self.processes.append(
                    subprocess.Popen(command, **pipes, stderr=subprocess.DEVNULL, env=env)
                )
        except OSError:  # no interpreter to start: the tables are built here
            self.close()

    def tables(self, stats: StatsFile, clip_warn: float) -> TablesAndFlags:
        """:func:`build_here`'s tables and flags, built by the workers where they are warm (a
        pass shorter than their start-up is not waited for) and all answered, else here."""
        built = self._built_by_workers(stats, clip_warn) if self.processes else None
        self.close()
        return built or build_here(stats, self.methods, clip_warn)

    def _built_by_workers(self, stats: StatsFile, clip_warn: float) -> TablesAndFlags | None:
        try:
            if not self._ready():
                return None
            slices = _slices(list(stats.tensors), len(self.processes))
            for process, names in zip(self.processes, slices, strict=False):
                part = replace(stats, tensors={n: stats.tensors[n] for n in names})
                _send(process.stdin, (part, clip_warn))
            parts = [_receive(p.stdout) for p in self.processes[: len(slices)]]
        except (OSError, EOFError, pickle.UnpicklingError, struct.error):
            return None
        return _joined(stats, self.methods, parts)

    def _ready(self) -> bool:
        """Whether every worker said it is warm (one byte, once), not waiting for any."""
        pipes = [p.stdout for p in self.processes]
        readable, _, _ = select.select(pipes, [], [], 0)
        return len(readable) == len(pipes) and all(p.read(1) == READY for p in pipes)

    def close(self) -> None:
        """Stops every worker still running (idempotent)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()
        self.processes = []


def _slices(names: list[str], parts: int) -> list[list[str]]:
    size = math.ceil(len(names) / parts) if names else 1
    return [names[i : i + size] for i in range(0, len(names), size)]


def _joined(stats: StatsFile, methods: list[str], parts: list[SliceResult]) -> TablesAndFlags:
    header = replace(stats, tensors={})
    tables = {m: build_table(header, m) for m in methods}  # method, algorithm, provenance
    flags: dict[str, list[ClipFlag]] = {m: [] for m in methods}
    for entries, part_flags in parts:
        for m in methods:
            tables[m].entries.update(entries[m])
            flags[m] += part_flags[m]
    return tables, flags


def _send(pipe: IO[bytes] | None, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    assert pipe is not None
    pipe.write(_LENGTH.pack(len(data)) + data)
    pipe.flush()


def _receive(pipe: IO[bytes] | None) -> Any:
    assert pipe is not None
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("table worker ended early")
    (length,) = _LENGTH.unpack(head)
    data = pipe.read(length)
    if len(data) < length:
        raise EOFError("table worker ended early")
    return pickle.loads(data)  # noqa: S301 - our own child's answer


def _serve(methods: list[str]) -> None:
    """The worker: warm ``methods`` up, say so, then build the tables of the one slice it is
    sent. The answers go to the original stdout alone: whatever a library prints goes to
    stderr instead of into the protocol."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    registry.warm_up(methods)
    answers.write(READY)
    answers.flush()
    part, clip_warn = _receive(sys.stdin.buffer)
    tables, flags = build_here(part, methods, clip_warn)
    _send(answers, ({m: t.entries for m, t in tables.items()}, flags))


if __name__ == "__main__":
    _serve(sys.argv[1:])
