"""``compare``'s per-layer drift summed on the GPU: tensors stay there, only sums come back.

With the CUDA provider, ``compare`` exposes dozens of activations of the FP32 reference (with
the isolated twins of the quantized ops) and of each candidate; copying them all to the host
to take a few dot products there costs more than the inference. :class:`DeviceDrift` takes, per
evaluation batch, every (reference, candidate) pair of both views (accumulated and isolated)
and every clipping count, and runs one kernel over all of them (float64 sums per block of
64 Ki values) and one that folds the blocks, in a fixed order, into per-accumulator totals
on the device. At the end the totals cross to the host once and fill the same
:class:`quantbench.evaluate.metrics.DriftAccumulator` / :class:`ClipCounter` fields the host path
fills,
with the host's rules: a batch holding NaN/Inf counts those values and adds no sum, ``n``
counts every value, clipping compares float32 values with the float32 ``amax``.

The sums are float64 over float32 values (the host uses float32 BLAS dot products, redone in
float64 on overflow), so the two paths agree within float summation-order rounding; ``max_abs``
differs at most by the float32 rounding of the difference. ``xp=numpy`` runs the same
bookkeeping with numpy sums (the CPU tests).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from quantbench.backends.onnxruntime import resolve_provider
from quantbench.backends.ortdevice import CUDA_PROVIDER
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import ClipCounter, DriftAccumulator
from quantbench.stats.devicestats import device_binning_wanted, import_cupy

#: values one block of the drift kernel reads
CHUNK = 1 << 16
THREADS = 256
#: per block and per accumulator: sum a*a, b*b, a*b, d*d, |d|, max |d|, NaN/Inf in a, in b,
#: values beyond amax
FIELDS = 9

_SOURCE = r"""
#define QB_FULL 0xffffffffu
#define QB_FIELDS 9

// entries: [nentries][5] = a address, b address (0: a clipping count only), kind (0 drift,
// 1 clip), accumulator row, first task; amax: [nentries] float32 (<= 0: no clipping count).
// tasks: [ntasks][3] = entry, start, end. out: [ntasks][QB_FIELDS].
extern "C" __global__ void qb_drift(const long long* entries, const float* amax,
                                    const long long* tasks, double* out) {
    const long long* task = tasks + 3 * blockIdx.x;
    const long long* e = entries + 5 * task[0];
    const float* a = reinterpret_cast<const float*>(e[0]);
    const float* b = reinterpret_cast<const float*>(e[1]);
    const float lim = amax[task[0]];
    double s[QB_FIELDS] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (long long i = task[1] + threadIdx.x; i < task[2]; i += blockDim.x) {
        const float av = a[i];
        if (lim > 0.0f && (av > lim || av < -lim)) s[8] += 1.0;
        if (b == nullptr) continue;
        const float bv = b[i];
        if (!isfinite(av)) s[6] += 1.0;
        if (!isfinite(bv)) s[7] += 1.0;
        const double x = (double)av, y = (double)bv, d = x - y;
        s[0] += x * x;
        s[1] += y * y;
        s[2] += x * y;
        s[3] += d * d;
        s[4] += fabs(d);
        s[5] = fabs(d) > s[5] ? fabs(d) : s[5];
    }
    __shared__ double shared[QB_FIELDS][THREADS_PER_BLOCK / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int f = 0; f < QB_FIELDS; ++f) {
        double v = s[f];
        for (int offset = 16; offset > 0; offset >>= 1) {
            const double o = __shfl_down_sync(QB_FULL, v, offset);
            v = f == 5 ? (o > v ? o : v) : v + o;
        }
        if (lane == 0) shared[f][warp] = v;
    }
    __syncthreads();
    if (threadIdx.x < QB_FIELDS) {
        const int f = threadIdx.x;
        double v = shared[f][0];
        for (int w = 1; w < THREADS_PER_BLOCK / 32; ++w) {
            v = f == 5 ? (shared[f][w] > v ? shared[f][w] : v) : v + shared[f][w];
        }
        out[QB_FIELDS * blockIdx.x + f] = v;
    }
}

// One thread per entry: its blocks in order (deterministic), then the host's rules: a drift
// batch with NaN/Inf adds only those counts; a clipping count always adds.
extern "C" __global__ void qb_drift_fold(const long long* entries, int nentries, int ntasks,
                                         const double* out, double* totals) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nentries) return;
    const long long* e = entries + 5 * k;
    const long long first = e[4];
    const long long last = k + 1 < nentries ? entries[5 * (k + 1) + 4] : ntasks;
    double s[QB_FIELDS] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (long long t = first; t < last; ++t) {
        for (int f = 0; f < QB_FIELDS; ++f) {
            const double v = out[QB_FIELDS * t + f];
            s[f] = f == 5 ? (v > s[f] ? v : s[f]) : s[f] + v;
        }
    }
    double* total = totals + QB_FIELDS * e[3];
    if (e[2] == 1 || s[6] + s[7] == 0.0) {
        for (int f = 0; f < QB_FIELDS; ++f) {
            if (f == 6 || f == 7) continue;
            total[f] = f == 5 ? (s[f] > total[f] ? s[f] : total[f]) : total[f] + s[f];
        }
    }
    total[6] += s[6];
    total[7] += s[7];
}
"""


def device_arrays(provider: str | None) -> ModuleType | None:
    """CuPy when ``compare`` keeps its tensors on the GPU: the CUDA provider, CuPy usable, and
    ``QUANTBENCH_DEVICE_BINNING`` not ``0``; else None (the host path, unchanged). An
    unavailable provider fails here in one line (exit 2), as it would when the session starts.
    """
    if not device_binning_wanted() or not provider:
        return None
    if resolve_provider(provider) != CUDA_PROVIDER:
        return None
    try:
        return import_cupy()
    except QuantbenchError:
        return None


def to_host(x: Any) -> np.ndarray:
    """A device array's copy on the host (a host array as it is)."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _kernels(cp: ModuleType) -> tuple[Any, Any]:
    key = id(cp)
    if key not in _KERNEL_CACHE:
        module = cp.RawModule(
            code=_SOURCE, options=("--std=c++14", f"-DTHREADS_PER_BLOCK={THREADS}")
        )
        _KERNEL_CACHE[key] = (module.get_function("qb_drift"), module.get_function("qb_drift_fold"))
    return _KERNEL_CACHE[key]


_KERNEL_CACHE: dict[int, tuple[Any, Any]] = {}


class DeviceDrift:
    """Drift sums and clipping counts of many tensor pairs, accumulated on the device."""

    def __init__(self, xp: ModuleType):
        self.xp = xp
        self.on_device = xp is not np
        self.rows: dict[int, int] = {}  # id(accumulator) -> totals row
        self.accumulators: list[DriftAccumulator | ClipCounter] = []
        self.totals = xp.zeros((0, FIELDS), dtype=xp.float64)
        self.batch: list[tuple[DriftAccumulator | ClipCounter, Any, Any]] = []

    def add(self, acc: DriftAccumulator, a: Any, b: Any) -> None:
        """Queue ``acc.update(a, b)`` for this batch (arrays on the device or the host)."""
        a, b = self._flat(a), self._flat(b)
        if a.shape != b.shape:  # a variable-size output: no value pairs up
            acc.note_mismatch(max(a.size, b.size))
            return
        self.batch.append((acc, a, b))

    def add_clip(self, counter: ClipCounter, values: Any) -> None:
        """Queue ``counter.update(values)`` for this batch."""
        self.batch.append((counter, self._flat(values), None))

    def run(self) -> None:
        """Sum this batch's queue into the device totals; returns when the GPU has read the
        batch's arrays (they may be released then)."""
        batch, self.batch = self.batch, []
        for acc, a, _ in batch:
            acc.n += int(a.size)
        batch = [item for item in batch if item[1].size]
        if not batch:
            return
        self._grow(batch)
        if not self.on_device:
            for acc, a, b in batch:
                self.totals[self.rows[id(acc)]] = _fold(
                    self.totals[self.rows[id(acc)]], _numpy_sums(a, b, _amax(acc)), b is None
                )
            return
        xp = self.xp
        entries, amax, tasks = _tables(batch, self.rows)
        drift, fold = _kernels(xp)
        out = xp.empty((len(tasks), FIELDS), dtype=xp.float64)
        entries_d = xp.asarray(entries)
        drift((len(tasks),), (THREADS,), (entries_d, xp.asarray(amax), xp.asarray(tasks), out))
        n = len(batch)
        fold(((n + 127) // 128,), (128,), (entries_d, np.int32(n), np.int32(len(tasks)), out,
                                           self.totals))  # fmt: skip
        xp.cuda.get_current_stream().synchronize()

    def finish(self) -> None:
        """Copy the totals into the accumulators (once, at the end)."""
        totals = self.totals.get() if self.on_device else self.totals
        for acc, row in zip(self.accumulators, totals):
            if isinstance(acc, ClipCounter):
                acc.clipped += int(row[8])
                continue
            acc.sum_aa += float(row[0])
            acc.sum_bb += float(row[1])
            acc.sum_ab += float(row[2])
            acc.sum_dd += float(row[3])
            acc.sum_abs_d += float(row[4])
            acc.max_abs_d = max(acc.max_abs_d, float(row[5]))
            acc.nonfinite_a += int(row[6])
            acc.nonfinite_b += int(row[7])
            acc.clipped += int(row[8])
        self.totals = self.xp.zeros((len(self.accumulators), FIELDS), dtype=self.xp.float64)

    # ---------------------------------------------------------------- internals
    def _flat(self, x: Any) -> Any:
        """Flat contiguous float32 (the host path's ``np.ascontiguousarray(x, float32)``)."""
        xp = self.xp
        x = xp.asarray(x)
        if x.dtype != xp.float32:
            x = x.astype(xp.float32)
        return xp.ascontiguousarray(x).reshape(-1)

    def _grow(self, batch: list[tuple[Any, Any, Any]]) -> None:
        new = [acc for acc, _, _ in batch if id(acc) not in self.rows]
        for acc in new:
            if id(acc) not in self.rows:
                self.rows[id(acc)] = len(self.accumulators)
                self.accumulators.append(acc)
        extra = len(self.accumulators) - len(self.totals)
        if extra > 0:
            zeros = self.xp.zeros((extra, FIELDS), dtype=self.xp.float64)
            self.totals = self.xp.concatenate([self.totals, zeros])


def _amax(acc: DriftAccumulator | ClipCounter) -> float:
    amax = acc.amax
    return float(np.float32(amax)) if amax is not None and amax > 0 else 0.0


def _tables(
    batch: list[tuple[Any, Any, Any]], rows: dict[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernels' tables (see ``_SOURCE``): entries, float32 amax per entry, block tasks."""
    entries, amax, tasks = [], [], []
    for k, (acc, a, b) in enumerate(batch):
        size = int(a.size)
        entries.append((a.data.ptr, 0 if b is None else b.data.ptr, int(b is None),
                        rows[id(acc)], len(tasks)))  # fmt: skip
        amax.append(_amax(acc))
        tasks.extend((k, start, min(start + CHUNK, size)) for start in range(0, size, CHUNK))
    return (
        np.array(entries, dtype=np.uint64).view(np.int64),
        np.array(amax, dtype=np.float32),
        np.array(tasks, dtype=np.int64),
    )


def _numpy_sums(a: np.ndarray, b: np.ndarray | None, amax: float) -> np.ndarray:
    """One entry's sums, as the kernel computes them, in numpy (float64)."""
    out = np.zeros(FIELDS)
    if amax > 0:
        lim = np.float32(amax)
        out[8] = np.count_nonzero(a > lim) + np.count_nonzero(a < -lim)
    if b is None:
        return out
    x, y = a.astype(np.float64), b.astype(np.float64)
    d = x - y
    with np.errstate(invalid="ignore", over="ignore"):
        out[:6] = (x @ x, y @ y, x @ y, d @ d, np.abs(d).sum(), np.abs(d).max(initial=0.0))
    out[6] = a.size - np.count_nonzero(np.isfinite(a))
    out[7] = b.size - np.count_nonzero(np.isfinite(b))
    return out


def _fold(total: np.ndarray, s: np.ndarray, clip: bool) -> np.ndarray:
    """``qb_drift_fold``'s rule for one entry."""
    total = total.copy()
    if clip or s[6] + s[7] == 0:
        keep = [f for f in range(FIELDS) if f not in (5, 6, 7)]
        total[keep] += s[keep]
        total[5] = max(total[5], s[5]) if not math.isnan(s[5]) else total[5]
    total[6:8] += s[6:8]
    return total
