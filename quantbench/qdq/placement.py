"""Where Q/DQ goes, following TensorRT's placement recommendations (reference section 4.2).

* Every input of a weighted op (Conv, ConvTranspose, Gemm, MatMul; DWConv2D on request):
  runtime inputs per-tensor with the table's scale, constant weights per-channel from their own
  values. No output quantization.
* A Conv whose kernel is a runtime tensor (TensorRT's ConvMultiInput): per-tensor Q/DQ on both
  data and kernel, the kernel's scale from its *own* calibration entry; the runtime bias stays FP.
* The residual input of an Add that follows a quantized weighted op, so TensorRT can fuse
  Conv+Add with an INT8 output.
* Biases stay FP32. A node is quantized only when *all* its inputs can be: TensorRT expects a
  Q/DQ pair on each input of a quantizable layer, a half-quantized op gains nothing.

This module only decides; :mod:`quantbench.qdq.insert` edits the graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph, residual_add_inputs
from quantbench.qdq.plan import (
    ACTIVATION,
    RESIDUAL,
    RUNTIME_WEIGHT,
    WEIGHT,
    QdqInput,
    QuantizedNode,
    SkippedNode,
)
from quantbench.qdq.weights import constant_values, weight_axis, weight_scale
from quantbench.table import CalibrationTable

#: ops whose inputs quantbench can quantize, and the input slots that get Q/DQ.
QUANTIZABLE_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (0, 1),
    "ConvTranspose": (0, 1),
    "Gemm": (0, 1),
    "MatMul": (0, 1),
    "DWConv2D": (0, 1),
}
DEFAULT_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_KERNEL_OPS = ("Conv", "ConvTranspose", "DWConv2D")


@dataclass(frozen=True)
class PlacementOptions:
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    exclude: tuple[str, ...] = ()
    per_channel: bool = True
    quantize_residual: bool = True


@dataclass
class Placement:
    """The decision for one model, before any graph edit."""

    quantized: list[QuantizedNode] = field(default_factory=list)
    skipped: list[SkippedNode] = field(default_factory=list)
    folds: dict[str, np.ndarray] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def needed_tensors(self) -> list[str]:
        """Runtime tensors whose table entries the quantized nodes use."""
        names = [i.tensor for q in self.quantized for i in q.inputs if i.role in _TABLE_ROLES]
        return list(dict.fromkeys(names))


_TABLE_ROLES = (ACTIVATION, RUNTIME_WEIGHT, RESIDUAL)


class Exclusions:
    """User exclusions: exact node names or regular expressions matched against the whole name."""

    def __init__(self, patterns: list[str] | tuple[str, ...], node_names: list[str]) -> None:
        self.patterns = list(patterns)
        names = set(node_names)
        self._compiled: list[tuple[str, re.Pattern[str] | None]] = []
        for pattern in self.patterns:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                if pattern in names:  # an exact node name that happens not to be a regex
                    compiled = None
                else:
                    raise QuantbenchError(
                        f"exclude pattern {pattern!r} is not a node name and not a valid regular "
                        f"expression ({exc}); escape special characters or fix the pattern"
                    ) from None
            self._compiled.append((pattern, compiled))
        self._used: set[str] = set()

    def match(self, node_name: str) -> str | None:
        for pattern, compiled in self._compiled:
            if node_name == pattern or (compiled is not None and compiled.fullmatch(node_name)):
                self._used.add(pattern)
                return pattern
        return None

    def unused(self) -> list[str]:
        return [p for p in self.patterns if p not in self._used]


def validate_op_types(op_types: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    unknown = [op for op in op_types if op not in QUANTIZABLE_INPUTS]
    if unknown:
        raise QuantbenchError(
            f"op_types: {', '.join(map(repr, unknown))} cannot be quantized by quantbench; "
            f"choose from {', '.join(QUANTIZABLE_INPUTS)} (TensorRT Q/DQ placement quantizes the "
            "inputs of weighted ops; other layers follow through Q/DQ propagation)"
        )
    return tuple(dict.fromkeys(op_types))


@dataclass
class ConstantInputs:
    """What placement reads from a graph's constant inputs: their values and each weight
    input's decision (its scale, or why it is not quantized), for one set of op types. Kept by
    whoever quantizes one graph with many tables (``--method auto``'s candidates, the recovery
    loop): the per-channel maxima of dddd-ocr's weights cost 75 ms a call."""

    values: dict[str, np.ndarray | str]
    decided: dict[tuple[str, int, str, bool], QdqInput | str] = field(default_factory=dict)


def constant_inputs(g: Graph, op_types: tuple[str, ...]) -> ConstantInputs:
    """The constant inputs of ``g``'s nodes of ``op_types``, none decided yet."""
    return ConstantInputs(constant_values(g.model, _constant_inputs(g, op_types)))


def plan_placement(
    g: Graph,
    table: CalibrationTable,
    options: PlacementOptions,
    constants: ConstantInputs | None = None,
) -> Placement:
    """Decide, node by node, what gets Q/DQ and what stays high precision (with the reason).
    ``constants``: :func:`constant_inputs` of ``g`` for ``options.op_types``, kept from an
    earlier call on the same graph."""
    exclusions = Exclusions(options.exclude, [n.name for n in g.model.graph.node])
    placement = Placement()
    constants = constants or constant_inputs(g, options.op_types)
    values = constants.values
    initializers = {init.name for init in g.model.graph.initializer}
    graph_outputs = {o.name for o in g.model.graph.output}
    wanted = set(options.op_types)
    decided: dict[str, QuantizedNode | SkippedNode] = {}

    for node in g.model.graph.node:
        if node.op_type not in QUANTIZABLE_INPUTS:
            continue
        if node.op_type not in wanted:
            decided[node.name] = SkippedNode(
                node.name, node.op_type, f"op type {node.op_type} not in op_types"
            )
            continue
        pattern = exclusions.match(node.name)
        if pattern is not None:
            decided[node.name] = SkippedNode(
                node.name, node.op_type, f"excluded by user ({pattern!r})"
            )
            continue
        decided[node.name] = _plan_weighted(g, node, table, options, constants, placement)

    quantized_names = {n for n, d in decided.items() if isinstance(d, QuantizedNode)}
    for add_name, decision in _plan_residuals(
        g, table, options, exclusions, quantized_names, placement
    ).items():
        decided[add_name] = decision

    order = {n.name: i for i, n in enumerate(g.model.graph.node)}
    for name in sorted(decided, key=order.__getitem__):
        decision = decided[name]
        target = placement.quantized if isinstance(decision, QuantizedNode) else placement.skipped
        target.append(decision)  # type: ignore[arg-type]

    for q in placement.quantized:
        for i in q.inputs:
            if i.role == WEIGHT and i.tensor not in initializers and i.tensor not in graph_outputs:
                placement.folds[i.tensor] = values[i.tensor]  # type: ignore[assignment]
    placement.warnings += [
        f"exclude pattern {p!r} matched no node (a pattern matches whole node names: "
        f"{p + '.*'!r} for names that start with it)"
        for p in exclusions.unused()
    ]
    placement.missing = list(dict.fromkeys(placement.missing))
    placement.invalid = list(dict.fromkeys(placement.invalid))
    return placement


def _constant_inputs(g: Graph, op_types: tuple[str, ...]) -> list[str]:
    wanted = set(op_types)
    names = [
        node.input[i]
        for node in g.model.graph.node
        if node.op_type in wanted
        for i in QUANTIZABLE_INPUTS[node.op_type]
        if i < len(node.input) and node.input[i] in g.constants
    ]
    return list(dict.fromkeys(names))


def _plan_weighted(
    g: Graph,
    node: onnx.NodeProto,
    table: CalibrationTable,
    options: PlacementOptions,
    constants: ConstantInputs,
    placement: Placement,
) -> QuantizedNode | SkippedNode:
    inputs: list[QdqInput] = []
    reasons: list[str] = []
    for index in QUANTIZABLE_INPUTS[node.op_type]:
        tensor = node.input[index] if index < len(node.input) else ""
        if not tensor:
            reasons.append(f"input {index} is missing")
            continue
        decision = (
            _decided_constant(node, index, tensor, constants, options.per_channel)
            if tensor in g.constants
            else _runtime_input(g, node, index, tensor, table, placement)
        )
        if isinstance(decision, str):
            reasons.append(decision)
        else:
            inputs.append(decision)
    if reasons:
        return SkippedNode(node.name, node.op_type, "; ".join(reasons))
    return QuantizedNode(node.name, node.op_type, tuple(inputs))


def _decided_constant(
    node: onnx.NodeProto, index: int, tensor: str, constants: ConstantInputs, per_channel: bool
) -> QdqInput | str:
    """:func:`_constant_input`, once per node input for the graph ``constants`` belongs to."""
    key = (node.name, index, tensor, per_channel)
    if key not in constants.decided:
        values = constants.values[tensor]
        constants.decided[key] = _constant_input(node, index, tensor, values, per_channel)
    return constants.decided[key]


def _constant_input(
    node: onnx.NodeProto, index: int, tensor: str, values: np.ndarray | str, per_channel: bool
) -> QdqInput | str:
    if isinstance(values, str):
        return f"weight {tensor!r}: {values}"
    if values.dtype != np.float32:
        return (
            f"weight {tensor!r} is {values.dtype.name}; quantbench emits Q/DQ for float32 tensors "
            "only (a float16/bfloat16 model file is widened first; a model proto: "
            "quantbench.model.widen.widen_to_float32)"
        )
    if not np.isfinite(values).all():
        return f"weight {tensor!r} contains NaN or Inf"
    axis = weight_axis(node, index, values.shape) if per_channel else None
    if node.op_type == "DWConv2D":
        axis = None  # the plugin takes one weight_scale attribute
    return QdqInput(index, tensor, WEIGHT, weight_scale(values, axis), axis)


def _runtime_input(
    g: Graph,
    node: onnx.NodeProto,
    index: int,
    tensor: str,
    table: CalibrationTable,
    placement: Placement,
) -> QdqInput | str:
    is_kernel = index == 1 and node.op_type in _KERNEL_OPS
    role = RUNTIME_WEIGHT if is_kernel else ACTIVATION
    dtype_problem = _dtype_problem(g, tensor, placement)
    if dtype_problem:
        return dtype_problem
    scale = _table_scale(table, tensor, placement)
    if isinstance(scale, str):
        if is_kernel and tensor not in table:
            return f"runtime weight {tensor!r} has no calibration entry"
        return scale
    return QdqInput(index, tensor, role, scale, None)


def _dtype_problem(g: Graph, tensor: str, placement: Placement) -> str | None:
    elem = g.elem_types.get(tensor)
    if elem is None:
        placement.warnings.append(
            f"type of {tensor!r} is unknown (shape inference stops at custom ops); assumed float32"
        )
        return None
    if elem != onnx.TensorProto.FLOAT:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem).name
        return f"input {tensor!r} is {dtype}; quantbench emits Q/DQ for float32 tensors only"
    return None


def _table_scale(table: CalibrationTable, tensor: str, placement: Placement) -> np.ndarray | str:
    if tensor not in table:
        placement.missing.append(tensor)
        return f"input {tensor!r} has no calibration entry"
    entry = table.entries[tensor]
    if entry.amax == 0:  # e.g. an LSTM's initial state: zero for every sample, exact in FP32
        return f"input {tensor!r} was zero in every calibration sample: nothing to quantize"
    if problem := entry.problem():
        placement.invalid.append(tensor)
        return f"input {tensor!r} has an unusable calibration entry ({problem})"
    return np.asarray(np.float32(entry.scale), dtype=np.float32)


def _plan_residuals(
    g: Graph,
    table: CalibrationTable,
    options: PlacementOptions,
    exclusions: Exclusions,
    quantized_names: set[str],
    placement: Placement,
) -> dict[str, QuantizedNode | SkippedNode]:
    """Q/DQ for the residual input of each Add fed by a weighted op (reference 4.2 item 4)."""
    nodes = {n.name: n for n in g.model.graph.node}
    producers = g.producers()
    out: dict[str, QuantizedNode | SkippedNode] = {}
    for add_name, residual in residual_add_inputs(g, options.op_types).items():
        add = nodes[add_name]
        fused = [producers[t].name for t in add.input if t != residual and t in producers]
        if not options.quantize_residual:
            out[add_name] = SkippedNode(add_name, "Add", "residual quantization disabled")
            continue
        pattern = exclusions.match(add_name)
        if pattern is not None:
            out[add_name] = SkippedNode(add_name, "Add", f"excluded by user ({pattern!r})")
            continue
        if not any(name in quantized_names for name in fused):
            out[add_name] = SkippedNode(
                add_name, "Add", f"the weighted op before it ({', '.join(fused)}) is not quantized"
            )
            continue
        scale = _table_scale(table, residual, placement)
        if isinstance(scale, str):
            out[add_name] = SkippedNode(add_name, "Add", f"residual {scale}")
            continue
        index = list(add.input).index(residual)
        out[add_name] = QuantizedNode(
            add_name, "Add", (QdqInput(index, residual, RESIDUAL, scale, None),)
        )
    return out
