"""Cross-layer equalization (quantbench.refine.equalize).

The references are independent of the code under test: onnxruntime runs the original and the
refined model (the same function in FP32), the 2-channel example's numbers are worked out by
hand, and weight ranges and SQNR are recomputed here with plain loops.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.refine import EQUALIZE, Refined
from quantbench.refine.equalize import NOTHING_ELIGIBLE, equalize

TINYCNN = Path(__file__).resolve().parents[1] / "examples" / "tinycnn" / "tinycnn.onnx"
#: the outputs here are all NCHW; their sizes are left to onnxruntime
_ANY4D = ["n", "c", "h", "w"]


# --- building and running small models ---------------------------------------------------------


def _conv(name: str, x: str, w: str, out: str, b: str | None = None, **attrs) -> onnx.NodeProto:
    inputs = [x, w] + ([b] if b else [])
    return helper.make_node("Conv", inputs, [out], name=name, **attrs)


def _model(
    nodes: list[onnx.NodeProto],
    weights: dict[str, np.ndarray],
    x_shape: list[int],
    outputs: list[str],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "eq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, _ANY4D) for o in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return session.run(None, {name: x})


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _assert_same_function(original: onnx.ModelProto, refined: onnx.ModelProto, shape) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 2
    for want, got in zip(_run(original, x), _run(refined, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def _assert_same_structure(original: onnx.ModelProto, refined: onnx.ModelProto) -> None:
    """Only initializer values may differ: nodes, names, order, dtypes and shapes as they were
    (the rewritten weights are float32 like the originals)."""
    assert list(refined.graph.node) == list(original.graph.node)
    assert list(refined.graph.input) == list(original.graph.input)
    assert list(refined.graph.output) == list(original.graph.output)
    before = [(t.name, t.data_type, list(t.dims)) for t in original.graph.initializer]
    after = [(t.name, t.data_type, list(t.dims)) for t in refined.graph.initializer]
    assert after == before
    onnx.checker.check_model(refined, full_check=True)


def _equalized(model: onnx.ModelProto, **options) -> Refined:
    """equalize(), checked to leave its input alone and the graph's structure as it was."""
    untouched = model.SerializeToString()
    refined = equalize(model, **options)
    assert model.SerializeToString() == untouched
    assert refined.name == EQUALIZE
    _assert_same_structure(model, refined.model)
    return refined


def _unbalanced(shape: tuple[int, ...], factors: list[float], axis: int, seed: int) -> np.ndarray:
    """Random weights whose slices along ``axis`` span very different ranges."""
    values = np.random.default_rng(seed).standard_normal(shape)
    view = [1] * len(shape)
    view[axis] = -1
    return (values * np.asarray(factors).reshape(view)).astype(np.float32)


# --- independent references --------------------------------------------------------------------


def _first_ranges(w1: np.ndarray) -> np.ndarray:
    return np.array([np.abs(w1[i]).max() for i in range(w1.shape[0])])


def _second_ranges(w2: np.ndarray, group: int) -> np.ndarray:
    """max|W2| over the weights reading each input channel, by the ONNX grouping rule."""
    out_per_group, in_per_group = w2.shape[0] // group, w2.shape[1]
    ranges = []
    for channel in range(in_per_group * group):
        g, local = divmod(channel, in_per_group)
        rows = w2[g * out_per_group : (g + 1) * out_per_group, local]
        ranges.append(np.abs(rows).max())
    return np.array(ranges)


def _sqnr(w: np.ndarray) -> float:
    """Per-output-channel symmetric INT8 (max|w| / 127), the whole tensor's SQNR in dB."""
    w = w.astype(np.float64)
    total_signal = total_noise = 0.0
    for channel in w:
        step = np.abs(channel).max() / 127
        q = np.clip(np.round(channel / step), -127, 127) * step if step > 0 else channel
        total_signal += float(np.sum(channel**2))
        total_noise += float(np.sum((channel - q) ** 2))
    return 10 * np.log10(total_signal / total_noise)


# --- models --------------------------------------------------------------------------------------


def _conv_act_conv(between: list[str], seed: int = 0) -> onnx.ModelProto:
    """conv1 (3->4, 3x3, unbalanced channels) -> ops -> conv2 (4->5, 3x3)."""
    weights = {
        "w1": _unbalanced((4, 3, 3, 3), [30, 1, 0.02, 4], 0, seed),
        "b1": np.array([0.5, -0.2, 0.01, 1.0]),
        "w2": _unbalanced((5, 4, 3, 3), [0.1, 2, 50, 1], 1, seed + 1),
        "b2": np.linspace(-1, 1, 5),
    }
    nodes = [_conv("conv1", "x", "w1", "t0", "b1", pads=[1, 1, 1, 1])]
    for i, op in enumerate(between):
        attrs = {"alpha": 0.1} if op == "LeakyRelu" else {}
        if op == "MaxPool":  # same size out: conv2 reads [2, 4, 8, 8] either way
            attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
        nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=f"act{i}", **attrs))
    nodes.append(_conv("conv2", f"t{len(between)}", "w2", "y", "b2", pads=[1, 1, 1, 1]))
    return _model(nodes, weights, [2, 3, 8, 8], ["y"])


def _mobile_block() -> onnx.ModelProto:
    """conv 3->4 -> Relu -> depthwise (group 4, multiplier 2: 4->8) -> Relu -> conv 1x1 8->3."""
    weights = {
        "w1": _unbalanced((4, 3, 3, 3), [5, 0.05, 1, 20], 0, 3),
        "b1": np.array([0.1, 0.2, -0.1, 0.3]),
        "wdw": _unbalanced((8, 1, 3, 3), [0.01, 3, 1, 1, 40, 0.5, 2, 0.2], 0, 4),
        "bdw": np.linspace(-0.5, 0.5, 8),
        "w3": _unbalanced((3, 8, 1, 1), [1, 10, 0.1, 5, 0.02, 1, 3, 30], 1, 5),
    }
    nodes = [
        _conv("conv", "x", "w1", "c1", "b1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        _conv("dw", "r1", "wdw", "c2", "bdw", group=4, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        _conv("pw", "r2", "w3", "y"),
    ]
    return _model(nodes, weights, [2, 3, 8, 8], ["y"])


# --- what it rewrites ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "between",
    [[], ["Relu"], ["LeakyRelu"], ["Identity"], ["Relu", "Identity"], ["Relu", "MaxPool"]],
)
def test_conv_relu_like_conv_keeps_the_function(between):
    model = _conv_act_conv(between)
    refined = _equalized(model)
    assert [layer.node for layer in refined.layers] == ["conv1 -> conv2"]
    assert refined.skipped == "" and refined.changed
    assert refined.layers[0].measure == "weight SQNR (dB)"
    _assert_same_function(model, refined.model, [2, 3, 8, 8])
    after = _inits(refined.model)
    np.testing.assert_allclose(_first_ranges(after["w1"]), _second_ranges(after["w2"], 1), 1e-6)
    np.testing.assert_array_equal(after["b2"], _inits(model)["b2"])  # conv2's bias is untouched
    # conv1's output and every op's after it, up to what conv2 reads, hold rescaled values
    assert refined.rescaled == [f"t{i}" for i in range(len(between) + 1)]


def test_two_channels_by_hand_meet_at_the_geometric_mean():
    """W1 = [4, -0.25] (1x1, one input channel), b1 = [2, 1], W2 = [1, -16] (1x1, one output):
    r1 = [4, 0.25], r2 = [1, 16], s = sqrt(r1 / r2) = [2, 0.125]; so W1' = [2, -2],
    b1' = [1, 8], W2' = [2, -2]: both ranges sqrt(r1 * r2) = [2, 2] (powers of two: exact)."""
    weights = {
        "w1": np.array([4.0, -0.25]).reshape(2, 1, 1, 1),
        "b1": np.array([2.0, 1.0]),
        "w2": np.array([1.0, -16.0]).reshape(1, 2, 1, 1),
    }
    nodes = [_conv("first", "x", "w1", "mid", "b1"), _conv("second", "mid", "w2", "y")]
    model = _model(nodes, weights, [1, 1, 2, 2], ["y"])
    refined = _equalized(model, iterations=1)
    after = _inits(refined.model)
    np.testing.assert_array_equal(after["w1"].reshape(-1), [2.0, -2.0])
    np.testing.assert_array_equal(after["b1"], [1.0, 8.0])
    np.testing.assert_array_equal(after["w2"].reshape(-1), [2.0, -2.0])
    (layer,) = refined.layers
    assert layer.node == "first -> second"
    assert layer.detail == (
        "2 of 2 channels rescaled, W1/s and W2*s with s in 0.125..2 (through nothing)"
    )
    _assert_same_function(model, refined.model, [1, 1, 2, 2])


def test_equalizing_twice_changes_nothing_more():
    once = equalize(_conv_act_conv(["Relu"])).model
    twice = _equalized(once)
    assert not twice.changed and twice.skipped == "1 conv pair(s), all already equalized"
    assert _inits(twice.model).keys() == _inits(once).keys()
    for name, values in _inits(once).items():
        np.testing.assert_array_equal(_inits(twice.model)[name], values)


def test_mobile_block_depthwise_pairs_keep_the_function_and_balance():
    model = _mobile_block()
    refined = _equalized(model)
    assert [layer.node for layer in refined.layers] == ["conv -> dw", "dw -> pw"]
    _assert_same_function(model, refined.model, [2, 3, 8, 8])
    after = _inits(refined.model)
    # depthwise W [8, 1, 3, 3] with group 4: input channel i is read by rows 2i and 2i+1
    np.testing.assert_allclose(_first_ranges(after["w1"]), _second_ranges(after["wdw"], 4), 3e-3)
    np.testing.assert_allclose(_first_ranges(after["wdw"]), _second_ranges(after["w3"], 1), 3e-3)
    before = _inits(model)
    spread = [np.ptp(np.log(_first_ranges(w["wdw"]))) for w in (before, after)]
    assert spread[1] < spread[0]  # the depthwise output's channel ranges are more even


def test_grouped_second_conv_keeps_the_function():
    """conv2 with group 2 (4 input channels, 2 per group, 6 outputs, 3 per group)."""
    weights = {
        "w1": _unbalanced((4, 3, 3, 3), [8, 0.1, 1, 3], 0, 7),
        "w2": _unbalanced((6, 2, 3, 3), [0.2, 9], 1, 8),
    }
    nodes = [
        _conv("c1", "x", "w1", "a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        _conv("c2", "r", "w2", "y", group=2),
    ]
    model = _model(nodes, weights, [2, 3, 9, 9], ["y"])
    refined = _equalized(model, iterations=1)
    assert [layer.node for layer in refined.layers] == ["c1 -> c2"]
    _assert_same_function(model, refined.model, [2, 3, 9, 9])
    after = _inits(refined.model)
    np.testing.assert_allclose(_first_ranges(after["w1"]), _second_ranges(after["w2"], 2), 1e-6)


@pytest.mark.parametrize("slope", [np.array([0.1, 0.3, -0.2, 0.05]).reshape(4, 1, 1), 0.25])
def test_prelu_between_keeps_the_function(slope):
    model = _conv_act_conv(["Relu"])
    prelu = helper.make_node("PRelu", ["t0", "slope"], ["t1"], name="act0")
    model.graph.node[1].CopyFrom(prelu)
    model.graph.initializer.append(numpy_helper.from_array(np.float32(slope), "slope"))
    refined = _equalized(model)
    assert [layer.node for layer in refined.layers] == ["conv1 -> conv2"]
    assert "through PRelu" in refined.layers[0].detail
    np.testing.assert_array_equal(_inits(refined.model)["slope"], np.float32(slope))
    _assert_same_function(model, refined.model, [2, 3, 8, 8])


def test_weight_sqnr_of_the_pair_does_not_fall_on_an_unbalanced_pair():
    """W2's input channels differ by 10^4 in range: per output channel the small ones drown in
    the large one's INT8 step. Equalizing moves that range into W1 (quantized per channel,
    scale-free), so the worse of the two weights' SQNR rises."""
    model = _conv_act_conv(["Relu"])
    refined = _equalized(model)
    before, after = _inits(model), _inits(refined.model)
    worst_before = min(_sqnr(before["w1"]), _sqnr(before["w2"]))
    worst_after = min(_sqnr(after["w1"]), _sqnr(after["w2"]))
    assert worst_after > worst_before + 1
    (layer,) = refined.layers
    assert layer.before == pytest.approx(worst_before, abs=0.01)
    assert layer.after == pytest.approx(worst_after, abs=0.01)


def test_tinycnn_keeps_its_function():
    """tinycnn's one eligible pair: stem's ReLU output also feeds the residual Add, conv2's
    ReLU feeds the dynamic depthwise conv's hypernetwork too, conv3 ends in pooling."""
    model = onnx.load(str(TINYCNN))
    refined = _equalized(model)
    assert [layer.node for layer in refined.layers] == ["/block_conv1/Conv -> /block_conv2/Conv"]
    _assert_same_function(model, refined.model, [1, 3, 32, 32])


# --- what it leaves alone ------------------------------------------------------------------------


def _assert_left_alone(model: onnx.ModelProto) -> None:
    refined = _equalized(model)
    assert refined.layers == [] and not refined.changed
    assert refined.skipped == NOTHING_ELIGIBLE == "no conv pair joined by a ReLU-like op"
    assert refined.model.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("op", ["Clip", "Sigmoid", "HardSwish", "Relu6"])
def test_ops_that_do_not_commute_with_scaling_stop_a_pair(op):
    model = _conv_act_conv(["Relu"])
    if op == "Relu6":  # exported as Clip(0, 6)
        bounds = [numpy_helper.from_array(np.float32(v), n) for n, v in (("lo", 0), ("hi", 6))]
        model.graph.initializer.extend(bounds)
        node = helper.make_node("Clip", ["t0", "lo", "hi"], ["t1"], name="act0")
    else:
        node = helper.make_node(op, ["t0"], ["t1"], name="act0")
    model.graph.node[1].CopyFrom(node)
    _assert_left_alone(model)


def test_a_weight_shared_by_two_convs_is_left_alone():
    """conv1's weight also serves conv3, on another branch: scaling it would change conv3."""
    model = _conv_act_conv(["Relu"])
    model.graph.node.append(_conv("conv3", "x", "w1", "z", pads=[1, 1, 1, 1]))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, _ANY4D))
    _assert_left_alone(model)


def test_a_shared_second_weight_is_left_alone():
    model = _conv_act_conv(["Relu"])
    model.graph.node.append(_conv("conv3", "t1", "w2", "z"))  # t1 then has two consumers too
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, _ANY4D))
    _assert_left_alone(model)


@pytest.mark.parametrize("tensor", ["t0", "t1"])
def test_a_graph_output_between_the_convs_is_left_alone(tensor):
    model = _conv_act_conv(["Relu"])
    model.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, _ANY4D))
    _assert_left_alone(model)


def test_a_second_consumer_between_the_convs_is_left_alone():
    model = _conv_act_conv(["Relu"])
    model.graph.node.append(helper.make_node("Neg", ["t1"], ["z"], name="neg"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, _ANY4D))
    _assert_left_alone(model)


def test_an_initializer_a_feed_can_override_is_left_alone():
    """IR 3 style: w2 listed among the graph inputs too, so its value is only a default."""
    model = _conv_act_conv(["Relu"])
    model.graph.input.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, [5, 4, 3, 3]))
    _assert_left_alone(model)


def test_a_conv_output_used_as_a_weight_is_left_alone():
    """A dynamic-weight conv: conv1's output is conv2's *weight*, not its data."""
    nodes = [
        _conv("conv1", "x", "w1", "k"),
        helper.make_node("Relu", ["k"], ["kr"], name="relu"),
        _conv("conv2", "x", "kr", "y"),
    ]
    _assert_left_alone(_model(nodes, {"w1": np.ones((2, 2, 1, 1))}, [2, 2, 1, 1], ["y"]))


def test_zero_iterations_is_refused():
    with pytest.raises(ValueError, match="iterations"):
        equalize(_conv_act_conv(["Relu"]), iterations=0)


# --- several convs on one activation; the activation-driven variant -------------------------------


def _two_heads(between: list[str]) -> onnx.ModelProto:
    """conv1 (3->4) -> ops -> two heads reading the same tensor: conv2 (4->5) and conv3 (4->2,
    1x1), as a detector's class and box heads (mtcnn's PNet)."""
    model = _conv_act_conv(between)
    last = f"t{len(between)}"
    model.graph.initializer.append(
        numpy_helper.from_array(_unbalanced((2, 4, 1, 1), [3, 0.1, 1, 8], 1, 9), "w3")
    )
    model.graph.node.append(_conv("conv3", last, "w3", "z"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, _ANY4D))
    return model


def test_two_heads_on_one_activation_are_scaled_together():
    """Both heads read channel i of the activation: both get their input channel i scaled, by
    the one scale that balances conv1's range against the larger of the heads' ranges."""
    model = _two_heads(["Relu"])
    prelu = helper.make_node("PRelu", ["t0", "slope"], ["t1"], name="act0")
    model.graph.node[1].CopyFrom(prelu)
    slope = np.array([0.1, 0.3, -0.2, 0.05], np.float32).reshape(4, 1, 1)
    model.graph.initializer.append(numpy_helper.from_array(slope, "slope"))
    refined = _equalized(model)
    assert [layer.node for layer in refined.layers] == ["conv1 -> conv2, conv3"]
    _assert_same_function(model, refined.model, [2, 3, 8, 8])
    after = _inits(refined.model)
    heads = np.maximum(_second_ranges(after["w2"], 1), _second_ranges(after["w3"], 1))
    np.testing.assert_allclose(_first_ranges(after["w1"]), heads, rtol=1e-6)


def test_a_head_that_is_not_a_conv_stops_the_pair():
    model = _conv_act_conv(["Relu"])
    model.graph.node.append(helper.make_node("Neg", ["t1"], ["z"], name="neg"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, _ANY4D))
    _assert_left_alone(model)


def _activation_max(model: onnx.ModelProto, tensor: str, x: np.ndarray) -> np.ndarray:
    """max|t_c| per channel of ``tensor``, read by onnxruntime with the tensor made an output."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, _ANY4D))
    value = _run(exposed, x)[-1]
    return np.abs(value).max(axis=(0, 2, 3))


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_activation_variant_balances_the_measured_activation(alpha):
    """With s_c = a_c^alpha / r2_c^(1-alpha): alpha 1 leaves every channel of the activation
    at range 1; alpha 0.5 leaves each channel's activation range equal to the range of the
    weights that read it (both sqrt(a_c * r2_c)). Measured again on the refined model."""
    from quantbench.refine.equalize import activation_tensors

    model = _two_heads(["Relu", "MaxPool"])
    assert activation_tensors(model) == ["t2"]
    x = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32)
    measured = _activation_max(model, "t2", x)
    refined = _equalized(model, activation_max={"t2": measured}, alpha=alpha)
    assert [layer.node for layer in refined.layers] == ["conv1 -> conv2, conv3"]
    _assert_same_function(model, refined.model, [2, 3, 8, 8])
    after = _inits(refined.model)
    now = _activation_max(refined.model, "t2", x)
    if alpha == 1.0:
        np.testing.assert_allclose(now, np.ones(4), rtol=1e-5)
    else:
        heads = np.maximum(_second_ranges(after["w2"], 1), _second_ranges(after["w3"], 1))
        np.testing.assert_allclose(now, heads, rtol=1e-5)


def test_activation_variant_leaves_unmeasured_pairs_alone():
    model = _conv_act_conv(["Relu"])
    refined = equalize(model, activation_max={"elsewhere": np.ones(4)})
    assert not refined.changed and refined.skipped == NOTHING_ELIGIBLE


def test_rescaled_names_exactly_the_tensors_whose_values_moved():
    """Run the original and the equalized mobile block with every intermediate exposed: the
    tensors ``rescaled`` names differ (per channel), every other one is the same; ``compare``
    leaves exactly those out of its layer-by-layer views."""
    model = _mobile_block()
    refined = _equalized(model)
    tensors = ["c1", "r1", "c2", "r2", "y"]
    x = np.random.default_rng(2).standard_normal([2, 3, 8, 8]).astype(np.float32)
    moved = []
    for name in tensors:
        want, got = (_exposed(m, name, x) for m in (model, refined.model))
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max())):
            moved.append(name)
    assert moved == ["c1", "r1", "c2", "r2"]
    assert sorted(refined.rescaled) == sorted(moved)


def _exposed(model: onnx.ModelProto, tensor: str, x: np.ndarray) -> np.ndarray:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend([helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None)])
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([tensor], {"x": x})[0]
