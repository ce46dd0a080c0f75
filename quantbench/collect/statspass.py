"""One streaming onnxruntime pass that turns calibration data into a :class:`StatsFile`.

The tensors to calibrate are exposed as extra graph outputs; each part of a batch updates their
:class:`TensorStats` and is then dropped, so memory is bounded by one part's activations plus
the fixed-size histograms. onnxruntime and the binning take turns on all the cores: a part is
inferred by onnxruntime's threads, then binned by every worker thread at once (tensors cut into
chunks, merged exactly), and dropped before the next part is inferred. Taking turns keeps one
part's activations in memory instead of two, so a part can be twice as large at the same peak
(larger parts keep onnxruntime's threads busier), and neither side's threads preempt the
other's. On many cores (:data:`OVERLAP_MIN_CORES`) a part is binned while the next one is
inferred instead: onnxruntime does not keep 16 cores busy, and binning is memory-bound.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from quantbench import __version__
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose_for_session
from quantbench.collect.devicecollect import collect_on_device, wants_device_stats
from quantbench.data.sources import (
    DataSource,
    Feed,
    Joined,
    StreamFingerprint,
    dynamic_batch,
    feed_num_samples,
    feed_parts,
    feed_slice,
    joined_feeds,
    nonempty,
    prefetched,
    samples_first,
)
from quantbench.errors import InternalError, QuantbenchError
from quantbench.machine import give_back_freed_memory, usable_cores
from quantbench.model.graph import Graph, TensorSpec
from quantbench.progress import progress_bar
from quantbench.stats import binning
from quantbench.stats.derivation import derivation_plan, read_by_pass, relus_by_source, with_copies
from quantbench.stats.tensorstats import StatsFile, TensorStats


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
    before_inference: Callable[[], None] | None = None,
    head_samples: int = 0,
    join_feeds: bool = False,
    ranges_only: bool = False,
) -> StatsFile:
    """Run the data through the model once and return statistics of ``tensors``.

    ``join_feeds`` (no ``--batch-size`` was asked for): a dynamic-batch model gets consecutive
    feeds joined into batches (:data:`JOIN_SAMPLES`, :func:`joined_feeds`), once its outputs
    for two samples run together match theirs run apart (:class:`_Joining`); statistics are
    exact, so only onnxruntime's float rounding of a batch can move a bin.

    ``before_inference`` is called once the session has started, before the first batch.

    ``head_samples``: also keep the statistics of the first that many samples apart
    (:attr:`StatsFile.head`; ``--method auto`` holds them back to judge on), snapshotted when
    the pass reaches them (a batch across the boundary is cut there), so that no second pass
    over them is needed. Not on the GPU path, nor where the boundary cannot be cut (a fixed
    batch that does not divide it): there ``head`` stays None.

    ``ranges_only`` (every method asked reads ranges only): the host's pass keeps each
    tensor's range and counts and no histogram (:meth:`TensorStats.ranges_only`; binning was
    half of a minmax pass on a detector), and such statistics are never cached; the GPU's
    pass bins anyway. Not with ``head_samples``.

    ``binning_threads`` (default: the usable cores) bin the chunks of every tensor at once;
    binning is exact and order-independent, so the statistics do not depend on the thread
    count.
    """
    plan = derivation_plan(graph, tensors)
    from_feed, from_outputs = read_by_pass(graph, tensors, plan)
    starting = _session_start(graph, from_outputs, provider, threads)

    def checked_and_device() -> bool:
        graph.finish_check()
        return wants_device_stats(provider)

    # beside the session's start (onnxruntime lets go of the GIL): the model's deferred check
    # and, for CUDA, CuPy's import and CUDA's start
    device = _beside(starting, checked_and_device)
    if device:  # CUDA: activations stay on the GPU (devicecollect)
        stats, num_samples, fingerprint = collect_on_device(
            graph,
            source,
            tensors,
            plan,
            show_progress=show_progress,
            before_inference=before_inference,
            runner=starting.result() if starting else None,
        )
        return _stats_file(graph, source, stats, num_samples, fingerprint)
    if ranges_only and head_samples:
        raise InternalError("a range-only pass keeps no held-back statistics")
    stats = {name: _new_stats(name, ranges_only) for name in tensors}
    relus = relus_by_source(plan)
    workers = _worker_count(binning_threads)
    binner = _Ranger(stats, relus, workers) if ranges_only else _Binner(stats, relus)
    fingerprint = None if source.fingerprinted else StreamFingerprint()
    num_samples = 0
    with _stats_workers(binning_threads) as pool:
        compiled = _CompiledLoad(pool, source.num_samples)
        runner = starting.result() if starting else None
        if before_inference is not None:
            before_inference()
        with (
            progress_bar("Calibrating", total=source.num_samples, show=show_progress) as advance,
            _binning_turns(pool) as bin_part,
        ):
            per_sample = [0]  # bytes of exposed activations per sample, after the first run
            head = None
            # a stream's fingerprint hashes its feeds as they come: those are never cut
            boundary = head_samples if fingerprint is None else 0
            batches = _cut_at(nonempty(source.batches(), source), graph.inputs, boundary)
            feeds = _fingerprinted(prefetched(batches), fingerprint)
            joins = join_feeds and runner is not None and dynamic_batch(graph.inputs)
            joining = _Joining(runner, graph) if joins else None
            if joining is not None:
                feeds = joined_feeds(
                    feeds, graph.inputs, JOIN_SAMPLES, JOIN_ELEMENTS, boundary, joining.enabled
                )
            joined = joined_budget(from_outputs)
            for feed in feeds:
                for part in _parts_of(feed, graph.inputs, joining, lambda: per_sample[0], joined):
                    outputs = runner.infer(part, from_outputs) if runner else {}
                    n = feed_num_samples(part, graph.inputs)
                    if not per_sample[0]:
                        per_sample[0] = max(1, -(-sum(a.nbytes for a in outputs.values()) // n))
                    values = {**{t: part[t] for t in from_feed}, **outputs}
                    if not ranges_only:
                        compiled.binning(sum(v.size for v in values.values()), n)
                    bin_part(binner, values)
                    del values
                    del outputs  # freed before onnxruntime infers the next part (taking turns)
                    num_samples += n
                    advance(n)
                if head is None and head_samples and num_samples == head_samples:
                    bin_part(binner, None)  # everything pooled so far binned: a true snapshot
                    head = {name: copy.deepcopy(ts) for name, ts in stats.items()}
            bin_part(binner, None)
    give_back_freed_memory()  # the parts' activations and the binning's temporaries
    whole = _stats_file(graph, source, with_copies(stats, plan), num_samples, fingerprint)
    whole.batches_agree = joining.checked if joining is not None else None
    if head is not None and num_samples > head_samples:
        whole.head = _stats_file(graph, source, with_copies(head, plan), head_samples, None)
        whole.head.data_fingerprint = ""  # its data is a part of the source: the caller names it
    return whole


#: samples one joined feed holds at most (``join_feeds``), and its input values at most (a
#: 224x224 RGB image is 150,528): the per-run cost of onnxruntime with hundreds of exposed
#: outputs is paid once per batch, not per sample (captcha-crnn's pass at 1 sample a run:
#: 1.48 s of inference, at 8: 1.02 s)
JOIN_SAMPLES = 16
JOIN_ELEMENTS = 1 << 21


class _Joining:
    """Whether feeds may be joined: some models declare a dynamic batch axis and reshape to a
    batch of 1 inside (khmersm), which may fail or, worse, mix samples silently. The first
    joined feed's first two samples are run together and apart (the model's own outputs
    only); joining goes on only where they agree to float rounding, else the feed is run one
    sample at a time and so is the rest."""

    def __init__(self, runner: OnnxRuntimeRunner, graph: Graph):
        self.runner = runner
        self.outputs = [o.name for o in graph.model.graph.output]
        self.checked: bool | None = None  # None until the first joined feed is tried

    def enabled(self) -> bool:
        return self.checked is not False

    def feeds(self, feed: Feed, n: int) -> list[Feed]:
        """``feed`` as it is, or, a joined feed where joining is refused, one sample at a
        time (a feed as the data gave it is never cut)."""
        if n < 2 or self.checked or not isinstance(feed, Joined):
            return [feed]
        self.checked = self._agrees(feed)
        return [feed] if self.checked else [feed_slice(feed, i, i + 1) for i in range(n)]

    def _agrees(self, feed: Feed) -> bool:
        apart = [self.runner.infer(feed_slice(feed, i, i + 1), self.outputs) for i in (0, 1)]
        try:
            together = self.runner.infer(feed_slice(feed, 0, 2), self.outputs)
        except QuantbenchError:
            return False
        return all(_batch_matches(together[o], [a[o] for a in apart]) for o in self.outputs)


def _batch_matches(together: np.ndarray, apart: list[np.ndarray]) -> bool:
    """Two samples' output run together equals theirs run apart, joined along the axis where
    the batch is (not always the first: a CTC head's is [time, batch, classes]), to float
    rounding."""
    if np.ndim(together) == 0 or any(np.ndim(a) != np.ndim(together) for a in apart):
        return False
    for axis in range(np.ndim(together)):
        try:
            whole = np.concatenate(apart, axis=axis)
        except ValueError:  # the other dims differ (an NMS head's count of boxes)
            continue
        if whole.shape == together.shape and _close(together, whole):
            return True
    return False


def _close(together: np.ndarray, whole: np.ndarray) -> bool:
    if whole.dtype.kind != "f":
        return bool(np.array_equal(whole, together))
    scale = float(np.max(np.abs(whole), initial=0.0))
    return bool(np.allclose(together, whole, rtol=1e-3, atol=1e-5 * scale, equal_nan=True))


def _parts_of(
    feed: Feed,
    inputs: list[TensorSpec],
    joining: _Joining | None,
    per_sample: Callable[[], int],
    joined: int,
) -> Iterator[Feed]:
    """The parts ``feed`` is run in (:func:`_parts`; a feed the pass joined, in parts of at most
    ``joined`` bytes), one sample at a time where a joined feed's check failed
    (:class:`_Joining`)."""
    whole = joining.feeds(feed, feed_num_samples(feed, inputs)) if joining else [feed]
    for one in whole:
        if isinstance(one, Joined):
            yield from feed_parts(one, inputs, per_sample, joined)
        else:
            yield from _parts(one, inputs, per_sample)


def joined_budget(outputs: Collection[str]) -> int:
    """Activations a part of a joined batch may return: :data:`JOINED_BUDGET_PER_TENSOR` per
    exposed tensor (onnxruntime's and the binning's cost per run grows with them), between
    :data:`JOINED_ACTIVATION_BUDGET` and :data:`ACTIVATION_BUDGET`."""
    wanted = len(outputs) * JOINED_BUDGET_PER_TENSOR
    return min(ACTIVATION_BUDGET, max(JOINED_ACTIVATION_BUDGET, wanted))


def _fingerprinted(feeds: Iterable[Feed], fingerprint: StreamFingerprint | None) -> Iterator[Feed]:
    """``feeds``, each hashed into a stream's ``fingerprint`` as it comes (before any join)."""
    for feed in feeds:
        if fingerprint is not None:
            fingerprint.update(feed)
        yield feed


def _cut_at(batches: Iterable[Feed], inputs: list[TensorSpec], boundary: int) -> Iterator[Feed]:
    """``batches``, the one holding sample ``boundary`` cut in two there where its batch axis
    allows (a dynamic batch); otherwise as they come."""
    seen = 0
    for feed in batches:
        n = feed_num_samples(feed, inputs)
        cut = boundary - seen
        if 0 < cut < n and dynamic_batch(inputs) and samples_first(feed, n):
            yield feed_slice(feed, 0, cut)
            yield feed_slice(feed, cut, n)
        else:
            yield feed
        seen += n


_SESSION_START = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-session")


def _session_start(
    graph: Graph, exposed: list[str], provider: str | None, threads: int | None
) -> Future[OnnxRuntimeRunner] | None:
    """The pass's session, started on a thread (None when no tensor needs exposing)."""
    if not exposed:
        return None
    model = expose_for_session(
        graph.model, exposed, graph.elem_types, source=graph.take_source(), types_of_model=True
    )
    return _SESSION_START.submit(
        OnnxRuntimeRunner, model, provider, threads, spin=False, generated_from=graph.model
    )


def _beside(starting: Future[OnnxRuntimeRunner] | None, work: Callable[[], bool]) -> bool:
    """``work()`` while the session starts. Should it fail, the start is waited for first
    (and its own failure dropped: ``work``'s, an invalid model say, is the one to report)."""
    try:
        return work()
    except BaseException:
        if starting is not None:
            starting.exception()  # waits, raises nothing
        raise


def _stats_file(
    graph: Graph,
    source: DataSource,
    stats: dict[str, TensorStats],
    num_samples: int,
    fingerprint: StreamFingerprint | None,
) -> StatsFile:
    """One pass's statistics as a file's record (the host's and the GPU's pass alike)."""
    return StatsFile(
        model_hash=graph.hash,
        data_fingerprint=source.fingerprint or (fingerprint.hexdigest() if fingerprint else ""),
        num_samples=num_samples,
        tensors=stats,
        tool_version=__version__,
        model_path=str(graph.path or ""),
        data_note=source.nonfinite.message() if source.nonfinite else "",
    )


def _new_stats(name: str, ranges_only: bool) -> TensorStats:
    return TensorStats.ranges_only(name) if ranges_only else TensorStats(name)


class _Ranger:
    """:class:`_Binner`'s twin for a range-only pass: each part's tensors scanned for their
    range (a min and a max, no bins, nothing pooled) in one task per worker, the tensors
    dealt out by size (a task per tensor cost more than the scan where a part is one sample of
    hundreds of small tensors: PP-OCRv5's recognizer, 352 a run), a Relu's range derived from
    its source's (exact: ``max(x, 0)`` of finite values; where the source held NaN/Inf, the
    Relu's own values are scanned)."""

    def __init__(
        self, stats: dict[str, TensorStats], relus_of: dict[str, list[str]], workers: int
    ):
        self.stats = stats
        self.relus_of = relus_of
        self.workers = max(1, workers)

    def due(self, values: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        return values or {}

    def bin(self, pool: ThreadPoolExecutor, due: dict[str, np.ndarray]) -> None:
        groups = _dealt(list(due), lambda n: np.size(due[n]), self.workers)
        found = _map(pool, _range_scans, [([due[n] for n in g],) for g in groups])
        for group, scans in zip(groups, found, strict=True):
            for name, seen in zip(group, scans, strict=True):
                self.stats[name].add_range(seen)
                for relu in self.relus_of.get(name, ()):
                    self.stats[relu].add_range(_relu_range(seen, due[name]))


def _range_scans(values: list[np.ndarray]) -> list[binning.Scan]:
    return [binning.range_scan(v) for v in values]


def _dealt(names: list[str], size: Callable[[str], int], hands: int) -> list[list[str]]:
    """``names`` in at most ``hands`` groups of about equal total ``size``, largest first."""
    groups: list[list[str]] = [[] for _ in range(min(hands, len(names)))]
    totals = [0] * len(groups)
    for name in sorted(names, key=size, reverse=True):
        lightest = totals.index(min(totals))
        groups[lightest].append(name)
        totals[lightest] += size(name)
    return groups


def _relu_range(seen: binning.Scan, values: np.ndarray) -> binning.Scan:
    """The range scan of ``max(values, 0)`` from ``values``' own scan ``seen``."""
    if seen.nan or seen.inf:  # -inf becomes 0, NaN stays NaN: scan the Relu itself
        return binning.range_scan(np.maximum(values, 0))
    if not seen.finite:
        return seen
    return binning.Scan(max(seen.lo, 0.0), max(seen.hi, 0.0), seen.finite, 0, 0, None)


#: exposed activations one inference may return: a larger batch of a dynamic-batch model is
#: run in parts (binning is exact and order-independent, so the bins do not change), which keeps
#: peak memory near one part whatever --batch-size asks for. 256 MiB: on 16 cores (ResNet-18,
#: batch 32) parts of ~18 samples ran 15 % faster than 128 MiB parts of ~9, where onnxruntime's
#: threads have less work per operator.
ACTIVATION_BUDGET = 256 << 20
#: the same for the batches the pass joins itself (the user asked for no batch), at least:
#: joining pays onnxruntime's per-run cost once for several samples, a cost that grows with the
#: tensors a run returns; a model with few tensors and large samples gains little from it, and
#: 256 MiB parts, two alive while binning overlaps, raised a dense super-resolution CNN's
#: (13 tensors) peak RSS from 310 to 853 MiB (48 tiles of 128 px). With 64 MiB parts for every
#: model captcha-crnn (832 tensors) ran 0.8 s slower; so 1 MiB a tensor, within both budgets.
JOINED_ACTIVATION_BUDGET = 64 << 20
JOINED_BUDGET_PER_TENSOR = 1 << 20


def _parts(feed: Feed, inputs: list[TensorSpec], per_sample: Callable[[], int]) -> Iterator[Feed]:
    """``feed`` in parts of at most :data:`ACTIVATION_BUDGET` of exposed activations
    (``per_sample()`` measured on a first one-sample part)."""
    return feed_parts(feed, inputs, per_sample, ACTIVATION_BUDGET)


class _Binner:
    """Pools small batches per tensor, then bins what is due on every worker at once.

    A histogram update has a fixed cost (a 32768-bin count and add: ~0.5 MB of memory traffic)
    that exceeds binning a small activation (7x7x512 at batch 1); pooling up to ``POOL`` values
    per tensor keeps memory bounded and, binning being exact and order-independent, gives
    bit-identical statistics (the pooled pieces are binned where they lie, never copied). A due
    tensor of one chunk (at most ``CHUNK`` values) is one task: scanned, re-binned where its
    grid widened, written with the Relus derived from it. A larger one is cut into chunks so
    it spreads over every core: the chunks are scanned in parallel, merged exactly
    (:func:`binning.merge_scans`) and, where the grid widened, re-binned in parallel; then
    one task writes its TensorStats and its Relus', so no two threads share one.
    """

    POOL = 1 << 18
    CHUNK = 1 << 21
    #: values pooled over all tensors at most: past it the fullest pools are binned early, so a
    #: model with hundreds of small tensors (a BERT-like encoder: 422) holds 64 MiB of pooled
    #: float32 values, not 422 x 1 MiB
    POOL_TOTAL = 1 << 24

    def __init__(self, stats: dict[str, TensorStats], relus_of: dict[str, list[str]]):
        self.stats = stats
        self.relus_of = relus_of
        self.pool: dict[str, list[np.ndarray]] = {}
        self.pooled: dict[str, int] = {}

    def add(self, values: dict[str, np.ndarray]) -> list[tuple[str, list[np.ndarray]]]:
        """Pool one part's values; returns the tensors whose pool is full (and, past
        :attr:`POOL_TOTAL`, the fullest of the rest), as flat pieces."""
        due = []
        for name, value in values.items():
            self.pool.setdefault(name, []).append(np.asarray(value).reshape(-1))
            self.pooled[name] = self.pooled.get(name, 0) + value.size
            if self.pooled[name] >= self.POOL:
                due.append(self._take(name))
        total = sum(self.pooled.values())
        for name in sorted(self.pooled, key=self.pooled.__getitem__, reverse=True):
            if total <= self.POOL_TOTAL:
                break
            total -= self.pooled[name]
            due.append(self._take(name))
        return due

    def due(self, values: dict[str, np.ndarray] | None) -> list[tuple[str, list[np.ndarray]]]:
        """:meth:`add` of one part's values, or (``None``: the end of the data) :meth:`flush`."""
        return self.add(values) if values is not None else self.flush()

    def flush(self) -> list[tuple[str, list[np.ndarray]]]:
        """What is left in every pool (the end of the data)."""
        return [self._take(name) for name in list(self.pool) if self.pool[name]]

    def _take(self, name: str) -> tuple[str, list[np.ndarray]]:
        self.pooled.pop(name, None)
        return name, self.pool.pop(name, [])

    def bin(self, pool: ThreadPoolExecutor, due: list[tuple[str, list[np.ndarray]]]) -> None:
        """Bin ``due`` into their statistics on ``pool``. A tensor of one chunk is one task
        (scanned, re-binned where its grid must widen, written); a larger one has every chunk
        scanned (and re-binned) by its own task, then one task merges its chunks and writes its
        TensorStats and its Relus' (disjoint, so no locks)."""
        chunks = {name: self._chunks(pieces) for name, pieces in due}
        whole = [
            pool.submit(self._bin_whole, n, chunks[n][0], pieces)
            for n, pieces in due
            if len(chunks[n]) == 1
        ]
        split = [(n, pieces) for n, pieces in due if len(chunks[n]) > 1]
        if split:
            self._bin_split(pool, split, {n: chunks[n] for n, _ in split})
        for future in whole:
            future.result()

    def _bin_whole(self, name: str, chunk: list[np.ndarray], pieces: list[np.ndarray]) -> None:
        added = self.stats[name].update(chunk)
        for relu in self.relus_of.get(name, ()):
            self.stats[relu].update_relu(added, pieces)

    def _bin_split(
        self,
        pool: ThreadPoolExecutor,
        due: list[tuple[str, list[np.ndarray]]],
        chunks: dict[str, list[list[np.ndarray]]],
    ) -> None:
        scans = _map(
            pool,
            binning.scan,
            [(c, self.stats[n].exponent) for n, cs in chunks.items() for c in cs],
        )
        seen: dict[str, binning.Scan] = {}
        start = 0
        for name, cs in chunks.items():
            seen[name] = binning.merge_scans(scans[start : start + len(cs)])
            start += len(cs)
        regrid = {
            name: self.stats[name].regrid_exponent(s)
            for name, s in seen.items()
            if s.counts is None and s.finite
        }
        recounted = _map(
            pool, binning.finite_counts, [(c, e) for n, e in regrid.items() for c in chunks[n]]
        )
        counts: dict[str, np.ndarray | None] = {n: s.counts for n, s in seen.items()}
        start = 0
        for name in regrid:
            counts[name] = np.sum(recounted[start : start + len(chunks[name])], axis=0)
            start += len(chunks[name])
        _map(pool, self._apply, [(n, pieces, seen[n], counts[n]) for n, pieces in due])

    def _apply(
        self, name: str, pieces: list[np.ndarray], seen: binning.Scan, counts: np.ndarray | None
    ) -> None:
        added = self.stats[name].add_scanned(seen, counts)
        for relu in self.relus_of.get(name, ()):
            self.stats[relu].update_relu(added, pieces)

    def _chunks(self, pieces: list[np.ndarray]) -> list[list[np.ndarray]]:
        """``pieces`` regrouped into tasks of at most ``CHUNK`` values (large ones cut)."""
        tasks: list[list[np.ndarray]] = []
        size = self.CHUNK
        for piece in pieces:
            for start in range(0, piece.size, self.CHUNK):
                cut = piece[start : start + self.CHUNK]
                if size + cut.size > self.CHUNK:
                    tasks.append([])
                    size = 0
                tasks[-1].append(cut)
                size += cut.size
        return tasks or [pieces]


#: values a pass must be expected to bin, per usable core, before it loads numba's kernels where the
#: C ones were not built (most of a second of one core, ~125 MiB) for the rest: its gain per value
#: is shared among the cores, its load is not. Measured on 2 cores (whole `calibrate --method
#: minmax` processes, numba against numpy from the start): silero-vad (3 M values) 2.2 against 1.3
#: s, orinet (241 M) 5.9 against 5.5 s, mtcnn-pnet (304 M) 4.6 against 3.9 s, magika (1.2 G) even,
#: the ResNet-18-shaped model (919 M) 17.5-19.4 against 19.7-19.9 s, dddd-det (1.4 G) 11.8-12.4
#: against 13.0-13.4 s; on 16 cores (an H100 host) that ResNet-18: 6.8-8.6 against 6.0-7.9 s, its
#: default 23.8-25.8 against 21.7-22.7 s (numpy faster).
COMPILED_MIN_VALUES_PER_CORE = 1 << 28


def compiled_min_values() -> int:
    """Values a pass must be expected to bin to load numba: :data:`COMPILED_MIN_VALUES_PER_CORE`
    per usable core (512 M on 2 cores, 4 G on 16)."""
    return COMPILED_MIN_VALUES_PER_CORE * usable_cores()


class _CompiledLoad:
    """Loads the compiled binning kernels (:func:`binning.warm_up`) on a worker once the pass
    is expected to bin :func:`compiled_min_values` values: the values per sample seen so far
    times the source's samples (where it does not say, the values binned so far). Binning
    goes on with numpy meanwhile; both give the same bins, so switching mid-pass changes
    nothing but speed."""

    def __init__(self, pool: ThreadPoolExecutor, total_samples: int | None):
        self.pool, self.total_samples = pool, total_samples
        self.threshold = compiled_min_values()
        self.values = self.samples = 0
        self.loading: Future | None = None

    def binning(self, values: int, samples: int) -> None:
        """Count one part's ``values`` over ``samples``; start the load once it pays."""
        self.values += values
        self.samples += samples
        if self.loading is None and self.expected() >= self.threshold:
            self.loading = self.pool.submit(binning.warm_up)

    def expected(self) -> float:
        """Values the whole pass is expected to bin."""
        if not self.total_samples or not self.samples:
            return self.values
        return self.values / self.samples * max(self.total_samples, self.samples)


#: from this many usable cores on, a part is binned while onnxruntime infers the next. Measured
#: (ResNet-18-shaped, batch 32, whole processes): on the 16-core GPU host 7.65 / 7.67 s against
#: 8.99 / 9.16 s taking turns (peak RSS 1.7 against 1.4 GiB); on 2 cores no gain (9.7-10.0
#: against 8.5-10.4 s, +250 MiB), where onnxruntime's threads already use every core.
OVERLAP_MIN_CORES = 8


def overlap_wanted() -> bool:
    """Whether to bin a part while onnxruntime infers the next (two parts alive) instead of
    taking turns: from :data:`OVERLAP_MIN_CORES` on, or as ``$QUANTBENCH_BIN_OVERLAP`` (1/0)
    says."""
    env = os.environ.get("QUANTBENCH_BIN_OVERLAP", "")
    if env in ("0", "1"):
        return env == "1"
    return usable_cores() >= OVERLAP_MIN_CORES


@contextmanager
def _binning_turns(
    pool: ThreadPoolExecutor,
) -> Iterator[Callable[[_Binner | _Ranger, dict[str, np.ndarray] | None], None]]:
    """``bin_part(binner, values)``: pool one part's values and bin what is due (``None``: the
    end of the data, bin everything left). Taking turns (the default), it returns once done;
    overlapped, it returns at once and the next call first waits for this part's binning, so
    the binner's pools are only touched between parts and at most two parts are alive."""
    if not overlap_wanted():

        def in_turn(binner: _Binner | _Ranger, values: dict[str, np.ndarray] | None) -> None:
            binner.bin(pool, binner.due(values))

        yield in_turn
        return
    pending: Future | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-binner") as driver:

        def overlapped(binner: _Binner | _Ranger, values: dict[str, np.ndarray] | None) -> None:
            nonlocal pending
            if pending is not None:
                pending.result()
            pending = driver.submit(binner.bin, pool, binner.due(values))
            if values is None:
                pending.result()

        try:
            yield overlapped
        finally:
            if pending is not None:  # an inference failed: let the part in flight finish first
                pending.exception()


def _map(pool: ThreadPoolExecutor, fn: Callable, args: list[tuple]) -> list:
    """``fn(*a)`` for every ``a`` on the pool's threads, results in order."""
    futures = [pool.submit(fn, *a) for a in args]
    return [f.result() for f in futures]


def default_binning_threads() -> int:
    """``$QUANTBENCH_BINNING_THREADS``, else the usable cores."""
    env = os.environ.get("QUANTBENCH_BINNING_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else usable_cores()


def _worker_count(threads: int | None) -> int:
    """The binning threads asked for, else :func:`default_binning_threads`."""
    return threads if threads and threads > 0 else default_binning_threads()


@contextmanager
def _stats_workers(threads: int | None) -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(
        max_workers=_worker_count(threads), thread_name_prefix="quantbench-stats"
    )
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
