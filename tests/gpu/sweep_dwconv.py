"""Time the depthwise timing shapes with several prebuilt kernel libraries (tuning builds).

Each library is one build of plugins/dwconv2d/kernels/dwconv2d.cu with different compile-time
knobs (-D DWCONV2D_...); only our kernels are timed (no cuDNN, no correctness checks: run
run_gpu_checks.py for those), with the same method as the timing table:

    python3 tests/gpu/sweep_dwconv.py --out "$OUT" build/variants/*.so

``--check`` first runs every depthwise case of the correctness grid (dwconv_gpu_harness.CASES,
all five modes) on each library against the references, so that a tuning build whose knobs
change the kernels' indexing is known correct before its timings are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

from quantbench.fileio import write_text_atomic  # noqa: E402  (harness puts the repo on the path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", type=Path, nargs="+", help="libdwconv2d_kernels.so builds")
    parser.add_argument("--out", type=Path, required=True, help="folder for sweep.json/.md")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per shape")
    parser.add_argument("--cases", nargs="*", default=None, help="BENCH_CASES names")
    parser.add_argument("--check", action="store_true", help="depthwise grid cases first")
    parser.add_argument(
        "--same-as", type=Path, default=None, help="a library whose timed-shape outputs must match"
    )
    args = parser.parse_args(argv)
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(f"sweep_dwconv: {reason}", file=sys.stderr)
        return 2
    names = args.cases or [n for n in harness.BENCH_CASES if n.startswith("dw")]
    checks = []
    if args.check:
        grid = sorted(n for n, c in harness.CASES.items() if c.in_channels == c.group)
        for path in args.libraries:
            lib = harness.kl.KernelLibrary(path)
            runner = harness.gpu_runner(lib)
            for name in grid:
                for mode in harness.MODES:
                    seed = grid.index(name) * 10 + harness.MODES.index(mode)
                    try:
                        row = harness.check_case(runner, name, mode, seed=seed)
                    except Exception as exc:  # one broken case must not hide the others
                        row = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
                    checks.append(
                        {"library": path.name, "case": name, "mode": mode, "path": lib.last_path()}
                        | {k: v for k, v in row.items() if k in ("passed", "error")}
                    )
        for path in args.libraries:
            mine = [c for c in checks if c["library"] == path.name]
            bad = [f"{c['case']}/{c['mode']}" for c in mine if not c["passed"]]
            print(f"check {path.name}: {len(mine) - len(bad)}/{len(mine)} passed {bad[:8]}")
    same = _same_as(args.same_as, args.libraries, names) if args.same_as else []
    rows = []
    for path in args.libraries:
        lib = harness.kl.KernelLibrary(path)
        for name in names:
            for row in harness.bench_case(lib, name, reps=args.reps, cudnn=False, other=False):
                rows.append(row | {"library": path.name})
    f32 = {(r["library"], r["case"]): r["ours_us"] for r in rows if r["mode"] == "f32"}
    lines = [
        "| library | case | mode | path | us | GB/s | x vs f32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f32[(r["library"], r["case"])] / r["ours_us"]
        lines.append(
            f"| {r['library']} | {r['case']} | {r['mode']} | {r['path']} | {r['ours_us']:.1f} "
            f"| {r['ours_GBps']:.0f} | {ratio:.2f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"timing": rows, "checks": checks, "same_as": same}
    write_text_atomic(args.out / "sweep.json", json.dumps(result, indent=1))
    write_text_atomic(args.out / "sweep.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _same_as(reference: Path, libraries: list[Path], names: list[str]) -> list[dict]:
    """The timed shapes in INT8 -> INT8 and FP16 on each library against ``reference`` (same
    inputs): INT8 must be identical (both exact); FP16 is reported as the largest difference."""
    import torch

    ref_lib = harness.kl.KernelLibrary(reference)
    out = []
    for name in names:
        spec = harness.BENCH_CASES[name]
        for mode in ("int8_i8", "f16"):
            gen = torch.Generator(device="cuda").manual_seed(5)
            tensors = harness.device_inputs(spec, mode, gen)
            params = harness.mode_params(spec, mode, 0.05)
            y0 = harness.device_forward(ref_lib, spec, mode, tensors, params)
            for path in libraries:
                lib = harness.kl.KernelLibrary(path)
                y = harness.device_forward(lib, spec, mode, tensors, params)
                torch.cuda.synchronize()
                diff = (y.float() - y0.float()).abs().max().item()  # type: ignore[attr-defined]
                row = {"library": path.name, "case": name, "mode": mode, "path": lib.last_path()}
                out.append(row | {"max_diff": diff, "identical": bool(torch.equal(y, y0))})
                print(f"same-as {path.name} {name} {mode} {row['path']}: max diff {diff}")
    return out


if __name__ == "__main__":
    sys.exit(main())
