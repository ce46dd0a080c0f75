"""The ``quantbench`` command line: a thin typer layer over the Python API.

Each command parses options, calls its Python twin and formats the result. User mistakes
(:class:`QuantbenchError`) become one line on stderr and exit code 2; Ctrl-C exits 130 and,
because every output is written atomically, leaves no partial file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from quantbench import __version__
from quantbench.errors import QuantbenchError
from quantbench.progress import console

app = typer.Typer(
    name="quantbench",
    help="INT8 calibration, explicit quantization and accuracy comparison for TensorRT and ONNX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


@app.command()
def calibrate(
    model: ModelArg,
    data: DataOpt = None,
    method: MethodOpt = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Output file (one method) or folder (several)."),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="trt | json | ort-flatbuffers")
    ] = "trt",
    trt_version: Annotated[
        str, typer.Option(help="TensorRT version the cache header targets (X.Y.Z, <= 10.x).")
    ] = "10.16.0",
    tensors: Annotated[
        str | None, typer.Option(help="all | quantizable (default: all for caches).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size for inference (default: the model's, else 1).")
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
) -> None:
    """Collect statistics in one onnxruntime pass and write calibration tables."""
    from quantbench import calibrate as cal

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
        use_cache=not no_cache,
    )
    cal.summarize(result)
    if report is not None:
        from quantbench.reports import write_report
        from quantbench.results import calibration_results

        write_report(calibration_results(model, result, command=_command_line()), report)
        console.print(f"wrote {report}")


@app.command()
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
        typer.echo(json.dumps(report, indent=2, default=float))
    else:
        render(report, limit=limit)


@app.command()
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
    ] = "entropy",
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
    allow_partial: Annotated[
        bool, typer.Option("--allow-partial", help="Quantize only what the table covers.")
    ] = False,
    requantize: Annotated[
        bool, typer.Option("--requantize", help="Strip existing Q/DQ nodes first.")
    ] = False,
    dwconv2d: Annotated[
        bool,
        typer.Option(
            "--dwconv2d", help="Emit runtime-weight convs as the DWConv2D plugin op (INT8 form)."
        ),
    ] = False,
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
    max_samples: Annotated[
        int | None, typer.Option(help="Calibrate on at most this many samples.")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Image preprocessing preset.")] = None,
    provider: Annotated[
        str | None, typer.Option(help="onnxruntime provider for calibration.")
    ] = None,
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
        report_integer_ops=int_ops,
    )
    _print_quantize(outcome)


def _print_quantize(outcome: object) -> None:
    from rich.table import Table

    result = outcome.result  # type: ignore[attr-defined]
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", soft_wrap=True)
    console.print(result.summary())
    if result.skipped:
        t = Table(title="Left in high precision", title_justify="left")
        for col in ("node", "op", "reason"):
            t.add_column(col)
        for s in result.skipped:
            t.add_row(escape(s.node), s.op_type, escape(s.reason))
        console.print(t)
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
    for p in outcome.written:  # type: ignore[attr-defined]
        console.print(f"wrote {p}")


@app.command()
def rewrite(
    model: ModelArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Rewritten ONNX model.")],
    to: Annotated[
        str,
        typer.Option(
            help="dwconv2d (runtime-weight Conv -> plugin op) or conv (plugin op -> Conv)."
        ),
    ],
) -> None:
    """Rewrite between ONNX Conv with runtime weights and the DWConv2D plugin op."""
    from quantbench.quantize import rewrite as do_rewrite

    changed, path = do_rewrite(model, output, to)
    console.print(f"rewrote {changed} node(s); wrote {path}")


@app.command()
def compare(
    a: Annotated[
        str,
        typer.Argument(help="Precision A: fp32, fp16, int8, int8:<method>, a .onnx or an engine."),
    ],
    b: Annotated[str, typer.Argument(help="Precision B (same forms).")],
    model: Annotated[Path, typer.Option(help="The FP32 ONNX model (the reference).")],
    data: Annotated[
        str, typer.Option("--data", help="Evaluation data (same forms as calibrate --data).")
    ],
    calib_data: Annotated[str | None, typer.Option(help="Calibration data for int8 specs.")] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="Calibrator for plain 'int8'.")
    ] = "entropy",
    table: Annotated[
        Path | None, typer.Option(help="Use this calibration table for 'int8'.")
    ] = None,
    stats: Annotated[
        Path | None, typer.Option(help="Use this statistics file for calibration.")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help=".npy of integer labels: reports accuracy.")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Node names/regexes kept in FP32 (repeatable).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size (default: the model's, else 1).")
    ] = None,
    max_samples: Annotated[
        int | None, typer.Option(help="Evaluate at most this many samples.")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Image preprocessing preset.")] = None,
    provider: Annotated[
        str | None, typer.Option(help="onnxruntime provider (cpu, cuda, ...).")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="onnxruntime intra-op threads.")] = None,
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
    report: Annotated[Path | None, typer.Option(help="Write the HTML report here.")] = None,
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
    doc = run_compare(
        a,
        b,
        model=model,
        data=data,
        calib_data=calib_data,
        method=method,
        table=table,
        stats=stats,
        labels=labels,
        exclude=exclude,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        latency=not no_latency,
        fail_below=fail_below,
        json_path=json_out,
        csv_path=csv_out,
        report_path=report,
        command=_command_line(),
    )
    print_summary(doc)
    for p in (json_out, csv_out, report):
        if p is not None:
            console.print(f"wrote {p}")
    if not doc.get("passed", True):
        failed = [t for t in doc["thresholds"] if not t["passed"]]
        raise ThresholdFailed(
            "gate missed: " + ", ".join(f"{t['metric']}={t['value']} < {t['min']}" for t in failed)
        )


@app.command()
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


@app.command()
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
        list[Path] | None, typer.Option(help="Plugin library to load, e.g. libdwconv2d_plugin.so.")
    ] = None,
    workspace_mb: Annotated[
        int | None, typer.Option(help="Builder workspace limit in MiB.")
    ] = None,
) -> None:
    """Build a TensorRT engine (needs TensorRT and an NVIDIA GPU)."""
    from quantbench.backends.tensorrt import build as trt_build
    from quantbench.graph import open_graph

    batches = None
    if calib_data is not None:
        from quantbench.data import open_data

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


def _table_as_trt_cache(path: Path, trt_version: str) -> bytes:
    """Any quantbench-readable table -> TensorRT cache bytes for the running TensorRT."""
    from quantbench.table.codecs import encode_table, read_table

    return encode_table(read_table(path), "trt", trt_version)


@app.command()
def sensitivity(
    model: ModelArg,
    data: Annotated[
        str, typer.Option("--data", help="Evaluation data (same forms as calibrate --data).")
    ],
    calib_data: Annotated[str, typer.Option(help="Calibration data.")],
    method: Annotated[
        str, typer.Option("--method", "-m", help="Calibrator, or 'auto' (best per tensor).")
    ] = "entropy",
    metric: Annotated[
        str,
        typer.Option(help="Rank by sqnr_db | cosine | top1_agreement (| accuracy with --labels)."),
    ] = "sqnr_db",
    labels: Annotated[
        Path | None, typer.Option(help=".npy of integer labels: adds accuracy.")
    ] = None,
    holdout_data: Annotated[
        str | None,
        typer.Option(help="Held-back data for --method auto (default: 64 calibration samples)."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Node names/regexes kept in FP32 (repeatable).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size (default: the model's, else 1).")
    ] = None,
    max_samples: Annotated[
        int | None, typer.Option(help="Evaluate at most this many samples.")
    ] = None,
    calib_max_samples: Annotated[
        int | None, typer.Option(help="Calibrate on at most this many samples.")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Image preprocessing preset.")] = None,
    provider: Annotated[
        str | None, typer.Option(help="onnxruntime provider (cpu, cuda, ...).")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="onnxruntime intra-op threads.")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the ranked rows as JSON here.")
    ] = None,
) -> None:
    """Rank quantized ops by the output drift each causes alone in INT8 (2 x ops evaluations)."""
    from quantbench.fileio import check_output_path, write_text_atomic
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
        labels=labels,
        exclude=exclude,
        holdout_data=holdout_data,
        batch_size=batch_size,
        calib_max_samples=calib_max_samples,
        preset=preset,
        provider=provider,
        threads=threads,
        show_progress=True,
    )
    console.print(f"{metric}: only this op INT8 / only this op FP32, worst first")
    for row in rows:
        alone, kept = row["only_quantized"][metric], row["only_fp32"][metric]
        console.print(f"{row['rank']:>4}  {escape(row['node'])}  {_num(alone)} / {_num(kept)}")
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(rows, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@app.command()
def recover(
    model: ModelArg,
    data: Annotated[
        str, typer.Option("--data", help="Evaluation data (same forms as calibrate --data).")
    ],
    calib_data: Annotated[str, typer.Option(help="Calibration data.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for the model, cache, trtexec line.")
    ],
    target: Annotated[
        str,
        typer.Option(help="METRIC=VALUE: top1_agreement, cosine, sqnr_db, accuracy_drop (labels)."),
    ] = "top1_agreement=0.99",
    labels: Annotated[
        Path | None, typer.Option(help=".npy of integer labels (needed for accuracy_drop).")
    ] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="Calibrator, or 'auto' (best per tensor).")
    ] = "entropy",
    budget: Annotated[
        int | None, typer.Option(help="Keep at most this many ops in high precision.")
    ] = None,
    precision: Annotated[str, typer.Option(help="fp32 | fp16 for the kept ops.")] = "fp32",
    trt_version: Annotated[
        str, typer.Option(help="TensorRT version the cache header targets (<= 10.x).")
    ] = "10.16.0",
    holdout_data: Annotated[
        str | None,
        typer.Option(help="Held-back data for --method auto (default: 64 calibration samples)."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Node names/regexes always kept in FP32.")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size (default: the model's, else 1).")
    ] = None,
    max_samples: Annotated[
        int | None, typer.Option(help="Evaluate at most this many samples.")
    ] = None,
    calib_max_samples: Annotated[
        int | None, typer.Option(help="Calibrate on at most this many samples.")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Image preprocessing preset.")] = None,
    provider: Annotated[
        str | None, typer.Option(help="onnxruntime provider (cpu, cuda, ...).")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="onnxruntime intra-op threads.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the HTML report here.")] = None,
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
        labels=labels,
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
    )
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


def main() -> None:
    """Console entry point: one-line errors for user mistakes, exit 130 on Ctrl-C."""
    try:
        app()  # standalone: usage errors print click's message and exit 2
    except QuantbenchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: no output was written", highlight=False)
        sys.exit(130)


if __name__ == "__main__":
    main()
