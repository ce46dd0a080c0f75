"""Comparison benchmark: ``quantbench compare fp32 int8`` against onnxruntime's qdq_loss_debug.

Same ResNet-18-shaped model, 200 evaluation samples, each job in its own process:

* ours: ``quantbench compare fp32 int8 --calib-data calib64.npz --no-latency``: calibration from a
  separate 64-sample set, the INT8 Q/DQ model built, then per-layer drift in both views
  (accumulated: the INT8 model's own activations; isolated: each quantized op re-run on FP32
  inputs) in one streaming pass;
* peer: ``onnxruntime.quantization.qdq_loss_debug`` on the *same* Q/DQ model (written by
  quantbench from the same calibration set): ``modify_model_output_intermediate_tensors`` on the
  float and the Q/DQ model -> ``collect_activations`` (both) -> ``create_activation_matching``
  -> ``compute_activation_error``: the accumulated view only. Its matcher pairs tensor ``X`` with
  ``X_DequantizeLinear_Output``, onnxruntime's own naming, so the model's DQ outputs are renamed
  to that (graph, scales and weights unchanged). The Q/DQ model is built before the peer's clock
  starts: the peer's time excludes calibration, ours includes it.

The peer keeps every activation of every sample in memory (about 110 MB per sample here); it runs
at 50 and 100 samples, and at 200 only when a straight-line fit predicts a peak RSS within
``--peer-rss-budget-gib`` (default 16 GiB: the machine has 24 GiB); otherwise the 200-sample
figures are the fit's prediction, marked as such. Target: our peak RSS flat from 50 to 200.

    .venv/bin/python benchmarks/bench_compare.py [--repeat N] [--peer-rss-budget-gib G]
"""

from __future__ import annotations

import argparse
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

EVAL_SAMPLES = 200
CALIB_SAMPLES = 64
EVAL_SEED, CALIB_SEED = 2, 3
OURS_COUNTS = (50, 200)
PEER_COUNTS = (50, 100)
METHOD = "entropy"
OUT = WORK / "compare"
MAX_RSS_GROWTH = 0.10


def prepare() -> dict[str, Path]:
    """Model, evaluation and calibration sets, and the Q/DQ model both tools analyse."""
    paths = {
        "model": ensure_resnet18(),
        "eval": ensure_resnet18_data(WORK / f"eval{EVAL_SAMPLES}.npz", EVAL_SAMPLES, EVAL_SEED),
        "calib": ensure_resnet18_data(
            WORK / f"compare-calib{CALIB_SAMPLES}.npz", CALIB_SAMPLES, CALIB_SEED
        ),
        "qdq": OUT / f"resnet18.int8.{METHOD}.onnx",
        "qdq_ort_names": OUT / f"resnet18.int8.{METHOD}.ortnames.onnx",
    }
    OUT.mkdir(parents=True, exist_ok=True)
    run_job(
        "qb-quantize",
        {
            "model": str(paths["model"]),
            "calib_data": str(paths["calib"]),
            "outputs": {METHOD: str(paths["qdq"])},
        },
    )
    run_job("ort-debug-names", {"source": str(paths["qdq"]), "output": str(paths["qdq_ort_names"])})
    return paths


def measure_ours(paths: dict[str, Path], repeat: int) -> dict[int, JobResult]:
    return {
        n: run_job(
            "qb-compare",
            {
                "model": str(paths["model"]),
                "data": str(paths["eval"]),
                "calib_data": str(paths["calib"]),
                "method": METHOD,
                "max_samples": n,
            },
            repeat=repeat,
        )
        for n in OURS_COUNTS
    }


def _peer(paths: dict[str, Path], n: int, repeat: int) -> JobResult:
    return run_job(
        "ort-qdq-debug",
        {
            "float_model": str(paths["model"]),
            "qdq_model": str(paths["qdq_ort_names"]),
            "data": str(paths["eval"]),
            "work_dir": str(OUT),
            "max_samples": n,
        },
        repeat=repeat,
    )


def linear_fit(points: dict[int, float], at: int) -> float:
    """Straight line through the two outermost measured points, evaluated at ``at``."""
    low, high = min(points), max(points)
    slope = (points[high] - points[low]) / (high - low)
    return points[high] + slope * (at - high)


def measure_peer(
    paths: dict[str, Path], repeat: int, budget_kib: float
) -> tuple[dict[int, JobResult], dict[str, float]]:
    """Measured runs, plus the 200-sample prediction (and the run itself when it fits)."""
    peer = {n: _peer(paths, n, repeat) for n in PEER_COUNTS}
    predicted = {
        "seconds": linear_fit({n: r.seconds for n, r in peer.items()}, EVAL_SAMPLES),
        "peak_rss_kib": linear_fit({n: r.peak_rss_kib for n, r in peer.items()}, EVAL_SAMPLES),
    }
    if predicted["peak_rss_kib"] <= budget_kib:
        peer[EVAL_SAMPLES] = _peer(paths, EVAL_SAMPLES, repeat)
    return peer, predicted


def evaluate(
    ours: dict[int, JobResult], peer: dict[int, JobResult], predicted: dict[str, float]
) -> dict[str, Any]:
    low, high = min(OURS_COUNTS), max(OURS_COUNTS)
    growth = ours[high].peak_rss_kib / ours[low].peak_rss_kib - 1.0
    peer_high = peer.get(high)
    peer_seconds = peer_high.seconds if peer_high else predicted["seconds"]
    peer_rss = peer_high.peak_rss_kib if peer_high else predicted["peak_rss_kib"]
    views = ours[high].details["layer_rows"]
    return {
        "peer_over_ours_time": {
            low: ratio(peer[low].seconds, ours[low].seconds),
            high: ratio(peer_seconds, ours[high].seconds),
        },
        "peer_over_ours_rss": {
            low: ratio(peer[low].peak_rss_kib, ours[low].peak_rss_kib),
            high: ratio(peer_rss, ours[high].peak_rss_kib),
        },
        "peer_200_measured": peer_high is not None,
        "peer_200_predicted": predicted,
        "ours_rss_growth": growth,
        "targets": {
            f"our peak RSS flat {low}->{high} samples (<= {MAX_RSS_GROWTH:.0%})": growth
            <= MAX_RSS_GROWTH,
            "accumulated and isolated views both computed": bool(
                views.get("accumulated") and views.get("isolated")
            ),
        },
    }


def render(
    console: Console,
    ours: dict[int, JobResult],
    peer: dict[int, JobResult],
    verdicts: dict[str, Any],
) -> None:
    table = Table(
        title="Per-layer comparison, ResNet-18-shaped, batch 1 (each job its own process)"
    )
    for column, justify in (
        ("tool", "left"),
        ("samples", "right"),
        ("wall", "right"),
        ("peak RSS", "right"),
        ("what it computed", "left"),
    ):
        table.add_column(column, justify=justify)
    for n, r in ours.items():
        d = r.details
        rows = d["layer_rows"]
        table.add_row(
            "quantbench compare fp32 int8",
            str(n),
            seconds_cell(r.seconds),
            mib_cell(r.peak_rss_kib),
            f"calibration ({d['calib_samples']} samples) + Q/DQ build + "
            f"{rows.get('accumulated', 0)} accumulated / {rows.get('isolated', 0)} isolated "
            f"layers; top-1 agreement {d['top1_agreement']:.1%}",
        )
    for n, r in peer.items():
        table.add_row(
            "onnxruntime qdq_loss_debug",
            str(n),
            seconds_cell(r.seconds),
            mib_cell(r.peak_rss_kib),
            f"{r.details['tensors_compared']} tensors, accumulated view (xmodel_err) only",
        )
    if not verdicts["peer_200_measured"]:
        p = verdicts["peer_200_predicted"]
        table.add_row(
            "onnxruntime qdq_loss_debug",
            str(EVAL_SAMPLES),
            f"~{p['seconds']:.0f} s",
            f"~{mib_cell(p['peak_rss_kib'])}",
            "[yellow]not run: predicted by a straight-line fit, over the RSS budget[/yellow]",
        )
    console.print(table)
    ratios = Table(title="Ratios (same run; * = peer figure predicted)")
    ratios.add_column("measure")
    star = "" if verdicts["peer_200_measured"] else "*"
    low, high = min(OURS_COUNTS), max(OURS_COUNTS)
    ratios.add_column(f"{low} samples", justify="right")
    ratios.add_column(f"{high} samples{star}", justify="right")
    for key, label in (
        ("peer_over_ours_time", "onnxruntime time / ours"),
        ("peer_over_ours_rss", "onnxruntime peak RSS / ours"),
    ):
        ratios.add_row(label, ratio_cell(verdicts[key][low]), ratio_cell(verdicts[key][high]))
    console.print(ratios)
    console.print(
        f"our peak RSS growth {low} -> {high} samples: {verdicts['ours_rss_growth']:+.1%}"
    )
    for name, ok in verdicts["targets"].items():
        console.print(f"target: {name}: {verdict(ok)}")


def run(
    repeat: int = DEFAULT_REPEAT, peer_budget_gib: float = 16.0, console: Console | None = None
) -> dict[str, Any]:
    """Measure, print, and return this benchmark's results document."""
    console = console or make_console()
    console.print(
        f"[bold]bench_compare[/bold]: {EVAL_SAMPLES} evaluation samples, calibration "
        f"{CALIB_SAMPLES} samples ({METHOD})"
    )
    paths = prepare()
    ours = measure_ours(paths, repeat)
    peer, predicted = measure_peer(paths, repeat, peer_budget_gib * GIB_KIB)
    verdicts = evaluate(ours, peer, predicted)
    render(console, ours, peer, verdicts)
    return {
        "benchmark": "compare",
        "model": str(paths["model"]),
        "qdq_model": str(paths["qdq"]),
        "method": METHOD,
        "repeat": repeat,
        "ours": {n: r.to_dict() for n, r in ours.items()},
        "peer": {n: r.to_dict() for n, r in peer.items()},
        **verdicts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="runs per job; the fastest counts"
    )
    parser.add_argument(
        "--peer-rss-budget-gib",
        type=float,
        default=16.0,
        help="run the peer at 200 samples only if its predicted peak RSS is within this",
    )
    args = parser.parse_args(argv)
    document = run(args.repeat, args.peer_rss_budget_gib)
    document["machine"] = machine_info()
    write_json(WORK / "compare.json", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
