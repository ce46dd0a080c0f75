"""Output-level evaluation of many variants of one model against one FP32 run.

The FP32 model runs once per evaluation batch and only its *outputs* are kept (class scores are
small); every variant then streams the same batches and is scored with the streaming
accumulators of :mod:`quantbench.compare.metrics`. Memory therefore grows with the size of the
model outputs times the number of samples, not with the number of variants.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner
from quantbench.compare.metrics import AgreementAccumulator, DriftAccumulator
from quantbench.data import DataSource, feed_num_samples
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph

#: metrics a variant is scored by; every one is computed on every evaluation.
METRICS = ("top1_agreement", "top5_agreement", "cosine", "sqnr_db", "accuracy", "accuracy_drop")
#: metrics where a smaller value is better.
LOWER_IS_BETTER = frozenset({"accuracy_drop"})
#: metrics that need labels.
LABELLED = frozenset({"accuracy", "accuracy_drop"})

_TOLERANCE = 1e-9
_TARGET = re.compile(r"^\s*([a-z0-9_]+)\s*=\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Target:
    """``metric=value``: the level a recovered model must reach."""

    metric: str
    value: float

    @property
    def text(self) -> str:
        return f"{self.metric}={self.value:g}"

    def met(self, metrics: dict[str, float | None]) -> bool:
        got = metrics.get(self.metric)
        if got is None:
            return False
        # a tolerance far below one sample in a million: 0.1 + 0.002 - 0.1 must meet 0.002
        if self.metric in LOWER_IS_BETTER:
            return got <= self.value + _TOLERANCE
        return got >= self.value - _TOLERANCE


def parse_target(text: str, has_labels: bool) -> Target:
    """``"top1_agreement=0.99"`` -> Target; a user mistake is a one-line QuantbenchError."""
    match = _TARGET.match(text or "")
    if not match:
        raise QuantbenchError(
            f"--target {text!r}: write METRIC=VALUE, e.g. top1_agreement=0.99 or "
            "accuracy_drop=0.005"
        )
    metric, raw = match.group(1), match.group(2)
    if metric not in METRICS:
        raise QuantbenchError(f"--target {text!r}: unknown metric {metric!r}; use one of {METRICS}")
    if metric in LABELLED and not has_labels:
        raise QuantbenchError(f"--target {text!r}: {metric} needs --labels LABELS.npy")
    value = float(raw)
    if metric in ("top1_agreement", "top5_agreement", "accuracy") and not 0 <= value <= 1:
        raise QuantbenchError(f"--target {text!r}: {metric} is a fraction between 0 and 1")
    if metric == "accuracy_drop" and not 0 <= value <= 1:
        raise QuantbenchError(f"--target {text!r}: accuracy_drop is a fraction between 0 and 1")
    if metric == "cosine" and not -1 <= value <= 1:
        raise QuantbenchError(f"--target {text!r}: cosine lies between -1 and 1")
    return Target(metric, value)


def badness(metrics: dict[str, float | None], metric: str) -> tuple[float, float]:
    """Sort key, larger = worse drift; SQNR breaks ties (agreement is coarse on few samples)."""
    value = metrics.get(metric)
    sqnr = metrics.get("sqnr_db")
    primary = math.inf if value is None else (value if metric in LOWER_IS_BETTER else -value)
    return primary, (math.inf if sqnr is None else -sqnr)


@dataclass
class Evaluator:
    """The FP32 outputs of every evaluation batch, and a way to score a variant against them."""

    graph: Graph
    source: DataSource
    labels: np.ndarray | None = None
    provider: str | None = None
    threads: int | None = None
    outputs: list[str] = field(default_factory=list)
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)
    batch_labels: list[np.ndarray | None] = field(default_factory=list)
    evaluations: int = 0

    def __post_init__(self) -> None:
        self.outputs = [o.name for o in self.graph.model.graph.output]
        runner = OnnxRuntimeRunner(self.graph.model, self.provider, self.threads)
        seen = 0
        for feed in self.source.batches():
            n = feed_num_samples(feed, self.graph.inputs)
            self.reference.append(runner.infer(feed, self.outputs))
            self.batch_labels.append(self._labels_for(seen, n))
            seen += n
        runner.close()
        if seen == 0:
            raise QuantbenchError(f"{self.source.description}: the evaluation data set is empty")
        if self.labels is not None and seen != len(self.labels):
            raise QuantbenchError(
                f"labels: {len(self.labels)} labels for {seen} evaluation samples"
            )
        self.num_samples = seen
        self.fp32_accuracy = self._fp32_accuracy()

    def _labels_for(self, start: int, n: int) -> np.ndarray | None:
        if self.labels is None:
            return None
        chunk = self.labels[start : start + n]
        if len(chunk) != n:
            raise QuantbenchError(
                f"labels: only {len(self.labels)} labels, more evaluation samples than that"
            )
        return chunk

    def _fp32_accuracy(self) -> float | None:
        acc = AgreementAccumulator()
        for ref, lab in zip(self.reference, self.batch_labels):
            acc.update(ref[self.outputs[0]], ref[self.outputs[0]], lab)
        result = acc.accuracy()
        return None if result is None else result["A"]

    def evaluate(self, model: onnx.ModelProto) -> dict[str, float | None]:
        """Every metric of :data:`METRICS` for ``model`` (same outputs as the FP32 model)."""
        runner = OnnxRuntimeRunner(model, self.provider, self.threads)
        drift = DriftAccumulator()
        agreement = AgreementAccumulator()
        batches = 0
        for index, feed in enumerate(self.source.batches()):
            if index >= len(self.reference):
                raise QuantbenchError(
                    f"{self.source.description}: yields more batches on a second pass; "
                    "evaluation data must be re-readable (a file or folder, not a generator)"
                )
            got = runner.infer(feed, self.outputs)
            ref = self.reference[index]
            for name in self.outputs:
                drift.update(ref[name], got[name])
            agreement.update(ref[self.outputs[0]], got[self.outputs[0]], self.batch_labels[index])
            batches += 1
        runner.close()
        if batches != len(self.reference):
            raise QuantbenchError(
                f"{self.source.description}: yields fewer batches on a second pass; evaluation "
                "data must be re-readable (a file or folder, not a generator)"
            )
        self.evaluations += 1
        return _metrics(drift, agreement)


def _metrics(drift: DriftAccumulator, agreement: AgreementAccumulator) -> dict[str, float | None]:
    d = drift.metrics()
    a = agreement.metrics()
    acc = agreement.accuracy()
    return {
        "top1_agreement": a["agreement"],
        "top5_agreement": a["top5_agreement"],
        "cosine": d["cosine"],
        "sqnr_db": d["sqnr_db"],
        "accuracy": None if acc is None else acc["B"],
        "accuracy_drop": None if acc is None else acc["A"] - acc["B"],
    }


def json_metrics(metrics: dict[str, float | None]) -> dict[str, float | str | None]:
    """Infinite SQNR (identical outputs) as ``"inf"``: JSON has no infinity."""
    out: dict[str, float | str | None] = {}
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = None if math.isnan(value) else ("inf" if value > 0 else "-inf")
        else:
            out[key] = value
    return out
