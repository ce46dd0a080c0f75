"""Calibration-table codecs: TensorRT cache, quantbench JSON, onnxruntime JSON and flatbuffers.

The real caches under ../shared/fixtures/trt_calib_caches (TRT 7.2.1 .. 10.10.0, names with ':'
and spaces, unsorted) must survive read -> write byte for byte; onnxruntime's own generated
FlatBuffers code and writer are the reference for the flatbuffers format.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from quantbench.errors import QuantbenchError
from quantbench.table import CalibrationTable, Provenance, TableEntry, scale_from_amax
from quantbench.table.codecs import (
    FORMAT_SUFFIX,
    detect_format,
    encode_table,
    format_for_path,
    read_table,
    write_table,
)
from quantbench.table.json_table import decode_json_table, encode_json_table
from quantbench.table.ort_flatbuffers import decode_ort_flatbuffers, encode_ort_flatbuffers
from quantbench.table.trt_cache import (
    DEFAULT_TRT_VERSION,
    decode_trt_cache,
    encode_trt_cache,
    format_header,
    parse_header,
    scale_bits,
    scale_to_hex,
    trt_version_int,
    trt_version_str,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "trt_calib_caches"
ORT_FIXTURES = FIXTURES / "ort_write_calibration_table"
CACHE_FILES = sorted(FIXTURES.glob("*.cache")) if FIXTURES.is_dir() else []

needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"third-party fixtures not found at {FIXTURES}"
)


def _fixture_caches() -> list[Path]:
    if not CACHE_FILES:
        pytest.skip(f"third-party fixtures not found at {FIXTURES}")
    return CACHE_FILES


def _bits(value: float) -> int:
    return scale_bits(value)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _assert_tables_equal(got: CalibrationTable, want: CalibrationTable) -> None:
    """Same names in the same order, same amax, same float32 scale bits, same methods."""
    assert list(got.entries) == list(want.entries)
    for name, entry in want.entries.items():
        other = got.entries[name]
        assert _same(other.amax, entry.amax), name
        assert _bits(other.scale) == _bits(entry.scale), name
        assert other.method == entry.method, name


def _independent_parse(data: bytes) -> list[tuple[str, int]]:
    """The reference doc's decoding rule, written independently of the codec."""
    lines = data.decode("utf-8").split("\n")
    assert lines[-1] == ""
    pairs = []
    for line in lines[1:-1]:
        name, _, value = line.rpartition(": ")
        pairs.append((name, int(value, 16)))
    return pairs


# --- TensorRT cache: fixtures ------------------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("path", CACHE_FILES, ids=lambda p: p.name)
def test_fixture_cache_round_trips_byte_for_byte(path: Path) -> None:
    data = path.read_bytes()
    table = decode_trt_cache(data, str(path))
    assert encode_trt_cache(table) == data
    version, algorithm = table.provenance.trt_version, table.algorithm
    assert encode_trt_cache(table, version, algorithm) == data


@needs_fixtures
@pytest.mark.parametrize("path", CACHE_FILES, ids=lambda p: p.name)
def test_fixture_cache_entries_match_reference_rule(path: Path) -> None:
    data = path.read_bytes()
    table = decode_trt_cache(data, str(path))
    expected = _independent_parse(data)
    assert [(name, _bits(e.scale)) for name, e in table.entries.items()] == expected
    for name, bits in expected:
        scale = struct.unpack(">f", bits.to_bytes(4, "big"))[0]
        assert table.amax(name) == pytest.approx(127 * scale, rel=1e-6)
    assert table.invalid() == []


@needs_fixtures
@pytest.mark.parametrize(
    ("name", "version", "algorithm", "count"),
    [
        ("trt7201_entropy2_model_convert.cache", "7.2.1", "EntropyCalibration2", 45),
        ("trt8401_entropy2_cnn_depthwise.cache", "8.4.1", "EntropyCalibration2", 36),
        ("trt100001_minmax_resnet50_layerapi.cache", "10.0.1", "MinMaxCalibration", 179),
        ("trt101000_entropy2_radioml_transformer.cache", "10.10.0", "EntropyCalibration2", 140),
    ],
)
def test_fixture_headers(name: str, version: str, algorithm: str, count: int) -> None:
    table = read_table(FIXTURES / name)
    assert (table.provenance.trt_version, table.algorithm, len(table)) == (
        version,
        algorithm,
        count,
    )


@needs_fixtures
def test_fixture_awkward_names_and_order() -> None:
    depthwise = read_table(FIXTURES / "trt8401_entropy2_cnn_depthwise.cache")
    assert _bits(depthwise.scale("Conv__54:0")) == 0x3CF5D113
    assert "Conv__94:0" in depthwise
    unnamed = read_table(FIXTURES / "trt7201_entropy2_model_convert.cache")
    assert _bits(unnamed.scale("(Unnamed Layer* 33) [Shuffle]_output")) == 0x3E9F02D4
    assert _bits(unnamed.scale("input.1")) == 0x3CAA54FC
    radioml = read_table(FIXTURES / "trt101000_entropy2_radioml_transformer.cache")
    names = list(radioml.entries)
    assert names[:2] == ["input", "/encoder/layers.0/Add_output_0"]
    assert names != sorted(names)


@needs_fixtures
@pytest.mark.parametrize("path", CACHE_FILES, ids=lambda p: p.name)
def test_fixture_cache_survives_json_and_back(path: Path) -> None:
    table = read_table(path)
    via_json = decode_json_table(encode_json_table(table), "mem.json")
    _assert_tables_equal(via_json, table)
    assert via_json.provenance == table.provenance
    assert encode_trt_cache(via_json) == path.read_bytes()


# --- TensorRT cache: values, versions, headers -------------------------------------------------


@pytest.mark.parametrize(
    ("hex_text", "scale", "amax"),
    [
        ("3c010204", 0.0078740157, 1.0),
        ("3c010a14", 0.0078759380, 1.000244),
        ("3caa4a58", 0.0207874030, 2.640000),
        ("3caa54fc", 0.0207924768, 2.640645),
        ("3d5b6231", 0.0535604395, 6.802176),
        ("41a5f8d8", 20.746506, 2634.806),
        ("3f800000", 1.0, 127.0),
        ("0", 0.0, 0.0),
        ("7c010204", 2.6793887e36, math.inf),  # FLT_MAX / 127: 127 * scale overflows float32
    ],
)
def test_worked_decodes(hex_text: str, scale: float, amax: float) -> None:
    table = decode_trt_cache(f"TRT-8401-EntropyCalibration2\nt: {hex_text}\n".encode(), "w")
    assert float(table.scale("t")) == pytest.approx(scale, rel=1e-6)
    assert table.amax("t") == pytest.approx(amax, rel=1e-4)
    assert encode_trt_cache(table, allow_invalid=True).endswith(f"t: {hex_text}\n".encode())


def test_worked_decode_of_infinity() -> None:
    table = decode_trt_cache(
        b"TRT-101303-MinMaxCalibration\n/encoder/Log_output_0: 7f800000\n", "w"
    )
    assert math.isinf(table.amax("/encoder/Log_output_0"))


@pytest.mark.parametrize(
    ("amax", "hex_text"),
    [
        (2.64, "3caa4a58"),
        (1.0, "3c010204"),
        (2.64 * 2048.5 / 2048, "3caa54fc"),
        (127.0, "3f800000"),
    ],
)
def test_writer_reproduces_tensorrt_bits(amax: float, hex_text: str) -> None:
    table = CalibrationTable()
    table.set("data", amax)
    assert encode_trt_cache(table, "10.0.1", "MinMaxCalibration") == (
        f"TRT-100001-MinMaxCalibration\ndata: {hex_text}\n".encode()
    )
    assert scale_to_hex(scale_from_amax(amax)) == hex_text


@pytest.mark.parametrize(
    ("version", "number"),
    [
        ("7.2.1", 7201),
        ("8.0.3", 8003),
        ("8.4.1", 8401),
        ("8.6.1.6", 8601),
        ("10.0.1", 100001),
        ("10.1.0", 100100),
        ("10.10.0", 101000),
        ("10.14.1", 101401),
        ("10.16", 101600),
        (DEFAULT_TRT_VERSION, 101600),
    ],
)
def test_version_encoding(version: str, number: int) -> None:
    assert trt_version_int(version) == number
    assert trt_version_int(trt_version_str(number)) == number


@pytest.mark.parametrize("bad", ["10", "ten", "10.1.0-rc", "", "8.10.0", "10.100.0", "10.1.100"])
def test_version_encoding_rejects_unencodable(bad: str) -> None:
    with pytest.raises(QuantbenchError, match="TensorRT version"):
        trt_version_int(bad)


@pytest.mark.parametrize("number", [12345, 999, 0])
def test_version_number_not_a_tensorrt_version(number: int) -> None:
    with pytest.raises(QuantbenchError, match="NV_TENSORRT_VERSION"):
        trt_version_str(number)


@pytest.mark.parametrize("version", ["11.0", "11.1.0", "12.0.0"])
def test_cache_for_tensorrt_11_is_refused(version: str) -> None:
    table = CalibrationTable()
    table.set("x", 1.0)
    with pytest.raises(QuantbenchError, match=r"quantbench quantize.*10\.x"):
        encode_trt_cache(table, version)


def test_header_parse_and_format() -> None:
    assert parse_header("TRT-8401-EntropyCalibration2") == (8401, "8.4.1", "EntropyCalibration2")
    assert parse_header("TRT-101401-MinMaxCalibration\r\n") == (
        101401,
        "10.14.1",
        "MinMaxCalibration",
    )
    assert format_header("10.0.1", "MinMaxCalibration") == "TRT-100001-MinMaxCalibration"
    for unverified in ("EntropyCalibration", "LegacyCalibration"):
        assert format_header("8.6.1", unverified) == f"TRT-8601-{unverified}"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("TRT-8401", "not TRT-<version>-<algorithm>"),
        ("TRT-8401-Percentile", "unknown calibration algorithm 'Percentile'"),
        ("TRT-x-EntropyCalibration2", "not TRT-<version>-<algorithm>"),
        # versions no TensorRT writes: 5 digits, leading zeros, TensorRT 11+ (no caches), 90.x
        ("TRT-12345-EntropyCalibration2", "version 12345 is no TensorRT that writes caches"),
        ("TRT-08401-EntropyCalibration2", "version 08401 is no TensorRT"),
        ("TRT-001000-EntropyCalibration2", "version 001000 is no TensorRT"),
        ("TRT-110000-EntropyCalibration2", "version 110000 is no TensorRT"),
        ("TRT-900001-EntropyCalibration2", "version 900001 is no TensorRT"),
        ("TRT-0-EntropyCalibration2", "version 0 is no TensorRT"),
        ("TRT-8401-EntropyCalibration2 ", "not TRT-<version>-<algorithm>"),
    ],
)
def test_bad_headers(header: str, message: str) -> None:
    with pytest.raises(QuantbenchError, match=rf"^c\.cache:1: .*{message}"):
        decode_trt_cache(f"{header}\ndata: 3caa4a58\n".encode(), "c.cache")


def test_writer_refuses_unknown_algorithm() -> None:
    table = CalibrationTable(algorithm="Percentile")
    with pytest.raises(QuantbenchError, match="Percentile"):
        encode_trt_cache(table)


# --- TensorRT cache: special values and invalid scales -----------------------------------------

SPECIAL_CACHE = (
    b"TRT-101303-MinMaxCalibration\n"
    b"/encoder/Cast_2_output_0: 3f800000\n"
    b"/model.22/ConstantOfShape_1_output_0: 0\n"
    b"/Constant_3_output_0_output: 7c010204\n"
    b"/encoder/Log_output_0: 7f800000\n"
)


def test_special_values_round_trip_with_allow_invalid() -> None:
    table = decode_trt_cache(SPECIAL_CACHE, "mpnet.cache")
    # 7c010204 (FLT_MAX/127) is a finite scale whose float32 amax overflows: flagged, but the
    # scale itself is writable, so only the +inf scale makes the writer refuse.
    assert table.invalid() == [
        "/model.22/ConstantOfShape_1_output_0",
        "/Constant_3_output_0_output",
        "/encoder/Log_output_0",
    ]
    assert encode_trt_cache(table, allow_invalid=True) == SPECIAL_CACHE
    with pytest.raises(QuantbenchError, match="'/encoder/Log_output_0': infinite"):
        encode_trt_cache(table)


def test_zero_scale_is_written_without_allow_invalid() -> None:
    """TensorRT itself writes 0 for all-zero tensors, so a zero amax is not refused."""
    table = CalibrationTable()
    table.set("zeros", 0.0)
    assert encode_trt_cache(table, "10.14.1") == b"TRT-101401-EntropyCalibration2\nzeros: 0\n"


@pytest.mark.parametrize(
    ("hex_text", "problem"),
    [
        ("bf800000", "is a negative scale"),
        ("80000000", "is a negative scale"),
        ("ff800000", "is a negative scale"),
        ("7fc00001", "is NaN"),
        ("7f800001", "is NaN"),
        # fewer than 8 digits: a subnormal or below-2**-95 scale, as a cut value reads
        ("1", r"has 1 hex digits \(scale 1\.4e-45\)"),
        ("3ce0", r"has 4 hex digits \(scale 2\.18e-41\)"),
        ("800000", r"has 6 hex digits \(scale 1\.18e-38\)"),  # smallest normal: still refused
        ("fffffff", r"has 7 hex digits \(scale 2\.52e-29\)"),
        ("03caa54f", "starts with 0"),
        ("00000000", "starts with 0"),
        ("", "is not hex digits"),
        ("3caa 4fc", "is not hex digits"),
        ("3caa54fcf", "has 9 hex digits"),
    ],
)
def test_values_tensorrt_never_writes_are_refused(hex_text: str, problem: str) -> None:
    """A damaged value must not be read as another scale (the 3ce0 cut made a 2.18e-41 scale
    that quantize applied: accuracy 0.918 -> 0.168)."""
    data = f"TRT-8401-EntropyCalibration2\nok: 3f800000\nodd tensor: {hex_text}\n".encode()
    with pytest.raises(
        QuantbenchError, match=rf"^odd\.cache:3: tensor 'odd tensor': value .*{problem}.*restore"
    ) as info:
        decode_trt_cache(data, "odd.cache")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("bits", "problem"),
    [
        (0xBF800000, "negative"),
        (0x7FC00001, "NaN"),
        (0x7F800000, "infinite"),
        (0x00000001, "below 2\\*\\*-95"),
        (0x0FFFFFFF, "below 2\\*\\*-95"),
    ],
)
def test_writer_refuses_scales_the_reader_would_refuse(bits: int, problem: str) -> None:
    table = CalibrationTable()
    table.entries["odd tensor"] = TableEntry.from_scale(
        np.array(bits, dtype=np.uint32).view(np.float32)[()]
    )
    with pytest.raises(QuantbenchError, match=f"tensor 'odd tensor': {problem}"):
        encode_trt_cache(table)


def test_smallest_cache_scale_is_read_and_written() -> None:
    data = b"TRT-8401-EntropyCalibration2\nsmall: 10000000\n"
    table = decode_trt_cache(data, "s.cache")
    assert float(table.scale("small")) == 2.0**-95
    assert encode_trt_cache(table) == data


@pytest.mark.parametrize("amax", [math.nan, -1.0, math.inf, 1e39])
def test_writer_refuses_invalid_amax(amax: float) -> None:
    table = CalibrationTable()
    table.set("good", 1.0)
    table.set("conv1 : out", amax)
    with pytest.raises(QuantbenchError, match="tensor 'conv1 : out'"):
        encode_trt_cache(table)


@pytest.mark.parametrize("name", ["", "two\nlines"])
def test_writer_refuses_unwritable_names(name: str) -> None:
    table = CalibrationTable()
    table.set(name, 1.0)
    with pytest.raises(QuantbenchError, match="name"):
        encode_trt_cache(table)


def test_decoder_tolerates_crlf_and_missing_final_newline() -> None:
    table = decode_trt_cache(b"TRT-8401-EntropyCalibration2\r\na:0: 3f800000\r\nb: 0", "crlf")
    assert [(n, _bits(e.scale)) for n, e in table.entries.items()] == [
        ("a:0", 0x3F800000),
        ("b", 0),
    ]


# --- TensorRT cache: bad input -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", r"c\.cache:1: .*empty"),
        (b"   \n", r"c\.cache:1: .*empty"),
        (b"data: 3caa4a58\n", r"c\.cache:1: .*header.*missing"),
        (b"data 2.640000104904175\n", r"c\.cache:1: .*onnxruntime's write_calibration_table"),
        (b"data:2.64\n", r"c\.cache:1: .*dynamic-range text"),
        (b'{"data": [0, 1]}', r"c\.cache:1: .*JSON"),
        (b"\x0c\x00\x00\x00\x00\x00", r"c\.cache:1: .*binary"),
        (b"TRT-8401-EntropyCalibration2\na: 3f800000\nno colon here\n", r"c\.cache:3: no ':'"),
        (b"TRT-8401-EntropyCalibration2\na: 3f80000g\n", r"c\.cache:2: tensor 'a': value"),
        (b"TRT-8401-EntropyCalibration2\na: 13f800000\n", r"c\.cache:2: tensor 'a': value"),
        (b"TRT-8401-EntropyCalibration2\na:3f800000\n", r"c\.cache:2: tensor 'a': value"),
        (b"TRT-8401-EntropyCalibration2\na: \n", r"c\.cache:2: tensor 'a': value"),
        (b"TRT-8401-EntropyCalibration2\n: 3f800000\n", r"c\.cache:2: empty tensor name"),
        (
            b"TRT-8401-EntropyCalibration2\na: 3f800000\nb: 0\na: 3f800000\n",
            r"c\.cache:4: .*line 2",
        ),
        (
            b"TRT-8401-EntropyCalibration2\na: 3f800000b: 3caa4a58\n",
            r"c\.cache:2: 'a: 3f800000b: 3caa4a58' holds two entries",
        ),
        (b"TRT-8401-EntropyCalibration2\na: 0b: 3caa4a58\n", r"c\.cache:2: .*two entries"),
        (b"TRT-8401-EntropyCalibration2\n\xff\xfe: 1\n", r"c\.cache:2: not UTF-8"),
    ],
)
def test_bad_caches(data: bytes, message: str) -> None:
    with pytest.raises(QuantbenchError, match=message):
        decode_trt_cache(data, "c.cache")


@needs_fixtures
def test_ort_text_cache_is_recognised_and_refused() -> None:
    path = ORT_FIXTURES / "calibration.cache"
    with pytest.raises(QuantbenchError, match="onnxruntime's write_calibration_table text"):
        decode_trt_cache(path.read_bytes(), str(path))
    with pytest.raises(QuantbenchError, match="not a calibration table .*onnxruntime's"):
        read_table(path)


# --- quantbench JSON ---------------------------------------------------------------------------


def _small_table() -> CalibrationTable:
    table = CalibrationTable(
        method="entropy",
        provenance=Provenance(model_hash="abc", num_samples=8, tool_version="0.1.0"),
    )
    table.set("input:0", 2.64)
    # 0x3cbc64c0 is one of the ~1% of scales for which (127 * s) / 127 != s in float32
    scale = np.array(0x3CBC64C0, dtype=np.uint32).view(np.float32)[()]
    table.entries["é layer"] = TableEntry.from_scale(scale, method="trt")
    return table


GOLDEN_JSON = """{
  "format": "quantbench-table",
  "version": 1,
  "method": "entropy",
  "algorithm": "EntropyCalibration2",
  "provenance": {
    "model_hash": "abc",
    "data_fingerprint": "",
    "num_samples": 8,
    "tool_version": "0.1.0",
    "trt_version": ""
  },
  "tensors": {
    "input:0": {
      "amax": 2.64,
      "scale": 0.020787402987480164,
      "scale_hex": "3caa4a58",
      "method": "entropy"
    },
    "é layer": {
      "amax": 2.920651912689209,
      "scale": 0.022997260093688965,
      "scale_hex": "3cbc64c0",
      "method": "trt"
    }
  }
}
"""


def test_json_golden_text() -> None:
    assert encode_json_table(_small_table()).decode("utf-8") == GOLDEN_JSON


def test_json_is_deterministic_and_lossless() -> None:
    table = _small_table()
    first = encode_json_table(table)
    assert encode_json_table(table) == first
    back = decode_json_table(first, "t.json")
    _assert_tables_equal(back, table)
    assert (back.method, back.algorithm, back.provenance) == (
        table.method,
        table.algorithm,
        table.provenance,
    )
    assert back.entries["é layer"].exact_scale is not None
    assert encode_json_table(back) == first


@pytest.mark.parametrize(
    ("document", "message"),
    [
        # 1e-40 / 127 = 7.87e-43 in float32 (numpy): subnormal, below finfo(float32).tiny
        (
            {"format": "quantbench-table", "version": 1, "tensors": {"X": {"amax": 1e-40}}},
            r"^t\.json: tensor 'X': amax 1e-40 gives a subnormal FP32 scale \(7\.88e-43; the "
            r"smallest usable amax is 1\.5e-36\); recalibrate",
        ),
        # 1e-44 / 127 rounds to 0 in float32: not "zero, negative, Inf or NaN"
        (
            {"format": "quantbench-table", "version": 1, "tensors": {"X": {"amax": 1e-44}}},
            r"^t\.json: tensor 'X': amax 1e-44 gives an FP32 scale \(amax / 127\) that "
            "underflows to 0",
        ),
        # the exact scale of a table converted from a cache: bits 0x00000001 (subnormal)
        (
            {
                "format": "quantbench-table",
                "version": 1,
                "tensors": {"X": {"amax": 1.78e-43, "scale_hex": "1"}},
            },
            r"tensor 'X': amax 1\.78e-43 gives a subnormal FP32 scale \(1\.4e-45",
        ),
        ({"X": [-1e-40, 1e-40]}, r"tensor 'X': amax 1e-40 gives a subnormal FP32 scale"),
    ],
)
def test_json_subnormal_scales_are_refused(document: dict, message: str) -> None:
    assert 0 < np.float32(1e-40) / np.float32(127) < np.finfo(np.float32).tiny
    assert np.float32(1e-44) / np.float32(127) == 0
    with pytest.raises(QuantbenchError, match=message):
        decode_json_table(json.dumps(document).encode(), "t.json")


def test_json_smallest_normal_scale_and_zero_are_read() -> None:
    tiny = float(np.finfo(np.float32).tiny)
    document = {
        "format": "quantbench-table",
        "version": 1,
        "tensors": {"small": {"amax": tiny * 127}, "zeros": {"amax": 0.0}},
    }
    table = decode_json_table(json.dumps(document).encode(), "t.json")
    assert float(table.scale("small")) == tiny
    assert table.amax("zeros") == 0.0


def test_json_non_finite_values_are_strings() -> None:
    table = CalibrationTable()
    for name, amax in [("nan", math.nan), ("inf", math.inf), ("ninf", -math.inf), ("neg0", -0.0)]:
        table.set(name, amax)
    data = encode_json_table(table)

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in output")

    tensors = json.loads(data, parse_constant=refuse)["tensors"]
    assert [tensors[n]["amax"] for n in ("nan", "inf", "ninf")] == ["nan", "inf", "-inf"]
    back = decode_json_table(data, "t.json")
    _assert_tables_equal(back, table)
    assert math.copysign(1.0, back.amax("neg0")) < 0
    assert back.invalid() == ["nan", "inf", "ninf", "neg0"]


def test_json_amax_only_entries_are_accepted() -> None:
    data = b'{"format": "quantbench-table", "version": 1, "tensors": {"x": {"amax": 3}}}'
    table = decode_json_table(data, "hand.json")
    assert table.amax("x") == 3.0
    assert _bits(table.scale("x")) == _bits(scale_from_amax(3.0))


def _quantbench_json(tensors: object, **extra: object) -> bytes:
    doc = {"format": "quantbench-table", "version": 1, "tensors": tensors, **extra}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"settings": {"a": 1}}', "JSON but not a calibration table"),
        (b"{}", "JSON but not a calibration table"),
        (b'{"format": "onnx-ranges", "tensors": {}}', "'onnx-ranges' is not 'quantbench-table'"),
        (b'{"format": "quantbench-table", "version": 2, "tensors": {}}', "version 2"),
        (_quantbench_json([]), "'tensors' must be an object"),
        (_quantbench_json({"x": {"scale": 1.0}}), "tensor 'x': missing 'amax'"),
        (_quantbench_json({"x": {"amax": "big"}}), r"tensor 'x'\.amax: expected a number"),
        (_quantbench_json({"x": {"amax": True}}), r"tensor 'x'\.amax: expected a number"),
        (_quantbench_json({"x": 2.0}), "tensor 'x': expected an object"),
        (_quantbench_json({"x": {"amax": 1.0, "scale_hex": "xyz"}}), "not 1-8 hex digits"),
        (_quantbench_json({"x": {"amax": 5.0, "scale_hex": "3caa4a58"}}), "does not match"),
        (
            _quantbench_json({"x": {"amax": 2.64, "scale": 1.0, "scale_hex": "3caa4a58"}}),
            "disagree",
        ),
        (_quantbench_json({"x": {"amax": 1.0, "method": 3}}), r"method: expected a string"),
        (_quantbench_json({}, provenance=[1]), "'provenance' must be an object"),
        (_quantbench_json({}, provenance={"num_samples": "many"}), "bad provenance"),
        (
            b'{"format": "quantbench-table", "version": 1, '
            b'"tensors": {"x": {"amax": 1}, "x": {"amax": 2}}}',
            "key 'x' appears twice",
        ),
        (b'{"format": "quantbench-table", "version": 1, "tensors": {', r"t\.json:1:\d+: invalid"),
        (b"\xff{}", "not UTF-8"),
    ],
)
def test_bad_json(data: bytes, message: str) -> None:
    with pytest.raises(QuantbenchError, match=message):
        decode_json_table(data, "t.json")


# --- onnxruntime JSON and flatbuffers: fixtures -------------------------------------------------


@needs_fixtures
def test_ort_json_fixture_reads_symmetric_amax() -> None:
    raw = json.loads((ORT_FIXTURES / "calibration.json").read_text())
    table = read_table(ORT_FIXTURES / "calibration.json")
    assert list(table.entries) == list(raw)
    for name, (low, high) in raw.items():
        assert table.amax(name) == max(abs(low), abs(high))
    assert any(abs(low) > high for low, high in raw.values())  # asymmetric ranges exist


@needs_fixtures
def test_ort_flatbuffers_fixture_matches_ort_reader() -> None:
    trt_table = pytest.importorskip("onnxruntime.quantization.CalTableFlatBuffers.TrtTable")
    data = (ORT_FIXTURES / "calibration.flatbuffers").read_bytes()
    root = trt_table.TrtTable.GetRootAs(data, 0)
    ort_pairs = [
        (root.Dict(i).Key().decode(), root.Dict(i).Value().decode())
        for i in range(root.DictLength())
    ]
    table = decode_ort_flatbuffers(data, "calibration.flatbuffers")
    assert [(name, float(text)) for name, text in ort_pairs] == list(table.amaxes().items())
    assert len(table) == 175
    assert list(table.entries) == sorted(table.entries, reverse=True)  # ORT's stored order


@needs_fixtures
def test_ort_json_and_flatbuffers_fixtures_agree() -> None:
    """That 2022 ORT wrote max(|lo|, |hi|) into the flatbuffers; our JSON reading agrees."""
    from_json = read_table(ORT_FIXTURES / "calibration.json")
    from_flatbuffers = read_table(ORT_FIXTURES / "calibration.flatbuffers")
    assert from_json.amaxes() == dict(from_flatbuffers.amaxes())


@needs_fixtures
def test_truncated_flatbuffers_are_rejected() -> None:
    data = (ORT_FIXTURES / "calibration.flatbuffers").read_bytes()
    for cut in (8, 100, len(data) // 2, len(data) - 4):  # the last 3 bytes are padding
        with pytest.raises(QuantbenchError, match="calibration.flatbuffers"):
            decode_ort_flatbuffers(data[:cut], "calibration.flatbuffers")
    corrupt = bytearray(data)
    corrupt[0:4] = (len(data) + 100).to_bytes(4, "little")
    with pytest.raises(QuantbenchError, match="outside the"):
        decode_ort_flatbuffers(bytes(corrupt), "x.flatbuffers")


# --- onnxruntime: cross-checks against its own writer and generated reader ---------------------


def _ort_quantization():
    return pytest.importorskip("onnxruntime.quantization.quant_utils")


def test_our_flatbuffers_equal_ort_writer_bytes(tmp_path: Path) -> None:
    quant_utils = _ort_quantization()
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

    rng = np.random.default_rng(7)
    names = _random_names(rng, 60)
    amaxes = np.float32(10.0) ** rng.uniform(-6, 6, len(names)).astype(np.float32)
    ranges = {
        n: (np.array(-a, np.float32), np.array(a, np.float32))
        for n, a in zip(names, amaxes, strict=True)
    }
    quant_utils.write_calibration_table(
        TensorsData(CalibrationMethod.MinMax, ranges), str(tmp_path)
    )
    table = CalibrationTable()
    for name, amax in zip(names, amaxes, strict=True):
        table.set(name, float(amax))
    assert encode_ort_flatbuffers(table) == (tmp_path / "calibration.flatbuffers").read_bytes()
    from_ort_json = read_table(tmp_path / "calibration.json")
    assert from_ort_json.amaxes() == table.amaxes()
    assert from_ort_json.algorithm == "MinMaxCalibration"


def test_ort_reads_our_flatbuffers() -> None:
    trt_table = pytest.importorskip("onnxruntime.quantization.CalTableFlatBuffers.TrtTable")
    table = _random_table(np.random.default_rng(11), 80, exact=False)
    root = trt_table.TrtTable.GetRootAs(encode_ort_flatbuffers(table), 0)
    pairs = {
        root.Dict(i).Key().decode("utf-8"): float(root.Dict(i).Value())
        for i in range(root.DictLength())
    }
    assert pairs == table.amaxes()
    assert list(pairs) == sorted(pairs, reverse=True)


def test_ort_tensors_data_json_and_signed_max_pitfall(tmp_path: Path) -> None:
    """Current ORT writes max(lo, hi) into its flatbuffers; its JSON keeps the true range."""
    quant_utils = _ort_quantization()
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        TensorData,
        TensorsData,
        save_tensors_data,
    )

    data = {
        "a:0": TensorData(lowest=np.array(-1.5, np.float32), highest=np.array(2.25, np.float32)),
        "b c": TensorData(lowest=np.float32(-3.0), highest=np.float32(1.0)),
    }
    tensors = TensorsData(CalibrationMethod.Entropy, data)
    quant_utils.write_calibration_table(tensors, str(tmp_path))
    save_tensors_data(tensors, tmp_path / "saved.json")
    plain_dict_dir = tmp_path / "plain"
    plain_dict_dir.mkdir()
    quant_utils.write_calibration_table(dict(tensors.items()), str(plain_dict_dir))
    expected = {"a:0": 2.25, "b c": 3.0}
    for path in (tmp_path / "calibration.json", tmp_path / "saved.json"):
        table = read_table(path)
        assert table.amaxes() == expected
        assert table.method == "onnxruntime:entropy"
    assert read_table(plain_dict_dir / "calibration.json").amaxes() == expected
    assert read_table(tmp_path / "calibration.flatbuffers").amax("b c") == 1.0  # ORT's pitfall
    ours = decode_ort_flatbuffers(encode_ort_flatbuffers(read_table(tmp_path / "saved.json")), "")
    assert ours.amax("b c") == 3.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"t": [1.0]}', "JSON but not a calibration table"),
        (b'{"t": [-1.0, "x"]}', "tensor 't': expected a number"),
        (b'{"t": [[], []]}', "tensor 't': empty range"),
        (b'{"CLS": "TensorsData", "data": {"t": {"lowest": 1}}}', "expected .min, max. or lowest"),
    ],
)
def test_bad_ort_json(data: bytes, message: str) -> None:
    with pytest.raises(QuantbenchError, match=message):
        decode_json_table(data, "ort.json")


@pytest.mark.parametrize(
    ("amax", "problem"),
    [
        (math.nan, "NaN"),
        (-2.0, "negative"),
        (-0.0, "negative"),
        (math.inf, "infinite"),
        (1e39, "beyond the float32 range"),
        (1e-40, "below the smallest normal float32"),
    ],
)
def test_flatbuffers_writer_refuses_values_ort_cannot_read(amax: float, problem: str) -> None:
    table = CalibrationTable()
    table.set("t 1:0", amax)
    with pytest.raises(QuantbenchError, match=f"tensor 't 1:0': amax .* is {problem}"):
        encode_ort_flatbuffers(table)
    back = decode_ort_flatbuffers(encode_ort_flatbuffers(table, allow_invalid=True), "")
    assert _same(back.amax("t 1:0"), amax)


def test_flatbuffers_bad_values_and_garbage() -> None:
    table = CalibrationTable()
    table.set("x", 1.0)
    good = encode_ort_flatbuffers(table)
    assert good.count(b"1.0\x00") == 1
    with pytest.raises(QuantbenchError, match="value '1_0' is not a decimal number"):
        decode_ort_flatbuffers(good.replace(b"1.0\x00", b"1_0\x00"), "x.fb")
    with pytest.raises(QuantbenchError, match="too short"):
        decode_ort_flatbuffers(b"\x04\x00\x00\x00", "x.fb")
    garbage = np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(QuantbenchError, match="x.fb: not an onnxruntime"):
        decode_ort_flatbuffers(garbage, "x.fb")


def test_empty_tables_in_every_format() -> None:
    empty = CalibrationTable()
    assert encode_trt_cache(empty) == b"TRT-101600-EntropyCalibration2\n"
    for fmt in ("trt", "json", "ort-flatbuffers"):
        data = encode_table(empty, fmt)
        assert detect_format(data) == ("json" if fmt == "json" else fmt)


# --- randomised round trips --------------------------------------------------------------------

_NAME_CHARS = list("abcXYZ019_./-:() [],*") + ["é", "ß", "张", "🙂", "\t", "Ω"]


def _random_names(rng: np.random.Generator, count: int) -> list[str]:
    names: dict[str, None] = {}
    while len(names) < count:
        length = int(rng.integers(1, 24))
        name = "".join(rng.choice(_NAME_CHARS, length))
        names[name + ":" * int(rng.integers(0, 2))] = None  # some end with ':'
    return list(names)


def _random_table(rng: np.random.Generator, count: int, exact: bool) -> CalibrationTable:
    """Cache-like tables (``exact``: random float32 scale bits, subnormals included) or
    calibrator-like ones (float64 amax over 30 decades, normal float32 range)."""
    table = CalibrationTable(method="random", provenance=Provenance(model_hash="h", num_samples=3))
    for name in _random_names(rng, count):
        if exact:
            # every scale a cache holds: 8 hex digits (from 2**-95) or 0
            bits = int(rng.integers(0x10000000, 0x7C000000)) if rng.random() > 0.1 else 0
            scale = np.array(bits, dtype=np.uint32).view(np.float32)[()]
            table.entries[name] = TableEntry.from_scale(scale, method="trt")
        else:
            table.set(name, float(10.0 ** rng.uniform(-15, 15)))
    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tables_round_trip_through_trt_cache(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for exact in (True, False):
        table = _random_table(rng, 300, exact)
        data = encode_trt_cache(table, "8.6.1")
        back = decode_trt_cache(data, "random.cache")
        assert list(back.entries) == list(table.entries)
        assert [_bits(e.scale) for e in back.entries.values()] == [
            _bits(e.scale) for e in table.entries.values()
        ]
        assert encode_trt_cache(back) == data
        if exact:
            assert back.amaxes() == table.amaxes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tables_round_trip_through_json(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for exact in (True, False):
        table = _random_table(rng, 300, exact)
        data = encode_json_table(table)
        back = decode_json_table(data, "random.json")
        _assert_tables_equal(back, table)
        assert back.provenance == table.provenance
        assert encode_json_table(back) == data


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tables_round_trip_through_flatbuffers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for exact in (True, False):
        table = _random_table(rng, 300, exact)
        # subnormal amax values are refused by default (onnxruntime's std::stof rejects them)
        data = encode_ort_flatbuffers(table, allow_invalid=exact)
        back = decode_ort_flatbuffers(data, "random.flatbuffers")
        assert back.amaxes() == table.amaxes()
        assert list(back.entries) == sorted(table.entries, reverse=True)


# --- dispatcher --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["trt", "json", "ort-flatbuffers"])
def test_write_then_read_every_format(tmp_path: Path, fmt: str) -> None:
    table = _random_table(np.random.default_rng(5), 50, exact=False)
    path = write_table(table, tmp_path / f"table{FORMAT_SUFFIX[fmt]}", fmt, trt_version="10.1")
    assert path.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    back = read_table(path)
    assert set(back.entries) == set(table.entries)
    for name in table.entries:
        assert _bits(back.scale(name)) == _bits(table.scale(name))
    if fmt == "trt":
        assert path.read_bytes().startswith(b"TRT-100100-EntropyCalibration2\n")


@needs_fixtures
@pytest.mark.parametrize(
    ("name", "detected"),
    [
        ("trt7201_entropy2_model_convert.cache", "trt"),
        ("ort_write_calibration_table/calibration.json", "ort-json"),
        ("ort_write_calibration_table/calibration.flatbuffers", "ort-flatbuffers"),
        ("ort_write_calibration_table/calibration.cache", None),
        ("trt8401_entropy2_cnn_depthwise.onnx", None),
    ],
)
def test_detect_format_of_fixtures(name: str, detected: str | None) -> None:
    assert detect_format((FIXTURES / name).read_bytes()) == detected


@needs_fixtures
def test_fixture_converts_between_formats(tmp_path: Path) -> None:
    source = FIXTURES / "trt8401_entropy2_cnn_depthwise.cache"
    table = read_table(source)
    json_path = write_table(table, tmp_path / "t.json", "json")
    assert detect_format(json_path.read_bytes()) == "json"
    cache_path = write_table(read_table(json_path), tmp_path / "t.cache", "trt")
    assert cache_path.read_bytes() == source.read_bytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a calibration table .*empty"),
        (b"\x89PNG\r\n\x1a\n" + bytes(64), "not a calibration table .*binary"),
        (b"hello world\n", "not a calibration table"),
    ],
)
def test_read_table_rejects_foreign_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "foreign.bin"
    path.write_bytes(content)
    with pytest.raises(QuantbenchError, match=rf"^{re.escape(str(path))}: {message}"):
        read_table(path)


def test_read_table_path_errors(tmp_path: Path) -> None:
    with pytest.raises(QuantbenchError, match="no such file"):
        read_table(tmp_path / "missing.cache")
    with pytest.raises(QuantbenchError, match="is a folder"):
        read_table(tmp_path)


def test_write_table_checks_before_touching_the_file(tmp_path: Path) -> None:
    table = CalibrationTable()
    table.set("x", math.nan)
    target = tmp_path / "t.cache"
    target.write_bytes(b"previous")
    with pytest.raises(QuantbenchError, match="tensor 'x'"):
        write_table(table, target, "trt")
    assert target.read_bytes() == b"previous"
    with pytest.raises(QuantbenchError, match="table format 'onnx'"):
        write_table(table, target, "onnx")  # type: ignore[arg-type]
    with pytest.raises(QuantbenchError, match="does not exist"):
        write_table(CalibrationTable(), tmp_path / "nowhere" / "t.json", "json")


def test_format_for_path() -> None:
    assert [format_for_path(f"x{s}") for s in FORMAT_SUFFIX.values()] == list(FORMAT_SUFFIX)
    assert format_for_path("calib.CACHE") == "trt"
    with pytest.raises(QuantbenchError, match="cannot tell the table format"):
        format_for_path("table.txt")
