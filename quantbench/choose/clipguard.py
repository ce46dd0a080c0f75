"""Clipping guard: flag tensors whose threshold cuts off more than a set fraction of their values,
and (in ``compare``, which measures it) quantized ops whose isolated SQNR falls below a floor.

A threshold below max|x| trades clipping for resolution; KL-based thresholds can make that trade
badly on distributions they were not designed for (a spike plus a sparse tail: an image
background with bright strokes, or a conv input concentrated near 0 with a long tail), and the
result is a silently ruined model. Everything here is read from the statistics' fine |x|
histogram, no inference: the clipped fraction of each threshold, and the expected squared
quantization error of symmetric INT8 at a threshold, which names the built-in method that would
clip less while keeping resolution. The SQNR rule names, for each op below the floor, the
tensor its quantized input comes from, the fraction clipped, and the built-in method whose
threshold has the lowest expected INT8 error for that tensor (or says that none does better, so
the error comes from elsewhere: the weights, or the op itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from quantbench import calibrators as registry
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import StatsFile, TensorStats, settled
from quantbench.table import INT8_MAX, CalibrationTable

#: default ``--clip-warn``: more than 1 value in 1000 beyond the threshold is flagged
DEFAULT_CLIP_WARN = 1e-3
#: default ``--sqnr-floor`` (dB). Symmetric INT8 with a sound threshold leaves an op 30-40 dB of
#: isolated SQNR (a Gaussian cut at 4 sigma: 10 log10(12 * 127^2 / 16) = 40.8 dB; the bundled
#: example's ops measure 22-46 dB with every built-in method); 20 dB is a noise power of 1 % of
#: the signal (relative L2 0.1, cosine ~0.995), 10-20 dB below that, while the thresholds that
#: ruined real models in issue 10 measured -4.9 and 6.9 dB.
DEFAULT_SQNR_FLOOR_DB = 20.0
#: a method suggested for an op below the SQNR floor must cut the tensor's expected INT8 error to
#: this fraction of the current one (about 1 dB): smaller differences are within what the binned
#: estimate resolves, and would not lift an op from below the floor anyway.
BETTER_BY = 0.8
#: built-in methods a flagged tensor is re-judged with
SUGGESTED_METHODS = ("mse", "percentile:99.99", "minmax", "entropy")


@dataclass(frozen=True)
class ClipFlag:
    """One tensor clipped beyond the limit, and the method that would do better (if any)."""

    tensor: str
    method: str
    amax: float
    fraction: float
    suggestion: str | None = None
    suggestion_amax: float | None = None
    suggestion_fraction: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "tensor": self.tensor,
            "method": self.method,
            "amax": self.amax,
            "clip_fraction": self.fraction,
            "suggestion": self.suggestion,
            "suggestion_amax": self.suggestion_amax,
            "suggestion_clip_fraction": self.suggestion_fraction,
        }

    def message(self) -> str:
        text = (
            f"{self.tensor}: {self.method} threshold {self.amax:.4g} clips "
            f"{_pct(self.fraction)} of its values"
        )
        if self.suggestion is None:
            return text + " (no built-in method clips less at a lower expected error)"
        return (
            f"{text}; {self.suggestion} (threshold {self.suggestion_amax:.4g}, clips "
            f"{_pct(self.suggestion_fraction)}) has the lowest expected quantization error"
        )


def _pct(fraction: float | None) -> str:
    """A clipped fraction as a percentage that keeps a small non-zero value visible."""
    if fraction is None:
        return "?"
    pct = fraction * 100
    return f"{pct:.2f}%" if pct == 0 or pct >= 0.01 else f"{pct:.1g}%"


def check_clip_warn(fraction: float) -> float:
    """``--clip-warn`` must be a fraction in [0, 1)."""
    if not 0 <= fraction < 1:
        raise QuantbenchError(f"--clip-warn must be a fraction in [0, 1), not {fraction!r}")
    return fraction


def check_sqnr_floor(floor_db: float) -> float:
    """``--sqnr-floor`` must be a number of dB (``-inf``: flag only undefined SQNR)."""
    if math.isnan(floor_db) or floor_db == math.inf:
        raise QuantbenchError(f"--sqnr-floor must be a number of dB, not {floor_db!r}")
    return floor_db


def clip_fraction(stats: TensorStats, amax: float) -> float:
    """Fraction of the tensor's finite values that ``amax`` clips: |x| beyond it by more than
    half an INT8 step. Those within half a step round to the top level anyway (no error beyond
    rounding): a Tanh saturating at 1.0 under a 0.9988 threshold, or a 0/1 mask under 0.9998,
    is not clipped (they were flagged at 17 % and 89 %, burying the real flags)."""
    if stats.count == 0:
        return 0.0
    return max(stats.count_above(amax * (1 + 0.5 / INT8_MAX)), 0.0) / stats.count


def expected_mse(stats: TensorStats, amax: float) -> float:
    """Mean squared error of symmetric INT8 fake quantization at ``amax``, every value at its
    fine bin's centre (bins of at most max|x| / 8192, so the centre error is far below a step)."""
    return float(expected_mses(stats, [amax])[0])


def expected_mses(stats: TensorStats, amaxes: list[float]) -> np.ndarray:
    """:func:`expected_mse` at each of ``amaxes``, in one pass over the bins."""
    if stats.count == 0:
        return np.zeros(len(amaxes))
    usable = np.array([a > 0 for a in amaxes])
    weight, centre = stats.abs_fine_centres()
    step = np.where(usable, np.asarray(amaxes, dtype=np.float64), 1.0)[:, None] / INT8_MAX
    quantized = np.minimum(np.rint(centre / step), INT8_MAX) * step
    return np.where(usable, ((quantized - centre) ** 2 @ weight) / stats.count, np.inf)


def clip_flags(
    stats: StatsFile,
    table: CalibrationTable,
    limit: float = DEFAULT_CLIP_WARN,
    tensors: list[str] | None = None,
    known: dict[str, CalibrationTable] | None = None,
) -> list[ClipFlag]:
    """Every tensor of ``table`` (or of ``tensors``) whose threshold clips more than ``limit``
    of its values, with the built-in method that has the lowest expected error among those that
    clip less (``known``: tables already built from ``stats``, by method, whose amax is taken
    instead of computed again). Each tensor's |x| CDF and bin centres, read for every
    threshold, are built once (:func:`~quantbench.stats.tensorstats.settled`; once for all calls
    when the
    caller's scope is settled too)."""
    if not stats.has_histograms:
        # only a pass for range-only methods keeps no bins, and their thresholds (max|x|)
        # clip nothing
        return []
    names = tensors if tensors is not None else list(table)
    with settled():
        clipped = []
        for name in names:
            if name not in table or name not in stats.tensors:
                continue
            t, entry = stats[name], table.entries[name]
            fraction = clip_fraction(t, entry.amax)
            if fraction > limit:
                clipped.append((t, entry.method or table.method, entry.amax, fraction))
        others = _suggested_amaxes([(t, method) for t, method, _, _ in clipped], known or {})
        return [
            _flag(t, method, amax, fraction, others[t.name])
            for t, method, amax, fraction in clipped
        ]


def _suggested_amaxes(
    tensors: list[tuple[TensorStats, str]], known: dict[str, CalibrationTable]
) -> dict[str, dict[str, float]]:
    """Per tensor, the amax of each of :data:`SUGGESTED_METHODS` but its own method: from a
    table already built where there is one, else computed for all the tensors that need it at
    once (one matrix product for mse; one device batch inside ``calibrators.tables_on``)."""
    out: dict[str, dict[str, float]] = {t.name: {} for t, _ in tensors}
    for m in SUGGESTED_METHODS:
        built = known.get(registry.canonical(m))
        todo = []
        for t, method in tensors:
            if registry.canonical(m) == method:
                continue
            if built is not None and t.name in built.entries:
                out[t.name][m] = built.entries[t.name].amax
            else:
                todo.append(t)
        for t, amax in zip(todo, registry.compute_amaxes(m, todo), strict=True):
            out[t.name][m] = amax
    return out


def _flag(
    t: TensorStats, method: str, amax: float, fraction: float, others: dict[str, float]
) -> ClipFlag:
    """``t``'s flag, with the suggested method (of ``others``, amax by method) that clips less
    and has the lowest expected error below the current one, if any."""
    current, *errors = expected_mses(t, [amax, *others.values()])
    best: tuple[float, str, float, float] | None = None
    for (m, other), error in zip(others.items(), errors):
        other_fraction = clip_fraction(t, other)
        if other_fraction < fraction and error < current and (best is None or error < best[0]):
            best = (error, m, other, other_fraction)
    if best is None:
        return ClipFlag(t.name, method, amax, fraction)
    return ClipFlag(t.name, method, amax, fraction, best[1], best[2], best[3])


def clip_warning(
    flags: list[ClipFlag],
    limit: float,
    who: str = "",
    shown: int = 10,
    *,
    listed_by: str,
    note: str = "",
) -> str:
    """One warning: a header naming the limit (and ``who``), then a line per flagged tensor,
    then ``note`` (why such a table can clip at all); empty when nothing is flagged.
    ``listed_by``: the option whose output lists every flag (for the line that says how many
    were left out)."""
    if not flags:
        return ""
    head = (
        f"{who + ': ' if who else ''}{len(flags)} tensor(s) clip more than {limit:.3g} of their "
        "values at their threshold (--clip-warn):"
    )
    listing = _listing(head, [f.message() for f in flags], shown, listed_by)
    return f"{listing}\n  {note}" if note else listing


def clip_summary(flags: dict[str, list[ClipFlag]], limit: float, *, listed_by: str) -> str:
    """One warning for several methods (``--method all``): a line per method that clips, with
    its worst tensor and how many a suggested method clips less on; the per-tensor lines
    (``listed_by``) would bury the methods the user did not choose in dozens of lines."""
    clipping = {m: f for m, f in flags.items() if f}
    if not clipping:
        return ""
    head = (
        f"{len(clipping)} of {len(flags)} methods clip more than {limit:.3g} of some tensors' "
        f"values at their threshold (--clip-warn; per tensor: {listed_by}):"
    )
    lines = []
    for method, found in clipping.items():
        worst = max(found, key=lambda f: f.fraction)
        helped = [f.suggestion for f in found if f.suggestion is not None]
        better = ""
        if helped:
            best = max(set(helped), key=helped.count)
            better = f"; {best} clips less on {helped.count(best)}"
        lines.append(
            f"{method}: {len(found)} tensor(s), worst {worst.tensor} {_pct(worst.fraction)}{better}"
        )
    return "\n".join([head, *(f"  {line}" for line in lines)])


def _listing(head: str, items: list[str], shown: int, listed_by: str) -> str:
    """``head``, then the first ``shown`` items, then how many more ``listed_by`` lists."""
    lines = [head] + [f"  {item}" for item in items[:shown]]
    if len(items) > shown:
        lines.append(f"  ... and {len(items) - shown} more ({listed_by} lists them all)")
    return "\n".join(lines)


@dataclass(frozen=True)
class SqnrFlag:
    """A quantized op whose isolated SQNR is below the floor (or undefined), the tensor its
    quantized input comes from, and the method with the lowest expected INT8 error for it."""

    node: str
    op_type: str
    output: str
    tensor: str
    sqnr_db: float
    floor_db: float
    method: str | None
    amax: float
    fraction: float | None
    suggestion: str | None = None
    suggestion_amax: float | None = None
    suggestion_fraction: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "rule": "sqnr_floor",
            "node": self.node,
            "op_type": self.op_type,
            "output": self.output,
            "tensor": self.tensor,
            "isolated_sqnr_db": self.sqnr_db,
            "floor_db": self.floor_db,
            "method": self.method,
            "amax": self.amax,
            "clip_fraction": self.fraction,
            "suggestion": self.suggestion,
            "suggestion_amax": self.suggestion_amax,
            "suggestion_clip_fraction": self.suggestion_fraction,
        }

    def message(self) -> str:
        sqnr = "undefined" if math.isnan(self.sqnr_db) else f"{self.sqnr_db:.1f} dB"
        clipped = "?" if self.fraction is None else _pct(self.fraction)
        text = (
            f"{self.node} ({self.op_type}): isolated SQNR {sqnr}; input {self.tensor}: "
            f"{self.method or 'its'} threshold {self.amax:.4g} clips {clipped} of its values"
        )
        if math.isnan(self.sqnr_db):  # no error to lower: a threshold cannot be the cause
            return text + (
                "; undefined: its FP32 or INT8 output holds NaN or Inf (non-finite samples in "
                "the evaluation data?) or its FP32 output is all zeros"
            )
        if self.suggestion is None:
            return text + (
                "; no built-in method has a lower expected error for it (the error comes from "
                "the weights or the op itself: keep it in high precision with --exclude)"
                if self.method is not None
                else ""
            )
        return (
            f"{text}; {self.suggestion} (threshold {self.suggestion_amax:.4g}, clips "
            f"{_pct(self.suggestion_fraction)}) has the lowest expected quantization error"
        )


@dataclass(frozen=True)
class OpDrift:
    """What ``compare`` measured of one quantized op: its isolated SQNR (NaN when undefined) and
    the tensor, threshold and clipped fraction (on the evaluation data) of its quantized input."""

    node: str
    op_type: str
    output: str
    tensor: str
    amax: float
    sqnr_db: float
    fraction: float | None


def sqnr_flags(
    ops: Sequence[OpDrift],
    floor_db: float = DEFAULT_SQNR_FLOOR_DB,
    stats: StatsFile | None = None,
    table: CalibrationTable | None = None,
) -> list[SqnrFlag]:
    """Every op whose isolated SQNR is below ``floor_db`` or undefined, worst first. With the
    calibration statistics of its input tensor, the built-in method with the lowest expected
    INT8 error is suggested when it is not the one used."""
    flags = []
    for op in ops:
        if not (math.isnan(op.sqnr_db) or op.sqnr_db < floor_db):
            continue
        entry = table.entries.get(op.tensor) if table is not None else None
        method = (entry.method or table.method) if entry is not None and table else None
        best = None
        if stats is not None and op.tensor in stats.tensors and stats[op.tensor].count:
            best = _lowest_error(stats[op.tensor], method, op.amax)
        flags.append(
            SqnrFlag(
                op.node,
                op.op_type,
                op.output,
                op.tensor,
                op.sqnr_db,
                floor_db,
                method,
                op.amax,
                op.fraction,
                *(best or (None, None, None)),
            )
        )
    flags.sort(key=lambda f: -math.inf if math.isnan(f.sqnr_db) else f.sqnr_db)
    return flags


def _lowest_error(
    t: TensorStats, method: str | None, amax: float
) -> tuple[str, float, float] | None:
    """(method, amax, clipped fraction) of the built-in method with the lowest expected INT8
    error for ``t``, when it beats the threshold in use (``amax``) by :data:`BETTER_BY`."""
    current = expected_mse(t, amax) * BETTER_BY
    best: tuple[float, str, float] | None = None
    for m in SUGGESTED_METHODS:
        if _same_method(m, method):
            continue
        other = registry.compute_amax(m, t)
        error = expected_mse(t, other)
        if error < current and (best is None or error < best[0]):
            best = (error, m, other)
    if best is None:
        return None
    return best[1], best[2], clip_fraction(t, best[2])


def _same_method(method: str, other: str | None) -> bool:
    """Whether two method names are the same calibrator (a table's own label, e.g. a TensorRT
    cache's, is none of the built-in ones)."""
    if other is None:
        return False
    try:
        return registry.canonical(method) == registry.canonical(other)
    except QuantbenchError:
        return False


def sqnr_warning(flags: list[SqnrFlag], who: str = "", shown: int = 10, *, listed_by: str) -> str:
    """One warning: a header naming the floor (and ``who``), then a line per flagged op, worst
    first; empty when nothing is flagged. ``listed_by``: as for :func:`clip_warning`."""
    if not flags:
        return ""
    head = (
        f"{who + ': ' if who else ''}{len(flags)} quantized op(s) below the isolated SQNR floor "
        f"of {flags[0].floor_db:.3g} dB (--sqnr-floor):"
    )
    return _listing(head, [f.message() for f in flags], shown, listed_by)
