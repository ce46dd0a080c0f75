"""Refinement passes judged at the outputs (quantbench.choose.refined) and wired into quantize.

The scores that matter are recomputed here independently: onnxruntime runs the written Q/DQ
model and FP32 on fresh samples the judging never saw, and numpy measures the SQNR.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.choose.refined import parse_refine
from quantbench.errors import QuantbenchError
from quantbench.quantize import quantize
from quantbench.refine import PASSES, refined_passes


def _unbalanced_model(path: Path) -> Path:
    """conv (4 -> 8) -> Relu -> conv (8 -> 4): conv1's channel 0 is 200x the others and conv2
    reads it with a weight 200x smaller, so the Relu output's per-tensor INT8 scale is set by
    one channel and flattens the other seven. Equalization moves that range into the weights."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.5, (8, 4, 3, 3)).astype(np.float32)
    w1[0] *= 200
    w2 = rng.normal(0, 0.5, (4, 8, 3, 3)).astype(np.float32)
    w2[:, 0] /= 200
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(np.full(8, 0.1, np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b2"),
    ]
    return _save(path, nodes, inits, ("x", ["n", 4, 12, 12]), ("y", ["n", 4, 12, 12]))


def _save(path: Path, nodes: list, inits: list, x: tuple, y: tuple) -> Path:
    """One-input, one-output float32 model (opset 17) written to ``path``."""
    graph = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info(x[0], TensorProto.FLOAT, x[1])],
        [helper.make_tensor_value_info(y[0], TensorProto.FLOAT, y[1])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _sqnr(model: Path, reference: Path, x: np.ndarray, name: str = "x") -> float:
    """SQNR (dB) of ``model``'s first output against ``reference``'s, each run as written."""
    from conftest import exact_session

    got = exact_session(model).run(None, {name: x})[0].astype(np.float64)
    want = exact_session(reference).run(None, {name: x})[0].astype(np.float64)
    return float(10 * np.log10((want**2).sum() / ((got - want) ** 2).sum()))


@pytest.fixture()
def unbalanced(tmp_path) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(1)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.normal(0, 1, (48, 4, 12, 12)).astype(np.float32))
    fresh = rng.normal(0, 1, (16, 4, 12, 12)).astype(np.float32)
    return _unbalanced_model(tmp_path / "m.onnx"), calib, fresh


def test_parse_refine_names_and_groups():
    assert parse_refine(None) is None
    assert parse_refine("none") == ()
    assert parse_refine("all") == PASSES
    assert parse_refine("bias, equalize") == ("equalize", "bias")  # pass order, not the user's
    with pytest.raises(QuantbenchError, match="unknown pass 'adaround'"):
        parse_refine("adaround")


def test_equalization_kept_where_it_helps_and_the_written_model_gains(unbalanced, tmp_path):
    model, calib, fresh = unbalanced
    plain, refined = tmp_path / "plain.onnx", tmp_path / "refined.onnx"
    quantize(model, plain, data=calib, refine="none", show_progress=False)
    out = quantize(model, refined, data=calib, refine="equalize", show_progress=False,
                   refined_model=tmp_path / "refined.fp32.onnx")  # fmt: skip
    assert out.refine is not None and out.refine.kept == ["equalize"]
    # both variants tried, each judged on its own; the higher kept
    tried = {t.name: t for t in out.refine.trials}
    assert list(tried) == ["equalize:activations", "equalize"]
    assert tried["equalize"].score_db >= tried["equalize:activations"].score_db
    assert refined_passes(onnx.load(refined)) == ["equalize"]
    assert refined_passes(onnx.load(tmp_path / "refined.fp32.onnx")) == ["equalize"]
    # the refined FP32 model computes what the original does
    assert _sqnr(tmp_path / "refined.fp32.onnx", model, fresh) > 100
    # measured independently on samples nothing was calibrated or judged on
    assert _sqnr(refined, model, fresh) > _sqnr(plain, model, fresh) + 3


def test_a_pass_that_does_not_gain_leaves_the_model_as_it_was(tmp_path, run_cli):
    from conftest import require_example

    example = require_example()
    out = tmp_path / "q.onnx"
    outcome = quantize(example / "tinycnn.onnx", out, data=example / "calib.npz",
                       refine="equalize", show_progress=False)  # fmt: skip
    trial = outcome.refine.trials[0]
    if trial.kept:
        pytest.skip("equalization gained on this example; the other branch is tested")
    assert outcome.refine.kept == [] and refined_passes(onnx.load(out)) == []
    plain = tmp_path / "plain.onnx"
    quantize(example / "tinycnn.onnx", plain, data=example / "calib.npz", refine="none",
             show_progress=False)  # fmt: skip
    a, b = onnx.load(out), onnx.load(plain)
    weights = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    for init in b.graph.initializer:
        np.testing.assert_array_equal(weights[init.name], numpy_helper.to_array(init))


def test_refine_with_a_given_table_is_one_line(tmp_path, run_cli):
    from conftest import require_example

    example = require_example()
    table = tmp_path / "t.json"
    code, _, _ = run_cli("calibrate", example / "tinycnn.onnx", "--data", example / "calib.npz",
                         "--method", "minmax", "-o", table)  # fmt: skip
    assert code == 0
    code, out, err = run_cli("quantize", example / "tinycnn.onnx", "--table", table,
                             "--refine", "bias", "-o", tmp_path / "q.onnx")  # fmt: skip
    assert code == 2 and "--refine needs --data" in err and "Traceback" not in err
    assert not (tmp_path / "q.onnx").exists()
    code, out, err = run_cli("quantize", example / "tinycnn.onnx", "--data",
                             example / "calib.npz", "--refine", "adaround", "-o",
                             tmp_path / "q.onnx")  # fmt: skip
    assert code == 2 and "unknown pass 'adaround'" in err


def _outlier_transformer(path: Path) -> Path:
    """LayerNormalization -> MatMul: two of the LayerNorm's output channels are 100x the rest
    (its gamma) and read with weights 100x smaller, so every channel matters to the output but
    the per-tensor activation scale is set by two: the case SmoothQuant's migration is for."""
    rng = np.random.default_rng(3)
    gamma = np.ones(16, np.float32)
    gamma[[2, 9]] = 100
    w = rng.normal(0, 0.3, (16, 8)).astype(np.float32)
    w[[2, 9]] /= 100
    nodes = [
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["x"], name="ln", axis=-1),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
    ]
    inits = [
        numpy_helper.from_array(gamma, "gamma"),
        numpy_helper.from_array(np.zeros(16, np.float32), "beta"),
        numpy_helper.from_array(w, "w"),
    ]
    return _save(path, nodes, inits, ("h", ["n", 6, 16]), ("y", ["n", 6, 8]))


def test_smoothing_alphas_are_alternatives_each_on_the_unsmoothed_model(tmp_path, monkeypatch):
    from quantbench.refine import smooth

    model = _outlier_transformer(tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, h=np.random.default_rng(4).normal(0, 1, (48, 6, 16)).astype(np.float32))
    seen: list[bytes] = []
    real = smooth.smooth

    def recording(m, *args, **kwargs):
        seen.append(m.graph.SerializeToString())
        return real(m, *args, **kwargs)

    monkeypatch.setattr(smooth, "smooth", recording)
    out = quantize(model, tmp_path / "q.onnx", data=calib, refine="smooth",
                   show_progress=False)  # fmt: skip
    original = onnx.load(model).graph.SerializeToString()
    assert len(seen) == 2 and all(graph == original for graph in seen)
    trials = out.refine.trials
    assert [t.name for t in trials] == ["smooth:0.5", "smooth:0.8"]
    kept = [t for t in trials if t.kept]
    assert len(kept) == 1 and out.refine.kept == [kept[0].name]
    assert kept[0].score_db == max(t.score_db for t in trials)
    # measured independently on fresh samples: the smoothed Q/DQ model beats the unsmoothed one
    plain = tmp_path / "plain.onnx"
    quantize(model, plain, data=calib, refine="none", show_progress=False)
    fresh = np.random.default_rng(5).normal(0, 1, (16, 6, 16)).astype(np.float32)
    smoothed = _sqnr(tmp_path / "q.onnx", model, fresh, "h")
    assert smoothed > _sqnr(plain, model, fresh, "h") + 10


def test_kept_rounding_is_verified_on_the_written_grid(tmp_path, capsys, monkeypatch):
    """quantize checks every rounded weight against the Q/DQ model it writes (the bug guard);
    a rounding that leaves a weight off its grid is refused before anything is written."""
    from conftest import require_example

    from quantbench.refine import rounding

    example = require_example()
    model, calib = example / "tinycnn.onnx", example / "calib.npz"
    out = quantize(model, tmp_path / "q.onnx", data=calib, refine="rounding",
                   show_progress=False)  # fmt: skip
    if "rounding" not in out.refine.kept:
        pytest.skip("rounding did not gain on the example")
    said = capsys.readouterr().err
    assert "rounded weights checked: exactly on the Q/DQ model's INT8 grid" in said
    real = rounding.round_weights

    def off_grid(*args, **kwargs):
        refined = real(*args, **kwargs)
        name = rounding.find_layers(refined.model)[0][0].weight
        for init in refined.model.graph.initializer:
            if init.name == name:
                w = numpy_helper.to_array(init).copy()
                w.flat[w.size // 2] *= 1.001  # between two grid points
                init.CopyFrom(numpy_helper.from_array(w, name))
        return refined

    monkeypatch.setattr(rounding, "round_weights", off_grid)
    with pytest.raises(QuantbenchError, match="is not exactly q \\* s"):
        quantize(model, tmp_path / "bad.onnx", data=calib, refine="rounding", show_progress=False)
    assert not (tmp_path / "bad.onnx").exists()
