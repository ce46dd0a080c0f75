"""The zoo's jobs, each run in a fresh Python process (same protocol as benchmarks/_jobs.py).

A job prints one JSON line as the last line of its stdout: ``{"job", "seconds", "peak_rss_kib",
...details}``; ``seconds`` excludes interpreter start-up and the imports the job declares. A job
that fails prints ``error: <one line>`` as the last line of stderr and exits 1; the parent keeps
that line for the table (FAILED) and the JSON.

    .venv/bin/python benchmarks/zoo/jobs.py NAME JSON_ARGS
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ZOO_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(ZOO_DIR), str(ZOO_DIR.parent)]

import numpy as np  # noqa: E402

JOBS: dict[str, tuple[Callable[..., dict[str, Any]], tuple[str, ...]]] = {}


def job(name: str, imports: tuple[str, ...] = ()) -> Callable:
    def register(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        JOBS[name] = (function, imports)
        return function

    return register


def load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files}


class NpzReader:
    """onnxruntime's ``CalibrationDataReader`` protocol over a saved data set, one sample a feed."""

    def __init__(self, path: str, layout: str) -> None:
        from corpus import samples

        self.feeds = samples(load(path), layout)
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.feeds):
            return None
        self.position += 1
        return self.feeds[self.position - 1]

    def rewind(self) -> None:
        self.position = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while (feed := self.get_next()) is not None:
            yield feed


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


@job("qb-methods", imports=("quantbench.calibrate", "quantbench.qdq"))
def qb_methods(model: str, calib: str, outputs: dict[str, str]) -> dict[str, Any]:
    """One statistics pass (``calibrate`` with several methods), then a Q/DQ model per method."""
    from quantbench.calibrate import calibrate
    from quantbench.model.graph import open_graph
    from quantbench.qdq import quantize_model, write_quantized

    graph = open_graph(model)
    result = calibrate(
        graph, calib, methods=list(outputs), tensors="quantizable", use_cache=False,
        show_progress=False,
    )  # fmt: skip
    done: dict[str, str] = {}
    for method, path in outputs.items():
        try:
            write_quantized(quantize_model(graph, result.tables[method]), path)
            done[method] = "ok"
        except Exception as exc:  # noqa: BLE001 - one method's failure must not hide the others
            done[method] = first_line(exc)
    return {"samples": result.stats.num_samples, "tensors": len(result.stats), "models": done}


@job("qb-quantize", imports=("quantbench.quantize",))
def qb_quantize(
    model: str,
    calib: str,
    output: str,
    method: str | None = None,
    refine: str | None = None,
    max_added_macs: float | None = None,
) -> dict[str, Any]:
    """``quantbench quantize MODEL --data CALIB [--method M] [--refine P] [--max-added-macs F]
    -o OUT`` (Python API)."""
    from quantbench.quantize import quantize

    kwargs: dict[str, Any] = {} if method is None else {"method": method}
    if refine is not None:
        kwargs["refine"] = refine
    if max_added_macs is not None:
        kwargs["max_added_macs"] = max_added_macs
    outcome = quantize(model, output, data=calib, show_progress=False, **kwargs)
    methods = sorted({e.method for e in outcome.table.entries.values() if e.method})
    methods = methods or [outcome.table.method or "?"]
    found: dict[str, Any] = {"table_methods": methods}
    if outcome.refine is not None:
        found["refine"] = outcome.refine.to_dict()
    return found


@job("ort-static", imports=("onnxruntime.quantization",))
def ort_static(model: str, calib: str, layout: str, output: str, method: str) -> dict[str, Any]:
    """onnxruntime ``quantize_static``: QDQ, per-channel, symmetric INT8 activations and weights."""
    reader = NpzReader(calib, layout)
    _ort_quantize(model, reader, output, method, {})
    return {"samples": len(reader.feeds), "method": method}


def _ort_quantize(
    model: str, reader: NpzReader, output: str, method: str, extra: dict[str, Any]
) -> None:
    """The ort jobs' one recipe; ``extra`` adds options (SmoothQuant) and changes nothing else."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        model, output, reader,
        quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, method),
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, **extra},
    )  # fmt: skip


# The peers (peers.py): run by the peers venv's python (run_job's ``python``).


@job(
    "ort-smoothquant",
    imports=("onnxruntime.quantization", "neural_compressor.adaptor.ox_utils.smooth_quant"),
)
def ort_smoothquant(
    model: str, calib: str, layout: str, output: str, alpha: float = 0.5
) -> dict[str, Any]:
    """``ort-static`` MinMax with onnxruntime's SmoothQuant (Neural Compressor's), where there is
    something to smooth; otherwise a "not applicable" record and no model."""
    from peers import smoothable_ops

    smoothable = smoothable_ops(model)
    if smoothable == 0:
        return {"not_applicable": "no MatMul, Gemm or Conv with an initializer weight"}
    reader = NpzReader(calib, layout)
    extra = {"SmoothQuant": True, "SmoothQuantAlpha": alpha}
    _ort_quantize(model, reader, output, "MinMax", extra)
    return {"samples": len(reader.feeds), "smoothable_ops": smoothable, "alpha": alpha}


@job("quark", imports=("quark.onnx", "torch"))
def quark(
    model: str, calib: str, layout: str, output: str, adaround_iterations: int
) -> dict[str, Any]:
    """AMD Quark for ONNX, MinMax INT8 Q/DQ, with AdaRound when ``adaround_iterations`` > 0."""
    from peers import quark_quantize

    reader = NpzReader(calib, layout)
    return {"samples": len(reader.feeds), **quark_quantize(model, reader, output,
                                                           adaround_iterations)}  # fmt: skip


@job("evaluate", imports=("onnxruntime", "corpus"))
def evaluate(
    key: str, pkgs: str, model: str, data: str, layout: str, candidates: dict[str, str]
) -> dict[str, Any]:
    """FP32 and every candidate over the evaluation set, scored with the model's task metric."""
    import onnxruntime as ort
    from corpus import corpus, run_samples

    spec = next(m for m in corpus(Path(pkgs)) if m.key == key)
    arrays = load(data)
    labels_path = Path(data).with_name("labels.npy")
    labels = np.load(labels_path) if labels_path.is_file() else None
    run = spec.run or run_samples

    from quantbench.backends.onnxruntime import disabled_optimizers, session_config

    def outputs(path: str) -> list[list[np.ndarray]]:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # exporters' stale output shapes warn on every run
        for key, value in session_config().items():
            options.add_session_config_entry(key, value)
        # a Q/DQ model as written, as TensorRT computes it: where onnxruntime's fused integer
        # kernels saturate (x86 without VNNI) the fusion is off, as in quantbench's sessions
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=disabled_optimizers())  # fmt: skip
        return run(session, arrays, layout)

    reference = outputs(model)
    scores: dict[str, Any] = {"fp32": spec.score(reference, reference, labels)}
    for name, path in candidates.items():
        try:
            got, reshaped = _shaped_as(outputs(path), reference)
            scores[name] = spec.score(reference, got, labels)
            if reshaped:
                scores[name]["reshaped_outputs"] = True
        except Exception as exc:  # noqa: BLE001
            scores[name] = {"error": first_line(exc)}
    return {"scores": scores, "eval_samples": len(reference)}


def _shaped_as(
    got: list[list[np.ndarray]], reference: list[list[np.ndarray]]
) -> tuple[list[list[np.ndarray]], bool]:
    """A candidate's outputs in FP32's shapes where only the shape differs (same size): Quark
    rebuilds dddd-ocr's (32, 1, 8210) output as (1, 262720), the shape the model declares, and
    a user would reshape it back before decoding. Whether any was reshaped (recorded)."""
    reshaped = False
    shaped = []
    for sample, ref in zip(got, reference, strict=True):
        if not isinstance(sample, list | tuple) or not isinstance(ref, list | tuple):
            return got, False  # a runner of its own (a stateful model): left as it returns
        row = []
        for g, r in zip(sample, ref, strict=True):
            if isinstance(g, np.ndarray) and g.shape != r.shape and g.size == r.size:
                g, reshaped = g.reshape(r.shape), True
            row.append(g)
        shaped.append(row)
    return shaped, reshaped


def child_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in JOBS:
        print(f"usage: jobs.py {{{'|'.join(JOBS)}}} JSON_ARGS", file=sys.stderr)
        return 2
    function, imports = JOBS[argv[0]]
    for module in imports:
        importlib.import_module(module)
    start = time.perf_counter()
    try:
        details = function(**json.loads(argv[1]))
    except Exception as exc:  # noqa: BLE001 - reported as one line to the parent
        traceback.print_exc()
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    record = {"job": argv[0], "seconds": seconds, "peak_rss_kib": peak_rss_kib(), **details}
    print("\n" + json.dumps(record))  # own line: some tools' progress bars end without one
    return 0


def peak_rss_kib() -> int:
    """This process' peak RSS (KiB): ``VmHWM``, the high-water mark of its own address space.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the pre-exec process' high-water
    mark over ``exec``, and subprocess forks (vfork) the parent, so a job started from
    run_zoo.py (a few hundred MiB) reported at least the parent's RSS; a 14 MiB child of a
    600 MiB parent read 613 MiB there. ru_maxrss stays the fallback where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ============================================================ parent side


@dataclass
class Outcome:
    job: str
    ok: bool
    seconds: float | None = None
    peak_rss_kib: int | None = None
    error: str | None = None
    details: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "ok": self.ok,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "peak_rss_mib": None if self.peak_rss_kib is None else round(self.peak_rss_kib / 1024),
            "error": self.error,
            **(self.details or {}),
        }


def run_job(
    name: str, args: dict[str, Any], cache: Path, timeout: float = 900, python: str | None = None
) -> Outcome:
    """Run one job in its own process, with a private, emptied statistics cache, which is also
    its working folder (Quark writes a CSV there). ``python``: another interpreter (the peers
    venv's) for jobs whose tools are not in the project's venv."""
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "QUANTBENCH_CACHE": str(cache)}
    try:
        proc = subprocess.run(
            [python or sys.executable, str(Path(__file__).resolve()), name, json.dumps(args)],
            capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=cache,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Outcome(name, False, error=f"timed out after {timeout:.0f} s")
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error: ")]
        how = f"killed by signal {-proc.returncode}: " if proc.returncode < 0 else ""
        message = errors[-1][7:] if errors else (lines[-1] if lines else "no output")
        return Outcome(name, False, error=how + message)
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    seconds, peak = record.pop("seconds"), record.pop("peak_rss_kib")
    record.pop("job")
    return Outcome(name, True, seconds, peak, details=record)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
