"""CalibrationTable: the per-tensor amax every calibrator produces, plus where it came from.

Codecs (one module each) turn a table into the files other tools read:
``trt_cache`` (TensorRT's native ``TRT-<version>-<Algo>`` cache), ``json_table`` (ours, lossless)
and ``ort_flatbuffers`` (onnxruntime's TensorRT execution provider).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

INT8_MAX = 127
#: the smallest normal float32: a smaller (subnormal) scale may be flushed to zero on a GPU
FLT_TINY = float(np.finfo(np.float32).tiny)


def scale_from_amax(amax: float) -> np.float32:
    """Symmetric INT8 scale, computed in float32 as TensorRT does (amax / 127)."""
    return np.float32(amax) / np.float32(INT8_MAX)


def amax_from_scale(scale: float) -> float:
    return float(np.float32(scale) * np.float32(INT8_MAX))


@dataclass
class TableEntry:
    """One tensor's range. ``scale`` is the float32 value a TensorRT cache stores.

    A table read from a cache keeps the cache's exact scale bits in ``exact_scale`` (127 * scale
    does not always survive the trip back through float32), so read-then-write is byte-identical.
    """

    amax: float
    method: str = ""
    exact_scale: np.float32 | None = None

    @classmethod
    def from_scale(cls, scale: float, method: str = "") -> TableEntry:
        s = np.float32(scale)
        return cls(amax=amax_from_scale(s), method=method, exact_scale=s)

    @property
    def scale(self) -> np.float32:
        if self.exact_scale is not None:
            return np.float32(self.exact_scale)
        return scale_from_amax(self.amax)

    def problem(self) -> str | None:
        """Why this entry gives no usable Q/DQ scale, as "amax ... is/gives ...", else None.

        Zero is not a problem: a tensor zero in every sample (TensorRT writes ``0`` for it),
        which quantize leaves in high precision. A positive amax whose float32 scale is
        subnormal or 0 is: a GPU may flush it to zero (the weight path refuses those too).
        """
        amax = self.amax
        for bad, word in ((math.isnan(amax), "NaN"), (amax < 0, "negative")):
            if bad:
                return f"amax {amax!r} is {word}"
        if math.isinf(amax):
            return f"amax {amax!r} is infinite (127 x scale overflows float32)"
        if amax == 0:
            return None
        with np.errstate(over="ignore", under="ignore"):
            scale = float(self.scale)
        if scale == 0:
            return f"amax {amax!r} gives an FP32 scale (amax / 127) that underflows to 0"
        if scale < FLT_TINY:
            return (
                f"amax {amax!r} gives a subnormal FP32 scale ({scale:.3g}; the smallest usable "
                f"amax is {FLT_TINY * INT8_MAX:.2g})"
            )
        if math.isinf(scale):
            return f"amax {amax!r} gives an FP32 scale beyond the float32 range"
        return None

    @property
    def is_valid(self) -> bool:
        """Usable for quantization: finite and strictly positive."""
        return math.isfinite(self.amax) and self.amax > 0


@dataclass
class Provenance:
    """Where a table came from, so a table cannot silently be applied to another model."""

    model_hash: str = ""
    data_fingerprint: str = ""
    num_samples: int = 0
    tool_version: str = ""
    trt_version: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "model_hash": self.model_hash,
            "data_fingerprint": self.data_fingerprint,
            "num_samples": self.num_samples,
            "tool_version": self.tool_version,
            "trt_version": self.trt_version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Provenance:
        return cls(
            model_hash=str(d.get("model_hash", "")),
            data_fingerprint=str(d.get("data_fingerprint", "")),
            num_samples=int(d.get("num_samples", 0) or 0),
            tool_version=str(d.get("tool_version", "")),
            trt_version=str(d.get("trt_version", "")),
        )


@dataclass
class CalibrationTable:
    """Ordered mapping tensor name -> :class:`TableEntry` (insertion order is kept on disk).

    ``algorithm`` is the TensorRT algorithm token written in a cache header
    (``EntropyCalibration2`` or ``MinMaxCalibration``); ``method`` is the quantbench calibrator
    name that produced the values (``entropy``, ``percentile:99.99`` ...).
    """

    entries: dict[str, TableEntry] = field(default_factory=dict)
    method: str = ""
    algorithm: str = "EntropyCalibration2"
    provenance: Provenance = field(default_factory=Provenance)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self):
        return iter(self.entries)

    def amax(self, name: str) -> float:
        return self.entries[name].amax

    def scale(self, name: str) -> np.float32:
        return self.entries[name].scale

    def set(self, name: str, amax: float, method: str | None = None) -> None:
        self.entries[name] = TableEntry(float(amax), method if method is not None else self.method)

    def amaxes(self) -> dict[str, float]:
        return {name: e.amax for name, e in self.entries.items()}

    def origin(self) -> str:
        """How the table says it was made, in one phrase: the method where it records one;
        a TensorRT cache records only its header's algorithm, which quantbench writes as
        EntropyCalibration2 for every method but minmax, so that is all it can say."""
        if self.method:
            return f"method {self.method}"
        if self.provenance.trt_version:
            return (
                f"TensorRT {self.provenance.trt_version} cache, algorithm {self.algorithm} "
                "(caches record no method; quantbench writes EntropyCalibration2 for all but "
                "minmax, its JSON tables record the method)"
            )
        return "method not recorded"

    def invalid(self) -> list[str]:
        """Tensors whose amax is zero, negative, Inf or NaN."""
        return [name for name, e in self.entries.items() if not e.is_valid]
