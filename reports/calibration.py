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
from quantbench.reports.formatting import as_finite, as_number, fmt_db, fmt_int, fmt_num
from quantbench.reports.layers import WorstLayer
from quantbench.reports.results import as_dict, as_records
from quantbench.reports.tables import Cell, Column, number_cell, text_cell

PICK_COUNT = 4
#: Said wherever the report names the default ``entropy`` (README, "Calibrators"): it is not
#: TensorRT's calibrator as documented, and no real TensorRT cache has confirmed it yet.
ENTROPY_NOTE = (
    "entropy is quantbench's variant of TensorRT's EntropyCalibration2: the zero spike of "
    "ReLU-like tensors is left out of the KL search (entropy:slides keeps it, as the slide "
    "pseudocode does), so on ReLU outputs it may differ from TensorRT's own calibration"
)


def method_note(methods: Sequence[str | None]) -> str:
    """:data:`ENTROPY_NOTE` when one of ``methods`` is the default ``entropy``, else ''."""
    return ENTROPY_NOTE if any(m in ("entropy", "entropy:trt") for m in methods) else ""


@dataclass(frozen=True)
class AutoSection:
    """``--method auto``'s record: every whole-model candidate's output SQNR on the judging
    slice, the one chosen, and the per-tensor choices of the mix."""

    holdout: str
    judged_by: str
    reused: bool
    chosen: str
    fallback: bool
    candidates: tuple[tuple[Cell, ...], ...]
    tensor_columns: tuple[Column, ...]
    tensors: tuple[tuple[Cell, ...], ...]


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
    note: str = ""
    auto: AutoSection | None = None


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
    views: Mapping[str, HistogramView],
    worst: Sequence[WorstLayer],
    ranked_view: str,
    flagged: Sequence[tuple[str, str]] = (),
) -> list[HistogramPick]:
    """Flagged tensors first (the clipping guard's), then the worst layers' tensors, then the
    tensors whose range the calibrator cut most."""
    picks: list[HistogramPick] = []
    for name, reason in flagged:
        view = views.get(name)
        if view is not None and all(p.name != view.name for p in picks):
            picks.append(HistogramPick(view.name, reason, histogram_chart(view)))
        if len(picks) == PICK_COUNT:
            return picks
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
        text_cell(tensor.get("used_label") or used),
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


def _resolve_auto(
    tensors: list[dict[str, Any]], method_used: str | None, auto: dict[str, Any]
) -> list[dict[str, Any]]:
    """With ``--method auto`` every tensor records "auto" as its method; the amax it got is the
    one of the method auto chose for it (the mix's per-tensor choice, or the single method that
    won), so charts and the amax table mark that method. Copies: the document is not changed."""
    if not auto:
        return tensors
    chosen = auto.get("chosen") if isinstance(auto.get("chosen"), str) else None
    per_tensor = {
        str(r.get("tensor")): r["method"]
        for r in as_records(auto.get("tensors"))
        if isinstance(r.get("method"), str)
    }
    out = []
    for tensor in tensors:
        used = tensor.get("used_method") or method_used
        if used == "auto":
            pick = chosen if chosen and chosen != "mix" else per_tensor.get(str(tensor.get("name")))
            if pick:
                tensor = {**tensor, "used_method": pick, "used_label": f"auto → {pick}"}
        out.append(tensor)
    return out


def auto_section(auto: dict[str, Any]) -> AutoSection | None:
    """The ``calibration.auto`` record laid out, or None when absent."""
    scores = as_dict(auto.get("output_sqnr_db"))
    if not auto or not scores:
        return None
    chosen = str(auto.get("chosen") or "")
    stopped = as_dict(auto.get("stopped_early"))
    best_first = sorted(scores, key=lambda k: -(as_number(scores[k]) or -math.inf))

    def verdict(name: str) -> Cell:
        if name == chosen:
            return Cell("chosen", css="good")
        if name in stopped:  # its score is the most it could still have reached
            return Cell(f"stopped after {stopped[name]} samples: could no longer win (≤)")
        return Cell("")

    candidates = tuple(
        (
            text_cell(
                f"{name} (per-tensor mix)" if name == "mix" else name,
                "name" + (" used" if name == chosen else ""),
            ),
            number_cell(scores[name], fmt_db, "used" if name == chosen else ""),
            verdict(name),
        )
        for name in best_first
    )
    records = as_records(auto.get("tensors"))
    methods = [m for m in auto.get("methods") or [] if isinstance(m, str)]
    tensor_columns = (
        Column("Tensor", "str"),
        Column("Mix uses", "str", "the method the per-tensor mix gives this tensor"),
        Column("Readers", "str", "quantized ops reading the tensor (they share its scale)"),
        *(Column(m, "num", f"worst isolated SQNR of the readers with {m}") for m in methods),
    )
    rows = []
    for r in records:
        sqnr = as_dict(r.get("isolated_sqnr_db"))
        used = r.get("method")
        readers = r.get("readers") if isinstance(r.get("readers"), list) else []
        rows.append(
            (
                text_cell(r.get("tensor"), "name"),
                text_cell(used),
                text_cell(", ".join(str(x) for x in readers) or None, "name"),
                *(number_cell(sqnr.get(m), fmt_db, "used" if m == used else "") for m in methods),
            )
        )
    return AutoSection(
        holdout=str(auto.get("holdout") or ""),
        judged_by=str(auto.get("judged_by") or "output SQNR"),
        reused=bool(auto.get("reused")),
        chosen=chosen,
        fallback=bool(auto.get("fallback")),
        candidates=candidates,
        tensor_columns=tensor_columns,
        tensors=tuple(rows),
    )


def calibration_section(
    calibration: dict[str, Any],
    worst: Sequence[WorstLayer],
    ranked_view: str,
    flagged: Sequence[tuple[str, str]] = (),
) -> CalibrationSection | None:
    """The calibration section, or None when the document has no calibration data.
    ``flagged``: (tensor, why) of the clipping guard's flags, whose histograms come first."""
    tensors = as_records(calibration.get("tensors"))
    if not calibration or not tensors:
        return None
    methods = _methods(calibration, tensors)
    colours = {m: svg.PALETTE[i % len(svg.PALETTE)] for i, m in enumerate(methods)}
    method_used = calibration.get("method_used")
    method_used = method_used if isinstance(method_used, str) else None
    tensors = _resolve_auto(tensors, method_used, as_dict(calibration.get("auto")))
    views: dict[str, HistogramView] = {}
    for tensor in tensors:
        view = _histogram(tensor, method_used, colours)
        if view is not None and view.name not in views:
            views[view.name] = view
    picks = _picks(views, worst, ranked_view, flagged)
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
        note=method_note([method_used, *methods]),
        auto=auto_section(as_dict(calibration.get("auto"))),
    )
