"""FP32 activations of a model over calibration data, streamed batch by batch.

The refinement passes read the inputs or outputs of chosen layers (bias correction: the mean
output shift; rounding: second moments of layer inputs; smoothing: per-channel input maxima).
Each reads what it needs from one streamed pass and keeps only running sums: nothing holds
more than one batch of activations.
"""

from __future__ import annotations

from collections.abc import Iterator

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
