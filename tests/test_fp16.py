"""FP16 candidates: emulated FP16 storage against a numpy reference, native conversion's report
of what onnxruntime really runs in FP16, and the strongly-typed mixed-precision artefact."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantbench.fp16 import (
    FP16_EMULATED,
    FP32,
    convert_fp16,
    declared_precisions,
    emulate_fp16,
    strongly_typed_fp16,
)


def _mlp(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = relu(x @ w + b) @ v: three compute nodes, weights with many FP16-unrepresentable
    values."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    v = rng.standard_normal((32, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "v"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (v, "v"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"w": w, "b": b, "v": v}


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def test_emulated_fp16_equals_fp16_storage_computed_by_hand() -> None:
    model, p = _mlp()
    x = (np.random.default_rng(1).standard_normal((5, 16)) * 3).astype(np.float32)
    # FP16 storage: every stored value (input, weights, each op's output) rounded to FP16;
    # arithmetic in float32 (float64 products differ from float32 only in the last bits)
    h = _half(_half(x).astype(np.float64) @ _half(p["w"]).astype(np.float64))
    hb = _half(h + _half(p["b"]))
    r = _half(np.maximum(hb, 0))
    expected = _half(r.astype(np.float64) @ _half(p["v"]).astype(np.float64))
    result = emulate_fp16(model)
    got = _run(result.model, x)
    assert np.array_equal(got, _half(got)), "outputs are FP16 values"
    # one FP16 rounding at most: the MatMul accumulation order may differ
    np.testing.assert_allclose(got, expected, rtol=2**-10, atol=1e-3)
    assert result.precision == {n: FP16_EMULATED for n in ("mm1", "add", "relu", "mm2")}
    assert result.fp16_share == 1.0
    reference = _run(model, x)
    assert not np.array_equal(got, reference), "FP16 storage changes the result"


def test_emulation_keeps_requested_nodes_in_fp32() -> None:
    model, _ = _mlp()
    result = emulate_fp16(model, keep_fp32=["relu", "mm2"])
    assert result.precision["relu"] == FP32 and result.precision["mm2"] == FP32
    kept = "kept in FP32 on request"
    assert result.fp32_nodes == {"relu": kept, "mm2": kept}
    assert result.fp16_share == 0.5


def test_native_conversion_names_the_ops_onnxruntime_runs_in_fp32() -> None:
    """onnxruntime's CPU provider loads an FP16 MatMul/Add/Relu by inserting Casts around them:
    the report must say they compute in FP32, not claim FP16."""
    model, _ = _mlp()
    result = convert_fp16(model)
    session_types = _session_node_input_types(result.model)
    for node, precision in result.precision.items():
        ran_fp16 = all(t == TensorProto.FLOAT16 for t in session_types[node])
        assert (precision == "fp16") == ran_fp16, node
        if precision == FP32:
            assert "FP16" in result.fp32_nodes[node]


def _session_node_input_types(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Independently of quantbench: the float input types of each node in onnxruntime's graph."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(Path(tmp) / "s.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        g = onnx.shape_inference.infer_shapes(onnx.load(opts.optimized_model_filepath)).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({i.name: i.data_type for i in g.initializer})
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    return {n.name: [types[i] for i in n.input if types.get(i) in floats] for n in g.node if n.name}


def test_strongly_typed_artefact_has_fp16_scales_and_dq_outputs(tmp_path) -> None:
    from quantbench.model.graph import open_graph
    from quantbench.qdq import quantize_model
    from quantbench.table import CalibrationTable

    model, _ = _mlp()
    table = CalibrationTable(method="minmax")
    for name, amax in (("x", 4.0), ("r", 6.0)):
        table.set(name, amax, "minmax")
    qdq = quantize_model(open_graph(model), table, allow_partial=True).model
    typed = strongly_typed_fp16(qdq)
    onnx.checker.check_model(typed, full_check=True)
    g = onnx.shape_inference.infer_shapes(typed).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.output]}
    inits = {i.name: i.data_type for i in g.initializer}
    dqs = [n for n in g.node if n.op_type == "DequantizeLinear"]
    assert dqs
    for dq in dqs:
        assert inits[dq.input[1]] == TensorProto.FLOAT16, dq.name
        assert types[dq.output[0]] == TensorProto.FLOAT16, dq.name
    assert [o.type.tensor_type.elem_type for o in g.output] == [TensorProto.FLOAT]
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    assert np.isfinite(_run(typed, x)).all()


def test_expose_types_tensors_as_the_exposed_model_does() -> None:
    """A tensor FP16 in the model exposed is exposed as FP16, whatever the given types say
    (the FP32 original's): issue 14's 'does not match expected type (tensor(float16))'."""
    from quantbench.backends.onnxruntime import expose
    from quantbench.fp16 import convert_fp16

    model, _ = _mlp()
    native = convert_fp16(model).model
    exposed = expose(native, ["h", "r"], {"h": TensorProto.FLOAT, "r": TensorProto.FLOAT})
    types = {o.name: o.type.tensor_type.elem_type for o in exposed.graph.output}
    assert types["h"] == types["r"] == TensorProto.FLOAT16
    x = np.ones((2, 16), np.float32)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    assert got["h"].dtype == np.float16


def test_isolated_fp16_view_equals_a_hand_computation() -> None:
    """Each op re-run on the FP32 reference's inputs rounded to FP16, its output rounded:
    computed here with numpy from the FP32 intermediate values."""
    from quantbench.backends.onnxruntime import expose
    from quantbench.evaluate.isolated import build_isolated_fp16
    from quantbench.model.graph import open_graph

    model, p = _mlp()
    graph = open_graph(model)
    iso = build_isolated_fp16(model, ["mm1", "add", "relu", "mm2"], graph.elem_types)
    assert iso.ops == {"h": "mm1", "hb": "add", "r": "relu", "y": "mm2"}
    fetch = ["h", "hb", "r", "y", *iso.twins.values()]
    x = (np.random.default_rng(4).standard_normal((6, 16)) * 2).astype(np.float32)
    session = ort.InferenceSession(
        expose(iso.model, fetch, {}).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = dict(zip(fetch, session.run(fetch, {"x": x})))
    h, hb, r = got["h"], got["hb"], got["r"]
    expected = {
        "h": _half(_half(x).astype(np.float64) @ _half(p["w"]).astype(np.float64)),
        "hb": _half(_half(h) + _half(p["b"])),
        "r": _half(np.maximum(_half(hb), 0)),
        "y": _half(_half(r).astype(np.float64) @ _half(p["v"]).astype(np.float64)),
    }
    for tensor, want in expected.items():
        twin = got[iso.twins[tensor]]
        assert np.array_equal(twin, _half(twin)), tensor
        if tensor in ("hb", "r"):  # elementwise: exact
            assert np.array_equal(twin, want), tensor
        else:  # a dot product: one FP16 rounding at most (summation order)
            np.testing.assert_allclose(twin, want, rtol=2**-10, atol=1e-3)
    # the reference itself is untouched FP32
    np.testing.assert_allclose(got["y"], _run(model, x), rtol=1e-6, atol=1e-6)


def test_strongly_typed_artefact_runs_close_to_its_emulated_verification_model() -> None:
    """The artefact `recover --precision fp16` writes and the model it verifies on compute the
    same thing: FP16 storage everywhere, INT8 where Q/DQ."""
    from quantbench.model.graph import open_graph
    from quantbench.qdq import quantize_model
    from quantbench.table import CalibrationTable

    model, _ = _mlp()
    table = CalibrationTable(method="minmax")
    for name, amax in (("x", 4.0), ("r", 6.0)):
        table.set(name, amax, "minmax")
    qdq = quantize_model(open_graph(model), table, allow_partial=True).model
    typed = strongly_typed_fp16(qdq)
    emulated = emulate_fp16(qdq)
    expected = {"mm1": "int8", "mm2": "int8", "add": FP16_EMULATED, "relu": FP16_EMULATED}
    assert emulated.precision == expected

    assert declared_precisions(typed) == {
        "mm1": "int8",
        "add": "fp16",
        "relu": "fp16",
        "mm2": "int8",
    }
    x = (np.random.default_rng(5).standard_normal((64, 16)) * 1.5).astype(np.float32)
    a, b = _run(typed, x).astype(np.float32), _run(emulated.model, x)
    fp32 = _run(qdq, x)
    # onnxruntime runs the artefact with its own FP16 kernels/casts, so not bit-identical; but
    # the two agree to a fraction of a percent of the output range (INT8 with clipped x moves
    # outputs by ~100% here), and closer to each other than either is to FP32-storage Q/DQ
    scale = np.abs(fp32).max()
    assert np.abs(a - b).max() < 0.01 * scale
    assert np.abs(a - b).mean() < np.abs(b - fp32).mean()
    assert np.abs(_run(model, x) - b).max() > 0.5 * scale  # INT8 is in both


def test_emulation_types_contrib_ops_from_the_graph_and_names_what_nothing_types() -> None:
    """ONNX shape inference cannot type com.microsoft.Gelu's output: with the graph's types
    (onnxruntime's) it is rounded like any op; without them it is reported in FP32, by name."""
    from quantbench.model.graph import open_graph

    model, _ = _mlp()
    relu = next(n for n in model.graph.node if n.name == "relu")
    relu.op_type, relu.domain, relu.name = "Gelu", "com.microsoft", "gelu"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    graph = open_graph(model)
    typed = emulate_fp16(model, types=graph.elem_types)
    assert typed.precision["gelu"] == FP16_EMULATED and typed.fp32_nodes == {}
    x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
    got = _run(typed.model, x)
    assert np.array_equal(got, _half(got))
    untyped = emulate_fp16(model)
    assert untyped.precision["gelu"] == FP32
    assert "unknown" in untyped.fp32_nodes["gelu"]


def _scaled(big: float, small: float) -> onnx.ModelProto:
    """y = ((x * small) * big) @ w, the constants of the issue (wrong answer 6)."""
    w = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(small, np.float32), "small"),
        numpy_helper.from_array(np.array(big, np.float32), "big"),
        numpy_helper.from_array(w, "w"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "small"], ["a"], name="mul1"),
            helper.make_node("Mul", ["a", "big"], ["b"], name="mul2"),
            helper.make_node("MatMul", ["b", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_emulation_casts_constants_as_ieee_fp16_does_never_clamped() -> None:
    """1e5 was clamped to 65504 and 1e-9 raised to 5.96e-8: FP16 makes them Inf and 0."""
    with np.errstate(over="ignore"):
        assert np.float16(1e5) == np.inf and np.float16(1e-9) == 0  # the expected values
        sub = float(np.float32(np.float16(1e-7)))  # a subnormal, kept as such
    inits = _inits(emulate_fp16(_scaled(1e5, 1e-4)).model)
    assert inits["big"] == np.inf
    assert _inits(emulate_fp16(_scaled(1e-9, 1e-4)).model)["big"] == 0.0
    assert _inits(emulate_fp16(_scaled(1e-7, 1e-4)).model)["big"] == np.float32(sub)
    x = np.ones((2, 4), np.float32)
    assert not np.isfinite(_run(emulate_fp16(_scaled(1e5, 1e-4)).model, x)).any()  # Inf, NaN


def test_isolated_and_accumulated_fp16_views_see_the_same_constant() -> None:
    """The first op reading a constant sees the same FP16 value in both views: Inf for 1e5
    (the accumulated view had 65504), 0 for 1e-9 (it had 5.96e-8)."""
    from quantbench.backends.onnxruntime import expose
    from quantbench.evaluate.isolated import build_isolated_fp16
    from quantbench.model.graph import open_graph

    x = np.random.default_rng(2).uniform(1, 2, (3, 4)).astype(np.float32)
    for big in (1e5, 1e-9):
        model = _scaled(big, 1.0)
        iso = build_isolated_fp16(model, ["mul2"], open_graph(model).elem_types)
        fetch = [iso.twins["b"]]
        s = ort.InferenceSession(
            expose(iso.model, fetch, {}).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        isolated = s.run(fetch, {"x": x})[0]
        acc = ort.InferenceSession(
            expose(emulate_fp16(model).model, ["b"], {}).SerializeToString(),
            providers=["CPUExecutionProvider"],
        ).run(["b"], {"x": x})[0]
        with np.errstate(over="ignore"):
            want = _half(_half(x) * np.float32(np.float16(big)))
        np.testing.assert_array_equal(isolated, want)
        np.testing.assert_array_equal(acc, want)


def test_strongly_typed_artefact_keeps_what_fp16_cannot_hold_in_fp32() -> None:
    """The artefact held 65504 for 1e5 (0.654x FP32 when run): the node reading it stays FP32
    with its FP32 constant, and the artefact computes x * 10 as FP32 does."""
    model = _scaled(1e5, 1e-4)
    artefact = strongly_typed_fp16(model)
    inits = {i.name: i for i in artefact.graph.initializer}
    assert inits["big"].data_type == TensorProto.FLOAT
    assert numpy_helper.to_array(inits["big"]) == np.float32(1e5)
    assert declared_precisions(artefact)["mul2"] == FP32
    x = np.random.default_rng(3).uniform(-2, 2, (5, 4)).astype(np.float32)
    got, want = _run(artefact, x), _run(model, x)
    np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3 * np.abs(want).max())
    # the verification model keeps the same node FP32 and computes the same
    from quantbench.fp16 import out_of_range_nodes

    keep, broken = out_of_range_nodes(model)
    assert keep == ["mul2"] and [b.tensor for b in broken] == ["big"]
    emulated = emulate_fp16(model, keep_fp32=keep).model
    np.testing.assert_allclose(_run(emulated, x), got, rtol=5e-3, atol=5e-3 * np.abs(want).max())


def test_strongly_typed_artefact_casts_small_weights_as_ieee_fp16() -> None:
    """A weight with a few tiny values is no broken constant: it goes FP16, each value cast as
    IEEE FP16 does (the converter raised 1e-9 to 5.96e-8)."""
    model, p = _mlp()
    w = model.graph.initializer[0]
    values = numpy_helper.to_array(w).copy()
    values[0, :3] = [1e-9, -2e-8, 1e-7]
    w.CopyFrom(numpy_helper.from_array(values, "w"))
    inits = {i.name: i for i in strongly_typed_fp16(model).graph.initializer}
    assert inits["w"].data_type == TensorProto.FLOAT16
    np.testing.assert_array_equal(numpy_helper.to_array(inits["w"]), values.astype(np.float16))
