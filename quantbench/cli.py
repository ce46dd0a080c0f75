"""The ``quantbench`` command line: a thin typer layer over the Python API.

Each command parses options, calls its Python twin and formats the result. User mistakes
(:class:`QuantbenchError`) become one line on stderr and exit code 2; Ctrl-C exits 130 and,
because every output is written atomically, leaves no partial file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

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
    Optional[str],
    typer.Option(
        "--data",
        help=".npz/.npy, a folder of them, an image folder (with --preset) or a data-loader "
        "script file.py[:function].",
    ),
]
MethodOpt = Annotated[
    Optional[list[str]],
    typer.Option("--method", "-m", help="Calibrator (repeatable), e.g. entropy, minmax, percentile:99.9, mse, entropy:ort, or 'all'."),
]


def _version(value: bool) -> None:
    if value:
        console.print(f"quantbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """quantbench: INT8 for TensorRT without losing accuracy."""


@app.command()
def calibrate(
    model: ModelArg,
    data: DataOpt = None,
    method: MethodOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (one method) or folder (several).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="trt | json | ort-flatbuffers")] = "trt",
    trt_version: Annotated[str, typer.Option(help="TensorRT version the cache header targets (X.Y.Z, <= 10.x).")] = "10.16.0",
    tensors: Annotated[Optional[str], typer.Option(help="all | quantizable (default: all for caches).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Batch size for inference (default: the model's, else 1).")] = None,
    max_samples: Annotated[Optional[int], typer.Option(help="Use at most this many samples.")] = None,
    preset: Annotated[Optional[str], typer.Option(help="Image preprocessing preset: a configs/ name or a .toml path.")] = None,
    provider: Annotated[Optional[str], typer.Option(help="onnxruntime provider: cpu (default), cuda, or a full name.")] = None,
    stats: Annotated[Optional[Path], typer.Option(help="Use this statistics file instead of running the data.")] = None,
    merge: Annotated[Optional[list[Path]], typer.Option(help="Merge these statistics files (shards) first (repeatable).")] = None,
    save_stats: Annotated[Optional[Path], typer.Option(help="Also save the statistics to this file.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Ignore and do not write the statistics cache.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write a calibration-only HTML report here.")] = None,
) -> None:
    """Collect statistics in one onnxruntime pass and write calibration tables."""
    from quantbench import calibrate as cal

    result = cal.calibrate(
        model, data, methods=method, output=output, fmt=fmt, trt_version=trt_version,
        tensors=tensors, batch_size=batch_size, max_samples=max_samples, preset=preset,
        provider=provider, stats=stats, merge=merge, save_stats=save_stats,
        use_cache=not no_cache,
    )
    cal.summarize(result)
    if report is not None:
        from quantbench.results import calibration_results
        from quantbench.reports import write_report

        write_report(calibration_results(model, result, command=_command_line()), report)
        console.print(f"wrote {report}")


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="An ONNX model, a calibration table/cache or a statistics file.")],
    model: Annotated[Optional[Path], typer.Option(help="With a table: list the model tensors it lacks.")] = None,
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


def _command_line() -> str:
    import shlex

    return "quantbench " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def main() -> None:
    """Console entry point: one-line errors for user mistakes."""
    try:
        app(standalone_mode=False)
    except QuantbenchError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: no output was written", highlight=False)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
