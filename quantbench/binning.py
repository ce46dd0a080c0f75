"""The binning hot path: float values -> counts on the signed power-of-two grid of ``stats``.

Calibration bins every element of every exposed activation, so this loop decides whether the
statistics cost anything next to inference. Two implementations give identical counts:

* ``numba`` (the ``[fast]`` dependency, installed by default): one fused pass per array — scale by
  ``2**-e`` in float64 (exact), floor, offset, increment — compiled once and cached on disk,
  releasing the GIL so several tensors are binned on several cores at once. Counts go to four
  interleaved int32 sub-histograms so runs of equal values (the zero spike of ReLU outputs) do not
  serialise on one counter.
* ``numpy``: the same arithmetic as vectorised numpy calls (the float->int conversion uses the
  1.5*2**52 trick) and ``np.bincount``. Used when numba is missing or ``QUANTBENCH_BINNING=numpy``.

Both bin only finite values; callers count NaN/Inf themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

#: bins per sign; the grid has ``2 * HALF_BINS`` bins (kept here, the lowest layer that needs it).
HALF_BINS = 16384
NUM_BINS = 2 * HALF_BINS
#: largest chunk binned into int32 sub-histograms before they are added to the int64 counts.
_CHUNK = 1 << 28


def _numpy_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """int64 counts of the finite values ``x`` (any float dtype) at bin width ``2**exponent``.

    ``x * 2**-e`` is exact in float64, floor is exact, and the float->int conversion uses the
    1.5*2**52 trick (a float add and an integer subtract) because numpy's cast is 3x slower.
    """
    scaled = np.multiply(x, 2.0**-exponent, dtype=np.float64)
    np.floor(scaled, out=scaled)  # in [-HALF_BINS, HALF_BINS): the caller's exponent ensures it
    magic = np.float64(1.5 * 2.0**52)
    scaled += magic + HALF_BINS
    idx = scaled.view(np.int64)
    idx -= magic.view(np.int64)
    return np.bincount(idx, minlength=NUM_BINS)


def _make_numba_counts() -> Callable[[np.ndarray, int], np.ndarray] | None:
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=True, inline="always")
    def index(v, scale):  # pragma: no cover - compiled
        # clamped: a value off the grid (a caller's bug) must never write outside the counts
        return min(max(np.int64(np.floor(np.float64(v) * scale)) + HALF_BINS, 0), NUM_BINS - 1)

    @numba.njit(nogil=True, cache=True, boundscheck=False)
    def kernel(x, scale, sub):  # pragma: no cover - compiled
        n = x.size
        body = n - n % 4
        for i in range(0, body, 4):
            sub[0, index(x[i], scale)] += 1
            sub[1, index(x[i + 1], scale)] += 1
            sub[2, index(x[i + 2], scale)] += 1
            sub[3, index(x[i + 3], scale)] += 1
        for i in range(body, n):
            sub[0, index(x[i], scale)] += 1

    def counts(x: np.ndarray, exponent: int) -> np.ndarray:
        flat = np.ascontiguousarray(x).reshape(-1)
        if flat.dtype not in (np.float32, np.float64):
            flat = flat.astype(np.float32)  # float16/bfloat16 widen exactly
        scale = 2.0**-exponent
        out = np.zeros(NUM_BINS, dtype=np.int64)
        sub = np.zeros((4, NUM_BINS), dtype=np.int32)
        for start in range(0, flat.size, _CHUNK):
            sub[:] = 0
            kernel(flat[start : start + _CHUNK], scale, sub)
            out += sub.sum(axis=0, dtype=np.int64)
        return out

    return counts


def _select() -> tuple[str, Callable[[np.ndarray, int], np.ndarray]]:
    if os.environ.get("QUANTBENCH_BINNING", "").lower() != "numpy":
        fast = _make_numba_counts()
        if fast is not None:
            return "numba", fast
    return "numpy", _numpy_counts


#: which implementation :func:`signed_counts` uses ("numba" or "numpy")
BACKEND, _counts = _select()


def signed_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """Counts of the finite values ``x`` on the signed grid of bin width ``2**exponent``.

    Bin ``HALF_BINS + floor(x / 2**exponent)``; every value must satisfy
    ``|x| < HALF_BINS * 2**exponent`` (what ``stats.exponent_for`` guarantees).
    """
    return _counts(x, exponent)


def numpy_signed_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """The pure-numpy implementation (the reference the compiled one must equal)."""
    return _numpy_counts(x, exponent)
