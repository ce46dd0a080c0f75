"""Two-stage (residual) INT8 activations: a few sensitive tensors quantized twice (issue 38).

Per-tensor INT8 gives an activation about 8 bits of its range; where one tensor's rounding
costs the task most (measured on the corpus: the audio fed to basic-pitch's constant-Q
front end, the stem of a YOLOX detector, every activation of MTCNN's P-Net), no choice of its
range recovers it. Two INT8 stages do, with every op still INT8 and TensorRT's rules kept
(symmetric, per-tensor activations, no zero point):

    x1 = DQ(Q(x, s))                 the tensor as quantized today
    x2 = DQ(Q(x - x1, s / RATIO))    its rounding error, quantized on a grid RATIO times finer
    y  = Conv(x1, W, b) + Conv(x2, W)

Each reader that is linear in that input (Conv, ConvTranspose, MatMul, Gemm: input 0) runs
twice in INT8, the second time on the residual without its bias, and the two outputs are added
(an elementwise Add TensorRT fuses into the second conv's epilogue); any other reader reads
``x1 + x2``. The residual's error is that of a ~15-bit grid inside [-amax, amax] (the values
the first stage clips stay clipped beyond 2 * s / RATIO * 127). The cost: one extra INT8 pass
of each reader of each chosen tensor, a Sub and a Q/DQ pair.

The transform works on a Q/DQ model (``quantize``'s output): it finds the tensor's
QuantizeLinear/DequantizeLinear pair and rewires its readers. Which tensors to treat is the
caller's choice (:func:`choose_greedy`: the best prefix of a sensitivity ranking, then the
other tensors one at a time, each kept only where the judged score gains).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantbench.model.graph import toposorted
from quantbench.model.names import tensor_names, unique

#: the residual's scale is the first stage's divided by this (a power of two: the residual of
#: a first-stage rounding lies in [-s/2, s/2], which the finer grid covers 64 / 2 = 32 times
#: over before it clips: room for what the first stage clipped)
RATIO = 64.0
#: readers run twice (input 0 linear in the tensor, the bias dropped the second time)
LINEAR_READERS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "MatMul": None}


def qdq_pair(model: onnx.ModelProto, tensor: str) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """The QuantizeLinear reading ``tensor`` and the one DequantizeLinear reading it."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] == tensor:
            found = readers.get(n.output[0], [])
            if len(found) == 1 and found[0].op_type == "DequantizeLinear":
                return n, found[0]
    raise KeyError(f"no Q/DQ pair quantizes {tensor!r}")


def two_stage(
    model: onnx.ModelProto, tensors: Sequence[str], ratio: float = RATIO
) -> onnx.ModelProto:
    """A copy of the Q/DQ ``model`` with each of ``tensors`` quantized in two stages."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for tensor in tensors:
        _two_stage_one(out, tensor, ratio)
    return toposorted(out)


def _two_stage_one(model: onnx.ModelProto, tensor: str, ratio: float) -> None:
    graph = model.graph
    q, dq = qdq_pair(model, tensor)
    inits = {i.name: i for i in graph.initializer}
    scale = numpy_helper.to_array(inits[q.input[1]])
    if scale.size != 1:
        raise ValueError(f"{tensor}: per-channel activation scale, not a TensorRT activation")
    zero_type = inits[q.input[2]].data_type if len(q.input) > 2 and q.input[2] else None
    taken = tensor_names(model)
    base = unique(taken, f"{tensor}_stage2")
    residual, q2, x2, s2, z2 = (f"{base}_{x}" for x in ("in", "q", "dq", "scale", "zp"))
    graph.initializer.append(
        numpy_helper.from_array(np.asarray(scale.reshape(()) / ratio, np.float32), s2)
    )
    zero = np.zeros((), np.uint8 if zero_type == onnx.TensorProto.UINT8 else np.int8)
    graph.initializer.append(numpy_helper.from_array(zero, z2))
    x1 = dq.output[0]
    added: list[onnx.NodeProto] = [
        helper.make_node("Sub", [tensor, x1], [residual], name=f"{base}_sub"),
        helper.make_node("QuantizeLinear", [residual, s2, z2], [q2], name=f"{base}_quantize"),
        helper.make_node("DequantizeLinear", [q2, s2, z2], [x2], name=f"{base}_dequantize"),
    ]
    summed = None
    for node in list(graph.node):
        if node in added or x1 not in node.input:
            continue
        bias_slot = LINEAR_READERS.get(node.op_type, -1)
        if bias_slot != -1 and list(node.input).count(x1) == 1 and node.input[0] == x1:
            twin = onnx.NodeProto()
            twin.CopyFrom(node)
            twin.name = unique(taken, f"{node.name or node.op_type}_stage2")
            twin.input[0] = x2
            if bias_slot is not None and len(twin.input) > bias_slot:
                del twin.input[bias_slot:]  # the bias once, in the first stage's reader
            if node.op_type == "Gemm":
                _drop_attribute(twin, "beta")
            first = unique(taken, f"{node.output[0]}_stage1")
            second = unique(taken, f"{twin.name}_out")
            final = node.output[0]
            node.output[0] = first
            twin.output[0] = second
            added += [twin, helper.make_node("Add", [first, second], [final],
                                             name=f"{twin.name}_add")]  # fmt: skip
        else:
            if summed is None:
                summed = f"{base}_sum"
                added.append(helper.make_node("Add", [x1, x2], [summed], name=f"{base}_add"))
            for k, name in enumerate(node.input):
                if name == x1:
                    node.input[k] = summed
    if any(o.name == x1 for o in graph.output):
        raise ValueError(f"{tensor}: its dequantized form is a graph output")
    graph.node.extend(added)


def _drop_attribute(node: onnx.NodeProto, name: str) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)


@dataclass
class Choice:
    """The tensors kept, the judged score after each trial (tensor, score, kept)."""

    tensors: list[str]
    base_db: float
    score_db: float
    trials: list[tuple[str, float, bool]] = field(default_factory=list)


def choose_greedy(
    model: onnx.ModelProto,
    ranked: Sequence[str],
    score: Callable[[onnx.ModelProto], float],
    *,
    budget: int = 16,
    min_gain_db: float = 0.01,
    prefixes: Sequence[int] = (),
    cost: Mapping[str, float] | None = None,
    max_cost: float = float("inf"),
) -> Choice:
    """Pick tensors of ``ranked`` (most sensitive first) to quantize in two stages, judged by
    ``score`` (output SQNR, dB, higher is better): first the best of the ranking's prefixes
    of ``prefixes`` sizes, each tried as one set (neighbouring tensors' rounding errors can
    cancel at the outputs, so that one of them alone in two stages loses: measured on a YOLOX
    stem), kept only where it gains ``min_gain_db``; then the other tensors in rank order, each
    kept on top of the others where it gains ``min_gain_db``; at most ``budget`` tensors and,
    with ``cost`` (a tensor's added work, e.g. its linear readers' MACs as a fraction of the
    model's), at most ``max_cost`` of it in all."""
    spent = (lambda names: sum(cost.get(n, 0.0) for n in names)) if cost else (lambda _: 0.0)
    base = best = score(model)
    kept: list[str] = []
    trials = []
    for size in sorted({k for k in prefixes if 1 < k <= min(budget, len(ranked))}):
        if spent(ranked[:size]) > max_cost:
            break
        found = score(two_stage(model, ranked[:size]))
        trials.append((f"first {size}", found, False))
        if found >= best + min_gain_db:
            best, kept = found, list(ranked[:size])
    if kept:
        trials = [(t, s, t == f"first {len(kept)}") for t, s, _ in trials]
    for tensor in ranked:
        if len(kept) >= budget:
            break
        if tensor in kept or spent([*kept, tensor]) > max_cost:
            continue
        found = score(two_stage(model, [*kept, tensor]))
        gain = found >= best + min_gain_db
        trials.append((tensor, found, gain))
        if gain:
            kept.append(tensor)
            best = found
    return Choice(kept, base, best, trials)


#: the prefix sizes :func:`choose` tries as sets
PREFIXES = (2, 4, 8, 12, 16)


def choose(
    model: onnx.ModelProto,
    ranked: Sequence[str],
    score: Callable[[onnx.ModelProto], float],
    *,
    budget: int = 16,
    min_gain_db: float = 0.01,
    cost: Mapping[str, float] | None = None,
    max_cost: float = float("inf"),
) -> tuple[Choice, Choice]:
    """Both searches of :func:`choose_greedy`, one tensor at a time and from the best prefix
    first (judged on the calibration slice, one at a time won on two corpus models of four,
    the prefix on one, the fourth a tie): (the one with the higher score, the other)."""
    common = {"budget": budget, "min_gain_db": min_gain_db, "cost": cost, "max_cost": max_cost}
    one = choose_greedy(model, ranked, score, **common)
    sets = choose_greedy(model, ranked, score, prefixes=PREFIXES, **common)
    return (sets, one) if sets.score_db > one.score_db else (one, sets)
