"""The calibration section: which histograms to draw up front, the on-demand data, the amax table.

Histograms are drawn as SVG only for a few tensors (the worst layers, then the tensors whose range
the calibrator cut most); every other tensor's histogram travels as compact JSON that the page's
script draws on request. That keeps a 200-tensor report small while any tensor stays one click
away.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from quantbench.reports import svg
from quantbench.reports.charts import HISTOGRAM_LAYOUT, HistogramView, histogram_chart
from quantbench.reports.formatting import as_finite, fmt_db, fmt_int, fmt_num
from quantbench.reports.layers import WorstLayer
from quantbench.reports.results import as_dict, as_records
from quantbench.reports.tables import Cell, Column, number_cell, text_cell

PICK_COUNT = 4


@dataclass(frozen=True)
class HistogramPick:
    """A pre-rendered histogram and why it was chosen."""

    name: str
    reason: str
    chart: Markup


@dataclass(frozen=True)
class CalibrationSection:
    method_used: str | None
    methods: tuple[str, ...]
    colours: dict[str, str]
    tensor_count: int
    picks: tuple[HistogramPick, ...]
    on_demand: dict[str, Any] | None
    default_tensor: str | None
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    warnings: tuple[str, ...]


def _methods(calibration: dict[str, Any], tensors: Sequence[dict[str, Any]]) -> list[str]:
    """The document's method list, then any method that only appears in a tensor's amax."""
    methods = [m for m in calibration.get("methods") or [] if isinstance(m, str)]
    for tensor in tensors:
        for method in as_dict(tensor.get("amax")):
            if method not in methods:
                methods.append(method)
    return methods


def _histogram(tensor: dict[str, Any], default_used: str | None, colours: dict[str, str]):
    """The tensor's HistogramView, or None when it carries no usable histogram."""
    hist = as_dict(tensor.get("histogram"))
    upper = as_finite(hist.get("upper"))
    counts = hist.get("counts")
    if upper is None or upper <= 0 or not isinstance(counts, list) or not counts:
        return None
    amax = {k: v for k, v in as_dict(tensor.get("amax")).items() if as_finite(v) is not None}
    used = tensor.get("used_method") if isinstance(tensor.get("used_method"), str) else None
    return HistogramView(
        name=str(tensor.get("name", "")),
        upper=upper,
        counts=[as_finite(c) or 0.0 for c in counts],
        amax=amax,
        used=used or default_used,
        colours=colours,
    )


def _range_cut(view: HistogramView) -> float:
    """How much of the observed range the used threshold cuts away (max / amax)."""
    used = as_finite(view.amax.get(view.used or ""))
    return view.upper / used if used and used > 0 else 0.0


def _picks(
    views: Mapping[str, HistogramView], worst: Sequence[WorstLayer], ranked_view: str
) -> list[HistogramPick]:
    picks: list[HistogramPick] = []
    for layer in worst:
        view = views.get(layer.tensor)
        if view is not None and all(p.name != view.name for p in picks):
            reason = f"worst layer #{layer.rank} by {ranked_view} SQNR ({fmt_db(layer.sqnr)})"
            picks.append(HistogramPick(view.name, reason, histogram_chart(view)))
        if len(picks) == PICK_COUNT:
            return picks
    by_cut = sorted(views.values(), key=lambda v: -_range_cut(v))
    for view in by_cut:
        if len(picks) == PICK_COUNT:
            break
        if all(p.name != view.name for p in picks) and _range_cut(view) > 0:
            reason = f"range cut most by calibration (max / amax = {_range_cut(view):.2f})"
            picks.append(HistogramPick(view.name, reason, histogram_chart(view)))
    return picks


#: On-demand histograms carry counts as round(LOG_LEVELS * log10(1 + count)): the chart's y axis
#: is log-scaled, so 1/100 of a decade (2.3 %) is below a pixel, and a count of millions shrinks
#: from 7 characters to 3.
LOG_LEVELS = 100


def _log_levels(counts: Sequence[float]) -> list[int]:
    return [round(LOG_LEVELS * math.log10(1 + max(c, 0.0))) for c in counts]


def _short(value: float) -> float:
    """Seven significant digits: the legend prints four, and repr's seventeen cost bytes."""
    return float(f"{value:.7g}")


def _short_map(amax: Mapping[str, float]) -> dict[str, float]:
    return {method: _short(value) for method, value in amax.items()}


def _on_demand(views: Mapping[str, HistogramView], colours: dict[str, str]) -> dict[str, Any]:
    """Histogram data for the page's script: [name, upper, log levels, {method: amax}, used]."""
    return {
        "layout": HISTOGRAM_LAYOUT,
        "log_levels": LOG_LEVELS,
        "methods": list(colours),
        "colours": colours,
        "tensors": [
            [v.name, _short(v.upper), _log_levels(v.counts), _short_map(v.amax), v.used]
            for v in views.values()
        ],
    }


def _amax_row(tensor: dict[str, Any], methods: Sequence[str], default_used: str | None):
    amax = as_dict(tensor.get("amax"))
    used = tensor.get("used_method") or default_used
    bad = sum(int(as_finite(tensor.get(k)) or 0) for k in ("nan_count", "inf_count"))
    cells = [
        text_cell(tensor.get("name"), "name"),
        number_cell(tensor.get("count"), fmt_int),
        number_cell(tensor.get("min"), fmt_num),
        number_cell(tensor.get("max"), fmt_num),
        number_cell(bad, fmt_int, "sev-bad" if bad else ""),
        text_cell(used),
    ]
    cells.extend(number_cell(amax.get(m), fmt_num, "used" if m == used else "") for m in methods)
    return tuple(cells)


def _warnings(tensors: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for tensor in tensors:
        nan = int(as_finite(tensor.get("nan_count")) or 0)
        inf = int(as_finite(tensor.get("inf_count")) or 0)
        if nan or inf:
            out.append(
                f"{tensor.get('name', '?')}: {fmt_int(nan)} NaN and {fmt_int(inf)} infinite "
                "values were seen during calibration and left out of its statistics"
            )
    return out


def calibration_section(
    calibration: dict[str, Any], worst: Sequence[WorstLayer], ranked_view: str
) -> CalibrationSection | None:
    """The calibration section, or None when the document has no calibration data."""
    tensors = as_records(calibration.get("tensors"))
    if not calibration or not tensors:
        return None
    methods = _methods(calibration, tensors)
    colours = {m: svg.PALETTE[i % len(svg.PALETTE)] for i, m in enumerate(methods)}
    method_used = calibration.get("method_used")
    method_used = method_used if isinstance(method_used, str) else None
    views: dict[str, HistogramView] = {}
    for tensor in tensors:
        view = _histogram(tensor, method_used, colours)
        if view is not None and view.name not in views:
            views[view.name] = view
    picks = _picks(views, worst, ranked_view)
    columns = (
        Column("Tensor", "str"),
        Column("Values", "num", "number of values the statistics saw"),
        Column("Min"),
        Column("Max"),
        Column("NaN/Inf", "num", "non-finite values (excluded from the statistics)"),
        Column("Used", "str", "calibrator whose amax the table uses"),
        *(Column(m, "num", f"amax chosen by {m}") for m in methods),
    )
    # The on-demand chart opens on a tensor not already drawn above it.
    shown = {p.name for p in picks}
    default = next((name for name in views if name not in shown), next(iter(views), None))
    return CalibrationSection(
        method_used=method_used,
        methods=tuple(methods),
        colours=colours,
        tensor_count=len(tensors),
        picks=tuple(picks),
        on_demand=_on_demand(views, colours) if views else None,
        default_tensor=default,
        columns=columns,
        rows=tuple(_amax_row(t, methods, method_used) for t in tensors),
        warnings=tuple(_warnings(tensors)),
    )
