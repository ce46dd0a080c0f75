"""Empirical bias correction (quantbench.refine.biascorrect), against numpy and onnxruntime.

The expected biases are computed here without the module: each layer's FP32 input is read from
onnxruntime, the layer is run on its own with the INT8-grid weight ``Wq`` (numpy) and with
``W``, and ``b - mean(difference)`` per channel is what the corrected bias must be.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import open_graph
from quantbench.refine import BIAS
from quantbench.refine.biascorrect import correct_bias

RNG = np.random.default_rng(7)
W = {
    "w_conv": RNG.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3,
    "b_conv": RNG.standard_normal(6).astype(np.float32) * 0.1,
    "w_nobias": RNG.standard_normal((6, 6, 3, 3)).astype(np.float32) * 0.2,
    "w_dw": RNG.standard_normal((6, 1, 3, 3)).astype(np.float32) * 0.5,
    "b_dw": RNG.standard_normal(6).astype(np.float32) * 0.1,
    "w_gemm": RNG.standard_normal((5, 6)).astype(np.float32) * 0.4,
    "b_gemm": RNG.standard_normal(5).astype(np.float32) * 0.1,
    "w_mm": RNG.standard_normal((5, 3)).astype(np.float32) * 0.4,
    "b_mm": RNG.standard_normal(3).astype(np.float32) * 0.1,
    "w_mm2": RNG.standard_normal((5, 2)).astype(np.float32) * 0.4,
}
#: layer -> (its input tensor, its weight, output-channel axis, its bias, where the bias adds)
LAYERS = {
    "conv": ("x", "w_conv", 0, "b_conv", "c1"),
    "conv_nobias": ("r1", "w_nobias", 0, None, "c2"),
    "dwconv": ("c2", "w_dw", 0, "b_dw", "c3"),
    "gemm": ("f", "w_gemm", 0, "b_gemm", "g"),
    "mm": ("g", "w_mm", 1, "b_mm", "y"),
    "mm_nobias": ("g", "w_mm2", 1, None, "y2"),
}


def model(opset: int = 17) -> onnx.ModelProto:
    """Conv(+b) -> Relu -> Conv(no b) -> depthwise Conv(+b) -> GAP -> Gemm(transB) ->
    MatMul + Add -> y, and MatMul (no bias, a graph output) -> y2."""
    nodes = [
        helper.make_node("Conv", ["x", "w_conv", "b_conv"], ["c1"], name="conv", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w_nobias"], ["c2"], name="conv_nobias", pads=[1] * 4),
        helper.make_node(
            "Conv", ["c2", "w_dw", "b_dw"], ["c3"], name="dwconv", pads=[1] * 4, group=6
        ),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w_gemm", "b_gemm"], ["g"], name="gemm", transB=1),
        helper.make_node("MatMul", ["g", "w_mm"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b_mm"], ["y"], name="mm_bias"),
        helper.make_node("MatMul", ["g", "w_mm2"], ["y2"], name="mm_nobias"),
    ]
    graph = helper.make_graph(
        nodes,
        "bias_test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["N", 2]),
        ],
        [numpy_helper.from_array(v, k) for k, v in W.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def feeds() -> list[dict[str, np.ndarray]]:
    """Inputs with a non-zero mean (a weight error's mean shift shows), in uneven batches."""
    rng = np.random.default_rng(3)
    return [{"x": (rng.random((n, 4, 8, 8)) * 2 - 0.3).astype(np.float32)} for n in (8, 5, 11)]


def source(m: onnx.ModelProto):
    return open_data(feeds(), open_graph(m, require_fixed_rank=False).inputs)


def run(m: onnx.ModelProto, outputs: list[str]) -> list[np.ndarray]:
    """``outputs`` of ``m`` over every feed, concatenated on the batch axis."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in outputs if t not in have)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    parts = [session.run(outputs, f) for f in feeds()]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(outputs))]


def on_grid(w: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel symmetric INT8 fake quantization, written out here."""
    moved = np.moveaxis(w, axis, 0)
    scale = (np.abs(moved).reshape(len(moved), -1).max(1) / np.float32(127)).astype(np.float32)
    scale = scale.reshape(-1, *([1] * (w.ndim - 1)))
    return np.moveaxis(np.clip(np.round(moved / scale), -127, 127) * scale, 0, axis)


def alone(op: str, x: np.ndarray, w: np.ndarray, **attrs) -> np.ndarray:
    """One node on its own in onnxruntime (no bias)."""
    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "alone",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype(np.float32), "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def expected_shift(name: str) -> np.ndarray:
    """mean over the data of layer(x; Wq) - layer(x; W), per output channel (float64)."""
    x_name, w_name, axis, _, _ = LAYERS[name]
    (x,) = run(model(), [x_name])
    w = W[w_name]
    if name.endswith("conv") or name == "conv_nobias":
        attrs = {"pads": [1] * 4, "group": 6 if name == "dwconv" else 1}
        diff = alone("Conv", x, on_grid(w, axis), **attrs) - alone("Conv", x, w, **attrs)
        return diff.astype(np.float64).mean(axis=(0, 2, 3))
    wq = on_grid(w, axis)
    if name == "gemm":
        diff = x.astype(np.float64) @ (wq.astype(np.float64) - w).T
    else:
        diff = x.astype(np.float64) @ (wq.astype(np.float64) - w)
    return diff.mean(axis=0)


def initializers(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def bias_of(m: onnx.ModelProto, layer: str) -> np.ndarray:
    """The constant that holds ``layer``'s bias in ``m`` (Conv/Gemm input 2, else the Add
    after the MatMul)."""
    inits = initializers(m)
    node = next(n for n in m.graph.node if n.name == layer)
    if node.op_type != "MatMul":
        return inits[node.input[2]]
    add = next(n for n in m.graph.node if n.op_type == "Add" and node.output[0] in n.input)
    return inits[next(t for t in add.input if t != node.output[0])]


@pytest.fixture(scope="module", params=[10, 18], ids=["opset10", "opset18"])
def refined(request):
    m = model(request.param)
    return m, correct_bias(m, source(m))


def test_corrected_biases_are_b_minus_the_mean_shift(refined):
    _, result = refined
    assert result.name == BIAS and not result.skipped
    assert sorted(c.node for c in result.layers) == sorted(LAYERS)
    for name, (_, _, _, bias, _) in LAYERS.items():
        b = W[bias] if bias else 0.0
        want = b - expected_shift(name)
        np.testing.assert_allclose(bias_of(result.model, name), want, rtol=1e-4, atol=2e-6)


def test_weights_stay_fp32_and_tensor_names_stay(refined):
    original, result = refined
    inits = initializers(result.model)
    for _, w_name, _, _, _ in LAYERS.values():
        np.testing.assert_array_equal(inits[w_name], W[w_name])
    assert [o.name for o in result.model.graph.output] == ["y", "y2"]
    # the bias-less Conv got a third input; the bias-less MatMul an Add that keeps y2's name
    assert len(next(n for n in result.model.graph.node if n.name == "conv_nobias").input) == 3
    (add,) = [n for n in result.model.graph.node if n.output[0] == "y2"]
    assert add.op_type == "Add"
    onnx.checker.check_model(result.model)
    # replaced bias initializers are gone, nothing else is
    assert set(initializers(original)) - set(inits) == {"b_conv", "b_dw", "b_gemm", "b_mm"}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_int8_weights_keep_the_fp32_mean_after_correction(refined, layer):
    """With the layer's weight replaced by Wq (here, in numpy) in the model corrected at that
    layer alone (the others' corrections would change its input), its output's mean per
    channel over the calibration data is FP32's; without the correction it is not."""
    original, _ = refined
    result = correct_bias(original, source(original), layers=[layer])
    _, w_name, axis, _, out = LAYERS[layer]
    (fp32,) = run(original, [out])

    def quantized(m: onnx.ModelProto) -> onnx.ModelProto:
        q = onnx.ModelProto.FromString(m.SerializeToString())
        (init,) = [i for i in q.graph.initializer if i.name == w_name]
        init.CopyFrom(numpy_helper.from_array(on_grid(W[w_name], axis), w_name))
        return q

    channel_axes = (0, 2, 3) if fp32.ndim == 4 else 0
    want = fp32.astype(np.float64).mean(axis=channel_axes)
    (after,) = run(quantized(result.model), [out])
    (before,) = run(quantized(original), [out])
    np.testing.assert_allclose(after.astype(np.float64).mean(axis=channel_axes), want, atol=2e-6)
    assert np.abs(before.mean(axis=channel_axes) - want).max() > 1e-4


def test_records_say_what_changed(refined):
    _, result = refined
    by = {c.node: c for c in result.layers}
    for change in result.layers:
        assert change.after > change.before  # the removed mean was part of the noise
        assert "dB" in change.measure
    assert "bias input added" in by["conv_nobias"].detail
    assert "bias Add" in by["mm_nobias"].detail
    assert "bias corrected" in by["gemm"].detail


def test_the_fp32_model_is_not_mutated():
    m = model()
    before = m.SerializeToString()
    correct_bias(m, source(m))
    assert m.SerializeToString() == before


def test_layers_restricts_the_pass():
    m = model()
    result = correct_bias(m, source(m), layers=["dwconv"])
    assert [c.node for c in result.layers] == ["dwconv"]
    np.testing.assert_array_equal(bias_of(result.model, "conv"), W["b_conv"])
    assert [c.node for c in correct_bias(m, source(m), layers="gemm").layers] == ["gemm"]
    with pytest.raises(QuantbenchError, match="no node named nope"):
        correct_bias(m, source(m), layers=["nope"])
    relu_only = correct_bias(m, source(m), layers=["relu"])
    assert not relu_only.changed and "relu: a Relu is not Conv, Gemm or MatMul" in relu_only.skipped


def test_a_model_without_eligible_layers_is_skipped():
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "x"], ["y"], name="dynamic"),
        ],
        "no_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = open_data([{"x": np.ones((4, 4), np.float32)}], open_graph(m).inputs)
    result = correct_bias(m, data)
    assert not result.changed
    assert "no Conv, Gemm or MatMul with a constant weight" in result.skipped
    assert "dynamic: its weight is computed at run time" in result.skipped


def test_all_weights_on_the_grid_drift_less_at_the_outputs(refined):
    """Every weight on its INT8 grid at once (upstream errors now reach each layer, which the
    FP32-input correction does not see): the outputs' mean error still shrinks severalfold."""
    original, result = refined

    def quantized(m: onnx.ModelProto) -> onnx.ModelProto:
        q = onnx.ModelProto.FromString(m.SerializeToString())
        grid = {w: on_grid(W[w], axis) for _, w, axis, _, _ in LAYERS.values()}
        for init in q.graph.initializer:
            if init.name in grid:
                init.CopyFrom(numpy_helper.from_array(grid[init.name], init.name))
        return q

    fp32 = run(original, ["y", "y2"])
    plain = run(quantized(original), ["y", "y2"])
    corrected = run(quantized(result.model), ["y", "y2"])
    for f, p, c in zip(fp32, plain, corrected, strict=True):
        assert np.abs(c.mean(0) - f.mean(0)).max() * 3 < np.abs(p.mean(0) - f.mean(0)).max()


def test_gemm_beta_and_a_missing_c():
    """Gemm's C enters times beta: C' = C - shift / beta; a Gemm without C gets one (transB=0:
    the weight's output channels are its columns)."""
    rng = np.random.default_rng(5)
    w1, w2 = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2))
    c1 = rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "c1"], ["y1"], name="beta", beta=2.5),
            helper.make_node("Gemm", ["x", "w2"], ["y2"], name="no_c", alpha=0.5),
        ],
        "gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 3]) for y in ("y1", "y2")],
        [numpy_helper.from_array(v, k) for k, v in {"w1": w1, "w2": w2, "c1": c1}.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = (rng.random((32, 4)) + 0.5).astype(np.float32)
    result = correct_bias(m, open_data([{"x": x}], open_graph(m).inputs))
    x64 = x.astype(np.float64)
    shift1 = (x64 @ (on_grid(w1, 1).astype(np.float64) - w1)).mean(0)
    shift2 = 0.5 * (x64 @ (on_grid(w2, 1).astype(np.float64) - w2)).mean(0)
    np.testing.assert_allclose(bias_of(result.model, "beta"), c1 - shift1 / 2.5, atol=1e-6)
    np.testing.assert_allclose(bias_of(result.model, "no_c"), -shift2, atol=1e-6)
