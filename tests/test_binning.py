"""The compiled binning path gives exactly the bins of the numpy path and of exact arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from synthetic import images, save, small_cnn

from quantbench import binning, collect
from quantbench.collect import collect_stats
from quantbench.data import open_data
from quantbench.graph import calibration_tensors, open_graph
from quantbench.stats import exponent_for


def _exact_bins(values: np.ndarray, exponent: int) -> np.ndarray:
    """HALF_BINS + floor(x / 2**e) with rational arithmetic: no floating point at all."""
    counts = np.zeros(binning.NUM_BINS, dtype=np.int64)
    width = Fraction(2) ** exponent
    for v in values.tolist():
        counts[binning.HALF_BINS + math.floor(Fraction(v) / width)] += 1
    return counts


def _edge_values() -> np.ndarray:
    """Values on and next to bin edges, signed zeros, subnormals and the extremes of the grid."""
    e = -10
    edges = np.arange(-50, 50, dtype=np.float64) * 2.0**e
    near = np.concatenate([np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf)])
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 2.0**-149, -(2.0**-149)])
    top = (binning.HALF_BINS * 2.0**e) * np.array([0.999999, -0.999999, -1.0])
    return np.concatenate([edges, near, special, top]).astype(np.float32)


def test_edge_values_land_in_the_exact_bins() -> None:
    x = _edge_values()
    e = -10
    expected = _exact_bins(x, e)
    assert np.array_equal(binning.numpy_signed_counts(x, e), expected)
    assert np.array_equal(binning.signed_counts(x, e), expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", ["normal", "relu", "heavy", "odd-length"])
def test_compiled_and_numpy_bins_are_identical(dtype: type, shape: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(100_003 if shape == "odd-length" else 100_000)
    if shape == "relu":
        x = np.maximum(x, 0)
    elif shape == "heavy":
        x = np.clip(rng.standard_cauchy(x.size), -6e4, 6e4)  # finite in float16 too
    x = x.astype(dtype)
    e = exponent_for(float(np.abs(x.astype(np.float64)).max()))
    got = binning.signed_counts(x, e)
    assert got.dtype == np.int64 and got.sum() == x.size
    assert np.array_equal(got, binning.numpy_signed_counts(x, e))


def test_sample_matches_exact_arithmetic() -> None:
    x = np.random.default_rng(3).laplace(size=2000).astype(np.float32)
    e = exponent_for(float(np.abs(x).max()))
    assert np.array_equal(binning.signed_counts(x, e), _exact_bins(x, e))


def test_statistics_do_not_depend_on_binning_threads_or_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole-model statistics: 1 thread at batch 1 == 3 threads at batch 7 with many small
    flushes (the exponent grows between them), bit for bit."""
    graph = open_graph(save(small_cnn(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=images(40, seed=5) * 3)
    names = calibration_tensors(graph, "all")
    runs = []
    for threads, batch, pool in ((1, 1, 1 << 18), (3, 7, 3000)):
        monkeypatch.setattr(collect._Binner, "POOL", pool)
        source = open_data(tmp_path / "d.npz", graph.inputs, batch_size=batch)
        runs.append(
            collect_stats(graph, source, names, binning_threads=threads, show_progress=False)
        )
    one, many = runs
    assert list(one.tensors) == list(many.tensors)
    for name in names:
        a, b = one[name], many[name]
        assert (a.count, a.min, a.max, a.exponent) == (b.count, b.min, b.max, b.exponent), name
        assert np.array_equal(a.counts, b.counts), name
