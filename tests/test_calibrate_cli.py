"""`quantbench calibrate` and `inspect` end to end, including every bad input of the issue."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import onnx
import pytest
import synthetic
from onnx import TensorProto, helper

from quantbench import calibrate as cal
from quantbench.table.codecs import FORMAT_SUFFIX, detect_format, read_table


def onnx_hash(path) -> str:
    """The model hash a table's provenance records: the file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_one_method_writes_a_trt_cache(run_cli, cnn_path, cnn_data, tmp_path):
    out = tmp_path / "cnn.cache"
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "entropy", "-o", out)
    assert code == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == "TRT-101600-EntropyCalibration2"
    table = read_table(out)
    assert list(table)[:2] == ["input", "c1"]  # network order, graph input first
    assert len(table) == 8 and not table.invalid()


def test_all_methods_write_a_folder_from_one_pass(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch
):
    calls = []
    real = cal.collect_stats
    monkeypatch.setattr(cal, "collect_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "tables"
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "--method", "all", "-o", out)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert (
        "entropy.cache" in names and "minmax.cache" in names and "percentile-99.99.cache" in names
    )
    assert read_table(out / "minmax.cache").algorithm == "MinMaxCalibration"
    assert len(calls) == 1
    # a second run with another method is served from the statistics cache: no inference
    code, _, err = run_cli(
        "calibrate",
        cnn_path,
        "--data",
        cnn_data,
        "-m",
        "mse",
        "-o",
        tmp_path / "m.json",
        "-f",
        "json",
    )
    assert code == 0 and len(calls) == 1 and "cached statistics" in err
    assert json.loads((tmp_path / "m.json").read_text())["method"] == "mse"


def test_tables_are_deterministic(cnn_path, cnn_data, tmp_path):
    a = cal.calibrate(
        cnn_path, cnn_data, output=tmp_path / "a.cache", use_cache=False, show_progress=False
    )
    b = cal.calibrate(
        cnn_path,
        cnn_data,
        output=tmp_path / "b.cache",
        batch_size=7,
        use_cache=False,
        show_progress=False,
    )
    assert a.written[0].read_bytes() == b.written[0].read_bytes()


def test_merge_shards_equals_whole(run_cli, cnn_path, tmp_path):
    x = synthetic.images(30)
    np.savez(tmp_path / "all.npz", input=x)
    np.savez(tmp_path / "h1.npz", input=x[:13])
    np.savez(tmp_path / "h2.npz", input=x[13:])
    for name in ("h1", "h2", "all"):
        code, _, err = run_cli(
            "calibrate",
            cnn_path,
            "--method",
            "entropy",  # a method of the statistics alone (auto also judges on the data)
            "--data",
            tmp_path / f"{name}.npz",
            "--save-stats",
            tmp_path / f"{name}.stats",
            "-o",
            tmp_path / f"{name}.cache",
        )
        assert code == 0, err
    code, _, err = run_cli(
        "calibrate",
        cnn_path,
        "--merge",
        tmp_path / "h1.stats",
        "--merge",
        tmp_path / "h2.stats",
        "--method",
        "entropy",
        "-o",
        tmp_path / "merged.cache",
    )
    assert code == 0, err
    assert (tmp_path / "merged.cache").read_bytes() == (tmp_path / "all.cache").read_bytes()


def test_inspect_model_cache_and_stats(run_cli, cnn_path, cnn_data, tmp_path):
    cache = tmp_path / "c.cache"
    assert (
        run_cli("calibrate", cnn_path, "--data", cnn_data, "--tensors", "quantizable", "-o", cache)[
            0
        ]
        == 0
    )
    code, out, _ = run_cli("inspect", cache, "--model", cnn_path, "--json")
    report = json.loads(out)
    assert code == 0 and report["num_tensors"] == 3
    assert set(report["missing"]) == {"c1", "c2", "sum", "gap", "logits"}
    assert report["missing_quantizable"] == []
    code, out, _ = run_cli("inspect", cnn_path, "--json")
    assert json.loads(out)["quantizable_ops"][0] == {"node": "conv1", "op_type": "Conv"}
    assert (
        run_cli("calibrate", cnn_path, "--data", cnn_data, "--save-stats", tmp_path / "s.stats")[0]
        == 0
    )
    code, out, _ = run_cli("inspect", tmp_path / "s.stats", "--json", "-m", "minmax")
    rows = json.loads(out)["tensors"]
    assert rows[0]["amax"]["minmax"] == pytest.approx(rows[0]["max_abs"])


# --------------------------------------------------------------------------- bad input


def _expect_error(run_cli, *args, match: str):
    code, out, err = run_cli(*args)
    assert code == 2, (out, err)
    assert match in err
    assert "Traceback" not in err
    assert len([ln for ln in err.strip().splitlines() if ln.startswith("error:")]) == 1


def test_not_onnx_and_truncated(run_cli, cnn_path, cnn_data, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_text("hello")
    _expect_error(run_cli, "calibrate", junk, "--data", cnn_data, match="not a readable ONNX model")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(cnn_path.read_bytes()[:300])
    _expect_error(run_cli, "calibrate", cut, "--data", cnn_data, match="cut.onnx")


def test_input_without_fixed_rank(run_cli, cnn_data, tmp_path):
    m = synthetic.small_cnn()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    path = synthetic.save(m, tmp_path / "norank.onnx")
    _expect_error(run_cli, "calibrate", path, "--data", cnn_data, match="no fixed rank")


def test_wrong_data(run_cli, cnn_path, tmp_path):
    np.savez(tmp_path / "w.npz", image=synthetic.images(2))
    _expect_error(
        run_cli,
        "calibrate",
        cnn_path,
        "--data",
        tmp_path / "w.npz",
        match="no data for model input(s) input",
    )
    np.savez(tmp_path / "e.npz", input=np.zeros((0, 3, 16, 16), np.float32))
    _expect_error(run_cli, "calibrate", cnn_path, "--data", tmp_path / "e.npz", match="empty")


def test_missing_output_folder_writes_nothing(run_cli, cnn_path, cnn_data, tmp_path):
    _expect_error(
        run_cli,
        "calibrate",
        cnn_path,
        "--data",
        cnn_data,
        "-o",
        tmp_path / "no" / "x.cache",
        match="does not exist",
    )
    assert not (tmp_path / "no").exists()


def test_corrupt_cache_to_inspect(run_cli, tmp_path):
    bad = tmp_path / "bad.cache"
    bad.write_text("TRT-8401-EntropyCalibration2\ninput 3c010a14\n")
    _expect_error(run_cli, "inspect", bad, match="bad.cache")


def test_stats_from_another_model(run_cli, cnn_path, cnn_data, tmp_path):
    assert (
        run_cli("calibrate", cnn_path, "--data", cnn_data, "--save-stats", tmp_path / "s.stats")[0]
        == 0
    )
    other = synthetic.save(synthetic.small_cnn(seed=5), tmp_path / "other.onnx")
    _expect_error(
        run_cli, "calibrate", other, "--stats", tmp_path / "s.stats", match="another model"
    )


def test_nan_activations_keep_their_finite_statistics(run_cli, tmp_path):
    """Issue 10 item 4: a tensor holding some NaN is calibrated from its finite values (it used
    to leave the table with everything downstream); the warning names it with its counts."""
    nodes = [
        helper.make_node("Log", ["x"], ["logx"], name="log"),  # NaN for negative inputs
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Add", ["logx", "r"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "nan.onnx"
    onnx.save(model, path)
    np.save(tmp_path / "x.npy", np.array([[1, -1, 2, 3]] * 5, np.float32))
    out = tmp_path / "t.cache"
    code, _, err = run_cli(
        "calibrate", path, "--data", tmp_path / "x.npy", "-m", "minmax", "-o", out
    )
    assert code == 0, err
    assert "NaN/Inf" in err and "logx (5 NaN, 0 Inf of 20)" in err
    table = read_table(out)
    assert set(table) == {"x", "logx", "r", "y"}
    # the finite values: log 1, log 2, log 3 and 1 + 1, 2 + log 2, 3 + log 3
    assert table.amax("logx") == pytest.approx(float(np.log(np.float32(3))), rel=1e-6)
    assert table.amax("y") == pytest.approx(3 + float(np.log(np.float32(3))), rel=1e-6)


def test_calibration_only_report(run_cli, cnn_path, cnn_data, tmp_path):
    html = tmp_path / "calib.html"
    code, _, err = run_cli(
        "calibrate",
        cnn_path,
        "--data",
        cnn_data,
        "-m",
        "all",
        "-o",
        tmp_path / "t",
        "--report",
        html,
    )
    assert code == 0, err
    text = html.read_text()
    assert "<svg" in text and "entropy:pytorch" in text and "http://" not in text


def test_one_table_that_cannot_be_written_leaves_none_behind(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch
):
    """``--method all``: when one method's table cannot go into a TensorRT cache (a NaN
    amax here), the command fails in one line and writes no table, not the ones before it."""
    from dataclasses import replace

    from quantbench import calibrators as registry

    spec = registry.spec("mse")
    monkeypatch.setitem(
        registry._REGISTRY,
        "mse",
        replace(spec, fn=lambda stats, option: float("nan"), many=None),
    )
    out = tmp_path / "tables"
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "--method", "all", "-o", out)
    assert code == 2 and "NaN scale" in err and "Traceback" not in err
    assert not out.exists()


def test_inspect_shows_named_dims_and_says_a_model_is_quantized(run_cli, cnn_path, cnn_data,
                                                                tmp_path):  # fmt: skip
    """'[N,3,16,16]' is rich markup syntax: inspect printed 'input float32' and dropped the
    shape (khmersm's 'x int64[batch,seq]'). A Q/DQ model said only '27 quantizable ops'."""
    code, out, err = run_cli("inspect", cnn_path)
    assert code == 0 and "input float32[N,3,16,16]" in out + err
    assert "already quantized" not in out + err
    q = tmp_path / "q.onnx"
    assert run_cli("quantize", cnn_path, "--data", cnn_data, "-o", q)[0] == 0
    code, out, err = run_cli("inspect", q)
    counts = Counter(n.op_type for n in onnx.load(str(q)).graph.node)
    assert (
        f"already quantized: {counts['QuantizeLinear']} QuantizeLinear, "
        f"{counts['DequantizeLinear']} DequantizeLinear" in " ".join((out + err).split())
    )


def test_without_output_the_last_line_says_no_table_was_written(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch
):
    """calibrate without -o ended on "calibrated N tensors ...", writing nothing and not saying
    so: its last line now says no table was written and how to get one."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax")
    assert code == 0, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("no table was written (no -o): give -o FILE"), err
    assert "statistics kept in" in last
    assert sorted(tmp_path.iterdir()) == before
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax",
                           "-o", "t.cache")  # fmt: skip
    assert code == 0 and err.strip().splitlines()[-1].startswith("wrote t.cache"), err


# --------------------------------------------------------------------------- format from -o


@pytest.mark.parametrize(
    ("name", "first_bytes"),
    [
        ("t.json", b"{"),
        ("t.JSON", b"{"),
        ("t.cache", b"TRT-101600-MinMaxCalibration\n"),
        ("t.calib", b"TRT-101600-MinMaxCalibration\n"),
        ("t.txt", b"TRT-101600-MinMaxCalibration\n"),
        ("table", b"TRT-101600-MinMaxCalibration\n"),
    ],
)
def test_output_suffix_names_the_format(run_cli, cnn_path, cnn_data, tmp_path, name, first_bytes):
    """`-o A.json` wrote TensorRT cache text into a .json file and lost the model hash."""
    out = tmp_path / name
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax", "-o", out)
    assert code == 0, err
    assert out.read_bytes().startswith(first_bytes)
    if first_bytes == b"{":
        document = json.loads(out.read_text())
        assert document["provenance"]["model_hash"] == onnx_hash(cnn_path)


def test_output_suffix_flatbuffers(run_cli, cnn_path, cnn_data, tmp_path):
    out = tmp_path / "calibration.flatbuffers"
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax", "-o", out)
    assert code == 0, err
    assert detect_format(out.read_bytes()) == "ort-flatbuffers"


@pytest.mark.parametrize(
    ("fmt", "name"), [("trt", "t.json"), ("json", "t.cache"), ("ort-flatbuffers", "t.json")]
)
def test_format_contradicting_the_suffix_is_refused_before_inference(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch, fmt, name
):
    calls = []
    monkeypatch.setattr(cal, "collect_stats", lambda *a, **k: calls.append(1))
    out = tmp_path / name
    args = ["calibrate", cnn_path, "--data", cnn_data, "-m", "minmax", "-f", fmt, "-o", out]
    code, _, err = run_cli(*args)
    assert code == 2 and calls == [] and not out.exists()
    suffix = out.suffix
    assert err.strip().splitlines() == [
        f"error: {out}: --format {fmt} contradicts the suffix {suffix} (a "
        f"{'json' if suffix == '.json' else 'trt'} table); drop --format, or name the file "
        f"*{FORMAT_SUFFIX[fmt]}"
    ]


@pytest.mark.parametrize(("fmt", "suffix"), [(None, ".cache"), ("json", ".json")])
def test_several_methods_into_a_folder_name_each_file(
    run_cli, cnn_path, cnn_data, tmp_path, fmt, suffix
):
    out = tmp_path / "tables.json"  # a folder: its name's suffix names no format
    args = ["calibrate", cnn_path, "--data", cnn_data, "-m", "minmax", "-m", "percentile:99.9"]
    code, _, err = run_cli(*args, *(["-f", fmt] if fmt else []), "-o", out)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        f"minmax{suffix}",
        f"percentile-99.9{suffix}",
    ]
    assert read_table(out / f"minmax{suffix}").method == ("minmax" if fmt else "")


# --------------------------------------------------------------------------- one label, one count


def test_inspect_and_quantize_count_the_same_ops(run_cli, tmp_path):
    """inspect said '8 quantizable ops' where quantize said '10 ops quantized' on the bundled
    example: quantize also quantizes the residual input of an Add after a weighted op."""
    from conftest import require_example

    example = require_example()
    model = onnx.load(str(example / "tinycnn.onnx"))
    producer = {out: n.op_type for n in model.graph.node for out in n.output}
    kinds = ("Conv", "ConvTranspose", "Gemm", "MatMul")
    weighted = sum(n.op_type in kinds for n in model.graph.node)
    adds = sum(
        n.op_type == "Add" and any(producer.get(t) in kinds for t in n.input)
        for n in model.graph.node
    )
    assert (weighted, adds) == (8, 2)  # the bundled example, counted by hand from the graph
    code, out, err = run_cli("inspect", example / "tinycnn.onnx")
    assert code == 0
    said = f"{weighted + adds} ops to quantize ({weighted} weighted, {adds} residual Add)"
    assert said in " ".join((out + err).split())
    table = tmp_path / "t.json"
    args = ["calibrate", example / "tinycnn.onnx", "--data", example / "calib.npz", "-m", "minmax"]
    assert run_cli(*args, "-o", table)[0] == 0
    code, out, err = run_cli("quantize", example / "tinycnn.onnx", "--table", table, "-o",
                             tmp_path / "q.onnx")  # fmt: skip
    assert code == 0, err
    said = f"{weighted + adds} ops quantized ({weighted} weighted, {adds} residual Add), 0 left"
    assert said in " ".join((out + err).split())


def test_quantize_reports_what_the_table_records(run_cli, cnn_path, cnn_data, tmp_path):
    """quantize said 'method not recorded' for a cache calibrate had just labelled entropy: a
    cache records only its header (quantbench writes EntropyCalibration2 for percentile too)."""
    for name, said in [
        ("t.json", "t.json: method percentile:99.9, 8 tensors"),
        (
            "t.cache",
            "t.cache: TensorRT 10.16.0 cache, algorithm EntropyCalibration2 (caches record no "
            "method; quantbench writes EntropyCalibration2 for all but minmax, its JSON tables "
            "record the method), 8 tensors",
        ),
    ]:
        table = tmp_path / name
        args = ["calibrate", cnn_path, "--data", cnn_data, "-m", "percentile:99.9", "-o", table]
        assert run_cli(*args)[0] == 0
        code, out, err = run_cli("quantize", cnn_path, "--table", table, "-o", tmp_path / "q.onnx")
        assert code == 0, err
        assert said in " ".join((out + err).split())
        assert "not recorded" not in out + err
