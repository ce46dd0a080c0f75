"""The refinement a compared Q/DQ model went through (issue 38): every pass ``quantize`` tried,
its judged output SQNR on the held-back calibration samples against the unrefined model's,
whether it was kept (or why not), and per pass what it changed per layer.

The record is the model's own (``quantbench.refine_record`` metadata, copied by ``compare``
into the results' ``refinement`` section per side); nothing is re-judged here, the verdicts
are the record's. Every field is read defensively: a record is data from a model file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantbench.reports.formatting import MISSING, as_finite, as_number, fmt_fixed, fmt_num
from quantbench.reports.results import as_dict, as_records
from quantbench.reports.tables import Cell, Column, number_cell, text_cell

#: per-layer rows shown per pass; the rest are counted (the results JSON has them all)
LAYER_LIMIT = 25
#: what the base row of the trials table is called
UNREFINED = "(unrefined)"

TRIAL_COLUMNS = (
    Column("Pass", "str", "the refinement pass (smooth:ALPHA: SmoothQuant at that strength)"),
    Column(
        "Output SQNR",
        "num",
        "the INT8 model's outputs against FP32 on the held-back calibration samples",
    ),
    Column("Δ vs unrefined", "num", "against the unrefined INT8 model's output SQNR"),
    Column("Result", "str", "kept, or why not"),
    Column("Layers changed", "num"),
    Column("Seconds", "num", "the pass and its judging"),
)


@dataclass(frozen=True)
class PassLayers:
    """One pass's per-layer changes: a table, truncated to :data:`LAYER_LIMIT` rows."""

    id: str
    title: str
    #: the measure of every row, when they share one ('' when the table has a column for it)
    measure: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    #: rows left out
    more: int = 0


@dataclass(frozen=True)
class SideRefinement:
    """One compared side's record."""

    side: str
    label: str
    summary: str
    scored_on: str
    trials_id: str
    trial_rows: tuple[tuple[Cell, ...], ...]
    passes: tuple[PassLayers, ...]
    trial_columns: tuple[Column, ...] = TRIAL_COLUMNS


@dataclass(frozen=True)
class RefinementSection:
    sides: tuple[SideRefinement, ...]

    @property
    def both(self) -> bool:
        return len(self.sides) > 1


def _db(value: Any) -> str:
    """An SQNR to two decimals (a pass must gain 0.01 dB: one decimal would hide verdicts)."""
    text = fmt_fixed(value, 2)
    return text + " dB" if as_finite(value) is not None else text


def _db_delta(value: Any) -> str:
    number = as_finite(value)
    if number is None:
        return MISSING
    return ("+" if number > 0 else "") + _db(number)


def _delta(before: Any, after: Any) -> float | None:
    a, b = as_finite(before), as_finite(after)
    return None if a is None or b is None else b - a


def _family(name: str) -> str:
    """``smooth:0.8`` -> ``smooth`` (the variants of one pass replace each other)."""
    return name.split(":")[0]


def _verdicts(record: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(short, long, kept) per trial, from the record's own ``kept`` flags: a pass not kept
    is told the score it had to beat (the unrefined one, or the last kept pass's)."""
    trials = as_records(record.get("trials"))
    final = [str(k) for k in record.get("kept") or [] if isinstance(k, str)]
    bar = record.get("base_output_sqnr_db")
    out = []
    for i, trial in enumerate(trials):
        name = str(trial.get("pass") or "")
        note = str(trial.get("note") or "")
        score = trial.get("output_sqnr_db")
        if trial.get("kept") is True:
            later = [
                str(t.get("pass"))
                for t in trials[i + 1 :]
                if t.get("kept") is True and _family(str(t.get("pass"))) == _family(name)
            ]
            if name in final or not later:
                out.append(("kept", "kept", True))
            else:
                out.append(("replaced", f"kept, then replaced by {later[-1]}", False))
            bar = score
        elif as_number(score) is None:
            told = f": {note}" if note and note != "nothing to change" else ""
            out.append(("nothing to change", "changed nothing" + told, False))
        else:
            why = f"not kept: no gain over {_db(bar)}"
            out.append(("not kept", why + (f"; {note}" if note else ""), False))
    return out


def _trial_rows(record: dict[str, Any]) -> tuple[tuple[Cell, ...], ...]:
    base = record.get("base_output_sqnr_db")
    rows = [
        (
            text_cell(UNREFINED),
            number_cell(base, _db),
            number_cell(None, _db_delta),
            text_cell("the score every pass is judged against", "muted"),
            number_cell(None, fmt_num),
            number_cell(None, fmt_num),
        )
    ]
    trials = as_records(record.get("trials"))
    for trial, (_, verdict, kept) in zip(trials, _verdicts(record), strict=True):
        score = trial.get("output_sqnr_db")
        layers = trial.get("layers")
        rows.append(
            (
                text_cell(trial.get("pass")),
                number_cell(score, _db),
                number_cell(_delta(base, score), _db_delta),
                text_cell(verdict, "good" if kept else "muted"),
                number_cell(len(layers) if isinstance(layers, list) else None, fmt_num),
                number_cell(trial.get("seconds"), lambda v: fmt_fixed(v, 1)),
            )
        )
    return tuple(rows)


def _pass_layers(trial: dict[str, Any], short: str, table_id: str, limit: int) -> PassLayers | None:
    layers = as_records(trial.get("layers"))
    if not layers:
        return None
    measures = {str(c.get("measure") or "") for c in layers}
    per_row = len(measures) > 1  # else the one measure is said once, above the table
    columns = [Column("Node", "str"), Column("What changed", "str")]
    if per_row:
        columns.append(Column("Measure", "str", "what before and after measure"))
    columns += [
        Column("Before", "num", "the pass's measure of the layer before it"),
        Column("After", "num", "the same measure after it"),
        Column("Δ", "num", "after − before (higher is better for an SQNR, not for a range)"),
    ]
    rows = []
    for change in layers[:limit]:
        cells = [text_cell(change.get("node"), "name"), text_cell(change.get("detail"), "note")]
        if per_row:
            cells.append(text_cell(change.get("measure"), "note"))
        cells += [
            number_cell(change.get("before"), _fixed),
            number_cell(change.get("after"), _fixed),
            number_cell(_delta(change.get("before"), change.get("after")), _signed),
        ]
        rows.append(tuple(cells))
    name = str(trial.get("pass") or MISSING)
    count = f"{len(layers)} layer{'s' if len(layers) != 1 else ''} changed"
    return PassLayers(
        id=table_id,
        title=f"{name} · {short} · {count}",
        measure="" if per_row else measures.pop(),
        columns=tuple(columns),
        rows=tuple(rows),
        more=max(len(layers) - limit, 0),
    )


def _fixed(value: Any) -> str:
    return fmt_fixed(value, 2)


def _signed(value: Any) -> str:
    number = as_finite(value)
    return MISSING if number is None else ("+" if number > 0 else "") + fmt_fixed(number, 2)


def _summary(record: dict[str, Any]) -> str:
    kept = [str(k) for k in record.get("kept") or [] if isinstance(k, str)]
    tried = len(as_records(record.get("trials")))
    tried_text = f"{tried} pass{'es' if tried != 1 else ''} tried"
    if not kept:
        return f"{tried_text}, none kept: the model is quantized from the unrefined FP32 model."
    scores = [
        t.get("output_sqnr_db")
        for t, (_, _, k) in zip(as_records(record.get("trials")), _verdicts(record), strict=True)
        if k
    ]
    end = scores[-1] if scores else None
    gain = _delta(record.get("base_output_sqnr_db"), end)
    moved = (
        f" ({_db(record.get('base_output_sqnr_db'))} → {_db(end)}, {_db_delta(gain)})"
        if gain is not None
        else ""
    )
    return f"{tried_text}; kept: {', '.join(kept)}{moved}."


def _scored_on(record: dict[str, Any]) -> str:
    holdout = str(record.get("holdout") or "")
    told = f" ({holdout})" if holdout else ""
    return (
        "Every output SQNR here was measured against FP32 on the held-back calibration "
        f"samples{told}, when the model was quantized; not on this report's evaluation data."
    )


def refinement_section(
    results: dict[str, Any], labels: tuple[str, str] = ("A", "B"), limit: int = LAYER_LIMIT
) -> RefinementSection | None:
    """The ``refinement`` section of a results document (per side the record its model
    carries), or None when no compared model carries one."""
    found = as_dict(results.get("refinement"))
    sides = []
    for side, label in zip(("A", "B"), labels, strict=True):
        record = found.get(side)
        if not isinstance(record, dict):
            continue
        verdicts = _verdicts(record)
        passes = []
        for i, (trial, (short, _, _)) in enumerate(
            zip(as_records(record.get("trials")), verdicts, strict=True)
        ):
            table = _pass_layers(trial, short, f"refine-layers-{side}-{i}", limit)
            if table is not None:
                passes.append(table)
        sides.append(
            SideRefinement(
                side=side,
                label=label,
                summary=_summary(record),
                scored_on=_scored_on(record),
                trials_id=f"refine-trials-{side}",
                trial_rows=_trial_rows(record),
                passes=tuple(passes),
            )
        )
    return RefinementSection(tuple(sides)) if sides else None
