"""Run the DWConv2D GPU checks and timings in one go and write results.json and results.md.

Meant for one call on the device machine (see plugins/dwconv2d/README.md):

    python3 tests/gpu/run_gpu_checks.py --out "$OUT"

Correctness: every case of dwconv_gpu_harness.CASES in every mode. Timing: the BENCH_CASES
shapes, ours against cuDNN through torch.nn.functional.conv2d (median of CUDA-event timings).
Exits 1 when any check failed, 2 when no GPU is usable.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

from quantbench.fileio import write_text_atomic  # noqa: E402  (harness puts the repo on the path)
from quantbench.machine import describe_gpu  # noqa: E402


def environment() -> dict[str, Any]:
    """What ran: GPU (name and the peak bandwidth "% of peak" divides by), driver,
    torch/cuDNN, nvcc, onnxruntime."""
    import torch

    gpu = describe_gpu(0)
    info: dict[str, Any] = {
        "gpu": gpu.name,
        "peak_GBps": None if math.isnan(gpu.gbps) else round(gpu.gbps, 1),
        "peak_source": gpu.source,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "library": str(harness.get_library().path),
        "cudnn_loaded_by_library": harness.get_library().cudnn_version(),
    }
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        info["onnxruntime"] = None
    for key, command in {
        "driver": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        "nvcc": [harness.kl.find_nvcc() or "nvcc", "--version"],
    }.items():
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            info[key] = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else None
        except OSError:
            info[key] = None
    return info


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 2 GiB (bytes read + written / time): the practical ceiling."""
    import torch

    src = torch.empty(2**29, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    us = harness.time_cuda(lambda: dst.copy_(src), warmup=3, reps=10, inner=5)
    return 2 * src.numel() * 4 / us / 1e3


def correctness_rows() -> list[dict[str, Any]]:
    runner = harness.gpu_runner(harness.get_library())
    names = sorted(harness.CASES)
    rows = []
    for name in names:
        for mode in harness.MODES:
            seed = names.index(name) * 10 + harness.MODES.index(mode)
            row = _checked(runner, name, mode, seed)
            rows.append(row)
            if row["path"] == "cudnn":  # the same case on our own kernels (the fallback)
                with harness.cudnn_mode(harness.get_library(), harness.kl.CUDNN_OFF):
                    rows.append(_checked(runner, name, mode, seed) | {"cudnn_mode": "off"})
            lib = harness.get_library()
            if (
                row["path"] in ("depthwise_rows", "depthwise_global")
                and mode != "f32"
                and lib.has_mma
            ):
                # the same case on the tensor-core kernel (where the per-shape table does not
                # take depthwise_mma but the plane fits it)
                with harness.mma_mode(lib, harness.kl.MMA_ON):
                    params = harness.mode_params(harness.CASES[name], mode, 0.05)
                    if lib.forward_path(params, harness.kernel_dtype(mode)) == "depthwise_mma":
                        rows.append(_checked(runner, name, mode, seed) | {"mma_mode": "on"})
            if row["path"] == "depthwise_global":  # the same case on depthwise_rows
                with harness.global_off():
                    rows.append(_checked(runner, name, mode, seed) | {"global_mode": "off"})
            if row["path"] in ("depthwise_mma", "gemm_mma"):
                # our tensor-core kernels: the same case on the CUDA-core kernels as well
                with harness.mma_mode(lib, harness.kl.MMA_OFF):
                    rows.append(_checked(runner, name, mode, seed) | {"mma_mode": "off"})
    return rows


def _checked(runner: Any, name: str, mode: str, seed: int) -> dict[str, Any]:
    try:
        row = harness.check_case(runner, name, mode, seed=seed)
    except Exception as exc:  # keep going: one broken case must not hide the others
        row = harness.describe(name, harness.CASES[name]) | {
            "mode": mode,
            "passed": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=3),
        }
    row["path"] = harness.get_library().last_path()
    return row


def bench_rows(reps: int) -> list[dict[str, Any]]:
    rows = []
    for name in harness.BENCH_CASES:
        try:
            rows.extend(harness.bench_case(harness.get_library(), name, reps=reps))
        except Exception as exc:
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
    return rows


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _percent(gbps: float, peak: float | None) -> str:
    return "-" if not peak else f"{100 * gbps / peak:.0f} %"


def markdown(env: dict[str, Any], rows: list[dict[str, Any]], bench: list[dict[str, Any]]) -> str:
    passed = sum(1 for r in rows if r.get("passed"))
    peak = env.get("peak_GBps")
    lines = [
        f"# DWConv2D GPU checks on {env.get('gpu')}",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
        f"Correctness: {passed}/{len(rows)} passed.",
        "",
        "| case | mode | path | input | weight | max err / max ref | ORT err | exact int8 "
        "| max LSB | passed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        err = r.get("max_err_over_max_ref", r.get("max_abs_err"))
        lines.append(
            f"| {r['case']} | {r['mode']} | {r.get('path')}"
            f"{' (cuDNN off)' if r.get('cudnn_mode') == 'off' else ''}"
            f"{' (MMA on)' if r.get('mma_mode') == 'on' else ''}"
            f"{' (MMA off)' if r.get('mma_mode') == 'off' else ''}"
            f"{' (global off)' if r.get('global_mode') == 'off' else ''} "
            f"| {r['input']} | {r['weight']} "
            f"| {_fmt(err)} | {_fmt(r.get('ort_max_err_over_max_ref'))} "
            f"| {_fmt(r.get('exact_fraction'), 6)} | {_fmt(r.get('max_lsb_diff'))} "
            f"| {'yes' if r.get('passed') else 'NO ' + r.get('error', '')} |"
        )
    lines += [
        "",
        "Timing (median per launch, CUDA events; cuDNN via torch F.conv2d, TF32 off, "
        "cudnn.benchmark on):",
        "",
        f"Peak: {_fmt(peak, 4)} GB/s ({env.get('peak_source')}); device-to-device copy measured "
        f"{_fmt(env.get('copy_GBps'), 4)} GB/s. Each timed call reads and writes buffers of its "
        "own (rotated, 4x the L2 in all); launches replayed from a CUDA graph.",
        "",
        "| case | mode | path | ours us | ours GB/s | % of peak | x vs our f32 | cuDNN us "
        "| cuDNN / ours | diff vs cuDNN "
        "| our other kernel us (cuDNN off / MMA on / MMA off / global off) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    f32_us = {r["case"]: r["ours_us"] for r in bench if r.get("mode") == "f32"}
    for r in bench:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} | | | | | | |")
            continue
        ratio = f32_us[r["case"]] / r["ours_us"] if r["case"] in f32_us else None
        lines.append(
            f"| {r['case']} | {r['mode']} | {r['path']} | {_fmt(r['ours_us'], 4)} "
            f"| {_fmt(r['ours_GBps'], 4)} | {_percent(r['ours_GBps'], peak)} "
            f"| {_fmt(ratio)} | {_fmt(r.get('cudnn_us'), 4)} "
            f"| {_fmt(r.get('speedup_vs_cudnn'))} | {_fmt(r.get('max_diff_vs_cudnn_over_max'))} "
            f"| {_fmt(r.get('kernels_us'), 4)} {r.get('kernels_path', '')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json/.md")
    parser.add_argument("--reps", type=int, default=30, help="timed repetitions per shape")
    parser.add_argument("--skip-bench", action="store_true", help="correctness only")
    parser.add_argument("--skip-checks", action="store_true", help="timing only")
    args = parser.parse_args(argv)
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(f"run_gpu_checks: {reason}", file=sys.stderr)
        return 2
    started = time.time()
    env = environment()
    rows = [] if args.skip_checks else correctness_rows()
    if not args.skip_bench:
        env["copy_GBps"] = round(copy_bandwidth_gbps(), 1)
    bench = [] if args.skip_bench else bench_rows(args.reps)
    env["seconds"] = round(time.time() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        args.out / "results.json",
        json.dumps({"environment": env, "correctness": rows, "timing": bench}, indent=1),
    )
    summary = markdown(env, rows, bench)
    write_text_atomic(args.out / "results.md", summary)
    print(summary)
    return 0 if all(r.get("passed") for r in rows) and not any("error" in r for r in bench) else 1


if __name__ == "__main__":
    sys.exit(main())
