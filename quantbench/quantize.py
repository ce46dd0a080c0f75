"""``quantbench quantize`` as a whole: table (given or calibrated) -> Q/DQ model -> file.

Also the reverse (a Q/DQ model's activation scales -> a TensorRT cache / JSON table), and the
DWConv2D rewrites for TensorRT versions or precisions that need the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from quantbench import calibrators as registry
from quantbench.calibrate import (
    auto_head,
    check_auto_budget,
    check_methods,
    method_table,
    obtain_stats,
)
from quantbench.choose.autocalib import AutoTable
from quantbench.choose.clipguard import (
    DEFAULT_CLIP_WARN,
    ClipFlag,
    check_clip_warn,
    clip_flags,
    clip_warning,
)
from quantbench.choose.refined import RefineOutcome, passes_to_try, refine_judged
from quantbench.choose.twostaged import check_max_added_macs, two_stage_judged
from quantbench.collect.executors import ExecutorSpec
from quantbench.errors import InternalError, QuantbenchError
from quantbench.fileio import check_not_an_input, check_output_path
from quantbench.fp16 import (
    FP16,
    FP16_SCALE_OPSET,
    FP32,
    check_high_precision,
    declared_precisions,
    fp16_tensors,
    out_of_range_nodes,
    strongly_typed_fp16,
)
from quantbench.fp16range import activation_overflows, kept_text, overflows_text
from quantbench.model import customops
from quantbench.model.graph import Graph, calibration_tensors, open_graph
from quantbench.model.protosize import save_model
from quantbench.model.widen import float32_work_graph, own_high_precision, with_io_types_of
from quantbench.progress import info, warn
from quantbench.qdq import QuantizeResult, quantize_model, read_qdq_scales, write_quantized
from quantbench.qdq.placement import DEFAULT_OP_TYPES
from quantbench.refine import QDQ_PASSES, ROUNDING, TWO_STAGE, mark_refined
from quantbench.refine.twostage import RATIO
from quantbench.refine.twostage import verify as verify_two_stage
from quantbench.table import CalibrationTable
from quantbench.table.codecs import format_for_path, read_table, write_table


@dataclass
class QuantizeOutcome:
    result: QuantizeResult
    table: CalibrationTable
    written: list[Path] = field(default_factory=list)
    integer_ops: list[dict[str, object]] = field(default_factory=list)
    #: tensors to quantize whose threshold clips more than ``clip_warn`` (from --data only:
    #: a given table comes without the statistics to judge it)
    clipping: list[ClipFlag] = field(default_factory=list)
    auto: AutoTable | None = None
    #: "fp32", or "fp16": the strongly-typed form, every unquantized op in FP16
    high_precision: str = FP32
    #: node -> "int8" | "fp16" | "fp32" as the written model declares it
    precisions: dict[str, str] = field(default_factory=dict)
    #: the refinement passes tried and kept (None: none were tried)
    refine: RefineOutcome | None = None


@customops.executes_as("dwconv2d_op")
def quantize(
    model: str | Path,
    output: str | Path,
    *,
    table: str | Path | None = None,
    data: object | None = None,
    method: str = registry.DEFAULT_METHOD,
    holdout_data: object | None = None,
    clip_warn: float = DEFAULT_CLIP_WARN,
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
    dwconv2d_op: str | None = None,
    report_integer_ops: bool = False,
    high_precision: str | None = None,
    show_progress: bool = True,
    executor: ExecutorSpec | None = None,
    refine: str | list[str] | None = None,
    refined_model: str | Path | None = None,
    auto_budget: float | None = None,
    max_added_macs: float | None = None,
) -> QuantizeOutcome:
    """Quantize ``model`` explicitly from a table or from calibration data.

    ``refine`` (:mod:`quantbench.refine`): the passes to try, each kept only where it raises
    the output SQNR on the held-back slice (:mod:`quantbench.choose.refined`); a comma list,
    ``cheap``, ``all`` or ``none``. None: the cheap passes when calibrating with ``auto``,
    none otherwise. ``refined_model``: where to write the refined FP32 model (what the
    TensorRT cache path must build from) when a pass was kept. ``max_added_macs``: with the
    ``two-stage`` pass, the most linear-op MACs its second stages may add, a fraction of the
    model's (None: :data:`~quantbench.choose.twostaged.DEFAULT_MAX_ADDED_MACS`).
    ``auto_budget``: seconds ``auto``'s judging of the calibrators may take (it then judges on
    fewer samples).

    ``high_precision="fp16"``: the unquantized ops become FP16 and the Q/DQ scales FP16
    (:func:`quantbench.fp16.strongly_typed_fp16`), the mixed INT8/FP16 model TensorRT builds
    as given with ``--stronglyTyped``. None: the model's own (:func:`own_high_precision`):
    FP16 for a model that computes in float16, else FP32. A float16/bfloat16 model is
    quantized from its exact float32 widening and keeps its input and output types.

    ``dwconv2d_op``: how its onnxruntime sessions run DWConv2D nodes (plugin, plugin:cuda,
    lower: :func:`quantbench.model.customops.executing`); None: the process's setting."""
    if (table is None) == (data is None):
        raise QuantbenchError("give exactly one of --table TABLE or --data PATH")
    if high_precision is not None:
        check_high_precision(high_precision, "--high-precision")
    if high_precision == FP16 and dwconv2d:
        raise QuantbenchError(
            "--high-precision fp16 with --dwconv2d: the DWConv2D plugin op's INT8 form has no "
            "strongly-typed FP16 variant; drop one of the two"
        )
    check_output_path(output)
    check_not_an_input(output, model, table, data, holdout_data)
    check_clip_warn(clip_warn)
    if data is not None:
        method = check_methods([method])[0]  # a bad name or option fails before the data pass
        check_auto_budget(auto_budget, [method])
    elif auto_budget is not None:
        raise QuantbenchError("--auto-budget times auto's judging on --data; drop it with --table")
    passes = passes_to_try(refine, method, table_given=table is not None)
    check_two_stage(passes, max_added_macs, dwconv2d)
    if refined_model is not None:
        check_output_path(refined_model)
        check_not_an_input(refined_model, model, table, data, holdout_data, output)
    source = open_graph(model)
    if high_precision is None:
        high_precision = own_high_precision(source.model) if not dwconv2d else FP32
    graph = float32_work_graph(
        source,
        "quantize",
        f": the ops left out of INT8 are {high_precision.upper()}, its inputs and outputs keep "
        "their types",
    )
    widened = graph is not source
    flags: list[ClipFlag] = []
    auto = None
    refined = None
    if table is None:
        stats, _, _ = obtain_stats(
            graph,
            data,
            tensors="quantizable",
            batch_size=batch_size,
            max_samples=max_samples,
            preset=preset,
            provider=provider,
            show_progress=show_progress,
            executor=executor,
            keep_head=auto_head(graph, [method], holdout_data),
            # FP16's overflow check counts the values beyond 65504: it needs the histograms
            ranges_only=registry.ranges_suffice([method]) and high_precision != FP16,
        )
        cal_table, auto = method_table(
            graph,
            stats,
            method,
            data,
            holdout_data,
            batch_size=batch_size,
            preset=preset,
            provider=provider,
            executor=executor,
            auto_budget=auto_budget,
        )
        flags = clip_flags(stats, cal_table, clip_warn, calibration_tensors(graph, "quantizable"))
        if text := clip_warning(
            flags, clip_warn, str(cal_table.method), listed_by="calibrate --report PAGE",
            note=auto.clip_note() if auto is not None else "",
        ):  # fmt: skip
            warn(text)
        note = registry.method_note(method)
        info(f"calibrated with method {method}{': ' + note if note else ''}")
        original = graph
        if any(p not in QDQ_PASSES for p in passes):
            refined = refine_judged(
                graph, cal_table, data, passes, num_samples=stats.num_samples,
                holdout_data=holdout_data, batch_size=batch_size, preset=preset,
                provider=provider,
            )  # fmt: skip
            graph, cal_table = refined.graph, refined.table
    else:
        cal_table = read_table(table)
        info(f"{table}: {cal_table.origin()}, {len(cal_table)} tensors")
    has_dwconv2d = any(n.op_type == "DWConv2D" for n in graph.model.graph.node)
    if op_types is None and dwconv2d and has_dwconv2d:
        # the model's own DWConv2D nodes (rewrite --to dwconv2d --depthwise) must be quantized
        # too, or the plugin's INT8 form cannot be made of them
        op_types = [*DEFAULT_OP_TYPES, "DWConv2D"]
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
    result.require_quantized(str(model))  # before anything is written
    if refined is not None:
        _verify_rounding(refined, graph.model, result.model)
    if TWO_STAGE in passes:
        refined = _two_stage(
            result, original, cal_table, refined, data, stats.num_samples, holdout_data,
            batch_size, preset, provider, max_added_macs, show_progress,
        )  # fmt: skip
    if dwconv2d:
        result.model = _to_plugin(result.model)
    if high_precision == FP16:
        result.model = fp16_artefact(result.model)
        result.opset_to = max(result.opset_to, FP16_SCALE_OPSET)
        if table is None and (
            text := overflows_text(activation_overflows(stats, sorted(fp16_tensors(result.model))))
        ):
            warn(text)
    if widened:
        result.model = with_io_types_of(result.model, source.model)
    kept = refined.kept if refined is not None else []
    mark_refined(result.model, kept, refined.to_dict() if refined is not None else None)
    written = [write_quantized(result, output)]
    if refined_model is not None:
        fp32_kept = [p for p in kept if p not in QDQ_PASSES]
        written.append(_write_refined(graph.model, fp32_kept, refined_model))
    rows = []
    if report_integer_ops:
        from quantbench.ort_int8 import integer_op_report

        rows = integer_op_report(result.model if not dwconv2d else _lowered(result.model))
    precisions = declared_precisions(result.model)
    return QuantizeOutcome(
        result, cal_table, written, rows, flags, auto, high_precision, precisions, refined
    )


def check_two_stage(passes: tuple[str, ...], max_added_macs: float | None, dwconv2d: bool) -> None:
    """``--refine two-stage`` and ``--max-added-macs`` fit together and with the rest (one line)."""
    check_max_added_macs(max_added_macs)
    if max_added_macs is not None and TWO_STAGE not in passes:
        raise QuantbenchError(
            "--max-added-macs caps the two-stage pass's added work: give --refine two-stage "
            "(or all) with it, or drop it"
        )
    if TWO_STAGE in passes and dwconv2d:
        raise QuantbenchError(
            "--refine two-stage with --dwconv2d: the DWConv2D plugin's INT8 form has no second "
            "stage; drop one of the two"
        )


def _two_stage(
    result: QuantizeResult,
    original: Graph,
    table: CalibrationTable,
    refined: RefineOutcome | None,
    data: object,
    num_samples: int,
    holdout_data: object | None,
    batch_size: int | None,
    preset: str | None,
    provider: str | None,
    max_added_macs: float | None,
    show_progress: bool,
) -> RefineOutcome:
    """The two-stage pass on the finished Q/DQ model (judged against the ``original`` FP32
    model), checked before anything is written; its trial joins the refinement record."""
    staged = two_stage_judged(
        result.model, original, data, num_samples=num_samples, holdout_data=holdout_data,
        batch_size=batch_size, preset=preset, provider=provider,
        max_added_macs=max_added_macs, show_progress=show_progress,
    )  # fmt: skip
    if refined is None:
        refined = RefineOutcome(original, table, [], [], staged.base_db, staged.holdout)
    refined.trials.append(staged.trial)
    if staged.tensors:
        try:
            twins = verify_two_stage(staged.model, staged.tensors)
        except ValueError as e:
            raise InternalError(f"two-stage model malformed: {e}") from e
        result.model = staged.model
        result.qdq_pairs += len(staged.tensors)
        result.second_stages = len(staged.tensors)
        refined.kept.append(TWO_STAGE)
        info(
            f"refine: {TWO_STAGE}: {len(staged.tensors)} tensors, {twins} linear readers run "
            "twice, each second stage checked: symmetric INT8 at the first stage's scale / "
            f"{RATIO:g}, the reader's own INT8 weights"
        )
    return refined


def _verify_rounding(refined: RefineOutcome, model: onnx.ModelProto, qdq: onnx.ModelProto) -> None:
    """The bug guard on a kept rounding pass's weights (:func:`~quantbench.refine.rounding.
    verify_on_grid`), before anything is written."""
    if ROUNDING not in refined.kept or refined.unrounded is None:
        return
    from quantbench.refine.rounding import verify_on_grid

    nodes = [c.node for t in refined.trials if t.kept and t.name == ROUNDING for c in t.layers]
    count = verify_on_grid(model, qdq, refined.unrounded, nodes)
    info(
        f"refine: {count} rounded weights checked: exactly on the Q/DQ model's INT8 grid, "
        "with TensorRT's implicit per-channel scale unchanged"
    )


def _write_refined(model: onnx.ModelProto, kept: list[str], path: str | Path) -> Path:
    """The refined FP32 model (the original when no pass was kept, said so)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    mark_refined(out, kept)
    if not kept:
        info(f"{path}: no refinement pass was kept; this is the unrefined FP32 model")
    return save_model(out, path)


def fp16_artefact(model: onnx.ModelProto) -> onnx.ModelProto:
    """The strongly-typed INT8/FP16 form of ``model``, saying which nodes stay FP32 because FP16
    cannot hold a constant they read: kept FP32 rather than refused, as the artefact then
    computes what the model does and TensorRT builds it as given (a clamped 65504 ran 0.65x)."""
    kept, broken = out_of_range_nodes(model)
    if text := kept_text(kept, broken):
        warn(text)
    return strongly_typed_fp16(model, keep_fp32=kept)


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
    check_not_an_input(output, model)
    scales = read_qdq_scales(model)
    table = scales.table
    if scales.second_stages:
        warn(
            f"{model}: {len(scales.second_stages)} second-stage quantizers (two-stage "
            "activations) skipped: a calibration cache holds one scale a tensor, so an engine "
            "built from it quantizes those tensors once; only the Q/DQ model keeps both stages"
        )
    if not len(table):
        raise QuantbenchError(f"{model}: has no per-tensor activation QuantizeLinear nodes to read")
    path = write_table(table, output, fmt or format_for_path(output), trt_version=trt_version)
    return table, path


def rewrite(
    model: str | Path, output: str | Path, to: str, *, depthwise: bool = False
) -> tuple[int, Path]:
    """``to='dwconv2d'``: runtime-weight Conv -> DWConv2D; ``to='conv'``: DWConv2D -> Conv;
    ``to='float32'``: a float16/bfloat16 model widened to float32
    (:mod:`quantbench.model.widen`).

    ``depthwise`` (with ``to='dwconv2d'`` only): also the constant-weight 2-D Convs with
    ``group > 1``, so that a real model's depthwise layers run through the plugin op."""
    from quantbench.plugins.dwconv2d import conv_to_dwconv2d, dwconv2d_to_conv, is_dwconv2d

    check_output_path(output)
    check_not_an_input(output, model)
    if depthwise and to != "dwconv2d":
        raise QuantbenchError(f"--depthwise applies to --to dwconv2d only, not --to {to}")
    graph = open_graph(model)
    if to == "float32":
        return _widen(graph.model, model, output)
    if to == "dwconv2d":
        new = conv_to_dwconv2d(graph.model, constant_grouped=depthwise)
    elif to == "conv":
        new = dwconv2d_to_conv(graph.model)
    else:
        raise QuantbenchError(f"--to must be dwconv2d, conv or float32, not {to!r}")
    count = sum(1 for n in graph.model.graph.node if is_dwconv2d(n))
    changed = abs(sum(1 for n in new.graph.node if is_dwconv2d(n)) - count)
    if not changed:  # an unchanged copy would pass for the rewritten model
        what = "no DWConv2D node to rewrite into Conv"
        if to == "dwconv2d":
            what = (
                "no convolution with runtime weights (TensorRT's ConvMultiInput)"
                + (" and no 2-D grouped Conv" if depthwise else " (--depthwise: grouped Convs too)")
                + " to rewrite into DWConv2D"
            )
        raise QuantbenchError(f"{model}: {what}; nothing written")
    return changed, save_model(new, output)


def _widen(source: onnx.ModelProto, model: str | Path, output: str | Path) -> tuple[int, Path]:
    from quantbench.model.widen import widen_to_float32

    wide, changed = widen_to_float32(source)
    if not changed:
        raise QuantbenchError(f"{model}: holds no float16 or bfloat16 tensor; nothing written")
    return changed, save_model(wide, output)
