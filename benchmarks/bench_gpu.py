"""GPU calibration benchmark: `quantbench calibrate --provider cuda`, its floor and its peer.

Run on a machine with an NVIDIA GPU, onnxruntime-gpu and CuPy (``pip install -e '.[gpu]'``).
Two workloads, same samples and batch for every job of a workload, each job a whole process of
its own (benchmarks/_jobs.py; ``seconds`` excludes interpreter start-up and imports, the
process column includes them):

* ``resnet18``: the ResNet-18-shaped model of models.py (dynamic batch);
* ``resnet50``: a ResNet-50-shaped model built here the same way (bottleneck blocks 3-4-6-3,
  53 Conv, BatchNorm statistics measured and folded; 25.6 M parameters).

Jobs: ours = ``quantbench calibrate MODEL --data D --method all --no-cache --provider cuda
--batch-size B`` through the Python API (statistics on the GPU; the tables of all seven methods
are computed on the GPU afterwards), and the same with ``--method entropy`` alone; floor =
plain onnxruntime-gpu FP32 inference (CUDAExecutionProvider, its default options) over the
same samples and batch; floor_fp32 = the same with TF32 off, the numerics quantbench's CUDA
sessions use (onnxruntime's default rounds convolution inputs to TF32);
peer = onnxruntime ``quantize_static`` with CalibrationMethod.Entropy and
``calibration_providers=[CUDA]``. The peer keeps every calibrated activation of every sample in
host memory, so it runs on 32 and 64 samples and its full-count time is the straight line
through those (marked ``~``). One untimed warm-up round first (CuPy compiles its kernels once
per machine and caches them on disk; cuDNN loads), then ``--repeat`` alternating rounds, medians.
Target (issue 12): ours / floor <= 1.3x.

    python benchmarks/bench_gpu.py [--samples 1024] [--batch 32] [--repeat 3] [--work DIR]
                                   [--only resnet18,resnet50] [--no-peer] [--profile FILE]

``--profile FILE`` measures instead where the time of one calibration goes (first workload of
``--only``, in this process: phase wall times, a cProfile, and CUDA-event times of one part's
inference and statistics) and writes it to FILE.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _jobs  # noqa: E402
from _jobs import (  # noqa: E402
    JobFailed,
    JobResult,
    job,
    load_feeds,
    make_console,
    ratio,
    ratio_cell,
    run_alternating,
    write_json,
    write_npz,
)

#: the second "ours" row: one method's table instead of all seven
ONE_METHOD = "entropy"
DEFAULT_SAMPLES = 1024
DEFAULT_BATCH = 32
DEFAULT_REPEAT = 3
PEER_SAMPLES = (32, 64)
MAX_FLOOR_RATIO = 1.3
JOB_TIMEOUT_S = 900.0
CUDA = "CUDAExecutionProvider"
#: ResNet-50: (width, blocks, first stride) per stage; the block output is 4x the width.
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))


# ============================================================================ the jobs (child side)


def _cuda_session(model: str, tf32: bool = True) -> Any:
    import onnxruntime as ort

    ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, as quantbench does
    options = {} if tf32 else {"use_tf32": "0"}
    session = ort.InferenceSession(model, providers=[(CUDA, options)])
    if CUDA not in session.get_providers():
        raise SystemExit(f"{CUDA} did not start: {session.get_providers()}")
    return session


@job("gpu-ort-fp32", imports=("onnxruntime",))
def gpu_ort_fp32(
    model: str, data: str, batch: int, max_samples: int | None = None, tf32: bool = True
) -> dict:
    """The floor: plain FP32 inference on the GPU over the same samples and batch (onnxruntime's
    defaults, TF32 included; ``tf32=False``: exact FP32, as quantbench's sessions run)."""
    session = _cuda_session(model, tf32)
    feeds = load_feeds(data, [i.name for i in session.get_inputs()], max_samples)
    for feed in _jobs.ArrayReader(feeds, batch=batch):
        session.run(None, feed)
    return {"samples": len(next(iter(feeds.values())))}


@job("gpu-qb-calibrate", imports=("quantbench.calibrate", "cupy", "onnxruntime"))
def gpu_qb_calibrate(
    model: str, data: str, batch: int, methods: list[str], max_samples: int | None = None
) -> dict:
    """``quantbench calibrate --method M --no-cache --provider cuda``, Python API."""
    from quantbench.calibrate import calibrate
    from quantbench.collect.devicecollect import wants_device_stats

    on_device = wants_device_stats("cuda")
    result = calibrate(
        model,
        data,
        methods=methods,
        use_cache=False,
        provider="cuda",
        batch_size=batch,
        max_samples=max_samples,
        show_progress=False,
    )
    return {
        "samples": result.stats.num_samples,
        "tensors": len(result.stats),
        "methods": len(result.tables),
        "device_binning": on_device,
    }


@job("gpu-ort-entropy", imports=("onnxruntime.quantization",))
def gpu_ort_entropy(
    model: str, data: str, output: str, batch: int, max_samples: int | None = None
) -> dict:
    """onnxruntime ``quantize_static`` Entropy (QDQ, per-channel, symmetric), CUDA calibration."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.preload_dlls()
    feeds = load_feeds(data, _jobs.model_input_names(model), max_samples)
    quantize_static(
        model,
        output,
        _jobs.ArrayReader(feeds, batch=batch),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.Entropy,
        calibration_providers=[CUDA],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )
    return {"samples": len(next(iter(feeds.values())))}


# ============================================================================ where the time goes


#: functions whose wall time the profile adds up (module, attribute path)
PHASES = (
    ("quantbench.calibrate", "open_graph"),
    ("quantbench.calibrate", "collect_stats"),
    ("quantbench.collect.devicecollect", "expose"),
    ("quantbench.collect.devicecollect", "DeviceOutputRunner.__init__"),
    ("quantbench.collect.devicecollect", "DeviceOutputRunner.infer"),
    ("quantbench.collect.devicecollect", "_DeviceBinner.bin"),
    ("quantbench.collect.devicecollect", "_DeviceBinner.results"),
    ("quantbench.collect.devicecollect", "StatsFile"),
    ("quantbench.data.sources", "StreamFingerprint.update"),
)


def _timed_phases(totals: dict[str, list[float]]) -> list[tuple[Any, str, Any]]:
    """Wrap each of :data:`PHASES` to add its wall seconds and calls to ``totals``; returns
    what to restore."""
    import functools
    import importlib

    undo = []
    for module_name, path in PHASES:
        owner: Any = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        if owner is None or not hasattr(owner, attr):
            continue
        original = getattr(owner, attr)

        def wrapped(*a: Any, _f: Any = original, _k: str = path, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _f(*a, **kw)
            finally:
                entry = totals.setdefault(_k, [0.0, 0])
                entry[0] += time.perf_counter() - t0
                entry[1] += 1

        functools.update_wrapper(wrapped, original)
        setattr(owner, attr, wrapped)
        undo.append((owner, attr, original))
    return undo


def profile(model: Path, data: Path, batch: int, samples: int, out: Path) -> None:
    """In this process: where ``calibrate -m all --provider cuda`` spends its time (phase wall
    times, a cProfile by cumulative time) and the device time of one part's statistics (CUDA
    events: onnxruntime's inference, the range + count kernels), written to ``out``."""
    import cProfile
    import io
    import pstats

    import cupy as cp

    from quantbench.calibrate import calibrate

    lines: list[str] = []
    args = dict(methods=["all"], use_cache=False, provider="cuda", batch_size=batch,
                max_samples=samples, show_progress=False)  # fmt: skip

    def timed(label: str, **extra: Any) -> float:
        t0 = time.perf_counter()
        calibrate(str(model), str(data), **{**args, **extra})
        seconds = time.perf_counter() - t0
        lines.append(f"{label}: {seconds:.3f} s")
        return seconds

    timed("first call (imports, kernel compile/cache, cuDNN)")
    timed("calibrate -m all")
    timed("calibrate -m entropy", methods=["entropy"])
    totals: dict[str, list[float]] = {}
    undo = _timed_phases(totals)
    try:
        timed("calibrate -m all, phases timed")
    finally:
        for owner, attr, original in undo:
            setattr(owner, attr, original)
    for key, (seconds, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {key:<40} {seconds:8.3f} s  {calls:5d} calls")
    profiler = cProfile.Profile()
    profiler.enable()
    calibrate(str(model), str(data), **args)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    lines.append(text.getvalue())
    lines.extend(_device_part_times(model, data, batch, cp))
    out.write_text("\n".join(lines))
    print("\n".join(lines[:40]))


def _device_part_times(model: Path, data: Path, batch: int, cp: Any) -> list[str]:
    """CUDA-event times of one part of ``batch`` samples: the exposed inference and the
    statistics kernels, each alone, 10 runs after 2 warm-ups (median)."""
    import statistics

    from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
    from quantbench.backends.ortdevice import DeviceOutputRunner
    from quantbench.collect.devicecollect import _DeviceBinner
    from quantbench.collect.statspass import derivation_plan
    from quantbench.model.graph import calibration_tensors, open_graph

    graph = open_graph(str(model))
    tensors = calibration_tensors(graph, "all")
    plan = derivation_plan(graph, tensors)
    inputs = {s.name for s in graph.inputs}
    measured = [t for t in tensors if t not in plan and t not in inputs]
    feed = {graph.inputs[0].name: np.load(data)["input"][:batch]}
    runner = DeviceOutputRunner(expose(graph.model, measured, graph.elem_types), cp, "cuda")
    plain = OnnxRuntimeRunner(str(model), "cuda")

    def gpu_ms(step: Any) -> float:
        times = []
        for i in range(12):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            t0 = time.perf_counter()
            start.record()
            step()
            stop.record()
            stop.synchronize()
            if i >= 2:
                wall = (time.perf_counter() - t0) * 1e3
                times.append((cp.cuda.get_elapsed_time(start, stop), wall))
        return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)

    outputs = runner.infer(feed, measured)
    n_values = sum(int(a.size) for a in outputs.values())
    relus = len([1 for kind, _ in plan.values() if kind == "relu"])
    lines = [f"one part: batch {batch}, {len(measured)} measured tensors, "
             f"{n_values / 1e6:.1f} M values, {relus} Relus from bins"]  # fmt: skip
    binner = _DeviceBinner(cp, tensors, plan)
    arrays = [a.reshape(-1) for a in outputs.values()]
    steps = {
        "plain inference (session.run)": lambda: plain.infer(feed),
        "exposed inference (IOBinding)": lambda: runner.infer(feed, measured),
        "statistics (range, sync, count)": lambda: binner.bank.add(outputs),
        "range kernel and sync alone": lambda: binner.bank._ranges(arrays),
    }
    for label, step in steps.items():
        device, wall = gpu_ms(step)
        lines.append(f"  {label:<34} {device:8.2f} ms device {wall:8.2f} ms wall")
    return lines


# ============================================================================ inputs (parent side)


def build_resnet50(path: Path, seed: int = 0) -> Path:
    """A ResNet-50-shaped model with a dynamic batch axis (models.py's builder and weights)."""
    import models

    b = models._Builder(rng=np.random.default_rng([seed, 50]))
    x = (models.INPUT_NAME, models._images(models.BN_STAT_SAMPLES, seed, 1))
    x = b.conv_bn("conv1", x, 64, 7, 2, "stem", relu=True)
    b.nodes.append(
        helper.make_node(
            "MaxPool", [x[0]], ["maxpool_output"], name="maxpool",
            kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
        )
    )  # fmt: skip
    x = ("maxpool_output", models._maxpool_3x3_s2(x[1]))
    for stage, (width, blocks, stride) in enumerate(RESNET50_STAGES, start=1):
        for block in range(blocks):
            x = _bottleneck(b, f"layer{stage}.{block}", x, width, stride if block == 0 else 1)
    b.head(x)
    shape = ["N", 3, models.IMAGE_SIZE, models.IMAGE_SIZE]
    graph = helper.make_graph(
        b.nodes,
        "resnet50",
        [helper.make_tensor_value_info(models.INPUT_NAME, TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(models.OUTPUT_NAME, TensorProto.FLOAT, ["N", 1000])],
        initializer=b.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", models.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _bottleneck(b: Any, name: str, x: tuple, width: int, stride: int) -> tuple:
    """torchvision Bottleneck (v1.5: stride on the 3x3): 1x1, 3x3, 1x1 (4x), + shortcut."""
    branch = b.conv_bn(f"{name}.conv1", x, width, 1, 1, "inner", relu=True)
    branch = b.conv_bn(f"{name}.conv2", branch, width, 3, stride, "inner", relu=True)
    branch = b.conv_bn(f"{name}.conv3", branch, 4 * width, 1, 1, "branch_out", relu=False)
    shortcut = x
    if stride != 1 or x[1].shape[1] != 4 * width:
        shortcut = b.conv_bn(f"{name}.downsample", x, 4 * width, 1, stride, "downsample", False)
    b.nodes.append(helper.make_node("Add", [branch[0], shortcut[0]], [f"{name}.add_output"]))
    return b.relu(f"{name}.relu", (f"{name}.add_output", branch[1] + shortcut[1]))


def prepare(work: Path, samples: int) -> dict[str, Path]:
    """Both models and one data file (the same images for both), built once per work folder."""
    import models

    work.mkdir(parents=True, exist_ok=True)
    paths = {"resnet18": work / "resnet18-dyn.onnx", "resnet50": work / "resnet50-dyn.onnx"}
    if not paths["resnet18"].is_file():
        models.build_resnet18(paths["resnet18"], seed=0, dynamic_batch=True)
    if not paths["resnet50"].is_file():
        build_resnet50(paths["resnet50"])
    data = work / f"images-{samples}.npz"
    if not data.is_file():
        write_npz(data, input=models.make_resnet18_data(samples, seed=1))
    return {**paths, "data": data}


# ============================================================================ measuring


def measure(
    model: Path, data: Path, work: Path, samples: int, batch: int, repeat: int, peer: bool = True
) -> dict:
    common = {"model": str(model), "data": str(data), "batch": batch, "max_samples": samples}
    jobs = {
        "floor": ("gpu-ort-fp32", common),
        "floor_fp32": ("gpu-ort-fp32", {**common, "tf32": False}),
        "ours": ("gpu-qb-calibrate", {**common, "methods": ["all"]}),
        "ours_entropy": ("gpu-qb-calibrate", {**common, "methods": [ONE_METHOD]}),
    }
    run_alternating(jobs, repeat=1, timeout=JOB_TIMEOUT_S)  # warm-up: kernel caches, cuDNN
    results: dict[str, Any] = run_alternating(jobs, repeat=repeat, timeout=JOB_TIMEOUT_S)
    probes: dict[int, JobResult | JobFailed] = {}
    for n in PEER_SAMPLES if peer else ():
        args = {**common, "max_samples": n, "output": str(work / f"{model.stem}-ort-{n}.onnx")}
        probes[n] = run_alternating(
            {"peer": ("gpu-ort-entropy", args)}, repeat=1, timeout=JOB_TIMEOUT_S
        )["peer"]
    results["peer_probes"] = probes
    results["peer"] = _peer_at(probes, samples)
    return results


def _peer_at(probes: dict[int, JobResult | JobFailed], samples: int) -> dict[str, Any]:
    """The peer at ``samples``: measured if probed there, else the line through two probes."""
    ok = {n: r for n, r in probes.items() if isinstance(r, JobResult)}
    if samples in ok:
        return {"seconds": ok[samples].seconds, "process_seconds": ok[samples].process_seconds,
                "estimated": False}  # fmt: skip
    if len(ok) < 2:
        failed = [str(r) for r in probes.values() if isinstance(r, JobFailed)]
        return {"error": "; ".join(failed) or "not measured"}
    (n1, r1), (n2, r2) = sorted(ok.items())[:2]

    def line(a: float, b: float) -> float:
        return a + (b - a) * (samples - n1) / (n2 - n1)

    return {
        "seconds": line(r1.seconds, r2.seconds),
        "process_seconds": line(r1.process_seconds, r2.process_seconds),
        "estimated": True,
    }


def _cell(result: Any, key: str = "seconds") -> str:
    if isinstance(result, JobFailed):
        return f"failed: {result.summary}"
    value = getattr(result, key, None) if isinstance(result, JobResult) else result.get(key)
    if value is None:
        return result.get("error", "-") if isinstance(result, dict) else "-"
    mark = "~" if isinstance(result, dict) and result.get("estimated") else ""
    return f"{mark}{value:.2f} s"


def _seconds(result: Any, key: str = "seconds") -> float | None:
    if isinstance(result, JobResult):
        return getattr(result, key)
    return result.get(key) if isinstance(result, dict) else None


def gpu_name() -> str:
    """The device's own name (CuPy, else torch), for titles: the machine may be any GPU."""
    try:
        from quantbench.machine import describe_gpu

        return describe_gpu(0).name
    except Exception as exc:  # noqa: BLE001 - a title never stops the benchmark
        return f"GPU not identified ({type(exc).__name__})"


def render(
    console: Any, key: str, samples: int, batch: int, results: dict, gpu: str
) -> dict[str, Any]:
    from rich.table import Table

    table = Table(title=f"{key}: {samples} samples, batch {batch}, {gpu} (CUDA)")
    for column in ("job", "work", "process", "vs floor (work)", "vs floor (process)"):
        table.add_column(column)
    floor = results["floor"]
    rows = {
        "floor: onnxruntime-gpu FP32 inference": floor,
        "floor_fp32: the same, TF32 off (quantbench's numerics)": results["floor_fp32"],
        "ours: quantbench calibrate -m all --provider cuda": results["ours"],
        f"ours_entropy: quantbench calibrate -m {ONE_METHOD} --provider cuda": results[
            "ours_entropy"
        ],
        "peer: onnxruntime quantize_static Entropy (CUDA)": results["peer"],
    }
    verdict: dict[str, Any] = {}
    for label, result in rows.items():
        work_ratio = ratio(_seconds(result), _seconds(floor))
        proc_ratio = ratio(_seconds(result, "process_seconds"), _seconds(floor, "process_seconds"))
        table.add_row(
            label,
            _cell(result),
            _cell(result, "process_seconds"),
            ratio_cell(work_ratio),
            ratio_cell(proc_ratio),
        )
        verdict[label.split(":")[0]] = {"work_ratio": work_ratio, "process_ratio": proc_ratio}
    console.print(table)
    ours = verdict["ours"]["work_ratio"]
    met = ours is not None and ours <= MAX_FLOOR_RATIO
    console.print(f"ours / floor (work) {ratio_cell(ours)}: target <= {MAX_FLOOR_RATIO}x "
                  f"{'met' if met else 'missed'}")  # fmt: skip
    return verdict


def _doc(result: Any) -> Any:
    if isinstance(result, JobResult):
        return result.to_dict()
    if isinstance(result, JobFailed):
        return {"error": str(result)}
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in _jobs.JOBS:  # a child: run one job
        return _jobs.child_main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--only", default="resnet18,resnet50")
    parser.add_argument("--work", type=Path, default=_jobs.WORK / "gpu")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write where the time goes to this file "
        "(first workload of --only, in this process) instead of the benchmark",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip onnxruntime quantize_static")
    args = parser.parse_args(argv)
    # the children are this script (its jobs are registered here), run by _jobs' runner
    _jobs.JOBS_SCRIPT = Path(__file__).resolve()
    console = make_console()
    start = time.perf_counter()
    inputs = prepare(args.work, args.samples)
    console.print(f"inputs ready in {time.perf_counter() - start:.1f} s")
    if args.profile:
        key = args.only.split(",")[0].strip()
        profile(inputs[key], inputs["data"], args.batch, args.samples, args.profile)
        return 0
    gpu = gpu_name()
    document: dict[str, Any] = {"samples": args.samples, "batch": args.batch, "workloads": {}}
    for key in [k.strip() for k in args.only.split(",") if k.strip()]:
        results = measure(inputs[key], inputs["data"], args.work, args.samples, args.batch,
                          args.repeat, peer=not args.no_peer)  # fmt: skip
        verdict = render(console, key, args.samples, args.batch, results, gpu)
        document["workloads"][key] = {
            **{k: _doc(v) for k, v in results.items() if k != "peer_probes"},
            "peer_probes": {n: _doc(r) for n, r in results["peer_probes"].items()},
            "ratios": verdict,
        }
    document["wall_seconds"] = time.perf_counter() - start
    document["gpu"] = gpu
    write_json(args.work / "bench_gpu.json", document)
    console.print(f"total {document['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
