"""A pass for range-only methods (minmax) keeps each tensor's range and counts, no histogram.

Expected values come from onnxruntime's own activations reduced here with numpy (or from
numbers worked out by hand), never from the statistics code under test.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_example
from onnx import TensorProto, helper

from quantbench import calibrate as cal
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.results import calibration_section
from quantbench.stats.derivation import derivation_plan
from quantbench.table.codecs import read_table


def _activation_ranges(graph, data, tensors, batch_size):
    """Reference: (count, min, max) of every tensor's values, exposed by onnxruntime."""
    inputs = {s.name for s in graph.inputs}
    outputs = [t for t in tensors if t not in inputs]
    runner = OnnxRuntimeRunner(expose(graph.model, outputs, graph.elem_types))
    seen: dict[str, list[np.ndarray]] = {n: [] for n in tensors}
    for feed in open_data(data, graph.inputs, batch_size=batch_size).batches():
        values = {**feed, **runner.infer(feed, outputs)}
        for n in tensors:
            seen[n].append(np.asarray(values[n], np.float64).reshape(-1))
    joined = {n: np.concatenate(v) for n, v in seen.items()}
    return {n: (v.size, v.min(), v.max()) for n, v in joined.items()}


@pytest.mark.parametrize("which", ["synthetic", "example"])
def test_ranges_match_the_activations_with_no_histogram(which, cnn_path, cnn_data):
    if which == "example":
        ex = require_example()
        path, data, bs = ex / "tinycnn.onnx", ex / "calib.npz", None
    else:
        path, data, bs = cnn_path, cnn_data, 3
    g = open_graph(path)
    tensors = calibration_tensors(g, "all")
    assert any(kind == "relu" for kind, _ in derivation_plan(g, tensors).values())
    source = open_data(data, g.inputs, batch_size=bs)
    got = collect_stats(g, source, tensors, show_progress=False, ranges_only=True)
    ref = _activation_ranges(g, data, tensors, bs)
    for n in tensors:
        t = got[n]
        assert (t.count, t.min, t.max) == ref[n], n
        assert (t.nan_count, t.inf_count) == (0, 0)
    assert not got.has_histograms
    with pytest.raises(QuantbenchError, match="keep_histograms=True"):
        got[tensors[0]].abs_cdf()
    with pytest.raises(QuantbenchError, match="save_stats=PATH"):
        got.save(cnn_path.parent / "s.stats")


def test_a_relu_of_nonfinite_values_keeps_its_own_counts(tmp_path):
    """x holds -inf, NaN and +inf; Relu(x) is derived from x: -inf becomes 0 (finite), NaN
    and +inf stay. By hand: x finite {-2, 3} (1 NaN, 2 Inf); Relu finite {0, 0, 3} (1 NaN,
    1 Inf)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.save(tmp_path / "x.npy", np.array([[-np.inf, -2, np.nan, 3, np.inf]], np.float32))
    g = open_graph(path)
    assert derivation_plan(g, ["x", "r"])["r"] == ("relu", "x")
    source = open_data(tmp_path / "x.npy", g.inputs)
    got = collect_stats(g, source, ["x", "r"], show_progress=False, ranges_only=True)
    x, r = got["x"], got["r"]
    assert (x.count, x.min, x.max, x.nan_count, x.inf_count) == (2, -2.0, 3.0, 1, 2)
    assert (r.count, r.min, r.max, r.nan_count, r.inf_count) == (3, 0.0, 3.0, 1, 1)


def test_minmax_alone_bins_nothing_and_caches_nothing(cnn_path, cnn_data, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("QUANTBENCH_CACHE", str(cache))
    out = tmp_path / "t.cache"
    result = cal.calibrate(cnn_path, cnn_data, methods=["minmax"], output=out,
                           show_progress=False)  # fmt: skip
    assert not result.stats.has_histograms and result.stats_path is None
    assert not list(cache.rglob("*.stats.npz"))  # a cache must serve every method
    g = open_graph(cnn_path)
    ref = _activation_ranges(g, cnn_data, calibration_tensors(g, "all"), None)
    table = read_table(out)
    for name, (_, lo, hi) in ref.items():
        amax = max(abs(lo), abs(hi))
        assert table.amax(name) == pytest.approx(amax, rel=1e-6), name
    with pytest.raises(QuantbenchError, match="keep_histograms=True"):
        calibration_section(result.stats, None, "minmax")


def test_histograms_kept_where_asked_and_for_other_methods(cnn_path, cnn_data, tmp_path):
    kept = cal.calibrate(cnn_path, cnn_data, methods=["minmax"], keep_histograms=True,
                         output=tmp_path / "k.cache", show_progress=False)  # fmt: skip
    assert kept.stats.has_histograms and kept.stats_path is not None
    out = tmp_path / "t.cache"
    saved = cal.calibrate(cnn_path, cnn_data, methods=["minmax"], use_cache=False, output=out,
                          save_stats=tmp_path / "s.stats", show_progress=False)  # fmt: skip
    assert saved.stats.has_histograms and (tmp_path / "s.stats").is_file()
    both = cal.calibrate(cnn_path, cnn_data, methods=["minmax", "entropy"], use_cache=False,
                         output=tmp_path / "both", show_progress=False)  # fmt: skip
    assert both.stats.has_histograms
    # no table written: the cached statistics are the run's product, kept whole
    bare = cal.calibrate(cnn_path, cnn_data, methods=["minmax"], show_progress=False)
    assert bare.stats.has_histograms


def test_minmax_with_a_report_draws_histograms(run_cli, cnn_path, cnn_data, tmp_path):
    html = tmp_path / "calib.html"
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "minmax",
                           "-o", tmp_path / "t.cache", "--report", html)  # fmt: skip
    assert code == 0, err
    assert "<svg" in html.read_text()


def test_quantize_with_minmax_bins_nothing(cnn_path, cnn_data, tmp_path, monkeypatch):
    """quantize --method minmax takes the range-only pass too (its amaxes are the activations'
    max|x|, read here from onnxruntime); with --high-precision fp16 it keeps the histograms,
    which FP16's overflow check counts."""
    import onnx as onnx_

    from quantbench.quantize import quantize

    kept: list[bool] = []
    real = cal.collect_stats
    monkeypatch.setattr(
        "quantbench.calibrate.collect_stats",
        lambda *a, **k: kept.append(k.get("ranges_only", False)) or real(*a, **k),
    )
    out = tmp_path / "q.onnx"
    quantize(cnn_path, out, data=cnn_data, method="minmax", refine="none", show_progress=False)
    assert kept == [True]
    g = open_graph(cnn_path)
    ref = _activation_ranges(g, cnn_data, ["input"], None)
    scales = {i.name: i for i in onnx_.load(out).graph.initializer}
    (scale,) = [v for k, v in scales.items() if k.startswith("input") and "scale" in k]
    assert float(onnx_.numpy_helper.to_array(scale)) == pytest.approx(
        max(abs(ref["input"][1]), abs(ref["input"][2])) / 127, rel=1e-6
    )
    quantize(cnn_path, tmp_path / "h.onnx", data=cnn_data, method="minmax", refine="none",
             high_precision="fp16", show_progress=False)  # fmt: skip
    assert kept == [True, False]
