"""TensorStats / StatsFile: exact merging, batching independence, resampling, persistence."""

from __future__ import annotations

import numpy as np
import pytest

from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import HALF_BINS, StatsFile, TensorStats, exponent_for, settled


def _stats(x: np.ndarray, chunks: int = 1, name: str = "t") -> TensorStats:
    s = TensorStats(name)
    for part in np.array_split(x, chunks):
        s.update(part)
    return s


@pytest.fixture()
def heavy_tail() -> np.ndarray:
    rng = np.random.default_rng(1)
    x = rng.laplace(0, 1, 50_000).astype(np.float32)
    x[::997] *= 40  # outliers that force the histogram to grow mid-stream
    return x


def test_two_halves_merged_equal_the_whole(heavy_tail):
    whole = _stats(heavy_tail)
    a, b = _stats(heavy_tail[:20_000]), _stats(heavy_tail[20_000:])
    merged = a.merge(b)
    assert np.array_equal(merged.counts, whole.counts)
    assert merged.exponent == whole.exponent
    assert (merged.count, merged.min, merged.max) == (whole.count, whole.min, whole.max)
    assert np.array_equal(b.merge(a).counts, whole.counts)  # order does not matter


def test_histogram_independent_of_batching_and_order(heavy_tail):
    reference = _stats(heavy_tail)
    rng = np.random.default_rng(7)
    shuffled = heavy_tail[rng.permutation(heavy_tail.size)]
    for chunks in (3, 17, 250):
        assert np.array_equal(_stats(shuffled, chunks).counts, reference.counts)


def test_growth_is_exact_rebinning():
    x = np.linspace(-1, 1, 10_001, dtype=np.float32)
    small_first = TensorStats("t")
    small_first.update(x * 0.001)  # tiny range first: very fine bins
    small_first.update(x * 100)  # then a range 10^5 x larger
    direct = _stats(np.concatenate([x * 0.001, x * 100]))
    assert np.array_equal(small_first.counts, direct.counts)


def test_exponent_keeps_max_inside_grid():
    for m in (1e-30, 0.37, 1.0, 2.0, 16384.0, 3e8):
        e = exponent_for(m)
        assert m < HALF_BINS * 2.0**e
        assert m >= HALF_BINS * 2.0 ** (e - 1)


def grid_values(j: int = 6, n: int = 20_000, seed: int = 0) -> tuple[np.ndarray, float]:
    """Signed values at fine-bin centres of width ``w = 2**-10`` plus one value at
    ``M = 2048 * j * w``: the fine grid is ``w`` and every edge of a 2048-bin histogram on
    ``[0, M]`` (``k * j * w``) is a fine edge, so resampling splits no fine bin."""
    w = 2.0**-10
    rng = np.random.default_rng(seed)
    top = 2048 * j
    k = rng.integers(0, top, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    x = np.concatenate([(k + 0.5) * w * sign, [top * w]]).astype(np.float32)
    return x, w


def test_abs_histogram_equals_numpy_exactly_on_grid_values():
    x, w = grid_values()
    s = _stats(x, chunks=7)
    assert s.bin_width == w and s.max_abs == float(x.max())
    ref, _ = np.histogram(np.abs(x), bins=2048, range=(0, s.max_abs))
    assert np.array_equal(s.abs_histogram(2048), ref)
    ref, _ = np.histogram(np.abs(x), bins=512, range=(0, s.max_abs))
    assert np.array_equal(s.abs_histogram(512), ref)


def test_signed_histogram_equals_numpy_exactly_on_grid_values():
    x, _ = grid_values(j=4, seed=3)
    s = _stats(x, chunks=5)
    t = s.max_abs
    for bins in (128, 2048):
        ref, _ = np.histogram(x, bins=bins, range=(-t, t))
        assert np.array_equal(s.signed_histogram(bins, -t, t), ref)


def _straddling_counts(values: np.ndarray, width: float, edges: np.ndarray) -> np.ndarray:
    """Per coarse bin: the values in the fine bins (of ``width``) that contain its two edges,
    the only values a linear split of fine bins can put on the wrong side (numpy only)."""
    fine = np.floor(values / width)
    at_edge = np.floor(edges / width)
    per_edge = np.array([np.count_nonzero(fine == e) for e in at_edge])
    return per_edge[:-1] + per_edge[1:]


def test_abs_histogram_on_arbitrary_values_within_the_straddling_fine_bins(heavy_tail):
    s = _stats(heavy_tail)
    ours = s.abs_histogram(2048)
    edges = np.linspace(0, s.max_abs, 2049)
    ref, _ = np.histogram(np.abs(heavy_tail), bins=edges)
    assert ours.sum() == pytest.approx(heavy_tail.size)
    bound = _straddling_counts(np.abs(heavy_tail).astype(np.float64), s.bin_width, edges)
    assert np.all(np.abs(ours - ref) <= bound + 1e-9)


def test_signed_histogram_on_arbitrary_values_within_the_straddling_fine_bins(heavy_tail):
    s = _stats(heavy_tail)
    t = s.max_abs
    edges = np.linspace(-t, t, 129)
    ours = s.signed_histogram(128, -t, t)
    ref, _ = np.histogram(heavy_tail, bins=edges)
    bound = _straddling_counts(heavy_tail.astype(np.float64), s.bin_width, edges)
    assert np.all(np.abs(ours - ref) <= bound + 1e-9)


def test_quantile_and_count_above():
    x = np.arange(1, 100_001, dtype=np.float32)
    s = _stats(x)
    assert s.abs_quantile(0.5) == pytest.approx(50_000, rel=1e-3)
    assert s.count_above(90_000) == pytest.approx(10_000, rel=1e-3)
    assert s.abs_quantile(1.0) == pytest.approx(100_000)


def test_nonfinite_values_counted_and_excluded():
    x = np.array([1.0, np.nan, -np.inf, 2.0, np.inf], dtype=np.float32)
    s = _stats(x)
    assert (s.nan_count, s.inf_count, s.count, s.max) == (1, 2, 2, 2.0)
    assert s.has_nonfinite


def test_all_zero_tensor_then_growth():
    s = _stats(np.zeros(100, np.float32))
    assert s.max_abs == 0 and s.count == 100
    s.update(np.array([3.0], np.float32))
    assert s.positive_counts()[0] == 100  # zeros stay in bin 0 after growth
    assert s.count == 101


def test_save_load_roundtrip(tmp_path, heavy_tail):
    sf = StatsFile("m" * 64, "d" * 64, 10, {"a:0 x": _stats(heavy_tail, name="a:0 x")}, "0.1.0")
    path = sf.save(tmp_path / "s.stats.npz")
    back = StatsFile.load(path)
    assert np.array_equal(back["a:0 x"].counts, sf["a:0 x"].counts)
    assert back.model_hash == sf.model_hash and back.num_samples == 10
    # deterministic bytes
    assert sf.save(tmp_path / "t.npz").read_bytes() == path.read_bytes()


def test_merge_files_checks_model(tmp_path, heavy_tail):
    a = StatsFile("m1", "d1", 5, {"t": _stats(heavy_tail[:100])})
    b = StatsFile("m2", "d2", 5, {"t": _stats(heavy_tail[100:])})
    with pytest.raises(QuantbenchError, match="different models"):
        StatsFile.merge([a, b])
    c = StatsFile("m1", "d2", 7, {"t": _stats(heavy_tail[100:])})
    merged = StatsFile.merge([a, c])
    assert merged.num_samples == 12
    assert np.array_equal(merged["t"].counts, _stats(heavy_tail).counts)


def test_load_rejects_foreign_files(tmp_path):
    bad = tmp_path / "x.npz"
    np.savez(bad, a=np.zeros(3))
    with pytest.raises(QuantbenchError, match="statistics file"):
        StatsFile.load(bad)
    junk = tmp_path / "j.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(QuantbenchError):
        StatsFile.load(junk)


def test_settled_statistics_give_the_same_histograms_once_and_never_stale() -> None:
    """Inside settled() a tensor's derived arrays are computed once (the same memory comes
    back, read-only), abs_histogram still hands each caller its own writable copy, and a
    tensor changed after the scope is read afresh."""
    rng = np.random.default_rng(5)
    t = TensorStats("t")
    t.update(rng.standard_normal(50_000).astype(np.float32))
    plain_hist, plain_cdf = t.abs_histogram(2048), t.abs_cdf()[1].copy()
    with settled():
        first, second = t.abs_histogram(2048), t.abs_histogram(2048)
        assert np.array_equal(first, plain_hist) and first is not second
        first[0] = -1.0  # the caller's copy: the next reader is unaffected
        assert t.abs_histogram(2048)[0] == plain_hist[0]
        cdf = t.abs_cdf()[1]
        assert np.shares_memory(cdf, t.abs_cdf()[1]) and np.array_equal(cdf, plain_cdf)
        with pytest.raises(ValueError):
            t.abs_fine_counts()[0] = 0
    t.update(np.array([100.0], np.float32))  # after the scope: new values, new histogram
    assert t.abs_histogram(2048)[-1] >= 1 and not np.array_equal(t.abs_cdf()[1], plain_cdf)


def test_a_settled_scope_inside_another_shares_its_arrays() -> None:
    """clip_flags settles its own reads; inside calibrate's scope it must reuse the tables'
    arrays, and leaving the inner scope must not end the outer one."""
    t = TensorStats("t")
    t.update(np.random.default_rng(6).standard_normal(10_000).astype(np.float32))
    with settled():
        outer = t.abs_cdf()[1]
        with settled():
            assert np.shares_memory(t.abs_cdf()[1], outer)
        assert np.shares_memory(t.abs_cdf()[1], outer)
    assert not np.shares_memory(t.abs_cdf()[1], outer)


# ---------------------------------------------------------------- int32 counters, widened
def _full_zero_bin(count: int) -> TensorStats:
    """Statistics of ``count`` zeros (the ReLU spike), held without binning that many values."""
    t = TensorStats("spike")
    t.update(np.zeros(1, np.float32))
    t.counts[HALF_BINS] = count
    t.count = count
    return t


def test_counters_are_int32_until_a_bin_could_overflow_them() -> None:
    t = TensorStats("x")
    t.update(np.linspace(-3, 3, 1000, dtype=np.float32))
    assert t.counts.dtype == np.int32 and t.counts.nbytes == 2 * HALF_BINS * 4
    limit = np.iinfo(np.int32).max
    near = _full_zero_bin(limit - 1)
    near.update(np.zeros(1, np.float32))  # exactly the int32 maximum: still fits
    assert near.counts.dtype == np.int32 and int(near.counts[HALF_BINS]) == limit
    near.update(np.zeros(3, np.float32))  # three more: 2**31 + 2 in one bin
    assert near.counts.dtype == np.int64 and int(near.counts[HALF_BINS]) == limit + 3
    assert int(near.counts.sum()) == near.count == limit + 3


def test_merge_and_relu_widen_the_counters_exactly() -> None:
    limit = np.iinfo(np.int32).max
    a, b = _full_zero_bin(limit - 5), _full_zero_bin(10)
    merged = a.merge(b)
    assert merged.counts.dtype == np.int64 and int(merged.counts[HALF_BINS]) == limit + 5
    # a Relu's bins taken from its source's batch: the Relu's own count passes the limit
    values = np.asarray([-1.0, -0.5, 0.25, 0.75], np.float32)
    batch = TensorStats("source").update(values)
    relu = _full_zero_bin(limit - 1)
    relu.update_relu(batch, values)
    assert relu.counts.dtype == np.int64
    assert relu.count == limit + 3 and int(relu.counts.sum()) == limit + 3
    assert int(relu.counts[:HALF_BINS].sum()) == 0  # max(x, 0) has no negatives


def test_saved_counts_keep_the_file_format(tmp_path, heavy_tail) -> None:
    stats = StatsFile("m", "d", 1, {"x": _stats(heavy_tail, name="x")})
    path = stats.save(tmp_path / "s.npz")
    with np.load(path) as z:
        assert z["cnt0"].dtype == np.int64
    loaded = StatsFile.load(path)
    assert loaded["x"].counts.dtype == np.int32
    assert np.array_equal(loaded["x"].counts, stats["x"].counts)
