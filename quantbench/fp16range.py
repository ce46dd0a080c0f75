"""What FP16 cannot hold: constants and activations beyond its range, counted and named.

The cast is IEEE float16's, numpy's ``astype(np.float16)`` (round to nearest even,
subnormals kept): what onnxruntime's Cast does and what a strongly-typed TensorRT engine holds
for an FP16 constant. Values of magnitude 65520 and more become Inf (65504 is the largest
finite value), nonzero values below half the smallest subnormal (2**-25, about 2.98e-8)
become 0, and subnormals (below 6.1e-5) keep few digits. Clamping instead (to 65504, or raising
tiny values to 5.96e-8) would report a model as healthy that runs broken, so nothing here
clamps; what breaks is said instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

if TYPE_CHECKING:
    from quantbench.stats.tensorstats import StatsFile

#: FP16's largest finite value
FP16_MAX = 65504.0
#: the smallest magnitude the cast makes Inf (half an FP16 step above 65504, ties to even)
FP16_OVERFLOW = 65520.0
#: a constant whose values move by more than this, relative (L2 over the tensor), is one FP16
#: breaks: normal FP16 values move by at most 2**-11 (0.05 %); beyond 1 % means values lost to
#: overflow, underflow or subnormal rounding that carry the tensor, not a few negligible ones
REL_TOLERANCE = 0.01


def to_fp16(values: np.ndarray) -> np.ndarray:
    """``float32(float16(values))``: IEEE float16 storage, Inf beyond range, never clamped."""
    with np.errstate(over="ignore"):
        return np.asarray(values, np.float32).astype(np.float16).astype(np.float32)


@dataclass(frozen=True)
class RangeLoss:
    """One FP32 constant the FP16 cast changes beyond rounding, with its counts."""

    tensor: str
    size: int
    #: finite values that become +-Inf
    overflow: int
    #: nonzero values that become 0
    underflow: int
    #: other values moved by more than :data:`REL_TOLERANCE` of themselves (subnormals)
    imprecise: int
    max_abs: float
    #: L2 error of the cast relative to the tensor's L2 norm (inf on overflow)
    rel_error: float

    @property
    def breaks(self) -> bool:
        """Whether FP16 breaks this constant: any overflow, or the tensor moved beyond 1 %."""
        return self.overflow > 0 or self.rel_error > REL_TOLERANCE

    def to_dict(self) -> dict[str, object]:
        """The results-document record (``rel_error`` None where Inf)."""
        return {
            "tensor": self.tensor,
            "values": self.size,
            "overflow": self.overflow,
            "underflow": self.underflow,
            "imprecise": self.imprecise,
            "max_abs": self.max_abs,
            "rel_error": None if self.rel_error == np.inf else self.rel_error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RangeLoss:
        rel = d.get("rel_error")
        return cls(
            str(d["tensor"]),
            int(d["values"]),  # type: ignore[call-overload]
            int(d["overflow"]),  # type: ignore[call-overload]
            int(d["underflow"]),  # type: ignore[call-overload]
            int(d["imprecise"]),  # type: ignore[call-overload]
            float(d["max_abs"]),  # type: ignore[arg-type]
            np.inf if rel is None else float(rel),  # type: ignore[arg-type]
        )

    def text(self) -> str:
        parts = []
        if self.overflow:
            parts.append(
                f"{self.overflow} value(s) beyond FP16's largest {FP16_MAX:g} become Inf "
                f"(max |value| {self.max_abs:.6g})"
            )
        if self.underflow:
            parts.append(f"{self.underflow} nonzero value(s) become 0")
        if self.imprecise:
            parts.append(f"{self.imprecise} value(s) move by more than {REL_TOLERANCE:.0%}")
        return f"{self.tensor} ({self.size} values): " + ", ".join(parts)


def range_loss(name: str, values: np.ndarray) -> RangeLoss | None:
    """What the FP16 cast does to ``values`` beyond rounding; None when nothing is lost."""
    a = np.asarray(values, np.float32)
    finite = np.isfinite(a)
    h = to_fp16(a)
    overflow = int(np.count_nonzero(finite & ~np.isfinite(h)))
    underflow = int(np.count_nonzero((a != 0) & (h == 0)))
    moved = np.abs(h.astype(np.float64) - a) > REL_TOLERANCE * np.abs(a.astype(np.float64))
    imprecise = int(np.count_nonzero(moved & finite & np.isfinite(h) & (h != 0)))
    if not (overflow or underflow or imprecise):
        return None
    a64 = np.where(finite, a, 0).astype(np.float64)
    norm = float(np.sqrt((a64**2).sum()))
    err = (
        np.inf
        if overflow
        else float(np.sqrt(((np.where(finite, h, 0) - a64) ** 2).sum())) / norm
        if norm
        else 0.0
    )
    max_abs = float(np.abs(a64).max()) if a.size else 0.0
    return RangeLoss(name, int(a.size), overflow, underflow, imprecise, max_abs, err)


def stored_constants(graph: onnx.GraphProto) -> list[tuple[str, onnx.TensorProto]]:
    """Every tensor ``graph`` stores (initializers, and Constant nodes' ``value``), by the name
    of the tensor it defines; the protos themselves, so a caller may rewrite them in place."""
    return [(t.name, t) for t in graph.initializer] + [
        (n.output[0], a.t)
        for n in graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    ]


def constant_losses(model: onnx.ModelProto) -> list[RangeLoss]:
    """Every FP32 initializer and Constant of ``model``'s main graph that FP16 cannot hold."""
    out = []
    for name, t in stored_constants(model.graph):
        if t.data_type != TensorProto.FLOAT:
            continue
        loss = range_loss(name, numpy_helper.to_array(t))
        if loss is not None:
            out.append(loss)
    return out


def losses_text(losses: list[RangeLoss], what: str, limit: int = 5) -> str:
    """One warning line: the constants FP16 cannot hold, with their counts."""
    if not losses:
        return ""
    shown = "; ".join(x.text() for x in losses[:limit])
    more = f"; and {len(losses) - limit} more" if len(losses) > limit else ""
    return f"FP16 cannot hold {len(losses)} constant(s) {what}: {shown}{more}"


def kept_text(kept: list[str], broken: list[RangeLoss]) -> str:
    """One warning line: the constants an FP16 artefact cannot hold and the nodes kept FP32."""
    text = losses_text(broken, "of the model")
    return f"{text}; kept in FP32 so the artefact computes them: {', '.join(kept)}" if text else ""


@dataclass(frozen=True)
class ActivationOverflow:
    """A tensor the calibration data drove to FP16's Inf: its max |x| and about how many."""

    tensor: str
    max_abs: float
    #: values of magnitude :data:`FP16_OVERFLOW` and more (from the histogram: approximate)
    count: int
    of: int


def activation_overflows(stats: StatsFile, tensors: Iterable[str]) -> list[ActivationOverflow]:
    """The ``tensors`` (those computed in FP16) whose calibration values reach FP16's Inf."""
    out = []
    for name in tensors:
        if name not in stats.tensors or stats[name].count == 0:
            continue
        t = stats[name]
        peak = max(abs(t.min), abs(t.max))
        if peak >= FP16_OVERFLOW:
            above = max(1, round(t.count_above(FP16_OVERFLOW)))
            out.append(ActivationOverflow(name, peak, above, t.count))
    return out


def overflows_text(found: list[ActivationOverflow], limit: int = 5) -> str:
    """One warning line: the FP16 tensors the data drives beyond 65504."""
    if not found:
        return ""
    shown = "; ".join(
        f"{x.tensor} (max |x| {x.max_abs:.6g}, about {x.count} of {x.of} values)"
        for x in found[:limit]
    )
    more = f"; and {len(found) - limit} more" if len(found) > limit else ""
    return (
        f"{len(found)} tensor(s) computed in FP16 reach beyond FP16's largest value "
        f"{FP16_MAX:g} on the calibration data, where FP16 gives Inf: {shown}{more}; "
        "compare fp32 MODEL.onnx tells what it does to the outputs"
    )
