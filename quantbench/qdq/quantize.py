"""``quantize_model``: a float ONNX model plus a CalibrationTable -> a Q/DQ model for TensorRT.

Steps, each its own module: strip existing Q/DQ (:mod:`.strip`, only with ``requantize``),
upgrade the opset (:mod:`.opset`), decide placement (:mod:`.placement`), edit the graph
(:mod:`.insert`), record the table in the model (:mod:`.embedded`). Every user mistake is found
before the graph is edited and nothing is written here; :func:`write_quantized` writes atomically.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx

from quantbench.errors import QuantbenchError, first_line
from quantbench.model.customops import checkable
from quantbench.model.graph import Graph, check_float_model, node_labels, open_graph
from quantbench.model.protosize import check_model, save_model
from quantbench.qdq.embedded import embed_table
from quantbench.qdq.insert import QdqEdit, insert_qdq
from quantbench.qdq.opset import OpsetDecision, ensure_qdq_opset
from quantbench.qdq.placement import (
    DEFAULT_OP_TYPES,
    ConstantInputs,
    Exclusions,
    Placement,
    PlacementOptions,
    constant_inputs,
    plan_placement,
    validate_op_types,
)
from quantbench.qdq.plan import QuantizeResult
from quantbench.qdq.strip import qdq_nodes, strip_qdq
from quantbench.table import CalibrationTable
from quantbench.table.coverage import provenance_problem

_EXAMPLES = 3


def quantize_model(
    graph_or_path: Graph | onnx.ModelProto | str | os.PathLike[str],
    table: CalibrationTable,
    *,
    op_types: Iterable[str] = DEFAULT_OP_TYPES,
    exclude: Iterable[str] = (),
    per_channel: bool = True,
    quantize_residual: bool = True,
    allow_partial: bool = False,
    requantize: bool = False,
    checked: bool = True,
) -> QuantizeResult:
    """Place Q/DQ the way TensorRT fuses it; see :mod:`quantbench.qdq` for the rules.

    ``exclude``: node names or regular expressions (matched against the whole name) to keep in
    high precision. ``allow_partial``: quantize what the table covers and list the rest instead
    of refusing. ``requantize``: strip the model's existing Q/DQ first instead of refusing.
    ``checked=False``: skip the ONNX checker on the result (a bug guard that serialises the
    whole model, 0.1 s a call on a 50 MB model), for models only onnxruntime will load
    (``--method auto``'s candidates: a model it refuses is reported as quantbench's fault).
    """
    source = graph_or_path if isinstance(graph_or_path, Graph) else open_graph(graph_or_path)
    label = str(source.path) if source.path else f"model {source.name!r}"
    check_float_model(source)
    op_types = validate_op_types(tuple(op_types))
    exclude = tuple(exclude)
    if source.path is None:
        _check_input(source.model, label)
    ready = _qdq_ready(graph_or_path, source, per_channel, requantize, exclude, label)
    decision, g, constants = ready.decision, ready.graph, ready.constants
    warnings = list(ready.renamed)
    if not ready.stripped:
        warnings += _check_provenance(source, table, allow_partial, label)
    warnings += decision.warnings
    options = PlacementOptions(op_types, exclude, decision.per_channel, quantize_residual)
    if op_types not in constants:
        constants[op_types] = constant_inputs(g, op_types)
    placement = plan_placement(g, table, options, constants[op_types])
    warnings += _check_coverage(g, table, placement, allow_partial, label)
    warnings += placement.warnings

    quantized_model, pairs = _inserted(ready, placement)
    embed_table(quantized_model, table, placement.needed_tensors())
    if checked:
        _check_output(quantized_model, label)
    return QuantizeResult(
        model=quantized_model,
        quantized=placement.quantized,
        skipped=placement.skipped,
        warnings=list(dict.fromkeys(warnings)),
        opset_from=decision.opset_from,
        opset_to=decision.opset_to,
        per_channel=decision.per_channel,
        qdq_pairs=pairs,
        not_quantizable=dict(
            Counter(n.op_type for n in source.model.graph.node if n.op_type in RECURRENT_OPS)
        ),
    )


#: weighted ops with no INT8 Q/DQ form in TensorRT (its RNN layers run in FP32/FP16)
RECURRENT_OPS = ("LSTM", "GRU", "RNN")


@dataclass
class _Ready:
    """A source graph's Q/DQ-ready form: the opset decision, the graph derived from it,
    placement's findings about its constants per op-type set, and what preparing it found
    (nodes renamed, existing Q/DQ stripped)."""

    decision: OpsetDecision
    graph: Graph
    constants: dict[tuple[str, ...], ConstantInputs]
    renamed: list[str]
    stripped: bool
    #: kept for later calls (the source is a Graph): the edit below is kept too
    kept: bool = False
    #: the last Q/DQ edit of this graph, which a placement differing only in scales reuses
    edit: QdqEdit | None = None


def _inserted(ready: _Ready, placement: Placement) -> tuple[onnx.ModelProto, int]:
    """``ready``'s graph with ``placement``'s Q/DQ inserted and the number of pairs: the last
    edit rescaled where only the scales differ (:class:`QdqEdit`), else a new edit."""
    quantized, folds = placement.quantized, placement.folds
    if ready.edit is not None:
        model = ready.edit.rescaled(quantized, folds)
        if model is not None:
            return model, len(ready.edit.scale_names)
    made = insert_qdq(ready.graph.model, quantized, folds)
    if ready.kept:  # the graph will be quantized again
        ready.edit = QdqEdit.of(ready.graph.model, made, quantized, folds)
    return made[0], len(made[1])


#: the last source graph's :class:`_Ready` form, with the source (weakly), its node and
#: initializer counts, per_channel and requantize. ``--method auto`` and the recovery loop
#: quantize one model with many tables or exclusion sets, and the working copy (a whole model:
#: 54 MB for dddd-ocr), the opset upgrade (version_converter and the checker: 0.4 s a call on
#: dddd-ocr's opset 12), the graph's derivation (0.16 s) and the weights' scales (75 ms) depend
#: on neither. The entry is dropped with its source.
_READY: list[tuple[weakref.ref[Graph], int, bool, bool, _Ready]] = []


def _qdq_ready(
    graph_or_path: object,
    source: Graph,
    per_channel: bool,
    requantize: bool,
    exclude: tuple[str, ...],
    label: str,
) -> _Ready:
    """The Q/DQ-ready form of ``source``, prepared once per source :class:`Graph` (a Graph's
    model is never changed in place; its node and initializer counts are compared too, a cheap
    guard: ByteSize costs 75 ms). ``exclude``'s regular expressions are checked either way."""
    cacheable = isinstance(graph_or_path, Graph)
    size = _shape_of(source.model) if cacheable else -1
    for cached, cached_size, pc, rq, ready in _READY:
        if cached() is source and cached_size == size and (pc, rq) == (per_channel, requantize):
            Exclusions(exclude, [n.name for n in ready.graph.model.graph.node])
            return ready
    model = onnx.ModelProto()
    model.CopyFrom(source.model)
    renamed = name_nodes(model)
    Exclusions(exclude, [n.name for n in model.graph.node])  # bad regexes fail before any work
    stripped = _strip_existing(model, requantize, label)
    decision = ensure_qdq_opset(stripped if stripped is not None else model, per_channel)
    g = open_graph(decision.model, require_fixed_rank=False)
    ready = _Ready(decision, g, {}, renamed, stripped is not None, kept=cacheable)
    if cacheable:
        _READY[:] = [(weakref.ref(source), size, per_channel, requantize, ready)]
        weakref.finalize(source, _READY.clear)  # gone with its graph, not kept for the process
    return ready


def qdq_ready_model(source: Graph) -> onnx.ModelProto | None:
    """The float model :func:`quantize_model` last edited for ``source`` (its nodes named, its
    opset upgraded for Q/DQ), while it is kept; None otherwise, or where preparing it stripped
    existing Q/DQ. It is ``source``'s model at the Q/DQ models' opset: a judge that runs the
    FP32 model beside them (``auto``'s isolated pass) reads it instead of converting its own
    copy (a whole model: 54 MB on dddd-ocr, opset 12). Never to be changed in place."""
    for cached, cached_size, _, _, ready in _READY:
        if cached() is source and cached_size == _shape_of(source.model) and not ready.stripped:
            return ready.graph.model
    return None


def _shape_of(model: onnx.ModelProto) -> int:
    return len(model.graph.node) * 2**32 + len(model.graph.initializer)


def write_quantized(result: QuantizeResult, path: str | os.PathLike[str]) -> Path:
    """Write the Q/DQ model atomically (a crash never leaves half a model); over 2 GiB, its
    weights in a ``.data`` file beside it (:func:`quantbench.model.protosize.save_model`)."""
    return save_model(result.model, path)


def name_nodes(model: onnx.ModelProto) -> list[str]:
    """Give unnamed nodes their stable label and make duplicate names unique.

    The plan, exclusions and reports refer to nodes by name, so every node needs its own.
    """
    renamed: list[str] = []
    for node, name in zip(model.graph.node, node_labels(model.graph.node), strict=True):
        if node.name and name != node.name:
            renamed.append(f"duplicate node name {node.name!r} renamed to {name!r}")
        node.name = name
    return renamed


def _check_input(model: onnx.ModelProto, label: str) -> None:
    try:
        check_model(checkable(model))
    except Exception as exc:  # noqa: BLE001
        first = first_line(exc)
        raise QuantbenchError(f"{label}: invalid ONNX model: {first}") from None


def _check_output(model: onnx.ModelProto, label: str) -> None:
    """A bug guard: the emitted model must pass the checker (custom DWConv2D ops aside)."""
    try:
        check_model(checkable(model))
    except Exception as exc:
        raise RuntimeError(f"{label}: quantbench produced an invalid Q/DQ model: {exc}") from exc


def _strip_existing(model: onnx.ModelProto, requantize: bool, label: str) -> onnx.ModelProto | None:
    existing = qdq_nodes(model)
    if not existing:
        return None
    if not requantize:
        raise QuantbenchError(
            f"{label}: already has {len(existing)} QuantizeLinear/DequantizeLinear nodes; pass "
            "requantize=True (--requantize) to strip them and quantize again"
        )
    return strip_qdq(model)


def _check_provenance(
    source: Graph, table: CalibrationTable, allow_partial: bool, label: str
) -> list[str]:
    """A table records the hash of the model it was calibrated on; another hash is refused."""
    message = provenance_problem(table, source.hash)
    if message is None or source.made_for(table.provenance.model_hash):
        return []
    if allow_partial:
        return [f"{message}; applied to the tensors both share (allow_partial)"]
    raise QuantbenchError(
        f"{label}: {message}; calibrate this model, or use --allow-partial to apply the "
        "matching tensors anyway"
    )


def _check_coverage(
    g: Graph, table: CalibrationTable, placement: Placement, allow_partial: bool, label: str
) -> list[str]:
    """Refuse a table that does not cover the tensors to quantize (unless allow_partial)."""
    model_tensors = _tensor_names(g.model)
    extra = [name for name in table if name not in model_tensors]
    notes: list[str] = []
    if placement.invalid:
        bad = ", ".join(
            f"{t} ({table.entries[t].problem()})" for t in placement.invalid[:_EXAMPLES]
        )
        message = f"{len(placement.invalid)} tensors to quantize have no usable scale, e.g. {bad}"
        if not allow_partial:
            raise QuantbenchError(
                f"{label}: {message}; recalibrate them or use --allow-partial to quantize only "
                "the rest"
            )
        notes.append(f"{message}; their ops stay high precision")
    if placement.missing:
        message = (
            f"calibration table lacks tensors to quantize: {len(placement.missing)} missing, "
            f"e.g. {', '.join(placement.missing[:_EXAMPLES])}"
        )
        if extra:
            message += (
                f"; it has {len(extra)} entries for tensors this model does not have (e.g. "
                f"{', '.join(extra[:_EXAMPLES])}): is it for another model?"
            )
        if not allow_partial:
            raise QuantbenchError(
                f"{label}: {message}; use --allow-partial to quantize only the rest"
            )
        notes.append(f"{message}; their ops stay high precision")
    elif extra:
        notes.append(
            f"calibration table has {len(extra)} entries for tensors this model does not have "
            f"(e.g. {', '.join(extra[:_EXAMPLES])}); they are ignored"
        )
    return notes


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    names = {v.name for v in model.graph.input} | {i.name for i in model.graph.initializer}
    names.update(o for n in model.graph.node for o in n.output if o)
    return names
