"""Streaming collection: statistics derived for Relu / value-preserving ops equal direct ones."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_example

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import open_data
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.stats.derivation import derivation_plan
from quantbench.stats.tensorstats import TensorStats


def _direct(graph, data, tensors, batch_size):
    """Reference: every tensor exposed by onnxruntime and binned directly."""
    inputs = {s.name for s in graph.inputs}
    outputs = [t for t in tensors if t not in inputs]
    runner = OnnxRuntimeRunner(expose(graph.model, outputs, graph.elem_types))
    ref = {n: TensorStats(n) for n in tensors}
    for feed in open_data(data, graph.inputs, batch_size=batch_size).batches():
        values = {**feed, **runner.infer(feed, outputs)}
        for n in tensors:
            ref[n].update(values[n])
    return ref


@pytest.mark.parametrize("which", ["synthetic", "example"])
def test_derived_statistics_are_bit_identical(which, cnn_path, cnn_data):
    if which == "example":
        ex = require_example()
        path, data, bs = ex / "tinycnn.onnx", ex / "calib.npz", None  # static batch 1
    else:
        path, data, bs = cnn_path, cnn_data, 3
    g = open_graph(path)
    tensors = calibration_tensors(g, "all")
    plan = derivation_plan(g, tensors)
    assert any(kind == "relu" for kind, _ in plan.values())
    got = collect_stats(g, open_data(data, g.inputs, batch_size=bs), tensors, show_progress=False)
    ref = _direct(g, data, tensors, bs)
    for n in tensors:
        a, b = got[n], ref[n]
        assert (a.exponent, a.count, a.min, a.max) == (b.exponent, b.count, b.min, b.max), n
        assert np.array_equal(a.counts, b.counts), n


def test_plan_derives_relu_and_reshape_only_from_measured(cnn_path):
    g = open_graph(cnn_path)
    plan = derivation_plan(g, calibration_tensors(g, "all"))
    assert plan["r1"] == ("relu", "c1")
    assert plan["flat"] == ("same", "gap")
    assert "c2" not in plan and "sum" not in plan


def test_expose_with_the_models_own_types_skips_nothing(cnn_path, monkeypatch):
    """``types_of_model``: the graph's own inferred types give the outputs a second inference
    would (and it is not run); a tensor they do not type is still inferred."""
    from quantbench.backends import onnxruntime as backend

    g = open_graph(cnn_path)
    names = [t for t in calibration_tensors(g, "all") if t not in {s.name for s in g.inputs}]

    def types(model):
        return {o.name: o.type.tensor_type.elem_type for o in model.graph.output}

    inferred = types(expose(g.model, names, g.elem_types))
    calls = []
    real = backend._inferred_types
    monkeypatch.setattr(
        backend, "_inferred_types", lambda m, n: calls.append(list(n)) or real(m, n)
    )
    assert types(expose(g.model, names, g.elem_types, types_of_model=True)) == inferred
    assert calls == []
    partial = {k: v for k, v in g.elem_types.items() if k != names[0]}
    assert types(expose(g.model, names, partial, types_of_model=True)) == inferred
    assert len(calls) == 1 and names[0] in calls[0]


def test_batches_read_ahead_keep_their_order_and_errors():
    """The next batch is read in a thread while this one runs: same order, and a data error
    surfaces in the caller as it would without the read-ahead."""
    import threading

    from quantbench.data.sources import prefetched
    from quantbench.errors import QuantbenchError

    readers = []

    def feeds():
        for i in range(5):
            readers.append(threading.current_thread().name)
            yield {"i": i}
        raise QuantbenchError("data.npz: sample 5 is broken")

    got = []
    with pytest.raises(QuantbenchError, match="sample 5 is broken"):
        for feed in prefetched(feeds()):
            got.append(feed["i"])
    assert got == [0, 1, 2, 3, 4]
    assert all(name.startswith("quantbench-read") for name in readers)


def test_types_are_inferred_without_weights_as_with_them(cnn_path):
    """``weightless`` drops only large payloads (a small shape tensor is kept) and ONNX type
    inference gives every tensor the type it gives on the full model."""
    import onnx
    from onnx import shape_inference

    from quantbench.model.graph import WEIGHTLESS_ABOVE, weightless

    model = onnx.load(cnn_path)
    light = weightless(model)
    for full, stub in zip(model.graph.initializer, light.graph.initializer, strict=True):
        assert (stub.name, stub.data_type, list(stub.dims)) == (
            full.name,
            full.data_type,
            list(full.dims),
        )
        assert stub.ByteSize() < full.ByteSize() or full.ByteSize() <= WEIGHTLESS_ABOVE
    assert any(i.ByteSize() > WEIGHTLESS_ABOVE for i in model.graph.initializer)

    def types(m):
        g = shape_inference.infer_shapes(m, strict_mode=False).graph
        return {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.output]}

    assert types(light) == types(model) and len(types(model)) > 5
    assert open_graph(cnn_path).elem_types == {
        **types(model),
        **{i.name: i.data_type for i in model.graph.initializer},
        **{v.name: v.type.tensor_type.elem_type for v in model.graph.input},
    }


def test_expose_in_place_adds_the_outputs_to_the_callers_model(cnn_path):
    """``in_place``: the caller's own model gets the outputs (no copy of its weights); without
    it, a copy does and the model is left as it was."""
    g = open_graph(cnn_path)
    names = [t for t in calibration_tensors(g, "all") if t not in {s.name for s in g.inputs}]
    before = g.model.SerializeToString()
    copied = expose(g.model, names, g.elem_types)
    assert copied is not g.model and g.model.SerializeToString() == before
    own = onnx.ModelProto()
    own.CopyFrom(g.model)
    same = expose(own, names, g.elem_types, in_place=True)
    assert same is own
    assert same.SerializeToString() == copied.SerializeToString()
