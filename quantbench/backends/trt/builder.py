"""ONNX -> serialized TensorRT engine, for TensorRT 8.6, 10.x and 11.x.

:func:`plan_build` is the version gate: a pure function from (TensorRT features, requested
precision) to the network-creation and builder flags, raising a QuantbenchError that says what to
do when the version cannot build what was asked (implicit INT8 or FP16 on TensorRT 11, strong
typing on 8.6, ...). :func:`build_engine` then drives the TensorRT API: plugin libraries, ONNX
parser (one line per parser error), optimization profile, calibration, timing cache.
:func:`build` is the Python twin of ``quantbench build``: flags in, engine file out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from quantbench.backends.trt.calibrator import (
    Batch,
    CalibratorBase,
    base_for_cache,
    make_calibrator,
    raise_for_calibration,
)
from quantbench.backends.trt.device import DeviceAllocator
from quantbench.backends.trt.log import last_error, make_logger
from quantbench.backends.trt.version import TrtFeatures, features_of, import_tensorrt
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path, write_bytes_atomic

Precision = Literal["fp32", "fp16", "int8-implicit", "int8-qdq"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8-implicit", "int8-qdq")
ShapeRange = tuple[Sequence[int], Sequence[int], Sequence[int]]
TableEncoder = Callable[[Path, str], bytes]


@dataclass(frozen=True)
class BuildPlan:
    """Flags, by their TensorRT enum member names, that a build of one precision needs."""

    precision: str
    network_flags: tuple[str, ...]  # NetworkDefinitionCreationFlag members
    builder_flags: tuple[str, ...]  # BuilderFlag members
    strongly_typed: bool  # the network is strongly typed (flag set, or TensorRT >= 11)
    calibrate: bool  # attach an IInt8Calibrator


def plan_build(
    features: TrtFeatures,
    precision: str,
    *,
    strongly_typed: bool | None = None,
    allow_fp16: bool = False,
) -> BuildPlan:
    """Decide the flags for ``precision`` on this TensorRT, or explain why it cannot be built.

    ``strongly_typed=None`` picks the natural mode: strongly typed for Q/DQ models where TensorRT
    supports it (precision then comes from the model alone), weakly typed otherwise.
    ``allow_fp16`` lets an INT8 build run the non-INT8 layers in FP16 (BuilderFlag.FP16), which
    only a weakly typed network on TensorRT < 11 can do.
    """
    if precision not in PRECISIONS:
        raise QuantbenchError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")
    if allow_fp16 and precision not in ("int8-implicit", "int8-qdq"):
        raise QuantbenchError("allow_fp16 applies to INT8 builds; for FP16 use precision 'fp16'")
    typed = _strong_typing(features, precision, strongly_typed, allow_fp16)
    network_flags = ["EXPLICIT_BATCH"] if features.explicit_batch_flag else []
    if typed and features.strongly_typed_flag:
        network_flags.append("STRONGLY_TYPED")
    builder_flags: list[str] = []
    if precision == "fp16":
        builder_flags.append("FP16")
    elif precision == "int8-implicit" or (precision == "int8-qdq" and not typed):
        builder_flags.append("INT8")
        if allow_fp16:
            builder_flags.append("FP16")
    return BuildPlan(
        precision=precision,
        network_flags=tuple(network_flags),
        builder_flags=tuple(builder_flags),
        strongly_typed=typed,
        calibrate=precision == "int8-implicit",
    )


def _strong_typing(
    features: TrtFeatures, precision: str, requested: bool | None, allow_fp16: bool
) -> bool:
    """Whether the network is strongly typed, raising when the request is impossible."""
    needs_precision_flags = precision in ("fp16", "int8-implicit") or allow_fp16
    if precision == "int8-implicit":
        features.require("implicit_int8", features.implicit_int8)
    if precision == "int8-qdq":
        features.require("explicit_qdq", features.explicit_qdq)
    if precision == "fp16" or allow_fp16:
        features.require("fp16_flag", features.fp16_flag)
    if features.always_strongly_typed:
        if requested is False:
            raise QuantbenchError(features.explain_missing("weakly_typed"))
        return True
    if requested is None:
        return precision == "int8-qdq" and features.strongly_typed_flag and not allow_fp16
    if requested:
        features.require("strongly_typed", features.strongly_typed_flag)
        if needs_precision_flags:
            raise QuantbenchError(
                "a strongly typed network takes its precision from the model: TensorRT disables "
                "the FP16/INT8 builder flags there; build with strongly_typed=False"
            )
    return bool(requested)


# -- plugins and parsing ----------------------------------------------------------------------


def load_plugins(trt: ModuleType, logger: Any, libraries: Iterable[str | os.PathLike[str]]) -> None:
    """Register TensorRT's bundled plugins and load each plugin library into the registry."""
    if hasattr(trt, "init_libnvinfer_plugins"):  # absent from lean/dispatch runtime wheels
        trt.init_libnvinfer_plugins(logger, "")
    for library in libraries:
        path = Path(library)
        if not path.is_file():
            raise QuantbenchError(f"{path}: plugin library not found")
        handle = trt.get_plugin_registry().load_library(str(path))
        if handle is None:
            raise QuantbenchError(
                f"{path}: TensorRT could not load the plugin library: {last_error(logger)}"
            )


class ParseFailed(QuantbenchError):
    """The ONNX parser rejected the model; ``errors`` holds one line per parser error."""

    def __init__(self, model: Path, errors: list[str]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {line}" for line in errors)
        super().__init__(
            f"{model}: TensorRT could not parse the model ({len(errors)} error(s)):\n{lines}"
        )


def parser_error_lines(parser: Any, features: TrtFeatures, model: Path) -> list[str]:
    """``node 'Conv_3' (Conv): <desc>`` for every error the parser recorded."""
    node_names: list[str] | None = None
    lines = []
    for index in range(parser.num_errors):
        error = parser.get_error(index)
        node_index = int(error.node())
        if features.parser_error_node_name:
            name, op = str(error.node_name()), str(error.node_operator())
        else:  # TensorRT 8.6 gives only the node's index: look its name up in the model.
            if node_names is None:
                node_names = _onnx_node_names(model)
            name = node_names[node_index] if 0 <= node_index < len(node_names) else ""
            op = ""
        where = (
            f"node {name!r}" if name else (f"node #{node_index}" if node_index >= 0 else "model")
        )
        lines.append(f"{where}{f' ({op})' if op else ''}: {error.desc()}")
    return lines


def _onnx_node_names(model: Path) -> list[str]:
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return [
        node.name or (f"node_of_{node.output[0]}" if node.output else "") for node in graph.node
    ]


# -- shapes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkInput:
    name: str
    shape: tuple[int, ...]
    dtype: Any  # trt.DataType

    @property
    def dynamic(self) -> bool:
        return any(dim < 0 for dim in self.shape)


def network_inputs(network: Any) -> list[NetworkInput]:
    inputs = []
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        inputs.append(
            NetworkInput(str(tensor.name), tuple(int(d) for d in tensor.shape), tensor.dtype)
        )
    return inputs


def check_shape_ranges(
    inputs: Sequence[NetworkInput], shapes: Mapping[str, ShapeRange] | None
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Validate ``shapes`` (name -> (min, opt, max)) against the network's inputs."""
    shapes = dict(shapes or {})
    by_name = {inp.name: inp for inp in inputs}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise QuantbenchError(
            f"shapes given for unknown input(s) {unknown}; inputs are {sorted(by_name)}"
        )
    missing = [inp.name for inp in inputs if inp.dynamic and inp.name not in shapes]
    if missing:
        detail = ", ".join(f"{n} {list(by_name[n].shape)}" for n in missing)
        raise QuantbenchError(f"dynamic input(s) {detail} need a shape range (min, opt, max)")
    checked = {}
    for name, triple in shapes.items():
        if len(triple) != 3:
            raise QuantbenchError(f"input {name!r}: give three shapes (min, opt, max)")
        low, opt, high = (tuple(int(d) for d in s) for s in triple)
        rank = len(by_name[name].shape)
        if not len(low) == len(opt) == len(high) == rank:
            raise QuantbenchError(f"input {name!r}: shapes must have rank {rank}")
        if any(not (a <= b <= c) for a, b, c in zip(low, opt, high, strict=True)):
            raise QuantbenchError(f"input {name!r}: need min <= opt <= max, got {low} {opt} {high}")
        fixed = by_name[name].shape
        if any(
            f >= 0 and not (a == b == c == f)
            for f, a, b, c in zip(fixed, low, opt, high, strict=True)
        ):
            raise QuantbenchError(
                f"input {name!r}: shape range {opt} changes static dims of {list(fixed)}"
            )
        checked[name] = (low, opt, high)
    return checked


def _calibration_metadata(
    trt: ModuleType, inputs: Sequence[NetworkInput], ranges: Mapping[str, Any]
) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Per input, the dtype and the shape TensorRT calibrates at (the profile's OPT shape)."""
    metadata = {}
    for inp in inputs:
        try:
            dtype = np.dtype(trt.nptype(inp.dtype))
        except TypeError:  # bf16 / fp8 inputs have no NumPy type: skip the check
            continue
        metadata[inp.name] = (dtype, ranges[inp.name][1] if inp.name in ranges else inp.shape)
    return metadata


def _has_qdq(trt: ModuleType, network: Any) -> bool:
    qdq_types = (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
    return any(network.get_layer(i).type in qdq_types for i in range(network.num_layers))


# -- the build --------------------------------------------------------------------------------


@dataclass
class BuildOutcome:
    engine: bytes
    plan: BuildPlan
    calibrator: Any = None
    warnings: list[str] = field(default_factory=list)


def build_engine(
    onnx_path: str | os.PathLike[str],
    *,
    precision: Precision = "fp32",
    table_bytes: bytes | None = None,
    calibrator: Any = None,
    shapes: Mapping[str, ShapeRange] | None = None,
    timing_cache: str | os.PathLike[str] | None = None,
    plugin_libraries: Sequence[str | os.PathLike[str]] = (),
    workspace_mb: int | None = None,
    strongly_typed: bool | None = None,
    allow_fp16: bool = False,
    detailed_profile: bool = True,
    trt_module: ModuleType | None = None,
    allocator: DeviceAllocator | None = None,
) -> bytes:
    """Build a serialized engine from ``onnx_path``; see :func:`build_engine_outcome`."""
    return build_engine_outcome(
        onnx_path,
        precision=precision,
        table_bytes=table_bytes,
        calibrator=calibrator,
        shapes=shapes,
        timing_cache=timing_cache,
        plugin_libraries=plugin_libraries,
        workspace_mb=workspace_mb,
        strongly_typed=strongly_typed,
        allow_fp16=allow_fp16,
        detailed_profile=detailed_profile,
        trt_module=trt_module,
        allocator=allocator,
    ).engine


def build_engine_outcome(
    onnx_path: str | os.PathLike[str],
    *,
    precision: Precision = "fp32",
    table_bytes: bytes | None = None,
    calibrator: Any = None,
    shapes: Mapping[str, ShapeRange] | None = None,
    timing_cache: str | os.PathLike[str] | None = None,
    plugin_libraries: Sequence[str | os.PathLike[str]] = (),
    workspace_mb: int | None = None,
    strongly_typed: bool | None = None,
    allow_fp16: bool = False,
    detailed_profile: bool = True,
    trt_module: ModuleType | None = None,
    allocator: DeviceAllocator | None = None,
) -> BuildOutcome:
    """Build an engine and return it with the plan used and the calibrator (for its stats).

    int8-implicit needs ``calibrator`` (from :func:`make_calibrator`) or ``table_bytes`` (a
    TensorRT calibration cache; the matching calibrator base is read off its header and TensorRT
    skips calibration). ``detailed_profile`` sets ProfilingVerbosity.DETAILED so the engine
    inspector can report each layer's tensors and precision.
    """
    model = Path(onnx_path)
    if not model.is_file():
        raise QuantbenchError(f"{model}: ONNX model not found")
    trt = trt_module if trt_module is not None else import_tensorrt()
    features = features_of(trt)
    plan = plan_build(features, precision, strongly_typed=strongly_typed, allow_fp16=allow_fp16)
    calibrator = _resolve_calibrator(trt, plan, calibrator, table_bytes, allocator)

    logger = make_logger(trt)
    load_plugins(trt, logger, plugin_libraries)
    builder = trt.Builder(logger)
    network = builder.create_network(
        _flag_bits(trt.NetworkDefinitionCreationFlag, plan.network_flags)
    )
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        raise ParseFailed(
            model, parser_error_lines(parser, features, model) or [last_error(logger)]
        )
    _check_quantization(trt, network, plan, model)

    config = builder.create_builder_config()
    for flag in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if workspace_mb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    if detailed_profile:
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    inputs = network_inputs(network)
    ranges = check_shape_ranges(inputs, shapes)
    profile = _add_profile(builder, config, ranges)
    if plan.calibrate:
        _attach_calibrator(trt, config, calibrator, profile, inputs, ranges)
    cache = _load_timing_cache(config, timing_cache)

    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if hasattr(calibrator, "release"):  # free calibration buffers, whatever TensorRT did
            calibrator.release()
    if calibrator is not None:
        raise_for_calibration(calibrator)
    if serialized is None:
        raise QuantbenchError(f"{model}: TensorRT could not build the engine: {last_error(logger)}")
    if timing_cache is not None and cache is not None:
        write_bytes_atomic(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    engine = bytes(memoryview(serialized))
    return BuildOutcome(engine, plan, calibrator, list(logger.warnings))


def _flag_bits(enum: Any, names: Sequence[str]) -> int:
    bits = 0
    for name in names:
        bits |= 1 << int(getattr(enum, name))
    return bits


def _resolve_calibrator(
    trt: ModuleType,
    plan: BuildPlan,
    calibrator: Any,
    table_bytes: bytes | None,
    allocator: DeviceAllocator | None,
) -> Any:
    if not plan.calibrate:
        if calibrator is not None or table_bytes is not None:
            raise QuantbenchError(
                "a calibration table/calibrator applies to int8-implicit builds, not "
                f"{plan.precision} (a Q/DQ model carries its own scales)"
            )
        return None
    if calibrator is not None and table_bytes is not None:
        raise QuantbenchError(
            "give either a calibrator or table_bytes, not both "
            "(pass the table to make_calibrator as cache_bytes)"
        )
    if calibrator is not None:
        return calibrator
    if table_bytes is None:
        raise QuantbenchError("int8-implicit needs a calibration table or calibration data")
    return make_calibrator(trt, base_for_cache(table_bytes), None, table_bytes, allocator=allocator)


def _check_quantization(trt: ModuleType, network: Any, plan: BuildPlan, model: Path) -> None:
    has_qdq = _has_qdq(trt, network)
    if plan.precision == "int8-qdq" and not has_qdq:
        raise QuantbenchError(
            f"{model}: no QuantizeLinear/DequantizeLinear nodes; quantize it first "
            "(quantbench quantize) or build int8-implicit with a calibration table"
        )
    if plan.precision == "int8-implicit" and has_qdq:
        raise QuantbenchError(
            f"{model}: has Q/DQ nodes, and TensorRT ignores a calibrator on such a network; "
            "build it as int8-qdq"
        )


def _add_profile(builder: Any, config: Any, ranges: Mapping[str, Any]) -> Any:
    if not ranges:
        return None
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in ranges.items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    return profile


def _attach_calibrator(
    trt: ModuleType,
    config: Any,
    calibrator: Any,
    profile: Any,
    inputs: Sequence[NetworkInput],
    ranges: Mapping[str, Any],
) -> None:
    if hasattr(calibrator, "set_input_metadata"):
        calibrator.set_input_metadata(_calibration_metadata(trt, inputs, ranges))
    config.int8_calibrator = calibrator
    if profile is not None:  # TensorRT calibrates at the OPT shape of this profile
        config.set_calibration_profile(profile)


def _load_timing_cache(config: Any, path: str | os.PathLike[str] | None) -> Any:
    if path is None:
        return None
    check_output_path(path)
    existing = Path(path).read_bytes() if Path(path).is_file() else b""
    cache = config.create_timing_cache(existing)
    config.set_timing_cache(cache, False)
    return cache


# -- engine files and the `quantbench build` twin ---------------------------------------------


def save_engine(path: str | os.PathLike[str], engine: bytes) -> Path:
    return write_bytes_atomic(path, engine)


def load_engine(path: str | os.PathLike[str]) -> bytes:
    engine_path = Path(path)
    if not engine_path.is_file():
        raise QuantbenchError(f"{engine_path}: engine file not found")
    return engine_path.read_bytes()


@dataclass(frozen=True)
class BuildResult:
    engine_path: Path
    precision: str
    trt_version: str
    strongly_typed: bool
    calibration_batches: int | None
    engine_bytes: int
    warnings: tuple[str, ...] = ()


def select_precision(*, int8: bool, qdq: bool, fp16: bool) -> tuple[Precision, bool]:
    """Map ``quantbench build`` flags to (precision, allow_fp16)."""
    if qdq:
        return "int8-qdq", fp16
    if int8:
        return "int8-implicit", fp16
    return ("fp16" if fp16 else "fp32"), False


def read_table_for_trt(
    table: str | os.PathLike[str], trt_version: str, encoder: TableEncoder | None = None
) -> bytes:
    """Bytes of a TensorRT calibration cache from ``table``.

    A file that already is a cache (``TRT-`` header) is used verbatim; any other table format
    goes through ``encoder(path, trt_version)`` (quantbench's trt-cache codec, wired by the CLI).
    """
    path = Path(table)
    if not path.is_file():
        raise QuantbenchError(f"{path}: calibration table not found")
    data = path.read_bytes()
    if data.startswith(b"TRT-"):
        return data
    if encoder is None:
        raise QuantbenchError(
            f"{path}: not a TensorRT calibration cache (no 'TRT-' header); "
            "convert the table to the trt-cache format first"
        )
    return encoder(path, trt_version)


def build(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    int8: bool = False,
    table: str | os.PathLike[str] | None = None,
    qdq: bool = False,
    fp16: bool = False,
    calibration_data: Iterable[Batch] | None = None,
    calibrator_base: CalibratorBase | None = None,
    calibration_cache_out: str | os.PathLike[str] | None = None,
    shapes: Mapping[str, ShapeRange] | None = None,
    timing_cache: str | os.PathLike[str] | None = None,
    plugin_libraries: Sequence[str | os.PathLike[str]] = (),
    workspace_mb: int | None = None,
    strongly_typed: bool | None = None,
    table_encoder: TableEncoder | None = None,
    trt_module: ModuleType | None = None,
    allocator: DeviceAllocator | None = None,
) -> BuildResult:
    """Build ``model`` into the engine file ``out`` (written atomically); ``quantbench build``.

    ``qdq``: the model has Q/DQ nodes (explicit quantization, TensorRT 8.6-11). ``int8``: implicit
    INT8 from ``table`` and/or ``calibration_data`` (TensorRT <= 10). ``fp16``: FP16 build, or FP16
    for the non-INT8 layers of an INT8 build (weakly typed, TensorRT <= 10).
    """
    out_path = check_output_path(out)
    precision, allow_fp16 = select_precision(int8=int8, qdq=qdq, fp16=fp16)
    trt = trt_module if trt_module is not None else import_tensorrt()
    version = str(getattr(trt, "__version__", ""))
    if precision != "int8-implicit" and (table is not None or calibration_data is not None):
        raise QuantbenchError(
            "a calibration table/data applies to implicit INT8 (int8 without qdq)"
        )
    table_bytes = read_table_for_trt(table, version, table_encoder) if table is not None else None
    calibrator = None
    if calibration_data is not None:
        base = calibrator_base or (base_for_cache(table_bytes) if table_bytes else "entropy2")
        calibrator = make_calibrator(
            trt, base, calibration_data, table_bytes, calibration_cache_out, allocator=allocator
        )
        table_bytes = None
    outcome = build_engine_outcome(
        model,
        precision=precision,
        table_bytes=table_bytes,
        calibrator=calibrator,
        shapes=shapes,
        timing_cache=timing_cache,
        plugin_libraries=plugin_libraries,
        workspace_mb=workspace_mb,
        strongly_typed=strongly_typed,
        allow_fp16=allow_fp16,
        trt_module=trt,
        allocator=allocator,
    )
    save_engine(out_path, outcome.engine)
    served = getattr(outcome.calibrator, "batches_served", None)
    return BuildResult(
        out_path,
        precision,
        version,
        outcome.plan.strongly_typed,
        served,
        len(outcome.engine),
        tuple(outcome.warnings),
    )
