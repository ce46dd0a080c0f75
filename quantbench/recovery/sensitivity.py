"""Layer sensitivity: what each quantized op costs at the model outputs.

Two views per op of the full INT8 plan, both scored against the FP32 outputs:

* ``only_quantized``: that op alone in INT8 (every other op excluded) — the damage it does;
* ``only_fp32``: every op in INT8 except that one — what keeping it in high precision buys.

Cost model: 2 x num_ops Q/DQ model builds and evaluations (one pass over the evaluation data
each), plus one FP32 pass whose outputs every evaluation reuses. Each evaluation is one task:
here in turn (onnxruntime's intra-op threads use every core), or with ``--executor`` on worker
processes or a Ray cluster, which receive the model bytes, the table and the FP32 outputs once
and reopen the evaluation data by path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from quantbench.backends.onnxruntime import start_provider
from quantbench.calibrators import DEFAULT_METHOD
from quantbench.collect.executors import ExecutorSpec, run_tasks, task_threads
from quantbench.compare import load_labels
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    DECISION_THRESHOLD,
    MASK_IOU,
    MEAN_IOU,
    SEQUENCE_KEYS,
    check_mask_threshold,
    declared_support,
)
from quantbench.evaluate.task_metrics import load_metric_script
from quantbench.model.graph import Graph, open_graph
from quantbench.model.widen import float32_work_graph
from quantbench.progress import warn
from quantbench.recovery.context import RecoveryContext, prepare, quantize_except
from quantbench.recovery.evaluation import (
    METRICS,
    RESERVED,
    EvaluationJob,
    badness,
    check_declared,
    data_unbatched,
    evaluation_job,
    json_metrics,
    worker_evaluator,
)

VIEWS = ("only_quantized", "only_fp32")
RANK_METRICS = (
    *("sqnr_db", "cosine", "top1_agreement", "top5_agreement"),
    *(*SEQUENCE_KEYS, MASK_IOU, MEAN_IOU),
)


def default_rank_metric(graph: Graph, labels: np.ndarray | None, unbatched: bool) -> str:
    """``sqnr_db``, or ``top1_agreement`` where every output holds integers (class ids)."""
    sqnr_undefined = declared_support(graph.model, unbatched).support("sqnr_db", labels)
    return "top1_agreement" if sqnr_undefined else "sqnr_db"


def check_rank_metric(metric: str, has_labels: bool, custom: bool = False) -> None:
    """A known ranking metric (a metric script's names are checked once FP32 has run)."""
    allowed = RANK_METRICS + (("accuracy", "accuracy_drop") if has_labels else ())
    if metric in allowed or (custom and metric not in METRICS):
        return
    extra = " or a name your --metric-script returns" if custom else ""
    raise QuantbenchError(f"--metric {metric!r}: choose one of {', '.join(allowed)}{extra}")


def variant_keep(ctx: RecoveryContext, node: str, view: str) -> tuple[str, ...]:
    """The ops a view keeps in high precision: every other one (``only_quantized``) or
    ``node`` alone (``only_fp32``)."""
    if view == "only_quantized":
        return tuple(n for n in ctx.quantized_nodes if n != node)
    return (node,)


def evaluate_keep(job: EvaluationJob, keep: tuple[str, ...]) -> tuple[dict, int, float]:
    """One candidate evaluation on a worker: (metrics, quantized ops, seconds)."""
    start = time.perf_counter()
    evaluator = worker_evaluator(job)
    variant = quantize_except(evaluator.graph, job.table, job.exclude, keep)
    metrics = evaluator.evaluate(variant.model)
    return metrics, len(variant.quantized), time.perf_counter() - start


def evaluate_all(
    ctx: RecoveryContext,
    keeps: list[tuple[str, ...]],
    executor: ExecutorSpec | None = None,
    job: EvaluationJob | None = None,
    show_progress: bool = False,
    description: str = "Evaluating",
) -> list[tuple[dict, int, float]]:
    """Every candidate of ``keeps`` evaluated, in order: here, or as tasks on ``executor``
    (with ``job``, :func:`quantbench.recovery.evaluation.evaluation_job`). Results and their
    order are the same either way."""
    if executor is not None and not executor.is_local and job is not None:
        results = run_tasks(
            executor,
            evaluate_keep,
            keeps,
            shared=job,
            describe=lambda keep: f"evaluation keeping {len(keep)} op(s) in high precision",
            description=description,
            show_progress=show_progress,
        )
        ctx.evaluator.evaluations += len(keeps)
        return results

    def here(_: object, keep: tuple[str, ...]) -> tuple[dict, int, float]:
        start = time.perf_counter()
        variant = ctx.quantize_except(keep)
        metrics = ctx.evaluator.evaluate(variant.model)
        return metrics, len(variant.quantized), time.perf_counter() - start

    return run_tasks(
        ExecutorSpec(),
        here,
        keeps,
        describe=lambda keep: f"evaluation keeping {len(keep)} op(s) in high precision",
        description=description,
        show_progress=show_progress,
    )


def parallel_job(
    ctx: RecoveryContext,
    executor: ExecutorSpec | None,
    eval_data: object,
    *,
    threads: int | None,
    batch_size: int | None,
    max_samples: int | None,
    preset: str | Path | None,
) -> EvaluationJob | None:
    """The workers' job (model bytes, table, FP32 outputs: sent once), or ``None`` to evaluate
    here: a local executor, or evaluation data the workers cannot open by path (a note)."""
    if executor is None or executor.is_local:
        return None
    if ctx.refined:  # the workers quantize the model they load: the unrefined one
        warn(
            f"refined by {', '.join(ctx.refine.kept)}: the ranking is evaluated here "
            f"(not with --executor {executor.kind}), where the refined model is"
        )
        return None
    job = evaluation_job(
        ctx.evaluator,
        eval_data,
        threads=threads or task_threads(executor),
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        table=ctx.table,
        exclude=ctx.exclude,
    )
    if job is None:
        warn(
            f"{ctx.evaluator.source.description}: a data-loader script or Python reader cannot "
            f"be reopened by the workers; evaluating here (not with --executor {executor.kind})"
        )
    return job


def rank_ops(
    ctx: RecoveryContext,
    metric: str,
    views: tuple[str, ...] = VIEWS,
    show_progress: bool = False,
    executor: ExecutorSpec | None = None,
    job: EvaluationJob | None = None,
) -> list[dict[str, Any]]:
    """One row per quantized op with the metrics of each view, worst ``only_quantized`` first;
    each (op, view) evaluation is one task (``executor``, ``job``: see :func:`evaluate_all`)."""
    ops = {q.node: q.op_type for q in ctx.plan.quantized}
    pairs = [(node, view) for node in ops for view in views]
    keeps = [variant_keep(ctx, node, view) for node, view in pairs]
    results = evaluate_all(ctx, keeps, executor, job, show_progress, "Sensitivity")
    rows: dict[str, dict[str, Any]] = {
        node: {"node": node, "op_type": op_type, "seconds": 0.0} for node, op_type in ops.items()
    }
    for (node, view), (metrics, quantized, seconds) in zip(pairs, results):
        rows[node][view] = metrics
        rows[node][f"{view}_nodes"] = quantized
        rows[node]["seconds"] += seconds
    ranked = list(rows.values())
    key_view = views[0]
    ranked.sort(key=lambda r: badness(r[key_view], metric), reverse=True)
    for rank, row in enumerate(ranked, 1):
        row["rank"] = rank
        row["ranked_by"] = metric
        for view in views:
            row[view] = json_metrics(row[view])
    return ranked


def sensitivity(
    model: str | Path | Graph,
    calib_data: object,
    eval_data: object,
    method: str = DEFAULT_METHOD,
    metric: str | None = None,
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
    executor: ExecutorSpec | None = None,
    mask_threshold: float = DECISION_THRESHOLD,
    auto_budget: float | None = None,
) -> list[dict[str, Any]]:
    """Rank every quantized op of ``model`` by the output drift it causes (worst first).

    Each row: ``rank``, ``node``, ``op_type``, ``only_quantized`` and ``only_fp32`` (metric
    dicts: top1/top5 agreement, cosine, sqnr_db, and accuracy/accuracy_drop with labels),
    ``seconds`` and ``ranked_by``: ``metric``, by default ``sqnr_db``, or ``top1_agreement``
    for a model whose outputs are all integers (no SQNR of class numbers).
    """
    if executor is not None:
        executor.validate()
    script = None if metric_script is None else load_metric_script(metric_script, RESERVED)
    if metric is not None:
        check_rank_metric(metric, labels is not None, custom=script is not None)
    check_mask_threshold(mask_threshold)
    start_provider(provider)  # CUDA starts while the model loads
    graph = (
        model
        if isinstance(model, Graph)
        else float32_work_graph(open_graph(model), "sensitivity")
    )
    label_array = load_labels(labels)
    unbatched = data_unbatched(graph, eval_data, preset)
    if metric is None:
        metric = default_rank_metric(graph, label_array, unbatched)
    check_declared(graph, metric, label_array, "--metric", unbatched)  # before calibration
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
        executor=executor,
        auto_budget=auto_budget,
        mask_threshold=mask_threshold,
    )
    ctx.evaluator.attach_script(script)
    ctx.evaluator.require(metric, "--metric")  # after the FP32 pass, before any variant
    job = parallel_job(
        ctx,
        executor,
        eval_data,
        threads=threads,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
    )
    return rank_ops(ctx, metric, show_progress=show_progress, executor=executor, job=job)
