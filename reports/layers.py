"""Per-layer drift: which layers are worst, the drift chart's series and the layer table.

A results document lists one entry per (layer, view). "accumulated" compares a tensor with every
earlier layer quantized; "isolated" compares it with only this layer quantized, so it points at
the layer that causes the error rather than the ones that inherit it. The worst layers are ranked
by isolated SQNR when it was measured, by accumulated SQNR otherwise; a layer whose SQNR is
undefined (NaN/Inf in the tensor, "nan" in the JSON) ranks worst of all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from quantbench.reports.charts import DriftPoint, drift_chart
from quantbench.reports.formatting import (
    as_number,
    fmt_fixed,
    fmt_nonfinite,
    fmt_num,
    fmt_sig,
    fmt_small_pct,
    nonfinite_counts,
    nonfinite_sentence,
)
from quantbench.reports.tables import Cell, Column, number_cell, sort_key, text_cell

VIEWS = ("accumulated", "isolated")
WORST_COUNT = 5
#: SQNR shading: 25 dB is roughly cosine 0.998 and 15 dB roughly cosine 0.985; below these a
#: layer's INT8 error is usually visible in the output. Display only: no result depends on it.
SQNR_WARN_DB = 25.0
SQNR_BAD_DB = 15.0
#: the NaN/Inf column closes the drift metrics, before the calibration ones (clipped, amax)
_NONFINITE_BEFORE = "clip_fraction"
NONFINITE_TIP = "NaN/Inf values seen in FP32 and in B: any makes the tensor's metrics undefined"

_IDENTITY_KEYS = ("index", "tensor", "node", "op_type", "view", "nonfinite", "precision")
PRECISION_TIP = (
    "precision the candidate computes this op in: int8, fp16 (native kernel), fp16-emulated "
    "(FP32 arithmetic on FP16-rounded values) or fp32"
)
#: (key, header, formatter, tooltip) for the metrics the producer writes, in display order.
_METRICS: tuple[tuple[str, str, Callable[[Any], str], str], ...] = (
    ("sqnr_db", "SQNR dB", lambda v: fmt_fixed(v, 1), "signal-to-quantization-noise ratio"),
    ("cosine", "Cosine", lambda v: fmt_fixed(v, 6), "cosine similarity of B's tensor to A's"),
    ("rel_l2", "Rel.\u00a0L2", lambda v: fmt_sig(v, 3), "‖B − A‖ / ‖A‖"),
    ("max_abs", "Max\u00a0|Δ|", lambda v: fmt_sig(v, 3), "largest absolute difference"),
    ("mean_abs", "Mean\u00a0|Δ|", lambda v: fmt_sig(v, 3), "mean absolute difference"),
    ("clip_fraction", "Clipped", fmt_small_pct, "fraction of values beyond the INT8 range"),
    ("amax", "amax", lambda v: fmt_num(v, 4), "calibrated range of the tensor"),
)


@dataclass(frozen=True)
class WorstLayer:
    rank: int
    index: int
    tensor: str
    node: str
    op_type: str
    sqnr: float | None
    other_sqnr: float | None
    candidate: str = ""


@dataclass(frozen=True)
class LayerSection:
    """Everything the template shows about layers."""

    ranked_view: str
    views: tuple[str, ...]
    worst: tuple[WorstLayer, ...]
    chart: Markup | None
    columns: tuple[Column, ...]
    rows: tuple[tuple[dict[str, str], tuple[Cell, ...]], ...]
    row_count: int
    #: both sides (A and B) were compared against FP32: rows say which
    both: bool = False
    sqnr_warn_db: float = SQNR_WARN_DB
    sqnr_bad_db: float = SQNR_BAD_DB


def _view(entry: dict[str, Any]) -> str:
    view = entry.get("view")
    return view if isinstance(view, str) and view else "accumulated"


def _index(entry: dict[str, Any], fallback: int) -> int:
    number = as_number(entry.get("index"))
    return int(number) if number is not None and math.isfinite(number) else fallback


def _sqnr(entry: dict[str, Any]) -> float | None:
    """The SQNR a chart can place (undefined and missing are gaps)."""
    number = as_number(entry.get("sqnr_db"))
    return None if number is None or math.isnan(number) else number


def _measured(entry: dict[str, Any]) -> float | None:
    """The SQNR for ranking: NaN when undefined, None when not measured."""
    return as_number(entry.get("sqnr_db"))


def _rank_key(entry: dict[str, Any]) -> tuple[bool, float]:
    """Undefined first, then by SQNR (-inf before any number)."""
    number = _measured(entry)
    assert number is not None
    return (not math.isnan(number), -math.inf if math.isnan(number) else number)


def rank_worst(entries: Sequence[dict[str, Any]], count: int = WORST_COUNT) -> tuple[str, list]:
    """The view used for ranking and its ``count`` lowest-SQNR entries, worst first; undefined
    SQNR (NaN/Inf in the tensor) is worse than any number, -inf included."""
    has_isolated = any(_view(e) == "isolated" and _measured(e) is not None for e in entries)
    ranked_view = "isolated" if has_isolated else "accumulated"
    candidates = [
        (i, e)
        for i, e in enumerate(entries)
        if _view(e) == ranked_view and _measured(e) is not None
    ]
    candidates.sort(key=lambda item: (*_rank_key(item[1]), _index(item[1], item[0])))
    return ranked_view, [e for _, e in candidates[:count]]


def _points(entries: Sequence[dict[str, Any]]) -> list[DriftPoint]:
    by_index: dict[int, dict[str, Any]] = {}
    for position, entry in enumerate(entries):
        slot = by_index.setdefault(_index(entry, position), {"entry": entry})
        slot[_view(entry)] = _sqnr(entry)
    points = []
    for index in sorted(by_index):
        slot = by_index[index]
        entry = slot["entry"]
        points.append(
            DriftPoint(
                index=index,
                name=str(entry.get("tensor") or entry.get("node") or f"layer {index}"),
                node=str(entry.get("node") or ""),
                op_type=str(entry.get("op_type") or "?"),
                accumulated=slot.get("accumulated"),
                isolated=slot.get("isolated"),
            )
        )
    return points


def _extra_metric_keys(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Numeric fields beyond the known ones, so a newer producer's metrics still show."""
    known = set(_IDENTITY_KEYS) | {key for key, *_ in _METRICS}
    extra: list[str] = []
    for entry in entries:
        for key, value in entry.items():
            if key not in known and key not in extra and as_number(value) is not None:
                extra.append(key)
    return extra


def _sqnr_css(value: Any) -> str:
    number = as_number(value)
    if number is None:
        return ""
    if math.isnan(number) or number < SQNR_BAD_DB:
        return "sev-bad"
    return "sev-warn" if number < SQNR_WARN_DB else ""


def _row(
    entry: dict[str, Any],
    position: int,
    extra: Sequence[str],
    worst_rank: dict[int, int],
    counted: bool,
    both: bool = False,
    precision: bool = False,
) -> tuple[dict[str, str], tuple[Cell, ...]]:
    index = _index(entry, position)
    rank = worst_rank.get(id(entry))
    cells = [
        number_cell(index, str),
        text_cell(entry.get("tensor"), "name"),
        text_cell(entry.get("node"), "name"),
        text_cell(entry.get("op_type")),
        *((text_cell(entry.get("precision")),) if precision else ()),
        text_cell(_view(entry)),
    ]
    if both:
        cells.append(text_cell(entry.get("candidate")))
    for key, _header, formatter, _tip in _METRICS:
        if key == _NONFINITE_BEFORE and counted:
            cells.append(nonfinite_cell(entry.get("nonfinite")))
        css = _sqnr_css(entry.get(key)) if key == "sqnr_db" else ""
        cells.append(number_cell(entry.get(key), formatter, css))
    cells.extend(number_cell(entry.get(key), fmt_num) for key in extra)
    attrs = {"data-view": _view(entry)}
    if rank is not None:
        attrs["data-worst"] = str(rank)
    return attrs, tuple(cells)


def nonfinite_cell(value: Any) -> Cell:
    """NaN/Inf counts (FP32 and candidate side apart), sorted by their total, red when any."""
    counts = nonfinite_counts(value)
    total = None if counts is None else counts[0] + counts[1]
    return Cell(
        fmt_nonfinite(value),
        sort_key(total),
        "sev-bad" if total else "",
        nonfinite_sentence(value),
        numeric=True,
    )


def _table_order(entry: dict[str, Any], position: int) -> tuple[int, int, int]:
    """Network order, both views of a layer side by side."""
    view = _view(entry)
    return _index(entry, position), VIEWS.index(view) if view in VIEWS else len(VIEWS), position


def layer_section(entries: Sequence[dict[str, Any]]) -> LayerSection | None:
    """The layer chart, worst list and table; None when the document has no layers."""
    if not entries:
        return None
    ranked_view, worst_entries = rank_worst(entries)
    points = _points(entries)
    measured = {(_index(e, i), _view(e)): _measured(e) for i, e in enumerate(entries)}
    other_view = "accumulated" if ranked_view == "isolated" else "isolated"
    worst = tuple(
        WorstLayer(
            rank=rank,
            index=_index(entry, 0),
            tensor=str(entry.get("tensor") or ""),
            node=str(entry.get("node") or ""),
            op_type=str(entry.get("op_type") or ""),
            sqnr=_measured(entry),
            other_sqnr=measured.get((_index(entry, 0), other_view)),
            candidate=str(entry.get("candidate") or ""),
        )
        for rank, entry in enumerate(worst_entries, 1)
    )
    has_sqnr = any(_sqnr(e) is not None for e in entries)
    chart = drift_chart(points, [w.index for w in worst], ranked_view) if has_sqnr else None
    extra = _extra_metric_keys(entries)
    counted = any(isinstance(e.get("nonfinite"), dict) for e in entries)
    both = len({e.get("candidate") for e in entries if e.get("candidate") is not None}) > 1
    precision = any(e.get("precision") for e in entries)
    columns = (
        Column("#"),
        Column("Tensor", "str"),
        Column("Node", "str"),
        Column("Op", "str"),
        *((Column("Precision", "str", PRECISION_TIP),) if precision else ()),
        Column("View", "str"),
        *(
            (Column("Side", "str", "A or B: both sides were compared against FP32"),)
            if both
            else ()
        ),
        *(
            column
            for key, header, _fmt, tip in _METRICS
            for column in (
                (Column("NaN/Inf", "num", NONFINITE_TIP),)
                if key == _NONFINITE_BEFORE and counted
                else ()
            )
            + (Column(header, "num", tip),)
        ),
        *(Column(key) for key in extra),
    )
    worst_rank = {id(entry): rank for rank, entry in enumerate(worst_entries, 1)}
    ordered = sorted(enumerate(entries), key=lambda item: _table_order(item[1], item[0]))
    rows = tuple(
        _row(entry, i, extra, worst_rank, counted, both, precision) for i, entry in ordered
    )
    views = tuple(v for v in VIEWS if any(_view(e) == v for e in entries)) + tuple(
        sorted({_view(e) for e in entries} - set(VIEWS))
    )
    return LayerSection(ranked_view, views, worst, chart, columns, rows, len(rows), both=both)
