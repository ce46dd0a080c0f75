"""Issue 39's re-scoped INT8 reference: exact int32 sums, then a float32 requantization (one
rounding per step). The kernels match it bit for bit on the GPU; here, on the CPU, the reference
itself is held to the issue's bound against the old float64 chain: at most 1 LSB, and rarely."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
harness = pytest.importorskip("dwconv_gpu_harness")


@pytest.mark.parametrize("mode", ["int8_i8", "int8_tie"])
def test_float32_epilogue_is_within_one_lsb_of_the_float64_chain(mode):
    names = sorted(harness.CASES)
    differ, total = 0.0, 0
    for name in names:
        spec = harness.CASES[name]
        inputs = harness.make_inputs(spec, mode, names.index(name) * 10 + 2)
        acc, v = harness.int8_expected(spec, inputs)
        gap = harness.chain_gap(acc, inputs.b, spec, harness._int8_output_scale(v))
        assert gap["f64_chain_max_lsb"] <= 1, name
        differ += gap["f64_chain_differs"] * v.size
        total += v.size
    assert differ / total < 1e-2  # ties aside, float32 and float64 round alike

