"""quantbench: INT8 calibration and explicit quantization for TensorRT and ONNX models.

The public Python API lives in :mod:`quantbench.api`; every CLI command has a twin there.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
