"""Graph edits: fold constant weights to initializers and put QuantizeLinear -> DequantizeLinear
pairs in front of the inputs a :class:`~quantbench.qdq.placement.Placement` chose.

A tensor read by several quantized ops gets one shared pair (same scale and axis), as TensorRT
and ModelOpt's ``DedicatedQDQPair=False`` expect: one Q per tensor keeps the INT8 tensor single
and lets TensorRT fuse the Q into the producer. Consumers that are not quantized keep reading
the original tensor, so graph outputs and high-precision branches are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import Message

from quantbench.model.names import UniqueNames
from quantbench.qdq.plan import QdqInput, QuantizedNode


def insert_qdq(
    model: onnx.ModelProto, quantized: list[QuantizedNode], folds: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, list[str]]:
    """The model with Q/DQ inserted, and its pairs' scale initializers in the order the pairs
    were made (one a pair)."""
    graph = gs.import_onnx(model)
    names = UniqueNames(graph)
    tensors = graph.tensors()
    for tensor_name, values in folds.items():
        fold_to_constant(tensors[tensor_name], values, names)
    nodes = {node.name: node for node in graph.nodes}
    pairs: dict[tuple[str, int | None, bytes], tuple[gs.Variable, str]] = {}
    for planned in quantized:
        node = nodes[planned.node]
        for qdq in planned.inputs:
            key = _pair_key(qdq)
            if key not in pairs:
                pairs[key] = add_qdq_pair(graph, tensors[qdq.tensor], qdq, names)
            node.inputs[qdq.index] = pairs[key][0]
    graph.cleanup().toposort()
    return export_like(graph, model), [name for _, name in pairs.values()]


def _pair_key(qdq: QdqInput) -> tuple[str, int | None, bytes]:
    """Inputs of one tensor with the same axis and scale share a Q/DQ pair."""
    return qdq.tensor, qdq.axis, qdq.scale.tobytes()


def _pairs(quantized: list[QuantizedNode]) -> dict[tuple[str, int | None, bytes], QdqInput]:
    """Each pair's first input, in the order the pairs are made."""
    pairs: dict[tuple[str, int | None, bytes], QdqInput] = {}
    for planned in quantized:
        for qdq in planned.inputs:
            pairs.setdefault(_pair_key(qdq), qdq)
    return pairs


def _layout(
    quantized: list[QuantizedNode],
    folds: dict[str, np.ndarray],
    pairs: dict[tuple[str, int | None, bytes], QdqInput] | None = None,
) -> tuple:
    """Everything of a placement the edited graph depends on except the scales' values: the
    inputs (index, tensor, axis, scale shape), which of them share a pair, and the folds.
    ``pairs``: :func:`_pairs` of ``quantized``, where the caller has them."""
    pair_of = {key: i for i, key in enumerate(_pairs(quantized) if pairs is None else pairs)}
    inputs = tuple(
        (p.node, tuple((q.index, q.tensor, q.axis, q.scale.shape, pair_of[_pair_key(q)])
                       for q in p.inputs))
        for p in quantized
    )  # fmt: skip
    return inputs, tuple(folds)


@dataclass
class QdqEdit:
    """What :func:`insert_qdq` made of ``source``, kept to be made again with other scales: a
    placement with the same :func:`_layout` (``--method auto``'s candidate tables, the
    recovery loop) gives the same graph with other scale values, so :meth:`rescaled` writes
    them into a copy (graphsurgeon's import, edit and export cost 0.1-0.5 s a call, a copy
    tens of milliseconds). The initializers it took unchanged from ``source`` (the weights) are
    not kept but copied from ``source`` again, so the edit costs no second copy of the weights
    (dddd-ocr's 54 MB, ResNet-18's 46 MB)."""

    source: onnx.ModelProto
    #: the edited model without its initializers
    skeleton: onnx.ModelProto
    #: its initializers in order: an index into source's (taken unchanged from it) or a tensor
    #: of the edit's own (scales, zero points, folded constants)
    initializers: list[int | onnx.TensorProto]
    scale_names: list[str]
    layout: tuple

    @classmethod
    def of(
        cls,
        source: onnx.ModelProto,
        made: tuple[onnx.ModelProto, list[str]],
        quantized: list[QuantizedNode],
        folds: dict[str, np.ndarray],
    ) -> QdqEdit:
        """The edit ``made`` (:func:`insert_qdq` of ``source``), ``source`` not copied (its
        owner never changes it). Nothing of ``made``'s weights is copied either: a message
        copied whole and then cleared keeps its memory (protobuf's arenas)."""
        model, scale_names = made
        in_source = {t.name: i for i, t in enumerate(source.graph.initializer)}
        initializers: list[int | onnx.TensorProto] = []
        for tensor in model.graph.initializer:
            j = in_source.get(tensor.name)
            if j is not None and tensor == source.graph.initializer[j]:
                initializers.append(j)
            else:
                own = onnx.TensorProto()
                own.CopyFrom(tensor)
                initializers.append(own)
        skeleton = _copied_without(model, "graph")
        skeleton.graph.CopyFrom(_copied_without(model.graph, "initializer"))
        return cls(source, skeleton, initializers, scale_names, _layout(quantized, folds))

    def rescaled(
        self, quantized: list[QuantizedNode], folds: dict[str, np.ndarray]
    ) -> onnx.ModelProto | None:
        """The edit's model with ``quantized``'s scales (a new model), or None where its
        layout differs (the graph itself would differ)."""
        pairs = _pairs(quantized)  # made once: each key holds a scale's bytes
        if _layout(quantized, folds, pairs) != self.layout:
            return None
        scales = {
            name: qdq.scale.astype(np.float32)
            for name, qdq in zip(self.scale_names, pairs.values(), strict=True)
        }
        model = onnx.ModelProto()
        model.CopyFrom(self.skeleton)
        for entry in self.initializers:
            tensor = self.source.graph.initializer[entry] if isinstance(entry, int) else entry
            if tensor.name in scales:
                tensor = _scale_tensor(tensor.name, scales[tensor.name])
            model.graph.initializer.add().CopyFrom(tensor)
        return model


def _copied_without(message: Message, skipped: str) -> Message:
    """A copy of ``message`` without its field ``skipped``."""
    out = type(message)()
    for field, value in message.ListFields():
        if field.name == skipped:
            continue
        if isinstance(value, Message):
            getattr(out, field.name).CopyFrom(value)
        elif hasattr(value, "extend"):  # a repeated field
            getattr(out, field.name).extend(value)
        else:
            setattr(out, field.name, value)
    return out


def fold_to_constant(tensor: gs.Tensor, values: np.ndarray, names: UniqueNames) -> None:
    """Turn a Constant-node or constant-chain output into an initializer with the same name.

    The producer keeps a placeholder output in the same slot (multi-output producers stay
    intact); ``cleanup`` then drops the chain if nothing else reads it.
    """
    for producer in list(tensor.inputs):
        slot = producer.outputs.index(tensor)
        producer.outputs[slot] = gs.Variable(names.fresh(f"{tensor.name}_unfolded"))
    tensor.to_constant(np.ascontiguousarray(values))


def _scale_tensor(name: str, values: np.ndarray) -> onnx.TensorProto:
    """A scale initializer as graphsurgeon exports a float32 Constant."""
    return onnx.numpy_helper.from_array(values, name)


def add_qdq_pair(
    graph: gs.Graph, source: gs.Tensor, qdq: QdqInput, names: UniqueNames
) -> tuple[gs.Variable, str]:
    """``source -> QuantizeLinear -> DequantizeLinear``; returns the dequantized tensor and the
    scale's name."""
    base = source.name
    scale = gs.Constant(names.fresh(f"{base}_scale"), qdq.scale.astype(np.float32))
    zero_point = gs.Constant(
        names.fresh(f"{base}_zero_point"), np.zeros(qdq.scale.shape, dtype=np.int8)
    )
    attrs = {} if qdq.axis is None else {"axis": qdq.axis}
    shape = None if source.shape is None else list(source.shape)
    quantized = gs.Variable(names.fresh(f"{base}_quantized"), dtype=np.int8, shape=shape)
    dequantized = gs.Variable(names.fresh(f"{base}_dequantized"), dtype=np.float32, shape=shape)
    graph.nodes.append(
        gs.Node(
            "QuantizeLinear",
            name=names.fresh(f"{base}_QuantizeLinear"),
            attrs=dict(attrs),
            inputs=[source, scale, zero_point],
            outputs=[quantized],
        )
    )
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear",
            name=names.fresh(f"{base}_DequantizeLinear"),
            attrs=dict(attrs),
            inputs=[quantized, scale, zero_point],
            outputs=[dequantized],
        )
    )
    return dequantized, scale.name


def export_like(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export, keeping what graphsurgeon does not carry: model metadata and doc strings."""
    model = gs.export_onnx(graph)
    model.ir_version = original.ir_version
    model.doc_string = original.doc_string
    model.domain = original.domain
    model.model_version = original.model_version
    del model.metadata_props[:]
    model.metadata_props.extend(original.metadata_props)
    return model
