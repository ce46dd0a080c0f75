"""How often the INT8 epilogue's float32 requantization differs from a float64 chain, and by
how much, on every INT8 case of the GPU grid (issue 39 item 4). Runs on the CPU: the kernels
match the float32 epilogue bit for bit (``run_gpu_checks.py``: exact fraction 1, 0 LSB on the
H100), so comparing the two references says what the kernels do::

    .venv/bin/python tests/gpu/epilogue_gap.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)


def main() -> int:
    names = sorted(harness.CASES)
    total = differ = 0
    worst = 0
    print("| case | mode | outputs | differ from the float64 chain | max LSB |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        spec = harness.CASES[name]
        for mode in ("int8_i8", "int8_tie"):
            seed = names.index(name) * 10 + harness.MODES.index(mode)  # run_gpu_checks' seeds
            inputs = harness.make_inputs(spec, mode, seed)
            acc, v = harness.int8_expected(spec, inputs)
            gap = harness.chain_gap(acc, inputs.b, spec, harness._int8_output_scale(v))
            n = int(np.prod(v.shape))
            total += n
            differ += round(gap["f64_chain_differs"] * n)
            worst = max(worst, int(gap["f64_chain_max_lsb"]))
            print(f"| {name} | {mode} | {n} | {gap['f64_chain_differs']:.2e} | "
                  f"{gap['f64_chain_max_lsb']} |")  # fmt: skip
    print(f"\nall: {differ} of {total} outputs differ ({differ / total:.2e}), at most {worst} LSB")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
