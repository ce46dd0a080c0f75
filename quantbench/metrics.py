"""Drift and agreement metrics: the one home used by compare, sensitivity, recover and auto.

Streaming sums that grow with each batch, never the activations themselves. Definitions
(``a`` = FP32 reference values, ``b`` = candidate values, over every element of every sample):

* cosine similarity = Σab / sqrt(Σa² · Σb²)
* SQNR (dB)         = 10 · log10(Σa² / Σ(a−b)²)   (higher is better; ``inf`` when identical)
* relative L2 error = sqrt(Σ(a−b)² / Σa²)
* max abs error     = max |a−b|;  mean abs error = Σ|a−b| / n
* clip fraction     = fraction of |a| above the tensor's quantization range amax

A tensor holding any NaN/Inf (in ``a`` or in ``b``) has *undefined* metrics (``None``): a sum
that skipped those elements would call a half-NaN output perfect. The counts are kept apart
(FP32 side, candidate side) so a report can say which model produced them.

Agreement (argmax) depends on the output's shape (:func:`agreement_kind`):

* ``class``: ``[N, C]`` (or ``[N, C, 1, 1]``) class scores: top-1 / top-5 agreement per sample;
* ``position``: rank >= 3, argmax over the class axis at every position (a CTC recognizer's
  ``(N, T, C)``, NHWC maps): agreement per position and ``sequence_agreement`` (every position
  of a sample agrees). The class axis is the last one, except for a rank-4 output that comes
  from a convolution (:func:`channels_first_outputs`: ONNX convolutions are NCHW), whose class
  axis is 1: a segmentation map ``[N, C, H, W]``. A last axis counts as classes only where the
  graph made it so (:func:`class_axis_doubts`: a MatMul/Gemm's features, a softmax over it, a
  convolution's channels moved last), not a detector's anchors or boxes-and-scores axis;
* none: rank <= 1, a class axis of size 1 (e.g. a text detector's ``[N, 1, H, W]`` probability
  map), or a box/coordinate output: argmax means nothing and only the drift metrics stand;
  :func:`agreement_kind` says why.

A model with several outputs is judged by its worst output (:func:`model_metrics`): an INT8
model is only as good as its worst head, and a pooled sum would let a large-valued output hide a
broken small one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx

from quantbench.graph import constant_tensors

#: drift metrics of one tensor pair (each undefined when the tensor holds NaN/Inf).
DRIFT_KEYS = ("cosine", "sqnr_db", "rel_l2", "max_abs", "mean_abs")
#: model-level metrics built from the outputs; ``accuracy``/``accuracy_drop`` need labels.
MODEL_METRICS = (
    "top1_agreement",
    "top5_agreement",
    "sequence_agreement",
    "cosine",
    "sqnr_db",
    "accuracy",
    "accuracy_drop",
)
CLASS, POSITION, UNKNOWN = "class", "position", "unknown"
_COORDINATES = re.compile(r"box|coord|landmark|keypoint", re.IGNORECASE)


def lower_is_better(metric: str) -> bool:
    """Names ending in ``_drop`` (``accuracy_drop``, a script's ``cer_drop``) are losses."""
    return metric.endswith("_drop")


# --------------------------------------------------------------------------- drift


@dataclass
class DriftAccumulator:
    """Running sums for one tensor pair, and how many non-finite values each side held."""

    n: int = 0
    sum_aa: float = 0.0
    sum_bb: float = 0.0
    sum_ab: float = 0.0
    sum_dd: float = 0.0
    sum_abs_d: float = 0.0
    max_abs_d: float = 0.0
    clipped: int = 0
    amax: float | None = None
    nonfinite_a: int = 0
    nonfinite_b: int = 0

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        """Add one batch. Dot products run in float32 BLAS (accumulated in float64 across
        batches): exact enough for dB-level metrics and several times cheaper than float64.
        A non-finite sum means NaN/Inf in the data (counted) or float32 overflow (redone in
        float64)."""
        a32 = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        b32 = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
        if a32.shape != b32.shape:
            raise ValueError(f"shape mismatch {np.shape(a)} vs {np.shape(b)}")
        self.n += a32.size
        with np.errstate(over="ignore", invalid="ignore"):
            d = a32 - b32
            sums = (float(a32 @ a32), float(b32 @ b32), float(a32 @ b32), float(d @ d))
        if not all(math.isfinite(v) for v in sums):
            bad_a = a32.size - int(np.count_nonzero(np.isfinite(a32)))
            bad_b = b32.size - int(np.count_nonzero(np.isfinite(b32)))
            self.nonfinite_a += bad_a
            self.nonfinite_b += bad_b
            if bad_a or bad_b:
                return  # the tensor is undefined from now on; its sums no longer matter
            a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
            d64 = a64 - b64
            sums = (float(a64 @ a64), float(b64 @ b64), float(a64 @ b64), float(d64 @ d64))
        self.sum_aa += sums[0]
        self.sum_bb += sums[1]
        self.sum_ab += sums[2]
        self.sum_dd += sums[3]
        absd = np.abs(d, out=d)
        if absd.size:
            self.sum_abs_d += float(absd.sum(dtype=np.float64))
            self.max_abs_d = max(self.max_abs_d, float(absd.max()))
        if self.amax is not None and self.amax > 0:
            self.clipped += count_clipped(a32, self.amax)

    @property
    def defined(self) -> bool:
        """False once any compared value was NaN/Inf (or nothing was compared)."""
        return self.n > 0 and not (self.nonfinite_a or self.nonfinite_b)

    def nonfinite(self) -> dict[str, int]:
        """NaN/Inf counts: in the FP32 reference, in the candidate, out of ``elements``."""
        return {"fp32": self.nonfinite_a, "candidate": self.nonfinite_b, "elements": self.n}

    def metrics(self) -> dict[str, float | None]:
        """:data:`DRIFT_KEYS` and ``clip_fraction``; all ``None`` when undefined."""
        if not self.defined:
            return {k: None for k in (*DRIFT_KEYS, "clip_fraction")}
        denom = math.sqrt(self.sum_aa * self.sum_bb)
        cosine = self.sum_ab / denom if denom > 0 else (1.0 if self.sum_dd == 0 else 0.0)
        if self.sum_dd == 0:
            sqnr = math.inf
        elif self.sum_aa == 0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.sum_aa / self.sum_dd)
        rel = (
            math.sqrt(self.sum_dd / self.sum_aa)
            if self.sum_aa > 0
            else (0.0 if self.sum_dd == 0 else math.inf)
        )
        return {
            "cosine": min(1.0, max(-1.0, cosine)),
            "sqnr_db": sqnr,
            "rel_l2": rel,
            "max_abs": self.max_abs_d,
            "mean_abs": self.sum_abs_d / self.n,
            "clip_fraction": (self.clipped / self.n) if self.amax else None,
        }


def nonfinite_text(counts: Mapping[str, int], label: str = "candidate") -> str:
    """``"12 of 100 values NaN/Inf in FP32 itself"`` / ``"... in the candidate"``."""
    parts = []
    if counts.get("fp32"):
        parts.append(f"{counts['fp32']} of {counts['elements']} values NaN/Inf in FP32 itself")
    if counts.get("candidate"):
        parts.append(f"{counts['candidate']} of {counts['elements']} values NaN/Inf in {label}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- agreement


def agreement_kind(
    shape: Sequence[int | str | None],
    name: str = "",
    channels_first: bool = False,
    class_axis_doubt: str = "",
    doubt_unless_size: int | None = None,
) -> tuple[str | None, str]:
    """Which argmax agreement an output of ``shape`` supports, and why not when none.

    Returns (``"class"`` | ``"position"`` | ``None`` | ``"unknown"``, reason). ``shape`` may
    hold symbolic dims (str/None) from the graph: ``"unknown"`` then means "decide on data".
    ``channels_first``: a rank-4 output's class axis is 1 (NCHW), not the last.
    ``class_axis_doubt``: why the graph gives no reason to read the last axis as classes
    (:func:`class_axis_doubts`); the output then has no agreement (a pooled embedding
    ``[N, D]``, a hidden state ``[N, T, D]``, logits flattened to ``[1, T*C]``).
    ``doubt_unless_size``: the doubt does not hold where the last axis has this size (a reshape
    whose target size is only known at run time, :class:`OutputLayout`).
    """
    if _COORDINATES.search(name):
        return None, f"{name!r} holds boxes/coordinates (by its name): argmax over it means nothing"
    nchw = _nchw_map(shape, channels_first)
    if nchw:
        if shape[1] == 1:
            return None, "NCHW map with one channel (e.g. a probability map): argmax means nothing"
        shape = _class_axis_last(shape)
    rest = list(shape[1:])
    if not rest:
        return None, f"rank-{len(shape)} output: no class axis to take an argmax over"
    conv_head = len(rest) == 3 and rest[1:] == [1, 1]
    if conv_head:
        rest = rest[:1]  # [N, C, 1, 1]: a classifier with a convolutional head
    last = rest[-1]
    if isinstance(last, int) and 0 <= last <= 1:
        return None, "the class axis (last) has size 1: argmax means nothing"
    # the doubt is about the last axis: an NCHW map's and a [N, C, 1, 1] head's classes are on 1
    static = isinstance(last, int) and last >= 0
    # lifted, or left to the data, where the axis may turn out of the size that lifts it
    lifted = doubt_unless_size is not None and (not static or last == doubt_unless_size)
    if class_axis_doubt and not nchw and not conv_head and not lifted:
        return None, class_axis_doubt
    if not static:
        return UNKNOWN, "the class axis is symbolic"
    return (CLASS, "") if len(rest) == 1 else (POSITION, "")


@dataclass
class AgreementAccumulator:
    """Argmax agreement of one output against FP32 (see :func:`agreement_kind`), and the
    accuracy of both sides against integer labels for class-score outputs."""

    name: str = ""
    #: the output is NCHW (rank 4): its class axis is 1
    channels_first: bool = False
    #: why its last axis may not hold classes (:func:`class_axis_doubts`), or ''
    class_axis_doubt: str = ""
    #: the size of the last axis at which that doubt does not hold (:class:`OutputLayout`)
    doubt_unless_size: int | None = None
    #: the graph declares the samples on axis 1 (a time-major ``[T, N, C]`` CTC output)
    samples_second: bool = False
    kind: str | None = None
    reason: str = ""
    samples: int = 0
    positions: int = 0
    top1: int = 0
    top5: int = 0
    sequences: int = 0
    nonfinite_a: bool = False
    nonfinite_b: bool = False
    correct_a: int = 0
    correct_b: int = 0
    labelled: int = 0

    def update(
        self,
        a: np.ndarray,
        b: np.ndarray,
        labels: np.ndarray | None = None,
        batch: int | None = None,
    ) -> None:
        """``labels``: integer class per sample, or None (then no accuracy). ``batch``: the
        samples the feed held, which tells a time-major ``[T, N, C]`` output (``T != N``) from a
        batch-first one, so that a sequence is one sample's, not one time step's."""
        a, b = np.asarray(a), np.asarray(b)
        self.kind, self.reason = agreement_kind(
            a.shape, self.name, self.channels_first, self.class_axis_doubt, self.doubt_unless_size
        )
        if self.kind not in (CLASS, POSITION) or a.shape != b.shape:
            return
        if _nchw_map(a.shape, self.channels_first):
            a, b = _class_axis_last(a), _class_axis_last(b)
        elif self.kind == POSITION and _samples_second(a.shape, batch, self.samples_second):
            a, b = np.moveaxis(a, 1, 0), np.moveaxis(b, 1, 0)
        finite_a, finite_b = bool(np.isfinite(a).all()), bool(np.isfinite(b).all())
        self.nonfinite_a |= not finite_a
        self.nonfinite_b |= not finite_b
        n = a.shape[0]
        a2, b2 = (a.reshape(n, -1), b.reshape(n, -1)) if self.kind == CLASS else _rows(a, b)
        top_a, top_b = a2.argmax(axis=1), b2.argmax(axis=1)
        same = top_a == top_b
        k = min(5, b2.shape[1])
        top5_b = np.argpartition(-b2, k - 1, axis=1)[:, :k]
        self.samples += n
        self.positions += same.size
        self.top1 += int(same.sum())
        self.top5 += int((top5_b == top_a[:, None]).any(axis=1).sum())
        self.sequences += int(same.reshape(n, -1).all(axis=1).sum())
        if labels is not None and self.kind == CLASS:
            lab = np.asarray(labels).reshape(-1)
            self.correct_a += int((top_a == lab).sum()) if finite_a else 0
            self.correct_b += int((top_b == lab).sum()) if finite_b else 0
            self.labelled += lab.size

    @property
    def applies(self) -> bool:
        return self.kind in (CLASS, POSITION)

    def metrics(self) -> dict[str, float | None]:
        """``agreement`` (per sample or per position), ``top5_agreement`` and, per position,
        ``sequence_agreement``; ``None`` where not applicable or undefined (NaN/Inf)."""
        if not self.applies or not self.samples or self.nonfinite_a or self.nonfinite_b:
            return {"agreement": None, "top5_agreement": None, "sequence_agreement": None}
        return {
            "agreement": self.top1 / self.positions,
            "top5_agreement": self.top5 / self.positions,
            "sequence_agreement": self.sequences / self.samples if self.kind == POSITION else None,
        }

    def note(self) -> str:
        """Why agreement is absent ('' when it is defined)."""
        if not self.applies:
            return f"agreement not defined: {self.reason}" if self.reason else ""
        if self.nonfinite_a or self.nonfinite_b:
            return "agreement undefined: NaN/Inf in the output"
        return ""

    def accuracy(self) -> dict[str, float | None] | None:
        """A (FP32) and B accuracy and B − A; None when no labels were scored."""
        if not self.labelled:
            return None
        acc_a = None if self.nonfinite_a else self.correct_a / self.labelled
        acc_b = None if self.nonfinite_b else self.correct_b / self.labelled
        delta = None if acc_a is None or acc_b is None else acc_b - acc_a
        return {"A": acc_a, "B": acc_b, "delta": delta}


def _samples_second(shape: tuple[int, ...], batch: int | None, declared: bool) -> bool:
    """Whether axis 1 of a rank-3+ output holds the samples: as the feed's size shows it
    (axis 0 is not that size, axis 1 is), else as the graph declares it."""
    if len(shape) < 3:
        return False
    if batch is not None and (shape[0] == batch) != (shape[1] == batch):
        return shape[1] == batch
    return declared


def _nchw_map(shape: Sequence[int | str | None], channels_first: bool) -> bool:
    """A rank-4 NCHW output with a spatial extent (``[N, C, 1, 1]`` is a classifier)."""
    return channels_first and len(shape) == 4 and list(shape[2:]) != [1, 1]


def _class_axis_last(x: Any) -> Any:
    """NCHW -> NHWC, for a shape or an array."""
    if isinstance(x, np.ndarray):
        return np.moveaxis(x, 1, -1)
    return (x[0], *x[2:], x[1])


def channels_first_outputs(model: Any) -> frozenset[str]:
    """Outputs of an ONNX model whose values come from a convolution-family op through
    value-wise ops only (activations, arithmetic with constants, casts), so their layout is
    NCHW: the class axis of a rank-4 one is 1."""
    producer = {out: node for node in model.graph.node for out in node.output}
    constants = constant_tensors(model)
    found = set()
    for value in model.graph.output:
        tensor = value.name
        for _ in range(64):  # a chain of value-wise ops, not a walk of the whole graph
            node = producer.get(tensor)
            if node is None or node.op_type not in _VALUEWISE:
                break
            if node.op_type == "Softmax" and _softmax_axis(node) not in (1, -3):
                break
            data = [i for i in node.input if i and i not in constants]
            if len(data) != 1:
                break
            tensor = data[0]
        node = producer.get(tensor)
        if node is not None and node.op_type in _NCHW_OPS:
            found.add(value.name)
    return frozenset(found)


def class_axis_doubts(model: Any) -> dict[str, str]:
    """Outputs whose last axis the graph gives no reason to read as classes, and why: argmax
    agreement per position is only claimed for a last axis that a MatMul/Gemm produced (its
    output features), that a softmax ran over, or that is a convolution's channel axis moved
    last by a Transpose. A detector's ``[N, 4 + classes, anchors]`` head (YOLOv8: a Concat of
    boxes and class scores, anchors last) or a hidden state ``[N, T, D]`` is none of these, and
    an argmax over it would report a meaningless "agreement" (on nudenet's YOLOv8: 0.42 where
    the output's SQNR is 27.7 dB)."""
    return _class_axis_evidence(model)[0]


def _class_axis_evidence(model: Any) -> tuple[dict[str, str], dict[str, int]]:
    """:func:`class_axis_doubts`, and the outputs whose doubt does not hold where their last
    axis has a given size (a CRNN's ``Reshape(Linear [T*N, C], [T, N, -1])``: only the run
    shows that the -1 is C)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    walk = _LastAxisWalk(model, producer, constant_tensors(model))
    doubts, unless = {}, {}
    for value in model.graph.output:
        t = value.type.tensor_type
        rank = len(t.shape.dim) if t.HasField("shape") else None
        if why := walk.doubt(value.name, -1, rank):
            doubts[value.name] = f"its last axis may not hold class scores: {why}"
            if (value.name, -1) in walk.unless:
                unless[value.name] = walk.unless[(value.name, -1)]
    return doubts, unless


@dataclass(frozen=True)
class OutputLayout:
    """What a model's graph says about where its outputs' classes lie, which argmax agreement
    reads: the outputs whose class axis is 1 (:func:`channels_first_outputs`) and those whose
    last axis may not hold classes, with why (:func:`class_axis_doubts`). The default knows no
    model: every class axis is the last."""

    channels_first: frozenset[str] = frozenset()
    class_axis_doubt: Mapping[str, str] = field(default_factory=dict)
    #: output -> the size of its last axis at which its doubt does not hold
    doubt_unless_size: Mapping[str, int] = field(default_factory=dict)
    #: outputs declared with the samples on axis 1 (:func:`samples_second_outputs`)
    samples_second: frozenset[str] = frozenset()

    @classmethod
    def of(cls, model: Any) -> OutputLayout:
        doubts, unless = _class_axis_evidence(model)
        return cls(channels_first_outputs(model), doubts, unless, samples_second_outputs(model))

    def kind(self, shape: Sequence[int | str | None], name: str) -> tuple[str | None, str]:
        """:func:`agreement_kind` of output ``name`` with this layout."""
        return agreement_kind(
            shape,
            name,
            name in self.channels_first,
            self.class_axis_doubt.get(name, ""),
            self.doubt_unless_size.get(name),
        )

    def accumulator(self, name: str) -> AgreementAccumulator:
        return AgreementAccumulator(
            name=name,
            channels_first=name in self.channels_first,
            class_axis_doubt=self.class_axis_doubt.get(name, ""),
            doubt_unless_size=self.doubt_unless_size.get(name),
            samples_second=name in self.samples_second,
        )


def samples_second_outputs(model: Any) -> frozenset[str]:
    """Outputs whose declared axis 1, not 0, is the first input's symbolic batch axis: a
    time-major ``[T, N, C]`` recognizer (PyTorch's CRNN/CTC exports)."""
    inits = {i.name for i in model.graph.initializer}
    feeds = [v for v in model.graph.input if v.name not in inits]
    dims = feeds[0].type.tensor_type.shape.dim if feeds else []
    batch = dims[0].dim_param if dims and dims[0].HasField("dim_param") else ""
    found = set()
    for value in model.graph.output if batch else ():
        out = value.type.tensor_type.shape.dim
        if len(out) >= 3 and out[1].dim_param == batch and out[0].dim_param != batch:
            found.add(value.name)
    return frozenset(found)


@dataclass
class _LastAxisWalk:
    """Follows one axis of a tensor back through the ops that made it (each (tensor, axis)
    once: a residual graph reaches the same tensors by many paths)."""

    model: Any
    producer: Mapping[str, Any]
    constants: Collection[str]
    seen: dict[tuple[str, int], str] = field(default_factory=dict)
    #: (tensor, axis) whose doubt does not hold where the axis has this size at run time
    unless: dict[tuple[str, int], int] = field(default_factory=dict)

    @cached_property
    def shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Tensor -> its dims (None where not static), where shape inference knows its rank
        (run only when a reshape or reduction is met: most heads end in a MatMul first)."""
        return _static_shapes(self.model)

    def doubt(self, tensor: str, axis: int, rank: int | None, depth: int = 64) -> str:
        """'' when ``axis`` (negative, from the end) of ``tensor`` is a class axis by how it
        was made, else what made it instead (the ops walked through, nearest first)."""
        key = (tensor, axis)
        if key not in self.seen:
            self.seen[key] = self._doubt(tensor, axis, rank, depth)
        return self.seen[key]

    def _doubt(self, tensor: str, axis: int, rank: int | None, depth: int) -> str:
        node = self.producer.get(tensor)
        if node is None:
            return "it comes from a graph input"
        if depth <= 0:
            return "its producers are too deep to follow"
        op = node.op_type
        if op in _FEATURES_LAST:
            return "" if axis == -1 else f"it comes from {op}, whose features are its last axis"
        if op in _NCHW_OPS:
            if rank is not None and rank + axis == 1:
                return ""
            return f"it comes from {op}, whose classes would be on axis 1"
        if op in ("Softmax", "LogSoftmax", "Hardmax") and _same_axis(
            _softmax_axis(node), axis, rank
        ):
            return ""
        if op == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if not perm or not -len(perm) <= axis < 0:
                return "it comes from a Transpose this check cannot follow"
            inner = perm[len(perm) + axis] - len(perm)
            return self._via(op, (tensor, axis), node.input[0], inner, len(perm), depth)
        if op in _GLOBAL_POOLS:  # [N, C, H, W] -> [N, C, 1, 1]: the channels go through
            if rank is not None and rank + axis == 1:
                return _through(op, self.doubt(node.input[0], axis, rank, depth - 1))
            return f"it comes from {op}, whose channels are on axis 1"
        data = [i for i in node.input if i and i not in self.constants]
        if op in _RESHAPES and axis == -1 and data:
            # [T*N, C] -> [T, N, C] (a CRNN's head after its Linear), [N, C, 1, 1] -> [N, C] (a
            # convolutional head): the axis goes through when shape inference shows its size
            # is the source's last axis that is not 1
            inner = self._reshaped_from(tensor, data[0])
            if inner is None:
                return self._reshape_doubt(op, tensor, data[0], depth)
            return _through(op, self.doubt(data[0], inner, self._rank(data[0]), depth - 1))
        if op in _REDUCTIONS and data:
            inner = self._reduced_from(node, tensor, axis, rank)
            if inner is None:
                return f"it comes from {op}, which may reduce it"
            return _through(op, self.doubt(data[0], inner, self._rank(data[0]), depth - 1))
        if op == "Concat":
            cat = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if _same_axis(cat, axis, rank):
                return "it is a Concat along it (several heads side by side)"
        elif op not in _VALUEWISE or not data:
            return f"it comes from {op}"
        if op in _BROADCASTING:
            # logits - max, exp / sum (a softmax written out), logits + bias: the scores make
            # the axis, whatever is broadcast against them
            reasons = [self.doubt(source, axis, rank, depth - 1) for source in data]
            if "" in reasons:
                return ""
        for source in data:
            if why := self._via(op, (tensor, axis), source, axis, rank, depth):
                return why
        return ""

    def _via(self, op: str, key: tuple[str, int], source: str, axis: int, rank: int | None,
             depth: int) -> str:  # fmt: skip
        """The doubt of ``axis`` of ``source`` seen through ``op`` (which keeps the axis's
        size), and its size condition carried up to ``key``."""
        why = self.doubt(source, axis, rank, depth - 1)
        if why and (source, axis) in self.unless:
            self.unless[key] = self.unless[(source, axis)]
        return _through(op, why)

    def _reshape_doubt(self, op: str, tensor: str, source: str, depth: int) -> str:
        """Why a reshape may not keep the last axis; where the target size is only known at
        run time (``[T, N, -1]`` from Shape ops) and the source's last axis holds classes,
        the doubt holds only if the output's last axis turns out of another size."""
        out, src = self.shapes.get(tensor), self.shapes.get(source)
        size = src[-1] if src else self._features(source)
        unknown = not out or out[-1] is None
        rank = len(src) if src else None
        if unknown and size and size > 1 and not self.doubt(source, -1, rank, depth - 1):
            self.unless[(tensor, -1)] = size
            return f"it comes from {op}, which keeps it only if its size is {size}, as before it"
        return f"it comes from {op}, which may not keep it"

    def _rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def _reshaped_from(self, tensor: str, source: str) -> int | None:
        """The axis of ``source`` (negative) that ``tensor``'s last axis is, or None: its last
        axis of the same size, or, where the reshape drops axes (``[N, C, 1, 1] -> [N, C]``),
        its last axis that is not of size 1."""
        out, src = self.shapes.get(tensor), self.shapes.get(source)
        if not out or not src or out[-1] is None:
            return None
        kept = len(src)
        while len(out) < len(src) and kept > 1 and src[kept - 1] == 1:
            kept -= 1
        return kept - 1 - len(src) if src[kept - 1] == out[-1] else None

    def _features(self, tensor: str) -> int | None:
        """The output features of the Gemm/MatMul making ``tensor``, read from its weight
        (where shape inference lost the activations' shapes, e.g. after an LSTM)."""
        node = self.producer.get(tensor)
        if node is None or node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2:
            return None
        weight = self.shapes.get(node.input[1])
        if not weight or len(weight) != 2 or node.input[1] not in self.constants:
            return None
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return weight[0] if node.op_type == "Gemm" and trans_b else weight[1]

    def _reduced_from(self, node: Any, tensor: str, axis: int, rank: int | None) -> int | None:
        """The axis of a reduction's input (negative) that ``axis`` of its output is, or None
        (the axis reduced, or the reduced axes unknown)."""
        source_shape = self.shapes.get(node.input[0])
        reduced = _reduction_axes(node, self.model)
        if source_shape is None or reduced is None:
            return None
        source_rank = len(source_shape)
        reduced = {a % source_rank for a in reduced} if reduced else set(range(source_rank))
        keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        kept = (
            list(range(source_rank))
            if keepdims
            else [a for a in range(source_rank) if a not in reduced]
        )
        if not -len(kept) <= axis < 0 or kept[axis] in reduced:
            return None
        return kept[axis] - source_rank


def _static_shapes(model: Any) -> dict[str, tuple[int | None, ...]]:
    """Tensor -> its dims (None where not a static size), from the graph and ONNX shape
    inference (only the graph's own where inference fails, e.g. a model over 2 GiB)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - best effort: without shapes, reshapes stay in doubt
        inferred = model.graph
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        if value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in value.type.tensor_type.shape.dim
            )
    for init in model.graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _reduction_axes(node: Any, model: Any) -> list[int] | None:
    """A reduction's axes (attribute, or constant second input from opset 18); [] for every
    axis; None when they are only known at run time."""
    attr = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if attr is not None:
        return attr
    if len(node.input) < 2 or not node.input[1]:
        noop = next((a.i for a in node.attribute if a.name == "noop_with_empty_axes"), 0)
        return None if noop else []
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return [int(a) for a in onnx.numpy_helper.to_array(init).reshape(-1)]
    return None


#: ops that only reshape: the last axis goes through them when its size stays the same
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: [N, C, H, W] -> [N, C, 1, 1]
_GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
#: reductions: an axis they keep goes through them
_REDUCTIONS = frozenset(
    {
        *("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1"),
        *("ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum"),
    }
)
#: value-wise ops of several data inputs, broadcast against each other
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "PRelu"})


def _through(op: str, why: str) -> str:
    """``why`` as seen from the op above it: ``it comes from Reshape (through Concat, Mul)``."""
    if not why:
        return ""
    head, _, path = why.partition(" (through ")
    return f"{head} (through {op}{', ' + path[:-1] if path else ''})"


def _same_axis(attr: int, axis: int, rank: int | None) -> bool:
    """Whether an op's axis attribute names ``axis`` (negative) of a tensor of ``rank``."""
    if attr < 0:
        return attr == axis
    return rank is not None and attr == rank + axis


#: ops whose last output axis is their output features
_FEATURES_LAST = frozenset(
    {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits"}
)


def _softmax_axis(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), -1)


#: ops whose outputs are NCHW whatever their inputs' layout said
_NCHW_OPS = frozenset(
    {
        *("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "BatchNormalization"),
        *("InstanceNormalization", "MaxPool", "AveragePool", "LpPool", "Resize", "Upsample"),
        *("DepthToSpace", "SpaceToDepth"),
    }
)
#: ops that keep the layout of their (one non-constant) input
_VALUEWISE = frozenset(
    {
        *("Sigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Tanh", "HardSigmoid"),
        *("HardSwish", "Clip", "Softplus", "Exp", "Log", "Neg", "Abs", "Sqrt", "Identity"),
        *("Cast", "Mul", "Add", "Sub", "Div", "Pow", "Softmax", "Dropout"),
    }
)


def _rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, ..., C) -> (N·positions, C): one row per position."""
    c = a.shape[-1]
    return a.reshape(-1, c), b.reshape(-1, c)


def labels_accuracy_reason(labels: np.ndarray | None) -> str:
    """Why built-in accuracy cannot use these labels ('' when it can)."""
    if labels is None:
        return ""
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        return f"labels are {labels.dtype}{list(labels.shape)}, not one integer class per sample"
    return ""


def accuracy_output(kinds: Mapping[str, str | None]) -> str | None:
    """The output accuracy is measured on: the first one holding class scores."""
    return next((name for name, kind in kinds.items() if kind == CLASS), None)


def output_kinds(
    shapes: Mapping[str, Sequence[int | str | None] | None], layout: OutputLayout | None = None
) -> dict[str, tuple[str | None, str]]:
    """:func:`agreement_kind` of every output; a shape of ``None`` (rank unknown) is unknown."""
    layout = layout or OutputLayout()
    return {
        name: (UNKNOWN, "its shape is unknown") if shape is None else layout.kind(shape, name)
        for name, shape in shapes.items()
    }


def declared_output_kinds(model: Any) -> dict[str, tuple[str | None, str]]:
    """:func:`output_kinds` of a model's outputs as it declares them."""
    return output_kinds(declared_output_shapes(model), OutputLayout.of(model))


def declared_output_shapes(model: Any) -> dict[str, tuple[int | str | None, ...] | None]:
    """Output name -> shape as an ONNX model declares it (symbolic dims as str/None; ``None``
    when the rank is not declared)."""
    shapes: dict[str, tuple[int | str | None, ...] | None] = {}
    for value in model.graph.output:
        t = value.type.tensor_type
        if not t.HasField("shape"):
            shapes[value.name] = None
            continue
        dims: list[int | str | None] = []
        for d in t.shape.dim:
            static = d.HasField("dim_value") and d.dim_value > 0
            dims.append(int(d.dim_value) if static else (d.dim_param or None))
        shapes[value.name] = tuple(dims)
    return shapes


def metric_support(
    metric: str, kinds: Mapping[str, tuple[str | None, str]], labels: np.ndarray | None
) -> str | None:
    """Why ``metric`` cannot be defined for outputs of these kinds: ``""`` when it can, a reason
    when it cannot, ``None`` when only data can tell (symbolic class axis)."""
    if metric in ("accuracy", "accuracy_drop", "accuracy_delta"):
        if labels is None:
            return f"{metric} needs --labels LABELS.npy"
        if reason := labels_accuracy_reason(labels):
            return f"{metric} needs integer class labels; {reason}"
        wanted, what = (CLASS,), "no output holds class scores [N, C]"
    elif metric in ("top1_agreement", "top5_agreement"):
        wanted, what = (CLASS, POSITION), "no output supports argmax agreement"
    elif metric == "sequence_agreement":
        wanted, what = (POSITION,), "no output has per-position scores (N, ..., C)"
    else:
        return ""
    found = [kind for kind, _ in kinds.values()]
    if any(kind in wanted for kind in found):
        return ""
    if UNKNOWN in found:
        return None
    why = "; ".join(f"{name}: {reason or kind}" for name, (kind, reason) in kinds.items())
    return f"{metric} is not defined for this model: {what} ({why})"


# --------------------------------------------------------------------------- model level


@dataclass
class OutputsAccumulator:
    """Drift and agreement of every model output of one candidate against FP32."""

    names: list[str]
    labels_usable: bool = True
    #: where the outputs' classes lie (:meth:`OutputLayout.of` the model)
    layout: OutputLayout = field(default_factory=OutputLayout)
    drift: dict[str, DriftAccumulator] = field(default_factory=dict)
    agreement: dict[str, AgreementAccumulator] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.drift = {n: DriftAccumulator() for n in self.names}
        self.agreement = {n: self.layout.accumulator(n) for n in self.names}

    def update(
        self,
        reference: Mapping[str, np.ndarray],
        candidate: Mapping[str, np.ndarray],
        labels: np.ndarray | None = None,
        batch: int | None = None,
    ) -> None:
        """One batch of ``batch`` samples; ``candidate`` keyed by the reference's output
        names."""
        label_output = self.label_output(reference)
        for name in self.names:
            a, b = reference[name], candidate[name]
            self.drift[name].update(a, b)
            lab = labels if name == label_output and self.labels_usable else None
            self.agreement[name].update(a, b, lab, batch)

    def label_output(self, reference: Mapping[str, np.ndarray]) -> str | None:
        kinds = {n: self.layout.kind(np.shape(reference[n]), n)[0] for n in self.names}
        return accuracy_output(kinds)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Per output: agreement metrics, drift metrics, ``agreement_kind``, ``agreement_note``
        and ``nonfinite`` counts."""
        out = {}
        for name in self.names:
            agree, drift = self.agreement[name], self.drift[name]
            row: dict[str, Any] = dict(agree.metrics())
            row.update({k: v for k, v in drift.metrics().items() if k != "clip_fraction"})
            row["agreement_kind"] = agree.kind if agree.applies else None
            row["agreement_note"] = agree.note() or None
            row["nonfinite"] = drift.nonfinite()
            out[name] = row
        return out

    def accuracy(self) -> dict[str, float | None] | None:
        return next(
            (acc for a in self.agreement.values() if (acc := a.accuracy()) is not None), None
        )

    def model_metrics(self) -> dict[str, float | None]:
        """:data:`MODEL_METRICS` for the whole model (worst output; see module doc)."""
        out = model_metrics(list(self.rows().values()))
        acc = self.accuracy()
        out["accuracy"] = None if acc is None else acc["B"]
        out["accuracy_drop"] = (
            None if acc is None or acc["delta"] is None else acc["A"] - acc["B"]  # type: ignore[operator]
        )
        return out


def model_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Model-level agreement/cosine/SQNR from per-output rows: the worst output counts.

    Agreement over outputs where argmax applies (``agreement_kind`` set); ``None`` when no
    output supports it, or when any output's value is undefined. Values may be JSON text
    (``"inf"``) as in a results document.
    """

    def worst(key: str, applicable: Sequence[Mapping[str, Any]]) -> float | None:
        if not applicable:
            return None
        values = [_number(r.get(key)) for r in applicable]
        if any(v is None for v in values):
            return None
        return min(values)  # type: ignore[type-var]

    agreeing = [r for r in rows if r.get("agreement_kind")]
    sequences = [r for r in rows if r.get("agreement_kind") == POSITION]
    return {
        "top1_agreement": worst("agreement", agreeing),
        "top5_agreement": worst("top5_agreement", agreeing),
        "sequence_agreement": worst("sequence_agreement", sequences),
        "cosine": worst("cosine", rows),
        "sqnr_db": worst("sqnr_db", rows),
    }


def _number(value: Any) -> float | None:
    """A metric value as a float; JSON's "inf"/"-inf" included, "nan"/None/other -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, str) and value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    return None


# --------------------------------------------------------------------------- clipping


def count_clipped(values: np.ndarray, amax: float) -> int:
    """How many values lie outside [-amax, amax] (would saturate in INT8)."""
    return int(np.count_nonzero(values > amax)) + int(np.count_nonzero(values < -amax))


@dataclass
class ClipCounter:
    """Fraction of a quantized op's FP32 input beyond its amax (its clipping)."""

    amax: float
    n: int = 0
    clipped: int = 0

    def update(self, values: np.ndarray) -> None:
        self.n += values.size
        self.clipped += count_clipped(values, self.amax)

    @property
    def fraction(self) -> float | None:
        return self.clipped / self.n if self.n else None


def is_class_scores(shape: tuple[int, ...]) -> bool:
    """[N, C] (or [N, C, 1, 1]) with C > 1: per-sample top-1/top-5 agreement applies."""
    return agreement_kind(shape)[0] == CLASS
