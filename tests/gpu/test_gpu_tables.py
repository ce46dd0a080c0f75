"""Tables whose candidate scores are computed on the GPU (``tables_on(cupy)``, what ``calibrate
--provider cuda`` does after its device pass) against the host path on the SAME statistics:
identical amaxes, for every method of ``--method all``.

The host path is checked against the slow references in tests/test_calibrators.py; the GPU
scores differ from it in the last bits only (CUDA's log, cuBLAS's summation order), which the
calibrators' near-tie checks on the host must absorb. The tensors are made to stress that: ReLU
spikes, flat histograms (many exactly tied candidates), data far from 0 (entropy:pytorch's NaN
quirk), heavy tails, a few values only, and more tensors than one device chunk holds. Run on the
device machine: ``python3 -m pytest -q -m gpu tests/gpu --noconftest``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_probe import cupy_or_reason  # noqa: E402  (sibling helper module)

from quantbench import calibrators
from quantbench.calibrators import entropy as entropy_module
from quantbench.stats.tensorstats import TensorStats

cp, REASON = cupy_or_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=REASON or "")]


def _tensors(count: int) -> list[TensorStats]:
    rng = np.random.default_rng(20261203)
    makers = [
        lambda n: rng.standard_normal(n),
        lambda n: np.maximum(rng.standard_normal(n), 0.0),  # ReLU: zero spike
        lambda n: rng.laplace(size=n) * rng.uniform(0.01, 100.0),
        lambda n: np.concatenate([rng.laplace(size=n), rng.uniform(20, 60, 3)]),  # outliers
        lambda n: rng.uniform(0.95, 1.0, n),  # far from 0: entropy:pytorch's NaN quirk
        lambda n: rng.uniform(-1.0, 1.0, n),  # flat: many tied candidates
        lambda n: rng.gamma(rng.uniform(0.3, 5.0), size=n),
        lambda n: rng.standard_normal(5),  # a few values
        lambda n: np.full(n, 0.75),  # constant
    ]
    out = []
    for i in range(count):
        stats = TensorStats(f"t{i}")
        stats.update(makers[i % len(makers)](int(rng.integers(1_000, 60_000))).astype(np.float32))
        out.append(stats)
    return [*out, TensorStats("empty")]


@pytest.mark.parametrize("method", calibrators.all_methods())
def test_gpu_scored_table_equals_the_host_table(method: str) -> None:
    tensors = _tensors(2 * entropy_module.DEVICE_HISTOGRAMS + 7)
    host = calibrators.compute_amaxes(method, tensors)
    with calibrators.tables_on(cp):
        device = calibrators.compute_amaxes(method, tensors)
    differ = [(t.name, h, d) for t, h, d in zip(tensors, host, device, strict=True) if h != d]
    assert not differ, f"{method}: {len(differ)} of {len(tensors)} amaxes differ: {differ[:5]}"


def test_the_gpu_scores_are_what_the_host_computes_to_the_last_bits() -> None:
    """The raw candidate KLs (not only the winners) agree to 1e-12: a real check that the
    device ran the same arithmetic, not one that the tie check happened to rescue."""
    tensors = _tensors(40)[:-1]
    edges = entropy_module.floor_group_edges(2048, 128, 128)
    bins = np.stack([t.abs_histogram(2048) for t in tensors])
    host = np.stack([entropy_module.kl_divergences_floor_groups(b, edges) for b in bins])
    device = cp.asnumpy(entropy_module.kl_divergences_floor_groups(cp.asarray(bins), edges, cp))
    assert np.array_equal(np.isinf(host), np.isinf(device))
    finite = np.isfinite(host)
    np.testing.assert_allclose(device[finite], host[finite], rtol=1e-12, atol=1e-13)
