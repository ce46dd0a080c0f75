"""``quantbench quantize`` as a whole: table (given or calibrated) -> Q/DQ model -> file.

Also the reverse (a Q/DQ model's activation scales -> a TensorRT cache / JSON table), and the
DWConv2D rewrites for TensorRT versions or precisions that need the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from quantbench import calibrators as registry
from quantbench.calibrate import AUTO, auto_method_table, build_table, obtain_stats
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path, write_bytes_atomic
from quantbench.graph import Graph, open_graph
from quantbench.qdq import QuantizeResult, quantize_model, table_from_qdq, write_quantized
from quantbench.table import CalibrationTable
from quantbench.table.codecs import format_for_path, read_table, write_table


@dataclass
class QuantizeOutcome:
    result: QuantizeResult
    table: CalibrationTable
    written: list[Path] = field(default_factory=list)
    integer_ops: list[dict[str, object]] = field(default_factory=list)


def quantize(
    model: str | Path,
    output: str | Path,
    *,
    table: str | Path | None = None,
    data: object | None = None,
    method: str = "entropy",
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    exclude: list[str] | None = None,
    op_types: list[str] | None = None,
    per_channel: bool = True,
    quantize_residual: bool = True,
    allow_partial: bool = False,
    requantize: bool = False,
    dwconv2d: bool = False,
    report_integer_ops: bool = False,
    show_progress: bool = True,
) -> QuantizeOutcome:
    """Quantize ``model`` explicitly from a table or from calibration data."""
    if (table is None) == (data is None):
        raise QuantbenchError("give exactly one of --table TABLE or --data PATH")
    check_output_path(output)
    graph = open_graph(model)
    cal_table = (
        read_table(table)
        if table is not None
        else _calibrated(
            graph, data, method, batch_size, max_samples, preset, provider, show_progress
        )
    )
    kwargs = {} if op_types is None else {"op_types": op_types}
    result = quantize_model(
        graph,
        cal_table,
        exclude=exclude or [],
        per_channel=per_channel,
        quantize_residual=quantize_residual,
        allow_partial=allow_partial,
        requantize=requantize,
        **kwargs,
    )
    if dwconv2d:
        result.model = _to_plugin(result.model)
    written = [write_quantized(result, output)]
    rows = []
    if report_integer_ops:
        from quantbench.ort_int8 import integer_op_report

        rows = integer_op_report(result.model if not dwconv2d else _lowered(result.model))
    return QuantizeOutcome(result, cal_table, written, rows)


def _calibrated(
    graph: Graph,
    data: object,
    method: str,
    batch_size: int | None,
    max_samples: int | None,
    preset: str | None,
    provider: str | None,
    show_progress: bool,
) -> CalibrationTable:
    if method != AUTO:
        registry.parse_method(method)  # a bad name fails before the data pass
    stats, _, _ = obtain_stats(
        graph,
        data,
        tensors="quantizable",
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
        show_progress=show_progress,
    )
    if method == AUTO:
        return auto_method_table(graph, stats, data, preset=preset, provider=provider)
    return build_table(stats, method, graph)


def _to_plugin(model: onnx.ModelProto) -> onnx.ModelProto:
    """Runtime-weight convs -> DWConv2D, in the INT8 form TensorRT's plugin path needs."""
    from quantbench.plugins.dwconv2d import conv_to_dwconv2d, dwconv2d_int8_pattern

    return dwconv2d_int8_pattern(conv_to_dwconv2d(model))


def _lowered(model: onnx.ModelProto) -> onnx.ModelProto:
    from quantbench.plugins.dwconv2d import dwconv2d_to_conv

    return dwconv2d_to_conv(model)


def extract_table(
    model: str | Path, output: str | Path, fmt: str | None = None, trt_version: str | None = None
) -> tuple[CalibrationTable, Path]:
    """The activation scales of a Q/DQ model as a TensorRT cache / JSON / flatbuffers table."""
    check_output_path(output)
    table = table_from_qdq(model)
    if not len(table):
        raise QuantbenchError(f"{model}: has no per-tensor activation QuantizeLinear nodes to read")
    path = write_table(table, output, fmt or format_for_path(output), trt_version=trt_version)
    return table, path


def rewrite(model: str | Path, output: str | Path, to: str) -> tuple[int, Path]:
    """``to='dwconv2d'``: runtime-weight Conv -> DWConv2D; ``to='conv'``: DWConv2D -> Conv."""
    from quantbench.plugins.dwconv2d import conv_to_dwconv2d, dwconv2d_to_conv, is_dwconv2d

    check_output_path(output)
    graph = open_graph(model)
    if to == "dwconv2d":
        new = conv_to_dwconv2d(graph.model)
    elif to == "conv":
        new = dwconv2d_to_conv(graph.model)
    else:
        raise QuantbenchError(f"--to must be dwconv2d or conv, not {to!r}")
    count = sum(1 for n in graph.model.graph.node if is_dwconv2d(n))
    changed = abs(sum(1 for n in new.graph.node if is_dwconv2d(n)) - count)
    return changed, write_bytes_atomic(output, new.SerializeToString())
