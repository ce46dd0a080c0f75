"""Graph edits: fold constant weights to initializers and put QuantizeLinear -> DequantizeLinear
pairs in front of the inputs a :class:`~quantbench.qdq.placement.Placement` chose.

A tensor read by several quantized ops gets one shared pair (same scale and axis), as TensorRT
and ModelOpt's ``DedicatedQDQPair=False`` expect: one Q per tensor keeps the INT8 tensor single
and lets TensorRT fuse the Q into the producer. Consumers that are not quantized keep reading
the original tensor, so graph outputs and high-precision branches are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantbench.model.names import UniqueNames
from quantbench.qdq.plan import QdqInput, QuantizedNode


def insert_qdq(
    model: onnx.ModelProto, quantized: list[QuantizedNode], folds: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, int]:
    """The model with Q/DQ inserted, and how many Q/DQ pairs that took."""
    graph = gs.import_onnx(model)
    names = UniqueNames(graph)
    tensors = graph.tensors()
    for tensor_name, values in folds.items():
        fold_to_constant(tensors[tensor_name], values, names)
    nodes = {node.name: node for node in graph.nodes}
    pairs: dict[tuple[str, int | None, bytes], gs.Variable] = {}
    for planned in quantized:
        node = nodes[planned.node]
        for qdq in planned.inputs:
            key = (qdq.tensor, qdq.axis, qdq.scale.tobytes())
            if key not in pairs:
                pairs[key] = add_qdq_pair(graph, tensors[qdq.tensor], qdq, names)
            node.inputs[qdq.index] = pairs[key]
    graph.cleanup().toposort()
    return export_like(graph, model), len(pairs)


def fold_to_constant(tensor: gs.Tensor, values: np.ndarray, names: UniqueNames) -> None:
    """Turn a Constant-node or constant-chain output into an initializer with the same name.

    The producer keeps a placeholder output in the same slot (multi-output producers stay
    intact); ``cleanup`` then drops the chain if nothing else reads it.
    """
    for producer in list(tensor.inputs):
        slot = producer.outputs.index(tensor)
        producer.outputs[slot] = gs.Variable(names.fresh(f"{tensor.name}_unfolded"))
    tensor.to_constant(np.ascontiguousarray(values))


def add_qdq_pair(
    graph: gs.Graph, source: gs.Tensor, qdq: QdqInput, names: UniqueNames
) -> gs.Variable:
    """``source -> QuantizeLinear -> DequantizeLinear``; returns the dequantized tensor."""
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
    return dequantized


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
