"""Launch one DWConv2D timing shape a few times, for Nsight Compute on the device machine.

    ncu --clock-control none -k regex:depthwise --launch-skip 2 --launch-count 1 \\
        python3 tests/gpu/profile_dwconv.py dw3x3_s1_mobilenet int8_i8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)


def main(argv: list[str]) -> int:
    import torch

    name, mode = argv
    spec = harness.BENCH_CASES[name]
    lib = harness.get_library()
    gen = torch.Generator(device="cuda").manual_seed(3)
    x, w, b = harness.device_inputs(spec, mode, gen)
    out_dtype = torch.int8 if mode == "int8_i8" else x.dtype
    y = torch.empty(spec.output_shape, dtype=out_dtype, device="cuda")
    params = harness.mode_params(spec, mode, 0.05)
    pointers = (x.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr())
    for _ in range(4):
        code = lib.forward(harness.kernel_dtype(mode), *pointers, params)
        if code != 0:
            print(f"CUDA error {code}", file=sys.stderr)
            return 1
    torch.cuda.synchronize()
    print(f"{name} {mode}: path {lib.last_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
