"""Constant-weight grouped convs rewritten to DWConv2D on request (``conv_to_dwconv2d(...,
constant_grouped=True)``, ``rewrite --to dwconv2d --depthwise``): only when asked, only grouped
2-D convs; the rewritten model run through the op (plugin, cpu) equals the original model in
onnxruntime (the independent reference) within float32 rounding; ``quantize --dwconv2d`` turns
the rewritten model into the plugin's INT8 form."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import QuantbenchError
from quantbench.plugins.dwconv2d import conv_to_dwconv2d, is_dwconv2d
from quantbench.quantize import quantize, rewrite

F32 = np.float32


def mobile_block(seed: int = 0) -> onnx.ModelProto:
    """A MobileNet-like block with constant weights: dense 1x1 expand, depthwise 3x3 stride 2
    (auto_pad SAME_UPPER), grouped 3x3 (group 4, dilation 2), dense 1x1 project."""
    rng = np.random.default_rng(seed)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(F32), name)

    inits = [
        init("expand_w", 16, 4, 1, 1), init("expand_b", 16),
        init("dw_w", 16, 1, 3, 3), init("dw_b", 16),
        init("grouped_w", 16, 4, 3, 3),
        init("project_w", 8, 16, 1, 1),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "expand_w", "expand_b"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["er"], name="expand_relu"),
        helper.make_node(
            "Conv", ["er", "dw_w", "dw_b"], ["d"], name="depthwise", group=16, strides=[2, 2],
            auto_pad="SAME_UPPER", kernel_shape=[3, 3],
        ),  # fmt: skip
        helper.make_node("Relu", ["d"], ["dr"], name="dw_relu"),
        helper.make_node(
            "Conv", ["dr", "grouped_w"], ["g"], name="grouped", group=4, pads=[2, 2, 2, 2],
            dilations=[2, 2],
        ),  # fmt: skip
        helper.make_node("Conv", ["g", "project_w"], ["y"], name="project"),
    ]
    graph = helper.make_graph(
        nodes,
        "mobile_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 15, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _types(model: onnx.ModelProto) -> dict[str, str]:
    return {n.name: n.op_type for n in model.graph.node}


def test_constant_grouped_convs_are_rewritten_only_when_asked():
    model = mobile_block()
    untouched = conv_to_dwconv2d(model)
    assert not any(is_dwconv2d(n) for n in untouched.graph.node)
    rewritten = conv_to_dwconv2d(model, constant_grouped=True)
    types = _types(rewritten)
    assert types["depthwise"] == types["grouped"] == "DWConv2D"
    assert types["expand"] == types["project"] == "Conv"  # group 1 stays a Conv
    dw = next(n for n in rewritten.graph.node if n.name == "depthwise")
    assert list(dw.input) == ["er", "dw_w", "dw_b"]  # the initializer is the op's W input
    attrs = {a.name: helper.get_attribute_value(a) for a in dw.attribute}
    # SAME_UPPER, stride 2, k 3: H 15 -> 8 pads 1+1, W 16 -> 8 pads 0+1 (the odd one at the end)
    assert attrs["pads"] == [1, 0, 1, 1] and attrs["group"] == 16 and attrs["strides"] == [2, 2]


def test_naming_a_constant_depthwise_conv_needs_the_flag():
    model = mobile_block()
    with pytest.raises(QuantbenchError, match="constant_grouped=True"):
        conv_to_dwconv2d(model, ["depthwise"])
    with pytest.raises(QuantbenchError, match="'project' is not"):
        conv_to_dwconv2d(model, ["project"], constant_grouped=True)
    only = conv_to_dwconv2d(model, ["grouped"], constant_grouped=True)
    assert _types(only)["grouped"] == "DWConv2D" and _types(only)["depthwise"] == "Conv"


def test_rewrite_command_flag(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(mobile_block(), src)
    with pytest.raises(QuantbenchError, match="--depthwise: grouped Convs too"):
        rewrite(src, tmp_path / "a.onnx", "dwconv2d")
    with pytest.raises(QuantbenchError, match="--to dwconv2d only"):
        rewrite(src, tmp_path / "b.onnx", "conv", depthwise=True)
    changed, path = rewrite(src, tmp_path / "c.onnx", "dwconv2d", depthwise=True)
    assert changed == 2 and sum(is_dwconv2d(n) for n in onnx.load(path).graph.node) == 2


def test_rewritten_model_through_the_op_equals_the_original_in_onnxruntime():
    pytest.importorskip("onnxruntime_extensions")
    import quantbench.plugins.dwconv2d as dw

    model = mobile_block(seed=3)
    rewritten = conv_to_dwconv2d(model, constant_grouped=True)
    x = np.random.default_rng(4).standard_normal((3, 4, 15, 16)).astype(F32)
    reference = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    session = dw.make_session(rewritten, device="cpu")
    got = session.run(None, {"x": x})[0]
    assert got.shape == reference.shape == (3, 8, 8, 8)
    # the op sums in float64 and rounds once; onnxruntime's Conv sums in float32
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(got, reference, rtol=0, atol=2e-6 * scale)
    # the test can fail: SAME_LOWER's pads instead of SAME_UPPER's move the values
    shifted = dw.make_session(_with_pads(rewritten, "depthwise", [1, 1, 1, 0]), device="cpu")
    moved = shifted.run(None, {"x": x})[0]
    assert np.abs(moved - reference).max() > 100 * 2e-6 * scale


def _with_pads(model: onnx.ModelProto, node: str, pads: list[int]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    target = next(n for n in out.graph.node if n.name == node)
    for a in target.attribute:
        if a.name == "pads":
            a.ints[:] = pads
    return out


def test_quantize_dwconv2d_on_a_rewritten_model_gives_the_int8_plugin_form(tmp_path):
    src = tmp_path / "dw.onnx"
    onnx.save(conv_to_dwconv2d(mobile_block(), constant_grouped=True), src)
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(5).standard_normal((8, 4, 15, 16)).astype(F32))
    out = tmp_path / "int8.onnx"
    quantize(src, out, data=data, method="minmax", dwconv2d=True, show_progress=False)
    model = onnx.load(out)
    ops = [n for n in model.graph.node if is_dwconv2d(n)]
    assert sorted(n.name for n in ops) == ["depthwise", "grouped"]
    for node in ops:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["input_scale"] > 0 and attrs["weight_scale"] > 0  # INT8 in, one scale
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    weight = next(n for n in ops if n.name == "depthwise").input[1]
    assert producers.get(weight) == "QuantizeLinear"  # int8 weight, its DQ absorbed


def test_a_cached_statistics_file_lacking_tensors_is_recomputed(tmp_path, monkeypatch):
    """A cache file written before DWConv2D inputs were calibrated must not be reused: its table
    would lack them and quantize would refuse the model."""
    from quantbench.calibrate import obtain_stats
    from quantbench.model.graph import calibration_tensors, open_graph
    from quantbench.stats.tensorstats import StatsFile

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "dw.onnx"
    onnx.save(conv_to_dwconv2d(mobile_block(), constant_grouped=True), src)
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(6).standard_normal((4, 4, 15, 16)).astype(F32))
    graph = open_graph(src)
    wanted = calibration_tensors(graph, "quantizable")
    assert "dr" in wanted  # the grouped DWConv2D's data input
    first, path, from_disk = obtain_stats(graph, data, tensors="quantizable", show_progress=False)
    assert not from_disk and path is not None and set(wanted) <= set(first.tensors)
    stale = StatsFile.load(path)
    del stale.tensors["dr"]
    stale.save(path)
    again, _, from_disk = obtain_stats(graph, data, tensors="quantizable", show_progress=False)
    assert not from_disk and "dr" in again.tensors
    _, _, from_disk = obtain_stats(graph, data, tensors="quantizable", show_progress=False)
    assert from_disk  # the complete file is reused


def test_exposed_outputs_of_an_fp16_dwconv2d_get_the_model_own_type():
    """compare exposes every layer; past a DWConv2D ONNX inference types nothing and the FP32
    reference's float32 was used, which onnxruntime refuses for an FP16 candidate."""
    pytest.importorskip("onnxruntime_extensions")
    from quantbench.backends.onnxruntime import expose

    rewritten = conv_to_dwconv2d(mobile_block(), constant_grouped=True)
    half = onnx.ModelProto()
    half.CopyFrom(rewritten)
    for i, init in enumerate(half.graph.initializer):
        array = numpy_helper.to_array(init).astype(np.float16)
        half.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, init.name))
    half.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    half.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    fp32_types = dict.fromkeys(["d", "dr", "g"], TensorProto.FLOAT)
    exposed = expose(half, ["d", "dr", "g"], fp32_types)
    types = {o.name: o.type.tensor_type.elem_type for o in exposed.graph.output}
    assert types["d"] == types["dr"] == types["g"] == TensorProto.FLOAT16
