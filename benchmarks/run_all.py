"""Run every quantbench benchmark against its peer, print the tables, write the results JSON.

Each benchmark measures ours and the peer's figures in the same run, every job in its own
process (see benchmarks/_jobs.py). Results go to benchmarks/_work/results.json, with the
machine they were measured on.

    .venv/bin/python benchmarks/run_all.py [--repeat N] [--only NAME,...]
    (NAME: speed, calibration, compare, real_cnn, executors)

``speed`` (benchmarks/zoo/bench_speed.py) is the headline: ``quantbench calibrate`` as whole
processes against plain FP32 onnxruntime on every real corpus model (made by ``make bench-zoo``;
a model without its files is reported as skipped) and the ResNet-18-shaped one.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_calibration  # noqa: E402
import bench_compare  # noqa: E402
import bench_executors  # noqa: E402
import bench_real_cnn  # noqa: E402
from _jobs import DEFAULT_REPEAT, WORK, machine_info, make_console, write_json  # noqa: E402
from zoo import bench_speed  # noqa: E402

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "speed": bench_speed.run,
    "calibration": bench_calibration.run,
    "compare": bench_compare.run,
    "real_cnn": bench_real_cnn.run,
    "executors": bench_executors.run,
}
RESULTS = WORK / "results.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="runs per job; the fastest counts"
    )
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help="comma-separated subset of: " + ", ".join(BENCHMARKS),
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    console = make_console()
    document: dict[str, Any] = {"machine": machine_info(), "repeat": args.repeat, "benchmarks": {}}
    failed = []
    for name in chosen:
        start = time.perf_counter()
        try:
            result = BENCHMARKS[name](repeat=args.repeat, console=console)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            console.print(f"[red]{name} failed[/red]: {exc}")
            traceback.print_exc()
            result = {"benchmark": name, "status": "failed", "error": str(exc)}
            failed.append(name)
        result["benchmark_seconds"] = round(time.perf_counter() - start, 1)
        document["benchmarks"][name] = result
        console.print()
    write_json(RESULTS, document)
    console.print(f"wrote {RESULTS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
