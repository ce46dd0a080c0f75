"""The calibration pass on a GPU: activations stay on the device, only bin counts come back.

:func:`quantbench.collect.collect_stats` hands over here when the provider is CUDA and CuPy is
installed. Same plan as the host pass (tensors derived from another one's bins are not read),
same statistics bit for bit (:mod:`quantbench.devicestats`); what differs is where the work
happens: onnxruntime writes the exposed tensors into its CUDA arena (IOBinding), CuPy bins them
there, and the arena gets the memory back before the next part runs. GPU memory is bounded by
one part's activations (:data:`DEVICE_ACTIVATION_BUDGET`) plus 256 KiB of counts per tensor,
whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from quantbench import __version__
from quantbench.backends.onnxruntime import expose, resolve_provider
from quantbench.backends.ortdevice import CUDA_PROVIDER, DeviceOutputRunner
from quantbench.data import (
    DataSource,
    Feed,
    StreamFingerprint,
    feed_num_samples,
    feed_parts,
    nonempty,
)
from quantbench.devicestats import (
    BinOps,
    DeviceBatch,
    DeviceTensorStats,
    device_binning_wanted,
    import_cupy,
)
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph, TensorSpec
from quantbench.progress import progress_bar, warn
from quantbench.stats import StatsFile, TensorStats

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
    if not device_binning_wanted() or not provider:
        return False
    if resolve_provider(provider) != CUDA_PROVIDER:
        return False
    try:
        import_cupy()
    except QuantbenchError as exc:
        warn(f"{exc}; binning on the host instead")
        return False
    return True


def collect_on_device(
    graph: Graph,
    source: DataSource,
    tensors: list[str],
    plan: dict[str, tuple[str, str]],
    *,
    provider: str | None = "cuda",
    show_progress: bool = True,
) -> StatsFile:
    """:func:`quantbench.collect.collect_stats` with inference and binning on the GPU.

    ``plan`` is ``collect.derivation_plan(graph, tensors)``: ``same`` tensors are renamed copies
    of their root, ``relu`` tensors are binned from their source's bins.
    """
    cp = import_cupy()
    input_names = {s.name for s in graph.inputs}
    measured = [t for t in tensors if t not in plan]
    from_feed = [t for t in measured if t in input_names]
    from_outputs = [t for t in measured if t not in input_names]
    runner = None
    if from_outputs:
        exposed = expose(graph.model, from_outputs, graph.elem_types)
        runner = DeviceOutputRunner(exposed, cp, provider, generated_from=graph.model)
    binner = _DeviceBinner(cp, tensors, plan)
    fingerprint = None if source.fingerprint else StreamFingerprint()
    num_samples = 0
    per_sample = [0]  # bytes of exposed activations per sample, after the first part
    with progress_bar("Calibrating", total=source.num_samples, show=show_progress) as advance:
        for feed in nonempty(source.batches(), source):
            if fingerprint is not None:
                fingerprint.update(feed)
            for part in _parts(feed, graph.inputs, lambda: per_sample[0]):
                outputs = runner.infer(part, from_outputs) if runner is not None else {}
                n = feed_num_samples(part, graph.inputs)
                if not per_sample[0]:
                    per_sample[0] = max(1, -(-sum(a.nbytes for a in outputs.values()) // n))
                values = {**{t: cp.asarray(part[t]) for t in from_feed}, **outputs}
                binner.bin(values)
                del values, outputs  # back to onnxruntime's arena (after the sync in bin)
                num_samples += n
                advance(n)
    return StatsFile(
        model_hash=graph.hash,
        data_fingerprint=source.fingerprint or (fingerprint.hexdigest() if fingerprint else ""),
        num_samples=num_samples,
        tensors=binner.results(),
        tool_version=__version__,
        model_path=str(graph.path or ""),
    )


class _DeviceBinner:
    """The device statistics of every tensor of the plan, fed one part at a time (``cp`` is
    CuPy, or numpy, which runs the same logic on the host)."""

    def __init__(self, cp: ModuleType, tensors: list[str], plan: dict[str, tuple[str, str]]):
        self.cp = cp
        self.tensors = tensors
        self.plan = plan
        ops = BinOps(cp)
        self.stats = {
            t: DeviceTensorStats(t, ops) for t in tensors if plan.get(t, ("",))[0] != "same"
        }
        self.relus_of: dict[str, list[str]] = {}
        for t, (kind, src) in plan.items():
            if kind == "relu":
                self.relus_of.setdefault(src, []).append(t)

    def bin(self, values: dict[str, Any]) -> None:
        """Bin one part; returns once the GPU is done reading ``values``."""
        for name, x in values.items():
            added: DeviceBatch | None = self.stats[name].update(x)
            for relu in self.relus_of.get(name, ()):
                self.stats[relu].update_relu(added, x)
        if self.cp is not np:  # numpy: the CPU tests of this logic
            self.cp.cuda.get_current_stream().synchronize()

    def results(self) -> dict[str, TensorStats]:
        """Host statistics in ``tensors`` order (the counts' one trip to the host)."""
        host = {t: s.to_host() for t, s in self.stats.items()}
        for t, (kind, src) in self.plan.items():
            if kind == "same":
                host[t] = host[src].renamed(t)
        return {t: host[t] for t in self.tensors}


def _parts(feed: Feed, inputs: list[TensorSpec], per_sample: Callable[[], int]) -> Iterator[Feed]:
    """``feed`` in parts of at most :data:`DEVICE_ACTIVATION_BUDGET` of exposed activations;
    the first part holds up to :data:`FIRST_PART` samples, so the usual batch sizes run whole
    (one input shape, one cuDNN search). The host pass's rule with a GPU-sized budget."""
    return feed_parts(feed, inputs, per_sample, DEVICE_ACTIVATION_BUDGET, FIRST_PART)
