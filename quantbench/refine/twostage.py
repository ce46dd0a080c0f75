"""Two-stage (residual) INT8 activations: a few sensitive tensors quantized twice (issue 38).

Per-tensor INT8 gives an activation about 8 bits of its range; where one tensor's rounding
costs the task most (measured on the corpus: the audio fed to basic-pitch's constant-Q
front end, the stem of a YOLOX detector, every activation of MTCNN's P-Net), no choice of its
range recovers it. Two INT8 stages do, with every op still INT8 and TensorRT's rules kept
(symmetric, per-tensor activations, no zero point):

    x1 = DQ(Q(x, s))                 the tensor as quantized today
    x2 = DQ(Q(x - x1, s / RATIO))    its rounding error, quantized on a grid RATIO times finer
    y  = Conv(x1, W, b) + Conv(x2, W)

Each reader that is linear in that input (Conv, ConvTranspose, MatMul, Gemm: input 0, or
input 1 where it is a runtime kernel or operand) runs twice in INT8, the second time on the
residual without its bias, and the two outputs are added (an elementwise Add TensorRT fuses
into the second conv's epilogue); a residual Add reads ``x1 + x2``. A tensor read by any
other op is no candidate (:func:`candidates`): that op would lose its INT8 input. The
residual's error is that of a ~15-bit grid inside [-amax, amax] (the values
the first stage clips stay clipped beyond 2 * s / RATIO * 127). The cost: one extra INT8 pass
of each reader of each chosen tensor, a Sub and a Q/DQ pair.

The transform works on a Q/DQ model (``quantize``'s output): it finds the tensor's
QuantizeLinear/DequantizeLinear pair and rewires its readers. Which tensors to treat is the
caller's choice (:func:`choose_greedy`: the best prefix of a sensitivity ranking, then the
other tensors one at a time, each kept only where the judged score gains).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantbench.model.graph import second_stage_quantizers, toposorted
from quantbench.model.names import tensor_names, unique

#: the residual's scale is the first stage's divided by this (a power of two: the residual of
#: a first-stage rounding lies in [-s/2, s/2], which the finer grid covers 64 / 2 = 32 times
#: over before it clips: room for what the first stage clipped)
RATIO = 64.0
#: readers run twice, linear in input 0 and in input 1 (a runtime kernel or MatMul operand)
#: with the other fixed: op -> the bias slot, dropped the second time
LINEAR_READERS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "MatMul": None}


def linear_slot(node: onnx.NodeProto, x1: str) -> int | None:
    """The input slot (0 or 1) in which ``node`` is linear in ``x1`` alone, or None."""
    if node.op_type not in LINEAR_READERS or list(node.input).count(x1) != 1:
        return None
    slot = list(node.input).index(x1)
    return slot if slot in (0, 1) else None


def qdq_pair(model: onnx.ModelProto, tensor: str) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """The QuantizeLinear reading ``tensor`` and the one DequantizeLinear reading it."""
    for q, dq in qdq_pairs(model):
        if q.input[0] == tensor:
            return q, dq
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
        slot = linear_slot(node, x1)
        if slot is not None:
            bias_slot = LINEAR_READERS[node.op_type]
            twin = onnx.NodeProto()
            twin.CopyFrom(node)
            twin.name = unique(taken, f"{node.name or node.op_type}_stage2")
            twin.input[slot] = x2
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
    """The tensors kept, the judged score after each trial (tensor, score, kept); with a
    confirming judge, its scores of the model as given and of the set kept."""

    tensors: list[str]
    base_db: float
    score_db: float
    trials: list[tuple[str, float, bool]] = field(default_factory=list)
    confirm_base_db: float = math.nan
    confirm_db: float = math.nan

    def ranking_score(self) -> float:
        """What :func:`choose` compares two searches by: the mean of both judges' scores
        where a second one confirmed (more samples say more), else the first's."""
        if math.isnan(self.confirm_db):
            return self.score_db
        return (self.score_db + self.confirm_db) / 2


def choose_greedy(
    ranked: Sequence[str],
    score: Callable[[Sequence[str]], float],
    *,
    budget: int = 16,
    min_gain_db: float = 0.01,
    prefixes: Sequence[int] = (),
    cost: Callable[[Sequence[str]], float] | None = None,
    max_cost: float = float("inf"),
    confirm: Callable[[Sequence[str]], float] | None = None,
) -> Choice:
    """Pick tensors of ``ranked`` (most sensitive first) to quantize in two stages, judged by
    ``score`` of a set of tensors (the output SQNR, dB, of the model with those tensors in two
    stages: higher is better; ``[]`` is the model as it is): first the best of the ranking's
    prefixes of ``prefixes`` sizes, each tried as one set (neighbouring tensors' rounding errors can
    cancel at the outputs, so that one of them alone in two stages loses: measured on a YOLOX
    stem), kept only where it gains ``min_gain_db``; then the other tensors in rank order, each
    kept on top of the others where it gains ``min_gain_db``; at most ``budget`` tensors and,
    with ``cost`` (the added work of a set of tensors in two stages, e.g. the MACs of their
    linear readers' second runs as a fraction of the model's), at most ``max_cost`` of it.

    ``confirm``: a second judge on other samples, asked only about a set that gained on the
    first; the set is kept only where it gains ``min_gain_db`` there too. A search over dozens
    of sets finds some that win on one slice by chance: on Silero VAD an encoder activation
    added to another gained 0.35 dB on its 64-chunk slice and lost 6.9 dB over the
    calibration's other 236 chunks (silent chunks, where its rounding had cancelled
    another's); the recording lost 1.4 points with it alone.
    """
    spent = cost or (lambda _: 0.0)
    base = best = score([])
    confirm_base = confirmed = math.nan  # asked when a first set gains on the slice
    kept: list[str] = []
    trials = []

    def gains(tensors: list[str], found: float) -> bool:
        """Whether ``tensors`` gains on the first judge's ``found`` and on the second."""
        nonlocal confirmed, confirm_base
        if found < best + min_gain_db:
            return False
        if confirm is None:
            return True
        if math.isnan(confirm_base):
            confirm_base = confirmed = confirm([])
        second = confirm(tensors)
        if second < confirmed + min_gain_db:
            return False
        confirmed = second
        return True

    for size in sorted({k for k in prefixes if 1 < k <= min(budget, len(ranked))}):
        if spent(ranked[:size]) > max_cost:
            break
        found = score(list(ranked[:size]))
        trials.append((f"first {size}", found, False))
        if gains(list(ranked[:size]), found):
            best, kept = found, list(ranked[:size])
    if kept:
        trials = [(t, s, t == f"first {len(kept)}") for t, s, _ in trials]
    for tensor in ranked:
        if len(kept) >= budget:
            break
        if tensor in kept or spent([*kept, tensor]) > max_cost:
            continue
        found = score([*kept, tensor])
        gain = gains([*kept, tensor], found)
        trials.append((tensor, found, gain))
        if gain:
            kept.append(tensor)
            best = found
    return Choice(kept, base, best, trials, confirm_base, confirmed)


#: the prefix sizes :func:`choose` tries as sets
PREFIXES = (2, 4, 8, 12, 16)


def choose(
    ranked: Sequence[str],
    score: Callable[[Sequence[str]], float],
    *,
    budget: int = 16,
    min_gain_db: float = 0.01,
    cost: Callable[[Sequence[str]], float] | None = None,
    max_cost: float = float("inf"),
    confirm: Callable[[Sequence[str]], float] | None = None,
) -> tuple[Choice, Choice]:
    """Both searches of :func:`choose_greedy`, one tensor at a time and from the best prefix
    first (judged on the calibration slice, one at a time won on two corpus models of four,
    the prefix on one, the fourth a tie): (the better by :meth:`Choice.ranking_score`, the
    other). Both start from the same model and try the same sets: ``score`` and ``confirm``
    may remember their answers."""
    common = {"budget": budget, "min_gain_db": min_gain_db, "cost": cost, "max_cost": max_cost,
              "confirm": confirm}  # fmt: skip
    one = choose_greedy(ranked, score, **common)
    sets = choose_greedy(ranked, score, prefixes=PREFIXES, **common)
    return (sets, one) if sets.ranking_score() > one.ranking_score() else (one, sets)


def qdq_pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """Every QuantizeLinear read by exactly one node, a DequantizeLinear, with that reader."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    found = []
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            after = readers.get(n.output[0], [])
            if len(after) == 1 and after[0].op_type == "DequantizeLinear":
                found.append((n, after[0]))
    return found


def candidates(model: onnx.ModelProto) -> list[str]:
    """The activations of the Q/DQ ``model`` that :func:`two_stage` can treat: runtime tensors
    with a per-tensor Q/DQ pair whose dequantized form is no graph output and is read only by
    ops linear in it (:func:`linear_slot`) or by residual Adds, not already a second stage,
    in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    constants = set(inits) | {o for n in model.graph.node if n.op_type == "Constant"
                              for o in n.output}  # fmt: skip
    outputs = {o.name for o in model.graph.output}
    second = {q.output[0] for q in second_stage_quantizers(model)}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in set(n.input):
            readers.setdefault(i, []).append(n)
    found = []
    for q, dq in qdq_pairs(model):
        scale = inits.get(q.input[1])
        if q.input[0] in constants or q.output[0] in second or dq.output[0] in outputs:
            continue
        x1 = dq.output[0]
        if any(linear_slot(r, x1) is None and r.op_type != "Add" for r in readers.get(x1, [])):
            continue  # an op that is neither linear in it nor a residual Add would go FP
        if scale is not None and numpy_helper.to_array(scale).size == 1:
            found.append(q.input[0])
    return list(dict.fromkeys(found))


def only(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """A copy of the Q/DQ ``model`` with every Q/DQ pair bypassed but ``tensor``'s, weights
    included: what quantizing that one activation alone costs at the outputs (the ranking of
    :mod:`quantbench.choose.twostaged`)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    bypass: dict[str, str] = {}
    dropped: set[str] = set()  # the pairs' output names (a node's Python wrapper is no key)
    for q, dq in qdq_pairs(out):
        if q.input[0] != tensor:
            bypass[dq.output[0]] = q.input[0]
            dropped.update((q.output[0], dq.output[0]))
    nodes = []
    for n in model.graph.node:
        if n.output and n.output[0] in dropped:
            continue
        kept = onnx.NodeProto()
        kept.CopyFrom(n)
        for k, name in enumerate(kept.input):
            if name in bypass:
                kept.input[k] = bypass[name]
        nodes.append(kept)
    for o in out.graph.output:
        if o.name in bypass:  # a dequantized graph output keeps its name
            nodes.append(helper.make_node("Identity", [bypass[o.name]], [o.name]))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def linear_readers(model: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    """The nodes :func:`two_stage` would run twice for ``tensor``: its linear readers."""
    _, dq = qdq_pair(model, tensor)
    x1 = dq.output[0]
    return [n for n in model.graph.node if linear_slot(n, x1) is not None]


def node_macs(node: onnx.NodeProto, shapes: Mapping[str, Sequence[int]]) -> float:
    """Multiply-accumulates of one linear node for the shapes of its inputs and output
    (``shapes``: tensor -> shape, as a run gave them); 0 for a shape it lacks."""
    need = [*node.input[:2], node.output[0]]
    if not all(name in shapes for name in need):
        return 0.0
    a, w, y = (list(shapes[name]) for name in need)
    if node.op_type == "Conv":
        return float(np.prod(y)) * float(np.prod(w[1:]))
    if node.op_type == "ConvTranspose":
        return float(np.prod(a)) * float(np.prod(w[1:]))
    if node.op_type == "Gemm":
        trans_a = any(at.name == "transA" and at.i for at in node.attribute)
        return float(np.prod(y)) * float(a[0] if trans_a else a[-1])
    if node.op_type == "MatMul":
        return float(np.prod(y)) * float(a[-1])
    return 0.0


def verify(model: onnx.ModelProto, tensors: Sequence[str], ratio: float = RATIO) -> int:
    """The bug guard on a two-stage model, before it is written: each of ``tensors`` has a
    second stage, a symmetric INT8 per-tensor quantizer (zero point 0) at exactly the first
    stage's scale / ``ratio`` on ``tensor - x1``; every node reading a second stage is a
    residual Add or a linear op without its bias whose output an Add joins to the first
    stage's and whose every multiplied input is INT8 (a DequantizeLinear output). That the
    sum is the reader on ``x1 + x2`` is the transform's own test (tests/test_refine_twostage).
    Returns the twins checked; raises ValueError naming what is wrong."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in set(n.input):
            by_input.setdefault(i, []).append(n)
    producer = {o: n for n in model.graph.node for o in n.output}
    first_of: dict[str, str] = {}  # second stage's DQ output -> the first stage's
    for q2 in second_stage_quantizers(model):
        sub = producer[q2.input[0]]
        for dq2 in by_input.get(q2.output[0], []):
            first_of[dq2.output[0]] = sub.input[1]
    for tensor in tensors:
        q, dq = qdq_pair(model, tensor)
        found = [x2 for x2, x1 in first_of.items() if x1 == dq.output[0]]
        if len(found) != 1:
            raise ValueError(f"{tensor}: no second stage on its rounding error")
        dq2 = producer[found[0]]
        q2 = producer[dq2.input[0]]
        s1, s2 = inits[q.input[1]], inits[q2.input[1]]
        zero = inits[q2.input[2]] if len(q2.input) > 2 else None
        if s2.size != 1 or np.float32(s2) != np.float32(s1.reshape(()) / ratio):
            raise ValueError(f"{tensor}: second-stage scale {s2} is not {s1} / {ratio:g}")
        if zero is None or zero.dtype != np.int8 or zero.any() or dq2.input[1:] != q2.input[1:]:
            raise ValueError(f"{tensor}: second stage not symmetric INT8 (zero point 0)")
    twins: set[str] = set()  # by output: a run reading two second stages is one run
    for x2 in first_of:
        for twin in by_input.get(x2, []):
            if twin.op_type in LINEAR_READERS:
                _check_twin(twin, by_input, producer)
                twins.add(twin.output[0])
            elif twin.op_type != "Add":
                raise ValueError(f"{twin.name} ({twin.op_type}) reads a second stage")
    return len(twins)


def _check_twin(
    twin: onnx.NodeProto,
    by_input: Mapping[str, list[onnx.NodeProto]],
    producer: Mapping[str, onnx.NodeProto],
) -> None:
    """One linear node reading a second stage: see :func:`verify`."""
    joined = by_input.get(twin.output[0], [])
    if len(joined) != 1 or joined[0].op_type != "Add":
        raise ValueError(f"{twin.name}: its output is not added to its first stage's")
    bias = LINEAR_READERS[twin.op_type]
    if bias is not None and len(twin.input) > bias:
        raise ValueError(f"{twin.name}: a second-stage reader adds the bias a second time")
    for k in (0, 1):
        made_by = producer.get(twin.input[k])
        if made_by is None or made_by.op_type != "DequantizeLinear":
            raise ValueError(f"{twin.name}: input {k} is not INT8 (no Q/DQ)")
