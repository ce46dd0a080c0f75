"""Clipping guard: flag tensors whose threshold cuts off more than a set fraction of their values.

A threshold below max|x| trades clipping for resolution; KL-based thresholds can make that trade
badly on distributions they were not designed for (a spike plus a sparse tail: an image
background with bright strokes, or a conv input concentrated near 0 with a long tail), and the
result is a silently ruined model. Everything here is read from the statistics' fine |x|
histogram, no inference: the clipped fraction of each threshold, and the expected squared
quantization error of symmetric INT8 at a threshold, which names the built-in method that would
clip less while keeping resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantbench import calibrators as registry
from quantbench.errors import QuantbenchError
from quantbench.stats import StatsFile, TensorStats
from quantbench.table import INT8_MAX, CalibrationTable

#: default ``--clip-warn``: more than 1 value in 1000 beyond the threshold is flagged
DEFAULT_CLIP_WARN = 1e-3
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
            f"{self.fraction:.2%} of its values"
        )
        if self.suggestion is None:
            return text + " (no built-in method clips less at a lower expected error)"
        return (
            f"{text}; {self.suggestion} (threshold {self.suggestion_amax:.4g}, clips "
            f"{self.suggestion_fraction:.2%}) has the lowest expected quantization error"
        )


def check_clip_warn(fraction: float) -> float:
    """``--clip-warn`` must be a fraction in [0, 1)."""
    if not 0 <= fraction < 1:
        raise QuantbenchError(f"--clip-warn must be a fraction in [0, 1), not {fraction!r}")
    return fraction


def clip_fraction(stats: TensorStats, amax: float) -> float:
    """Fraction of the tensor's finite values with |x| beyond ``amax``."""
    if stats.count == 0:
        return 0.0
    return max(stats.count_above(amax), 0.0) / stats.count


def expected_mse(stats: TensorStats, amax: float) -> float:
    """Mean squared error of symmetric INT8 fake quantization at ``amax``, every value at its
    fine bin's centre (bins of at most max|x| / 8192, so the centre error is far below a step)."""
    if stats.count == 0 or not amax > 0:
        return float("inf") if stats.count else 0.0
    counts = stats.abs_fine_counts().astype(np.float64)
    used = np.flatnonzero(counts)
    centre = np.minimum((used + 0.5) * stats.bin_width, stats.max_abs)
    step = amax / INT8_MAX
    quantized = np.minimum(np.rint(centre / step), INT8_MAX) * step
    return float(counts[used] @ (quantized - centre) ** 2 / stats.count)


def clip_flags(
    stats: StatsFile,
    table: CalibrationTable,
    limit: float = DEFAULT_CLIP_WARN,
    tensors: list[str] | None = None,
) -> list[ClipFlag]:
    """Every tensor of ``table`` (or of ``tensors``) whose threshold clips more than ``limit``
    of its values, with the built-in method that has the lowest expected error among those that
    clip less."""
    flags = []
    names = tensors if tensors is not None else list(table)
    for name in names:
        if name not in table or name not in stats.tensors:
            continue
        t, entry = stats[name], table.entries[name]
        fraction = clip_fraction(t, entry.amax)
        if fraction <= limit:
            continue
        flags.append(_flag(t, entry.method or table.method, entry.amax, fraction))
    return flags


def _flag(t: TensorStats, method: str, amax: float, fraction: float) -> ClipFlag:
    current = expected_mse(t, amax)
    best: tuple[float, str, float, float] | None = None
    for m in SUGGESTED_METHODS:
        if registry.canonical(m) == method:
            continue
        other = registry.compute_amax(m, t)
        other_fraction = clip_fraction(t, other)
        error = expected_mse(t, other)
        if other_fraction < fraction and error < current and (best is None or error < best[0]):
            best = (error, m, other, other_fraction)
    if best is None:
        return ClipFlag(t.name, method, amax, fraction)
    return ClipFlag(t.name, method, amax, fraction, best[1], best[2], best[3])


def clip_warning(flags: list[ClipFlag], limit: float, who: str = "", shown: int = 10) -> str:
    """One warning: a header naming the limit (and ``who``), then a line per flagged tensor;
    empty when nothing is flagged."""
    if not flags:
        return ""
    head = (
        f"{who + ': ' if who else ''}{len(flags)} tensor(s) clip more than {limit:.3g} of their "
        "values at their threshold (--clip-warn):"
    )
    lines = [head] + [f"  {f.message()}" for f in flags[:shown]]
    if len(flags) > shown:
        lines.append(f"  ... and {len(flags) - shown} more (see the results JSON)")
    return "\n".join(lines)
