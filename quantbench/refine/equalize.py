"""Cross-layer equalization (CLE; Nagel et al. 2019, "Data-Free Quantization", as in AIMET).

A ReLU-like op f with f(x / s) = f(x) / s for s > 0 lets two convolutions trade range per channel
without changing the function: dividing output channel i of the first conv (its filter and bias)
by s_i and multiplying the weights that read input channel i of the second conv by s_i is exact
(in FP32 up to rounding). With r1_i = max|W1[i]| and r2_i = max|W2 reading channel i|,
s_i = sqrt(r1_i / r2_i) gives both ranges sqrt(r1_i * r2_i). Only weights are read (data-free);
only initializer values change, so the graph, its node, tensor and initializer names stay as
they were.

What it buys under TensorRT: weights are quantized per output channel, which already removes
much of the imbalance CLE fixes in W1. The gain is on the *per-tensor* activation between the
convs (a depthwise conv's output feeding a pointwise conv, above all), whose channel ranges
follow W1's and become more even; and on W2, whose per-output-channel scale spans input channels
of uneven range. The weight ranges are only a data-free proxy for the activation's; the
activation variant (``activation_max``: per-channel max|x| of the intermediate tensor, measured
on the calibration data) balances the measured activation against W2 instead, SmoothQuant's
way (Xiao et al. 2023), with no op added: the activation's scale goes into W1 and b1. On
mtcnn-pnet (PReLU, MaxPool, two heads on one tensor) it raised the face-cell IoU 84.2 -> 84.8
where the weight-driven scales lowered it to 81.4.

Pairs: Conv -> (any number of Relu, LeakyRelu, PRelu, Identity, MaxPool) -> Conv(s), where
every tensor on the way has exactly one consumer and is not a graph output, the last one is
read by convs only (one, or several: a detector's heads; each gets its input channels scaled),
and the first conv's weight and bias and each second's weight are float32 initializers used by
that node alone (not graph inputs, which a feed could override). The first conv may have any
group (output channel i depends only on W1[i] and b1[i]); a second may be regular, grouped or
depthwise (input channel i belongs to group i // (C / g), so it scales
W2[g*M/g:(g+1)*M/g, i % (C / g)]). Skipped: Clip/Relu6, HardSigmoid, HardSwish, Sigmoid, SiLU
and every op that does not commute with positive scaling; BatchNormalization or a per-channel
Mul/Add between the convs (not folded here: fold it first); ConvTranspose; Gemm/MatMul pairs;
weights given as Constant nodes or computed at run time, or as external data not loaded; nodes
inside subgraphs.

Chains (conv-conv-conv) are equalized pair by pair in graph order, sweep after sweep, until no
scale of a sweep moves by more than ``tolerance`` (AIMET's iterative scheme; each sweep leaves
the pair it visits last exactly balanced), or ``iterations`` sweeps. The activation variant
needs one sweep: a pair's scales change no other pair's activation.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantbench.qdq.weights import weight_axis, weight_scale
from quantbench.refine import EQUALIZE, LayerChange, Refined
from quantbench.refine.smooth import smoothing_scales
from quantbench.table import INT8_MAX

#: ops between the convs that commute with a positive per-channel scale: f(x / s) = f(x) / s
#: (MaxPool: the max of a channel's window scales with the channel)
RELU_LIKE = frozenset({"Relu", "LeakyRelu", "PRelu", "Identity", "MaxPool"})
#: at most this many sweeps over the pairs by default (AIMET converges in a few)
DEFAULT_ITERATIONS = 20
#: stop once every scale of a sweep is within this of 1
DEFAULT_TOLERANCE = 1e-3
MEASURE = "weight SQNR (dB)"
NOTHING_ELIGIBLE = "no conv pair joined by a ReLU-like op"

_ONNX_DOMAINS = ("", "ai.onnx")
#: a relative imbalance float32 weights carry anyway (a few ulps): not worth a rewrite
_FLOAT32_NOISE = 2.0**-20


@dataclass(frozen=True)
class _Second:
    """A conv reading the pair's activation, and its weight (the one equalization rescales)."""

    node: onnx.NodeProto
    weight: str
    group: int


@dataclass(frozen=True)
class _Pair:
    """A conv and the convs that read its output through ReLU-like ops (one, or several
    reading the same tensor: a detector's heads), and the initializers equalization
    rewrites."""

    first: onnx.NodeProto
    seconds: tuple[_Second, ...]
    between: tuple[str, ...]
    weight1: str
    bias1: str | None
    #: the first conv's output and each op's after it, up to the activation the second convs
    #: read: the tensors the pair's scales rescale
    chain: tuple[str, ...]

    @property
    def tensor(self) -> str:
        """The activation the second convs read (quantized per tensor in INT8)."""
        return self.chain[-1]

    @property
    def label(self) -> str:
        return f"{_node_name(self.first)} -> {', '.join(_node_name(s.node) for s in self.seconds)}"


def equalize(
    model: onnx.ModelProto,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    tolerance: float = DEFAULT_TOLERANCE,
    activation_max: Mapping[str, np.ndarray] | None = None,
    alpha: float = 0.5,
) -> Refined:
    """Cross-layer equalization of every eligible conv pair of ``model`` (left untouched).

    ``iterations``: the most sweeps over all pairs (1: one pass, each pair balanced once);
    ``tolerance``: stop earlier once no scale of a sweep differs from 1 by more than it.
    ``activation_max``: max|x_c| per channel of the tensors the second convs read
    (:func:`activation_tensors`, measured on the calibration data): the scales then balance
    those activations against the second convs' weights, SmoothQuant's way,
    ``s_c = a_c^alpha / r2_c^(1-alpha)``, in one sweep (pairs share no activation, so one pair's
    scales leave every other pair's activation as it was); pairs whose activation is not in it
    are left alone.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, not {iterations}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be 0 or more, not {tolerance}")
    start = time.perf_counter()
    refined = onnx.ModelProto()
    refined.CopyFrom(model)
    pairs = _pairs(refined.graph)
    if activation_max is not None:
        pairs = [pair for pair in pairs if pair.tensor in activation_max]
    if not pairs:
        seconds = time.perf_counter() - start
        return Refined(EQUALIZE, refined, seconds=seconds, skipped=NOTHING_ELIGIBLE)
    original = _weights(refined.graph, pairs)
    weights = {name: values.astype(np.float64) for name, values in original.items()}
    if activation_max is None:
        totals = _equalize_weights(pairs, weights, iterations, tolerance)
    else:
        totals = _equalize_activations(pairs, weights, activation_max, alpha)
    final = {name: values.astype(np.float32) for name, values in weights.items()}
    changed = {name for name, values in final.items() if not np.array_equal(values, original[name])}
    _store(refined.graph, {name: final[name] for name in changed})
    layers = [
        _layer_change(pair, total, original, final)
        for pair, total in zip(pairs, totals, strict=True)
        if changed.intersection(_names(pair))
    ]
    skipped = "" if layers else f"{len(pairs)} conv pair(s), all already equalized"
    rescaled = [t for pair in pairs if changed.intersection(_names(pair)) for t in pair.chain]
    return Refined(EQUALIZE, refined, layers, time.perf_counter() - start, skipped, rescaled)


# --- finding the pairs -------------------------------------------------------------------------


def _pairs(graph: onnx.GraphProto) -> list[_Pair]:
    """The eligible pairs of the main graph, in graph (topological) order of their first conv."""
    consumers = _consumers(graph)
    uses = Counter(_all_inputs(graph))
    outputs = {o.name for o in graph.output}
    constants = _own_initializers(graph)
    found = []
    for node in graph.node:
        if not _is_conv(node):
            continue
        joined = _follow(node.output[0], consumers, outputs)
        pair = _pair(node, *joined, constants, uses) if joined else None
        if pair:
            found.append(pair)
    return found


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto | None, int]]]:
    """Tensor -> (node, input index) of each main-graph use; a use inside a subgraph is
    ``(None, -1)``, which no pair accepts."""
    found: dict[str, list[tuple[onnx.NodeProto | None, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                found.setdefault(name, []).append((node, index))
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                for name in _all_inputs(sub):
                    found.setdefault(name, []).append((None, -1))
    return found


def _all_inputs(graph: onnx.GraphProto) -> Iterator[str]:
    """Every input name of every node, subgraphs included (an outer tensor used there counts)."""
    for node in graph.node:
        yield from (name for name in node.input if name)
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                yield from _all_inputs(sub)


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _own_initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Float32 initializers a feed cannot override (those not listed as graph inputs), with
    their values in the model (external data loaded)."""
    fed = {i.name for i in graph.input}
    return {
        t.name: t
        for t in graph.initializer
        if t.name not in fed
        and t.data_type == onnx.TensorProto.FLOAT
        and t.data_location != onnx.TensorProto.EXTERNAL  # not loaded: nothing to rescale
    }


def _is_conv(node: onnx.NodeProto) -> bool:
    return node.op_type == "Conv" and node.domain in _ONNX_DOMAINS and len(node.output) == 1


def _follow(
    tensor: str,
    consumers: dict[str, list[tuple[onnx.NodeProto | None, int]]],
    outputs: set[str],
) -> tuple[tuple[onnx.NodeProto, ...], tuple[str, ...], tuple[str, ...]] | None:
    """The convs that read ``tensor`` as their data input through ReLU-like ops only, each
    tensor on the way consumed once and no graph output; with the op types passed on the way
    and the tensors from ``tensor`` to the one the convs read. Several convs may read that
    last tensor, none other."""
    between: list[str] = []
    chain = [tensor]
    while tensor not in outputs and consumers.get(tensor):
        uses = consumers[tensor]
        if all(node is not None and index == 0 and _is_conv(node) for node, index in uses):
            return tuple(node for node, _ in uses), tuple(between), tuple(chain)
        node, index = uses[0]
        if len(uses) != 1 or node is None or index != 0:
            return None
        if node.op_type not in RELU_LIKE or node.domain not in _ONNX_DOMAINS:
            return None
        if len(node.output) != 1:
            return None
        between.append(node.op_type)
        tensor = node.output[0]
        chain.append(tensor)
    return None


def _pair(
    first: onnx.NodeProto,
    seconds: tuple[onnx.NodeProto, ...],
    between: tuple[str, ...],
    chain: tuple[str, ...],
    constants: dict[str, onnx.TensorProto],
    uses: Counter[str],
) -> _Pair | None:
    """The pair, when its weights are initializers of its own and the channel counts agree."""

    def own(index: int, node: onnx.NodeProto) -> str | None:
        name = node.input[index] if len(node.input) > index else ""
        return name if name in constants and uses[name] == 1 else None

    weight1 = own(1, first)
    has_bias = len(first.input) > 2 and first.input[2] != ""
    bias1 = own(2, first) if has_bias else None
    if weight1 is None or (has_bias and bias1 is None):
        return None
    dims1 = list(constants[weight1].dims)
    channels = dims1[0] if len(dims1) >= 3 else -1
    if bias1 is not None and list(constants[bias1].dims) != [channels]:
        return None
    found = []
    for second in seconds:
        weight2, group2 = own(1, second), _group(second)
        dims2 = list(constants[weight2].dims) if weight2 else []
        if len(dims2) < 3 or dims2[1] * group2 != channels or dims2[0] % group2:
            return None
        found.append(_Second(second, weight2, group2))
    return _Pair(first, tuple(found), between, weight1, bias1, chain)


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1) or 1


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type} -> {node.output[0]}"


# --- the scales --------------------------------------------------------------------------------


def _names(pair: _Pair) -> list[str]:
    return [name for name in (pair.weight1, pair.bias1) if name] + [
        second.weight for second in pair.seconds
    ]


def _weights(graph: onnx.GraphProto, pairs: list[_Pair]) -> dict[str, np.ndarray]:
    """The pairs' initializers as stored (float32; the sweeps work on float64 copies and round
    to float32 once, at the end)."""
    names = {name for pair in pairs for name in _names(pair)}
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in names}


def _equalize_weights(
    pairs: list[_Pair], weights: dict[str, np.ndarray], iterations: int, tolerance: float
) -> list[np.ndarray]:
    """Sweep the pairs in order, rescaling ``weights`` in place; each pair's accumulated scale.

    A conv inside a chain is the second of one pair and the first of the next, so balancing one
    pair unbalances its neighbour a little: sweep until the scales settle."""
    totals = [np.ones(weights[p.weight1].shape[0]) for p in pairs]
    for _ in range(iterations):
        moved = 0.0
        for pair, total in zip(pairs, totals, strict=True):
            scales = _pair_scales(pair, weights)
            _apply(pair, scales, weights)
            total *= scales
            moved = max(moved, float(np.max(np.abs(scales - 1))))
        if moved <= tolerance:
            break
    return totals


def _equalize_activations(
    pairs: list[_Pair],
    weights: dict[str, np.ndarray],
    activation_max: Mapping[str, np.ndarray],
    alpha: float,
) -> list[np.ndarray]:
    """One sweep: each pair's activation balanced against its second convs' weights."""
    totals = []
    for pair in pairs:
        measured = np.asarray(activation_max[pair.tensor], np.float64).reshape(-1)
        reading = _second_ranges(pair, weights)
        if measured.shape != reading.shape:
            totals.append(np.ones(reading.shape))
            continue
        scales = smoothing_scales(measured, reading, alpha).astype(np.float64)
        scales[np.abs(scales - 1) <= _FLOAT32_NOISE] = 1.0
        _apply(pair, scales, weights)
        totals.append(scales)
    return totals


def _pair_scales(pair: _Pair, weights: dict[str, np.ndarray]) -> np.ndarray:
    """s_i = sqrt(r1_i / r2_i) from the weight ranges (the data-free choice)."""
    first = _output_ranges(weights[pair.weight1])
    return balancing_scales(first, _second_ranges(pair, weights))


def _second_ranges(pair: _Pair, weights: dict[str, np.ndarray]) -> np.ndarray:
    """max|W| over every second conv's weights that read each channel."""
    ranges = [_input_ranges(weights[s.weight], s.group) for s in pair.seconds]
    return np.max(ranges, axis=0)


def balancing_scales(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per channel, the s that gives ranges ``first / s`` and ``second * s`` both
    sqrt(first * second). 1 where either range is 0 (a dead channel has nothing to balance) and
    where s is within float32 rounding of 1 (so equalizing twice changes nothing)."""
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scales = np.sqrt(first / second)
    usable = (first > 0) & (second > 0) & np.isfinite(scales) & (scales > 0)
    usable &= np.abs(scales - 1) > _FLOAT32_NOISE
    return np.where(usable, scales, 1.0)


def _output_ranges(weight: np.ndarray) -> np.ndarray:
    """max|W[i]| per output channel, over the whole filter."""
    return np.abs(weight).reshape(weight.shape[0], -1).max(axis=1)


def _by_group(weight: np.ndarray, group: int) -> np.ndarray:
    """``weight`` [M, C/g, ...] viewed as [g, M/g, C/g, rest]: input channel i is
    [i // (C/g), :, i % (C/g)] (group 1: W[:, i]; depthwise: W[i*m:(i+1)*m, 0])."""
    per_group = weight.shape[1]
    return weight.reshape(group, weight.shape[0] // group, per_group, -1)


def _input_ranges(weight: np.ndarray, group: int) -> np.ndarray:
    """max|W| over the weights that read each input channel."""
    return np.abs(_by_group(weight, group)).max(axis=(1, 3)).reshape(-1)


def _apply(pair: _Pair, scales: np.ndarray, weights: dict[str, np.ndarray]) -> None:
    """W1[i] /= s_i, b1[i] /= s_i, and every W2's input channel i *= s_i."""
    shape = (-1,) + (1,) * (weights[pair.weight1].ndim - 1)
    weights[pair.weight1] = weights[pair.weight1] / scales.reshape(shape)
    if pair.bias1:
        weights[pair.bias1] = weights[pair.bias1] / scales
    for second in pair.seconds:
        weight2 = weights[second.weight]
        grouped = _by_group(weight2, second.group) * scales.reshape(second.group, 1, -1, 1)
        weights[second.weight] = grouped.reshape(weight2.shape)


def _store(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> None:
    """Write float32 ``weights`` back under their own names, in their own places."""
    for tensor in graph.initializer:
        if tensor.name in weights:
            stored = numpy_helper.from_array(weights[tensor.name], tensor.name)
            stored.doc_string = tensor.doc_string
            tensor.CopyFrom(stored)


# --- the record --------------------------------------------------------------------------------


def _layer_change(
    pair: _Pair,
    total: np.ndarray,
    before: dict[str, np.ndarray],
    after: dict[str, np.ndarray],
) -> LayerChange:
    """The pair's record: the channels it scaled and the worse of its two weights' SQNR."""
    scaled = int(np.count_nonzero(total != 1))
    through = " -> ".join(pair.between) if pair.between else "nothing"
    detail = (
        f"{scaled} of {total.size} channels rescaled, W1/s and W2*s with s in "
        f"{total.min():.3g}..{total.max():.3g} (through {through})"
    )
    return LayerChange(
        node=pair.label,
        detail=detail,
        before=_pair_sqnr(pair, before),
        after=_pair_sqnr(pair, after),
        measure=MEASURE,
    )


def _pair_sqnr(pair: _Pair, weights: dict[str, np.ndarray]) -> float:
    """The lower of the two convs' weight SQNRs, each as INT8 per output channel quantizes it."""
    return min(
        weight_sqnr(weights[pair.weight1], pair.first),
        *(weight_sqnr(weights[s.weight], s.node) for s in pair.seconds),
    )


def weight_sqnr(values: np.ndarray, node: onnx.NodeProto) -> float:
    """SQNR in dB of ``values`` (``node``'s weight input) after symmetric INT8 quantization with
    the scale TensorRT takes (max|w| / 127 per output channel), rounding half to even as
    QuantizeLinear does; inf when it quantizes exactly."""
    weight = np.asarray(values, dtype=np.float32)
    axis = weight_axis(node, 1, weight.shape)
    scale = weight_scale(weight, axis)
    if axis is not None:
        scale = np.expand_dims(scale, tuple(a for a in range(weight.ndim) if a != axis))
    quantized = np.clip(np.rint(weight / scale), -INT8_MAX, INT8_MAX) * scale
    signal = float(np.sum(np.square(weight, dtype=np.float64)))
    noise = float(np.sum(np.square(weight.astype(np.float64) - quantized)))
    if noise == 0:
        return math.inf if signal > 0 else math.nan
    return 10 * math.log10(signal / noise)


def activation_tensors(model: onnx.ModelProto) -> list[str]:
    """The activations of ``model``'s eligible pairs (what ``activation_max`` must measure,
    per channel along axis 1)."""
    return [pair.tensor for pair in _pairs(model.graph)]
