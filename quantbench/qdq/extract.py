"""Read activation scales back out of a Q/DQ model (ours, ModelOpt's, a QAT export).

Each per-tensor QuantizeLinear on a runtime tensor gives that tensor an entry with
``amax = scale * 127``; the table codecs then write it as a TensorRT cache or JSON. Weight
quantizers (constant input) and per-channel quantizers have no place in a per-tensor table and
are counted, not converted; so are the second stages of two-stage activations
(:mod:`quantbench.refine.twostage`), which quantize a residual no FP32 model holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantbench.model.graph import constant_tensors, load_model, second_stage_quantizers
from quantbench.qdq.embedded import embedded_table
from quantbench.table import CalibrationTable, TableEntry, scale_from_amax

_QDQ_METHOD = "qdq"


@dataclass
class QdqScales:
    """The table plus what did not fit in it."""

    table: CalibrationTable
    weight_quantizers: list[str] = field(default_factory=list)
    per_channel_activations: list[str] = field(default_factory=list)
    asymmetric: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    non_constant_scales: list[str] = field(default_factory=list)
    second_stages: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{len(self.table)} activation scales"]
        for label, names in (
            ("weight quantizers skipped", self.weight_quantizers),
            ("per-channel activation quantizers skipped", self.per_channel_activations),
            ("asymmetric quantizers converted to symmetric amax", self.asymmetric),
            ("tensors with conflicting scales (first kept)", self.conflicts),
            ("quantizers with runtime scales skipped", self.non_constant_scales),
            ("second-stage (two-stage) quantizers skipped", self.second_stages),
        ):
            if names:
                parts.append(f"{len(names)} {label}")
        return ", ".join(parts)


def read_qdq_scales(model: onnx.ModelProto | str | Path) -> QdqScales:
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    constants = constant_tensors(proto)
    values = _constant_values(proto)
    embedded = embedded_table(proto)
    table = CalibrationTable(method=embedded.method if embedded else _QDQ_METHOD)
    if embedded is not None:
        table.algorithm, table.provenance = embedded.algorithm, embedded.provenance
    result = QdqScales(table)
    second = {n.output[0] for n in second_stage_quantizers(proto)}
    for node in proto.graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        label = node.name or node.output[0]
        tensor = node.input[0]
        if node.output[0] in second:
            result.second_stages.append(label)
            continue
        if tensor in constants:
            result.weight_quantizers.append(label)
            continue
        scale = values.get(node.input[1])
        if scale is None:
            result.non_constant_scales.append(label)
            continue
        if scale.size != 1:
            result.per_channel_activations.append(label)
            continue
        zero_point = values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        entry, symmetric = _entry(np.float32(scale.reshape(())), zero_point, embedded, tensor)
        if not symmetric:
            result.asymmetric.append(tensor)
        if tensor in table:
            if np.float32(table.scale(tensor)) != np.float32(entry.scale):
                result.conflicts.append(tensor)
            continue
        table.entries[tensor] = entry
    return result


def table_from_qdq(model: onnx.ModelProto | str | Path) -> CalibrationTable:
    """Per-tensor activation amax of a Q/DQ model (see :func:`read_qdq_scales` for the rest)."""
    return read_qdq_scales(model).table


def _entry(
    scale: np.float32,
    zero_point: np.ndarray | None,
    embedded: CalibrationTable | None,
    tensor: str,
) -> tuple[TableEntry, bool]:
    """The tensor's entry, and whether its quantizer was TensorRT-style (int8, zero-point 0)."""
    if zero_point is None:  # ONNX default: uint8 with zero-point 0
        zero_point = np.zeros((), dtype=np.uint8)
    info = np.iinfo(zero_point.dtype)
    zp = int(zero_point.reshape(-1)[0])
    if zero_point.dtype == np.int8 and zp == 0:
        if embedded is not None and tensor in embedded:
            amax = embedded.amax(tensor)
            if scale_from_amax(amax) == scale:
                return TableEntry(amax, embedded.entries[tensor].method or embedded.method), True
        return TableEntry.from_scale(scale, _QDQ_METHOD), True
    amax = float(np.float32(max(abs(info.min - zp), abs(info.max - zp))) * scale)
    return TableEntry(amax, _QDQ_METHOD), False


def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs (where Q/DQ scales and zero points live)."""
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.output:
            continue
        for attr in node.attribute:
            if attr.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr.name == "value_float":
                values[node.output[0]] = np.asarray(attr.f, dtype=np.float32)
            elif attr.name == "value_floats":
                values[node.output[0]] = np.asarray(attr.floats, dtype=np.float32)
    return values
