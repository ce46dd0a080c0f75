"""Mean IoU of class maps (segmentation): per class, the pixels FP32 and the candidate both
give it over those either gives it, averaged over the classes present; what the field reads
where per-pixel agreement is dominated by the background. Expected values by hand, or from
numpy on onnxruntime's own outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from quantbench.evaluate.metrics import (
    AgreementAccumulator,
    declared_output_kinds,
    declared_support,
    metric_support,
    model_metrics,
)

A = np.array([[0, 1], [2, 2]])
B = np.array([[0, 1], [1, 2]])
# class 0: 1 / 1; class 1: 1 / (1 + 2 - 1); class 2: 1 / (2 + 1 - 1): mean (1 + 0.5 + 0.5) / 3
BY_HAND = 2 / 3


def _one_hot(classes: np.ndarray, count: int = 3) -> np.ndarray:
    """[H, W] class ids -> [1, count, H, W] scores whose argmax over axis 1 is that id."""
    return (np.eye(count)[classes].transpose(2, 0, 1)[None] * 10).astype(np.float32)


def test_mean_iou_of_a_score_map_by_hand():
    acc = AgreementAccumulator(name="seg", channels_first=True)
    acc.update(_one_hot(A), _one_hot(B))
    m = acc.metrics()
    assert acc.kind == "position"
    assert m["mean_iou"] == pytest.approx(BY_HAND)
    assert m["agreement"] == pytest.approx(3 / 4)  # the per-pixel agreement it complements
    assert acc.iou_classes() == 3


def test_mean_iou_of_a_class_id_map_by_hand():
    acc = AgreementAccumulator(name="ids", exact=True)
    acc.update(A[None], B[None], batch=1)
    assert acc.metrics()["mean_iou"] == pytest.approx(BY_HAND)
    many = AgreementAccumulator(name="ids", exact=True)  # ids beyond a segmentation's classes
    many.update(np.full((1, 2, 2), 5000), np.full((1, 2, 2), 5000), batch=1)
    assert many.metrics()["mean_iou"] is None and many.iou_classes() is None
    tokens = AgreementAccumulator(name="tok", exact=True)  # [N, T] ids: a sequence, no map
    tokens.update(np.array([[1, 2, 3]]), np.array([[1, 2, 3]]), batch=1)
    assert tokens.metrics()["mean_iou"] is None


def test_the_model_is_judged_by_its_worst_class_map():
    rows = [
        {"iou_classes": 3, "mean_iou": 0.8, "cosine": 1.0, "sqnr_db": 30.0},
        {"iou_classes": 5, "mean_iou": 0.6, "cosine": 1.0, "sqnr_db": 30.0},
        {"iou_classes": None, "mean_iou": None, "cosine": 1.0, "sqnr_db": 30.0},
    ]
    assert model_metrics(rows)["mean_iou"] == 0.6


def _segmenter(classes: int = 4) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv(3->classes) -> Softmax over the channels -> y[N,classes,8,8]."""
    from test_metrics_layout import _conv_model

    return _conv_model(classes, ["Softmax"], ["N", classes, 8, 8])


def test_a_segmenter_is_a_class_map_and_others_are_told_what_they_define():
    seg = _segmenter()
    assert declared_support(seg).class_maps == {"y"}
    kinds = declared_output_kinds(seg)
    assert metric_support("mean_iou", kinds, None, (), declared_support(seg).class_maps) == ""
    classifier = _segmenter()
    classifier.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    )
    kinds = declared_output_kinds(classifier)
    reason = metric_support("mean_iou", kinds, None, declared_support(classifier).masks,
                            declared_support(classifier).class_maps)  # fmt: skip
    assert "no output is a class map" in reason


def test_compare_reports_and_gates_the_mean_iou(run_cli, tmp_path):
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "c.json"
    onnx.save(_segmenter(), path)
    x = np.random.default_rng(1).standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.savez(data, x=x)
    int8 = tmp_path / "q.onnx"
    assert run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)[0] == 0
    a = ort.InferenceSession(str(path)).run(None, {"x": x})[0].argmax(axis=1)
    b = ort.InferenceSession(str(int8)).run(None, {"x": x})[0].argmax(axis=1)
    ious = [((a == c) & (b == c)).sum() / ((a == c) | (b == c)).sum() for c in range(4)
            if ((a == c) | (b == c)).any()]  # fmt: skip
    expected = float(np.mean(ious))
    assert expected < 1.0  # the test needs a map INT8 changed
    html = tmp_path / "r.html"
    code, stdout, err = run_cli("compare", "fp32", int8, "--model", path, "--data", data,
                           "--no-latency", "--json", out, "--report", html)  # fmt: skip
    assert code == 0, err
    row = json.loads(out.read_text())["outputs"][0]
    assert row["mean_iou"] == pytest.approx(expected) and row["iou_classes"] == len(ious)
    assert "mIoU" in " ".join((stdout + err).split()) and "mIoU" in html.read_text()
    assert f"mean IoU {expected * 100:.2f}% on y" in html.read_text()  # the headline
    gate = ["--model", path, "--data", data, "--no-latency", "--fail-below"]
    assert run_cli("compare", "fp32", int8, *gate, f"mean_iou={expected + 0.01}")[0] == 1
    assert run_cli("compare", "fp32", int8, *gate, f"mean_iou={expected - 0.01}")[0] == 0


def test_a_class_map_defines_no_ctc_agreement():
    """ctc_agreement is computed for (N, T, C) sequences only; a segmentation map's positions
    were listed as defining it (inspect, "defined for it")."""
    seg = _segmenter()
    kinds, maps = declared_output_kinds(seg), declared_support(seg).class_maps
    assert "no output has per-position scores (N, T, C)" in metric_support(
        "ctc_agreement", kinds, None, (), maps
    )
    assert metric_support("sequence_agreement", kinds, None, (), maps) == ""
