"""Precision specs -> runnable candidates.

``fp32`` (the model as is), ``fp16`` (onnxruntime's float16 converter, I/O kept FP32),
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
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph, load_model, node_label
from quantbench.stats import StatsFile
from quantbench.table import CalibrationTable

ENGINE_SUFFIXES = (".plan", ".engine", ".trt")


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

    @property
    def is_reference(self) -> bool:
        return self.spec == "fp32"


@dataclass
class CalibrationContext:
    """What an ``int8`` spec is made from: a table, or statistics plus a default method."""

    stats: StatsFile | None = None
    table: CalibrationTable | None = None
    default_method: str = "entropy"
    exclude: list[str] = field(default_factory=list)
    #: data ``int8:auto`` judges the calibrators on (the calibration data by default)
    holdout: object | None = None


def resolve(spec: str, graph: Graph, ctx: CalibrationContext) -> Candidate:
    s = spec.strip()
    low = s.lower()
    if low == "fp32":
        return Candidate("fp32", "FP32", model=graph.model)
    if low == "fp16":
        return Candidate("fp16", "FP16", model=_to_fp16(graph.model))
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
        return Candidate(s, path.name, model=model, quantized=has_qdq)
    raise QuantbenchError(
        f"unknown precision {spec!r}: use fp32, fp16, int8, int8:<method>, a .onnx model or a "
        "TensorRT engine (.plan/.engine)"
    )


def _to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)


def _int8(graph: Graph, ctx: CalibrationContext, method: str | None) -> Candidate:
    from quantbench.calibrate import AUTO, auto_method_table, build_table
    from quantbench.qdq import quantize_model

    if method is None and ctx.table is not None:
        table, label_method = ctx.table, ctx.table.method or "table"
    else:
        m = method or ctx.default_method
        if ctx.stats is None:
            raise QuantbenchError(
                f"int8{':' + method if method else ''} needs calibration: give --calib-data PATH "
                "or --table TABLE"
            )
        if m == AUTO:
            table = auto_method_table(graph, ctx.stats, ctx.holdout)
            label_method = AUTO
        else:
            table, label_method = build_table(ctx.stats, m, graph), registry.canonical(m)
    result = quantize_model(graph, table, exclude=ctx.exclude, allow_partial=True)
    return Candidate(
        spec=f"int8:{label_method}",
        label=f"INT8 ({label_method})",
        model=result.model,
        method=label_method,
        table=table,
        quantized=True,
        excluded=[s.to_dict() for s in result.skipped],
        dynamic_weight_convs=_dynamic_convs(graph, result),
    )


def _dynamic_convs(graph: Graph, result: Any) -> list[dict[str, Any]]:
    """Every dynamic-weight conv: how it was quantized, or why it was not."""
    from quantbench.graph import is_dynamic_weight_conv
    from quantbench.qdq.plan import RUNTIME_WEIGHT

    quantized = {q.node: q for q in result.quantized}
    skipped = {s.node: s.reason for s in result.skipped}
    out = []
    for i, n in enumerate(graph.model.graph.node):
        if not is_dynamic_weight_conv(graph, n):
            continue
        name = node_label(n, i)
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
