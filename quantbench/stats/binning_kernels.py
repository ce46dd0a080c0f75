"""numba kernels of :mod:`quantbench.stats.binning`, in a module of their own so that numba is
imported only when something is binned (:func:`quantbench.stats.binning._kernels`)."""

from __future__ import annotations

import numba
import numpy as np

from quantbench.stats.grid import HALF_BINS, NUM_BINS


# The kernels are module-level functions, not closures: numba's on-disk cache keys a closure by
# its pickled free variables, and a pickled dispatcher differs in every process, so a closure
# over ``_index`` was compiled afresh (about 1.5 s of CPU) by every calibration.
@numba.njit(nogil=True, cache=True, inline="always")
def index(v, scale):  # pragma: no cover - compiled
    # clamped: a value off the grid (a caller's bug) must never write outside the counts
    q = v * scale
    k = np.floor(q)
    if q == 0.0 and v < 0.0:  # a float64 subnormal below 0 whose product underflowed to -0.0
        k = -1.0
    return min(max(np.int64(k) + HALF_BINS, 0), NUM_BINS - 1)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def count_kernel(x, scale, sub):  # pragma: no cover - compiled
    """Bin the finite values of ``x`` (all on the grid) into ``sub``."""
    for i in range(x.size):
        v = np.float64(x[i])
        if v - v == 0.0:  # finite
            sub[i & 3, index(v, scale)] += 1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bin_kernel(x, scale, sub):  # pragma: no cover - compiled
    """Bin ``x``: every value finite and on the grid (the caller checked its range)."""
    for i in range(x.size):
        sub[i & 3, index(np.float64(x[i]), scale)] += 1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def scan_kernel(x, scale, sub):  # pragma: no cover - compiled
    """min/max/NaN/Inf of ``x`` and, while every finite value fits, its bins."""
    lo = np.inf
    hi = -np.inf
    nan = 0
    inf = 0
    fits = True
    for i in range(x.size):
        v = np.float64(x[i])
        if v != v:
            nan += 1
        elif v - v != 0.0:
            inf += 1
        else:
            lo = min(lo, v)
            hi = max(hi, v)
            if fits:
                if abs(v) * scale < HALF_BINS:
                    sub[i & 3, index(v, scale)] += 1
                else:
                    fits = False
    return lo, hi, nan, inf, fits


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bin_direct_kernel(x, scale, out):  # pragma: no cover - compiled
    """:func:`bin_kernel` straight into the int64 counts: for few values, where zeroing and
    draining four sub-histograms would cost more than the binning."""
    for i in range(x.size):
        out[index(np.float64(x[i]), scale)] += 1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def count_direct_kernel(x, scale, out):  # pragma: no cover - compiled
    """:func:`count_kernel` straight into the int64 counts (few values)."""
    for i in range(x.size):
        v = np.float64(x[i])
        if v - v == 0.0:  # finite
            out[index(v, scale)] += 1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def drain_kernel(sub, out):  # pragma: no cover - compiled
    """Add the sub-histograms into ``out`` and zero them, in one read of each."""
    for b in range(out.size):
        out[b] += np.int64(sub[0, b]) + sub[1, b] + sub[2, b] + sub[3, b]
        sub[0, b] = 0
        sub[1, b] = 0
        sub[2, b] = 0
        sub[3, b] = 0


@numba.njit(nogil=True, cache=True, boundscheck=False)
def drain_store_kernel(sub, out):  # pragma: no cover - compiled
    """:func:`drain_kernel` into an uninitialised ``out`` (stores, not adds)."""
    for b in range(out.size):
        out[b] = np.int64(sub[0, b]) + sub[1, b] + sub[2, b] + sub[3, b]
        sub[0, b] = 0
        sub[1, b] = 0
        sub[2, b] = 0
        sub[3, b] = 0
