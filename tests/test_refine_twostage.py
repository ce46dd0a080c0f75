"""refine.twostage: the rewritten Q/DQ model equals its readers run on x1 + x2, the bias once."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.refine.twostage import candidates, choose_greedy, only, two_stage, verify


def _qdq_conv(int8_weight: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(+bias) -> y, and x's dequantized form also read by an Add;
    ``int8_weight``: the weight through a Q/DQ pair too (as quantize writes it)."""
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
    if int8_weight:
        inits.append(numpy_helper.from_array(np.float32(np.abs(w).max() / 127), "sw"))
        nodes[2].input[1] = "wd"
        nodes[:0] = [
            helper.make_node("QuantizeLinear", ["w", "sw", "z"], ["wq"]),
            helper.make_node("DequantizeLinear", ["wq", "sw", "z"], ["wd"]),
        ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("twice", TensorProto.FLOAT, [1, 3, 8, 8])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime this project supports loads
    return model


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
    scores = iter([10.0, 12.0])
    choice = choose_greedy(["x"], lambda tensors: next(scores))
    assert choice.tensors == ["x"] and choice.score_db == 12.0
    scores = iter([10.0, 10.005])
    assert choose_greedy(["x"], lambda tensors: next(scores)).tensors == []


def test_choose_greedy_keeps_only_what_the_confirming_judge_confirms() -> None:
    """A tensor that gains on the slice but loses on the confirming samples is dropped (Silero
    VAD's first encoder activation: +0.35 dB on its slice, -6.9 dB on the other chunks); the
    confirming judge is asked only about the empty set and sets that gained on the slice."""
    slice_db = {(): 10.0, ("a",): 11.0, ("b",): 12.0, ("a", "c"): 10.5}
    confirm_db = {(): 20.0, ("b",): 19.0, ("a",): 21.0}
    asked: list[tuple[str, ...]] = []

    def confirm(tensors) -> float:
        asked.append(tuple(tensors))
        return confirm_db[tuple(tensors)]

    choice = choose_greedy(["b", "a", "c"], lambda t: slice_db[tuple(t)], confirm=confirm)
    # b gains 2 dB on the slice but loses 1 on the confirming samples: not kept; a then gains
    # on both; c never gains on the slice and is never confirmed
    assert choice.tensors == ["a"]
    assert (choice.base_db, choice.score_db) == (10.0, 11.0)
    assert (choice.confirm_base_db, choice.confirm_db) == (20.0, 21.0)
    assert asked == [(), ("b",), ("a",)]
    assert [kept for _, _, kept in choice.trials] == [False, True, False]


def test_the_confirming_judge_is_not_asked_when_nothing_gains_on_the_slice() -> None:
    asked: list[tuple[str, ...]] = []
    choice = choose_greedy(["a", "b"], lambda t: 10.0 - len(t),
                           confirm=lambda t: asked.append(tuple(t)) or 20.0)  # fmt: skip
    assert choice.tensors == [] and asked == [] and math.isnan(choice.confirm_db)


def test_choose_greedy_without_a_confirming_judge_keeps_slice_gains() -> None:
    slice_db = {(): 10.0, ("b",): 12.0, ("b", "a"): 12.5}
    choice = choose_greedy(["b", "a"], lambda t: slice_db[tuple(t)])
    assert choice.tensors == ["b", "a"] and math.isnan(choice.confirm_db)


def test_choose_greedy_keeps_within_the_cost() -> None:
    """A set costing more than ``max_cost`` is never scored; the cheaper tensor is kept."""
    scored: list[list[str]] = []

    def score(tensors) -> float:
        scored.append(list(tensors))
        return 10.0 + len(tensors)

    cost = {"a": 0.3, "b": 0.1}
    choice = choose_greedy(["a", "b"], score, cost=lambda ts: sum(cost[t] for t in ts),
                           max_cost=0.25)  # fmt: skip
    assert choice.tensors == ["b"] and ["a"] not in scored


def _qdq_matmul() -> onnx.ModelProto:
    """Both MatMul operands runtime tensors, each through its own Q/DQ (attention's Q @ K^T)."""
    inits = [
        numpy_helper.from_array(np.float32(1.0 / 127), "sa"),
        numpy_helper.from_array(np.float32(3.0 / 127), "sb"),
        numpy_helper.from_array(np.int8(0), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["a", "sa", "z"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "sa", "z"], ["ad"]),
        helper.make_node("QuantizeLinear", ["b", "sb", "z"], ["bq"]),
        helper.make_node("DequantizeLinear", ["bq", "sb", "z"], ["bd"]),
        helper.make_node("MatMul", ["ad", "bd"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 5, 6]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 4])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime this project supports loads
    return model


def _stages(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
    """x1, x2 by hand: round half to even, saturate to int8 (ONNX QuantizeLinear)."""
    s1 = np.float32(s)
    x1 = np.clip(np.round(x / s1), -128, 127).astype(np.float32) * s1
    s2 = np.float32(s1 / np.float32(64))
    x2 = np.clip(np.round((x - x1) / s2), -128, 127).astype(np.float32) * s2
    return x1, x2


def test_both_matmul_operands_in_two_stages_are_the_product_of_the_sums() -> None:
    """A runtime operand in slot 1 gets its own twin (the MatMul stays INT8 on both inputs,
    never reading an FP sum); with both operands treated the product runs four times."""
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (2, 5, 6)).astype(np.float32)
    b = rng.uniform(-3, 3, (2, 6, 4)).astype(np.float32)
    model = _qdq_matmul()
    assert candidates(model) == ["a", "b"]
    out = two_stage(model, ["a", "b"])
    onnx.checker.check_model(out)
    assert verify(out, ["a", "b"]) == 3  # the three runs reading a second stage
    assert sum(n.op_type == "MatMul" for n in out.graph.node) == 4
    a1, a2 = _stages(a, 1.0 / 127)
    b1, b2 = _stages(b, 3.0 / 127)
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"a": a, "b": b})
    np.testing.assert_allclose(y, (a1 + a2) @ (b1 + b2), rtol=1e-5, atol=1e-5)


def test_verify_refuses_a_broken_second_stage() -> None:
    with pytest.raises(ValueError, match="input 1 is not INT8"):
        verify(two_stage(_qdq_conv(), ["x"]), ["x"])  # an FP32 weight
    model = two_stage(_qdq_conv(int8_weight=True), ["x"])
    assert verify(model, ["x"]) == 1
    for init in model.graph.initializer:  # a second-stage scale off by one ulp
        if init.name.endswith("_scale") and "stage2" in init.name:
            value = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(np.nextafter(value, np.float32(1)), init.name))
    with pytest.raises(ValueError, match="second-stage scale"):
        verify(model, ["x"])
    model = two_stage(_qdq_conv(int8_weight=True), ["x"])
    twin = next(n for n in model.graph.node if n.op_type == "Conv" and len(n.input) == 2)
    twin.input.append("b")  # the bias added twice
    with pytest.raises(ValueError, match="bias a second time"):
        verify(model, ["x"])


def test_only_keeps_one_activation_quantized() -> None:
    """The ranking's model: every other pair (weights too) bypassed, by name."""
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (2, 5, 6)).astype(np.float32)
    b = rng.uniform(-3, 3, (2, 6, 4)).astype(np.float32)
    alone = only(_qdq_matmul(), "b")
    assert [n.op_type for n in alone.graph.node].count("QuantizeLinear") == 1
    session = ort.InferenceSession(alone.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"a": a, "b": b})
    b1, _ = _stages(b, 3.0 / 127)
    np.testing.assert_allclose(y, a @ b1, rtol=1e-5, atol=1e-5)


def test_a_tensor_read_by_a_nonlinear_op_is_no_candidate() -> None:
    """Its reader would read the FP sum and leave INT8."""
    model = _qdq_conv()
    model.graph.node.append(helper.make_node("MaxPool", ["xd"], ["pooled"], kernel_shape=[2, 2]))
    assert candidates(model) == []


def test_a_cap_of_twice_the_default_searches_twice_as_wide():
    from quantbench.choose.twostaged import search_width

    assert search_width(0.25) == (24, 16)  # the default cap: 24 tensors tried, 16 kept at most
    assert search_width(0.49) == (24, 16)
    assert search_width(0.5) == (48, 32)
    assert search_width(1.0) == (48, 32)
