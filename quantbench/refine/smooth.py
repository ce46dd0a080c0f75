"""SmoothQuant-style activation-outlier migration for MatMul/Gemm and Conv with constant weights.

Transformer activations (LayerNorm outputs, the residual stream) carry a few input channels
up to 100x larger than the rest; one per-tensor INT8 scale sized for them leaves the other
channels a handful of levels. Weights are quantized per *output* channel, so their input
channels can absorb a per-channel factor: with ``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``
(Xiao et al., "SmoothQuant", 2023), ``X' = X / s`` and ``W' = diag(s) W`` compute the same
``X' W' = X W`` while the activation's channels come closer together (``alpha`` moves the
difficulty between the two sides: 0.5 splits it evenly).

``1/s`` is folded where it is free: a LayerNormalization whose output feeds only the smoothed
projections (the Q/K/V of one attention layer share one ``s``, taken over all of their
weights) gets its Scale and B divided by ``s``. Elsewhere one ``Mul(X, 1/s)`` feeds the
smoothed consumers only; other consumers (a residual Add) keep ``X``.

A Conv's input channels (axis 1) take ``s`` the same way: ``W[:, c]`` of a plain conv,
``W[c]`` of a depthwise one (whose per-channel weight scale then absorbs it exactly), with
``Mul(X, 1/s)`` shaped [C, 1, ...] in front. CNNs whose convs read an Add or a Mul carry the
same per-channel outliers: PP-OCRv5's recognizer (PP-LCNetV3 with learnable affine blocks)
3.5-52x between channels, where smoothing took its INT8 output SQNR 4.6 -> 11.7 dB and CTC line
agreement 27 -> 85 %; dddd-ocr's SiLU outputs, 85.4 -> 89.4 % of lines.

The rewrite keeps the FP32 function (up to float rounding) but moves activation ranges: a
calibration table must be made on the refined model (``RANGE_CHANGING``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from quantbench.data.sources import DataSource
from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph, node_labels, open_graph
from quantbench.model.names import tensor_names, unique
from quantbench.refine import SMOOTH, LayerChange, Refined, edits
from quantbench.refine.activations import channel_max

#: the smallest smoothing factor (SmoothQuant's clamp): keeps 1/s finite
MIN_SCALE = 1e-5
MEASURE = (
    "activation channel range: max/median over X's input channels of max|X_j| on the "
    "calibration data (1 = flat); after = max|X_j / s_j|, exact"
)


@dataclass
class _Target:
    """A MatMul/Gemm or Conv whose constant weight can absorb ``s`` along its input channels."""

    node: onnx.NodeProto
    label: str
    weight: np.ndarray
    #: the weight's input-channel axis: 0 for MatMul's [K, N] and Gemm's B, 1 for Gemm transB
    #: and a Conv's [M, C, k...], 0 for a depthwise Conv's [C, 1, k...] (its input channel c
    #: is its output channel c, whose per-channel weight scale takes any factor exactly)
    in_axis: int
    #: the activation's channel axis: last for MatMul/Gemm, 1 for Conv (NCHW)
    x_axis: int = -1

    @property
    def channel_max(self) -> np.ndarray:
        """max|W_j| per input channel j (float64)."""
        others = tuple(a for a in range(self.weight.ndim) if a != self.in_axis)
        return np.abs(self.weight.astype(np.float64)).max(axis=others)


def smooth(
    model: onnx.ModelProto,
    data: DataSource | None,
    *,
    alpha: float = 0.5,
    provider: str | None = None,
    channel_max: Mapping[str, np.ndarray] | None = None,
) -> Refined:
    """Smoothed copy of ``model``: every activation X made by a LayerNorm or an Add
    (:data:`OUTLIER_PRODUCERS`) feeding MatMul/Gemm nodes with constant 2-D weights (Gemm
    without transA) is divided by ``s`` per input channel, their weights multiplied by it (a
    LayerNormalization takes ``1/s`` for free; an Add gets a Mul after it).
    Channels whose maxima are already flat (``s = 1`` throughout) are left alone.

    ``channel_max``: max|X_j| per tensor (:func:`activation_channel_max`), so that a search
    over ``alpha`` streams the data once; tensors it lacks are measured on ``data`` (which
    may be None where ``channel_max`` has them all). ``model`` is not modified."""
    if not 0.0 <= alpha <= 1.0:
        raise QuantbenchError(f"smoothing alpha must lie in [0, 1], not {alpha}")
    start = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = open_graph(out, require_fixed_rank=False)
    groups = _targets(graph, out)
    if not groups:
        why = "no MatMul, Gemm or Conv with a constant weight reads a LayerNorm, Add or Mul output"
        return Refined(SMOOTH, out, skipped=why)
    maxima = dict(channel_max or {})
    missing = [x for x in groups if x not in maxima]
    if missing and data is None:
        raise QuantbenchError(f"smoothing needs data: no channel maxima for {', '.join(missing)}")
    if missing:
        axes = {x: groups[x][0].x_axis for x in missing}
        maxima.update(activation_channel_max(model, data, axes, provider=provider))
    changes, reasons, rescaled = _apply(graph, out, groups, maxima, alpha)
    skipped = "" if changes else "; ".join(reasons) or "no activation to smooth"
    return Refined(SMOOTH, out, changes, time.perf_counter() - start, skipped, rescaled)


#: where activation outliers come from in transformers: a LayerNorm's per-channel gain, a
#: residual sum (a LayerNorm decomposed by its exporter ends in an Add too), and a product: the
#: final Mul of a decomposed GELU or SiLU, which feeds the feed-forward down-projection (minilm's
#: GELU outputs span 4-19x between channels, max over median: cheap smoothing there took its
#: neighbour agreement 96.0 -> 98.0 %, output SQNR 26.2 -> 27.9 dB). A Mul is smoothed only
#: where its channels are not already flat (:data:`FLAT_PRODUCT`): an LSTM's hidden state
#: o * tanh(c), 1.0-1.3x on captcha-crnn, gains nothing and would cost a judging pass. A CNN's
#: classifier head (Flatten -> Gemm) has none worth a Mul in front of its Gemm.
OUTLIER_PRODUCERS = frozenset({"LayerNormalization", "SkipLayerNormalization", "Add", "Mul"})
#: producers smoothed only where max|X_j| varies between channels by more than
#: :data:`FLAT_PRODUCT` (max over median)
PRODUCTS = frozenset({"Mul"})
FLAT_PRODUCT = 2.0


def smoothable_tensors(model: onnx.ModelProto) -> dict[str, int]:
    """The activations :func:`smooth` would divide (inputs of MatMul/Gemm with constant 2-D
    weights, of Conv with constant weights), whose channel maxima it needs: each with its
    channel axis."""
    groups = _targets(open_graph(model, require_fixed_rank=False), model)
    return {x: targets[0].x_axis for x, targets in groups.items()}


def activation_channel_max(
    model: onnx.ModelProto,
    data: DataSource,
    tensors: Mapping[str, int] | Iterable[str],
    provider: str | None = None,
) -> dict[str, np.ndarray]:
    """max|X_j| per channel j of each tensor over ``data`` (one streamed FP32 pass, a running
    maximum over the other axes; non-finite values left out), along the axis ``tensors``
    gives it (:func:`smoothable_tensors`), else the last."""
    axes = dict(tensors) if isinstance(tensors, Mapping) else dict.fromkeys(tensors, -1)
    return channel_max(model, data, list(axes), axis=axes, provider=provider)


def smoothing_scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``, at least :data:`MIN_SCALE`; 1 for a
    channel whose activation or weight is all zero (nothing to balance, and the formula would
    divide by zero or drive the weight to zero)."""
    x = np.asarray(x_max, np.float64)
    w = np.asarray(w_max, np.float64)
    live = (x > 0) & (w > 0)
    safe_w = np.where(live, w, 1.0)
    s = np.where(live, np.power(x, alpha) / np.power(safe_w, 1.0 - alpha), 1.0)
    return np.maximum(s, MIN_SCALE).astype(np.float32)


# --------------------------------------------------------------------------- which layers


def _targets(graph: Graph, model: onnx.ModelProto) -> dict[str, list[_Target]]:
    """The smoothable nodes of ``model`` grouped by their activation input, in graph order."""
    groups: dict[str, list[_Target]] = {}
    producers = graph.producers()
    for node, label in zip(model.graph.node, node_labels(model.graph.node), strict=True):
        made_by = _producer(producers, node.input[0]) if node.input else None
        if made_by is None or made_by.op_type not in OUTLIER_PRODUCERS:
            continue
        target = _target(graph, model, node, label)
        same_kind = target is not None and all(
            t.x_axis == target.x_axis for t in groups.get(node.input[0], [])
        )
        if target is not None and same_kind:
            groups.setdefault(node.input[0], []).append(target)
    return groups


def _producer(producers: Mapping[str, onnx.NodeProto], x: str) -> onnx.NodeProto | None:
    """The node that makes ``x``, looking through Identity (Paddle's exporter puts one after
    most ops: PP-OCRv5's convs read ``Identity(Add(...))``)."""
    made_by = producers.get(x)
    seen = 0
    while made_by is not None and made_by.op_type == "Identity" and seen < 16:
        made_by, seen = producers.get(made_by.input[0]), seen + 1
    return made_by


def _target(
    graph: Graph, model: onnx.ModelProto, node: onnx.NodeProto, label: str
) -> _Target | None:
    if node.op_type == "Conv" and node.domain in ("", "ai.onnx"):
        return _conv_target(graph, model, node, label)
    if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) < 2 or node.input[0] in graph.constants:
        return None
    if node.op_type == "Gemm" and edits.attr(node, "transA", 0):
        return None  # X's input channels are then its first axis
    weight = edits.constant(model, graph, node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype.kind != "f":
        return None
    in_axis = 1 if node.op_type == "Gemm" and edits.attr(node, "transB", 0) else 0
    return _Target(node, label, weight, in_axis)


def _conv_target(
    graph: Graph, model: onnx.ModelProto, node: onnx.NodeProto, label: str
) -> _Target | None:
    """A Conv with a constant weight whose input channels can each take a factor: a plain one
    (group 1: ``W[:, c]``) or a depthwise one (one input channel a group: ``W[c]``)."""
    if len(node.input) < 2 or node.input[0] in graph.constants:
        return None
    weight = edits.constant(model, graph, node.input[1])
    if weight is None or weight.ndim < 3 or weight.dtype.kind != "f":
        return None
    group = edits.attr(node, "group", 1)
    if group == 1:
        return _Target(node, label, weight, in_axis=1, x_axis=1)
    if weight.shape[1] == 1 and weight.shape[0] == group:
        return _Target(node, label, weight, in_axis=0, x_axis=1)
    return None


# --------------------------------------------------------------------------- rewriting


def _apply(
    graph: Graph,
    model: onnx.ModelProto,
    groups: dict[str, list[_Target]],
    maxima: Mapping[str, np.ndarray],
    alpha: float,
) -> tuple[list[LayerChange], list[str], list[str]]:
    """Smooths every group; the records, why groups were left alone, and the tensors left
    scaled by ``1/s`` under their own names (a LayerNorm's output that took it)."""
    taken = tensor_names(model)
    consumers = edits.consumers(model)
    producers = {o: n for n in model.graph.node for o in n.output if o}
    outputs = {o.name for o in model.graph.output}
    changes: list[LayerChange] = []
    reasons: list[str] = []
    replaced: list[str] = []
    rescaled: list[str] = []
    for x, targets in groups.items():
        x_max = np.asarray(maxima[x], np.float64).reshape(-1)
        channels = targets[0].weight.shape[targets[0].in_axis]
        if x_max.shape != (channels,):
            reasons.append(f"{x}: {x_max.size} activation maxima for {channels} input channels")
            continue
        made_by = producers.get(x)
        if made_by is not None and made_by.op_type in PRODUCTS:
            spread = float(x_max.max() / max(float(np.median(x_max)), np.finfo(np.float64).tiny))
            if spread <= FLAT_PRODUCT:
                reasons.append(f"{x}: channels already flat (max/median {spread:.1f})")
                continue
        w_max = np.max([t.channel_max for t in targets], axis=0)
        s = smoothing_scales(x_max, w_max, alpha)
        if np.all(s == 1):
            reasons.append(f"{x}: s = 1 on every channel")
            continue
        norm = _foldable_norm(graph, model, x, targets, consumers, producers, outputs)
        if norm is not None:
            ln, constants = norm
            replaced += _fold_into_norm(model, ln, constants, s, taken)
            rescaled.append(x)
            how = f"1/s folded into LayerNormalization {ln.name or ln.output[0]}'s Scale and B"
        else:
            how = _insert_mul(model, x, targets, s, taken, len(consumers.get(x, [])))
        replaced += [_scale_weight(model, t, s, taken) for t in targets]
        changes.append(_record(x, targets, x_max, w_max, s, alpha, how))
    edits.drop_unused_initializers(model, replaced)
    return changes, reasons, rescaled


def _foldable_norm(
    graph: Graph,
    model: onnx.ModelProto,
    x: str,
    targets: list[_Target],
    consumers: dict[str, list[onnx.NodeProto]],
    producers: dict[str, onnx.NodeProto],
    outputs: set[str],
) -> tuple[onnx.NodeProto, dict[int, np.ndarray]] | None:
    """The LayerNormalization producing ``x`` and its Scale/B by input index, when ``1/s`` can
    go into them: ``x`` is its Y, read only by ``targets`` (not a graph output), and Scale/B
    are constants whose last axis is X's channels."""
    ln = producers.get(x)
    if ln is None or ln.op_type != "LayerNormalization" or ln.domain not in ("", "ai.onnx"):
        return None
    if ln.output[0] != x or x in outputs:
        return None
    readers = consumers.get(x, [])
    if sorted(n.output[0] for n in readers) != sorted(t.node.output[0] for t in targets):
        return None
    channels = targets[0].weight.shape[targets[0].in_axis]
    constants: dict[int, np.ndarray] = {}
    for index in [i for i in (1, 2) if len(ln.input) > i and ln.input[i]]:
        value = edits.constant(model, graph, ln.input[index])
        if value is None or value.ndim == 0 or value.shape[-1] != channels:
            return None
        constants[index] = value
    return ln, constants


def _fold_into_norm(
    model: onnx.ModelProto,
    ln: onnx.NodeProto,
    constants: dict[int, np.ndarray],
    s: np.ndarray,
    taken: set[str],
) -> list[str]:
    """Scale/s and B/s as new initializers of ``ln`` (the old may be shared); the names they
    replaced."""
    old = [ln.input[index] for index in constants]
    for (index, value), name in zip(constants.items(), old, strict=True):
        scaled = (value / s).astype(value.dtype)
        ln.input[index] = edits.add_initializer(model, scaled, f"{name}_smooth", taken)
    return old


def _insert_mul(
    model: onnx.ModelProto,
    x: str,
    targets: list[_Target],
    s: np.ndarray,
    taken: set[str],
    readers: int,
) -> str:
    """``Mul(x, 1/s)`` just before the first target, feeding the targets only; says so."""
    dtype = targets[0].weight.dtype
    # along the activation's channel axis: NCHW's channels come before the spatial axes
    shape = (-1,) if targets[0].x_axis == -1 else (-1,) + (1,) * (targets[0].weight.ndim - 2)
    inverse = edits.add_initializer(
        model, (1 / s).astype(dtype).reshape(shape), f"{x}_smooth_scale", taken
    )
    smoothed = unique(taken, f"{x}_smooth")
    mul = helper.make_node("Mul", [x, inverse], [smoothed], name=smoothed)
    ours = {t.node.output[0] for t in targets}
    at = next(i for i, n in enumerate(model.graph.node) if n.output and n.output[0] in ours)
    for t in targets:
        t.node.input[0] = smoothed
    model.graph.node.insert(at, mul)
    others = readers - len(targets)
    kept = f"; {others} other consumer(s) keep {x}" if others else ""
    return f"Mul {smoothed} inserted before them{kept}"


def _scale_weight(model: onnx.ModelProto, target: _Target, s: np.ndarray, taken: set[str]) -> str:
    """``diag(s) W`` as the target's new weight; the name it replaced."""
    shape = [1] * target.weight.ndim
    shape[target.in_axis] = -1
    scaled = (target.weight * s.reshape(shape)).astype(target.weight.dtype)
    old = target.node.input[1]
    target.node.input[1] = edits.add_initializer(model, scaled, f"{old}_smooth", taken)
    return old


def _record(
    x: str,
    targets: list[_Target],
    x_max: np.ndarray,
    w_max: np.ndarray,
    s: np.ndarray,
    alpha: float,
    how: str,
) -> LayerChange:
    """Activation channel range before/after (exact: max|X_j/s_j| = max|X_j|/s_j), with the
    weights' input-channel range, which grows by what the activation loses."""
    s64 = s.astype(np.float64)
    before, after = _range(x_max), _range(x_max / s64)
    detail = (
        f"alpha {alpha:g}, {len(s)} channels: activation channel range "
        f"{_text(before)} -> {_text(after)}, weights' input-channel range "
        f"{_text(_range(w_max))} -> {_text(_range(w_max * s64))}; {how}"
    )
    node = f"{x} -> {', '.join(t.label for t in targets)}"
    return LayerChange(node, detail, before=before, after=after, measure=MEASURE)


def _range(channel_max: np.ndarray) -> float | None:
    """max/median of per-channel maxima; None where most channels are zero."""
    median = float(np.median(channel_max))
    return float(np.max(channel_max)) / median if median > 0 else None


def _text(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"
