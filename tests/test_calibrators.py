"""Built-in calibrators against independent, slow reference implementations.

Every reference here is written the plain way, one candidate at a time, from the published
algorithm (TensorRT slides, pytorch-quantization's loop, MSE brute force) or is the real library
(onnxruntime's ``HistogramCollector``), and is fed the same histogram as the calibrator.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import scipy.stats

from quantbench.calibrators import (
    all_methods,
    compute_amax,
    compute_amaxes,
    expand_methods,
    parse_method,
    spec,
    tables_on,
)
from quantbench.calibrators import entropy as entropy_module
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats
from quantbench.table import scale_from_amax

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _distributions() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261202)
    n = 200_000
    data = {
        "normal": rng.standard_normal(n),
        "laplace_outliers": np.concatenate([rng.laplace(size=n), [25.0, -40.0, 31.0]]),
        "uniform": rng.uniform(-1.0, 1.0, n),
        "relu": np.maximum(rng.standard_normal(n), 0.0),
        "tiny": np.array([0.1, -0.3, 0.5, 2.0, 0.7]),
        "constant": np.full(1000, 0.75),
    }
    return {name: x.astype(np.float32) for name, x in data.items()}


DATA = _distributions()
NAMES = list(DATA)


def stats_of(x: np.ndarray, name: str = "t") -> TensorStats:
    stats = TensorStats(name)
    stats.update(x)
    return stats


@pytest.fixture(scope="module")
def stats_by_name() -> dict[str, TensorStats]:
    return {name: stats_of(x, name) for name, x in DATA.items()}


# --------------------------------------------------------------------------- references


def slide_entropy_amax(bins: np.ndarray, max_abs: float) -> float:
    """Migacz (GTC 2017) pseudocode, one candidate at a time, floor(i/128)-bin levels with the
    remainder in the last level; threshold (m + 0.5) * bin width."""
    num_bins = bins.size
    divergences = []
    for i in range(128, num_bins + 1):
        p = bins[:i].copy()
        p[i - 1] += bins[i:].sum()
        source = bins[:i]
        level = np.minimum(np.arange(i) // (i // 128), 127)
        level_count = np.bincount(level, weights=source, minlength=128)
        level_nonempty = np.bincount(level, weights=(source > 0).astype(float), minlength=128)
        q = np.zeros(i)
        nonempty = source > 0
        q[nonempty] = level_count[level[nonempty]] / level_nonempty[level[nonempty]]
        terms = p > 0
        if np.any(q[terms] == 0):
            divergences.append(math.inf)
            continue
        p_norm, q_norm = p / p.sum(), q / q.sum()
        divergences.append(float(np.sum(p_norm[terms] * np.log(p_norm[terms] / q_norm[terms]))))
    m = 128 + int(np.argmin(divergences))
    return (m + 0.5) * max_abs / num_bins


def pytorch_entropy_amax(calib_hist: np.ndarray, calib_bin_edges: np.ndarray) -> float:
    """pytorch-quantization ``_compute_amax_entropy`` (num_bits=8, signed, stride 1)."""
    bins = calib_hist.copy()
    bins[0] = bins[1]
    divergences = []
    for i in range(128, len(bins) + 1):
        space = np.linspace(0, i, num=128 + 1)
        digitized = np.digitize(np.arange(i), space) - 1
        digitized[bins[:i] == 0] = -1
        valid = digitized != -1
        level_count = np.bincount(digitized[valid], weights=bins[:i][valid], minlength=128)
        level_size = np.bincount(digitized[valid], minlength=128)
        new_density = np.zeros(i)
        new_density[valid] = level_count[digitized[valid]] / level_size[digitized[valid]]
        reference_density = np.array(bins[:i])
        reference_density[-1] += np.sum(bins[i:])
        with np.errstate(invalid="ignore", divide="ignore"):
            divergences.append(scipy.stats.entropy(reference_density, new_density))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return float(calib_bin_edges[last_argmin + 128])


def brute_force_mse_amax(counts: np.ndarray, max_abs: float) -> float:
    """pytorch-quantization ``_compute_amax_mse``: fake-quantize the bin centres per candidate."""
    edges = np.linspace(0.0, max_abs, counts.size + 1)
    centers = (edges[1:] + edges[:-1]) / 2
    errors = []
    for i in range(128, len(centers)):
        amax = centers[i]
        scale = 127.0 / amax
        quantized = np.clip(np.rint(centers * scale), -127, 127) / scale
        errors.append(np.sum((quantized - centers) ** 2 * counts))
    return float(centers[128 + int(np.argmin(errors))])


def onnxruntime_collector(num_bins: int):
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")
    return calibrate.HistogramCollector(
        method="entropy",
        symmetric=False,
        num_bins=num_bins,
        num_quantized_bins=128,
        percentile=99.999,
        scenario="same",
    )


def onnxruntime_entropy_amax(x: np.ndarray, num_bins: int) -> float:
    """onnxruntime's real Entropy calibration of raw data (one ``collect`` call)."""
    collector = onnxruntime_collector(num_bins)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints progress
        collector.collect({"t": x})
        lo, hi, *_ = collector.compute_collection_result()["t"]
    return max(abs(float(lo)), abs(float(hi)))


def scale_hex(amax: float) -> str:
    return struct.pack(">f", scale_from_amax(amax)).hex()


def imagenet_like_input(seed: int) -> np.ndarray:
    """Normalised images whose pixels saturate at 0 and 255, like real photos."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.rint(rng.normal(128, 80, size=(8, 3, 32, 32))), 0, 255)
    pixels = pixels.astype(np.float32) / np.float32(255)
    mean = np.array(IMAGENET_MEAN, np.float32)[None, :, None, None]
    std = np.array(IMAGENET_STD, np.float32)[None, :, None, None]
    return ((pixels - mean) / std).astype(np.float32)


# --------------------------------------------------------------------------- minmax


@pytest.mark.parametrize("name", NAMES)
def test_minmax_is_max_abs(name: str, stats_by_name: dict[str, TensorStats]) -> None:
    assert compute_amax("minmax", stats_by_name[name]) == float(np.abs(DATA[name]).max())


# --------------------------------------------------------------------------- entropy:trt


@pytest.mark.parametrize("name", NAMES)
def test_entropy_trt_matches_slide_pseudocode(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    stats = stats_by_name[name]
    expected = slide_entropy_amax(stats.abs_histogram(2048), stats.max_abs)
    assert compute_amax("entropy:slides", stats) == expected
    # the default (quantbench's variant) leaves the zero spike out of P before the same search:
    # the values in the finest bins at 0, [-w, w) with w the fine width, counted from the data
    x = DATA[name].astype(np.float64)
    spike = np.count_nonzero((x >= -stats.bin_width) & (x < stats.bin_width))
    bins = stats.abs_histogram(2048)
    bins[0] = max(bins[0] - spike, 0.0)
    expected_trt = slide_entropy_amax(bins, stats.max_abs) if bins.any() else stats.max_abs
    assert compute_amax("entropy", stats) == expected_trt
    assert compute_amax("entropy:trt", stats) == expected_trt
    if spike == 0:
        assert expected_trt == expected


def test_entropy_trt_does_not_collapse_on_relu_zeros() -> None:
    """The literal slide search picks a tiny threshold for a ReLU output (zero spike); the
    default (quantbench's zero-spike variant) keeps most of the range."""
    rng = np.random.default_rng(3)
    relu = stats_of(np.maximum(rng.standard_normal(400_000), 0).astype(np.float32))
    literal, default = compute_amax("entropy:slides", relu), compute_amax("entropy", relu)
    assert literal < 0.5 * relu.max_abs  # 1.93 of 4.40
    assert default > 0.9 * relu.max_abs  # 4.12 of 4.40


def test_entropy_trt_fast_kl_matches_direct_kl(stats_by_name: dict[str, TensorStats]) -> None:
    """The prefix-sum KL of every candidate equals the plain per-candidate sum."""
    bins = stats_by_name["laplace_outliers"].abs_histogram(2048)
    edges = entropy_module.floor_group_edges(2048, 128, 128)
    _assert_matches_direct_kl(entropy_module.kl_divergences(bins, edges), bins, edges)


def _assert_matches_direct_kl(fast: np.ndarray, bins: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``fast`` equals the plain per-candidate KL (infinities where it is infinite, 1e-12
    elsewhere); returns the plain KL."""
    direct = np.array([entropy_module.kl_divergence_direct(bins, row) for row in edges])
    assert np.array_equal(np.isinf(fast), np.isinf(direct))
    finite = np.isfinite(direct)
    np.testing.assert_allclose(fast[finite], direct[finite], rtol=0, atol=1e-12)
    return direct


@pytest.mark.parametrize("name", ["laplace_outliers", "relu", "tiny", "flat"])
def test_entropy_shared_level_kl_matches_direct_kl(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    """The KL that shares the levels of equal group sizes equals the plain per-candidate sum,
    and picks the same candidate, exact ties included (a flat histogram: many equal KLs)."""
    if name == "flat":
        bins = np.zeros(2048)
        bins[:1500] = 3.0
    else:
        bins = stats_by_name[name].abs_histogram(2048)
    edges = entropy_module.floor_group_edges(2048, 128, 128)
    shared = entropy_module.kl_divergences_floor_groups(bins, edges)
    direct = _assert_matches_direct_kl(shared, bins, edges)
    best = int(np.flatnonzero(direct == direct[np.isfinite(direct)].min())[0])
    assert entropy_module.best_candidate(bins, edges, kl=shared) == best


@pytest.mark.parametrize("name", ["laplace_outliers", "relu", "tiny"])
def test_entropy_kl_over_distinct_level_ranges_is_bit_identical(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    """entropy:pytorch's KL, each distinct level range computed once and gathered per
    candidate, gives exactly the bits of the per-candidate blocks, and matches the plain KL."""
    bins = stats_by_name[name].abs_histogram(2048)
    bins[0] = bins[1]
    edges = entropy_module.digitize_group_edges(2048, 128, 128)
    ranges = entropy_module.digitize_group_ranges(2048, 128, 128)
    assert len(ranges.start) < edges.size // 10  # the point: far fewer ranges than levels
    gathered = entropy_module.kl_divergences(bins, edges, ranges)
    blocks = entropy_module.kl_divergences(bins, edges)
    assert gathered.tobytes() == blocks.tobytes()
    _assert_matches_direct_kl(gathered[::37], bins, edges[::37])


def test_level_ranges_name_each_levels_bins() -> None:
    """Each level of each candidate maps to the range of exactly its own first and end bin."""
    edges = entropy_module.digitize_group_edges(2048, 128, 128)
    ranges = entropy_module.LevelRanges.of(edges)
    assert np.array_equal(ranges.start[ranges.which], edges[:, :-1])
    assert np.array_equal(ranges.end[ranges.which], edges[:, 1:])


def test_a_table_of_many_tensors_matches_the_references(
    stats_by_name: dict[str, TensorStats],
) -> None:
    """The vectorised table path (one matrix product for mse) gives every tensor the amax of
    the slow references, in order, and 0 to an empty tensor."""
    tensors = [*stats_by_name.values(), TensorStats("empty")]
    mse = compute_amaxes("mse", tensors)
    slides = compute_amaxes("entropy:slides", tensors)
    for t, got_mse, got_slides in zip(tensors[:-1], mse, slides, strict=False):
        bins = t.abs_histogram(2048)
        assert got_mse == pytest.approx(brute_force_mse_amax(bins, t.max_abs), rel=1e-12, abs=0)
        assert got_slides == slide_entropy_amax(bins, t.max_abs)
    assert mse[-1] == slides[-1] == 0.0


def _numpy_posing_as_cupy() -> ModuleType:
    """NumPy under another name, with CuPy's ``asnumpy``: the device path's code (every
    histogram of a table at once) run on the host."""
    module = ModuleType("numpy_as_device")
    module.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    module.asnumpy = np.asarray
    return module


def test_a_table_on_a_device_matches_the_references(
    stats_by_name: dict[str, TensorStats], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``tables_on(device)`` the entropy and mse candidates of all tensors are scored at
    once (in chunks: 3 histograms here) and the near-ties settled on the host: every amax is
    the slow references' (and so the host path's), in order, empty tensors included."""
    monkeypatch.setattr(entropy_module, "DEVICE_HISTOGRAMS", 3)
    rng = np.random.default_rng(11)
    extra = [stats_of(rng.gamma(k, size=30_000).astype(np.float32), f"g{k}") for k in (1, 2, 5)]
    far = stats_of(rng.uniform(0.95, 1.0, 20_000).astype(np.float32), "far_from_0")  # NaN quirk
    tensors = [*stats_by_name.values(), *extra, far, TensorStats("empty")]
    with tables_on(_numpy_posing_as_cupy()):
        methods = ("entropy:slides", "entropy", "entropy:pytorch", "mse")
        got = {m: compute_amaxes(m, tensors) for m in methods}
    for i, t in enumerate(tensors[:-1]):
        bins = t.abs_histogram(2048)
        assert got["entropy:slides"][i] == slide_entropy_amax(bins, t.max_abs)
        assert got["entropy:pytorch"][i] == pytorch_entropy_amax(
            bins, np.linspace(0.0, t.max_abs, 2049)
        )
        assert got["mse"][i] == pytest.approx(brute_force_mse_amax(bins, t.max_abs), rel=1e-12)
    for m, amaxes in got.items():
        assert amaxes == compute_amaxes(m, tensors), m  # the host path, tensor by tensor
        assert amaxes[-1] == 0.0


def test_entropy_trt_level_edges_for_non_multiple_of_128() -> None:
    edges = entropy_module.floor_group_edges(2048, 128, 128)
    row = edges[300 - 128]  # i = 300: groups of 2 bins, the last level takes bins 254..299
    assert row[0] == 0 and row[1] == 2 and row[127] == 254 and row[128] == 300


@pytest.mark.parametrize("name", ["uniform", "constant"])
def test_entropy_trt_keep_everything_is_half_bin_above_max(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    """§1.3: when keeping the whole range wins, TensorRT writes 2048.5/2048 * max."""
    stats = stats_by_name[name]
    assert compute_amax("entropy", stats) == 2048.5 * stats.max_abs / 2048


def test_entropy_trt_reproduces_real_cache_value_bit_exactly() -> None:
    """model_convert's TRT 7.2.1 cache has ``input.1: 3caa54fc`` = 2.64 * 2048.5/2048 / 127 for
    an ImageNet-normalised input (max (1 - 0.406) / 0.225 = 2.64); MinMax writes 2.64 exactly."""
    stats = stats_of(imagenet_like_input(seed=3), "input.1")
    assert stats.max_abs == float(np.float32(2.64))
    assert scale_hex(compute_amax("entropy", stats)) == "3caa54fc"
    assert scale_hex(compute_amax("minmax", stats)) == "3caa4a58"


def test_entropy_trt_matches_fixture_cache_entry() -> None:
    cache = FIXTURES / "trt_calib_caches" / "trt7201_entropy2_model_convert.cache"
    if not cache.is_file():
        pytest.skip(f"fixture {cache} not present (shared fixtures are not checked out)")
    lines = cache.read_text().splitlines()
    assert lines[0] == "TRT-7201-EntropyCalibration2"
    entries = dict(line.rsplit(": ", 1) for line in lines[1:] if line)
    stats = stats_of(imagenet_like_input(seed=11), "input.1")
    assert scale_hex(compute_amax("entropy", stats)) == entries["input.1"]


# --------------------------------------------------------------------------- entropy:pytorch


@pytest.mark.parametrize("name", NAMES)
def test_entropy_pytorch_matches_reference_loop(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    stats = stats_by_name[name]
    hist = stats.abs_histogram(2048)
    edges = np.linspace(0.0, stats.max_abs, 2049)
    expected = pytorch_entropy_amax(hist, edges)
    assert compute_amax("entropy:pytorch", stats) == expected


def test_entropy_pytorch_nan_quirk_clips_to_first_nonempty_bin() -> None:
    """Data far from 0 leaves bins[:i] empty for small i: pytorch-quantization's NaN KL wins."""
    x = np.random.default_rng(5).uniform(0.95, 1.0, 50_000).astype(np.float32)
    stats = stats_of(x)
    hist = stats.abs_histogram(2048)
    expected = pytorch_entropy_amax(hist, np.linspace(0.0, stats.max_abs, 2049))
    amax = compute_amax("entropy:pytorch", stats)
    assert amax == expected
    assert amax < float(x.min())


# --------------------------------------------------------------------------- entropy:ort


ORT_CASES = [(name, 128) for name in NAMES] + [
    (name, 2048) for name in ("normal", "laplace_outliers", "relu", "tiny")
]


@pytest.mark.parametrize(("name", "num_bins"), ORT_CASES)
def test_entropy_ort_matches_onnxruntime_on_raw_data(
    name: str, num_bins: int, stats_by_name: dict[str, TensorStats]
) -> None:
    """ORT bins the raw float32 values with np.histogram; we re-bin our fine power-of-two grid
    (each of the 2t/num_bins wide ORT bins holds >= 8 fine bins), splitting the fine bins that
    straddle an ORT edge linearly, so counts differ slightly and the KL argmin may move by a
    bin on a flat KL curve: allow 2 ORT bins."""
    stats = stats_by_name[name]
    method = "entropy:ort" if num_bins == 128 else "entropy:ort-2048"
    theirs = onnxruntime_entropy_amax(DATA[name], num_bins)
    ours = compute_amax(method, stats)
    assert abs(ours - theirs) <= 2 * (2 * stats.max_abs / num_bins)


@pytest.mark.parametrize(
    ("name", "num_bins"),
    [("normal", 128), ("tiny", 128), ("laplace_outliers", 2048), ("relu", 2048)],
)
def test_entropy_ort_identical_to_onnxruntime_on_same_histogram(
    name: str, num_bins: int, stats_by_name: dict[str, TensorStats]
) -> None:
    """Given the same histogram, our threshold is ORT's bit for bit (float32 KL included)."""
    stats = stats_by_name[name]
    hist, edges = entropy_module.ort_histogram(stats, num_bins)
    _, np_edges = np.histogram(DATA[name], num_bins, range=(-edges[-1], edges[-1]))
    assert np.array_equal(edges, np_edges)
    histogram = (hist, edges, np.float32(stats.min), np.float32(stats.max))
    lo, hi = onnxruntime_collector(num_bins).get_entropy_threshold(histogram, 128)
    ours_lo, ours_hi = entropy_module.ort_entropy_threshold(hist, edges)
    assert (max(float(ours_lo), stats.min), min(float(ours_hi), stats.max)) == (lo, hi)


def test_entropy_ort_defaults_degenerate_to_max_calibration() -> None:
    """§1.6/§15: with quantize_static's defaults (128 bins) ORT's entropy is max|x|."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200_000), [12.0]]).astype(np.float32)
    stats = stats_of(x)
    assert onnxruntime_entropy_amax(x, 128) == 12.0
    assert compute_amax("entropy:ort", stats) == 12.0
    assert compute_amax("entropy", stats) < 6.0
    assert compute_amax("entropy:ort-2048", stats) < 6.0


# --------------------------------------------------------------------------- percentile


def order_statistic_bracket(x: np.ndarray, q: float, widen: int = 0) -> tuple[float, float]:
    """Sample values between which the q-quantile of the counts must fall (``widen`` more
    order statistics on each side)."""
    values = np.sort(np.abs(x.astype(np.float64)))
    rank = q * values.size
    low = max(math.ceil(rank - 1e-6) - 1 - widen, 0)
    high = min(math.floor(rank + 1e-6) + widen, values.size - 1)
    return float(values[min(low, high)]), float(values[max(low, high)])


@pytest.mark.parametrize("p", ["50", "99", "99.9", "99.99", "100"])
@pytest.mark.parametrize("name", NAMES)
def test_percentile_within_a_fine_bin_of_the_sample_quantile(
    name: str, p: str, stats_by_name: dict[str, TensorStats]
) -> None:
    stats = stats_by_name[name]
    amax = compute_amax(f"percentile:{p}", stats)
    low, high = order_statistic_bracket(DATA[name], float(p) / 100)
    assert low - stats.bin_width <= amax <= high + stats.bin_width


@pytest.fixture(scope="module")
def dense_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "normal": rng.standard_normal(2_000_000).astype(np.float32),
        "uniform": rng.uniform(-1.0, 1.0, 2_000_000).astype(np.float32),
    }


@pytest.mark.parametrize("p", [50.0, 90.0, 99.0])
@pytest.mark.parametrize("name", ["normal", "uniform"])
def test_percentile_matches_numpy_percentile_on_dense_data(
    name: str, p: float, dense_data: dict[str, np.ndarray]
) -> None:
    """np.percentile interpolates between the order statistics around rank q*(n-1); ours lies
    within a fine bin of those around rank q*n. Where those few samples are packed closer than
    a quarter bin, the two agree to one fine bin plus that spread."""
    x = dense_data[name]
    stats = stats_of(x)
    low, high = order_statistic_bracket(x, p / 100, widen=1)
    spread = high - low
    assert spread < stats.bin_width / 4, "data not dense enough for this check"
    expected = float(np.percentile(np.abs(x.astype(np.float64)), p))
    assert abs(compute_amax(f"percentile:{p}", stats) - expected) <= stats.bin_width + spread


def test_percentile_default_is_99_99(stats_by_name: dict[str, TensorStats]) -> None:
    stats = stats_by_name["laplace_outliers"]
    assert compute_amax("percentile", stats) == compute_amax("percentile:99.99", stats)
    assert compute_amax("percentile:100", stats) == stats.max_abs


@pytest.mark.parametrize("p", ["0", "-1", "100.5", "abc", "nan", "inf"])
def test_percentile_out_of_range_is_a_user_error(
    p: str, stats_by_name: dict[str, TensorStats]
) -> None:
    with pytest.raises(QuantbenchError, match="percentile"):
        compute_amax(f"percentile:{p}", stats_by_name["normal"])


# --------------------------------------------------------------------------- mse


@pytest.mark.parametrize("name", NAMES)
def test_mse_matches_brute_force(name: str, stats_by_name: dict[str, TensorStats]) -> None:
    stats = stats_by_name[name]
    expected = brute_force_mse_amax(stats.abs_histogram(2048), stats.max_abs)
    assert compute_amax("mse", stats) == pytest.approx(expected, rel=1e-12, abs=0)


def test_mse_clips_little_of_uniform_and_much_of_laplace(
    stats_by_name: dict[str, TensorStats],
) -> None:
    """Uniform data has no tail worth clipping; a Laplace body with rare outliers does."""
    uniform, laplace = stats_by_name["uniform"], stats_by_name["laplace_outliers"]
    assert compute_amax("mse", uniform) > 0.99 * uniform.max_abs
    assert compute_amax("mse", laplace) < 0.7 * laplace.max_abs


# --------------------------------------------------------------------------- all methods


def shuffled_batches(x: np.ndarray, seed: int) -> TensorStats:
    """Statistics built from many batches of shuffled values, merged from two shards."""
    rng = np.random.default_rng(seed)
    values = rng.permutation(x)
    cuts = np.sort(
        rng.choice(np.arange(1, max(values.size, 2)), size=min(7, values.size - 1), replace=False)
    )
    parts = np.split(values, cuts)
    half = len(parts) // 2
    shard_a, shard_b = TensorStats("t"), TensorStats("t")
    for part in parts[:half]:
        shard_a.update(part)
    for part in parts[half:]:
        shard_b.update(part)
    return shard_b.merge(shard_a)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_is_independent_of_batching(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    batched = shuffled_batches(DATA[name], seed=len(name))
    for method in all_methods():
        assert compute_amax(method, batched) == compute_amax(method, stats_by_name[name]), method


@pytest.mark.parametrize("name", NAMES)
def test_every_method_is_positive_and_at_most_just_above_max(
    name: str, stats_by_name: dict[str, TensorStats]
) -> None:
    stats = stats_by_name[name]
    for method in all_methods():
        amax = compute_amax(method, stats)
        assert 0 < amax <= 2048.5 / 2048 * stats.max_abs, method


def test_entropy_variants_disagree_as_documented() -> None:
    """§1.6: the three entropy flavours give different amax on the same N(0,1)+outlier data,
    and pytorch's zero-bin overwrite makes it keep far more of a ReLU output than TensorRT."""
    rng = np.random.default_rng(1)
    stats = stats_of(np.concatenate([rng.standard_normal(200_001), [12.0]]).astype(np.float32))
    flavours = [compute_amax(m, stats) for m in ("entropy", "entropy:pytorch", "entropy:ort-2048")]
    for i, a in enumerate(flavours):
        for b in flavours[i + 1 :]:
            assert abs(a - b) > 0.02 * a
    relu = stats_of(DATA["relu"])
    assert compute_amax("entropy:pytorch", relu) > 2 * compute_amax("entropy:slides", relu)


def test_empty_and_all_zero_tensors_give_zero() -> None:
    empty = TensorStats("empty")
    zeros = stats_of(np.zeros(100, np.float32))
    for method in all_methods():
        assert compute_amax(method, empty) == 0.0
        assert compute_amax(method, zeros) == 0.0


def test_very_small_and_large_magnitudes_scale_exactly() -> None:
    """The grid is a power of two: scaling data by 2**k scales every amax by exactly 2**k."""
    x = DATA["laplace_outliers"]
    base = stats_of(x)
    for k in (-60, 40):
        scaled = stats_of((x * np.float32(2.0**k)).astype(np.float32))
        assert scaled.exponent == base.exponent + k
        for method in all_methods():
            assert compute_amax(method, scaled) == compute_amax(method, base) * 2.0**k, method


# --------------------------------------------------------------------------- registry


def test_all_expands_to_every_method_and_variant() -> None:
    methods = expand_methods(["all"])
    for expected in (
        "minmax",
        "entropy",
        "entropy:pytorch",
        "entropy:ort",
        "percentile:99.99",
        "mse",
    ):
        assert expected in methods
    assert "entropy:ort-2048" not in methods  # slow niche variant: by name only
    assert expand_methods(["entropy:ort-2048"]) == ["entropy:ort-2048"]
    assert len(methods) == len(set(methods))
    assert expand_methods(["entropy:trt", "percentile"]) == ["entropy", "percentile:99.99"]


def test_registry_metadata() -> None:
    assert spec("minmax").trt_algorithm == "MinMaxCalibration"
    assert spec("entropy").trt_algorithm == "EntropyCalibration2"
    assert spec("entropy").default_option == "trt"
    for name in ("minmax", "entropy", "percentile", "mse"):
        description = spec(name).description
        assert description and "\n" not in description
    assert parse_method("percentile:99.9")[1] == "99.9"


@pytest.mark.parametrize("method", ["histogram", "entropy:tensorrt", "entropy:ort-128"])
def test_unknown_method_or_option_is_a_user_error(method: str) -> None:
    with pytest.raises(QuantbenchError):
        parse_method(method)


def test_numeric_entropy_option_is_a_user_error(stats_by_name: dict[str, TensorStats]) -> None:
    """parse_method lets numbers through for any calibrator; entropy has no numeric variant."""
    with pytest.raises(QuantbenchError, match="unknown variant"):
        compute_amax("entropy:5", stats_by_name["normal"])


@pytest.mark.parametrize("method", ["minmax:1", "mse:fast"])
def test_option_on_a_method_without_options_is_a_user_error(
    method: str, stats_by_name: dict[str, TensorStats]
) -> None:
    with pytest.raises(QuantbenchError, match="takes no option"):
        compute_amax(method, stats_by_name["normal"])


def test_a_range_reaching_float32_max_gets_finite_float32_scales() -> None:
    """An attention mask of finfo(float32).min next to ordinary values (a real transformer
    export): every method of ``all`` gives an amax of at most the largest float32, so a
    TensorRT cache can hold it (entropy's top bin edge lies above it; onnxruntime's float32
    histogram edges overflow on this range and gave NaN)."""
    big = float(np.finfo(np.float32).max)
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(50_000), np.full(20_000, -big), np.zeros(5_000)])
    stats = stats_of(x.astype(np.float32))
    for method in all_methods():
        amax = compute_amax(method, stats)
        assert math.isfinite(amax) and 0 < amax <= big, method
        assert math.isfinite(scale_from_amax(amax)), method
        assert compute_amaxes(method, [stats]) == [amax], method
    assert compute_amax("minmax", stats) == big


def test_rel_entr32_is_scipys_float32_rel_entr_bit_for_bit() -> None:
    """entropy:ort's KL no longer imports SciPy; its rel_entr must be SciPy's float32 one:
    random normalised distributions (tails spanning 30 decades, zeros, negatives) and the
    edge cases (0 against 0 and negatives, NaN, Inf, subnormals)."""
    from scipy.special import rel_entr

    rng = np.random.default_rng(2)
    for _ in range(40):
        x = (rng.random(20_000) ** rng.uniform(1, 30)).astype(np.float32)
        y = (rng.random(20_000) ** rng.uniform(1, 30)).astype(np.float32)
        x[rng.random(x.size) < 0.05] = 0
        y[rng.random(y.size) < 0.02] = 0
        x[rng.random(x.size) < 0.01] *= -1
        x, y = x / x.sum(), y / y.sum()
        assert np.array_equal(entropy_module.rel_entr32(x, y), rel_entr(x, y), equal_nan=True)
    edge = np.array([0, 0, 0, -1, 1, 1, np.nan, 1, np.inf, 1e-45, 3e38, 1], np.float32)
    other = np.array([0, -1, 1, 1, 0, -1, 1, np.nan, 1, 1e-45, 1e-38, np.inf], np.float32)
    got, want = entropy_module.rel_entr32(edge, other), rel_entr(edge, other)
    assert got.dtype == want.dtype == np.float32
    assert np.array_equal(got, want, equal_nan=True), (got, want)
