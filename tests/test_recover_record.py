"""recover's record keeps the metric it was judged on: with ``--target task_accuracy_drop=0.002``
(a metric script's name) the recovery JSON's task section held only ``accuracy`` and its page
said "NO GATE: no thresholds were set". The target is a gate: shown with its value and verdict."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import require_example

from quantbench.backends.onnxruntime import OnnxRuntimeRunner


def _accuracy(model: onnx.ModelProto, images: np.ndarray, labels: np.ndarray) -> float:
    runner = OnnxRuntimeRunner(model)  # the model's batch is 1
    logits = [runner.infer({"image": image[None]})["logits"] for image in images]
    return float(np.mean(np.concatenate(logits).argmax(1) == labels))


@pytest.mark.parametrize("bound,budget,verdict", [(0.002, [], "PASS"), (0.0, ["--budget", "0"],
                                                                          "FAIL")])  # fmt: skip
def test_recover_target_is_a_gate_in_json_and_page(run_cli, tmp_path, bound, budget, verdict):
    ex = require_example()
    out, page = tmp_path / "rec", tmp_path / "rec.html"
    code, _, err = run_cli(
        "recover", ex / "tinycnn.onnx", "--data", ex / "eval.npz", "--calib-data",
        ex / "calib.npz", "--labels", ex / "eval_labels.npy", "--metric-script",
        ex / "metric.py", "--target", f"task_accuracy_drop={bound}", "-o", out, *budget,
        "--report", page,
    )  # fmt: skip
    images, labels = np.load(ex / "eval.npz")["image"], np.load(ex / "eval_labels.npy")
    fp32 = _accuracy(onnx.load(ex / "tinycnn.onnx"), images, labels)
    recovered = _accuracy(onnx.load(out / "tinycnn.recovered.onnx"), images, labels)
    drop = fp32 - recovered
    met = drop <= bound + 1e-9
    assert met == (verdict == "PASS") and code == (0 if met else 1), err
    doc = json.loads((out / "tinycnn.recovery.json").read_text())
    task = doc["task"]["task_accuracy_drop"]
    assert task["A"] == 0.0 and task["B"] == pytest.approx(drop)
    assert doc["task"]["task_accuracy"]["A"] == pytest.approx(fp32)
    assert doc["task"]["task_accuracy"]["B"] == pytest.approx(recovered)
    (gate,) = doc["thresholds"]
    assert gate["metric"] == "task_accuracy_drop" and gate["max"] == bound
    assert gate["value"] == pytest.approx(drop) and gate["passed"] is met
    assert doc["passed"] is met
    html = page.read_text()
    assert "NO GATE" not in html and "No thresholds were set" not in html
    assert f'id="verdict-badge">{verdict}<' in html and 'id="thresholds"' in html
