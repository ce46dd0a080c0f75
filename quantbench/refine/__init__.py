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
  (max|w| / 127, implicit path) and the Q/DQ path give the same integers.

Every pass takes an FP32 ``onnx.ModelProto`` and returns a :class:`Refined`: a new FP32 model
with the same inputs and outputs, exactly valid for both TensorRT paths, and a record of what
changed per layer. Passes never mutate their input model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

#: the passes, in the order they are applied when several are asked for: the exact rewrites
#: first (they change activation ranges), then the weight-side passes that read activations;
#: bias correction last, so that it corrects the shift of the weights as they end up
EQUALIZE = "equalize"
SMOOTH = "smooth"
BIAS = "bias"
ROUNDING = "rounding"
PASSES = (EQUALIZE, SMOOTH, ROUNDING, BIAS)
#: passes whose rewrite keeps the FP32 function but moves activation ranges: a table must be
#: calibrated on the refined model, never carried over from the original
RANGE_CHANGING = frozenset({EQUALIZE, SMOOTH})
#: the cheap passes the default ``auto`` may try
CHEAP = (EQUALIZE, SMOOTH, BIAS)


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

    @property
    def changed(self) -> bool:
        return bool(self.layers)
