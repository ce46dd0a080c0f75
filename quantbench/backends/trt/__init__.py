"""TensorRT backend internals, one concept per module.

``version`` (lazy import, feature gates), ``device`` (CUDA memory through cuda-python or pycuda),
``calibrator`` (the IInt8Calibrator adapter), ``builder`` (ONNX -> engine), ``runner`` (inference)
and ``inspector`` (engine-layer JSON -> ONNX nodes). None of them imports TensorRT at import time:
:func:`quantbench.backends.trt.version.import_tensorrt` does, where TensorRT is really needed.
The public surface is :mod:`quantbench.backends.tensorrt`.
"""
