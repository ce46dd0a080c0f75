"""The results document (schema ``quantbench-results``, version 1): the input of the report.

Every field is documented in the README ("Results JSON"). ``compare`` and ``calibrate
--report`` build it here; JSON and the per-layer CSV (pandas) are written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from quantbench import __version__
from quantbench import calibrators as registry
from quantbench.errors import QuantbenchError
from quantbench.fileio import atomic_path, write_text_atomic
from quantbench.graph import Graph
from quantbench.stats import StatsFile

SCHEMA = "quantbench-results"
SCHEMA_VERSION = 1
HISTOGRAM_BINS = 128

#: --fail-below metric names and where they are read from.
GATE_METRICS = (
    "top1_agreement",
    "top5_agreement",
    "accuracy",
    "accuracy_delta",
    "cosine",
    "sqnr_db",
    "min_layer_sqnr_db",
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
            m: (None if t.has_nonfinite else _finite(registry.compute_amax(m, t)))
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
    from quantbench.graph import open_graph

    graph = model if isinstance(model, Graph) else open_graph(model)
    doc = base_document("calibration", graph, command)
    methods = list(result.tables)
    doc["data"] = {
        "calib_fingerprint": result.stats.data_fingerprint,
        "calib_samples": result.stats.num_samples,
    }
    doc["calibration"] = calibration_section(result.stats, None, methods[0] if methods else None)
    doc["written"] = [str(p) for p in result.written]
    return doc


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


# --------------------------------------------------------------------------- gates


def parse_gate(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in GATE_METRICS:
        raise QuantbenchError(
            f"--fail-below {text!r}: expected METRIC=VALUE with METRIC one of "
            + ", ".join(GATE_METRICS)
        )
    try:
        return name, float(value)
    except ValueError:
        raise QuantbenchError(f"--fail-below {text!r}: {value!r} is not a number") from None


def gate_value(doc: dict[str, Any], metric: str, side: str = "B") -> float | None:
    outputs = [o for o in doc.get("outputs", []) if o.get("candidate") == side]
    first = outputs[0] if outputs else {}
    acc = doc.get("task", {}).get("accuracy", {})
    if metric == "top1_agreement":
        return first.get("agreement")
    if metric == "top5_agreement":
        return first.get("top5_agreement")
    if metric == "accuracy":
        return acc.get(side)
    if metric == "accuracy_delta":
        return acc.get("delta")
    if metric in ("cosine", "sqnr_db"):
        v = first.get(metric)
        return math.inf if v == "inf" else v
    if metric == "min_layer_sqnr_db":
        vals = [
            r["sqnr_db"]
            for r in doc.get("layers", [])
            if r.get("candidate") == side
            and r.get("view") == "accumulated"
            and isinstance(r.get("sqnr_db"), (int, float))
        ]
        return min(vals) if vals else None
    return None


def apply_gates(doc: dict[str, Any], gates: list[tuple[str, float]]) -> None:
    rows = []
    for metric, minimum in gates:
        value = gate_value(doc, metric)
        rows.append(
            {
                "metric": metric,
                "min": minimum,
                "value": value,
                "passed": value is not None and value >= minimum,
            }
        )
    doc["thresholds"] = rows
    doc["passed"] = all(r["passed"] for r in rows)


# --------------------------------------------------------------------------- files


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    return write_text_atomic(
        path, json.dumps(doc, indent=2, default=_json_default, allow_nan=False) + "\n"
    )


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, Path):
        return str(v)
    raise TypeError(type(v).__name__)


def write_layers_csv(doc: dict[str, Any], path: str | Path) -> Path:
    import pandas as pd

    columns = [
        "candidate",
        "index",
        "tensor",
        "node",
        "op_type",
        "view",
        "quantized",
        "cosine",
        "sqnr_db",
        "rel_l2",
        "max_abs",
        "mean_abs",
        "clip_fraction",
        "amax",
    ]
    frame = pd.DataFrame(doc.get("layers", []), columns=columns)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)
