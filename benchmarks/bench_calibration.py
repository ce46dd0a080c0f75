"""Calibration benchmark: ``quantbench calibrate --method all`` against its floor and its peer.

Two workloads, each job a whole process of its own (benchmarks/_jobs.py), same samples and same
batch for every job of a workload:

* ``resnet18``: the ResNet-18-shaped model of models.py with a dynamic batch axis, 256 image-like
  samples, batch 32;
* ``bert``: the BERT-like encoder of models.py (12 layers, hidden 384, int64 ``input_ids`` and
  ``attention_mask``, 98 quantized tensors), 256 token sequences of length 128, batch 32.

Jobs: ours = ``quantbench calibrate MODEL --data D --method all --batch-size 32 --no-cache``;
floor = plain FP32 onnxruntime inference over the same samples; peer = onnxruntime
``quantize_static`` with CalibrationMethod.Entropy (QDQ, per-channel, symmetric INT8). Jobs run
in alternating rounds (``--repeat``) and the medians are reported, with CPU seconds (user+sys of
the child, from ``os.wait4``) and peak RSS. onnxruntime's Entropy calibrator holds every
calibrated tensor of every sample in memory (about 110 MB a sample on the encoder), so on the
encoder the peer runs at 32 and 64 samples and runs at the full count only if a straight line
through those predicts a peak RSS within ``--peer-rss-budget-gib``; otherwise its full-count
figures are that line's prediction, marked ``~``.

Also: our batch-1 peak RSS at 64 and 256 samples (< 1 GiB, flat) and the cached second run.
Targets (issue 11): ours / floor <= 1.5x; onnxruntime Entropy / ours >= 8x.

    .venv/bin/python benchmarks/bench_calibration.py [--repeat N] [--samples N] [--batch N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _jobs import (  # noqa: E402
    DEFAULT_REPEAT,
    GIB_KIB,
    WORK,
    JobFailed,
    JobResult,
    ensure_bert,
    ensure_bert_data,
    ensure_resnet18,
    ensure_resnet18_data,
    machine_info,
    make_console,
    mib_cell,
    ratio,
    ratio_cell,
    run_alternating,
    run_job,
    seconds_cell,
    write_json,
)

OUT = WORK / "calibration"
CALIB_SEED = 1
DEFAULT_SAMPLES = 256
DEFAULT_BATCH = 32
#: the peer's probe sizes on a workload whose full run may not fit in memory (whole batches)
PEER_PROBE_BATCHES = (1, 2)
DEFAULT_PEER_RSS_BUDGET_GIB = 8.0
JOB_TIMEOUT_S = 1800.0
#: issue 11's targets
MAX_FLOOR_RATIO = 1.5
MIN_PEER_SPEEDUP = 8.0
MAX_RSS_KIB = GIB_KIB
MAX_RSS_GROWTH = 0.10
BATCH1_SAMPLES = (64, 256)


@dataclass(frozen=True)
class Workload:
    """A model and its data; ``probe_peer``: measure the peer small first (memory)."""

    key: str
    title: str
    model: Callable[[], Path]
    data: Callable[[int], Path]
    probe_peer: bool


WORKLOADS = (
    Workload(
        "resnet18",
        "ResNet-18-shaped, Nx3x224x224",
        lambda: ensure_resnet18(dynamic_batch=True),
        lambda n: ensure_resnet18_data(WORK / f"calib{n}.npz", n, CALIB_SEED),
        probe_peer=False,
    ),
    Workload(
        "bert",
        "BERT-like encoder, 12 layers, hidden 384, int64 tokens [N,128]",
        ensure_bert,
        lambda n: ensure_bert_data(WORK / f"bert-calib{n}.npz", n, CALIB_SEED),
        probe_peer=True,
    ),
)


@dataclass
class Peer:
    """The peer's figures at the full sample count: measured, predicted (``~``), or failed."""

    result: JobResult | None = None
    predicted: bool = False
    error: str | None = None
    probes: dict[int, JobResult] | None = None


def _peer_args(model: Path, data: Path, batch: int, samples: int) -> dict[str, Any]:
    output = OUT / f"{model.stem}-ort-entropy-{samples}.onnx"
    return {
        "model": str(model),
        "data": str(data),
        "output": str(output),
        "method": "Entropy",
        "batch": batch,
        "max_samples": samples,
    }


def _line(probes: dict[int, JobResult], n: int) -> JobResult:
    """The straight line through two probe runs, evaluated at ``n`` samples."""
    (n0, a), (n1, b) = sorted(probes.items())

    def at(y0: float | None, y1: float | None) -> float | None:
        return None if y0 is None or y1 is None else y0 + (y1 - y0) * (n - n0) / (n1 - n0)

    return JobResult(
        a.job,
        at(a.seconds, b.seconds),
        int(at(a.peak_rss_kib, b.peak_rss_kib)),
        at(a.process_seconds, b.process_seconds),
        {"samples": n, "predicted_from": sorted(probes)},
        [],
        at(a.cpu_seconds, b.cpu_seconds),
        at(a.work_cpu_seconds, b.work_cpu_seconds),
    )


def measure(
    work: Workload, samples: int, batch: int, repeat: int, rss_budget_gib: float
) -> tuple[dict[str, JobResult | JobFailed], Peer]:
    """Floor, ours and the peer in alternating rounds; the peer probed first where asked."""
    OUT.mkdir(parents=True, exist_ok=True)
    model, data = work.model(), work.data(samples)
    common = {"model": str(model), "data": str(data)}
    jobs: dict[str, tuple[str, dict[str, Any]]] = {
        "floor": ("ort-fp32", {**common, "batch": batch}),
        "ours": (
            "qb-calibrate",
            {
                **common,
                "methods": ["all"],
                "output": str(OUT / f"tables-{work.key}"),
                "batch_size": batch,
            },
        ),
    }
    probe_sizes = [batch * k for k in PEER_PROBE_BATCHES if batch * k < samples]
    if work.probe_peer and len(probe_sizes) == 2:
        for n in probe_sizes:
            jobs[f"peer-{n}"] = ("ort-quantize-static", _peer_args(model, data, batch, n))
    else:
        probe_sizes = []
        jobs["peer"] = ("ort-quantize-static", _peer_args(model, data, batch, samples))
    results = run_alternating(jobs, repeat=repeat, timeout=JOB_TIMEOUT_S)
    if not probe_sizes:
        return results, _peer_from(results["peer"])
    probes = {n: results[f"peer-{n}"] for n in probe_sizes}
    failed = next((p for p in probes.values() if isinstance(p, JobFailed)), None)
    if failed is not None:
        return results, Peer(error=failed.summary)
    predicted = _line(probes, samples)  # type: ignore[arg-type]
    if predicted.peak_rss_kib <= rss_budget_gib * GIB_KIB:
        full = run_alternating(
            {"peer": ("ort-quantize-static", _peer_args(model, data, batch, samples))},
            repeat=repeat,
            timeout=JOB_TIMEOUT_S,
        )["peer"]
        peer = _peer_from(full)
    else:
        peer = Peer(result=predicted, predicted=True)
    peer.probes = probes  # type: ignore[assignment]
    return results, peer


def _peer_from(result: JobResult | JobFailed) -> Peer:
    if isinstance(result, JobFailed):
        return Peer(error=result.summary)
    return Peer(result=result)


def evaluate(results: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """The two ratios of the issue and their verdicts (``None``: not measurable)."""
    ours, floor = results["ours"], results["floor"]
    ok = isinstance(ours, JobResult) and isinstance(floor, JobResult)
    floor_ratio = ratio(ours.seconds, floor.seconds) if ok else None
    cpu_ratio = ratio(ours.cpu_seconds, floor.cpu_seconds) if ok else None
    speedup = (
        ratio(peer.result.seconds, ours.seconds)
        if peer.result is not None and isinstance(ours, JobResult)
        else None
    )
    return {
        "ours_over_floor_time": floor_ratio,
        "ours_over_floor_cpu": cpu_ratio,
        "peer_over_ours_time": speedup,
        "peer_predicted": peer.predicted,
        "peer_error": peer.error,
        "targets": {
            f"ours / floor <= {MAX_FLOOR_RATIO:g}x": (
                None if floor_ratio is None else floor_ratio <= MAX_FLOOR_RATIO
            ),
            f"onnxruntime Entropy / ours >= {MIN_PEER_SPEEDUP:g}x": (
                None if speedup is None else speedup >= MIN_PEER_SPEEDUP
            ),
        },
    }


def _verdict(ok: bool | None, note: str = "") -> str:
    if ok is None:
        return "[dim]n/a[/dim]" + (f" ({note})" if note else "")
    word = "[green]PASS[/green]" if ok else "[red]MISS[/red]"
    return word + (f" ({note})" if note else "")


def _cpu_cell(seconds: float | None, mark: str = "") -> str:
    return "-" if seconds is None else f"{mark}{seconds:.1f} s"


def render_workload(
    console: Console,
    work: Workload,
    samples: int,
    batch: int,
    results: dict[str, Any],
    peer: Peer,
    verdicts: dict[str, Any],
) -> None:
    table = Table(
        title=f"Calibration, {work.title}, {samples} samples, batch {batch} "
        "(each job its own process; medians of alternating runs)"
    )
    for column in ("job", "samples", "wall", "CPU", "peak RSS", "note"):
        table.add_column(column, justify="left" if column in ("job", "note") else "right")

    def row(label: str, n: int, result: JobResult | JobFailed, note: str = "", mark: str = ""):
        if isinstance(result, JobFailed):
            table.add_row(label, str(n), "FAILED", "-", "-", result.summary)
            return
        runs = f"{len(result.all_seconds)} run(s)" if result.all_seconds else ""
        table.add_row(
            label,
            str(n),
            mark + seconds_cell(result.seconds),
            _cpu_cell(result.cpu_seconds, mark),
            mark + mib_cell(result.peak_rss_kib),
            "; ".join(x for x in (note, runs) if x),
        )

    row("plain FP32 onnxruntime inference (floor)", samples, results["floor"])
    ours = results["ours"]
    tables = (
        f"{len(ours.details.get('methods', []))} tables, {ours.details.get('tensors')} tensors"
        if isinstance(ours, JobResult)
        else ""
    )
    row("quantbench calibrate --method all --no-cache", samples, ours, tables)
    label = "onnxruntime quantize_static Entropy (QDQ, per-channel, symmetric)"
    for n, probe in (peer.probes or {}).items():
        row(label, n, probe, "probe")
    if peer.error is not None:
        table.add_row(label, str(samples), "FAILED", "-", "-", peer.error)
    elif peer.result is not None:
        note = (
            "~ predicted: straight line through the probes (its peak RSS would exceed the budget)"
            if peer.predicted
            else ""
        )
        row(label, samples, peer.result, note, "~" if peer.predicted else "")
    table.add_section()
    targets = list(verdicts["targets"].values())
    table.add_row(
        "ours / floor",
        "",
        ratio_cell(verdicts["ours_over_floor_time"]),
        ratio_cell(verdicts["ours_over_floor_cpu"]),
        "",
        _verdict(targets[0], f"target <= {MAX_FLOOR_RATIO:g}x, wall"),
    )
    mark = "~" if peer.predicted else ""
    speed = verdicts["peer_over_ours_time"]
    table.add_row(
        "onnxruntime Entropy / ours",
        "",
        mark + ratio_cell(speed),
        "",
        "",
        _verdict(
            targets[1],
            f"target >= {MIN_PEER_SPEEDUP:g}x, wall"
            + (", peer predicted" if peer.predicted else "")
            + (", peer FAILED" if peer.error else ""),
        ),
    )
    console.print(table)


def measure_batch1(model: Path, data: Path) -> dict[str, Any]:
    """Our peak RSS at batch 1, 64 vs 256 samples: under 1 GiB and flat (one run each)."""
    rss = {}
    for n in BATCH1_SAMPLES:
        args = {"model": str(model), "data": str(data), "methods": ["all"], "batch_size": 1}
        rss[n] = run_job(
            "qb-calibrate", {**args, "max_samples": n}, timeout=JOB_TIMEOUT_S
        ).peak_rss_kib
    low, top = min(BATCH1_SAMPLES), max(BATCH1_SAMPLES)
    growth = rss[top] / rss[low] - 1.0
    return {
        "peak_rss_kib": rss,
        "growth": growth,
        "ok": rss[top] < MAX_RSS_KIB and growth <= MAX_RSS_GROWTH,
    }


def measure_cached(model: Path, data: Path, batch: int) -> dict[str, JobResult]:
    """First run fills an empty statistics cache; the second must be served from it."""
    cache = WORK / "cache" / "calibration-shared"
    args = {
        "model": str(model),
        "data": str(data),
        "methods": ["all"],
        "use_cache": True,
        "batch_size": batch,
    }
    first = run_job("qb-calibrate", args, cache_dir=cache, timeout=JOB_TIMEOUT_S)
    second = run_job("qb-calibrate", args, cache_dir=cache, keep_cache=True, timeout=JOB_TIMEOUT_S)
    return {"cache-first": first, "cache-second": second}


def render_checks(console: Console, batch1: dict[str, Any], cached: dict[str, JobResult]) -> None:
    rss = batch1["peak_rss_kib"]
    low, top = min(BATCH1_SAMPLES), max(BATCH1_SAMPLES)
    console.print(
        f"ResNet-18-shaped, batch 1: our peak RSS {mib_cell(rss[low])} at {low} samples, "
        f"{mib_cell(rss[top])} at {top} ({batch1['growth']:+.1%}); target < 1 GiB and flat "
        f"(<= {MAX_RSS_GROWTH:.0%}): {_verdict(batch1['ok'])}"
    )
    first, second = cached["cache-first"], cached["cache-second"]
    console.print(
        f"ResNet-18-shaped, cache on: first run {seconds_cell(first.seconds)}, second run "
        f"{seconds_cell(second.seconds)} "
        + (
            "(statistics from the cache, no inference): [green]PASS[/green]"
            if second.details.get("from_cache")
            else "(ran inference again): [red]MISS[/red]"
        )
    )


def _job_doc(result: JobResult | JobFailed | None) -> dict[str, Any] | None:
    if result is None:
        return None
    if isinstance(result, JobFailed):
        return {"status": "failed", "error": result.summary}
    return result.to_dict()


def run(
    repeat: int = DEFAULT_REPEAT,
    console: Console | None = None,
    samples: int = DEFAULT_SAMPLES,
    batch: int = DEFAULT_BATCH,
    peer_rss_budget_gib: float = DEFAULT_PEER_RSS_BUDGET_GIB,
    only: tuple[str, ...] = tuple(w.key for w in WORKLOADS),
    checks: bool = True,
) -> dict[str, Any]:
    """Measure, print, write benchmarks/_work/calibration/<workload>.json, return the document."""
    console = console or make_console()
    document: dict[str, Any] = {
        "benchmark": "calibration",
        "samples": samples,
        "batch": batch,
        "repeat": repeat,
        "workloads": {},
    }
    for work in (w for w in WORKLOADS if w.key in only):
        console.print(
            f"[bold]bench_calibration[/bold]: {work.key}, {samples} samples, batch {batch}"
        )
        results, peer = measure(work, samples, batch, repeat, peer_rss_budget_gib)
        verdicts = evaluate(results, peer)
        render_workload(console, work, samples, batch, results, peer, verdicts)
        doc = {
            "model": str(work.model()),
            "data": str(work.data(samples)),
            "samples": samples,
            "batch": batch,
            "repeat": repeat,
            "jobs": {
                "floor": _job_doc(results["floor"]),
                "ours": _job_doc(results["ours"]),
                "peer": _job_doc(peer.result) if peer.error is None else {"error": peer.error},
                "peer_probes": {n: _job_doc(p) for n, p in (peer.probes or {}).items()},
            },
            **verdicts,
            "machine": machine_info(),
        }
        write_json(OUT / f"{work.key}.json", doc)
        document["workloads"][work.key] = doc
    if checks and "resnet18" in only:
        model, data = WORKLOADS[0].model(), WORKLOADS[0].data(max(BATCH1_SAMPLES))
        batch1 = measure_batch1(model, data)
        cached = measure_cached(model, WORKLOADS[0].data(samples), batch)
        render_checks(console, batch1, cached)
        document["batch1_rss"] = batch1
        document["cached"] = {k: v.to_dict() for k, v in cached.items()}
        write_json(OUT / "checks.json", {k: document[k] for k in ("batch1_rss", "cached")})
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="alternating rounds; medians count"
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument(
        "--peer-rss-budget-gib",
        type=float,
        default=DEFAULT_PEER_RSS_BUDGET_GIB,
        help="run the encoder's peer at the full count only if predicted to fit",
    )
    parser.add_argument(
        "--only",
        default=",".join(w.key for w in WORKLOADS),
        help="comma-separated subset of: " + ", ".join(w.key for w in WORKLOADS),
    )
    parser.add_argument(
        "--no-checks", action="store_true", help="skip the batch-1 RSS and cache checks"
    )
    args = parser.parse_args(argv)
    only = tuple(k.strip() for k in args.only.split(",") if k.strip())
    unknown = sorted(set(only) - {w.key for w in WORKLOADS})
    if unknown or args.samples < 1 or args.batch < 1:
        parser.error(f"bad --only {unknown}" if unknown else "--samples/--batch must be >= 1")
    document = run(
        args.repeat,
        samples=args.samples,
        batch=args.batch,
        peer_rss_budget_gib=args.peer_rss_budget_gib,
        only=only,
        checks=not args.no_checks,
    )
    document["machine"] = machine_info()
    write_json(WORK / "calibration.json", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
