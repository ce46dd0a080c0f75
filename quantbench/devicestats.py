"""Tensor statistics computed where the tensor lives: on the GPU, with CuPy (optional).

Copying every exposed activation to the host to bin it there costs more than the inference
itself on a GPU (the PCIe copy alone, then one host pass per tensor). :class:`DeviceTensorStats`
keeps one tensor's counts on the device and only its scalars (range, NaN/Inf counts) and, at
the end, its 32768 counts cross to the host.

It is exactly :class:`quantbench.stats.TensorStats` computed elsewhere: the same steps in the same
order (:meth:`TensorStats.update`'s grid-widening rule, :meth:`TensorStats.update_relu`'s reuse of
a source's bins), the same bin arithmetic (``HALF_BINS + floor(float64(v) * 2**-e)``, exact in
float64, see :mod:`quantbench.binning`), so :meth:`DeviceTensorStats.to_host` gives the
statistics the host path gives for the same values, bit for bit. The arithmetic is written once
against an array namespace (``xp``: CuPy, or numpy so the logic runs and is tested on a CPU);
only the kernels differ (:class:`BinOps`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from quantbench import binning
from quantbench.binning import HALF_BINS, NUM_BINS
from quantbench.errors import QuantbenchError
from quantbench.stats import MIN_EXPONENT, TensorStats, exponent_for

#: ``QUANTBENCH_DEVICE_BINNING=0`` bins on the host even when the data is on the GPU.
DEVICE_BINNING_ENV = "QUANTBENCH_DEVICE_BINNING"
CUPY_HINT = "pip install 'quantbench[gpu]' (or cupy-cuda13x / cupy-cuda12x matching your CUDA)"

#: float -> double, exact for subnormals too: single-precision arithmetic on the GPU may flush
#: subnormals to zero (seen on CuPy's kernels), so a float's bits are decoded when its exponent
#: field is 0; double arithmetic never flushes. min/max propagate NaN as numpy's do.
_PREAMBLE = """
__device__ double qb_double(double x) { return x; }
__device__ double qb_double(float x) {
    int bits = __float_as_int(x);
    if ((bits & 0x7f800000) == 0) {
        double v = ldexp((double)(bits & 0x007fffff), -149);
        return bits < 0 ? -v : v;
    }
    return (double)x;
}
template <typename T> __device__ double qb_double(T x) { return (double)(float)x; }
__device__ double qb_min(double a, double b) { return (a < b || a != a) ? a : b; }
__device__ double qb_max(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ double qb_finite_or(double v, double other) { return isfinite(v) ? v : other; }
#define QB_INF __longlong_as_double(0x7ff0000000000000LL)
"""

# The finite values of x (all on the grid) -> counts, in one pass and no temporary: float64
# arithmetic as on the host, 64-bit atomics (two's complement: int64 counts add the same);
# ``relu`` bins max(x, 0) instead.
_COUNT_SOURCE = f"""
double v = qb_double(x);
if (relu && v < 0.0) v = 0.0;
if (isfinite(v)) {{
    long long b = (long long)floor(v * scale) + {HALF_BINS}LL;
    b = b < 0 ? 0 : (b > {NUM_BINS - 1}LL ? {NUM_BINS - 1}LL : b);
    atomicAdd(reinterpret_cast<unsigned long long*>(&counts[b]), 1ULL);
}}
"""


def import_cupy() -> ModuleType:
    """CuPy with a usable GPU, or a QuantbenchError naming what is missing."""
    try:
        import cupy
    except ImportError:
        raise QuantbenchError(f"statistics on the GPU need CuPy: {CUPY_HINT}") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise QuantbenchError("statistics on the GPU: CuPy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise QuantbenchError(f"statistics on the GPU: CuPy cannot use CUDA ({exc})") from None
    return cupy


def device_binning_wanted() -> bool:
    """False when ``$QUANTBENCH_DEVICE_BINNING`` is ``0``/``no``/``off`` (host binning)."""
    return os.environ.get(DEVICE_BINNING_ENV, "1").strip().lower() not in ("0", "no", "off")


class BinOps:
    """The array operations the statistics need, exact on numpy and on CuPy.

    ``numpy``: the host reference (:func:`binning.numpy_finite_counts`, ``min``/``max``);
    ``cupy``: CUDA kernels doing the arithmetic in float64 (see ``_PREAMBLE``), compiled once
    per dtype and cached on disk by CuPy.
    """

    def __init__(self, xp: ModuleType):
        self.xp = xp
        self.on_device = xp is not np
        if self.on_device:
            self._count = xp.ElementwiseKernel(
                "T x, float64 scale, int32 relu",
                "raw int64 counts",
                _COUNT_SOURCE,
                "qb_bin_count",
                preamble=_PREAMBLE,
            )
            self._relu = xp.ElementwiseKernel(
                "T x", "float64 y", "double v = qb_double(x); y = v < 0.0 ? 0.0 : v;",
                "qb_relu", preamble=_PREAMBLE,
            )  # fmt: skip
            self._min, self._max, self._fmin, self._fmax = (
                xp.ReductionKernel(
                    "T x",
                    "float64 y",
                    mapped,
                    reduce,
                    "y = a",
                    identity,
                    name,
                    preamble=_PREAMBLE,
                )
                for name, mapped, reduce, identity in (
                    ("qb_min", "qb_double(x)", "qb_min(a, b)", "QB_INF"),
                    ("qb_max", "qb_double(x)", "qb_max(a, b)", "-QB_INF"),
                    ("qb_fmin", "qb_finite_or(qb_double(x), QB_INF)", "qb_min(a, b)", "QB_INF"),
                    ("qb_fmax", "qb_finite_or(qb_double(x), -QB_INF)", "qb_max(a, b)", "-QB_INF"),
                )
            )

    def add(self, counts: Any, x: Any, exponent: int, relu: bool = False) -> None:
        """``counts +=`` the bins of the finite values of ``x`` (of ``max(x, 0)`` with relu)."""
        if self.on_device:
            self._count(x, 2.0**-exponent, int(relu), counts)
            return
        counts += binning.numpy_finite_counts(np.maximum(x, 0) if relu else x, exponent)

    def relu(self, x: Any) -> Any:
        """``max(x, 0)``, NaN kept (float64 on the device: exact for every input dtype)."""
        return self._relu(x) if self.on_device else np.maximum(x, 0)

    def range(self, x: Any) -> Any:
        """[min, max] of ``x`` as one small array (NaN if any is NaN, +-Inf counted)."""
        if self.on_device:
            return self.xp.stack([self._min(x), self._max(x)])
        return np.array([x.min(), x.max()], dtype=np.float64)

    def finite_range(self, x: Any) -> Any:
        """[min, max] of the finite values of ``x`` (+Inf, -Inf when there are none)."""
        if self.on_device:
            return self.xp.stack([self._fmin(x), self._fmax(x)])
        finite = x[np.isfinite(x)]
        if finite.size == 0:
            return np.array([np.inf, -np.inf])
        return np.array([finite.min(), finite.max()], dtype=np.float64)


@dataclass(frozen=True)
class DeviceBatch:
    """What one batch added (the device twin of ``stats.BatchCounts``)."""

    counts: Any
    exponent: int
    lo: float
    hi: float
    finite: int
    finite_only: bool


class DeviceTensorStats:
    """One tensor's statistics with its counts on the device (see the module docstring)."""

    def __init__(self, name: str, ops: BinOps):
        self.name = name
        self.ops = ops
        self.xp = ops.xp
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.nan_count = 0
        self.inf_count = 0
        self.exponent = MIN_EXPONENT
        self.counts = self.xp.zeros(NUM_BINS, dtype=self.xp.int64)

    def update(self, values: Any) -> DeviceBatch | None:
        """:meth:`TensorStats.update` on device values (any shape, float dtype)."""
        x = values.reshape(-1)
        if x.size == 0:
            return None
        lo, hi, finite, nan, inf = self._range(x)
        self.nan_count += nan
        self.inf_count += inf
        if finite == 0:
            return None
        if not max(abs(lo), abs(hi)) < HALF_BINS * 2.0**self.exponent:
            self._grow(exponent_for(max(abs(lo), abs(hi))))
        batch = self.xp.zeros(NUM_BINS, dtype=self.xp.int64)
        self.ops.add(batch, x, self.exponent)
        self.counts += batch
        self._add_range(finite, lo, hi)
        return DeviceBatch(batch, self.exponent, lo, hi, finite, nan + inf == 0)

    def update_relu(self, source: DeviceBatch | None, values: Any) -> None:
        """:meth:`TensorStats.update_relu`: ``max(values, 0)`` from the source batch's bins."""
        if source is None:
            return
        if not source.finite_only:
            self.update(self.ops.relu(values))
            return
        lo, hi = max(source.lo, 0.0), max(source.hi, 0.0)
        self._grow(exponent_for(hi))
        if self.exponent == source.exponent:  # negatives become 0: positive bin 0
            self.counts[HALF_BINS:] += source.counts[HALF_BINS:]
            self.counts[HALF_BINS : HALF_BINS + 1] += source.counts[:HALF_BINS].sum()
        else:
            self.ops.add(self.counts, values.reshape(-1), self.exponent, relu=True)
        self._add_range(source.finite, lo, hi)

    def to_host(self) -> TensorStats:
        """The statistics as a host :class:`TensorStats` (the only copy of the counts)."""
        counts = self.counts.get() if hasattr(self.counts, "get") else self.counts.copy()
        return TensorStats(
            self.name,
            self.count,
            self.min,
            self.max,
            self.nan_count,
            self.inf_count,
            self.exponent,
            np.asarray(counts, dtype=np.int64),
        )

    # ---------------------------------------------------------------- internals
    def _range(self, x: Any) -> tuple[float, float, int, int, int]:
        """(lo, hi) of the finite values, how many are finite, NaN, Inf: one transfer when all
        are finite (min/max propagate NaN and see Inf), a second one otherwise."""
        lo, hi = (float(v) for v in _host(self.ops.range(x)))
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, int(x.size), 0, 0
        xp = self.xp
        counts = xp.stack([xp.isnan(x).sum(), xp.isfinite(x).sum()])
        lo, hi = (float(v) for v in _host(self.ops.finite_range(x)))
        nan, finite = (int(v) for v in _host(counts))
        return lo, hi, finite, nan, int(x.size) - finite - nan

    def _grow(self, exponent: int) -> None:
        """:meth:`TensorStats._grow` on the device: sum old bins in groups (exact)."""
        if exponent <= self.exponent:
            return
        shift = exponent - self.exponent
        neg = self._coarsen(self.counts[:HALF_BINS][::-1], shift)
        pos = self._coarsen(self.counts[HALF_BINS:], shift)
        self.counts = self.xp.concatenate([neg[::-1], pos])
        self.exponent = exponent

    def _coarsen(self, half: Any, shift: int) -> Any:
        out = self.xp.zeros(HALF_BINS, dtype=self.xp.int64)
        if shift >= HALF_BINS.bit_length():
            out[:1] = half.sum()
            return out
        summed = self.xp.ascontiguousarray(half).reshape(-1, 1 << shift).sum(axis=1)
        out[: summed.size] = summed
        return out

    def _add_range(self, n: int, lo: float, hi: float) -> None:
        self.count += n
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)


def _host(a: Any) -> np.ndarray:
    """A small array on the host (one device-to-host copy for CuPy)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)
