"""Which ops of a Q/DQ model onnxruntime (CPU) really runs in integer arithmetic.

A Q/DQ model only *describes* quantization; each runtime decides what to fuse. onnxruntime fuses
``DQ -> Conv -> Q`` into QLinearConv, but a Conv whose output is not quantized (TensorRT's
recommended placement, reference section 4.2) stays a float Conv between DequantizeLinear nodes:
the INT8 rounding is simulated, the arithmetic is float. Accuracy numbers from onnxruntime are
then a *simulation* of TensorRT INT8, and latency numbers say nothing about INT8 speed. This
module makes that visible: onnxruntime saves the graph it will execute
(``SessionOptions.optimized_model_filepath``) and every op in it is classified.

Level ``ORT_ENABLE_EXTENDED`` is used: it contains the QDQ fusions and keeps standard op names;
``ORT_ENABLE_ALL`` adds NCHWc/NHWC layout rewrites that rename nodes and are hardware specific.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from quantbench.errors import QuantbenchError, first_line
from quantbench.model.graph import QDQ_OPS, load_model
from quantbench.model.protosize import loadable

INTEGER = "integer"
INT8_DATA = "integer (int8 data, no rescale)"
SIMULATED = "float (Q/DQ simulated)"
FLOAT = "float"
REMOVED = "removed (fused or folded by onnxruntime)"

#: onnxruntime kernels that compute on integer tensors (default and com.microsoft domains).
INTEGER_KERNELS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearLeakyRelu",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "QLinearReduceMean",
        "QLinearWhere",
        "QLinearConvTranspose",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QAttention",
    }
)
#: integer kernels whose output is float (they dequantize internally).
_FLOAT_OUTPUT_KERNELS = frozenset({"MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention"})
_INT_OUTPUT_KERNELS = INTEGER_KERNELS - _FLOAT_OUTPUT_KERNELS
_INT_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)


def integer_op_report(model: onnx.ModelProto | str | os.PathLike[str]) -> list[dict[str, object]]:
    """One row per op: ``node``, ``op_type`` (as in the model), ``kernel`` (what onnxruntime runs,
    None if it removed the op), ``execution`` (one of the labels above) and ``integer``."""
    original = model if isinstance(model, onnx.ModelProto) else load_model(model)
    optimized = optimized_graph(model)
    original_ops = {n.name: n.op_type for n in original.graph.node if n.name}
    int_tensors = _integer_tensors(optimized)
    producers = {o: n for n in optimized.graph.node for o in n.output if o}

    rows: list[dict[str, object]] = []
    seen: set[str] = set()
    for node in optimized.graph.node:
        if node.op_type in QDQ_OPS:
            continue
        seen.add(node.name)
        execution = _classify(node, int_tensors, producers)
        rows.append(
            {
                "node": node.name,
                "op_type": original_ops.get(node.name, node.op_type),
                "kernel": f"{node.domain}.{node.op_type}" if node.domain else node.op_type,
                "execution": execution,
                "integer": execution in (INTEGER, INT8_DATA),
            }
        )
    for node in original.graph.node:
        if node.op_type in QDQ_OPS or node.op_type == "Constant" or node.name in seen:
            continue
        rows.append(
            {
                "node": node.name,
                "op_type": node.op_type,
                "kernel": None,
                "execution": REMOVED,
                "integer": False,
            }
        )
    return rows


def integer_op_counts(rows: list[dict[str, object]]) -> dict[str, int]:
    """How many ops ran under each execution label."""
    return dict(Counter(str(r["execution"]) for r in rows))


def optimized_graph(model: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    """The graph onnxruntime's CPU provider executes after its level-2 (extended) rewrites."""
    import onnxruntime as ort  # deferred: importing onnxruntime costs ~0.3 s

    label = "model" if isinstance(model, onnx.ModelProto) else str(model)
    with tempfile.TemporaryDirectory(prefix="quantbench-ort-") as tmp:
        saved = Path(tmp) / "optimized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(saved)
        options.log_severity_level = 3
        try:
            with loadable(model if isinstance(model, onnx.ModelProto) else str(model)) as src:
                ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            first = first_line(exc)
            raise QuantbenchError(
                f"{label}: onnxruntime cannot load the model ({first}); custom ops such as "
                "DWConv2D must be lowered first (quantbench.plugins.dwconv2d.dwconv2d_to_conv)"
            ) from None
        return onnx.load(str(saved))


def _integer_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors holding int8/uint8 data: Q outputs, integer-kernel outputs, int initializers."""
    names = {i.name for i in model.graph.initializer if i.data_type in _INT_TYPES}
    for v in list(model.graph.value_info) + list(model.graph.input):
        if v.type.tensor_type.elem_type in _INT_TYPES:
            names.add(v.name)
    for node in model.graph.node:  # topological order: int-ness flows forward
        if node.op_type == "QuantizeLinear" or node.op_type in _INT_OUTPUT_KERNELS:
            names.update(node.output)
        elif node.op_type != "DequantizeLinear" and node.input and node.input[0] in names:
            names.update(node.output)  # data movement on int8 (MaxPool, Reshape, ...)
    return names


def _classify(
    node: onnx.NodeProto, int_tensors: set[str], producers: dict[str, onnx.NodeProto]
) -> str:
    """Integer kernel; op on int8 data; float op fed by DQ (rounding simulated); plain float."""
    if node.op_type in INTEGER_KERNELS:
        return INTEGER
    if node.input and node.input[0] in int_tensors:
        return INT8_DATA
    from_dq = any(
        name in producers and producers[name].op_type == "DequantizeLinear" for name in node.input
    )
    return SIMULATED if from_dq else FLOAT
