"""SmoothQuant-style smoothing (quantbench.refine.smooth), against numpy and onnxruntime.

The smoothing factors are computed here from the formula, s_j = max|X_j|^a / max|W_j|^(1-a),
with max|X_j| read from onnxruntime; the FP32 function is checked with onnxruntime.
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
from quantbench.refine import SMOOTH
from quantbench.refine.smooth import activation_channel_max, smooth

K = 8
OUTLIER = 3
RNG = np.random.default_rng(11)
GAMMA = (1 + 0.1 * RNG.standard_normal(K)).astype(np.float32)
GAMMA[OUTLIER] *= 100  # LayerNorm outliers come from a few large scales
BETA = (0.1 * RNG.standard_normal(K)).astype(np.float32)
QKV = {n: (RNG.standard_normal((K, 6)) * 0.3).astype(np.float32) for n in ("wq", "wk", "wv")}


def make(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "smooth_test", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def qkv_model() -> onnx.ModelProto:
    """h -> LayerNormalization -> X -> MatMul x3 (Q, K, V); X feeds nothing else."""
    nodes = [helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["x"], name="ln")]
    nodes += [helper.make_node("MatMul", ["x", w], [w[1]], name=f"proj_{w[1]}") for w in QKV]
    return make(
        nodes,
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 5, K])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", 5, 6]) for o in "qkv"],
        [("gamma", GAMMA), ("beta", BETA), *QKV.items()],
    )


def residual_model() -> onnx.ModelProto:
    """h -> LayerNormalization -> X -> MatMul(W [K, K]) -> Add(X, .) -> y: X also feeds the
    residual Add, so the LayerNorm cannot take 1/s."""
    nodes = [
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["x"], name="ln"),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
        helper.make_node("Add", ["x", "m"], ["y"], name="residual"),
    ]
    w = (RNG.standard_normal((K, K)) * 0.3).astype(np.float32)
    return make(
        nodes,
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 5, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, K])],
        [("gamma", GAMMA), ("beta", BETA), ("w", w)],
    )


def feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    return [{"h": rng.standard_normal((n, 5, K)).astype(np.float32)} for n in (6, 4)]


def source(m: onnx.ModelProto):
    return open_data(feeds(), open_graph(m, require_fixed_rank=False).inputs)


def run(m: onnx.ModelProto, outputs: list[str], data=None) -> list[np.ndarray]:
    """``outputs`` of ``m`` over every feed, concatenated on the batch axis."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in outputs if t not in have)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    parts = [session.run(outputs, f) for f in data or feeds()]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(outputs))]


def initializers(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def node(m: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.name == name)


def by_hand(x: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s from the formula: max|X_j| over every leading axis, max|W_j| over every weight's row."""
    x_max = np.abs(x.astype(np.float64)).reshape(-1, x.shape[-1]).max(0)
    w_max = np.max([np.abs(w.astype(np.float64)).max(1) for w in weights], axis=0)
    return x_max**alpha / w_max ** (1 - alpha)


def int8_error(x: np.ndarray, w: np.ndarray) -> float:
    """Relative squared error of X W with X per-tensor and W per-output-channel symmetric
    INT8 (numpy)."""
    x, w = x.reshape(-1, x.shape[-1]).astype(np.float64), w.astype(np.float64)
    sx = np.abs(x).max() / 127
    sw = np.abs(w).max(0, keepdims=True) / 127
    xq = np.clip(np.round(x / sx), -127, 127) * sx
    wq = np.clip(np.round(w / sw), -127, 127) * sw
    exact = x @ w
    return float(((xq @ wq - exact) ** 2).sum() / (exact**2).sum())


@pytest.fixture(scope="module")
def qkv():
    m = qkv_model()
    return m, smooth(m, source(m), alpha=0.5)


def test_fp32_function_is_unchanged(qkv):
    original, result = qkv
    assert result.name == SMOOTH and not result.skipped
    for before, after in zip(run(original, list("qkv")), run(result.model, list("qkv"))):
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * np.abs(before).max())


def test_layernorm_scale_and_bias_take_one_over_the_shared_s(qkv):
    original, result = qkv
    (x,) = run(original, ["x"])
    s = by_hand(x, list(QKV.values()), 0.5)
    ln = node(result.model, "ln")
    inits = initializers(result.model)
    np.testing.assert_allclose(inits[ln.input[1]], GAMMA / s, rtol=1e-5)
    np.testing.assert_allclose(inits[ln.input[2]], BETA / s, rtol=1e-5)
    for w_name, w in QKV.items():
        proj = node(result.model, f"proj_{w_name[1]}")
        assert proj.input[0] == "x"  # folded: no Mul
        np.testing.assert_allclose(inits[proj.input[1]], w * s[:, None], rtol=1e-5)
    assert not [n for n in result.model.graph.node if n.op_type == "Mul"]
    # the replaced constants are gone
    assert not {"gamma", "beta", *QKV} & set(inits)
    # x (the LayerNorm's output) now holds x / s under its own name
    assert result.rescaled == ["x"]


def test_the_activation_channel_range_shrinks(qkv):
    original, result = qkv
    (x,) = run(original, ["x"])
    (x_after,) = run(result.model, ["x"])
    (change,) = result.layers
    assert change.node == "x -> proj_q, proj_k, proj_v"

    def ratio(v: np.ndarray) -> float:
        per_channel = np.abs(v).reshape(-1, K).max(0)
        return per_channel.max() / np.median(per_channel)

    assert change.before == pytest.approx(ratio(x), rel=1e-5)
    assert change.after == pytest.approx(ratio(x_after), rel=1e-4)
    assert change.after < change.before / 5
    assert "alpha 0.5" in change.detail and "LayerNormalization ln" in change.detail


def test_int8_error_of_the_product_drops(qkv):
    """X per-tensor, W per output channel, both INT8 (numpy): X'W' loses less than XW."""
    original, result = qkv
    (x,) = run(original, ["x"])
    (x_after,) = run(result.model, ["x"])
    inits = initializers(result.model)
    w_after = inits[node(result.model, "proj_q").input[1]]
    before, after = int8_error(x, QKV["wq"]), int8_error(x_after, w_after)
    assert after < before / 4


def test_a_mul_feeds_the_projection_and_the_residual_keeps_x():
    m = residual_model()
    result = smooth(m, source(m))
    (before,) = run(m, ["y"])
    (after,) = run(result.model, ["y"])
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * np.abs(before).max())
    (mul,) = [n for n in result.model.graph.node if n.op_type == "Mul"]
    assert mul.input[0] == "x" and mul.output[0] == "x_smooth"
    assert node(result.model, "proj").input[0] == "x_smooth"
    assert list(node(result.model, "residual").input) == ["x", "m"]
    inits = initializers(result.model)
    np.testing.assert_array_equal(inits[node(result.model, "ln").input[1]], GAMMA)
    (x,) = run(m, ["x"])
    s = by_hand(x, [initializers(m)["w"]], 0.5)
    np.testing.assert_allclose(inits[mul.input[1]], 1 / s, rtol=1e-5)
    assert "Mul x_smooth inserted" in result.layers[0].detail
    assert "1 other consumer(s) keep x" in result.layers[0].detail
    assert result.rescaled == []  # x keeps its values; x / s is a new tensor, x_smooth


def test_gemm_trans_b_scales_the_weight_columns():
    """Gemm(X, W [N, K], transB=1) on a residual sum: W' = W diag(s), X through a Mul."""
    w = (RNG.standard_normal((6, K)) * 0.3).astype(np.float32)
    m = make(
        [helper.make_node("Add", ["h", "h"], ["x2"], name="residual"),
         helper.make_node("Gemm", ["x2", "w"], ["y"], name="fc", transB=1)],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [("w", w)],
    )  # fmt: skip
    rng = np.random.default_rng(4)
    data = [
        {
            "h": rng.standard_normal((16, K)).astype(np.float32)
            * np.where(np.arange(K) == OUTLIER, 50, 1).astype(np.float32)
        }
    ]
    result = smooth(m, open_data(data, open_graph(m).inputs), alpha=0.7)
    s = by_hand(2 * data[0]["h"], [w.T], 0.7)
    fc = node(result.model, "fc")
    np.testing.assert_allclose(initializers(result.model)[fc.input[1]], w * s, rtol=1e-5)
    (before,), (after,) = run(m, ["y"], data), run(result.model, ["y"], data)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * np.abs(before).max())


def test_channel_max_measured_once_serves_several_alphas():
    m = qkv_model()
    maxima = activation_channel_max(m, source(m), ["x"])
    (x,) = run(m, ["x"])
    np.testing.assert_allclose(maxima["x"], np.abs(x).reshape(-1, K).max(0), rtol=1e-6)
    for alpha in (0.3, 0.8):
        given = smooth(m, None, alpha=alpha, channel_max=maxima)  # no data read
        measured = smooth(m, source(m), alpha=alpha)
        assert given.model.SerializeToString() == measured.model.SerializeToString()


def test_the_model_is_not_mutated_and_alpha_is_checked():
    m = qkv_model()
    before = m.SerializeToString()
    smooth(m, source(m))
    assert m.SerializeToString() == before
    with pytest.raises(QuantbenchError, match="alpha"):
        smooth(m, source(m), alpha=1.5)
    with pytest.raises(QuantbenchError, match="no channel maxima for x"):
        smooth(m, None)


def test_a_model_without_targets_is_skipped():
    m = make(
        [helper.make_node("MatMul", ["h", "h"], ["y"], name="dynamic")],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [],
    )
    result = smooth(m, None)
    assert not result.changed and "no MatMul, Gemm or Conv with a constant weight" in result.skipped


def test_a_cnn_head_is_left_alone():
    """Flatten -> Gemm (a classifier head) has no LayerNorm or residual outliers to move: no
    Mul is put in front of it."""
    w = (RNG.standard_normal((6, K)) * 0.3).astype(np.float32)
    m = make(
        [helper.make_node("Flatten", ["h"], ["f"], name="flat"),
         helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [("w", w)],
    )  # fmt: skip
    data = [{"h": RNG.standard_normal((4, K)).astype(np.float32)}]
    result = smooth(m, open_data(data, open_graph(m).inputs))
    assert not result.changed and result.skipped
    assert [n.op_type for n in result.model.graph.node] == ["Flatten", "Gemm"]


def _product_model() -> onnx.ModelProto:
    """h -> SiLU as a decomposed exporter writes it (Sigmoid, then Mul(h, sigmoid(h))) -> x ->
    MatMul(W [K, K]) -> y: the feed-forward down-projection's input is a product."""
    w = (RNG.standard_normal((K, K)) * 0.3).astype(np.float32)
    return make(
        [helper.make_node("Sigmoid", ["h"], ["g"], name="gate"),
         helper.make_node("Mul", ["h", "g"], ["x"], name="silu"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="down")],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 5, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, K])],
        [("w", w)],
    )  # fmt: skip


def _product_data(outlier: float) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(4)
    h = rng.standard_normal((6, 5, K)).astype(np.float32)
    h[..., OUTLIER] *= outlier
    return [{"h": h}]


def test_a_product_with_outlier_channels_is_smoothed():
    """SiLU's Mul with one channel 20x the others (max/median of max|x_j| far above 2): a Mul
    x * (1/s) is put before the projection, s by the formula, the FP32 function kept."""
    m = _product_model()
    data = _product_data(20.0)
    result = smooth(m, open_data(data, open_graph(m).inputs))
    assert result.changed
    (mul,) = [n for n in result.model.graph.node if n.op_type == "Mul" and n.name != "silu"]
    assert mul.input[0] == "x"
    (x,) = run(m, ["x"], data)
    s = by_hand(x, [initializers(m)["w"]], 0.5)
    np.testing.assert_allclose(initializers(result.model)[mul.input[1]], 1 / s, rtol=1e-5)
    (before,) = run(m, ["y"], data)
    (after,) = run(result.model, ["y"], data)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * np.abs(before).max())


def test_a_product_with_flat_channels_is_left_alone():
    """The same product with every channel alike (an LSTM's o * tanh(c) spans 1.0-1.3x on
    captcha-crnn): nothing to migrate, so no Mul and no judging; the reason says so."""
    m = _product_model()
    data = _product_data(1.0)
    (x,) = run(m, ["x"], data)
    maxima = np.abs(x).reshape(-1, K).max(axis=0)
    assert maxima.max() / np.median(maxima) <= 2.0  # flat by the same measure, by hand
    result = smooth(m, open_data(data, open_graph(m).inputs))
    assert not result.changed and "channels already flat" in result.skipped
    assert [n.op_type for n in result.model.graph.node] == ["Sigmoid", "Mul", "MatMul"]


C = 6


def _conv_model(depthwise: bool) -> onnx.ModelProto:
    """h -> Add(h, b) -> Identity (Paddle's exporter writes one after most ops) -> x -> Conv
    3x3 (plain 6 -> 4, or depthwise) -> y: PP-OCRv5's recognizer reads its convs' inputs that
    way, with channels 3-50x apart."""
    shape = (C, 1, 3, 3) if depthwise else (4, C, 3, 3)
    w = (RNG.standard_normal(shape) * 0.3).astype(np.float32)
    b = (0.1 * RNG.standard_normal((1, C, 1, 1))).astype(np.float32)
    out = C if depthwise else 4
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1],
                            group=C if depthwise else 1)  # fmt: skip
    return make(
        [helper.make_node("Add", ["h", "b"], ["a"], name="affine"),
         helper.make_node("Identity", ["a"], ["x"], name="id"), conv],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", C, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", out, 5, 7])],
        [("w", w), ("b", b)],
    )  # fmt: skip


def _conv_data() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    h = rng.standard_normal((4, C, 5, 7)).astype(np.float32)
    h[:, 2] *= 30  # one channel 30x the others
    return [{"h": h}]


@pytest.mark.parametrize("depthwise", [False, True])
def test_a_conv_reading_an_add_through_identity_is_smoothed(depthwise):
    """A Conv's input channels take s like a MatMul's rows: s from the formula with max|X_c|
    over N, H, W and max|W| over the weight's other axes (a depthwise conv's channel c is its
    own output channel c), 1/s in a Mul shaped [C, 1, 1] before the conv, W scaled along its
    input channels; the FP32 function is kept and the activation's channels come together."""
    m = _conv_model(depthwise)
    data = _conv_data()
    result = smooth(m, open_data(data, open_graph(m).inputs))
    assert result.changed
    (mul,) = [n for n in result.model.graph.node if n.op_type == "Mul"]
    assert mul.input[0] == "x"
    (x,) = run(m, ["x"], data)
    x_max = np.abs(x.astype(np.float64)).max(axis=(0, 2, 3))
    w = initializers(m)["w"].astype(np.float64)
    w_max = np.abs(w).max(axis=(1, 2, 3)) if depthwise else np.abs(w).max(axis=(0, 2, 3))
    s = np.sqrt(x_max) / np.sqrt(w_max)
    inverse = initializers(result.model)[mul.input[1]]
    assert inverse.shape == (C, 1, 1)
    np.testing.assert_allclose(inverse.reshape(-1), 1 / s, rtol=1e-5)
    scaled = initializers(result.model)[node(result.model, "conv").input[1]]
    along = (slice(None), None, None, None) if depthwise else (None, slice(None), None, None)
    np.testing.assert_allclose(scaled, w * s[along], rtol=1e-5)
    (before,) = run(m, ["y"], data)
    (after,) = run(result.model, ["y"], data)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * np.abs(before).max())
    spread = x_max.max() / np.median(x_max)
    assert result.layers[0].before == pytest.approx(spread)
    assert result.layers[0].after < spread / 3


def test_a_grouped_conv_is_left_alone():
    """A grouped (not depthwise) conv's input channel c meets only its group's weights: no
    single factor per channel to give it here, so it is not a target."""
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    m = make(
        [helper.make_node("Add", ["h", "h"], ["x"], name="twice"),
         helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1], group=2)],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", C, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 7])],
        [("w", w)],
    )  # fmt: skip
    result = smooth(m, open_data(_conv_data(), open_graph(m).inputs))
    assert not result.changed and "no MatMul, Gemm or Conv" in result.skipped
