"""Read any calibration table by sniffing its bytes; write one in a chosen format, atomically.

Formats read: TensorRT cache (``TRT-`` header), quantbench JSON, onnxruntime JSON
(``{name: [min, max]}`` or TensorData) and onnxruntime's TensorRT-EP flatbuffers. Formats
written: ``trt``, ``json``, ``ort-flatbuffers`` (onnxruntime's JSON is range-based and lossy for
our purpose, so we read it but do not write it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

from quantbench.errors import QuantbenchError
from quantbench.fileio import write_bytes_atomic
from quantbench.table import CalibrationTable
from quantbench.table.json_table import (
    decode_json_table,
    encode_json_table,
    json_flavour,
    load_json,
)
from quantbench.table.ort_flatbuffers import (
    decode_ort_flatbuffers,
    encode_ort_flatbuffers,
    looks_like_ort_flatbuffers,
)
from quantbench.table.trt_cache import (
    decode_trt_cache,
    encode_trt_cache,
    foreign_hint,
    looks_like_trt_cache,
)

TableFormat = Literal["trt", "json", "ort-flatbuffers"]
DetectedFormat = Literal["trt", "json", "ort-json", "ort-flatbuffers"]

FORMAT_SUFFIX: dict[str, str] = {
    "trt": ".cache",
    "json": ".json",
    "ort-flatbuffers": ".flatbuffers",
}

# Output suffixes that name a format unambiguously (for choosing a format from a file name).
_SUFFIX_FORMAT: dict[str, TableFormat] = {
    ".cache": "trt",
    ".calib": "trt",
    ".json": "json",
    ".flatbuffers": "ort-flatbuffers",
    ".fb": "ort-flatbuffers",
}

_NOT_A_TABLE = (
    "not a calibration table (expected a TensorRT cache, quantbench JSON or onnxruntime table)"
)


def detect_format(data: bytes) -> DetectedFormat | None:
    """Which codec reads ``data``, from its bytes alone; None when none does.

    A file that merely starts like JSON is reported as "json" so its reader can say what is
    wrong with it (syntax error, foreign JSON) rather than a generic "not a table".
    """
    if looks_like_trt_cache(data):
        return "trt"
    if data.lstrip()[:1] == b"{":
        try:
            flavour = json_flavour(load_json(data, "<data>"))
        except QuantbenchError:
            return "json"
        return "ort-json" if flavour is not None and flavour != "quantbench" else "json"
    if looks_like_ort_flatbuffers(data):
        return "ort-flatbuffers"
    return None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise QuantbenchError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise QuantbenchError(f"{path}: is a folder, not a calibration table") from None
    except OSError as exc:
        raise QuantbenchError(f"{path}: cannot read ({exc.strerror})") from None


def read_table(path: str | os.PathLike[str]) -> CalibrationTable:
    """Read a calibration table in any supported format (see :func:`detect_format`)."""
    source = Path(path)
    data = _read_bytes(source)
    detected = detect_format(data)
    if detected == "trt":
        return decode_trt_cache(data, str(source))
    if detected in ("json", "ort-json"):
        return decode_json_table(data, str(source))
    if detected == "ort-flatbuffers":
        return decode_ort_flatbuffers(data, str(source))
    raise QuantbenchError(f"{source}: {_NOT_A_TABLE}; {foreign_hint(data)}")


def encode_table(
    table: CalibrationTable,
    fmt: TableFormat,
    trt_version: str | None = None,
    *,
    allow_invalid: bool = False,
) -> bytes:
    """The bytes of ``table`` in ``fmt``; ``trt_version`` only matters for ``trt``."""
    if fmt == "trt":
        return encode_trt_cache(table, trt_version, allow_invalid=allow_invalid)
    if fmt == "json":
        return encode_json_table(table)
    if fmt == "ort-flatbuffers":
        return encode_ort_flatbuffers(table, allow_invalid=allow_invalid)
    raise QuantbenchError(f"table format {fmt!r}: choose one of {', '.join(get_args(TableFormat))}")


def write_table(
    table: CalibrationTable,
    path: str | os.PathLike[str],
    fmt: TableFormat,
    trt_version: str | None = None,
    *,
    allow_invalid: bool = False,
) -> Path:
    """Write ``table`` to ``path`` atomically; everything is checked before the file is touched.

    For ``trt``, ``trt_version`` defaults to the table's own header version when it was read
    from a cache, else 10.16.0; TensorRT 11+ is refused (it reads no caches).
    """
    data = encode_table(table, fmt, trt_version, allow_invalid=allow_invalid)
    return write_bytes_atomic(path, data)


def output_format(path: str | os.PathLike[str] | None, fmt: str | None) -> TableFormat:
    """The format to write ``path`` in: ``fmt`` when given, else the one its suffix names
    (``.json``, ``.flatbuffers``/``.fb``), else ``trt`` (``.cache``, ``.calib``, any other).

    A ``fmt`` the suffix contradicts (``--format trt -o t.json``) is refused: the file would
    hold another format than its name says, and a cache in ``t.json`` loses the model hash.
    """
    if fmt is not None and fmt not in FORMAT_SUFFIX:
        raise QuantbenchError(f"--format must be one of {', '.join(FORMAT_SUFFIX)}, not {fmt!r}")
    suffix = Path(path).suffix.lower() if path is not None else ""
    named = _SUFFIX_FORMAT.get(suffix)
    if fmt is None:
        return named or "trt"
    if named is not None and named != fmt:
        raise QuantbenchError(
            f"{path}: --format {fmt} contradicts the suffix {suffix} (a {named} table); drop "
            f"--format, or name the file *{FORMAT_SUFFIX[fmt]}"
        )
    return fmt  # type: ignore[return-value]


def format_for_path(path: str | os.PathLike[str]) -> TableFormat:
    """The output format a file name asks for (``.cache`` -> trt, ``.json``, ``.flatbuffers``)."""
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIX_FORMAT:
        raise QuantbenchError(
            f"{path}: cannot tell the table format from the suffix {suffix or '(none)'!r}; "
            f"use {', '.join(sorted(_SUFFIX_FORMAT))} or give the format explicitly"
        )
    return _SUFFIX_FORMAT[suffix]
