"""The ``quantbench`` command line: a thin typer layer over the Python API.

Each command parses options, calls its Python twin and formats the result. Exit codes
(:mod:`quantbench.errors`): 0 success, 1 a gate missed, 2 a user mistake (one line), 3 a bug
in quantbench (one line; the traceback is saved, or printed with ``QUANTBENCH_DEBUG=1``); Ctrl-C
exits 130 and, because every output is written atomically, leaves no partial file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from quantbench import __version__
from quantbench.calibrators import DEFAULT_METHOD
from quantbench.choose.clipguard import DEFAULT_CLIP_WARN, DEFAULT_SQNR_FLOOR_DB
from quantbench.clihelp import Command, Group
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import DECISION_THRESHOLD
from quantbench.progress import console

app = typer.Typer(
    name="quantbench",
    help="INT8 calibration, explicit quantization and accuracy comparison for TensorRT and ONNX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)

ModelArg = Annotated[Path, typer.Argument(help="ONNX model file.", show_default=False)]
DataOpt = Annotated[
    str | None,
    typer.Option(
        "--data",
        help=".npz/.npy, a folder of them, an image folder (with --preset) or a data-loader "
        "script file.py[:function].",
    ),
]
MethodOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        "-m",
        help="Calibrator (repeatable), e.g. entropy, minmax, percentile:99.9, mse, entropy:ort, "
        "or 'all'.",
    ),
]

HoldoutOpt = Annotated[
    str | None,
    typer.Option(
        "--holdout-data",
        help="Data --method auto judges the calibrators on (default: up to the first 64 "
        "calibration samples, held back: the candidates are calibrated on the others).",
    ),
]
AutoBudgetOpt = Annotated[
    float | None,
    typer.Option(
        "--auto-budget",
        metavar="SECONDS",
        help="Cap --method auto's judging at about this many seconds: it judges the "
        "calibrators on the first held-back samples that fit and says what it skipped.",
    ),
]
RefineOpt = Annotated[
    str | None,
    typer.Option(
        "--refine",
        metavar="PASSES",
        help="Refinement passes to try, each kept only where it raises the output SQNR on the "
        "held-back slice: comma list of equalize, smooth, rounding, bias, two-stage (quantize "
        "only: a few sensitive activations get a second INT8 stage, their readers run twice), "
        "cheap (equalize, smooth, bias); or all, none. Default: cheap with --method auto, "
        "else none.",
    ),
]
MaxAddedMacsOpt = Annotated[
    float | None,
    typer.Option(
        "--max-added-macs",
        metavar="FRACTION",
        help="With --refine two-stage: the most linear-op MACs the second stages may add, a "
        "fraction of the model's (default 0.25; 0.5 or more also searches twice as many "
        "tensors, at about twice the time).",
    ),
]
RefinedModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--refined-model",
        help="Write the refined FP32 model here (what a TensorRT cache must be built with).",
    ),
]
ClipWarnOpt = Annotated[
    float,
    typer.Option(
        "--clip-warn",
        help="Warn about tensors whose threshold clips more than this fraction of their values.",
    ),
]
SqnrFloorOpt = Annotated[
    float,
    typer.Option(
        "--sqnr-floor",
        metavar="DB",
        help="Flag quantized ops whose isolated SQNR is below this many dB, with the tensor, its "
        "clipped fraction and the built-in method with the lowest expected INT8 error for it.",
    ),
]
MaskThresholdOpt = Annotated[
    float,
    typer.Option(
        "--mask-threshold",
        help="Where a probability map's values (outputs a Sigmoid made) count as decided, for "
        "mask_iou: the detector's own (a DBNet text detector binarizes at 0.3).",
    ),
]
AllowPartialOpt = Annotated[
    bool,
    typer.Option(
        "--allow-partial",
        help="Apply a table made for another model, or not covering every tensor to quantize, "
        "to the tensors it covers.",
    ),
]
MetricScriptOpt = Annotated[
    str | None,
    typer.Option(
        help="Task metric script FILE.py[:NAME] (default NAME 'metric'): a function "
        "(fp32, candidate, labels) -> dict or a class with update()/compute()."
    ),
]
LabelsOpt = Annotated[
    Path | None,
    typer.Option(
        help="Labels, one per sample: a .npy, or a .npz holding one array (integers: accuracy "
        "and accuracy_drop; any dtype: metric scripts)."
    ),
]


# Options shared by several commands, each defined once.
ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        help="Where calibration shards and candidate evaluations run: local | processes (this "
        "machine's cores) | ray (a Ray cluster; pip install 'quantbench\\[ray]').",
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Parallel workers (default: the usable cores, or the Ray cluster's CPUs).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="Ray cluster to join (default: $RAY_ADDRESS, else a local Ray started for the run).",
    ),
]
DWConv2DOpOpt = Annotated[
    str | None,
    typer.Option(
        "--dwconv2d-op",
        metavar="MODE",
        help="How onnxruntime runs DWConv2D nodes: plugin (the op itself, numpy reference on "
        "the CPU; the default where onnxruntime-extensions is installed: pip install "
        "'quantbench\\[plugin]'), plugin:cuda (the plugin's CUDA kernels through CuPy) or lower "
        "(standard Conv).",
    ),
]
EvalDataOpt = Annotated[
    str, typer.Option("--data", help="Evaluation data (same forms as calibrate --data).")
]
CalibDataOpt = Annotated[str, typer.Option(help="Calibration data.")]
AutoMethodOpt = Annotated[
    str, typer.Option("--method", "-m", help="Calibrator, or 'auto' (best per tensor).")
]
EvalExcludeOpt = Annotated[
    list[str] | None, typer.Option(help="Node names/regexes kept in FP32 (repeatable).")
]
BatchSizeOpt = Annotated[
    int | None, typer.Option(help="Batch size (default: the model's, else 1).")
]
EvalMaxSamplesOpt = Annotated[
    int | None, typer.Option(help="Evaluate at most this many samples.")
]
CalibMaxSamplesOpt = Annotated[
    int | None, typer.Option(help="Calibrate on at most this many samples.")
]
PresetOpt = Annotated[str | None, typer.Option(help="Image preprocessing preset.")]
EvalProviderOpt = Annotated[
    str | None, typer.Option(help="onnxruntime provider (cpu, cuda, ...).")
]
ThreadsOpt = Annotated[int | None, typer.Option(help="onnxruntime intra-op threads.")]
ReportOpt = Annotated[Path | None, typer.Option(help="Write the HTML report here.")]


def _executor(kind: str, workers: int | None, ray_address: str | None) -> object:
    """``--executor/--workers/--ray-address`` checked before any work (one-line errors)."""
    from quantbench.collect.executors import ExecutorSpec

    return ExecutorSpec(kind, workers, ray_address).validate()


def _version(value: bool) -> None:
    if value:
        console.print(f"quantbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """quantbench: INT8 for TensorRT without losing accuracy."""


@app.command(cls=Command)
def calibrate(
    model: ModelArg,
    data: DataOpt = None,
    method: MethodOpt = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Output file (one method) or folder (several)."),
    ] = None,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="trt | json | ort-flatbuffers (default: the -o file's suffix, .json -> json, "
            ".flatbuffers -> ort-flatbuffers, else trt).",
        ),
    ] = None,
    trt_version: Annotated[
        str, typer.Option(help="TensorRT version the cache header targets (X.Y.Z, <= 10.x).")
    ] = "10.16.0",
    tensors: Annotated[
        str | None, typer.Option(help="all | quantizable (default: all for caches).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Batch size for inference (default: the model's, else samples joined into "
            "batches of up to 16 where the model runs them alike, else 1)."
        ),
    ] = None,
    max_samples: Annotated[int | None, typer.Option(help="Use at most this many samples.")] = None,
    preset: Annotated[
        str | None,
        typer.Option(help="Image preprocessing preset: a configs/ name or a .toml path."),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(help="onnxruntime provider: cpu (default), cuda, or a full name."),
    ] = None,
    stats: Annotated[
        Path | None, typer.Option(help="Use this statistics file instead of running the data.")
    ] = None,
    merge: Annotated[
        list[Path] | None,
        typer.Option(help="Merge these statistics files (shards) first (repeatable)."),
    ] = None,
    save_stats: Annotated[
        Path | None, typer.Option(help="Also save the statistics to this file.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Ignore and do not write the statistics cache.")
    ] = False,
    report: Annotated[
        Path | None, typer.Option(help="Write a calibration-only HTML report here.")
    ] = None,
    holdout_data: HoldoutOpt = None,
    auto_budget: AutoBudgetOpt = None,
    clip_warn: ClipWarnOpt = DEFAULT_CLIP_WARN,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
) -> None:
    """Collect statistics in one onnxruntime pass and write calibration tables."""
    from quantbench import calibrate as cal
    from quantbench.fileio import check_not_an_input, check_output_path

    if report is not None:
        check_output_path(report)  # before any inference
        check_not_an_input(report, model, data, stats, holdout_data, *(merge or []))
    result = cal.calibrate(
        model,
        data,
        methods=method,
        output=output,
        fmt=fmt,
        trt_version=trt_version,
        tensors=tensors,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
        stats=stats,
        merge=merge,
        save_stats=save_stats,
        holdout_data=holdout_data,
        clip_warn=clip_warn,
        use_cache=not no_cache,
        executor=_executor(executor, workers, ray_address),
        auto_budget=auto_budget,
        keep_histograms=report is not None,
    )
    cal.summarize(result)
    if report is not None:
        from quantbench.reports import write_report
        from quantbench.results import calibration_results

        write_report(calibration_results(model, result, command=_command_line()), report)
        console.print(f"wrote {report}")


@app.command(cls=Command)
def inspect(
    path: Annotated[
        Path, typer.Argument(help="An ONNX model, a calibration table/cache or a statistics file.")
    ],
    model: Annotated[
        Path | None, typer.Option(help="With a table: list the model tensors it lacks.")
    ] = None,
    method: MethodOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    limit: Annotated[int, typer.Option(help="Rows to show per table.")] = 50,
) -> None:
    """Show what is inside a model, a calibration table or a statistics file."""
    from quantbench.inspection import inspect_path, render

    report = inspect_path(path, model=model, methods=method)
    if as_json:
        from quantbench.jsonsafe import dumps

        typer.echo(dumps(report), nl=False)
    else:
        render(report, limit=limit)


@app.command(cls=Command)
def quantize(
    model: ModelArg,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Q/DQ ONNX model to write.")
    ] = None,
    table: Annotated[
        Path | None, typer.Option(help="Calibration table: TensorRT cache, JSON or flatbuffers.")
    ] = None,
    data: DataOpt = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="Calibrator when calibrating from --data.")
    ] = DEFAULT_METHOD,
    exclude: Annotated[
        list[str] | None,
        typer.Option(help="Node name or regex kept in high precision (repeatable)."),
    ] = None,
    op_types: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated op types to quantize (default Conv,ConvTranspose,Gemm,MatMul)."
        ),
    ] = None,
    per_tensor: Annotated[
        bool, typer.Option("--per-tensor", help="Per-tensor weight scales instead of per-channel.")
    ] = False,
    no_residual: Annotated[
        bool, typer.Option("--no-residual", help="Do not quantize residual Add inputs.")
    ] = False,
    allow_partial: AllowPartialOpt = False,
    requantize: Annotated[
        bool, typer.Option("--requantize", help="Strip existing Q/DQ nodes first.")
    ] = False,
    dwconv2d: Annotated[
        bool,
        typer.Option(
            "--dwconv2d", help="Emit runtime-weight convs as the DWConv2D plugin op (INT8 form)."
        ),
    ] = False,
    dwconv2d_op: DWConv2DOpOpt = None,
    high_precision: Annotated[
        str | None,
        typer.Option(
            help="fp32 | fp16: precision of the unquantized ops (fp16: strongly-typed "
            "INT8/FP16 model, FP16 Q/DQ scales, opset 19). Default: the model's own, fp16 "
            "for a float16 model, else fp32."
        ),
    ] = None,
    int_ops: Annotated[
        bool,
        typer.Option("--int-ops", help="Report which ops onnxruntime runs in integer arithmetic."),
    ] = False,
    extract_table: Annotated[
        Path | None,
        typer.Option(
            help="Reverse: write MODEL's Q/DQ scales to this table (.cache/.json/.flatbuffers)."
        ),
    ] = None,
    trt_version: Annotated[
        str | None, typer.Option(help="TensorRT version for an extracted cache header.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size when calibrating.")] = None,
    max_samples: CalibMaxSamplesOpt = None,
    preset: PresetOpt = None,
    provider: Annotated[
        str | None, typer.Option(help="onnxruntime provider for calibration.")
    ] = None,
    holdout_data: HoldoutOpt = None,
    auto_budget: AutoBudgetOpt = None,
    clip_warn: ClipWarnOpt = DEFAULT_CLIP_WARN,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    refine: RefineOpt = None,
    refined_model: RefinedModelOpt = None,
    max_added_macs: MaxAddedMacsOpt = None,
) -> None:
    """Write a Q/DQ ONNX model placed the way TensorRT fuses it (or read one's scales back)."""
    from quantbench import quantize as qz

    if extract_table is not None:
        table_out, path = qz.extract_table(model, extract_table, trt_version=trt_version)
        console.print(f"wrote {path} ({len(table_out)} tensors)")
        return
    if output is None:
        raise QuantbenchError("give -o OUT.onnx (or --extract-table to read scales back)")
    outcome = qz.quantize(
        model,
        output,
        table=table,
        data=data,
        method=method,
        holdout_data=holdout_data,
        clip_warn=clip_warn,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
        exclude=exclude,
        op_types=[t.strip() for t in op_types.split(",")] if op_types else None,
        per_channel=not per_tensor,
        quantize_residual=not no_residual,
        allow_partial=allow_partial,
        requantize=requantize,
        dwconv2d=dwconv2d,
        dwconv2d_op=dwconv2d_op,
        report_integer_ops=int_ops,
        executor=_executor(executor, workers, ray_address),
        high_precision=high_precision,
        refine=refine,
        refined_model=refined_model,
        auto_budget=auto_budget,
        max_added_macs=max_added_macs,
    )
    _print_quantize(outcome)


def _print_quantize(outcome: object) -> None:
    from rich.table import Table

    result = outcome.result  # type: ignore[attr-defined]
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", soft_wrap=True)
    console.print(result.summary())
    if outcome.high_precision == "fp16":  # type: ignore[attr-defined]
        from collections import Counter

        counts = Counter(outcome.precisions.values())  # type: ignore[attr-defined]
        console.print(
            "strongly typed (trtexec --stronglyTyped): "
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            + " ops; Q/DQ scales FP16"
        )
    if result.skipped:
        t = Table(title="Left in high precision", title_justify="left")
        for col in ("node", "op", "reason"):
            t.add_column(col)
        for s in result.skipped:
            t.add_row(escape(s.node), s.op_type, escape(s.reason))
        console.print(t)
    if outcome.refine is not None:  # type: ignore[attr-defined]
        _print_refine(outcome.refine)  # type: ignore[attr-defined]
    rows = outcome.integer_ops  # type: ignore[attr-defined]
    if rows:
        from quantbench.ort_int8 import integer_op_counts

        counts = integer_op_counts(rows)
        console.print(
            "onnxruntime CPU execution: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        )
        t = Table(title="Ops by execution in onnxruntime", title_justify="left")
        for col in ("node", "op", "kernel", "execution"):
            t.add_column(col)
        for r in rows:
            t.add_row(
                escape(str(r["node"])),
                str(r["op_type"]),
                str(r["kernel"] or "-"),
                str(r["execution"]),
            )
        console.print(t)
        from quantbench.backends.onnxruntime import saturating_int8_kernels
        from quantbench.ort_int8 import INTEGER
        from quantbench.progress import warn

        if saturating_int8_kernels() and counts.get(INTEGER):
            warn(
                "this CPU has no VNNI: onnxruntime's integer kernels above add int8 products "
                "into int16 with saturation here, so quantbench's own sessions (compare, auto) "
                "run the Q/DQ model as written instead, in float (README: INT8 arithmetic on "
                "x86 without VNNI)"
            )
    for p in outcome.written:  # type: ignore[attr-defined]
        console.print(f"wrote {p}")


def _print_refine(refine: object) -> None:
    """The passes tried, each with its judged output SQNR and whether it was kept."""
    from rich.table import Table

    t = Table(title="Refinement passes (output SQNR on the held-back slice)", title_justify="left")
    for col in ("pass", "output SQNR", "kept", "layers changed", "seconds"):
        t.add_column(col)
    t.add_row("(none)", f"{refine.base_score_db:.2f} dB", "", "", "")  # type: ignore[attr-defined]
    for trial in refine.trials:  # type: ignore[attr-defined]
        score = "-" if trial.score_db is None else f"{trial.score_db:.2f} dB"
        kept = "yes" if trial.kept else escape(trial.note) or "no"
        t.add_row(trial.name, score, kept, str(len(trial.layers)), f"{trial.seconds:.1f}")
    console.print(t)
    kept = refine.kept  # type: ignore[attr-defined]
    console.print(f"refined by {', '.join(kept)}" if kept else "no refinement pass kept")


@app.command(cls=Command)
def rewrite(
    model: ModelArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Rewritten ONNX model.")],
    to: Annotated[
        str,
        typer.Option(
            help="dwconv2d (runtime-weight Conv -> plugin op), conv (plugin op -> Conv) or "
            "float32 (a float16/bfloat16 model widened, exactly, for quantization)."
        ),
    ],
    depthwise: Annotated[
        bool,
        typer.Option(
            "--depthwise",
            help="With --to dwconv2d: also every constant-weight 2-D Conv with group > 1 "
            "(depthwise and grouped convs), its weight becoming the op's W input.",
        ),
    ] = False,
) -> None:
    """Rewrite between ONNX Conv with runtime weights and the DWConv2D plugin op, or widen a
    float16 model to float32."""
    from quantbench.quantize import rewrite as do_rewrite

    changed, path = do_rewrite(model, output, to, depthwise=depthwise)
    what = "tensor(s), attribute(s) and type(s) to float32" if to == "float32" else "node(s)"
    console.print(f"rewrote {changed} {what}; wrote {path}")


@app.command(cls=Command)
def compare(
    a: Annotated[
        str,
        typer.Argument(help="Precision A: fp32, fp16, int8, int8:<method>, a .onnx or an engine."),
    ],
    b: Annotated[str, typer.Argument(help="Precision B (same forms).")],
    data: EvalDataOpt,
    model: Annotated[
        Path | None,
        typer.Option(
            help="The FP32 ONNX model (the reference); default: A (or B) where it is an FP32 "
            ".onnx file, which then compares as fp32."
        ),
    ] = None,
    calib_data: Annotated[str | None, typer.Option(help="Calibration data for int8 specs.")] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="Calibrator for plain 'int8'.")
    ] = DEFAULT_METHOD,
    table: Annotated[
        Path | None, typer.Option(help="Use this calibration table for 'int8'.")
    ] = None,
    stats: Annotated[
        Path | None, typer.Option(help="Use this statistics file for calibration.")
    ] = None,
    holdout_data: HoldoutOpt = None,
    allow_partial: AllowPartialOpt = False,
    clip_warn: ClipWarnOpt = DEFAULT_CLIP_WARN,
    sqnr_floor: SqnrFloorOpt = DEFAULT_SQNR_FLOOR_DB,
    mask_threshold: MaskThresholdOpt = DECISION_THRESHOLD,
    labels: LabelsOpt = None,
    metric_script: MetricScriptOpt = None,
    exclude: EvalExcludeOpt = None,
    batch_size: BatchSizeOpt = None,
    max_samples: EvalMaxSamplesOpt = None,
    calib_max_samples: CalibMaxSamplesOpt = None,
    preset: PresetOpt = None,
    provider: EvalProviderOpt = None,
    threads: ThreadsOpt = None,
    backend: Annotated[str, typer.Option(help="onnxruntime | tensorrt")] = "onnxruntime",
    no_latency: Annotated[
        bool, typer.Option("--no-latency", help="Skip the latency measurement.")
    ] = False,
    fail_below: Annotated[
        list[str] | None,
        typer.Option(help="Gate METRIC=VALUE (repeatable): exit 1 when missed."),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the results JSON here.")
    ] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Write the per-layer table as CSV here.")
    ] = None,
    report: ReportOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    dwconv2d_op: DWConv2DOpOpt = None,
    auto_budget: AutoBudgetOpt = None,
) -> None:
    """Per-layer drift, task metrics and latency of B (and A) against onnxruntime FP32."""
    from quantbench.compare import compare as run_compare
    from quantbench.compare.summary import print_summary
    from quantbench.errors import ThresholdFailed

    if backend not in ("onnxruntime", "tensorrt"):
        raise QuantbenchError(f"--backend must be onnxruntime or tensorrt, not {backend!r}")
    if backend == "tensorrt":
        from quantbench.backends.tensorrt import import_tensorrt

        import_tensorrt()
    if report is not None:
        from quantbench.fileio import check_output_path

        check_output_path(report)
    doc = run_compare(
        a,
        b,
        model=model,
        data=data,
        calib_data=calib_data,
        method=method,
        table=table,
        stats=stats,
        holdout_data=holdout_data,
        allow_partial=allow_partial,
        clip_warn=clip_warn,
        sqnr_floor=sqnr_floor,
        mask_threshold=mask_threshold,
        labels=labels,
        metric_script=metric_script,
        exclude=exclude,
        batch_size=batch_size,
        max_samples=max_samples,
        calib_max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        latency=not no_latency,
        fail_below=fail_below,
        json_path=json_out,
        csv_path=csv_out,
        command=_command_line(),
        executor=_executor(executor, workers, ray_address),
        dwconv2d_op=dwconv2d_op,
        auto_budget=auto_budget,
    )
    if report is not None:
        from quantbench.reports import write_report

        write_report(doc, report)
    print_summary(doc)
    for p in (json_out, csv_out, report):
        if p is not None:
            console.print(f"wrote {p}")
    if not doc.get("passed", True):
        from quantbench.results import gate_failures

        raise ThresholdFailed(gate_failures(doc))


@app.command(cls=Command)
def report(
    results: Annotated[
        Path, typer.Argument(help="Results JSON from compare --json (or calibrate).")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")],
) -> None:
    """Render a results JSON as one self-contained HTML page."""
    from quantbench.reports import load_results, write_report

    write_report(load_results(results), output)
    console.print(f"wrote {output}")


@app.command(cls=Command)
def build(
    model: ModelArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Engine file (.plan) to write.")],
    int8: Annotated[
        bool,
        typer.Option("--int8", help="INT8 build (implicit with --table, explicit with --qdq)."),
    ] = False,
    table: Annotated[
        Path | None, typer.Option(help="Calibration table for implicit INT8 (TensorRT <= 10).")
    ] = None,
    qdq: Annotated[
        bool, typer.Option("--qdq", help="The model carries Q/DQ nodes (explicit INT8).")
    ] = False,
    fp16: Annotated[
        bool, typer.Option("--fp16", help="FP16 build (or FP16 fallback, TensorRT <= 10).")
    ] = False,
    calib_data: Annotated[
        str | None, typer.Option(help="Let TensorRT calibrate itself on this data.")
    ] = None,
    timing_cache: Annotated[
        Path | None, typer.Option(help="Timing cache file (read and updated).")
    ] = None,
    plugin: Annotated[
        list[Path] | None,
        typer.Option(help="Plugin library to load (repeatable), e.g. libdwconv2d_plugin.so."),
    ] = None,
    workspace_mb: Annotated[
        int | None, typer.Option(help="Builder workspace limit in MiB.")
    ] = None,
    allow_partial: AllowPartialOpt = False,
) -> None:
    """Build a TensorRT engine (needs TensorRT and an NVIDIA GPU)."""
    from quantbench.backends.tensorrt import build as trt_build
    from quantbench.model.graph import open_graph

    if table is not None:
        _check_build_table(model, table, allow_partial)

    batches = None
    if calib_data is not None:
        from quantbench.data.sources import open_data

        batches = open_data(calib_data, open_graph(model).inputs).batches()
    result = trt_build(
        model,
        output,
        int8=int8 and not qdq,
        table=table,
        qdq=qdq,
        fp16=fp16,
        calibration_data=batches,
        timing_cache=timing_cache,
        plugin_libraries=plugin or (),
        workspace_mb=workspace_mb,
        table_encoder=_table_as_trt_cache,
    )
    console.print(f"wrote {output} ({result})")


def _check_build_table(model: Path, table: Path, allow_partial: bool) -> None:
    """``build --table``: the same provenance and coverage check as quantize and compare; an
    implicit-INT8 cache should cover every tensor TensorRT may run in INT8."""
    from quantbench.model.graph import calibration_tensors, open_graph
    from quantbench.progress import warn
    from quantbench.table.codecs import read_table
    from quantbench.table.coverage import check_table

    graph = open_graph(model)
    needed = calibration_tensors(graph, "all")
    names = {o for n in graph.model.graph.node for o in n.output} | {s.name for s in graph.inputs}
    for note in check_table(
        read_table(table),
        model_hash=graph.hash,
        needed=needed,
        model_tensors=names,
        allow_partial=allow_partial,
        label=str(table),
    ):
        warn(note)


def _table_as_trt_cache(path: Path, trt_version: str) -> bytes:
    """Any quantbench-readable table -> TensorRT cache bytes for the running TensorRT."""
    from quantbench.table.codecs import encode_table, read_table

    return encode_table(read_table(path), "trt", trt_version)


@app.command(cls=Command)
def sensitivity(
    model: ModelArg,
    data: EvalDataOpt,
    calib_data: CalibDataOpt,
    method: AutoMethodOpt = DEFAULT_METHOD,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Rank by sqnr_db | cosine | top1_agreement | sequence_agreement | "
            "ctc_agreement | mask_iou | mean_iou (| accuracy with --labels | a --metric-script "
            "name). "
            "Default: sqnr_db, top1_agreement for a model whose outputs are all integers."
        ),
    ] = None,
    mask_threshold: MaskThresholdOpt = DECISION_THRESHOLD,
    labels: LabelsOpt = None,
    metric_script: MetricScriptOpt = None,
    holdout_data: HoldoutOpt = None,
    exclude: EvalExcludeOpt = None,
    batch_size: BatchSizeOpt = None,
    max_samples: EvalMaxSamplesOpt = None,
    calib_max_samples: CalibMaxSamplesOpt = None,
    preset: PresetOpt = None,
    provider: EvalProviderOpt = None,
    threads: ThreadsOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the ranked rows as JSON here.")
    ] = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    auto_budget: AutoBudgetOpt = None,
) -> None:
    """Rank quantized ops by the output drift each causes alone in INT8 (2 x ops evaluations)."""
    from quantbench.fileio import check_output_path
    from quantbench.recovery import sensitivity as run_sensitivity

    if json_out is not None:
        check_output_path(json_out)
    rows = run_sensitivity(
        model,
        calib_data,
        data,
        method=method,
        metric=metric,
        max_samples=max_samples,
        mask_threshold=mask_threshold,
        labels=labels,
        metric_script=metric_script,
        exclude=exclude,
        holdout_data=holdout_data,
        batch_size=batch_size,
        calib_max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        show_progress=True,
        executor=_executor(executor, workers, ray_address),
        auto_budget=auto_budget,
    )
    metric = rows[0]["ranked_by"] if rows else metric
    _print_sensitivity(rows, metric)
    if json_out is not None:
        from quantbench.model.graph import open_graph
        from quantbench.results import base_document, write_json

        doc = base_document("sensitivity", open_graph(model), _command_line())
        doc.update(
            {"method": method, "metric": metric, "mask_threshold": mask_threshold, "rows": rows}
        )
        write_json(doc, json_out)
        console.print(f"wrote {json_out}")


#: why a sensitivity cell holds no number, or an infinite one (footnotes of the table)
_NOTHING_QUANTIZED = (
    "—: no op was quantized in that view, so there is no error to measure: alone, this op has "
    "no INT8 form (e.g. an Add's residual input, quantized only beside the quantized op it "
    "follows, for TensorRT's fusion)"
)
_IDENTICAL = "inf: the outputs were identical to FP32's"


def _print_sensitivity(rows: list[dict], metric: str | None) -> None:
    """The ranking, one line per op; a view that quantized nothing reads "—", with why."""
    console.print(f"{metric}: only this op INT8 / only this op FP32, worst first")
    notes: list[str] = []
    for row in rows:
        cells = []
        for view in ("only_quantized", "only_fp32"):
            value = row[view][metric]
            if row.get(f"{view}_nodes") == 0:
                cells.append("—")
                notes.append(_NOTHING_QUANTIZED)
            else:
                cells.append(_num(value))
                if value == "inf" or value == float("inf"):
                    notes.append(_IDENTICAL)
        console.print(f"{row['rank']:>4}  {escape(row['node'])}  {cells[0]} / {cells[1]}")
    for note in dict.fromkeys(notes):
        console.print(note, soft_wrap=True, highlight=False)


@app.command(cls=Command)
def recover(
    model: ModelArg,
    data: EvalDataOpt,
    calib_data: CalibDataOpt,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for the model, cache, trtexec line.")
    ],
    target: Annotated[
        str | None,
        typer.Option(
            help="METRIC=VALUE: top1_agreement, sequence_agreement, ctc_agreement, mask_iou, "
            "mean_iou, cosine, sqnr_db, accuracy_drop (labels), or a --metric-script name "
            "(_drop: lower is better). Default: top1_agreement=0.99; mask_iou=0.99 for a "
            "model whose outputs are probability maps; ctc_agreement=0.99 for a recognizer "
            "(scores per frame from float input)."
        ),
    ] = None,
    mask_threshold: MaskThresholdOpt = DECISION_THRESHOLD,
    labels: LabelsOpt = None,
    metric_script: MetricScriptOpt = None,
    method: AutoMethodOpt = DEFAULT_METHOD,
    budget: Annotated[
        int | None, typer.Option(help="Keep at most this many ops in high precision.")
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            help="fp32 | fp16 for the kept ops. Default: the model's own, fp16 for a "
            "float16 model, else fp32."
        ),
    ] = None,
    trt_version: Annotated[
        str, typer.Option(help="TensorRT version the cache header targets (<= 10.x).")
    ] = "10.16.0",
    holdout_data: HoldoutOpt = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Node names/regexes always kept in FP32.")
    ] = None,
    batch_size: BatchSizeOpt = None,
    max_samples: EvalMaxSamplesOpt = None,
    calib_max_samples: CalibMaxSamplesOpt = None,
    preset: PresetOpt = None,
    provider: EvalProviderOpt = None,
    threads: ThreadsOpt = None,
    report: ReportOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: RayAddressOpt = None,
    refine: RefineOpt = None,
    auto_budget: AutoBudgetOpt = None,
) -> None:
    """Keep the fewest ops in FP32/FP16 (greedy by sensitivity) until the target is met."""
    from quantbench.errors import ThresholdFailed
    from quantbench.fileio import check_output_path
    from quantbench.recovery import check_artefact_target, write_artefacts
    from quantbench.recovery import recover as run_recover

    check_artefact_target(output, trt_version)
    if report is not None:
        check_output_path(report)
    result = run_recover(
        model,
        calib_data,
        data,
        target=target,
        mask_threshold=mask_threshold,
        labels=labels,
        metric_script=metric_script,
        method=method,
        budget=budget,
        precision=precision,
        exclude=exclude,
        holdout_data=holdout_data,
        batch_size=batch_size,
        max_samples=max_samples,
        calib_max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        show_progress=True,
        executor=_executor(executor, workers, ray_address),
        refine=refine,
        auto_budget=auto_budget,
    )
    if result.context.refine is not None:
        _print_refine(result.context.refine)
    paths = write_artefacts(
        result, output, model_path=model, trt_version=trt_version, command=_command_line()
    )
    kept = ", ".join(escape(n) for n in result.kept) or "none"
    console.print(
        f"{'met' if result.met else 'missed'} {result.target.text}: "
        f"{result.target.metric}={_num(result.metric)} with {len(result.kept)} of "
        f"{len(result.context.plan.quantized)} ops kept in {result.precision} ({kept}); "
        f"{result.context.evaluator.evaluations} evaluations, {result.seconds:.1f} s"
    )
    if result.precision == "fp16":
        from collections import Counter

        counts = Counter(result.op_precisions.values())
        console.print(
            "artefact strongly typed (trtexec --stronglyTyped): "
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            + " ops; verified on its FP16-storage emulation"
        )
    for path in paths.values():
        console.print(f"wrote {path}")
    if report is not None:
        from quantbench.reports import write_report

        write_report(json.loads(paths["results"].read_text()), report)
        console.print(f"wrote {report}")
    if not result.met:
        raise ThresholdFailed(
            f"target {result.target.text} not reached with {len(result.kept)} ops kept "
            f"(last {result.target.metric}={_num(result.metric)}); raise --budget or relax --target"
        )


def _num(value: object) -> str:
    """4 significant digits; ``inf`` and missing values as words."""
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _command_line() -> str:
    import shlex

    return "quantbench " + " ".join(shlex.quote(a) for a in sys.argv[1:])


DEBUG_ENV = "QUANTBENCH_DEBUG"
#: folder for the traceback files of internal errors (default: the system temp folder); the
#: tests point it at their own tmp folder so that a run leaves nothing in /tmp
ERROR_DIR_ENV = "QUANTBENCH_ERROR_DIR"


def main() -> None:
    """Console entry point; exit codes in :mod:`quantbench.errors` (0 ok, 1 gate missed, 2 user
    input, 3 internal error, 130 Ctrl-C), each error reported as one line."""
    try:
        app()  # standalone: usage errors print click's message and exit 2
    except QuantbenchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(_interrupted())
    except SystemExit as exc:  # typer turns Ctrl-C into Exit(130) before it reaches us
        if exc.code == 130 and _caused_by_interrupt(exc):
            sys.exit(_interrupted())
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: exit 3, not a traceback
        sys.exit(_internal_error(exc))


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the exception's chain (cause or context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _interrupted() -> int:
    """Ctrl-C: say what was written (outputs are atomic: nothing half-written, ever); the
    statistics cache is no output of the command and is not named."""
    from quantbench.collect.statspass import stats_cache_dir
    from quantbench.fileio import written_files

    cache = stats_cache_dir().parent.resolve()
    outputs = [p for p in written_files() if not p.resolve().is_relative_to(cache)]
    what = "nothing was written"
    if outputs:
        done = ", ".join(escape(str(p)) for p in outputs)
        what = f"only {done} written before it, each complete; nothing else was"
    console.print(f"[red]interrupted[/red]: {what}", highlight=False, soft_wrap=True)
    return 130


def _internal_error(exc: BaseException) -> int:
    """Report a bug as one line and where its traceback is; ``QUANTBENCH_DEBUG=1`` prints it."""
    import os
    import tempfile
    import traceback

    from quantbench.errors import first_line

    text = "".join(traceback.format_exception(exc))
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        sys.stderr.write(text)
        where = "the traceback is above"
    else:
        folder = os.environ.get(ERROR_DIR_ENV) or None
        if folder is not None:
            os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="quantbench-error-", suffix=".txt", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{_command_line()}\nquantbench {__version__}\n\n{text}")
        where = f"traceback saved to {path} ({DEBUG_ENV}=1 prints it)"
    console.print(
        f"[red]internal error[/red] (a bug in quantbench, please report it with the traceback): "
        f"{escape(type(exc).__name__)}: {escape(first_line(exc))}; {escape(where)}",
        highlight=False,
        soft_wrap=True,
    )
    return 3


if __name__ == "__main__":
    main()
