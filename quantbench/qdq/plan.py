"""What quantization did to a model: every quantized node with its Q/DQ inputs, and every op that
was left in high precision with the reason. Nothing is skipped silently (peers.md section 0.6:
onnxruntime and ModelOpt drop or mis-quantize dynamic-weight convolutions without a word)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from quantbench.errors import QuantbenchError

#: roles an input can play; they decide where its scale comes from.
ACTIVATION = "activation"  # runtime tensor, per-tensor scale from the calibration table
WEIGHT = "weight"  # constant tensor, scale from its own values (per-channel where supported)
RUNTIME_WEIGHT = "runtime weight"  # a conv kernel computed at run time: per-tensor, from the table
RESIDUAL = "residual"  # the other input of an Add that follows a quantized weighted op


@dataclass(frozen=True)
class QdqInput:
    """One input of a quantized node and the Q/DQ pair placed on it."""

    index: int
    tensor: str
    role: str
    scale: np.ndarray  # float32; shape () per-tensor, (K,) per-channel
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "tensor": self.tensor,
            "role": self.role,
            "axis": self.axis,
            "scale": self.scale.tolist(),
        }


@dataclass(frozen=True)
class QuantizedNode:
    """A node whose inputs now come from DequantizeLinear nodes."""

    node: str
    op_type: str
    inputs: tuple[QdqInput, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "op_type": self.op_type,
            "inputs": [i.to_dict() for i in self.inputs],
        }


@dataclass(frozen=True)
class SkippedNode:
    """A candidate op left in high precision, and why."""

    node: str
    op_type: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "op_type": self.op_type, "reason": self.reason}


@dataclass
class QuantizeResult:
    """The Q/DQ model plus the plan that produced it."""

    model: onnx.ModelProto
    quantized: list[QuantizedNode] = field(default_factory=list)
    skipped: list[SkippedNode] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    opset_from: int = 0
    opset_to: int = 0
    per_channel: bool = True
    qdq_pairs: int = 0
    #: of those pairs, the second stages of two-stage activations (quantbench.refine.twostage)
    second_stages: int = 0
    #: weighted ops TensorRT's INT8 Q/DQ does not quantize (recurrent layers), by op type:
    #: they stay in FP32/FP16 whatever the table says, and are said so
    not_quantizable: dict[str, int] = field(default_factory=dict)

    def quantized_node(self, name: str) -> QuantizedNode:
        for q in self.quantized:
            if q.node == name:
                return q
        raise KeyError(name)

    def skipped_node(self, name: str) -> SkippedNode:
        for s in self.skipped:
            if s.node == name:
                return s
        raise KeyError(name)

    def require_quantized(self, label: str) -> None:
        """Refuses a result with no quantized op: an "INT8" model that is the FP32 one would
        pass every comparison (sensitivity, recover, compare and quantize all say so)."""
        if self.quantized:
            return
        why = f"; e.g. {self.skipped[0].node}: {self.skipped[0].reason}" if self.skipped else ""
        raise QuantbenchError(
            f"{label}: no op is quantized ({len(self.skipped)} candidate op(s) left in high "
            f"precision{why}); check --exclude and that the model has Conv/Gemm/MatMul ops"
        )

    def summary(self) -> str:
        """One line for the CLI: counts, opset change, weight mode."""
        opset = (
            f"opset {self.opset_from}"
            if self.opset_from == self.opset_to
            else f"opset {self.opset_from} -> {self.opset_to}"
        )
        weights = "per-channel" if self.per_channel else "per-tensor"
        kept = ", ".join(f"{n} {op}" for op, n in self.not_quantizable.items())
        adds = sum(q.op_type == "Add" for q in self.quantized)
        # the same split inspect gives for a model's ops to quantize
        split = f" ({len(self.quantized) - adds} weighted, {adds} residual Add)" if adds else ""
        return (
            f"{len(self.quantized)} ops quantized{split}, {len(self.skipped)} left in high "
            "precision, "
            f"{self.qdq_pairs} Q/DQ pairs"
            + (f" ({self.second_stages} of them second stages)" if self.second_stages else "")
            + f", {weights} weights, {opset}"
            + (f", {kept} not quantizable (they stay in FP32/FP16)" if kept else "")
            + (f", {len(self.warnings)} warnings" if self.warnings else "")
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "quantized": [q.to_dict() for q in self.quantized],
            "skipped": [s.to_dict() for s in self.skipped],
            "warnings": list(self.warnings),
            "opset_from": self.opset_from,
            "opset_to": self.opset_to,
            "per_channel": self.per_channel,
            "qdq_pairs": self.qdq_pairs,
            "second_stages": self.second_stages,
            "not_quantizable": dict(self.not_quantizable),
        }
