"""The binning hot path: float values -> range, NaN/Inf counts and counts on the signed grid.

Calibration bins every element of every exposed activation, so this loop decides whether the
statistics cost anything next to inference. :func:`scan` does it in one read of the values
when they fit the tensor's current grid (every batch after the first, nearly always): it finds
min/max of the finite values, counts NaN/Inf and bins the finite values together. When a value
lies off the grid it returns the range only; the caller widens the grid and calls
:func:`finite_counts`.

Two implementations give identical results:

* ``numba`` (a dependency, with a fallback): compiled once and cached on disk, releasing the GIL
  so several tensors are binned on several cores at once. Counts go to four interleaved int32
  sub-histograms so runs of equal values (the zero spike of ReLU outputs) do not serialise on
  one counter.
* ``numpy``: the same arithmetic as vectorised numpy calls. Used when numba is missing or
  ``QUANTBENCH_BINNING=numpy``.

Bin of a finite value ``v`` at exponent ``e``: ``HALF_BINS + floor(v / 2**e)`` (``v * 2**-e`` is
exact in float64); ``v`` is on the grid when ``|v| < HALF_BINS * 2**e``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: bins per sign; the grid has ``2 * HALF_BINS`` bins (kept here, the lowest layer that needs it).
HALF_BINS = 16384
NUM_BINS = 2 * HALF_BINS
#: largest chunk binned into int32 sub-histograms before they are added to the int64 counts.
_CHUNK = 1 << 28


@dataclass(frozen=True)
class Scan:
    """One batch: range of its finite values, NaN/Inf counts, and its counts on the grid it was
    scanned with (``None`` when some finite value lies off that grid)."""

    lo: float
    hi: float
    finite: int
    nan: int
    inf: int
    counts: np.ndarray | None


# --------------------------------------------------------------------------- numpy


def _numpy_finite_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """int64 counts of the finite values of ``x`` at bin width ``2**exponent``.

    The float->int conversion uses the 1.5*2**52 trick (a float add and an integer subtract)
    because numpy's cast is 3x slower.
    """
    if not np.isfinite(x).all():
        x = x[np.isfinite(x)]
    scaled = np.multiply(x, 2.0**-exponent, dtype=np.float64)
    np.floor(scaled, out=scaled)
    magic = np.float64(1.5 * 2.0**52)
    scaled += magic + HALF_BINS
    idx = scaled.view(np.int64)
    idx -= magic.view(np.int64)
    return np.bincount(idx, minlength=NUM_BINS)


def _numpy_scan(x: np.ndarray, exponent: int) -> Scan:
    lo, hi = float(x.min()), float(x.max())
    nan = inf = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite_mask = np.isfinite(x)
        nan = int(np.isnan(x).sum())
        inf = int(x.size - finite_mask.sum()) - nan
        x = x[finite_mask]
        if x.size == 0:
            return Scan(math.inf, -math.inf, 0, nan, inf, None)
        lo, hi = float(x.min()), float(x.max())
    fits = max(abs(lo), abs(hi)) < HALF_BINS * 2.0**exponent
    counts = _numpy_finite_counts(x, exponent) if fits else None
    return Scan(lo, hi, int(x.size), nan, inf, counts)


# --------------------------------------------------------------------------- numba


def _make_numba() -> tuple[Callable, Callable] | None:
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=True, inline="always")
    def index(v, scale):  # pragma: no cover - compiled
        # clamped: a value off the grid (a caller's bug) must never write outside the counts
        return min(max(np.int64(np.floor(v * scale)) + HALF_BINS, 0), NUM_BINS - 1)

    @numba.njit(nogil=True, cache=True, boundscheck=False)
    def count_kernel(x, scale, sub):  # pragma: no cover - compiled
        """Bin the finite values of ``x`` (all on the grid) into ``sub``."""
        for i in range(x.size):
            v = np.float64(x[i])
            if v - v == 0.0:  # finite
                sub[i & 3, index(v, scale)] += 1

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

    def widened(x: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(x).reshape(-1)
        if flat.dtype not in (np.float32, np.float64):
            flat = flat.astype(np.float32)  # float16/bfloat16 widen exactly
        return flat

    def finite_counts(x: np.ndarray, exponent: int) -> np.ndarray:
        flat = widened(x)
        scale = 2.0**-exponent
        out = np.zeros(NUM_BINS, dtype=np.int64)
        sub = np.zeros((4, NUM_BINS), dtype=np.int32)
        for start in range(0, flat.size, _CHUNK):
            sub[:] = 0
            count_kernel(flat[start : start + _CHUNK], scale, sub)
            out += sub.sum(axis=0, dtype=np.int64)
        return out

    def scan(x: np.ndarray, exponent: int) -> Scan:
        flat = widened(x)
        scale = 2.0**-exponent
        out = np.zeros(NUM_BINS, dtype=np.int64)
        sub = np.zeros((4, NUM_BINS), dtype=np.int32)
        lo, hi, nan, inf, fits = math.inf, -math.inf, 0, 0, True
        for start in range(0, flat.size, _CHUNK):
            sub[:] = 0
            c_lo, c_hi, c_nan, c_inf, c_fits = scan_kernel(flat[start : start + _CHUNK], scale, sub)
            lo, hi, nan, inf = min(lo, c_lo), max(hi, c_hi), nan + c_nan, inf + c_inf
            fits = fits and c_fits
            if fits:
                out += sub.sum(axis=0, dtype=np.int64)
        finite = flat.size - nan - inf
        return Scan(lo, hi, finite, nan, inf, out if fits and finite else None)

    return scan, finite_counts


def _select() -> tuple[str, Callable, Callable]:
    if os.environ.get("QUANTBENCH_BINNING", "").lower() != "numpy":
        fast = _make_numba()
        if fast is not None:
            return "numba", *fast
    return "numpy", _numpy_scan, _numpy_finite_counts


#: which implementation :func:`scan` and :func:`finite_counts` use ("numba" or "numpy")
BACKEND, _scan, _finite_counts = _select()


def scan(x: np.ndarray, exponent: int) -> Scan:
    """Range, NaN/Inf counts and (when every finite value is on the grid) counts of ``x``."""
    return _scan(np.asarray(x).reshape(-1), exponent)


def finite_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """Counts of the finite values of ``x``; each must satisfy ``|v| < HALF_BINS * 2**e``."""
    return _finite_counts(np.asarray(x).reshape(-1), exponent)


def numpy_scan(x: np.ndarray, exponent: int) -> Scan:
    """The pure-numpy :func:`scan` (the reference the compiled one must equal)."""
    return _numpy_scan(np.asarray(x).reshape(-1), exponent)


def numpy_finite_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """The pure-numpy :func:`finite_counts`."""
    return _numpy_finite_counts(np.asarray(x).reshape(-1), exponent)
