"""Tables built by worker processes are the one-process tables, entry for entry; a worker that
is cold, dead or not needed costs nothing but speed."""

from __future__ import annotations

import select

import numpy as np
import pytest

from quantbench import calibrate as cal
from quantbench import calibrators as registry
from quantbench import tableworkers as tw
from quantbench.stats import StatsFile, TensorStats

METHODS = registry.expand_methods(["all"])
WARM_TIMEOUT_S = 60


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


def _same(a: tw.TablesAndFlags, b: tw.TablesAndFlags) -> None:
    tables_a, flags_a = a
    tables_b, flags_b = b
    assert list(tables_a) == list(tables_b)
    for m in tables_a:
        assert tables_a[m].method == tables_b[m].method
        assert tables_a[m].algorithm == tables_b[m].algorithm
        assert tables_a[m].provenance == tables_b[m].provenance
        assert list(tables_a[m].entries.items()) == list(tables_b[m].entries.items())  # order too
    assert flags_a == flags_b


def _wait_until_warm(workers: tw.TableWorkers) -> None:
    pipes = [p.stdout for p in workers.processes]
    pending = set(pipes)
    while pending:
        readable, _, _ = select.select(list(pending), [], [], WARM_TIMEOUT_S)
        assert readable, "the table workers did not warm up"
        pending -= set(readable)


@pytest.fixture()
def three_workers(monkeypatch):
    monkeypatch.setattr(tw, "worker_count", lambda tensors, methods: 3)


def _spy_on_workers(monkeypatch) -> list[bool]:
    used = []
    real = tw.TableWorkers._built_by_workers
    monkeypatch.setattr(
        tw.TableWorkers,
        "_built_by_workers",
        lambda self, *a: used.append(True) or real(self, *a),
    )
    return used


def test_workers_slices_join_to_the_one_process_tables(three_workers, monkeypatch):
    stats = _stats()
    here = tw.build_here(stats, METHODS, 0.001)
    assert "never_finite" not in here[0]["entropy"] and "with_nan" in here[0]["entropy"]
    assert sum(len(f) for f in here[1].values()) > 0  # the flags are compared, not empty lists
    used = _spy_on_workers(monkeypatch)
    with tw.TableWorkers(METHODS, len(stats)) as workers:
        workers.start()
        assert len(workers.processes) == 3
        _wait_until_warm(workers)
        built = workers._built_by_workers(stats, 0.001)
        assert built is not None and used == [True]
        _same(built, here)
        assert [p.wait(timeout=WARM_TIMEOUT_S) for p in workers.processes] == [0, 0, 0]


def test_a_dead_worker_costs_only_speed(three_workers):
    stats = _stats(12)
    with tw.TableWorkers(METHODS, len(stats)) as workers:
        workers.start()
        _wait_until_warm(workers)
        workers.processes[1].kill()
        workers.processes[1].wait()
        assert workers._built_by_workers(stats, 0.001) is None
        _same(workers.tables(stats, 0.001), tw.build_here(stats, METHODS, 0.001))
        assert workers.processes == []  # closed


def test_cold_workers_are_not_waited_for(three_workers, monkeypatch):
    stats = _stats(12)
    monkeypatch.setattr(tw.TableWorkers, "_ready", lambda self: False)  # still importing
    with tw.TableWorkers(METHODS, len(stats)) as workers:
        workers.start()
        processes = list(workers.processes)
        _same(workers.tables(stats, 0.001), tw.build_here(stats, METHODS, 0.001))
    assert all(p.poll() is not None for p in processes)  # killed, not left behind


def test_workers_start_only_where_they_pay(monkeypatch):
    assert tw.worker_count(123, 7, cores=16) == tw.MAX_WORKERS  # ResNet-50: 861 units
    assert tw.worker_count(123, 7, cores=4) == 3  # one core left to this process
    assert tw.worker_count(31, 7, cores=16) == 2
    assert tw.worker_count(10, 7, cores=16) == 1  # a small model: one process is quicker
    assert tw.worker_count(123, 7, cores=2) == 1
    monkeypatch.setattr(tw, "worker_count", lambda tensors, methods: 3)
    registry.register("my_local", "a caller's own calibrator")(lambda stats, opt: 1.0)
    try:
        assert not tw.portable("my_local") and tw.portable("entropy:pytorch")
        with tw.TableWorkers(["entropy", "my_local"], 200) as workers:
            workers.start()  # a fresh process would not know my_local
            assert workers.processes == []
    finally:
        registry._REGISTRY.pop("my_local")


def test_calibrate_on_a_gpu_provider_builds_its_tables_in_workers(
    cnn_path, cnn_data, three_workers, monkeypatch
):
    serial = cal.calibrate(cnn_path, cnn_data, methods=["all"], show_progress=False)
    used = _spy_on_workers(monkeypatch)
    monkeypatch.setattr(cal, "_host_idle_during_inference", lambda provider, executor: True)
    monkeypatch.setattr(tw.TableWorkers, "start", _started_and_warm(tw.TableWorkers.start))
    workers = cal.calibrate(
        cnn_path, cnn_data, methods=["all"], use_cache=False, show_progress=False
    )
    assert used == [True]
    assert list(workers.tables) == list(serial.tables) == METHODS
    _same((workers.tables, workers.clipping), (serial.tables, serial.clipping))


def _started_and_warm(start):  # noqa: ANN001, ANN202 - test helper wrapping a method
    def started(self: tw.TableWorkers) -> None:
        start(self)
        _wait_until_warm(self)  # the example's pass is shorter than the workers' start-up

    return started
