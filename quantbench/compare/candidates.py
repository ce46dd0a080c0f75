"""Precision specs -> runnable candidates.

``fp32`` (the model as is), ``fp16`` (:func:`quantbench.fp16.fp16_model`: onnxruntime's FP16
kernels where the provider has them, else FP16 storage emulated; I/O kept FP32),
``int8`` / ``int8:<method>`` (quantbench's Q/DQ model from calibration statistics or a
``--table``), a path to an ONNX model, or a TensorRT engine (``.plan``/``.engine``, needs the
TensorRT backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from quantbench import calibrators as registry
from quantbench.backends.onnxruntime import resolve_provider
from quantbench.calibrate import method_table
from quantbench.choose.clipguard import DEFAULT_CLIP_WARN, ClipFlag, clip_flags, clip_warning
from quantbench.errors import QuantbenchError
from quantbench.fp16 import FP32, NATIVE, Fp16Model, declared_precisions, fp16_model
from quantbench.model.graph import Graph, calibration_tensors, load_model, node_labels
from quantbench.progress import warn
from quantbench.qdq import quantize_model
from quantbench.stats.tensorstats import StatsFile
from quantbench.table import CalibrationTable

ENGINE_SUFFIXES = (".plan", ".engine", ".trt")
AUTO = registry.AUTO


@dataclass
class Candidate:
    """One side of a comparison."""

    spec: str
    label: str
    backend: str = "onnxruntime"
    model: onnx.ModelProto | None = None
    engine_path: Path | None = None
    method: str | None = None
    table: CalibrationTable | None = None
    quantized: bool = False
    excluded: list[dict[str, Any]] = field(default_factory=list)
    dynamic_weight_convs: list[dict[str, Any]] = field(default_factory=list)
    #: the table checks' findings (another model's table, missing/extra tensors ...)
    warnings: list[str] = field(default_factory=list)
    #: tensors whose threshold clips more than the context's ``clip_warn``
    clipping: list[dict[str, Any]] = field(default_factory=list)
    #: ``int8:auto``: every candidate's output score and the per-tensor choices
    auto: dict[str, Any] | None = None
    #: ``fp16``: how FP16 was computed, per-node precision and the nodes left in FP32
    fp16: Fp16Model | None = None
    #: node label -> "fp32" | "fp16" | "fp16-emulated" | "int8" (compute nodes only)
    precisions: dict[str, str] = field(default_factory=dict)
    #: the onnxruntime provider the candidate was made for
    provider: str = "CPUExecutionProvider"

    def precision_record(self) -> dict[str, Any]:
        """The candidate record's precision part: FP16 mode/share/ops left in FP32, counts."""
        counts: dict[str, int] = {}
        for p in self.precisions.values():
            counts[p] = counts.get(p, 0) + 1
        record: dict[str, Any] = {"op_precisions": counts}
        if self.fp16 is not None:
            record["fp16"] = self.fp16.to_dict(self.provider)
        return record

    @property
    def is_reference(self) -> bool:
        return self.spec == "fp32"


@dataclass
class CalibrationContext:
    """What an ``int8`` spec is made from: a table, or statistics plus a default method."""

    stats: StatsFile | None = None
    table: CalibrationTable | None = None
    default_method: str = registry.DEFAULT_METHOD
    exclude: list[str] = field(default_factory=list)
    #: the calibration data (``int8:auto`` judges on its first samples unless ``holdout_data``)
    calib_data: object | None = None
    holdout_data: object | None = None
    batch_size: int | None = None
    preset: str | None = None
    provider: str | None = None
    #: apply a table made for another model / not covering every tensor to quantize
    allow_partial: bool = False
    clip_warn: float = DEFAULT_CLIP_WARN
    #: ``--auto-budget``: seconds an ``int8:auto`` candidate's judging may take
    auto_budget: float | None = None
    #: what resolving each int8 candidate found, for the results JSON ``calibration`` section
    findings: dict[str, Candidate] = field(default_factory=dict)

    def findings_section(self) -> dict[str, Any]:
        """``clip_warn``, the flagged tensors of every int8 candidate, and ``auto``'s record."""
        section: dict[str, Any] = {"clip_warn": self.clip_warn, "clipping": []}
        for spec, c in self.findings.items():
            section["clipping"] += [{"candidate": spec, **f} for f in c.clipping]
            if c.auto is not None:
                section["auto"] = c.auto
        return section


def resolve(spec: str, graph: Graph, ctx: CalibrationContext) -> Candidate:
    s = spec.strip()
    low = s.lower()
    if low == "fp32":
        precisions = {n: FP32 for n in declared_precisions(graph.model)}
        return Candidate("fp32", "FP32", model=graph.model, precisions=precisions)
    if low == "fp16":
        provider = resolve_provider(ctx.provider)
        converted = fp16_model(graph.model, provider=provider, types=graph.elem_types)
        label = "FP16" if converted.mode == NATIVE else "FP16 (emulated)"
        return Candidate(
            "fp16",
            label,
            model=converted.model,
            fp16=converted,
            precisions=dict(converted.precision),
            provider=provider,
        )
    if low == "int8" or low.startswith("int8:"):
        method = s.partition(":")[2] or None
        return _int8(graph, ctx, method)
    path = Path(s)
    if path.suffix in ENGINE_SUFFIXES:
        if not path.is_file():
            raise QuantbenchError(f"{path}: engine file not found")
        return Candidate(s, path.name, backend="tensorrt", engine_path=path)
    if path.suffix == ".onnx" or path.is_file():
        model = load_model(path)
        has_qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
        precisions = declared_precisions(model)
        return Candidate(s, path.name, model=model, quantized=has_qdq, precisions=precisions)
    raise QuantbenchError(
        f"unknown precision {spec!r}: use fp32, fp16, int8, int8:<method>, a .onnx model or a "
        "TensorRT engine (.plan/.engine)"
    )


def _int8(graph: Graph, ctx: CalibrationContext, method: str | None) -> Candidate:
    auto = None
    flags: list[ClipFlag] = []
    if method is None and ctx.table is not None:
        table, label_method = ctx.table, ctx.table.method or "table"
    else:
        m = method or ctx.default_method
        if ctx.stats is None:
            raise QuantbenchError(
                f"int8{':' + method if method else ''} needs calibration: give --calib-data PATH "
                "or --table TABLE"
            )
        label_method = m if m == AUTO else registry.canonical(m)
        table, auto = method_table(
            graph,
            ctx.stats,
            m,
            ctx.calib_data,
            ctx.holdout_data,
            batch_size=ctx.batch_size,
            preset=ctx.preset,
            provider=ctx.provider,
            auto_budget=ctx.auto_budget,
        )
    if ctx.stats is not None:  # a given table is judged too when statistics are at hand
        flags = clip_flags(
            ctx.stats, table, ctx.clip_warn, calibration_tensors(graph, "quantizable")
        )
        if text := clip_warning(
            flags, ctx.clip_warn, f"int8:{label_method}", listed_by="--json FILE",
            note=auto.clip_note() if auto is not None else "",
        ):  # fmt: skip
            warn(text)
    result = quantize_model(graph, table, exclude=ctx.exclude, allow_partial=ctx.allow_partial)
    result.require_quantized(f"int8:{label_method}")
    for w in result.warnings:
        warn(f"int8:{label_method}: {w}")
    candidate = Candidate(
        spec=f"int8:{label_method}",
        label=f"INT8 ({label_method})",
        model=result.model,
        method=label_method,
        table=table,
        quantized=True,
        excluded=[s.to_dict() for s in result.skipped],
        dynamic_weight_convs=_dynamic_convs(graph, result),
        warnings=list(result.warnings),
        clipping=[f.to_dict() for f in flags],
        auto=None if auto is None else auto.to_dict(),
        precisions=declared_precisions(result.model),
    )
    ctx.findings[candidate.spec] = candidate
    return candidate


def _dynamic_convs(graph: Graph, result: Any) -> list[dict[str, Any]]:
    """Every dynamic-weight conv: how it was quantized, or why it was not."""
    from quantbench.model.graph import is_dynamic_weight_conv
    from quantbench.qdq.plan import RUNTIME_WEIGHT

    quantized = {q.node: q for q in result.quantized}
    skipped = {s.node: s.reason for s in result.skipped}
    out = []
    labels = node_labels(graph.model.graph.node)
    for i, n in enumerate(graph.model.graph.node):
        if not is_dynamic_weight_conv(graph, n):
            continue
        name = labels[i]
        q = quantized.get(name)
        weight = next((x for x in q.inputs if x.role == RUNTIME_WEIGHT), None) if q else None
        out.append(
            {
                "node": name,
                "data_tensor": n.input[0],
                "weight_tensor": n.input[1],
                "quantized": q is not None,
                "weight_amax": None
                if weight is None
                else float(weight.scale.reshape(-1)[0]) * 127.0,
                "reason": skipped.get(name, ""),
            }
        )
    return out
