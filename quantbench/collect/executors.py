"""Where independent pieces of work run: here, in worker processes, or on a Ray cluster.

Calibration shards and candidate evaluations are independent and their results merge exactly,
so one small interface serves both: ``executor.map(fn, items, shared=...)`` calls
``fn(shared, item)`` for every item and returns the results in item order, whatever order they
finished in. ``shared`` (the model bytes, the FP32 reference outputs) crosses to the workers once:
Ray puts it in the object store, worker processes receive it when they start.

A task whose worker dies, or that raises, is run once more; a second failure fails the command
in one line naming the item (``describe(item)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from quantbench.errors import QuantbenchError, first_line
from quantbench.progress import progress_bar

EXECUTORS = ("local", "processes", "ray")
#: attempts per task: the first run and one retry
ATTEMPTS = 2

Item = TypeVar("Item")
Result = TypeVar("Result")
TaskFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class ExecutorSpec:
    """What the user asked for: ``--executor``, ``--workers``, ``--ray-address``."""

    kind: str = "local"
    workers: int | None = None
    ray_address: str | None = None

    def validate(self) -> ExecutorSpec:
        """Check the options before any work starts (one-line errors)."""
        if self.kind not in EXECUTORS:
            raise QuantbenchError(f"--executor {self.kind!r}: use one of {', '.join(EXECUTORS)}")
        if self.workers is not None and self.workers < 1:
            raise QuantbenchError(f"--workers {self.workers}: give at least 1 worker")
        if self.ray_address and self.kind != "ray":
            raise QuantbenchError("--ray-address needs --executor ray")
        if self.kind == "ray":
            _import_ray()
        return self

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


class TaskFailed(QuantbenchError):
    """A task failed on every attempt (one line, naming it)."""


def run_tasks(
    spec: ExecutorSpec,
    fn: TaskFn,
    items: Sequence[Item],
    *,
    shared: Any = None,
    describe: Callable[[Item], str] = str,
    description: str = "Working",
    show_progress: bool = True,
) -> list[Any]:
    """``[fn(shared, item) for item in items]`` on the executor ``spec`` names, in item order."""
    spec.validate()
    if not items:
        return []
    runner = {"local": _run_local, "processes": _run_processes, "ray": _run_ray}[spec.kind]
    with progress_bar(description, total=len(items), show=show_progress, unit="tasks") as advance:
        return runner(spec, fn, list(items), shared, describe, advance)


def default_workers(spec: ExecutorSpec) -> int:
    if spec.workers:
        return spec.workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def width(spec: ExecutorSpec) -> int:
    """How many tasks run at once: 1 here, the workers of this machine, or the Ray cluster's
    CPUs (``--workers`` caps both). Work is cut into this many pieces (calibration shards)."""
    if spec.kind == "local":
        return 1
    if spec.kind == "processes":
        return default_workers(spec)
    if spec.workers:
        return spec.workers
    ray = _ensure_ray(spec)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def task_threads(spec: ExecutorSpec) -> int | None:
    """onnxruntime intra-op threads for one task: all cores here (``None``: onnxruntime's
    default), this machine's cores shared by the workers, or the one CPU a Ray task holds."""
    if spec.kind == "local":
        return None
    if spec.kind == "ray":
        return 1
    return max(1, default_workers(ExecutorSpec()) // default_workers(spec))


def _failure(item_text: str, exc: BaseException) -> QuantbenchError:
    if isinstance(exc, QuantbenchError):  # a user mistake: the same on every attempt
        return exc
    if isinstance(exc, BrokenProcessPool):
        return TaskFailed(f"{item_text} failed twice: its worker process died")
    return TaskFailed(f"{item_text} failed twice: {type(exc).__name__}: {first_line(exc)}")


# --------------------------------------------------------------------------- local


def _run_local(spec, fn, items, shared, describe, advance) -> list[Any]:  # noqa: ANN001
    results = []
    for item in items:
        for attempt in range(ATTEMPTS):
            try:
                results.append(fn(shared, item))
                break
            except QuantbenchError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried once, then reported
                if attempt == ATTEMPTS - 1:
                    raise _failure(describe(item), exc) from exc
        advance(1)
    return results


# --------------------------------------------------------------------------- processes

_WORKER_SHARED: Any = None


def _init_worker(shared: Any) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = shared
    # a worker is one of several: onnxruntime and the binning threads share the machine's cores
    os.environ.setdefault("QUANTBENCH_WORKER", "1")


def _call_in_worker(fn: TaskFn, item: Any) -> Any:
    return fn(_WORKER_SHARED, item)


def _run_processes(spec, fn, items, shared, describe, advance) -> list[Any]:  # noqa: ANN001
    """One pool for every task; the tasks that failed (or were lost with a worker that died)
    run once more, each in a pool of its own, so a second death names its own task."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # onnxruntime's threads do not survive fork
    workers = min(default_workers(spec), len(items))
    results: dict[int, Any] = {}
    with ProcessPoolExecutor(workers, context, _init_worker, (shared,)) as pool:
        futures = {pool.submit(_call_in_worker, fn, item): i for i, item in enumerate(items)}
        for future in as_completed(futures):
            try:
                results[futures[future]] = future.result()
                advance(1)
            except QuantbenchError:
                for other in futures:
                    other.cancel()
                raise
            except Exception:  # noqa: BLE001 - retried below (a dead worker: BrokenProcessPool)
                pass
    retry = [i for i in range(len(items)) if i not in results]
    running: dict[Future, tuple[int, ProcessPoolExecutor]] = {}
    try:
        while retry or running:
            while retry and len(running) < workers:
                i = retry.pop(0)
                alone = ProcessPoolExecutor(1, context, _init_worker, (shared,))
                running[alone.submit(_call_in_worker, fn, items[i])] = (i, alone)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i, alone = running.pop(future)
                alone.shutdown(wait=False)
                try:
                    results[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - the second failure: one line
                    raise _failure(describe(items[i]), exc) from None
                advance(1)
    finally:
        for _, alone in running.values():
            alone.shutdown(wait=False, cancel_futures=True)
    return [results[i] for i in range(len(items))]


# --------------------------------------------------------------------------- ray


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise QuantbenchError("--executor ray needs Ray: pip install 'quantbench[ray]'") from None
    return ray


def _ensure_ray(spec: ExecutorSpec) -> Any:
    """Connect to ``--ray-address`` (or ``RAY_ADDRESS``), else start a local Ray for the run."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    address = spec.ray_address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {
        "address": address,
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": "ERROR",
        "configure_logging": True,
    }
    if address is None and spec.workers:
        kwargs["num_cpus"] = spec.workers
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        where = address or "a local Ray"
        raise QuantbenchError(f"Ray at {where}: cannot connect ({first_line(exc)})") from None
    return ray


def _run_ray(spec, fn, items, shared, describe, advance) -> list[Any]:  # noqa: ANN001
    ray = _ensure_ray(spec)
    shared_ref = ray.put(shared)
    remote = ray.remote(fn).options(max_retries=ATTEMPTS - 1, retry_exceptions=True)
    refs = {remote.remote(shared_ref, item): i for i, item in enumerate(items)}
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            i = refs[ref]
            try:
                results[i] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - Ray wraps the task's exception
                cause = getattr(exc, "cause", None) or exc
                for other in pending:
                    ray.cancel(other)
                raise _failure(describe(items[i]), cause) from None
            advance(1)
    return [results[i] for i in range(len(items))]
