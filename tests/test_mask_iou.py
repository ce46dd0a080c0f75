"""Mask IoU: the agreement of a Sigmoid's probability map (a text detector's, a segmentation
model's, a multi-label classifier's, a transcriber's posteriorgram), where argmax means nothing
and per-element agreement would count the background. Expected values are worked out by hand or
computed here with numpy from onnxruntime's own outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.evaluate.metrics import (
    AgreementAccumulator,
    OutputLayout,
    declared_output_kinds,
    declared_support,
    metric_support,
    model_metrics,
)


def _map_model(tail: str | None = "Sigmoid", channels: int = 1) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv(3->channels) -> ``tail`` -> y[N,channels,8,8]."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.5
    last = "y" if tail is None else "c"
    nodes = [helper.make_node("Conv", ["x", "w"], [last], pads=[1, 1, 1, 1])]
    if tail is not None:
        nodes.append(helper.make_node(tail, ["c"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_mask_iou_pools_the_decisions_of_every_sample():
    """Batch 1: A above 0.5 at {0, 2}, B at {0, 1}: both 1, either 3. Batch 2: A at {1, 3}, B at
    {1, 3}: both 2, either 2. Pooled: 3 / 5 (a per-batch mean would say 0.67)."""
    acc = AgreementAccumulator(name="m", probability=True)
    acc.update(
        np.array([[0.9, 0.2, 0.7, 0.1]], np.float32), np.array([[0.6, 0.6, 0.4, 0.1]], np.float32)
    )
    acc.update(
        np.array([[0.1, 0.8, 0.3, 0.99]], np.float32), np.array([[0.2, 0.7, 0.5, 0.51]], np.float32)
    )
    assert acc.metrics()["mask_iou"] == pytest.approx(3 / 5)
    assert acc.kind == "class"  # [N, 4] scores keep their argmax agreement beside it
    assert acc.metrics()["agreement"] == 0.5  # argmax 0 vs 0, 3 vs 1


def test_mask_iou_is_undefined_without_decisions_or_with_nan():
    empty = AgreementAccumulator(name="m", probability=True, channels_first=True)
    low = np.full((2, 1, 4, 4), 0.1, np.float32)
    empty.update(low, low)
    assert empty.metrics()["mask_iou"] is None  # nothing above 0.5 anywhere: nothing checked
    assert "mask IoU undefined: no value above 0.5 on either side" in empty.note()
    nan = AgreementAccumulator(name="m", probability=True, channels_first=True)
    bad = np.full((2, 1, 4, 4), 0.9, np.float32)
    bad[0, 0, 0, 0] = np.nan
    nan.update(np.full((2, 1, 4, 4), 0.9, np.float32), bad)
    assert nan.metrics()["mask_iou"] is None
    assert "mask IoU undefined" not in nan.note()  # the NaN is the reason, said elsewhere


def test_only_sigmoid_maps_are_masks():
    assert declared_support(_map_model("Sigmoid")).masks == {"y"}
    assert declared_support(_map_model("Relu")).masks == frozenset()
    assert declared_support(_map_model(None)).masks == frozenset()
    one = AgreementAccumulator(name="p", probability=True)  # one decision per sample: no map
    one.update(np.array([[0.7], [0.2]], np.float32), np.array([[0.6], [0.6]], np.float32))
    assert one.kind == "decision" and one.metrics()["mask_iou"] is None
    layout = OutputLayout(unbatched=True, probabilities=frozenset({"y"}))
    assert layout.mask((8, 8), "y") and not layout.mask((1,), "y")


def test_the_model_is_judged_by_its_worst_map():
    rows = [
        {"mask_threshold": 0.5, "mask_iou": 0.9, "cosine": 1.0, "sqnr_db": 30.0},
        {"mask_threshold": 0.5, "mask_iou": 0.7, "cosine": 1.0, "sqnr_db": 30.0},
        {"mask_threshold": None, "mask_iou": None, "cosine": 1.0, "sqnr_db": 30.0},
    ]
    assert model_metrics(rows)["mask_iou"] == 0.7
    rows[0]["mask_iou"] = "nan"  # one undefined map: the model's value is undefined
    assert model_metrics(rows)["mask_iou"] is None


def test_metric_support_names_what_is_defined_instead():
    sigmoid, plain = _map_model("Sigmoid"), _map_model(None)
    kinds = declared_output_kinds(sigmoid)
    assert metric_support("mask_iou", kinds, None, declared_support(sigmoid).masks) == ""
    reason = metric_support("top1_agreement", kinds, None, declared_support(sigmoid).masks)
    assert reason.endswith("defined for it: mask_iou, cosine, sqnr_db")
    reason = metric_support("mask_iou", declared_output_kinds(plain), None, frozenset())
    assert "no output holds probabilities a Sigmoid made" in reason
    assert reason.endswith("defined for it: cosine, sqnr_db")


def _files(tmp_path, model: onnx.ModelProto, samples: int = 24):
    path, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((samples, 3, 8, 8)).astype(np.float32)
    np.savez(data, x=x)
    return path, data, x


def _iou_by_onnxruntime(fp32: str, candidate: str, x: np.ndarray, at: float = 0.5) -> float:
    a = ort.InferenceSession(fp32).run(None, {"x": x})[0] > at
    b = ort.InferenceSession(candidate).run(None, {"x": x})[0] > at
    return float((a & b).sum() / (a | b).sum())


def test_compare_reports_and_gates_the_mask_iou(run_cli, tmp_path):
    path, data, x = _files(tmp_path, _map_model("Sigmoid"))
    int8, out, html = tmp_path / "q.onnx", tmp_path / "c.json", tmp_path / "r.html"
    code, _, err = run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)
    assert code == 0, err
    expected = _iou_by_onnxruntime(str(path), str(int8), x)
    assert 0.5 < expected < 1.0  # the test needs a mask that INT8 changed, but not wholly
    args = ["--model", path, "--data", data, "--no-latency", "--json", out, "--report", html]
    code, stdout, err = run_cli("compare", "fp32", int8, *args)
    assert code == 0, err
    row = json.loads(out.read_text())["outputs"][0]
    assert row["mask_iou"] == pytest.approx(expected)
    assert row["mask_threshold"] == 0.5 and row["agreement"] is None
    assert "mask IoU (decisions at 0.5), cosine and SQNR stand" in " ".join((stdout + err).split())
    decided = int((ort.InferenceSession(str(path)).run(None, {"x": x})[0] > 0.5).sum())
    assert row["mask_decisions"]["fp32"] == decided
    assert row["mask_decisions"]["values"] == x.shape[0] * 8 * 8
    assert f"mask y (B), decisions at 0.5: FP32 {decided:,}," in " ".join((stdout + err).split())
    page = html.read_text()
    assert "Mask IoU" in page and f"{expected * 100:.2f}%" in page
    assert f'title="decisions at 0.5: FP32 {decided:,}, B ' in page
    gate = ["--model", path, "--data", data, "--no-latency", "--fail-below"]
    code, stdout, err = run_cli("compare", "fp32", int8, *gate, f"mask_iou={expected + 0.01}")
    assert code == 1, err
    code, stdout, err = run_cli("compare", "fp32", int8, *gate, f"mask_iou={expected - 0.01}")
    assert code == 0, err
    at_03 = _iou_by_onnxruntime(str(path), str(int8), x, at=0.3)
    assert at_03 != pytest.approx(expected)  # the threshold matters on this map
    code, stdout, err = run_cli("compare", "fp32", int8, *args, "--mask-threshold", "0.3")
    assert code == 0, err
    row = json.loads(out.read_text())["outputs"][0]
    assert row["mask_iou"] == pytest.approx(at_03) and row["mask_threshold"] == 0.3
    code, stdout, err = run_cli("compare", "fp32", int8, *args, "--mask-threshold", "1")
    assert code == 2 and "--mask-threshold 1: a probability map's decision threshold" in err


def test_a_mask_gate_on_a_model_without_one_says_what_is_defined(run_cli, tmp_path):
    path, data, _ = _files(tmp_path, _map_model(None))
    code, stdout, err = run_cli(
        "compare", "fp32", "int8", "--model", path, "--data", data, "--calib-data", data,
        "--fail-below", "mask_iou=0.9",
    )  # fmt: skip
    assert code == 2
    assert "no output holds probabilities a Sigmoid made" in err
    assert "defined for it: cosine, sqnr_db" in " ".join((stdout + err).split())


def test_recover_aims_at_the_mask_by_default_and_sensitivity_ranks_by_it(run_cli, tmp_path):
    path, data, x = _files(tmp_path, _map_model("Sigmoid"))
    common = ["--data", data, "--calib-data", data, "-m", "minmax"]
    rec = ["-o", tmp_path / "rec", "--mask-threshold", ".3"]
    code, _, err = run_cli("recover", path, *common, *rec)
    assert code in (0, 1), err
    assert "target: mask_iou=0.99 (the default for this model's outputs" in " ".join(err.split())
    doc = json.loads((tmp_path / "rec" / "m.recovery.json").read_text())
    assert doc["recovery"]["target"] == "mask_iou=0.99"
    assert doc["recovery"]["mask_threshold"] == 0.3
    page = tmp_path / "rec.html"
    assert run_cli("report", tmp_path / "rec" / "m.recovery.json", "-o", page)[0] == 0
    assert "mask_iou=0.99 (decisions at 0.3)" in page.read_text()
    step0 = doc["recovery"]["steps"][0]["metric"]
    int8 = tmp_path / "plain.onnx"  # step 0 is plain INT8: the same IoU as onnxruntime's
    assert run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)[0] == 0
    assert step0 == pytest.approx(_iou_by_onnxruntime(str(path), str(int8), x, at=0.3))
    out = tmp_path / "s.json"
    code, _, err = run_cli("sensitivity", path, *common, "--metric", "mask_iou", "--json", out)
    assert code == 0, err
    rows = json.loads(out.read_text())["rows"]
    values = [r[view]["mask_iou"] for r in rows for view in ("only_quantized", "only_fp32")]
    assert values and all(0.0 <= v <= 1.0 for v in values)


def test_recover_without_a_default_target_asks_for_one(run_cli, tmp_path):
    path, data, _ = _files(tmp_path, _map_model(None))
    code, _, err = run_cli(
        "recover", path, "--data", data, "--calib-data", data, "-o", tmp_path / "rec"
    )
    assert code == 2
    text = " ".join(err.split())
    assert "give --target METRIC=VALUE (e.g. sqnr_db=30)" in text
    assert "defined for it: cosine, sqnr_db" in text
    assert not (tmp_path / "rec").exists()


def test_a_map_stays_a_probability_map_through_moves_and_resizes():
    """A segmentation head upsampled after its Sigmoid, then moved to NHWC, is still a map of
    probabilities; a Sigmoid scaled afterwards is not."""
    cases = ((["Resize", "Transpose"], ["N", 16, 16, 1], True), (["Mul"], ["N", 1, 8, 8], False))
    for tail, shape, is_map in cases:
        model = _map_model("Sigmoid")
        y = model.graph.node[-1]
        y.output[0] = "s"
        inputs = {
            "Resize": ["{}", "", "scales"],
            "Transpose": ["{}"],
            "Mul": ["{}", "two"],
        }
        attrs = {"Transpose": {"perm": [0, 2, 3, 1]}}
        last = "s"
        for i, op in enumerate(tail):
            out = "y" if i == len(tail) - 1 else f"t{i}"
            ins = [name.format(last) for name in inputs[op]]
            model.graph.node.append(helper.make_node(op, ins, [out], **attrs.get(op, {})))
            last = out
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
                numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            ]
        )
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, shape))
        assert (declared_support(model).masks == {"y"}) is is_map, tail


def test_inspect_says_how_the_outputs_can_be_judged(run_cli, tmp_path):
    cases = (("Sigmoid", ["mask_iou", "cosine", "sqnr_db"]), (None, ["cosine", "sqnr_db"]))
    for tail, metrics in cases:
        path = tmp_path / f"{tail}.onnx"
        onnx.save(_map_model(tail), path)
        code, out, err = run_cli("inspect", path, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["output_metrics"] == metrics
        assert doc["output_agreement"]["y"]["mask"] is (tail == "Sigmoid")
        assert "one channel" in doc["output_agreement"]["y"]["reason"]
        code, stdout, err = run_cli("inspect", path)
        assert "judged by (compare --fail-below, sensitivity --metric, recover --target): " + (
            ", ".join(metrics)
        ) in " ".join((stdout + err).split())


def test_a_detectors_class_scores_are_judged_by_their_decisions(tmp_path):
    """A YOLOv8-like head joins boxes and Sigmoid class scores: the scores' part gets a mask
    IoU, and a detector whose FP32 decides 3 anchor-classes and whose INT8 loses one and
    invents another agrees on 2 of 4 (by hand), resting on 3 and 3 decisions of 32 values."""
    from test_metrics_layout import _detector_head

    from quantbench.evaluate.metrics import OutputsAccumulator
    from quantbench.model.graph import open_graph
    from quantbench.recovery.evaluation import default_target

    model = _detector_head()
    scores = np.full((2, 2, 8), 0.1, np.float32)
    scores[0, 0, 0], scores[0, 1, 3], scores[1, 0, 5] = 0.9, 0.8, 0.7
    changed = scores.copy()
    changed[1, 0, 5], changed[1, 1, 1] = 0.3, 0.6
    boxes = np.full((2, 4, 8), 100.0, np.float32)
    a, b = np.concatenate([boxes, scores], 1), np.concatenate([boxes + 1, changed], 1)
    acc = OutputsAccumulator(["y"], layout=OutputLayout.of(model))
    acc.update({"y": a}, {"y": b})
    rows = acc.rows()
    part = rows["y[4:6 on axis 1]"]
    assert part["mask_iou"] == pytest.approx(0.5) and part["mask_threshold"] == 0.5
    assert part["mask_decisions"] == {"fp32": 3, "candidate": 3, "both": 2, "values": 32}
    assert rows["y"]["mask_threshold"] is None  # boxes and scores together are no map
    assert rows["y[0:4 on axis 1]"]["mask_threshold"] is None
    assert acc.model_metrics()["mask_iou"] == pytest.approx(0.5)
    assert declared_support(model).masks == {"y"}
    path = tmp_path / "head.onnx"
    onnx.save(model, path)
    assert default_target(open_graph(path), None) == "mask_iou=0.99"


def test_a_mask_target_fp32_never_decides_says_so(run_cli, tmp_path):
    """Every probability is 0.5 (a zero convolution): nothing is above 0.6 in FP32 itself, so
    no candidate can be judged by mask IoU; recover says that in one line, before any variant."""
    model = _map_model("Sigmoid")
    model.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.zeros((1, 3, 3, 3), np.float32), "w")
    )
    path, data, _ = _files(tmp_path, model)
    code, _, err = run_cli("recover", path, "--data", data, "--calib-data", data, "-m", "minmax",
                           "--mask-threshold", "0.6", "-o", tmp_path / "rec")  # fmt: skip
    assert code == 2
    text = " ".join(err.split())
    assert "--target mask_iou: undefined on this data: no value of FP32's probability" in text
    assert "above 0.6; --mask-threshold sets the model's own threshold" in text
