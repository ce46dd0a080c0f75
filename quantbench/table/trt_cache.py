"""TensorRT's native calibration cache: ``TRT-<version>-<Algo>`` then ``name: <hex>`` lines.

The format (reference doc section 2) is what ``IInt8Calibrator::writeCalibrationCache`` receives
and what ``trtexec --calib`` / ``readCalibrationCache`` hand back to TensorRT. Each entry's hex is
the IEEE-754 float32 bit pattern of the *scale* (amax / 127), lowercase, without zero padding.
Decoding keeps the exact scale bits (:meth:`TableEntry.from_scale`), the entry order and the
header, so reading a cache and writing it again reproduces the file byte for byte.
"""

from __future__ import annotations

import re

import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.table import CalibrationTable, TableEntry

HEADER_PREFIX = "TRT-"

# The last TensorRT release line with implicit INT8 (calibrators and caches); TRT 11 removed it.
DEFAULT_TRT_VERSION = "10.16.0"
FIRST_VERSION_WITHOUT_CACHES = 11

ALGORITHMS: tuple[str, ...] = (
    "EntropyCalibration2",  # IInt8EntropyCalibrator2: seen in real caches
    "MinMaxCalibration",  # IInt8MinMaxCalibrator: seen in real caches
    # IInt8EntropyCalibrator (v1) and IInt8LegacyCalibrator: no public cache shows their header
    # token (reference doc 1.4 and 8.3); these two spellings are a guess, accepted but unverified.
    "EntropyCalibration",
    "LegacyCalibration",
)

#: the header token trtexec's ``--calib`` accepts: its calibrator is an IInt8EntropyCalibrator2,
#: and TensorRT drops a cache another calibrator class wrote (a ``MinMaxCalibration`` cache made
#: trtexec calibrate on random data: reference doc 2.3)
TRTEXEC_ALGORITHM = "EntropyCalibration2"

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)?")
_HEADER_RE = re.compile(r"TRT-(\d+)-([A-Za-z0-9_]+)")
#: what TensorRT can have written: 4 digits (1.0.0 .. 9.9.99) or 10xxxx (10.x; 11 has no caches)
_HEADER_VERSION_RE = re.compile(r"[1-9]\d{3}|10\d{4}")
_HEX_RE = re.compile(r"[0-9a-fA-F]+")
#: a value as TensorRT writes a scale quantbench can use: no zero padding, so every scale from
#: 2**-95 (bits 0x10000000, about 2.5e-29) up has exactly 8 digits; ``0`` is an all-zero tensor's
_VALUE_RE = re.compile(r"0|[1-9a-fA-F][0-9a-fA-F]{7}")
#: ": <value>" inside a name: two entries whose line break was lost
_MERGED_RE = re.compile(r": (?:0|[1-9a-fA-F][0-9a-fA-F]{7})")
_DECIMAL = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ORT_TEXT_LINE_RE = re.compile(rf"\S+ +{_DECIMAL}")
_RANGES_LINE_RE = re.compile(rf".+: *{_DECIMAL}")
_ENTRY_LINE_RE = re.compile(r".+: [0-9a-fA-F]{1,8}")

_SIGN_BIT = 0x80000000
_EXPONENT_MASK = 0x7F800000
_INFINITY_BITS = 0x7F800000
#: the smallest scale a cache holds in 8 hex digits: 2**-95 (about 2.5e-29, amax 3.2e-27)
SMALLEST_CACHE_BITS = 0x10000000


def trt_version_int(version: str) -> int:
    """``NV_TENSORRT_VERSION`` as a cache header writes it: "10.1.0" -> 100100, "8.4.1" -> 8401.

    TensorRT <= 9 used ``major*1000 + minor*100 + patch``; 10.0 switched to
    ``major*10000 + minor*100 + patch``. Accepts "X.Y", "X.Y.Z" and "X.Y.Z.B" (the build number
    of ``tensorrt.__version__`` is not encoded in the header).
    """
    match = _VERSION_RE.fullmatch(version.strip())
    if match is None:
        raise QuantbenchError(
            f"TensorRT version {version!r}: expected MAJOR.MINOR or MAJOR.MINOR.PATCH, "
            f"e.g. {DEFAULT_TRT_VERSION}"
        )
    major, minor, patch = int(match[1]), int(match[2]), int(match[3] or 0)
    if major >= 10:
        if minor > 99 or patch > 99:
            raise QuantbenchError(f"TensorRT version {version!r}: minor and patch must be <= 99")
        return major * 10000 + minor * 100 + patch
    if major < 1 or minor > 9 or patch > 99:
        raise QuantbenchError(
            f"TensorRT version {version!r}: cannot be encoded in a cache header "
            "(TensorRT <= 9 headers need minor <= 9 and patch <= 99)"
        )
    return major * 1000 + minor * 100 + patch


def trt_version_str(version_int: int) -> str:
    """Inverse of :func:`trt_version_int`: 100100 -> "10.1.0", 8401 -> "8.4.1"."""
    if version_int >= 100000:
        major, rest = divmod(version_int, 10000)
    elif 1000 <= version_int <= 9999:
        major, rest = divmod(version_int, 1000)
    else:
        raise QuantbenchError(
            f"TensorRT version number {version_int}: not a 4-digit (TRT <= 9) or 6-digit "
            "(TRT >= 10) NV_TENSORRT_VERSION"
        )
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def check_cache_target(version: str) -> int:
    """The header number for ``version``; refuses TensorRT 11+, which cannot consume a cache."""
    version_int = trt_version_int(version)
    major = int(trt_version_str(version_int).split(".")[0])
    if major >= FIRST_VERSION_WITHOUT_CACHES:
        raise QuantbenchError(
            f"TensorRT {version} has no implicit INT8 and reads no calibration cache (removed in "
            f"TensorRT 11); build the Q/DQ model with `quantbench quantize` instead, or target "
            f"TensorRT 10.x (e.g. --trt-version {DEFAULT_TRT_VERSION})"
        )
    return version_int


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise QuantbenchError(
            f"calibration algorithm {algorithm!r}: a TensorRT cache header needs one of "
            f"{', '.join(ALGORITHMS)}"
        )
    return algorithm


def parse_header(line: str, source: str = "cache") -> tuple[int, str, str]:
    """``"TRT-8401-EntropyCalibration2"`` -> ``(8401, "8.4.1", "EntropyCalibration2")``."""
    text = line.rstrip("\r\n")
    match = _HEADER_RE.fullmatch(text)
    if match is None:
        raise QuantbenchError(
            f"{source}:1: header {text[:60]!r} is not TRT-<version>-<algorithm> "
            "(e.g. TRT-101000-EntropyCalibration2)"
        )
    if _HEADER_VERSION_RE.fullmatch(match[1]) is None:
        raise QuantbenchError(
            f"{source}:1: header {text[:60]!r}: version {match[1]} is no TensorRT that writes "
            "caches (4 digits for TensorRT <= 9, e.g. 8401; 10xxxx for 10.x, e.g. 101000); "
            "the header is damaged: restore the cache or calibrate again"
        )
    version_int = int(match[1])
    version = trt_version_str(version_int)
    algorithm = match[2]
    if algorithm not in ALGORITHMS:
        raise QuantbenchError(
            f"{source}:1: unknown calibration algorithm {algorithm!r} in the header "
            f"(known: {', '.join(ALGORITHMS)})"
        )
    return version_int, version, algorithm


def format_header(version: str, algorithm: str) -> str:
    """Inverse of :func:`parse_header`, for a TensorRT that still reads caches (<= 10.x)."""
    return f"{HEADER_PREFIX}{check_cache_target(version)}-{check_algorithm(algorithm)}"


def scale_bits(scale: float) -> int:
    """The float32 bit pattern, taken from numpy so NaN payloads and -0.0 survive."""
    with np.errstate(over="ignore"):
        return int(np.array(scale, dtype=np.float32).view(np.uint32))


def scale_to_hex(scale: float) -> str:
    """``0.020787403`` -> ``"3caa4a58"``; zero is ``"0"`` (no zero padding, as TensorRT writes)."""
    return format(scale_bits(scale), "x")


def hex_to_scale(text: str) -> np.float32:
    return np.array(int(text, 16), dtype=np.uint32).view(np.float32)[()]


def scale_problem(bits: int) -> str | None:
    """Why a scale with these bits must not be written to a cache (NaN, +-inf, negative, or too
    small for the 8 hex digits :func:`decode_trt_cache` demands), else None.

    Zero is allowed: TensorRT itself writes ``0`` for all-zero tensors.
    """
    if bits & _EXPONENT_MASK == _EXPONENT_MASK:
        return "NaN" if bits & 0x007FFFFF else "infinite"
    if bits & _SIGN_BIT:
        return "negative"
    if 0 < bits < SMALLEST_CACHE_BITS:
        return "below 2**-95 (about 2.5e-29, amax 3.2e-27: no usable range)"
    return None


def _check_name(name: str) -> None:
    if not name:
        raise QuantbenchError("a tensor with an empty name cannot go into a TensorRT cache")
    if "\n" in name:
        raise QuantbenchError(
            f"tensor {name!r}: a name containing a newline cannot go into a TensorRT cache"
        )


def encode_trt_cache(
    table: CalibrationTable,
    trt_version: str | None = None,
    algorithm: str | None = None,
    *,
    allow_invalid: bool = False,
) -> bytes:
    """The cache bytes TensorRT ``trt_version`` would accept for ``table``.

    ``trt_version`` defaults to the version the table was read from (``provenance.trt_version``),
    else :data:`DEFAULT_TRT_VERSION`; ``algorithm`` defaults to ``table.algorithm``. NaN, infinite
    and negative scales are refused (TensorRT never writes them) unless ``allow_invalid``, which
    exists to re-write such a cache byte for byte.
    """
    version = trt_version or table.provenance.trt_version or DEFAULT_TRT_VERSION
    lines = [format_header(version, algorithm or table.algorithm)]
    for name, entry in table.entries.items():
        _check_name(name)
        with np.errstate(over="ignore"):  # amax beyond float32 -> inf scale, refused below
            bits = scale_bits(entry.scale)
        problem = scale_problem(bits)
        if problem and not allow_invalid:
            raise QuantbenchError(
                f"tensor {name!r}: {problem} scale (amax {entry.amax}) cannot go into a TensorRT "
                "cache; recalibrate it or drop it from the table"
            )
        lines.append(f"{name}: {bits:x}")
    try:
        return ("\n".join(lines) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QuantbenchError(f"a tensor name is not valid Unicode text: {exc}") from None


def foreign_hint(data: bytes) -> str:
    """A guess at what a file that is not a TensorRT cache is, for the error message."""
    if not data.strip():
        return "the file is empty"
    if b"\0" in data[:4096]:
        return "it is binary data (an onnxruntime calibration.flatbuffers table?)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "it is not UTF-8 text"
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return "it is JSON (a quantbench or onnxruntime JSON table?), not a TensorRT cache"
    first = stripped.splitlines()[0].rstrip()
    if _ENTRY_LINE_RE.fullmatch(first):
        return "the first line must be the TRT-<version>-<algorithm> header; it is missing"
    if _ORT_TEXT_LINE_RE.fullmatch(first):
        return (
            "this looks like onnxruntime's write_calibration_table text output "
            "('name value' lines), not a TensorRT cache; its values are max(lo, hi), so use "
            "calibration.json from the same folder instead"
        )
    if _RANGES_LINE_RE.fullmatch(first):
        return (
            "this looks like a per-tensor dynamic-range text file ('name: float', as "
            "sampleINT8API --ranges reads), not a TensorRT cache"
        )
    return "a TensorRT cache starts with a header line like TRT-101000-EntropyCalibration2"


def _value_problem(value: str) -> str | None:
    """Why ``value`` (the text after ': ') is not a scale TensorRT wrote, else None.

    TensorRT writes 8 digits for every scale from 2**-95 up and ``0`` for an all-zero tensor, so
    a shorter value (a subnormal or absurdly small scale), a leading zero, a negative or NaN
    scale can only be damage. ``7f800000`` (+inf) is kept: TensorRT writes it (a Log output);
    quantize refuses it for a tensor it quantizes.
    """
    if _HEX_RE.fullmatch(value) is None:
        return "is not hex digits (the float32 bits of the scale)"
    if _VALUE_RE.fullmatch(value) is None:
        if len(value) > 8:
            return f"has {len(value)} hex digits; a float32 has 8"
        if len(value) == 8:
            return "starts with 0, which TensorRT never writes"
        return (
            f"has {len(value)} hex digits (scale {hex_to_scale(value):.3g}); TensorRT writes 8 "
            "for every scale above 2.5e-29 and '0' for zero"
        )
    bits = int(value, 16)
    if bits & _SIGN_BIT:
        return f"is a negative scale ({hex_to_scale(value):.3g}), which TensorRT never writes"
    if bits & _EXPONENT_MASK == _EXPONENT_MASK and bits != _INFINITY_BITS:
        return "is NaN, which TensorRT never writes"
    return None


def _parse_entry(line: str, source: str, lineno: int) -> tuple[str, np.float32]:
    name, colon, value = line.rpartition(":")
    if not colon:
        raise QuantbenchError(
            f"{source}:{lineno}: no ':' in {line[:80]!r}; expected '<tensor name>: <hex>'"
        )
    if not name:
        raise QuantbenchError(f"{source}:{lineno}: empty tensor name in {line[:80]!r}")
    if not value.startswith(" "):
        problem = "does not follow ': ' (a colon and one space)"
    else:
        problem = _value_problem(value[1:])
    if problem is None and _MERGED_RE.search(name):
        raise QuantbenchError(
            f"{source}:{lineno}: {line[:80]!r} holds two entries (a lost line break?); the cache "
            "is damaged: restore it or calibrate again"
        )
    if problem:
        raise QuantbenchError(
            f"{source}:{lineno}: tensor {name!r}: value {value.strip()[:40]!r} {problem}; the "
            "cache is damaged or not a TensorRT cache: restore it or calibrate again"
        )
    return name, hex_to_scale(value[1:])


def _decode_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data[: exc.start].count(b"\n") + 1
        raise QuantbenchError(
            f"{source}:{lineno}: not UTF-8 text; the cache is corrupt or not a TensorRT cache"
        ) from None


def decode_trt_cache(data: bytes, source: str) -> CalibrationTable:
    """Parse a TensorRT cache; ``source`` (the file name) prefixes every error message.

    Names are everything before the *last* ':' (names may contain ':' and spaces). Values must
    be written as TensorRT writes them (:func:`_value_problem`), so a damaged value is refused
    rather than read as another scale; ``0`` and +inf are kept and ``table.invalid()`` lists them.
    """
    if not data.startswith(HEADER_PREFIX.encode()):
        raise QuantbenchError(f"{source}:1: not a TensorRT calibration cache: {foreign_hint(data)}")
    lines = _decode_text(data, source).split("\n")
    _, version, algorithm = parse_header(lines[0], source)
    table = CalibrationTable(algorithm=algorithm)
    table.provenance.trt_version = version
    first_seen: dict[str, int] = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for lineno, raw in enumerate(lines[1:], start=2):
            line = raw.removesuffix("\r")
            if not line:
                continue
            name, scale = _parse_entry(line, source, lineno)
            if name in first_seen:
                raise QuantbenchError(
                    f"{source}:{lineno}: tensor {name!r} already appeared on line "
                    f"{first_seen[name]}; a TensorRT cache holds each tensor once"
                )
            first_seen[name] = lineno
            table.entries[name] = TableEntry.from_scale(scale)
    return table


def looks_like_trt_cache(data: bytes) -> bool:
    return data.startswith(HEADER_PREFIX.encode())
