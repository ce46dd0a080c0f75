"""``--labels`` given as a ``.npz``: compare, sensitivity and recover died with exit 3
(``'NpzFile' object has no attribute 'ndim'``). A one-array ``.npz`` is its array; one with
several arrays is one line naming the file and the arrays it holds."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from quantbench.backends.onnxruntime import OnnxRuntimeRunner


def test_one_array_npz_labels_score_accuracy(run_cli, cnn_path, cnn_data, tmp_path):
    images = np.load(cnn_data)["input"][:8]
    (logits,) = OnnxRuntimeRunner(onnx.load(cnn_path)).infer({"input": images}).values()
    labels = tmp_path / "labels.npz"
    np.savez(labels, y=logits.argmax(1).astype(np.int64))  # FP32's own answers: accuracy 1
    out = tmp_path / "r.json"
    code, _, err = run_cli(
        "compare", "fp32", cnn_path, "--model", cnn_path, "--data", cnn_data, "--labels", labels,
        "--max-samples", "8", "--no-latency", "--json", out,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out.read_text())["task"]["accuracy"]["A"] == 1.0


@pytest.mark.parametrize("command", ["compare", "sensitivity", "recover"])
def test_several_array_npz_labels_name_the_arrays(run_cli, cnn_path, cnn_data, tmp_path, command):
    labels = tmp_path / "labels.npz"
    np.savez(labels, y=np.zeros(40, np.int64), ids=np.arange(40))
    args = {
        "compare": ("compare", "fp32", cnn_path, "--model", cnn_path, "--no-latency"),
        "sensitivity": ("sensitivity", cnn_path, "--calib-data", cnn_data),
        "recover": ("recover", cnn_path, "--calib-data", cnn_data, "-o", tmp_path / "rec"),
    }[command]
    code, _, err = run_cli(*args, "--data", cnn_data, "--labels", labels)
    line = " ".join(err.split())
    assert code == 2, err
    assert str(labels) in line and "y, ids" in line and "one array" in line
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rec").exists()
