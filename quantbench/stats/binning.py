"""The binning hot path: float values -> range, NaN/Inf counts and counts on the signed grid.

Calibration bins every element of every exposed activation, so this loop decides whether the
statistics cost anything next to inference. :func:`scan` finds min/max of the finite values,
counts NaN/Inf and, when the values fit the tensor's current grid (every batch after the first,
nearly always), bins them: a vectorised min/max first, then one binning loop without per-value
checks (a fused loop that checks every value where NaN/Inf appear). When a value lies off the
grid it returns the range only; the caller widens the grid and calls :func:`finite_counts`.

Three implementations give identical results:

* C (``_binning.c``, built at install as the optional extension ``_binning_c``, called through
  ctypes, which releases the GIL so several tensors are binned on several cores at once): used
  from the first value, nothing to load. The bins of a block are computed together (SSE2 on
  x86-64), then counted.
* ``numba`` (a dependency, for an install that could not compile the extension): compiled once
  and cached on disk, also releasing the GIL. Used once :func:`warm_up` has loaded it: the load
  costs most of a second of one core and ~125 MiB, which only a pass binning hundreds of
  millions of values repays (the statistics pass decides, from its first part).
  ``QUANTBENCH_BINNING=numba`` takes it even where the extension was built.
* ``numpy``: the same arithmetic as vectorised numpy calls. Used where neither is loaded, or
  with ``QUANTBENCH_BINNING=numpy``.

The compiled ones count into four interleaved int32 sub-histograms so runs of equal values (the
zero spike of ReLU outputs) do not serialise on one counter (a few values go straight to the
counts), block by block while each block of values is in cache; many small pooled pieces are
joined first (per-call costs, not values, dominated a model with hundreds of small tensors).

Bin of a finite value ``v`` at exponent ``e``: ``HALF_BINS + floor(v / 2**e)`` (``v * 2**-e`` is
exact in float64, except that a float64 subnormal may underflow to a signed zero: one below 0
is put in bin -1 by hand); ``v`` is on the grid when ``|v| < HALF_BINS * 2**e``.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from quantbench.stats.grid import HALF_BINS, NUM_BINS

#: largest chunk binned into int32 sub-histograms before they are added to the int64 counts.
_CHUNK = 1 << 28
#: at most this many values are binned straight into the int64 counts: the four int32
#: sub-histograms (zeroed, then drained: 0.8 MB of memory traffic, ~50 us) pay off only where
#: they keep a long run of equal values (a ReLU's zeros) from waiting on one counter.
DIRECT = 1 << 15
#: pieces smaller than this are copied into one array before they are scanned: each piece
#: costs a min, a max and a kernel call (~8 us), more than copying a few thousand values.
JOIN = 1 << 14
#: values a block: its min/max is taken and it is binned while it is still in L2 (a tensor
#: read once from memory, not twice)
BLOCK = 1 << 16


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
    if x.dtype == np.float64 and exponent > 0:  # only float64 subnormals can underflow here
        scaled[(scaled == 0.0) & (x < 0.0)] = -1.0  # a value below 0 belongs in bin -1
    magic = np.float64(1.5 * 2.0**52)
    scaled += magic + HALF_BINS
    idx = scaled.view(np.int64)
    idx -= magic.view(np.int64)
    return np.bincount(idx, minlength=NUM_BINS)


def _numpy_scan(x: np.ndarray, exponent: int) -> Scan:
    seen, x = _numpy_range(x)
    if not seen.finite:
        return seen
    fits = max(abs(seen.lo), abs(seen.hi)) < HALF_BINS * 2.0**exponent
    counts = _numpy_finite_counts(x, exponent) if fits else None
    return Scan(seen.lo, seen.hi, seen.finite, seen.nan, seen.inf, counts)


def _numpy_range(x: np.ndarray) -> tuple[Scan, np.ndarray]:
    """Range and NaN/Inf counts of ``x`` (no counts), and its finite values: ``x`` itself
    unless it holds NaN/Inf (then a copy without them)."""
    lo, hi = float(x.min()), float(x.max())
    nan = inf = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite_mask = np.isfinite(x)
        nan = int(np.isnan(x).sum())
        inf = int(x.size - finite_mask.sum()) - nan
        x = x[finite_mask]
        if x.size == 0:
            return Scan(math.inf, -math.inf, 0, nan, inf, None), x
        lo, hi = float(x.min()), float(x.max())
    return Scan(lo, hi, int(x.size), nan, inf, None), x


# --------------------------------------------------------------------------- compiled (C, numba)


@functools.cache
def _native() -> ModuleType | None:
    """The C kernels (:mod:`quantbench.stats.binning_ckernels`); ``None`` where the extension
    was not built or ``QUANTBENCH_BINNING`` asks for numba or numpy."""
    if os.environ.get("QUANTBENCH_BINNING", "").lower() in ("numba", "numpy"):
        return None
    try:
        from quantbench.stats import binning_ckernels
    except ImportError:
        return None
    return binning_ckernels


@functools.cache
def _kernels() -> ModuleType | None:
    """The numba kernels (:mod:`quantbench.stats.binning_kernels`), imported on first use, so
    that numba's import (~0.6 s) is paid by a calibration's warm-up thread, not by every
    command; ``None`` (the numpy path) when ``QUANTBENCH_BINNING=numpy`` asks for it or numba
    is missing or cannot be imported."""
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


class _Counts:
    """int64 counts of the blocks added. Up to :data:`DIRECT` values in all go straight into
    them; more go to four int32 sub-histograms (the thread's own, kept zeroed between uses:
    allocating 512 KiB costs its page faults every time), drained into the counts every
    :data:`_CHUNK` values and at the end (so many small pieces cost one histogram)."""

    def __init__(self, k: ModuleType, total: int, direct: Callable, sub_kernel: Callable):
        self.k, self.direct, self.sub_kernel = k, direct, sub_kernel
        self.sub = _thread_sub() if total > DIRECT else None
        # the first drain stores, so the sub-histograms' counts need no zeroed array
        self.out = np.zeros(NUM_BINS, dtype=np.int64) if self.sub is None else None
        self.filled = 0

    def add(self, block: np.ndarray, scale: float) -> None:
        if self.sub is None:
            self.direct(block, scale, self.out)
            return
        if self.filled + block.size > _CHUNK:
            self._drain()
        self.filled += block.size
        self.sub_kernel(block, scale, self.sub)

    def _drain(self) -> None:
        if self.out is None:
            self.out = np.empty(NUM_BINS, dtype=np.int64)
            self.k.drain_store_kernel(self.sub, self.out)
        else:
            self.k.drain_kernel(self.sub, self.out)
        self.filled = 0

    def result(self) -> np.ndarray:
        if self.sub is not None:
            self._drain()
        return self.out

    def release(self) -> None:
        """Zero the thread's sub-histograms where counts were left in them (a scan that found
        a value off the grid or a NaN, an interrupt): the next user expects them zeroed."""
        if self.sub is not None and self.filled:
            self.sub.fill(0)
            self.filled = 0


_THREAD = threading.local()


def _thread_sub() -> np.ndarray:
    """This thread's four int32 sub-histograms, all zero (every user drains them)."""
    sub = getattr(_THREAD, "sub", None)
    if sub is None:
        sub = _THREAD.sub = np.zeros((4, NUM_BINS), dtype=np.int32)
    return sub


def _blocks(flats: list[np.ndarray], size: int = BLOCK) -> Iterator[np.ndarray]:
    """``flats`` in blocks of at most ``size`` values, in order."""
    for flat in flats:
        for start in range(0, flat.size, size):
            yield flat[start : start + size]


def _compiled_finite_counts(k: ModuleType, pieces: list[np.ndarray], exponent: int) -> np.ndarray:
    flats = [_widened(p) for p in pieces]
    counts = _Counts(k, sum(f.size for f in flats), k.count_direct_kernel, k.count_kernel)
    try:
        for block in _blocks(flats):
            counts.add(block, 2.0**-exponent)
        return counts.result()
    finally:
        counts.release()


def _compiled_scan(k: ModuleType, pieces: list[np.ndarray], exponent: int) -> Scan:
    flats = [f for f in map(_widened, pieces) if f.size]
    scale = 2.0**-exponent
    total = sum(f.size for f in flats)
    counts = _Counts(k, total, k.bin_direct_kernel, k.bin_kernel)
    lo, hi, fits = math.inf, -math.inf, True
    try:
        # block by block (in L2), the block's range (:func:`_range`: one read in C, else
        # numpy's SIMD min/max, ~0.15 ns a value) tells whether every value is finite and on
        # the grid; then the bins need no per-value checks, which halves the binning (1.0 +
        # 0.15 ns a value against 1.9 for the fused scan), and the block is binned while it is
        # in cache
        for block in _blocks(flats):
            seen = _range(block)
            if seen.nan or seen.inf:
                return merge_scans([_fused_scan(k, f, scale) for f in flats])
            lo, hi = min(lo, seen.lo), max(hi, seen.hi)
            fits = fits and max(abs(seen.lo), abs(seen.hi)) * scale < HALF_BINS
            if fits:
                counts.add(block, scale)
        return Scan(lo, hi, total, 0, 0, counts.result() if fits else None)
    finally:
        counts.release()


def _compact(flats: list[np.ndarray]) -> list[np.ndarray]:
    """``flats`` with every run of pieces under :data:`JOIN` values joined into one array (an
    LSTM's 100-value step outputs pooled over a few hundred samples: one scan, not hundreds)."""
    if len(flats) < 2:
        return flats
    out: list[np.ndarray] = []
    run: list[np.ndarray] = []
    for flat in flats:
        if flat.size < JOIN and (not run or flat.dtype == run[0].dtype):
            run.append(flat)
            continue
        if run:
            out.append(_joined(run))
            run = []
        if flat.size < JOIN:
            run.append(flat)
        else:
            out.append(flat)
    if run:
        out.append(_joined(run))
    return out


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


#: set once :func:`warm_up` has loaded the compiled kernels; until then every scan takes the
#: numpy path (the same bins), so a process that bins little never pays numba's load
_LOADED = threading.Event()


def _compiled() -> ModuleType | None:
    """The compiled kernels in use: C where built, else numba once loaded (:func:`warm_up`),
    else None (the numpy path)."""
    native = _native()
    if native is not None:
        return native
    return _kernels() if _LOADED.is_set() else None


def backend() -> str:
    """Which implementation :func:`scan` and :func:`finite_counts` use now: "c", "numba" (once
    :func:`warm_up` has loaded it) or "numpy"."""
    if _native() is not None:
        return "c"
    return "numpy" if _compiled() is None else "numba"


#: values the numpy path bins at a time: its float64 temporaries stay at 2 MiB a block. Whole
#: 2 M-value chunks took 16-32 MiB each on every worker, and glibc keeps such freed blocks in the
#: worker's arena once its mmap threshold has risen: a statistics pass held them to the end
#: (dddd-det: +96 MiB over the first part's binning, before the compiled kernels took over).
NUMPY_BLOCK = 1 << 18


def _numpy_scan_blocks(pieces: list[np.ndarray], exponent: int) -> Scan:
    """:func:`_numpy_scan` of the pieces' concatenation, a block at a time (exact: merged)."""
    return merge_scans([_numpy_scan(b, exponent) for b in _blocks(pieces, NUMPY_BLOCK)])


def _numpy_counts_blocks(pieces: list[np.ndarray], exponent: int) -> np.ndarray:
    """:func:`_numpy_finite_counts` of the pieces' concatenation, a block at a time."""
    counts = np.zeros(NUM_BINS, dtype=np.int64)
    for block in _blocks(pieces, NUMPY_BLOCK):
        counts += _numpy_finite_counts(block, exponent)
    return counts


def _scan(pieces: list[np.ndarray], exponent: int) -> Scan:
    k = _compiled()
    if k is None:
        return _numpy_scan_blocks(pieces, exponent)
    return _compiled_scan(k, pieces, exponent)


def _finite_counts(pieces: list[np.ndarray], exponent: int) -> np.ndarray:
    k = _compiled()
    if k is None:
        return _numpy_counts_blocks(pieces, exponent)
    return _compiled_finite_counts(k, pieces, exponent)


#: arrays this small take the numpy path (the same bins) even once the compiled kernels are
#: loaded: a kernel call's fixed costs exceed their binning
SMALL = 1 << 12

#: an array, or pieces (a list of arrays) standing for their concatenation, not copied
Values = np.ndarray | list[np.ndarray]


def _pieces(x: Values) -> list[np.ndarray]:
    """``x`` as flat pieces, runs of small ones joined (:func:`_compact`)."""
    return _compact([_flat(a) for a in (x if isinstance(x, list) else [x])])


def _flat(a: np.ndarray) -> np.ndarray:
    return a if isinstance(a, np.ndarray) and a.ndim == 1 else np.asarray(a).reshape(-1)


def scan(x: Values, exponent: int) -> Scan:
    """Range, NaN/Inf counts and (when every finite value is on the grid) counts of ``x``."""
    pieces = _pieces(x)
    size = sum(p.size for p in pieces)
    if size == 0:
        return Scan(math.inf, -math.inf, 0, 0, 0, None)
    if size < SMALL:
        return _numpy_scan(_joined(pieces), exponent)
    return _scan(pieces, exponent)


def range_scan(x: Values) -> Scan:
    """Range and NaN/Inf counts of ``x``, no counts (a pass for range-only calibrators): a
    vectorised min and max per piece, each releasing the GIL, so tensors scan in parallel."""
    pieces = [_flat(a) for a in (x if isinstance(x, list) else [x])]
    scans = [_range(p) for p in pieces if p.size]
    return merge_scans(scans) if scans else Scan(math.inf, -math.inf, 0, 0, 0, None)


def _range(x: np.ndarray) -> Scan:
    """Range and NaN/Inf counts of a flat array: in one read with the C kernels, else numpy's
    min and max (two reads, from memory for an array larger than the cache)."""
    native = _native()
    if native is None or x.size < SMALL or x.dtype not in (np.float32, np.float64):
        return _numpy_range(x)[0]
    lo, hi, nan, inf = native.range_kernel(np.ascontiguousarray(x))
    return Scan(lo, hi, x.size - nan - inf, nan, inf, None)


def finite_counts(x: Values, exponent: int) -> np.ndarray:
    """Counts of the finite values of ``x``; each must satisfy ``|v| < HALF_BINS * 2**e``."""
    pieces = _pieces(x)
    if sum(p.size for p in pieces) < SMALL:
        return _numpy_finite_counts(_joined(pieces), exponent)
    return _finite_counts(pieces, exponent)


def warm_up() -> None:
    """Load numba's kernels and use them from now on (its import and first calls take most of
    a second: a caller runs this on a worker while binning goes on with numpy). A no-op where
    the C kernels are built, numba is missing or ``QUANTBENCH_BINNING=numpy``."""
    if _native() is not None:
        return
    k = _kernels()
    if k is None or _LOADED.is_set():
        return
    x = np.zeros(SMALL, np.float32)
    _compiled_scan(k, [x], 0)
    x[0] = np.nan  # the fused kernel, for data with NaN/Inf
    _compiled_scan(k, [x], 0)
    _compiled_finite_counts(k, [x], 0)
    _LOADED.set()


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
