"""Bad-cache fuzzing: every single-character corruption of a real TensorRT cache.

The invariant (a TensorRT cache has no checksum, so this is the most a reader can promise):

* a corruption is refused with one line ``file:line: ...``, or
* the table read is the original except in the one field the corruption hit, and then only
  in ways the format cannot tell from an honest file:

  - a hex digit replaced by another hex digit: that one value is another well-formed value
    (8 digits, positive, finite, normal: never a subnormal, zero, NaN or negative one);
  - a character of a tensor name: that one entry has another name (its value is unchanged); a
    name the model lacks is caught by the model check of quantize/compare (tested below);
  - a character of the header: another well-formed TensorRT version or algorithm label.

  Everything else (separators, line breaks, deletions inside a value) leaves the table
  identical or is refused: values never change silently.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from quantbench.errors import QuantbenchError
from quantbench.table.trt_cache import decode_trt_cache, scale_bits

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "trt_calib_caches"
# tf2onnx names with ':' (Conv__54:0: the parser splits on the last ':'), and TensorRT's own
# names with spaces and brackets ((Unnamed Layer* 33) [Shuffle]_output); about 6 s together
CACHES = ["trt8401_entropy2_cnn_depthwise.cache", "trt7201_entropy2_model_convert.cache"]
REPLACEMENTS = "0fg: \n"
HEX = set("0123456789abcdefABCDEF")

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"fixtures not found at {FIXTURES}")


def _fields(text: str) -> list[tuple[int, str]]:
    """For each character position, (line number from 0, field): header | name | sep | value |
    newline."""
    out: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.split("\n")):
        if lineno == 0:
            kinds = ["header"] * len(line)
        else:
            name, _, value = line.rpartition(": ")
            kinds = ["name"] * len(name) + ["sep"] * 2 + ["value"] * len(value)
        out.extend((lineno, kind) for kind in kinds)
        out.append((lineno, "newline"))
    return out[: len(text)]


def _mutants(text: str):
    for pos in range(len(text)):
        yield pos, None, text[:pos] + text[pos + 1 :]
        for char in REPLACEMENTS:
            if char != text[pos]:
                yield pos, char, text[:pos] + char + text[pos + 1 :]


def _entries(table) -> list[tuple[str, int]]:
    return [(name, scale_bits(e.scale)) for name, e in table.entries.items()]


def _check_accepted(original, got, lineno: int, field: str, char: str | None) -> str | None:
    """Why ``got`` breaks the invariant (None: it holds)."""
    want, have = _entries(original), _entries(got)
    if len(have) != len(want):
        return f"{len(have)} entries, not {len(want)}"
    header_same = (got.algorithm, got.provenance.trt_version) == (
        original.algorithm,
        original.provenance.trt_version,
    )
    if field != "header" and not header_same:
        return "header changed"
    for index, ((name, bits), (old_name, old_bits)) in enumerate(zip(have, want, strict=True)):
        hit = index == lineno - 1
        if bits != old_bits:
            if not (hit and field == "value" and char is not None and char in HEX):
                return f"value of {old_name!r} changed silently"
            scale = float(np.array(bits, dtype=np.uint32).view(np.float32))
            if not (math.isfinite(scale) and scale >= 2.0**-95):
                return f"value of {old_name!r} became {scale!r}"
        if name != old_name and not (hit and field == "name"):
            return f"name {old_name!r} became {name!r}"
    return None


@pytest.mark.parametrize("name", CACHES)
def test_every_single_character_corruption_is_refused_or_harmless(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    text = data.decode()
    original = decode_trt_cache(data, "fuzz.cache")
    fields = _fields(text)
    refused = accepted = 0
    broken: list[str] = []
    for pos, char, mutant in _mutants(text):
        lineno, field = fields[pos]
        try:
            got = decode_trt_cache(mutant.encode(), "fuzz.cache")
        except QuantbenchError as exc:
            message = str(exc)
            assert message.startswith("fuzz.cache:") and "\n" not in message, message
            refused += 1
            continue
        accepted += 1
        if why := _check_accepted(original, got, lineno, field, char):
            broken.append(f"pos {pos} ({field} of line {lineno + 1}) {char!r}: {why}")
    assert not broken, f"{len(broken)} silent changes, e.g. {broken[:5]}"
    # the fuzz reached both outcomes: name and hex-for-hex edits read through, the rest refused
    assert refused > 1000 and accepted > 1000


@pytest.fixture()
def tinycnn_cache(run_cli, tmp_path) -> tuple[Path, str]:
    from conftest import require_example

    example = require_example()
    cache = tmp_path / "t.cache"
    code, _, err = run_cli(
        "calibrate", example / "tinycnn.onnx", "--data", example / "calib.npz",
        "--method", "minmax", "-o", cache,
    )  # fmt: skip
    assert code == 0, err
    return example / "tinycnn.onnx", cache.read_text()


def test_quantize_refuses_a_cut_value_in_one_line(run_cli, tmp_path, tinycnn_cache):
    """The newcomer's repro: a value cut to 4 hex digits made scale 2.18e-41 and exit 0."""
    model, text = tinycnn_cache
    lines = text.split("\n")
    index = next(i for i, line in enumerate(lines) if line.startswith("/Flatten_output_0: "))
    lines[index] = "/Flatten_output_0: 3ce0"
    bad = tmp_path / "bad.cache"
    bad.write_text("\n".join(lines))
    code, _, err = run_cli("quantize", model, "--table", bad, "-o", tmp_path / "q.onnx")
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: {bad}:{index + 1}: tensor '/Flatten_output_0': value '3ce0' has 4 hex digits "
        "(scale 2.18e-41); TensorRT writes 8 for every scale above 2.5e-29 and '0' for zero; "
        "the cache is damaged or not a TensorRT cache: restore it or calibrate again"
    ]
    assert not (tmp_path / "q.onnx").exists()


def test_a_renamed_tensor_is_caught_by_the_model_check(run_cli, tmp_path, tinycnn_cache):
    """A corrupted name reads through the parser (the fuzz invariant); quantize then refuses
    the table because a tensor to quantize is missing and an unknown one is present."""
    model, text = tinycnn_cache
    renamed = tmp_path / "renamed.cache"
    renamed.write_text(text.replace("\n/Relu_output_0: ", "\n/Relu_outpu_0: "))
    code, _, err = run_cli("quantize", model, "--table", renamed, "-o", tmp_path / "q.onnx")
    assert code == 2
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "lacks tensors to quantize: 1 missing, e.g. /Relu_output_0" in line
    assert "this model does not have (e.g. /Relu_outpu_0)" in line
    assert not (tmp_path / "q.onnx").exists()
