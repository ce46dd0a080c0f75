"""The tables and clip flags built on forked workers are the one-process ones, entry for entry."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from quantbench import calibrate as cal
from quantbench import calibrators as registry
from quantbench import parallel_tables as pt
from quantbench.stats import StatsFile, TensorStats

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux only")

METHODS = registry.expand_methods(["all"])


def _stats(tensors: int = 23) -> StatsFile:
    """Tensors of several shapes of distribution, one with NaN among finite values and one
    with no finite value (no table entry), so every branch of the tables is taken."""
    rng = np.random.default_rng(7)
    out = StatsFile("model-hash", "data-fingerprint", num_samples=64)
    for i in range(tensors):
        t = TensorStats(f"t{i}")
        kind = i % 4
        if kind == 0:
            x = rng.standard_normal(20_000)
        elif kind == 1:
            x = rng.standard_t(2, 20_000) * (i + 1)  # heavy tails: clip flags
        elif kind == 2:
            x = np.maximum(rng.standard_normal(20_000), 0)  # a Relu's output
        else:
            x = rng.uniform(-3, 5, 20_000)
        t.update(x.astype(np.float32))
        out.tensors[t.name] = t
    nan = TensorStats("with_nan")
    nan.update(np.array([1.0, np.nan, -2.5, 0.25], dtype=np.float32))
    never = TensorStats("never_finite")
    never.update(np.array([np.inf, np.nan], dtype=np.float32))
    out.tensors.update({nan.name: nan, never.name: never})
    return out


def _same(a: pt.TablesAndFlags, b: pt.TablesAndFlags) -> None:
    tables_a, flags_a = a
    tables_b, flags_b = b
    assert list(tables_a) == list(tables_b)
    for m in tables_a:
        assert tables_a[m].method == tables_b[m].method
        assert tables_a[m].algorithm == tables_b[m].algorithm
        assert tables_a[m].provenance == tables_b[m].provenance
        assert list(tables_a[m].entries.items()) == list(tables_b[m].entries.items())  # order too
    assert flags_a == flags_b


def test_forked_slices_join_to_the_one_process_tables():
    stats = _stats()
    alone = pt._built(stats, METHODS, 0.001)
    assert "never_finite" not in alone[0]["entropy"] and "with_nan" in alone[0]["entropy"]
    assert sum(len(f) for f in alone[1].values()) > 0  # the flags are compared, not empty lists
    for workers in (2, 3, 7):
        _same(pt._forked(stats, METHODS, 0.001, workers), alone)


def _die(index: int) -> None:
    os._exit(3)


def test_a_dead_worker_falls_back_to_this_process(monkeypatch):
    stats = _stats(12)
    monkeypatch.setattr(pt, "worker_count", lambda tensors, methods: 3)
    monkeypatch.setattr(pt, "_slice_job", _die)  # the forked workers inherit the patch
    _same(pt.tables_and_flags(stats, METHODS, 0.001), pt._built(stats, METHODS, 0.001))


def test_worker_count_follows_the_work_and_the_cores(monkeypatch):
    monkeypatch.delenv("QUANTBENCH_WORKER", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert pt.worker_count(123, 7) == pt.MAX_WORKERS  # ResNet-50's tables: 861 units
    assert pt.worker_count(10, 7) == 1  # a small model: one process is quicker than a fork
    assert pt.worker_count(31, 7) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert pt.worker_count(123, 7) == 2
    monkeypatch.setenv("QUANTBENCH_WORKER", "1")  # a worker of a process pool: cores are shared
    assert pt.worker_count(123, 7) == 1


def test_calibrate_all_methods_through_forked_workers_matches_one_process(
    cnn_path, cnn_data, monkeypatch
):
    monkeypatch.delenv("QUANTBENCH_WORKER", raising=False)
    serial = cal.calibrate(cnn_path, cnn_data, methods=["all"], show_progress=False)
    forks = []
    real = pt._forked
    monkeypatch.setattr(pt, "worker_count", lambda tensors, methods: 3)
    monkeypatch.setattr(pt, "_forked", lambda *a: forks.append(a[-1]) or real(*a))
    forked = cal.calibrate(cnn_path, cnn_data, methods=["all"], show_progress=False)
    assert forks == [3] and forked.from_cache
    assert list(forked.tables) == list(serial.tables) == METHODS
    _same((forked.tables, forked.clipping), (serial.tables, serial.clipping))
