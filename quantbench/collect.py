"""One streaming onnxruntime pass that turns calibration data into a :class:`StatsFile`.

The tensors to calibrate are exposed as extra graph outputs; each batch updates their
:class:`TensorStats` and is then dropped, so memory is bounded by one batch of activations plus
the fixed-size histograms. Histogram updates of batch *k* run in a worker thread while
onnxruntime computes batch *k+1* (both release the GIL for most of their work).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from quantbench import __version__
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.data import Batch, DataSource, Feed, StreamFingerprint, feed_num_samples
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph, TensorSpec
from quantbench.progress import progress_bar
from quantbench.stats import StatsFile, TensorStats


def stats_cache_dir() -> Path:
    """Where statistics are kept between runs (``$QUANTBENCH_CACHE`` or ~/.cache/quantbench)."""
    root = os.environ.get("QUANTBENCH_CACHE") or Path.home() / ".cache" / "quantbench"
    return Path(root) / "stats"


def cached_stats_path(model_hash: str, data_fingerprint: str, tensors_mode: str) -> Path:
    return stats_cache_dir() / f"{model_hash[:16]}-{data_fingerprint[:16]}-{tensors_mode}.stats.npz"


def find_cached_stats(
    model_hash: str, data_fingerprint: str | None, tensors_mode: str
) -> Path | None:
    """A cached statistics file covering ``tensors_mode`` (``all`` covers ``quantizable``)."""
    if not data_fingerprint:
        return None
    modes = [tensors_mode] + (["all"] if tensors_mode != "all" else [])
    for mode in modes:
        p = cached_stats_path(model_hash, data_fingerprint, mode)
        if p.is_file():
            return p
    return None


def collect_stats(
    graph: Graph,
    source: DataSource,
    tensors: list[str],
    *,
    provider: str | None = None,
    threads: int | None = None,
    binning_threads: int | None = None,
    show_progress: bool = True,
) -> StatsFile:
    """Run the data through the model once and return statistics of ``tensors``.

    ``binning_threads`` (default: the usable cores) bin different tensors at once; each tensor
    is binned by one task at a time, so the statistics do not depend on the thread count.
    """
    input_names = {s.name for s in graph.inputs}
    plan = derivation_plan(graph, tensors)
    measured = [t for t in tensors if t not in plan]
    from_feed = [t for t in measured if t in input_names]
    from_outputs = [t for t in measured if t not in input_names]
    runner = OnnxRuntimeRunner(
        expose(graph.model, from_outputs, graph.elem_types),
        provider,
        threads,
        spin=False,
        generated_from=graph.model,
    )
    stats = {name: TensorStats(name) for name in tensors}
    binner = _Binner(stats, [(t, src) for t, (kind, src) in plan.items() if kind == "relu"])
    fingerprint = None if source.fingerprint else StreamFingerprint()
    num_samples = 0
    with (
        progress_bar("Calibrating", total=source.num_samples, show=show_progress) as advance,
        _stats_workers(binning_threads) as pool,
    ):
        pending: list[Future[None]] = []
        measured = [0]  # bytes of exposed activations per sample, after the first run
        for feed in _nonempty(source.batches(), source):
            if fingerprint is not None:
                fingerprint.update(feed)
            for part in _parts(feed, graph.inputs, lambda: measured[0]):
                outputs = runner.infer(part, from_outputs) if from_outputs else {}
                n = feed_num_samples(part, graph.inputs)
                if not measured[0]:
                    measured[0] = max(1, -(-sum(a.nbytes for a in outputs.values()) // n))
                _wait(pending)  # part k is binned while onnxruntime computes part k+1
                values = {**{t: part[t] for t in from_feed}, **outputs}
                pending = binner.submit(pool, values)
                num_samples += n
                advance(n)
        _wait(pending)
        _wait(binner.submit_flush(pool))
    for name, (kind, src) in plan.items():
        if kind == "same":
            stats[name] = stats[src].renamed(name)
    return StatsFile(
        model_hash=graph.hash,
        data_fingerprint=source.fingerprint or (fingerprint.hexdigest() if fingerprint else ""),
        num_samples=num_samples,
        tensors=stats,
        tool_version=__version__,
        model_path=str(graph.path or ""),
    )


#: exposed activations one inference may return: a larger batch of a dynamic-batch model is
#: run in parts (binning is exact and order-independent, so the bins do not change), which keeps
#: peak memory near two parts whatever --batch-size asks for.
ACTIVATION_BUDGET = 128 << 20


def _parts(feed: Feed, inputs: list[TensorSpec], per_sample: Callable[[], int]) -> Iterator[Feed]:
    """``feed`` cut along its batch axis into parts of at most :data:`ACTIVATION_BUDGET` of
    exposed activations (``per_sample()`` bytes each, measured on a first one-sample part), or
    whole when it cannot be cut (a fixed batch, one sample, no batch axis)."""
    n = feed_num_samples(feed, inputs)
    dynamic = all(spec.shape and not isinstance(spec.shape[0], int) for spec in inputs)
    if n <= 1 or not dynamic or any(np.shape(a)[:1] != (n,) for a in feed.values()):
        yield feed
        return
    start = 0
    while start < n:
        known = per_sample()
        stop = min(n, start + (max(1, ACTIVATION_BUDGET // known) if known else 1))
        yield Batch({k: v[start:stop] for k, v in feed.items()}, stop - start)
        start = stop


#: ops whose output holds exactly the input's values (rearranged): same statistics.
VALUE_PRESERVING = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")


def derivation_plan(graph: Graph, tensors: list[str]) -> dict[str, tuple[str, str]]:
    """Tensors whose statistics follow from another calibrated tensor without reading them.

    ``("same", src)``: a value-preserving op of ``src``; ``("relu", src)``: ``Relu(src)``,
    binned from ``src``'s bins. Neither needs onnxruntime to output the tensor, which saves
    both the copy and the histogram pass (a ResNet has a Relu after almost every conv).
    """
    wanted = set(tensors)
    plan: dict[str, tuple[str, str]] = {}
    for node in graph.model.graph.node:
        if len(node.output) != 1 or not node.input or node.output[0] not in wanted:
            continue
        src = node.input[0]
        if src not in wanted:
            continue
        kind, root = plan.get(src, ("measured", src))
        if node.op_type in VALUE_PRESERVING and kind in ("measured", "same"):
            plan[node.output[0]] = ("same", root)
        elif node.op_type == "Relu" and kind == "measured":
            plan[node.output[0]] = ("relu", src)
    return plan


class _Binner:
    """Bins batches into their TensorStats, one task per tensor, pooling small batches first.

    A histogram update has a fixed cost (a 32768-bin count and add: ~0.5 MB of memory traffic)
    that exceeds binning a small activation (7x7x512 at batch 1); pooling up to ``POOL`` values
    per tensor keeps memory bounded and, binning being exact and order-independent, gives
    bit-identical statistics. A tensor and the Relu outputs derived from it are one task, so no
    two threads ever touch the same TensorStats.
    """

    POOL = 1 << 18

    def __init__(self, stats: dict[str, TensorStats], relus: list[tuple[str, str]]):
        self.stats = stats
        self.relus_of: dict[str, list[str]] = {}
        for relu, src in relus:
            self.relus_of.setdefault(src, []).append(relu)
        self.pool: dict[str, list[np.ndarray]] = {}
        self.pooled: dict[str, int] = {}

    def submit(self, pool: ThreadPoolExecutor, values: dict[str, np.ndarray]) -> list[Future]:
        """Queue one batch: tensors whose pool fills are binned by the workers."""
        due = []
        for name, value in values.items():
            self.pool.setdefault(name, []).append(np.asarray(value).reshape(-1))
            self.pooled[name] = self.pooled.get(name, 0) + value.size
            if self.pooled[name] >= self.POOL:
                due.append(self._take(name))
        return [pool.submit(self._bin, name, parts) for name, parts in due]

    def submit_flush(self, pool: ThreadPoolExecutor) -> list[Future]:
        """Queue what is left in every pool (the end of the data)."""
        due = [self._take(name) for name in list(self.pool)]
        return [pool.submit(self._bin, name, parts) for name, parts in due if parts]

    def _take(self, name: str) -> tuple[str, list[np.ndarray]]:
        self.pooled.pop(name, None)
        return name, self.pool.pop(name, [])

    def _bin(self, name: str, parts: list[np.ndarray]) -> None:
        x = parts[0] if len(parts) == 1 else np.concatenate(parts)
        added = self.stats[name].update(x)
        for relu in self.relus_of.get(name, ()):
            self.stats[relu].update_relu(added, x)


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware where the platform tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_binning_threads() -> int:
    """``$QUANTBENCH_BINNING_THREADS``, else the usable cores."""
    env = os.environ.get("QUANTBENCH_BINNING_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else usable_cores()


@contextmanager
def _stats_workers(threads: int | None) -> Iterator[ThreadPoolExecutor]:
    count = threads if threads and threads > 0 else default_binning_threads()
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="quantbench-stats")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _wait(futures: list[Future]) -> None:
    for f in futures:
        f.result()


def _nonempty(batches: Iterator[Feed], source: DataSource) -> Iterator[Feed]:
    empty = True
    for feed in batches:
        empty = False
        yield feed
    if empty:
        raise QuantbenchError(f"{source.description}: the data set is empty (no batches)")
