"""Device binning (CuPy) against the host TensorStats on the SAME values: identical bins.

The host reference is quantbench.stats.tensorstats.TensorStats (binning.py: numba, or numpy), an
independent
implementation of the bin rule; the device side is quantbench.stats.devicestats on CuPy arrays.
Values
are chosen to break a careless kernel: exact bin edges and their float neighbours, powers of
two, negatives (floor, not truncation), +-0, float32/float16 subnormals (no flush to zero),
NaN/Inf (counted, never binned), ranges that force the grid to widen by small and huge steps,
float16/float64, and tens of millions of values (atomics under contention at the ReLU spike).
The kernels are those of quantbench.stats.devicestats.StatsBank (one range and one count kernel for
all tensors of a part). Run on the device machine:
``python3 -m pytest -q -m gpu tests/gpu --noconftest``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_probe import cupy_or_reason  # noqa: E402  (sibling helper module)

from quantbench.stats import binning
from quantbench.stats.binning import HALF_BINS
from quantbench.stats.tensorstats import TensorStats

cp, REASON = cupy_or_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=REASON or "")]

TINY32 = 2.0**-149
TINY16 = 2.0**-24


def _edges(exponent: int, dtype: type) -> np.ndarray:
    """Bin edges k * 2**e (k over the whole grid, sparsely) and both float neighbours."""
    ks = np.unique(np.concatenate([np.arange(-40, 41), np.linspace(-HALF_BINS, HALF_BINS - 1, 97)]))
    edges = (ks.astype(np.float64) * 2.0**exponent).astype(dtype)
    edges = edges[np.abs(edges.astype(np.float64)) < HALF_BINS * 2.0**exponent]
    up = np.nextafter(edges, np.array(np.inf, dtype))
    down = np.nextafter(edges, np.array(-np.inf, dtype))
    both = np.concatenate([edges, up, down])
    return both[np.abs(both.astype(np.float64)) < HALF_BINS * 2.0**exponent]


def _host(batches: list[np.ndarray], relus: int = 1) -> tuple[TensorStats, list[TensorStats]]:
    host, relu = TensorStats("x"), [TensorStats(f"r{k}") for k in range(relus)]
    for batch in batches:
        added = host.update(batch)
        for r in relu:
            r.update_relu(added, batch)
    return host, relu


def _device(batches: list[np.ndarray], relus: int = 1) -> tuple[TensorStats, list[TensorStats]]:
    from quantbench.stats.devicestats import StatsBank

    names = [f"r{k}" for k in range(relus)]
    bank = StatsBank(cp, ["x"], {"x": names})
    for batch in batches:
        bank.add({"x": cp.asarray(batch)})
    got = bank.results()
    return got["x"], [got[n] for n in names]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("exponent", [-160, -149, -30, -14, -1, 0, 3, 20, 100])
def test_kernel_bins_equal_the_host_formula(dtype, exponent):
    if dtype is np.float16 and not -40 <= exponent <= 5:
        pytest.skip("float16 has no values on this grid")
    if dtype is np.float32 and exponent > 100:
        pytest.skip("no float32 values")
    values = _edges(exponent, dtype)
    if dtype is np.float32:
        values = np.concatenate([values, np.array([TINY32, -TINY32, 0.0, -0.0], dtype)])
    values = values[np.abs(values.astype(np.float64)) < HALF_BINS * 2.0**exponent]
    host, host_relu = _host([values])
    dev, dev_relu = _device([values])
    assert host.count == values.size
    assert _fields(dev) == _fields(host)
    np.testing.assert_array_equal(dev.counts, host.counts)
    assert _fields(dev_relu[0]) == _fields(host_relu[0])
    np.testing.assert_array_equal(dev_relu[0].counts, host_relu[0].counts)
    # and the host formula itself, at the grid the values were made for
    at = TensorStats("x", exponent=host.exponent, counts=host.counts).counts_at(exponent)
    if exponent >= host.exponent:
        np.testing.assert_array_equal(at, binning.numpy_finite_counts(values, exponent))


def _sequences() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(12)
    relu_like = np.maximum(rng.normal(0.2, 1.0, 20_000_000), 0).astype(np.float32)
    return {
        "subnormals-first": [
            np.array([TINY32, -TINY32, 3 * TINY32, -0.0, 0.0], np.float32),
            np.array([-TINY32 * 7, 1e-38], np.float32),
            rng.normal(0, 1e-20, 10_000).astype(np.float32),
            rng.normal(0, 1.0, 100_000).astype(np.float32),
        ],
        "edges-then-widen": [
            _edges(-10, np.float32),
            _edges(-3, np.float32),
            _edges(7, np.float32),
            np.array([3.4e38, -3.4e38], np.float32),
            _edges(-10, np.float32),
        ],
        "nonfinite": [
            np.array([np.nan] * 5, np.float32),
            np.array([np.inf, -np.inf], np.float32),
            np.array([np.nan, 1.0, -2.0, np.inf, 0.5], np.float32),
            np.where(rng.random(1_000_000) < 0.01, np.nan, rng.normal(size=1_000_000)).astype(
                np.float32
            ),
            np.array([-np.inf, 1e30], np.float32),
        ],
        "powers-of-two": [
            np.array([s * 2.0**k for k in range(-149, 128) for s in (1, -1)], np.float32),
            np.array([s * 2.0**k for k in range(-24, 16) for s in (1, -1)], np.float32),
        ],
        "relu-spike-20M": [relu_like, -relu_like, relu_like * 1e3],
        "conv-like-4d": [rng.normal(0, s, (8, 64, 56, 56)).astype(np.float32) for s in (1, 4, 2)],
        "float16": [
            np.array([TINY16, -TINY16, 65504.0, -65504.0, np.nan, 0.0], np.float16),
            rng.normal(0, 3, 100_000).astype(np.float16),
        ],
        "float64": [
            np.array([1e-300, -1e-300, 5e-324, -5e-324], np.float64),
            rng.normal(0, 1e5, 100_000),
            np.array([1e300, -1e-10], np.float64),
        ],
        "empty": [np.zeros(0, np.float32), np.zeros((0, 3), np.float32), np.ones(3, np.float32)],
    }


SEQUENCES = _sequences()


def _fields(t: TensorStats) -> tuple:
    return (t.count, t.min, t.max, t.nan_count, t.inf_count, t.exponent)


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_device_statistics_equal_host_statistics(name):
    host, host_relu = _host(SEQUENCES[name], relus=1)
    dev, dev_relu = _device(SEQUENCES[name], relus=1)
    assert _fields(dev) == _fields(host), name
    np.testing.assert_array_equal(dev.counts, host.counts, err_msg=name)
    assert _fields(dev_relu[0]) == _fields(host_relu[0]), name
    np.testing.assert_array_equal(dev_relu[0].counts, host_relu[0].counts)


def test_many_tensors_in_one_part_with_many_relus():
    """One bank, parts of several tensors (float32, float16, float64, empty, all-NaN), one
    source with more Relus than one count task bins (MAX_RELUS), some on the source's grid
    (derived from its bins in shared memory), some on their own (binned), with NaN and -Inf
    among the values: each tensor equals its own host TensorStats, part after part, while the
    grids widen."""
    from quantbench.stats.devicestats import MAX_RELUS, StatsBank

    rng = np.random.default_rng(21)
    relus = [f"r{k}" for k in range(MAX_RELUS + 3)]
    names = ["wide", "half", "double", "empty", "nan"]
    bank = StatsBank(cp, names, {"wide": relus, "half": ["rh"]})
    host = {n: TensorStats(n) for n in [*names, *relus, "rh"]}
    for k, r in enumerate(relus[:4]):  # coarse grids from a (pretend) earlier maximum
        bank.slots[r].exponent = host[r].exponent = -2 - k
    kinds = set()
    for step, scale in enumerate((1.0, 0.5, 40.0, 3e3, 2.0)):
        part = {
            "wide": rng.normal(0.1, scale, (7, 64, 33, 29)).astype(np.float32),
            "half": rng.normal(0, scale, 70_001).astype(np.float16),
            "double": rng.normal(0, scale * 1e-30, 5_000),
            "empty": np.zeros((0, 4), np.float32),
            "nan": np.full(17, np.nan, np.float32),
        }
        part["wide"].reshape(-1)[::1_000] = 0.0
        if step % 2:
            part["wide"].reshape(-1)[5::100_003] = -np.inf
            part["wide"].reshape(-1)[77] = np.nan
        bank.add({n: cp.asarray(v) for n, v in part.items()})
        for n, v in part.items():
            added = host[n].update(v)
            for r in relus if n == "wide" else ["rh"] if n == "half" else []:
                host[r].update_relu(added, v)
        source = bank.slots["wide"].exponent
        kinds |= {bank.slots[r].exponent == source for r in relus}
    assert kinds == {True, False}  # Relus derived from the bins and binned on their own grid
    got = bank.results()
    for n, h in host.items():
        assert _fields(got[n]) == _fields(h), n
        np.testing.assert_array_equal(got[n].counts, h.counts, err_msg=n)
