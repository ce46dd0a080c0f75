"""Explicit quantization: Q/DQ ONNX models placed the way TensorRT fuses them.

``quantize_model(model, table)`` inserts QuantizeLinear -> DequantizeLinear pairs from a
:class:`~quantbench.table.CalibrationTable` (placement rules in :mod:`.placement`);
``table_from_qdq(model)`` reads the activation scales of any Q/DQ model back into a table.

Decisions (reference sections 4.1-4.3):

* Weights are stored **float32 -> QuantizeLinear -> DequantizeLinear**, not INT8 + DQ. TensorRT 10
  accepts both; TensorRT 8.x accepts only high-precision weights; ModelOpt writes the Q -> DQ
  form; the float weights stay in the file, so stripping Q/DQ (``requantize``) and comparing
  against FP32 lose nothing, and onnxruntime folds the weight Q into an INT8 initializer at load
  time anyway. The cost is file size (float32 weights, as in the FP32 model).
* Scales are float32 ``amax / 127`` (activations from the table, weights ``max|w| / 127`` per
  output channel, an all-zero channel gets a small positive scale); zero points are int8 0.
* One shared Q/DQ pair per (tensor, scale, axis): a tensor read by several quantized ops is
  quantized once. Only the quantized readers are rewired; other readers and graph outputs keep
  the float tensor.
* Runtime conv kernels (ConvMultiInput) get per-tensor Q/DQ with their own calibrated scale:
  per-channel on a non-constant kernel is not documented for TensorRT.
* The amax values used are embedded in the model's metadata (:mod:`.embedded`) so that
  ``table -> Q/DQ -> table`` is exact.
"""

from quantbench.qdq.extract import QdqScales, read_qdq_scales, table_from_qdq
from quantbench.qdq.placement import DEFAULT_OP_TYPES, QUANTIZABLE_INPUTS
from quantbench.qdq.plan import (
    ACTIVATION,
    RESIDUAL,
    RUNTIME_WEIGHT,
    WEIGHT,
    QdqInput,
    QuantizedNode,
    QuantizeResult,
    SkippedNode,
)
from quantbench.qdq.quantize import quantize_model, write_quantized
from quantbench.qdq.strip import strip_qdq

__all__ = [
    "ACTIVATION",
    "DEFAULT_OP_TYPES",
    "QUANTIZABLE_INPUTS",
    "RESIDUAL",
    "RUNTIME_WEIGHT",
    "WEIGHT",
    "QdqInput",
    "QdqScales",
    "QuantizeResult",
    "QuantizedNode",
    "SkippedNode",
    "quantize_model",
    "read_qdq_scales",
    "strip_qdq",
    "table_from_qdq",
    "write_quantized",
]
