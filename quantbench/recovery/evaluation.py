"""Output-level evaluation of many variants of one model against one FP32 run.

The FP32 model runs once per evaluation batch and only its *outputs* are kept (class scores are
small); every variant then streams the same batches and is scored with the streaming
accumulators of :mod:`quantbench.evaluate.metrics`. Memory therefore grows with the size of the
model outputs times the number of samples, not with the number of variants.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, with_outputs
from quantbench.collect.workerinput import WorkerInput
from quantbench.data.sources import DataSource, feed_num_samples, open_data
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    DECISION_THRESHOLD,
    MASK_IOU,
    MEAN_IOU,
    MODEL_METRICS,
    SEQUENCE_KEYS,
    OutputLayout,
    OutputsAccumulator,
    OutputSupport,
    declared_support,
    labels_accuracy_reason,
    lower_is_better,
    nonfinite_text,
)
from quantbench.evaluate.task_metrics import MetricScript, split_spec
from quantbench.jsonsafe import json_float
from quantbench.model.graph import Graph

#: built-in metrics a variant is scored by; every one is computed on every evaluation (``None``
#: where undefined). A ``--metric-script`` adds its own names.
METRICS = MODEL_METRICS
#: metrics that need labels.
LABELLED = frozenset({"accuracy", "accuracy_drop"})
#: names a metric script may not return (built-ins, and the NaN/Inf count of an evaluation).
RESERVED = frozenset({*METRICS, "nonfinite", "shape_mismatches"})

_TOLERANCE = 1e-9
_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Target:
    """``metric=value``: the level a recovered model must reach."""

    metric: str
    value: float

    @property
    def text(self) -> str:
        return f"{self.metric}={self.value:g}"

    def met(self, metrics: dict[str, float | None]) -> bool:
        """An undefined value (``None``: NaN/Inf outputs) never meets a target."""
        got = metrics.get(self.metric)
        if got is None:
            return False
        # a tolerance far below one sample in a million: 0.1 + 0.002 - 0.1 must meet 0.002
        if lower_is_better(self.metric):
            return got <= self.value + _TOLERANCE
        return got >= self.value - _TOLERANCE


def parse_target(text: str, has_labels: bool, custom: bool = False) -> Target:
    """``"top1_agreement=0.99"`` -> Target; a user mistake is a one-line QuantbenchError.

    ``custom``: a metric script is given, so other names are accepted here and checked against
    what it returns once FP32 has run (:meth:`Evaluator.require`)."""
    match = _TARGET.match(text or "")
    if not match:
        raise QuantbenchError(
            f"--target {text!r}: write METRIC=VALUE, e.g. top1_agreement=0.99 or "
            "accuracy_drop=0.005"
        )
    metric, raw = match.group(1), match.group(2)
    if metric not in METRICS and not custom:
        raise QuantbenchError(
            f"--target {text!r}: unknown metric {metric!r}; use one of {', '.join(METRICS)} "
            "or a name returned by --metric-script"
        )
    if metric in LABELLED and not has_labels:
        raise QuantbenchError(f"--target {text!r}: {metric} needs --labels LABELS.npy")
    value = float(raw)
    fractions = ("top1_agreement", "top5_agreement", *SEQUENCE_KEYS, MASK_IOU, MEAN_IOU, "accuracy")
    if metric in (*fractions, "accuracy_drop") and not 0 <= value <= 1:
        raise QuantbenchError(f"--target {text!r}: {metric} is a fraction between 0 and 1")
    if metric == "cosine" and not -1 <= value <= 1:
        raise QuantbenchError(f"--target {text!r}: cosine lies between -1 and 1")
    return Target(metric, value)


#: what recover aims at without a --target: the first the model's declared outputs define
DEFAULT_TARGETS = ("top1_agreement=0.99", f"{MASK_IOU}=0.99")
#: ... but a recognizer's text, not its frames (:attr:`OutputSupport.recognizer`)
SEQUENCE_TARGET = "ctc_agreement=0.99"


def default_target(graph: Graph, labels: np.ndarray | None, unbatched: bool = False) -> str:
    """The first of :data:`DEFAULT_TARGETS` the model's outputs can give (a symbolic class
    axis counts: the data decides), :data:`SEQUENCE_TARGET` for a recognizer; one line saying
    what to give when none can."""
    declared = declared_support(graph.model, unbatched)
    if declared.recognizer:
        return SEQUENCE_TARGET
    reasons = []
    for text in DEFAULT_TARGETS:
        reason = declared.support(text.partition("=")[0], labels)
        if not reason:
            return text
        reasons.append(reason)
    raise QuantbenchError(
        f"{graph.path}: give --target METRIC=VALUE (e.g. sqnr_db=30): the default "
        f"{DEFAULT_TARGETS[0]} is not defined for this model: {reasons[0].partition(': ')[2]}"
    )


def check_declared(
    graph: Graph, metric: str, labels: np.ndarray | None, option: str, unbatched: bool = False
) -> None:
    """Fail in one line, before any inference, when the model's declared outputs cannot give
    ``metric`` (a symbolic class axis defers the check to :meth:`Evaluator.require`;
    ``unbatched``: the data feeds a model without a batch axis one sample at a time)."""
    reason = declared_support(graph.model, unbatched).support(metric, labels)
    if reason:
        raise QuantbenchError(f"{option} {metric}: {reason}")


def data_unbatched(graph: Graph, data: object, preset: str | Path | None = None) -> bool:
    """Whether ``data`` (a file or folder) feeds ``graph`` one sample at a time, its inputs
    having no batch axis (:attr:`DataSource.unbatched`); a bad source says so when opened."""
    if not isinstance(data, (str, Path)):
        return False
    try:
        return open_data(data, graph.inputs, preset=preset).unbatched
    except QuantbenchError:
        return False


def badness(metrics: dict[str, float | None], metric: str) -> tuple[float, float]:
    """Sort key, larger = worse drift; SQNR breaks ties (agreement is coarse on few samples).
    An undefined value (``None``) is the worst of all."""
    value = metrics.get(metric)
    sqnr = metrics.get("sqnr_db")
    primary = math.inf if value is None else (value if lower_is_better(metric) else -value)
    return primary, (math.inf if sqnr is None else -sqnr)


@dataclass
class Evaluator:
    """The FP32 outputs of every evaluation batch, and a way to score a variant against them.

    Scores come from :class:`quantbench.evaluate.metrics.OutputsAccumulator` (the definitions
    ``compare`` uses) plus the metric script's numbers; ``nonfinite`` counts the candidate's
    NaN/Inf output values.
    """

    graph: Graph
    source: DataSource
    labels: np.ndarray | None = None
    provider: str | None = None
    threads: int | None = None
    script: MetricScript | None = None
    outputs: list[str] = field(default_factory=list)
    #: where the outputs' classes lie (NCHW maps, last axes that may not be classes)
    layout: OutputLayout = field(default_factory=OutputLayout)
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)
    batch_labels: list[np.ndarray | None] = field(default_factory=list)
    #: samples per reference batch (tells a time-major output's samples axis)
    batch_sizes: list[int] = field(default_factory=list)
    evaluations: int = 0
    #: where a probability map's values count as decided (``--mask-threshold``)
    mask_threshold: float = DECISION_THRESHOLD
    #: what each evaluation fetches: the outputs and :attr:`extra`
    fetched: list[str] = field(default_factory=list, init=False)
    #: tensors an NMS/NonZero chose from (:meth:`OutputLayout.judged_tensors`)
    extra: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.outputs = [o.name for o in self.graph.model.graph.output]
        self.layout = OutputLayout.of(self.graph.model, self.source.unbatched, self.mask_threshold)
        # and the tensors an NMS/NonZero chose from, judged where its outputs' sizes differ
        self.fetched, self.extra = self.layout.judged_tensors()
        if self.reference:  # a worker's copy: the driver's FP32 outputs, no second FP32 pass
            self.num_samples = self.source.num_samples or 0
            self.attach_script(self.script)
            return
        runner = OnnxRuntimeRunner(self._fetching(self.graph.model), self.provider, self.threads)
        seen = 0
        for feed in self.source.batches():
            n = feed_num_samples(feed, self.graph.inputs)
            self.reference.append(runner.infer(feed, self.fetched))
            self.batch_labels.append(self._labels_for(seen, n))
            self.batch_sizes.append(n)
            seen += n
        runner.close()
        if seen == 0:
            raise QuantbenchError(f"{self.source.description}: the evaluation data set is empty")
        if self.labels is not None and seen != len(self.labels):
            raise QuantbenchError(
                f"labels: {len(self.labels)} labels for {seen} evaluation samples"
            )
        self.num_samples = seen
        self.attach_script(self.script)

    def attach_script(self, script: MetricScript | None) -> None:
        """Use ``script`` from now on; FP32 against itself (from the cache, no inference) gives
        the baseline every metric is checked against."""
        self.script = script
        self.fp32_metrics = self._score(self.reference)
        self.fp32_accuracy = self.fp32_metrics.get("accuracy")

    def _labels_for(self, start: int, n: int) -> np.ndarray | None:
        if self.labels is None:
            return None
        chunk = self.labels[start : start + n]
        if len(chunk) != n:
            raise QuantbenchError(
                f"labels: only {len(self.labels)} labels, more evaluation samples than that"
            )
        return chunk

    def require(self, metric: str, option: str) -> None:
        """One line, before any variant is evaluated, when ``metric`` is undefined even for FP32
        against itself on this data (no such output, NaN/Inf in FP32, a name the metric
        script does not return)."""
        if self.fp32_metrics.get(metric) is not None:
            return
        reason = self.observed_support().support(metric, self.labels)
        if not reason and metric not in METRICS:
            returned = [k for k in self.fp32_metrics if k not in RESERVED]
            where = self.script.where if self.script else "no --metric-script"
            reason = f"{where} returned no {metric!r} (it returned {', '.join(returned) or '-'})"
        if not reason:
            nonfinite = self._fp32_nonfinite()
            if not nonfinite and metric == "top5_agreement":
                reason = (
                    "needs outputs of more than 5 classes (with 5 or fewer, the top 5 hold every "
                    "class whatever the model does); use top1_agreement"
                )
            elif not nonfinite and metric == MASK_IOU:
                reason = (
                    f"undefined on this data: no value of FP32's probability maps is above "
                    f"{self.mask_threshold:g}; --mask-threshold sets the model's own threshold"
                )
            else:
                reason = "undefined on this data: " + (nonfinite or "no value")
        raise QuantbenchError(f"{option} {metric}: {reason}")

    def observed_support(self) -> OutputSupport:
        """:class:`OutputSupport` of the outputs as FP32 gave them (a declared shape may be
        symbolic, or wrong)."""
        first = self.reference[0]
        return OutputSupport.of({o: np.shape(first[o]) for o in self.outputs}, self.layout)

    def _fp32_nonfinite(self) -> str:
        acc = OutputsAccumulator(self.outputs, layout=self.layout)
        for ref in self.reference:
            acc.update(ref, ref)
        texts = [
            f"FP32 output {name}: {nonfinite_text(row['nonfinite'])}"
            for name, row in acc.rows().items()
            if nonfinite_text(row["nonfinite"])
        ]
        return "; ".join(texts)

    def _fetching(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` also outputting :attr:`extra`."""
        return with_outputs(model, self.extra, self.graph.elem_types)

    def evaluate(self, model: onnx.ModelProto) -> dict[str, float | None]:
        """Every metric of :data:`METRICS` (and the script's) for ``model`` (same outputs as
        the FP32 model)."""
        runner = OnnxRuntimeRunner(
            self._fetching(model), self.provider, self.threads, generated_from=self.graph.model
        )

        def batches() -> Iterator[dict[str, np.ndarray]]:
            count = 0
            for index, feed in enumerate(self.source.batches()):
                if index >= len(self.reference):
                    raise QuantbenchError(
                        f"{self.source.description}: yields more batches on a second pass; "
                        "evaluation data must be re-readable (a file or folder, not a generator)"
                    )
                yield runner.infer(feed, self.fetched)
                count += 1
            if count != len(self.reference):
                raise QuantbenchError(
                    f"{self.source.description}: yields fewer batches on a second pass; "
                    "evaluation data must be re-readable (a file or folder, not a generator)"
                )

        try:
            metrics = self._score(batches())
        finally:
            runner.close()
        self.evaluations += 1
        return metrics

    def _score(self, candidate: Iterable[dict[str, np.ndarray]]) -> dict[str, float | None]:
        usable = not labels_accuracy_reason(self.labels)
        acc = OutputsAccumulator(self.fetched, labels_usable=usable, layout=self.layout)
        session = self.script.session() if self.script is not None else None
        for index, got in enumerate(candidate):  # the candidate drives: it checks its count
            ref, lab = self.reference[index], self.batch_labels[index]
            acc.update(ref, got, lab, self.batch_sizes[index])
            if session is not None:
                ref_outputs = {o: ref[o] for o in self.outputs}  # a script sees outputs only
                session.update(ref_outputs, {o: got[o] for o in self.outputs}, lab)
        metrics: dict[str, float | None] = dict(acc.model_metrics())
        metrics["nonfinite"] = sum(d.nonfinite_b for d in acc.drift.values())
        rows = acc.rows().values()  # batches whose output sizes differed (NonZero, NMS)
        metrics["shape_mismatches"] = max((r.get("shape_mismatches") or 0 for r in rows), default=0)
        if session is not None:
            metrics.update(session.compute())
        return metrics


@dataclass(frozen=True)
class EvaluationJob:
    """What a worker needs to evaluate variants exactly as the driver's :class:`Evaluator`
    does, sent once (Ray's object store, or the worker processes' initialiser): the model and
    evaluation data (:class:`WorkerInput`), labels, metric script and the driver's FP32 outputs
    per batch."""

    input: WorkerInput
    labels: np.ndarray | None
    script: str | None
    reference: list[dict[str, np.ndarray]]
    batch_labels: list[np.ndarray | None]
    batch_sizes: list[int]
    #: what the variants are built from (quantbench.recovery.context.RecoveryContext)
    table: Any = None
    exclude: tuple[str, ...] = ()
    mask_threshold: float = DECISION_THRESHOLD


def evaluation_job(
    evaluator: Evaluator,
    data: object,
    *,
    threads: int | None,
    batch_size: int | None,
    max_samples: int | None,
    preset: str | Path | None,
    table: Any = None,
    exclude: tuple[str, ...] = (),
) -> EvaluationJob | None:
    """The job for ``evaluator``, or ``None`` when workers cannot open the evaluation data by
    path (a data-loader script, a Python reader: it streams once, here)."""
    if not isinstance(data, (str, Path)) or not evaluator.source.splittable:
        return None
    where = WorkerInput.of(
        evaluator.graph,
        data,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=evaluator.provider,
        threads=threads,
    )
    return EvaluationJob(
        where,
        labels=evaluator.labels,
        script=_absolute_script(evaluator.script),
        reference=evaluator.reference,
        batch_labels=evaluator.batch_labels,
        batch_sizes=evaluator.batch_sizes,
        table=table,
        exclude=exclude,
        mask_threshold=evaluator.mask_threshold,
    )


def _absolute_script(script: MetricScript | None) -> str | None:
    """``FILE.py:NAME`` with an absolute path: a worker's working directory is not ours."""
    if script is None:
        return None
    path, name = split_spec(script.where)
    return f"{path.resolve()}:{name}"


def worker_evaluator(job: EvaluationJob) -> Evaluator:
    """The driver's evaluator rebuilt on a worker: its FP32 outputs, no FP32 pass."""
    from quantbench.evaluate.task_metrics import load_metric_script

    script = None if job.script is None else load_metric_script(job.script, RESERVED)
    return Evaluator(
        job.input.graph(),
        job.input.source(),
        job.labels,
        job.input.provider,
        job.input.threads,
        script,
        reference=job.reference,
        batch_labels=job.batch_labels,
        batch_sizes=job.batch_sizes,
        mask_threshold=job.mask_threshold,
    )


def json_metrics(metrics: dict[str, float | None]) -> dict[str, float | str | None]:
    """Infinite SQNR (identical outputs) as ``"inf"``, NaN as ``"nan"`` (quantbench.jsonsafe)."""
    return {k: json_float(v) if isinstance(v, float) else v for k, v in metrics.items()}
