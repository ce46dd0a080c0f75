"""Entropy (KL-divergence) calibration in three flavours that real tools disagree on.

``entropy`` / ``entropy:trt`` (default) is *quantbench's variant* of TensorRT's
``IInt8EntropyCalibrator2`` (the slide algorithm with the zero spike left out: see (*) below;
unconfirmed against a real TensorRT cache of a ReLU network) (reference
§1.2, §1.3, §1.7); ``entropy:pytorch`` and ``entropy:ort`` reproduce pytorch-quantization and
onnxruntime, so a user can see *why* the same data gives three different scales (§1.6):

=============  =======================  =========================  ============================
aspect         trt (EntropyCalibr.2)    pytorch (HistogramCalib.)  ort (quantize_static)
=============  =======================  =========================  ============================
histogram      |x|, 2048 bins [0, max]  same                       signed, 128 bins [-t, t]
zero bin       zero spike removed (*)   ``bins[0] = bins[1]``      kept
candidates     i = 128 .. 2048          same                       windows of 2i+1 bins, i >= 64
levels         floor(i/128) bins each   ``np.digitize`` edges      floor groups, remainder's
                                                                   bins never get Q
Q expansion    over non-empty bins      same                       count / non-zero P bins,
                                                                   into every bin, int64
smoothing      none                     none                       eps = 1e-4 (float32)
tie-break      first argmin             last argmin                first argmin
amax           (i + 0.5) * max / 2048   i * max / 2048             window edge, clipped to
                                                                   (min, max)
=============  =======================  =========================  ============================

(*) quantbench's own choice, not known to be TensorRT's: TensorRT's code is not public, and no
real TensorRT cache of a ReLU network has confirmed it yet. ``entropy:slides`` keeps the spike:
the slide pseudocode literally, which collapses on ReLU outputs (see :func:`trt_amax`).

TensorRT level formation (our choice, TensorRT's own code is not public). For a candidate ``i``
that is not a multiple of 128 we merge ``g = floor(i / 128)`` consecutive bins per level and let
the last level also take the ``i mod 128`` remaining bins, in the merge *and* in the expansion,
so P and Q cover the same bins. Reasons: it is the integer-group rule the reference recollects
from the GTC 2017 slides (§1.2), it is what MXNet's slide-derived ``_get_optimal_threshold`` and
its many copies do, and the facts that can be checked against real caches (§1.3: i = 2048, a
multiple of 128) are the same under either rule. pytorch-quantization's fractional
``np.digitize`` edges stay available as ``entropy:pytorch`` (with its quirks: see
:func:`pytorch_amax`).

All candidates are evaluated at once from prefix sums (O(bins + candidates * 128), ~2 ms per
tensor); candidates within float noise of the minimum are re-evaluated with the plain
``sum p log(p/q)`` so the tie-break does not depend on summation order.

``entropy:ort`` runs onnxruntime's integer/float32 arithmetic candidate by candidate (it rounds
``q`` down to integers and smooths in float32, so it cannot share the prefix-sum kernel). With
``quantize_static``'s defaults (128 bins, 128 levels) there is one candidate only, the full range,
so ORT "entropy" is max calibration; ``entropy:ort-2048`` shows what 2048 bins would give.
ORT's histogram depends on how the data was split into ``collect`` calls; ours is the one ORT
builds when it sees all values in one call. Our histogram is interpolated from the fine grid
(:mod:`quantbench.stats.tensorstats`), so counts are rounded to integers before ORT's arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np

from quantbench.calibrators import register, register_many, table_arrays
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats

HIST_BINS = 2048
QUANT_LEVELS = 128
START_BIN = 128
ORT_DEFAULT_BINS = 128
ORT_SMOOTH_EPS = 1e-4
#: candidates whose fast KL lies this close to the minimum are re-evaluated the plain way (the
#: prefix-sum KL differs from it by < 1e-13 on 1e6-sample tensors).
TIE_RTOL = 1e-10
TIE_ATOL = 1e-12
#: candidates whose levels :func:`kl_divergences` evaluates at once: a block's temporaries
#: (120 x 129 float64, 121 KiB) stay in cache and under glibc's 128 KiB mmap threshold, where
#: the whole matrix's (2 MB each) were mapped and zeroed afresh by the kernel for every
#: operation: entropy:pytorch on ResNet-50's 123 live tensors took 1.3 s that way, 0.45 s now
KL_BLOCK = 120
#: histograms whose candidates one GPU evaluation covers (entropy:pytorch's gathered levels of
#: 128 histograms: 250 MB of float64)
DEVICE_HISTOGRAMS = 128

VARIANTS = ("trt", "slides", "pytorch", "ort", "ort-2048")


# --------------------------------------------------------------------------- level edges


@lru_cache(maxsize=8)
def floor_group_edges(num_bins: int, levels: int, start: int) -> np.ndarray:
    """Level edges per candidate, shape ``(candidates, levels + 1)``: groups of ``i // levels``
    bins, the last level running to ``i`` (the TensorRT choice, see module docstring)."""
    kept = np.arange(start, num_bins + 1)
    edges = np.arange(levels + 1)[None, :] * (kept // levels)[:, None]
    edges[:, -1] = kept
    edges.flags.writeable = False
    return edges


@lru_cache(maxsize=8)
def digitize_group_edges(num_bins: int, levels: int, start: int) -> np.ndarray:
    """Level edges of ``np.digitize(range(i), np.linspace(0, i, levels + 1)) - 1``.

    Bin ``k`` falls in level ``floor(levels * k / i)`` (the linspace edges ``j * i / levels`` are
    exact in float64), so level ``j`` starts at bin ``ceil(j * i / levels)``.
    """
    kept = np.arange(start, num_bins + 1)
    edges = -((-np.arange(levels + 1)[None, :] * kept[:, None]) // levels)
    edges.flags.writeable = False
    return edges


# --------------------------------------------------------------------------- KL kernels


def _xlogx(v: np.ndarray, xp: ModuleType = np) -> np.ndarray:
    out = xp.zeros_like(v, dtype=xp.float64)
    pos = v > 0
    out[pos] = v[pos] * xp.log(v[pos])
    return out


@dataclass(frozen=True)
class LevelRanges:
    """The distinct bin ranges ``[start, end)`` that the levels of all candidates cover, and
    which range each level is: a level's terms are computed once per range, not once per
    candidate (the digitize edges of 2048 bins: 18,748 ranges for 245,888 levels)."""

    start: np.ndarray
    end: np.ndarray
    which: np.ndarray  # (candidates, levels): index into start/end

    @classmethod
    def of(cls, level_edges: np.ndarray) -> LevelRanges:
        width = int(level_edges.max()) + 1
        key = level_edges[:, :-1].astype(np.int64) * width + level_edges[:, 1:]
        distinct, which = np.unique(key, return_inverse=True)
        return cls(distinct // width, distinct % width, which.reshape(key.shape))


@lru_cache(maxsize=8)
def digitize_group_ranges(num_bins: int, levels: int, start: int) -> LevelRanges:
    """:class:`LevelRanges` of :func:`digitize_group_edges`, built once."""
    return LevelRanges.of(digitize_group_edges(num_bins, levels, start))


def kl_divergences(
    bins: np.ndarray,
    level_edges: np.ndarray,
    ranges: LevelRanges | None = None,
    xp: ModuleType = np,
) -> np.ndarray:
    """KL(P || Q) of every candidate at once (natural log), ``inf`` where Q = 0 < P.

    Candidate row ``r`` keeps ``i = level_edges[r, -1]`` bins: P = ``bins[:i]`` with the outliers
    ``sum(bins[i:])`` added to ``P[i-1]``; Q spreads each level's count evenly over its
    non-empty bins. With T = sum P and Tq = sum Q = sum ``bins[:i]``::

        KL = (sum P log P - sum P log Q) / T + log(Tq / T)

    ``sum P log P`` is a prefix sum plus the folded last bin; ``sum P log Q`` is
    ``sum_levels L log(L / n)`` plus ``outliers * log Q[i-1]`` (L: level count, n: its non-empty
    bins), so no per-bin work is done per candidate. ``ranges`` (of these ``level_edges``): each
    level's ``L log(L / n)`` is computed once per distinct range and gathered per candidate,
    the same numbers summed in the same order, so the same bits.

    ``bins`` may hold one histogram per row, as ``xp`` arrays (CuPy: all on the GPU at once);
    the result then has one row of candidates per histogram.
    """
    level_edges = xp.asarray(level_edges)
    pre = _Prefix.of(bins, level_edges[:, -1], xp)
    candidates = (*pre.cum.shape[:-1], len(level_edges))
    p_log_q = xp.empty(candidates)
    last_q = xp.empty(candidates)
    block = KL_BLOCK if xp is np else len(level_edges)  # a GPU takes every row at once
    if ranges is not None:
        cum, nonempty = pre.cum, pre.nonempty_cum
        start, end, which = (xp.asarray(a) for a in (ranges.start, ranges.end, ranges.which))
        q, terms = _level_q_terms(
            cum[..., end] - cum[..., start], nonempty[..., end] - nonempty[..., start], xp
        )
        last_q = q[..., which[:, -1]]
    for first in range(0, len(level_edges), block):  # rows are independent: same bits
        rows = slice(first, first + block)
        if ranges is not None:
            p_log_q[..., rows] = terms[..., which[rows]].sum(axis=-1)
            continue
        edges = level_edges[rows]
        level_q, p_log_q[..., rows] = _level_terms(
            xp.diff(pre.cum[..., edges], axis=-1),
            xp.diff(pre.nonempty_cum[..., edges], axis=-1),
            xp,
        )
        last_q[..., rows] = level_q[..., -1]
    return pre.kl(p_log_q, last_q, xp)


@dataclass(frozen=True)
class _Prefix:
    """The per-bin prefix sums every candidate's KL reads (candidate ``r`` keeps ``kept[r]``
    bins)."""

    kept: np.ndarray
    cum: np.ndarray
    nonempty_cum: np.ndarray
    xlogx_cum: np.ndarray
    outliers: np.ndarray
    total: float | np.ndarray  # (n, 1) for n histograms
    last: np.ndarray

    @classmethod
    def of(cls, bins: np.ndarray, kept: np.ndarray, xp: ModuleType = np) -> _Prefix:
        """Prefix sums of ``bins``: one histogram (``(bins,)``) or one per row (``(n, bins)``)."""
        bins = xp.asarray(bins, dtype=xp.float64)
        lead = [(0, 0)] * (bins.ndim - 1)
        return cls(
            kept,
            xp.pad(xp.cumsum(bins, axis=-1), [*lead, (1, 0)]),
            xp.pad(xp.cumsum(bins > 0, axis=-1, dtype=xp.int64), [*lead, (1, 0)]),
            xp.pad(xp.cumsum(_xlogx(bins, xp), axis=-1), [*lead, (1, 0)]),
            # suffix sums, so an empty tail is exactly 0 rather than total - prefix
            xp.pad(xp.cumsum(bins[..., ::-1], axis=-1)[..., ::-1], [*lead, (0, 1)])[..., kept],
            bins.sum(axis=-1, keepdims=True) if bins.ndim > 1 else bins.sum(),
            bins[..., kept - 1],
        )

    def kl(self, p_log_q: np.ndarray, last_q: np.ndarray, xp: ModuleType = np) -> np.ndarray:
        """KL per candidate from ``sum_levels L log(L / n)`` and the last level's Q."""
        kept, outliers, last = self.kept, self.outliers, self.last
        with np.errstate(divide="ignore", invalid="ignore"):
            p_log_q = p_log_q + xp.where(outliers > 0, outliers * xp.log(last_q), 0.0)
            p_log_p = self.xlogx_cum[..., kept - 1] + _xlogx(last + outliers, xp)
            kl = (p_log_p - p_log_q) / self.total + xp.log(self.cum[..., kept] / self.total)
        kl[(outliers > 0) & (last <= 0)] = xp.inf
        return kl


def _level_terms(
    count: np.ndarray, nonempty: np.ndarray, xp: ModuleType = np
) -> tuple[np.ndarray, np.ndarray]:
    """Each level's Q (its count over its non-empty bins) and, per row, ``sum L log Q``."""
    q, terms = _level_q_terms(count, nonempty, xp)
    return q, terms.sum(axis=-1)


def _level_q_terms(
    count: np.ndarray, nonempty: np.ndarray, xp: ModuleType = np
) -> tuple[np.ndarray, np.ndarray]:
    """Each level's Q and its ``L log Q`` (0 for an empty level)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = xp.where(count > 0, count / nonempty, 0.0)
        return q, xp.where(count > 0, count * xp.log(q), 0.0)


def kl_divergence_direct(bins: np.ndarray, edges: np.ndarray) -> float:
    """KL(P || Q) of one candidate the plain way (``scipy.stats.entropy`` arithmetic)."""
    kept = int(edges[-1])
    p = np.array(bins[:kept], dtype=np.float64)
    p[-1] += bins[kept:].sum()
    source = np.asarray(bins[:kept], dtype=np.float64)
    sizes = np.diff(edges)
    level_count = np.add.reduceat(source, edges[:-1])
    level_nonempty = np.add.reduceat((source > 0).astype(np.int64), edges[:-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        per_level = np.where(level_nonempty > 0, level_count / level_nonempty, 0.0)
    q = np.where(source > 0, np.repeat(per_level, sizes), 0.0)
    if q.sum() <= 0:
        return float("inf")
    from scipy.special import rel_entr  # here: importing SciPy costs 0.3-1 s (warm_up)

    return float(np.sum(rel_entr(p / p.sum(), q / q.sum())))


def kl_divergences_floor_groups(
    bins: np.ndarray, level_edges: np.ndarray, xp: ModuleType = np
) -> np.ndarray:
    """:func:`kl_divergences` for :func:`floor_group_edges`, sharing the levels candidates have
    in common (to within summation order, which :func:`best_candidate`'s tie check absorbs).

    Candidates ``i`` with the same group size ``g = i // levels`` have the same first
    ``levels - 1`` levels (``j * g``); only the last level, running to ``i``, differs. So
    ``sum L log(L / n)`` over those is computed once per group size (16 of them for 2048 bins)
    and the per-candidate work is the last level alone: about 4 thousand logarithms instead of
    250 thousand. ``bins`` may hold one histogram per row, as in :func:`kl_divergences`.
    """
    sizes, which = np.unique(level_edges[:, 1], return_inverse=True)  # group size: j * g at j=1
    shared_edges = np.arange(level_edges.shape[1] - 1)[None, :] * sizes[:, None]
    kept, start, which, shared_edges = (
        xp.asarray(a) for a in (level_edges[:, -1], level_edges[:, -2], which, shared_edges)
    )
    pre = _Prefix.of(bins, kept, xp)
    _, shared = _level_terms(  # levels 0 .. levels-2 of each group size
        xp.diff(pre.cum[..., shared_edges], axis=-1),
        xp.diff(pre.nonempty_cum[..., shared_edges], axis=-1),
        xp,
    )
    last_q, last = _level_terms(
        (pre.cum[..., kept] - pre.cum[..., start])[..., None],
        (pre.nonempty_cum[..., kept] - pre.nonempty_cum[..., start])[..., None],
        xp,
    )
    return pre.kl(shared[..., which] + last, last_q[..., 0], xp)


def best_candidate(
    bins: np.ndarray, level_edges: np.ndarray, last: bool = False, kl: np.ndarray | None = None
) -> int:
    """Row of ``level_edges`` with the smallest KL (first or last on ties); ``kl``: the fast
    divergences when the caller computed them another way."""
    kl = kl_divergences(bins, level_edges) if kl is None else kl
    best = float(np.min(kl))
    if not np.isfinite(best):
        return len(kl) - 1 if last else 0
    near = np.flatnonzero(kl <= best + TIE_ATOL + TIE_RTOL * abs(best))
    if near.size > 1:
        exact = np.array([kl_divergence_direct(bins, level_edges[r]) for r in near])
        ties = near[exact == exact.min()]
        return int(ties[-1] if last else ties[0])
    return int(near[0])


# --------------------------------------------------------------------------- variants


def zero_spike(stats: TensorStats) -> float:
    """Values in the finest bin at 0: for ReLU-like tensors, the exact zeros."""
    return float(stats.positive_counts()[0] + stats.negative_counts()[0])


def trt_amax(stats: TensorStats) -> float:
    """quantbench's variant of TensorRT EntropyCalibration2: the zero spike left out of the KL
    search (the slide algorithm otherwise; not yet confirmed by a TensorRT cache of a ReLU net).

    Exact zeros are exact at every scale, so they say nothing about the threshold. The literal
    slide algorithm (``entropy:slides``) lets a ReLU output's zero spike dominate P: merging
    bin 0 with its neighbours then costs so much KL that the search collapses to i < 256
    (e.g. amax 0.96 for a ReLU output with max 7.7, and accuracy 92% -> 37% on the bundled
    example), which is not what TensorRT's caches for ReLU networks show. Everything else is
    the slide algorithm: same bins, candidates, levels and ``(i + 0.5)`` threshold.
    """
    return slide_amaxes([stats], without_zero_spike=True)[0]


def slides_amax(stats: TensorStats) -> float:
    """The GTC-2017 slide pseudocode literally: ``(i + 0.5) * max|x| / 2048``, first best ``i``."""
    return slide_amaxes([stats], without_zero_spike=False)[0]


def slide_amaxes(stats: list[TensorStats], without_zero_spike: bool) -> list[float]:
    """:func:`trt_amax` (``without_zero_spike``) or :func:`slides_amax` of every tensor, the
    candidates' KL of all of them at once on :func:`table_arrays`' device when there is one."""
    edges = floor_group_edges(HIST_BINS, QUANT_LEVELS, START_BIN)
    histograms = [_slide_bins(t, without_zero_spike) for t in stats]
    searched = [i for i, bins in enumerate(histograms) if bins.any()]
    kls = candidate_kls(kl_divergences_floor_groups, [histograms[i] for i in searched], edges)
    amax = [t.max_abs for t in stats]  # an all-zero histogram keeps the whole range
    for i, kl in zip(searched, kls, strict=True):
        kept = int(edges[best_candidate(histograms[i], edges, kl=kl), -1])
        amax[i] = (kept + 0.5) * stats[i].max_abs / HIST_BINS
    return amax


def _slide_bins(stats: TensorStats, without_zero_spike: bool) -> np.ndarray:
    """The 2048-bin |x| histogram the slide search reads, its zero spike taken out or not."""
    bins = stats.abs_histogram(HIST_BINS)  # a fresh array: changing bin 0 harms no caller
    if without_zero_spike:
        bins[0] = max(bins[0] - zero_spike(stats), 0.0)
    return bins


def candidate_kls(
    kernel: Callable[..., np.ndarray], histograms: list[np.ndarray], *args: object
) -> list[np.ndarray]:
    """``kernel(bins, *args)``: every candidate's KL of each histogram. On the host, one
    histogram at a time (the bits the tests pin); on a :func:`table_arrays` device, up to
    :data:`DEVICE_HISTOGRAMS` at once, with only the KL rows coming back. The two differ in
    the last bits only, which :func:`best_candidate`'s near-tie check on the host absorbs, so
    the amaxes are the same."""
    xp = table_arrays()
    if xp is None:
        return [kernel(bins, *args) for bins in histograms]
    out: list[np.ndarray] = []
    for first in range(0, len(histograms), DEVICE_HISTOGRAMS):
        part = xp.asarray(np.stack(histograms[first : first + DEVICE_HISTOGRAMS]))
        out.extend(xp.asnumpy(kernel(part, *args, xp=xp)))
    return out


def pytorch_amax(stats: TensorStats) -> float:
    """pytorch-quantization ``_compute_amax_entropy``: returns bin edge ``i`` of the last best.

    Quirk kept on purpose: where ``bins[:i]`` is all zero, ``scipy.stats.entropy`` returns NaN
    (Q normalises 0/0) and the reversed ``np.argmin`` picks the *largest* such ``i``, i.e. the
    left edge of the first non-empty bin (for data far from 0, amax is about min|x|).
    """
    return pytorch_amaxes([stats])[0]


def _pytorch_bins(stats: TensorStats) -> np.ndarray:
    bins = stats.abs_histogram(HIST_BINS)  # a fresh array: overwriting bin 0 harms no caller
    bins[0] = bins[1]
    return bins


def pytorch_amaxes(stats: list[TensorStats]) -> list[float]:
    """:func:`pytorch_amax` of every tensor, their KL at once as in :func:`slide_amaxes`."""
    edges = digitize_group_edges(HIST_BINS, QUANT_LEVELS, START_BIN)
    kept_all = edges[:, -1]
    histograms = [_pytorch_bins(t) for t in stats]
    amax = [0.0] * len(stats)
    searched = []
    for i, bins in enumerate(histograms):
        empty_rows = np.flatnonzero(np.cumsum(bins)[kept_all - 1] == 0)  # the NaN quirk
        if empty_rows.size:
            amax[i] = int(kept_all[empty_rows[-1]]) * stats[i].max_abs / HIST_BINS
        else:
            searched.append(i)
    ranges = digitize_group_ranges(HIST_BINS, QUANT_LEVELS, START_BIN)
    kls = candidate_kls(kl_divergences, [histograms[i] for i in searched], edges, ranges)
    for i, kl in zip(searched, kls, strict=True):
        kept = int(kept_all[best_candidate(histograms[i], edges, last=True, kl=kl)])
        amax[i] = kept * stats[i].max_abs / HIST_BINS
    return amax


def _ort_smooth(dist: np.ndarray) -> np.ndarray | None:
    """onnxruntime ``smooth_distribution``: zeros get eps, non-zeros pay for it (float32)."""
    is_zero = (dist == 0).astype(np.float32)
    is_nonzero = (dist != 0).astype(np.float32)
    n_zero = is_zero.sum()
    n_nonzero = dist.size - n_zero
    if not n_nonzero:
        return None
    eps_nonzero = ORT_SMOOTH_EPS * float(n_zero) / float(n_nonzero)
    out = dist.astype(np.float32)
    out += ORT_SMOOTH_EPS * is_zero + (-eps_nonzero) * is_nonzero
    return out


def _ort_kl(p: np.ndarray, q: np.ndarray) -> np.float32:
    """onnxruntime's own float32 ``entropy(p, q)``."""
    p = p / np.sum(p)
    q = q / np.sum(q)
    return np.sum(rel_entr32(p, q)).astype(np.float32)


def rel_entr32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``scipy.special.rel_entr`` of float32 arrays without importing SciPy (0.4 s, a fifth
    of a small model's whole ``calibrate``): like SciPy's float32 loop, ``x * log(x / y)`` in
    float64 rounded to float32, 0 where ``x == 0 <= y``, Inf elsewhere, NaN from a NaN
    (equal to SciPy's bit for bit on 6 M random pairs; tests/test_calibrators.py)."""
    xd = np.asarray(x, np.float32).astype(np.float64)
    yd = np.asarray(y, np.float32).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inner = xd * np.log(xd / yd)
        out = np.where((xd > 0) & (yd > 0), inner, np.where((xd == 0) & (yd >= 0), 0.0, np.inf))
        out[np.isnan(xd) | np.isnan(yd)] = np.nan
        return out.astype(np.float32)


def ort_entropy_threshold(
    hist: np.ndarray, edges: np.ndarray, num_quantized_bins: int = QUANT_LEVELS
) -> tuple[np.float32, np.float32]:
    """onnxruntime ``HistogramCollector.get_entropy_threshold`` before clipping to (min, max).

    ``hist``: int64 signed counts on ``edges`` (symmetric around 0). Windows widen around the
    centre bin; P folds outliers into its end bins; Q merges ``size // levels`` bins per level
    (the remainder's count goes to the last level but is never expanded), expands each level's
    count over the level's non-zero *P* bins and truncates to int64; both are smoothed.
    """
    hist = np.asarray(hist, dtype=np.int64)
    num_bins = hist.size
    zero_bin = num_bins // 2
    half_levels = num_quantized_bins // 2
    prefix = np.concatenate([[0], np.cumsum(hist)])
    divergences = np.zeros(zero_bin - half_levels + 1)
    windows = []
    for half_width in range(half_levels, zero_bin + 1):
        start = zero_bin - half_width
        end = min(zero_bin + half_width + 1, num_bins)
        windows.append((start, end))
        window = hist[start:end]
        p = window.copy()
        p[0] += prefix[start]
        p[-1] += prefix[-1] - prefix[end]
        merged = window.size // num_quantized_bins
        whole = merged * num_quantized_bins
        level_count = window[:whole].reshape(num_quantized_bins, merged).sum(axis=1)
        level_count[-1] += window[whole:].sum()
        level_nonzero = (p[:whole] != 0).reshape(num_quantized_bins, merged).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_level = np.where(level_nonzero > 0, level_count / level_nonzero, 0.0)
        q = np.zeros(window.size, dtype=np.int64)
        q[:whole] = np.repeat(per_level.astype(np.int64), merged)
        p_smooth, q_smooth = _ort_smooth(p), _ort_smooth(q)
        index = half_width - half_levels
        if p_smooth is None or q_smooth is None:
            divergences[index] = np.inf
        else:
            divergences[index] = _ort_kl(p_smooth, q_smooth)
    start, end = windows[int(np.argmin(divergences))]
    return edges[start], edges[end]


def ort_histogram(stats: TensorStats, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The histogram ORT's ``collect_value`` builds from all values in one call (float32 data):
    integer counts and ``np.histogram``'s float32 edges on [-t, t], t = max(|min|, |max|)."""
    t = stats.max_abs
    counts = np.rint(stats.signed_histogram(num_bins, -t, t)).astype(np.int64)
    t32 = np.float32(t)
    with np.errstate(over="ignore", invalid="ignore"):
        edges = np.linspace(-t32, t32, num_bins + 1, endpoint=True, dtype=np.float32)
    if not np.isfinite(edges).all():
        # a range reaching +-FLT_MAX (an attention mask of finfo(float32).min) overflows ORT's
        # float32 edge arithmetic, which then gives NaN edges and a NaN threshold; the edges it
        # means are computed in float64 instead
        edges = np.linspace(-t, t, num_bins + 1, endpoint=True).astype(np.float32)
    return counts, edges


def ort_amax(stats: TensorStats, num_bins: int = ORT_DEFAULT_BINS) -> float:
    """onnxruntime Entropy calibration as amax = max(|lo|, |hi|) of its clipped threshold."""
    hist, edges = ort_histogram(stats, num_bins)
    lo, hi = ort_entropy_threshold(hist, edges)
    lo = max(float(lo), stats.min)
    hi = min(float(hi), stats.max)
    return max(abs(lo), abs(hi))


_VARIANT_FNS = {
    "trt": trt_amax,
    "slides": slides_amax,
    "pytorch": pytorch_amax,
    "ort": ort_amax,
    "ort-2048": lambda stats: ort_amax(stats, 2048),
}


def _check_variant(option: str | None) -> str:
    variant = option or "trt"
    if variant not in _VARIANT_FNS:
        raise QuantbenchError(
            f"method 'entropy:{variant}': unknown variant; choose one of {', '.join(VARIANTS)}"
        )
    return variant


@register(
    "entropy",
    "KL-divergence threshold; variants trt (TensorRT EntropyCalibrator2, quantbench's "
    "zero-spike variant), slides (literal), pytorch, ort",
    trt_algorithm="EntropyCalibration2",
    default_option="trt",
    options=VARIANTS,
    in_all=("trt", "slides", "pytorch", "ort"),  # ort-2048 is ~30 ms/tensor: asked for by name only
    note="quantbench's variant of TensorRT's EntropyCalibration2 search (zero spike left out; "
    "unconfirmed by a TensorRT cache of a ReLU network)",
    check=_check_variant,
)
def entropy(stats: TensorStats, option: str | None) -> float:
    """amax minimising KL(P || Q) the way the chosen tool does it (default: quantbench's
    zero-spike variant of TensorRT's search)."""
    return float(_VARIANT_FNS[_check_variant(option)](stats))


@register_many("entropy")
def entropy_many(stats: list[TensorStats], option: str | None) -> list[float]:
    """:func:`entropy` of many tensors, the candidates' KL of all of them at once (on the GPU
    inside :func:`quantbench.calibrators.tables_on`) for the 2048-bin variants."""
    variant = _check_variant(option)
    if variant in ("trt", "slides"):
        return slide_amaxes(stats, without_zero_spike=variant == "trt")
    if variant == "pytorch":
        return pytorch_amaxes(stats)
    return [float(_VARIANT_FNS[variant](t)) for t in stats]
