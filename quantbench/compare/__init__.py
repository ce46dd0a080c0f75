"""``compare``: the Python twin of ``quantbench compare A B``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantbench.calibrate import obtain_stats
from quantbench.compare.candidates import CalibrationContext
from quantbench.compare.run import run_comparison
from quantbench.data import open_data
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path
from quantbench.graph import calibration_tensors, open_graph
from quantbench.results import (
    apply_gates,
    base_document,
    calibration_section,
    parse_gate,
    write_json,
    write_layers_csv,
)
from quantbench.table.codecs import read_table

__all__ = ["compare", "load_labels"]


def load_labels(labels: str | Path | np.ndarray | None) -> np.ndarray | None:
    """Integer labels from a ``.npy`` (or an array, from Python), checked to be 1-D."""
    if labels is None:
        return None
    where = "labels" if isinstance(labels, np.ndarray) else str(labels)
    array = labels if isinstance(labels, np.ndarray) else _read_labels(Path(labels))
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise QuantbenchError(
            f"{where}: labels must be a 1-D integer array, got {array.dtype}{list(array.shape)}"
        )
    return array


def _read_labels(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise QuantbenchError(f"{path}: labels file not found") from None
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{path}: not a readable .npy of labels ({exc})") from None


def compare(
    a: str,
    b: str,
    *,
    model: str | Path,
    data: object,
    calib_data: object | None = None,
    method: str = "entropy",
    table: str | Path | None = None,
    stats: str | Path | None = None,
    labels: str | Path | None = None,
    exclude: list[str] | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    calib_max_samples: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
    latency: bool = True,
    latency_runs: int = 100,
    fail_below: list[str] | None = None,
    json_path: str | Path | None = None,
    csv_path: str | Path | None = None,
    report_path: str | Path | None = None,
    command: str = "",
    show_progress: bool = True,
) -> dict[str, Any]:
    """Compare precision ``a`` against ``b`` on ``data``; returns the results document."""
    gates = [parse_gate(g) for g in fail_below or []]
    for p in (json_path, csv_path, report_path):
        if p is not None:
            check_output_path(p)
    graph = open_graph(model)
    label_array = load_labels(labels)
    source = open_data(
        data, graph.inputs, batch_size=batch_size, max_samples=max_samples, preset=preset
    )
    if (
        label_array is not None
        and source.num_samples is not None
        and len(label_array) != source.num_samples
    ):
        raise QuantbenchError(
            f"{labels}: {len(label_array)} labels for {source.num_samples} evaluation samples"
        )
    needs_int8 = any(s.lower().startswith("int8") for s in (a, b))
    ctx = CalibrationContext(default_method=method, exclude=list(exclude or []), holdout=calib_data)
    stats_file = None
    if table is not None:
        ctx.table = read_table(table)
    if needs_int8 and (calib_data is not None or stats is not None):
        stats_file, _, _ = obtain_stats(
            graph,
            calib_data,
            tensors="quantizable",
            stats=stats,
            batch_size=batch_size,
            max_samples=calib_max_samples,
            preset=preset,
            provider=provider,
            show_progress=show_progress,
        )
        ctx.stats = stats_file
    body = run_comparison(
        graph,
        source,
        (a, b),
        ctx,
        labels=label_array,
        provider=provider,
        threads=threads,
        latency=latency,
        latency_runs=latency_runs,
        show_progress=show_progress,
    )
    doc = base_document("compare", graph, command or f"quantbench compare {a} {b} --model {model}")
    doc["data"] = {
        "eval_path": str(data) if isinstance(data, (str, Path)) else type(data).__name__,
        "eval_fingerprint": source.fingerprint,
        "eval_samples": body.pop("eval_samples"),
        "calib_path": str(calib_data) if isinstance(calib_data, (str, Path)) else None,
        "calib_fingerprint": stats_file.data_fingerprint if stats_file else None,
        "calib_samples": stats_file.num_samples if stats_file else None,
    }
    method_used = body.pop("method_used")
    doc.update(body)
    if stats_file is not None:
        doc["calibration"] = calibration_section(
            stats_file, calibration_tensors(graph, "quantizable"), method_used
        )
    apply_gates(doc, gates)
    if json_path is not None:
        write_json(doc, json_path)
    if csv_path is not None:
        write_layers_csv(doc, csv_path)
    if report_path is not None:
        from quantbench.reports import write_report

        write_report(doc, report_path)
    return doc
