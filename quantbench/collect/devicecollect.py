"""The calibration pass on a GPU: activations stay on the device, only bin counts come back.

:func:`quantbench.collect.statspass.collect_stats` hands over here when the provider is CUDA and
CuPy is
installed. Same plan as the host pass (tensors derived from another one's bins are not read),
same statistics bit for bit (:mod:`quantbench.stats.devicestats`); what differs is where the work
happens: onnxruntime writes the exposed tensors into its CUDA arena (IOBinding), CuPy bins them
there, and the arena gets the memory back before the next part runs. GPU memory is bounded by
two parts' activations (:data:`DEVICE_ACTIVATION_BUDGET` each: one counted while onnxruntime
infers the next) plus 256 KiB of counts per tensor, whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, resolve_provider
from quantbench.backends.ortdevice import CUDA_PROVIDER, DeviceOutputRunner
from quantbench.data.sources import (
    Batch,
    DataSource,
    Feed,
    StreamFingerprint,
    feed_num_samples,
    feed_parts,
    nonempty,
    prefetched,
)
from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph, TensorSpec
from quantbench.progress import progress_bar, warn
from quantbench.stats.derivation import read_by_pass, relus_by_source, with_copies
from quantbench.stats.devicestats import StatsBank, device_binning_wanted, import_cupy
from quantbench.stats.tensorstats import TensorStats

#: exposed activations one GPU inference may produce; a larger feed runs in parts (exact).
#: ResNet-50 at batch 32 exposes 2.0 GiB: one part, one input shape (one cuDNN search).
DEVICE_ACTIVATION_BUDGET = 4 << 30
#: samples of the first part, before the activation size of one sample is known: a feed of
#: up to this many runs whole, so the usual batch sizes see one input shape (one cuDNN search).
FIRST_PART = 64


def wants_device_stats(provider: str | None) -> bool:
    """Whether to bin on the GPU: a CUDA provider that is available, CuPy, no opt-out.

    An unavailable provider fails here, in one line naming what is missing; a missing CuPy
    only costs speed (the host pass runs, with a warning).
    """
    if not _cuda_pass(provider):
        return False
    try:
        import_cupy()
    except QuantbenchError as exc:
        warn(f"{exc}; binning on the host instead")
        return False
    return True


def table_device(provider: str | None) -> ModuleType | None:
    """CuPy where the pass runs on the GPU (:func:`wants_device_stats`, without its warning):
    the tables' heavy array work goes there too (:func:`quantbench.calibrators.tables_on`)."""
    try:
        return import_cupy() if _cuda_pass(provider) else None
    except QuantbenchError:
        return None


def _cuda_pass(provider: str | None) -> bool:
    """A CUDA provider, and no opt-out of device binning; an unavailable provider raises."""
    if not provider or not device_binning_wanted():
        return False
    return resolve_provider(provider) == CUDA_PROVIDER


def collect_on_device(
    graph: Graph,
    source: DataSource,
    tensors: list[str],
    plan: dict[str, tuple[str, str]],
    *,
    show_progress: bool = True,
    before_inference: Callable[[], None] | None = None,
    runner: OnnxRuntimeRunner | None = None,
) -> tuple[dict[str, TensorStats], int, StreamFingerprint | None]:
    """:func:`quantbench.collect.statspass.collect_stats`'s pass with inference and binning on the
    GPU:
    the statistics of ``tensors``, the samples seen, and the stream's fingerprint where the
    source has none up front. ``runner``: the CUDA session over the model with the tensors to
    read exposed, started by :func:`quantbench.collect.statspass.collect_stats` beside other work
    (None
    when every tensor is an input).

    ``plan`` is ``derivation.derivation_plan(graph, tensors)``: ``same`` tensors are renamed copies
    of their root, ``relu`` tensors are binned from their source's values in its pass.

    Per part: its calibrated inputs are copied to the GPU on the reading thread, onnxruntime
    runs (its outputs stay in its CUDA arena), then one range kernel, one host sync and one
    count kernel for all of the part's tensors (:class:`StatsBank`), on a stream and a thread
    of our own while onnxruntime infers the next part; a part's outputs go back to the arena
    once its counting is done (two parts at most alive).
    """
    cp = import_cupy()
    from_feed, from_outputs = read_by_pass(graph, tensors, plan)
    device_runner = None if runner is None else DeviceOutputRunner(runner, cp)
    binner = _DeviceBinner(cp, tensors, plan, cp.cuda.Stream(non_blocking=True))
    if before_inference is not None:
        before_inference()
    fingerprint = None if source.fingerprinted else StreamFingerprint()
    num_samples = 0
    per_sample = [0]  # bytes of exposed activations per sample, after the first part
    uploads = cp.cuda.Stream(non_blocking=True)

    def staged(feed: Feed) -> tuple[Feed, Feed]:
        return feed, _on_device(cp, uploads, feed, from_feed)

    with progress_bar("Calibrating", total=source.num_samples, show=show_progress) as advance:
        for feed, on_gpu in prefetched(nonempty(source.batches(), source), staged):
            if fingerprint is not None:
                fingerprint.update(feed)
            for part in _parts(on_gpu, graph.inputs, lambda: per_sample[0]):
                outputs = device_runner.infer(part, from_outputs) if device_runner else {}
                n = feed_num_samples(part, graph.inputs)
                if not per_sample[0]:
                    per_sample[0] = max(1, -(-sum(a.nbytes for a in outputs.values()) // n))
                binner.bin({**{t: part[t] for t in from_feed}, **outputs})
                del outputs  # the binner holds the part until its counting is done
                num_samples += n
                advance(n)
        stats = binner.results()
    return stats, num_samples, fingerprint


def _on_device(cp: ModuleType, stream: Any, feed: Feed, names: list[str]) -> Feed:
    """``feed`` with its calibrated inputs copied to the GPU, once (on the reading thread,
    beside inference): onnxruntime reads the same copy (bound as a device input) that the
    statistics bin. Synchronised, because onnxruntime runs on a stream of its own."""
    if not names:
        return feed
    with stream:
        on_gpu = {**feed, **{t: cp.asarray(feed[t]) for t in names}}
    stream.synchronize()
    return Batch(on_gpu, feed.num_samples) if isinstance(feed, Batch) else on_gpu


#: bins one part of the GPU pass while onnxruntime infers the next (it lets go of the GIL)
_BINNING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-bin")


class _DeviceBinner:
    """The device statistics of every tensor of the plan, fed one part at a time (``cp`` is
    CuPy, or numpy, which runs the same logic on the host).

    On the GPU (``stream`` given), a part's binning runs on a thread of its own: the range
    kernel, its host sync and the bookkeeping (about 6 ms a ResNet-50 part) and the count
    kernel's launch overlap the next part's inference instead of following it. At most two
    parts are alive: the one binned and counted, and the one onnxruntime infers.
    """

    def __init__(
        self,
        cp: ModuleType,
        tensors: list[str],
        plan: dict[str, tuple[str, str]],
        stream: Any = None,
    ):
        self.tensors = tensors
        self.plan = plan
        self.bank = StatsBank(cp, [t for t in tensors if t not in plan], relus_by_source(plan))
        self.stream = stream
        #: the part being binned: its values, and the job that returns its counting's fence
        self.pending: tuple[dict[str, Any], Future[Any]] | None = None

    def bin(self, values: dict[str, Any]) -> None:
        """Bin one part. On the GPU, returns once the previous part is binned and counted
        (its values released); ``values`` are kept until their own counting is done."""
        self._settle()
        if self.stream is None:
            self.bank.add(values)
            return
        self.pending = (values, _BINNING.submit(self._add, values))

    def _add(self, values: dict[str, Any]) -> Any:
        with self.stream:
            self.bank.add(values)
            return self.bank.fence()

    def _settle(self) -> None:
        """The pending part binned (a binning error is raised here) and counted."""
        if self.pending is not None:
            _, job = self.pending
            self.pending = None
            event = job.result()
            if event is not None:
                event.synchronize()

    def results(self) -> dict[str, TensorStats]:
        """Host statistics in ``tensors`` order (the counts' one trip to the host)."""
        self._settle()
        host = with_copies(self.bank.results(), self.plan)
        return {t: host[t] for t in self.tensors}


def _parts(feed: Feed, inputs: list[TensorSpec], per_sample: Callable[[], int]) -> Iterator[Feed]:
    """``feed`` in parts of at most :data:`DEVICE_ACTIVATION_BUDGET` of exposed activations;
    the first part holds up to :data:`FIRST_PART` samples, so the usual batch sizes run whole
    (one input shape, one cuDNN search). The host pass's rule with a GPU-sized budget."""
    return feed_parts(feed, inputs, per_sample, DEVICE_ACTIVATION_BUDGET, FIRST_PART)
