"""refine.twostage: the rewritten Q/DQ model equals its readers run on x1 + x2, the bias once."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantbench.refine.twostage import choose_greedy, two_stage


def _qdq_conv() -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(+bias) -> y, and x's dequantized form also read by an Add."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.float32(2.0 / 127), "s"),
        numpy_helper.from_array(np.int8(0), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Conv", ["xd", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["xd", "xd"], ["twice"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("twice", TensorProto.FLOAT, [1, 3, 8, 8])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_two_stage_is_the_reader_on_both_stages() -> None:
    model = _qdq_conv()
    x = np.random.default_rng(1).uniform(-2, 2, size=(1, 3, 8, 8)).astype(np.float32)
    out = two_stage(model, ["x"])
    onnx.checker.check_model(out)
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and sorted(len(c.input) for c in convs) == [2, 3]  # bias once
    assert sum(n.op_type == "QuantizeLinear" for n in out.graph.node) == 2
    s = 2.0 / 127
    x1 = np.clip(np.round(x / s), -128, 127) * s
    s2 = np.float32(s / 64)
    x2 = np.clip(np.round((x - x1) / s2), -128, 127) * s2
    y, twice = _run(out, x)
    ref_model = _qdq_conv()
    for n in list(ref_model.graph.node)[:2]:
        ref_model.graph.node.remove(n)
    ref_model.graph.node.insert(0, helper.make_node("Identity", ["x"], ["xd"]))
    y_ref, twice_ref = _run(ref_model, (x1 + x2).astype(np.float32))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(twice, twice_ref, rtol=1e-6, atol=1e-6)
    assert np.abs(x1 + x2 - x).max() <= s2 / 2 + 1e-7  # ~15 bits inside the first range


def test_choose_greedy_keeps_only_gains() -> None:
    model = _qdq_conv()
    scores = iter([10.0, 12.0])
    choice = choose_greedy(model, ["x"], lambda m: next(scores))
    assert choice.tensors == ["x"] and choice.score_db == 12.0
    scores = iter([10.0, 10.005])
    assert choose_greedy(model, ["x"], lambda m: next(scores)).tensors == []
