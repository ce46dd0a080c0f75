"""VariantSessions: candidates that differ only in small constants share one session, and each
computes what its own model computes (numpy's fake quantization as the reference)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench.backends.onnxruntime import OnnxRuntimeRunner
from quantbench.evaluate.variants import SMALL_ELEMENTS, VariantSessions

N = SMALL_ELEMENTS + 1  # the weight is "large": a candidate with another weight splits off


def _candidate(scale: float, weight: np.ndarray) -> onnx.ModelProto:
    """y = DequantizeLinear(QuantizeLinear(x, scale)) * weight, int8 symmetric."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("Mul", ["d", "w"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.float32(scale), "s"),
        numpy_helper.from_array(np.int8(0), "z"),
        numpy_helper.from_array(weight.astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.metadata_props.add(key="table", value=f"scale {scale}")  # differs: not computed
    return model


def _fake_quant(x: np.ndarray, scale: float, weight: np.ndarray) -> np.ndarray:
    q = np.clip(np.rint(x / np.float32(scale)), -128, 127).astype(np.float32)
    return q * np.float32(scale) * weight


def test_candidates_differing_in_scales_share_a_session_and_compute_their_own():
    rng = np.random.default_rng(0)
    w1, w2 = rng.uniform(0.5, 2, N), rng.uniform(0.5, 2, N)
    specs = {"a": (0.05, w1), "b": (0.013, w1), "c": (0.05, w2)}
    opened: list[onnx.ModelProto] = []

    def open_runner(model: onnx.ModelProto) -> OnnxRuntimeRunner:
        opened.append(model)
        return OnnxRuntimeRunner(model.SerializeToString(), arena=False)

    sessions = VariantSessions(list(specs), lambda k: _candidate(*specs[k]), open_runner)
    x = rng.normal(0, 2, (1, N)).astype(np.float32)
    for key, (scale, weight) in specs.items():
        runner = sessions.runner(key)
        got = runner.infer({"x": x}, ["y"])["y"]
        runner.close()
        np.testing.assert_allclose(got, _fake_quant(x, scale, weight), rtol=1e-6)
    # a and b: one session with the scale as an input; c (another weight): a session of its own
    assert len(opened) == 2
    assert [i.name for i in opened[0].graph.input] == ["x", "s"]
    assert [i.name for i in opened[1].graph.input] == ["x"]


def test_one_candidate_is_built_once_and_runs_as_written():
    built = []

    def build(key: str) -> onnx.ModelProto:
        built.append(key)
        return _candidate(0.1, np.ones(N))

    sessions = VariantSessions(["only"], build, lambda m: OnnxRuntimeRunner(m.SerializeToString()))
    runner = sessions.runner("only")
    assert built == ["only"]
    x = np.linspace(-20, 20, N, dtype=np.float32)[None]
    np.testing.assert_allclose(runner.infer({"x": x}, ["y"])["y"], _fake_quant(x, 0.1, 1.0))
