"""FP32 activations of a model over calibration data, streamed batch by batch.

The refinement passes read the inputs or outputs of chosen layers (bias correction: the mean
output shift; rounding: second moments of layer inputs; smoothing: per-channel input maxima).
Each reads what it needs from one streamed pass and keeps only running sums: nothing holds
more than one batch of activations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.data.sources import DataSource, nonempty
from quantbench.model.graph import open_graph


def stream_activations(
    model: onnx.ModelProto,
    data: DataSource,
    tensors: list[str],
    *,
    provider: str | None = None,
    threads: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Per batch of ``data``, the named tensors of ``model`` (FP32, as onnxruntime computes
    them). Graph inputs among ``tensors`` come from the feed; graph outputs are not exposed
    twice."""
    graph = open_graph(model, require_fixed_rank=False)
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    wanted = [t for t in dict.fromkeys(tensors) if t not in inputs]
    extra = [t for t in wanted if t not in outputs]
    exposed = expose(model, extra, graph.elem_types) if extra else model
    runner = OnnxRuntimeRunner(exposed, provider=provider, threads=threads, generated_from=model)
    fed = [t for t in dict.fromkeys(tensors) if t in inputs]
    try:
        for feed in nonempty(data.batches(), data):
            values = runner.infer(feed, wanted) if wanted else {}
            typed = runner.typed_feeds(feed)
            values.update({t: np.asarray(typed[t]) for t in fed})
            yield values
    finally:
        runner.close()


def channel_max(
    model: onnx.ModelProto,
    data: DataSource,
    tensors: list[str],
    *,
    axis: int | Mapping[str, int] = -1,
    provider: str | None = None,
) -> dict[str, np.ndarray]:
    """max|X_c| per channel ``c`` (along ``axis``, or each tensor's own) of each tensor over
    ``data``: one streamed FP32 pass, a running maximum over every other axis; non-finite
    values left out."""
    maxima: dict[str, np.ndarray] = {}
    for values in stream_activations(model, data, tensors, provider=provider):
        for name, value in values.items():
            along = axis if isinstance(axis, int) else axis[name]
            batch = _batch_channel_max(np.asarray(value), along)
            maxima[name] = batch if name not in maxima else np.maximum(maxima[name], batch)
    return maxima


def _batch_channel_max(value: np.ndarray, axis: int) -> np.ndarray:
    if value.ndim == 0:
        value = value.reshape(1)
    magnitude = np.abs(np.moveaxis(value.astype(np.float32, copy=False), axis, -1))
    magnitude[~np.isfinite(magnitude)] = 0
    return magnitude.reshape(-1, magnitude.shape[-1]).max(axis=0, initial=0.0)
