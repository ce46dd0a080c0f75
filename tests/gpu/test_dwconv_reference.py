"""The oracle of the GPU checks, tested on the CPU (runs in CI, no GPU or torch needed).

A GPU test is only as good as its reference and its pass/fail rules: the float64 reference must
agree with onnxruntime's Conv, and the checker must accept right outputs and reject outputs with
one unwritten element or one wrong value.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

pytest.importorskip("onnxruntime")

# Every case but the 41x41 one (1681 taps: slow in numpy, and a plain depthwise conv otherwise).
REFERENCE_CASES = sorted(name for name in harness.CASES if name != "dw_k41_d3_direct")


@pytest.mark.parametrize("name", REFERENCE_CASES)
def test_float64_reference_matches_onnxruntime(name: str) -> None:
    spec = harness.CASES[name]
    inputs = harness.make_inputs(spec, "f32", seed=3)
    ours = harness.reference_f64(spec, inputs.x, inputs.w, inputs.b)
    ort = harness.onnxruntime_reference_f32(spec, inputs.x, inputs.w, inputs.b)
    assert ort is not None and ort.shape == ours.shape == spec.output_shape
    assert np.abs(ours - ort).max() <= 1e-5 * np.abs(ours).max()


def test_per_batch_weights_differ_from_shared_weights() -> None:
    """Per-batch weights really are used per item: item 1 with item 0's filters differs."""
    spec = harness.CASES["dw_pb_k3"]
    inputs = harness.make_inputs(spec, "f32", seed=4)
    y = harness.reference_f64(spec, inputs.x, inputs.w, inputs.b)
    shared = harness.ConvSpec(
        spec.batch, spec.in_channels, spec.in_h, spec.in_w, spec.out_channels, spec.kernel,
        spec.strides, spec.pads, spec.dilations, spec.group, False, harness.kl.BIAS_NONE,
    )  # fmt: skip
    y0 = harness.reference_f64(shared, inputs.x, inputs.w[0], None)
    bias = inputs.b.reshape(spec.batch, -1, 1, 1)
    assert np.allclose(y[0], y0[0] + bias[0])
    assert not np.allclose(y[1], y0[1] + bias[1])


def _true_runner(fault: str | None = None):
    """A stand-in for the GPU: the correctly rounded result, optionally with one planted fault."""

    def run(spec, mode, inputs, output_scale, poison):
        if mode.startswith("int8"):
            scales = harness.int8_scales(mode)
            acc, v = harness.int8_expected(spec, inputs, scales)
            out = (
                v.copy()
                if mode == "int8_f32"
                else harness.requantize_reference(acc, inputs.b, spec, output_scale, scales)
            )
        else:
            ref = harness.reference_f64(spec, inputs.x, inputs.w, inputs.b)
            out = ref.astype(np.float16 if mode == "f16" else np.float32)
        flat = out.reshape(-1)
        middle = flat.size // 2
        if fault == "unwritten":
            flat[middle] = poison
        elif fault == "off_by_one":
            if mode in ("int8_i8", "int8_tie"):
                flat[middle] = flat[middle] + 1 if flat[middle] < 127 else 126
            else:
                flat[middle] = np.nextafter(flat[middle], np.inf, dtype=flat.dtype)
        elif fault == "small_error":
            flat[middle] += flat.dtype.type(1e-3 * float(np.abs(flat).max()))
        return out

    return run


CHECK_CASES = ["dw_k3_s2_asym", "g3_kg6_d2", "dense_pb_k3"]


@pytest.mark.parametrize("mode", harness.MODES)
@pytest.mark.parametrize("name", CHECK_CASES)
def test_checker_accepts_correct_outputs(name: str, mode: str) -> None:
    row = harness.check_case(_true_runner(), name, mode, seed=5)
    assert row["passed"], row


@pytest.mark.parametrize("mode", harness.MODES)
def test_checker_rejects_an_unwritten_element(mode: str) -> None:
    row = harness.check_case(_true_runner("unwritten"), "g3_kg6_d2", mode, seed=6)
    assert not row["passed"]
    assert row["unwritten"] == 1


@pytest.mark.parametrize("mode", ["int8_i8", "int8_f32", "int8_tie"])
def test_checker_rejects_one_lsb_off(mode: str) -> None:
    row = harness.check_case(_true_runner("off_by_one"), "dense_pb_k3", mode, seed=7)
    assert not row["passed"]


def _round_half_up_runner():
    """A stand-in that requantizes with round half up (what a fast path that misses ties does)."""

    def run(spec, mode, inputs, output_scale, poison):
        scales = harness.int8_scales(mode)
        _, v = harness.int8_expected(spec, inputs, scales)
        q = np.floor(v.astype(np.float64) / output_scale + 0.5)
        return np.clip(q, -128, 127).astype(np.int8)

    return run


@pytest.mark.parametrize("name", ["dwr_k3_s2_w20", "dwr_k7_c20", "dw_pb_k3"])
def test_tie_mode_has_ties_and_rejects_round_half_up(name: str) -> None:
    good = harness.check_case(_true_runner(), name, "int8_tie", seed=11)
    assert good["passed"], good
    assert good["ties"] >= 0.05 * np.prod(harness.CASES[name].output_shape)
    bad = harness.check_case(_round_half_up_runner(), name, "int8_tie", seed=11)
    assert not bad["passed"] and bad["mismatches"] > 0


@pytest.mark.parametrize("mode", ["f32", "f16"])
def test_checker_rejects_a_small_float_error(mode: str) -> None:
    row = harness.check_case(_true_runner("small_error"), "dw_k3_s2_asym", mode, seed=8)
    assert not row["passed"]
    assert math.isfinite(row["max_abs_err"])


def test_int8_output_scale_saturates_some_outputs() -> None:
    row = harness.check_case(_true_runner(), "dense_pb_k3", "int8_i8", seed=9)
    assert 0.0 < row["saturated_fraction"] < 0.05
