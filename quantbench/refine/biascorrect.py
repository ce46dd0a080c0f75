"""Empirical bias correction: fold the mean output shift of INT8 weights into the bias.

Quantizing a layer's weight W per output channel (symmetric INT8, ``Wq``) changes its output
by ``layer(x; Wq - W)``, which is linear in the weight error. Its mean over the data, per
output channel, is a systematic shift every later layer inherits; subtracting it from the
bias removes it (Nagel et al., "Data-Free Quantization", section 4.2, empirical variant).

The shift is measured exactly and cheaply in one onnxruntime pass: an auxiliary model is the
FP32 model plus, per layer, a twin node computing the layer on ``Wq - W`` (same attributes, no
bias), reduced per channel to its mean, its mean square and the layer output's mean square.
Each layer therefore sees its **FP32** inputs, not the inputs a quantized upstream would feed
it: one pass corrects every layer, but the shifts upstream layers' errors cause are not
corrected (they are mostly what their own corrections remove).

The refined model keeps the original FP32 weights: only biases change (a Conv without one
gets one; a MatMul without a following constant Add gets an Add), so the Q/DQ or TensorRT
quantization applied later produces exactly the ``Wq`` the correction was measured for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantbench.data.sources import DataSource
from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph, node_labels, open_graph
from quantbench.model.names import tensor_names, unique
from quantbench.qdq.weights import weight_axis, weight_scale
from quantbench.refine import BIAS, LayerChange, Refined, edits
from quantbench.refine.activations import stream_activations
from quantbench.table import INT8_MAX

MEASURE = (
    "output SQNR of the layer with INT8 weights (dB) on the calibration data; after: bias "
    "corrected, on the same data the correction was measured on"
)


@dataclass
class _Layer:
    """One layer to correct and where its bias lives."""

    node: onnx.NodeProto
    label: str
    weight: np.ndarray
    axis: int
    #: the tensor holding the layer's output with its bias (an Add's output for MatMul + Add)
    output: str
    #: the node and input index holding the bias constant; index -1: none yet
    bias_node: onnx.NodeProto | None
    bias_index: int
    bias: np.ndarray | None
    #: the bias enters the output multiplied by this (Gemm's beta)
    bias_gain: float = 1.0
    #: the bias tensor the correction replaced (its initializer goes if nothing else uses it)
    replaced: str = ""
    #: the FP32 weight the INT8 one is compared with when it is not ``weight`` itself: the
    #: weight before a rounding pass put ``weight`` on its grid
    unrounded: np.ndarray | None = None

    @property
    def channels(self) -> int:
        return int(self.weight.shape[self.axis])

    @property
    def conv(self) -> bool:
        return self.node.op_type == "Conv"


@dataclass
class _Sums:
    """Running per-channel sums of one layer over the pass (float64)."""

    count: float = 0.0
    delta: np.ndarray | float = 0.0
    delta_sq: np.ndarray | float = 0.0
    output_sq: np.ndarray | float = 0.0
    names: tuple[str, ...] = ()

    def add(self, values: dict[str, np.ndarray], channels: int) -> None:
        """One batch: means weighted by the batch's element count per channel."""
        mean, mean_sq, out_sq, shape = (values[n] for n in self.names)
        n = float(np.prod(shape.astype(np.float64))) / channels
        self.count += n
        self.delta = self.delta + n * mean.astype(np.float64)
        self.delta_sq = self.delta_sq + n * mean_sq.astype(np.float64)
        self.output_sq = self.output_sq + n * out_sq.astype(np.float64)


def correct_bias(
    model: onnx.ModelProto,
    data: DataSource,
    *,
    provider: str | None = None,
    layers: Iterable[str] | None = None,
    original: onnx.ModelProto | None = None,
) -> Refined:
    """Bias-corrected copy of ``model`` for every Conv (grouped and depthwise included), Gemm
    and MatMul (2-D weight) of the main graph whose weight is constant, or only ``layers``
    (node names, :func:`~quantbench.model.graph.node_labels` for unnamed nodes).

    One streamed FP32 pass over ``data``; each layer's shift is measured on its FP32 inputs
    (not on what a quantized upstream feeds it). Where the bias goes: Conv's B (added if
    absent), Gemm's C (``C - shift / beta``, added if absent), the constant of an Add that
    alone consumes a MatMul's output, else a new Add after the MatMul (its output keeps the
    MatMul's tensor name, so consumers and tables still find it). Left alone: ConvTranspose,
    runtime weights or biases, MatMul weights that are not 2-D, Gemm with ``beta=0``.
    ``original``: the model before :mod:`quantbench.refine.rounding` put the weights on their
    INT8 grid (same weight names); the shift is then that of the rounded weights against the
    original ones, which rounding alone leaves in. ``model`` is not modified."""
    start = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = open_graph(out, require_fixed_rank=False)
    wanted = None if layers is None else [layers] if isinstance(layers, str) else list(layers)
    found, reasons = _eligible(graph, out, wanted)
    if not found:
        why = "no Conv, Gemm or MatMul with a constant weight"
        return Refined(BIAS, out, skipped=f"{why}{_reasons(reasons)}")
    if original is not None:
        _compare_with(found, original)
    sums = _measure(out, found, edits.opset(out), data, provider)
    taken = tensor_names(out)
    changes = [_correct(out, layer, sums[layer.label], taken) for layer in found]
    edits.drop_unused_initializers(out, [layer.replaced for layer in found if layer.replaced])
    recorded = [c for c in changes if c is not None]
    skipped = "" if recorded else f"every weight is on its INT8 grid: no shift{_reasons(reasons)}"
    return Refined(BIAS, out, recorded, time.perf_counter() - start, skipped)


# --------------------------------------------------------------------------- which layers


def _eligible(
    graph: Graph, model: onnx.ModelProto, wanted: list[str] | None
) -> tuple[list[_Layer], list[str]]:
    """The layers to correct (of ``model``'s own nodes) and why the others were left."""
    labels = node_labels(model.graph.node)
    if wanted is not None:
        unknown = sorted(set(wanted) - set(labels))
        if unknown:
            raise QuantbenchError(f"bias correction: no node named {', '.join(unknown)}")
    consumers = edits.consumers(model)  # of ``model`` itself: graph.model may be a rewritten copy
    outputs = {o.name for o in model.graph.output}
    found: list[_Layer] = []
    reasons: list[str] = []
    for node, label in zip(model.graph.node, labels, strict=True):
        if wanted is not None and label not in wanted:
            continue
        if node.op_type not in ("Conv", "Gemm", "MatMul") or node.domain not in ("", "ai.onnx"):
            if wanted is not None:
                reasons.append(f"{label}: a {node.op_type} is not Conv, Gemm or MatMul")
            continue
        layer = _layer(graph, model, node, label, consumers, outputs)
        if isinstance(layer, str):
            reasons.append(f"{label}: {layer}")
        else:
            found.append(layer)
    return found, reasons


def _layer(
    graph: Graph,
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    label: str,
    consumers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> _Layer | str:
    """The layer of ``node``, or why it is not corrected."""
    if len(node.input) < 2 or node.input[0] in graph.constants:
        return "no runtime data input"
    weight = edits.constant(model, graph, node.input[1])
    if weight is None:
        return "its weight is computed at run time"
    axis = weight_axis(node, 1, weight.shape)
    if axis is None or weight.dtype.kind != "f":
        return "its weight has no output-channel axis (a MatMul weight must be 2-D)"
    bias_input = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    layer = _Layer(node, label, weight, axis, node.output[0], None, -1, None)
    if node.op_type == "MatMul":
        return _matmul_bias(graph, model, layer, consumers, outputs)
    if bias_input:
        bias = edits.constant(model, graph, bias_input)
        if bias is None:
            return "its bias is computed at run time"
        layer.bias_node, layer.bias_index, layer.bias = node, 2, bias
    if node.op_type == "Gemm":
        layer.bias_gain = float(edits.attr(node, "beta", 1.0))
        if layer.bias_gain == 0:
            return "Gemm with beta=0 (its C has no effect)"
    return layer


def _matmul_bias(
    graph: Graph,
    model: onnx.ModelProto,
    layer: _Layer,
    consumers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> _Layer:
    """A MatMul's bias: the constant of the Add that alone consumes its output, else none
    (one is added)."""
    out = layer.node.output[0]
    users = consumers.get(out, [])
    if out in outputs or len(users) != 1 or users[0].op_type != "Add":
        return layer
    add = users[0]
    other = 1 if add.input[0] == out else 0
    if add.input[other] == out:
        return layer
    bias = edits.constant(model, graph, add.input[other])
    if bias is None or bias.dtype.kind != "f" or not _per_channel(bias, layer.channels):
        return layer
    layer.bias_node, layer.bias_index, layer.bias, layer.output = add, other, bias, add.output[0]
    return layer


def _per_channel(bias: np.ndarray, channels: int) -> bool:
    """Whether ``bias`` adds along the output's last axis (a scalar, ``[N]``, ``[..., N]``):
    only then is ``bias - shift`` the same Add with a corrected constant."""
    return bias.size == 1 or (bias.ndim >= 1 and bias.shape[-1] == channels)


def _reasons(reasons: list[str]) -> str:
    return f" ({'; '.join(reasons)})" if reasons else ""


# --------------------------------------------------------------------------- measuring


def quantized_weight(weight: np.ndarray, axis: int) -> np.ndarray:
    """``Wq``: ``weight`` through per-channel symmetric INT8 Q/DQ, as QuantizeLinear and
    DequantizeLinear compute it (float32 division, round half to even, clip to ±127)."""
    w = weight.astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    scale = weight_scale(w, axis).reshape(shape)
    return (np.clip(np.round(w / scale), -INT8_MAX, INT8_MAX) * scale).astype(np.float32)


def _compare_with(found: list[_Layer], original: onnx.ModelProto) -> None:
    """Each layer's weight before rounding, by the weight's name in ``original``."""
    weights = {i.name: i for i in original.graph.initializer}
    for layer in found:
        init = weights.get(layer.node.input[1])
        if init is not None:
            values = numpy_helper.to_array(init)
            if values.shape == layer.weight.shape:
                layer.unrounded = values


def _measure(
    model: onnx.ModelProto,
    found: list[_Layer],
    opset: int,
    data: DataSource,
    provider: str | None,
) -> dict[str, _Sums]:
    """Per layer, the running per-channel sums of the weight error's output, in one pass."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    taken = tensor_names(model)
    sums: dict[str, _Sums] = {}
    for i, layer in enumerate(found):
        sums[layer.label] = _Sums(names=_add_probe(probe, layer, f"qb_bias{i}", opset, taken))
    wanted = [n for s in sums.values() for n in s.names]
    for values in stream_activations(probe, data, wanted, provider=provider):
        for layer in found:
            sums[layer.label].add(values, layer.channels)
    return sums


def _add_probe(
    probe: onnx.ModelProto, layer: _Layer, prefix: str, opset: int, taken: set[str]
) -> tuple[str, str, str, str]:
    """Adds the twin of ``layer`` on ``Wq - W`` and its per-channel reductions to ``probe``;
    returns the names of mean(delta), mean(delta²), mean(output²) and delta's shape."""
    prefix = unique(taken, prefix)
    g = probe.graph
    reference = layer.weight if layer.unrounded is None else layer.unrounded
    dw = quantized_weight(layer.weight, layer.axis) - reference.astype(np.float32)
    dw = dw.astype(layer.weight.dtype)
    g.initializer.append(numpy_helper.from_array(dw, f"{prefix}_dw"))
    node = layer.node
    nodes = [_twin(probe, node, f"{prefix}_dw", f"{prefix}_delta", opset, dw.dtype)]
    nodes += [helper.make_node("Mul", [f"{prefix}_delta"] * 2, [f"{prefix}_delta_sq"])]
    nodes += [helper.make_node("Mul", [layer.output] * 2, [f"{prefix}_out_sq"])]
    nodes += [helper.make_node("Shape", [f"{prefix}_delta"], [f"{prefix}_shape"])]
    names = (f"{prefix}_mean", f"{prefix}_mean_sq", f"{prefix}_out_mean_sq", f"{prefix}_shape")
    sources = (f"{prefix}_delta", f"{prefix}_delta_sq", f"{prefix}_out_sq")
    for source, target in zip(sources, names[:3], strict=True):
        nodes += _channel_mean(probe, layer, source, target, opset)
    g.node.extend(nodes)
    return names


def _twin(
    probe: onnx.ModelProto,
    node: onnx.NodeProto,
    weight: str,
    output: str,
    opset: int,
    dtype: np.dtype,
) -> onnx.NodeProto:
    """``node`` on ``weight`` with its attributes and without its bias (Gemm before opset 11
    requires a C: a zero scalar)."""
    inputs = [node.input[0], weight]
    if node.op_type == "Gemm" and opset < 11:
        probe.graph.initializer.append(numpy_helper.from_array(np.zeros(1, dtype), f"{output}_c0"))
        inputs.append(f"{output}_c0")
    twin = helper.make_node(node.op_type, inputs, [output], name=f"{output}_twin")
    twin.attribute.extend(node.attribute)
    return twin


def _channel_mean(
    probe: onnx.ModelProto, layer: _Layer, source: str, target: str, opset: int
) -> list[onnx.NodeProto]:
    """Nodes reducing ``source`` to its mean per output channel (axis 1 of a Conv's output,
    the last axis of a Gemm's or MatMul's, whatever their rank)."""
    if layer.conv:
        axes = [0, *range(2, layer.weight.ndim)]
        return [_reduce_mean(probe, source, target, axes, opset)]
    shape = f"{target}_2d"
    probe.graph.initializer.append(
        numpy_helper.from_array(np.array([-1, layer.channels], np.int64), f"{target}_2d_shape")
    )
    reshape = helper.make_node("Reshape", [source, f"{target}_2d_shape"], [shape])
    return [reshape, _reduce_mean(probe, shape, target, [0], opset)]


def _reduce_mean(
    probe: onnx.ModelProto, source: str, target: str, axes: list[int], opset: int
) -> onnx.NodeProto:
    """ReduceMean over ``axes`` (keepdims=0): an attribute before opset 18, an input since."""
    if opset < 18:
        return helper.make_node("ReduceMean", [source], [target], axes=axes, keepdims=0)
    probe.graph.initializer.append(
        numpy_helper.from_array(np.array(axes, np.int64), f"{target}_ax")
    )
    return helper.make_node("ReduceMean", [source, f"{target}_ax"], [target], keepdims=0)


# --------------------------------------------------------------------------- correcting


def _correct(
    model: onnx.ModelProto, layer: _Layer, sums: _Sums, taken: set[str]
) -> LayerChange | None:
    """Writes ``b - E[delta]`` as the layer's bias; the record, or None when nothing moved."""
    if sums.count == 0:
        return None
    mean = np.asarray(sums.delta, np.float64) / sums.count
    if not np.any(mean):
        return None
    dtype = layer.bias.dtype if layer.bias is not None else layer.weight.dtype
    old = layer.bias if layer.bias is not None else np.zeros(layer.channels, dtype)
    shift = mean.reshape(_bias_shape(layer, old))
    corrected = (old.astype(np.float64) - shift / layer.bias_gain).astype(dtype)
    how = _write_bias(model, layer, corrected, taken)
    return _record(layer, sums, mean, how)


def _bias_shape(layer: _Layer, bias: np.ndarray) -> tuple[int, ...]:
    """How the per-channel shift broadcasts against the bias as it is stored."""
    if layer.conv:
        return (layer.channels,)  # Conv's B is 1-D [M]
    return (layer.channels,) if bias.ndim <= 1 else (*([1] * (bias.ndim - 1)), layer.channels)


def _write_bias(model: onnx.ModelProto, layer: _Layer, bias: np.ndarray, taken: set[str]) -> str:
    """Puts ``bias`` where the layer's bias lives, as a new initializer (an old one may be
    shared); says how."""
    name = edits.add_initializer(model, bias, f"{layer.label}_bias_corrected", taken)
    node = layer.node
    if layer.bias_node is not None:
        layer.replaced = layer.bias_node.input[layer.bias_index]
        layer.bias_node.input[layer.bias_index] = name
        return "bias corrected"
    if node.op_type != "MatMul":
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = name
        return "bias input added"
    out = node.output[0]
    node.output[0] = unique(taken, f"{out}_before_bias")
    add = helper.make_node(
        "Add", [node.output[0], name], [out], name=unique(taken, f"{layer.label}_bias")
    )
    at = next(i for i, n in enumerate(model.graph.node) if node.output[0] in n.output)
    model.graph.node.insert(at + 1, add)
    return f"bias Add {add.name} added after it"


def _record(layer: _Layer, sums: _Sums, mean: np.ndarray, how: str) -> LayerChange:
    """The layer's output SQNR with INT8 weights before and after the correction (the noise
    after it is the shift's variance: its mean is what was removed)."""
    delta_sq = np.asarray(sums.delta_sq, np.float64) / sums.count
    signal = float(np.sum(np.asarray(sums.output_sq, np.float64) / sums.count))
    before = _db(signal, float(np.sum(delta_sq)))
    after = _db(signal, float(np.sum(np.maximum(delta_sq - mean**2, 0.0))))
    rms = math.sqrt(signal / layer.channels)
    worst = float(np.max(np.abs(mean)))
    share = f" ({100 * worst / rms:.3g}% of the output RMS)" if rms > 0 else ""
    detail = (
        f"{layer.node.op_type}, {layer.channels} channels: {how}; largest mean shift removed "
        f"{worst:.3g}{share}"
    )
    return LayerChange(layer.label, detail, before=before, after=after, measure=MEASURE)


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf
