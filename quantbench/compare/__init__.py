"""``compare``: the Python twin of ``quantbench compare A B``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantbench import calibrators as registry
from quantbench.backends.onnxruntime import start_provider
from quantbench.calibrate import auto_head, check_auto_budget, check_methods, obtain_stats
from quantbench.choose.clipguard import (
    DEFAULT_CLIP_WARN,
    DEFAULT_SQNR_FLOOR_DB,
    check_clip_warn,
    check_sqnr_floor,
)
from quantbench.collect.executors import ExecutorSpec
from quantbench.compare.candidates import CalibrationContext
from quantbench.compare.run import run_comparison
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    DECISION_THRESHOLD,
    MODEL_METRICS,
    check_mask_threshold,
    declared_support,
)
from quantbench.evaluate.task_metrics import load_metric_script
from quantbench.fileio import check_not_an_input, check_output_path
from quantbench.model import customops
from quantbench.model.graph import (
    QDQ_OPS,
    calibration_tensors,
    check_float_model,
    open_graph,
)
from quantbench.model.widen import float32_work_graph
from quantbench.progress import info
from quantbench.results import (
    GATE_METRICS,
    apply_gates,
    base_document,
    calibration_section,
    parse_gate,
    write_json,
    write_layers_csv,
)
from quantbench.table.codecs import read_table

__all__ = ["compare", "labels_for_samples", "load_labels"]


def load_labels(labels: str | Path | np.ndarray | None) -> np.ndarray | None:
    """Labels from a plain ``.npy``, a one-array ``.npz`` (or an array, from Python): any dtype
    such a file holds (integers, floats, unicode strings...), one entry per sample along axis 0.
    Built-in accuracy uses them only when they are integers and an output holds class scores;
    every label reaches a ``--metric-script``."""
    if labels is None:
        return None
    where = "labels" if isinstance(labels, np.ndarray) else str(labels)
    array = labels if isinstance(labels, np.ndarray) else _read_labels(Path(labels))
    if array.ndim == 0 or array.dtype.hasobject:
        raise QuantbenchError(
            f"{where}: labels need one entry per sample (axis 0) of a plain dtype, got "
            f"{array.dtype}{list(array.shape)}"
        )
    return array


def labels_for_samples(
    labels: np.ndarray, max_samples: int | None, where: object = "labels"
) -> np.ndarray:
    """The labels of the samples evaluated, in order: ``--max-samples N`` uses the first N
    samples, so it uses the first N labels too (said on the console). compare, sensitivity and
    recover share this rule; the count must then equal the number of samples evaluated."""
    if max_samples is not None and len(labels) > max_samples:
        info(f"{where}: using the first {max_samples} of {len(labels)} labels (--max-samples)")
        return labels[:max_samples]
    return labels


def _read_labels(path: Path) -> np.ndarray:
    """A ``.npy``, or a ``.npz`` holding one array (its only array is the labels: a ``.npz``
    with several cannot say which, so the user is told to pick one)."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise QuantbenchError(f"{path}: labels file not found") from None
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{path}: not a readable .npy/.npz of labels ({exc})") from None
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        names = list(loaded.files)
        if len(names) != 1:
            held = ", ".join(names) or "no array"
            raise QuantbenchError(
                f"{path}: a .npz of labels must hold one array, this one holds {held}; save the "
                "labels alone (np.save('labels.npy', labels)) and give that file"
            )
        try:
            return loaded[names[0]]
        except Exception as exc:  # noqa: BLE001
            raise QuantbenchError(f"{path}: array {names[0]!r} is not readable ({exc})") from None


def reference_from_specs(a: str, b: str) -> tuple[str, str, str]:
    """(model, a, b) for ``compare`` without ``--model``: the first of ``a`` and ``b`` that is
    an ``.onnx`` file with no Q/DQ node becomes the FP32 reference and, as a side, ``fp32``
    (``compare model.onnx model.int8.onnx`` means what it says); else one line asking for
    ``--model``."""
    for k, spec in enumerate((a, b)):
        path = Path(spec)
        if path.suffix == ".onnx" and path.is_file() and not _quantized(path):
            sides = ["fp32", b] if k == 0 else [a, "fp32"]
            return str(path), sides[0], sides[1]
    raise QuantbenchError(
        f"compare {a} {b}: no FP32 reference: give the FP32 ONNX model with --model MODEL.onnx "
        "(A and B are what is compared against it: fp32, fp16, int8[:method], a .onnx or an "
        "engine), or give that model itself as A"
    )


def _quantized(path: Path) -> bool:
    """Whether the ONNX file holds a Q/DQ node (:data:`QDQ_OPS`), read without its external
    weights."""
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - unreadable: open_graph says so in one line later
        return False
    return any(n.op_type in QDQ_OPS for n in proto.graph.node)


@customops.executes_as("dwconv2d_op")
def compare(
    a: str,
    b: str,
    *,
    model: str | Path | None = None,
    data: object,
    calib_data: object | None = None,
    method: str = registry.DEFAULT_METHOD,
    table: str | Path | None = None,
    stats: str | Path | None = None,
    holdout_data: object | None = None,
    allow_partial: bool = False,
    clip_warn: float = DEFAULT_CLIP_WARN,
    sqnr_floor: float = DEFAULT_SQNR_FLOOR_DB,
    mask_threshold: float = DECISION_THRESHOLD,
    labels: str | Path | np.ndarray | None = None,
    metric_script: str | Path | None = None,
    exclude: list[str] | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    calib_max_samples: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
    latency: bool = True,
    latency_runs: int = 100,
    fail_below: list[str] | None = None,
    json_path: str | Path | None = None,
    csv_path: str | Path | None = None,
    command: str = "",
    show_progress: bool = True,
    executor: ExecutorSpec | None = None,
    dwconv2d_op: str | None = None,
    auto_budget: float | None = None,
) -> dict[str, Any]:
    """Compare precision ``a`` against ``b`` on ``data``; returns the results document (its HTML
    page: :func:`quantbench.reports.write_report`; the core does not import the reports).

    ``dwconv2d_op``: how onnxruntime runs DWConv2D nodes in every session (``plugin``: the op
    itself on the CPU, ``plugin:cuda``: the plugin's CUDA kernels, ``lower``: standard Conv;
    :func:`quantbench.model.customops.executing`); None: the process's setting (default
    plugin where onnxruntime-extensions is installed). ``model``: the FP32 reference; None:
    ``a`` (or else ``b``) where it is an FP32 ``.onnx`` file (:func:`reference_from_specs`)."""
    reference_named = model is not None
    if model is None:
        model, a, b = reference_from_specs(a, b)
    gates = [parse_gate(g, custom=metric_script is not None) for g in fail_below or []]
    script = (
        None
        if metric_script is None
        else load_metric_script(metric_script, reserved=(*GATE_METRICS, *MODEL_METRICS))
    )
    for p in (json_path, csv_path):
        if p is not None:
            check_output_path(p)
            check_not_an_input(p, model, data, calib_data, table, stats, holdout_data, labels)
    start_provider(provider)  # CUDA starts while the model loads
    graph = float32_work_graph(
        open_graph(model),
        "compare",
        ": it is the FP32 reference, and the model itself can be a candidate against it",
    )
    named = "the reference (--model)" if reference_named else f"the reference, {model}"
    check_float_model(graph, named)
    label_array = load_labels(labels)
    if label_array is not None:
        label_array = labels_for_samples(label_array, max_samples, labels)
    source = open_data(
        data, graph.inputs, batch_size=batch_size, max_samples=max_samples, preset=preset
    )
    declared = declared_support(graph.model, source.unbatched)
    for metric, _ in gates:
        if reason := declared.support(metric, label_array):
            raise QuantbenchError(f"--fail-below {metric}: {reason}")
    if (
        label_array is not None
        and source.num_samples is not None
        and len(label_array) != source.num_samples
    ):
        raise QuantbenchError(
            f"{labels}: {len(label_array)} labels for {source.num_samples} evaluation samples"
        )
    needs_int8 = any(s.lower().startswith("int8") for s in (a, b))
    check_clip_warn(clip_warn)
    check_sqnr_floor(sqnr_floor)
    check_mask_threshold(mask_threshold)
    default_method = check_methods([method])[0]  # checked once, whoever uses it
    int8_methods = []  # the methods the int8 candidates calibrate with
    for spec in (a, b):  # every int8 method is checked before any inference
        if spec.lower().startswith("int8:") and spec.partition(":")[2].strip():
            int8_methods += check_methods([spec.partition(":")[2]])
        elif spec.lower() == "int8" and table is None:
            int8_methods.append(default_method)
    check_auto_budget(auto_budget, int8_methods)
    ctx = CalibrationContext(
        default_method=default_method,
        exclude=list(exclude or []),
        calib_data=calib_data,
        holdout_data=holdout_data,
        batch_size=batch_size,
        preset=preset,
        provider=provider,
        allow_partial=allow_partial,
        clip_warn=clip_warn,
        auto_budget=auto_budget,
    )
    stats_file = None
    if table is not None:
        ctx.table = read_table(table)
    if needs_int8 and (calib_data is not None or stats is not None):
        stats_file, _, _ = obtain_stats(
            graph,
            calib_data,
            tensors="quantizable",
            stats=stats,
            batch_size=batch_size,
            max_samples=calib_max_samples,
            preset=preset,
            provider=provider,
            show_progress=show_progress,
            executor=executor,
            keep_head=auto_head(graph, int8_methods, holdout_data),
        )
        ctx.stats = stats_file
    body = run_comparison(
        graph,
        source,
        (a, b),
        ctx,
        labels=label_array,
        metric_script=script,
        provider=provider,
        threads=threads,
        latency=latency,
        latency_runs=latency_runs,
        show_progress=show_progress,
        sqnr_floor=sqnr_floor,
        mask_threshold=mask_threshold,
    )
    doc = base_document("compare", graph, command or f"quantbench compare {a} {b} --model {model}")
    doc["data"] = {
        "eval_path": str(data) if isinstance(data, (str, Path)) else type(data).__name__,
        "eval_fingerprint": source.fingerprint,
        "eval_samples": body.pop("eval_samples"),
        "calib_path": str(calib_data) if isinstance(calib_data, (str, Path)) else None,
        "calib_fingerprint": stats_file.data_fingerprint if stats_file else None,
        "calib_samples": stats_file.num_samples if stats_file else None,
    }
    method_used = body.pop("method_used")
    doc.update(body)
    if stats_file is not None:
        doc["calibration"] = calibration_section(
            stats_file, calibration_tensors(graph, "quantizable"), method_used
        )
        doc["calibration"].update(ctx.findings_section())
    apply_gates(doc, gates)
    if json_path is not None:
        write_json(doc, json_path)
    if csv_path is not None:
        write_layers_csv(doc, csv_path)
    return doc

