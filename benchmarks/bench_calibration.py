"""Calibration benchmark: ``quantbench calibrate --method all`` against onnxruntime, same run.

On the ResNet-18-shaped model (1x3x224x224, benchmarks/models.py) and the same .npz data at 64
and 256 samples, each job in its own process (so peak RSS is its own):

* ours: ``quantbench calibrate MODEL --data D.npz --method all --no-cache`` (one statistics pass,
  every calibrator's table written);
* peer: ``onnxruntime.quantization.quantize_static`` with Entropy, QDQ, per-channel, symmetric
  INT8 activations and weights (its TensorRT-oriented setting);
* floor: plain FP32 onnxruntime inference over the same samples, same batch size (1: the model's).

Then the second-run case: ``calibrate --method all`` twice with the statistics cache on; the
second run must load the statistics and do no inference.

Targets (the issue's): peer/ours time >= 5x; our peak RSS < 1 GiB and flat from 64 to 256
samples (growth <= 10 %); ours/FP32 time <= 2x.

    .venv/bin/python benchmarks/bench_calibration.py [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _jobs import (  # noqa: E402
    DEFAULT_REPEAT,
    GIB_KIB,
    WORK,
    JobResult,
    ensure_resnet18,
    ensure_resnet18_data,
    machine_info,
    make_console,
    mib_cell,
    ratio,
    ratio_cell,
    run_job,
    seconds_cell,
    verdict,
    write_json,
)

SAMPLE_COUNTS = (64, 256)
CALIB_SEED = 1
OUT = WORK / "calibration"
#: the issue's targets
MIN_SPEEDUP = 5.0
MAX_RSS_KIB = GIB_KIB
MAX_RSS_GROWTH = 0.10
MAX_FP32_RATIO = 2.0


def prepare() -> tuple[Path, dict[int, Path]]:
    """Model and one .npz per sample count (the 64 are the first 64 of the 256)."""
    model = ensure_resnet18()
    data = {n: ensure_resnet18_data(WORK / f"calib{n}.npz", n, CALIB_SEED) for n in SAMPLE_COUNTS}
    return model, data


def measure(model: Path, data: dict[int, Path], repeat: int) -> dict[str, JobResult]:
    """Every job of this benchmark; keys like ``ours-256``."""
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, JobResult] = {}
    for n, path in data.items():
        tables = OUT / f"tables-{n}"
        shutil.rmtree(tables, ignore_errors=True)
        results[f"fp32-{n}"] = run_job(
            "ort-fp32", {"model": str(model), "data": str(path)}, repeat=repeat
        )
        results[f"ours-{n}"] = run_job(
            "qb-calibrate",
            {"model": str(model), "data": str(path), "methods": ["all"], "output": str(tables)},
            repeat=repeat,
        )
        results[f"ort-{n}"] = run_job(
            "ort-quantize-static",
            {
                "model": str(model),
                "data": str(path),
                "output": str(OUT / f"ort-entropy-{n}.onnx"),
                "method": "Entropy",
            },
            repeat=repeat,
        )
    results.update(measure_cached(model, data[max(data)]))
    return results


def measure_cached(model: Path, data: Path) -> dict[str, JobResult]:
    """First run fills an empty statistics cache; the second must be served from it."""
    cache = WORK / "cache" / "calibration-shared"
    args = {"model": str(model), "data": str(data), "methods": ["all"], "use_cache": True}
    first = run_job("qb-calibrate", args, cache_dir=cache)
    second = run_job("qb-calibrate", args, cache_dir=cache, keep_cache=True)
    return {"cache-first": first, "cache-second": second}


def evaluate(results: dict[str, JobResult]) -> dict[str, Any]:
    """Ratios and whether each target is met."""
    top, low = max(SAMPLE_COUNTS), min(SAMPLE_COUNTS)
    speedup = {
        n: ratio(results[f"ort-{n}"].seconds, results[f"ours-{n}"].seconds) for n in SAMPLE_COUNTS
    }
    fp32 = {
        n: ratio(results[f"ours-{n}"].seconds, results[f"fp32-{n}"].seconds) for n in SAMPLE_COUNTS
    }
    rss_top, rss_low = results[f"ours-{top}"].peak_rss_kib, results[f"ours-{low}"].peak_rss_kib
    growth = rss_top / rss_low - 1.0
    second = results["cache-second"]
    return {
        "peer_over_ours_time": speedup,
        "ours_over_fp32_time": fp32,
        "ours_rss_growth": growth,
        "peer_rss_growth": results[f"ort-{top}"].peak_rss_kib / results[f"ort-{low}"].peak_rss_kib
        - 1.0,
        "targets": {
            f"peer/ours time >= {MIN_SPEEDUP:g}x ({top} samples)": speedup[top] >= MIN_SPEEDUP,
            f"our peak RSS < 1 GiB ({top} samples)": rss_top < MAX_RSS_KIB,
            f"our peak RSS flat {low}->{top} (<= {MAX_RSS_GROWTH:.0%})": growth <= MAX_RSS_GROWTH,
            f"ours/FP32 time <= {MAX_FP32_RATIO:g}x ({top} samples)": fp32[top] <= MAX_FP32_RATIO,
            "cached second run does no inference": bool(second.details.get("from_cache")),
        },
    }


def render(console: Console, results: dict[str, JobResult], verdicts: dict[str, Any]) -> None:
    table = Table(
        title="Calibration, ResNet-18-shaped 1x3x224x224, batch 1 (each job its own process)"
    )
    for column in ("job", "samples", "wall", "peak RSS", "note"):
        table.add_column(
            column, justify="right" if column in ("samples", "wall", "peak RSS") else "left"
        )
    labels = {
        "fp32": "plain FP32 onnxruntime inference",
        "ours": "quantbench calibrate --method all --no-cache",
        "ort": "onnxruntime quantize_static Entropy (QDQ, per-channel, symmetric)",
    }
    for n in SAMPLE_COUNTS:
        for kind in ("fp32", "ours", "ort"):
            r = results[f"{kind}-{n}"]
            note = f"{len(r.details['methods'])} tables" if kind == "ours" else ""
            table.add_row(
                labels[kind], str(n), seconds_cell(r.seconds), mib_cell(r.peak_rss_kib), note
            )
    for key, label in (("cache-first", "first run, cache on"), ("cache-second", "second run")):
        r = results[key]
        note = (
            "statistics from cache, no inference"
            if r.details.get("from_cache")
            else "ran inference"
        )
        table.add_row(
            f"quantbench calibrate --method all, {label}",
            str(r.details["samples"]),
            seconds_cell(r.seconds),
            mib_cell(r.peak_rss_kib),
            note,
        )
    console.print(table)

    ratios = Table(title="Ratios (same run)")
    ratios.add_column("measure")
    for n in SAMPLE_COUNTS:
        ratios.add_column(f"{n} samples", justify="right")
    ratios.add_row(
        "onnxruntime Entropy time / ours",
        *(ratio_cell(verdicts["peer_over_ours_time"][n]) for n in SAMPLE_COUNTS),
    )
    ratios.add_row(
        "ours time / plain FP32",
        *(ratio_cell(verdicts["ours_over_fp32_time"][n]) for n in SAMPLE_COUNTS),
    )
    ratios.add_row(
        "onnxruntime Entropy peak RSS / ours",
        *(
            ratio_cell(ratio(results[f"ort-{n}"].peak_rss_kib, results[f"ours-{n}"].peak_rss_kib))
            for n in SAMPLE_COUNTS
        ),
    )
    console.print(ratios)
    console.print(
        f"peak RSS growth {min(SAMPLE_COUNTS)} -> {max(SAMPLE_COUNTS)} samples: "
        f"ours {verdicts['ours_rss_growth']:+.1%}, "
        f"onnxruntime {verdicts['peer_rss_growth']:+.1%}"
    )
    targets = Table(title="Targets")
    targets.add_column("target")
    targets.add_column("result")
    for name, ok in verdicts["targets"].items():
        targets.add_row(name, verdict(ok))
    console.print(targets)


def run(repeat: int = DEFAULT_REPEAT, console: Console | None = None) -> dict[str, Any]:
    """Measure, print, and return this benchmark's results document."""
    console = console or make_console()
    model, data = prepare()
    names = ", ".join(p.name for p in data.values())
    console.print(f"[bold]bench_calibration[/bold]: {model.name}, data {names}")
    results = measure(model, data, repeat)
    verdicts = evaluate(results)
    render(console, results, verdicts)
    return {
        "benchmark": "calibration",
        "model": str(model),
        "batch": 1,
        "repeat": repeat,
        "jobs": {key: r.to_dict() for key, r in results.items()},
        **verdicts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="runs per job; the fastest counts"
    )
    args = parser.parse_args(argv)
    document = run(args.repeat)
    document["machine"] = machine_info()
    write_json(WORK / "calibration.json", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
