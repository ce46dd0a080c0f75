"""Opset requirements of Q/DQ: QuantizeLinear/DequantizeLinear exist from opset 10, the ``axis``
attribute that per-channel weights need from opset 13. Older models are upgraded with
``onnx.version_converter``; when that fails the weights fall back to per-tensor (a warning, not
an error) as long as opset 10 is there."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from quantbench.errors import QuantbenchError
from quantbench.model.opsetconvert import convert_version

MIN_QDQ_OPSET = 10
PER_CHANNEL_OPSET = 13


@dataclass
class OpsetDecision:
    model: onnx.ModelProto
    opset_from: int
    opset_to: int
    per_channel: bool
    warnings: list[str] = field(default_factory=list)


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``version_converter`` plus the checker; raises whatever either raises."""
    converted = convert_version(model, target)
    onnx.checker.check_model(converted)
    return converted


def ensure_qdq_opset(model: onnx.ModelProto, per_channel: bool) -> OpsetDecision:
    """Upgrade to the lowest opset the requested Q/DQ form needs, or fall back to per-tensor."""
    current = default_opset(model)
    needed = PER_CHANNEL_OPSET if per_channel else MIN_QDQ_OPSET
    if current >= needed:
        return OpsetDecision(model, current, current, per_channel)
    targets = [needed] if needed == MIN_QDQ_OPSET else [PER_CHANNEL_OPSET, MIN_QDQ_OPSET]
    failures: list[str] = []
    for target in targets:
        if target <= current:
            break
        try:
            converted = convert(model, target)
        except Exception as exc:  # noqa: BLE001 - the converter raises many kinds
            failures.append(f"opset {current} -> {target}: {_first_line(exc)}")
            continue
        return _decision(converted, current, target, per_channel, failures)
    if current >= MIN_QDQ_OPSET:
        return _decision(model, current, current, per_channel, failures)
    raise QuantbenchError(
        f"model opset {current} is too old for Q/DQ (needs >= {MIN_QDQ_OPSET}) and "
        f"onnx.version_converter could not upgrade it ({'; '.join(failures)}); re-export the "
        f"model with opset >= {PER_CHANNEL_OPSET}"
    )


def _decision(
    model: onnx.ModelProto, current: int, target: int, per_channel: bool, failures: list[str]
) -> OpsetDecision:
    decision = OpsetDecision(model, current, target, per_channel)
    if per_channel and target < PER_CHANNEL_OPSET:
        decision.per_channel = False
        decision.warnings.append(
            f"could not upgrade opset {current} to {PER_CHANNEL_OPSET} for per-channel weights "
            f"({'; '.join(failures)}); weights are quantized per-tensor"
        )
    return decision


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
