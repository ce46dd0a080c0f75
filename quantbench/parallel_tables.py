"""Every method's table and clip check of a finished statistics pass, on forked workers.

After inference the host's cores are idle, yet ``--method all``'s seven tables of a large model
cost a few tenths of a second on one of them (ResNet-50: 123 tensors, 0.3-0.4 s, GIL-bound
NumPy on 2,048-bin histograms, so threads do not help). Every calibrator's amax depends on its
own tensor alone (a vectorised twin gives exactly the one-at-a-time amax, by the registry's
contract), and so does a tensor's clip flag, so the tensors are cut into contiguous slices and
each slice's tables and flags are built in a worker forked from this process: the statistics
are inherited, not sent, and only the amaxes and flags come back. Joined in slice order they
are the one-process tables and flags, entry for entry (tested).

Fork, not spawn: a forked child needs no start-up imports and no copy of the statistics, and
it never runs a user's ``__main__`` again; it touches no GPU or onnxruntime state (the tables
are NumPy), which is what makes forking a process that holds them safe. Where fork is not
available, a worker dies or the work is small, the tables are built here, as before.
"""

from __future__ import annotations

import gc
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

from quantbench.clipguard import ClipFlag, clip_flags
from quantbench.stats import StatsFile, settled
from quantbench.table import CalibrationTable, TableEntry
from quantbench.table.build import build_table

#: tensors x methods per worker: below about this much (~0.1 s of tables) a fork does not pay
WORK_PER_WORKER = 100
MAX_WORKERS = 8

TablesAndFlags = tuple[dict[str, CalibrationTable], dict[str, list[ClipFlag]]]
#: one slice's table entries and clip flags, by method
SliceResult = tuple[dict[str, dict[str, TableEntry]], dict[str, list[ClipFlag]]]

#: what forked workers read: (statistics, methods, clip limit, slices), set only around a fork
_JOB: tuple[StatsFile, list[str], float, list[list[str]]] | None = None


def tables_and_flags(stats: StatsFile, methods: list[str], clip_warn: float) -> TablesAndFlags:
    """Each of ``methods``' table of ``stats`` and the tensors each table clips beyond
    ``clip_warn`` (:func:`~quantbench.clipguard.clip_flags`, knowing the other tables)."""
    workers = worker_count(len(stats), len(methods))
    if workers > 1:
        try:
            return _forked(stats, methods, clip_warn, workers)
        except (BrokenProcessPool, OSError):  # a worker died or fork was refused: build here
            pass
    return _built(stats, methods, clip_warn)


def worker_count(tensors: int, methods: int) -> int:
    """How many workers the tables of ``tensors`` x ``methods`` pay for on this machine (1:
    build them here)."""
    if not sys.platform.startswith("linux") or os.environ.get("QUANTBENCH_WORKER"):
        return 1  # fork is only safe enough on Linux; a worker of a pool already shares cores
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - Linux has it
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS, tensors, tensors * methods // WORK_PER_WORKER))


def _built(stats: StatsFile, methods: list[str], clip_warn: float) -> TablesAndFlags:
    with settled():  # every table and the clip check read each tensor's histograms once
        tables = {m: build_table(stats, m) for m in methods}
        flags = {m: clip_flags(stats, t, clip_warn, known=tables) for m, t in tables.items()}
    return tables, flags


def _slices(names: list[str], parts: int) -> list[list[str]]:
    size = math.ceil(len(names) / parts)
    return [names[i : i + size] for i in range(0, len(names), size)]


def _forked(stats: StatsFile, methods: list[str], clip_warn: float, workers: int) -> TablesAndFlags:
    import multiprocessing

    global _JOB
    slices = _slices(list(stats.tensors), workers)
    _JOB = (stats, methods, clip_warn, slices)
    # frozen, the objects the workers inherit are never collected there: no GPU array's
    # destructor runs in a child, and the collector does not copy the parent's pages
    gc.freeze()
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(len(slices), context) as pool:
            parts = list(pool.map(_slice_job, range(len(slices))))
    finally:
        _JOB = None
        gc.unfreeze()
    return _joined(stats, methods, parts)


def _slice_job(index: int) -> SliceResult:
    """In a worker: one slice's amaxes and clip flags, by method."""
    assert _JOB is not None, "a table worker runs only inside tables_and_flags"
    stats, methods, clip_warn, slices = _JOB
    part = replace(stats, tensors={name: stats.tensors[name] for name in slices[index]})
    tables, flags = _built(part, methods, clip_warn)
    return {m: t.entries for m, t in tables.items()}, flags


def _joined(
    stats: StatsFile,
    methods: list[str],
    parts: list[SliceResult],
) -> TablesAndFlags:
    header = replace(stats, tensors={})
    tables = {m: build_table(header, m) for m in methods}  # method, algorithm, provenance
    flags: dict[str, list[ClipFlag]] = {m: [] for m in methods}
    for entries, part_flags in parts:
        for m in methods:
            tables[m].entries.update(entries[m])
            flags[m] += part_flags[m]
    return tables, flags
