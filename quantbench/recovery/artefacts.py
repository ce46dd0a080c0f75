"""What ``recover`` writes: the Q/DQ model, a TensorRT cache and the trtexec line to use them.

* ``<name>.recovered.onnx``: the Q/DQ model with the kept ops unquantized (explicit
  quantization, any TensorRT that reads Q/DQ). With ``--precision fp16`` it is strongly typed:
  every unquantized op FP16, FP16 Q/DQ scales (opset 19), built as given by
  ``trtexec --stronglyTyped`` (TensorRT 10.x; always on in 11.x), which takes no precision
  flags.
* ``<name>.recovered.cache``: for TensorRT <= 10 implicit quantization, the calibration cache
  without the input tensors of the kept ops (a tensor another INT8 op still reads keeps its
  scale: removing it would push that op out of INT8 too).
* ``<name>.trtexec.txt``: the matching ``trtexec`` lines: the cache path with
  ``--int8 [--fp16] --precisionConstraints=obey --layerPrecisions=<op>:fp32|fp16,...``; the
  Q/DQ model with the same flags (fp32) or ``--stronglyTyped`` alone (fp16).
* ``<name>.recovery.json``: a results document whose ``recovery`` section the HTML report
  renders.

Layer names: ``--layerPrecisions`` takes TensorRT layer names. TensorRT names a layer it builds
from one ONNX node after that node, so the ONNX node names are used; a layer TensorRT fuses
(Conv+Relu, Conv+Add) carries a combined name and the constraint may not bind. This is an
approximation: check the built engine with ``quantbench inspect`` / the engine inspector.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import onnx

from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import lower_is_better
from quantbench.fileio import write_text_atomic
from quantbench.jsonsafe import from_json_float
from quantbench.model.graph import node_labels
from quantbench.model.protosize import save_model
from quantbench.recovery.evaluation import RESERVED, json_metrics
from quantbench.recovery.search import RecoveryResult
from quantbench.refine import mark_refined
from quantbench.results import base_document, write_json
from quantbench.table import CalibrationTable
from quantbench.table.codecs import write_table
from quantbench.table.trt_cache import DEFAULT_TRT_VERSION, TRTEXEC_ALGORITHM, check_cache_target


def _node_inputs(result: RecoveryResult) -> dict[str, list[str]]:
    """Node name (``graph.node_labels``, the names the plan uses) -> non-constant inputs."""
    graph = result.context.graph
    nodes = graph.model.graph.node
    return {
        name: [i for i in node.input if i and i not in graph.constants]
        for node, name in zip(nodes, node_labels(nodes), strict=True)
    }


def trimmed_table(result: RecoveryResult) -> tuple[CalibrationTable, list[str], list[str]]:
    """The table minus the kept ops' inputs; returns (table, removed, kept because shared)."""
    still_int8 = {qi.tensor for q in result.final.quantized for qi in q.inputs}
    inputs = _node_inputs(result)
    removed: list[str] = []
    shared: list[str] = []
    for node in result.kept:
        for tensor in inputs.get(node, []):
            target = shared if tensor in still_int8 else removed
            if tensor in result.context.table and tensor not in target:
                target.append(tensor)
    source = result.context.table
    table = CalibrationTable(
        entries={k: v for k, v in source.entries.items() if k not in removed},
        method=source.method,
        algorithm=TRTEXEC_ALGORITHM,  # the cache is for trtexec.txt's --calib line
        provenance=source.provenance,
    )
    return table, removed, shared


def layer_precisions(result: RecoveryResult) -> str:
    """``--layerPrecisions=a:fp32,b:fp32`` (empty string when nothing is kept). With ``fp16``,
    the nodes the artefact keeps FP32 (FP16 cannot hold a constant they read) are ``:fp32``
    too: with ``--fp16`` alone TensorRT would build them in FP16."""
    layers = {n: result.precision for n in result.kept}
    if result.precision == "fp16":
        layers.update({n: p for n, p in result.op_precisions.items() if p == "fp32"})
    if not layers:
        return ""
    return "--layerPrecisions=" + ",".join(f"{n}:{p}" for n, p in layers.items())


def trtexec_lines(result: RecoveryResult, onnx_path: Path, qdq_path: Path, cache: Path) -> str:
    """Both ways to build the recovered engine, as shell lines with a comment each.

    A strongly-typed model (``fp16``) takes ``--stronglyTyped`` and no precision flag: TensorRT
    refuses layer precisions in a strongly-typed network, and 11.x has no precision flags."""
    flags = ["--int8"] + (["--fp16"] if result.precision == "fp16" else [])
    constraint = layer_precisions(result)
    if constraint:
        flags += ["--precisionConstraints=obey", constraint]
    quoted = " ".join(shlex.quote(f) for f in flags)
    cache_line = (
        "# TensorRT <= 10, implicit quantization from the calibration cache\n"
        "# (layer names = ONNX node names; exact only for layers TensorRT does not fuse)\n"
        f"trtexec --onnx={shlex.quote(str(onnx_path))} {quoted} "
        f"--calib={shlex.quote(str(cache))}\n"
    )
    if result.precision == "fp16":
        return cache_line + (
            "# explicit quantization, strongly typed: INT8 where Q/DQ, FP16 elsewhere, as the\n"
            "# model's types say (TensorRT 10.x; on 11.x strong typing is always on: drop the "
            "flag)\n"
            f"trtexec --onnx={shlex.quote(str(qdq_path))} --stronglyTyped\n"
        )
    return cache_line + (
        "# explicit quantization: the kept ops already have no Q/DQ in this model\n"
        f"trtexec --onnx={shlex.quote(str(qdq_path))} {quoted}\n"
    )


def recovery_document(result: RecoveryResult, command: str = "") -> dict[str, Any]:
    """A ``compare``-kind results document carrying the ``recovery`` section."""
    ctx = result.context
    doc = base_document("compare", ctx.graph, command or "quantbench recover")
    doc["recovery"] = result.section()
    kept = len(result.kept)
    doc["a"] = {"spec": "fp32", "label": "FP32", "backend": "onnxruntime", "method": None}
    counts: dict[str, int] = {}
    for p in result.op_precisions.values():
        counts[p] = counts.get(p, 0) + 1
    mixed = " + FP16, strongly typed" if result.precision == "fp16" else ""
    doc["b"] = {
        "spec": f"int8:{ctx.method}",
        "label": f"INT8 ({ctx.method}){mixed}, {kept} op(s) kept in {result.precision}",
        "backend": "onnxruntime",
        "method": ctx.method,
        "op_precisions": counts,
    }
    kept_nodes = set(result.kept)  # kept by the search, through quantize's exclusions: say so
    doc["excluded"] = [
        {**s.to_dict(), "reason": f"kept in {result.precision} by recover"}
        if s.node in kept_nodes
        else s.to_dict()
        for s in result.final.skipped
    ]
    doc["data"] = {
        "eval_samples": ctx.evaluator.num_samples,
        "calib_samples": ctx.stats.num_samples,
    }
    task = _task_section(result)
    if task:
        doc["task"] = task
    doc["thresholds"] = [target_gate(result)]
    doc["passed"] = result.met
    return doc


def _task_section(result: RecoveryResult) -> dict[str, Any]:
    """``accuracy`` (integer labels) and the metric script's numbers as ``{A, B, delta}``, A
    measured on FP32, B on the recovered model: the report's task table, as compare's."""
    final = result.steps[-1]["metrics"]
    fp32 = json_metrics(result.context.evaluator.fp32_metrics)
    task: dict[str, Any] = {}
    accuracy = result.context.evaluator.fp32_accuracy
    if accuracy is not None:
        task["accuracy"] = {"A": accuracy, "B": final.get("accuracy")}
    for name in final:
        if name not in RESERVED:  # a metric script's own
            task[name] = {"A": fp32.get(name), "B": final[name]}
    for entry in task.values():
        a, b = _number(entry["A"]), _number(entry["B"])
        entry["delta"] = None if a is None or b is None else b - a
    return task


def _number(value: Any) -> float | None:
    """A metric as a float; None when undefined (``"nan"``, null)."""
    number = from_json_float(value)
    return None if number is None or math.isnan(number) else number


def target_gate(result: RecoveryResult) -> dict[str, Any]:
    """The ``--target`` as a gate row (``thresholds``), judged as the search judged it: the
    recovery record shows the metric it was judged on, its bound, value and verdict."""
    target = result.target
    bound = "max" if lower_is_better(target.metric) else "min"
    gate: dict[str, Any] = {"metric": target.metric, bound: target.value}
    gate.update({"value": result.metric, "passed": result.met})
    if _number(result.metric) is None:
        gate["reason"] = "undefined on the recovered model's outputs (NaN/Inf)"
    return gate


def check_artefact_target(out_dir: str | Path, trt_version: str) -> Path:
    """Refuse a bad output folder or TensorRT version before any inference runs."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise QuantbenchError(f"{out}: --output names a folder for the artefacts, but is a file")
    if not out.parent.is_dir():
        raise QuantbenchError(f"{out}: the folder {out.parent} does not exist")
    check_cache_target(trt_version)  # the cache header's rule: encodable, TensorRT <= 10.x
    return out


def write_artefacts(
    result: RecoveryResult,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    trt_version: str = DEFAULT_TRT_VERSION,
    command: str = "",
) -> dict[str, Path]:
    """Write the four files into ``out_dir`` (created if missing); returns kind -> path."""
    out = check_artefact_target(out_dir, trt_version)
    out.mkdir(exist_ok=True)
    name = result.context.name
    paths = {
        "model": out / f"{name}.recovered.onnx",
        "cache": out / f"{name}.recovered.cache",
        "trtexec": out / f"{name}.trtexec.txt",
        "results": out / f"{name}.recovery.json",
    }
    table, removed, shared = trimmed_table(result)
    artefact = result.artefact if result.artefact is not None else result.final.model
    ctx = result.context
    if ctx.refine is not None:
        mark_refined(artefact, ctx.refine.kept, ctx.refine.to_dict())
    save_model(artefact, paths["model"])
    write_table(table, paths["cache"], "trt", trt_version=trt_version)
    source = Path(model_path or ctx.graph.path or f"{name}.onnx")
    if ctx.refined:  # the cache's ranges and weights are the refined model's: build from it
        paths["refined"] = out / f"{name}.refined.onnx"
        refined = onnx.ModelProto()
        refined.CopyFrom(ctx.graph.model)
        mark_refined(refined, ctx.refine.kept)
        source = save_model(refined, paths["refined"])
    write_text_atomic(
        paths["trtexec"], trtexec_lines(result, source, paths["model"], paths["cache"])
    )
    doc = recovery_document(result, command)
    doc["recovery"]["cache_removed"] = removed
    doc["recovery"]["cache_kept_shared"] = shared
    if ctx.refine is not None:
        doc["recovery"]["refine"] = ctx.refine.to_dict()
    doc["recovery"]["artefacts"] = {k: str(v) for k, v in paths.items()}
    write_json(doc, paths["results"])
    return paths
