"""Turn a results document into what the template shows, section by section.

All judgement about the document (what passed, what is worth a headline, which numbers read as
percentages) lives here in Python where it is tested; the template only lays it out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from markupsafe import Markup

from quantbench.compare.latency import timing_note
from quantbench.evaluate.metrics import (
    MASK_IOU,
    MEAN_IOU,
    OPTIONAL_KEYS,
    carried_metrics,
    lower_is_better,
)
from quantbench.reports import svg
from quantbench.reports.calibration import (
    CalibrationSection,
    calibration_section,
    method_note,
)
from quantbench.reports.charts import bar_chart, recovery_chart
from quantbench.reports.formatting import (
    MISSING,
    UNDEFINED,
    as_finite,
    as_number,
    fmt_db,
    fmt_fixed,
    fmt_int,
    fmt_metric,
    fmt_metric_delta,
    fmt_ms,
    fmt_num,
    fmt_pct,
    fmt_ratio,
    fmt_sig,
    nonfinite_counts,
    nonfinite_sentence,
)
from quantbench.reports.guard import flagged_tensors, guard_section
from quantbench.reports.layers import LayerSection, layer_section, nonfinite_cell
from quantbench.reports.refinement import refinement_section
from quantbench.reports.results import as_dict, as_records
from quantbench.reports.tables import Cell, Column, number_cell, text_cell

LATENCY_STATS = (("median_ms", "median"), ("p90_ms", "p90"), ("p99_ms", "p99"))


@dataclass(frozen=True)
class Card:
    """A headline number in the verdict: label, value, a line of context, a tone class."""

    label: str
    value: str
    detail: str = ""
    tone: str = ""


@dataclass(frozen=True)
class ThresholdRow:
    metric: str
    rule: str
    value: str
    passed: bool | None
    reason: str = ""


@dataclass(frozen=True)
class TaskRow:
    metric: str
    a: str
    b: str
    delta: str
    tone: str


@dataclass(frozen=True)
class LatencySection:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    chart_ms: Markup | None
    chart_throughput: Markup | None
    speedup: float | None
    #: what was timed, where no TensorRT engine ran ("onnxruntime CPU, Q/DQ emulated: not
    #: TensorRT's speed"); None where an engine was timed
    note: str | None = None


@dataclass(frozen=True)
class RecoverySection:
    target: str
    chart: Markup | None
    rows: tuple[tuple[Cell, ...], ...]
    kept_final: tuple[str, ...]


@dataclass(frozen=True)
class SpecialOps:
    excluded: tuple[tuple[str, str, str], ...]
    dynamic_convs: tuple[tuple[Cell, ...], ...]
    kept_by_recovery: tuple[str, ...]


def side_label(side: dict[str, Any], fallback: str) -> str:
    """How a compared configuration is named: its label, else its spec, else A/B."""
    for key in ("label", "spec"):
        value = side.get(key)
        if isinstance(value, str) and value:
            return value
    return fallback


def overall_status(results: dict[str, Any], thresholds: list[dict[str, Any]]) -> str:
    """ "pass", "fail", or "none" when no gate was set: the report then claims no verdict, even
    though ``compare`` records ``passed: true`` for a run without gates (nothing was judged)."""
    passed = results.get("passed")
    flags = [t.get("passed") for t in thresholds if isinstance(t.get("passed"), bool)]
    if passed is False:
        return "fail"
    if not flags:
        return "none"
    return "pass" if all(flags) else "fail"


def _rule(threshold: dict[str, Any]) -> str:
    metric = str(threshold.get("metric", ""))
    parts = []
    if as_finite(threshold.get("min")) is not None:
        parts.append("≥ " + fmt_metric(metric, threshold["min"]))
    if as_finite(threshold.get("max")) is not None:
        parts.append("≤ " + fmt_metric(metric, threshold["max"]))
    return " and ".join(parts) or MISSING


def _threshold_value(threshold: dict[str, Any]) -> str:
    """The measured value; a gate judged on an undefined value (null with a ``reason``, or
    "nan") reads "undefined", not as if nothing had been measured."""
    value = threshold.get("value")
    if value is None and threshold.get("reason"):
        return UNDEFINED
    return fmt_metric(str(threshold.get("metric", "")), value)


def threshold_rows(thresholds: list[dict[str, Any]]) -> tuple[ThresholdRow, ...]:
    return tuple(
        ThresholdRow(
            metric=str(t.get("metric", MISSING)),
            rule=_rule(t),
            value=_threshold_value(t),
            passed=t.get("passed") if isinstance(t.get("passed"), bool) else None,
            reason=str(t.get("reason") or ""),
        )
        for t in thresholds
    )


def task_rows(task: dict[str, Any]) -> tuple[TaskRow, ...]:
    """One row per task metric, with B − A computed when the producer left it out."""
    rows = []
    for name, entry in task.items():
        values = as_dict(entry)
        a, b = values.get("A"), values.get("B")
        delta = values.get("delta")
        if delta is None and as_finite(a) is not None and as_finite(b) is not None:
            delta = b - a
        change = as_finite(delta)
        if change is not None and lower_is_better(name):  # *_drop: a loss, lower is better
            change = -change
        tone = "" if change is None or change == 0 else ("good" if change > 0 else "bad")
        if as_number(b) is not None and as_finite(b) is None:  # B undefined (NaN/Inf)
            tone = "bad"
        rows.append(
            TaskRow(
                name.replace("_", " "),
                fmt_metric(name, a),
                fmt_metric(name, b),
                fmt_metric_delta(name, delta),
                tone,
            )
        )
    return tuple(rows)


def _undefined_css(value: Any) -> str:
    number = as_number(value)
    return "sev-bad" if number is not None and math.isnan(number) else ""


#: (key, column, formatter) of the output table's metrics, in display order.
_OUTPUT_METRICS = (
    (
        "agreement",
        Column(
            "Top-1",
            "num",
            "argmax(B) = argmax(A): per sample for class scores, per position for rank ≥ 3",
        ),
        fmt_pct,
    ),
    (
        "top5_agreement",
        Column("Top-5", "num", "argmax(A) in B's top 5 (per sample or position)"),
        fmt_pct,
    ),
    (
        "sequence_agreement",
        Column("Sequence", "num", "rank ≥ 3: samples whose every position agrees"),
        fmt_pct,
    ),
    (
        "ctc_agreement",
        Column(
            "CTC",
            "num",
            "(N, T, C): samples whose CTC-decoded paths agree (repeats merged, the class FP32 "
            "picks most often dropped as the blank)",
        ),
        fmt_pct,
    ),
    (
        MASK_IOU,
        Column(
            "Mask IoU",
            "num",
            "a Sigmoid's probability map: values above its threshold (0.5 unless "
            "--mask-threshold) in both A and B over those above it in either",
        ),
        fmt_pct,
    ),
    (
        MEAN_IOU,
        Column(
            "mIoU",
            "num",
            "a class map (segmentation): per class, the pixels both A and B give it over those "
            "either does, averaged over the classes present",
        ),
        fmt_pct,
    ),
    ("cosine", Column("Cosine"), lambda v: fmt_fixed(v, 6)),
    ("sqnr_db", Column("SQNR dB"), lambda v: fmt_fixed(v, 1)),
    ("rel_l2", Column("Rel. L2"), lambda v: fmt_sig(v, 3)),
    ("max_abs", Column("Max |Δ|"), lambda v: fmt_sig(v, 3)),
    ("mean_abs", Column("Mean |Δ|"), lambda v: fmt_sig(v, 3)),
)
NONFINITE_COLUMN = Column("NaN/Inf", "num", "NaN/Inf values in FP32 and in B: metrics undefined")
NOTE_COLUMN = Column("Note", "str", "why agreement is not defined for this output")


def _shown_keys(outputs: list[dict[str, Any]]) -> list[str]:
    """The metrics the output table has columns for: the optional ones only where an output
    carries them (:func:`quantbench.evaluate.metrics.carried_metrics`)."""
    carried = carried_metrics(outputs)
    return [k for k, _, _ in _OUTPUT_METRICS if k not in OPTIONAL_KEYS or k in carried]


def _sides(rows: list[dict[str, Any]]) -> set[str]:
    """The candidates (A, B) rows belong to: two when both sides were quantized/converted."""
    return {str(r["candidate"]) for r in rows if r.get("candidate") is not None}


def output_columns(outputs: list[dict[str, Any]]) -> tuple[Column, ...]:
    """The output table's columns: the side only when both were compared, the metrics
    :func:`_shown`, the NaN/Inf counts and the agreement note only when the document carries
    them."""
    columns = [Column("Side", "str")] if len(_sides(outputs)) > 1 else []
    columns.append(Column("Output", "str"))
    shown = _shown_keys(outputs)
    columns += [c for k, c, _ in _OUTPUT_METRICS if k in shown]
    if any(isinstance(o.get("nonfinite"), dict) for o in outputs):
        columns.append(NONFINITE_COLUMN)
    if any(o.get("agreement_note") for o in outputs):
        columns.append(NOTE_COLUMN)
    return tuple(columns)


def output_rows(outputs: list[dict[str, Any]]) -> tuple[tuple[Cell, ...], ...]:
    counted = any(isinstance(o.get("nonfinite"), dict) for o in outputs)
    noted = any(o.get("agreement_note") for o in outputs)
    shown = _shown_keys(outputs)
    rows = []
    both = len(_sides(outputs)) > 1
    for o in outputs:
        cells = [text_cell(o.get("candidate"))] if both else []
        cells.append(text_cell(o.get("name"), "name"))
        for key, _column, formatter in _OUTPUT_METRICS:
            if key in shown:
                cell = number_cell(o.get(key), formatter, _undefined_css(o.get(key)))
                if key == MASK_IOU and (told := _decisions_text(o)):
                    cell = replace(cell, title=told)
                cells.append(cell)
        if counted:
            cells.append(nonfinite_cell(o.get("nonfinite")))
        if noted:
            cells.append(text_cell(o.get("agreement_note"), "note"))
        rows.append(tuple(cells))
    return tuple(rows)


def _decisions_text(output: dict[str, Any]) -> str:
    """What a mask IoU rests on, for its cell's tooltip."""
    counts = as_dict(output.get("mask_decisions"))
    if not counts:
        return ""
    side = output.get("candidate") or "B"
    return (
        f"decisions at {output.get('mask_threshold')}: FP32 {counts.get('fp32'):,}, {side} "
        f"{counts.get('candidate'):,}, both {counts.get('both'):,} of {counts.get('values'):,} "
        "values"
    )


def speedup(latency: dict[str, Any]) -> float | None:
    """A's median latency over B's: above 1 means B is faster."""
    a = as_finite(as_dict(latency.get("A")).get("median_ms"))
    b = as_finite(as_dict(latency.get("B")).get("median_ms"))
    return a / b if a and b and a > 0 and b > 0 else None


def speed_change(ratio: float) -> tuple[str, bool]:
    """B against A as one factor >= 1 with its direction ("3.21× slower", False): the card and
    the headline say the same thing the same way. ``ratio`` is :func:`speedup`'s A / B."""
    faster = ratio >= 1
    factor = ratio if faster else 1 / ratio
    return f"{fmt_ratio(factor)} {'faster' if faster else 'slower'}", faster


def latency_section(
    latency: dict[str, Any], labels: tuple[str, str], note: str | None = None
) -> LatencySection | None:
    a, b = as_dict(latency.get("A")), as_dict(latency.get("B"))
    if not a and not b:
        return None

    def ratio(key: str, invert: bool) -> str:
        va, vb = as_finite(a.get(key)), as_finite(b.get(key))
        if not va or not vb:
            return ""
        return fmt_ratio(va / vb if not invert else vb / va)

    rows = [
        (label, fmt_ms(a.get(key)), fmt_ms(b.get(key)), ratio(key, invert=False))
        for key, label in (*LATENCY_STATS, ("mean_ms", "mean"))
    ]
    rows.append(
        (
            "throughput /s",
            fmt_num(a.get("throughput"), 4),
            fmt_num(b.get("throughput"), 4),
            ratio("throughput", invert=True),
        )
    )
    rows.append(("batch size", fmt_int(a.get("batch_size")), fmt_int(b.get("batch_size")), ""))
    rows.append(("timed runs", fmt_int(a.get("runs")), fmt_int(b.get("runs")), ""))
    colours = (svg.A_COLOUR, svg.B_COLOUR)
    groups = [
        (label, [(labels[0], a.get(key)), (labels[1], b.get(key))]) for key, label in LATENCY_STATS
    ]
    has_ms = any(as_finite(v) is not None for _, bars in groups for _, v in bars)
    throughput = [(labels[0], a.get("throughput")), (labels[1], b.get("throughput"))]
    has_tp = any(as_finite(v) is not None for _, v in throughput)
    return LatencySection(
        columns=("", labels[0], labels[1], "speed-up (A / B)"),
        rows=tuple(rows),
        chart_ms=bar_chart(groups, colours, "ms", "Latency in milliseconds") if has_ms else None,
        chart_throughput=(
            bar_chart(
                [("samples/s", throughput)], colours, "/s", "Throughput in samples per second"
            )
            if has_tp
            else None
        ),
        speedup=speedup(latency),
        note=note,
    )


_TARGET = re.compile(r"^\s*([^<>=\s]+)\s*(?:>=|=|>)\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*$")


def _parse_target(target: Any) -> tuple[str, float | None]:
    """ "top1_agreement=0.99" -> ("top1_agreement", 0.99); anything else keeps its text only."""
    text = str(target) if target is not None else ""
    match = _TARGET.match(text)
    if not match:
        return text or "metric", None
    try:
        return match.group(1), float(match.group(2))
    except ValueError:
        return match.group(1), None


def recovery_section(recovery: dict[str, Any]) -> RecoverySection | None:
    steps = as_records(recovery.get("steps"))
    if not steps:
        return None
    metric, target = _parse_target(recovery.get("target"))
    rows, points, previous = [], [], set()
    for position, step in enumerate(steps):
        kept = [str(k) for k in step.get("kept_high_precision") or []]
        added = [k for k in kept if k not in previous]
        previous = set(kept)
        value = as_finite(step.get("metric"))
        met = step.get("met")
        if not isinstance(
            met, bool
        ):  # older documents: judge here; *_drop metrics: lower is better
            lower_better = metric.endswith("_drop")
            met = (
                target is not None
                and value is not None
                and (value <= target if lower_better else value >= target)
            )
        number = step.get("step", position)
        rows.append(
            (
                number_cell(number, str),
                text_cell(", ".join(added) if added else None, "name"),
                number_cell(len(kept), fmt_int),
                number_cell(step.get("metric"), fmt_num, "good" if met else ""),
                number_cell(step.get("seconds"), lambda v: fmt_fixed(v, 1)),
            )
        )
        points.append((number, step.get("metric"), len(kept)))
    final = tuple(str(k) for k in steps[-1].get("kept_high_precision") or [])
    shown = str(recovery.get("target") or MISSING)
    if metric == MASK_IOU and as_finite(recovery.get("mask_threshold")) is not None:
        shown += f" (decisions at {recovery['mask_threshold']:g})"
    return RecoverySection(
        target=shown,
        chart=recovery_chart(points, target, metric) if len(points) > 1 else None,
        rows=tuple(rows),
        kept_final=final,
    )


def special_ops(results: dict[str, Any], recovery: RecoverySection | None) -> SpecialOps | None:
    excluded = tuple(
        (str(e.get("node", MISSING)), str(e.get("op_type", MISSING)), str(e.get("reason", MISSING)))
        for e in as_records(results.get("excluded"))
    )
    dynamic = tuple(
        (
            text_cell(d.get("node"), "name"),
            text_cell(d.get("data_tensor"), "name"),
            text_cell(d.get("weight_tensor"), "name"),
            text_cell(_yes_no(d.get("quantized"))),
            number_cell(d.get("weight_amax"), fmt_num),
        )
        for d in as_records(results.get("dynamic_weight_convs"))
    )
    kept = recovery.kept_final if recovery else ()
    if not (excluded or dynamic or kept):
        return None
    return SpecialOps(excluded, dynamic, kept)


def _yes_no(value: Any) -> str | None:
    if isinstance(value, bool):
        return "INT8" if value else "kept in high precision"
    return None


_IDENTIFIER_KEYS = ("hash", "fingerprint", "path")


def _fields(
    section: dict[str, Any], known: tuple[tuple[str, str], ...]
) -> list[tuple[str, str, bool]]:
    """(label, value, monospace) for known fields first, then any other scalar the producer
    wrote; hashes, fingerprints and paths are monospace so they can be compared by eye."""
    names = dict(known)
    keys = [key for key, _ in known if key in section] + [
        key
        for key, value in section.items()
        if key not in names and not isinstance(value, dict | list)
    ]
    return [
        (
            names.get(key, key.replace("_", " ")),
            _scalar(section.get(key)),
            any(hint in key for hint in _IDENTIFIER_KEYS),
        )
        for key in keys
    ]


def _scalar(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return fmt_num(value) if isinstance(value, float) else str(value)


def provenance(results: dict[str, Any]) -> dict[str, Any]:
    """Everything needed to reproduce or audit the run, grouped for a two-column layout."""
    model, data = as_dict(results.get("model")), as_dict(results.get("data"))
    run = [
        ("tool version", _scalar(results.get("tool_version")), False),
        ("created", _scalar(results.get("created")), False),
        ("results kind", _scalar(results.get("kind", "compare")), False),
        ("schema version", _scalar(results.get("schema_version")), False),
    ]
    sides_known = (
        ("spec", "spec"),
        ("label", "label"),
        ("backend", "backend"),
        ("provider", "provider"),
        ("threads", "threads"),
        ("method", "calibration method"),
    )
    a, b = as_dict(results.get("a")), as_dict(results.get("b"))
    side_keys = [k for k, _ in sides_known if k in a or k in b]
    side_keys += [
        k
        for k in (*a, *b)
        if k not in side_keys and not isinstance(a.get(k, b.get(k)), dict | list)
    ]
    names = dict(sides_known)
    sides = [
        (names.get(k, k.replace("_", " ")), _scalar(a.get(k)), _scalar(b.get(k)))
        for k in dict.fromkeys(side_keys)
    ]
    return {
        "run": run,
        "model": _fields(
            model,
            (
                ("name", "name"),
                ("path", "path"),
                ("hash", "hash"),
                ("opset", "opset"),
                ("num_nodes", "nodes"),
            ),
        ),
        "data": _fields(
            data,
            (
                ("eval_path", "eval data"),
                ("eval_fingerprint", "eval fingerprint"),
                ("eval_samples", "eval samples"),
                ("calib_path", "calibration data"),
                ("calib_fingerprint", "calibration fingerprint"),
                ("calib_samples", "calibration samples"),
            ),
        ),
        "machine": _fields(
            as_dict(results.get("machine")),
            (
                ("hostname", "host"),
                ("platform", "platform"),
                ("cpu", "CPU"),
                ("cpu_count", "CPU count"),
                ("python", "Python"),
                ("onnxruntime", "onnxruntime"),
                ("tensorrt", "TensorRT"),
            ),
        ),
        "sides": sides if (a or b) else [],
        "method_note": method_note([a.get("method"), b.get("method")]),
        "command": results.get("command") if isinstance(results.get("command"), str) else None,
    }


def _first_output(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first output with an agreement value, undefined ("nan") included."""
    return next((o for o in outputs if as_number(o.get("agreement")) is not None), {})


#: a recognizer's lead figure: the text a greedy CTC decoder reads (``reads_text`` rows)
TEXT_TITLE = "CTC text agreement"


def _agreement_title(output: dict[str, Any]) -> str:
    """What an output's agreement is: argmax (top-1), or equal values (integers)."""
    return "exact agreement" if output.get("agreement_kind") == "exact" else "top-1 agreement"


def _worst_mask(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The probability map with the lowest mask IoU (an undefined one first), or {}."""
    return _worst(outputs, "mask_threshold", MASK_IOU)


def _worst_class_map(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The class map with the lowest mean IoU (an undefined one first), or {}."""
    return _worst(outputs, "iou_classes", MEAN_IOU)


def _worst(outputs: list[dict[str, Any]], marker: str, metric: str) -> dict[str, Any]:
    """Among the outputs that carry ``marker``, the one with the lowest ``metric`` (an
    undefined one first), or {}."""
    carrying = [o for o in outputs if o.get(marker) is not None]

    def rank(o: dict[str, Any]) -> float:
        value = as_finite(o.get(metric))
        return -math.inf if value is None else value

    return min(carrying, key=rank, default={})


def _output_name(output: dict[str, Any], outputs: list[dict[str, Any]]) -> str:
    """An output's name, with its side when both sides were compared."""
    name = str(output.get("name", "?"))
    return f"{name} ({output.get('candidate')})" if len(_sides(outputs)) > 1 else name


def nonfinite_findings(results: dict[str, Any]) -> tuple[str, ...]:
    """One line per output, and one for the layers, that held NaN/Inf: their metrics are
    undefined and every gate reading them fails."""
    lines = []
    for o in as_records(results.get("outputs")):
        if text := nonfinite_sentence(o.get("nonfinite"), str(o.get("candidate") or "B")):
            lines.append(f"output {o.get('name', '?')}: {text}")
    bad = [
        e
        for e in as_records(results.get("layers"))
        if e.get("view", "accumulated") == "accumulated"
        and sum((nonfinite_counts(e.get("nonfinite")) or (0, 0, 0))[:2])
    ]
    if bad:
        first = bad[0]
        lines.append(
            f"{len(bad)} layer(s) hold NaN/Inf, first {first.get('tensor') or first.get('node')}: "
            + nonfinite_sentence(first.get("nonfinite"), str(first.get("candidate") or "B"))
        )
    return tuple(lines)


def verdict_cards(
    results: dict[str, Any],
    layers: LayerSection | None,
    latency: LatencySection | None,
    labels: tuple[str, str],
) -> tuple[Card, ...]:
    """The few numbers a reviewer reads first: agreement, task metric, worst layer, speed."""
    cards = []
    outputs = as_records(results.get("outputs"))
    output = _first_output(outputs)
    if output and output.get("reads_text"):
        detail = f"output {_output_name(output, outputs)} · frames {fmt_pct(output['agreement'])}"
        if as_number(output.get("sequence_agreement")) is not None:
            detail += f" · every frame {fmt_pct(output['sequence_agreement'])}"
        undefined = as_finite(output.get("ctc_agreement")) is None
        text = fmt_pct(output["ctc_agreement"])
        cards.append(Card(TEXT_TITLE, text, detail, "bad" if undefined else ""))
    elif output:
        detail = f"output {_output_name(output, outputs)}"
        if as_finite(output.get("top5_agreement")) is not None:
            detail += f" · top-5 {fmt_pct(output['top5_agreement'])}"
        if as_number(output.get("sequence_agreement")) is not None:
            detail += f" · sequence {fmt_pct(output['sequence_agreement'])}"
        if as_number(output.get("ctc_agreement")) is not None:
            detail += f" · CTC {fmt_pct(output['ctc_agreement'])}"
        undefined = as_finite(output.get("agreement")) is None
        cards.append(
            Card(
                _agreement_title(output).capitalize(),
                fmt_pct(output["agreement"]),
                detail,
                "bad" if undefined else "",
            )
        )
    mask = _worst_mask(outputs)
    if mask:
        maps = sum(o.get("mask_threshold") is not None for o in outputs)
        detail = f"output {_output_name(mask, outputs)}, decisions at {mask['mask_threshold']}"
        detail += f" · worst of {maps} probability maps" if maps > 1 else ""
        undefined = as_finite(mask.get(MASK_IOU)) is None
        cards.append(
            Card("Mask IoU", fmt_pct(mask.get(MASK_IOU)), detail, "bad" if undefined else "")
        )
    if seg := _worst_class_map(outputs):
        detail = f"output {_output_name(seg, outputs)}, over {seg['iou_classes']} classes"
        bad = "bad" if as_finite(seg.get(MEAN_IOU)) is None else ""
        cards.append(Card("Mean IoU", fmt_pct(seg.get(MEAN_IOU)), detail, bad))
    nonfinite = nonfinite_findings(results)
    if nonfinite:
        cards.append(Card("NaN/Inf", f"{len(nonfinite)} finding(s)", nonfinite[0], "bad"))
    guard = guard_section(results, labels)
    if guard is not None and guard.count:
        cards.append(Card("Clipping guard", f"{guard.count} flag(s)", guard.headline, "bad"))
    for row in task_rows(as_dict(results.get("task")))[:2]:
        cards.append(
            Card(row.metric.capitalize(), row.b, f"{row.delta} vs {labels[0]} ({row.a})", row.tone)
        )
    speed = _speed_card(results, latency, labels)
    demoted = bool(latency and latency.note)  # not TensorRT's speed: after the accuracy
    if speed and not demoted:
        cards.append(speed)
    if layers and layers.worst:
        worst = layers.worst[0]
        cards.append(
            Card(
                f"Worst layer ({layers.ranked_view})",
                fmt_db(worst.sqnr),
                f"{worst.candidate + ' · ' if layers.both else ''}"
                f"{worst.tensor or worst.node} · {worst.op_type}",
                "bad" if worst.sqnr is None or math.isnan(worst.sqnr) else "",
            )
        )
    if speed and demoted:
        cards.append(speed)
    return tuple(cards)


def _speed_card(
    results: dict[str, Any], latency: LatencySection | None, labels: tuple[str, str]
) -> Card | None:
    """B's median latency against A's. Timed on a TensorRT engine it is a verdict (good / bad);
    timed in onnxruntime it is a secondary card saying what was timed, neither good nor bad."""
    if not latency or latency.speedup is None:
        return None
    change, faster = speed_change(latency.speedup)
    lat = as_dict(results.get("latency"))
    detail = (
        f"median {fmt_ms(as_dict(lat.get('A')).get('median_ms'))} → "
        f"{fmt_ms(as_dict(lat.get('B')).get('median_ms'))}"
    )
    if latency.note:
        return Card(
            f"Median latency, {labels[1]} vs {labels[0]}",
            change,
            f"{latency.note} · {detail}",
            "secondary",
        )
    label = f"Median latency, {labels[1]} vs {labels[0]}"
    return Card(label, change, detail, "good" if faster else "bad")


def calibration_cards(
    results: dict[str, Any], calibration: CalibrationSection | None
) -> tuple[Card, ...]:
    """Headline numbers of a calibration-only report."""
    data = as_dict(results.get("data"))
    cards = [
        Card(
            "Calibration samples",
            fmt_int(data.get("calib_samples")),
            str(data.get("calib_path") or ""),
        )
    ]
    if calibration:
        cards.append(Card("Tensors calibrated", fmt_int(calibration.tensor_count)))
        written = results.get("written")
        written = written if isinstance(written, list) else []
        if calibration.method_used or len(written) <= 1:
            cards.append(
                Card(
                    "Method used",
                    calibration.method_used or MISSING,
                    f"{len(calibration.methods)} methods compared",
                )
            )
        else:  # -m all: one table per method, none of them "the one used"
            cards.append(Card("Tables written", fmt_int(len(written)), "one per method"))
        bad = len(calibration.warnings)
        cards.append(Card("Tensors with NaN/Inf", fmt_int(bad), "", "bad" if bad else "good"))
    guard = guard_section(results)
    if guard is not None and guard.count:
        cards.append(Card("Clipping guard", f"{guard.count} flag(s)", guard.headline, "bad"))
    return tuple(cards)


def headline(results: dict[str, Any], labels: tuple[str, str], latency: LatencySection | None):
    """One sentence a reviewer can paste: what was compared and how B fared against A."""
    parts = []
    outputs = as_records(results.get("outputs"))
    output = _first_output(outputs)
    if output and output.get("reads_text"):
        name = _output_name(output, outputs)
        frames = fmt_pct(output["agreement"])
        parts.append(f"{TEXT_TITLE} {fmt_pct(output['ctc_agreement'])} on {name} (frames {frames})")
    elif output:
        name = _output_name(output, outputs)
        parts.append(f"{_agreement_title(output)} {fmt_pct(output['agreement'])} on {name}")
    if mask := _worst_mask(outputs):
        name = _output_name(mask, outputs)
        parts.append(f"mask IoU {fmt_pct(mask.get(MASK_IOU))} on {name}")
    if seg := _worst_class_map(outputs):
        parts.append(f"mean IoU {fmt_pct(seg.get(MEAN_IOU))} on {_output_name(seg, outputs)}")
    if nonfinite_findings(results):
        parts.append("NaN/Inf seen: some metrics are undefined")
    for row in task_rows(as_dict(results.get("task")))[:1]:
        parts.append(f"{row.metric} {row.a} → {row.b} ({row.delta})")
    if latency and latency.speedup is not None and not latency.note:  # a TensorRT engine's
        parts.append(f"{speed_change(latency.speedup)[0]} at the median")
    subject = f"{labels[1]} vs {labels[0]}"
    return subject + (": " + "; ".join(parts) + "." if parts else ".")


def gate_summary(thresholds: tuple[ThresholdRow, ...], status: str) -> str:
    """What the badge means, in words."""
    judged = [t for t in thresholds if t.passed is not None]
    missed = [t for t in judged if not t.passed]
    if status == "none":
        return "No thresholds were set, so this run has no pass/fail verdict."
    if missed:
        return f"{len(missed)} of {len(judged)} thresholds missed: " + ", ".join(
            t.metric for t in missed
        )
    if status == "fail":
        return "Recorded as failed by quantbench; no threshold row says which gate."
    if judged:
        return f"All {len(judged)} thresholds met."
    return "Recorded as passed by quantbench."


def build_view(results: dict[str, Any]) -> dict[str, Any]:
    """The template's context for one results document."""
    kind = results.get("kind", "compare")
    model = as_dict(results.get("model"))
    a, b = as_dict(results.get("a")), as_dict(results.get("b"))
    labels = (side_label(a, "A"), side_label(b, "B"))
    thresholds = as_records(results.get("thresholds"))
    layers = layer_section(as_records(results.get("layers")))
    latency = latency_section(as_dict(results.get("latency")), labels, timing_note(results))
    recovery = recovery_section(as_dict(results.get("recovery")))
    calibration = calibration_section(
        as_dict(results.get("calibration")),
        layers.worst if layers else (),
        layers.ranked_view if layers else "isolated",
        flagged_tensors(results),
    )
    model_name = model.get("name") or model.get("path") or "model"
    cards = (
        calibration_cards(results, calibration)
        if kind == "calibration"
        else verdict_cards(results, layers, latency, labels)
    )
    status = overall_status(results, thresholds)
    gates = threshold_rows(thresholds)
    return {
        "kind": kind,
        "headline": headline(results, labels, latency),
        "gate_summary": gate_summary(gates, status),
        "model_name": str(model_name),
        "labels": labels,
        "created": results.get("created"),
        "tool_version": results.get("tool_version"),
        "status": status,
        "cards": cards,
        "thresholds": gates,
        "task": task_rows(as_dict(results.get("task"))),
        "output_columns": output_columns(as_records(results.get("outputs"))),
        "outputs": output_rows(as_records(results.get("outputs"))),
        "nonfinite": nonfinite_findings(results),
        "guard": guard_section(results, labels),
        "layers": layers,
        "calibration": calibration,
        "refinement": refinement_section(results, labels),
        "special": special_ops(results, recovery),
        "latency": latency,
        "recovery": recovery,
        "provenance": provenance(results),
    }
