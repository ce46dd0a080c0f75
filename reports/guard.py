"""The clipping guard's findings: tensors whose threshold clips too much (``--clip-warn``,
``calibration.clipping``) and quantized ops whose isolated SQNR is below the floor
(``--sqnr-floor``, the document's ``flags``), each with the built-in method that would do better.

The guard decides nothing here: the producer flagged, this only lays the flags out, worst first
as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantbench.reports.formatting import as_finite, as_number, fmt_db, fmt_num, fmt_small_pct
from quantbench.reports.results import as_dict, as_records
from quantbench.reports.tables import Cell, Column, number_cell, text_cell

CLIP_COLUMNS = (
    Column("Side", "str", "A or B (hover for its label)"),
    Column("Tensor", "str"),
    Column("Method", "str", "calibrator whose threshold the table uses for this tensor"),
    Column("amax"),
    Column("Clipped", "num", "fraction of the tensor's calibration values beyond amax"),
    Column("Better method", "str", "built-in method that clips less at a lower expected error"),
    Column("Its amax"),
    Column("Its clipped"),
)
FLOOR_COLUMNS = (
    Column("Side", "str", "A or B (hover for its label)"),
    Column("Node", "str"),
    Column("Op", "str"),
    Column("Isolated SQNR", "num", "the error this op adds by itself, FP32 inputs"),
    Column("Quantized input", "str", "the tensor whose threshold the op's input uses"),
    Column("Method", "str"),
    Column("amax"),
    Column("Clipped", "num", "fraction of the input's evaluation values beyond amax"),
    Column(
        "Better method",
        "str",
        "built-in method whose threshold has the lowest expected INT8 error for the input",
    ),
    Column("Its amax"),
    Column("Its clipped", "num", "on the calibration data"),
)


@dataclass(frozen=True)
class GuardSection:
    clip_warn: float | None
    sqnr_floor: float | None
    clip_rows: tuple[tuple[Cell, ...], ...]
    floor_rows: tuple[tuple[Cell, ...], ...]
    summary: str
    clip_columns: tuple[Column, ...] = CLIP_COLUMNS
    floor_columns: tuple[Column, ...] = FLOOR_COLUMNS
    #: the first flag in words, for the verdict card
    headline: str = ""

    @property
    def count(self) -> int:
        return len(self.clip_rows) + len(self.floor_rows)


def _suggestion(flag: dict[str, Any]) -> Cell:
    if flag.get("suggestion"):
        return text_cell(flag["suggestion"], "good")
    if flag.get("method") is None and flag.get("rule") == "sqnr_floor":
        return text_cell(None)  # no statistics: nothing to judge a method by
    return text_cell("none better", "muted", "no built-in method has a lower expected error")


def _who(flag: dict[str, Any], names: dict[str, tuple[str, str]]) -> Cell:
    """The side (A/B), its label as the tooltip."""
    who = str(flag.get("candidate") or "")
    side, label = names.get(who, (who, who))
    return text_cell(side, title=label)


def _clip_row(flag: dict[str, Any], names: dict[str, tuple[str, str]]) -> tuple[Cell, ...]:
    return (
        _who(flag, names),
        text_cell(flag.get("tensor"), "name"),
        text_cell(flag.get("method")),
        number_cell(flag.get("amax"), fmt_num),
        number_cell(flag.get("clip_fraction"), fmt_small_pct, "sev-bad"),
        _suggestion(flag),
        number_cell(flag.get("suggestion_amax"), fmt_num),
        number_cell(flag.get("suggestion_clip_fraction"), fmt_small_pct),
    )


def _floor_row(flag: dict[str, Any], names: dict[str, tuple[str, str]]) -> tuple[Cell, ...]:
    return (
        _who(flag, names),
        text_cell(flag.get("node"), "name"),
        text_cell(flag.get("op_type")),
        number_cell(flag.get("isolated_sqnr_db"), fmt_db, "sev-bad"),
        text_cell(flag.get("tensor"), "name"),
        text_cell(flag.get("method")),
        number_cell(flag.get("amax"), fmt_num),
        number_cell(flag.get("clip_fraction"), fmt_small_pct),
        _suggestion(flag),
        number_cell(flag.get("suggestion_amax"), fmt_num),
        number_cell(flag.get("suggestion_clip_fraction"), fmt_small_pct),
    )


def _summary(clips: int, floors: int, clip_warn: float | None, floor: float | None) -> str:
    parts = []
    if clip_warn is not None:
        limit = fmt_small_pct(clip_warn)
        parts.append(
            f"{clips} tensor(s) clip more than {limit} of their values (--clip-warn)"
            if clips
            else f"no tensor clips more than {limit} of its values (--clip-warn)"
        )
    if floor is not None:
        parts.append(
            f"{floors} quantized op(s) below {fmt_db(floor)} isolated SQNR (--sqnr-floor)"
            if floors
            else f"no quantized op is below {fmt_db(floor)} isolated SQNR (--sqnr-floor)"
        )
    text = "; ".join(parts) + "."
    return text[:1].upper() + text[1:]


def _names(results: dict[str, Any], labels: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """A flag's candidate ("B" for the SQNR rule, the spec "int8:entropy" for clipping) ->
    (side, label), so both tables name a candidate alike."""
    names = {"A": ("A", labels[0]), "B": ("B", labels[1])}
    for key, label in zip(("a", "b"), labels, strict=True):
        spec = as_dict(results.get(key)).get("spec")
        if isinstance(spec, str) and spec:
            names.setdefault(spec, (key.upper(), label))
    return names


def _drop_first(columns: tuple[Column, ...], rows: list[tuple[Cell, ...]]):
    return columns[1:], tuple(r[1:] for r in rows)


def _headline(clips: list[dict[str, Any]], floors: list[dict[str, Any]]) -> str:
    if floors:
        f = floors[0]
        better = f" ({f['suggestion']} does better)" if f.get("suggestion") else ""
        return f"{f.get('node')}: {fmt_db(f.get('isolated_sqnr_db'))} isolated{better}"
    if clips:
        f = clips[0]
        better = f" ({f['suggestion']} does better)" if f.get("suggestion") else ""
        return f"{f.get('tensor')}: clips {fmt_small_pct(f.get('clip_fraction'))}{better}"
    return ""


def flagged_tensors(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(tensor, why) of every flag, worst first: ops below the SQNR floor, then clipping."""
    out = [
        (str(f.get("tensor")), f"flagged: {f.get('node')} at {fmt_db(f.get('isolated_sqnr_db'))}")
        for f in as_records(results.get("flags"))
    ]
    out += [
        (str(f.get("tensor")), f"flagged: clips {fmt_small_pct(f.get('clip_fraction'))}")
        for f in as_records(as_dict(results.get("calibration")).get("clipping"))
    ]
    return out


def guard_section(
    results: dict[str, Any], labels: tuple[str, str] = ("A", "B")
) -> GuardSection | None:
    """The guard's flags, or None when the guard did not run (no limit and no flag recorded).
    The candidate column is left out when every flag is about the same candidate."""
    calibration = as_dict(results.get("calibration"))
    clips = as_records(calibration.get("clipping"))
    floors = as_records(results.get("flags"))
    clip_warn = as_finite(calibration.get("clip_warn"))
    floor = as_number(results.get("sqnr_floor_db"))
    if floor is not None and floor != floor:
        floor = None
    if not clips and not floors and clip_warn is None and floor is None:
        return None
    names = _names(results, labels)
    clip_rows = [_clip_row(f, names) for f in clips]
    floor_rows = [_floor_row(f, names) for f in floors]
    clip_columns, floor_columns = CLIP_COLUMNS, FLOOR_COLUMNS
    who = {r[0].title or r[0].text for r in clip_rows + floor_rows}
    summary = _summary(len(clips), len(floors), clip_warn, floor)
    if results.get("kind") == "calibration":  # calibrate: one table per --method, no sides
        clip_columns = (Column("Table", "str", "the table of this --method"), *CLIP_COLUMNS[1:])
    if len(who) == 1:
        clip_columns, clip_rows_t = _drop_first(clip_columns, clip_rows)
        floor_columns, floor_rows_t = _drop_first(FLOOR_COLUMNS, floor_rows)
        summary = f"{who.pop()}: {summary}"
    else:
        clip_rows_t, floor_rows_t = tuple(clip_rows), tuple(floor_rows)
    return GuardSection(
        clip_warn=clip_warn,
        sqnr_floor=floor,
        clip_rows=clip_rows_t,
        floor_rows=floor_rows_t,
        summary=summary,
        clip_columns=clip_columns,
        floor_columns=floor_columns,
        headline=_headline(clips, floors),
    )
