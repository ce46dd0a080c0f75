"""quantbench: INT8 calibration and explicit quantization for TensorRT and ONNX models.

Every CLI command has a Python twin in the module of its concept
(``quantbench.calibrate.calibrate``, ``quantbench.quantize.quantize``,
``quantbench.compare.compare``, ...): the README's "Python API" section lists them, and a test
imports each name it gives.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
