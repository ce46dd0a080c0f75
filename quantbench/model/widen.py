"""A float16 (or bfloat16) model made float32, for quantization.

quantbench places Q/DQ on float32 tensors (the precision TensorRT calibrates and fuses from), so
a model exported in half precision is widened first: every FP16/BF16 initializer, constant,
cast target, typed attribute and declared tensor type becomes FP32, subgraphs included. Nothing
is rounded: FP16 and BF16 values are all exactly representable in FP32. ``rewrite --to float32``
writes the widening; calibrate, quantize, compare, sensitivity and recover work on it
(:func:`float32_graph`); ``--high-precision fp16`` gives the ops left out of INT8 their FP16
back, and :func:`with_io_types_of` the written model the half model's input and output types.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench.model.graph import Graph, open_graph, rename_tensors
from quantbench.progress import warn

#: element types widened to FLOAT
NARROW_FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
#: integer attributes that name an element type (Cast's to, RandomNormal's dtype, ...)
_TYPE_ATTRIBUTES = ("to", "dtype")


def widen_to_float32(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every FP16/BF16 made FP32, and how many places changed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    changed = _widen_graph(out.graph)
    return out, changed


def float32_graph(graph: Graph) -> Graph | None:
    """``graph``'s exact float32 widening, as ``rewrite --to float32`` writes it (the same
    hash), which remembers the half file it came from (tables and statistics made for that
    apply too: :meth:`Graph.made_for`); None when ``graph`` computes in no half type."""
    if not holds_narrow_floats(graph.model):
        return None
    graph.finish_check()  # an invalid model says so before it is widened
    wide, _ = widen_to_float32(graph.model)
    widened = open_graph(wide)
    widened.path, widened.widened_from = graph.path, graph.hash
    return widened


def float32_work_graph(graph: Graph, command: str, detail: str = "") -> Graph:
    """``graph``, or its float32 widening (:func:`float32_graph`, said once, with ``detail``
    after it) where it computes in a half type: what ``command`` calibrates and quantizes."""
    widened = float32_graph(graph)
    if widened is None:
        return graph
    warn(
        f"{graph.path or graph.model.graph.name}: computes in float16/bfloat16; {command} works "
        f"on its exact float32 widening (as quantbench rewrite --to float32 writes it){detail}"
    )
    return widened


def holds_narrow_floats(
    model: onnx.ModelProto, kinds: tuple[int, ...] = NARROW_FLOATS
) -> bool:
    """Whether ``model`` computes anything in one of ``kinds`` (FP16/BF16): an initializer, a
    graph input or output, a Constant or a Cast target of that type (subgraphs included).
    Reads only: no copy of the model is made."""
    return _narrow_graph(model.graph, kinds)


def _narrow_graph(graph: onnx.GraphProto, kinds: tuple[int, ...]) -> bool:
    if any(t.data_type in kinds for t in graph.initializer):
        return True
    if any(v.type.tensor_type.elem_type in kinds for v in (*graph.input, *graph.output)):
        return True
    return any(_narrow_attribute(a, kinds) for node in graph.node for a in node.attribute)


def _narrow_attribute(attr: onnx.AttributeProto, kinds: tuple[int, ...]) -> bool:
    if attr.type == onnx.AttributeProto.TENSOR:
        return attr.t.data_type in kinds
    if attr.type == onnx.AttributeProto.TENSORS:
        return any(t.data_type in kinds for t in attr.tensors)
    if attr.type == onnx.AttributeProto.GRAPH:
        return _narrow_graph(attr.g, kinds)
    if attr.type == onnx.AttributeProto.GRAPHS:
        return any(_narrow_graph(g, kinds) for g in attr.graphs)
    return attr.type == onnx.AttributeProto.INT and (
        attr.name in _TYPE_ATTRIBUTES and attr.i in kinds
    )


def own_high_precision(model: onnx.ModelProto) -> str:
    """The precision a model's ops left out of INT8 keep by default: "fp16" for a model that
    computes in float16, else "fp32" (bfloat16's range, FP32's, does not fit FP16's)."""
    return "fp16" if holds_narrow_floats(model, (TensorProto.FLOAT16,)) else "fp32"


def _widen_graph(graph: onnx.GraphProto) -> int:
    changed = 0
    for i, init in enumerate(graph.initializer):
        if init.data_type in NARROW_FLOATS:
            graph.initializer[i].CopyFrom(_widened_tensor(init))
            changed += 1
    for sparse in graph.sparse_initializer:
        if sparse.values.data_type in NARROW_FLOATS:
            sparse.values.CopyFrom(_widened_tensor(sparse.values))
            changed += 1
    for info in (*graph.input, *graph.output, *graph.value_info):
        changed += _widen_type(info.type)
    for node in graph.node:
        changed += _widen_node(node)
    return changed


def _widen_node(node: onnx.NodeProto) -> int:
    changed = 0
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in NARROW_FLOATS:
            attr.t.CopyFrom(_widened_tensor(attr.t))
            changed += 1
        elif attr.type == onnx.AttributeProto.TENSORS:
            for t in attr.tensors:
                if t.data_type in NARROW_FLOATS:
                    t.CopyFrom(_widened_tensor(t))
                    changed += 1
        elif attr.type == onnx.AttributeProto.GRAPH:
            changed += _widen_graph(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            changed += sum(_widen_graph(g) for g in attr.graphs)
        elif (
            attr.type == onnx.AttributeProto.INT
            and attr.name in _TYPE_ATTRIBUTES
            and attr.i in NARROW_FLOATS
        ):
            attr.i = TensorProto.FLOAT
            changed += 1
    return changed


def _widen_type(t: onnx.TypeProto) -> int:
    """Tensor element types, also inside sequence, optional and map value types."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(t, kind)
        if inner.elem_type in NARROW_FLOATS:
            inner.elem_type = TensorProto.FLOAT
            return 1
        return 0
    if kind == "sequence_type":
        return _widen_type(t.sequence_type.elem_type)
    if kind == "optional_type":
        return _widen_type(t.optional_type.elem_type)
    if kind == "map_type":
        return _widen_type(t.map_type.value_type)
    return 0


def _widened_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    """The same values as FP32 (exact), name and dims kept; external data is read first."""
    values = numpy_helper.to_array(t).astype(np.float32)
    wide = numpy_helper.from_array(values, t.name)
    wide.doc_string = t.doc_string
    return wide


def with_io_types_of(model: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (made from ``source``'s widening) with ``source``'s half-precision inputs and
    outputs back: a Cast after each such input and before each such output, so that the model
    is a drop-in replacement for ``source`` (its inputs widen exactly; its outputs round to
    the half type, as ``source``'s do)."""
    narrow = {
        v.name: v.type.tensor_type.elem_type
        for v in (*source.graph.input, *source.graph.output)
        if v.type.tensor_type.elem_type in NARROW_FLOATS
    }
    graph = model.graph
    taken = {o for n in graph.node for o in (*n.input, *n.output)} | set(narrow)
    weights = {t.name for t in graph.initializer}
    casts_in, casts_out, rename = [], [], {}
    for v in graph.input:
        if v.name in narrow and v.name not in weights and _is_float32(v):
            wide = rename[v.name] = _fresh(f"{v.name}_float32", taken)
            casts_in.append(helper.make_node("Cast", [v.name], [wide], to=TensorProto.FLOAT,
                                             name=_fresh(f"{v.name}_widen", taken)))  # fmt: skip
            v.type.tensor_type.elem_type = narrow[v.name]
    for v in graph.output:
        if v.name in narrow and _is_float32(v):
            wide = rename[v.name] = _fresh(f"{v.name}_float32", taken)
            casts_out.append(helper.make_node("Cast", [wide], [v.name], to=narrow[v.name],
                                              name=_fresh(f"{v.name}_narrow", taken)))  # fmt: skip
            v.type.tensor_type.elem_type = narrow[v.name]
    rename_tensors(graph, rename)  # before the Casts join: they keep the I/O names
    if casts_in or casts_out:
        nodes = [*casts_in, *graph.node, *casts_out]
        del graph.node[:]
        graph.node.extend(nodes)
    return model


def _is_float32(v: onnx.ValueInfoProto) -> bool:
    return v.type.tensor_type.elem_type == TensorProto.FLOAT


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3`` ... whichever is not yet taken (then taken)."""
    fresh, k = name, 1
    while fresh in taken:
        k += 1
        fresh = f"{name}_{k}"
    taken.add(fresh)
    return fresh
