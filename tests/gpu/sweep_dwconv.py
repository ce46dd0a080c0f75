"""Time the depthwise timing shapes with several prebuilt kernel libraries (tuning builds).

Each library is one build of plugins/dwconv2d/kernels/dwconv2d.cu with different compile-time
knobs (-D DWCONV2D_...); only our kernels are timed (no cuDNN, no correctness checks: run
run_gpu_checks.py for those), with the same method as the timing table:

    python3 tests/gpu/sweep_dwconv.py --out "$OUT" build/variants/*.so
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
    args = parser.parse_args(argv)
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(f"sweep_dwconv: {reason}", file=sys.stderr)
        return 2
    names = args.cases or [n for n in harness.BENCH_CASES if n.startswith("dw")]
    rows = []
    for path in args.libraries:
        lib = harness.kl.KernelLibrary(path)
        for name in names:
            for row in harness.bench_case(lib, name, reps=args.reps, cudnn=False):
                rows.append(row | {"library": path.name})
    f32 = {(r["library"], r["case"]): r["ours_us"] for r in rows if r["mode"] == "f32"}
    lines = ["| library | case | mode | us | GB/s | x vs f32 |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f32[(r["library"], r["case"])] / r["ours_us"]
        lines.append(
            f"| {r['library']} | {r['case']} | {r['mode']} | {r['ours_us']:.1f} "
            f"| {r['ours_GBps']:.0f} | {ratio:.2f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "sweep.json", json.dumps(rows, indent=1))
    write_text_atomic(args.out / "sweep.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
