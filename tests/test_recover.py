"""Layer sensitivity, ``--method auto`` and greedy high-precision fallback (issue 7).

The synthetic model has one deliberately bad layer: channel 7 of ``spiky`` (conv2's input) is
400x larger than the others and conv2's weights undo that, so FP32 is unchanged but one
per-tensor INT8 scale for ``spiky`` rounds the seven small channels to zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import synthetic
from conftest import require_example
from onnx import TensorProto, helper, numpy_helper

from quantbench.backends.onnxruntime import OnnxRuntimeRunner
from quantbench.calibrate import build_table, obtain_stats
from quantbench.choose.autocalib import output_sqnr
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import open_graph
from quantbench.recovery import auto_table, recover, sensitivity, write_artefacts
from quantbench.recovery.context import prepare
from quantbench.recovery.sensitivity import rank_ops
from quantbench.table.codecs import read_table

OUTLIER_GAIN = 400.0
BAD_LAYER = "conv2"
BAD_TENSOR = "spiky"


def heavy_tailed_cnn(seed: int = 0) -> onnx.ModelProto:
    """conv1 -> relu -> Mul(one channel x400) -> conv2 -> relu -> conv3 -> GAP -> fc."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32)
    gain = np.ones((1, 8, 1, 1), np.float32)
    gain[0, 7] = OUTLIER_GAIN
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    w2[:, 7] /= OUTLIER_GAIN
    arrays = {
        "w1": w1,
        "gain": gain,
        "w2": w2,
        "w3": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32),
        "fc_w": (rng.standard_normal((10, 8)) * 0.8).astype(np.float32),
        "fc_b": np.zeros(10, np.float32),
    }
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=pads),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Mul", ["r1", "gain"], [BAD_TENSOR], name="gain"),
        helper.make_node("Conv", [BAD_TENSOR, "w2"], ["c2"], name=BAD_LAYER, pads=pads),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3", pads=pads),
        helper.make_node("GlobalAveragePool", ["c3"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "heavy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _centre_logits(model, synthetic.images(32, seed=1))
    onnx.checker.check_model(model)
    return model


def _centre_logits(model: onnx.ModelProto, images: np.ndarray) -> None:
    """A bias that centres the logits, so the FP32 argmax spreads over several classes."""
    (logits,) = OnnxRuntimeRunner(model).infer({"input": images}).values()
    bias = next(i for i in model.graph.initializer if i.name == "fc_b")
    bias.CopyFrom(numpy_helper.from_array((-logits.mean(0)).astype(np.float32), "fc_b"))


@pytest.fixture(scope="module")
def heavy(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heavy")
    model = heavy_tailed_cnn()
    path = synthetic.save(model, root / "heavy.onnx")
    calib, evaluation = root / "calib.npz", root / "eval.npz"
    np.savez(calib, input=synthetic.images(32, seed=1))
    images = synthetic.images(64, seed=2)
    np.savez(evaluation, input=images)
    (logits,) = OnnxRuntimeRunner(model).infer({"input": images}).values()
    labels = root / "labels.npy"
    np.save(labels, logits.argmax(1).astype(np.int64))
    return {"model": path, "calib": calib, "eval": evaluation, "labels": labels}


def _recover(heavy: dict[str, Path], **kwargs):
    """recover's fallback search on the bad layer: without the refinement passes, since
    smoothing (a Conv reading a Mul) moves channel 7's gain into conv2's weights and so
    cures the bad layer in INT8 (:func:`test_smoothing_spares_the_bad_layer`)."""
    options = {"target": "sqnr_db=20", "batch_size": 16, "refine": "none", **kwargs}
    return recover(heavy["model"], heavy["calib"], heavy["eval"], **options)


def test_smoothing_spares_the_bad_layer(heavy):
    """With its default passes recover no longer keeps the bad layer: smoothing divides
    ``spiky``'s channels by s before conv2 and multiplies conv2's weights by it, so the 400x
    channel no longer sets the one per-tensor scale; every op in INT8 scores above 10 dB where
    without the passes it scores below 0 (test_recover_keeps_the_bad_layer_...)."""
    result = _recover(heavy, refine=None)
    assert result.met and BAD_LAYER not in result.kept
    assert result.steps[0]["kept_high_precision"] == [] and result.steps[0]["metric"] > 10


def _sqnr(value: float | str) -> float:
    return float(value)  # "inf" -> inf


def test_sensitivity_ranks_the_heavy_tailed_layer_first(heavy):
    rows = sensitivity(heavy["model"], heavy["calib"], heavy["eval"], batch_size=16)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert {r["node"] for r in rows} == {"conv1", BAD_LAYER, "conv3", "fc"}
    worst, rest = rows[0], rows[1:]
    assert worst["node"] == BAD_LAYER
    assert _sqnr(worst["only_quantized"]["sqnr_db"]) < 0  # alone it destroys the outputs
    assert all(_sqnr(r["only_quantized"]["sqnr_db"]) > 20 for r in rest)
    # leaving only the bad layer in FP32 recovers far more than leaving any other one
    best_fp32 = max(rows, key=lambda r: _sqnr(r["only_fp32"]["sqnr_db"]))
    assert best_fp32["node"] == BAD_LAYER
    assert all(r["only_quantized_nodes"] == 1 and r["only_fp32_nodes"] == 3 for r in rows)


def test_sensitivity_costs_two_evaluations_per_op(heavy):
    ctx = prepare(heavy["model"], heavy["calib"], heavy["eval"], batch_size=16)
    rows = rank_ops(ctx, "top1_agreement")
    assert ctx.evaluator.evaluations == 2 * len(ctx.plan.quantized) == 2 * len(rows)
    assert rows[0]["node"] == BAD_LAYER  # agreement collapses there too


def test_recover_keeps_the_bad_layer_and_writes_artefacts(heavy, tmp_path):
    result = _recover(heavy)
    assert result.met and result.kept == [BAD_LAYER]
    assert [s["step"] for s in result.steps] == [0, 1]
    assert result.steps[0]["kept_high_precision"] == []
    assert result.steps[0]["metric"] < 0 < 20 < result.steps[1]["metric"]
    assert all(s["seconds"] >= 0 for s in result.steps)
    # ranking (one evaluation per op) plus one verification per step
    assert result.context.evaluator.evaluations == len(result.ranking) + len(result.steps)

    paths = write_artefacts(result, tmp_path / "out", model_path=heavy["model"])
    recovered = onnx.load(str(paths["model"]))
    OnnxRuntimeRunner(recovered).infer({"input": synthetic.images(2, seed=3)})
    dq_outputs = {
        o for n in recovered.graph.node if n.op_type == "DequantizeLinear" for o in n.output
    }
    readers = {n.name: set(n.input) for n in recovered.graph.node}
    assert not readers[BAD_LAYER] & dq_outputs
    assert all(readers[n] & dq_outputs for n in ("conv1", "conv3", "fc"))

    cache = read_table(paths["cache"])
    assert BAD_TENSOR not in cache and "r2" in cache and "input" in cache
    assert paths["cache"].read_bytes().startswith(b"TRT-")

    lines = paths["trtexec"].read_text()
    assert "--precisionConstraints=obey --layerPrecisions=conv2:fp32" in lines
    assert f"--calib={paths['cache']}" in lines and f"--onnx={paths['model']}" in lines

    doc = json.loads(paths["results"].read_text())
    assert doc["recovery"]["target"] == "sqnr_db=20"
    assert doc["recovery"]["kept_high_precision"] == [BAD_LAYER]
    assert doc["recovery"]["cache_removed"] == [BAD_TENSOR]
    from quantbench.reports import render_report

    html = render_report(doc)
    assert "Accuracy recovery" in html and BAD_LAYER in html
    # the kept op is recover's doing, not the user's --exclude; the outputs were verified
    [kept] = [e for e in doc["excluded"] if e["node"] == BAD_LAYER]
    assert kept["reason"] == "kept in fp32 by recover"
    assert "No model outputs were compared" not in html


def test_recover_to_an_accuracy_target_with_labels(heavy):
    result = _recover(heavy, target="accuracy_drop=0.15", labels=heavy["labels"])
    assert result.context.evaluator.fp32_accuracy == 1.0  # labels are the FP32 argmax
    assert result.steps[0]["metric"] > 0.15
    assert result.met and result.kept[0] == BAD_LAYER
    assert result.steps[-1]["metric"] <= 0.15


def test_plain_int8_meeting_the_target_needs_no_search(heavy):
    result = _recover(heavy, target="sqnr_db=-40")
    assert result.met and result.kept == [] and len(result.steps) == 1
    assert result.ranking == [] and result.context.evaluator.evaluations == 1


def test_budget_stops_the_search(heavy):
    result = _recover(heavy, target="sqnr_db=90", budget=1)
    assert not result.met and result.kept == [BAD_LAYER] and len(result.steps) == 2


def test_fp16_fallback_names_fp16_layers(heavy, tmp_path):
    result = _recover(heavy, precision="fp16")
    paths = write_artefacts(result, tmp_path / "out16")
    lines = paths["trtexec"].read_text()
    assert "--int8 --fp16" in lines and "--layerPrecisions=conv2:fp16" in lines


def test_auto_table_records_methods_and_is_no_worse_than_entropy(heavy):
    graph = open_graph(heavy["model"])
    stats, _, _ = obtain_stats(graph, heavy["calib"], tensors="all", show_progress=False)
    held = open_data(heavy["calib"], graph.inputs, batch_size=16)
    auto = auto_table(graph, stats, held)
    assert auto.table.method == "auto"
    assert set(auto.choices) == {"input", BAD_TENSOR, "r2", "flat"}
    for tensor, choice in auto.choices.items():
        assert auto.table.entries[tensor].method == choice["method"] in auto.methods
        scores = choice["isolated_sqnr_db"]
        assert _sqnr(scores[choice["isolated_best"]]) >= max(map(_sqnr, scores.values()))
    entropy = build_table(stats, "entropy")
    evaluation = open_data(heavy["eval"], graph.inputs, batch_size=16)
    auto_eval = output_sqnr(graph, auto.table, evaluation)
    entropy_eval = output_sqnr(graph, entropy, evaluation)
    assert auto_eval >= entropy_eval - 0.5  # held-out choice, measured on unseen data
    # the chosen whole-model candidate is the best of the mix and every method alone
    assert auto.output_sqnr_db[auto.chosen] == max(auto.output_sqnr_db.values())


def test_caches_for_trtexec_carry_the_header_trtexec_reads(heavy, tmp_path):
    """trtexec's --calib calibrator is an IInt8EntropyCalibrator2 and drops a cache with
    another header, calibrating on random data instead (reference doc 2.3): an ``auto`` table
    that minmax won, and recover's cache for its trtexec line, say EntropyCalibration2."""
    from quantbench.choose.autocalib import _relabelled
    from quantbench.table.codecs import encode_table

    graph = open_graph(heavy["model"])
    stats, _, _ = obtain_stats(graph, heavy["calib"], tensors="all", show_progress=False)
    minmax = build_table(stats, "minmax")
    assert encode_table(minmax, "trt").split(b"\n")[0].endswith(b"-MinMaxCalibration")
    won = encode_table(_relabelled(minmax, "minmax"), "trt")
    assert won.split(b"\n")[0].endswith(b"-EntropyCalibration2")
    result = _recover(heavy, method="minmax")
    paths = write_artefacts(result, tmp_path / "out", model_path=heavy["model"])
    header = paths["cache"].read_text().splitlines()[0]
    assert header.startswith("TRT-") and header.endswith("-EntropyCalibration2")


def test_recover_with_method_auto_still_keeps_the_bad_layer(heavy):
    result = _recover(heavy, method="auto")
    assert result.met and result.kept == [BAD_LAYER]
    assert result.section()["auto"]["tensors"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target": "top1_agreement"}, "METRIC=VALUE"),
        ({"target": "top1=0.9"}, "unknown metric"),
        ({"target": "top1_agreement=1.5"}, "between 0 and 1"),
        ({"target": "accuracy_drop=0.01"}, "needs --labels"),
        ({"budget": -1}, "--budget"),
        ({"precision": "int4"}, "--precision"),
    ],
)
def test_bad_requests_are_user_errors(heavy, kwargs, message):
    with pytest.raises(QuantbenchError, match=message):
        _recover(heavy, **kwargs)


def test_bad_sensitivity_metric_and_trt_version_are_user_errors(heavy, tmp_path):
    with pytest.raises(QuantbenchError, match="--metric"):
        sensitivity(heavy["model"], heavy["calib"], heavy["eval"], metric="accuracy")
    result = _recover(heavy)
    with pytest.raises(QuantbenchError, match="no implicit INT8"):
        write_artefacts(result, tmp_path / "o", trt_version="11.0.0")
    with pytest.raises(QuantbenchError, match="does not exist"):
        write_artefacts(result, tmp_path / "missing" / "o")


def test_tinycnn_example_recovers_agreement():
    example = require_example()
    result = recover(
        example / "tinycnn.onnx",
        example / "calib.npz",
        example / "eval.npz",
        target="top1_agreement=0.99",
        max_samples=200,
    )
    assert result.met
    assert result.steps[-1]["metric"] >= 0.99
    assert len(result.kept) < len(result.context.plan.quantized)


def test_auto_beats_entropy_where_entropy_clips_a_small_sample_tensor(tmp_path):
    """Seed 2: 32 calibration images give ``flat`` 256 values; entropy clips it hard."""
    model_path = synthetic.save(heavy_tailed_cnn(seed=2), tmp_path / "seed2.onnx")
    calib, evaluation = tmp_path / "calib.npz", tmp_path / "eval.npz"
    np.savez(calib, input=synthetic.images(32, seed=1))
    np.savez(evaluation, input=synthetic.images(64, seed=2))
    graph = open_graph(model_path)
    stats, _, _ = obtain_stats(graph, calib, tensors="all", show_progress=False)
    auto = auto_table(graph, stats, open_data(calib, graph.inputs, batch_size=16))
    assert not auto.fallback
    assert auto.choices["flat"]["method"] != "entropy"
    assert auto.table.entries["flat"].method == auto.choices["flat"]["method"]
    unseen = open_data(evaluation, graph.inputs, batch_size=16)
    entropy_sqnr = output_sqnr(graph, build_table(stats, "entropy"), unseen)
    assert output_sqnr(graph, auto.table, unseen) > entropy_sqnr + 3.0


# ----------------------------------------------------------------- metrics defined before work

NOISE_SCRIPT = """
import numpy as np


def metric(fp32, candidate, labels):
    a = fp32["logits"].astype(np.float64)
    d = a - candidate["logits"]
    return {"noise_drop": float((d * d).sum() / (a * a).sum())}
"""

AGREE_SCRIPT = """
class Agree:
    def __init__(self):
        self.same = self.total = 0

    def update(self, fp32, candidate, labels):
        self.same += int((fp32["logits"].argmax(1) == candidate["logits"].argmax(1)).sum())
        self.total += len(fp32["logits"])

    def compute(self):
        return {"agree": self.same / self.total}
"""


def score_model(tmp_path: Path, class_dim: int | str, classes: int = 1) -> Path:
    """Gemm -> ``classes`` scores per sample ([N, classes]); ``class_dim`` is how the output
    declares it."""
    w = np.random.default_rng(0).standard_normal((classes, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["score"], name="fc", transB=1)],
        "score",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", class_dim])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = synthetic.save(model, tmp_path / "score.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(1).standard_normal((16, 8)))
    return path


def test_undefined_target_fails_before_calibrating(tmp_path, monkeypatch, run_cli):
    path = score_model(tmp_path, 1)
    data = tmp_path / "data.npz"

    def no_inference(*args, **kwargs):
        raise AssertionError("calibration ran before the target was checked")

    monkeypatch.setattr("quantbench.recovery.context.obtain_stats", no_inference)
    with pytest.raises(QuantbenchError, match="top1_agreement is not defined for this model"):
        recover(path, data, data, target="top1_agreement=0.99")
    with pytest.raises(QuantbenchError, match="--metric top1_agreement: .*size 1"):
        sensitivity(path, data, data, metric="top1_agreement")
    code, _, err = run_cli(
        "recover", path, "--data", data, "--calib-data", data, "-o", tmp_path / "out",
        "--target", "top1_agreement=0.99",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not defined" in err
    assert not (tmp_path / "out").exists()


def test_top5_target_on_five_or_fewer_classes_says_why(tmp_path, run_cli):
    """With 4 classes the top 5 hold every class: top-5 agreement is 1 for any model, so it
    is no target (it used to say 'undefined on this data: no value')."""
    path = score_model(tmp_path, 4, classes=4)
    data = tmp_path / "data.npz"
    code, _, err = run_cli(
        "recover", path, "--data", data, "--calib-data", data, "-o", tmp_path / "out",
        "--target", "top5_agreement=0.99",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs outputs of more than 5 classes" in err and "use top1_agreement" in err
    assert not (tmp_path / "out").exists()


def test_symbolic_class_axis_is_checked_on_fp32_before_any_variant(tmp_path, monkeypatch):
    path = score_model(tmp_path, "C")  # the graph cannot tell; one FP32 pass can
    data = tmp_path / "data.npz"

    def no_variant(self, model):
        raise AssertionError("a variant was evaluated before the target was checked")

    monkeypatch.setattr("quantbench.recovery.evaluation.Evaluator.evaluate", no_variant)
    with pytest.raises(QuantbenchError, match="--target top1_agreement: .*size 1"):
        recover(path, data, data, target="top1_agreement=0.99")


def test_undefined_metric_ranks_worst():
    from quantbench.recovery.evaluation import badness

    rows = [{"sqnr_db": 30.0}, {"sqnr_db": None}, {"sqnr_db": -5.0}]
    ranked = sorted(rows, key=lambda m: badness(m, "sqnr_db"), reverse=True)
    assert ranked == [{"sqnr_db": None}, {"sqnr_db": -5.0}, {"sqnr_db": 30.0}]


def test_recover_reaches_a_metric_script_target(heavy, tmp_path):
    script = tmp_path / "noise.py"
    script.write_text(NOISE_SCRIPT)
    # noise_drop = Σd²/Σa² <= 0.01 is SQNR >= 20 dB: the same answer as sqnr_db=20
    result = _recover(heavy, target="noise_drop=0.01", metric_script=script)
    assert result.met and result.kept == [BAD_LAYER]
    first, last = result.steps[0]["metrics"], result.steps[-1]["metrics"]
    assert first["noise_drop"] == pytest.approx(10 ** (-first["sqnr_db"] / 10), rel=1e-4)
    assert result.steps[-1]["metric"] <= 0.01 < result.steps[0]["metric"]
    assert last["noise_drop"] == pytest.approx(10 ** (-last["sqnr_db"] / 10), rel=1e-4)
    section = result.section()
    assert section["metric_script"].endswith("noise.py:metric")
    assert section["fp32_metrics"]["noise_drop"] == 0.0
    with pytest.raises(QuantbenchError, match="returned no 'nois_drop'"):
        _recover(heavy, target="nois_drop=0.01", metric_script=script)


def test_sensitivity_ranks_by_a_metric_script_class(heavy, tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT)
    rows = sensitivity(
        heavy["model"], heavy["calib"], heavy["eval"], batch_size=16, metric="agree",
        metric_script=f"{script}:Agree",
    )  # fmt: skip
    assert rows[0]["node"] == BAD_LAYER
    for row in rows:  # the script's agreement is the built-in top-1 agreement, sample by sample
        assert row["only_quantized"]["agree"] == row["only_quantized"]["top1_agreement"]
