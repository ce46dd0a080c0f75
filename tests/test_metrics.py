"""Drift/agreement metric definitions against hand-derived numbers, NaN/Inf handling end to end
(issue 16 item 1), metrics for any output rank and user metric scripts (issue 10 item 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import synthetic
from onnx import TensorProto, helper, numpy_helper

from quantbench.backends.onnxruntime import OnnxRuntimeRunner
from quantbench.compare import compare
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    AgreementAccumulator,
    DriftAccumulator,
    agreement_kind,
    model_metrics,
)
from quantbench.evaluate.task_metrics import load_metric_script
from quantbench.recovery.evaluation import parse_target

# --------------------------------------------------------------------------- definitions


def test_drift_metrics_match_hand_sums():
    # a = [1, -2, 0.5, 3], b = [1.1, -2, 0.4, 2]: Σa² = 14.25, Σb² = 9.37, Σab = 11.3,
    # d = a - b = [-0.1, 0, 0.1, 1]: Σd² = 1.02, Σ|d| = 1.2, max |d| = 1; |a| > 1.5 twice
    acc = DriftAccumulator(amax=1.5)
    acc.update(np.array([1.0, -2.0]), np.array([1.1, -2.0]))  # two batches = one pass
    acc.update(np.array([0.5, 3.0]), np.array([0.4, 2.0]))
    m = acc.metrics()
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(14.25 / 1.02), rel=1e-6)
    assert m["cosine"] == pytest.approx(11.3 / math.sqrt(14.25 * 9.37), rel=1e-6)
    assert m["rel_l2"] == pytest.approx(math.sqrt(1.02 / 14.25), rel=1e-6)
    assert m["max_abs"] == pytest.approx(1.0, rel=1e-6)
    assert m["mean_abs"] == pytest.approx(0.3, rel=1e-6)
    assert m["clip_fraction"] == 0.5
    assert acc.nonfinite() == {"fp32": 0, "candidate": 0, "elements": 4}


def test_identical_and_zero_reference_edge_values():
    same = DriftAccumulator()
    same.update(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    assert same.metrics()["sqnr_db"] == math.inf and same.metrics()["cosine"] == 1.0
    zero = DriftAccumulator()
    zero.update(np.zeros(3), np.array([0.0, 1.0, 0.0]))
    assert zero.metrics()["sqnr_db"] == -math.inf and zero.metrics()["rel_l2"] == math.inf


def test_any_nonfinite_value_makes_every_drift_metric_undefined():
    acc = DriftAccumulator()
    acc.update(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, np.nan, 3.0, np.inf]))
    acc.update(np.array([1.0, 2.0]), np.array([1.0, 2.0]))  # later clean batches do not heal it
    assert not acc.defined
    assert set(acc.metrics().values()) == {None}
    assert acc.nonfinite() == {"fp32": 0, "candidate": 2, "elements": 6}
    ref = DriftAccumulator()
    ref.update(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))  # FP32 itself produced NaN
    assert ref.nonfinite() == {"fp32": 1, "candidate": 1, "elements": 2}
    assert ref.metrics()["cosine"] is None


def test_float32_overflow_is_not_mistaken_for_nan():
    # Σa² = 2e40 overflows float32 (max 3.4e38); the values are finite: SQNR 10 log10(2) dB
    acc = DriftAccumulator()
    acc.update(np.array([1e20, 1e20], np.float32), np.array([1e20, 0.0], np.float32))
    assert acc.defined and acc.nonfinite()["candidate"] == 0
    assert acc.metrics()["sqnr_db"] == pytest.approx(10 * math.log10(2), rel=1e-6)


def test_class_agreement_by_hand():
    # argmax A = [1, 0, 2, 5], argmax B = [0, 0, 2, 4]; A's class in B's top 5: all but sample 0
    # (B row 0 ranks class 1 last of 6)
    a = np.zeros((4, 6))
    b = np.zeros((4, 6))
    for row, (ia, ib) in enumerate([(1, 0), (0, 0), (2, 2), (5, 4)]):
        a[row, ia] = 1
        b[row] = np.arange(6) / 10
        b[row, ib] = 1
    b[0, 1] = -1
    acc = AgreementAccumulator()
    acc.update(a, b, labels=np.array([1, 0, 0, 4]))
    assert acc.kind == "class"
    assert acc.metrics() == {
        "agreement": 0.5,
        "top5_agreement": 0.75,
        "sequence_agreement": None,
        "ctc_agreement": None,
        "mask_iou": None,
        "mean_iou": None,
    }
    # labels [1, 0, 0, 4]: A right on samples 0, 1 (2/4); B right on 1, 3 (2/4)
    assert acc.accuracy() == {"A": 0.5, "B": 0.5, "delta": 0.0}
    # the same scores on their first 5 classes: B's top 5 is every class, so top-5 agreement
    # would be 1 whatever B is; it is not defined
    five = AgreementAccumulator()
    five.update(a[:, :5], b[:, :5])
    assert five.metrics()["top5_agreement"] is None
    assert five.metrics()["agreement"] == 0.5


def test_position_agreement_by_hand():
    eye = np.eye(4)
    a = eye[[[0, 1, 2], [3, 3, 0]]]  # (N=2, T=3, C=4)
    b = eye[[[0, 1, 1], [3, 3, 0]]]
    acc = AgreementAccumulator()
    acc.update(a, b)
    assert acc.kind == "position"
    m = acc.metrics()
    assert m["agreement"] == 5 / 6  # 5 of 6 positions
    assert m["sequence_agreement"] == 1 / 2  # sample 1 agrees everywhere, sample 0 does not


def test_nonfinite_scores_make_agreement_and_accuracy_undefined():
    acc = AgreementAccumulator()
    acc.update(np.eye(3), np.array([[1, 0, 0], [0, np.nan, 0], [0, 0, 1.0]]), np.arange(3))
    assert acc.metrics()["agreement"] is None
    assert acc.accuracy() == {"A": 1.0, "B": None, "delta": None}


@pytest.mark.parametrize(
    ("shape", "name", "kind"),
    [
        (("N",), "y", None),
        (("N", 1), "y", None),
        (("N", 10), "y", "class"),
        (("N", 10, 1, 1), "y", "class"),
        (("N", "T", 37), "y", "position"),
        (("N", "T", 1), "y", None),
        (("N", "T", "C"), "y", "unknown"),
        (("N", 100, 4), "boxes", None),
    ],
)
def test_agreement_kind(shape, name, kind):
    got, reason = agreement_kind(shape, name)
    assert got == kind
    assert bool(reason) == (kind != "class" and kind != "position")


def test_model_metrics_take_the_worst_output():
    rows = [
        {"agreement_kind": "class", "agreement": 0.9, "top5_agreement": 1.0, "cosine": 0.99,
         "sqnr_db": "inf"},
        {"agreement_kind": None, "agreement": None, "cosine": 0.5, "sqnr_db": 12.0},
        {"agreement_kind": "position", "agreement": 0.7, "top5_agreement": 0.95,
         "sequence_agreement": 0.2, "cosine": 0.98, "sqnr_db": 20.0},
    ]  # fmt: skip
    m = model_metrics(rows)
    assert m == {
        "top1_agreement": 0.7,
        "top5_agreement": 0.95,
        "sequence_agreement": 0.2,
        "ctc_agreement": None,  # no (N, T, C) output carries one
        "mask_iou": None,  # no output is a probability map
        "mean_iou": None,
        "cosine": 0.5,
        "sqnr_db": 12.0,
    }
    rows[2]["cosine"] = "nan"  # one undefined output makes the model's value undefined
    assert model_metrics(rows)["cosine"] is None
    assert model_metrics(rows[1:2])["top1_agreement"] is None  # no output supports argmax


# --------------------------------------------------------------------------- models


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "m", inputs, outputs, initializer=[numpy_helper.from_array(v, k) for k, v in inits]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def nan_models(tmp_path: Path) -> tuple[Path, Path]:
    """FP32 ``y = x W`` and a candidate ``y = h + 0 * log(relu(h))``: NaN wherever h < 0."""
    w = np.random.default_rng(3).standard_normal((8, 6)).astype(np.float32)
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])]
    y = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])]
    zero = np.zeros((), np.float32)
    clean = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Identity", ["h"], ["y"], name="out"),
        ],
        x,
        y,
        [("w", w)],
    )
    broken = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Log", ["r"], ["l"], name="log"),
            helper.make_node("Mul", ["l", "zero"], ["z"], name="mul"),
            helper.make_node("Add", ["h", "z"], ["y"], name="out"),
        ],
        x,
        y,
        [("w", w), ("zero", zero)],
    )
    return synthetic.save(clean, tmp_path / "clean.onnx"), synthetic.save(
        broken, tmp_path / "broken.onnx"
    )


def test_nan_candidate_fails_the_cosine_gate_and_reports_the_count(run_cli, tmp_path):
    clean, broken = nan_models(tmp_path)
    x = np.random.default_rng(4).standard_normal((20, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x)
    w = numpy_helper.to_array(onnx.load(str(clean)).graph.initializer[0])
    expected = int(np.count_nonzero(x @ w <= 0))  # log(relu(h)) is -inf/NaN there
    assert 0 < expected < x.shape[0] * 6
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(
        "compare", "fp32", broken, "--model", clean, "--data", tmp_path / "eval.npz",
        "--no-latency", "--json", out, "--fail-below", "cosine=0.999",
        "--fail-below", "min_layer_sqnr_db=-100",
    )  # fmt: skip
    assert code == 1, err
    assert "gate missed" in err and "undefined" in err and "NaN/Inf" in err
    doc = json.loads(out.read_text())
    (row,) = doc["outputs"]
    assert row["nonfinite"] == {"fp32": 0, "candidate": expected, "elements": 120}
    assert row["cosine"] == "nan" and row["sqnr_db"] == "nan"
    assert [t["passed"] for t in doc["thresholds"]] == [False, False]
    assert doc["thresholds"][0]["value"] is None and "120" in doc["thresholds"][0]["reason"]
    layers = {r["tensor"]: r for r in doc["layers"] if r["view"] == "accumulated"}
    assert layers["h"]["sqnr_db"] == "inf" and layers["h"]["nonfinite"]["candidate"] == 0
    assert layers["y"]["nonfinite"]["candidate"] == expected
    assert f"{expected} of 120 values NaN/Inf in candidate B" in " ".join((stdout + err).split())


def test_nan_in_fp32_itself_is_named_as_such(tmp_path):
    clean, broken = nan_models(tmp_path)
    np.savez(tmp_path / "eval.npz", x=np.random.default_rng(4).standard_normal((20, 8)))
    doc = compare(
        "fp32", str(clean), model=broken, data=tmp_path / "eval.npz", latency=False,
        fail_below=["sqnr_db=0"], show_progress=False,
    )  # fmt: skip
    (row,) = doc["outputs"]
    assert row["nonfinite"]["fp32"] > 0 and row["nonfinite"]["candidate"] == 0
    assert not doc["passed"] and "in FP32 itself" in doc["thresholds"][0]["reason"]


def sequence_model(tmp_path: Path, name: str, seed: int, noise: float) -> Path:
    """(N, T, 8) -> MatMul -> (N, T, 5) scores, like a CTC head; ``noise`` perturbs W."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    w += noise * np.random.default_rng(seed).standard_normal(w.shape).astype(np.float32)
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", 5])],
        [("w", w)],
    )
    return synthetic.save(model, tmp_path / name)


def test_sequence_output_agreement_per_position_and_whole_sequence(tmp_path):
    fp32 = sequence_model(tmp_path, "fp32.onnx", 0, 0.0)
    cand = sequence_model(tmp_path, "cand.onnx", 1, 0.3)
    x = np.random.default_rng(5).standard_normal((12, 7, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x)
    doc = compare(
        "fp32", str(cand), model=fp32, data=tmp_path / "eval.npz", latency=False,
        show_progress=False, fail_below=["sequence_agreement=0"],
    )  # fmt: skip
    ya = OnnxRuntimeRunner(onnx.load(str(fp32))).infer({"x": x})["logits"].argmax(-1)
    yb = OnnxRuntimeRunner(onnx.load(str(cand))).infer({"x": x})["logits"].argmax(-1)
    per_position = float((ya == yb).mean())
    whole = float((ya == yb).all(axis=1).mean())
    assert 0 < whole < per_position < 1  # the data makes the two differ
    (row,) = doc["outputs"]
    assert row["agreement_kind"] == "position"
    assert row["agreement"] == pytest.approx(per_position, abs=1e-12)
    assert row["sequence_agreement"] == pytest.approx(whole, abs=1e-12)
    assert doc["thresholds"][0]["value"] == pytest.approx(whole, abs=1e-12)


def test_agreement_absent_with_a_reason_where_argmax_means_nothing(run_cli, tmp_path):
    model = _model(
        [helper.make_node("ReduceSum", ["x"], ["score"], name="sum", keepdims=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", 1])],
        [],
    )
    path = synthetic.save(model, tmp_path / "score.onnx")
    np.savez(tmp_path / "eval.npz", x=np.ones((3, 4), np.float32))
    code, out, err = run_cli(
        "compare", "fp32", path, "--model", path, "--data", tmp_path / "eval.npz", "--no-latency"
    )
    assert code == 0, err
    text = " ".join((out + err).split())
    assert "agreement not defined: the class axis (last) has size 1" in text
    # a gate on it is a one-line input error before any inference, not a silent pass or fail
    code, _, err = run_cli(
        "compare", "fp32", path, "--model", path, "--data", tmp_path / "eval.npz",
        "--no-latency", "--fail-below", "top1_agreement=0.9",
    )  # fmt: skip
    assert code == 2 and "not defined for this model" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- metric scripts

FUNCTION_SCRIPT = """
import numpy as np

NAMES = np.array(["cat", "dog", "owl", "fox"])


def metric(fp32, candidate, labels):
    a, b = fp32["logits"].argmax(1), candidate["logits"].argmax(1)
    return {
        "named_accuracy": float((NAMES[b] == labels).mean()),
        "flip_drop": float((a != b).mean()),
        "samples": len(a),
    }
"""

CLASS_SCRIPT = """
import numpy as np


class Agree:
    def __init__(self):
        self.same = 0
        self.total = 0

    def update(self, fp32, candidate, labels):
        self.same += int((fp32["logits"].argmax(1) == candidate["logits"].argmax(1)).sum())
        self.total += len(fp32["logits"])

    def compute(self):
        return {"agree": self.same / self.total}
"""


def _set(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))


@pytest.fixture()
def scripted(tmp_path):
    x = synthetic.images(24, seed=11)
    np.savez(tmp_path / "eval.npz", input=x)
    (tmp_path / "fn.py").write_text(FUNCTION_SCRIPT)
    (tmp_path / "cls.py").write_text(CLASS_SCRIPT)
    base = synthetic.small_cnn()
    _set(base, "fc_b", -OnnxRuntimeRunner(base).infer({"input": x})["logits"].mean(0))
    noisy = onnx.ModelProto()
    noisy.CopyFrom(base)  # the same CNN with a perturbed classifier
    w = numpy_helper.to_array(next(i for i in base.graph.initializer if i.name == "fc_w"))
    _set(noisy, "fc_w", w + 0.5 * np.random.default_rng(7).standard_normal(w.shape))
    model = synthetic.save(base, tmp_path / "base.onnx")
    other = synthetic.save(noisy, tmp_path / "other.onnx")
    ya = OnnxRuntimeRunner(base).infer({"input": x})["logits"].argmax(1)
    yb = OnnxRuntimeRunner(noisy).infer({"input": x})["logits"].argmax(1)
    names = np.array(["cat", "dog", "owl", "fox"])
    labels = names[ya].copy()
    labels[:5] = "eel"  # five labels no model predicts
    np.save(tmp_path / "labels.npy", labels)  # a unicode .npy
    return {
        "model": model,
        "eval": tmp_path / "eval.npz",
        "other": other,
        "labels": tmp_path / "labels.npy",
        "fn": tmp_path / "fn.py",
        "cls": tmp_path / "cls.py",
        "named_b": float((names[yb] == labels).mean()),
        "named_a": float((names[ya] == labels).mean()),
        "flip": float((ya != yb).mean()),
    }


def test_function_metric_script_reaches_json_and_gates(run_cli, scripted, tmp_path):
    cnn_path = scripted["model"]
    assert 0 < scripted["flip"] < 1
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(
        "compare", "fp32", scripted["other"], "--model", cnn_path, "--data", scripted["eval"],
        "--no-latency", "--labels", scripted["labels"], "--metric-script", scripted["fn"],
        "--json", out, "--fail-below", "named_accuracy=0", "--fail-below", "flip_drop=1",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    task = doc["task"]
    assert "accuracy" not in task  # string labels: no built-in accuracy, said once
    assert " ".join((stdout + err).split()).count("accuracy not computed") == 1
    assert task["named_accuracy"]["A"] == pytest.approx(scripted["named_a"])  # 19/24
    assert task["named_accuracy"]["B"] == pytest.approx(scripted["named_b"])
    assert task["flip_drop"] == {"A": 0.0, "B": pytest.approx(scripted["flip"]),
                                 "delta": pytest.approx(scripted["flip"])}  # fmt: skip
    assert task["samples"]["B"] == 24
    assert doc["metric_script"] == f"{scripted['fn']}:metric"
    assert doc["thresholds"][1] == {
        "metric": "flip_drop", "max": 1.0, "value": pytest.approx(scripted["flip"]),
        "passed": True,
    }  # fmt: skip
    # _drop is lower-is-better: a maximum below the value fails (exit 1)
    code, _, err = run_cli(
        "compare", "fp32", scripted["other"], "--model", cnn_path, "--data", scripted["eval"],
        "--no-latency", "--labels", scripted["labels"], "--metric-script", scripted["fn"],
        "--fail-below", f"flip_drop={scripted['flip'] / 2}",
    )  # fmt: skip
    assert code == 1 and "flip_drop" in err


def test_class_metric_script_and_its_gate(scripted):
    cnn_path = scripted["model"]
    doc = compare(
        "fp32", str(scripted["other"]), model=cnn_path, data=scripted["eval"], latency=False,
        metric_script=f"{scripted['cls']}:Agree", fail_below=["agree=1"], show_progress=False,
    )  # fmt: skip
    assert doc["task"]["agree"]["B"] == pytest.approx(1 - scripted["flip"])
    assert doc["task"]["agree"]["A"] == 1.0
    assert not doc["passed"]


@pytest.mark.parametrize(
    ("body", "spec_name", "match"),
    [
        ("def metric(a, b, l):\n    return 1.0\n", "", "dict"),
        ("def metric(a, b, l):\n    raise KeyError('zz')\n", "", "KeyError"),
        ("def metric(a, b, l):\n    return {'cosine': 1.0}\n", "", "built-in"),
        ("def metric(a, b, l):\n    return {'x': 'high'}\n", "", "not a number"),
        ("class M:\n    def update(self, a, b, l): pass\n", ":M", "compute"),
        ("import nosuchmodule_qb\n", "", "on import"),
        ("x = 1\n", ":nope", "defines no 'nope'"),
    ],
)
def test_metric_script_errors_are_one_line_naming_it(run_cli, cnn_path, tmp_path, body,
                                                     spec_name, match):  # fmt: skip
    script = tmp_path / "bad_metric.py"
    script.write_text(body)
    np.savez(tmp_path / "eval.npz", input=synthetic.images(4))
    code, _, err = run_cli(
        "compare", "fp32", cnn_path, "--model", cnn_path, "--data", tmp_path / "eval.npz",
        "--no-latency", "--metric-script", f"{script}{spec_name}",
    )  # fmt: skip
    assert code == 2, err
    assert "bad_metric.py" in err and match in err and len(err.strip().splitlines()) == 1


def test_gate_on_a_name_the_script_does_not_return(scripted):
    cnn_path = scripted["model"]
    with pytest.raises(QuantbenchError, match="returned no 'agre'"):
        compare(
            "fp32", "fp32", model=cnn_path, data=scripted["eval"], latency=False,
            metric_script=f"{scripted['cls']}:Agree", fail_below=["agre=1"], show_progress=False,
        )  # fmt: skip


def test_metric_script_spec_default_name(tmp_path):
    (tmp_path / "m.py").write_text(FUNCTION_SCRIPT)
    assert load_metric_script(tmp_path / "m.py").where.endswith("m.py:metric")


def test_recover_scores_a_sequence_model_per_position(tmp_path):
    """Issue 10 item 2: recover on an (N, T, C) model gets a number, not ``n/a``."""
    from quantbench.recovery import recover

    fp32 = sequence_model(tmp_path, "seq.onnx", 0, 0.0)
    x = np.random.default_rng(6).standard_normal((16, 9, 8)).astype(np.float32)
    np.savez(tmp_path / "seq.npz", x=x)
    result = recover(
        fp32, tmp_path / "seq.npz", tmp_path / "seq.npz", target="sequence_agreement=1", budget=0
    )
    (step,) = result.steps
    ya = OnnxRuntimeRunner(onnx.load(str(fp32))).infer({"x": x})["logits"].argmax(-1)
    yb = OnnxRuntimeRunner(result.final.model).infer({"x": x})["logits"].argmax(-1)
    assert step["metrics"]["top1_agreement"] == pytest.approx(float((ya == yb).mean()))
    assert step["metric"] == pytest.approx(float((ya == yb).all(1).mean()))


def test_example_metric_scripts_agree_with_builtin_accuracy(tmp_path):
    """The bundled example: a function and a class script computing INT8 accuracy from the labels
    give the same number as the built-in accuracy."""
    from conftest import require_example

    ex = require_example()
    (tmp_path / "acc.py").write_text(
        "import numpy as np\n\n\n"
        "def metric(fp32, candidate, labels):\n"
        "    (out,) = candidate.values()\n"
        "    return {'int8_accuracy': float((out.argmax(1) == labels).mean())}\n\n\n"
        "class Acc:\n"
        "    def __init__(self):\n"
        "        self.hits = self.n = 0\n\n"
        "    def update(self, fp32, candidate, labels):\n"
        "        (out,) = candidate.values()\n"
        "        self.hits += int((out.argmax(1) == labels).sum())\n"
        "        self.n += len(labels)\n\n"
        "    def compute(self):\n"
        "        return {'int8_accuracy': self.hits / self.n}\n"
    )
    values = []
    for name in ("metric", "Acc"):
        doc = compare(
            "fp32", "int8", model=ex / "tinycnn.onnx", data=ex / "eval.npz",
            calib_data=ex / "calib.npz", labels=ex / "eval_labels.npy", method="minmax",
            metric_script=f"{tmp_path / 'acc.py'}:{name}", max_samples=128, latency=False,
            show_progress=False, fail_below=["int8_accuracy=0.5"],
        )  # fmt: skip
        assert doc["task"]["int8_accuracy"]["A"] == doc["task"]["accuracy"]["A"]
        assert doc["task"]["int8_accuracy"]["B"] == doc["task"]["accuracy"]["B"]
        assert doc["passed"]
        values.append(doc["task"]["int8_accuracy"]["B"])
    assert values[0] == values[1]


def test_bundled_example_metric_script_drives_recover(run_cli, tmp_path) -> None:
    """examples/tinycnn/metric.py (the README's example) reaches a recover target: its drop is
    recomputed here from the written model's predictions and the labels."""
    example = Path("examples/tinycnn")
    out = tmp_path / "rec"
    code, _, err = run_cli(
        "recover", example / "tinycnn.onnx", "--data", example / "eval.npz",
        "--calib-data", example / "calib.npz", "--labels", example / "eval_labels.npy",
        "--metric-script", example / "metric.py", "--target", "task_accuracy_drop=0.01",
        "-m", "entropy", "--max-samples", "200", "--calib-max-samples", "64", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads((out / "tinycnn.recovery.json").read_text())["recovery"]
    final = doc["steps"][-1]["metrics"]
    x = np.load(example / "eval.npz")
    feeds = x[next(iter(x.keys()))][:200]
    labels = np.load(example / "eval_labels.npy")[:200]

    from conftest import exact_session

    def predictions(model: Path) -> np.ndarray:
        s = exact_session(model)
        name = s.get_inputs()[0].name
        return np.array([s.run(None, {name: feeds[i : i + 1]})[0].argmax() for i in range(200)])

    drop = (predictions(example / "tinycnn.onnx") == labels).mean() - (
        predictions(out / "tinycnn.recovered.onnx") == labels
    ).mean()
    assert final["task_accuracy_drop"] == pytest.approx(drop) and drop <= 0.01


def _scores(paths: list[list[int]], classes: int) -> np.ndarray:
    """(N, T, C) scores whose argmax at every position is the given path."""
    out = np.zeros((len(paths), len(paths[0]), classes), np.float32)
    for n, path in enumerate(paths):
        out[n, np.arange(len(path)), path] = 1.0
    return out


@pytest.mark.parametrize("blank", [0, 3])
def test_ctc_agreement_compares_the_decoded_paths(blank):
    """captcha_crnn: keeping two convolutions in FP32 moved 'every position agrees' from 0.925
    to 0.89 while the decoded text moved from 0.98 to 0.975: flips between a blank and the
    character beside it change no text. By hand (b = blank): FP32 [b 1 1 b 2 b] and INT8
    [b 1 b b 2 2] both read "1 2"; FP32 [b 2 b b b b] reads "2", INT8 [b 2 b 2 b b] "2 2".
    The blank is not assumed: 0 or the last class, it is FP32's most frequent class."""
    b = blank
    fp32 = [[b, 1, 1, b, 2, b], [b, 2, b, b, b, b]]
    int8 = [[b, 1, b, b, 2, 2], [b, 2, b, 2, b, b]]
    acc = AgreementAccumulator(name="logits")
    acc.update(_scores(fp32, 4), _scores(int8, 4))
    m = acc.metrics()
    assert acc.kind == "position"
    assert m["sequence_agreement"] == 0.0  # no sample agrees at every position
    assert m["agreement"] == 9 / 12
    assert m["ctc_agreement"] == 0.5


def test_ctc_agreement_only_for_sequences_and_as_a_target():
    maps = AgreementAccumulator(name="seg")  # (N, H, W, C): positions, but no sequence
    maps.update(np.ones((2, 3, 3, 4), np.float32), np.ones((2, 3, 3, 4), np.float32))
    assert maps.kind == "position" and maps.metrics()["ctc_agreement"] is None
    assert parse_target("ctc_agreement=0.95", has_labels=False).metric == "ctc_agreement"
    with pytest.raises(QuantbenchError, match="fraction"):
        parse_target("ctc_agreement=95", has_labels=False)


def test_sqnr_accumulator_gives_drift_accumulators_sqnr_to_the_bit():
    """auto's lean accumulator keeps exactly DriftAccumulator's two sums (same float32 BLAS,
    same float64 carry), with or without the signal's power given, and is undefined where
    DriftAccumulator is (NaN in the data, a batch whose shapes differ)."""
    from quantbench.evaluate.metrics import DriftAccumulator, SqnrAccumulator, power32

    rng = np.random.default_rng(4)
    drift, lean, given = DriftAccumulator(), SqnrAccumulator(), SqnrAccumulator()
    for size in (17, 4096, 300):
        a = rng.standard_normal(size).astype(np.float32) * 3
        b = a + rng.standard_normal(size).astype(np.float32) * 0.01
        drift.update(a, b)
        lean.update(a, b)
        given.update(a, b, power32(a))
    assert lean.sum_aa == drift.sum_aa and lean.sum_dd == drift.sum_dd
    assert lean.sqnr_db() == given.sqnr_db() == drift.metrics()["sqnr_db"]
    lean.update(np.array([1.0, np.nan], np.float32), np.zeros(2, np.float32))
    assert math.isnan(lean.sqnr_db())
    shaped = SqnrAccumulator()
    shaped.update(np.ones(3, np.float32), np.ones(4, np.float32))
    assert math.isnan(shaped.sqnr_db())
    assert math.isnan(SqnrAccumulator().sqnr_db())
