"""MSE calibration: the amax that minimises the expected squared INT8 quantization error.

As pytorch-quantization's ``_compute_amax_mse`` (reference §1.6): the |x| distribution is the
2048-bin histogram on ``[0, max|x|]`` with every value at its bin centre ``c_k``; the candidates
are the centres from bin 128 on; the error of a candidate ``a`` is
``sum_k count_k * (fq(c_k) - c_k)**2`` with symmetric INT8 fake quantization
``fq(c) = clip(rint(c * 127 / a), -127, 127) * a / 127`` (round half to even, clipping above
``a``); the first minimum wins.

Vectorised without per-call work per (candidate, bin): in units of the step ``a / 127`` the
error of centre ``k`` under candidate ``i`` is ``(u - min(rint(u), 127))**2`` with
``u = 127 * (k + 0.5) / (i + 0.5)``, which does not depend on the data. That matrix is built once
(1920 x 2048 float64, 31 MiB, ~20 ms, on first use); a table's tensors share one matrix product
(reading the 31 MiB once, not once per tensor). Candidates within float noise of the minimum are
re-evaluated with a plain sum, so the first minimum does not depend on how BLAS ordered the sums
(one tensor or many, host or GPU, give the same amax).
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

import numpy as np

from quantbench.calibrators import register, register_many, table_arrays
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats

HIST_BINS = 2048
START_BIN = 128
INT8_MAX = 127
#: candidates this close to the smallest error are re-evaluated the plain way (BLAS sums in
#: blocks: the same error can differ in its last bits between a matrix-vector and a
#: matrix-matrix product)
TIE_RTOL = 1e-10


@lru_cache(maxsize=1)
def step_error_matrix(num_bins: int = HIST_BINS, start: int = START_BIN) -> np.ndarray:
    """Squared error of each bin centre (columns) under each candidate (rows), in steps**2."""
    candidate = np.arange(start, num_bins)[:, None] + 0.5
    centre = np.arange(num_bins)[None, :] + 0.5
    # in place: each 31 MiB temporary costs more in fresh pages than in arithmetic
    matrix = np.divide(INT8_MAX * centre, candidate)
    rounded = np.rint(matrix)
    np.minimum(rounded, INT8_MAX, out=rounded)
    np.subtract(matrix, rounded, out=matrix)
    np.square(matrix, out=matrix)
    matrix.flags.writeable = False
    return matrix


@lru_cache(maxsize=2)
def _device_step_errors(xp: ModuleType) -> np.ndarray:
    """:func:`step_error_matrix` copied to ``xp``'s device once (31 MiB)."""
    return xp.asarray(step_error_matrix(HIST_BINS, START_BIN))


def _step_errors_of(counts: np.ndarray) -> np.ndarray:
    """Every candidate's error (in steps**2) for each column of ``counts``: one matrix product,
    on :func:`table_arrays`' device when there is one (near-ties are settled on the host by
    :func:`_first_best`, so the amaxes do not depend on where it ran)."""
    xp = table_arrays()
    if xp is None:
        return step_error_matrix(HIST_BINS, START_BIN) @ counts
    return xp.asnumpy(_device_step_errors(xp) @ xp.asarray(counts))


def _steps_squared(num_bins: int, bin_width: float) -> np.ndarray:
    return ((np.arange(START_BIN, num_bins) + 0.5) * bin_width / INT8_MAX) ** 2


def _first_best(errors: np.ndarray, counts: np.ndarray, bin_width: float) -> float:
    """Threshold of the first candidate with the smallest error (near-ties summed plainly)."""
    best = float(np.min(errors))
    near = np.flatnonzero(errors <= best + TIE_RTOL * abs(best))
    if near.size > 1:
        rows = step_error_matrix(counts.size, START_BIN)[near]
        plain = np.sum(rows * counts, axis=1) * _steps_squared(counts.size, bin_width)[near]
        near = near[plain == plain.min()]
    return (START_BIN + int(near[0]) + 0.5) * bin_width


def _check_option(option: str | None) -> None:
    if option is not None:
        raise QuantbenchError(f"method 'mse:{option}': mse takes no option; use 'mse'")


@register(
    "mse",
    "amax minimising the mean squared INT8 quantization error of |x|",
    check=_check_option,
)
def mse(stats: TensorStats, option: str | None) -> float:
    """Bin centre with the smallest expected squared error; takes no option."""
    return mse_many([stats], option)[0]


@register_many("mse")
def mse_many(stats: list[TensorStats], option: str | None) -> list[float]:
    """:func:`mse` of many tensors: one matrix-matrix product for all of them."""
    _check_option(option)
    if not stats:
        return []
    counts = np.stack([t.abs_histogram(HIST_BINS) for t in stats], axis=1)
    errors = _step_errors_of(counts)
    out = []
    for j, t in enumerate(stats):
        bin_width = t.max_abs / HIST_BINS
        scaled = errors[:, j] * _steps_squared(HIST_BINS, bin_width)
        out.append(_first_best(scaled, counts[:, j], bin_width))
    return out
