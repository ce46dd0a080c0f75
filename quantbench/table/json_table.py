"""quantbench's own JSON table (lossless) and a reader for onnxruntime's JSON tables.

Ours keeps everything a :class:`CalibrationTable` holds: entry order, amax as Python's shortest
round-tripping repr, the exact float32 scale bits, methods, algorithm and provenance. NaN and
infinities are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (:mod:`quantbench.jsonsafe`,
as in every quantbench JSON) so the file stays strict JSON; the earlier spellings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` are still read. The same table always gives the same bytes.

onnxruntime writes ranges, not amax: ``{name: [min, max]}`` (ORT ~1.11) or TensorData dicts with
``lowest``/``highest`` (newer ``write_calibration_table`` / ``save_tensors_data``). They are read
as ``amax = max(|lo|, |hi|)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.jsonsafe import NONFINITE_TEXT, json_float
from quantbench.table import (
    CalibrationTable,
    Provenance,
    TableEntry,
    amax_from_scale,
    scale_from_amax,
)
from quantbench.table.trt_cache import hex_to_scale, scale_bits, scale_to_hex

FORMAT_TAG = "quantbench-table"
FORMAT_VERSION = 1

# Written as quantbench.jsonsafe spells them; tables written before that used these spellings.
_LEGACY_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

# CalibrationMethod names in onnxruntime's TensorsData JSON -> quantbench method names.
_ORT_METHODS = {
    "MinMax": "minmax",
    "Entropy": "entropy",
    "Percentile": "percentile",
    "Distribution": "distribution",
}


def _float_out(value: float) -> float | str:
    return json_float(value)


def _same_float(a: float, b: float) -> bool:
    """Equal, with NaN equal to NaN (a NaN amax must still round-trip)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def _entry_out(entry: TableEntry) -> dict[str, Any]:
    return {
        "amax": _float_out(entry.amax),
        "scale": _float_out(entry.scale),
        "scale_hex": scale_to_hex(entry.scale),
        "method": entry.method,
    }


def encode_json_table(table: CalibrationTable) -> bytes:
    """Deterministic UTF-8 JSON (2-space indent, names unescaped, trailing newline)."""
    document = {
        "format": FORMAT_TAG,
        "version": FORMAT_VERSION,
        "method": table.method,
        "algorithm": table.algorithm,
        "provenance": table.provenance.to_dict(),
    }
    with np.errstate(over="ignore"):  # an amax beyond float32 has an infinite scale
        document["tensors"] = {name: _entry_out(e) for name, e in table.entries.items()}
    try:
        text = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False)
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QuantbenchError(f"a tensor name is not valid Unicode text: {exc}") from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise QuantbenchError(f"key {key!r} appears twice in one JSON object")
        obj[key] = value
    return obj


def load_json(data: bytes, source: str) -> Any:
    """Parse JSON; duplicate keys (a tensor listed twice) are an error, not last-wins.

    Bare NaN/Infinity tokens are accepted: onnxruntime writes them (Python's json default).
    """
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError:
        raise QuantbenchError(f"{source}: not UTF-8 text, so not a JSON table") from None
    except json.JSONDecodeError as exc:
        raise QuantbenchError(
            f"{source}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})"
        ) from None
    except QuantbenchError as exc:
        raise QuantbenchError(f"{source}: {exc}") from None


def json_flavour(document: Any) -> str | None:
    """Which JSON table ``document`` is: "quantbench", "ort-minmax-lists" (ORT ~1.11),
    "ort-tensors-data" (TensorsData), "ort-tensor-dicts" ({name: TensorData}), or None."""
    if not isinstance(document, dict) or not document:
        return None
    if "format" in document:
        return "quantbench" if document.get("format") == FORMAT_TAG else None
    if document.get("CLS") == "TensorsData" and isinstance(document.get("data"), dict):
        return "ort-tensors-data"
    values = list(document.values())
    if all(isinstance(v, list) and len(v) == 2 for v in values):
        return "ort-minmax-lists"
    if all(isinstance(v, dict) and "lowest" in v and "highest" in v for v in values):
        return "ort-tensor-dicts"
    return None


def _float_in(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise QuantbenchError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            raise QuantbenchError(f"{where}: {value} is too large for a float") from None
    if isinstance(value, str) and value in _LEGACY_NONFINITE:
        return _LEGACY_NONFINITE[value]
    if isinstance(value, str) and value in NONFINITE_TEXT:
        return NONFINITE_TEXT[value]
    raise QuantbenchError(f"{where}: expected a number, got {value!r}")


def _str_in(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise QuantbenchError(f"{where}: expected a string, got {value!r}")
    return value


def _scale_in(raw: Mapping[str, Any], where: str) -> np.float32 | None:
    """The stored scale: ``scale_hex`` is authoritative, ``scale`` must agree with it."""
    scale = None
    if "scale_hex" in raw:
        text = _str_in(raw["scale_hex"], f"{where}.scale_hex")
        if not 1 <= len(text) <= 8 or any(c not in "0123456789abcdefABCDEF" for c in text):
            raise QuantbenchError(f"{where}.scale_hex: {text!r} is not 1-8 hex digits")
        scale = hex_to_scale(text)
    if "scale" in raw:
        with np.errstate(over="ignore"):
            written = np.float32(_float_in(raw["scale"], f"{where}.scale"))
        if scale is None:
            scale = written
        elif scale_bits(written) != scale_bits(scale) and not (
            math.isnan(written) and math.isnan(scale)
        ):
            raise QuantbenchError(
                f"{where}: scale {raw['scale']!r} and scale_hex {raw['scale_hex']!r} disagree; "
                "delete both to recompute the scale from amax"
            )
    return scale


def _usable(entry: TableEntry, where: str) -> TableEntry:
    """Refuse a positive amax whose FP32 scale is subnormal or 0 (a GPU may flush it to zero:
    a silently wrong model). NaN, Inf, negative and 0 are read; ``table.invalid()`` lists the
    first three and quantize refuses them for a tensor it quantizes."""
    if math.isfinite(entry.amax) and entry.amax > 0 and (problem := entry.problem()):
        raise QuantbenchError(
            f"{where}: {problem}; recalibrate it, or write amax 0 for a tensor that is zero in "
            "every sample"
        )
    return entry


def _entry_in(raw: Any, where: str) -> TableEntry:
    if not isinstance(raw, dict):
        raise QuantbenchError(f"{where}: expected an object with 'amax', got {raw!r}")
    if "amax" not in raw:
        raise QuantbenchError(f"{where}: missing 'amax'")
    amax = _float_in(raw["amax"], f"{where}.amax")
    method = _str_in(raw.get("method", ""), f"{where}.method")
    scale = _scale_in(raw, where)
    if scale is None:
        return _usable(TableEntry(amax, method), where)
    with np.errstate(over="ignore", invalid="ignore"):
        derived = scale_from_amax(amax)
        if scale_bits(derived) == scale_bits(scale):
            return _usable(TableEntry(amax, method), where)
        if _same_float(amax_from_scale(scale), amax):
            # Read from a TensorRT cache: amax was derived from these exact scale bits.
            return _usable(TableEntry(amax, method, exact_scale=scale), where)
    raise QuantbenchError(
        f"{where}: amax {raw['amax']!r} does not match scale_hex {scale_to_hex(scale)!r} "
        f"(amax/127 is {scale_to_hex(derived)}); edit amax only and delete scale and scale_hex"
    )


def _provenance_in(raw: Any, source: str) -> Provenance:
    if not isinstance(raw, dict):
        raise QuantbenchError(f"{source}: 'provenance' must be an object, got {raw!r}")
    try:
        return Provenance.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise QuantbenchError(f"{source}: bad provenance ({exc})") from None


def _decode_quantbench(document: dict[str, Any], source: str) -> CalibrationTable:
    version = document.get("version")
    if version != FORMAT_VERSION:
        raise QuantbenchError(
            f"{source}: quantbench table version {version!r} is not {FORMAT_VERSION}; "
            "it was written by another quantbench version"
        )
    tensors = document.get("tensors")
    if not isinstance(tensors, dict):
        raise QuantbenchError(f"{source}: 'tensors' must be an object of tensor name -> entry")
    table = CalibrationTable(
        method=_str_in(document.get("method", ""), f"{source}: method"),
        algorithm=_str_in(document.get("algorithm", "EntropyCalibration2"), f"{source}: algorithm"),
        provenance=_provenance_in(document.get("provenance", {}), source),
    )
    for name, raw in tensors.items():
        table.entries[name] = _entry_in(raw, f"{source}: tensor {name!r}")
    return table


def _ort_numbers(value: Any, where: str) -> list[float]:
    """A number, a nested list of numbers, or onnxruntime's ``numpy.array`` wrapper of either."""
    if isinstance(value, dict) and value.get("CLS") == "numpy.array":
        value = value.get("data")
    if isinstance(value, list):
        return [number for item in value for number in _ort_numbers(item, where)]
    return [_float_in(value, where)]


def _ort_amax(lowest: Any, highest: Any, where: str) -> float:
    values = _ort_numbers(lowest, where) + _ort_numbers(highest, where)
    if not values:
        raise QuantbenchError(f"{where}: empty range")
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(abs(v) for v in values)


def _decode_ort(document: dict[str, Any], flavour: str, source: str) -> CalibrationTable:
    method = "onnxruntime"
    ranges: Mapping[str, Any] = document
    if flavour == "ort-tensors-data":
        ranges = document["data"]
        raw_method = document.get("calibration_method")
        if isinstance(raw_method, dict):
            raw_method = str(raw_method.get("value", ""))
        name = str(raw_method or "").rsplit(".", 1)[-1]
        if name in _ORT_METHODS:
            method = f"onnxruntime:{_ORT_METHODS[name]}"
    table = CalibrationTable(method=method)
    if method == "onnxruntime:minmax":
        table.algorithm = "MinMaxCalibration"
    for tensor, raw in ranges.items():
        where = f"{source}: tensor {tensor!r}"
        if isinstance(raw, list) and len(raw) == 2:
            amax = _ort_amax(raw[0], raw[1], where)
        elif isinstance(raw, dict) and "lowest" in raw and "highest" in raw:
            amax = _ort_amax(raw["lowest"], raw["highest"], where)
        else:
            raise QuantbenchError(f"{where}: expected [min, max] or lowest/highest, got {raw!r}")
        table.entries[tensor] = _usable(TableEntry(amax, method), where)
    return table


def decode_json_table(data: bytes, source: str) -> CalibrationTable:
    """Read a quantbench JSON table or an onnxruntime JSON table (see the module docstring)."""
    document = load_json(data, source)
    flavour = json_flavour(document)
    if flavour == "quantbench":
        return _decode_quantbench(document, source)
    if flavour is not None:
        return _decode_ort(document, flavour, source)
    if isinstance(document, dict) and "format" in document:
        raise QuantbenchError(
            f"{source}: JSON format {document['format']!r} is not {FORMAT_TAG!r}; "
            "not a calibration table"
        )
    raise QuantbenchError(
        f"{source}: JSON but not a calibration table (expected a quantbench table or "
        "onnxruntime's {name: [min, max]} / TensorData ranges)"
    )
