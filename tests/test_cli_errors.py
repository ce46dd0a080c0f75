"""Exit codes (0 ok, 1 gate missed, 2 user input, 3 internal error), non-finite values in JSON,
and the rules that used to be written twice (issue 16 items 6 and 9, issue 14 item 3)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import synthetic
from onnx import TensorProto, helper

from quantbench.errors import QuantbenchError

REPO = Path(__file__).resolve().parents[1]


def strict_json(path: Path) -> object:
    """Parse as strict JSON: Python's json accepts NaN/Infinity, real JSON does not."""

    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: non-standard JSON token {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


# --------------------------------------------------------------------------- exit codes


def test_identical_models_gate_on_infinite_sqnr_writes_json(run_cli, cnn_path, cnn_data, tmp_path):
    """`compare A A --fail-below sqnr_db=40 --json x` died with "Out of range float values are
    not JSON compliant: inf" and exit 1 (the gate-missed code)."""
    out = tmp_path / "x.json"
    code, _, err = run_cli(
        "compare", cnn_path, cnn_path, "--model", cnn_path, "--data", cnn_data,
        "--fail-below", "sqnr_db=40", "--json", out, "--no-latency", "--max-samples", "8",
    )  # fmt: skip
    assert code == 0, err
    doc = strict_json(out)
    gate = doc["thresholds"][0]
    assert gate["metric"] == "sqnr_db" and gate["value"] == "inf" and gate["passed"] is True
    assert doc["outputs"][0]["sqnr_db"] == "inf" and doc["passed"] is True


def test_a_bug_is_exit_3_with_one_line_and_a_saved_traceback(run_cli, monkeypatch, tmp_path):
    import quantbench.inspection as inspection

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(inspection, "inspect_path", boom)
    monkeypatch.setenv("QUANTBENCH_ERROR_DIR", str(tmp_path))
    monkeypatch.delenv("QUANTBENCH_DEBUG", raising=False)
    code, out, err = run_cli("inspect", tmp_path)
    assert code == 3
    text = " ".join((out + err).split())
    assert "internal error" in text and "RuntimeError: boom" in text
    assert "second line" not in text and "Traceback" not in text
    assert "QUANTBENCH_DEBUG=1" in text
    saved = list(tmp_path.glob("quantbench-error-*.txt"))
    assert len(saved) == 1 and "Traceback" in saved[0].read_text()
    assert "second line" in saved[0].read_text()

    monkeypatch.setenv("QUANTBENCH_DEBUG", "1")
    code, out, err = run_cli("inspect", tmp_path)
    assert code == 3 and "Traceback" in err and "RuntimeError: boom" in err


def test_traceback_file_defaults_to_the_system_temp_folder(run_cli, tmp_path, monkeypatch):
    """Without QUANTBENCH_ERROR_DIR the file goes where tempfile puts it (TMPDIR here)."""
    import tempfile

    import quantbench.inspection as inspection

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(inspection, "inspect_path", boom)
    monkeypatch.delenv("QUANTBENCH_ERROR_DIR")
    monkeypatch.delenv("QUANTBENCH_DEBUG", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    code, _, err = run_cli("inspect", tmp_path)
    assert code == 3
    saved = list(tmp_path.glob("quantbench-error-*.txt"))
    assert len(saved) == 1 and str(saved[0]) in " ".join(err.split()).replace(" ", "")


def test_user_error_stays_exit_2_and_gate_exit_1():
    from quantbench.errors import InternalError, ThresholdFailed

    assert QuantbenchError("x").exit_code == 2
    assert ThresholdFailed("x").exit_code == 1
    assert InternalError("x").exit_code == 3 and not isinstance(InternalError("x"), QuantbenchError)


def _type_clash(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its output declared float16 while the graph computes float32: what the
    FP16 conversion of issue 14 produced (onnxruntime refuses to load it)."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    return broken


def test_onnxruntime_failing_on_a_generated_model_is_internal(tmp_path):
    from quantbench.backends.onnxruntime import OnnxRuntimeRunner
    from quantbench.errors import InternalError

    good = synthetic.small_cnn()
    broken = _type_clash(good)
    with pytest.raises(InternalError, match="quantbench generated"):
        OnnxRuntimeRunner(broken, generated_from=good)
    with pytest.raises(QuantbenchError, match="cannot load the model"):
        OnnxRuntimeRunner(broken)  # the user's own model: their input
    with pytest.raises(QuantbenchError, match="cannot load the model"):
        OnnxRuntimeRunner(broken, generated_from=broken)  # the user's model is already broken


def test_compare_fp16_that_onnxruntime_rejects_is_exit_3(run_cli, cnn_path, cnn_data, monkeypatch):
    """Issue 16 item 6: onnxruntime failing on a model quantbench generated was exit 2."""
    import quantbench.compare.candidates as candidates
    from quantbench.fp16 import Fp16Model

    monkeypatch.setattr(candidates, "fp16_model", lambda m, **_: Fp16Model(_type_clash(m)))
    code, out, err = run_cli(
        "compare", "fp32", "fp16", "--model", cnn_path, "--data", cnn_data, "--no-latency",
        "--max-samples", "4",
    )  # fmt: skip
    assert code == 3, out + err
    assert "internal error" in " ".join(err.split())


# --------------------------------------------------------------------------- JSON


def test_every_json_writer_spells_nonfinite_values_the_same_way():
    """Six converters used to disagree: NaN became "-inf" in three and null in two."""
    from quantbench import jsonsafe, results
    from quantbench.compare import run
    from quantbench.recovery import evaluation
    from quantbench.stats import tensorstats as stats
    from quantbench.table import json_table

    nan, inf = math.nan, math.inf
    converters = [
        jsonsafe.json_float,
        results._finite,
        run._clean,
        stats._json_float,
        lambda v: evaluation.json_metrics({"m": v})["m"],
        json_table._float_out,
    ]
    for convert in converters:
        assert [convert(nan), convert(inf), convert(-inf), convert(1.5)] == [
            "nan", "inf", "-inf", 1.5,
        ], convert  # fmt: skip


def test_no_module_writes_its_own_nonfinite_strings():
    """One implementation: only quantbench/jsonsafe.py turns infinities into "inf"/"-inf"."""
    writer = re.compile(r'"inf"\s+if\s+.+\s+else\s+"-inf"')
    offenders = []
    for folder in ("quantbench", "reports", "calibrators", "plugins"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name != "jsonsafe.py" and writer.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_write_json_is_strict_at_any_depth(tmp_path):
    from quantbench.results import write_json

    doc = {"a": [np.float32("nan"), {"b": np.float64("-inf")}], "c": (math.inf, np.int64(3))}
    write_json(doc, tmp_path / "d.json")
    assert strict_json(tmp_path / "d.json") == {"a": ["nan", {"b": "-inf"}], "c": ["inf", 3]}


def test_nan_metric_fails_its_gate():
    from quantbench.results import apply_gates

    doc = {"outputs": [{"candidate": "B", "sqnr_db": "nan", "cosine": "inf"}]}
    apply_gates(doc, [("sqnr_db", 10.0), ("cosine", 0.9)])
    assert [t["passed"] for t in doc["thresholds"]] == [False, True]


def test_sensitivity_json_is_a_versioned_document(run_cli, cnn_path, cnn_data, tmp_path):
    """Issue 14: `sensitivity --json` wrote a bare list."""
    out = tmp_path / "s.json"
    code, _, err = run_cli(
        "sensitivity", cnn_path, "--data", cnn_data, "--calib-data", cnn_data,
        "--max-samples", "8", "--json", out,
    )  # fmt: skip
    assert code == 0, err
    doc = strict_json(out)
    assert isinstance(doc, dict)
    assert (doc["schema"], doc["schema_version"], doc["kind"]) == (
        "quantbench-results",
        1,
        "sensitivity",
    )
    assert doc["metric"] == "sqnr_db" and doc["method"] == "auto"  # the default
    assert doc["model"]["hash"] and [r["rank"] for r in doc["rows"]] == list(
        range(1, len(doc["rows"]) + 1)
    )
    assert {r["node"] for r in doc["rows"]} == {"conv1", "conv2", "add", "fc"}


# --------------------------------------------------------------------------- one rule each


def test_trt_version_rule_is_shared():
    """TrtVersion.header_number encoded 10.100.0 as 110000 (= 11.0.0); the cache refuses it."""
    from quantbench.backends.trt.version import TrtVersion
    from quantbench.recovery.artefacts import check_artefact_target

    with pytest.raises(QuantbenchError, match="<= 99"):
        _ = TrtVersion.parse("10.100.0").header_number
    for bad, message in (("10.100.0", "<= 99"), ("11.0.0", "Q/DQ"), ("ten", "MAJOR.MINOR")):
        with pytest.raises(QuantbenchError, match=message):
            check_artefact_target(Path("out"), bad)


def test_recover_bad_trt_version_fails_before_the_search(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch
):
    import quantbench.recovery as recovery

    called = []
    monkeypatch.setattr(recovery, "recover", lambda *a, **k: called.append(1))
    code, _, err = run_cli(
        "recover", cnn_path, "--data", cnn_data, "--calib-data", cnn_data, "-o", tmp_path / "o",
        "--trt-version", "10.100.0",
    )  # fmt: skip
    assert code == 2 and "10.100.0" in err and called == []
    assert not (tmp_path / "o").exists()


def test_labels_with_max_samples_use_the_first_labels(run_cli, cnn_path, cnn_data, tmp_path):
    """compare refused labels for the whole set with --max-samples; recover truncated them
    silently. One rule: the first N labels, said on the console."""
    labels = tmp_path / "labels.npy"
    np.save(labels, np.arange(40) % 10)
    out = tmp_path / "r.json"
    code, _, err = run_cli(
        "compare", "fp32", cnn_path, "--model", cnn_path, "--data", cnn_data, "--labels", labels,
        "--max-samples", "16", "--no-latency", "--json", out,
    )  # fmt: skip
    assert code == 0, err
    assert "first 16 of 40 labels" in " ".join(err.split())
    assert strict_json(out)["data"]["eval_samples"] == 16


def test_labels_for_samples_rule():
    from quantbench.compare import labels_for_samples

    labels = np.arange(10)
    assert labels_for_samples(labels, 4).tolist() == [0, 1, 2, 3]
    assert labels_for_samples(labels, None) is labels
    assert labels_for_samples(labels, 20) is labels


def _duplicate_names() -> onnx.ModelProto:
    """Two Convs both named "conv" and an unnamed Relu."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 1, 1], [1.0, 0.5, -0.5, 1.0])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["y"], name="conv"),
    ]
    graph = helper.make_graph(
        nodes,
        "dup",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_node_names_follow_one_rule_in_quantize_compare_and_inspect(tmp_path):
    from quantbench.compare.run import _node_of
    from quantbench.inspection import inspect_model
    from quantbench.model.graph import node_labels, open_graph
    from quantbench.qdq.quantize import name_nodes

    model = _duplicate_names()
    assert node_labels(model.graph.node) == ["conv", "Relu_1", "conv_1"]
    graph = open_graph(model)
    assert {k: v[0] for k, v in _node_of(graph).items()} == {
        "a": "conv", "r": "Relu_1", "y": "conv_1",
    }  # fmt: skip
    shown = json.dumps(inspect_model(graph))
    assert "conv_1" in shown
    named = onnx.ModelProto()
    named.CopyFrom(model)
    name_nodes(named)
    assert [n.name for n in named.graph.node] == ["conv", "Relu_1", "conv_1"]


def test_table_json_still_reads_the_earlier_spellings():
    from quantbench.table import CalibrationTable
    from quantbench.table.json_table import decode_json_table, encode_json_table

    table = CalibrationTable()
    table.set("a", math.inf)
    table.set("b", 2.0)
    text = encode_json_table(table).decode()
    legacy = text.replace('"inf"', '"Infinity"')
    assert legacy != text
    back = decode_json_table(legacy.encode(), "old.json")
    assert back.amax("a") == math.inf and back.amax("b") == 2.0


def test_compare_report_folder_is_checked_before_inference(
    run_cli, cnn_path, cnn_data, tmp_path, monkeypatch
):
    """The report is written by the CLI (the core does not import the reports): its path is
    still checked before any inference."""
    import quantbench.compare as compare_module

    called = []
    monkeypatch.setattr(compare_module, "run_comparison", lambda *a, **k: called.append(1))
    code, _, err = run_cli(
        "compare", "fp32", cnn_path, "--model", cnn_path, "--data", cnn_data,
        "--report", tmp_path / "missing" / "r.html",
    )  # fmt: skip
    assert code == 2 and "does not exist" in err and called == []


def test_inspect_json_is_strict(run_cli, cnn_path, cnn_data, tmp_path):
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-o", tmp_path / "t.json",
                           "-f", "json", "--save-stats", tmp_path / "s.stats")  # fmt: skip
    assert code == 0, err
    for target in (cnn_path, tmp_path / "t.json", tmp_path / "s.stats"):
        code, out, err = run_cli("inspect", target, "--json")
        assert code == 0, err
        path = tmp_path / "inspect.json"
        path.write_text(out)
        assert isinstance(strict_json(path), dict)


@pytest.mark.parametrize(
    "command",
    [
        "calibrate -o MODEL",
        "calibrate --save-stats DATA",
        "quantize -o TABLE",
        "compare --json DATA",
    ],
)
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(
    run_cli, cnn_path, cnn_data, tmp_path, command
):
    """'-o' or '--save-stats' naming the command's own model, data or table overwrote it
    (a user's calibration data was lost this way). Symlinks count as the file they name."""
    table = tmp_path / "t.cache"
    assert run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax", "-o", table)[0] == 0
    link = tmp_path / "model-link.onnx"
    link.symlink_to(cnn_path)
    before = {p: p.read_bytes() for p in (cnn_path, cnn_data, table)}
    args = {
        "calibrate -o MODEL": ("calibrate", link, "--data", cnn_data, "-m", "minmax", "-o",
                               cnn_path),
        "calibrate --save-stats DATA": ("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax",
                                        "-o", tmp_path / "u.cache", "--save-stats", cnn_data),
        "quantize -o TABLE": ("quantize", cnn_path, "--table", table, "-o", table),
        "compare --json DATA": ("compare", "fp32", "int8", "--model", cnn_path, "--data",
                                cnn_data, "--table", table, "--json", cnn_data),
    }[command]  # fmt: skip
    code, _, err = run_cli(*args)
    assert code == 2, err
    assert "is also an input of this command" in err and "choose another output path" in err
    assert {p: p.read_bytes() for p in before} == before


def test_comma_separated_methods_say_how_to_give_several(run_cli, cnn_path, cnn_data, tmp_path):
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax,mse", "-o",
                           tmp_path / "t")  # fmt: skip
    assert code == 2 and "give several with --method repeated" in err


def test_report_of_sensitivity_results_says_what_report_renders(run_cli, tmp_path):
    import json

    doc = {"schema": "quantbench-results", "schema_version": 1, "kind": "sensitivity"}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    code, _, err = run_cli("report", tmp_path / "s.json", "-o", tmp_path / "s.html")
    assert code == 2 and "have no report page" in err and "recover" in err
    # it pointed to "its JSON and CSV": sensitivity has --json and no --csv
    import typer

    from quantbench.cli import app

    options = {
        opt for p in typer.main.get_command(app).commands["sensitivity"].params for opt in p.opts
    }
    assert "--json" in options and "--csv" not in options
    assert "sensitivity prints and writes with --json" in " ".join(err.split())
    assert "csv" not in err.lower()


# --------------------------------------------------------------------------- compare's reference


def test_compare_takes_an_fp32_onnx_a_as_its_reference(run_cli, cnn_path, cnn_data, tmp_path):
    """`compare model.onnx model.int8.onnx --data D`, a newcomer's first try, said only
    "Missing option '--model'": the FP32 file given as A is the reference, and side A is fp32."""
    from quantbench.quantize import quantize

    qdq = tmp_path / "cnn.qdq.onnx"
    quantize(cnn_path, qdq, data=cnn_data, method="minmax", refine="none", show_progress=False)
    out = tmp_path / "c.json"
    code, _, err = run_cli("compare", cnn_path, qdq, "--data", cnn_data, "--json", out,
                           "--no-latency", "--max-samples", "8")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert Path(doc["model"]["path"]).resolve() == Path(cnn_path).resolve()
    assert doc["a"]["spec"] == "fp32" and doc["b"]["op_precisions"].get("int8", 0) > 0
    # B given as the FP32 file: it is the reference and side B is fp32
    code, _, err = run_cli("compare", qdq, cnn_path, "--data", cnn_data, "--json", out,
                           "--no-latency", "--max-samples", "8")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["b"]["spec"] == "fp32" and doc["a"]["op_precisions"].get("int8", 0) > 0


def test_compare_without_a_reference_is_one_line(run_cli, cnn_data, tmp_path):
    code, out, err = run_cli("compare", "fp32", "int8", "--data", cnn_data, "--no-latency")
    assert code == 2
    line = (out + err).strip()
    assert "\n" not in line and "no FP32 reference" in line and "--model" in line, line
