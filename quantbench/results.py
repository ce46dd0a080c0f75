"""The results document (schema ``quantbench-results``, version 1): the input of the report.

Every field is documented in the README ("Results JSON"). ``compare`` and ``calibrate
--report`` build it here; JSON and the per-layer CSV (pandas) are written atomically.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import re
from pathlib import Path
from typing import Any

import numpy as np

from quantbench import __version__
from quantbench import calibrators as registry
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    MASK_IOU,
    MEAN_IOU,
    SEQUENCE_KEYS,
    lower_is_better,
    model_metrics,
    nonfinite_text,
)
from quantbench.fileio import atomic_path, write_text_atomic
from quantbench.jsonsafe import dumps, from_json_float, json_float
from quantbench.model.graph import Graph
from quantbench.stats.tensorstats import StatsFile

SCHEMA = "quantbench-results"
SCHEMA_VERSION = 1
HISTOGRAM_BINS = 128

#: --fail-below built-in metric names (a --metric-script adds its own; see apply_gates).
GATE_METRICS = (
    "top1_agreement",
    "top5_agreement",
    "sequence_agreement",
    "ctc_agreement",
    MASK_IOU,
    MEAN_IOU,
    "accuracy",
    "accuracy_delta",
    "cosine",
    "sqnr_db",
    "min_layer_sqnr_db",
)

#: the gates read from the outputs' rows (:func:`quantbench.evaluate.metrics.model_metrics`)
_OUTPUT_GATES = (
    *("top1_agreement", "top5_agreement", *SEQUENCE_KEYS, MASK_IOU, MEAN_IOU),
    *("cosine", "sqnr_db"),
)


def machine_info() -> dict[str, Any]:
    import onnxruntime

    try:
        import tensorrt  # type: ignore[import-not-found]

        trt_version = tensorrt.__version__
    except ImportError:
        trt_version = None
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "tensorrt": trt_version,
    }


def model_info(graph: Graph) -> dict[str, Any]:
    return {
        "path": str(graph.path or ""),
        "name": graph.name,
        "hash": graph.hash,
        "opset": graph.opset,
        "num_nodes": len(graph.model.graph.node),
    }


def base_document(kind: str, graph: Graph, command: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "model": model_info(graph),
        "machine": machine_info(),
    }


def calibration_section(
    stats: StatsFile,
    tensors: list[str] | None,
    method_used: str | None,
    methods: list[str] | None = None,
) -> dict[str, Any]:
    """amax per method per tensor and a compact |x| histogram, for the report's calibration part."""
    method_list = registry.expand_methods(methods or ["all"])
    names = [t for t in (tensors or list(stats.tensors)) if t in stats.tensors]
    rows = []
    for name in names:
        t = stats[name]
        amax = {
            m: (None if t.count == 0 else _finite(registry.compute_amax(m, t)))
            for m in method_list
        }
        upper = t.max_abs
        hist = (
            t.abs_histogram(HISTOGRAM_BINS, upper)
            if t.count and upper > 0
            else np.zeros(HISTOGRAM_BINS)
        )
        rows.append(
            {
                **{k: _finite(v) for k, v in t.summary().items()},
                "name": name,
                "amax": amax,
                "used_method": method_used,
                "histogram": {"upper": upper, "counts": [round(float(c), 2) for c in hist]},
            }
        )
    return {
        "methods": method_list,
        "method_used": method_used,
        "tensors": rows,
        "num_samples": stats.num_samples,
        "data_fingerprint": stats.data_fingerprint,
    }


def calibration_results(
    model: str | Path | Graph, result: Any, command: str = ""
) -> dict[str, Any]:
    """Results document of ``calibrate --report`` (kind = calibration)."""
    from quantbench.model.graph import open_graph

    graph = model if isinstance(model, Graph) else open_graph(model)
    doc = base_document("calibration", graph, command)
    methods = list(result.tables)
    doc["data"] = {
        "calib_fingerprint": result.stats.data_fingerprint,
        "calib_samples": result.stats.num_samples,
    }
    # with several methods (-m all) no one method is "the one used": each table was written
    used = methods[0] if len(methods) == 1 else None
    doc["calibration"] = calibration_section(result.stats, None, used)
    doc["calibration"]["clip_warn"] = result.clip_warn
    doc["calibration"]["clipping"] = [
        {"candidate": m, **f.to_dict()} for m, flags in result.clipping.items() for f in flags
    ]
    if result.auto is not None:
        doc["calibration"]["auto"] = result.auto.to_dict()
    doc["written"] = [str(p) for p in result.written]
    return doc


def _finite(v: Any) -> Any:
    """Non-finite floats as quantbench's JSON strings (see quantbench.jsonsafe)."""
    return json_float(v) if isinstance(v, float) else v


# --------------------------------------------------------------------------- gates


def parse_gate(text: str, custom: bool = False) -> tuple[str, float]:
    """``"cosine=0.999"`` -> ("cosine", 0.999). ``custom``: a metric script may add names."""
    name, sep, value = text.partition("=")
    name = name.strip()
    known = name in GATE_METRICS or (custom and _GATE_NAME.match(name) is not None)
    if not sep or not known:
        extra = " or a name your --metric-script returns" if custom else ""
        raise QuantbenchError(
            f"--fail-below {text!r}: expected METRIC=VALUE with METRIC one of "
            + ", ".join(GATE_METRICS)
            + extra
        )
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isnan(number):
        raise QuantbenchError(f"--fail-below {text!r}: {value!r} is not a number") from None
    return name, number


def gate_value(doc: dict[str, Any], metric: str, side: str = "B") -> float | None:
    """The value a gate judges; ``None`` when undefined (NaN/Inf, not applicable): it fails.

    Output metrics are the worst output's (:func:`quantbench.evaluate.metrics.model_metrics`);
    ``min_layer_sqnr_db`` is undefined when any layer is; other names are task metrics
    (``accuracy``, a metric script's numbers).
    """
    if metric in _OUTPUT_GATES:
        return model_metrics(_side_rows(doc.get("outputs"), side))[metric]
    if metric == "min_layer_sqnr_db":
        vals = [_metric_number(r.get("sqnr_db")) for r in _accumulated_layers(doc, side)]
        return None if not vals or any(v is None for v in vals) else min(vals)  # type: ignore[type-var]
    if metric == "accuracy_delta":
        return _metric_number(_task_entry(doc, "accuracy").get("delta"))
    return _metric_number(_task_entry(doc, metric).get(side))


def gate_reason(doc: dict[str, Any], metric: str, side: str = "B") -> str:
    """Why a gate's value is undefined, in words ('' when nothing specific is known)."""
    rows = _side_rows(doc.get("outputs"), side)
    if metric == "min_layer_sqnr_db":
        bad = [
            r for r in _accumulated_layers(doc, side) if _metric_number(r.get("sqnr_db")) is None
        ]
        if not bad:
            return "no layer was compared"
        first = bad[0]
        what = nonfinite_text(first.get("nonfinite") or {}) or "undefined"
        return f"{len(bad)} layer(s) undefined, first {first.get('tensor')}: {what}"
    parts = []
    for r in rows:
        text = nonfinite_text(r.get("nonfinite") or {})
        if text:
            parts.append(f"output {r.get('name')}: {text}")
    if metric.endswith("agreement") and not parts:
        parts.extend(
            f"output {r.get('name')}: {r['agreement_note']}"
            for r in rows
            if r.get("agreement_note")
        )
    if metric not in GATE_METRICS and metric not in (doc.get("task") or {}):
        parts.append("the metric script did not return it")
    return "; ".join(parts)


def apply_gates(doc: dict[str, Any], gates: list[tuple[str, float]]) -> None:
    """Judge every gate: higher is better, except names ending in ``_drop`` (a maximum). An
    undefined value fails, with the reason."""
    task = doc.get("task") or {}
    for metric, _ in gates:
        if metric not in GATE_METRICS and metric not in task:
            returned = [k for k in task if k != "accuracy"]
            raise QuantbenchError(
                f"--fail-below {metric}: the metric script {doc.get('metric_script') or ''} "
                f"returned no {metric!r} (it returned {', '.join(returned) or 'nothing'})"
            )
    rows = []
    for metric, bound in gates:
        value = gate_value(doc, metric)
        lower = lower_is_better(metric)
        passed = value is not None and (value <= bound if lower else value >= bound)
        row: dict[str, Any] = {"metric": metric, "max" if lower else "min": bound}
        row.update({"value": value, "passed": passed})
        if value is None:
            row["reason"] = gate_reason(doc, metric) or "undefined"
        rows.append(row)
    doc["thresholds"] = rows
    doc["passed"] = all(r["passed"] for r in rows)


def gate_failures(doc: dict[str, Any]) -> str:
    """One line naming every missed gate (the CLI's exit-1 message)."""
    missed = []
    for t in doc.get("thresholds", []):
        if t["passed"]:
            continue
        bound = f"> {t['max']}" if "max" in t else f"< {t['min']}"
        value = "undefined" if t["value"] is None else f"{t['value']:.6g}"
        reason = f" ({t['reason']})" if t.get("reason") else ""
        missed.append(f"{t['metric']}={value} {bound}{reason}")
    return "gate missed: " + ", ".join(missed)


_GATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _metric_number(value: Any) -> float | None:
    """A JSON metric value as a float; undefined ("nan"), null or text -> None."""
    number = from_json_float(value)
    return None if number is None or math.isnan(number) else number


def _side_rows(rows: Any, side: str) -> list[dict[str, Any]]:
    return [r for r in rows or [] if isinstance(r, dict) and r.get("candidate") == side]


def _accumulated_layers(doc: dict[str, Any], side: str) -> list[dict[str, Any]]:
    return [r for r in _side_rows(doc.get("layers"), side) if r.get("view") == "accumulated"]


def _task_entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    entry = (doc.get("task") or {}).get(name)
    return entry if isinstance(entry, dict) else {}


# --------------------------------------------------------------------------- files


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Strict JSON, atomically; infinities and NaN anywhere become "inf"/"-inf"/"nan"."""
    return write_text_atomic(path, dumps(doc))


def _csv_row(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer with its NaN/Inf counts as two flat columns (``nonfinite`` is an object)."""
    counts = layer.get("nonfinite") or {}
    return {
        **layer,
        "nonfinite_fp32": counts.get("fp32"),
        "nonfinite_candidate": counts.get("candidate"),
    }


def write_layers_csv(doc: dict[str, Any], path: str | Path) -> Path:
    """The ``layers`` table as CSV: undefined metrics are the text ``nan`` (as in the JSON),
    NaN/Inf counts in ``nonfinite_fp32`` / ``nonfinite_candidate``."""
    import pandas as pd

    columns = [
        "candidate",
        "index",
        "tensor",
        "node",
        "op_type",
        "view",
        "quantized",
        "precision",
        "cosine",
        "sqnr_db",
        "rel_l2",
        "max_abs",
        "mean_abs",
        "nonfinite_fp32",
        "nonfinite_candidate",
        "clip_fraction",
        "amax",
    ]
    rows = [_csv_row(r) for r in doc.get("layers", [])]
    frame = pd.DataFrame(rows, columns=columns)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)
