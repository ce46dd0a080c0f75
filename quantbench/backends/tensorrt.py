"""quantbench's TensorRT backend (optional: ``pip install 'quantbench[tensorrt]'``).

Importing this module never imports TensorRT; functions that need it call
:func:`import_tensorrt`, which raises a QuantbenchError with the install hint when it is absent.
Supports TensorRT 8.6, 10.x and 11.x (11 dropped implicit INT8: build Q/DQ models there).

- build an engine: :func:`build` (the ``quantbench build`` twin), :func:`build_engine`
- calibrate implicitly (TensorRT <= 10): :func:`make_calibrator`
- run it: :class:`TensorRTRunner`
- see what it runs: :func:`engine_graph_json`, :func:`engine_layers`, :func:`map_layers_to_onnx`,
  :func:`parse_profile`, :func:`join_profile`
"""

from __future__ import annotations

from quantbench.backends.trt.builder import (
    BuildPlan,
    BuildResult,
    ParseFailed,
    build,
    build_engine,
    build_engine_outcome,
    load_engine,
    plan_build,
    save_engine,
    select_precision,
)
from quantbench.backends.trt.calibrator import (
    BASE_CLASS_NAMES,
    CalibrationFeed,
    base_for_cache,
    make_calibrator,
    raise_for_calibration,
)
from quantbench.backends.trt.device import (
    CudartAllocator,
    DeviceAllocator,
    DeviceBuffer,
    PycudaAllocator,
    default_allocator,
)
from quantbench.backends.trt.inspector import (
    EngineLayer,
    EngineProfile,
    LayerMapping,
    comparable_tensors,
    engine_graph_json,
    engine_layers,
    join_profile,
    map_layers_to_onnx,
    parse_layer_name,
    parse_precision,
    parse_profile,
    precision_counts,
)
from quantbench.backends.trt.runner import TensorRTRunner
from quantbench.backends.trt.version import (
    INSTALL_HINT,
    TrtFeatures,
    TrtVersion,
    features_of,
    import_tensorrt,
)

__all__ = [
    "BASE_CLASS_NAMES",
    "INSTALL_HINT",
    "BuildPlan",
    "BuildResult",
    "CalibrationFeed",
    "CudartAllocator",
    "DeviceAllocator",
    "DeviceBuffer",
    "EngineLayer",
    "EngineProfile",
    "LayerMapping",
    "ParseFailed",
    "PycudaAllocator",
    "TensorRTRunner",
    "TrtFeatures",
    "TrtVersion",
    "base_for_cache",
    "build",
    "build_engine",
    "build_engine_outcome",
    "comparable_tensors",
    "default_allocator",
    "engine_graph_json",
    "engine_layers",
    "features_of",
    "import_tensorrt",
    "join_profile",
    "load_engine",
    "make_calibrator",
    "map_layers_to_onnx",
    "parse_layer_name",
    "parse_precision",
    "parse_profile",
    "plan_build",
    "precision_counts",
    "raise_for_calibration",
    "save_engine",
    "select_precision",
]
