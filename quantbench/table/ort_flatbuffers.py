"""onnxruntime's TensorRT-EP calibration table: FlatBuffers ``CalTableFlatBuffers.TrtTable``.

Schema (onnxruntime ``ort_trt_int8_cal_table.fbs``)::

    table KeyValue { key: string (key); value: string; }   // vtable slots 4 and 6
    table TrtTable { dict: [KeyValue]; }                     // root, slot 4

This is the file the EP reads when ``trt_int8_use_native_calibration_table=0`` (the default).
``value`` is the decimal text of the *dynamic range*: the EP applies ``std::stof(value)`` as
``setDynamicRange(-r, r)``. We write ``r = amax = max(|lo|, |hi|)``; onnxruntime's own
``write_calibration_table`` writes ``max(lo, hi)`` (signed), which is too small whenever
``|lo| > hi`` -- a pitfall we do not copy.

Layout matches onnxruntime's writer byte for byte: keys are visited in sorted order and each
``KeyValue`` is prepended, so the stored vector is in *reverse*-sorted key order. The EP copies
the vector into a hash map, so the order carries no meaning; the reader returns file order.

Writing uses the official ``flatbuffers`` runtime. Reading walks the buffer with explicit bounds
checks, because the Python runtime has no verifier and silently reads past the end of (or
wraps around) a truncated or foreign buffer.
"""

from __future__ import annotations

import math
import re
import struct

import flatbuffers
import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.table import CalibrationTable, TableEntry

_FLT_TINY = float(np.finfo(np.float32).tiny)
_VALUE_RE = re.compile(
    r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|infinity|nan)", re.IGNORECASE
)


def _value_problem(amax: float) -> str | None:
    """Why ``str(amax)`` would break onnxruntime's ``std::stof`` reader or TensorRT, else None."""
    if math.isnan(amax):
        return "NaN"
    if math.copysign(1.0, amax) < 0:
        return "negative"
    if math.isinf(amax):
        return "infinite"
    with np.errstate(over="ignore"):
        as_float32 = float(np.float32(amax))
    if math.isinf(as_float32):
        return "beyond the float32 range (std::stof throws)"
    if 0 < as_float32 < _FLT_TINY:
        return "below the smallest normal float32 (std::stof throws)"
    return None


def encode_ort_flatbuffers(table: CalibrationTable, *, allow_invalid: bool = False) -> bytes:
    """The ``calibration.flatbuffers`` bytes onnxruntime's TensorRT EP reads for ``table``.

    Values are ``repr(amax)`` (shortest text that round-trips). Amax values the EP cannot use
    (NaN, negative, infinite, outside float32's normal range) are refused unless
    ``allow_invalid``.
    """
    texts: dict[str, str] = {}
    for name, entry in table.entries.items():
        amax = float(entry.amax)
        problem = _value_problem(amax)
        if problem and not allow_invalid:
            raise QuantbenchError(
                f"tensor {name!r}: amax {amax!r} is {problem}; it cannot go into an onnxruntime "
                "TensorRT table; recalibrate it or drop it from the table"
            )
        texts[name] = repr(amax)
    builder = flatbuffers.Builder(1024)
    key_values = []
    for name in sorted(texts):
        key = builder.CreateString(name)
        value = builder.CreateString(texts[name])
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(0, key, 0)
        builder.PrependUOffsetTRelativeSlot(1, value, 0)
        key_values.append(builder.EndObject())
    builder.StartVector(4, len(key_values), 4)
    for key_value in key_values:
        builder.PrependUOffsetTRelative(key_value)
    vector = builder.EndVector()
    builder.StartObject(1)
    builder.PrependUOffsetTRelativeSlot(0, vector, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())


class _Corrupt(Exception):
    """Internal: the buffer is not a well-formed TrtTable (turned into a QuantbenchError)."""


class _Reader:
    """Bounds-checked little-endian reads of FlatBuffers tables, vectors and strings."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _unpack(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise _Corrupt(f"offset {pos} outside the {len(self.data)}-byte buffer")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def u32(self, pos: int) -> int:
        return self._unpack("<I", pos)

    def follow(self, pos: int) -> int:
        """Position an unsigned offset stored at ``pos`` points to."""
        return pos + self.u32(pos)

    def field(self, table: int, slot: int) -> int | None:
        """Position of field ``slot`` of the table at ``table``, None when absent."""
        vtable = table - self._unpack("<i", table)
        vtable_size = self._unpack("<H", vtable)
        entry = 4 + 2 * slot
        if vtable_size < 4 or vtable_size % 2:
            raise _Corrupt(f"bad vtable size {vtable_size}")
        if entry + 2 > vtable_size:
            return None
        offset = self._unpack("<H", vtable + entry)
        return table + offset if offset else None

    def string(self, pos: int) -> str:
        start = self.follow(pos)
        length = self.u32(start)
        end = start + 4 + length
        if end >= len(self.data) or self.data[end] != 0:
            raise _Corrupt(f"string at {start} runs past the buffer or lacks its NUL")
        try:
            return self.data[start + 4 : end].decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"string at {start} is not UTF-8") from None


def _read_key_values(data: bytes) -> list[tuple[str, str]]:
    reader = _Reader(data)
    root = reader.follow(0)
    dict_field = reader.field(root, 0)
    if dict_field is None:
        raise _Corrupt("the root table has no 'dict' vector")
    vector = reader.follow(dict_field)
    count = reader.u32(vector)
    if vector + 4 + 4 * count > len(data):
        raise _Corrupt(f"'dict' claims {count} entries, more than the buffer holds")
    pairs = []
    for index in range(count):
        key_value = reader.follow(vector + 4 + 4 * index)
        key_field, value_field = reader.field(key_value, 0), reader.field(key_value, 1)
        if key_field is None or value_field is None:
            raise _Corrupt(f"entry {index} lacks its key or value")
        pairs.append((reader.string(key_field), reader.string(value_field)))
    return pairs


def read_key_values(data: bytes, source: str) -> list[tuple[str, str]]:
    """The raw (key, value text) pairs in file order; QuantbenchError when malformed."""
    if len(data) < 12:
        raise QuantbenchError(
            f"{source}: {len(data)} bytes is too short for an onnxruntime flatbuffers table"
        )
    try:
        return _read_key_values(data)
    except _Corrupt as exc:
        raise QuantbenchError(
            f"{source}: not an onnxruntime TensorRT-EP flatbuffers table ({exc})"
        ) from None


def decode_ort_flatbuffers(data: bytes, source: str) -> CalibrationTable:
    """Read ``calibration.flatbuffers``: amax = the stored dynamic range, in file order.

    A negative value (what onnxruntime's writer produces for an all-negative tensor) is kept as
    read; ``table.invalid()`` lists it.
    """
    table = CalibrationTable()
    for name, text in read_key_values(data, source):
        if not name:
            raise QuantbenchError(f"{source}: an entry has an empty tensor name")
        if name in table.entries:
            raise QuantbenchError(f"{source}: tensor {name!r} appears twice")
        if _VALUE_RE.fullmatch(text) is None:
            raise QuantbenchError(
                f"{source}: tensor {name!r}: value {text[:40]!r} is not a decimal number"
            )
        table.entries[name] = TableEntry(float(text))
    return table


def looks_like_ort_flatbuffers(data: bytes) -> bool:
    """True when ``data`` parses as a TrtTable whose values are all numbers."""
    try:
        decode_ort_flatbuffers(data, "<data>")
    except QuantbenchError:
        return False
    return True
