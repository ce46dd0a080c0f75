"""Speed on real models: ``quantbench calibrate`` as a user runs it, against plain FP32 inference.

For every model of the real-model corpus (corpus.py), and the ResNet-18-shaped model of
benchmarks/models.py as an extra row, each of these runs as a **whole process** (interpreter
start, imports, model load, the pass, the tables written): wall time around the process, peak
RSS and CPU seconds from ``os.wait4``, both taken by a small launcher process (``LAUNCHER``):

* **floor**: plain onnxruntime FP32 inference over the same calibration samples (a small
  ``python -c`` script: import onnxruntime, load the model, run every sample), at batch 1 and,
  where every input's batch axis is dynamic, at ``--floor-batch`` (default 32, at most the sample
  count); a model with a fixed batch runs at that batch, a "stack" data set (one sample a feed,
  the model has no batch axis) one sample a feed. Each batch is its own process; the floor is
  the best median of them;
* ``quantbench calibrate MODEL --data CALIB.npz --no-cache -o OUT --method minmax``;
* the same with ``--method all`` (``-o`` a folder: one table per method);
* the same with no ``--method`` (the default, ``auto``);
* with ``--before EXECUTABLE``, the default once more through that quantbench ("default
  before", e.g. a frozen checkout of main): an A/B of the same rounds and floor.

quantbench reads the corpus' calib.npz as run_zoo.py gives it (its sample-first layout rule
sees "concat" and "stack" data alike), without ``--batch-size``: what a user's command does.
Every process gets a fresh, empty ``$QUANTBENCH_CACHE``, and may write byte-compiled modules
(as an installed package has them; only the first round compiles). The jobs run in rounds
(floor, minmax, all, default, floor, ...) ``--repeat`` times (default 3); medians are reported
with their ratio to the floor of the same run. Targets (issue 37): default <= 2x floor, minmax
<= 1.5x floor, each plus 1 s of fixed cost where the floor is under 3 s; peak RSS of the
default <= minmax's + 256 MiB.

    .venv/bin/python benchmarks/zoo/bench_speed.py [--repeat N] [--only orinet,resnet18]
        [--zoo-work PATH] [--no-resnet] [--samples N] [--floor-batch N] [--json PATH]

The corpus' models and data come from ``--zoo-work`` (default benchmarks/_work/zoo, made by
``make bench-zoo``; only read here); a model whose files are missing is reported as skipped.
Results go to benchmarks/_work/zoo/speed.json (``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZOO_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(ZOO_DIR), str(ZOO_DIR.parent)]

import corpus as zoo  # noqa: E402
from _jobs import (  # noqa: E402
    DEFAULT_REPEAT,
    WORK,
    ensure_resnet18,
    ensure_resnet18_data,
    machine_info,
    make_console,
    write_json,
)

ZOO_WORK = WORK / "zoo"
RESULTS = ZOO_WORK / "speed.json"
RESNET = "resnet18"
#: as benchmarks/bench_calibration.py makes them
RESNET_SAMPLES, RESNET_SEED = 256, 1
DEFAULT_FLOOR_BATCH = 32
JOB_TIMEOUT_S = 1800.0
MIB_KIB = 1024
#: issue 37's targets
MAX_DEFAULT_RATIO = 2.0
MAX_ONE_METHOD_RATIO = 1.5
FIXED_COST_S, FIXED_COST_BELOW_S = 1.0, 3.0
MAX_RSS_EXTRA_MIB = 256
CALIBRATE_JOBS: dict[str, list[str]] = {
    "minmax": ["--method", "minmax"],
    "all": ["--method", "all"],
    "default": [],
}

#: the A/B job of ``--before``: the default through another quantbench executable
BEFORE = "default before"

#: the floor: plain onnxruntime over the calibration samples, argv = model data layout batch
FLOOR_SCRIPT = """\
import json, sys
import numpy as np
import onnxruntime as ort
model, data, layout, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
options = ort.SessionOptions()
options.log_severity_level = 3
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
with np.load(data) as archive:
    if len(names) == 1 and names[0] not in archive.files and archive.files == ["input"]:
        arrays = {names[0]: archive["input"]}
    else:
        arrays = {name: archive[name] for name in names}
n = len(next(iter(arrays.values())))
runs = 0
if layout == "stack":
    for i in range(n):
        session.run(None, {k: v[i] for k, v in arrays.items()})
        runs += 1
else:
    for a in range(0, n, batch):
        session.run(None, {k: v[a : a + batch] for k, v in arrays.items()})
        runs += 1
print(json.dumps({"samples": n, "runs": runs}))
"""


# ============================================================================ one process


@dataclass
class Run:
    """One whole process: wall seconds around it, its peak RSS and CPU (``os.wait4`` in
    :data:`LAUNCHER`)."""

    seconds: float
    peak_rss_kib: int
    cpu_seconds: float
    error: str | None = None
    stdout_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "peak_rss_mib": round(self.peak_rss_kib / MIB_KIB, 1),
            "cpu_seconds": round(self.cpu_seconds, 3),
            **({"error": self.error} if self.error else {}),
        }


#: starts the measured process and reaps it. Linux carries the high-water RSS of the address
#: space a process replaces at exec into its ``ru_maxrss``; a child spawned straight from this
#: harness (hundreds of MiB once it has built the ResNet model or loaded onnx) would report at
#: least the harness' peak. This launcher (``python -S``, about 10 MiB) spawns the command
#: instead and reports its wall time, exit status and rusage: argv = result file, command...
LAUNCHER = """\
import json, os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(sys.argv[1], "w") as out:
    json.dump({"seconds": seconds, "status": status, "maxrss": usage.ru_maxrss,
               "cpu": usage.ru_utime + usage.ru_stime}, out)
"""


def _kill_group(pid: int) -> None:
    """SIGKILL the launcher and the process it started (their own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_process(command: list[str], cache: Path, timeout: float) -> Run:
    """``command`` (an absolute path first) in its own process through :data:`LAUNCHER`,
    ``$QUANTBENCH_CACHE`` = ``cache`` (fresh and empty); the process group is killed after
    ``timeout`` seconds. ``PYTHONDONTWRITEBYTECODE`` is left out of its environment: an
    installed package has its modules byte-compiled (pip compiles on install), an editable
    checkout gets them written by its first run, not recompiled by every run (67 modules,
    0.1 s a process here, where the environment sets it)."""
    env = {**os.environ, "QUANTBENCH_CACHE": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.TemporaryDirectory(prefix="qb-speed-run-") as tmp,
    ):
        result = Path(tmp) / "rusage.json"
        launcher = [sys.executable, "-S", "-c", LAUNCHER, str(result), *command]
        proc = subprocess.Popen(
            launcher, stdout=out, stderr=err, env=env, cwd=WORK, start_new_session=True
        )
        timer = threading.Timer(timeout, _kill_group, (proc.pid,))
        timer.start()
        try:
            proc.wait()
        finally:
            timer.cancel()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        record = json.loads(result.read_text()) if result.is_file() else None
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    if record is None:
        how = f"timed out after {timeout:.0f} s" if proc.returncode < 0 else "launcher failed"
        return Run(0.0, 0, 0.0, f"{how}: {last}"[:300])
    code = os.waitstatus_to_exitcode(record["status"])
    error = None
    if code != 0:
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        error = f"{how}: {last}"[:300]
    tail = "\n".join(stdout.strip().splitlines()[-3:])
    return Run(record["seconds"], record["maxrss"], record["cpu"], error, tail)


# ============================================================================ one model


@dataclass
class Subject:
    """A model to measure: its file, calibration data and how the data is laid out."""

    key: str
    model: Path | None
    data: Path | None
    layout: str = "concat"
    samples: int | None = None
    missing: str | None = None


@dataclass
class Job:
    """One job of a row (a floor batch or a calibrate variant) and its runs over the rounds."""

    name: str
    command: list[str]
    output: str | None = None  # -o's name inside the run's temporary folder
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def peak_rss_kib(self) -> float | None:
        return statistics.median(r.peak_rss_kib for r in self.runs) if self.runs else None

    @property
    def cpu_seconds(self) -> float | None:
        return statistics.median(r.cpu_seconds for r in self.runs) if self.runs else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "median_seconds": None if self.seconds is None else round(self.seconds, 3),
            "median_peak_rss_mib": (
                None if self.peak_rss_kib is None else round(self.peak_rss_kib / MIB_KIB, 1)
            ),
            "median_cpu_seconds": None if self.cpu_seconds is None else round(self.cpu_seconds, 3),
            "runs": [r.to_dict() for r in self.runs],
            "error": self.error,
        }


def input_batch_axes(model: Path) -> list[int | None]:
    """Each runtime input's first dim: its fixed size, or None where it is dynamic (a named,
    0 or unset dim) or the input has no axis, quantbench's ``dynamic_batch`` rule."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    firsts: list[int | None] = []
    for value in graph.input:
        if value.name in constants:
            continue
        dims = value.type.tensor_type.shape.dim
        if not dims:
            firsts.append(0)  # a scalar: no batch axis at all
        elif dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            firsts.append(dims[0].dim_value)
        else:
            firsts.append(None)
    return firsts


def floor_batches(subject: Subject, floor_batch: int) -> tuple[list[int], str]:
    """The batches the floor runs at, and why."""
    assert subject.model is not None and subject.samples is not None
    if subject.layout == "stack":
        return [1], "one sample a feed (stack data: the model has no batch axis)"
    firsts = input_batch_axes(subject.model)
    if firsts and all(f is None for f in firsts):
        largest = max(1, min(floor_batch, subject.samples))
        return sorted({1, largest}), "dynamic batch axis"
    fixed = sorted({f for f in firsts if f})
    if len(fixed) == 1 and all(f == fixed[0] for f in firsts):
        return fixed, f"fixed batch {fixed[0]}"
    return [1], f"batch axes {firsts}: batch 1 only"


def quantbench_command(explicit: str | None) -> list[str]:
    """The CLI: ``--quantbench``, else the console script beside this interpreter, else
    ``python -m quantbench``."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise SystemExit(f"--quantbench {explicit}: no such executable")
        return [str(Path(found).resolve())]
    script = Path(sys.executable).parent / "quantbench"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "quantbench"]


def make_jobs(
    subject: Subject, batches: list[int], qb: list[str], before: list[str] | None = None
) -> list[Job]:
    assert subject.model is not None and subject.data is not None
    model, data = str(subject.model), str(subject.data)
    jobs = [
        Job(f"floor b{b}", [sys.executable, "-c", FLOOR_SCRIPT, model, data, subject.layout,
                            str(b)])
        for b in batches
    ]  # fmt: skip
    for name, flags in CALIBRATE_JOBS.items():
        output = "tables" if name == "all" else f"{name}.cache"
        command = [*qb, "calibrate", model, "--data", data, "--no-cache", *flags, "-o", "{OUT}"]
        jobs.append(Job(name, command, output))
    if before:
        command = [*before, "calibrate", model, "--data", data, "--no-cache", "-o", "{OUT}"]
        jobs.append(Job(BEFORE, command, "default.cache"))
    return jobs


def run_rounds(jobs: list[Job], repeat: int, timeout: float) -> None:
    """Every job once a round, ``repeat`` rounds; a job that fails is not run again."""
    for _ in range(max(1, repeat)):
        for job in jobs:
            if job.error:
                continue
            with tempfile.TemporaryDirectory(prefix="qb-speed-") as tmp:
                cache = Path(tmp) / "cache"
                cache.mkdir()
                target = Path(tmp) / job.output if job.output else None
                command = [str(target) if a == "{OUT}" else a for a in job.command]
                run = run_process(command, cache, timeout)
                if run.error is None and target is not None and not target.exists():
                    run.error = f"exit 0 but {job.output} was not written"
            if run.error:
                job.error = run.error
            else:
                job.runs.append(run)


def allowance(floor_s: float) -> float:
    return FIXED_COST_S if floor_s < FIXED_COST_BELOW_S else 0.0


def judge(row: dict[str, Any]) -> dict[str, bool | None]:
    """PASS/MISS of issue 37's three targets (None where a figure is missing)."""
    floor = row.get("floor_seconds")
    jobs = row.get("jobs", {})

    def median(name: str, key: str) -> float | None:
        return jobs.get(name, {}).get(key)

    default_s, minmax_s = median("default", "median_seconds"), median("minmax", "median_seconds")
    rss_d, rss_m = median("default", "median_peak_rss_mib"), median("minmax", "median_peak_rss_mib")
    out: dict[str, bool | None] = {"default": None, "minmax": None, "rss": None}
    if floor:
        extra = allowance(floor)
        if default_s is not None:
            out["default"] = default_s <= MAX_DEFAULT_RATIO * floor + extra
        if minmax_s is not None:
            out["minmax"] = minmax_s <= MAX_ONE_METHOD_RATIO * floor + extra
    if rss_d is not None and rss_m is not None:
        out["rss"] = rss_d <= rss_m + MAX_RSS_EXTRA_MIB
    return out


def measure(
    subject: Subject,
    repeat: int,
    floor_batch: int,
    qb: list[str],
    timeout: float,
    console: Any,
    before: list[str] | None = None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"model": subject.key, "layout": subject.layout}
    if subject.missing:
        console.print(f"  [yellow]skipped[/yellow]: {subject.missing}")
        return {**row, "status": "skipped", "error": subject.missing}
    assert subject.model is not None and subject.data is not None
    row.update(model_file=str(subject.model), data=str(subject.data), samples=subject.samples)
    batches, why = floor_batches(subject, floor_batch)
    row.update(floor_batches=batches, floor_batch_rule=why)
    load_before = os.getloadavg()
    console.print(
        f"  {subject.samples} samples ({subject.layout}), floor at batch "
        f"{', '.join(map(str, batches))} ({why}); load average before "
        + " ".join(f"{x:.2f}" for x in load_before)
    )
    jobs = make_jobs(subject, batches, qb, before)
    start = time.perf_counter()
    run_rounds(jobs, repeat, timeout)
    load_after = os.getloadavg()
    console.print(
        f"  {time.perf_counter() - start:.0f} s; load average after "
        + " ".join(f"{x:.2f}" for x in load_after)
    )
    row["load_average_before"] = [round(x, 2) for x in load_before]
    row["load_average_after"] = [round(x, 2) for x in load_after]
    row["jobs"] = {j.name: j.to_dict() for j in jobs}
    floors = [j for j in jobs if j.name.startswith("floor") and j.runs]
    if floors:
        best = min(floors, key=lambda j: j.seconds or 0.0)
        row["floor_job"] = best.name
        row["floor_seconds"] = round(best.seconds or 0.0, 3)
        row["floor_peak_rss_mib"] = round((best.peak_rss_kib or 0) / MIB_KIB, 1)
        for name in [*CALIBRATE_JOBS, *([BEFORE] if before else [])]:
            seconds = row["jobs"][name]["median_seconds"]
            row["jobs"][name]["ratio_to_floor"] = (
                None if seconds is None else round(seconds / best.seconds, 3)
            )
    errors = {j.name: j.error for j in jobs if j.error}
    for name, error in errors.items():
        console.print(f"  [red]FAILED[/red] {name}: {error}")
    row["targets"] = judge(row)
    row["status"] = "measured" if floors and not errors else ("partial" if floors else "failed")
    return row


# ============================================================================ subjects


def corpus_subject(spec: zoo.ZooModel, zoo_work: Path) -> Subject:
    """A corpus model's file and calibration data, as run_zoo.py's ``ensure_data`` left them."""
    model = zoo_work / "pkgs" / spec.file
    folder = zoo_work / spec.key
    calib, meta = folder / "calib.npz", folder / "data.json"
    if not model.is_file():
        return Subject(spec.key, None, None, missing=f"{model} not found (make bench-zoo)")
    if not (calib.is_file() and meta.is_file()):
        return Subject(spec.key, None, None, missing=f"no {calib} / {meta.name} (make bench-zoo)")
    doc = json.loads(meta.read_text())
    return Subject(spec.key, model, calib, doc["layout"], doc["calib"])


def resnet_subject(samples: int) -> Subject:
    model = ensure_resnet18(dynamic_batch=True)
    data = ensure_resnet18_data(WORK / f"calib{samples}.npz", samples, RESNET_SEED)
    return Subject(RESNET, model, data, "concat", samples)


# ============================================================================ output


def _verdict(ok: bool | None) -> str:
    if ok is None:
        return "[dim]n/a[/dim]"
    return "[green]PASS[/green]" if ok else "[red]MISS[/red]"


def _timed(row: dict[str, Any], name: str) -> str:
    job = row.get("jobs", {}).get(name)
    if job is None:
        return ""
    if job["median_seconds"] is None:
        return "[red]FAILED[/red]"
    ratio = job.get("ratio_to_floor")
    text = f"{job['median_seconds']:.1f} s"
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def render(console: Any, rows: list[dict[str, Any]], repeat: int) -> None:
    from rich.table import Table

    table = Table(
        title=f"calibrate as whole processes vs plain FP32 onnxruntime (medians of {repeat}; "
        "ratio to the floor of the same run)"
    )
    ab = any(BEFORE in r.get("jobs", {}) for r in rows)
    columns = (
        "model", "samples", "floor (batch)", "minmax", "all", *([BEFORE] if ab else []),
        "default", "peak RSS default vs minmax", "default<=2x", "minmax<=1.5x", "RSS<=+256",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        if "floor_seconds" not in r:
            status = r.get("status", "?").upper()
            table.add_row(r["model"], str(r.get("samples", "")), f"[red]{status}[/red]",
                          *[""] * (len(columns) - 3))  # fmt: skip
            continue
        jobs = r["jobs"]
        rss_d = jobs["default"]["median_peak_rss_mib"]
        rss_m = jobs["minmax"]["median_peak_rss_mib"]
        rss = "-"
        if rss_d is not None and rss_m is not None:
            rss = f"{rss_d - rss_m:+,.0f} MiB ({rss_m:,.0f} -> {rss_d:,.0f})"
        targets = r["targets"]
        batch = r["floor_job"].removeprefix("floor b")
        table.add_row(
            r["model"],
            str(r["samples"]),
            f"{r['floor_seconds']:.1f} s / {r['floor_peak_rss_mib']:,.0f} MiB ({batch})",
            _timed(r, "minmax"),
            _timed(r, "all"),
            *([_timed(r, BEFORE)] if ab else []),
            _timed(r, "default"),
            rss,
            _verdict(targets["default"]),
            _verdict(targets["minmax"]),
            _verdict(targets["rss"]),
        )
    console.print(table)
    console.print(
        f"targets: default <= {MAX_DEFAULT_RATIO:g}x floor, minmax <= {MAX_ONE_METHOD_RATIO:g}x "
        f"floor (each + {FIXED_COST_S:g} s where the floor is under {FIXED_COST_BELOW_S:g} s); "
        f"peak RSS of the default <= minmax's + {MAX_RSS_EXTRA_MIB} MiB"
    )
    for r in rows:
        for name, job in r.get("jobs", {}).items():
            if job["error"]:
                console.print(f"[red]FAILED[/red] {r['model']} {name}: {job['error']}")
        if r.get("status") in ("skipped", "failed") and r.get("error"):
            console.print(f"[yellow]{r['status']}[/yellow] {r['model']}: {r['error']}")


# ============================================================================ entry points


def run(
    repeat: int = DEFAULT_REPEAT,
    console: Any = None,
    *,
    only: list[str] | None = None,
    zoo_work: Path = ZOO_WORK,
    resnet: bool = True,
    samples: int = RESNET_SAMPLES,
    floor_batch: int = DEFAULT_FLOOR_BATCH,
    quantbench: str | None = None,
    before: str | None = None,
    timeout: float = JOB_TIMEOUT_S,
    json_path: Path = RESULTS,
) -> dict[str, Any]:
    """Measure every chosen model, print the table, write ``json_path``; the result document."""
    console = console or make_console()
    specs = zoo.corpus(zoo_work / "pkgs")
    keys = [s.key for s in specs] + ([RESNET] if resnet or (only and RESNET in only) else [])
    chosen = [k for k in keys if not only or k in only]
    machine = machine_info()
    console.print(
        f"[bold]Speed on real models[/bold]: {machine['cpus']} cores, {machine['memory_gib']} GiB, "
        f"onnxruntime {machine['onnxruntime']}, load average "
        + " ".join(f"{x:.2f}" for x in machine["load_average"])
        + f"; {repeat} round(s); corpus from {zoo_work}"
    )
    qb = quantbench_command(quantbench)
    before_qb = quantbench_command(before) if before else None
    WORK.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = []
    for key in chosen:
        console.print(f"[bold]{key}[/bold]")
        try:
            if key == RESNET:
                subject = resnet_subject(samples)
            else:
                subject = corpus_subject(next(s for s in specs if s.key == key), zoo_work)
            row = measure(subject, repeat, floor_batch, qb, timeout, console, before_qb)
        except Exception as exc:  # noqa: BLE001 - one broken model must not stop the others
            row = {"model": key, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            console.print(f"  [red]harness error[/red]: {row['error']}")
        row["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        rows.append(row)
    render(console, rows, repeat)
    document = {
        "benchmark": "speed",
        "machine": machine,
        "repeat": repeat,
        "quantbench": qb,
        "before": before_qb,
        "zoo_work": str(zoo_work),
        "floor_batch": floor_batch,
        "targets": {
            "default_max_ratio": MAX_DEFAULT_RATIO,
            "one_method_max_ratio": MAX_ONE_METHOD_RATIO,
            "fixed_cost_s": FIXED_COST_S,
            "fixed_cost_below_floor_s": FIXED_COST_BELOW_S,
            "rss_max_extra_mib": MAX_RSS_EXTRA_MIB,
        },
        "wall_seconds": round(time.perf_counter() - start, 1),
        "models": rows,
    }
    write_json(json_path, document)
    console.print(f"wrote {json_path}")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="rounds; medians count")
    parser.add_argument(
        "--only", default="", help=f"comma-separated model keys (corpus keys, {RESNET})"
    )
    parser.add_argument(
        "--zoo-work",
        type=Path,
        default=ZOO_WORK,
        help="the corpus' work folder (pkgs/ and <model>/calib.npz, made by make bench-zoo); "
        "only read",
    )
    parser.add_argument("--no-resnet", action="store_true", help=f"leave out the {RESNET} row")
    parser.add_argument(
        "--samples", type=int, default=RESNET_SAMPLES, help=f"{RESNET} calibration samples"
    )
    parser.add_argument(
        "--floor-batch",
        type=int,
        default=DEFAULT_FLOOR_BATCH,
        help="the floor's large batch on a dynamic-batch model (also at batch 1; best counts)",
    )
    parser.add_argument("--quantbench", help="the quantbench executable (default: the venv's)")
    parser.add_argument(
        "--before",
        help="another quantbench executable whose default runs in the same rounds "
        f"('{BEFORE}': an A/B against the same floor)",
    )
    parser.add_argument("--timeout", type=float, default=JOB_TIMEOUT_S, help="seconds per process")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args(argv)
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    known = [s.key for s in zoo.corpus(args.zoo_work / "pkgs")] + [RESNET]
    unknown = sorted(set(only) - set(known))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.repeat < 1 or args.samples < 1 or args.floor_batch < 1:
        parser.error("--repeat, --samples and --floor-batch must be at least 1")
    from rich.console import Console

    console = Console() if Console().is_terminal else Console(width=200)
    document = run(
        args.repeat,
        console,
        only=only or None,
        zoo_work=args.zoo_work.resolve(),
        resnet=not args.no_resnet,
        samples=args.samples,
        floor_batch=args.floor_batch,
        quantbench=args.quantbench,
        before=args.before,
        timeout=args.timeout,
        json_path=args.json,
    )
    bad = [r for r in document["models"] if r.get("status") in ("failed", "partial")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
