"""Executors run the same tasks to the same results, in item order, and fail in one line."""

from __future__ import annotations

import os

import pytest

from quantbench.collect.executors import ExecutorSpec, TaskFailed, run_tasks
from quantbench.errors import QuantbenchError


def square_plus(shared: int, item: int) -> int:
    return item * item + shared


def always_fails(shared: object, item: int) -> int:
    raise RuntimeError(f"boom {item}")


def fails_once(shared: str, item: int) -> int:
    """Fails the first time it sees an item (a marker file per item), succeeds the second."""
    marker = os.path.join(shared, f"seen-{item}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("transient")
    return item


def dies_once(shared: str, item: int) -> int:
    """Kills its worker process the first time (a worker that dies), succeeds on the retry."""
    marker = os.path.join(shared, f"died-{item}")
    if item == 3 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return item


def item_3_always_dies(shared: object, item: int) -> int:
    """Kills its worker process every time for item 3 (the others are lost with it once)."""
    if item == 3:
        os._exit(1)
    return item


def user_error(shared: object, item: int) -> int:
    raise QuantbenchError(f"data.npz[x]: bad sample {item}")


@pytest.mark.parametrize("kind", ["local", "processes"])
def test_results_in_item_order(kind: str) -> None:
    spec = ExecutorSpec(kind, workers=2)
    got = run_tasks(spec, square_plus, list(range(7)), shared=10, show_progress=False)
    assert got == [10, 11, 14, 19, 26, 35, 46]


@pytest.mark.parametrize("kind", ["local", "processes"])
def test_a_transient_failure_is_retried(kind: str, tmp_path) -> None:
    spec = ExecutorSpec(kind, workers=2)
    assert run_tasks(spec, fails_once, [1, 2], shared=str(tmp_path), show_progress=False) == [1, 2]


def test_a_dead_worker_is_retried(tmp_path) -> None:
    spec = ExecutorSpec("processes", workers=2)
    got = run_tasks(spec, dies_once, [1, 2, 3, 4], shared=str(tmp_path), show_progress=False)
    assert got == [1, 2, 3, 4]


def test_a_worker_that_dies_twice_names_its_own_item() -> None:
    """The first death takes every unfinished task down with the pool; the retries run apart,
    so the second death names item 3, not a task that was only lost with it."""
    spec = ExecutorSpec("processes", workers=2)
    with pytest.raises(TaskFailed) as err:
        run_tasks(
            spec,
            item_3_always_dies,
            [1, 2, 3, 4, 5],
            describe=lambda i: f"shard {i}",
            show_progress=False,
        )
    assert str(err.value) == "shard 3 failed twice: its worker process died"


@pytest.mark.parametrize("kind", ["local", "processes"])
def test_failing_twice_is_one_line_naming_the_item(kind: str) -> None:
    spec = ExecutorSpec(kind, workers=2)
    with pytest.raises(TaskFailed, match=r"^shard 5 failed twice: RuntimeError: boom 5$"):
        run_tasks(spec, always_fails, [5], describe=lambda i: f"shard {i}", show_progress=False)


def test_user_errors_keep_their_message() -> None:
    with pytest.raises(QuantbenchError, match=r"^data.npz\[x\]: bad sample 0$"):
        run_tasks(ExecutorSpec("processes", workers=1), user_error, [0], show_progress=False)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ExecutorSpec("cluster"), "--executor 'cluster': use one of local, processes, ray"),
        (ExecutorSpec("local", workers=0), "--workers 0: give at least 1 worker"),
        (ExecutorSpec("local", ray_address="auto"), "--ray-address needs --executor ray"),
    ],
)
def test_bad_options_are_refused_before_work(spec: ExecutorSpec, message: str) -> None:
    with pytest.raises(QuantbenchError) as err:
        run_tasks(spec, square_plus, [1], shared=0, show_progress=False)
    assert str(err.value) == message
