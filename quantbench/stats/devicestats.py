"""Tensor statistics computed where the tensors live: on the GPU, with CuPy (optional).

Copying every exposed activation to the host to bin it there costs more than the inference
itself on a GPU. :class:`StatsBank` keeps the counts of every calibrated tensor on the device,
one row each, and works a part (all the tensors one inference exposed) at a time:

1. one *range* kernel over all the part's tensors (finite min/max, NaN, +Inf, -Inf counts per
   block of 64 Ki values), then ONE transfer of those few numbers to the host;
2. on the host, per tensor, :meth:`quantbench.stats.tensorstats.TensorStats.update`'s rules: the
grid
   widens to the batch's range (the rare widening re-grids that tensor's row with
   :meth:`TensorStats.counts_at`, the host's exact re-gridding), NaN/Inf are counted, and the
   Relu tensors derived from a source (:func:`quantbench.collect.statspass.derivation_plan`) follow
   :meth:`TensorStats.update_relu`: they are ``max(x, 0)`` of the source's batch, skipped when
   the batch has no finite value;
3. one *count* kernel over all the part's tensors: each value read once and counted in a
   block-private histogram in shared memory (the bin of 0, where ReLU-like data piles up, per
   warp with a ballot), which is added to the tensor's row once per block of 1 Mi values. A
   Relu on its source's grid takes the block's bins (negative ones into bin 0: exactly
   ``update_relu``'s reuse of the source's bins); a Relu on a finer grid bins ``max(x, 0)`` in
   the same read, with 64-bit atomics.

The bin arithmetic is the host's (``HALF_BINS + floor(float64(v) * 2**-e)``, exact in float64,
see :mod:`quantbench.stats.binning`), so :meth:`StatsBank.results` gives the statistics the host
path gives for the same values, bit for bit. The count kernel runs without a host sync: the
caller keeps the part's arrays alive until :meth:`StatsBank.fence` says the GPU is done with
them, so onnxruntime can run the next part meanwhile.

The same steps run on numpy (``xp=numpy``: the kernels become numpy calls), which is how the
rules are tested on a machine without a GPU; the kernels are tested on the device against the
host :class:`TensorStats` (tests/gpu/test_gpu_path_binning.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.stats import binning
from quantbench.stats.binning import HALF_BINS, NUM_BINS
from quantbench.stats.tensorstats import MIN_EXPONENT, TensorStats, counts_dtype, exponent_for

#: ``QUANTBENCH_DEVICE_BINNING=0`` bins on the host even when the data is on the GPU.
DEVICE_BINNING_ENV = "QUANTBENCH_DEVICE_BINNING"
CUPY_HINT = "pip install 'quantbench[gpu]' (or cupy-cuda13x / cupy-cuda12x matching your CUDA)"
#: values one block of the range kernel reads, and its threads
CHUNK = 1 << 16
THREADS = 256
#: values one block of the count kernel reads (one private histogram of NUM_BINS 32-bit
#: counts in shared memory, 128 KiB, zeroed and added to the tensor's row once), its threads
COUNT_CHUNK = 1 << 20
COUNT_THREADS = 1024
HISTOGRAM_BYTES = NUM_BINS * 4
#: Relus on another grid than their source that one count task bins (more take further tasks)
MAX_RELUS = 4

#: float -> double, exact for subnormals too: single-precision arithmetic on the GPU may flush
#: subnormals to zero (seen on CuPy's kernels), so a float's bits are decoded when its exponent
#: field is 0; double arithmetic never flushes.
_SOURCE = r"""
#define QB_HALF 16384LL
#define QB_BINS 32768LL
#define QB_FULL 0xffffffffu

__device__ __forceinline__ double qb_double(double x) { return x; }
__device__ __forceinline__ double qb_double(float x) {
    int bits = __float_as_int(x);
    if ((bits & 0x7f800000) == 0) {
        double v = ldexp((double)(bits & 0x007fffff), -149);
        return bits < 0 ? -v : v;
    }
    return (double)x;
}

__device__ __forceinline__ long long qb_bin(double v, double scale) {
    long long b = (long long)floor(v * scale) + QB_HALF;
    return b < 0 ? 0 : (b > QB_BINS - 1 ? QB_BINS - 1 : b);
}

// tasks: [ntasks][3] = tensor, start, end; ptrs: [ntensors] device addresses;
// out: [ntasks][5] = finite min, finite max, NaN, +Inf, -Inf (counts as doubles, exact)
template <typename T>
__global__ void qb_range(const long long* tasks, const unsigned long long* ptrs, double* out) {
    const long long* task = tasks + 3 * blockIdx.x;
    const T* x = reinterpret_cast<const T*>(ptrs[task[0]]);
    const long long start = task[1], end = task[2];
    const double inf = __longlong_as_double(0x7ff0000000000000LL);
    double lo = inf, hi = -inf;
    long long nan = 0, pinf = 0, ninf = 0;
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        double v = qb_double(x[i]);
        if (isfinite(v)) {
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        } else if (v != v) {
            ++nan;
        } else if (v > 0.0) {
            ++pinf;
        } else {
            ++ninf;
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        double l = __shfl_down_sync(QB_FULL, lo, offset);
        double h = __shfl_down_sync(QB_FULL, hi, offset);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
        nan += __shfl_down_sync(QB_FULL, nan, offset);
        pinf += __shfl_down_sync(QB_FULL, pinf, offset);
        ninf += __shfl_down_sync(QB_FULL, ninf, offset);
    }
    __shared__ double s_lo[32], s_hi[32];
    __shared__ long long s_nan[32], s_pinf[32], s_ninf[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_lo[warp] = lo; s_hi[warp] = hi;
        s_nan[warp] = nan; s_pinf[warp] = pinf; s_ninf[warp] = ninf;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            lo = s_lo[w] < lo ? s_lo[w] : lo;
            hi = s_hi[w] > hi ? s_hi[w] : hi;
            nan += s_nan[w]; pinf += s_pinf[w]; ninf += s_ninf[w];
        }
        double* o = out + 5 * blockIdx.x;
        o[0] = lo; o[1] = hi; o[2] = (double)nan; o[3] = (double)pinf; o[4] = (double)ninf;
    }
}

// ints: tasks [ntasks][8] = tensor, start, end, own (bin the tensor: 0/1), first and end
//       "binned" relu, first and end "derived" relu;
//       then tensor addresses [ntensors], tensor rows [ntensors], relu rows [nrelus].
// reals: tensor scales 2**-e [ntensors], relu scales [nrelus].
// The tensor's values are counted in a block-private histogram in shared memory (32-bit,
// QB_BINS of them: dynamic shared memory) and added to its row once per block. A "derived"
// relu (own tasks only: its grid is the tensor's) takes the block's bins: the non-negative
// ones as they are, the negative ones and -Inf in bin 0 (max(v, 0) = 0). A "binned" relu
// (another grid, at most QB_MAX_RELUS per task) bins max(v, 0) itself with 64-bit atomics:
// NaN and +Inf skipped, -Inf -> 0, as numpy's maximum gives them. The bin of 0, where
// ReLU-like data piles up, is counted per warp with a ballot.
#define QB_MAX_RELUS 4
template <typename T>
__global__ void qb_count(const long long* ints, const double* reals, int ntasks, int ntensors,
                         unsigned long long* counts) {
    extern __shared__ unsigned int hist[];
    const long long* task = ints + 8 * blockIdx.x;
    const long long* tptr = ints + 8 * (long long)ntasks;
    const long long* trow = tptr + ntensors;
    const long long* rrow = trow + ntensors;
    const double* rscale = reals + ntensors;
    const long long t = task[0], start = task[1], end = task[2];
    const bool own = task[3] != 0;
    const int r0 = (int)task[4], nr = (int)(task[5] - task[4]);
    const int d0 = (int)task[6], nd = (int)(task[7] - task[6]);
    const T* x = reinterpret_cast<const T*>(tptr[t]);
    unsigned long long* row = counts + trow[t] * QB_BINS;
    const double scale = reals[t];
    unsigned long long* rrows[QB_MAX_RELUS];
    double rs[QB_MAX_RELUS];
    unsigned long long rzero[QB_MAX_RELUS];
#pragma unroll
    for (int k = 0; k < QB_MAX_RELUS; ++k) {
        rrows[k] = k < nr ? counts + rrow[r0 + k] * QB_BINS : row;
        rs[k] = k < nr ? rscale[r0 + k] : 1.0;
        rzero[k] = 0;
    }
    if (own) {
        for (int k = threadIdx.x; k < QB_BINS; k += blockDim.x) hist[k] = 0u;
        __syncthreads();
    }
    const double inf = __longlong_as_double(0x7ff0000000000000LL);
    unsigned int zero = 0, ninf = 0;
    const int lane = threadIdx.x & 31;
    // every thread of the block makes the same number of trips (the ballots need whole warps)
    for (long long base = start; base < end; base += blockDim.x) {
        const long long i = base + threadIdx.x;
        const bool in = i < end;
        const double v = in ? qb_double(x[i]) : 0.0;
        if (own) {
            const bool ok = in && isfinite(v);
            const long long b = ok ? qb_bin(v, scale) : -1;
            const unsigned mask = __ballot_sync(QB_FULL, b == QB_HALF);
            if (ok && b != QB_HALF) atomicAdd(hist + b, 1u);
            zero += __popc(mask);
            if (nd) ninf += __popc(__ballot_sync(QB_FULL, in && v == -inf));
        }
#pragma unroll
        for (int k = 0; k < QB_MAX_RELUS; ++k) {
            if (k < nr) {
                const bool ok = in && v == v && v != inf;
                const long long b = ok ? qb_bin(v < 0.0 ? 0.0 : v, rs[k]) : -1;
                const unsigned mask = __ballot_sync(QB_FULL, b == QB_HALF);
                if (ok && b != QB_HALF) atomicAdd(rrows[k] + b, 1ULL);
                rzero[k] += __popc(mask);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < QB_MAX_RELUS; ++k) {
            if (k < nr && rzero[k]) atomicAdd(rrows[k] + QB_HALF, rzero[k]);
        }
    }
    if (!own) return;
    if (lane == 0 && zero) atomicAdd(hist + QB_HALF, zero);
    __syncthreads();
    unsigned long long negative = 0;
    for (int k = threadIdx.x; k < QB_BINS; k += blockDim.x) {
        const unsigned int c = hist[k];
        if (c == 0u) continue;
        atomicAdd(row + k, (unsigned long long)c);
        if (k < QB_HALF) {
            negative += c;
        } else {
            for (int j = 0; j < nd; ++j) {
                atomicAdd(counts + rrow[d0 + j] * QB_BINS + k, (unsigned long long)c);
            }
        }
    }
    if (nd) {
        for (int offset = 16; offset > 0; offset >>= 1) {
            negative += __shfl_down_sync(QB_FULL, negative, offset);
        }
        const unsigned long long zeros = negative + ninf;
        if (lane == 0 && zeros) {
            for (int j = 0; j < nd; ++j) {
                atomicAdd(counts + rrow[d0 + j] * QB_BINS + QB_HALF, zeros);
            }
        }
    }
}
"""
_KERNELS = ("qb_range<float>", "qb_range<double>", "qb_count<float>", "qb_count<double>")


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


@dataclass
class _Slot:
    """One tensor's scalars (its counts are row ``row`` of the bank's counts)."""

    name: str
    row: int
    count: int = 0
    min: float = math.inf
    max: float = -math.inf
    nan_count: int = 0
    inf_count: int = 0
    exponent: int = MIN_EXPONENT
    relus: list[_Slot] = field(default_factory=list)

    def widen(self, max_abs: float, bank: StatsBank) -> None:
        """The grid widens to hold ``max_abs`` (``TensorStats.update``'s rule); counts binned
        so far are re-gridded exactly, on the host (rare: only when a batch exceeds the grid)."""
        if max_abs < HALF_BINS * 2.0**self.exponent:
            return
        exponent = exponent_for(max_abs)
        if self.count:
            old = TensorStats(self.name, exponent=self.exponent, counts=bank.row(self.row))
            bank.set_row(self.row, old.counts_at(exponent))
        self.exponent = exponent

    def add_range(self, n: int, lo: float, hi: float) -> None:
        self.count += n
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)


@dataclass(frozen=True)
class _Binned:
    """What the count pass bins of one tensor of a part."""

    values: Any  # flat float32/float64 array
    slot: _Slot  # the tensor itself
    relus: tuple[_Slot, ...]  # the Relus derived from it


class StatsBank:
    """The statistics of many tensors, counts on the device (see the module docstring).

    ``measured``: tensors whose values :meth:`add` receives; ``relus_of``: source -> the Relu
    tensors binned from it (``max(source, 0)``). ``xp`` is CuPy, or numpy (the same rules on
    the host, for tests).
    """

    def __init__(self, xp: ModuleType, measured: list[str], relus_of: dict[str, list[str]]):
        self.xp = xp
        self.on_device = xp is not np
        self.slots: dict[str, _Slot] = {}
        for name in measured:
            self.slots[name] = _Slot(name, len(self.slots))
        for src, relus in relus_of.items():
            for relu in relus:
                slot = _Slot(relu, len(self.slots))
                self.slots[src].relus.append(slot)
                self.slots[relu] = slot
        self.counts = xp.zeros((len(self.slots), NUM_BINS), dtype=xp.int64)
        self._kernels = _kernels(xp) if self.on_device else None
        self._range_out = None  # reused device buffer of the range kernel's block results

    # ---------------------------------------------------------------- one part
    def add(self, values: dict[str, Any]) -> None:
        """Add one part (``{measured tensor: array}``). Returns after one host sync (the
        ranges); the counting runs on, reading ``values``: keep them until :meth:`fence`."""
        flat = {name: self._flat(x) for name, x in values.items() if x.size}
        if not flat:
            return
        ranges = self._ranges(list(flat.values()))
        work = [self._rules(self.slots[name], x, r) for (name, x), r in zip(flat.items(), ranges)]
        self._count([w for w in work if w is not None])

    def fence(self) -> Any:
        """An event the GPU passes once the counting of every part added so far is done
        (``None`` on numpy, where nothing is pending)."""
        if not self.on_device:
            return None
        event = self.xp.cuda.Event(block=False, disable_timing=True)
        event.record()
        return event

    def results(self) -> dict[str, TensorStats]:
        """Host statistics of every tensor (one copy of all counts)."""
        counts = self.counts.get() if self.on_device else self.counts
        return {
            s.name: TensorStats(
                s.name,
                s.count,
                s.min,
                s.max,
                s.nan_count,
                s.inf_count,
                s.exponent,
                np.array(counts[s.row], dtype=counts_dtype(s.count)),
            )
            for s in self.slots.values()
        }

    # ---------------------------------------------------------------- rows (re-gridding)
    def row(self, row: int) -> np.ndarray:
        r = self.counts[row]
        return r.get() if self.on_device else r.copy()

    def set_row(self, row: int, counts: np.ndarray) -> None:
        self.counts[row] = self.xp.asarray(counts, dtype=self.xp.int64)

    # ---------------------------------------------------------------- internals
    def _flat(self, x: Any) -> Any:
        """Flat, contiguous float32 or float64 (other float dtypes widen exactly to float64)."""
        xp = self.xp
        if not isinstance(x, xp.ndarray):
            x = xp.asarray(x)
        if x.dtype not in (xp.float32, xp.float64):
            x = x.astype(xp.float64)
        return xp.ascontiguousarray(x).reshape(-1)

    def _rules(self, slot: _Slot, x: Any, r: np.ndarray) -> _Binned | None:
        """``TensorStats.update`` / ``update_relu``'s bookkeeping for one tensor of a part,
        from its range ``r`` = (finite lo, finite hi, NaN, +Inf, -Inf); None: nothing to bin."""
        lo, hi = float(r[0]), float(r[1])
        nan, pinf, ninf = int(r[2]), int(r[3]), int(r[4])
        finite = int(x.size) - nan - pinf - ninf
        slot.nan_count += nan
        slot.inf_count += pinf + ninf
        if finite == 0:  # update() returns None: no bins, and its Relus see nothing
            return None
        slot.widen(max(abs(lo), abs(hi)), self)
        slot.add_range(finite, lo, hi)
        for relu in slot.relus:  # max(x, 0): NaN stays NaN, +Inf stays, -Inf becomes 0
            relu.nan_count += nan
            relu.inf_count += pinf
            rlo, rhi = (0.0 if ninf else max(lo, 0.0)), max(hi, 0.0)
            relu.widen(rhi, self)
            relu.add_range(finite + ninf, rlo, rhi)
        return _Binned(x, slot, tuple(slot.relus))

    def _ranges(self, arrays: list[Any]) -> np.ndarray:
        """(finite lo, finite hi, NaN, +Inf, -Inf) per array, on the host (one sync)."""
        if not self.on_device:
            return np.array([_numpy_range(x) for x in arrays], dtype=np.float64)
        xp = self.xp
        groups = [(dtype, index, _tasks([arrays[i] for i in index])) for dtype, index in
                  _by_dtype(arrays)]  # fmt: skip
        out = self._range_buffer(sum(len(tasks) for _, _, tasks in groups))
        owner, done = [], 0
        for dtype, index, tasks in groups:
            ptrs = np.array([arrays[i].data.ptr for i in index], dtype=np.uint64)
            table = xp.asarray(np.concatenate([tasks.reshape(-1), ptrs.view(np.int64)]))
            kernel = self._kernels[f"qb_range<{_CTYPE[dtype]}>"]
            args = (table[: tasks.size], table[tasks.size :], out[done : done + len(tasks)])
            kernel((len(tasks),), (THREADS,), args)
            owner.append(index[tasks[:, 0]])
            done += len(tasks)
        blocks = out[:done].get()  # the part's one host sync
        return _reduce_blocks(blocks, np.concatenate(owner), len(arrays))

    def _range_buffer(self, n: int) -> Any:
        if self._range_out is None or len(self._range_out) < n:
            self._range_out = self.xp.empty((max(n, 256), 5), dtype=self.xp.float64)
        return self._range_out

    def _count(self, work: list[_Binned]) -> None:
        if not work:
            return
        if not self.on_device:
            for w in work:
                self.counts[w.slot.row] += binning.numpy_finite_counts(w.values, w.slot.exponent)
                if w.relus:
                    relu = np.maximum(w.values, 0)
                    for r in w.relus:
                        self.counts[r.row] += binning.numpy_finite_counts(relu, r.exponent)
            return
        xp = self.xp
        for dtype, index in _by_dtype([w.values for w in work]):
            group = [work[i] for i in index]
            ints, reals, ntasks = _count_tables(group)
            table = xp.asarray(np.concatenate([ints, reals.view(np.int64)]))
            kernel = self._kernels[f"qb_count<{_CTYPE[dtype]}>"]
            args = (table[: ints.size], table[ints.size :], np.int32(ntasks), np.int32(len(group)),
                    self.counts)  # fmt: skip
            kernel((ntasks,), (COUNT_THREADS,), args, shared_mem=HISTOGRAM_BYTES)


_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_KERNEL_CACHE: dict[int, dict[str, Any]] = {}


def _kernels(cp: ModuleType) -> dict[str, Any]:
    """The compiled kernels (once per process; CuPy caches the binary on disk)."""
    key = id(cp)
    if key not in _KERNEL_CACHE:
        module = cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=_KERNELS)
        kernels = {name: module.get_function(name) for name in _KERNELS}
        for name, kernel in kernels.items():
            if name.startswith("qb_count"):  # over the 48 KiB default: asked for explicitly
                kernel.max_dynamic_shared_size_bytes = HISTOGRAM_BYTES
        _KERNEL_CACHE[key] = kernels
    return _KERNEL_CACHE[key]


def _by_dtype(arrays: list[Any]) -> list[tuple[np.dtype, np.ndarray]]:
    """Indices of ``arrays`` grouped by dtype (float32 first)."""
    out = []
    for dtype in _CTYPE:
        index = np.array([i for i, a in enumerate(arrays) if a.dtype == dtype], dtype=np.int64)
        if index.size:
            out.append((dtype, index))
    return out


def _tasks(arrays: list[Any]) -> np.ndarray:
    """Blocks of at most :data:`CHUNK` values: [array, start, end] rows, array by array."""
    rows = []
    for i, a in enumerate(arrays):
        starts = np.arange(0, int(a.size), CHUNK, dtype=np.int64)
        ends = np.minimum(starts + CHUNK, int(a.size))
        rows.append(np.stack([np.full_like(starts, i), starts, ends], 1))
    return np.concatenate(rows)


def _reduce_blocks(blocks: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Per-array range from per-block ranges (min of mins, max of maxes, sums of counts)."""
    out = np.empty((n, 5), dtype=np.float64)
    out[:, 0], out[:, 1] = np.inf, -np.inf
    out[:, 2:] = 0
    np.minimum.at(out[:, 0], owner, blocks[:, 0])
    np.maximum.at(out[:, 1], owner, blocks[:, 1])
    for k in (2, 3, 4):
        np.add.at(out[:, k], owner, blocks[:, k])
    return out


def _count_tables(group: list[_Binned]) -> tuple[np.ndarray, np.ndarray, int]:
    """The count kernel's tables (see ``qb_count`` in ``_SOURCE``): per tensor, blocks of
    :data:`COUNT_CHUNK` values; its Relus on its own grid are derived from its bins in the
    tensor's own tasks, the others binned :data:`MAX_RELUS` at a time (further ones in tasks
    that do not count the tensor again)."""
    tasks, tptr, trow, tscale, rrow, rscale = [], [], [], [], [], []
    for t, w in enumerate(group):
        tptr.append(w.values.data.ptr)
        trow.append(w.slot.row)
        tscale.append(2.0**-w.slot.exponent)
        derived = [r for r in w.relus if r.exponent == w.slot.exponent]
        binned = [r for r in w.relus if r.exponent != w.slot.exponent]
        d0 = len(rrow)
        rrow.extend(r.row for r in derived)
        b0 = len(rrow)
        rrow.extend(r.row for r in binned)
        rscale.extend(2.0**-r.exponent for r in derived + binned)
        groups = [(b0 + g, min(b0 + g + MAX_RELUS, len(rrow)))
                  for g in range(0, len(binned), MAX_RELUS)] or [(b0, b0)]  # fmt: skip
        size = int(w.values.size)
        for g, (r0, r1) in enumerate(groups):
            own, d1 = (1, b0) if g == 0 else (0, d0)  # the tensor itself in the first group only
            for start in range(0, size, COUNT_CHUNK):
                tasks.append((t, start, min(start + COUNT_CHUNK, size), own, r0, r1, d0, d1))
    ints = np.concatenate(
        [
            np.array(tasks, dtype=np.int64).reshape(-1),
            np.array(tptr, dtype=np.uint64).view(np.int64),
            np.array(trow, dtype=np.int64),
            np.array(rrow, dtype=np.int64),
        ]
    )
    reals = np.array(tscale + rscale, dtype=np.float64)
    return ints, reals, len(tasks)


def _numpy_range(x: np.ndarray) -> tuple[float, float, int, int, int]:
    finite = np.isfinite(x)
    values = x[finite] if not finite.all() else x
    lo = float(values.min()) if values.size else math.inf
    hi = float(values.max()) if values.size else -math.inf
    nan = int(np.isnan(x).sum())
    pinf = int(np.count_nonzero(x == np.inf))
    return lo, hi, nan, pinf, int(x.size) - int(finite.sum()) - nan - pinf
