"""Integer and bool outputs (class ids an ArgMax made, token ids, NonZero/NMS indices) are
labels, not measurements: compare checks them value by value and never reports a cosine or SQNR
of class numbers; an output whose size varies with the data (NonZero, NMS) is told, not a crash.
Expected values are worked out by hand or with numpy from onnxruntime's own outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.choose.autocalib import judge_description
from quantbench.evaluate.metrics import (
    AgreementAccumulator,
    DriftAccumulator,
    OutputLayout,
    OutputsAccumulator,
    declared_output_kinds,
    metric_support,
    model_metrics,
)
from quantbench.evaluate.outputaxes import value_free_outputs


def _argmax_model(with_probabilities: bool = True) -> onnx.ModelProto:
    """x[N,6,16] -> MatMul(16->10) -> ArgMax -> ids int64[N,6] (and Softmax -> prob[N,6,10])."""
    w = np.random.default_rng(0).standard_normal((16, 10)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
    ]
    outputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])]
    if with_probabilities:
        outputs.append(helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 6, 10]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 16])],
        outputs,
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _nonzero_model(threshold: float) -> onnx.ModelProto:
    """x -> MatMul -> Sigmoid -> p; NonZero(p > threshold) -> idx int64[3, K]: K varies."""
    w = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["p"]),
        helper.make_node("Greater", ["p", "t"], ["g"]),
        helper.make_node("NonZero", ["g"], ["idx"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 16])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [3, "K"])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(threshold, np.float32), "t"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_integers_agree_value_by_value_and_sample_by_sample():
    """[[1,2,3],[4,5,6]] vs [[1,2,0],[4,5,6]]: 5 of 6 values, 1 of 2 samples."""
    acc = AgreementAccumulator(name="ids", exact=True)
    acc.update(np.array([[1, 2, 3], [4, 5, 6]]), np.array([[1, 2, 0], [4, 5, 6]]), batch=2)
    m = acc.metrics()
    assert acc.kind == "exact"
    assert m["agreement"] == pytest.approx(5 / 6) and m["sequence_agreement"] == 0.5
    assert m["top5_agreement"] is None and m["ctc_agreement"] is None
    assert "compared exactly" in acc.note()
    labels = AgreementAccumulator(name="label", exact=True)  # one class id per sample
    labels.update(np.array([1, 2, 3]), np.array([1, 0, 3]), np.array([1, 2, 2]), batch=3)
    assert labels.metrics()["agreement"] == pytest.approx(2 / 3)
    assert labels.metrics()["sequence_agreement"] is None  # one value per sample: no sequence
    assert labels.accuracy() == {"A": pytest.approx(2 / 3), "B": pytest.approx(1 / 3),
                                 "delta": pytest.approx(-1 / 3)}  # fmt: skip


def test_a_batch_whose_shapes_differ_agrees_nowhere():
    """Batch 1: 6 equal values; batch 2: [3, 4] vs [3, 5], 15 values that cannot pair up:
    6 of 21 agree. The drift of such a float tensor is undefined, never an exception."""
    acc = AgreementAccumulator(name="idx", exact=True)
    acc.update(np.ones((3, 2), np.int64), np.ones((3, 2), np.int64), batch=8)
    acc.update(np.ones((3, 4), np.int64), np.ones((3, 5), np.int64), batch=8)
    assert acc.metrics()["agreement"] == pytest.approx(6 / 21)
    assert acc.metrics()["sequence_agreement"] is None  # axis 0 is not the samples
    assert "differed between FP32 and the candidate on 1 batch(es)" in acc.note()
    drift = DriftAccumulator()
    drift.update(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))
    drift.update(np.ones((3, 4), np.float32), np.ones((2, 4), np.float32))
    assert drift.mismatched == 1 and drift.metrics()["cosine"] is None


def test_the_model_cosine_and_sqnr_are_its_float_outputs():
    rows = [
        {"agreement_kind": "exact", "agreement": 0.9, "cosine": None, "sqnr_db": None},
        {"agreement_kind": "class", "agreement": 0.95, "cosine": 0.99, "sqnr_db": 30.0},
    ]
    m = model_metrics(rows)
    assert m["top1_agreement"] == 0.9 and m["cosine"] == 0.99 and m["sqnr_db"] == 30.0
    kinds = declared_output_kinds(_argmax_model(with_probabilities=False))
    assert kinds["ids"][0] == "exact"
    reason = metric_support("sqnr_db", kinds, None)
    assert "every output holds integers" in reason
    assert reason.endswith("defined for it: top1_agreement, sequence_agreement")
    assert metric_support("top1_agreement", kinds, None) == ""
    assert judge_description(_argmax_model(False)) == (
        "worst integer output's share of changed values, in dB"
    )
    assert judge_description(_argmax_model(True)) == "worst float output's SQNR"


def _save(tmp_path, model: onnx.ModelProto, name: str = "m.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _data(tmp_path, samples: int = 40):
    x = np.random.default_rng(1).standard_normal((samples, 6, 16)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    return tmp_path / "d.npz", x


def test_compare_checks_class_ids_exactly(run_cli, tmp_path):
    path = _save(tmp_path, _argmax_model())
    data, x = _data(tmp_path)
    int8, out = tmp_path / "q.onnx", tmp_path / "c.json"
    assert run_cli("quantize", path, "--data", data, "-m", "minmax", "-o", int8)[0] == 0
    code, stdout, err = run_cli("compare", "fp32", int8, "--model", path, "--data", data,
                           "--no-latency", "--json", out, "--batch-size", "8",
                           "--report", tmp_path / "r.html")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    ids = next(o for o in doc["outputs"] if o["name"] == "ids")
    page = (tmp_path / "r.html").read_text()
    assert f"exact agreement {ids['agreement'] * 100:.2f}% on ids" in page
    a = ort.InferenceSession(str(path)).run(["ids"], {"x": x})[0]
    b = ort.InferenceSession(str(int8)).run(["ids"], {"x": x})[0]
    assert ids["agreement"] == pytest.approx(float((a == b).mean()))
    assert ids["sequence_agreement"] == pytest.approx(float((a == b).all(axis=1).mean()))
    assert ids["cosine"] is None and ids["sqnr_db"] is None and ids["agreement_kind"] == "exact"
    assert "integers: compared exactly" in " ".join((stdout + err).split())
    prob = next(o for o in doc["outputs"] if o["name"] == "prob")
    gate = f"cosine={prob['cosine'] - 1e-6}"
    code, stdout, err = run_cli("compare", "fp32", int8, "--model", path, "--data", data,
                           "--no-latency", "--fail-below", gate)  # fmt: skip
    assert code == 0, err  # the model's cosine is prob's, not a cosine of class numbers


def test_a_variable_size_output_is_told_not_a_crash(run_cli, tmp_path):
    """NonZero of a thresholded map: a candidate that decides more elements returns more
    indices. compare stopped with an internal error (ValueError: shape mismatch)."""
    path = _save(tmp_path, _nonzero_model(0.5))
    other = _save(tmp_path, _nonzero_model(0.45), "other.onnx")
    data, x = _data(tmp_path)
    out = tmp_path / "c.json"
    code, stdout, err = run_cli("compare", "fp32", other, "--model", path, "--data", data,
                           "--no-latency", "--json", out, "--batch-size", "8")  # fmt: skip
    assert code == 0, err
    row = json.loads(out.read_text())["outputs"][0]
    same = total = mismatched = 0
    for start in range(0, len(x), 8):  # the same batches, by hand
        feed = {"x": x[start : start + 8]}
        a = ort.InferenceSession(str(path)).run(None, feed)[0]
        b = ort.InferenceSession(str(other)).run(None, feed)[0]
        if a.shape == b.shape:
            same, total = same + int((a == b).sum()), total + a.size
        else:
            mismatched, total = mismatched + 1, total + max(a.size, b.size)
    assert mismatched > 0  # the test needs batches of different sizes
    assert row["agreement"] == pytest.approx(same / total)
    assert row["shape_mismatches"] == mismatched
    assert f"differed between FP32 and the candidate on {mismatched} batch(es)" in " ".join(
        (stdout + err).split()
    )


def test_compare_judges_a_float_output_of_varying_size_on_what_it_chose_from(run_cli, tmp_path):
    """vals = p[p > 0.5]: its own drift is undefined where the lengths differ; p, the Sigmoid
    the NonZero read, is compared beside it and is what the model's SQNR gate reads."""
    path = _save(tmp_path, _gathered_model())
    data, _ = _data(tmp_path, samples=400)
    out = tmp_path / "c.json"
    code, stdout, err = run_cli("compare", "fp32", "int8", "--model", path, "--data", data,
                           "--calib-data", data, "-m", "minmax", "--no-latency", "--json", out,
                           "--fail-below", "sqnr_db=10")  # fmt: skip
    assert code == 0, err
    rows = {o["name"]: o for o in json.loads(out.read_text())["outputs"]}
    assert rows["vals"]["judged_on"] == ["p"] and rows["vals"]["shape_mismatches"] > 0
    assert rows["p"]["sqnr_db"] > 10
    assert "its drift is judged on p, what it chose from" in " ".join((stdout + err).split())


def test_sensitivity_and_auto_rank_an_integer_only_model_by_its_changed_values(run_cli, tmp_path):
    path = _save(tmp_path, _argmax_model(with_probabilities=False))
    data, _ = _data(tmp_path)
    out = tmp_path / "s.json"
    code, _, err = run_cli("sensitivity", path, "--data", data, "--calib-data", data,
                           "--json", out)  # fmt: skip
    assert code == 0, err
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["ranked_by"] == "top1_agreement"
    assert "top1_agreement: only this op INT8" in err
    code, _, err = run_cli("calibrate", path, "--data", data, "-o", tmp_path / "t.cache")
    assert code == 0, err
    assert "worst integer output's share of changed values, in dB" in " ".join(err.split())
    assert "-inf" not in err  # every candidate got a score


def _gathered_model() -> onnx.ModelProto:
    """p = Sigmoid(MatMul(Relu(MatMul(x)))); vals = p[p > 0.5] (NonZero + GatherND): a float
    output whose length is the number of decisions, as after an NMS. The second MatMul's small
    weights keep p near 0.5, where INT8 moves decisions."""
    rng = np.random.default_rng(0)
    model = _nonzero_model(0.5)
    graph = model.graph
    graph.node[1].input[0] = "l2"  # Sigmoid reads a second MatMul
    graph.node.insert(1, helper.make_node("Relu", ["logits"], ["r"]))
    graph.node.insert(2, helper.make_node("MatMul", ["r", "w2"], ["l2"]))
    graph.initializer.append(
        numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32) * 0.05, "w2")
    )
    graph.node.extend(
        [
            helper.make_node("Transpose", ["idx"], ["idx_t"], perm=[1, 0]),
            helper.make_node("GatherND", ["p", "idx_t"], ["vals"]),
        ]
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("vals", TensorProto.FLOAT, ["K"]))
    return model


def test_auto_judges_outputs_of_varying_size_on_what_they_chose_from(run_cli, tmp_path):
    """Every candidate's output length differed from FP32's on the judging slice: auto listed
    "-inf dB" for each and 'chose' one. It now scores the tensor the NonZero chose from (p)."""
    path = _save(tmp_path, _gathered_model())
    data, _ = _data(tmp_path, samples=400)  # a judging slice of 64 samples, 1,536 decisions
    code, _, err = run_cli("calibrate", path, "--data", data, "-o", tmp_path / "t.cache")
    assert code == 0, err
    text = " ".join(err.split())
    assert "auto: chose" in text and "(vals on p: the tensors its NMS/NonZero chose from)" in text
    assert "not judged" not in text and "nan dB" not in text


def _untraced_model() -> onnx.ModelProto:
    """:func:`_gathered_model` whose NonZero reads Cast(Round(p)), not a comparison: what it
    chose from is not traced."""
    model = _gathered_model()
    greater = next(n for n in model.graph.node if n.op_type == "Greater")
    index = list(model.graph.node).index(greater)
    model.graph.node.remove(greater)
    model.graph.node.insert(index, helper.make_node("Round", ["p"], ["rounded"]))
    model.graph.node.insert(
        index + 1, helper.make_node("Cast", ["rounded"], ["g"], to=TensorProto.BOOL)
    )
    return model


def test_auto_says_it_cannot_judge_outputs_whose_size_varies(run_cli, tmp_path):
    """Where the selection's source cannot be traced (NonZero of a cast, not a comparison),
    auto says why it judged nothing instead of ranking undefined scores or blaming NaN/Inf."""
    path = _save(tmp_path, _untraced_model())
    data, _ = _data(tmp_path, samples=400)
    code, _, err = run_cli("calibrate", path, "--data", data, "-o", tmp_path / "t.cache")
    assert code == 0, err
    text = " ".join(err.split())
    said = "auto: percentile:99.99 (not judged: the outputs' sizes differ between FP32 and the"
    assert said in text
    assert "NaN or Inf" not in text


def _token_model() -> onnx.ModelProto:
    """ids int64[N,6] -> Gather(embedding) -> MatMul -> tag = ArgMax int64[N,6]; the ids and
    their Shape also returned as outputs (a BERT export passes its inputs through)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["tag"], axis=-1, keepdims=0),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
        helper.make_node("Shape", ["logits"], ["shape"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])],
        [
            helper.make_tensor_value_info("tag", TensorProto.INT64, ["N", 6]),
            helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N", 6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
        ],
        [
            numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "emb"),
            numpy_helper.from_array(rng.standard_normal((16, 10)).astype(np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_integers_no_float_value_reaches_are_not_compared():
    """MiniLM's export returns input_ids and attention_mask through Identity: compared exactly
    they 'agree' 100 % whatever INT8 does, which made top1_agreement defined and recover's
    default target met by plain INT8. The tags an ArgMax made from the (float) embedding are
    compared; the copies and the shape are not."""
    model = _token_model()
    assert value_free_outputs(model) == {"ids_out", "shape"}
    kinds = declared_output_kinds(model)
    assert set(kinds) == {"tag"} and kinds["tag"][0] == "exact"
    acc = OutputsAccumulator(["tag", "ids_out", "shape"], layout=OutputLayout.of(model))
    ids = np.arange(12).reshape(2, 6)
    acc.update(
        {"tag": ids % 3, "ids_out": ids, "shape": np.array([2, 6, 10])},
        {"tag": (ids + 1) % 3, "ids_out": ids, "shape": np.array([2, 6, 10])},
        batch=2,
    )
    rows = acc.rows()
    assert rows["ids_out"]["agreement"] is None and rows["ids_out"]["value_free"] is True
    assert "quantization cannot change them" in rows["ids_out"]["agreement_note"]
    assert acc.model_metrics()["top1_agreement"] == 0.0  # the tags alone: none agree


def test_auto_scores_a_model_that_passes_its_inputs_through(run_cli, tmp_path):
    """The pass-through outputs are not compared: auto must not read their missing SQNR as
    'undefined' for every candidate (it did, and judged nothing)."""
    path = _save(tmp_path, _token_model())
    ids = np.random.default_rng(2).integers(0, 50, (200, 6)).astype(np.int64)
    np.savez(tmp_path / "ids.npz", ids=ids)
    code, _, err = run_cli("calibrate", path, "--data", tmp_path / "ids.npz", "-o",
                           tmp_path / "t.cache")  # fmt: skip
    assert code == 0, err
    text = " ".join(err.split())
    assert "auto: chose" in text and "not judged" not in text and "-inf" not in text
    assert "worst integer output's share of changed values" in text  # the tags, not the copies


def test_recover_judges_a_variable_size_output_on_what_it_chose_from(run_cli, tmp_path):
    """vals = p[p > 0.5]: recover and sensitivity score p, the Sigmoid the NonZero read, where
    the step's sqnr_db was undefined whenever the lengths differed."""
    path = _save(tmp_path, _gathered_model())
    data, _ = _data(tmp_path, samples=400)
    out = tmp_path / "rec"
    code, _, err = run_cli("recover", path, "--data", data, "--calib-data", data, "-m", "minmax",
                           "--target", "sqnr_db=20", "-o", out)  # fmt: skip
    assert code == 0, err
    step0 = json.loads((out / "m.recovery.json").read_text())["recovery"]["steps"][0]
    assert step0["metric"] is not None and step0["metric"] > 20  # p's SQNR, not undefined
    code, _, err = run_cli("sensitivity", path, "--data", data, "--calib-data", data, "-m",
                           "minmax", "--json", tmp_path / "s.json")  # fmt: skip
    assert code == 0, err
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert all(r["only_quantized"]["sqnr_db"] is not None for r in rows)


def test_recover_says_why_a_variable_size_output_leaves_its_metric_undefined(run_cli, tmp_path):
    path = _save(tmp_path, _untraced_model())
    data, _ = _data(tmp_path, samples=400)
    code, _, err = run_cli("recover", path, "--data", data, "--calib-data", data, "-m", "minmax",
                           "--target", "sqnr_db=20", "-o", tmp_path / "rec")  # fmt: skip
    assert code in (0, 1), err
    text = " ".join(err.split())
    assert "step 0: plain INT8, sqnr_db=undefined (output sizes differed from FP32's on" in text


def _nms_model() -> onnx.ModelProto:
    """x[N,50,16] -> boxes [N,50,4] (MatMul), scores [N,1,50] (MatMul, Sigmoid, Transpose) ->
    NonMaxSuppression -> selected indices int64[K, 3]; the scores are an output too."""
    rng = np.random.default_rng(0)
    inits = {
        "wb": rng.standard_normal((16, 4)).astype(np.float32) * 3,
        "ws": rng.standard_normal((16, 1)).astype(np.float32),
        "most": np.array([20], np.int64),
        "iou": np.array([0.5], np.float32),
        "least": np.array([0.6], np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wb"], ["boxes"]),
        helper.make_node("MatMul", ["x", "ws"], ["s0"]),
        helper.make_node("Sigmoid", ["s0"], ["s1"]),
        helper.make_node("Transpose", ["s1"], ["scores"], perm=[0, 2, 1]),
        helper.make_node(
            "NonMaxSuppression", ["boxes", "scores", "most", "iou", "least"], ["sel"]
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 50, 16])],
        [
            helper.make_tensor_value_info("sel", TensorProto.INT64, ["K", 3]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 1, 50]),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_an_nms_detector_is_compared_and_judged(run_cli, tmp_path):
    """The selected indices are compared exactly (batches that selected another number agree
    nowhere); auto scores the boxes and scores NMS chose from, not the indices."""
    from quantbench.evaluate.outputaxes import selection_sources

    model = _nms_model()
    assert selection_sources(model) == {"sel": ["boxes", "scores"]}
    path = _save(tmp_path, model)
    x = np.random.default_rng(0).standard_normal((64, 50, 16)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    code, _, err = run_cli("calibrate", path, "--data", tmp_path / "d.npz", "-o",
                           tmp_path / "t.cache")  # fmt: skip
    assert code == 0, err
    text = " ".join(err.split())
    assert "(sel on boxes, scores: the tensors its NMS/NonZero chose from)" in text
    assert "not judged" not in text
    out = tmp_path / "c.json"
    code, stdout, err = run_cli("compare", "fp32", "int8", "--model", path, "--data",
                           tmp_path / "d.npz", "--table", tmp_path / "t.cache",
                           "--batch-size", "8", "--no-latency", "--json", out)  # fmt: skip
    assert code == 0, err
    rows = {o["name"]: o for o in json.loads(out.read_text())["outputs"]}
    assert rows["sel"]["agreement_kind"] == "exact" and rows["sel"]["cosine"] is None
    assert rows["scores"]["mask_threshold"] == 0.5 and rows["scores"]["cosine"] > 0.99
    # the boxes NMS chose from are judged by their drift beside the outputs, never by argmax
    assert rows["boxes"]["agreement"] is None and rows["boxes"]["sqnr_db"] > 20
    assert "the NMS/NonZero before sel chose from" in rows["boxes"]["agreement_note"]
