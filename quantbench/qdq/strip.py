"""Remove existing Q/DQ so a quantized model can be quantized again (``requantize=True``).

``x -> Q -> DQ -> op`` becomes ``x -> op``; an INT8 weight behind a lone DQ becomes its float32
values again. Anything else (a Q feeding a plugin's INT8 input, QOperator ops such as
QLinearConv) has no float form to return to and is refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from quantbench.errors import QuantbenchError
from quantbench.model.graph import QDQ_OPS
from quantbench.model.names import UniqueNames
from quantbench.qdq.insert import export_like

_QOPERATOR_OPS = ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm")


def qdq_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type in QDQ_OPS]


def strip_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float model a Q/DQ model simulates (scales dropped)."""
    qop = [n.name or n.op_type for n in model.graph.node if n.op_type in _QOPERATOR_OPS]
    if qop:
        raise QuantbenchError(
            f"model has QOperator-format ops ({', '.join(qop[:3])}); requantize needs a float or "
            "Q/DQ model"
        )
    graph = gs.import_onnx(model)
    names = UniqueNames(graph)
    for dq in [n for n in graph.nodes if n.op == "DequantizeLinear"]:
        replace_uses(graph, dq.outputs[0], _float_source(dq, names), names)
    graph.cleanup()
    left = [n for n in graph.nodes if n.op in QDQ_OPS]
    if left:
        consumers = sorted({c.op for n in left for o in n.outputs for c in o.outputs})
        readers = ", ".join(consumers) or "a graph output"
        raise QuantbenchError(
            f"cannot strip {left[0].op} {left[0].name!r}: it feeds {readers} "
            "directly (an INT8 tensor with no float form); remove it by hand before requantizing"
        )
    graph.toposort()
    return export_like(graph, model)


def _float_source(dq: gs.Node, names: UniqueNames) -> gs.Tensor:
    quantized = dq.inputs[0]
    producer = quantized.inputs[0] if quantized.inputs else None
    if producer is not None and producer.op == "QuantizeLinear":
        return producer.inputs[0]
    if isinstance(quantized, gs.Constant):
        return gs.Constant(names.fresh(f"{quantized.name}_float"), dequantized_values(dq))
    raise QuantbenchError(
        f"DequantizeLinear {dq.name!r} reads {quantized.name!r}, which is neither a "
        "QuantizeLinear output nor a constant; cannot recover its float input"
    )


def dequantized_values(dq: gs.Node) -> np.ndarray:
    """(q - zero_point) * scale along the DQ's axis, in float32."""
    q = np.asarray(dq.inputs[0].values).astype(np.float32)
    scale = np.asarray(dq.inputs[1].values, dtype=np.float32)
    zero = (
        np.asarray(dq.inputs[2].values).astype(np.float32)
        if len(dq.inputs) > 2 and isinstance(dq.inputs[2], gs.Constant)
        else np.zeros_like(scale)
    )
    if scale.ndim == 1 and scale.size > 1:
        axis = int(dq.attrs.get("axis", 1)) % q.ndim
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((q - zero) * scale).astype(np.float32)


def replace_uses(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor, names: UniqueNames) -> None:
    """Make every reader of ``old`` read ``new``; a graph output keeps its name via Identity."""
    for consumer in list(old.outputs):
        for slot, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[slot] = new
    if old in graph.outputs:
        for producer in list(old.inputs):
            producer.outputs[producer.outputs.index(old)] = gs.Variable(names.fresh(old.name))
        graph.nodes.append(
            gs.Node(
                "Identity", name=names.fresh(f"{old.name}_Identity"), inputs=[new], outputs=[old]
            )
        )
