"""What sensitivity analysis and recovery share: graph, statistics, table, plan, evaluator.

Statistics are obtained once (``obtain_stats``, cached on disk like every other command) with
``tensors="all"`` so the same statistics feed both the Q/DQ models and a TensorRT cache that
covers every tensor TensorRT may run in INT8.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantbench import calibrators as registry
from quantbench.calibrate import (
    auto_head,
    check_auto_budget,
    check_methods,
    method_table,
    obtain_stats,
)
from quantbench.choose.autocalib import AutoTable
from quantbench.choose.refined import RefineOutcome, refine_judged, restamped
from quantbench.collect.executors import ExecutorSpec
from quantbench.compare import labels_for_samples, load_labels
from quantbench.data.sources import open_data
from quantbench.evaluate.metrics import DECISION_THRESHOLD
from quantbench.fp16 import FP16, FP32, emulate_fp16, out_of_range_nodes, strongly_typed_fp16
from quantbench.model.graph import Graph, open_graph
from quantbench.qdq import QuantizeResult, quantize_model
from quantbench.recovery.evaluation import Evaluator
from quantbench.stats.tensorstats import StatsFile
from quantbench.table import CalibrationTable


@dataclass
class RecoveryContext:
    """One model calibrated once, its full INT8 plan, and the FP32 evaluation outputs."""

    graph: Graph
    stats: StatsFile
    table: CalibrationTable
    plan: QuantizeResult
    evaluator: Evaluator
    method: str
    exclude: tuple[str, ...] = ()
    auto: AutoTable | None = None
    #: what the ops left unquantized run in: "fp32", or "fp16" (the strongly-typed artefact)
    precision: str = FP32
    #: the refinement passes tried before any op is kept in high precision; when some were
    #: kept, :attr:`graph` is the refined model (the evaluator still judges against the
    #: original FP32 model)
    refine: RefineOutcome | None = None
    #: the user's model's name (its file's stem), which names the artefacts: a refined
    #: :attr:`graph` has no file, and its ONNX graph name ("main_graph") named them before
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.graph.name

    @property
    def refined(self) -> bool:
        return self.refine is not None and self.refine.refined

    @property
    def quantized_nodes(self) -> list[str]:
        return [q.node for q in self.plan.quantized]

    def quantize_except(self, keep_high_precision: Iterable[str]) -> QuantizeResult:
        """The full INT8 model with ``keep_high_precision`` (exact node names) left unquantized
        (with their unrounded weights, when a rounding pass was kept)."""
        keep = list(keep_high_precision)
        graph, table = self.graph, self.table
        if keep and self.refine is not None and self.refine.unrounded is not None:
            graph = unrounded_for(self.graph, self.refine.unrounded, keep)
            table = restamped(table, graph)
        return quantize_except(graph, table, self.exclude, keep)

    def verification_model(self, variant: QuantizeResult) -> onnx.ModelProto:
        """What a variant is scored on: the Q/DQ model itself for ``fp32``; for ``fp16`` its
        emulated equivalent (:func:`quantbench.fp16.emulate_fp16`: FP16 weights, FP16 Q/DQ
        scales, every op output rounded to FP16), i.e. the arithmetic of the strongly-typed
        artefact :meth:`artefact_model` writes, which onnxruntime's CPU provider cannot run
        in FP16 itself, with the same nodes FP32 (:func:`quantbench.fp16.out_of_range_nodes`)."""
        if self.precision == FP16:  # the nodes the artefact keeps FP32 kept FP32 here too
            kept, _ = out_of_range_nodes(variant.model)
            return emulate_fp16(variant.model, keep_fp32=kept, types=self.graph.elem_types).model
        return variant.model

    def artefact_model(self, variant: QuantizeResult) -> onnx.ModelProto:
        """The model written for ``variant``: Q/DQ as is, or strongly typed INT8/FP16."""
        if self.precision == FP16:
            return strongly_typed_fp16(variant.model)
        return variant.model

    def quantize_only(self, node: str) -> QuantizeResult:
        """Only ``node`` quantized: every other op of the plan excluded by its exact name."""
        return self.quantize_except(n for n in self.quantized_nodes if n != node)


def unrounded_for(graph: Graph, unrounded: onnx.ModelProto, nodes: list[str]) -> Graph:
    """``graph`` whose ``nodes`` read their weights as they were before rounding: a layer
    kept in high precision computes with the FP32 weights, not their INT8 grid points."""
    before = {i.name: i for i in unrounded.graph.initializer}
    chosen = set(nodes)
    weights = {n.input[1] for n in graph.model.graph.node if n.name in chosen and len(n.input) > 1}
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    for init in model.graph.initializer:
        if init.name in weights and init.name in before:
            init.CopyFrom(before[init.name])
    restored = open_graph(model, require_fixed_rank=False)
    restored.path = graph.path
    return restored


def quantize_except(
    graph: Graph, table: CalibrationTable, exclude: Iterable[str], keep: Iterable[str]
) -> QuantizeResult:
    """The full INT8 model of ``graph`` with ``keep`` (exact node names) and ``exclude``
    (patterns) left unquantized: one definition for the driver and the workers."""
    patterns = [*exclude, *(re.escape(n) for n in keep)]
    return quantize_model(graph, table, exclude=patterns, allow_partial=True)


def prepare(
    model: str | Path | Graph,
    calib_data: object,
    eval_data: object,
    *,
    method: str = registry.DEFAULT_METHOD,
    labels: str | Path | np.ndarray | None = None,
    exclude: Iterable[str] = (),
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
) -> RecoveryContext:
    """Calibrate, plan the full INT8 model and run FP32 over the evaluation data once
    (``mask_threshold``: where a probability map's values count as decided; ``auto_budget``:
    seconds ``auto``'s judging may take)."""
    method = check_methods([method])[0]  # a bad name or option fails before any inference
    check_auto_budget(auto_budget, [method])
    graph = model if isinstance(model, Graph) else open_graph(model)
    label_array = load_labels(labels)
    stats, _, _ = obtain_stats(
        graph,
        calib_data,
        tensors="all",
        batch_size=batch_size,
        max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        show_progress=show_progress,
        executor=executor,
        keep_head=auto_head(graph, [method], holdout_data),
    )
    table, auto = method_table(
        graph,
        stats,
        method,
        calib_data,
        holdout_data,
        batch_size=batch_size,
        preset=preset,
        provider=provider,
        threads=threads,
        executor=executor,
        auto_budget=auto_budget,
    )
    excluded = tuple(exclude)
    plan = quantize_model(graph, table, exclude=excluded, allow_partial=True)
    plan.require_quantized(f"{graph.path or graph.name}")
    source = open_data(
        eval_data, graph.inputs, batch_size=batch_size, max_samples=max_samples, preset=preset
    )
    if label_array is not None:
        label_array = labels_for_samples(label_array, max_samples, labels)
    evaluator = Evaluator(
        graph, source, label_array, provider, threads, mask_threshold=mask_threshold
    )
    return RecoveryContext(graph, stats, table, plan, evaluator, method, excluded, auto)


def refine_context(
    ctx: RecoveryContext,
    passes: Sequence[str],
    calib_data: object,
    *,
    holdout_data: object | None = None,
    batch_size: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    threads: int | None = None,
) -> None:
    """Try the refinement passes on ``ctx``'s model (each kept where it helps at the outputs,
    :mod:`quantbench.choose.refined`) and re-plan its INT8 model on what was kept; the
    evaluator keeps judging against the original FP32 model."""
    refined = refine_judged(
        ctx.graph, ctx.table, calib_data, passes, num_samples=ctx.stats.num_samples,
        holdout_data=holdout_data, batch_size=batch_size, preset=preset, provider=provider,
        threads=threads,
    )  # fmt: skip
    ctx.refine = refined
    if refined.refined:
        ctx.graph, ctx.table = refined.graph, refined.table
        ctx.plan = quantize_model(ctx.graph, ctx.table, exclude=ctx.exclude, allow_partial=True)
