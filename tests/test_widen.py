"""A float16 / bfloat16 model widened to float32 (``rewrite --to float32``), exactly, so that it
can be quantized; expected outputs are computed in numpy from the same half-precision values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.calibrate import calibrate
from quantbench.compare import compare
from quantbench.errors import QuantbenchError
from quantbench.model.graph import open_graph
from quantbench.model.widen import NARROW_FLOATS, holds_narrow_floats, widen_to_float32
from quantbench.quantize import quantize, rewrite
from quantbench.recovery import recover, sensitivity

RNG = np.random.default_rng(7)
W16 = RNG.standard_normal((3, 4)).astype(np.float16)
C16 = np.array([0.5, -1.25, 3.0, 1e-3], np.float16)


def _half_model() -> onnx.ModelProto:
    """out = (MatMul(x, w) + c) cast to FP16, plus a ConstantOfShape of 0.25 and, through an If,
    a constant picked by a flag; float16 everywhere a model exported in half has it."""
    then_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(C16, "kt"))],
        "then",
        [],
        [helper.make_tensor_value_info("k", TensorProto.FLOAT16, [4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k2"], value=numpy_helper.from_array(-C16, "ke"))],
        "else",
        [],
        [helper.make_tensor_value_info("k2", TensorProto.FLOAT16, [4])],
    )
    quarter = numpy_helper.from_array(np.array([0.25], np.float16), "q")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(C16, "ct")),
        helper.make_node("Add", ["m", "c"], ["a"], name="add"),
        helper.make_node("Cast", ["a"], ["h"], to=TensorProto.FLOAT16, name="cast"),
        helper.make_node("Shape", ["h"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["z"], value=quarter, name="cos"),
        helper.make_node("Add", ["h", "z"], ["hz"], name="add_quarter"),
        helper.make_node(
            "If", ["flag"], ["picked"], then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Add", ["hz", "picked"], ["y"], name="add_picked"),
    ]
    graph = helper.make_graph(
        nodes,
        "half",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 3]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4])],
        initializer=[numpy_helper.from_array(W16, "w")],
        value_info=[helper.make_tensor_value_info("m", TensorProto.FLOAT16, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _narrow_types(model: onnx.ModelProto) -> list[str]:
    """Every place a float16/bfloat16 is left, found by walking the serialized model's fields."""
    found = []

    def walk(msg, where):
        for field, value in msg.ListFields():
            repeated = hasattr(value, "__len__") and not isinstance(value, (str, bytes))
            items = list(value) if repeated else [value]
            for item in items:
                typed = field.name in ("elem_type", "data_type") or (
                    field.name == "i" and getattr(msg, "name", "") in ("to", "dtype")
                )
                if field.type == field.TYPE_MESSAGE:
                    walk(item, f"{where}.{field.name}")
                elif typed and item in NARROW_FLOATS:
                    found.append(f"{where}.{field.name}")

    walk(model, "model")
    return found


def test_every_half_value_and_type_becomes_float32_and_the_model_runs():
    half = _half_model()
    assert len(_narrow_types(half)) >= 9  # the walk sees what there is to widen
    wide, changed = widen_to_float32(half)
    assert changed >= 9 and _narrow_types(wide) == []
    onnx.checker.check_model(wide)
    init = {t.name: numpy_helper.to_array(t) for t in wide.graph.initializer}
    assert init["w"].dtype == np.float32 and np.array_equal(init["w"], W16.astype(np.float32))
    x16 = RNG.standard_normal((5, 3)).astype(np.float16)
    session = ort.InferenceSession(wide.SerializeToString(), providers=["CPUExecutionProvider"])
    for flag, pick in ((True, C16), (False, -C16)):
        got = session.run(None, {"x": x16.astype(np.float32), "flag": np.array(flag)})[0]
        x32, w32, c32 = x16.astype(np.float32), W16.astype(np.float32), C16.astype(np.float32)
        want = (x32 @ w32 + c32) + np.float32(0.25) + pick.astype(np.float32)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_bfloat16_initializers_widen_exactly():
    """Both encodings a model may hold: raw bytes and int32_data (helper.make_tensor's)."""
    values = RNG.standard_normal((2, 5)).astype(ml_dtypes.bfloat16)
    raw = numpy_helper.from_array(values, "raw")
    packed = helper.make_tensor(
        "packed", TensorProto.BFLOAT16, values.shape, values.astype(np.float32).ravel()
    )
    assert not packed.raw_data and raw.raw_data
    graph = helper.make_graph(
        [helper.make_node("Add", ["raw", "packed"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 5])],
        initializer=[raw, packed],
    )
    wide, changed = widen_to_float32(helper.make_model(graph))
    assert changed == 3 and _narrow_types(wide) == []
    for t in wide.graph.initializer:
        got = numpy_helper.to_array(t)
        assert got.dtype == np.float32 and np.array_equal(got, values.astype(np.float32)), t.name


def test_rewrite_cli_widens_then_quantize_takes_the_model(run_cli, tmp_path):
    conv16 = _conv_model(TensorProto.FLOAT16)
    src, wide = tmp_path / "half.onnx", tmp_path / "wide.onnx"
    onnx.save(conv16, str(src))
    x = RNG.standard_normal((8, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    code, out, err = run_cli("rewrite", src, "--to", "float32", "-o", wide)
    assert code == 0, err
    assert "to float32; wrote" in " ".join((out + err).split())
    outcome = quantize(
        wide, tmp_path / "q.onnx", data=tmp_path / "calib.npz", method="minmax",
        high_precision="fp16", show_progress=False,
    )  # fmt: skip
    assert [q.node for q in outcome.result.quantized] == ["conv"]
    ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])


def test_quantize_takes_a_half_model_as_rewrite_then_quantize_fp16_would(run_cli, tmp_path):
    """quantize on the FP16 file itself (it used to refuse and name the two commands) gives
    the model those two commands give, FP16 kept for the ops left out of INT8, with the FP16
    file's input and output types: a drop-in replacement, whose output is the two-step
    model's rounded to FP16, bit for bit. A table made by calibrating the FP16 file applies;
    --high-precision fp32 keeps no half type but at the inputs and outputs."""
    src, wide = tmp_path / "half.onnx", tmp_path / "wide.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT16), str(src))
    x = RNG.standard_normal((8, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    assert run_cli("rewrite", src, "--to", "float32", "-o", wide)[0] == 0
    common = dict(data=tmp_path / "calib.npz", method="minmax", show_progress=False)
    two_step = quantize(wide, tmp_path / "two.onnx", high_precision="fp16", **common)
    code, _, err = run_cli(
        "quantize", src, "--data", tmp_path / "calib.npz", "--method", "minmax",
        "-o", tmp_path / "one.onnx",
    )  # fmt: skip
    assert code == 0, err
    assert "computes in float16/bfloat16" in " ".join(err.split())
    one_step = onnx.load(str(tmp_path / "one.onnx"))
    onnx.checker.check_model(one_step, full_check=True)
    io = [v.type.tensor_type.elem_type for v in (*one_step.graph.input, *one_step.graph.output)]
    assert io == [TensorProto.FLOAT16, TensorProto.FLOAT16]
    x16 = x.astype(np.float16)
    got = ort.InferenceSession(str(tmp_path / "one.onnx"), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(tmp_path / "two.onnx"), providers=["CPUExecutionProvider"])
    y16 = got.run(None, {"x": x16})[0]
    assert y16.dtype == np.float16
    assert np.array_equal(y16, ref.run(None, {"x": x16.astype(np.float32)})[0].astype(np.float16))
    assert two_step.high_precision == "fp16"
    calibrate(
        src, tmp_path / "calib.npz", methods=["minmax"], output=tmp_path / "half.json",
        fmt="json", use_cache=False, show_progress=False,
    )  # fmt: skip
    by_table = quantize(src, tmp_path / "t.onnx", table=tmp_path / "half.json")
    assert [q.node for q in by_table.result.quantized] == ["conv"]
    wide32 = quantize(src, tmp_path / "f32.onnx", high_precision="fp32", **common)
    assert wide32.high_precision == "fp32"
    f32 = onnx.load(str(tmp_path / "f32.onnx"))
    casts = [a.i for n in f32.graph.node if n.op_type == "Cast" for a in n.attribute]
    assert casts == [TensorProto.FLOAT, TensorProto.FLOAT16]  # at the input, at the output
    assert not any(t.data_type in NARROW_FLOATS for t in f32.graph.initializer)


def test_rewrite_of_a_float32_model_writes_nothing(run_cli, tmp_path):
    src = tmp_path / "f32.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT), str(src))
    code, _, err = run_cli("rewrite", src, "--to", "float32", "-o", tmp_path / "w.onnx")
    assert code == 2 and "holds no float16 or bfloat16 tensor; nothing written" in err
    assert not (tmp_path / "w.onnx").exists()
    with pytest.raises(QuantbenchError, match="dwconv2d, conv or float32"):
        rewrite(src, tmp_path / "w.onnx", "float64")


def _conv_model(elem: int) -> onnx.ModelProto:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(dtype)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", elem, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", elem, ["N", 4, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_narrow_floats_are_found_wherever_a_half_model_has_them():
    assert not holds_narrow_floats(_conv_model(TensorProto.FLOAT))
    assert holds_narrow_floats(_conv_model(TensorProto.FLOAT16))
    assert holds_narrow_floats(_conv_model(TensorProto.BFLOAT16))
    assert holds_narrow_floats(_half_model())
    cast_only = _conv_model(TensorProto.FLOAT)
    cast_only.graph.node.append(
        helper.make_node("Cast", ["y"], ["y16"], to=TensorProto.FLOAT16, name="cast")
    )
    assert holds_narrow_floats(cast_only)
    assert not holds_narrow_floats(widen_to_float32(cast_only)[0])


def test_compare_with_a_half_model_as_reference_judges_against_its_widening(tmp_path):
    """Following quantize's advice (rewrite, then quantize --high-precision fp16) and comparing
    against the FP16 model the user has: the reference runs widened, as the rewritten file
    does, and the FP16 model itself is a candidate fed its input rounded to FP16 (it used to
    stop with an internal error: the isolated copies mixed FP16 and FP32 tensors)."""
    half, wide, q = tmp_path / "half.onnx", tmp_path / "wide.onnx", tmp_path / "q.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT16), str(half))
    rewrite(half, wide, "float32")
    x = RNG.standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    quantize(
        wide, q, data=tmp_path / "data.npz", method="minmax", high_precision="fp16",
        show_progress=False,
    )  # fmt: skip
    common = dict(data=tmp_path / "data.npz", latency=False, show_progress=False)
    doc = compare(str(half), str(q), model=half, **common)
    explicit = compare(str(half), str(q), model=wide, **common)
    rows = {(o["candidate"], o["name"]): o for o in doc["outputs"]}
    for o in explicit["outputs"]:
        assert rows[(o["candidate"], o["name"])]["sqnr_db"] == pytest.approx(o["sqnr_db"])
    assert doc["model"]["hash"] == explicit["model"]["hash"]
    # A, by hand: the FP16 model on the input rounded to FP16, against the widened model
    ref = ort.InferenceSession(str(wide), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    a = ort.InferenceSession(str(half), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float16)}
    )
    r, d = ref[0].astype(np.float64), a[0].astype(np.float64) - ref[0]
    assert rows[("A", "y")]["sqnr_db"] == pytest.approx(
        10 * np.log10((r**2).sum() / (d**2).sum()), rel=1e-6
    )


def test_tables_and_statistics_of_the_half_file_apply_to_its_widened_reference(tmp_path):
    """Tables and statistics of the FP16 file itself (as quantbench made them before it
    widened half models: calibrated as they are, recording the half file's hash) are made for
    the model compare and quantize widen: applied as they are, not refused as another model's
    with advice to calibrate the model the user had calibrated. The INT8 candidate is the one
    the same table gives on the rewritten file with the hash check waived. calibrate itself
    now works on the widening, whose hash the rewritten file has."""
    half, wide = tmp_path / "half.onnx", tmp_path / "wide.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT16), str(half))
    rewrite(half, wide, "float32")
    x = RNG.standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    table, stats = tmp_path / "half.json", tmp_path / "half.stats.npz"
    calibrate(
        open_graph(half), tmp_path / "data.npz", methods=["minmax"], output=table, fmt="json",
        save_stats=stats, use_cache=False, show_progress=False,
    )  # fmt: skip
    common = dict(data=tmp_path / "data.npz", latency=False, show_progress=False)
    by_table = compare("fp32", "int8", model=half, table=table, **common)
    by_stats = compare("fp32", "int8", model=half, stats=stats, method="minmax", **common)
    waived = compare("fp32", "int8", model=wide, table=table, allow_partial=True, **common)
    expected = {(o["candidate"], o["name"]): o["sqnr_db"] for o in waived["outputs"]}
    for doc in (by_table, by_stats):
        got = {(o["candidate"], o["name"]): o["sqnr_db"] for o in doc["outputs"]}
        assert got == pytest.approx(expected)
    assert quantize(half, tmp_path / "q.onnx", table=table, show_progress=False).result.quantized
    with pytest.raises(QuantbenchError, match="made for another model"):
        compare("fp32", "int8", model=wide, table=table, **common)
    widened = calibrate(half, tmp_path / "data.npz", methods=["minmax"], show_progress=False)
    assert widened.stats.model_hash == open_graph(wide).hash


def test_sensitivity_and_recover_take_a_half_model_as_its_widening(tmp_path):
    """Both used to stop at "no op is quantized" (the half tensors take no Q/DQ): they now
    rank and recover the widening, as on the rewritten file; recover keeps its ops in the
    model's own FP16 unless told otherwise, and its artefact the model's input and output
    types."""
    half, wide = tmp_path / "half.onnx", tmp_path / "wide.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT16), str(half))
    rewrite(half, wide, "float32")
    x = RNG.standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x[:8])
    np.savez(tmp_path / "eval.npz", x=x[8:])
    calib, evaluation = tmp_path / "calib.npz", tmp_path / "eval.npz"
    ranked = {
        str(m): [(r["node"], r["only_quantized"]["sqnr_db"]) for r in sensitivity(
            m, calib, evaluation, method="minmax"
        )]
        for m in (half, wide)
    }  # fmt: skip
    assert [node for node, _ in ranked[str(half)]] == [node for node, _ in ranked[str(wide)]]
    assert [db for _, db in ranked[str(half)]] == pytest.approx([db for _, db in ranked[str(wide)]])
    assert [node for node, _ in ranked[str(half)]] == ["conv"]
    for precision in (None, "fp32"):
        result = recover(
            half, calib, evaluation, "cosine=0.5", method="minmax", precision=precision
        )
        assert result.precision == (precision or "fp16")
        io = [v.type.tensor_type.elem_type for v in result.artefact.graph.input]
        io += [v.type.tensor_type.elem_type for v in result.artefact.graph.output]
        assert io == [TensorProto.FLOAT16, TensorProto.FLOAT16]  # the half model's
        ort.InferenceSession(
            result.artefact.SerializeToString(), providers=["CPUExecutionProvider"]
        ).run(None, {"x": x[:2].astype(np.float16)})


def test_a_model_half_converted_by_onnxruntime_before_quantizes_in_fp16_again(tmp_path):
    """An FP16 export made by onnxruntime's float16 converter (I/O kept FP32) holds its Casts'
    names, graph_input_cast_0 ...; widened and converted again for --high-precision fp16, the
    new Casts took the same names (an internal error: two nodes writing one tensor)."""
    from quantbench.fp16 import strongly_typed_fp16

    exported = strongly_typed_fp16(_conv_model(TensorProto.FLOAT))
    assert any(n.name.startswith("graph_input_cast") for n in exported.graph.node)
    onnx.save(exported, str(tmp_path / "half.onnx"))
    x = RNG.standard_normal((8, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    outcome = quantize(
        tmp_path / "half.onnx", tmp_path / "q.onnx", data=tmp_path / "calib.npz",
        method="minmax", show_progress=False,
    )  # fmt: skip
    assert outcome.high_precision == "fp16"
    assert [q.node for q in outcome.result.quantized] == ["conv"]
    q = onnx.load(str(tmp_path / "q.onnx"))
    onnx.checker.check_model(q, full_check=True)
    y = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    ref = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    r = ref.run(None, {"x": x})[0].astype(np.float64)
    assert 10 * np.log10((r**2).sum() / ((y - r) ** 2).sum()) > 20  # INT8 of the same model



def test_a_bfloat16_model_quantizes_with_fp32_kept_and_its_types_back(tmp_path):
    """A bfloat16 model (its input too) used to be refused as unfeedable: it opens, is fed
    through its float32 widening, keeps FP32 for the ops left out of INT8 (bfloat16's range
    does not fit FP16) and gets its bfloat16 input and output back."""
    src = tmp_path / "bf16.onnx"
    onnx.save(_conv_model(TensorProto.BFLOAT16), str(src))
    np.savez(tmp_path / "calib.npz", x=RNG.standard_normal((8, 3, 8, 8)).astype(np.float32))
    outcome = quantize(
        src, tmp_path / "q.onnx", data=tmp_path / "calib.npz", method="minmax",
        show_progress=False,
    )  # fmt: skip
    assert outcome.high_precision == "fp32"
    assert [q.node for q in outcome.result.quantized] == ["conv"]
    q = onnx.load(str(tmp_path / "q.onnx"))
    onnx.checker.check_model(q, full_check=True)
    io = [v.type.tensor_type.elem_type for v in (*q.graph.input, *q.graph.output)]
    assert io == [TensorProto.BFLOAT16, TensorProto.BFLOAT16]
    assert not any(t.data_type in NARROW_FLOATS for t in q.graph.initializer)
    ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])


def test_inspect_names_the_widening_a_half_model_is_worked_on_as(tmp_path):
    """inspect shows a half model as it is, and the hash of the widening the other commands
    use (the rewritten file's, which its tables record): such a table is the model's."""
    from quantbench.inspection import inspect_model, inspect_table

    half, wide = tmp_path / "half.onnx", tmp_path / "wide.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT16), str(half))
    rewrite(half, wide, "float32")
    np.savez(tmp_path / "calib.npz", x=RNG.standard_normal((8, 3, 8, 8)).astype(np.float32))
    report = inspect_model(open_graph(half))
    assert report["widened_hash"] == open_graph(wide).hash != report["hash"]
    assert inspect_model(open_graph(wide))["widened_hash"] == ""
    calibrate(
        half, tmp_path / "calib.npz", methods=["minmax"], output=tmp_path / "t.json",
        fmt="json", use_cache=False, show_progress=False,
    )  # fmt: skip
    assert not inspect_table(tmp_path / "t.json", open_graph(half)).get("model_mismatch")
    other = tmp_path / "other.onnx"
    onnx.save(_conv_model(TensorProto.FLOAT), str(other))
    assert inspect_table(tmp_path / "t.json", open_graph(other))["model_mismatch"]
