"""recover's default target for a recognizer: the decoded text (ctc_agreement), not its frames.

A CTC recognizer's frames agree at 99.7 % where 1.5 % of its decoded strings differ (captcha
CRNN, measured): frame agreement would call that model recovered at step 0.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.model.graph import open_graph
from quantbench.recovery.evaluation import default_target

STEPS, FEATURES, CLASSES = 16, 8, 6


def _recognizer(ids_input: bool = False, declared: list | None = None, class_head: bool = False):
    """x[N, T, 8] -> MatMul (6 classes) -> Softmax over them: per-frame class scores, as a CRNN
    ends. ``ids_input``: the frames come from token ids through an embedding (a tagger);
    ``declared``: the output's declared shape (ddddocr declares ``[1, seqlen]`` for its
    ``[T, 1, C]``); ``class_head``: a second output of class scores per sample."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["e" if ids_input else "x", "w"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((FEATURES, CLASSES)).astype(np.float32), "w")
    ]
    if ids_input:
        nodes.insert(0, helper.make_node("Gather", ["emb", "x"], ["e"]))
        emb = rng.standard_normal((40, FEATURES)).astype(np.float32)
        inits.append(numpy_helper.from_array(emb, "emb"))
        x = helper.make_tensor_value_info("x", TensorProto.INT64, ["N", STEPS])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", STEPS, FEATURES])
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, declared or ["N", STEPS, CLASSES])
    ]
    if class_head:
        nodes += [
            helper.make_node("ReduceMean", ["m"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("Softmax", ["pooled"], ["cls"], axis=-1),
        ]
        outputs.append(helper.make_tensor_value_info("cls", TensorProto.FLOAT, ["N", CLASSES]))
    graph = helper.make_graph(nodes, "g", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _default(tmp_path, model: onnx.ModelProto) -> str:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return default_target(open_graph(path), None)


def test_a_recognizer_is_judged_by_its_text_a_tagger_by_its_positions(tmp_path):
    assert _default(tmp_path, _recognizer()) == "ctc_agreement=0.99"
    assert _default(tmp_path, _recognizer(ids_input=True)) == "top1_agreement=0.99"
    # a second head of per-sample classes is not a sequence: agreement judges both heads
    assert _default(tmp_path, _recognizer(class_head=True)) == "top1_agreement=0.99"


def _decoded(path: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding, written out: drop a frame equal to the one before, then blanks."""
    out, previous = [], None
    for c in path.tolist():
        if c != previous and c != blank:
            out.append(c)
        previous = c
    return out


def _text_agreement(fp32: str, candidate: str, x: np.ndarray) -> float:
    from conftest import exact_session

    a = exact_session(fp32).run(None, {"x": x})[0].argmax(-1)
    b = exact_session(candidate).run(None, {"x": x})[0].argmax(-1)
    blank = int(np.bincount(a.ravel()).argmax())  # the class FP32's frames pick most often
    return float(np.mean([_decoded(p, blank) == _decoded(q, blank) for p, q in zip(a, b)]))


def test_recover_aims_at_the_text_where_only_the_run_shows_the_sequences(run_cli, tmp_path):
    """The output is declared ``[N, seqlen]`` (as ddddocr's is): the FP32 pass shows
    ``[N, T, C]``, so the default becomes ctc_agreement=0.99, said once, and step 0 (plain
    INT8) scores what a greedy CTC decoder of onnxruntime's outputs gives."""
    path, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(_recognizer(declared=["N", "seqlen"]), path)
    x = np.random.default_rng(3).standard_normal((300, STEPS, FEATURES)).astype(np.float32)
    np.savez(data, x=x)
    out = tmp_path / "rec"
    code, _, err = run_cli(
        "recover", path, "--data", data, "--calib-data", data, "-m", "minmax", "-o", out
    )
    assert code in (0, 1), err
    text = " ".join(err.split())
    assert text.count("target: ctc_agreement=0.99 (the default for this model's outputs") == 1
    assert "top1_agreement=0.99" not in text
    doc = json.loads((out / "m.recovery.json").read_text())["recovery"]
    assert doc["target"] == "ctc_agreement=0.99"
    int8 = tmp_path / "plain.onnx"
    assert run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)[0] == 0
    expected = _text_agreement(str(path), str(int8), x)
    assert 0 < expected < 1  # the data makes INT8 change some strings
    assert doc["steps"][0]["metric"] == pytest.approx(expected)


def _compare_json(run_cli, tmp_path, model: onnx.ModelProto, x: np.ndarray, name: str) -> tuple:
    """FP32 against plain minmax INT8 of ``model`` on ``x``: (results JSON, report HTML, the
    FP32 and INT8 paths)."""
    path, data, int8 = (
        tmp_path / f"{name}.onnx",
        tmp_path / f"{name}.npz",
        tmp_path / f"{name}8.onnx",
    )
    onnx.save(model, path)
    np.savez(data, x=x)
    assert run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)[0] == 0
    out, page = tmp_path / f"{name}.json", tmp_path / f"{name}.html"
    code, _, err = run_cli("compare", "fp32", int8, "--model", path, "--data", data, "--json", out)
    assert code == 0, err
    assert run_cli("report", out, "-o", page)[0] == 0
    return json.loads(out.read_text()), page.read_text(), str(path), str(int8)


def test_a_recognizers_report_leads_with_its_text(run_cli, tmp_path):
    """The verdict card and the headline give the decoded text's agreement first, the frames'
    beside it; a tagger (token ids in) keeps per-position agreement first."""
    x = np.random.default_rng(3).standard_normal((300, STEPS, FEATURES)).astype(np.float32)
    doc, page, fp32, int8 = _compare_json(run_cli, tmp_path, _recognizer(), x, "rec")
    row = doc["outputs"][0]
    expected = _text_agreement(fp32, int8, x)
    assert row["reads_text"] is True and row["ctc_agreement"] == pytest.approx(expected)
    assert 0 < expected < row["agreement"] < 1  # text agrees less often than frames do
    frames = f"{100 * row['agreement']:.2f}%"
    assert f"CTC text agreement {100 * expected:.2f}% on y (frames {frames})" in page
    ids = np.random.default_rng(3).integers(0, 40, (300, STEPS)).astype(np.int64)
    doc, page, _, _ = _compare_json(run_cli, tmp_path, _recognizer(ids_input=True), ids, "tag")
    assert doc["outputs"][0]["reads_text"] is False
    assert "CTC text agreement" not in page and "top-1 agreement" in page
