"""The binning hot path: float values -> range, NaN/Inf counts and counts on the signed grid.

Calibration bins every element of every exposed activation, so this loop decides whether the
statistics cost anything next to inference. :func:`scan` finds min/max of the finite values,
counts NaN/Inf and, when the values fit the tensor's current grid (every batch after the first,
nearly always), bins them: a vectorised min/max first, then one binning loop without per-value
checks (a fused loop that checks every value where NaN/Inf appear). When a value lies off the
grid it returns the range only; the caller widens the grid and calls :func:`finite_counts`.

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

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from quantbench.stats.grid import HALF_BINS, NUM_BINS

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


@functools.cache
def _kernels() -> ModuleType | None:
    """The compiled kernels (:mod:`quantbench.stats.binning_kernels`), imported on first use, so
    that
    numba's import (~0.6 s) is paid by a calibration's warm-up thread, not by every command;
    ``None`` (the numpy path) when ``QUANTBENCH_BINNING=numpy`` asks for it or numba is missing
    or cannot be imported."""
    if os.environ.get("QUANTBENCH_BINNING", "").lower() == "numpy":
        return None
    try:
        from quantbench.stats import binning_kernels
    except ImportError:
        return None
    return binning_kernels


def _widened(x: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.dtype not in (np.float32, np.float64):
        flat = flat.astype(np.float32)  # float16/bfloat16 widen exactly
    return flat


def _numba_counts(flats: list[np.ndarray], scale: float, kernel: Callable) -> np.ndarray:
    """Counts of the pieces ``flats`` together: one set of sub-histograms, emptied into the
    int64 counts every :data:`_CHUNK` values (so many small pieces cost one histogram)."""
    out = np.zeros(NUM_BINS, dtype=np.int64)
    sub = np.zeros((4, NUM_BINS), dtype=np.int32)
    filled = 0
    for flat in flats:
        for start in range(0, flat.size, _CHUNK):
            piece = flat[start : start + _CHUNK]
            if filled + piece.size > _CHUNK:
                out += sub.sum(axis=0, dtype=np.int64)
                sub[:] = 0
                filled = 0
            kernel(piece, scale, sub)
            filled += piece.size
    return out + sub.sum(axis=0, dtype=np.int64)


def _numba_finite_counts(k: ModuleType, pieces: list[np.ndarray], exponent: int) -> np.ndarray:
    return _numba_counts([_widened(p) for p in pieces], 2.0**-exponent, k.count_kernel)


def _numba_scan(k: ModuleType, pieces: list[np.ndarray], exponent: int) -> Scan:
    flats = [f for f in map(_widened, pieces) if f.size]
    scale = 2.0**-exponent
    # numpy's SIMD min/max (~0.15 ns a value) tell whether every value is finite (a NaN
    # propagates, an Inf is an extreme) and on the grid; then the bins need no per-value
    # checks, which halves the binning (1.0 + 0.15 ns a value against 1.9 for the fused scan).
    ranges = [(float(f.min()), float(f.max())) for f in flats]
    if not all(math.isfinite(lo) and math.isfinite(hi) for lo, hi in ranges):
        return merge_scans([_fused_scan(k, f, scale) for f in flats])
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    fits = max(abs(lo), abs(hi)) * scale < HALF_BINS
    counts = _numba_counts(flats, scale, k.bin_kernel) if fits else None
    return Scan(lo, hi, sum(f.size for f in flats), 0, 0, counts)


def _fused_scan(k: ModuleType, flat: np.ndarray, scale: float) -> Scan:
    """Range, NaN/Inf counts and bins in one loop that checks every value (data with NaN/Inf)."""
    out = np.zeros(NUM_BINS, dtype=np.int64)
    sub = np.zeros((4, NUM_BINS), dtype=np.int32)
    lo, hi, nan, inf, fits = math.inf, -math.inf, 0, 0, True
    for start in range(0, flat.size, _CHUNK):
        sub[:] = 0
        chunk = flat[start : start + _CHUNK]
        c_lo, c_hi, c_nan, c_inf, c_fits = k.scan_kernel(chunk, scale, sub)
        lo, hi, nan, inf = min(lo, c_lo), max(hi, c_hi), nan + c_nan, inf + c_inf
        fits = fits and c_fits
        if fits:
            out += sub.sum(axis=0, dtype=np.int64)
    finite = flat.size - nan - inf
    return Scan(lo, hi, finite, nan, inf, out if fits and finite else None)


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def backend() -> str:
    """Which implementation :func:`scan` and :func:`finite_counts` use: "numba" or "numpy"."""
    return "numpy" if _kernels() is None else "numba"


def _scan(pieces: list[np.ndarray], exponent: int) -> Scan:
    k = _kernels()
    return _numpy_scan(_joined(pieces), exponent) if k is None else _numba_scan(k, pieces, exponent)


def _finite_counts(pieces: list[np.ndarray], exponent: int) -> np.ndarray:
    k = _kernels()
    if k is None:
        return _numpy_finite_counts(_joined(pieces), exponent)
    return _numba_finite_counts(k, pieces, exponent)


#: arrays this small take the numpy path (the same bins): a few values checked before any
#: inference (a method's dry run) must not pay numba's first call, which :func:`warm_up` pays
#: in a worker thread while onnxruntime runs.
SMALL = 1 << 12

#: an array, or pieces (a list of arrays) standing for their concatenation, not copied
Values = np.ndarray | list[np.ndarray]


def _pieces(x: Values) -> list[np.ndarray]:
    return [np.asarray(a).reshape(-1) for a in (x if isinstance(x, list) else [x])]


def scan(x: Values, exponent: int) -> Scan:
    """Range, NaN/Inf counts and (when every finite value is on the grid) counts of ``x``."""
    pieces = _pieces(x)
    size = sum(p.size for p in pieces)
    if size == 0:
        return Scan(math.inf, -math.inf, 0, 0, 0, None)
    if size < SMALL:
        return _numpy_scan(_joined(pieces), exponent)
    return _scan(pieces, exponent)


def finite_counts(x: Values, exponent: int) -> np.ndarray:
    """Counts of the finite values of ``x``; each must satisfy ``|v| < HALF_BINS * 2**e``."""
    pieces = _pieces(x)
    if sum(p.size for p in pieces) < SMALL:
        return _numpy_finite_counts(_joined(pieces), exponent)
    return _finite_counts(pieces, exponent)


def warm_up() -> None:
    """Load the compiled kernels ahead of the first batch: numba's first call in a process
    (its registries, a BLAS probe) takes most of a second, which a caller can overlap."""
    x = np.zeros(SMALL, np.float32)
    _scan([x], 0)
    x[0] = np.nan  # the fused kernel, for data with NaN/Inf
    _scan([x], 0)
    _finite_counts([x], 0)


def merge_scans(parts: list[Scan]) -> Scan:
    """The :class:`Scan` of the concatenation of the scanned parts (exact: counts add, ranges
    combine), so a tensor can be scanned in chunks on several cores."""
    if len(parts) == 1:
        return parts[0]
    finite = sum(p.finite for p in parts)
    counts = None
    if finite and all(p.counts is not None for p in parts if p.finite):
        counts = np.zeros(NUM_BINS, dtype=np.int64)
        for p in parts:
            if p.counts is not None:
                counts += p.counts
    return Scan(
        min(p.lo for p in parts),
        max(p.hi for p in parts),
        finite,
        sum(p.nan for p in parts),
        sum(p.inf for p in parts),
        counts,
    )


def numpy_scan(x: np.ndarray, exponent: int) -> Scan:
    """The pure-numpy :func:`scan` (the reference the compiled one must equal)."""
    return _numpy_scan(np.asarray(x).reshape(-1), exponent)


def numpy_finite_counts(x: np.ndarray, exponent: int) -> np.ndarray:
    """The pure-numpy :func:`finite_counts`."""
    return _numpy_finite_counts(np.asarray(x).reshape(-1), exponent)
