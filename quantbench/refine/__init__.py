"""Refinement passes: FP32 models that quantize better, every op still INT8 (issue 38).

Choosing a range per tensor is all calibration does; some accuracy is out of its reach. A
refinement pass rewrites the FP32 model itself so that its INT8 form loses less:

* :mod:`~quantbench.refine.equalize` — cross-layer equalization of conv/conv and
  conv/depthwise pairs through ReLU-like ops (exact in FP32: the same function);
* :mod:`~quantbench.refine.smooth` — activation-outlier migration for MatMul/Gemm fed by
  LayerNorm/Add, SmoothQuant-style (exact in FP32);
* :mod:`~quantbench.refine.biascorrect` — empirical bias correction: the mean output shift that
  quantizing the weights causes, measured on the calibration data, folded into the bias;
* :mod:`~quantbench.refine.rounding` — adaptive weight rounding against each layer's FP32
  outputs on the calibration data; the weights are written back exactly on the INT8 grid of
  their per-channel scale, the per-channel max element kept, so TensorRT's own weight scale
  (max|w| / 127, implicit path) and the Q/DQ path give the same integers;
* :mod:`~quantbench.refine.twostage` — two-stage activations: a few sensitive activations
  of the Q/DQ model quantized twice (the second INT8 stage on the first's rounding error),
  their linear readers run twice in INT8. It rewrites the Q/DQ model, not the FP32 one, so
  it comes after quantization and only the Q/DQ path can express it.

Every other pass takes an FP32 ``onnx.ModelProto`` and returns a :class:`Refined`: a new FP32 model
with the same inputs and outputs, exactly valid for both TensorRT paths, and a record of what
changed per layer. Passes never mutate their input model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

#: the passes, in the order they are applied when several are asked for: the exact rewrites
#: first (they change activation ranges), then the weight-side passes that read activations;
#: bias correction last, so that it corrects the shift of the weights as they end up; then the
#: Q/DQ rewrite of the model they make
EQUALIZE = "equalize"
SMOOTH = "smooth"
BIAS = "bias"
ROUNDING = "rounding"
TWO_STAGE = "two-stage"
PASSES = (EQUALIZE, SMOOTH, ROUNDING, BIAS, TWO_STAGE)
#: passes that rewrite the Q/DQ model after quantization (a calibration cache cannot hold them)
QDQ_PASSES = frozenset({TWO_STAGE})
#: passes whose rewrite keeps the FP32 function but moves activation ranges: a table must be
#: calibrated on the refined model, never carried over from the original
RANGE_CHANGING = frozenset({EQUALIZE, SMOOTH})
#: the cheap passes the default ``auto`` may try
CHEAP = (EQUALIZE, SMOOTH, BIAS)
#: metadata key of a refined model (FP32 or Q/DQ): which passes made it (``inspect`` says so)
REFINED_KEY = "quantbench.refined"
#: metadata key of the judging record (every pass tried, its score, its per-layer changes)
RECORD_KEY = "quantbench.refine_record"


@dataclass
class LayerChange:
    """What a pass did to one layer (a node, or a pair of nodes for equalization).

    ``before``/``after``: the pass's own measure of the layer, in dB where it is an SQNR
    (weight quantization SQNR for equalization, the layer's output SQNR for rounding and bias
    correction), None where it does not apply."""

    node: str
    detail: str
    before: float | None = None
    after: float | None = None
    measure: str = ""


@dataclass
class Refined:
    """A refined FP32 model and what the pass changed."""

    name: str
    model: onnx.ModelProto
    layers: list[LayerChange] = field(default_factory=list)
    seconds: float = 0.0
    #: why the pass changed nothing, when it did not (no eligible layer, ...)
    skipped: str = ""
    #: tensors the refined model computes scaled per channel under their original names
    #: (equalization's, a LayerNorm that took smoothing's 1/s): their values are not the
    #: original model's, so a layer-by-layer comparison against it must leave them out
    rescaled: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.layers)


def mark_refined(
    model: onnx.ModelProto, kept: Sequence[str], record: dict[str, Any] | None = None
) -> None:
    """Record in ``model``'s metadata which passes made it (``inspect`` says so) and, when
    given, the judging record of every pass tried (``compare --report`` shows it), each
    trial's seconds left out: the same model, data and options write the same bytes (the
    printed table and the results JSON keep the times)."""
    for prop in list(model.metadata_props):
        if prop.key in (REFINED_KEY, RECORD_KEY):
            model.metadata_props.remove(prop)
    if kept:
        model.metadata_props.add(key=REFINED_KEY, value=",".join(kept))
    if record is not None:
        timeless = {**record}
        if isinstance(record.get("trials"), list):
            timeless["trials"] = [_timeless(t) for t in record["trials"]]
        model.metadata_props.add(key=RECORD_KEY, value=json.dumps(timeless, allow_nan=False))


def _timeless(trial: Any) -> Any:
    """A trial's record without its seconds."""
    return {k: v for k, v in trial.items() if k != "seconds"} if isinstance(trial, dict) else trial


def refined_passes(model: onnx.ModelProto) -> list[str]:
    """The passes :func:`mark_refined` recorded, or none."""
    for prop in model.metadata_props:
        if prop.key == REFINED_KEY:
            return [p for p in prop.value.split(",") if p]
    return []


def refine_record(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The judging record :func:`mark_refined` stored, or None (none stored, or unreadable)."""
    for prop in model.metadata_props:
        if prop.key == RECORD_KEY:
            try:
                found = json.loads(prop.value)
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None
