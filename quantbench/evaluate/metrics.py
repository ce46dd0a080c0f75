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
  of a sample agrees); for ``(N, T, C)`` also ``ctc_agreement``: the sequences a CTC decoder
  reads agree (argmax path, repeats merged, the blank dropped: the class FP32's paths pick most
  often, as a CTC blank is), which per-position flips between a blank and the character it
  stands beside do not change. The class axis is the last one, except for a rank-4 output that
  comes from a convolution (:func:`channels_first_outputs`: ONNX convolutions are NCHW), whose
  class axis is 1: a segmentation map ``[N, C, H, W]``, where a softmax ran over the channels
  (:func:`channel_class_doubts`: else they may be separate heatmaps). A last axis counts as
  classes only where the graph made it so (:func:`class_axis_doubts`: a MatMul/Gemm's features,
  a softmax over it, a convolution's channels moved last), not a detector's anchors or
  boxes-and-scores axis (what the graph says about its outputs' axes:
  :mod:`quantbench.evaluate.outputaxes`);
* ``decision``: one probability per sample that a Sigmoid made (``[N]``, ``[N, 1]``: a
  wake-word, voice-activity or binary classifier, :func:`probability_outputs`): agreement of
  the decision at 0.5, per sample (and accuracy against 0/1 labels);
* ``mask_iou``, beside any of these: probabilities a Sigmoid made, more than one per sample (a
  text detector's or a segmentation model's probability map, a multi-label classifier's
  scores, a music transcriber's note posteriorgram): the values above 0.5 on both sides over
  those above it on either, over every value of every sample. Per-element agreement would say
  99 % where only the background agrees, and argmax over such a map means nothing;
* ``exact``: an integer or bool output (class ids an ArgMax made, token ids, counts, NMS
  indices): its values are labels, not measurements, so they agree or not, element by element
  (``agreement``), and sample by sample where axis 0 holds the samples
  (``sequence_agreement``); cosine and SQNR of class numbers would mean nothing and are not
  computed (the model's cosine and SQNR are its float outputs'). A batch whose two outputs
  differ in shape (a variable-size output) agrees nowhere;
* none: rank <= 1, a class axis of size 1 (e.g. a text detector's ``[N, 1, H, W]`` probability
  map, a raw score), or a box/coordinate output: argmax means nothing and only the drift
  metrics stand; :func:`agreement_kind` says why.

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

from quantbench.errors import QuantbenchError
from quantbench.evaluate.outputaxes import (
    OutputParts,
    channel_class_doubts,
    channels_first_outputs,
    class_axis_evidence,
    concat_parts,
    probability_outputs,
    samples_second_outputs,
    selection_sources,
    value_free_outputs,
)

#: drift metrics of one tensor pair (each undefined when the tensor holds NaN/Inf).
DRIFT_KEYS = ("cosine", "sqnr_db", "rel_l2", "max_abs", "mean_abs")
#: IoU of a probability map's decisions (:func:`is_mask`): its own metric, beside agreement
MASK_IOU = "mask_iou"
#: mean over classes of the IoU of a class map's pixels (a segmentation map,
#: :func:`class_map_outputs`)
MEAN_IOU = "mean_iou"
#: model-level metrics built from the outputs; ``accuracy``/``accuracy_drop`` need labels.
MODEL_METRICS = (
    "top1_agreement",
    "top5_agreement",
    "sequence_agreement",
    "ctc_agreement",
    MASK_IOU,
    MEAN_IOU,
    "cosine",
    "sqnr_db",
    "accuracy",
    "accuracy_drop",
)
CLASS, POSITION, UNKNOWN, EXACT = "class", "position", "unknown", "exact"
#: why an integer output no float value reaches is not compared
VALUE_FREE = (
    "integers no float value reaches (a copy of an integer input, a shape): quantization "
    "cannot change them, so they are not compared"
)
#: a probability's decision (:func:`agreement_kind`), taken at this threshold
DECISION, DECISION_THRESHOLD = "decision", 0.5
#: an output's agreement metrics (the maps' included), and those only outputs with positions have
AGREEMENT_KEYS = (
    *("agreement", "top5_agreement", "sequence_agreement", "ctc_agreement"),
    *(MASK_IOU, MEAN_IOU),
)
SEQUENCE_KEYS = ("sequence_agreement", "ctc_agreement")
#: classes a class map's confusion counts may hold (more: class ids are not segmentation labels)
_MAX_MAP_CLASSES = 1024
_COORDINATES = re.compile(r"box|coord|landmark|keypoint", re.IGNORECASE)


def check_mask_threshold(value: float) -> float:
    """``--mask-threshold``: a probability strictly between 0 and 1."""
    if not 0.0 < value < 1.0:
        raise QuantbenchError(
            f"--mask-threshold {value:g}: a probability map's decision threshold lies strictly "
            "between 0 and 1 (0.5 by default; a DBNet text detector binarizes at 0.3)"
        )
    return value


def lower_is_better(metric: str) -> bool:
    """Names ending in ``_drop`` (``accuracy_drop``, a script's ``cer_drop``) are losses."""
    return metric.endswith("_drop")


# --------------------------------------------------------------------------- drift


def sqnr_of_sums(sum_aa: float, sum_dd: float) -> float:
    """SQNR in dB of a signal's power ``sum_aa`` over its noise's ``sum_dd`` (inf without
    noise, -inf without signal)."""
    if sum_dd == 0:
        return math.inf
    if sum_aa == 0:
        return -math.inf
    return 10.0 * math.log10(sum_aa / sum_dd)


def _flat32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1)


def power32(a: np.ndarray) -> float:
    """``a``'s sum of squares as :class:`DriftAccumulator` and :class:`SqnrAccumulator` take it
    (float32 BLAS), to share one tensor's between several accumulators."""
    a32 = _flat32(a)
    return float(a32 @ a32)


@dataclass
class SqnrAccumulator:
    """Only the SQNR of a tensor pair: :class:`DriftAccumulator`'s ``sum_aa`` and ``sum_dd``,
    computed alike (the same value to the bit), for a third of its work: ``--method auto``
    scores hundreds of isolated ops on every part of its slice."""

    n: int = 0
    sum_aa: float = 0.0
    sum_dd: float = 0.0
    #: NaN/Inf met, or a batch whose tensors differed in shape: undefined from then on
    undefined: bool = False

    def update(self, a: np.ndarray, b: np.ndarray, power: float | None = None) -> None:
        """Add one batch; ``power``: :func:`power32` of ``a``, when already taken."""
        a32, b32 = _flat32(a), _flat32(b)
        if a32.shape != b32.shape:
            self.undefined, self.n = True, self.n + max(a32.size, b32.size)
            return
        self.n += a32.size
        with np.errstate(over="ignore", invalid="ignore"):
            d = a32 - b32
            aa = float(a32 @ a32) if power is None else power
            dd = float(d @ d)
        if not (math.isfinite(aa) and math.isfinite(dd)):
            if not (np.isfinite(a32).all() and np.isfinite(b32).all()):
                self.undefined = True
                return
            a64, d64 = a32.astype(np.float64), a32.astype(np.float64) - b32.astype(np.float64)
            aa, dd = float(a64 @ a64), float(d64 @ d64)
        self.sum_aa += aa
        self.sum_dd += dd

    def sqnr_db(self) -> float:
        """The SQNR in dB, NaN when undefined (or nothing was compared)."""
        if self.undefined or not self.n:
            return math.nan
        return sqnr_of_sums(self.sum_aa, self.sum_dd)


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
    #: batches whose two tensors differed in shape (a variable-size output: NonZero, NMS)
    mismatched: int = 0

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        """Add one batch. Dot products run in float32 BLAS (accumulated in float64 across
        batches): exact enough for dB-level metrics and several times cheaper than float64.
        A non-finite sum means NaN/Inf in the data (counted) or float32 overflow (redone in
        float64)."""
        a32, b32 = _flat32(a), _flat32(b)
        if a32.shape != b32.shape:  # a variable-size output: no value pairs up
            self.note_mismatch(max(a32.size, b32.size))
            return
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

    def note_mismatch(self, size: int) -> None:
        """A batch whose tensors differ in shape: no value pairs up, so the tensor is undefined
        from now on (never compared on the batches that happened to match)."""
        self.mismatched += 1
        self.n += size

    @property
    def defined(self) -> bool:
        """False once any compared value was NaN/Inf or a batch's shapes differed (or nothing
        was compared)."""
        return self.n > 0 and not (self.nonfinite_a or self.nonfinite_b or self.mismatched)

    def nonfinite(self) -> dict[str, int]:
        """NaN/Inf counts: in the FP32 reference, in the candidate, out of ``elements``."""
        return {"fp32": self.nonfinite_a, "candidate": self.nonfinite_b, "elements": self.n}

    def metrics(self) -> dict[str, float | None]:
        """:data:`DRIFT_KEYS` and ``clip_fraction``; all ``None`` when undefined."""
        if not self.defined:
            return {k: None for k in (*DRIFT_KEYS, "clip_fraction")}
        denom = math.sqrt(self.sum_aa * self.sum_bb)
        cosine = self.sum_ab / denom if denom > 0 else (1.0 if self.sum_dd == 0 else 0.0)
        sqnr = sqnr_of_sums(self.sum_aa, self.sum_dd)
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
    channel_doubt: str = "",
    probability: bool = False,
    exact: bool = False,
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
    ``channel_doubt``: why an NCHW map's channels may not be classes (no softmax over them,
    :func:`channel_class_doubts`): then it has no agreement either.
    ``probability``: a Sigmoid made the output (:func:`probability_outputs`); with one value
    per sample its decision at 0.5 is what agrees or not (``"decision"``).
    ``exact``: the output holds integers or bools, compared value by value (``"exact"``).
    """
    if exact:
        return EXACT, ""
    if _COORDINATES.search(name):
        return None, f"{name!r} holds boxes/coordinates (by its name): argmax over it means nothing"
    if probability and all(isinstance(d, int) and d == 1 for d in shape[1:]):
        return DECISION, ""
    nchw = _nchw_map(shape, channels_first)
    if nchw:
        if shape[1] == 1:
            return None, "NCHW map with one channel (e.g. a probability map): argmax means nothing"
        if channel_doubt:
            return None, channel_doubt
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


def is_mask(shape: Sequence[int | str | None], probability: bool) -> bool:
    """Whether an output of ``shape`` (samples first) that a Sigmoid made (``probability``)
    holds more than one probability per sample, or may (a symbolic axis): a map whose decisions
    :data:`MASK_IOU` compares."""
    rest = shape[1:]
    if not probability or not rest:
        return False
    if all(isinstance(d, int) and d >= 0 for d in rest):
        return math.prod(rest) > 1  # type: ignore[arg-type]
    return True


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
    #: why its channels (NCHW) may not hold classes (:func:`channel_class_doubts`), or ''
    channel_doubt: str = ""
    #: the model has no batch axis (fed one sample at a time): each output is one sample's
    unbatched: bool = False
    #: the graph declares the samples on axis 1 (a time-major ``[T, N, C]`` CTC output)
    samples_second: bool = False
    #: a Sigmoid made the output (:func:`probability_outputs`)
    probability: bool = False
    #: the output holds integers or bools (:data:`EXACT`)
    exact: bool = False
    #: why this tensor has no agreement at all, whatever its shape ('' when it may have):
    #: integers no float value reaches, a tensor an NMS chose from (drift only)
    not_compared: str = ""
    #: batches of an exact output whose two sides differed in shape
    mismatched: int = 0
    #: every batch of an exact output held the samples on axis 0 (sequences are per sample)
    sampled: bool = True
    kind: str | None = None
    reason: str = ""
    samples: int = 0
    positions: int = 0
    top1: int = 0
    top5: int = 0
    #: scores per sample or position: top-5 agreement says nothing with 5 or fewer
    classes: int = 0
    sequences: int = 0
    nonfinite_a: bool = False
    nonfinite_b: bool = False
    correct_a: int = 0
    correct_b: int = 0
    labelled: int = 0
    #: per sample of an (N, T, C) output, FP32's and the candidate's argmax paths
    paths_a: list[np.ndarray] = field(default_factory=list)
    paths_b: list[np.ndarray] = field(default_factory=list)
    #: a probability map's decision threshold (``--mask-threshold``: a detector's own)
    mask_threshold: float = DECISION_THRESHOLD
    #: a probability map's values compared (:func:`is_mask`), and those above the threshold
    #: on both sides and on either
    mask_values: int = 0
    mask_both: int = 0
    mask_either: int = 0
    #: values above the threshold in FP32 and in the candidate
    mask_a: int = 0
    mask_b: int = 0
    #: a class map's pixels by (FP32 class, candidate class) (:func:`class_map_outputs`)
    confusion: np.ndarray | None = None
    #: why a class map has no mean IoU ('' while it may): too many classes, negative ids
    no_iou: str = ""

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
        if self.not_compared:
            self.kind, self.reason = None, self.not_compared
            return
        if self.unbatched:  # the sample axis the model does not have
            a, b, batch = a[None], b[None], 1
        if a.shape == b.shape and is_mask(a.shape, self.probability):
            self.update_mask(a, b)
        self.kind, self.reason = agreement_kind(
            a.shape,
            self.name,
            self.channels_first,
            self.class_axis_doubt,
            self.doubt_unless_size,
            self.channel_doubt,
            self.probability,
            self.exact,
        )
        if self.kind == EXACT:
            self._update_exact(a, b, labels, batch)
            return
        if self.kind == DECISION and a.shape == b.shape:
            self._update_decisions(a, b, labels)
            return
        if self.kind not in (CLASS, POSITION) or a.shape != b.shape:
            return
        if _nchw_map(a.shape, self.channels_first):
            a, b = _class_axis_last(a), _class_axis_last(b)
        elif self.kind == POSITION and _samples_second(a.shape, batch, self.samples_second):
            a, b = np.moveaxis(a, 1, 0), np.moveaxis(b, 1, 0)
        finite_a, finite_b = self._note_finite(a, b)
        n = a.shape[0]
        a2, b2 = (a.reshape(n, -1), b.reshape(n, -1)) if self.kind == CLASS else _rows(a, b)
        top_a, top_b = a2.argmax(axis=1), b2.argmax(axis=1)
        same = top_a == top_b
        self.classes = b2.shape[1]
        k = min(5, b2.shape[1])
        top5_b = np.argpartition(-b2, k - 1, axis=1)[:, :k]
        self.samples += n
        self.positions += same.size
        self.top1 += int(same.sum())
        self.top5 += int((top5_b == top_a[:, None]).any(axis=1).sum())
        self.sequences += int(same.reshape(n, -1).all(axis=1).sum())
        if self.kind == POSITION and a.ndim == 3:
            self.paths_a.extend(top_a.reshape(n, -1).astype(np.int32))
            self.paths_b.extend(top_b.reshape(n, -1).astype(np.int32))
        if self.kind == POSITION and a.ndim >= 4:  # a spatial map: its pixels' classes
            self._count_classes(top_a, top_b, b2.shape[1])
        if labels is not None and self.kind == CLASS:
            self._tally_labels(top_a, top_b, labels, finite_a, finite_b)

    def _update_decisions(self, a: np.ndarray, b: np.ndarray, labels: np.ndarray | None) -> None:
        """One probability per sample: the decisions at :data:`DECISION_THRESHOLD` agree or
        not; with labels (0 / 1 per sample) both sides' accuracy."""
        n = a.shape[0] if a.ndim else 1
        pa, pb = a.reshape(n), b.reshape(n)
        finite_a, finite_b = self._note_finite(pa, pb)
        da, db = pa > DECISION_THRESHOLD, pb > DECISION_THRESHOLD
        self.classes = 2
        self.samples += n
        self.positions += n
        self.top1 += int((da == db).sum())
        if labels is not None:
            self._tally_labels(da.astype(np.int64), db.astype(np.int64), labels, finite_a, finite_b)

    def _update_exact(
        self, a: np.ndarray, b: np.ndarray, labels: np.ndarray | None, batch: int | None
    ) -> None:
        """Integers or bools: equal or not, element by element and sample by sample; a batch
        whose shapes differ (a variable-size output) agrees nowhere. With labels, a
        one-value-per-sample output (class ids) is scored against them."""
        n = batch if batch is not None else (a.shape[0] if a.ndim else 1)
        self.sampled &= a.ndim >= 1 and a.shape[0] == n and b.ndim >= 1 and b.shape[0] == n
        self.samples += n
        if a.shape != b.shape:
            self.mismatched += 1
            self.positions += max(a.size, b.size)
            return
        same = a == b
        self.positions += same.size
        self.top1 += int(same.sum())
        if a.ndim >= 3 and a.size:  # an integer class map ([N, H, W]): its pixels' classes
            if a.dtype.kind not in "iu" or min(int(a.min()), int(b.min())) < 0:
                self.no_iou = self.no_iou or "its values are not class ids (negative, or bools)"
            else:
                self._count_classes(a.ravel(), b.ravel(), int(max(a.max(), b.max())) + 1)
        if self.sampled and same.size:
            self.sequences += int(same.reshape(n, -1).all(axis=1).sum())
        if labels is not None and a.ndim == 1 and a.shape[0] == n:
            self._tally_labels(a, b, labels, True, True)

    def _count_classes(self, top_a: np.ndarray, top_b: np.ndarray, classes: int) -> None:
        """Add a class map's pixels to :attr:`confusion` (grown to ``classes``)."""
        if self.no_iou:
            return
        if classes > _MAX_MAP_CLASSES:
            self.no_iou = f"{classes} classes: more than a segmentation map's {_MAX_MAP_CLASSES}"
            self.confusion = None
            return
        size = self.confusion.shape[0] if self.confusion is not None else 0
        if classes > size:
            grown = np.zeros((classes, classes), np.int64)
            if self.confusion is not None:
                grown[:size, :size] = self.confusion
            self.confusion = grown
        c = self.confusion.shape[0]  # type: ignore[union-attr]
        pairs = top_a.astype(np.int64).ravel() * c + top_b.astype(np.int64).ravel()
        self.confusion += np.bincount(pairs, minlength=c * c).reshape(c, c)  # type: ignore[operator]

    def _class_ious(self) -> np.ndarray | None:
        """A class map's IoU per class present in FP32 or the candidate; None where the
        output is no class map."""
        if self.confusion is None or self.no_iou:
            return None
        inter = np.diag(self.confusion).astype(np.float64)
        union = self.confusion.sum(axis=0) + self.confusion.sum(axis=1) - inter
        present = union > 0
        return inter[present] / union[present]

    def iou_classes(self) -> int | None:
        """How many classes a class map's mean IoU averages; None where it is no class map."""
        ious = self._class_ious()
        return None if ious is None else len(ious)

    def _mean_iou(self) -> float | None:
        ious = self._class_ious()
        return float(ious.mean()) if ious is not None and len(ious) else None

    def update_mask(self, a: np.ndarray, b: np.ndarray) -> None:
        """A probability map's decisions at :attr:`mask_threshold`, pooled over samples (also
        for a part of an output that a Sigmoid made: a detector's scores)."""
        self._note_finite(a, b)
        da, db = a > self.mask_threshold, b > self.mask_threshold
        self.mask_values += a.size
        self.mask_both += int(np.count_nonzero(da & db))
        self.mask_either += int(np.count_nonzero(da | db))
        self.mask_a += int(np.count_nonzero(da))
        self.mask_b += int(np.count_nonzero(db))

    def mask_decisions(self) -> dict[str, int] | None:
        """How many values each side decided (above the threshold), both did, and were
        compared: what a mask IoU rests on (4 decisions make a fragile IoU)."""
        if not self.mask:
            return None
        return {
            "fp32": self.mask_a,
            "candidate": self.mask_b,
            "both": self.mask_both,
            "values": self.mask_values,
        }

    def _note_finite(self, a: np.ndarray, b: np.ndarray) -> tuple[bool, bool]:
        """Whether each side's values are all finite; a side that is not stays marked."""
        finite_a, finite_b = bool(np.isfinite(a).all()), bool(np.isfinite(b).all())
        self.nonfinite_a |= not finite_a
        self.nonfinite_b |= not finite_b
        return finite_a, finite_b

    def _tally_labels(
        self,
        pred_a: np.ndarray,
        pred_b: np.ndarray,
        labels: np.ndarray,
        finite_a: bool,
        finite_b: bool,
    ) -> None:
        """Both sides' hits against the labels (a side with NaN/Inf hits none)."""
        lab = np.asarray(labels).reshape(-1)
        self.correct_a += int((pred_a == lab).sum()) if finite_a else 0
        self.correct_b += int((pred_b == lab).sum()) if finite_b else 0
        self.labelled += lab.size

    @property
    def applies(self) -> bool:
        return self.kind in (CLASS, POSITION, DECISION, EXACT)

    @property
    def mask(self) -> bool:
        """Whether the output is a probability map (:func:`is_mask`) whose IoU was measured."""
        return self.mask_values > 0

    def metrics(self) -> dict[str, float | None]:
        """``agreement`` (per sample or per position), ``top5_agreement`` (with more than 5
        classes: with fewer it is 1 whatever the model does), per position
        ``sequence_agreement``, and a probability map's ``mask_iou``; ``None`` where not
        applicable or undefined (NaN/Inf; no value above the threshold on either side)."""
        out: dict[str, float | None] = dict.fromkeys(AGREEMENT_KEYS)
        if self.nonfinite_a or self.nonfinite_b:
            return out
        if self.mask_either:
            out[MASK_IOU] = self.mask_both / self.mask_either
        if not self.applies or not self.samples:
            return out
        out[MEAN_IOU] = self._mean_iou()
        if self.kind == EXACT:
            out["agreement"] = self.top1 / self.positions if self.positions else None
            several = self.sampled and self.positions > self.samples  # more than one per sample
            out["sequence_agreement"] = self.sequences / self.samples if several else None
            return out
        out.update(
            {
                "agreement": self.top1 / self.positions,
                "top5_agreement": self.top5 / self.positions if self.classes > 5 else None,
                "sequence_agreement": (
                    self.sequences / self.samples if self.kind == POSITION else None
                ),
                "ctc_agreement": (
                    ctc_agreement(self.paths_a, self.paths_b) if self.paths_a else None
                ),
            }
        )
        return out

    def note(self) -> str:
        """Why agreement is absent, or what it means where that is not argmax ('' for an
        argmax agreement); and why a probability map's IoU is undefined."""
        notes = [self._agreement_note()]
        finite = not (self.nonfinite_a or self.nonfinite_b)
        if self.mask and finite and not self.mask_either:
            notes.append(
                f"mask IoU undefined: no value above {self.mask_threshold:g} on either side"
            )
        return "; ".join(n for n in notes if n)

    def _agreement_note(self) -> str:
        if not self.applies:
            return f"agreement not defined: {self.reason}" if self.reason else ""
        if self.nonfinite_a or self.nonfinite_b:
            return "agreement undefined: NaN/Inf in the output"
        if self.kind == DECISION:
            return (
                f"agreement of the decisions at {DECISION_THRESHOLD} (a Sigmoid's probability, "
                "one per sample)"
            )
        if self.kind == EXACT:
            differ = (
                f"; its shape differed between FP32 and the candidate on {self.mismatched} "
                "batch(es) (a variable-size output: NonZero, NMS), which agree nowhere"
                if self.mismatched
                else ""
            )
            return f"integers: compared exactly (equal or not; no cosine or SQNR){differ}"
        return ""

    def accuracy(self) -> dict[str, float | None] | None:
        """A (FP32) and B accuracy and B − A; None when no labels were scored."""
        if not self.labelled:
            return None
        acc_a = None if self.nonfinite_a else self.correct_a / self.labelled
        acc_b = None if self.nonfinite_b else self.correct_b / self.labelled
        delta = None if acc_a is None or acc_b is None else acc_b - acc_a
        return {"A": acc_a, "B": acc_b, "delta": delta}


def ctc_agreement(paths_a: Sequence[np.ndarray], paths_b: Sequence[np.ndarray]) -> float:
    """Share of samples whose CTC-decoded argmax paths agree: repeats merged, then the blank
    dropped. The blank is the class FP32's paths pick most often (a CTC model emits it on most
    frames), so no convention (0 or the last class) is assumed."""
    blank = int(np.bincount(np.concatenate(paths_a)).argmax())
    same = sum(
        np.array_equal(_ctc_decoded(a, blank), _ctc_decoded(b, blank))
        for a, b in zip(paths_a, paths_b, strict=True)
    )
    return same / len(paths_a)


def _ctc_decoded(path: np.ndarray, blank: int) -> np.ndarray:
    merged = path[np.r_[True, path[1:] != path[:-1]]]
    return merged[merged != blank]


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
    #: outputs joining different kinds of values, judged part by part too (:func:`concat_parts`)
    parts: OutputParts = field(default_factory=dict)
    #: NCHW outputs whose channels may not be classes, and why (:func:`channel_class_doubts`)
    channel_doubt: Mapping[str, str] = field(default_factory=dict)
    #: the model has no batch axis: the data feeds it one sample at a time
    #: (:attr:`quantbench.data.sources.DataSource.unbatched`), so its outputs have none either
    unbatched: bool = False
    #: outputs a Sigmoid made (:func:`probability_outputs`)
    probabilities: frozenset[str] = frozenset()
    #: where a probability map's values count as decided (:data:`MASK_IOU`)
    mask_threshold: float = DECISION_THRESHOLD
    #: outputs holding integers or bools, compared exactly (:data:`EXACT`)
    exact: frozenset[str] = frozenset()
    #: integer outputs no float value reaches (:func:`value_free_outputs`): not compared
    value_free: frozenset[str] = frozenset()
    #: outputs after an NMS/NonZero -> the float tensors it chose from
    #: (:func:`selection_sources`), judged by their drift where a caller fetches them
    chosen_from: Mapping[str, list[str]] = field(default_factory=dict)
    #: the model's outputs (other tensors a caller fetches are not outputs)
    outputs: tuple[str, ...] = ()
    #: an input holds integers (token ids): per-position scores are a tagger's, not frames a
    #: CTC decoder reads (:attr:`OutputSupport.recognizer`)
    token_inputs: bool = False

    @classmethod
    def of(
        cls, model: Any, unbatched: bool = False, mask_threshold: float = DECISION_THRESHOLD
    ) -> OutputLayout:
        """What ``model``'s graph says (``unbatched``: data feeds it one sample at a time;
        ``mask_threshold``: a probability map's decisions, :data:`MASK_IOU`)."""
        doubts, unless = class_axis_evidence(model)
        first = channels_first_outputs(model)
        fixed = value_free_outputs(model)
        return cls(
            first,
            doubts,
            unless,
            samples_second_outputs(model),
            concat_parts(model),
            channel_class_doubts(model, first),
            unbatched,
            probability_outputs(model),
            mask_threshold,
            exact_outputs(model) - fixed,
            fixed,
            selection_sources(model),
            tuple(o.name for o in model.graph.output),
            _integer_inputs(model),
        )

    @cached_property
    def sources(self) -> frozenset[str]:
        """The tensors NMS/NonZero outputs chose from (:attr:`chosen_from`)."""
        return frozenset(t for tensors in self.chosen_from.values() for t in tensors)

    def not_compared(self, name: str) -> str:
        """Why tensor ``name`` has no agreement whatever its shape ('' when it may have)."""
        if name in self.value_free:
            return VALUE_FREE
        if name in self.sources and name not in self.outputs:
            outputs = ", ".join(o for o, t in self.chosen_from.items() if name in t)
            return f"a tensor the NMS/NonZero before {outputs} chose from: judged by its drift"
        return ""

    def judged_tensors(self) -> tuple[list[str], list[str]]:
        """The tensors a candidate is judged on, and those of them that are not outputs:
        every output, joined by the tensors an NMS/NonZero chose from (:attr:`chosen_from`)."""
        judged = list(self.outputs)
        for tensors in self.chosen_from.values():
            judged += [t for t in tensors if t not in judged]
        return judged, [t for t in judged if t not in self.outputs]

    def stands_in(self, name: str, fetched: Collection[str]) -> bool:
        """Whether output ``name`` is judged on the tensors it chose from, all among
        ``fetched``: its own drift (sizes that differ) then does not count."""
        sources = self.chosen_from.get(name)
        return bool(sources) and all(t in fetched for t in sources)

    def part_op(self, name: str, part: str) -> str:
        """The op that made part row ``part`` of output ``name`` (:attr:`parts`)."""
        axis, bounds = self.parts[name]
        return {part_name(name, a, b, axis): op for a, b, op in bounds}[part]

    def sigmoid_parts(self, name: str) -> bool:
        """Whether output ``name`` joins a part a Sigmoid made (a detector's class scores)."""
        return name in self.parts and any(op == "Sigmoid" for *_, op in self.parts[name][1])

    def pieces(self, name: str, shape: Sequence[int]) -> list[tuple[str, tuple[slice, ...]]]:
        """Output ``name``'s parts (:attr:`parts`) in an array of ``shape``: (row name, index);
        none when the run's shape does not hold the parts the graph declared."""
        if name not in self.parts:
            return []
        axis, bounds = self.parts[name]
        if len(shape) <= axis or shape[axis] != bounds[-1][1]:
            return []
        found = []
        for start, stop, _ in bounds:
            index = [slice(None)] * len(shape)
            index[axis] = slice(start, stop)
            found.append((part_name(name, start, stop, axis), tuple(index)))
        return found

    def kind(self, shape: Sequence[int | str | None], name: str) -> tuple[str | None, str]:
        """:func:`agreement_kind` of output ``name`` with this layout."""
        if reason := self.not_compared(name):
            return None, reason
        return agreement_kind(
            (1, *shape) if self.unbatched else shape,
            name,
            name in self.channels_first,
            self.class_axis_doubt.get(name, ""),
            self.doubt_unless_size.get(name),
            self.channel_doubt.get(name, ""),
            name in self.probabilities,
            name in self.exact,
        )

    def mask(self, shape: Sequence[int | str | None], name: str) -> bool:
        """:func:`is_mask` of output ``name`` with this layout."""
        return is_mask((1, *shape) if self.unbatched else shape, name in self.probabilities)

    def accumulator(self, name: str) -> AgreementAccumulator:
        return AgreementAccumulator(
            name=name,
            channels_first=name in self.channels_first,
            class_axis_doubt=self.class_axis_doubt.get(name, ""),
            doubt_unless_size=self.doubt_unless_size.get(name),
            channel_doubt=self.channel_doubt.get(name, ""),
            unbatched=self.unbatched,
            samples_second=name in self.samples_second,
            probability=name in self.probabilities,
            mask_threshold=self.mask_threshold,
            exact=name in self.exact,
            not_compared=self.not_compared(name),
        )


#: ONNX element types compared exactly: integers and bools
_EXACT_TYPES = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL")
)


def exact_outputs(model: Any) -> frozenset[str]:
    """The outputs a model declares as integers or bools (:data:`EXACT`)."""
    return frozenset(
        v.name
        for v in model.graph.output
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _EXACT_TYPES
    )


#: output metrics a results table shows only where some output carries them
OPTIONAL_KEYS = (*SEQUENCE_KEYS, MASK_IOU, MEAN_IOU)


def carried_metrics(rows: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The :data:`OPTIONAL_KEYS` some of these result rows carry: the sequence metrics where
    an output has positions, mask IoU where one is a probability map, mean IoU where one is a
    class map (what the console and HTML tables show columns for)."""
    carried: set[str] = set()
    if any(r.get("agreement_kind") == POSITION or r.get("sequence_agreement") is not None
           for r in rows):  # fmt: skip
        carried.update(SEQUENCE_KEYS)
    if any(r.get("mask_threshold") is not None for r in rows):
        carried.add(MASK_IOU)
    if any(r.get("iou_classes") is not None for r in rows):
        carried.add(MEAN_IOU)
    return frozenset(carried)


def part_name(output: str, start: int, stop: int, axis: int) -> str:
    """How a part of an output is named in results: ``output0[4:22 on axis 1]``."""
    return f"{output}[{start}:{stop} on axis {axis}]"


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
    """The output accuracy is measured on: the first one holding class scores, else the first
    probability (its decision against 0 / 1 labels), else the first integer one (class ids,
    scored where it holds one per sample)."""
    for wanted in (CLASS, DECISION, EXACT):
        found = next((name for name, kind in kinds.items() if kind == wanted), None)
        if found is not None:
            return found
    return None


def output_kinds(
    shapes: Mapping[str, Sequence[int | str | None] | None], layout: OutputLayout | None = None
) -> dict[str, tuple[str | None, str]]:
    """:func:`agreement_kind` of every output; a shape of ``None`` (rank unknown) is unknown."""
    layout = layout or OutputLayout()
    return {
        name: (UNKNOWN, "its shape is unknown") if shape is None else layout.kind(shape, name)
        for name, shape in shapes.items()
    }


def declared_output_kinds(model: Any, unbatched: bool = False) -> dict[str, tuple[str | None, str]]:
    """:func:`output_kinds` of a model's outputs as it declares them (``unbatched``: fed one
    sample at a time, :attr:`OutputLayout.unbatched`), less those no float value reaches
    (:func:`value_free_outputs`: nothing to judge them by)."""
    return dict(declared_support(model, unbatched).kinds)


def _integer_inputs(model: Any) -> bool:
    """Whether a graph input (not an initializer) holds integers (not bools: a mask)."""
    initializers = {t.name for t in model.graph.initializer}
    integers = _EXACT_TYPES - {onnx.TensorProto.BOOL}
    return any(
        v.type.tensor_type.elem_type in integers
        for v in model.graph.input
        if v.name not in initializers
    )


@dataclass(frozen=True)
class OutputSupport:
    """What outputs of given shapes can be judged by (:func:`metric_support`): each one's
    agreement kind, less those no float value reaches, and which are probability maps, class
    maps and sequences. One layout serves all of them."""

    kinds: Mapping[str, tuple[str | None, str]]
    masks: frozenset[str] = frozenset()
    class_maps: frozenset[str] = frozenset()
    #: ``(N, T, C)`` scores per position: what ``ctc_agreement`` decodes
    sequences: frozenset[str] = frozenset()
    #: a recognizer reading sequences from float input (a CTC text or speech model): every
    #: output with agreement is a sequence and no input is token ids (a tagger's every
    #: position counts); its text, ``ctc_agreement``, is what it is judged by
    recognizer: bool = False

    @classmethod
    def of(
        cls, shapes: Mapping[str, Sequence[int | str | None] | None], layout: OutputLayout
    ) -> OutputSupport:
        judged = {k: v for k, v in shapes.items() if k not in layout.value_free}
        kinds = output_kinds(judged, layout)
        extra = 1 if layout.unbatched else 0
        sequences = frozenset(
            name
            for name, shape in judged.items()
            if shape is not None and kinds[name][0] == POSITION and len(shape) + extra == 3
        )
        agreeing = {n for n, (kind, _) in kinds.items() if kind in (CLASS, POSITION, DECISION)}
        return cls(
            kinds,
            mask_outputs(judged, layout),
            class_map_outputs(judged, layout),
            sequences,
            bool(sequences) and agreeing <= sequences and not layout.token_inputs,
        )

    def support(self, metric: str, labels: np.ndarray | None) -> str | None:
        """:func:`metric_support` of ``metric`` for these outputs."""
        return metric_support(metric, self.kinds, labels, self.masks, self.class_maps)

    def defined(self, labels: np.ndarray | None) -> list[str]:
        """:func:`defined_metrics` for these outputs."""
        return defined_metrics(self.kinds, labels, self.masks, self.class_maps)


def declared_support(model: Any, unbatched: bool = False) -> OutputSupport:
    """:class:`OutputSupport` of a model's outputs as it declares them."""
    return OutputSupport.of(declared_output_shapes(model), OutputLayout.of(model, unbatched))


def mask_outputs(
    shapes: Mapping[str, Sequence[int | str | None] | None], layout: OutputLayout
) -> frozenset[str]:
    """The outputs of these shapes that are probability maps (:func:`is_mask`), or join one
    (:meth:`OutputLayout.sigmoid_parts`: a YOLO head's class scores); one of unknown rank
    counts when a Sigmoid made it."""
    return frozenset(
        name
        for name, shape in shapes.items()
        if (name in layout.probabilities if shape is None else layout.mask(shape, name))
        or layout.sigmoid_parts(name)
    )


def class_map_outputs(
    shapes: Mapping[str, Sequence[int | str | None] | None], layout: OutputLayout
) -> frozenset[str]:
    """The outputs of these shapes that are class maps (:data:`MEAN_IOU`): a spatial map of
    class scores (rank 4, argmax per pixel) or of class ids (integers of rank 3 or more), or
    may be (a symbolic class axis)."""
    found = set()
    for name, shape in shapes.items():
        if shape is None:
            continue
        kind = layout.kind(shape, name)[0]
        rank = len(shape) + (1 if layout.unbatched else 0)
        if (kind in (POSITION, UNKNOWN) and rank >= 4) or (kind == EXACT and rank >= 3):
            found.add(name)
    return frozenset(found)


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
    metric: str,
    kinds: Mapping[str, tuple[str | None, str]],
    labels: np.ndarray | None,
    masks: Collection[str] = (),
    class_maps: Collection[str] = (),
) -> str | None:
    """Why ``metric`` cannot be defined for outputs of these kinds (``masks``: those that are
    probability maps, :func:`mask_outputs`; ``class_maps``: :func:`class_map_outputs`): ``""``
    when it can, a reason when it cannot (with the metrics that are defined), ``None`` when
    only data can tell (symbolic class axis)."""
    reason = _unsupported(metric, kinds, labels, masks, class_maps)
    if not reason:
        return reason
    defined = [m for m in defined_metrics(kinds, labels, masks, class_maps) if m != metric]
    return f"{reason}; defined for it: {', '.join(defined)}"


def defined_metrics(
    kinds: Mapping[str, tuple[str | None, str]],
    labels: np.ndarray | None,
    masks: Collection[str] = (),
    class_maps: Collection[str] = (),
) -> list[str]:
    """The :data:`MODEL_METRICS` outputs of these kinds can give (or may: a symbolic class
    axis), in their order."""
    return [m for m in MODEL_METRICS if not _unsupported(m, kinds, labels, masks, class_maps)]


def _unsupported(
    metric: str,
    kinds: Mapping[str, tuple[str | None, str]],
    labels: np.ndarray | None,
    masks: Collection[str],
    class_maps: Collection[str] = (),
) -> str | None:
    if metric == MEAN_IOU:
        if class_maps:
            return ""
        return (
            f"{metric} is not defined for this model: no output is a class map (class scores "
            "per pixel, [N, C, H, W] or [N, H, W, C], or class ids [N, H, W])"
        )
    if metric == MASK_IOU:
        if masks:
            return ""
        return (
            f"{metric} is not defined for this model: no output holds probabilities a Sigmoid "
            "made, more than one per sample (a probability map, multi-label scores)"
        )
    if metric in ("accuracy", "accuracy_drop", "accuracy_delta"):
        if labels is None:
            return f"{metric} needs --labels LABELS.npy"
        if reason := labels_accuracy_reason(labels):
            return f"{metric} needs integer class labels; {reason}"
        wanted, what = (CLASS, DECISION), "no output holds class scores [N, C] or a probability"
    elif metric == "top1_agreement":
        wanted, what = (CLASS, POSITION, DECISION, EXACT), "no output supports agreement"
    elif metric == "top5_agreement":
        wanted, what = (CLASS, POSITION), "no output supports argmax agreement"
    elif metric == "sequence_agreement":
        wanted, what = (POSITION, EXACT), "no output has positions (N, ..., C) or integers"
    elif metric in SEQUENCE_KEYS:  # ctc_agreement: sequences (N, T, C), not class maps
        kinds = {name: kind for name, kind in kinds.items() if name not in class_maps}
        wanted, what = (POSITION,), "no output has per-position scores (N, T, C)"
    elif metric in ("cosine", "sqnr_db") and kinds and all(k == EXACT for k, _ in kinds.values()):
        return (
            f"{metric} is not defined for this model: every output holds integers, compared "
            "exactly (no cosine or SQNR of class numbers)"
        )
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

    #: part row -> the output it is a part of (:meth:`OutputLayout.pieces`)
    part_of: dict[str, str] = field(default_factory=dict)
    #: outputs with parts in the graph that a batch did not hold: judged whole only
    unsplit: set[str] = field(default_factory=set)
    #: part row -> the decisions of a part a Sigmoid made (a detector's class scores)
    part_masks: dict[str, AgreementAccumulator] = field(default_factory=dict)
    #: outputs compared exactly or not at all: no cosine or SQNR of class numbers
    undrifted: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        self.drift = {n: DriftAccumulator() for n in self.names}
        self.agreement = {n: self.layout.accumulator(n) for n in self.names}
        self.undrifted = self.layout.exact | self.layout.value_free

    def update(
        self,
        reference: Mapping[str, np.ndarray],
        candidate: Mapping[str, np.ndarray],
        labels: np.ndarray | None = None,
        batch: int | None = None,
    ) -> None:
        """One batch of ``batch`` samples; ``candidate`` keyed by the reference's output
        names. An output joining kinds of values also updates a drift row per part."""
        label_output = self.label_output(reference)
        for name in self.names:
            a, b = reference[name], candidate[name]
            if name not in self.undrifted:
                self.drift[name].update(a, b)
            lab = labels if name == label_output and self.labels_usable else None
            self.agreement[name].update(a, b, lab, batch)
            self._update_parts(name, np.asarray(a), np.asarray(b))

    def _update_parts(self, name: str, a: np.ndarray, b: np.ndarray) -> None:
        if name not in self.layout.parts or name in self.unsplit:
            return
        pieces = self.layout.pieces(name, a.shape) if a.shape == b.shape else []
        known = self.parts_of(name)
        if not pieces or (known and [row for row, _ in pieces] != known):
            # a batch that does not hold the parts: they are not judged at all rather than on
            # some batches only (the whole output still is)
            for row in known:
                del self.drift[row], self.part_of[row]
                self.part_masks.pop(row, None)
            self.unsplit.add(name)
            return
        for row, index in pieces:
            self.part_of[row] = name
            self.drift.setdefault(row, DriftAccumulator()).update(a[index], b[index])
            shape = a[index].shape
            if self.layout.part_op(name, row) == "Sigmoid" and is_mask(
                (1, *shape) if self.layout.unbatched else shape, True
            ):
                self.part_masks.setdefault(row, self._mask_accumulator(row))
                self.part_masks[row].update_mask(a[index], b[index])

    def _mask_accumulator(self, row: str) -> AgreementAccumulator:
        threshold = self.layout.mask_threshold
        return AgreementAccumulator(name=row, probability=True, mask_threshold=threshold)

    def label_output(self, reference: Mapping[str, np.ndarray]) -> str | None:
        kinds = {n: self.layout.kind(np.shape(reference[n]), n)[0] for n in self.names}
        return accuracy_output(kinds)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Per output: agreement metrics, drift metrics, ``agreement_kind``, ``agreement_note``,
        ``mask_threshold`` (the decisions' of a probability map whose ``mask_iou`` was
        measured, else ``None``) and ``nonfinite`` counts."""
        out = {}
        for name in self.names:
            agree, drift = self.agreement[name], self.drift[name]
            row: dict[str, Any] = dict(agree.metrics())
            row.update({k: v for k, v in drift.metrics().items() if k != "clip_fraction"})
            stands_in = self.layout.stands_in(name, self.names)
            notes = [agree.note()]
            if drift.mismatched:
                notes.append(
                    f"its shape differed between FP32 and the candidate on {drift.mismatched} "
                    "batch(es) (a variable-size output: NonZero, NMS): not compared value by value"
                )
            if stands_in:
                judged = ", ".join(self.layout.chosen_from[name])
                notes.append(f"its drift is judged on {judged}, what it chose from")
            row["agreement_kind"] = agree.kind if agree.applies else None
            row["agreement_note"] = "; ".join(n for n in notes if n) or None
            row["mask_threshold"] = agree.mask_threshold if agree.mask else None
            row["mask_decisions"] = agree.mask_decisions()
            row["iou_classes"] = agree.iou_classes()
            row["shape_mismatches"] = drift.mismatched + agree.mismatched
            row["value_free"] = name in self.layout.value_free
            row["judged_on"] = list(self.layout.chosen_from[name]) if stands_in else None
            # decoded text leads where the model reads sequences (OutputSupport.recognizer)
            decoded = row.get("ctc_agreement") is not None
            row["reads_text"] = decoded and not self.layout.token_inputs
            row["nonfinite"] = drift.nonfinite()
            out[name] = row
            for part in self.parts_of(name):
                out[part] = self._part_row(part, name)
        return out

    def parts_of(self, name: str) -> list[str]:
        """The part rows of output ``name`` (none where it is judged whole only)."""
        return [row for row, output in self.part_of.items() if output == name]

    def _part_row(self, part: str, output: str) -> dict[str, Any]:
        """A part's drift, and the mask IoU of a part a Sigmoid made (a detector's scores)."""
        drift = self.drift[part]
        row: dict[str, Any] = dict.fromkeys(AGREEMENT_KEYS)
        row.update({k: v for k, v in drift.metrics().items() if k != "clip_fraction"})
        made = self.layout.part_op(output, part)
        row.update(agreement_kind=None, agreement_note=None, part_of=output, part_made_by=made)
        mask = self.part_masks.get(part)
        row["mask_threshold"] = mask.mask_threshold if mask is not None else None
        row["mask_decisions"] = mask.mask_decisions() if mask is not None else None
        if mask is not None:
            row[MASK_IOU] = mask.metrics()[MASK_IOU]
            row["agreement_note"] = mask.note() or None
        row["nonfinite"] = drift.nonfinite()
        return row

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

    Agreement over outputs where argmax applies (``agreement_kind`` set), mask IoU over the
    probability maps (``mask_threshold`` set); ``None`` when no output supports it, or when any
    output's value is undefined. Values may be JSON text
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
    ranked = [r for r in agreeing if r.get("agreement_kind") in (CLASS, POSITION)]  # top-5
    sequences = [
        r
        for r in rows
        if r.get("agreement_kind") == POSITION
        or (r.get("agreement_kind") == EXACT and r.get("sequence_agreement") is not None)
    ]
    # cosine and SQNR: float outputs (or the tensors an NMS chose from, standing in for them)
    measured = [
        r
        for r in rows
        if r.get("agreement_kind") != EXACT and not r.get("value_free") and not r.get("judged_on")
    ]
    decoded = [r for r in sequences if r.get("ctc_agreement") is not None]  # (N, T, C) only
    masks = [r for r in rows if r.get("mask_threshold") is not None]
    maps = [r for r in rows if r.get("iou_classes") is not None]
    return {
        "top1_agreement": worst("agreement", agreeing),
        "top5_agreement": worst("top5_agreement", ranked),
        "sequence_agreement": worst("sequence_agreement", sequences),
        "ctc_agreement": worst("ctc_agreement", decoded),
        MASK_IOU: worst(MASK_IOU, masks),
        MEAN_IOU: worst(MEAN_IOU, maps),
        "cosine": worst("cosine", measured),
        "sqnr_db": worst("sqnr_db", measured),
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
