"""Explicit quantization: placement against TensorRT's rules, bad inputs, scales read back, and
what onnxruntime really runs in integer arithmetic."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import synthetic
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import QuantbenchError
from quantbench.model.graph import constant_tensors, open_graph
from quantbench.ort_int8 import (
    FLOAT,
    INTEGER,
    REMOVED,
    SIMULATED,
    integer_op_counts,
    integer_op_report,
)
from quantbench.qdq import (
    ACTIVATION,
    RESIDUAL,
    RUNTIME_WEIGHT,
    WEIGHT,
    quantize_model,
    read_qdq_scales,
    table_from_qdq,
    write_quantized,
)
from quantbench.qdq import opset as opset_module
from quantbench.qdq.embedded import METADATA_KEY
from quantbench.qdq.weights import ZERO_CHANNEL_SCALE
from quantbench.table import CalibrationTable, Provenance, TableEntry

F32 = np.float32

# --------------------------------------------------------------------------- model builders


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _rand(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(F32)


def cnn(opset: int = 17) -> onnx.ModelProto:
    """Conv(+folded-BN bias) -> Relu -> Conv -> BatchNorm -> Add(residual) -> Relu -> GAP ->
    Flatten -> Gemm(transB=1) -> MatMul(constant [6, 3])."""
    rng = np.random.default_rng(0)
    w1 = _rand(rng, 8, 3, 3, 3)
    w1[5] = 0.0  # an all-zero output channel
    inits = [
        _init("w1", w1),
        _init("b1", _rand(rng, 8, scale=0.1)),
        _init("w2", _rand(rng, 8, 8, 3, 3, scale=0.15)),
        _init("bn_scale", (1 + _rand(rng, 8, scale=0.1)).astype(F32)),
        _init("bn_bias", _rand(rng, 8, scale=0.1)),
        _init("bn_mean", _rand(rng, 8, scale=0.1)),
        _init("bn_var", (1 + np.abs(_rand(rng, 8, scale=0.1))).astype(F32)),
        _init("fc_w", _rand(rng, 6, 8, scale=0.5)),
        _init("fc_b", _rand(rng, 6, scale=0.1)),
        _init("proj", _rand(rng, 6, 3, scale=0.5)),
    ]
    bn = "BatchNormalization"
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node(
            bn, ["c2", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n2"], name="bn2"
        ),
        helper.make_node("Add", ["n2", "r1"], ["sum"], name="add"),
        helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["fc"], name="fc", transB=1),
        helper.make_node("MatMul", ["fc", "proj"], ["y"], name="proj"),
    ]
    return _model(nodes, [_vi("x", [1, 3, 12, 12])], [_vi("y", [1, 3])], inits, opset)


def conv_add_after_conv() -> onnx.ModelProto:
    """Add directly after a Conv (the TensorRT Conv+Add fusion pattern)."""
    rng = np.random.default_rng(1)
    inits = [_init("wa", _rand(rng, 4, 4, 3, 3)), _init("wb", _rand(rng, 4, 4, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
        helper.make_node("Conv", ["ra", "wb"], ["b"], name="conv_b"),
        helper.make_node("Add", ["b", "ra"], ["y"], name="residual_add"),
    ]
    return _model(nodes, [_vi("x", [1, 4, 8, 8])], [_vi("y", [1, 4, 8, 8])], inits)


def gemm_model(trans_b: int) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    w = _rand(rng, 5, 7) if trans_b else _rand(rng, 7, 5)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm", transB=trans_b)]
    return _model(nodes, [_vi("x", [2, 7])], [_vi("y", [2, 5])], [_init("w", w)])


def conv_transpose_model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv", strides=[2, 2])
    ]
    inits = [_init("w", _rand(rng, 4, 6, 2, 2)), _init("b", _rand(rng, 6, scale=0.1))]
    return _model(nodes, [_vi("x", [1, 4, 5, 5])], [_vi("y", [1, 6, 10, 10])], inits)


def constant_node_weights() -> onnx.ModelProto:
    """Weights written as Constant nodes, one behind a foldable chain (Constant -> Transpose)."""
    rng = np.random.default_rng(4)
    conv_w = _rand(rng, 6, 3, 3, 3)
    fc_w_t = _rand(rng, 6, 4, scale=0.5)  # stored [K, N]; the graph transposes it to [N, K]
    nodes = [
        helper.make_node(
            "Constant", [], ["cw"], name="const_w", value=numpy_helper.from_array(conv_w)
        ),
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
        helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node(
            "Constant", [], ["fw_t"], name="const_fc", value=numpy_helper.from_array(fc_w_t)
        ),
        helper.make_node("Transpose", ["fw_t"], ["fw"], name="transpose_fc", perm=[1, 0]),
        helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4])])


def dynamic_weight_conv(runtime_bias: bool = False) -> onnx.ModelProto:
    """x -> GAP -> Flatten -> Gemm -> Reshape [C,1,3,3] = kernel; Conv(x, kernel, group=C)."""
    rng = np.random.default_rng(5)
    c = 4
    inits = [
        _init("hyper_w", _rand(rng, c * 9, c, scale=0.5)),
        _init("kernel_shape", np.array([c, 1, 3, 3], np.int64)),
        _init("bias_w", _rand(rng, c, c, scale=0.2)),
        _init("bias_shape", np.array([c], np.int64)),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["feat"], name="flatten"),
        helper.make_node("Gemm", ["feat", "hyper_w"], ["kflat"], name="hyper", transB=1),
        helper.make_node("Reshape", ["kflat", "kernel_shape"], ["kernel"], name="to_kernel"),
    ]
    conv_inputs = ["x", "kernel"]
    if runtime_bias:
        nodes += [
            helper.make_node("Gemm", ["feat", "bias_w"], ["bflat"], name="hyper_bias", transB=1),
            helper.make_node("Reshape", ["bflat", "bias_shape"], ["bias"], name="to_bias"),
        ]
        conv_inputs.append("bias")
    nodes.append(
        helper.make_node("Conv", conv_inputs, ["y"], name="dyn_conv", group=c, pads=[1, 1, 1, 1])
    )
    used = {i for n in nodes for i in n.input}
    inits = [i for i in inits if i.name in used]
    return _model(nodes, [_vi("x", [1, c, 8, 8])], [_vi("y", [1, c, 8, 8])], inits)


def fan_out_model() -> onnx.ModelProto:
    """x feeds two Convs and a Relu; the Convs share one Q/DQ pair, the Relu reads x itself."""
    rng = np.random.default_rng(6)
    inits = [_init("wa", _rand(rng, 4, 3, 3, 3)), _init("wb", _rand(rng, 4, 3, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b"),
        helper.make_node("Relu", ["x"], ["rx"], name="relu_x"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add_ab"),
    ]
    outputs = [_vi("y", [1, 4, 6, 6]), _vi("rx", [1, 3, 6, 6])]
    return _model(nodes, [_vi("x", [1, 3, 6, 6])], outputs, inits)


def shared_weight_model() -> onnx.ModelProto:
    """One constant weight read by a Conv (axis 0) and a ConvTranspose (axis 1)."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("ConvTranspose", ["c", "w"], ["y"], name="deconv"),
    ]
    return _model(
        nodes,
        [_vi("x", [1, 4, 6, 6])],
        [_vi("y", [1, 4, 6, 6])],
        [_init("w", _rand(rng, 4, 4, 1, 1))],
    )


# --------------------------------------------------------------------------- helpers


def random_feeds(model: onnx.ModelProto, n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = []
    for _ in range(n):
        feed = {}
        for v in model.graph.input:
            if v.name in inits:
                continue
            shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
            feed[v.name] = rng.standard_normal(shape).astype(F32)
        feeds.append(feed)
    return feeds


def minmax_table(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> CalibrationTable:
    """amax = max|x| over the feeds for every float runtime tensor (a MinMax calibration)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    constants = constant_tensors(model)
    existing = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for out in node.output:
            if out and out not in constants and out not in existing:
                probe.graph.output.append(helper.make_empty_tensor_value_info(out))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    amax: dict[str, float] = {}
    for feed in feeds:
        values = dict(zip(names, session.run(None, feed), strict=True)) | feed
        for name, value in values.items():
            if value.dtype == F32:
                amax[name] = max(amax.get(name, 0.0), float(np.abs(value).max()))
    table = CalibrationTable(method="minmax", algorithm="MinMaxCalibration")
    for name, value in amax.items():
        table.set(name, value)
    return table


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model as written (conftest.exact_session: no Q/DQ fused into integer kernels)."""
    from conftest import exact_session

    return exact_session(model.SerializeToString()).run(None, feed)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def producer(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if tensor in n.output), None)


def value(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


def axis_of(n: onnx.NodeProto) -> int | None:
    return next((a.i for a in n.attribute if a.name == "axis"), None)


def qdq_on(model: onnx.ModelProto, node_name: str, index: int):
    """(Q, DQ) in front of input ``index`` of ``node_name``; asserts the Q -> DQ structure."""
    dq = producer(model, node(model, node_name).input[index])
    assert dq is not None and dq.op_type == "DequantizeLinear", f"{node_name}[{index}] has no DQ"
    q = producer(model, dq.input[0])
    assert q is not None and q.op_type == "QuantizeLinear"
    assert q.input[1] == dq.input[1] and q.input[2] == dq.input[2], "Q and DQ share scale and zp"
    assert axis_of(q) == axis_of(dq)
    zero_point = value(model, q.input[2])
    assert zero_point.dtype == np.int8 and not zero_point.any()
    return q, dq


def assert_activation_qdq(model, node_name, index, tensor, table):
    q, dq = qdq_on(model, node_name, index)
    assert q.input[0] == tensor
    scale = value(model, q.input[1])
    assert scale.shape == () and scale.dtype == F32
    assert scale == F32(table.amax(tensor)) / F32(127)  # exact float32
    assert value(model, q.input[2]).shape == ()
    assert axis_of(dq) is None
    return q, dq


def assert_weight_qdq(model, node_name, weight, axis):
    q, dq = qdq_on(model, node_name, 1)
    assert q.input[0] == weight
    w = value(model, weight)
    assert w.dtype == F32, "weights stay float32 (FP32 -> Q -> DQ form)"
    reduce = tuple(a for a in range(w.ndim) if a != axis)
    expected = (np.abs(w).max(axis=reduce) / F32(127)).astype(F32)
    expected[expected == 0] = ZERO_CHANNEL_SCALE
    assert axis_of(dq) == axis
    np.testing.assert_array_equal(value(model, dq.input[1]), expected)
    return w


def assert_no_output_qdq(model: onnx.ModelProto, original: onnx.ModelProto, result) -> None:
    """Every Q is there for a quantized op's input; outputs are never quantized for their own
    sake (a weighted op's output gets a Q only when the next quantized op reads it)."""
    planned = {i.tensor for n in result.quantized for i in n.inputs}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            assert n.input[0] in planned, n.name
            readers = [r for r in model.graph.node if n.output[0] in r.input]
            assert [r.op_type for r in readers] == ["DequantizeLinear"]
    assert [o.name for o in model.graph.output] == [o.name for o in original.graph.output]
    for o in model.graph.output:
        assert producer(model, o.name).op_type not in ("QuantizeLinear", "DequantizeLinear")


def assert_close_to_fp32(fp32, quantized, feeds, threshold=0.99):
    for feed in feeds:
        for a, b in zip(run(fp32, feed), run(quantized, feed), strict=True):
            assert cosine(a, b) > threshold


def quantize_calibrated(model, **kwargs):
    feeds = random_feeds(model)
    table = minmax_table(model, feeds)
    return quantize_model(model, table, **kwargs), table, feeds


# --------------------------------------------------------------------------- placement


def test_cnn_placement_follows_tensorrt_rules():
    fp32 = cnn()
    result, table, feeds = quantize_calibrated(fp32)
    q = result.model
    assert_activation_qdq(q, "conv1", 0, "x", table)
    w1 = assert_weight_qdq(q, "conv1", "w1", axis=0)
    assert not w1[5].any()  # the zero channel got the small positive scale, checked above
    assert_activation_qdq(q, "conv2", 0, "r1", table)
    assert_weight_qdq(q, "conv2", "w2", axis=0)
    assert_activation_qdq(q, "fc", 0, "flat", table)
    assert_weight_qdq(q, "fc", "fc_w", axis=0)  # transB=1: weight [N, K]
    assert_activation_qdq(q, "proj", 0, "fc", table)
    assert_weight_qdq(q, "proj", "proj", axis=1)  # MatMul constant 2-D: output columns
    # biases and BatchNorm stay FP32 and untouched
    assert node(q, "conv1").input[2] == "b1" and node(q, "fc").input[2] == "fc_b"
    assert list(node(q, "bn2").input) == ["c2", "bn_scale", "bn_bias", "bn_mean", "bn_var"]
    # this Add follows the BatchNorm, not a weighted op: graph.residual_add_inputs (shared with
    # calibration) does not see it as residual, so it stays as it is
    assert list(node(q, "add").input) == ["n2", "r1"]
    assert_no_output_qdq(q, fp32, result)
    roles = {(n.node, i.tensor): i.role for n in result.quantized for i in n.inputs}
    assert roles[("conv1", "x")] == ACTIVATION and roles[("conv1", "w1")] == WEIGHT
    assert [n.node for n in result.quantized] == ["conv1", "conv2", "fc", "proj"]
    assert result.skipped == [] and result.warnings == []
    onnx.checker.check_model(q)
    assert_close_to_fp32(fp32, q, feeds)


def test_residual_add_after_conv_gets_qdq_and_can_be_disabled():
    fp32 = conv_add_after_conv()
    result, table, feeds = quantize_calibrated(fp32)
    assert_activation_qdq(result.model, "residual_add", 1, "ra", table)
    assert node(result.model, "residual_add").input[0] == "b"  # the fused conv output stays FP
    assert result.qdq_pairs == 4  # x, wa, ra (shared by conv_b and the Add), wb
    assert result.quantized_node("residual_add").inputs[0].role == RESIDUAL
    assert node(result.model, "residual_add").input[1] == node(result.model, "conv_b").input[0]
    assert_close_to_fp32(fp32, result.model, feeds)

    off = quantize_model(fp32, table, quantize_residual=False)
    assert node(off.model, "residual_add").input[1] == "ra"
    assert off.skipped_node("residual_add").reason == "residual quantization disabled"

    no_conv = quantize_model(fp32, table, exclude=["conv_b"])
    assert node(no_conv.model, "residual_add").input[1] == "ra"
    assert "not quantized" in no_conv.skipped_node("residual_add").reason


@pytest.mark.parametrize(("trans_b", "axis"), [(1, 0), (0, 1)])
def test_gemm_weight_axis_follows_trans_b(trans_b, axis):
    fp32 = gemm_model(trans_b)
    result, table, feeds = quantize_calibrated(fp32)
    assert_activation_qdq(result.model, "gemm", 0, "x", table)
    assert_weight_qdq(result.model, "gemm", "w", axis=axis)
    assert result.quantized_node("gemm").inputs[1].scale.shape == (5,)
    assert_close_to_fp32(fp32, result.model, feeds)


def test_conv_transpose_weight_axis_1():
    fp32 = conv_transpose_model()
    result, table, feeds = quantize_calibrated(fp32)
    assert_activation_qdq(result.model, "deconv", 0, "x", table)
    assert_weight_qdq(result.model, "deconv", "w", axis=1)
    assert node(result.model, "deconv").input[2] == "b"
    assert_close_to_fp32(fp32, result.model, feeds)


def test_constant_node_and_chain_weights_are_folded_and_per_channel():
    fp32 = constant_node_weights()
    result, table, feeds = quantize_calibrated(fp32)
    q = result.model
    initializers = {i.name for i in q.graph.initializer}
    assert {"cw", "fw"} <= initializers  # folded to initializers, names kept
    assert not any(n.op_type in ("Constant", "Transpose") for n in q.graph.node)
    assert_weight_qdq(q, "conv", "cw", axis=0)
    fw = assert_weight_qdq(q, "fc", "fw", axis=0)
    const_fc = node(fp32, "const_fc")
    np.testing.assert_array_equal(fw, numpy_helper.to_array(const_fc.attribute[0].t).T)
    assert_activation_qdq(q, "conv", 0, "x", table)
    assert_close_to_fp32(fp32, q, feeds)


@pytest.mark.parametrize("runtime_bias", [False, True])
def test_dynamic_weight_conv_gets_per_tensor_qdq_on_both_inputs(runtime_bias):
    fp32 = dynamic_weight_conv(runtime_bias)
    result, table, feeds = quantize_calibrated(fp32)
    q = result.model
    assert_activation_qdq(q, "dyn_conv", 0, "x", table)
    kq, kdq = assert_activation_qdq(q, "dyn_conv", 1, "kernel", table)  # its OWN entry
    assert value(q, kq.input[1]) != value(q, qdq_on(q, "dyn_conv", 0)[0].input[1])
    planned = result.quantized_node("dyn_conv")
    assert [(i.role, i.axis) for i in planned.inputs] == [
        (ACTIVATION, None),
        (RUNTIME_WEIGHT, None),
    ]
    if runtime_bias:
        assert node(q, "dyn_conv").input[2] == "bias"  # runtime bias stays FP
    assert_activation_qdq(q, "hyper", 0, "feat", table)
    assert_weight_qdq(q, "hyper", "hyper_w", axis=0)
    assert_close_to_fp32(fp32, q, feeds)


def test_dynamic_weight_conv_without_kernel_entry_is_listed_not_silent():
    fp32 = dynamic_weight_conv()
    table = minmax_table(fp32, random_feeds(fp32))
    del table.entries["kernel"]
    with pytest.raises(QuantbenchError, match=r": 1 missing, e\.g\. kernel; use --allow-partial"):
        quantize_model(fp32, table)
    result = quantize_model(fp32, table, allow_partial=True)
    assert (
        result.skipped_node("dyn_conv").reason == "runtime weight 'kernel' has no calibration entry"
    )
    assert node(result.model, "dyn_conv").input[:2] == ["x", "kernel"]
    assert any("1 missing, e.g. kernel" in w for w in result.warnings)


def test_fan_out_shares_one_qdq_pair_and_other_readers_keep_float():
    fp32 = fan_out_model()
    result, table, feeds = quantize_calibrated(fp32)
    q = result.model
    assert node(q, "conv_a").input[0] == node(q, "conv_b").input[0]
    assert sum(1 for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x") == 1
    assert node(q, "relu_x").input[0] == "x"
    assert result.qdq_pairs == 4  # x (shared), wa, wb, and b: the residual of add_ab
    assert result.quantized_node("add_ab").inputs[0].tensor == "b"
    assert_close_to_fp32(fp32, q, feeds)


def test_weight_shared_with_different_axes_gets_two_pairs():
    fp32 = shared_weight_model()
    result, _, feeds = quantize_calibrated(fp32)
    q = result.model
    assert_weight_qdq(q, "conv", "w", axis=0)
    assert_weight_qdq(q, "deconv", "w", axis=1)
    assert node(q, "conv").input[1] != node(q, "deconv").input[1]
    assert_close_to_fp32(fp32, q, feeds)


def test_excluded_nodes_are_untouched_and_listed():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(fp32, table, exclude=["conv2", r"f.*", "no_such_node"])
    q = result.model
    assert list(node(q, "conv2").input) == ["r1", "w2"]
    assert list(node(q, "fc").input) == ["flat", "fc_w", "fc_b"]
    assert result.skipped_node("conv2").reason == "excluded by user ('conv2')"
    assert result.skipped_node("fc").reason == "excluded by user ('f.*')"
    assert (
        "exclude pattern 'no_such_node' matched no node (a pattern matches whole node names: "
        "'no_such_node.*' for names that start with it)" in result.warnings
    )
    assert {n.node for n in result.quantized} == {"conv1", "proj"}


def test_op_types_restricts_and_lists_the_rest():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(fp32, table, op_types=["Conv"])
    assert result.skipped_node("fc").reason == "op type Gemm not in op_types"
    assert result.skipped_node("proj").reason == "op type MatMul not in op_types"
    assert list(node(result.model, "proj").input) == ["fc", "proj"]


def test_per_channel_false_gives_per_tensor_weights():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(fp32, table, per_channel=False)
    q, dq = qdq_on(result.model, "conv1", 1)
    assert axis_of(dq) is None
    assert value(result.model, dq.input[1]) == np.abs(value(result.model, "w1")).max() / F32(127)
    assert not result.per_channel


def test_opset_11_model_is_upgraded_to_13():
    fp32 = cnn(opset=11)
    result, _, feeds = quantize_calibrated(fp32)
    assert (result.opset_from, result.opset_to) == (11, 13)
    assert result.model.opset_import[0].version == 13
    assert_weight_qdq(result.model, "conv1", "w1", axis=0)
    onnx.checker.check_model(result.model)
    assert_close_to_fp32(fp32, result.model, feeds)


def test_failed_upgrade_falls_back_to_per_tensor_with_warning(monkeypatch):
    def refuse(model, target):
        raise RuntimeError("adapter missing")

    monkeypatch.setattr(opset_module, "convert", refuse)
    fp32 = cnn(opset=11)
    result, _, feeds = quantize_calibrated(fp32)
    assert result.opset_to == 11 and not result.per_channel
    assert any("per-tensor" in w and "adapter missing" in w for w in result.warnings)
    assert all(axis_of(n) is None for n in result.model.graph.node if "Linear" in n.op_type)
    assert_close_to_fp32(fp32, result.model, feeds)


def test_opset_below_10_not_convertible_is_refused(monkeypatch):
    fp32 = cnn(opset=9)
    table = minmax_table(fp32, random_feeds(fp32))
    upgraded = quantize_model(fp32, table)
    assert (upgraded.opset_from, upgraded.opset_to) == (9, 13)

    def refuse(model, target):
        raise RuntimeError("no adapter")

    monkeypatch.setattr(opset_module, "convert", refuse)
    with pytest.raises(QuantbenchError, match=r"opset 9 is too old for Q/DQ"):
        quantize_model(fp32, table)


def test_emitted_models_load_in_onnxruntime_and_pass_checker():
    for fp32 in (
        cnn(),
        gemm_model(0),
        conv_transpose_model(),
        constant_node_weights(),
        dynamic_weight_conv(True),
        fan_out_model(),
    ):
        result, _, feeds = quantize_calibrated(fp32)
        onnx.checker.check_model(result.model, full_check=True)
        ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        # loading is not enough: the model computes the FP32 function, quantized (not equal)
        assert_close_to_fp32(fp32, result.model, feeds, threshold=0.98)
        got, want = run(result.model, feeds[0])[0], run(fp32, feeds[0])[0]
        assert np.abs(got - want).max() > 0, fp32.graph.name


# --------------------------------------------------------------------------- bad input


def test_table_for_another_model_is_refused():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    table.provenance = Provenance(model_hash="0" * 64)
    with pytest.raises(QuantbenchError, match="made for another model"):
        quantize_model(fp32, table)
    result = quantize_model(fp32, table, allow_partial=True)
    assert any("another model" in w for w in result.warnings)


def test_missing_and_extra_entries_are_listed():
    fp32 = cnn()
    full = minmax_table(fp32, random_feeds(fp32))
    table = CalibrationTable()
    table.set("x", full.amax("x"))
    table.set("some/other/model:0", 1.0)
    with pytest.raises(QuantbenchError) as info:
        quantize_model(fp32, table)
    message = str(info.value)
    assert "\n" not in message
    assert "3 missing, e.g. r1, flat, fc" in message
    assert "some/other/model:0" in message and "another model" in message
    assert message.endswith("use --allow-partial to quantize only the rest")
    partial = quantize_model(fp32, table, allow_partial=True)
    assert [n.node for n in partial.quantized] == ["conv1"]
    assert partial.skipped_node("conv2").reason == "input 'r1' has no calibration entry"


def test_extra_entries_alone_are_a_warning():
    fp32 = gemm_model(1)
    table = minmax_table(fp32, random_feeds(fp32))
    table.set("not_in_model", 2.0)
    result = quantize_model(fp32, table)
    assert any("not_in_model" in w and "ignored" in w for w in result.warnings)


def test_a_tensor_zero_in_every_sample_stays_high_precision_without_refusal():
    """An LSTM's initial state (ConstantOfShape) is 0 in every sample: amax 0 is a fact of the
    data, not a broken table (a real CRNN export has two such tensors)."""
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    table.set("r1", 0.0)
    result = quantize_model(fp32, table)
    assert "conv2" not in [n.node for n in result.quantized] and "conv1" in [
        n.node for n in result.quantized
    ]
    assert result.skipped_node("conv2").reason == (
        "input 'r1' was zero in every calibration sample: nothing to quantize"
    )


@pytest.mark.parametrize(
    ("amax", "problem"),
    [
        (-1.0, "amax -1.0 is negative"),
        (float("inf"), "amax inf is infinite"),
        (float("nan"), "amax nan is NaN"),
        (1e-45, "amax 1e-45 gives an FP32 scale (amax / 127) that underflows to 0"),
        (1e-44, "amax 1e-44 gives an FP32 scale (amax / 127) that underflows to 0"),
        (1e-40, "amax 1e-40 gives a subnormal FP32 scale (7.88e-43;"),
    ],
)
def test_invalid_scale_is_refused_naming_the_tensor(amax, problem):
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    table.set("r1", amax)
    with pytest.raises(QuantbenchError, match=r"have no usable scale, e.g\. r1 \(") as info:
        quantize_model(fp32, table)
    assert problem in str(info.value)
    result = quantize_model(fp32, table, allow_partial=True)
    assert problem in result.skipped_node("conv2").reason


def test_existing_qdq_is_refused_unless_requantize():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    first = quantize_model(fp32, table)
    with pytest.raises(QuantbenchError, match="already has .* QuantizeLinear/DequantizeLinear"):
        quantize_model(first.model, table)
    again = quantize_model(first.model, table, requantize=True)
    assert [n.op_type for n in again.model.graph.node] == [
        n.op_type for n in first.model.graph.node
    ]
    for a, b in zip(again.model.graph.initializer, first.model.graph.initializer, strict=True):
        assert a.name == b.name
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_requantize_restores_int8_weights_behind_lone_dq():
    fp32 = gemm_model(1)
    table = minmax_table(fp32, random_feeds(fp32))
    first = quantize_model(fp32, table).model
    # rewrite the weight pair into the "INT8 weight + DQ" form other tools write
    q = next(n for n in first.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "w")
    scale = value(first, q.input[1])
    w = value(first, "w")
    int8 = np.clip(np.round(w / scale[:, None]), -128, 127).astype(np.int8)
    first.graph.initializer.append(_init("w_int8", int8))
    dq = next(
        n for n in first.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]
    )
    dq.input[0] = "w_int8"
    first.graph.node.remove(q)
    again = quantize_model(first, table, requantize=True)
    qw, _ = qdq_on(again.model, "gemm", 1)
    np.testing.assert_allclose(value(again.model, qw.input[0]), int8 * scale[:, None], rtol=0)


def test_bad_regex_and_bad_op_types_are_refused():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    with pytest.raises(QuantbenchError, match=r"exclude pattern 'conv\[' is not a node name"):
        quantize_model(fp32, table, exclude=["conv["])
    with pytest.raises(QuantbenchError, match="'Relu' cannot be quantized"):
        quantize_model(fp32, table, op_types=["Conv", "Relu"])


def test_node_name_that_is_not_a_regex_can_be_excluded():
    fp32 = gemm_model(1)
    fp32.graph.node[0].name = "gemm(1"
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(fp32, table, exclude=["gemm(1"])
    assert result.skipped_node("gemm(1").reason.startswith("excluded by user")


def test_write_quantized_is_atomic_and_checks_folder(tmp_path):
    fp32 = cnn()
    result, _, _ = quantize_calibrated(fp32)
    path = write_quantized(result, tmp_path / "model.qdq.onnx")
    assert onnx.load(str(path)) == result.model
    assert [p.name for p in tmp_path.iterdir()] == ["model.qdq.onnx"]
    with pytest.raises(QuantbenchError, match="does not exist"):
        write_quantized(result, tmp_path / "missing" / "m.onnx")


def test_quantize_from_path_and_unnamed_nodes(tmp_path):
    fp32 = conv_add_after_conv()
    for n in fp32.graph.node:
        n.name = ""
    path = tmp_path / "m.onnx"
    onnx.save(fp32, str(path))
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(path, table)
    assert [n.node for n in result.quantized] == ["Conv_0", "Conv_2", "Add_3"]


def test_summary_and_plan_serialise():
    result, _, _ = quantize_calibrated(cnn())
    assert result.summary().startswith("4 ops quantized, 0 left in high precision, 8 Q/DQ pairs")
    plan = result.to_dict()
    assert plan["quantized"][0]["inputs"][1]["axis"] == 0
    assert len(plan["quantized"][0]["inputs"][1]["scale"]) == 8


# --------------------------------------------------------------------------- scales read back


def test_round_trip_table_qdq_table_is_exact():
    fp32 = cnn()
    table = minmax_table(fp32, random_feeds(fp32))
    result = quantize_model(fp32, table)
    back = read_qdq_scales(result.model)
    expected = {i.tensor for n in result.quantized for i in n.inputs if i.role != WEIGHT}
    assert set(back.table) == expected
    for name in back.table:
        assert F32(back.table.amax(name)) == F32(table.amax(name))
        assert back.table.scale(name) == table.scale(name)
    assert len(back.weight_quantizers) == 4
    assert back.table.method == "minmax" and back.table.algorithm == "MinMaxCalibration"


def test_scales_without_embedded_table_keep_exact_scale_bits():
    fp32 = dynamic_weight_conv()
    table = minmax_table(fp32, random_feeds(fp32))
    model = quantize_model(fp32, table).model
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    back = table_from_qdq(model)
    assert "kernel" in back  # the runtime weight is a calibrated tensor
    for name in back:
        assert back.scale(name).tobytes() == table.scale(name).tobytes()
        ulps = abs(
            int(F32(back.amax(name)).view(np.int32)) - int(F32(table.amax(name)).view(np.int32))
        )
        assert ulps <= 1


def test_table_from_cache_scales_round_trips_exactly_without_metadata():
    fp32 = cnn()
    calibrated = minmax_table(fp32, random_feeds(fp32))
    cache_like = CalibrationTable()
    for name in calibrated:
        cache_like.entries[name] = TableEntry.from_scale(calibrated.scale(name))
    model = quantize_model(fp32, cache_like).model
    del model.metadata_props[:]
    back = table_from_qdq(model)
    for name in back:
        assert back.amax(name) == cache_like.amax(name)
        assert back.scale(name) == cache_like.scale(name)


def test_foreign_qdq_model_asymmetric_per_channel_and_constant_scales():
    """A Q/DQ model as other tools write it: uint8 activations, Constant-node scales."""
    rng = np.random.default_rng(9)
    nodes = [
        helper.make_node("Constant", [], ["xs"], value=numpy_helper.from_array(F32(0.05))),
        helper.make_node("Constant", [], ["xz"], value=numpy_helper.from_array(np.uint8(128))),
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="qw", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw", axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"], name="qc", axis=1),
        helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["y"], name="dqc", axis=1),
    ]
    inits = [
        _init("w", _rand(rng, 2, 3, 1, 1)),
        _init("ws", np.full(2, 0.01, F32)),
        _init("wz", np.zeros(2, np.int8)),
        _init("cs", np.full(2, 0.02, F32)),
        _init("cz", np.zeros(2, np.int8)),
    ]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("y", [1, 2, 4, 4])], inits)
    scales = read_qdq_scales(model)
    assert list(scales.table) == ["x"]
    assert scales.table.amax("x") == pytest.approx(128 * 0.05)  # max(|0-128|, |255-128|) * s
    assert scales.asymmetric == ["x"]
    assert scales.weight_quantizers == ["qw"]
    assert scales.per_channel_activations == ["qc"]
    assert "1 activation scales" in scales.summary()


# --------------------------------------------------------------------------- onnxruntime int ops


def _fully_quantized_conv() -> onnx.ModelProto:
    """Q/DQ on input, weight AND output: the pattern onnxruntime fuses into QLinearConv."""
    rng = np.random.default_rng(10)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "z"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "z"], ["xd"], name="dqx"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="qw", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw", axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "cs", "z"], ["cq"], name="qc"),
        helper.make_node("DequantizeLinear", ["cq", "cs", "z"], ["y"], name="dqc"),
    ]
    inits = [
        _init("w", _rand(rng, 4, 3, 3, 3)),
        _init("b", np.zeros(4, F32)),
        _init("xs", F32(0.03)),
        _init("cs", F32(0.05)),
        _init("z", np.int8(0)),
        _init("ws", np.full(4, 0.01, F32)),
        _init("wz", np.zeros(4, np.int8)),
    ]
    return _model(nodes, [_vi("x", [1, 3, 6, 6])], [_vi("y", [1, 4, 6, 6])], inits)


def test_onnxruntime_fuses_fully_quantized_conv_into_qlinearconv():
    rows = integer_op_report(_fully_quantized_conv())
    conv = next(r for r in rows if r["node"] == "conv")
    assert conv == {
        "node": "conv",
        "op_type": "Conv",
        "kernel": "QLinearConv",
        "execution": INTEGER,
        "integer": True,
    }
    assert integer_op_counts(rows) == {INTEGER: 1}


def test_default_placement_is_reported_as_simulated_in_onnxruntime():
    fp32 = cnn()
    result, _, _ = quantize_calibrated(fp32)
    rows = {r["node"]: r for r in integer_op_report(result.model)}
    # Convs without an output Q stay float Convs between DequantizeLinear nodes
    for name in ("conv1", "conv2"):
        assert rows[name]["execution"] == SIMULATED and rows[name]["integer"] is False
    assert rows["conv1"]["kernel"] == "com.microsoft.FusedConv"  # Conv + Relu, still float
    assert rows["relu1"]["execution"] == REMOVED
    # the Gemm's output is quantized because the MatMul reads it: onnxruntime runs QGemm, and
    # the MatMul (DQ inputs, float output) as MatMulIntegerToFloat
    assert rows["fc"]["kernel"] == "com.microsoft.QGemm" and rows["fc"]["integer"]
    assert rows["proj"]["kernel"] == "com.microsoft.MatMulIntegerToFloat"
    assert rows["proj"]["execution"] == INTEGER
    assert rows["gap"]["execution"] == FLOAT and rows["flatten"]["execution"] == FLOAT
    counts = integer_op_counts(list(rows.values()))
    assert counts == {SIMULATED: 2, FLOAT: 5, INTEGER: 2, REMOVED: 1}


def test_integer_report_refuses_models_onnxruntime_cannot_load():
    bad = _fully_quantized_conv()
    bad.graph.node[4].op_type = "DWConv2D"
    with pytest.raises(QuantbenchError, match="onnxruntime cannot load the model"):
        integer_op_report(bad)


def test_no_qdq_placed_on_non_float_inputs():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="int_matmul")]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.INT32, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])],
        [_init("b", np.ones((3, 2), np.int32))],
    )
    table = CalibrationTable()
    result = quantize_model(model, table)
    reason = result.skipped_node("int_matmul").reason
    assert re.search(r"'a' is int32", reason) and "'b' is int32" in reason


# --------------------------------------------------------------------------- bundled example

TINYCNN = Path(__file__).resolve().parents[1] / "examples" / "tinycnn"


@pytest.mark.skipif(not (TINYCNN / "tinycnn.onnx").is_file(), reason="examples/tinycnn not built")
def test_tinycnn_quantizes_every_weighted_op_and_stays_close_to_fp32():
    fp32 = onnx.load(str(TINYCNN / "tinycnn.onnx"))
    name = fp32.graph.input[0].name
    calib = np.load(TINYCNN / "calib.npz")
    images = calib[next(iter(calib.keys()))][:32]
    feeds = [{name: images[i : i + 1]} for i in range(len(images))]
    table = minmax_table(fp32, feeds)
    result = quantize_model(open_graph(fp32), table)
    weighted = [n.name for n in fp32.graph.node if n.op_type in ("Conv", "Gemm")]
    assert {q.node for q in result.quantized} >= set(weighted)
    assert result.skipped == [] and result.warnings == []
    residuals = [q for q in result.quantized if q.op_type == "Add"]
    assert len(residuals) == 2 and all(q.inputs[0].role == RESIDUAL for q in residuals)
    dynamic = result.quantized_node("/dynamic_dw/Conv")
    assert [(i.role, i.axis) for i in dynamic.inputs] == [
        (ACTIVATION, None),
        (RUNTIME_WEIGHT, None),
    ]
    back = table_from_qdq(result.model)
    assert all(back.amax(t) == table.amax(t) for t in back)
    assert_close_to_fp32(fp32, result.model, feeds[:8])


# --------------------------------------------------------------------------- independent values


def _conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pad: int) -> np.ndarray:
    """Plain NCHW cross-correlation, stride 1, in float64 (the reference, not onnxruntime)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    k, _, kh, kw = w.shape
    out = np.zeros((n, k, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i : i + out.shape[2], j : j + out.shape[3]]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j].astype(np.float64))
    return out + (0 if b is None else b.astype(np.float64)[None, :, None, None])


def _fake_quant(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ONNX QuantizeLinear -> DequantizeLinear, int8, zero point 0: x / s in float32, rounded
    half to even, saturated to [-128, 127], times s."""
    q = np.clip(np.rint(x.astype(F32) / scale), -128, 127)
    return (q * scale).astype(F32)


def two_convs() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x[1,2,5,5] -> Conv(w1, b1, pad 1) -> Relu -> Conv(w2, no bias) -> y."""
    rng = np.random.default_rng(11)
    weights = {
        "w1": _rand(rng, 3, 2, 3, 3, scale=0.4),
        "b1": _rand(rng, 3, scale=0.1),
        "w2": _rand(rng, 2, 3, 1, 1, scale=0.6),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    inits = [_init(k, v) for k, v in weights.items()]
    return _model(nodes, [_vi("x", [1, 2, 5, 5])], [_vi("y", [1, 2, 5, 5])], inits), weights


def test_qdq_values_match_hand_derived_scales_placement_and_a_numpy_reference():
    """Not just "it loads": every scale, the exact Q/DQ wiring and the output, derived without
    quantbench (amax chosen by hand; weights' scales and the fake-quant reference in numpy)."""
    fp32, w = two_convs()
    table = CalibrationTable(method="minmax")
    table.set("x", 2.0)  # chosen by hand: some inputs below lie beyond it and must saturate
    table.set("r", 1.5)
    result = quantize_model(fp32, table)
    q = result.model

    # activation scales: 2/127 and 1.5/127 in float32, bit patterns derived by hand
    # (1/127 = 2^-7 * 1.0000001000000100...b, so 2/127 -> 0x3c810204, 1.5/127 -> 0x3c418306)
    assert value(q, qdq_on(q, "conv1", 0)[0].input[1]).view(np.uint32) == 0x3C810204
    assert value(q, qdq_on(q, "conv2", 0)[0].input[1]).view(np.uint32) == 0x3C418306
    s_x, s_r = F32(2.0) / F32(127), F32(1.5) / F32(127)
    # weight scales: max|w| per output channel / 127, computed here with numpy
    s_w1 = (np.abs(w["w1"]).reshape(3, -1).max(axis=1) / F32(127)).astype(F32)
    s_w2 = (np.abs(w["w2"]).reshape(2, -1).max(axis=1) / F32(127)).astype(F32)
    np.testing.assert_array_equal(value(q, qdq_on(q, "conv1", 1)[1].input[1]), s_w1)
    np.testing.assert_array_equal(value(q, qdq_on(q, "conv2", 1)[1].input[1]), s_w2)

    # placement, listed by hand: a Q -> DQ pair in front of x, w1, r and w2; nothing else
    def feeds_of(n: onnx.NodeProto) -> list[str]:
        """What each input of n really is: 'Q/DQ(t)' for a pair on tensor t, else the name."""
        out = []
        for name in n.input:
            dq = producer(q, name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                out.append(f"Q/DQ({producer(q, dq.input[0]).input[0]})")
            else:
                out.append(name)
        return out

    layout = {
        n.name: (n.op_type, feeds_of(n))
        for n in q.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
    }
    assert layout == {
        "conv1": ("Conv", ["Q/DQ(x)", "Q/DQ(w1)", "b1"]),
        "relu": ("Relu", ["c1"]),
        "conv2": ("Conv", ["Q/DQ(r)", "Q/DQ(w2)"]),
    }
    ops = sorted(n.op_type for n in q.graph.node)
    assert ops.count("QuantizeLinear") == 4 and ops.count("DequantizeLinear") == 4
    assert [o.name for o in q.graph.output] == ["y"] and producer(q, "y").op_type == "Conv"

    # output against a numpy fake-quant reference (float tolerance only)
    x = (np.random.default_rng(12).standard_normal((1, 2, 5, 5)) * 1.2).astype(F32)
    assert (np.abs(x) > 2.0).any(), "the test needs values that saturate"
    xq = _fake_quant(x, s_x)
    w1q = _fake_quant(w["w1"], s_w1[:, None, None, None])
    w2q = _fake_quant(w["w2"], s_w2[:, None, None, None])
    r = np.maximum(_conv2d(xq, w1q, w["b1"], pad=1), 0).astype(F32)
    expected = _conv2d(_fake_quant(r, s_r), w2q, None, pad=0)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        q.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # and the quantization is real: the FP32 model gives a measurably different answer
    (fp32_out,) = run(fp32, {"x": x})
    assert np.abs(fp32_out - got).max() > 1e-3


def test_gemm_qdq_output_matches_numpy_fake_quant():
    """Gemm transB=1: per-row weight scales (axis 0) and the output, derived in numpy."""
    fp32 = gemm_model(1)
    wt = value(fp32, "w")  # [5, 7]: output rows
    table = CalibrationTable(method="minmax")
    table.set("x", 1.0)
    q = quantize_model(fp32, table).model
    s_w = (np.abs(wt).max(axis=1) / F32(127)).astype(F32)
    np.testing.assert_array_equal(value(q, qdq_on(q, "gemm", 1)[1].input[1]), s_w)
    x = (np.random.default_rng(13).standard_normal((2, 7))).astype(F32)
    s_x = F32(1.0) / F32(127)
    expected = _fake_quant(x, s_x).astype(np.float64) @ _fake_quant(wt, s_w[:, None]).T
    (got,) = run(q, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_one_graph_quantized_with_many_tables_is_upgraded_once(tmp_path, monkeypatch):
    """auto and recover quantize one model with many tables: the opset upgrade (here 12 -> 13,
    for per-channel weights) and each weight's scale run once per source graph, and every
    result is the one a fresh graph gives."""
    from quantbench.calibrate import calibrate
    from quantbench.qdq import placement as qp
    from quantbench.qdq import quantize as qz

    path = synthetic.save(synthetic.small_cnn(opset=12), tmp_path / "m12.onnx")
    np.savez(tmp_path / "d.npz", input=synthetic.images(16))
    tables = calibrate(path, tmp_path / "d.npz", methods=["minmax", "mse"], show_progress=False)
    tables = tables.tables
    assert tables["minmax"].amaxes() != tables["mse"].amaxes()
    fresh = {m: quantize_model(open_graph(path), t).model for m, t in tables.items()}
    upgrades = []
    real = qz.ensure_qdq_opset
    monkeypatch.setattr(qz, "ensure_qdq_opset", lambda *a: upgrades.append(1) or real(*a))
    scaled = []
    real_scale = qp.weight_scale
    monkeypatch.setattr(qp, "weight_scale", lambda *a: scaled.append(1) or real_scale(*a))
    graph = open_graph(path)
    for m in ["minmax", "mse", "minmax"]:
        result = quantize_model(graph, tables[m])
        assert result.opset_from == 12 and result.opset_to == 13 and result.per_channel
        assert result.model.SerializeToString() == fresh[m].SerializeToString()
        weighted = sum(n.op_type in ("Conv", "Gemm") for n in graph.model.graph.node)
        assert len(scaled) == weighted  # the first table's call found every scale
    assert len(upgrades) == 1
    quantize_model(open_graph(path), tables["mse"])  # another graph: its own upgrade
    quantize_model(graph, tables["mse"], per_channel=False)  # another form: its own too
    assert len(upgrades) == 3


def test_the_ready_graph_is_dropped_with_its_source(tmp_path):
    """The kept Q/DQ-ready form goes with its source graph, not with the process."""
    import gc

    from quantbench.calibrate import calibrate
    from quantbench.qdq import quantize as qz

    path = synthetic.save(synthetic.small_cnn(opset=12), tmp_path / "m12.onnx")
    np.savez(tmp_path / "d.npz", input=synthetic.images(8))
    table = calibrate(path, tmp_path / "d.npz", methods=["minmax"], show_progress=False)
    graph = open_graph(path)
    quantize_model(graph, table.tables["minmax"])
    assert len(qz._READY) == 1
    del graph
    gc.collect()
    assert qz._READY == []


def test_recurrent_layers_are_said_to_stay_in_high_precision(tmp_path):
    """beats_blstm: '1 ops quantized, 0 left in high precision' said nothing of its 6 LSTMs,
    which hold most of its weights and which TensorRT's INT8 Q/DQ does not quantize."""
    from onnx import TensorProto, helper, numpy_helper

    from quantbench.qdq import quantize_model
    from quantbench.table import CalibrationTable

    rng = np.random.default_rng(0)
    hidden, feats = 3, 4
    inits = [
        numpy_helper.from_array(rng.normal(size=(1, 4 * hidden, feats)).astype("f4"), "W"),
        numpy_helper.from_array(rng.normal(size=(1, 4 * hidden, hidden)).astype("f4"), "R"),
        numpy_helper.from_array(rng.normal(size=(hidden, 2)).astype("f4"), "w2"),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["Y"], hidden_size=hidden),
        helper.make_node("Flatten", ["Y"], ["ys"], axis=3),  # [T, 1, 1, H] -> [T, H]
        helper.make_node("MatMul", ["ys", "w2"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, feats])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [5, 2])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    table = CalibrationTable(method="minmax")
    for name in ("x", "Y", "ys"):
        table.set(name, 1.0)
    result = quantize_model(model, table, allow_partial=True)
    assert result.not_quantizable == {"LSTM": 1}
    assert "1 LSTM not quantizable (they stay in FP32/FP16)" in result.summary()
    assert result.to_dict()["not_quantizable"] == {"LSTM": 1}


def test_nothing_quantized_is_refused_not_passed(run_cli, cnn_path, cnn_data, tmp_path):
    """g2p's LSTM encoder has no op TensorRT quantizes: quantize wrote an 'INT8' model equal to
    the FP32 one and compare printed 'PASS sqnr_db = inf'. Excluding every op does the same."""
    every = [".*"]
    code, _, err = run_cli("quantize", cnn_path, "--data", cnn_data, "-m", "minmax",
                           "--exclude", *every, "-o", tmp_path / "q.onnx")  # fmt: skip
    assert code == 2 and "no op is quantized" in err
    assert not (tmp_path / "q.onnx").exists()
    code, _, err = run_cli("compare", "fp32", "int8", "--model", cnn_path, "--data", cnn_data,
                           "--calib-data", cnn_data, "-m", "minmax", "--exclude", *every,
                           "--fail-below", "sqnr_db=30", "--no-latency")  # fmt: skip
    assert code == 2 and "int8:minmax: no op is quantized" in err and "PASS" not in err


def test_checked_false_skips_only_the_checker(monkeypatch):
    """``checked=False`` (auto's candidates, which onnxruntime loads anyway) runs no ONNX
    checker on the result, and the model is the checked one's."""
    from quantbench.qdq import quantize as quantize_module

    fp32 = cnn()
    checked, table, _ = quantize_calibrated(fp32)
    monkeypatch.setattr(
        quantize_module, "_check_output", lambda *a: pytest.fail("the checker ran")
    )
    unchecked = quantize_model(fp32, table, checked=False)
    assert unchecked.model.SerializeToString() == checked.model.SerializeToString()


def test_quantbench_sessions_run_a_qdq_model_as_written():
    """On x86 without VNNI onnxruntime's fused integer kernels saturate int16 sums (this CNN's
    INT8 output: cosine 0.90 to FP32 on an AVX2-only AMD EPYC); with VNNI they are exact but
    round an FP32 bias to int32. quantbench's sessions turn the fusion off on every machine, so
    what compare measures is the Q/DQ model's own arithmetic, as TensorRT computes it, alike
    on every CPU."""
    from quantbench.backends.onnxruntime import (
        QDQ_FUSION,
        OnnxRuntimeRunner,
        disabled_optimizers,
    )

    fp32 = cnn()
    result, _, feeds = quantize_calibrated(fp32)
    runner = OnnxRuntimeRunner(result.model, "cpu")
    for feed in feeds:
        (as_written,) = run(result.model, feed)
        got = runner.infer(feed, ["y"])["y"]
        np.testing.assert_allclose(got, as_written, rtol=1e-5, atol=1e-6)
        assert cosine(got, run(fp32, feed)[0]) > 0.99
    runner.close()
    assert QDQ_FUSION in disabled_optimizers()  # on every machine, VNNI or not


def _biased_qdq_conv() -> onnx.ModelProto:
    """x -> Q/DQ (scale 1) -> Conv 1x1 with an int8 weight 1 (DQ scale 1) and an FP32 bias ->
    Q/DQ (scale 1/8, so that the bias's 3/8 is kept)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    eighth = numpy_helper.from_array(np.array(0.125, np.float32), "eighth")
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.int8), "w_q")
    b = numpy_helper.from_array(np.array([0.375], np.float32), "b")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "one", "zero"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "one", "zero"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "one", "zero"], ["w_dq"]),
        helper.make_node("Conv", ["x_dq", "w_dq", "b"], ["conv"]),
        helper.make_node("QuantizeLinear", ["conv", "eighth", "zero"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "eighth", "zero"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "biased",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        [one, eighth, zero, w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_quantbench_sessions_add_an_fp32_bias_in_fp32():
    """quantbench's sessions turn onnxruntime's Q/DQ fusion off on every machine, and its other
    Q/DQ rewrites with it: one of them rounds a Q/DQ conv's FP32 bias to int32 at input scale x
    weight scale, which TensorRT does not (it adds the bias in FP32). With both scales 1,
    onnxruntime's default session adds 0 for a bias of 0.375 (where the fused kernels run); the
    model says round(x) + 0.375, which quantbench's session gives on any CPU."""
    from quantbench.backends.onnxruntime import OnnxRuntimeRunner
    x = np.array([[[[1.2, 2.0], [3.0, -4.4]]]], np.float32)
    expected = np.array([[[[1.375, 2.375], [3.375, -3.625]]]], np.float32)  # by hand
    runner = OnnxRuntimeRunner(_biased_qdq_conv(), "cpu")
    np.testing.assert_array_equal(runner.infer({"x": x})["y"], expected)
    runner.close()


# --------------------------------------------------------------------------- reused edits


def _scaled(table: CalibrationTable, factor: float) -> CalibrationTable:
    out = CalibrationTable(method=f"x{factor}", algorithm=table.algorithm)
    for name, entry in table.entries.items():
        out.set(name, entry.amax * factor)
    return out


@pytest.mark.parametrize("make", [cnn, fan_out_model, shared_weight_model, constant_node_weights])
def test_a_graph_quantized_again_with_other_scales_is_the_fresh_model_bit_for_bit(make) -> None:
    """One Graph quantized with table A, then B (the last Q/DQ edit rescaled): B's model
    serialises to exactly the bytes of B quantized on a fresh graph, and changing what was
    returned changes no later result."""
    model = make()
    table = minmax_table(model, random_feeds(model))
    graph = open_graph(model)
    first = quantize_model(graph, table).model
    first.graph.initializer[0].name = "changed by the caller"
    for factor in (0.5, 3.0):
        other = _scaled(table, factor)
        again = quantize_model(graph, other).model
        fresh = quantize_model(open_graph(model), other).model
        assert again.SerializeToString() == fresh.SerializeToString(), factor
        assert any(again.graph.initializer) and again is not fresh


def test_a_placement_with_another_layout_is_edited_anew() -> None:
    """Excluding a node changes the graph, not only its scales: the result equals a fresh
    quantization with that exclusion (no stale edit reused)."""
    model = fan_out_model()
    table = minmax_table(model, random_feeds(model))
    graph = open_graph(model)
    quantize_model(graph, table)
    again = quantize_model(graph, table, exclude=["conv_b"]).model
    fresh = quantize_model(open_graph(model), table, exclude=["conv_b"]).model
    assert again.SerializeToString() == fresh.SerializeToString()
    assert producer(again, node(again, "conv_b").input[0]) is None  # x itself
