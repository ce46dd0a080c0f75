"""Lazy TensorRT import and what each TensorRT version can and cannot do.

TensorRT's Python API changed shape twice in the versions quantbench supports: 10.0 made every
network explicit-batch and added IPluginV3, 11.0 removed implicit INT8 (the IInt8Calibrator family,
``BuilderFlag.INT8/FP16``, ``IBuilderConfig.int8_calibrator``) and made every network strongly
typed. Code asks :class:`TrtFeatures` instead of comparing version numbers at each call site, and
:meth:`TrtFeatures.explain_missing` turns a missing feature into a message that says what to do.

Sources (read from NVIDIA/TensorRT tags v8.6.1, v9.0.1, v10.0.1, v10.16, v11.1): include/NvInfer.h
``NetworkDefinitionCreationFlag`` (kSTRONGLY_TYPED first in 9.0; deprecated and ignored in 11.0),
python/src/infer/pyInt8.cpp (absent in 11.x), pyCore.cpp ``BuilderFlag`` values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from quantbench.errors import QuantbenchError
from quantbench.table.trt_cache import trt_version_int

INSTALL_HINT = "TensorRT is not installed: pip install 'quantbench[tensorrt]' (needs an NVIDIA GPU)"
MIN_SUPPORTED = (8, 6)

_VERSION_RE = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class TrtVersion:
    """A TensorRT version as ``tensorrt.__version__`` spells it (``10.3.0.26``, ``8.6.1.post1``)."""

    major: int
    minor: int = 0
    patch: int = 0
    build: int = 0

    @classmethod
    def parse(cls, text: str) -> TrtVersion:
        match = _VERSION_RE.match(str(text))
        if match is None:
            raise QuantbenchError(f"cannot read a TensorRT version from {text!r} (expected 10.3.0)")
        major, minor, patch, build = (int(part) if part else 0 for part in match.groups())
        return cls(major, minor, patch, build)

    @property
    def header_number(self) -> int:
        """``NV_TENSORRT_VERSION`` as a calibration-cache header writes it (``TRT-<n>-<Algo>``).

        M*1000+m*100+p up to 9.x, M*10000+m*100+p from 10.0 (NvInferRuntimeBase.h of each tag);
        one rule, :func:`quantbench.table.trt_cache.trt_version_int`.
        """
        return trt_version_int(str(self))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True)
class TrtFeatures:
    """Feature gates of one TensorRT version; every flag names the API it stands for."""

    version: TrtVersion
    implicit_int8: bool  # BuilderFlag.INT8 + IBuilderConfig.int8_calibrator (< 11)
    calibrator_classes: bool  # trt.IInt8EntropyCalibrator2 & co. (< 11)
    calibration_profile: bool  # IBuilderConfig.set_calibration_profile (< 11)
    explicit_qdq: bool  # IQuantizeLayer / IDequantizeLayer from ONNX Q/DQ (>= 8.0)
    strongly_typed_flag: bool  # NetworkDefinitionCreationFlag.STRONGLY_TYPED honoured (9.x, 10.x)
    always_strongly_typed: bool  # every network is strongly typed, the flag is ignored (>= 11)
    explicit_batch_flag: bool  # EXPLICIT_BATCH must be passed to create_network (< 10)
    fp16_flag: bool  # BuilderFlag.FP16 (< 11)
    ipluginv3: bool  # IPluginV3 / IPluginCreatorV3One (>= 10)
    parser_error_node_name: bool  # ParserError.node_name() (>= 10.0; 8.6 has node() only)

    @classmethod
    def from_version(cls, version: str | TrtVersion) -> TrtFeatures:
        v = version if isinstance(version, TrtVersion) else TrtVersion.parse(version)
        major = v.major
        return cls(
            version=v,
            implicit_int8=major < 11,
            calibrator_classes=major < 11,
            calibration_profile=major < 11,
            explicit_qdq=major >= 8,
            strongly_typed_flag=9 <= major < 11,
            always_strongly_typed=major >= 11,
            explicit_batch_flag=major < 10,
            fp16_flag=major < 11,
            ipluginv3=major >= 10,
            parser_error_node_name=major >= 10,
        )

    @property
    def supported(self) -> bool:
        return (self.version.major, self.version.minor) >= MIN_SUPPORTED

    @property
    def can_be_strongly_typed(self) -> bool:
        return self.strongly_typed_flag or self.always_strongly_typed

    def explain_missing(self, feature: str) -> str:
        """One line saying what this version lacks for ``feature`` and what to use instead."""
        v = f"{self.version.major}.{self.version.minor}"
        messages = {
            "implicit_int8": (
                f"TensorRT {v} removed implicit INT8 (IInt8Calibrator, BuilderFlag.INT8): "
                "use the explicit Q/DQ model (quantbench quantize) instead"
            ),
            "calibrator_classes": (
                f"TensorRT {v} has no IInt8Calibrator classes (removed in 11.0): "
                "use the explicit Q/DQ model (quantbench quantize) instead"
            ),
            "fp16_flag": (
                f"TensorRT {v} removed BuilderFlag.FP16 (networks are always strongly typed): "
                "convert the ONNX model to FP16 first (for example ModelOpt AutoCast) and build "
                "it as fp32"
            ),
            "strongly_typed": (
                f"TensorRT {v} has no strongly typed networks (NetworkDefinitionCreationFlag."
                "STRONGLY_TYPED arrived in 9.0): build weakly typed (strongly_typed=False)"
            ),
            "weakly_typed": (
                f"TensorRT {v} networks are always strongly typed: precision comes from the ONNX "
                "model (Q/DQ nodes, FP16 tensors), strongly_typed=False is not possible"
            ),
            "explicit_qdq": (
                f"TensorRT {v} cannot import ONNX Q/DQ nodes (explicit quantization needs 8.0+)"
            ),
            "ipluginv3": (
                f"TensorRT {v} has no IPluginV3 (added in 10.0): use TensorRT 10 or newer for the "
                "DWConv2D plugin"
            ),
        }
        if feature not in messages:
            raise ValueError(f"unknown TensorRT feature {feature!r}")
        return messages[feature]

    def require(self, feature: str, available: bool) -> None:
        """Raise the :meth:`explain_missing` message as a QuantbenchError when not ``available``."""
        if not available:
            raise QuantbenchError(self.explain_missing(feature))


def import_tensorrt() -> ModuleType:
    """Import ``tensorrt`` on first use, with an install hint instead of a bare ImportError."""
    try:
        import tensorrt
    except ImportError as exc:
        raise QuantbenchError(INSTALL_HINT) from exc
    features = features_of(tensorrt)
    if not features.supported:
        raise QuantbenchError(
            f"TensorRT {features.version} is older than quantbench supports "
            f"({MIN_SUPPORTED[0]}.{MIN_SUPPORTED[1]} or newer): pip install -U tensorrt"
        )
    return tensorrt


def features_of(trt_module: ModuleType) -> TrtFeatures:
    """Features of an imported ``tensorrt`` module (or a test double with ``__version__``)."""
    return TrtFeatures.from_version(str(getattr(trt_module, "__version__", "0")))
