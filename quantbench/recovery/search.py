"""``recover``: the smallest set of ops kept in high precision that reaches a target.

Greedy by sensitivity: ops are ranked once by the drift they cause when quantized alone (the
``only_quantized`` view of :mod:`.sensitivity`), then kept in high precision one at a time,
worst first, each step verified on the full model (every other op INT8). It stops when the
target is met or ``budget`` ops are kept. Cost: num_ops evaluations for the ranking plus at most
``budget + 1`` verifications; no ranking is done when plain INT8 already meets the target.

With ``--executor`` the ranking's evaluations are tasks on worker processes or a Ray cluster;
the verification steps stay sequential (each depends on the previous step's outcome), so the
search takes exactly the steps a local run takes.

Greedy is not optimal (two ops may only matter together), but each step is measured, so the
recorded metric is the true metric of the model that is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantbench.backends.onnxruntime import start_provider
from quantbench.calibrators import DEFAULT_METHOD
from quantbench.choose.refined import parse_refine, passes_to_try
from quantbench.collect.executors import ExecutorSpec
from quantbench.compare import load_labels
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import DECISION_THRESHOLD, check_mask_threshold
from quantbench.evaluate.task_metrics import load_metric_script
from quantbench.fp16 import FP16, check_high_precision, declared_precisions, out_of_range_nodes
from quantbench.fp16range import kept_text
from quantbench.model.graph import Graph, open_graph
from quantbench.model.widen import float32_work_graph, own_high_precision, with_io_types_of
from quantbench.progress import info, warn
from quantbench.qdq import QuantizeResult
from quantbench.recovery.context import RecoveryContext, prepare, refine_context
from quantbench.recovery.evaluation import (
    RESERVED,
    SEQUENCE_TARGET,
    Evaluator,
    Target,
    check_declared,
    data_unbatched,
    default_target,
    json_metrics,
    parse_target,
)
from quantbench.recovery.sensitivity import parallel_job, rank_ops
from quantbench.refine import BIAS, TWO_STAGE

#: what each step's metric was measured on, per high precision
VERIFIED_ON = {
    "fp32": "the Q/DQ model, unquantized ops in FP32 (onnxruntime)",
    "fp16": "the Q/DQ model with FP16 storage for every unquantized op and FP16 Q/DQ scales "
    "(onnxruntime, emulated): the arithmetic of the strongly-typed artefact",
}


@dataclass
class RecoveryResult:
    """Every verified step, the ops finally kept, and the model/table they belong to."""

    target: Target
    precision: str
    steps: list[dict[str, Any]]
    kept: list[str]
    met: bool
    final: QuantizeResult
    context: RecoveryContext
    ranking: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    #: the model the artefacts hold (strongly typed INT8/FP16 for ``fp16``)
    artefact: onnx.ModelProto | None = None

    @property
    def op_precisions(self) -> dict[str, str]:
        """Node -> "int8" | "fp16" | "fp32" as the written artefact declares it."""
        return declared_precisions(self.artefact or self.final.model)

    @property
    def metric(self) -> float | None:
        return self.steps[-1]["metric"]

    def section(self) -> dict[str, Any]:
        """The ``recovery`` section of a results document (rendered by the HTML report)."""
        section: dict[str, Any] = {
            "target": self.target.text,
            "metric": self.target.metric,
            "mask_threshold": self.context.evaluator.mask_threshold,
            "precision": self.precision,
            "method": self.context.method,
            "met": self.met,
            "kept_high_precision": list(self.kept),
            "quantized_ops": len(self.context.plan.quantized),
            "evaluations": self.context.evaluator.evaluations,
            "seconds": self.seconds,
            "steps": self.steps,
            "sensitivity": self.ranking,
            "fp32_metrics": json_metrics(self.context.evaluator.fp32_metrics),
            "verified_on": VERIFIED_ON[self.precision],
            "op_precisions": self.op_precisions,
        }
        script = self.context.evaluator.script
        if script is not None:
            section["metric_script"] = script.where
        if self.context.auto is not None:
            section["auto"] = self.context.auto.to_dict()
        return section


def _observed_default(evaluator: Evaluator, tgt: Target, custom: bool) -> Target:
    """The default target, once FP32 has shown the outputs' shapes: a recognizer whose
    declared shapes hid its sequences (a symbolic or wrong rank) is judged by its text too."""
    if tgt.text != SEQUENCE_TARGET and evaluator.observed_support().recognizer:
        tgt = parse_target(SEQUENCE_TARGET, False, custom)
    info(f"target: {tgt.text} (the default for this model's outputs; --target sets another)")
    return tgt


def _check_budget(budget: int | None, num_ops: int) -> int:
    if budget is None:
        return num_ops
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise QuantbenchError(f"--budget {budget!r}: give a whole number of ops (0 or more)")
    return min(budget, num_ops)


def _step(
    ctx: RecoveryContext, number: int, kept: list[str], target: Target
) -> tuple[dict[str, Any], QuantizeResult, bool]:
    start = time.perf_counter()
    variant = ctx.quantize_except(kept)
    metrics = ctx.evaluator.evaluate(ctx.verification_model(variant))
    met = target.met(metrics)
    record = {
        "step": number,
        "kept_high_precision": list(kept),
        "metric": json_metrics(metrics)[target.metric],
        "metrics": json_metrics(metrics),
        "quantized_ops": len(variant.quantized),
        "met": met,
        "seconds": time.perf_counter() - start,
    }
    return record, variant, met


def _why_undefined(metrics: dict[str, Any]) -> str:
    """Why a step's metric is undefined, as a parenthesis ('' when nothing is known)."""
    if bad := metrics.get("nonfinite"):
        return f" ({bad} NaN/Inf output values)"
    if differed := metrics.get("shape_mismatches"):
        return (
            f" (output sizes differed from FP32's on {differed} batch(es): a variable-size "
            "output such as NonZero or NMS; a --metric-script can judge it)"
        )
    return ""


def _announce(record: dict[str, Any], target: Target) -> None:
    kept = record["kept_high_precision"]
    added = f"+{kept[-1]}" if kept else "plain INT8"
    value = record["metric"]
    if isinstance(value, float):
        shown = f"{value:.4g}"
    elif value is None:
        shown = "undefined" + _why_undefined(record["metrics"])
    else:
        shown = str(value)
    info(f"step {record['step']}: {added}, {target.metric}={shown} ({record['seconds']:.1f} s)")


def recover(
    model: str | Path | Graph,
    calib_data: object,
    eval_data: object,
    target: str | None = None,
    labels: str | Path | np.ndarray | None = None,
    method: str = DEFAULT_METHOD,
    budget: int | None = None,
    precision: str | None = None,
    *,
    metric_script: str | Path | None = None,
    exclude: list[str] | None = None,
    holdout_data: object | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    calib_max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    threads: int | None = None,
    show_progress: bool = False,
    executor: ExecutorSpec | None = None,
    mask_threshold: float = DECISION_THRESHOLD,
    auto_budget: float | None = None,
    refine: str | list[str] | None = None,
) -> RecoveryResult:
    """Keep the fewest ops in ``precision`` (greedy, worst first) until ``target`` is met
    (``None``: :func:`default_target`, said in one line).

    ``fp16``: every op left unquantized (the kept ones and those never quantized) runs in
    FP16; each step is verified on the emulated equivalent of the strongly-typed artefact
    written (:meth:`RecoveryContext.verification_model`). The sensitivity ranking itself is
    measured with FP32 high precision (it only orders the candidates).

    ``refine``: refinement passes tried before any op is kept in high precision (as
    ``quantize --refine``; None: the cheap ones with ``auto``), so a pass that recovers
    accuracy in INT8 spares a fallback.
    """
    started = time.perf_counter()
    if executor is not None:
        executor.validate()
    script = None if metric_script is None else load_metric_script(metric_script, RESERVED)
    custom = script is not None
    tgt = None if target is None else parse_target(target, labels is not None, custom=custom)
    if precision is not None:
        check_high_precision(precision, "--precision")
    check_mask_threshold(mask_threshold)
    _check_budget(budget, 0)  # a bad budget fails before any inference
    passes = _recover_passes(refine, method)
    start_provider(provider)  # CUDA starts while the model loads
    source = model if isinstance(model, Graph) else open_graph(model)
    graph = source if isinstance(model, Graph) else float32_work_graph(source, "recover")
    if precision is None:  # the model's own: FP16 for a float16 model
        precision = own_high_precision(source.model)
    label_array = load_labels(labels)
    unbatched = data_unbatched(graph, eval_data, preset)
    defaulted = tgt is None
    if defaulted:
        tgt = parse_target(default_target(graph, label_array, unbatched), False, custom)
    check_declared(graph, tgt.metric, label_array, "--target", unbatched)  # before calibration
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
    ctx.precision = precision
    ctx.evaluator.attach_script(script)
    if defaulted:
        tgt = _observed_default(ctx.evaluator, tgt, custom)
    ctx.evaluator.require(tgt.metric, "--target")  # after the FP32 pass, before any variant
    if passes:
        refine_context(
            ctx, passes, calib_data, holdout_data=holdout_data, batch_size=batch_size,
            preset=preset, provider=provider, threads=threads,
        )  # fmt: skip
    limit = _check_budget(budget, len(ctx.plan.quantized))
    kept: list[str] = []
    record, final, met = _step(ctx, 0, kept, tgt)
    steps = [record]
    if show_progress:
        _announce(record, tgt)
    ranking: list[dict[str, Any]] = []
    if not met and limit > 0:
        job = parallel_job(
            ctx,
            executor,
            eval_data,
            threads=threads,
            batch_size=batch_size,
            max_samples=max_samples,
            preset=preset,
        )
        ranking = rank_ops(
            ctx,
            tgt.metric,
            views=("only_quantized",),
            show_progress=show_progress,
            executor=executor,
            job=job,
        )
        for row in ranking[:limit]:
            kept.append(row["node"])
            record, final, met = _step(ctx, len(steps), kept, tgt)
            steps.append(record)
            if show_progress:
                _announce(record, tgt)
            if met:
                break
    if met and kept and len(kept) == len(ctx.plan.quantized):
        warn(
            f"--target {tgt.metric}: met only with every quantized op ({len(kept)}) kept in "
            f"{precision}: the recovered model has no INT8 op left; relax the target or "
            "calibrate differently"
        )
    artefact = ctx.artefact_model(final)
    if precision == FP16 and (text := kept_text(*out_of_range_nodes(final.model))):
        warn(text)
    if graph is not source:  # a half-precision model's artefact keeps its I/O types
        artefact = with_io_types_of(_copy(artefact), source.model)
    seconds = time.perf_counter() - started
    return RecoveryResult(tgt, precision, steps, kept, met, final, ctx, ranking, seconds, artefact)


def _recover_passes(refine: str | list[str] | None, method: str) -> tuple[str, ...]:
    """:func:`passes_to_try` without bias correction: it folds the mean shift of a layer's
    INT8 weights into its bias, a wrong shift once recover keeps that layer in FP32/FP16
    (on a test model it turned a recoverable -11 dB into -4.5 dB with every op kept); and
    without two-stage activations, a rewrite of one finished Q/DQ model where recover plans
    many (each op it keeps in high precision changes which activations are INT8)."""
    passes = passes_to_try(refine, method)
    asked = parse_refine(refine) is not None
    if BIAS in passes and asked:
        warn(
            "--refine bias: recover does not use bias correction (a layer it keeps in high "
            "precision would carry the INT8 weights' shift); quantize --refine bias does"
        )
    if TWO_STAGE in passes and asked:
        warn(
            "--refine: recover does not try two-stage activations (a rewrite of one finished "
            "Q/DQ model, where recover plans many); quantize --refine two-stage does"
        )
    return tuple(p for p in passes if p not in (BIAS, TWO_STAGE))


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
