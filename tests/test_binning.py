"""The compiled binning path gives exactly the bins of the numpy path and of exact arithmetic."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from synthetic import images, save, small_cnn

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.collect import statspass as collect
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import open_data
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.stats import binning
from quantbench.stats.tensorstats import TensorStats, exponent_for


@pytest.fixture(autouse=True, scope="module", params=["c", "numba"])
def compiled(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test on both compiled paths: the C kernels (built at install) and numba's (an
    install without a C compiler; loaded by warm_up, as a large statistics pass loads it)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("QUANTBENCH_BINNING", "" if request.param == "c" else "numba")
    binning._native.cache_clear()
    binning.warm_up()
    assert binning.backend() == request.param
    yield request.param
    patch.undo()
    binning._native.cache_clear()


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


def _tiled(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` repeated past :data:`binning.SMALL` values (so :func:`binning.scan` takes the
    compiled path, not the numpy one it uses for small arrays) and the repeat count."""
    reps = binning.SMALL // x.size + 1
    return np.tile(x, reps), reps


@pytest.mark.parametrize("tiled", [False, True], ids=["small", "compiled-size"])
def test_edge_values_land_in_the_exact_bins(tiled: bool) -> None:
    # without -HALF_BINS * 2**e, which is off the grid
    x = _binned_as_exact(_edge_values()[:-1], -10, tiled)
    for scan in (binning.scan, binning.numpy_scan):
        seen = scan(x, -10)
        assert (seen.lo, seen.hi, seen.finite) == (float(x.min()), float(x.max()), x.size)


def _binned_as_exact(x: np.ndarray, e: int, tiled: bool) -> np.ndarray:
    """Assert that every binning path (counts alone, scans; numpy and compiled) puts ``x`` (tiled
    past SMALL values when ``tiled``) in the bins of the rational reference; the ``x`` binned."""
    expected = _exact_bins(x, e)
    if tiled:
        x, reps = _tiled(x)
        expected = expected * reps
    assert np.array_equal(binning.numpy_finite_counts(x, e), expected)
    assert np.array_equal(binning.finite_counts(x, e), expected)
    for scan in (binning.scan, binning.numpy_scan):
        seen = scan(x, e)
        assert seen.counts is not None and np.array_equal(seen.counts, expected)
    return x


@pytest.mark.parametrize("tiled", [False, True], ids=["small", "compiled-size"])
def test_a_value_on_the_grid_edge_is_off_the_grid(tiled: bool) -> None:
    """|v| == HALF_BINS * 2**e needs the next exponent (stats.exponent_for agrees)."""
    e = -10
    edge = np.float32(-binning.HALF_BINS * 2.0**e)
    assert exponent_for(abs(float(edge))) == e + 1
    x, reps = _tiled(np.array([0.5, edge], np.float32)) if tiled else ([0.5, edge], 1)
    for scan in (binning.scan, binning.numpy_scan):
        seen = scan(np.asarray(x, np.float32), e)
        assert seen.counts is None and seen.lo == float(edge) and seen.finite == 2 * reps


@pytest.mark.parametrize("tiled", [False, True], ids=["small", "compiled-size"])
def test_non_finite_values_are_counted_not_binned(tiled: bool) -> None:
    x = np.array([1.0, np.nan, -np.inf, 2.5, np.inf, np.nan, -3.0], np.float32)
    nonfinite = np.array([np.nan, np.inf], np.float32)
    e = -4
    expected = _exact_bins(np.array([1.0, 2.5, -3.0], np.float32), e)
    reps = 1
    if tiled:
        (x, reps), (nonfinite, _) = _tiled(x), _tiled(nonfinite)
        expected = expected * reps
    for scan, counts in (
        (binning.scan, binning.finite_counts),
        (binning.numpy_scan, binning.numpy_finite_counts),
    ):
        seen = scan(x, e)
        assert (seen.lo, seen.hi) == (-3.0, 2.5)
        assert (seen.finite, seen.nan, seen.inf) == (3 * reps, 2 * reps, 2 * reps)
        assert np.array_equal(seen.counts, expected)
        assert np.array_equal(counts(x, e), expected)
        empty = scan(nonfinite, e)
        assert (empty.finite, empty.counts) == (0, None)
        assert empty.nan == empty.inf == nonfinite.size // 2


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
    got = binning.finite_counts(x, e)
    assert got.dtype == np.int64 and got.sum() == x.size
    assert np.array_equal(got, binning.numpy_finite_counts(x, e))
    fast, slow = binning.scan(x, e), binning.numpy_scan(x, e)
    assert (fast.lo, fast.hi, fast.finite) == (slow.lo, slow.hi, slow.finite)
    assert np.array_equal(fast.counts, got) and np.array_equal(slow.counts, got)
    assert binning.scan(x, e - 1).counts is None  # one exponent finer: max|x| is off the grid


def test_sample_matches_exact_arithmetic() -> None:
    x = np.random.default_rng(3).laplace(size=5000).astype(np.float32)  # > SMALL: compiled
    e = exponent_for(float(np.abs(x).max()))
    assert np.array_equal(binning.finite_counts(x, e), _exact_bins(x, e))


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


def _reference_update(stats: TensorStats, x: np.ndarray) -> None:
    """The statistics update as released before the compiled path (numpy only): the contract
    the fused scan must keep bit for bit."""
    x = x.reshape(-1).astype(np.float64)
    finite = x[np.isfinite(x)]
    stats.nan_count += int(np.isnan(x).sum())
    stats.inf_count += int(np.isinf(x).sum())
    if finite.size == 0:
        return
    lo, hi = float(finite.min()), float(finite.max())
    stats._grow(exponent_for(max(abs(lo), abs(hi))))
    idx = np.floor(finite * 2.0**-stats.exponent).astype(np.int64) + binning.HALF_BINS
    stats.counts += np.bincount(idx, minlength=binning.NUM_BINS)
    stats._add_range(int(finite.size), lo, hi)


def test_streamed_statistics_equal_the_released_algorithm() -> None:
    """Batches whose range grows and shrinks (the grid widens mid-stream), with NaN/Inf."""
    rng = np.random.default_rng(11)
    new, old = TensorStats("t"), TensorStats("t")
    for scale in (0.01, 0.5, 0.02, 40.0, 3.0, 1e-5, 900.0, 1.0):
        x = (rng.standard_normal(5000) * scale).astype(np.float32)
        x[rng.integers(0, x.size, 3)] = np.nan
        x[rng.integers(0, x.size, 2)] = np.inf
        new.update(x)
        _reference_update(old, x)
        assert new.exponent == old.exponent
        assert np.array_equal(new.counts, old.counts)
        assert (new.count, new.min, new.max) == (old.count, old.min, old.max)
        assert (new.nan_count, new.inf_count) == (old.nan_count, old.inf_count)


def test_large_batches_run_in_parts_with_the_same_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose exposed activations exceed the budget is run in parts: the same bins as
    one run of the whole batch, and onnxruntime never sees more than the part size."""
    graph = open_graph(save(small_cnn(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=images(40, seed=9))
    names = calibration_tensors(graph, "all")
    whole = collect_stats(
        graph, open_data(tmp_path / "d.npz", graph.inputs, batch_size=40), names,
        binning_threads=1, show_progress=False,
    )  # fmt: skip
    seen: list[int] = []
    infer = collect.OnnxRuntimeRunner.infer

    def spy(self, feed, names):  # noqa: ANN001
        seen.append(len(feed["input"]))
        return infer(self, feed, names)

    monkeypatch.setattr(collect.OnnxRuntimeRunner, "infer", spy)
    monkeypatch.setattr(collect, "ACTIVATION_BUDGET", 1)  # every part a single sample
    parts = collect_stats(
        graph, open_data(tmp_path / "d.npz", graph.inputs, batch_size=20), names,
        binning_threads=2, show_progress=False,
    )  # fmt: skip
    assert seen == [1] * 40  # one sample first, to measure the activations per sample
    assert parts.num_samples == whole.num_samples == 40
    for name in names:
        assert np.array_equal(parts[name].counts, whole[name].counts), name


def test_chunks_scanned_apart_merge_to_the_whole_scan() -> None:
    """merge_scans of a tensor's chunks equals scanning it whole: counts, range, NaN/Inf, and
    'off the grid' when any chunk is; a chunk of only NaN/Inf changes nothing but the counts."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(30_000) * 3).astype(np.float32)
    x[100:140] = np.nan
    x[7000] = -np.inf
    x[20_000:29_000] = np.nan  # a whole chunk without a finite value
    e = exponent_for(float(np.nanmax(np.abs(x[np.isfinite(x)]))))
    for exponent in (e, e - 1):  # fits / the largest |x| is off the grid
        whole = binning.numpy_scan(x, exponent)
        chunks = [x[i : i + 4500] for i in range(0, x.size, 4500)]
        assert any(np.isnan(c).all() for c in chunks)
        merged = binning.merge_scans([binning.scan(c, exponent) for c in chunks])
        fields = ("lo", "hi", "finite", "nan", "inf")
        assert [getattr(merged, f) for f in fields] == [getattr(whole, f) for f in fields]
        if whole.counts is None:
            assert merged.counts is None
        else:
            assert np.array_equal(merged.counts, whole.counts)


def test_statistics_do_not_depend_on_the_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor binned in many small chunks on several threads (the grid widening between
    batches) gives the statistics of binning it whole on one thread, bit for bit."""
    graph = open_graph(save(small_cnn(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=images(24, seed=2) * 5)
    names = calibration_tensors(graph, "all")
    runs = []
    scanned: list[list[int]] = []
    scan = binning.scan

    def spy(x: binning.Values, e: int) -> binning.Scan:
        scanned[-1].append(sum(np.size(p) for p in (x if isinstance(x, list) else [x])))
        return scan(x, e)

    monkeypatch.setattr(binning, "scan", spy)
    for threads, chunk, pool in ((1, 1 << 30, 1 << 30), (4, 5000, 20_000)):
        scanned.append([])
        monkeypatch.setattr(collect._Binner, "CHUNK", chunk)
        monkeypatch.setattr(collect._Binner, "POOL", pool)
        source = open_data(tmp_path / "d.npz", graph.inputs, batch_size=4)
        runs.append(
            collect_stats(graph, source, names, binning_threads=threads, show_progress=False)
        )
    whole, chunked = runs
    assert max(scanned[0]) > 20_000 and max(scanned[1]) == 5000  # whole, then in chunks
    for name in names:
        a, b = whole[name], chunked[name]
        assert (a.count, a.min, a.max, a.exponent) == (b.count, b.min, b.max, b.exponent), name
        assert (a.nan_count, a.inf_count) == (b.nan_count, b.inf_count), name
        assert np.array_equal(a.counts, b.counts), name


@pytest.mark.parametrize("nonfinite", [False, True])
def test_pieces_scan_as_their_concatenation(nonfinite: bool) -> None:
    """A list of arrays (a tensor's pooled batches, never copied) scans and counts as the
    concatenated array does; pieces of any size, an empty one included."""
    rng = np.random.default_rng(8)
    pieces = [(rng.standard_normal(n) * 2).astype(np.float32) for n in (7000, 1, 0, 300, 9000)]
    if nonfinite:
        pieces[3][5] = np.nan
        pieces[4][:2] = -np.inf
    whole = np.concatenate(pieces)
    finite = whole[np.isfinite(whole)]
    e = exponent_for(float(np.abs(finite).max()))
    for exponent in (e, e - 1):
        a, b = binning.scan(pieces, exponent), binning.numpy_scan(whole, exponent)
        assert (a.lo, a.hi, a.finite, a.nan, a.inf) == (b.lo, b.hi, b.finite, b.nan, b.inf)
        assert (a.counts is None) == (b.counts is None) == (exponent != e)
        if b.counts is not None:
            assert np.array_equal(a.counts, b.counts)
    assert np.array_equal(binning.finite_counts(pieces, e), _exact_bins(finite, e))


@pytest.mark.parametrize("nonfinite", [False, True])
def test_the_numpy_path_in_blocks_scans_as_the_whole(monkeypatch, nonfinite: bool) -> None:
    """Before the compiled kernels load, the numpy path bins a block of NUMPY_BLOCK values at
    a time (bounded temporaries): the same scan as the whole array, exact bins, a block with
    NaN/Inf or off the grid anywhere (here blocks of 1,000 over pieces of 7,000 and 9,000)."""
    rng = np.random.default_rng(9)
    pieces = [(rng.standard_normal(n) * 2).astype(np.float32) for n in (7000, 0, 9000)]
    pieces[2][8500] = 40.0  # the only value off the grid one exponent down: in the last block
    if nonfinite:
        pieces[0][6100] = np.nan
        pieces[2][1:3] = -np.inf
    whole = np.concatenate(pieces)
    finite = whole[np.isfinite(whole)]
    e = exponent_for(float(np.abs(finite).max()))
    wholes = {x: binning.numpy_scan(whole, x) for x in (e, e - 1)}  # one array at once
    monkeypatch.setattr(binning, "_compiled", lambda: None)
    monkeypatch.setattr(binning, "NUMPY_BLOCK", 1000)
    sizes: list[int] = []
    real = binning._numpy_scan
    monkeypatch.setattr(binning, "_numpy_scan", lambda x, e: sizes.append(x.size) or real(x, e))
    for exponent, b in wholes.items():
        a = binning.scan(pieces, exponent)
        assert (a.lo, a.hi, a.finite, a.nan, a.inf) == (b.lo, b.hi, b.finite, b.nan, b.inf)
        assert (a.counts is None) == (b.counts is None) == (exponent != e)
    assert max(sizes) == 1000 and len(sizes) == 2 * 16  # a block at a time, never a piece
    assert np.array_equal(binning.scan(pieces, e).counts, _exact_bins(finite, e))
    assert np.array_equal(binning.finite_counts(pieces, e), _exact_bins(finite, e))


def test_relu_of_pieces_equals_relu_of_the_whole() -> None:
    """update_relu given pieces bins max(x, 0) as given the concatenated array (both paths:
    the source's bins reused, and the finer grid binned afresh)."""
    rng = np.random.default_rng(4)
    for neg_scale in (1.0, 50.0):  # 50: the negatives set the source's grid, Relu's is finer
        pieces = [rng.standard_normal(n).astype(np.float32) for n in (5000, 6000)]
        pieces = [np.where(p < 0, p * neg_scale, p) for p in pieces]
        whole = np.concatenate(pieces)
        src, relu_pieces, relu_whole = TensorStats("x"), TensorStats("r"), TensorStats("r")
        added = src.update(whole)
        relu_pieces.update_relu(added, pieces)
        relu_whole.update(np.maximum(whole, 0))
        assert relu_pieces.exponent == relu_whole.exponent
        assert np.array_equal(relu_pieces.counts, relu_whole.counts)
        assert (relu_pieces.count, relu_pieces.max) == (relu_whole.count, relu_whole.max)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("what", ["nan", "inf", "off-grid"])
def test_one_odd_value_anywhere_in_a_long_array(where: str, what: str) -> None:
    """A NaN, an Inf or a value off the grid at the start, in the middle or at the end of a
    long array given in two pieces gives exactly the numpy scan of the whole array (its
    counts, or none)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(400_000) * 4).astype(np.float32)
    e = exponent_for(float(np.abs(x).max()))
    at = {"first": 5, "middle": 131_149, "last": x.size - 3}[where]
    x[at] = {"nan": np.nan, "inf": -np.inf, "off-grid": binning.HALF_BINS * 2.0**e}[what]
    fast, slow = binning.scan([x[:1000], x[1000:]], e), binning.numpy_scan(x, e)
    assert (fast.lo, fast.hi, fast.finite, fast.nan, fast.inf) == (
        slow.lo,
        slow.hi,
        slow.finite,
        slow.nan,
        slow.inf,
    )
    assert (fast.counts is None) == (slow.counts is None)
    if slow.counts is not None:
        assert np.array_equal(fast.counts, slow.counts)


@pytest.mark.parametrize(("overlap", "pool_total"), [("0", None), ("1", None), ("0", 3000)])
def test_parts_binned_overlapped_or_in_turn_give_the_same_bins(
    tmp_path, monkeypatch, overlap, pool_total
):
    """Binning a part while onnxruntime infers the next (QUANTBENCH_BIN_OVERLAP=1) or taking
    turns: per-sample parts, pooled small tensors (or, past a bound on all pools, the fullest
    binned early), bit-identical to the reference of every tensor exposed and binned directly
    by TensorStats."""
    graph = open_graph(save(small_cnn(), tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", input=images(24, seed=4))
    names = calibration_tensors(graph, "all")
    outputs = [n for n in names if n not in {s.name for s in graph.inputs}]
    runner = OnnxRuntimeRunner(expose(graph.model, outputs, graph.elem_types))
    reference = {n: TensorStats(n) for n in names}
    for feed in open_data(tmp_path / "d.npz", graph.inputs, batch_size=24).batches():
        values = {**feed, **runner.infer(feed, outputs)}
        for n in names:
            reference[n].update(values[n])
    monkeypatch.setenv("QUANTBENCH_BIN_OVERLAP", overlap)
    monkeypatch.setattr(collect, "ACTIVATION_BUDGET", 1)  # every part a single sample
    if pool_total is not None:
        monkeypatch.setattr(collect._Binner, "POOL_TOTAL", pool_total)
        flushed = []
        real_add = collect._Binner.add
        monkeypatch.setattr(
            collect._Binner, "add", lambda b, v: flushed.extend(d := real_add(b, v)) or d
        )
    got = collect_stats(
        graph, open_data(tmp_path / "d.npz", graph.inputs, batch_size=8), names,
        binning_threads=3, show_progress=False,
    )  # fmt: skip
    assert got.num_samples == 24
    if pool_total is not None:  # the bound bit: pools far from full were binned before the end
        assert flushed and all(sum(p.size for p in ps) < collect._Binner.POOL for _, ps in flushed)
    for n in names:
        a, b = got[n], reference[n]
        assert (a.exponent, a.count, a.min, a.max) == (b.exponent, b.count, b.min, b.max), n
        assert np.array_equal(a.counts, b.counts), n


@pytest.mark.parametrize("what", ["nan", "off-grid"])
def test_a_scan_cut_short_leaves_no_counts_behind(what: str) -> None:
    """A scan that bins some blocks into the thread's sub-histograms and then meets a NaN or a
    value off the grid returns no counts; the next scan on that thread must start from zero
    (its counts equal the numpy path's), not from the abandoned blocks' counts."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(5 * binning.BLOCK) * 3).astype(np.float32)
    e = exponent_for(float(np.abs(x).max()))
    bad = x.copy()
    bad[-1] = np.nan if what == "nan" else binning.HALF_BINS * 2.0**e
    assert bad.size > binning.DIRECT  # the sub-histogram path
    cut = binning.scan(bad, e)
    assert cut.counts is None or what == "nan"
    again = binning.scan(x, e)
    assert np.array_equal(again.counts, binning.numpy_scan(x, e).counts)
    assert np.array_equal(binning.finite_counts(x, e), binning.numpy_finite_counts(x, e))


@pytest.mark.parametrize("direct", [0, 1 << 30], ids=["sub-histograms", "direct"])
def test_counts_are_exact_on_either_counting_path(monkeypatch, direct: int) -> None:
    """The four int32 sub-histograms and the direct int64 counts give the exact bins (values on
    and next to every edge, a long run of zeros), whatever path the size picks."""
    monkeypatch.setattr(binning, "DIRECT", direct)
    e = -10
    edges = _edge_values()
    edges = edges[np.abs(edges) < binning.HALF_BINS * 2.0**e]  # on the grid
    x, reps = _tiled(edges)
    x = np.concatenate([x, np.zeros(70_000, np.float32)])
    expected = _exact_bins(edges, e) * reps
    expected[binning.HALF_BINS] += 70_000
    assert np.array_equal(binning.scan(x, e).counts, expected)
    assert np.array_equal(binning.finite_counts(x, e), expected)


def test_many_small_pieces_of_two_dtypes_count_as_their_concatenation() -> None:
    """Hundreds of small pooled pieces (an LSTM's per-step outputs), float16 among float32,
    are joined before they are scanned; the scan equals the numpy scan of the whole."""
    rng = np.random.default_rng(9)
    pieces = [
        (rng.standard_normal(100) * 2).astype(np.float16 if i % 7 == 3 else np.float32)
        for i in range(300)
    ]
    pieces.insert(150, (rng.standard_normal(binning.JOIN + 5) * 2).astype(np.float32))
    whole = np.concatenate([p.astype(np.float32) for p in pieces])
    e = exponent_for(float(np.abs(whole).max()))
    a, b = binning.scan(pieces, e), binning.numpy_scan(whole, e)
    assert (a.lo, a.hi, a.finite) == (b.lo, b.hi, b.finite)
    assert np.array_equal(a.counts, b.counts)


@pytest.mark.parametrize("tiled", [False, True], ids=["small", "compiled-size"])
def test_float64_subnormals_below_zero_stay_below_zero_at_a_wide_bin(tiled: bool) -> None:
    """At a bin width of 8 (e = 3) -5e-324 * 2**-3 underflows to -0.0 in float64, but the value
    is below 0: it belongs in bin -1 (HALF_BINS - 1), as the rational reference says; +5e-324
    and -0.0 belong in bin 0."""
    x = np.array([-5e-324, -3 * 5e-324, 5e-324, -0.0, -(2.0**-1070), -1.0, 7.9], np.float64)
    expected = _exact_bins(x, 3)
    assert expected[binning.HALF_BINS - 1] == 4 and expected[binning.HALF_BINS] == 3
    _binned_as_exact(x, 3, tiled)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "where", ["none", "first", "step-edge", "tail", "every-step", "all-nan", "all-inf"]
)
def test_a_range_scan_equals_numpys_min_and_max(dtype: type, where: str) -> None:
    """The range (C: one read, NaN/Inf found per 64-value step and read again value by value)
    equals numpy's min and max of the finite values and its NaN/Inf counts, wherever the odd
    values sit: none, the first value, the last of a step, the tail past the last whole step,
    one in every step, or nothing finite at all."""
    rng = np.random.default_rng(17)
    x = (rng.standard_normal(3 * binning.SMALL + 37) * 5).astype(dtype)
    x[1000] = 9.5  # the extremes, away from the odd values
    x[2000] = -8.25
    odd = {"none": [], "first": [0], "step-edge": [63, 64], "tail": [x.size - 1],
           "every-step": list(range(5, x.size, 64))}.get(where, [])  # fmt: skip
    for i, j in enumerate(odd):
        x[j] = (np.nan, np.inf, -np.inf)[i % 3]
    if where == "all-nan":
        x[:] = np.nan
    if where == "all-inf":
        x[:] = np.inf
    finite = x[np.isfinite(x)]
    got = binning.range_scan(x)
    assert got.nan == int(np.isnan(x).sum()) and got.inf == int(np.isinf(x).sum())
    assert got.finite == finite.size
    if finite.size:
        assert (got.lo, got.hi) == (float(finite.min()), float(finite.max()))
    else:
        assert (got.lo, got.hi) == (math.inf, -math.inf)
