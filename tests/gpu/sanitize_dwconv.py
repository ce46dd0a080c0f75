"""Run the DWConv2D grid under compute-sanitizer with exactly sized device buffers.

torch's caching allocator rounds allocations up (512 bytes and more), so a read a few bytes past
a tensor goes unseen by compute-sanitizer there. This runner allocates every tensor with its own
cudaMalloc of exactly its size (through CuPy's runtime bindings, no memory pool), so memcheck
flags any byte read or written outside a tensor, and it checks every result against the same
references as the GPU tests (dwconv_gpu_harness.check_case). On the device machine:

    compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python3 tests/gpu/sanitize_dwconv.py --lib plugins/dwconv2d/build/libdwconv2d_kernels.so

(`--mma on` runs the FP16/INT8 depthwise cases on the tensor-core kernel, depthwise_mma, `--mma off`
on depthwise_rows; the default is the library's per-shape table.)

The grid holds depthwise_rows shapes whose INT8 weight tensor is not a multiple of 4 bytes
(dwr_odd_*: filters of 9, 25 or 49 bytes ending a tensor of 45, 75 or 147 bytes), where a
4-byte filter load that ran past the last filter would be caught. Exits 1 when a case fails its
reference check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

OUT_DTYPES = {
    "f32": np.float32,
    "f16": np.float16,
    "int8_i8": np.int8,
    "int8_f32": np.float32,
    "int8_tie": np.int8,
}


def exact_runner(lib: Any) -> harness.Runner:
    """A runner whose device buffers are each one cudaMalloc of exactly the tensor's bytes."""
    from cupy.cuda import runtime

    h2d, d2h = runtime.memcpyHostToDevice, runtime.memcpyDeviceToHost

    def upload(array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        pointer = runtime.malloc(array.nbytes)
        runtime.memcpy(pointer, array.ctypes.data, array.nbytes, h2d)
        return pointer

    def run(
        spec: Any, mode: str, inputs: harness.CaseInputs, output_scale: float, poison: float
    ) -> np.ndarray:
        out = np.full(spec.output_shape, poison, dtype=OUT_DTYPES[mode])
        pointers = [upload(inputs.x), upload(inputs.w)]
        b = None if inputs.b is None else upload(inputs.b)
        y = upload(out)
        try:
            code = lib.forward(
                harness.kernel_dtype(mode),
                pointers[0],
                pointers[1],
                b,
                y,
                harness.mode_params(spec, mode, output_scale),
                0,
            )
            if code != 0:
                raise RuntimeError(f"forward returned CUDA error {code}")
            runtime.deviceSynchronize()
            runtime.memcpy(out.ctypes.data, y, out.nbytes, d2h)
        finally:
            for pointer in [*pointers, y] + ([] if b is None else [b]):
                runtime.free(pointer)
        return out

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", type=Path, required=True, help="libdwconv2d_kernels.so")
    parser.add_argument("--modes", default="int8_i8,int8_f32,int8_tie", help="comma-separated")
    parser.add_argument("--cudnn", choices=("off", "auto"), default="off")
    parser.add_argument("--cases", default="", help="comma-separated names (default: the grid)")
    parser.add_argument(
        "--mma", choices=("off", "on", "default"), default="default", help="depthwise_mma"
    )
    args = parser.parse_args(argv)
    lib = harness.kl.KernelLibrary(args.lib)
    if lib.has_dispatch:  # else a baseline build from before the cuDNN path: no cuDNN anyway
        lib.set_cudnn_mode(harness.kl.CUDNN_AUTO if args.cudnn == "auto" else harness.kl.CUDNN_OFF)
    if args.mma != "default":  # tensor cores for FP16/INT8 depthwise (default: per-shape table)
        lib.set_mma_mode(harness.kl.MMA_ON if args.mma == "on" else harness.kl.MMA_OFF)
    runner = exact_runner(lib)
    names = args.cases.split(",") if args.cases else sorted(harness.CASES)
    cases = {name: harness.CASES[name] for name in names}
    failed = 0
    total = 0
    for index, name in enumerate(names):
        for mode in args.modes.split(","):
            total += 1
            try:
                row = harness.check_case(runner, name, mode, seed=index * 10, spec=cases[name])
                ok, detail = bool(row["passed"]), ""
            except Exception as exc:  # report and go on
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            failed += not ok
            path = lib.last_path() if lib.has_dispatch else lib.kernel_path(cases[name].to_params())
            print(f"{name} {mode} {path}: {'ok' if ok else 'FAILED ' + detail}")
    print(f"sanitize_dwconv: {total - failed}/{total} cases passed ({args.lib})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
