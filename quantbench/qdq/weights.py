"""Constant weights: their values (folding Constant nodes and constant chains), which axis holds
the output channels, and their symmetric INT8 scales.

A weight is any constant input, whether the exporter wrote it as an initializer, a ``Constant``
node or a foldable chain such as ``Constant -> Transpose``. ModelOpt quantizes Constant-node
weights per-tensor with *activation* ranges (peers.md section 15), which can collapse accuracy;
here every form is folded to its values first and treated like an initializer.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantbench.table import INT8_MAX

#: the scale given to an all-zero weight channel. Any positive scale dequantizes zeros exactly;
#: a 0 scale is illegal in Q/DQ, and a subnormal one risks underflow once TensorRT multiplies it
#: by the activation scale, so use a small *normal* float32.
ZERO_CHANNEL_SCALE = np.float32(1.0 / (INT8_MAX * 2**16))


def constant_values(model: onnx.ModelProto, names: list[str]) -> dict[str, np.ndarray | str]:
    """Values of constant tensors; for one that cannot be evaluated, the reason as a string."""
    initializers = {init.name: init for init in model.graph.initializer}
    values: dict[str, np.ndarray | str] = {
        name: numpy_helper.to_array(initializers[name]) for name in names if name in initializers
    }
    chained = [name for name in names if name not in values]
    if chained:
        values.update(_evaluate_chains(model, chained, initializers))
    return values


def _evaluate_chains(
    model: onnx.ModelProto, names: list[str], initializers: dict[str, onnx.TensorProto]
) -> dict[str, np.ndarray | str]:
    """Run only the nodes that produce ``names`` (they have no runtime inputs) on numpy."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    needed_nodes: set[int] = set()
    needed_inits: set[str] = set()
    index = {id(node): i for i, node in enumerate(model.graph.node)}
    stack = list(names)
    while stack:
        tensor = stack.pop()
        if tensor in initializers:
            needed_inits.add(tensor)
            continue
        node = producers.get(tensor)
        if node is None or index[id(node)] in needed_nodes:
            continue
        needed_nodes.add(index[id(node)])
        stack.extend(i for i in node.input if i)
    graph = helper.make_graph(
        [model.graph.node[i] for i in sorted(needed_nodes)],
        "constant_chains",
        [],
        [helper.make_empty_tensor_value_info(name) for name in names],
        [initializers[name] for name in sorted(needed_inits)],
    )
    sub = helper.make_model(graph, opset_imports=list(model.opset_import))
    sub.functions.extend(model.functions)
    try:
        results = ReferenceEvaluator(sub).run(None, {})
    except Exception as exc:  # noqa: BLE001 - any op may fail; the weight is then reported
        reason = f"constant chain could not be evaluated ({type(exc).__name__}: {exc})"
        return {name: reason.splitlines()[0] for name in names}
    return {name: np.asarray(value) for name, value in zip(names, results, strict=True)}


def weight_axis(node: onnx.NodeProto, index: int, shape: tuple[int, ...]) -> int | None:
    """The output-channel axis of a constant input, or None where only per-tensor applies.

    TensorRT documents per-channel weights for Conv (K of KCRS: axis 0), ConvTranspose (C_out:
    axis 1), Gemm (axis 0 for the PyTorch [N, K] layout with transB=1, else axis 1) and MatMul
    whose second input is a constant 2-D matrix (its columns: axis 1) — reference section 4.1.
    """
    if index != 1:
        return None
    op = node.op_type
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if op == "MatMul" and len(shape) == 2:
        return 1
    return None


def weight_scale(values: np.ndarray, axis: int | None) -> np.ndarray:
    """max|w| / 127 in float32, over the whole tensor or per slice along ``axis``."""
    magnitude = np.abs(values.astype(np.float32, copy=False))
    if axis is None:
        amax = np.float32(magnitude.max()) if magnitude.size else np.float32(0)
    else:
        reduce_axes = tuple(a for a in range(values.ndim) if a != axis)
        amax = magnitude.max(axis=reduce_axes).astype(np.float32)
    scale = np.asarray(amax / np.float32(INT8_MAX), dtype=np.float32)
    return np.where(scale > 0, scale, ZERO_CHANNEL_SCALE).astype(np.float32)
