"""A real depthwise-heavy model through the DWConv2D op: FP32, FP16 and INT8 against FP32
onnxruntime, and the op's latency against onnxruntime's own Conv (issue 39 item 3).

Why: the op's tests use synthetic shapes; this runs a pretrained network whose depthwise convs
all go through the op, so drift is measured where it matters (accumulated through the network,
on real photos) and the task metric (top-1 / top-5 agreement with FP32) says what it costs.

Steps, each a whole ``quantbench`` process where the CLI does the work:

a. ``quantbench rewrite --to dwconv2d --depthwise``: every constant-weight depthwise/grouped Conv
   becomes a DWConv2D node (its weight initializer the op's W input).
b. FP32: ``quantbench compare fp32 REWRITTEN --dwconv2d-op plugin[:cuda]``: per-layer drift and
   the outputs against the original model in onnxruntime FP32.
c. INT8: ``quantbench quantize --dwconv2d`` (the plugin's INT8 form: int8 in, one per-tensor
   weight scale, the other convs Q/DQ), compared the same way; beside it, for reference, the
   original model's Q/DQ INT8 (per-channel weights, onnxruntime's Conv) by the same calibrator.
d. FP16: ``quantize --high-precision fp16`` refuses ``--dwconv2d`` (the INT8 plugin form has no
   strongly-typed FP16 variant), so the FP16 model is made here (:func:`fp16_model`): every
   float32 initializer to float16, a Cast after the input and before the output, so every op,
   DWConv2D included, computes in FP16 (the op runs FP16 between exact Casts inside onnxruntime:
   plugins/dwconv2d/README.md, "The op inside onnxruntime").
e. Latency: the original model in onnxruntime (its own Conv, on ``--provider``: cpu, or cuda
   where onnxruntime-gpu is installed) against the rewritten model with the op on ``--device``
   inside a session on the same provider (on cuda each op call copies its tensors to and from
   the GPU, and onnxruntime runs the custom op's node on the CPU side, so this is not the
   plugin's speed inside TensorRT); on cuda also the kernels alone against torch's cuDNN
   convolution for the model's depthwise layers (same shapes, device buffers, CUDA-graph timing
   of tests/gpu/dwconv_gpu_harness.py). ``--provider cuda`` also runs every ``compare`` (the
   FP32 reference and the other ops of each candidate) on onnxruntime's CUDA provider.

Data: a .npz with the model's input (``input``, [N, 3, 224, 224], imagenet preset) for
calibration and one for evaluation; :func:`make_photo_data` makes both from the photos of
benchmarks/bench_real_cnn.py (opencv-doc, mate-backgrounds), every third photo calibrating::

    python benchmarks/dwconv_real_model.py --make-data --calib calib.npz --eval eval.npz
    python benchmarks/dwconv_real_model.py --model mobilenet_v2.onnx --calib calib.npz \\
        --eval eval.npz --device cpu --max-samples 8

The model: benchmarks/export_mobilenet_v2.py. Results: rich tables, and a JSON written to
``--json`` (default ``$OUT/dwconv_real_model.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from rich.markup import escape
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
HARNESS_DIR = REPO / "tests" / "gpu"
DEVICES = ("cpu", "cuda")
PROVIDERS = ("cpu", "cuda")  # --provider, as quantbench's own --provider spells them
JSON_NAME = "dwconv_real_model.json"
console = Console(width=160)  # wide tables also when the output is a log file


class BenchError(Exception):
    """A user mistake or a missing piece, said in one line."""


# --------------------------------------------------------------------------- data


def make_photo_data(calib: Path, evaluation: Path) -> tuple[int, int]:
    """The photos of bench_real_cnn (imagenet preset), every third calibrating, as .npz."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_real_cnn import PHOTOS

    from quantbench.data.sources import Preset

    found = [p for p in PHOTOS if p.is_file()]
    if len(found) < 30:
        raise BenchError("photos missing: apt-get install -y opencv-doc mate-backgrounds")
    preset = Preset.load("imagenet")
    samples = [preset.apply(p) for p in found]
    cal = np.stack([s for i, s in enumerate(samples) if i % 3 == 0])
    ev = np.stack([s for i, s in enumerate(samples) if i % 3 != 0])
    np.savez(calib, input=cal)
    np.savez(evaluation, input=ev)
    return len(cal), len(ev)


# --------------------------------------------------------------------------- quantbench steps


def quantbench(*args: str | Path, log: Path) -> None:
    """One ``quantbench`` command as its own process (as a user runs it); its output to ``log``;
    a failure raises with the command's last line."""
    cmd = [sys.executable, "-m", "quantbench", *map(str, args)]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log.write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise BenchError(f"quantbench {args[0]} failed ({log}): {last}")
    console.print(f"[dim]quantbench {args[0]} … {time.perf_counter() - started:.1f} s[/dim]")


def depthwise_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The model's DWConv2D nodes."""
    return [n for n in model.graph.node if n.op_type == "DWConv2D"]


def compare_summary(doc: dict[str, Any], dw_names: set[str]) -> dict[str, Any]:
    """What a compare JSON says about candidate B: outputs, worst layer, the DWConv2D layers."""
    out = doc["outputs"][0]
    layers = [r for r in doc["layers"] if r["candidate"] == "B" and r["view"] == "accumulated"]

    def sqnr(r: dict[str, Any]) -> float:
        return float(r["sqnr_db"])  # the JSON writes inf as the string "inf"

    worst = min(layers, key=sqnr) if layers else None
    dw_rows = [r for r in layers if r["node"] in dw_names]
    return {
        "output": out["name"],
        "top1_agreement": out["agreement"],
        "top5_agreement": out["top5_agreement"],
        "output_sqnr_db": out["sqnr_db"],
        "output_cosine": out["cosine"],
        "output_max_abs": out["max_abs"],
        "samples": doc["data"]["eval_samples"],
        "worst_layer": None if worst is None else {"node": worst["node"], "sqnr_db": sqnr(worst)},
        "dwconv_layers": [
            {"node": r["node"], "sqnr_db": sqnr(r), "cosine": r["cosine"], "max_abs": r["max_abs"]}
            for r in dw_rows
        ],
        "custom_ops": doc["b"].get("custom_ops"),
    }


def run_compare(
    candidate: Path, args: argparse.Namespace, op_mode: str, work: Path, tag: str
) -> dict[str, Any]:
    out = work / f"compare_{tag}.json"
    extra = ["--max-samples", str(args.max_samples)] if args.max_samples else []
    quantbench(
        "compare", "fp32", candidate, "--model", args.model, "--data", args.eval,
        "--dwconv2d-op", op_mode, "--provider", args.provider, "--no-latency", "--json", out,
        *extra, log=work / f"compare_{tag}.log",
    )  # fmt: skip
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- FP16


def fp16_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every op in FP16: float32 initializers to float16, Cast after each float32 input and
    before each float32 output, so the file keeps float32 I/O (compare feeds it the same data)
    and every intermediate tensor keeps its name (per-layer drift matches by name)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(init).astype(np.float16)
            g.initializer[i].CopyFrom(numpy_helper.from_array(array, init.name))
    renames: dict[str, str] = {}
    casts_in = []
    for inp in g.input:
        if inp.type.tensor_type.elem_type == TensorProto.FLOAT:
            renames[inp.name] = f"{inp.name}_fp16"
            casts_in.append(
                helper.make_node("Cast", [inp.name], [renames[inp.name]],
                                 name=f"{inp.name}_to_fp16", to=TensorProto.FLOAT16)  # fmt: skip
            )
    for node in g.node:
        node.input[:] = [renames.get(t, t) for t in node.input]
    casts_out = []
    for output in g.output:
        if output.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = f"{output.name}_fp16"
        for node in g.node:
            node.output[:] = [inner if t == output.name else t for t in node.output]
        casts_out.append(
            helper.make_node("Cast", [inner], [output.name], name=f"{output.name}_to_fp32",
                             to=TensorProto.FLOAT)  # fmt: skip
        )
    nodes = casts_in + list(g.node) + casts_out
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]  # float32 shapes would now be wrong; onnxruntime infers them
    return out


# --------------------------------------------------------------------------- latency


def _median_ms(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def model_latency(
    original: Path, rewritten: Path, x: np.ndarray, device: str, provider: str, reps: int
) -> dict[str, Any]:
    """Whole-model wall time per run: the original in onnxruntime (its own Conv, on
    ``provider``) against the rewritten model with the op on ``device``, inside an onnxruntime
    session on the same provider (with cuda, onnxruntime runs the op's node on the CPU side and
    copies its tensors across; the op then copies them to the GPU again when ``device`` is cuda)."""
    import onnxruntime as ort

    import quantbench.plugins.dwconv2d as dw
    from quantbench.backends.onnxruntime import resolve_provider, session_providers

    providers = session_providers(resolve_provider(provider))  # TF32 off, as compare runs it
    ref = ort.InferenceSession(str(original), providers=providers)
    ours = dw.make_session(rewritten, device=device, providers=providers)
    name = ref.get_inputs()[0].name
    return {
        "batch": int(x.shape[0]),
        "reps": reps,
        f"onnxruntime_conv_{provider}_ms": _median_ms(lambda: ref.run(None, {name: x}), 3, reps),
        f"dwconv2d_op_{device}_in_{provider}_session_ms": _median_ms(
            lambda: ours.run(None, {name: x}), 3, reps
        ),
        "note": (
            f"onnxruntime's own Conv on its {provider} provider; the op on {device} inside an "
            f"onnxruntime {provider} session"
            + (", each op call copying its tensors to and from the GPU" if device == "cuda" else "")
            + (
                " (onnxruntime runs the custom op's node on the CPU side, so its tensors also "
                "cross between the provider's GPU memory and the host)"
                if provider == "cuda"
                else ""
            )
        ),
    }


def layer_shapes(
    model: onnx.ModelProto, batch: int, original: onnx.ModelProto | None = None
) -> list[dict[str, Any]]:
    """Each DWConv2D's problem at ``batch``: input shape, kernel, attributes. ONNX's shape
    inference stops at the first DWConv2D, so the shapes come from ``original`` (the model
    before the rewrite: same tensor names, standard ops) where given."""
    from quantbench.plugins.dwconv2d.onnx_op import tensor_shapes, validate_dwconv2d

    shapes = {**tensor_shapes(model), **(tensor_shapes(original) if original else {})}
    rows = []
    for node in depthwise_nodes(model):
        spec = validate_dwconv2d(model, node)
        x = shapes.get(node.input[0])
        if x is None or not all(isinstance(d, int) for d in x[1:]):
            raise BenchError(f"DWConv2D {node.name!r}: its input shape is not static ({x})")
        w = spec.weight_shape or ()
        rows.append({
            "node": node.name, "input": [batch, *x[1:]], "weight": list(w),
            "strides": list(spec.strides), "pads": list(spec.pads),
            "dilations": list(spec.dilations), "group": spec.group, "bias": len(node.input) > 2,
        })  # fmt: skip
    return rows


def _layer_tensors(spec: Any, mode: str, bias: bool, gen: Any) -> tuple[Any, Any, Any, Any]:
    """Random device tensors of one layer in ``mode`` and the kernel parameters (INT8: fixed
    scales, int8 output; the timing does not depend on the values)."""
    import torch

    k = spec.out_channels
    if mode == "int8":
        x = torch.randint(-128, 128, spec.input_shape, generator=gen, device="cuda").to(torch.int8)
        w = torch.randint(-128, 128, spec.weight_shape, generator=gen, device="cuda").to(torch.int8)
        b = torch.randn(k, generator=gen, device="cuda") if bias else None
        return x, w, b, spec.to_params(0.02, 0.01, 0.05)
    dtype = torch.float16 if mode == "f16" else torch.float32
    x = torch.randn(spec.input_shape, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(spec.weight_shape, generator=gen, device="cuda") * 0.1).to(dtype)
    b = torch.randn(k, generator=gen, device="cuda").to(dtype) if bias else None
    return x, w, b, spec.to_params()


def _launcher(lib: Any, mode: str, ptrs: tuple, params: Any, node: str) -> Callable[[], None]:
    """One forward of the kernels on torch's current stream (what time_cuda captures)."""
    import torch

    def launch() -> None:
        code = lib.forward(mode, *ptrs, params, torch.cuda.current_stream().cuda_stream)
        if code != 0:
            raise BenchError(f"{node} {mode}: CUDA error {code}")

    return launch


def kernel_latency(
    model: onnx.ModelProto, batch: int, reps: int, original: onnx.ModelProto | None = None
) -> dict[str, Any]:
    """The plugin kernels alone against torch's cuDNN conv (groups) for every depthwise layer:
    FP32 (TF32 off) and FP16 against cuDNN, INT8 (int8 out) ours alone (cuDNN has no INT8
    grouped conv in torch); device buffers, CUDA-graph replays (the harness's time_cuda)."""
    import torch

    sys.path.insert(0, str(HARNESS_DIR))
    from dwconv_gpu_harness import time_cuda, torch_conv

    from quantbench.plugins.dwconv2d import cuda as dwcuda
    from quantbench.plugins.dwconv2d import kernel_lib as kl

    lib = dwcuda.kernels()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for layer in layer_shapes(model, batch, original):
        n, c, h, w = layer["input"]
        k, _, kh, kw = layer["weight"]
        spec = kl.ConvSpec(
            batch=n, in_channels=c, in_h=h, in_w=w, out_channels=k, kernel=(kh, kw),
            strides=tuple(layer["strides"]), pads=tuple(layer["pads"]),
            dilations=tuple(layer["dilations"]), group=layer["group"],
            bias_mode=kl.BIAS_SHARED if layer["bias"] else kl.BIAS_NONE,
        )  # fmt: skip
        row: dict[str, Any] = {"node": layer["node"], "input": layer["input"], "kernel": [kh, kw],
                               "stride": layer["strides"][0]}  # fmt: skip
        for mode in ("f32", "f16", "int8"):
            x, wt, b, params = _layer_tensors(spec, mode, layer["bias"], gen)
            y = torch.empty(spec.output_shape, dtype=x.dtype, device="cuda")
            ptrs = (x.data_ptr(), wt.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr())
            launch = _launcher(lib, mode, ptrs, params, layer["node"])
            row[f"ours_{mode}_us"] = time_cuda(launch, reps=reps)
            row[f"ours_{mode}_path"] = lib.last_path()
            if mode != "int8":
                row[f"cudnn_{mode}_us"] = time_cuda(
                    lambda x=x, wt=wt, b=b, spec=spec: torch_conv(spec, x, wt, b), reps=reps
                )
        rows.append(row)
    totals = {
        key: sum(r[key] for r in rows)
        for key in ("ours_f32_us", "cudnn_f32_us", "ours_f16_us", "cudnn_f16_us", "ours_int8_us")
    }
    return {"batch": batch, "layers": rows, "totals_us": totals}


# --------------------------------------------------------------------------- report


def _fmt(value: float | str | None, digits: int = 2) -> str:
    """A number as printed; the results JSON writes inf as a string ("inf"), kept as it is."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return "inf" if value == float("inf") else f"{value:.{digits}f}"


def print_accuracy(results: dict[str, dict[str, Any]]) -> None:
    table = Table(title="Against FP32 onnxruntime (the original model, Conv)", title_justify="left")
    for col in ("candidate", "top-1 agree", "top-5 agree", "output SQNR dB", "worst layer",
                "DWConv2D layers SQNR dB (min / median)", "samples"):  # fmt: skip
        table.add_column(col)
    for name, s in results.items():
        dw = [r["sqnr_db"] for r in s["dwconv_layers"]]
        worst = s["worst_layer"]
        table.add_row(
            name,
            _fmt(s["top1_agreement"], 3),
            _fmt(s["top5_agreement"], 3),
            _fmt(s["output_sqnr_db"], 1),
            "-" if worst is None else f"{worst['node']} {_fmt(worst['sqnr_db'], 1)}",
            f"{_fmt(min(dw), 1)} / {_fmt(statistics.median(dw), 1)}" if dw else "- (no DWConv2D)",
            str(s["samples"]),
        )
    console.print(table)


def print_latency(model_lat: dict[str, Any], kernels: dict[str, Any] | None) -> None:
    t = Table(title=f"Whole model, batch {model_lat['batch']}, median of {model_lat['reps']} "
              "(ms)", title_justify="left")  # fmt: skip
    for key, value in model_lat.items():
        if key.endswith("_ms"):
            t.add_row(key[:-3], f"{value:.2f}")
    console.print(t)
    console.print(f"[dim]{model_lat['note']}[/dim]")
    if kernels is None:
        return
    k = Table(title=f"Depthwise layers, kernels alone vs cuDNN, batch {kernels['batch']} (us)",
              title_justify="left")  # fmt: skip
    for col in ("layer", "input", "k/s", "ours f32", "cuDNN f32", "ours f16", "cuDNN f16",
                "ours int8", "path f32/f16/int8"):  # fmt: skip
        k.add_column(col)
    for r in kernels["layers"]:
        k.add_row(
            r["node"], "x".join(map(str, r["input"])), f"{r['kernel'][0]}/{r['stride']}",
            *(f"{r[c]:.1f}" for c in ("ours_f32_us", "cudnn_f32_us", "ours_f16_us",
                                      "cudnn_f16_us", "ours_int8_us")),
            "/".join(r[f"ours_{m}_path"] for m in ("f32", "f16", "int8")),
        )  # fmt: skip
    tot = kernels["totals_us"]
    k.add_row("total", "", "", *(f"{tot[c]:.1f}" for c in tot), "")
    console.print(k)


# --------------------------------------------------------------------------- main


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if args.device == "cuda":
        from quantbench.plugins.dwconv2d import cuda as dwcuda

        try:
            dwcuda.check_available()
        except Exception as exc:  # noqa: BLE001 - said in one line before any work
            raise BenchError(str(exc).splitlines()[0]) from None
    from quantbench.backends.onnxruntime import resolve_provider
    from quantbench.errors import QuantbenchError

    try:
        resolve_provider(args.provider)
    except QuantbenchError as exc:  # said in one line before any work
        raise BenchError(f"--provider {args.provider}: {exc}") from None
    op_mode = "plugin" if args.device == "cpu" else "plugin:cuda"
    rewritten = work / "dwconv.onnx"
    quantbench("rewrite", args.model, "--to", "dwconv2d", "--depthwise", "-o", rewritten,
               log=work / "rewrite.log")  # fmt: skip
    dw_model = onnx.load(str(rewritten))
    dw_names = {n.name for n in depthwise_nodes(dw_model)}
    calib_extra = ["--max-samples", str(args.calib_max_samples)] if args.calib_max_samples else []
    int8_plugin, int8_qdq = work / "dwconv_int8.onnx", work / "qdq_int8.onnx"
    quantbench("quantize", rewritten, "--data", args.calib, "--dwconv2d", "-m", args.method,
               "-o", int8_plugin, *calib_extra, log=work / "quantize_plugin.log")  # fmt: skip
    quantbench("quantize", args.model, "--data", args.calib, "-m", args.method, "-o", int8_qdq,
               *calib_extra, log=work / "quantize_qdq.log")  # fmt: skip
    fp16 = work / "dwconv_fp16.onnx"
    onnx.save(fp16_model(dw_model), str(fp16))
    candidates = {
        f"FP32, DWConv2D op ({args.device})": rewritten,
        f"FP16, every op, DWConv2D op ({args.device})": fp16,
        f"INT8 plugin form, DWConv2D op ({args.device})": int8_plugin,
        "INT8 Q/DQ, onnxruntime Conv (reference)": int8_qdq,
    }
    accuracy = {}
    for i, (name, path) in enumerate(candidates.items()):
        doc = run_compare(path, args, op_mode, work, f"{i}")
        accuracy[name] = compare_summary(doc, dw_names)
    print_accuracy(accuracy)
    with np.load(args.eval) as data:
        x = np.ascontiguousarray(data[next(iter(data.files))][: args.latency_batch])
    model_lat = model_latency(args.model, rewritten, x, args.device, args.provider, args.reps)
    kernels = None
    if args.device == "cuda":
        original = onnx.load(str(args.model))
        kernels = kernel_latency(dw_model, args.latency_batch, args.reps, original)
    print_latency(model_lat, kernels)
    gpu = None
    if args.device == "cuda":
        from quantbench.machine import describe_gpu

        gpu = describe_gpu().label
        console.print(f"GPU: {gpu}")
    return {
        "model": str(args.model),
        "device": args.device,
        "provider": args.provider,
        "gpu": gpu,
        "method": args.method,
        "depthwise_layers": sorted(dw_names),
        "fp16_note": "quantize --high-precision fp16 refuses --dwconv2d; the FP16 model is made "
        "by fp16_model(): float16 initializers, Casts at the input and output, every op FP16",
        "accuracy": accuracy,
        "model_latency": model_lat,
        "kernel_latency": kernels
        if kernels is not None
        else "needs --device cuda (torch with CUDA and the kernels)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="the FP32 ONNX model (export_mobilenet_v2.py)")
    p.add_argument("--calib", type=Path, required=True, help="calibration .npz")
    p.add_argument("--eval", type=Path, required=True, help="evaluation .npz")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where the op computes")
    p.add_argument("--provider", choices=PROVIDERS, default="cpu",
                   help="onnxruntime provider for the other ops (compare, latency)")
    p.add_argument("--method", default="entropy", help="calibrator for both INT8 models")
    p.add_argument("--max-samples", type=int, help="evaluate at most this many samples")
    p.add_argument("--calib-max-samples", type=int, help="calibrate on at most this many")
    p.add_argument("--latency-batch", type=int, default=1, help="batch for the latency runs")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions")
    p.add_argument("--work", type=Path, help="folder for the models and logs (default: temp)")
    p.add_argument("--json", type=Path, help=f"results JSON (default $OUT/{JSON_NAME})")
    p.add_argument("--make-data", action="store_true", help="write --calib/--eval from photos")
    args = p.parse_args(argv)
    try:
        if args.make_data:
            n_cal, n_ev = make_photo_data(args.calib, args.eval)
            console.print(f"wrote {args.calib} ({n_cal} samples), {args.eval} ({n_ev})")
            return 0
        for name in ("model", "calib", "eval"):
            path = getattr(args, name)
            if path is None or not path.is_file():
                raise BenchError(f"--{name} {path}: no such file")
        if args.work is not None:
            args.work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            doc = run(args, args.work or Path(tmp))
    except BenchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    out = args.json or (Path(os.environ["OUT"]) / JSON_NAME if os.environ.get("OUT") else None)
    if out is not None:
        out.write_text(json.dumps(doc, indent=2, default=float))
        console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
