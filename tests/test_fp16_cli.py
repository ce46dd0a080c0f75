"""FP16 and mixed INT8/FP16 from the command line on the bundled example (issue 14): compare
with an FP16 side, ``quantize --high-precision fp16`` and ``recover --precision fp16``."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_example
from onnx import TensorProto, helper, numpy_helper


def _types(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def _op_precisions(model: onnx.ModelProto) -> dict[str, str]:
    """Independently of quantbench: INT8 = reads a DQ output, FP16 = FP16 output."""
    types = _types(model)
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    out = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast", "Flatten", "Reshape"):
            continue
        if any(i in dq for i in n.input):
            out[n.name] = "int8"
        else:
            fp16 = all(types.get(o) == TensorProto.FLOAT16 for o in n.output)
            out[n.name] = "fp16" if fp16 else "fp32"
    return out


def _check_strongly_typed(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    types = _types(model)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert dqs
    for dq in dqs:
        assert inits[dq.input[1]] == TensorProto.FLOAT16, dq.name
        assert types[dq.output[0]] == TensorProto.FLOAT16, dq.name
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [TensorProto.FLOAT]


def _eval(example) -> dict[str, np.ndarray]:
    return dict(np.load(example / "eval.npz"))


def test_compare_fp32_fp16_on_the_bundled_example(run_cli, tmp_path):
    """Failed with an internal error (exposed tensors kept their FP32 type after FP16)."""
    example = require_example()
    out = tmp_path / "r.json"
    args = ["--model", example / "tinycnn.onnx", "--data", example / "eval.npz"]
    code, stdout, err = run_cli(
        "compare", "fp32", "fp16", *args, "--max-samples", "64", "--no-latency", "--json", out
    )
    assert code == 0, err
    assert "B: FP16 emulated" in " ".join((stdout + err).split())  # says how FP16 was computed
    doc = json.loads(out.read_text())
    record = doc["b"]["fp16"]
    assert record["mode"] == "emulated" and record["fp16_share"] == 1.0
    assert record["fp32_ops"] == []
    conv_rows = [r for r in doc["layers"] if r["op_type"] == "Conv"]
    assert {r["view"] for r in conv_rows} == {"accumulated", "isolated"}
    assert {r["precision"] for r in conv_rows} == {"fp16-emulated"}
    first = [r for r in conv_rows if r["node"] == "/stem/Conv"]
    # the first op reads the (FP16-rounded) input itself: isolated = accumulated
    assert first[0]["sqnr_db"] == pytest.approx(first[1]["sqnr_db"], abs=0.01)
    out_row = doc["outputs"][0]
    assert out_row["agreement"] > 0.95 and 40 < float(out_row["sqnr_db"]) < 120


def test_compare_fp16_against_int8_reports_each_ops_precision(run_cli, tmp_path):
    example = require_example()
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(
        "compare", "fp16", "int8", "--model", example / "tinycnn.onnx",
        "--data", example / "eval.npz", "--calib-data", example / "calib.npz",
        "--max-samples", "32", "--no-latency", "--json", out,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    by_side = {
        side: {r["node"]: r["precision"] for r in doc["layers"] if r["candidate"] == side}
        for side in ("A", "B")
    }
    assert by_side["A"]["/stem/Conv"] == "fp16-emulated"
    assert by_side["B"]["/stem/Conv"] == "int8" and by_side["B"]["/Relu"] == "fp32"
    assert doc["b"]["op_precisions"]["int8"] >= 5


def test_quantize_high_precision_fp16_writes_the_strongly_typed_model(run_cli, tmp_path):
    example = require_example()
    out = tmp_path / "mixed.onnx"
    code, _, err = run_cli(
        "quantize", example / "tinycnn.onnx", "--data", example / "calib.npz",
        "--max-samples", "64", "--high-precision", "fp16", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    assert "--stronglyTyped" in " ".join(err.split())
    model = onnx.load(str(out))
    _check_strongly_typed(model)
    precisions = _op_precisions(model)
    assert set(precisions.values()) == {"int8", "fp16"}
    feed = {k: v[:1] for k, v in _eval(example).items()}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, feed)[0]).all()
    code, _, err = run_cli(
        "quantize", example / "tinycnn.onnx", "--data", example / "calib.npz",
        "--high-precision", "fp8", "-o", tmp_path / "x.onnx",
    )  # fmt: skip
    assert code == 2 and "--high-precision 'fp8'" in err and not (tmp_path / "x.onnx").exists()


def test_recover_precision_fp16_end_to_end(run_cli, tmp_path):
    example = require_example()
    out = tmp_path / "rec"
    code, _, err = run_cli(
        "recover", example / "tinycnn.onnx", "--data", example / "eval.npz",
        "--calib-data", example / "calib.npz", "--max-samples", "200",
        "--calib-max-samples", "100", "--target", "sqnr_db=30", "--method", "entropy",
        "--precision", "fp16", "-o", out,
    )  # fmt: skip
    assert code in (0, 1), err
    doc = json.loads((out / "tinycnn.recovery.json").read_text())["recovery"]
    artefact = onnx.load(str(out / "tinycnn.recovered.onnx"))
    _check_strongly_typed(artefact)
    # op by op: the kept ops and every unquantized op FP16, every other planned op INT8
    precisions = _op_precisions(artefact)
    kept = doc["kept_high_precision"]
    assert kept and all(precisions[n] == "fp16" for n in kept)
    assert "fp32" not in precisions.values()
    assert {n: p for n, p in precisions.items()} == doc["op_precisions"]
    assert sum(p == "int8" for p in precisions.values()) == doc["steps"][-1]["quantized_ops"]
    assert "emulated" in doc["verified_on"]
    # the trtexec line matches the artefact: strongly typed, no precision flag
    lines = (out / "tinycnn.trtexec.txt").read_text().splitlines()
    explicit = [x for x in lines if "recovered.onnx" in x]
    assert len(explicit) == 1 and explicit[0].endswith("--stronglyTyped")
    assert "--int8" not in explicit[0] and "--fp16" not in explicit[0]
    cache = [x for x in lines if "--calib=" in x]
    assert "--int8 --fp16 --precisionConstraints=obey" in cache[0]
    assert all(f"{n}:fp16" in cache[0] for n in kept)
    # the recorded metrics are those of the artefact (up to onnxruntime's own FP16 kernels)
    data = _eval(example)
    name = next(iter(data))
    x = data[name][:200]
    fp32 = ort.InferenceSession(str(example / "tinycnn.onnx"), providers=["CPUExecutionProvider"])
    mixed = ort.InferenceSession(artefact.SerializeToString(), providers=["CPUExecutionProvider"])
    a = np.concatenate([fp32.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])
    b = np.concatenate([mixed.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    sqnr = 10 * np.log10((a64**2).sum() / ((a64 - b64) ** 2).sum())
    final = doc["steps"][-1]["metrics"]
    assert sqnr == pytest.approx(final["sqnr_db"], abs=1.5)
    assert np.mean(a.argmax(1) == b.argmax(1)) == pytest.approx(final["top1_agreement"], abs=0.011)


def test_an_fp16_overflow_in_a_layer_is_named_as_one(run_cli, tmp_path):
    """y = x * 1000 * 1000 on x in [1, 2]: the second product (1e6 and more) is beyond
    FP16's largest value, 65504, so FP16 makes it Inf; compare names the layer and why."""
    k = numpy_helper.from_array(np.array(1000.0, np.float32), "k")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "k"], ["m"], name="first"),
            helper.make_node("Mul", ["m", "k"], ["big"], name="second"),
            helper.make_node("Div", ["big", "k"], ["y"], name="back"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(3).uniform(1, 2, (8, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    code, out, err = run_cli(
        "compare", "fp32", "fp16", "--model", tmp_path / "m.onnx", "--data", tmp_path / "d.npz",
        "--no-latency",
    )  # fmt: skip
    text = " ".join((out + err).split())
    assert "layer(s) of B hold NaN/Inf, first big:" in text, text
    assert "it runs in FP16, whose largest value is 65504: FP16 overflows there" in text


def _scaled_model(tmp_path, big: float, small: float = 1e-4):
    """MatMul((x * small) * big, W) and data: wrong answer 6 of the newcomer's issue."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(small, np.float32), "small"),
        numpy_helper.from_array(np.array(big, np.float32), "big"),
        numpy_helper.from_array(rng.normal(size=(8, 10)).astype(np.float32), "W"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "small"], ["a"], name="mul1"),
            helper.make_node("Mul", ["a", "big"], ["b"], name="mul2"),
            helper.make_node("MatMul", ["b", "W"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(64, 8)).astype(np.float32))
    return tmp_path / "m.onnx", tmp_path / "d.npz"


def test_compare_fails_the_gates_of_an_fp16_constant_overflow(run_cli, tmp_path):
    """np.float16(1e5) is Inf: the FP16 side's outputs are not finite and every gate fails (it
    passed at cosine 1, the emulation having clamped 1e5 to 65504); the constant is named."""
    with np.errstate(over="ignore"):
        assert np.float16(1e5) == np.inf
    model, data = _scaled_model(tmp_path, 1e5)
    code, out, err = run_cli(
        "compare", "fp32", "fp16", "--model", model, "--data", data, "--no-latency",
        "--fail-below", "cosine=0.99", "--fail-below", "top1_agreement=0.99",
        "--json", tmp_path / "r.json",
    )  # fmt: skip
    text = " ".join((out + err).split())
    assert code == 1, text
    assert "FAIL cosine = undefined" in text and "FAIL top1_agreement = undefined" in text
    assert "PASS" not in text
    assert "FP16 cannot hold 1 constant(s) of B: big (1 values): 1 value(s) beyond" in text
    assert "max |value| 100000" in text
    doc = json.loads((tmp_path / "r.json").read_text())
    (record,) = doc["b"]["fp16"]["out_of_range_constants"]
    assert record["tensor"] == "big" and record["overflow"] == 1
    # an underflow: np.float16(1e-9) == 0, so y is 0 and cosine is undefined or 0
    assert np.float16(1e-9) == 0
    model, data = _scaled_model(tmp_path, 1e-9)
    code, out, err = run_cli(
        "compare", "fp32", "fp16", "--model", model, "--data", data, "--no-latency",
        "--fail-below", "cosine=0.99",
    )  # fmt: skip
    text = " ".join((out + err).split())
    assert code == 1 and "FAIL cosine" in text, text
    assert "big (1 values): 1 nonzero value(s) become 0" in text


def _cosine_ratio(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return (
        float(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64)),
        float(a64 @ b64 / (a64 @ a64)),
    )


def _run(path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_quantize_fp16_keeps_a_constant_fp16_cannot_hold_in_fp32(run_cli, tmp_path):
    """--high-precision fp16 wrote 65504 for 1e5 (exit 0, 0.654x FP32 when run): the node
    reading it stays FP32 with the constant FP32, said in one warning naming both."""
    model, data = _scaled_model(tmp_path, 1e5)
    out = tmp_path / "q.onnx"
    code, _, err = run_cli(
        "quantize", model, "--data", data, "--high-precision", "fp16", "-o", out
    )
    text = " ".join(err.split())
    assert code == 0, text
    assert "FP16 cannot hold 1 constant(s) of the model: big" in text
    assert "kept in FP32 so the artefact computes them: mul2" in text
    artefact = onnx.load(str(out))
    big = next(i for i in artefact.graph.initializer if i.name == "big")
    assert big.data_type == TensorProto.FLOAT and numpy_helper.to_array(big) == np.float32(1e5)
    x = np.load(data)["x"]
    cosine, ratio = _cosine_ratio(_run(model, x), _run(out, x))
    assert cosine > 0.999 and abs(ratio - 1) < 0.01, (cosine, ratio)  # clamped: ratio 0.655


def test_quantize_fp16_warns_of_an_activation_beyond_fp16(run_cli, tmp_path):
    """MatMul((x * 10) * 1e4, W): the MatMul's input b = 1e5 x reaches beyond 65504 on the
    data (both constants fit FP16); the warning names b and its max, as numpy computes it."""
    model, data = _scaled_model(tmp_path, 1e4, small=10.0)
    x = np.load(data)["x"]
    peak = np.abs((x * np.float32(10)) * np.float32(1e4)).max()
    assert peak > 65520
    code, _, err = run_cli(
        "quantize", model, "--data", data, "--high-precision", "fp16", "-o", tmp_path / "q.onnx"
    )
    text = " ".join(err.split())
    assert code == 0, text
    assert "1 tensor(s) computed in FP16 reach beyond FP16's largest value 65504" in text
    assert f"b (max |x| {peak:.6g}," in text


def test_recover_fp16_judges_the_artefact_it_writes(run_cli, tmp_path):
    """recover said "met, 0.9999" for an artefact running at 0.654x FP32: now the artefact
    keeps the node FP32, runs at FP32's scale, and the cache line keeps it FP32 too."""
    model, data = _scaled_model(tmp_path, 1e5)
    out = tmp_path / "rec"
    code, _, err = run_cli(
        "recover", model, "--data", data, "--calib-data", data, "--precision", "fp16",
        "--target", "cosine=0.99", "-o", out,
    )  # fmt: skip
    text = " ".join(err.split())
    assert "kept in FP32 so the artefact computes them: mul2" in text
    doc = json.loads((out / "m.recovery.json").read_text())["recovery"]
    x = np.load(data)["x"]
    cosine, ratio = _cosine_ratio(_run(model, x), _run(out / "m.recovered.onnx", x))
    assert cosine > 0.99 and abs(ratio - 1) < 0.01, (cosine, ratio)
    assert doc["steps"][-1]["metrics"]["cosine"] == pytest.approx(cosine, abs=1e-3)
    assert code == 0 and doc["op_precisions"]["mul2"] == "fp32"
    assert "mul2:fp32" in (out / "m.trtexec.txt").read_text()


def test_recover_fp16_is_not_met_where_an_activation_overflows(run_cli, tmp_path):
    """(x * 10) * 1e4 reaches beyond 65504 in FP16: the artefact's outputs are Inf/NaN, so
    the target is not met (exit 1)."""
    model, data = _scaled_model(tmp_path, 1e4, small=10.0)
    x = np.load(data)["x"]
    with np.errstate(over="ignore"):
        assert not np.isfinite(((x * np.float32(10)) * np.float32(1e4)).astype(np.float16)).all()
    code, _, err = run_cli(
        "recover", model, "--data", data, "--calib-data", data, "--precision", "fp16",
        "--target", "cosine=0.99", "-o", tmp_path / "rec",
    )  # fmt: skip
    text = " ".join(err.split())
    assert code == 1, text
    doc = json.loads((tmp_path / "rec" / "m.recovery.json").read_text())["recovery"]
    assert doc["met"] is False
