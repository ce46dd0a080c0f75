"""The DWConv2D ONNX op: builder, validation, Conv <-> DWConv2D rewrites checked numerically in
onnxruntime, the per-sample-kernel lowering against a numpy reference, and the INT8 plugin
pattern's structure (TensorRT itself cannot run here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import QuantbenchError
from quantbench.plugins.dwconv2d import (
    OP_TYPE,
    PLUGIN_NAMESPACE,
    checkable_copy,
    conv_to_dwconv2d,
    dwconv2d_int8_pattern,
    dwconv2d_to_conv,
    is_dwconv2d,
    make_dwconv2d_node,
    validate_dwconv2d,
)
from quantbench.qdq import quantize_model
from quantbench.table import CalibrationTable

F32 = np.float32
TINYCNN = Path(__file__).resolve().parents[1] / "examples" / "tinycnn" / "tinycnn.onnx"


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "dw", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run(model, feed):
    """The model as written (conftest.exact_session: no Q/DQ fused into integer kernels)."""
    from conftest import exact_session

    return exact_session(model.SerializeToString()).run(None, feed)


def dynamic_depthwise(channels: int = 4, tail: str = "none", **conv_attrs) -> onnx.ModelProto:
    """GlobalAveragePool -> Gemm -> Reshape to [C,1,3,3]: a kernel computed from the sample;
    Conv(x, kernel, group=C), static batch 1. ``tail``: "conv" (a quantizable Conv reads the
    result), "residual" (an Add reads it as well)."""
    rng = np.random.default_rng(0)
    c = channels
    conv_attrs = {"pads": [1, 1, 1, 1], **conv_attrs}
    inits = [
        numpy_helper.from_array((rng.standard_normal((c * 9, c)) * 0.5).astype(F32), "hyper_w"),
        numpy_helper.from_array(np.array([c, 1, 3, 3], np.int64), "kernel_shape"),
        numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.5).astype(F32), "after_w"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["feat"], name="flatten"),
        helper.make_node("Gemm", ["feat", "hyper_w"], ["kflat"], name="hyper", transB=1),
        helper.make_node("Reshape", ["kflat", "kernel_shape"], ["kernel"], name="to_kernel"),
        helper.make_node("Conv", ["x", "kernel"], ["d"], name="dyn", group=c, **conv_attrs),
    ]
    out = "d"
    if tail in ("conv", "residual"):
        nodes.append(helper.make_node("Conv", ["d", "after_w"], ["y"], name="after"))
        out = "y"
    if tail == "residual":
        nodes.append(helper.make_node("Add", ["d", "y"], ["z"], name="residual"))
        out = "z"
    else:
        inits = inits[:2] if tail == "none" else inits
    model = _model(nodes, [_vi("x", [1, c, 8, 8])], [_vi(out, None)], inits)
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(v for v in inferred.graph.output)
    onnx.checker.check_model(model)
    return model


def conv2d_reference(x, w, b, strides, pads, dilations, group):
    """Direct grouped convolution in float64 (NCHW, KCRS, ONNX pads order)."""
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    wo = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, k, ho, wo))
    kg = k // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilations[0], j * dilations[1]
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    r0 : r0 + strides[0] * (ho - 1) + 1 : strides[0],
                    c0 : c0 + strides[1] * (wo - 1) + 1 : strides[1],
                ]
                out[:, g * kg : (g + 1) * kg] += np.einsum(
                    "ncij,kc->nkij", patch, w[g * kg : (g + 1) * kg, :, i, j]
                )
    if b is not None:
        out += b.reshape(1, k, 1, 1)
    return out


def per_sample_reference(x, w, b, **attrs):
    """The DWConv2D semantics: sample n uses kernel w[n] (and bias b[n] for [N, K] bias)."""
    rows = []
    for n in range(x.shape[0]):
        kernel = w[n] if w.ndim == 5 else w
        bias = None if b is None else (b[n] if b.ndim == 2 else b)
        rows.append(conv2d_reference(x[n : n + 1], kernel, bias, **attrs))
    return np.concatenate(rows)


def dw_model(x_shape, w_shape, b_shape=None, out_shape=None, **attrs):
    """A model whose DWConv2D takes X, W (and bias) as graph inputs."""
    inputs = [_vi("X", x_shape), _vi("W", w_shape)] + ([_vi("B", b_shape)] if b_shape else [])
    node = make_dwconv2d_node("X", "W", "Y", "B" if b_shape else None, name="dw", **attrs)
    return _model([node], inputs, [_vi("Y", out_shape)])


# --------------------------------------------------------------------------- builder


def test_make_node_carries_the_plugin_contract():
    node = make_dwconv2d_node(
        "x", "w", "y", "b", strides=[2, 2], pads=[1, 1, 1, 1], group=8, name="dw"
    )
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == OP_TYPE == "DWConv2D" and node.domain == ""
    assert attrs == {
        "strides": [2, 2],
        "pads": [1, 1, 1, 1],
        "dilations": [1, 1],
        "group": 8,
        "input_scale": -1.0,
        "weight_scale": -1.0,
        "output_scale": -1.0,
        "plugin_namespace": PLUGIN_NAMESPACE.encode(),
        "plugin_version": b"1",
    }
    assert list(node.input) == ["x", "w", "b"]


def test_checkable_copy_lets_the_checker_see_the_rest():
    model = dw_model([1, 4, 6, 6], [4, 1, 3, 3], out_shape=[1, 4, 4, 4], group=4)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for DWConv2D"):
        onnx.checker.check_model(model)
    onnx.checker.check_model(checkable_copy(model))
    assert model.graph.node[0].domain == ""  # the original is not touched


# --------------------------------------------------------------------------- Conv <-> DWConv2D


def test_conv_to_dwconv2d_and_back_is_exact_in_onnxruntime():
    original = dynamic_depthwise(tail="residual", strides=[1, 1], dilations=[1, 1])
    dw = conv_to_dwconv2d(original)
    node = next(n for n in dw.graph.node if n.name == "dyn")
    assert node.op_type == "DWConv2D" and list(node.input) == ["x", "kernel"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["group"] == 4 and attrs["pads"] == [1, 1, 1, 1] and attrs["strides"] == [1, 1]
    assert [n.op_type for n in dw.graph.node].count("Conv") == 1  # the constant-weight Conv stays
    lowered = dwconv2d_to_conv(dw)
    onnx.checker.check_model(lowered)
    assert not any(n.op_type == "DWConv2D" for n in lowered.graph.node)
    assert next(n for n in lowered.graph.node if n.name == "dyn").op_type == "Conv"
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((1, 4, 8, 8)).astype(F32)
        np.testing.assert_array_equal(run(original, {"x": x})[0], run(lowered, {"x": x})[0])


def test_auto_pad_same_upper_becomes_explicit_pads():
    rng = np.random.default_rng(2)
    model = dynamic_depthwise()
    conv = next(n for n in model.graph.node if n.name == "dyn")
    del conv.attribute[:]
    conv.attribute.extend(
        [
            helper.make_attribute("group", 4),
            helper.make_attribute("strides", [2, 2]),
            helper.make_attribute("auto_pad", "SAME_UPPER"),
            helper.make_attribute("kernel_shape", [3, 3]),
        ]
    )
    del model.graph.output[:]
    model.graph.output.append(_vi("d", [1, 4, 4, 4]))
    original = model
    dw = conv_to_dwconv2d(original)
    pads = next(
        helper.get_attribute_value(a) for a in dw.graph.node[-1].attribute if a.name == "pads"
    )
    assert pads == [0, 0, 1, 1]  # total padding 1 per axis; SAME_UPPER puts it at the end
    x = rng.standard_normal((1, 4, 8, 8)).astype(F32)
    np.testing.assert_array_equal(
        run(original, {"x": x})[0], run(dwconv2d_to_conv(dw), {"x": x})[0]
    )


def test_conv_to_dwconv2d_custom_domain_passes_checker_as_is():
    dw = conv_to_dwconv2d(dynamic_depthwise(), domain="quantbench")
    onnx.checker.check_model(dw)
    x = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(F32)
    np.testing.assert_array_equal(
        run(dynamic_depthwise(), {"x": x})[0], run(dwconv2d_to_conv(dw), {"x": x})[0]
    )


def test_conv_to_dwconv2d_refuses_what_it_cannot_rewrite():
    model = dynamic_depthwise(tail="conv")
    with pytest.raises(QuantbenchError, match="'after' is not a Conv with a runtime kernel"):
        conv_to_dwconv2d(model, nodes=["after"])
    with pytest.raises(QuantbenchError, match="no node named 'nope'"):
        conv_to_dwconv2d(model, nodes=["nope"])
    assert conv_to_dwconv2d(model, nodes=["dyn"]).graph.node[4].op_type == "DWConv2D"
    bad_kernel = dynamic_depthwise()
    next(n for n in bad_kernel.graph.node if n.name == "dyn").attribute.append(
        helper.make_attribute("kernel_shape", [5, 5])
    )
    with pytest.raises(QuantbenchError, match=r"kernel_shape \[5, 5\] disagrees"):
        conv_to_dwconv2d(bad_kernel)


def test_conv_to_dwconv2d_refuses_1d_conv():
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="c1d")]
    model = _model(nodes, [_vi("x", [1, 2, 8]), _vi("w", [2, 2, 3])], [_vi("y", [1, 2, 6])])
    with pytest.raises(QuantbenchError, match="Conv 'c1d': DWConv2D is 2-D only"):
        conv_to_dwconv2d(model)


# --------------------------------------------------------------------------- lowering numerics


@pytest.mark.parametrize(
    ("w_shape", "b_shape"),
    [
        ([3, 6, 2, 3, 3], [3, 6]),  # per-sample kernel and bias: batch folded into channels
        ([3, 6, 2, 3, 3], [6]),  # per-sample kernel, shared bias (tiled)
        ([3, 6, 2, 3, 3], None),
        ([6, 2, 3, 3], [3, 6]),  # shared kernel, per-sample bias (added as [N, K, 1, 1])
    ],
)
def test_lowering_matches_numpy_loop_reference(w_shape, b_shape):
    attrs = {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2], "group": 2}
    model = dw_model([3, 4, 9, 9], w_shape, b_shape, None, **attrs)
    validate_dwconv2d(model, model.graph.node[0])
    lowered = dwconv2d_to_conv(model)
    onnx.checker.check_model(lowered)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 9, 9)).astype(F32)
    w = rng.standard_normal(w_shape).astype(F32)
    feed = {"X": x, "W": w}
    b = None
    if b_shape:
        b = rng.standard_normal(b_shape).astype(F32)
        feed["B"] = b
    got = run(lowered, feed)[0]
    want = per_sample_reference(
        x, w, b, strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2
    )
    assert got.shape == want.shape == (3, 6, 5, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_per_sample_kernels_with_dynamic_batch_are_refused():
    model = dw_model(["N", 4, 8, 8], ["N", 4, 1, 3, 3], group=4)
    with pytest.raises(QuantbenchError, match="needs a static kernel shape.*fixed batch size"):
        dwconv2d_to_conv(model)


def test_shared_kernel_with_dynamic_batch_lowers_to_plain_conv():
    model = dw_model(["N", 4, 8, 8], [4, 1, 3, 3], group=4, pads=[1, 1, 1, 1])
    lowered = dwconv2d_to_conv(model)
    assert [n.op_type for n in lowered.graph.node] == ["Conv"]
    rng = np.random.default_rng(5)
    x, w = (
        rng.standard_normal((2, 4, 8, 8)).astype(F32),
        rng.standard_normal((4, 1, 3, 3)).astype(F32),
    )
    want = conv2d_reference(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 4)
    np.testing.assert_allclose(run(lowered, {"X": x, "W": w})[0], want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "b_shape", "attrs", "message"),
    [
        ([1, 4, 8, 8], [4, 1, 3, 3], None, {"strides": [1, 1, 1]}, "strides must be 2 ints"),
        ([1, 4, 8, 8], [4, 1, 3, 3], None, {"pads": [1, 1]}, "pads must be 4 ints"),
        ([1, 4, 8, 8], [4, 1, 3, 3], None, {"pads": [1, -1, 1, 1]}, "pads must be >= 0"),
        ([1, 4, 8, 8], [4, 1, 3, 3], None, {"dilations": [0, 1]}, "dilations must be >= 1"),
        ([1, 4, 8, 8], [4, 1, 3, 3], None, {"group": 0}, "group must be a positive integer"),
        (
            [1, 4, 8, 8],
            [4, 1, 3, 3],
            None,
            {"group": 3},
            "group 3 does not divide the input channels C=4",
        ),
        (
            [1, 4, 8, 8],
            [3, 2, 3, 3],
            None,
            {"group": 2},
            "group 2 does not divide the output channels K=3",
        ),
        (
            [1, 4, 8, 8],
            [4, 2, 3, 3],
            None,
            {"group": 4},
            r"kernel channel dim is 2 but C/group = 4/4 = 1",
        ),
        ([1, 4, 8, 8], [4, 1, 3], None, {"group": 4}, "got rank 3"),
        ([1, 4, 8], [4, 1, 3, 3], None, {"group": 4}, r"input X must be \[N, C, H, W\]"),
        ([1, 4, 8, 8], [4, 1, 3, 3], [5], {"group": 4}, "bias has 5 values per sample but K=4"),
        ([1, 4, 8, 8], [4, 1, 3, 3], [1, 4, 1], {"group": 4}, r"bias must be \[K\] or \[N, K\]"),
        ([2, 4, 8, 8], [4, 1, 3, 3], [3, 4], {"group": 4}, "bias is .N, K. with N=3"),
        ([2, 4, 8, 8], [3, 4, 1, 3, 3], None, {"group": 4}, "per-sample kernel has N=3"),
        (
            [1, 4, 8, 8],
            [4, 1, 3, 3],
            None,
            {"group": 4, "input_scale": 0.1},
            "needs both input_scale and weight_scale",
        ),
        (
            [1, 4, 8, 8],
            [4, 1, 3, 3],
            None,
            {"group": 4, "output_scale": 0.1},
            "needs INT8 input too",
        ),
        (
            [1, 4, 8, 8],
            [4, 1, 3, 3],
            None,
            {"group": 4, "output_scale": float("nan")},
            "output_scale must be a finite float",
        ),
    ],
)
def test_validation_errors_name_the_node(x_shape, w_shape, b_shape, attrs, message):
    model = dw_model(x_shape, w_shape, b_shape, **attrs)
    with pytest.raises(QuantbenchError, match=f"DWConv2D 'dw': .*{message}"):
        validate_dwconv2d(model, model.graph.node[0])


def test_validation_rejects_unknown_attributes_and_arity():
    model = dw_model([1, 4, 8, 8], [4, 1, 3, 3], group=4)
    node = model.graph.node[0]
    node.attribute.append(helper.make_attribute("kernel_shape", [3, 3]))
    with pytest.raises(QuantbenchError, match="unknown attributes kernel_shape"):
        validate_dwconv2d(model, node)
    del node.input[1:]
    with pytest.raises(QuantbenchError, match=r"needs inputs \(X, W\)"):
        validate_dwconv2d(model, node)


def test_valid_node_gives_its_spec():
    model = dw_model([2, 4, 8, 8], [2, 4, 1, 3, 3], [2, 4], group=4, pads=[1, 1, 1, 1])
    spec = validate_dwconv2d(model, model.graph.node[0])
    assert spec.per_batch and spec.group == 4 and spec.pads == (1, 1, 1, 1)
    assert spec.bias_shape == (2, 4) and not spec.int8_input and not spec.int8_output


# --------------------------------------------------------------------------- INT8 plugin pattern


def _minmax_table(model, feeds):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for node in probe.graph.node:
        for out in node.output:
            if out not in {o.name for o in probe.graph.output}:
                probe.graph.output.append(helper.make_empty_tensor_value_info(out))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    table = CalibrationTable(method="minmax")
    for feed in feeds:
        for name, value in (dict(zip(names, session.run(None, feed), strict=True)) | feed).items():
            if value.dtype == F32:
                table.set(
                    name,
                    max(table.amax(name) if name in table else 0.0, float(np.abs(value).max())),
                )
    return table


def _quantized_dw(tail: str):
    original = dynamic_depthwise(tail=tail)
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(F32)} for _ in range(4)]
    table = _minmax_table(original, feeds)
    dw = conv_to_dwconv2d(original)
    result = quantize_model(dw, table, op_types=("Conv", "Gemm", "DWConv2D"))
    return original, table, feeds, result


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_int8_pattern_removes_input_dq_and_absorbs_the_output_q():
    original, table, feeds, result = _quantized_dw(tail="conv")
    planned = result.quantized_node("dyn")
    assert [(i.tensor, i.role) for i in planned.inputs] == [
        ("x", "activation"),
        ("kernel", "runtime weight"),
    ]
    # the plugin op's output is typed by onnxruntime on the lowered model (graph._elem_types)
    assert not any("type of 'd' is unknown" in w for w in result.warnings)
    pattern = dwconv2d_int8_pattern(result.model)
    dw = next(n for n in pattern.graph.node if n.op_type == "DWConv2D")
    producers = {o: n for n in pattern.graph.node for o in n.output}
    assert [producers[i].op_type for i in dw.input] == ["QuantizeLinear", "QuantizeLinear"]
    assert [producers[i].input[0] for i in dw.input] == ["x", "kernel"]
    attrs = _attrs(dw)
    assert np.float32(attrs["input_scale"]) == table.scale("x")
    assert np.float32(attrs["weight_scale"]) == table.scale("kernel")
    assert np.float32(attrs["output_scale"]) == table.scale("d")  # its only reader was a Q
    readers = [n for n in pattern.graph.node if dw.output[0] in n.input]
    assert [n.op_type for n in readers] == ["DequantizeLinear"]  # INT8 out -> DQ -> Conv
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "d" for n in pattern.graph.node)
    # the INT8 plugin form lowers to exactly the Q/DQ model it stands for
    for feed in feeds:
        qdq = run(dwconv2d_to_conv(result.model), feed)[0]
        plugin = run(dwconv2d_to_conv(pattern), feed)[0]
        np.testing.assert_array_equal(qdq, plugin)
        fp32 = run(original, feed)[0]
        cos = float((qdq * fp32).sum() / (np.linalg.norm(qdq) * np.linalg.norm(fp32)))
        assert cos > 0.99


def test_int8_pattern_keeps_float_output_when_other_ops_read_it():
    _, _, feeds, result = _quantized_dw(tail="residual")
    pattern = dwconv2d_int8_pattern(result.model)
    dw = next(n for n in pattern.graph.node if n.op_type == "DWConv2D")
    assert _attrs(dw)["output_scale"] == -1.0 and _attrs(dw)["input_scale"] > 0
    assert dw.output[0] == "d"
    for feed in feeds:
        np.testing.assert_array_equal(
            run(dwconv2d_to_conv(result.model), feed)[0], run(dwconv2d_to_conv(pattern), feed)[0]
        )


def test_int8_pattern_refuses_unquantized_or_missing_nodes():
    dw = conv_to_dwconv2d(dynamic_depthwise())
    with pytest.raises(
        QuantbenchError, match="DWConv2D 'dyn': its data input has no DequantizeLinear"
    ):
        dwconv2d_int8_pattern(dw)
    with pytest.raises(QuantbenchError, match="no DWConv2D named other"):
        dwconv2d_int8_pattern(dw, nodes=["other"])
    with pytest.raises(QuantbenchError, match="has no DWConv2D node"):
        dwconv2d_int8_pattern(dynamic_depthwise())


# --------------------------------------------------------------------------- bundled example


@pytest.mark.skipif(not TINYCNN.is_file(), reason=f"{TINYCNN} not generated yet")
def test_tinycnn_round_trip_and_quantization():
    original = onnx.load(str(TINYCNN))
    dw = conv_to_dwconv2d(original)
    rewritten = [n.name for n in dw.graph.node if n.op_type == "DWConv2D"]
    assert rewritten == ["/dynamic_dw/Conv"]
    lowered = dwconv2d_to_conv(dw)
    spec = original.graph.input[0].type.tensor_type.shape
    shape = [d.dim_value or 1 for d in spec.dim]
    rng = np.random.default_rng(7)
    feeds = [
        {original.graph.input[0].name: rng.standard_normal(shape).astype(F32)} for _ in range(3)
    ]
    for feed in feeds:
        for a, b in zip(run(original, feed), run(lowered, feed), strict=True):
            np.testing.assert_array_equal(a, b)
    table = _minmax_table(original, feeds)
    result = quantize_model(original, table)
    planned = result.quantized_node("/dynamic_dw/Conv")
    assert [(i.role, i.axis) for i in planned.inputs] == [
        ("activation", None),
        ("runtime weight", None),
    ]
    ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_rewrite_cli_writes_only_what_it_rewrote(run_cli, tmp_path, cnn_path):
    """A model with nothing to rewrite used to get an unchanged copy and 'rewrote 0 node(s)',
    which a pipeline would take for the plugin model."""
    onnx.save(dynamic_depthwise(), str(tmp_path / "dw.onnx"))
    code, out, err = run_cli("rewrite", tmp_path / "dw.onnx", "--to", "dwconv2d", "-o",
                             tmp_path / "dw.plugin.onnx")  # fmt: skip
    assert code == 0, err
    plugin = onnx.load(str(tmp_path / "dw.plugin.onnx"))
    assert sum(is_dwconv2d(n) for n in plugin.graph.node) == 1
    code, out, err = run_cli("rewrite", cnn_path, "--to", "dwconv2d", "-o",
                             tmp_path / "cnn.plugin.onnx")  # fmt: skip
    assert code == 2
    assert "no convolution with runtime weights" in err and "nothing written" in err
    assert not (tmp_path / "cnn.plugin.onnx").exists()
