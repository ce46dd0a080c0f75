"""TEST DOUBLE of the small part of the ``tensorrt`` module quantbench's backend touches.

This is NOT TensorRT and produces no TensorRT results: it records which API calls quantbench makes
and drives a calibrator through the call sequence TensorRT documents for IInt8Calibrator
(reference §6.2, python/src/infer/pyInt8.cpp): ``get_batch_size``, ``read_calibration_cache``,
then -- only when that returned None -- ``get_batch(names)`` until None or ``[]``, then
``write_calibration_cache(memoryview)``; any exception inside is swallowed like the pybind
trampoline does. Names and their presence per version follow the bindings of NVIDIA/TensorRT tags
v8.6.1, v10.x and v11.1 (e.g. no calibrator classes, ``BuilderFlag.INT8/FP16`` or
``IBuilderConfig.int8_calibrator`` on 11.x; no ``STRONGLY_TYPED`` on 8.6; ``ParserError.node_name``
from 10.0). The "engine" it serializes is a JSON record of the configuration, and its runtime
"executes" a fixed ``y = x + 1`` so the runner's plumbing (shapes, addresses, copies) can be
checked -- it says nothing about TensorRT numerics.

Also provides :class:`FakeAllocator`, an in-memory stand-in for CUDA device memory.
"""

from __future__ import annotations

import enum
import json
import types
from typing import Any

import numpy as np
import onnx

# -- device memory ------------------------------------------------------------------------------


class FakeAllocator:
    """Device memory as a dict of bytearrays keyed by fake pointers (256-byte aligned)."""

    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}
        self.mallocs = 0
        self.frees = 0
        self.uploads = 0
        self._next = 0x10000
        self.streams: set[int] = set()

    def malloc(self, nbytes: int) -> int:
        ptr = self._next
        self._next += (nbytes + 255) // 256 * 256 + 256
        self.memory[ptr] = bytearray(nbytes)
        self.mallocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        del self.memory[ptr]  # KeyError on double free: a bug the tests should see
        self.frees += 1

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None:
        block = self.memory[dst]
        data = np.ascontiguousarray(src).tobytes()
        assert len(data) <= len(block), "host array larger than the device allocation"
        block[: len(data)] = data
        self.uploads += 1

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None:
        block = self.memory[src]
        flat = dst.reshape(-1).view(np.uint8)
        flat[:] = np.frombuffer(bytes(block[: dst.nbytes]), dtype=np.uint8)

    def read(self, ptr: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(dtype).itemsize
        return np.frombuffer(bytes(self.memory[ptr][:nbytes]), dtype=dtype).reshape(shape)

    def create_stream(self) -> int:
        handle = 0x5000 + len(self.streams)
        self.streams.add(handle)
        return handle

    def synchronize(self, stream: int) -> None:
        assert stream in self.streams

    def destroy_stream(self, stream: int) -> None:
        self.streams.remove(stream)

    @property
    def live(self) -> int:
        return len(self.memory)


# -- calibrator driving -------------------------------------------------------------------------


class CalibrationAlgoType(enum.IntEnum):
    LEGACY_CALIBRATION = 0
    ENTROPY_CALIBRATION = 1
    ENTROPY_CALIBRATION_2 = 2
    MINMAX_CALIBRATION = 3


def _calibrator_base(name: str, algo: CalibrationAlgoType) -> type:
    def __init__(self: Any) -> None:
        self._double_base_initialised = True

    def get_algorithm(self: Any) -> CalibrationAlgoType:
        return algo

    return type(name, (), {"__init__": __init__, "get_algorithm": get_algorithm})


def drive_calibration(
    calibrator: Any,
    names: list[str],
    allocator: FakeAllocator | None = None,
    shapes: dict[str, tuple[tuple[int, ...], Any]] | None = None,
    cache_to_write: bytes = b"TRT-double-EntropyCalibration2\n",
    max_batches: int = 1000,
) -> dict[str, Any]:
    """Call ``calibrator`` the way TensorRT's builder does; returns what it observed.

    When ``allocator`` and ``shapes`` (name -> (shape, dtype)) are given, the data behind each
    returned pointer is read back immediately, as TensorRT would.
    """
    assert getattr(calibrator, "_double_base_initialised", False), "base __init__ not called"
    seen: dict[str, Any] = {"batch_size": None, "pointers": [], "data": [], "swallowed": []}
    seen["batch_size"] = calibrator.get_batch_size()
    cache = calibrator.read_calibration_cache()
    seen["cache"] = None if cache is None else bytes(cache)
    if cache is None:
        for _ in range(max_batches):
            try:
                pointers = calibrator.get_batch(names)
            except Exception as exc:  # the trampoline prints and treats it as "done"
                seen["swallowed"].append(exc)
                break
            if not pointers:
                break
            assert len(pointers) == len(names), "trampoline memcpy's exactly len(names) pointers"
            assert all(isinstance(p, int) for p in pointers)
            seen["pointers"].append(list(pointers))
            if allocator is not None and shapes is not None:
                seen["data"].append(
                    {
                        n: allocator.read(p, shapes[n][1], shapes[n][0]).copy()
                        for n, p in zip(names, pointers, strict=True)
                    }
                )
        calibrator.write_calibration_cache(memoryview(cache_to_write))
    return seen


# -- the module ---------------------------------------------------------------------------------


class _Enum:
    """Namespace of int-valued members (pybind enums are ints with names)."""

    def __init__(self, **members: int) -> None:
        for key, value in members.items():
            setattr(self, key, value)


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    INT64 = 8


_NP_OF = {
    DataType.FLOAT: np.float32,
    DataType.HALF: np.float16,
    DataType.INT8: np.int8,
    DataType.INT32: np.int32,
    DataType.BOOL: np.bool_,
    DataType.INT64: np.int64,
}
_OF_ONNX = {
    1: DataType.FLOAT,
    10: DataType.HALF,
    3: DataType.INT8,
    6: DataType.INT32,
    7: DataType.INT64,
    9: DataType.BOOL,
}


def make_fake_tensorrt(version: str, allocator: FakeAllocator | None = None) -> types.ModuleType:
    """A module object shaped like ``tensorrt`` ``version`` for the parts quantbench uses."""
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt_double")
    trt.__version__ = version
    trt.calls = []  # (name, detail) in call order
    trt.built = []  # records of every build_serialized_network call
    trt.loaded_libraries = []
    record = trt.calls.append

    # enums ---------------------------------------------------------------------------------
    if major < 10:
        trt.NetworkDefinitionCreationFlag = _Enum(EXPLICIT_BATCH=0, EXPLICIT_PRECISION=1)
    elif major < 11:
        trt.NetworkDefinitionCreationFlag = _Enum(EXPLICIT_BATCH=0, STRONGLY_TYPED=1)
    else:
        trt.NetworkDefinitionCreationFlag = _Enum(STRONGLY_TYPED=0, PREFER_JIT_PYTHON_PLUGINS=1)
    if major == 9:  # 9.x: STRONGLY_TYPED = 2 after EXPLICIT_PRECISION (NvInfer.h v9.1.0)
        trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED = 2
    flags = {"DEBUG": 2, "GPU_FALLBACK": 3, "REFIT": 4, "TF32": 6}
    if major < 11:
        flags.update(FP16=0, INT8=1)
    trt.BuilderFlag = _Enum(**flags)
    trt.MemoryPoolType = _Enum(WORKSPACE=0)
    trt.ProfilingVerbosity = _Enum(LAYER_NAMES_ONLY=0, NONE=1, DETAILED=2)
    trt.LayerInformationFormat = _Enum(ONELINE=0, JSON=1)
    trt.TensorIOMode = _Enum(NONE=0, INPUT=1, OUTPUT=2)
    trt.LayerType = _Enum(CONVOLUTION=0, QUANTIZE=33, DEQUANTIZE=34, OTHER=99)
    trt.DataType = DataType
    trt.nptype = lambda dt: _NP_OF[DataType(dt)]

    # logger ------------------------------------------------------------------------------
    class ILogger:
        class Severity(enum.IntEnum):
            INTERNAL_ERROR = 0
            ERROR = 1
            WARNING = 2
            INFO = 3
            VERBOSE = 4

        def __init__(self) -> None:
            self._double_base_initialised = True

    trt.ILogger = ILogger

    # calibrators (gone in 11.x) -----------------------------------------------------------
    if major < 11:
        trt.CalibrationAlgoType = CalibrationAlgoType
        trt.IInt8Calibrator = _calibrator_base(
            "IInt8Calibrator", CalibrationAlgoType.ENTROPY_CALIBRATION_2
        )
        trt.IInt8EntropyCalibrator2 = _calibrator_base(
            "IInt8EntropyCalibrator2", CalibrationAlgoType.ENTROPY_CALIBRATION_2
        )
        trt.IInt8EntropyCalibrator = _calibrator_base(
            "IInt8EntropyCalibrator", CalibrationAlgoType.ENTROPY_CALIBRATION
        )
        trt.IInt8MinMaxCalibrator = _calibrator_base(
            "IInt8MinMaxCalibrator", CalibrationAlgoType.MINMAX_CALIBRATION
        )
        trt.IInt8LegacyCalibrator = _calibrator_base(
            "IInt8LegacyCalibrator", CalibrationAlgoType.LEGACY_CALIBRATION
        )

    # plugins ---------------------------------------------------------------------------------
    class PluginRegistry:
        def load_library(self, path: str) -> Any:
            record(("load_library", path))
            trt.loaded_libraries.append(path)
            return None if path.endswith("broken.so") else object()

    registry = PluginRegistry()
    trt.get_plugin_registry = lambda: registry
    trt.init_libnvinfer_plugins = lambda logger, namespace: record(
        ("init_libnvinfer_plugins", namespace)
    )

    # network + parser ------------------------------------------------------------------------
    class Tensor:
        def __init__(self, name: str, shape: tuple[int, ...], dtype: DataType) -> None:
            self.name, self.shape, self.dtype = name, shape, dtype

    class Layer:
        def __init__(self, name: str, layer_type: int) -> None:
            self.name, self.type = name, layer_type

    class Network:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.inputs: list[Tensor] = []
            self.layers: list[Layer] = []

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        def get_input(self, index: int) -> Tensor:
            return self.inputs[index]

        @property
        def num_layers(self) -> int:
            return len(self.layers)

        def get_layer(self, index: int) -> Layer:
            return self.layers[index]

    class ParserError:
        def __init__(self, node: int, name: str, op: str, desc: str) -> None:
            self._node, self._name, self._op, self._desc = node, name, op, desc

        def node(self) -> int:
            return self._node

        def desc(self) -> str:
            return self._desc

        if major >= 10:

            def node_name(self) -> str:
                return self._name

            def node_operator(self) -> str:
                return self._op

    class OnnxParser:
        def __init__(self, network: Network, logger: Any) -> None:
            self.network, self.errors = network, []

        def parse_from_file(self, path: str) -> bool:
            record(("parse_from_file", path))
            graph = onnx.load(path).graph
            initializers = {i.name for i in graph.initializer}
            for value in graph.input:
                if value.name in initializers:
                    continue
                tt = value.type.tensor_type
                shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                self.network.inputs.append(Tensor(value.name, shape, _OF_ONNX[tt.elem_type]))
            kinds = {
                "QuantizeLinear": trt.LayerType.QUANTIZE,
                "DequantizeLinear": trt.LayerType.DEQUANTIZE,
            }
            for index, node in enumerate(graph.node):
                if node.op_type.startswith("Unsupported"):
                    self.errors.append(
                        ParserError(
                            index,
                            node.name,
                            node.op_type,
                            f"No importer registered for op: {node.op_type}",
                        )
                    )
                self.network.layers.append(
                    Layer(node.name, kinds.get(node.op_type, trt.LayerType.OTHER))
                )
            return not self.errors

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, index: int) -> ParserError:
            return self.errors[index]

    trt.OnnxParser = OnnxParser

    # builder ---------------------------------------------------------------------------------
    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = bytes(data)

        def serialize(self) -> bytes:
            return self.data + b"+timed"

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[Any, Any, Any]] = {}

        def set_shape(self, name: str, low: Any, opt: Any, high: Any) -> None:
            self.shapes[name] = (tuple(low), tuple(opt), tuple(high))

    config_attributes = {"profiling_verbosity"} | ({"int8_calibrator"} if major < 11 else set())

    class BuilderConfig:
        def __init__(self) -> None:
            object.__setattr__(self, "state", {"flags": [], "pools": {}, "profiles": []})

        def __setattr__(self, key: str, value: Any) -> None:
            if key not in config_attributes:
                raise AttributeError(f"'IBuilderConfig' object has no attribute '{key}'")
            self.state[key] = value

        def __getattr__(self, key: str) -> Any:
            if key in config_attributes:
                return self.state.get(key)
            raise AttributeError(f"'IBuilderConfig' object has no attribute '{key}'")

        def set_flag(self, flag: int) -> None:
            self.state["flags"].append(flag)

        def set_memory_pool_limit(self, pool: int, size: int) -> None:
            self.state["pools"][pool] = size

        def add_optimization_profile(self, profile: Profile) -> int:
            self.state["profiles"].append(profile)
            return len(self.state["profiles"]) - 1

        def create_timing_cache(self, data: bytes) -> TimingCache:
            return TimingCache(data)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            self.state["timing_cache"] = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            return self.state["timing_cache"]

        if major < 11:

            def set_calibration_profile(self, profile: Profile) -> bool:
                self.state["calibration_profile"] = profile
                return True

    class Builder:
        def __init__(self, logger: Any) -> None:
            assert getattr(logger, "_double_base_initialised", False), (
                "ILogger base not initialised"
            )
            self.logger = logger

        def create_network(self, flags: int = 0) -> Network:
            record(("create_network", flags))
            return Network(flags)

        def create_builder_config(self) -> BuilderConfig:
            return BuilderConfig()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> Any:
            state = config.state
            calibrator = state.get("int8_calibrator")
            seen = None
            int8 = major < 11 and trt.BuilderFlag.INT8 in state["flags"]
            has_qdq = any(
                layer.type in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
                for layer in network.layers
            )
            if int8 and calibrator is not None and not has_qdq:
                shapes = {}
                profile = state.get("calibration_profile")
                for t in network.inputs:
                    shape = (
                        profile.shapes[t.name][1]
                        if profile and t.name in profile.shapes
                        else t.shape
                    )
                    shapes[t.name] = (shape, _NP_OF[t.dtype])
                seen = drive_calibration(
                    calibrator,
                    [t.name for t in network.inputs],
                    allocator,
                    shapes if allocator else None,
                )
            trt.built.append({"network_flags": network.flags, "state": state, "calibration": seen})
            if getattr(self, "fail_with", None):
                self.logger.log(ILogger.Severity.ERROR, self.fail_with)
                return None
            summary = {
                "inputs": [(t.name, list(t.shape), int(t.dtype)) for t in network.inputs],
                "flags": state["flags"],
                "double": True,
            }
            return memoryview(json.dumps(summary).encode())

    trt.Builder = Builder

    # runtime (y = x + 1 plumbing check) -------------------------------------------------------
    class Engine:
        def __init__(self, summary: dict[str, Any]) -> None:
            ((name, shape, dtype),) = summary["inputs"]
            self.io = [
                (name, tuple(shape), DataType(dtype), trt.TensorIOMode.INPUT),
                ("y", tuple(shape), DataType(dtype), trt.TensorIOMode.OUTPUT),
            ]

        @property
        def num_io_tensors(self) -> int:
            return len(self.io)

        def get_tensor_name(self, index: int) -> str:
            return self.io[index][0]

        def _find(self, name: str) -> tuple[Any, ...]:
            return next(t for t in self.io if t[0] == name)

        def get_tensor_mode(self, name: str) -> int:
            return self._find(name)[3]

        def get_tensor_dtype(self, name: str) -> DataType:
            return self._find(name)[2]

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self._find(name)[1]

        def create_execution_context(self) -> Context:
            return Context(self)

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine, self.shapes, self.addresses = engine, {}, {}

        def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
            declared = self.engine.get_tensor_shape(name)
            if any(d >= 0 and d != s for d, s in zip(declared, shape, strict=True)) or shape[0] > 8:
                return False
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            source = self.engine.io[0][0]
            return self.shapes.get(source, self.engine.get_tensor_shape(name))

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            record(("execute_async_v3", stream_handle))
            name, _, dtype, _ = self.engine.io[0]
            shape = self.shapes[name]
            x = allocator.read(self.addresses[name], _NP_OF[dtype], shape)
            allocator.memcpy_htod(self.addresses["y"], (x + 1).astype(_NP_OF[dtype]))
            return True

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            try:
                summary = json.loads(bytes(data))
            except ValueError:
                self.logger.log(ILogger.Severity.ERROR, "double: not a serialized engine")
                return None
            return Engine(summary)

    trt.Runtime = Runtime
    return trt
