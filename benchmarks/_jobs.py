"""Benchmark jobs, each in a fresh Python process, and the parent-side helpers that run them.

Why one process per job: peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) is the high-water mark of
a whole process, so two tools (or two sample counts) measured in one process would both report the
larger. A job prints one JSON line as the last line of its stdout::

    {"job": "qb-calibrate", "seconds": 12.3, "peak_rss_kib": 456789, ...job details...}

``seconds`` is the wall time of the work itself: the modules a job declares are imported before
the clock starts, so interpreter start-up and imports (about a second, different per tool) do
not blur the comparison; the parent adds ``process_seconds`` (the whole process, start to exit).

Run one job by hand::

    .venv/bin/python benchmarks/_jobs.py ort-fp32 '{"model": "m.onnx", "data": "d.npz"}'
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
WORK = BENCH_DIR / "_work"
JOBS_SCRIPT = Path(__file__).resolve()
GIB_KIB = 1024 * 1024

# ============================================================================ the jobs (child side)


@dataclass(frozen=True)
class JobSpec:
    """A job function and the modules imported before its clock starts."""

    function: Callable[..., dict[str, Any]]
    imports: tuple[str, ...]


JOBS: dict[str, JobSpec] = {}


def job(name: str, imports: tuple[str, ...] = ()) -> Callable:
    """Register ``function`` as job ``name``."""

    def register(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        JOBS[name] = JobSpec(function, imports)
        return function

    return register


def load_array(path: str | Path, max_samples: int | None = None) -> np.ndarray:
    """The ``input`` array of a benchmark .npz, whole: what a peer's data reader typically holds."""
    with np.load(path) as archive:
        array = archive["input"]
    return array[:max_samples] if max_samples else array


def load_feeds(
    path: str | Path, input_names: list[str], max_samples: int | None = None
) -> dict[str, np.ndarray]:
    """Every model input's array from a benchmark .npz, whole, keyed by input name.

    The .npz keys are the input names (``input_ids``, ``attention_mask``); a one-input model's
    data may be stored under ``input`` instead.
    """
    with np.load(path) as archive:
        keys = list(archive.keys())
        if len(input_names) == 1 and input_names[0] not in keys and keys == ["input"]:
            arrays = {input_names[0]: archive["input"]}
        else:
            missing = [name for name in input_names if name not in keys]
            if missing:
                raise SystemExit(f"{path}: no array for model input(s) {', '.join(missing)}")
            arrays = {name: archive[name] for name in input_names}
    return {name: a[:max_samples] if max_samples else a for name, a in arrays.items()}


def model_input_names(model: str) -> list[str]:
    """The runtime inputs of an ONNX model (initializers listed as inputs left out)."""
    import onnx

    graph = onnx.load(model, load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    return [v.name for v in graph.input if v.name not in constants]


class ArrayReader:
    """onnxruntime ``CalibrationDataReader`` protocol over arrays, ``batch`` samples a feed.

    ``array`` is one array (fed as ``input_name``) or ``{input name: array}`` for several inputs.
    """

    def __init__(
        self,
        array: np.ndarray | dict[str, np.ndarray],
        input_name: str = "input",
        batch: int = 1,
    ) -> None:
        self.arrays = array if isinstance(array, dict) else {input_name: array}
        self.length = len(next(iter(self.arrays.values())))
        self.batch = batch
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= self.length:
            return None
        start, self.position = self.position, self.position + self.batch
        return {name: a[start : self.position] for name, a in self.arrays.items()}

    def rewind(self) -> None:
        self.position = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while (feed := self.get_next()) is not None:
            yield feed


# numba (quantbench.stats.binning_kernels) is imported by the pass itself, not by
# quantbench.calibrate:
# named here so that "seconds" excludes it as it excludes the floor's onnxruntime import
@job("qb-calibrate", imports=("quantbench.calibrate", "quantbench.stats.binning_kernels"))
def qb_calibrate(
    model: str,
    data: str,
    methods: list[str],
    output: str | None = None,
    use_cache: bool = False,
    tensors: str | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
) -> dict[str, Any]:
    """``quantbench calibrate MODEL --data DATA -m ... [--no-cache]``, through the Python API."""
    from quantbench.calibrate import calibrate

    result = calibrate(
        model,
        data,
        methods=methods,
        output=output,
        use_cache=use_cache,
        tensors=tensors,
        batch_size=batch_size,
        max_samples=max_samples,
        show_progress=False,
    )
    return {
        "samples": result.stats.num_samples,
        "tensors": len(result.stats),
        "methods": list(result.tables),
        "from_cache": result.from_cache,
        "files_written": len(result.written),
    }


@job("qb-quantize", imports=("quantbench.calibrate", "quantbench.qdq"))
def qb_quantize(
    model: str, calib_data: str, outputs: dict[str, str], tensors: str = "quantizable"
) -> dict[str, Any]:
    """One statistics pass, then a Q/DQ model per method (what ``compare ... int8`` builds)."""
    from quantbench.calibrate import calibrate
    from quantbench.model.graph import open_graph
    from quantbench.qdq import quantize_model, write_quantized

    graph = open_graph(model)
    result = calibrate(
        graph,
        calib_data,
        methods=list(outputs),
        tensors=tensors,
        use_cache=False,
        show_progress=False,
    )
    summary = {}
    for method, path in outputs.items():
        quantized = quantize_model(graph, result.tables[method], allow_partial=True)
        write_quantized(quantized, path)
        summary[method] = quantized.summary()
    return {"samples": result.stats.num_samples, "models": summary}


@job("ort-quantize-static", imports=("onnxruntime.quantization",))
def ort_quantize_static(
    model: str,
    data: str,
    output: str,
    method: str = "Entropy",
    batch: int = 1,
    max_samples: int | None = None,
) -> dict[str, Any]:
    """onnxruntime's static Q/DQ quantization, set up the way its docs advise for TensorRT."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    feeds = load_feeds(data, model_input_names(model), max_samples)
    quantize_static(
        model,
        output,
        ArrayReader(feeds, batch=batch),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, method),
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )
    return {"samples": len(next(iter(feeds.values()))), "method": method}


@job("ort-fp32", imports=("onnxruntime",))
def ort_fp32(
    model: str, data: str, batch: int = 1, max_samples: int | None = None
) -> dict[str, Any]:
    """Plain FP32 inference over the data: the floor any calibration pass is measured against."""
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = load_feeds(data, [i.name for i in session.get_inputs()], max_samples)
    for feed in ArrayReader(feeds, batch=batch):
        session.run(None, feed)
    return {"samples": len(next(iter(feeds.values())))}


@job("ort-logits", imports=("onnxruntime",))
def ort_logits(model: str, data: str, output: str) -> dict[str, Any]:
    """A model's first output for every sample, saved as .npz ``logits`` (onnxruntime CPU)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    array = load_array(data)
    outputs = [
        session.run(None, feed)[0] for feed in ArrayReader(array, session.get_inputs()[0].name)
    ]
    write_npz(Path(output), logits=np.concatenate(outputs))
    return {"samples": len(array)}


@job("qb-compare", imports=("quantbench.compare",))
def qb_compare(
    model: str, data: str, calib_data: str, method: str = "entropy", max_samples: int | None = None
) -> dict[str, Any]:
    """``quantbench compare fp32 int8 --no-latency``: drift only, both views, one pass."""
    from quantbench.compare import compare

    doc = compare(
        "fp32",
        "int8",
        model=model,
        data=data,
        calib_data=calib_data,
        method=method,
        max_samples=max_samples,
        latency=False,
        show_progress=False,
    )
    views: dict[str, int] = {}
    for row in doc["layers"]:
        views[row["view"]] = views.get(row["view"], 0) + 1
    output = next((o for o in doc["outputs"] if o["candidate"] == "B"), {})
    worst = doc["ranking"][0] if doc["ranking"] else {}
    return {
        "eval_samples": doc["data"]["eval_samples"],
        "calib_samples": doc["data"]["calib_samples"],
        "layer_rows": views,
        "top1_agreement": output.get("agreement"),
        "output_sqnr_db": output.get("sqnr_db"),
        "worst_isolated": {k: worst.get(k) for k in ("tensor", "isolated_sqnr_db")},
    }


@job("ort-debug-names", imports=("onnx",))
def ort_debug_names(source: str, output: str) -> dict[str, Any]:
    """Copy of a Q/DQ model with DQ outputs named the way ``qdq_loss_debug`` pairs tensors.

    ``create_activation_matching`` finds the quantized version of tensor ``X`` only under the
    name ``X_DequantizeLinear_Output`` (onnxruntime's own naming). The graph, scales and weights
    are untouched; only those tensor names change, so onnxruntime analyses the same model.
    """
    import onnx

    model = onnx.load(source)
    producers = {out: node for node in model.graph.node for out in node.output}
    renames: dict[str, str] = {}
    for node in model.graph.node:
        quantize = producers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if quantize is not None and quantize.op_type == "QuantizeLinear":
            renames[node.output[0]] = f"{quantize.input[0]}_DequantizeLinear_Output"
    for node in model.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    for value in list(model.graph.value_info) + list(model.graph.output):
        value.name = renames.get(value.name, value.name)
    onnx.save(model, output)
    return {"renamed": len(renames)}


@job("ort-qdq-debug", imports=("onnxruntime.quantization.qdq_loss_debug",))
def ort_qdq_debug(
    float_model: str, qdq_model: str, data: str, work_dir: str, max_samples: int | None = None
) -> dict[str, Any]:
    """onnxruntime's per-tensor debugging, accumulated view: float vs Q/DQ model activations."""
    from onnxruntime.quantization import qdq_loss_debug as debug

    work = Path(work_dir)
    float_aug, qdq_aug = work / "float.aug.onnx", work / "qdq.aug.onnx"
    debug.modify_model_output_intermediate_tensors(float_model, float_aug)
    debug.modify_model_output_intermediate_tensors(qdq_model, qdq_aug)
    array = load_array(data, max_samples)
    float_acts = debug.collect_activations(str(float_aug), ArrayReader(array))
    qdq_acts = debug.collect_activations(str(qdq_aug), ArrayReader(array))
    matching = debug.create_activation_matching(qdq_acts, float_acts)
    errors = debug.compute_activation_error(matching)
    cross = {name: e["xmodel_err"] for name, e in errors.items() if "xmodel_err" in e}
    worst = min(cross, key=cross.get) if cross else None
    return {
        "eval_samples": len(array),
        "tensors_compared": len(cross),
        "worst_accumulated": {"tensor": worst, "sqnr_db": cross.get(worst) if worst else None},
    }


def _cpu_seconds() -> float:
    """User + system CPU of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_main(argv: list[str]) -> int:
    """``_jobs.py NAME JSON_ARGS``: run one job, print its JSON line."""
    if len(argv) != 2 or argv[0] not in JOBS:
        print(f"usage: _jobs.py {{{'|'.join(JOBS)}}} JSON_ARGS", file=sys.stderr)
        return 2
    spec = JOBS[argv[0]]
    for module in spec.imports:
        importlib.import_module(module)
    cpu_start = _cpu_seconds()
    start = time.perf_counter()
    details = spec.function(**json.loads(argv[1]))
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    record = {"job": argv[0], "seconds": seconds, "work_cpu_seconds": cpu, "peak_rss_kib": peak}
    print(json.dumps({**record, **details}))
    return 0


# ============================================================================ running (parent side)


class JobFailed(RuntimeError):
    """A job exited non-zero (or was killed); the message carries the tail of its stderr."""

    def __init__(self, message: str, summary: str) -> None:
        super().__init__(message)
        #: one line for a table: the exception line of the job's traceback, or how it ended
        self.summary = summary


@dataclass
class JobResult:
    """What one job measured; with repeats, the fastest run's time and the largest peak RSS."""

    job: str
    seconds: float
    peak_rss_kib: int
    process_seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    all_seconds: list[float] = field(default_factory=list)
    #: user + system CPU of the whole child process (``os.wait4`` rusage), imports included
    cpu_seconds: float | None = None
    #: user + system CPU of the work alone (the child's own rusage around the job function)
    work_cpu_seconds: float | None = None

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / 1024

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "seconds": round(self.seconds, 3),
            "all_seconds": [round(s, 3) for s in self.all_seconds],
            "process_seconds": round(self.process_seconds, 3),
            "cpu_seconds": None if self.cpu_seconds is None else round(self.cpu_seconds, 3),
            "work_cpu_seconds": (
                None if self.work_cpu_seconds is None else round(self.work_cpu_seconds, 3)
            ),
            "peak_rss_kib": self.peak_rss_kib,
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            **self.details,
        }


def run_job(
    name: str,
    args: dict[str, Any],
    *,
    cache_dir: Path | None = None,
    keep_cache: bool = False,
    repeat: int = 1,
    timeout: float | None = None,
) -> JobResult:
    """Run job ``name`` in its own process ``repeat`` times.

    ``cache_dir`` becomes ``$QUANTBENCH_CACHE`` (default: a folder private to the job). It is
    emptied before each run unless ``keep_cache``, so no run sees statistics another one cached
    by accident; ``keep_cache`` measures the second-run case on purpose.
    """
    cache = cache_dir or WORK / "cache" / name
    runs = []
    for _ in range(max(1, repeat)):
        if not keep_cache:
            shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        runs.append(_run_once(name, args, cache, timeout))
    fastest = min(runs, key=lambda r: r.seconds)
    fastest.peak_rss_kib = max(r.peak_rss_kib for r in runs)
    fastest.all_seconds = [r.seconds for r in runs]
    return fastest


def run_alternating(
    jobs: dict[str, tuple[str, dict[str, Any]]],
    *,
    repeat: int = 1,
    cache_dir: Path | None = None,
    timeout: float | None = None,
) -> dict[str, JobResult | JobFailed]:
    """Run ``{key: (job name, args)}`` in rounds (each job once per round) ``repeat`` times.

    Alternating spreads the load of a shared machine over every job alike, where back-to-back
    repeats of one job would catch one quiet or busy stretch. Each result holds the *median*
    run's figures (wall, CPU) and the largest peak RSS. A job that fails is not run again: its
    :class:`JobFailed` stands in for its result.
    """
    runs: dict[str, list[JobResult]] = {key: [] for key in jobs}
    failed: dict[str, JobFailed] = {}
    for _ in range(max(1, repeat)):
        for key, (name, args) in jobs.items():
            if key in failed:
                continue
            cache = cache_dir or WORK / "cache" / name
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True, exist_ok=True)
            try:
                runs[key].append(_run_once(name, args, cache, timeout))
            except JobFailed as exc:
                failed[key] = exc
    return {key: failed[key] if key in failed else _median(runs[key]) for key in jobs}


def _median(runs: list[JobResult]) -> JobResult:
    """The run of median wall time, with the median CPU and process time, the largest RSS."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    middle = ordered[(len(ordered) - 1) // 2]

    def median_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return JobResult(
        middle.job,
        statistics.median(r.seconds for r in runs),
        max(r.peak_rss_kib for r in runs),
        statistics.median(r.process_seconds for r in runs),
        middle.details,
        [r.seconds for r in runs],
        median_of([r.cpu_seconds for r in runs]),
        median_of([r.work_cpu_seconds for r in runs]),
    )


def _run_once(name: str, args: dict[str, Any], cache: Path, timeout: float | None) -> JobResult:
    """One job in a fresh process, reaped with ``os.wait4`` for its CPU time and peak RSS."""
    env = {**os.environ, "QUANTBENCH_CACHE": str(cache)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, str(JOBS_SCRIPT), name, json.dumps(args)],
            stdout=out,
            stderr=err,
            text=True,
            env=env,
            cwd=REPO,
        )
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        process_seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        code = proc.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        lines = stderr.strip().splitlines()
        tail = "\n".join(lines[-8:])
        summary = lines[-1].strip() if lines and code > 0 else how
        raise JobFailed(f"job {name} failed ({how}):\n{tail}", summary[:160])
    record = json.loads(stdout.strip().splitlines()[-1])
    seconds, peak = record.pop("seconds"), record.pop("peak_rss_kib")
    work_cpu = record.pop("work_cpu_seconds", None)
    record.pop("job")
    return JobResult(
        name,
        seconds,
        peak,
        process_seconds,
        record,
        [seconds],
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        work_cpu_seconds=work_cpu,
    )


# ============================================================================ inputs (parent side)


def _fresh(path: Path, source: Path) -> bool:
    """``path`` exists and is newer than the file that generates it."""
    return path.is_file() and path.stat().st_mtime >= source.stat().st_mtime


def _models_module() -> Any:
    """benchmarks/models.py (the ResNet-18 builder), imported by path."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    if not (BENCH_DIR / "models.py").is_file():
        raise SystemExit("benchmarks/models.py is missing: it builds the ResNet-18 benchmark model")
    return importlib.import_module("models")


def ensure_resnet18(work: Path = WORK, dynamic_batch: bool = False) -> Path:
    """The ResNet-18-shaped model (batch 1, or a dynamic batch axis), rebuilt when stale."""
    path = work / ("resnet18-dyn.onnx" if dynamic_batch else "resnet18.onnx")
    if not _fresh(path, BENCH_DIR / "models.py"):
        work.mkdir(parents=True, exist_ok=True)
        _models_module().build_resnet18(path, batch=1, seed=0, dynamic_batch=dynamic_batch)
    return path


def ensure_bert(work: Path = WORK) -> Path:
    """The BERT-like encoder of models.py (dynamic batch and sequence), rebuilt when stale."""
    path = work / "bert.onnx"
    if not _fresh(path, BENCH_DIR / "models.py"):
        work.mkdir(parents=True, exist_ok=True)
        _models_module().build_bert(path, seed=0)
    return path


def ensure_bert_data(path: Path, samples: int, seed: int) -> Path:
    """``samples`` token sequences (keys ``input_ids``, ``attention_mask``), rebuilt when stale."""
    if not _fresh(path, BENCH_DIR / "models.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, **_models_module().make_bert_data(samples, seed))
    return path


def ensure_resnet18_data(path: Path, samples: int, seed: int) -> Path:
    """``samples`` image-like inputs saved as .npz (key ``input``), rebuilt when stale."""
    if not _fresh(path, BENCH_DIR / "models.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, input=_models_module().make_resnet18_data(samples, seed))
    return path


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    """An uncompressed .npz written atomically (np.savez to a file object keeps the name)."""
    from quantbench.fileio import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    return path


def write_json(path: Path, document: dict[str, Any]) -> Path:
    from quantbench.fileio import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(document, indent=2, default=str) + "\n")


def machine_info() -> dict[str, Any]:
    """Where the numbers were measured: they mean little without it."""
    import platform

    import onnxruntime

    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(total_kib / GIB_KIB, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


# ============================================================================ table cells

#: runs per job by default; on a shared 2-core machine single runs vary by up to 2x.
DEFAULT_REPEAT = 3


def make_console() -> Any:
    """A rich console that does not wrap the tables to 80 columns when piped to a file."""
    from rich.console import Console

    probe = Console()
    return probe if probe.is_terminal else Console(width=140)


def seconds_cell(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def mib_cell(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:,.0f} MiB"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def verdict(ok: bool | None) -> str:
    """Rich markup for a target met, missed, or not measured."""
    if ok is None:
        return "[dim]n/a[/dim]"
    return "[green]met[/green]" if ok else "[red]missed[/red]"


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
