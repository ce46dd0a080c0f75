"""TensorStats: mergeable, bounded-memory statistics of one tensor; StatsFile: all of a model's.

The histogram is the heart of calibration, so its design decides what calibrators can do:

* Signed values are binned on a fixed grid of ``2 * HALF_BINS`` bins of width ``2**exponent``
  centred on 0 (bins ``[0, HALF_BINS)`` hold negatives, ``[HALF_BINS, 2*HALF_BINS)`` the
  non-negatives). Keeping both signs lets one histogram serve |x|-based calibrators (TensorRT) and
  signed ones (onnxruntime's entropy), so no method needs a second inference pass.
* When a larger value arrives the exponent grows and old bins are summed in groups of
  ``2**shift``. Because the grid is a power of two anchored at 0, re-binning is exact:
  ``floor(x / 2**e) >> d == floor(x / 2**(e + d))``. The final histogram is therefore identical
  whatever the batch size, sample order or sharding — merging two halves gives the whole, bit for
  bit.
* At the end ``max|x|`` spans at least ``HALF_BINS / 2`` fine bins, so a 2048-bin TensorRT
  histogram on ``[0, max|x|]`` is rebuilt with at least 4 fine bins per coarse bin (fine bins are
  split linearly at coarse edges).

Memory is ``2 * HALF_BINS`` counters per tensor, independent of sample count: int32 (128 KiB)
while the tensor's count of values fits one (no bin can hold more), int64 (256 KiB) from the
batch that would pass it on. A model of 800 tensors holds 100 MiB of histograms, not 200.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.fileio import atomic_path
from quantbench.jsonsafe import json_float as _json_float
from quantbench.memo import memo_scope
from quantbench.stats import binning
from quantbench.stats.binning import HALF_BINS

#: exponent of an empty or all-zero histogram: every later exponent re-bins it into bin 0.
MIN_EXPONENT = -160
#: most values a tensor's int32 counts may hold (a bin holds at most all of them)
INT32_COUNTS = int(np.iinfo(np.int32).max)
STATS_FORMAT = "quantbench-stats"
STATS_VERSION = 1
#: inside :func:`settled`: arrays derived from statistics that no longer change, by (tensor
#: id, what), each with its tensor (held, so that its id is not reused while the scope lasts)
_SETTLED: ContextVar[dict[tuple[int, tuple], tuple[TensorStats, object]] | None] = ContextVar(
    "quantbench_settled", default=None
)


@contextmanager
def settled() -> Iterator[None]:
    """A scope in which the statistics read do not change (the tables of a finished pass): a
    tensor's |x| histograms and CDF are computed once, not once per table (``--method all``'s
    seven tables and the clip check read the same ones). Derived arrays come back read-only; a
    scope inside another shares the outer one's arrays."""
    with memo_scope(_SETTLED):
        yield


def release_settled() -> None:
    """Drop the derived arrays a settled scope holds (they are built again when read): for a
    scope about to run something large with no histogram to read (``auto``'s judging passes
    hold none of them; captcha-crnn's 832 tensors held 632 MiB)."""
    memo = _SETTLED.get()
    if memo is not None:
        memo.clear()


def exponent_for(max_abs: float) -> int:
    """Smallest power-of-two bin width with ``max_abs < HALF_BINS * 2**e``."""
    if not max_abs > 0:
        return MIN_EXPONENT
    e = math.ceil(math.log2(max_abs / HALF_BINS))
    while max_abs >= HALF_BINS * 2.0**e:
        e += 1
    while e > MIN_EXPONENT and max_abs < HALF_BINS * 2.0 ** (e - 1):
        e -= 1
    return max(e, MIN_EXPONENT)


def counts_dtype(count: int) -> type[np.signedinteger]:
    """The counters' type for a histogram of ``count`` values: int32 while no bin can overflow
    it, else int64."""
    return np.int32 if count <= INT32_COUNTS else np.int64


def _coarsen(half: np.ndarray, shift: int) -> np.ndarray:
    """Sum one side's bins in groups of ``2**shift`` (exact: the grid is anchored at 0)."""
    if shift <= 0:
        return half
    if shift >= HALF_BINS.bit_length():
        out = np.zeros_like(half)
        out[0] = half.sum()
        return out
    group = 1 << shift
    summed = half.reshape(-1, group).sum(axis=1)
    out = np.zeros_like(half)
    out[: summed.size] = summed
    return out


@dataclass(frozen=True)
class BatchCounts:
    """What one batch added to a TensorStats: its bins (at ``exponent``) and range."""

    counts: np.ndarray
    exponent: int
    lo: float
    hi: float
    finite_only: bool


@dataclass
class TensorStats:
    """Range and histogram of one tensor over every value seen so far (mergeable)."""

    name: str
    count: int = 0
    min: float = math.inf
    max: float = -math.inf
    nan_count: int = 0
    inf_count: int = 0
    exponent: int = MIN_EXPONENT
    counts: np.ndarray = field(default_factory=lambda: np.zeros(2 * HALF_BINS, dtype=np.int32))

    @classmethod
    def ranges_only(cls, name: str) -> TensorStats:
        """Statistics that will hold the range and counts but no histogram (a pass for
        range-only calibrators, :meth:`add_range`): reading their bins is a one-line error
        naming the way to keep them, never an empty histogram taken for data."""
        return cls(name, counts=np.zeros(0, dtype=np.int32))

    @property
    def has_histogram(self) -> bool:
        return self.counts.size > 0

    # ---------------------------------------------------------------- collection
    def add_range(self, seen: binning.Scan) -> None:
        """Add a batch's range and NaN/Inf counts (:func:`binning.range_scan`), no bins."""
        self.nan_count += seen.nan
        self.inf_count += seen.inf
        if seen.finite:
            self._add_range(seen.finite, seen.lo, seen.hi)

    def update(self, values: binning.Values) -> BatchCounts | None:
        """Add a batch of values (any shape, any float dtype; or pieces, a list of arrays
        standing for their concatenation); returns what the batch added.

        One read of the values when they fit the current grid; otherwise the grid widens to
        the batch's range and the finite values are binned on it (NaN/Inf are counted only).
        """
        x = values if isinstance(values, list) else np.asarray(values)
        seen = binning.scan(x, self.exponent)
        if seen.finite + seen.nan + seen.inf == 0:
            return None
        counts = seen.counts
        if counts is None and seen.finite:
            counts = binning.finite_counts(x, self.regrid_exponent(seen))
        return self.add_scanned(seen, counts)

    def regrid_exponent(self, seen: binning.Scan) -> int:
        """The exponent a batch scanned at this tensor's grid is binned at when it did not fit."""
        return max(self.exponent, exponent_for(max(abs(seen.lo), abs(seen.hi))))

    def add_scanned(self, seen: binning.Scan, counts: np.ndarray | None) -> BatchCounts | None:
        """:meth:`update` with the reading done by the caller (possibly in parallel chunks,
        :func:`binning.merge_scans`): ``seen`` scanned at :attr:`exponent`, and ``counts`` its
        finite values binned at :meth:`regrid_exponent` when ``seen.counts`` is ``None``."""
        self.nan_count += seen.nan
        self.inf_count += seen.inf
        if seen.finite == 0 or counts is None:
            return None
        if seen.counts is None:
            self._grow(self.regrid_exponent(seen))
        self._hold(self.count + seen.finite)
        self.counts += counts
        self._add_range(seen.finite, seen.lo, seen.hi)
        return BatchCounts(counts, self.exponent, seen.lo, seen.hi, seen.nan + seen.inf == 0)

    def update_relu(self, source: BatchCounts | None, values: binning.Values) -> None:
        """Add ``max(values, 0)`` reusing the source batch's bins when the grids coincide.

        Exact: moving the negative bins into bin 0 is what binning ``max(x, 0)`` gives; when
        this tensor's grid is finer than the source's it bins ``max(x, 0)`` itself. ``values``
        may be pieces (a list of arrays) standing for their concatenation.
        """
        if source is None:
            return
        pieces = values if isinstance(values, list) else [values]
        if not source.finite_only:
            self.update(np.concatenate([np.maximum(p, 0).reshape(-1) for p in pieces]))
            return
        lo, hi = max(source.lo, 0.0), max(source.hi, 0.0)
        added = int(source.counts.sum())
        self._grow(exponent_for(hi))
        self._hold(self.count + added)
        if self.exponent == source.exponent:  # negatives become 0: positive bin 0
            self.counts[HALF_BINS:] += source.counts[HALF_BINS:]
            self.counts[HALF_BINS] += source.counts[:HALF_BINS].sum()
        else:
            relu = [np.maximum(p, 0) for p in pieces]
            self.counts += binning.finite_counts(relu, self.exponent)
        self._add_range(added, lo, hi)

    def _hold(self, count: int) -> None:
        """Widen the counters to int64 before they would hold more than ``count`` fits."""
        if counts_dtype(count) is np.int64 and self.counts.dtype != np.int64:
            self.counts = self.counts.astype(np.int64)

    def _add_range(self, n: int, lo: float, hi: float) -> None:
        self.count += n
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)

    def renamed(self, name: str) -> TensorStats:
        """The same statistics under another name (for value-preserving ops like Reshape)."""
        return TensorStats(
            name,
            self.count,
            self.min,
            self.max,
            self.nan_count,
            self.inf_count,
            self.exponent,
            self.counts.copy(),
        )

    def _grow(self, exponent: int) -> None:
        if exponent <= self.exponent:
            return
        shift = exponent - self.exponent
        neg, pos = self.negative_counts(), self.positive_counts()
        neg, pos = _coarsen(neg, shift), _coarsen(pos, shift)
        self.counts = np.concatenate([neg[::-1], pos]).astype(self.counts.dtype, copy=False)
        self.exponent = exponent

    def merge(self, other: TensorStats) -> TensorStats:
        """Return the statistics of both sample sets together (exact)."""
        out = TensorStats(self.name)
        out.exponent = max(self.exponent, other.exponent)
        out.count = self.count + other.count
        out.counts = np.add(
            self.counts_at(out.exponent), other.counts_at(out.exponent),
            dtype=counts_dtype(out.count),
        )  # fmt: skip
        out.min, out.max = min(self.min, other.min), max(self.max, other.max)
        out.nan_count = self.nan_count + other.nan_count
        out.inf_count = self.inf_count + other.inf_count
        return out

    def counts_at(self, exponent: int) -> np.ndarray:
        """These counts on the grid of ``exponent`` (not finer than this one's), exact."""
        copy = TensorStats(self.name, exponent=self.exponent, counts=self.counts.copy())
        copy._grow(exponent)
        return copy.counts

    def without(self, part: TensorStats) -> TensorStats | None:
        """The statistics of the values seen that are not in ``part`` (``--method auto``'s
        held-back slice), or None when ``part`` is not a subset of them.

        Bins and counts are exact (the grid is anchored at 0). The range is exact unless
        ``part`` holds an extreme; then it is bounded by the outer edge of the rest's outermost
        non-empty fine bin (within one fine bin, ``max|x| / 8192`` at most, of the true value).
        """
        if part.exponent > self.exponent or part.count > self.count:
            return None
        counts = self.counts - part.counts_at(self.exponent)
        nan, inf = self.nan_count - part.nan_count, self.inf_count - part.inf_count
        if counts.min(initial=0) < 0 or nan < 0 or inf < 0:
            return None
        rest = TensorStats(self.name, self.count - part.count, math.inf, -math.inf, nan, inf)
        rest.exponent, rest.counts = self.exponent, counts
        if rest.count == 0:
            return rest
        filled = np.flatnonzero(counts)
        w = self.bin_width
        low, high = int(filled[0]) - HALF_BINS, int(filled[-1]) - HALF_BINS
        # bin index i >= 0 holds [i*w, (i+1)*w); i < 0 holds [i*w, (i+1)*w) as well
        rest.min = self.min if part.min > self.min else max(self.min, low * w)
        rest.max = self.max if part.max < self.max else min(self.max, (high + 1) * w)
        return rest

    # ---------------------------------------------------------------- views
    @property
    def bin_width(self) -> float:
        return 2.0**self.exponent

    @property
    def max_abs(self) -> float:
        if self.count == 0:
            return 0.0
        return max(abs(self.min), abs(self.max))

    @property
    def has_nonfinite(self) -> bool:
        return self.nan_count > 0 or self.inf_count > 0

    def positive_counts(self) -> np.ndarray:
        """Fine bins of x >= 0: bin k holds [k*w, (k+1)*w)."""
        return self._bins()[HALF_BINS:]

    def negative_counts(self) -> np.ndarray:
        """Fine bins of x < 0 by |x|: bin k holds |x| in (k*w, (k+1)*w]."""
        return self._bins()[:HALF_BINS][::-1]

    def _bins(self) -> np.ndarray:
        if not self.has_histogram:
            raise QuantbenchError(
                f"{self.name}: these statistics hold a range only, no histogram (a pass for "
                f"range-only methods such as minmax): collect them with keep_histograms=True"
            )
        return self.counts

    def abs_fine_counts(self) -> np.ndarray:
        """Fine |x| histogram: ``HALF_BINS`` bins of width :attr:`bin_width` from 0."""
        return self._derived(("fine",), lambda: self.positive_counts() + self.negative_counts())

    def _derived(self, what: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """``compute()``, or inside :func:`settled` its one read-only result for this tensor."""
        memo = _SETTLED.get()
        if memo is None:
            return compute()
        key = (id(self), what)
        if key not in memo:
            value = compute()
            value.flags.writeable = False
            memo[key] = (self, value)
        return memo[key][1]  # type: ignore[return-value]

    def abs_fine_centres(self) -> np.ndarray:
        """Rows (counts, centre |x|) of the non-empty fine |x| bins, each centre clamped to
        max|x|: every value at its fine bin's centre, as expected-error estimates take them."""

        def centres() -> np.ndarray:
            counts = self.abs_fine_counts().astype(np.float64)
            used = np.flatnonzero(counts)
            centre = np.minimum((used + 0.5) * self.bin_width, self.max_abs)
            return np.stack([counts[used], centre])

        return self._derived(("centres",), centres)

    def abs_histogram(self, num_bins: int = 2048, upper: float | None = None) -> np.ndarray:
        """|x| histogram with ``num_bins`` equal bins on ``[0, upper]`` (default ``max|x|``).

        This is the histogram TensorRT's EntropyCalibrator2 works on. Counts above ``upper`` are
        dropped; callers that need them fold :meth:`count_above` into the last bin themselves.
        """
        upper = self.max_abs if upper is None else upper

        def resampled() -> np.ndarray:
            fine = self.abs_fine_counts().astype(np.float64)
            return _resample(fine, self.bin_width, 0.0, upper, num_bins, 0.0, (0.0, self.max_abs))

        return self._derived(("abs", num_bins, upper), resampled).copy()  # the caller's own

    def signed_histogram(self, num_bins: int, lower: float, upper: float) -> np.ndarray:
        """Signed histogram with ``num_bins`` equal bins on ``[lower, upper]``."""
        fine = self._bins().astype(np.float64)
        origin = -HALF_BINS * self.bin_width
        data_range = (self.min, self.max) if self.count else (0.0, 0.0)
        return _resample(fine, self.bin_width, origin, upper, num_bins, lower, data_range)

    def abs_cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """(fine bin edges, cumulative |x| counts at them): what :meth:`count_above` and
        :meth:`abs_quantile` read (inside :func:`settled`, built once for every threshold)."""

        def edges_and_cdf() -> np.ndarray:
            fine = self.abs_fine_counts()
            edges = np.minimum(np.arange(fine.size + 1) * self.bin_width, self.max_abs)
            return np.stack([edges, np.concatenate([[0.0], np.cumsum(fine, dtype=np.float64)])])

        edges, cdf = self._derived(("cdf",), edges_and_cdf)
        return edges, cdf

    def count_above(self, threshold: float) -> float:
        """How many |x| exceed ``threshold`` (fine bins split linearly)."""
        edges, cumulative = self.abs_cdf()
        return float(cumulative[-1] - np.interp(threshold, edges, cumulative))

    def abs_quantile(self, q: float) -> float:
        """Value below which a fraction ``q`` of |x| lies (linear within a fine bin)."""
        edges, cdf = self.abs_cdf()
        if cdf[-1] == 0:
            return 0.0
        return float(np.interp(q * cdf[-1], cdf, edges))

    def summary(self) -> dict[str, float | int]:
        return {
            "count": self.count,
            "min": self.min if self.count else 0.0,
            "max": self.max if self.count else 0.0,
            "max_abs": self.max_abs,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
        }


def _resample(
    fine: np.ndarray,
    width: float,
    origin: float,
    upper: float,
    num_bins: int,
    lower: float,
    data_range: tuple[float, float],
) -> np.ndarray:
    """Re-bin fine counts (bins of ``width`` starting at ``origin``) onto ``num_bins`` bins.

    Fine edges are clipped to the observed ``data_range`` so the bins holding the extremes are
    spread over the part of them that holds data: a value equal to the max lands in the last
    bin, as in ``np.histogram``.
    """
    if num_bins <= 0:
        raise ValueError("num_bins must be positive")
    if not upper > lower:
        out = np.zeros(num_bins)
        out[0] = fine.sum()
        return out
    cdf = np.concatenate([[0.0], np.cumsum(fine)])
    fine_edges = np.clip(origin + np.arange(fine.size + 1) * width, *data_range)
    coarse_edges = np.linspace(lower, upper, num_bins + 1)
    return np.diff(np.interp(coarse_edges, fine_edges, cdf))


# --------------------------------------------------------------------------- StatsFile


@dataclass
class StatsFile:
    """Statistics of every calibrated tensor of one model over one data set.

    Saved as ``.npz``: one JSON metadata record plus the sparse histogram of each tensor.
    ``model_hash`` ties the file to its model; ``data_fingerprint`` to its data (a merge of
    shards records the sorted shard fingerprints).
    """

    model_hash: str
    data_fingerprint: str
    num_samples: int = 0
    tensors: dict[str, TensorStats] = field(default_factory=dict)
    tool_version: str = ""
    model_path: str = ""
    #: what the pass found wrong with the data itself (samples holding NaN/Inf), kept so that
    #: reusing the statistics (a cache hit, ``--stats``) says it again
    data_note: str = ""
    #: the statistics of the pass's first ``head.num_samples`` samples, when the pass was asked
    #: to keep them apart (``--method auto``'s held-back slice: no second pass over it); never
    #: saved, never compared
    head: StatsFile | None = field(default=None, repr=False, compare=False)
    #: whether the pass ran two samples as one batch and got their outputs run apart (None:
    #: it did not try; ``auto`` then tries its slice's batch itself); never saved, never
    #: compared
    batches_agree: bool | None = field(default=None, repr=False, compare=False)

    def __iter__(self) -> Iterator[TensorStats]:
        return iter(self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, name: str) -> TensorStats:
        return self.tensors[name]

    def nonfinite_tensors(self) -> list[str]:
        return [t.name for t in self if t.has_nonfinite]

    # ---------------------------------------------------------------- persistence
    @property
    def has_histograms(self) -> bool:
        """False for a range-only pass's statistics (:meth:`TensorStats.ranges_only`), which
        serve range-only calibrators and are never saved (a cache must serve every method)."""
        return all(t.has_histogram for t in self)

    def save(self, path: str | Path) -> Path:
        if not self.has_histograms:
            raise QuantbenchError(
                f"{path}: these statistics hold ranges only, no histograms (a pass for range-only "
                "methods such as minmax), and a statistics file must serve every method: collect "
                "them with keep_histograms=True or save_stats=PATH"
            )
        meta = {
            "format": STATS_FORMAT,
            "version": STATS_VERSION,
            "half_bins": HALF_BINS,
            "model_hash": self.model_hash,
            "data_fingerprint": self.data_fingerprint,
            "num_samples": self.num_samples,
            "tool_version": self.tool_version,
            "model_path": self.model_path,
            "data_note": self.data_note,
            "tensors": [],
        }
        arrays: dict[str, np.ndarray] = {}
        for i, t in enumerate(self):
            nz = np.flatnonzero(t.counts)
            arrays[f"idx{i}"] = nz.astype(np.int32)
            arrays[f"cnt{i}"] = t.counts[nz].astype(np.int64)  # the file's type either way
            meta["tensors"].append(
                {
                    "name": t.name,
                    "count": t.count,
                    "min": _json_float(t.min),
                    "max": _json_float(t.max),
                    "nan_count": t.nan_count,
                    "inf_count": t.inf_count,
                    "exponent": t.exponent,
                }
            )
        arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        with atomic_path(path) as tmp:
            tmp.write_bytes(buf.getvalue())
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> StatsFile:
        path = Path(path)
        if not path.is_file():
            raise QuantbenchError(f"{path}: statistics file not found")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                if meta.get("format") != STATS_FORMAT:
                    raise ValueError("not a quantbench statistics file")
                if meta.get("half_bins") != HALF_BINS:
                    raise ValueError(
                        f"made with {meta.get('half_bins')} bins, expected {HALF_BINS}"
                    )
                tensors: dict[str, TensorStats] = {}
                for i, t in enumerate(meta["tensors"]):
                    counts = np.zeros(2 * HALF_BINS, dtype=counts_dtype(int(t["count"])))
                    counts[z[f"idx{i}"]] = z[f"cnt{i}"]
                    tensors[t["name"]] = TensorStats(
                        name=t["name"],
                        count=int(t["count"]),
                        min=float(t["min"]),
                        max=float(t["max"]),
                        nan_count=int(t["nan_count"]),
                        inf_count=int(t["inf_count"]),
                        exponent=int(t["exponent"]),
                        counts=counts,
                    )
        except QuantbenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad file
            raise QuantbenchError(
                f"{path}: not a readable quantbench statistics file ({exc}); re-run calibrate"
            ) from None
        return cls(
            model_hash=meta["model_hash"],
            data_fingerprint=meta["data_fingerprint"],
            num_samples=int(meta["num_samples"]),
            tensors=tensors,
            tool_version=meta.get("tool_version", ""),
            model_path=meta.get("model_path", ""),
            data_note=meta.get("data_note", ""),
        )

    # ---------------------------------------------------------------- merging
    @classmethod
    def merge(cls, parts: Iterable[StatsFile]) -> StatsFile:
        """Merge shards of one data set (same model); exact, order-independent."""
        parts = list(parts)
        if not parts:
            raise QuantbenchError("nothing to merge: give at least one statistics file")
        hashes = {p.model_hash for p in parts}
        if len(hashes) > 1:
            raise QuantbenchError(
                "cannot merge statistics of different models (model hashes "
                + ", ".join(sorted(h[:12] for h in hashes))
                + ")"
            )
        names = list(parts[0].tensors)
        for p in parts[1:]:
            if set(p.tensors) != set(names):
                missing = sorted(set(names) ^ set(p.tensors))[:5]
                raise QuantbenchError(
                    "cannot merge statistics that cover different tensors (e.g. "
                    + ", ".join(missing)
                    + "); calibrate every shard with the same --tensors"
                )
        merged = {}
        for name in names:
            acc = parts[0].tensors[name]
            for p in parts[1:]:
                acc = acc.merge(p.tensors[name])
            merged[name] = acc
        fingerprint = hashlib.sha256(
            "+".join(sorted(p.data_fingerprint for p in parts)).encode()
        ).hexdigest()
        return cls(
            model_hash=parts[0].model_hash,
            data_fingerprint=fingerprint if len(parts) > 1 else parts[0].data_fingerprint,
            num_samples=sum(p.num_samples for p in parts),
            tensors=merged,
            tool_version=parts[0].tool_version,
            model_path=parts[0].model_path,
            data_note="; ".join(dict.fromkeys(p.data_note for p in parts if p.data_note)),
        )

    def without(self, part: StatsFile) -> StatsFile | None:
        """The statistics of this data set's samples that are not in ``part`` (a subset of
        them, e.g. ``--method auto``'s held-back slice; see :meth:`TensorStats.without`), or
        None when ``part`` is not a subset of the same tensors."""
        if part.model_hash != self.model_hash or set(part.tensors) != set(self.tensors):
            return None
        rest = {}
        for name, full in self.tensors.items():
            found = full.without(part.tensors[name])
            if found is None:
                return None
            rest[name] = found
        return StatsFile(
            model_hash=self.model_hash,
            data_fingerprint=f"{self.data_fingerprint}-without-{part.data_fingerprint}",
            num_samples=self.num_samples - part.num_samples,
            tensors=rest,
            tool_version=self.tool_version,
            model_path=self.model_path,
        )


def stats_from_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, TensorStats]:
    """Convenience for tests and the Python API: statistics of in-memory arrays."""
    out = {}
    for name, a in arrays.items():
        t = TensorStats(name)
        t.update(a)
        out[name] = t
    return out
