"""Adaptive weight rounding (quantbench.refine.rounding).

Expected values never come from the code under test: a layer's output error is measured by
onnxruntime running the layer with the weight change as its weight, or by numpy on the input
rows; optima by enumerating every floor/ceil choice; the designed case's errors by hand.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_example
from onnx import TensorProto, helper, numpy_helper

from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.qdq import quantize_model
from quantbench.qdq.weights import weight_axis, weight_scale
from quantbench.refine import ROUNDING
from quantbench.refine import rounding as R
from quantbench.refine.activations import stream_activations
from quantbench.table import CalibrationTable

# --------------------------------------------------------------------------- helpers


def _model(nodes, inits, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _with_weight(model: onnx.ModelProto, name: str, values: np.ndarray) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(values.astype(np.float32), name))
    return out


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _only_layer(model: onnx.ModelProto) -> R.Layer:
    found, skipped = R.find_layers(model)
    assert len(found) == 1, skipped
    return found[0]


def _h_error(layer: R.Layer, hess: R.Hessian, dw_stored: np.ndarray) -> float:
    """tr(dW H dW^T) for a weight change given in the initializer's layout."""
    dw = dataclasses.replace(layer, values=dw_stored).matrix().astype(np.float64)
    return R.output_error(dw.reshape(layer.groups, -1, layer.k), hess.h)


def _conv(w: np.ndarray, x_shape: list, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return _model([node], {"w": w}, {"x": x_shape}, ["y"])


# --------------------------------------------------------------------------- (a) H is X^T X

CONVS = {  # weight shape, input shape, attributes
    "pads-strides-dilations": (
        (4, 3, 3, 2),
        (2, 3, 9, 8),
        dict(pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2]),
    ),
    "groups": ((6, 2, 3, 3), (2, 4, 7, 7), dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1])),
    "depthwise-x2": ((8, 1, 3, 3), (1, 4, 6, 6), dict(group=4, dilations=[2, 2], pads=[2] * 4)),
    "same-upper": ((5, 3, 3, 3), (1, 3, 8, 7), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same-lower": ((5, 3, 2, 4), (1, 3, 8, 7), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    "valid": ((3, 3, 3, 3), (2, 3, 7, 6), dict(auto_pad="VALID", strides=[1, 2])),
    "1d": ((4, 2, 3), (2, 2, 10), dict(strides=[2], pads=[1, 2])),
    "3d": ((2, 2, 2, 3, 2), (1, 2, 4, 5, 4), dict(pads=[0, 1, 0, 1, 0, 1])),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_h_gives_the_output_error_onnxruntime_measures(case):
    """tr(dW H dW^T) with H from every im2col row equals ||conv(x, dW)||^2 as onnxruntime
    computes it: padding, strides, dilations and groups are read as ONNX means them."""
    w_shape, x_shape, attrs = CONVS[case]
    rng = np.random.default_rng(len(case))
    model = _conv(rng.standard_normal(w_shape).astype(np.float32), list(x_shape), **attrs)
    x = rng.standard_normal(x_shape).astype(np.float32)
    layer = _only_layer(model)
    hess = R.Hessian(layer, max_rows=10**6)
    hess.add(x)
    for _ in range(3):
        dw = rng.standard_normal(w_shape).astype(np.float32)
        (y,) = _run(_with_weight(model, "w", dw), {"x": x})
        expected = float((y.astype(np.float64) ** 2).sum())
        assert _h_error(layer, hess, dw) == pytest.approx(expected, rel=1e-5)


DENSE = {
    "gemm": ("Gemm", (5, 3), (6, 5), {}),
    "gemm-transB": ("Gemm", (3, 5), (6, 5), dict(transB=1)),
    "gemm-transA": ("Gemm", (5, 3), (5, 6), dict(transA=1)),
    "gemm-transA-transB": ("Gemm", (3, 5), (5, 6), dict(transA=1, transB=1)),
    "matmul-2d": ("MatMul", (5, 3), (6, 5), {}),
    "matmul-3d": ("MatMul", (5, 3), (2, 7, 5), {}),
    "matmul-4d": ("MatMul", (5, 3), (2, 3, 4, 5), {}),
}


def _dense(op: str, w: np.ndarray, x_shape: list, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "w"], ["y"], name="dense", **attrs)
    return _model([node], {"w": w}, {"x": x_shape}, ["y"])


@pytest.mark.parametrize("case", sorted(DENSE))
def test_dense_h_gives_the_output_error_onnxruntime_measures(case):
    """Gemm (transA, transB) and MatMul ([..., K] inputs): the same identity."""
    op, w_shape, x_shape, attrs = DENSE[case]
    rng = np.random.default_rng(len(case))
    model = _dense(op, rng.standard_normal(w_shape).astype(np.float32), list(x_shape), **attrs)
    x = rng.standard_normal(x_shape).astype(np.float32)
    layer = _only_layer(model)
    hess = R.Hessian(layer, max_rows=10**6)
    hess.add(x)
    dw = rng.standard_normal(w_shape).astype(np.float32)
    (y,) = _run(_with_weight(model, "w", dw), {"x": x})
    assert _h_error(layer, hess, dw) == pytest.approx(
        float((y.astype(np.float64) ** 2).sum()), rel=1e-5
    )


def test_rows_are_sampled_per_item_whatever_the_batching_and_the_passes(monkeypatch):
    """At most max_rows rows per sample, the same ones however the data is batched and
    however many passes the budget needs; the streamed path gives Hessian.add's H."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((6, 4, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["y"], name="c2"),
    ]
    model = _model(nodes, {"w1": w1, "w2": w2}, {"x": ["N", 3, 8, 8]}, ["y"])
    x = rng.standard_normal((6, 3, 8, 8)).astype(np.float32)
    graph = open_graph(model)
    layers, _ = R.find_layers(model)

    def hessians(batch_size):
        data = open_data([{"x": x}], graph.inputs, batch_size=batch_size)
        return R.accumulate_hessians(model, data, layers, max_rows=10)

    one = hessians(1)
    assert [h.rows for h in one.values()] == [60, 60]  # 6 samples x 10 of 64 positions
    direct = R.Hessian(layers[0], max_rows=10)
    direct.add(x)
    np.testing.assert_allclose(direct.h, one["c1"].h, rtol=1e-12)
    monkeypatch.setattr(R, "HESSIAN_BUDGET", layers[0].hessian_bytes)  # one layer per pass
    assert len(R.plan_passes(layers)) == 2
    for other in (hessians(4), hessians(6)):
        for name in one:
            np.testing.assert_allclose(other[name].h, one[name].h, rtol=1e-12)


def test_several_passes_need_data_that_can_be_read_again(monkeypatch):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="m1"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="m2"),
    ]
    model = _model(nodes, {"w1": w, "w2": w.T.copy()}, {"x": ["N", 3]}, ["y"])
    graph = open_graph(model)
    monkeypatch.setattr(R, "HESSIAN_BUDGET", 5 * 5 * 8)
    feeds = ({"x": rng.standard_normal((4, 3)).astype(np.float32)} for _ in range(2))
    with pytest.raises(QuantbenchError, match="read only once"):
        R.round_weights(model, open_data(feeds, graph.inputs), progress=lambda n: None)


# --------------------------------------------------------------------------- (b) on the grid


def _net() -> onnx.ModelProto:
    """Grouped Conv (bias) -> Relu -> depthwise Conv -> GAP -> Flatten -> Gemm (transB=0) ->
    Relu -> MatMul: every kind of layer the pass rounds."""
    rng = np.random.default_rng(5)
    inits = {
        "w1": (rng.standard_normal((8, 2, 3, 3)) * 0.3).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": (rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32),
        "w3": (rng.standard_normal((8, 6)) * 0.3).astype(np.float32),
        "w4": (rng.standard_normal((6, 5)) * 0.3).astype(np.float32),
    }
    inits["w4"][:, 2] = 0  # an all-zero output channel
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", group=2, pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=8, pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3"], ["d"], name="gemm"),
        helper.make_node("Relu", ["d"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w4"], ["y"], name="matmul"),
    ]
    return _model(nodes, inits, {"x": ["N", 4, 10, 10]}, ["y"])


def _smooth_images(n: int, seed: int) -> np.ndarray:
    """Neighbouring pixels and channels correlate, as in images: rounding errors can cancel."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4, 10, 10)).cumsum(axis=2).cumsum(axis=3) / 4
    return (x + x[:, :1]).astype(np.float32)


@pytest.fixture(scope="module")
def net_refined():
    model = _net()
    graph = open_graph(model)
    data = open_data([{"x": _smooth_images(16, 0)}], graph.inputs, batch_size=4)
    before = model.SerializeToString()
    refined = R.round_weights(model, data, progress=lambda n: None)
    assert model.SerializeToString() == before  # the input model is never touched
    return model, refined


def test_every_layer_is_rounded_and_recorded(net_refined):
    _, refined = net_refined
    assert refined.name == ROUNDING and refined.changed and not refined.skipped
    assert [c.node for c in refined.layers] == ["conv", "dw", "gemm", "matmul"]
    for change in refined.layers:
        assert change.measure == "layer output SQNR (dB)"
        assert change.after > change.before


def test_weights_sit_exactly_on_their_channel_grid(net_refined):
    """Integers |q| <= 127 times the original per-channel scale, the max element of each
    channel kept at ±127, and weight_scale (TensorRT's max|w|/127, the Q/DQ path's scale)
    on the new weights finds exactly the original scale and the same integers."""
    model, refined = net_refined
    old, new = _weights(model), _weights(refined.model)
    nodes = {n.input[1]: n for n in model.graph.node if len(n.input) > 1}
    for name in ("w1", "w2", "w3", "w4"):
        assert new[name].dtype == np.float32 and new[name].shape == old[name].shape
        assert not np.array_equal(new[name], old[name])
        axis = weight_axis(nodes[name], 1, old[name].shape)
        shape = [-1 if a == axis else 1 for a in range(old[name].ndim)]
        scale = weight_scale(old[name], axis).reshape(shape)
        ratio = new[name].astype(np.float64) / scale
        q = np.rint(ratio)
        assert np.abs(ratio - q).max() < 1e-3 and np.abs(q).max() <= 127
        moved = np.moveaxis(np.abs(old[name]), axis, 0).reshape(old[name].shape[axis], -1)
        top = moved.argmax(axis=1)
        q_top = np.moveaxis(q, axis, 0).reshape(len(top), -1)[np.arange(len(top)), top]
        sign = np.sign(
            np.moveaxis(old[name], axis, 0).reshape(len(top), -1)[np.arange(len(top)), top]
        )
        np.testing.assert_array_equal(q_top, 127 * sign)
        again = weight_scale(new[name], axis).reshape(shape)
        np.testing.assert_array_equal(again, scale)
        exact = new[name] / again
        np.testing.assert_array_equal(np.rint(exact), q)
        assert np.abs(exact - q).max() < 1e-3
        live = np.abs(moved).max(axis=1) > 0
        np.testing.assert_array_equal(
            np.abs(new[name]).max(axis=tuple(a for a in range(q.ndim) if a != axis))[live],
            (np.float32(127) * again).reshape(-1)[live],
        )
    assert not new["w4"][:, 2].any()  # an all-zero channel stays zero


def test_quantizing_the_refined_weights_changes_nothing(net_refined):
    """Per-channel weight Q/DQ (quantbench's scale) of the refined model is the identity on
    its weights: it runs in onnxruntime to bit-identical outputs."""
    model, refined = net_refined
    quantized = onnx.ModelProto()
    quantized.CopyFrom(refined.model)
    nodes = {n.input[1]: n for n in model.graph.node if len(n.input) > 1}
    for init in quantized.graph.initializer:
        if init.name in nodes:
            w = numpy_helper.to_array(init)
            axis = weight_axis(nodes[init.name], 1, w.shape)
            s = weight_scale(w, axis).reshape([-1 if a == axis else 1 for a in range(w.ndim)])
            q = np.clip(np.rint(w / s), -127, 127)
            init.CopyFrom(numpy_helper.from_array((q * s).astype(np.float32), init.name))
    x = _smooth_images(3, 9)
    np.testing.assert_array_equal(_run(quantized, {"x": x})[0], _run(refined.model, {"x": x})[0])


def test_only_weight_initializers_change(net_refined):
    model, refined = net_refined
    assert [n.name for n in refined.model.graph.node] == [n.name for n in model.graph.node]
    assert [i.name for i in refined.model.graph.initializer] == [
        i.name for i in model.graph.initializer
    ]
    np.testing.assert_array_equal(_weights(refined.model)["b1"], _weights(model)["b1"])
    assert refined.model.graph.input == model.graph.input
    assert refined.model.graph.output == model.graph.output


# --------------------------------------------------------------------------- (c) lower error


def _gemm_layer(w: np.ndarray, x: np.ndarray, trans_b: int = 1):
    model = _dense("Gemm", w, ["N", x.shape[1]], transB=trans_b)
    layer = _only_layer(model)
    hess = R.Hessian(layer, max_rows=10**6)
    hess.add(x)
    return model, layer, hess


def test_correlated_inputs_lower_the_output_error_numpy_measures():
    """On correlated inputs the rounded Gemm's output error on the held-out rows (numpy:
    ||X dW^T||^2) is below round-to-nearest's, and the record's SQNRs are those errors."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((200, 12)) @ rng.standard_normal((12, 12))).astype(np.float32)
        w = rng.standard_normal((7, 12)).astype(np.float32)
        _, layer, hess = _gemm_layer(w, x)
        result = R.round_layer(layer, hess)
        assert result.values is not None, result.reason
        # judged on the held-out items: every 4th row (each row of a 2-D input is an item)
        xd, wd = x[R.HELD_EVERY - 1 :: R.HELD_EVERY].astype(np.float64), w.astype(np.float64)
        s = weight_scale(w, 0).astype(np.float64)[:, None]
        nearest = (np.clip(np.rint(wd / s), -127, 127) * s).astype(np.float32)  # as DQ gives
        signal = ((xd @ wd.T) ** 2).sum()
        err_nearest = ((xd @ (nearest - wd).T) ** 2).sum()
        err_new = ((xd @ (result.values.astype(np.float64) - wd).T) ** 2).sum()
        assert err_new < err_nearest
        assert result.change.before == pytest.approx(10 * np.log10(signal / err_nearest), rel=1e-7)
        assert result.change.after == pytest.approx(10 * np.log10(signal / err_new), rel=1e-7)


def test_a_designed_case_finds_the_compensating_rounding():
    """Inputs 1 and 2 are the same signal u; their weights sit at 10.4 and 20.4 steps.
    Round-to-nearest loses 0.4 + 0.4 steps on u (error 0.64 s^2 sum(u^2)); rounding one of
    them up instead loses 0.2 (0.04 s^2 sum(u^2)), the least any integers can."""
    rng = np.random.default_rng(0)
    z, u = rng.standard_normal((2, 100))
    x = np.stack([z, u, u], axis=1).astype(np.float32)
    s = np.float32(0.01)
    w = (np.array([[127.0, 10.4, 20.4]]) * s).astype(np.float32)
    _, layer, hess = _gemm_layer(w, x)
    result = R.round_layer(layer, hess)
    ud = x[:, 1].astype(np.float64)
    step = float(weight_scale(w, 0)[0])
    rtn_error = 0.64 * step**2 * (ud**2).sum()
    xd = x.astype(np.float64)
    err = ((xd @ (result.values.astype(np.float64) - w).T) ** 2).sum()
    held = xd[R.HELD_EVERY - 1 :: R.HELD_EVERY]  # what the record's SQNRs are measured on
    signal = ((held @ w.T.astype(np.float64)) ** 2).sum()
    rtn_held = 0.64 * step**2 * (held[:, 1] ** 2).sum()
    assert signal * 10 ** (-result.change.before / 10) == pytest.approx(rtn_held, rel=1e-3)
    assert rtn_error > 0
    assert err == pytest.approx(0.04 * step**2 * (ud**2).sum(), rel=1e-3)
    assert sorted(np.rint(result.values[0, 1:] / step)) in ([10, 21], [11, 20])


def test_tiny_layer_against_every_floor_ceil_choice():
    """Cout=1, K=4: every floor/ceil choice of the three weights that are not the channel's
    max (which stays at ±127) enumerated. The kept rounding is never worse than
    round-to-nearest, is the best of those choices in most draws and near it in the rest
    (GPTQ may also move a weight by more than one step, beating every floor/ceil choice)."""
    ratios = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((64, 4)) @ rng.standard_normal((4, 4))).astype(np.float32)
        w = rng.standard_normal((1, 4)).astype(np.float32)
        _, layer, hess = _gemm_layer(w, x)
        xd, wd = x.astype(np.float64), w.astype(np.float64)
        s = float(weight_scale(w, 0)[0])
        top = int(np.abs(wd).argmax())

        def error(q, xd=xd, wd=wd, s=s):
            return float(((xd @ (q * s - wd).T) ** 2).sum())

        choices = []
        for bits in itertools.product((0, 1), repeat=4):
            q = np.clip(np.floor(wd / s) + np.array(bits), -127, 127)
            q[0, top] = 127 * np.sign(wd[0, top])
            choices.append(error(q))
        nearest = error(np.rint(wd / s))
        result = R.round_layer(layer, hess)
        new = None if result.values is None else result.values.astype(np.float64)
        kept = nearest if new is None else error(np.rint(new / s))
        assert kept <= nearest * (1 + 1e-9)
        ratios.append(kept / min(choices))
    ratios = np.array(ratios)
    assert (ratios <= 1 + 1e-9).mean() >= 0.75
    assert np.quantile(ratios, 0.9) < 1.5


def test_no_gain_keeps_the_weights():
    """Uncorrelated inputs with equal energy (H = I): GPTQ has nothing to spread the errors
    over and equals round-to-nearest, so the layer is left as it was, with the reason."""
    w = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    model = _dense("Gemm", w, ["N", 4], transB=1)
    graph = open_graph(model)
    data = open_data([{"x": np.eye(4, dtype=np.float32)}], graph.inputs)
    refined = R.round_weights(model, data)  # quantbench's own progress display
    assert not refined.changed and "did not lower" in refined.skipped
    np.testing.assert_array_equal(_weights(refined.model)["w"], w)


def test_dead_inputs_round_to_nearest():
    """An input that is zero on every row has no say in the error: its weights are rounded to
    nearest and nothing is carried to or from them."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((80, 6)) @ rng.standard_normal((6, 6))
    x[:, 2] = 0
    w = rng.standard_normal((5, 6)).astype(np.float32)
    _, layer, hess = _gemm_layer(w, x.astype(np.float32))
    result = R.round_layer(layer, hess)
    assert result.values is not None, result.reason
    scale = weight_scale(w, 0).astype(np.float64)
    np.testing.assert_array_equal(
        np.rint(result.values[:, 2] / scale), np.rint(w[:, 2].astype(np.float64) / scale)
    )
    assert (np.rint(result.values / scale[:, None]) != np.rint(w / scale[:, None])).any()


def test_non_finite_rows_are_left_out():
    w = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    x = np.random.default_rng(4).standard_normal((10, 4)).astype(np.float32)
    _, layer, clean = _gemm_layer(w, np.delete(x, [2, 7], axis=0))
    x[2, 1], x[7, 3] = np.nan, np.inf
    _, _, hess = _gemm_layer(w, x)
    assert (hess.rows, hess.nonfinite) == (8, 2)
    np.testing.assert_allclose(hess.h, clean.h, rtol=1e-12)  # held-out split: another order


@pytest.mark.parametrize(
    "op, attrs, x_shape",
    [
        ("Gemm", {}, (240, 16)),
        ("Gemm", dict(transB=1), (240, 16)),
        ("Gemm", dict(transA=1), (16, 240)),
        ("MatMul", {}, (30, 8, 16)),
    ],
)
def test_dense_layers_round_weights_end_to_end(op, attrs, x_shape):
    """Gemm (transA, transB) and MatMul: on the grid, and a lower output error than
    round-to-nearest's as onnxruntime runs the layer on the calibration inputs."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 16) if attrs.get("transB") else (16, 6)).astype(np.float32)
    rows = rng.standard_normal((240, 16)) @ rng.standard_normal((16, 16))  # correlated inputs
    rows = rows.astype(np.float32)
    x = rows.T.copy() if attrs.get("transA") else rows.reshape(x_shape)
    model = _dense(op, w, [*x.shape], **attrs)
    graph = open_graph(model)
    refined = R.round_weights(
        model, open_data([{"x": x}], graph.inputs, batch_size=x.shape[0]), progress=lambda n: None
    )
    assert [c.node for c in refined.layers] == ["dense"]
    new = _weights(refined.model)["w"]
    axis = weight_axis(model.graph.node[0], 1, w.shape)
    scale = np.expand_dims(weight_scale(w, axis), 1 - axis)
    assert np.abs(new / scale - np.rint(new / scale)).max() < 1e-3
    nearest = (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)
    (y,) = _run(model, {"x": x})
    (y_new,) = _run(_with_weight(model, "w", new), {"x": x})
    (y_nearest,) = _run(_with_weight(model, "w", nearest), {"x": x})
    assert ((y_new - y).astype(np.float64) ** 2).sum() < (
        (y_nearest - y).astype(np.float64) ** 2
    ).sum()


# --------------------------------------------------------------------------- what is skipped


def test_skipped_layers_say_why():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    const = helper.make_node(
        "Constant", [], ["wc"], name="const", value=numpy_helper.from_array(w, "v")
    )
    nodes = [
        const,
        helper.make_node("MatMul", ["x", "shared"], ["a"], name="shared1"),
        helper.make_node("MatMul", ["a", "shared"], ["b"], name="shared2"),
        helper.make_node("MatMul", ["b", "wc"], ["c"], name="constant_node"),
        helper.make_node("MatMul", ["c", "b"], ["d"], name="runtime"),
        helper.make_node("Reshape", ["d", "shape"], ["e"], name="reshape"),
        helper.make_node("ConvTranspose", ["e", "wt"], ["y"], name="deconv"),
    ]
    inits = {
        "shared": w,
        "shape": np.array([1, 4, 1, 4], np.int64),
        "wt": rng.standard_normal((4, 2, 2, 2)).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found, skipped = R.find_layers(model)
    assert found == []
    assert "shared" in skipped["shared1"] and "shared" in skipped["shared2"]
    assert "Constant node" in skipped["constant_node"]
    assert "run time" in skipped["runtime"]
    assert "ConvTranspose" in skipped["deconv"]
    data = open_data(
        [{"x": rng.standard_normal((4, 4)).astype(np.float32)}], open_graph(model).inputs
    )
    refined = R.round_weights(model, data, progress=lambda n: None)
    assert not refined.changed and refined.skipped.startswith("no layer to round")
    assert refined.model is not model and refined.model == model


def test_layers_picks_nodes_by_name():
    model = _net()
    graph = open_graph(model)
    data = open_data([{"x": _smooth_images(4, 1)}], graph.inputs)
    refined = R.round_weights(model, data, layers=["gemm"], progress=lambda n: None)
    assert [c.node for c in refined.layers] == ["gemm"]
    changed = {
        k for k, v in _weights(refined.model).items() if not np.array_equal(v, _weights(model)[k])
    }
    assert changed == {"w3"}
    with pytest.raises(QuantbenchError, match="no node named 'nope'"):
        R.round_weights(model, data, layers=["gemm", "nope"])


# --------------------------------------------------------------------------- (e) tinycnn


def _minmax_table(model: onnx.ModelProto, data) -> CalibrationTable:
    table = CalibrationTable(method="minmax", algorithm="MinMaxCalibration")
    amax: dict[str, float] = {}
    for values in stream_activations(model, data, calibration_tensors(open_graph(model), "all")):
        for name, v in values.items():
            amax[name] = max(amax.get(name, 0.0), float(np.abs(v).max()))
    for name, value in amax.items():
        table.set(name, value)
    return table


def test_tinycnn_quantizes_closer_to_fp32():
    """The bundled example, 32 calibration samples: every constant-weight layer is rounded
    (the runtime-weight depthwise conv is not), the refined model runs in onnxruntime, its
    weights are their own INT8 values, and both its weight-only and its full INT8 (Q/DQ, the
    same minmax table) outputs are closer to the FP32 model's on held-out samples."""
    example = require_example()
    graph = open_graph(example / "tinycnn.onnx")
    data = open_data(example / "calib.npz", graph.inputs, max_samples=32)
    refined = R.round_weights(graph.model, data, progress=lambda n: None)
    assert len(refined.layers) == 7
    assert "/dynamic_dw/Conv" not in {c.node for c in refined.layers}
    images = np.load(example / "eval.npz")["image"][:100]

    def outputs(model):
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return np.concatenate(
            [session.run(None, {"image": images[i : i + 1]})[0] for i in range(len(images))]
        )

    reference = outputs(graph.model)

    def sqnr(model):
        y = outputs(model)
        return 10 * np.log10((reference**2).sum() / ((y - reference) ** 2).sum())

    def weights_quantized(model):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for init in out.graph.initializer:
            if init.name.endswith("weight"):  # every weight of tinycnn has its channels on axis 0
                w = numpy_helper.to_array(init)
                s = weight_scale(w, 0).reshape([-1] + [1] * (w.ndim - 1))
                init.CopyFrom(
                    numpy_helper.from_array(
                        (np.clip(np.rint(w / s), -127, 127) * s).astype(np.float32), init.name
                    )
                )
        return out

    fp32_refined = sqnr(refined.model)
    assert sqnr(weights_quantized(refined.model)) == fp32_refined  # already on the grid
    assert fp32_refined > sqnr(weights_quantized(graph.model)) + 3
    table = _minmax_table(graph.model, data)
    int8 = sqnr(quantize_model(graph.model, table).model)
    int8_refined = sqnr(quantize_model(refined.model, table).model)
    assert int8_refined >= int8


def test_a_rounding_fit_to_noise_is_judged_on_held_out_items():
    """K = 48 inputs, 64 rows of pure noise: GPTQ fits the 48 fitting rows almost exactly
    (its in-sample error far below nearest's), which says nothing about new rows. Every
    channel kept away from nearest lowers the error on the held-out rows (numpy), and the
    record is measured there."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w = rng.standard_normal((6, 48)).astype(np.float32)
    _, layer, hess = _gemm_layer(w, x)
    assert hess.held_rows == 16 and hess.rows == 64
    result = R.round_layer(layer, hess)
    held = x[R.HELD_EVERY - 1 :: R.HELD_EVERY].astype(np.float64)
    s = weight_scale(w, 0).astype(np.float64)[:, None]
    nearest = np.clip(np.rint(w / s), -127, 127) * s
    new = nearest if result.values is None else result.values.astype(np.float64)
    per_channel = ((held @ (new - w).T) ** 2).sum(axis=0)
    per_channel_nearest = ((held @ (nearest - w).T) ** 2).sum(axis=0)
    assert (per_channel <= per_channel_nearest * (1 + 1e-9)).all()
    if result.change is not None:
        assert "judged on held-out samples" in result.change.detail


def test_too_few_items_are_judged_in_sample_and_said():
    """Three items: none is held out, so the layer is fit and judged on all of them."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((3, 40, 8)) @ rng.standard_normal((8, 8))).astype(np.float32)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    model = _dense("MatMul", w, ["N", 40, 8])
    layer = _only_layer(model)
    hess = R.Hessian(layer, max_rows=10**6)
    hess.add(x)
    assert hess.held is None and hess.held_rows == 0
    result = R.round_layer(layer, hess)
    assert result.change is not None, result.reason
    assert "in-sample: too few samples to hold out" in result.change.detail
