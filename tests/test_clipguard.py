"""Clipping guard, second rule (issue 10, Build 5): quantized ops whose isolated SQNR falls below
``--sqnr-floor`` are named with the tensor, the fraction clipped and the built-in method with the
lowest expected INT8 error for it; the expected errors are checked against the raw values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import require_example

from quantbench import calibrators as registry
from quantbench.choose.clipguard import (
    DEFAULT_SQNR_FLOOR_DB,
    SUGGESTED_METHODS,
    OpDrift,
    check_sqnr_floor,
    sqnr_flags,
    sqnr_warning,
)
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import StatsFile, TensorStats
from quantbench.table.build import build_table


def _spike_and_tail() -> np.ndarray:
    """Issue 10's recognizer conv input: most values in one spike at 0.06, a tail to 0.42."""
    rng = np.random.default_rng(0)
    return np.concatenate([np.full(160_000, 0.0605), rng.uniform(-0.04, 0.42, 40_000)]).astype(
        np.float32
    )


def _int8_mse(values: np.ndarray, amax: float) -> float:
    """Fake-quantize the raw values (symmetric INT8) and measure the squared error directly."""
    step = amax / 127
    q = np.clip(np.rint(values / step), -127, 127) * step
    return float(np.mean((q - values.astype(np.float64)) ** 2))


def _stats(values: np.ndarray, name: str = "conv_in") -> StatsFile:
    t = TensorStats(name)
    t.update(values)
    return StatsFile("h", "d", 1, {name: t})


def _op(sqnr: float, amax: float, node: str = "conv", tensor: str = "conv_in") -> OpDrift:
    return OpDrift(node, "Conv", f"{node}_out", tensor, amax, sqnr, 0.2)


def test_op_below_the_floor_is_named_with_the_method_of_lowest_error():
    y = _spike_and_tail()
    stats = _stats(y)
    table = build_table(stats, "entropy")
    amax = table.amax("conv_in")
    flags = sqnr_flags(
        [_op(25.0, amax, "fine"), _op(-4.9, amax, "bad"), _op(math.nan, amax, "undef")],
        DEFAULT_SQNR_FLOOR_DB,
        stats,
        table,
    )
    # undefined ranks worst, 25 dB is above the floor
    assert [f.node for f in flags] == ["undef", "bad"]
    flag = flags[1]
    assert flag.tensor == "conv_in" and flag.method == "entropy" and flag.fraction == 0.2
    # Independent reference: the built-in method whose amax gives the lowest INT8 error on the
    # raw values (not the histogram the guard reads).
    errors = {
        m: _int8_mse(y, registry.compute_amax(m, stats["conv_in"]))
        for m in SUGGESTED_METHODS
        if registry.canonical(m) != "entropy"
    }
    assert flag.suggestion == min(errors, key=errors.get)
    assert errors[flag.suggestion] < _int8_mse(y, amax)
    # clipped: beyond the threshold by more than half an INT8 step (within it rounds to 127)
    assert flag.suggestion_fraction == pytest.approx(
        np.mean(np.abs(y) > flag.suggestion_amax * (1 + 0.5 / 127)), abs=1e-4
    )
    text = sqnr_warning(flags, "int8:entropy", listed_by="--json FILE")
    assert text.splitlines()[0] == (
        "int8:entropy: 2 quantized op(s) below the isolated SQNR floor of 20 dB (--sqnr-floor):"
    )
    assert "bad (Conv): isolated SQNR -4.9 dB; input conv_in: entropy threshold" in text
    assert "undef (Conv): isolated SQNR undefined" in text
    undefined = flags[0].message()  # no threshold advice: NaN/Inf or a zero reference
    assert "undefined: its FP32 or INT8 output holds NaN or Inf" in undefined
    assert "lowest expected" not in undefined and "--exclude" not in undefined
    shorter = sqnr_warning(flags, "int8:entropy", shown=1, listed_by="--json FILE")
    assert shorter.splitlines()[-1] == "  ... and 1 more (--json FILE lists them all)"


def test_no_better_method_says_the_error_comes_from_elsewhere():
    """Uniform values: minmax already has the lowest expected error of the built-in methods, so
    a low SQNR is not the threshold's fault (e.g. the weights) and no method is suggested."""
    y = np.random.default_rng(1).uniform(-1, 1, 100_000).astype(np.float32)
    stats = _stats(y)
    table = build_table(stats, "minmax")
    (flag,) = sqnr_flags([_op(12.0, table.amax("conv_in"))], 20.0, stats, table)
    errors = {
        m: _int8_mse(y, registry.compute_amax(m, stats["conv_in"])) for m in SUGGESTED_METHODS
    }
    assert errors["minmax"] < min(errors.values()) / 0.8  # the reference: nothing 1 dB better
    assert flag.suggestion is None
    assert "no built-in method has a lower expected error" in flag.message()
    # without statistics (a given Q/DQ model) the op is still named, nothing is suggested
    (bare,) = sqnr_flags([_op(12.0, 1.0)], 20.0)
    assert bare.method is None and bare.suggestion is None and "--exclude" not in bare.message()


def test_sqnr_floor_must_be_a_number():
    assert check_sqnr_floor(-math.inf) == -math.inf
    for bad in (math.nan, math.inf):
        with pytest.raises(QuantbenchError, match="--sqnr-floor"):
            check_sqnr_floor(bad)


def _isolated_below(doc: dict, floor: float) -> set[str]:
    """From the layer table itself: quantized ops whose isolated SQNR is under ``floor``."""
    return {
        r["node"]
        for r in doc["layers"]
        if r["view"] == "isolated" and r["quantized"] and r["amax"] is not None
        and r["sqnr_db"] < floor
    }  # fmt: skip


def test_compare_flags_ops_below_the_floor_on_the_console_and_in_the_json(run_cli, tmp_path):
    """entropy:slides on the bundled ReLU network (accuracy 91.8% -> 36.8%): every op whose
    isolated SQNR is under 20 dB is named, grouped under one header, with mse suggested."""
    example = require_example()
    common = (
        "--model", example / "tinycnn.onnx", "--data", example / "eval.npz",
        "--calib-data", example / "calib.npz", "--max-samples", "64", "--no-latency",
    )  # fmt: skip
    code, _, err = run_cli(
        "compare", "fp32", "int8:entropy:slides", *common, "--json", tmp_path / "s.json"
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "s.json").read_text())
    flagged = {f["node"] for f in doc["flags"]}
    assert flagged == _isolated_below(doc, 20.0) and "/block_conv1/Conv" in flagged
    assert doc["sqnr_floor_db"] == 20.0
    first = doc["flags"][0]
    assert first["rule"] == "sqnr_floor" and first["candidate"] == "B"
    assert first["method"] == "entropy:slides" and first["suggestion"] == "mse"
    assert first["tensor"] in {t["name"] for t in doc["calibration"]["tensors"]}
    assert first["isolated_sqnr_db"] == min(
        r["sqnr_db"] for r in doc["layers"] if r["view"] == "isolated" and r["quantized"]
    )
    text = " ".join(err.split())
    assert f"int8:entropy:slides: {len(flagged)} quantized op(s) below the isolated SQNR floor" in (
        text
    )
    lines = [ln for ln in err.splitlines() if "(Conv): isolated SQNR" in ln or "(Add)" in ln]
    assert len(lines) == len(flagged)
    # the default method keeps every op above 20 dB here; a higher floor is honoured
    code, _, err = run_cli(
        "compare", "fp32", "int8", *common, "--sqnr-floor", "25", "--json", tmp_path / "d.json"
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "d.json").read_text())
    assert {f["node"] for f in doc["flags"]} == _isolated_below(doc, 25.0)
    assert _isolated_below(doc, 20.0) == set()


def test_bad_sqnr_floor_fails_before_inference(run_cli, tmp_path):
    example = require_example()
    code, _, err = run_cli(
        "compare", "fp32", "int8", "--model", example / "tinycnn.onnx",
        "--data", example / "eval.npz", "--calib-data", example / "calib.npz",
        "--sqnr-floor", "nan", "--json", tmp_path / "x.json",
    )  # fmt: skip
    assert code == 2 and "--sqnr-floor" in err and not (tmp_path / "x.json").exists()
