"""Turn a results document into what the template shows, section by section.

All judgement about the document (what passed, what is worth a headline, which numbers read as
percentages) lives here in Python where it is tested; the template only lays it out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from quantbench.reports import svg
from quantbench.reports.calibration import CalibrationSection, calibration_section
from quantbench.reports.charts import bar_chart, recovery_chart
from quantbench.reports.formatting import (
    MISSING,
    as_finite,
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
)
from quantbench.reports.layers import LayerSection, layer_section
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
    """ "pass", "fail", or "none" when no gate was set (the report then claims no verdict)."""
    passed = results.get("passed")
    if isinstance(passed, bool):
        return "pass" if passed else "fail"
    flags = [t.get("passed") for t in thresholds if isinstance(t.get("passed"), bool)]
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


def threshold_rows(thresholds: list[dict[str, Any]]) -> tuple[ThresholdRow, ...]:
    return tuple(
        ThresholdRow(
            metric=str(t.get("metric", MISSING)),
            rule=_rule(t),
            value=fmt_metric(str(t.get("metric", "")), t.get("value")),
            passed=t.get("passed") if isinstance(t.get("passed"), bool) else None,
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
        tone = "" if change is None or change == 0 else ("good" if change > 0 else "bad")
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


def output_rows(outputs: list[dict[str, Any]]) -> tuple[tuple[Cell, ...], ...]:
    return tuple(
        (
            text_cell(o.get("name"), "name"),
            number_cell(o.get("agreement"), fmt_pct),
            number_cell(o.get("top5_agreement"), fmt_pct),
            number_cell(o.get("cosine"), lambda v: fmt_fixed(v, 6)),
            number_cell(o.get("sqnr_db"), lambda v: fmt_fixed(v, 1)),
            number_cell(o.get("rel_l2"), lambda v: fmt_sig(v, 3)),
            number_cell(o.get("max_abs"), lambda v: fmt_sig(v, 3)),
            number_cell(o.get("mean_abs"), lambda v: fmt_sig(v, 3)),
        )
        for o in outputs
    )


OUTPUT_COLUMNS = (
    Column("Output", "str"),
    Column("Top-1 agreement", "num", "share of samples where A and B pick the same class"),
    Column("Top-5 agreement", "num", "share of samples where A's top class is in B's top 5"),
    Column("Cosine"),
    Column("SQNR dB"),
    Column("Rel. L2"),
    Column("Max |Δ|"),
    Column("Mean |Δ|"),
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


def latency_section(latency: dict[str, Any], labels: tuple[str, str]) -> LatencySection | None:
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
    return RecoverySection(
        target=str(recovery.get("target") or MISSING),
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
        "command": results.get("command") if isinstance(results.get("command"), str) else None,
    }


def _first_output(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return next((o for o in outputs if as_finite(o.get("agreement")) is not None), {})


def verdict_cards(
    results: dict[str, Any],
    layers: LayerSection | None,
    latency: LatencySection | None,
    labels: tuple[str, str],
) -> tuple[Card, ...]:
    """The few numbers a reviewer reads first: agreement, task metric, worst layer, speed."""
    cards = []
    output = _first_output(as_records(results.get("outputs")))
    if output:
        detail = f"output {output.get('name', '?')}"
        if as_finite(output.get("top5_agreement")) is not None:
            detail += f" · top-5 {fmt_pct(output['top5_agreement'])}"
        cards.append(Card("Top-1 agreement", fmt_pct(output["agreement"]), detail))
    for row in task_rows(as_dict(results.get("task")))[:2]:
        cards.append(
            Card(row.metric.capitalize(), row.b, f"{row.delta} vs {labels[0]} ({row.a})", row.tone)
        )
    if latency and latency.speedup is not None:
        change, faster = speed_change(latency.speedup)
        lat = as_dict(results.get("latency"))
        detail = (
            f"median {fmt_ms(as_dict(lat.get('A')).get('median_ms'))} → "
            f"{fmt_ms(as_dict(lat.get('B')).get('median_ms'))}"
        )
        cards.append(
            Card(
                f"Median latency, {labels[1]} vs {labels[0]}",
                change,
                detail,
                "good" if faster else "bad",
            )
        )
    if layers and layers.worst:
        worst = layers.worst[0]
        cards.append(
            Card(
                f"Worst layer ({layers.ranked_view})",
                fmt_db(worst.sqnr),
                f"{worst.tensor or worst.node} · {worst.op_type}",
            )
        )
    return tuple(cards)


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
        cards.append(
            Card(
                "Method used",
                calibration.method_used or MISSING,
                f"{len(calibration.methods)} methods compared",
            )
        )
        bad = len(calibration.warnings)
        cards.append(Card("Tensors with NaN/Inf", fmt_int(bad), "", "bad" if bad else "good"))
    return tuple(cards)


def headline(results: dict[str, Any], labels: tuple[str, str], latency: LatencySection | None):
    """One sentence a reviewer can paste: what was compared and how B fared against A."""
    parts = []
    output = _first_output(as_records(results.get("outputs")))
    if output:
        parts.append(f"top-1 agreement {fmt_pct(output['agreement'])} on {output.get('name', '?')}")
    for row in task_rows(as_dict(results.get("task")))[:1]:
        parts.append(f"{row.metric} {row.a} → {row.b} ({row.delta})")
    if latency and latency.speedup is not None:
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
    latency = latency_section(as_dict(results.get("latency")), labels)
    recovery = recovery_section(as_dict(results.get("recovery")))
    calibration = calibration_section(
        as_dict(results.get("calibration")),
        layers.worst if layers else (),
        layers.ranked_view if layers else "isolated",
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
        "output_columns": OUTPUT_COLUMNS,
        "outputs": output_rows(as_records(results.get("outputs"))),
        "layers": layers,
        "calibration": calibration,
        "special": special_ops(results, recovery),
        "latency": latency,
        "recovery": recovery,
        "provenance": provenance(results),
    }
