"""Layer sensitivity: what each quantized op costs at the model outputs.

Two views per op of the full INT8 plan, both scored against the FP32 outputs:

* ``only_quantized``: that op alone in INT8 (every other op excluded) — the damage it does;
* ``only_fp32``: every op in INT8 except that one — what keeping it in high precision buys.

Cost model: 2 x num_ops Q/DQ model builds and evaluations (one pass over the evaluation data
each), plus one FP32 pass whose outputs every evaluation reuses. It runs sequentially: the
evaluation already uses every core through onnxruntime's intra-op threads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from quantbench.calibrators import DEFAULT_METHOD
from quantbench.compare import load_labels
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph, open_graph
from quantbench.progress import progress_bar
from quantbench.recovery.context import RecoveryContext, prepare
from quantbench.recovery.evaluation import (
    METRICS,
    RESERVED,
    badness,
    check_declared,
    json_metrics,
)
from quantbench.task_metrics import load_metric_script

VIEWS = ("only_quantized", "only_fp32")
RANK_METRICS = ("sqnr_db", "cosine", "top1_agreement", "top5_agreement", "sequence_agreement")


def check_rank_metric(metric: str, has_labels: bool, custom: bool = False) -> None:
    """A known ranking metric (a metric script's names are checked once FP32 has run)."""
    allowed = RANK_METRICS + (("accuracy", "accuracy_drop") if has_labels else ())
    if metric in allowed or (custom and metric not in METRICS):
        return
    extra = " or a name your --metric-script returns" if custom else ""
    raise QuantbenchError(f"--metric {metric!r}: choose one of {', '.join(allowed)}{extra}")


def rank_ops(
    ctx: RecoveryContext,
    metric: str,
    views: tuple[str, ...] = VIEWS,
    show_progress: bool = False,
) -> list[dict[str, Any]]:
    """One row per quantized op with the metrics of each view, worst ``only_quantized`` first."""
    rows = []
    ops = {q.node: q.op_type for q in ctx.plan.quantized}
    with progress_bar("Sensitivity", total=len(ops) * len(views), show=show_progress) as advance:
        for node, op_type in ops.items():
            row: dict[str, Any] = {"node": node, "op_type": op_type}
            start = time.perf_counter()
            for view in views:
                if view == "only_quantized":
                    variant = ctx.quantize_only(node)
                else:
                    variant = ctx.quantize_except([node])
                row[view] = ctx.evaluator.evaluate(variant.model)
                row[f"{view}_nodes"] = len(variant.quantized)
                advance(1)
            row["seconds"] = time.perf_counter() - start
            rows.append(row)
    key_view = views[0]
    rows.sort(key=lambda r: badness(r[key_view], metric), reverse=True)
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
        for view in views:
            row[view] = json_metrics(row[view])
    return rows


def sensitivity(
    model: str | Path | Graph,
    calib_data: object,
    eval_data: object,
    method: str = DEFAULT_METHOD,
    metric: str = "sqnr_db",
    max_samples: int | None = None,
    *,
    labels: str | Path | np.ndarray | None = None,
    metric_script: str | Path | None = None,
    exclude: list[str] | None = None,
    holdout_data: object | None = None,
    batch_size: int | None = None,
    calib_max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    threads: int | None = None,
    show_progress: bool = False,
) -> list[dict[str, Any]]:
    """Rank every quantized op of ``model`` by the output drift it causes (worst first).

    Each row: ``rank``, ``node``, ``op_type``, ``only_quantized`` and ``only_fp32`` (metric
    dicts: top1/top5 agreement, cosine, sqnr_db, and accuracy/accuracy_drop with labels),
    ``seconds``.
    """
    script = None if metric_script is None else load_metric_script(metric_script, RESERVED)
    check_rank_metric(metric, labels is not None, custom=script is not None)
    graph = model if isinstance(model, Graph) else open_graph(model)
    label_array = load_labels(labels)
    check_declared(graph, metric, label_array, "--metric")  # before calibration
    ctx = prepare(
        graph,
        calib_data,
        eval_data,
        method=method,
        labels=label_array,
        exclude=exclude or (),
        holdout_data=holdout_data,
        batch_size=batch_size,
        max_samples=max_samples,
        calib_max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        show_progress=show_progress,
    )
    ctx.evaluator.attach_script(script)
    ctx.evaluator.require(metric, "--metric")  # after the FP32 pass, before any variant
    return rank_ops(ctx, metric, show_progress=show_progress)
