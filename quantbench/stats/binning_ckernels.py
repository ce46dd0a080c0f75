"""The C binning kernels (``_binning.c``, built at install as the optional extension
``quantbench.stats._binning_c``) behind the same functions as the numba ones
(:mod:`quantbench.stats.binning_kernels`), so :mod:`quantbench.stats.binning` uses either.

Called through ctypes, which releases the GIL for the call: tensors bin on several cores at
once. Importing this module raises ImportError where the extension was not built (no C
compiler at install) or was built for another grid.
"""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np

from quantbench.stats.grid import HALF_BINS, NUM_BINS

_spec = importlib.util.find_spec("quantbench.stats._binning_c")
if _spec is None or not _spec.origin:
    raise ImportError("quantbench.stats._binning_c was not built")
try:
    _lib = ctypes.CDLL(_spec.origin)
    _lib.qb_half_bins.restype = ctypes.c_int64
    _half_bins = _lib.qb_half_bins()
except (OSError, AttributeError) as error:  # not loadable here, or not these kernels
    raise ImportError(f"quantbench.stats._binning_c cannot be used: {error}") from error
if _half_bins != HALF_BINS:
    raise ImportError("quantbench.stats._binning_c was built for another grid: reinstall")

_P, _N, _S = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _functions(kind: str, argtypes: list) -> dict[np.dtype, ctypes._CFuncPtr]:
    found = {}
    for dtype, suffix in _SUFFIX.items():
        fn = getattr(_lib, f"qb_{kind}_{suffix}")
        fn.argtypes, fn.restype = argtypes, None
        found[dtype] = fn
    return found


_BIN = _functions("bin", [_P, _N, _S, _P])
_COUNT = _functions("count", [_P, _N, _S, _P])
_BIN_DIRECT = _functions("bin_direct", [_P, _N, _S, _P])
_COUNT_DIRECT = _functions("count_direct", [_P, _N, _S, _P])
_SCAN = _functions("scan", [_P, _N, _S, _P, _P, _P])
_RANGE = _functions("range", [_P, _N, _P, _P])
_lib.qb_drain.argtypes, _lib.qb_drain.restype = [_P, _P, ctypes.c_int], None


def _values(x: np.ndarray) -> np.ndarray:
    """``x`` as the C side reads it (it trusts its pointers): a flat contiguous float32/float64
    array, as the numba kernels take; anything else refused."""
    if x.dtype not in _SUFFIX or x.ndim != 1 or not x.flags.c_contiguous:
        raise TypeError(f"binning: a flat contiguous float32/float64 array, not {x.dtype}")
    return x


def _counts(target: np.ndarray, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """``target`` where it is the counts the C side writes (``dtype``, ``shape``, contiguous)."""
    if target.dtype != dtype or target.shape != shape or not target.flags.c_contiguous:
        raise TypeError(f"binning: counts must be {np.dtype(dtype)} {shape}")
    return target


_SUB = (4, NUM_BINS)  # the four interleaved int32 sub-histograms
_OUT = (NUM_BINS,)  # the int64 counts


def _binned(kernels: dict, x: np.ndarray, scale: float, target: np.ndarray, shape: tuple) -> None:
    """One of the four binning kernels on ``x`` into ``target``: the sub-histograms (int32,
    :data:`_SUB`) or the int64 counts (:data:`_OUT`)."""
    dtype = np.int32 if shape == _SUB else np.int64
    kernels[_values(x).dtype](
        x.ctypes.data, x.size, scale, _counts(target, dtype, shape).ctypes.data
    )


def bin_kernel(x: np.ndarray, scale: float, sub: np.ndarray) -> None:
    """Bin ``x`` into ``sub``: every value finite and on the grid (the caller checked)."""
    _binned(_BIN, x, scale, sub, _SUB)


def count_kernel(x: np.ndarray, scale: float, sub: np.ndarray) -> None:
    """Bin the finite values of ``x`` (all on the grid) into ``sub``."""
    _binned(_COUNT, x, scale, sub, _SUB)


def bin_direct_kernel(x: np.ndarray, scale: float, out: np.ndarray) -> None:
    """:func:`bin_kernel` straight into the int64 counts (few values)."""
    _binned(_BIN_DIRECT, x, scale, out, _OUT)


def count_direct_kernel(x: np.ndarray, scale: float, out: np.ndarray) -> None:
    """:func:`count_kernel` straight into the int64 counts (few values)."""
    _binned(_COUNT_DIRECT, x, scale, out, _OUT)


def scan_kernel(
    x: np.ndarray, scale: float, sub: np.ndarray
) -> tuple[float, float, int, int, bool]:
    """min, max, NaN and Inf counts of ``x`` and, while every finite value fits, its bins."""
    _values(x)
    _counts(sub, np.int32, _SUB)
    result = np.empty(2, np.float64)
    counts = np.empty(3, np.int64)
    _SCAN[x.dtype](x.ctypes.data, x.size, scale, sub.ctypes.data, result.ctypes.data,
                   counts.ctypes.data)  # fmt: skip
    return float(result[0]), float(result[1]), int(counts[0]), int(counts[1]), bool(counts[2])


def range_kernel(x: np.ndarray) -> tuple[float, float, int, int]:
    """min and max of the finite values of ``x`` (inf, -inf where none is finite) and its NaN
    and Inf counts, in one read of ``x``."""
    _values(x)
    result = np.empty(2, np.float64)
    counts = np.empty(2, np.int64)
    _RANGE[x.dtype](x.ctypes.data, x.size, result.ctypes.data, counts.ctypes.data)
    return float(result[0]), float(result[1]), int(counts[0]), int(counts[1])


def drain_kernel(sub: np.ndarray, out: np.ndarray) -> None:
    """Add the sub-histograms into ``out`` and zero them."""
    _drain(sub, out, store=False)


def drain_store_kernel(sub: np.ndarray, out: np.ndarray) -> None:
    """:func:`drain_kernel` into an uninitialised ``out`` (stores, not adds)."""
    _drain(sub, out, store=True)


def _drain(sub: np.ndarray, out: np.ndarray, *, store: bool) -> None:
    _lib.qb_drain(_counts(sub, np.int32, _SUB).ctypes.data,
                  _counts(out, np.int64, _OUT).ctypes.data, int(store))  # fmt: skip
