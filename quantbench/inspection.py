"""``quantbench inspect``: what is inside a model, a calibration table or a statistics file.

Each ``inspect_*`` returns a plain dict (printed as JSON with ``--json``) and ``render`` turns
it into rich tables for people.
"""

from __future__ import annotations

import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from quantbench import calibrators as registry
from quantbench.errors import QuantbenchError
from quantbench.evaluate.metrics import (
    VALUE_FREE,
    declared_support,
)
from quantbench.evaluate.outputaxes import value_free_outputs
from quantbench.jsonsafe import from_json_float
from quantbench.model.graph import (
    QDQ_OPS,
    QUANTIZED_OPS,
    WEIGHTED_OP_TYPES,
    Graph,
    calibration_tensors,
    is_dynamic_weight_conv,
    node_labels,
    open_graph,
    residual_add_inputs,
    type_text,
    untyped_tensors,
)
from quantbench.model.widen import float32_graph
from quantbench.progress import results as console
from quantbench.refine import QDQ_PASSES, refine_record, refined_passes
from quantbench.stats.tensorstats import StatsFile
from quantbench.table.codecs import read_table


def kind_of(path: Path) -> str:
    """``model`` | ``stats`` | ``table``, by content (suffixes lie)."""
    if not path.is_file():
        raise QuantbenchError(f"{path}: file not found")
    if path.suffix == ".onnx":
        return "model"
    if zipfile.is_zipfile(path):
        return "stats"
    return "table"


def inspect_model(g: Graph) -> dict[str, Any]:
    labels = node_labels(g.model.graph.node)
    nodes = list(g.model.graph.node)
    return {
        "kind": "model",
        "path": str(g.path or ""),
        "hash": g.hash,
        "opset": g.opset,
        "num_nodes": len(g.model.graph.node),
        "inputs": [s.describe() for s in g.inputs],
        "outputs": [
            s.describe() if v.type.HasField("tensor_type") else f"{v.name} {type_text(v.type)}"
            for s, v in zip(g.outputs, g.model.graph.output, strict=True)
        ],
        "quantizable_ops": [
            {"node": labels[i], "op_type": n.op_type}
            for i, n in enumerate(nodes)
            if n.op_type in WEIGHTED_OP_TYPES
        ],
        # quantize also quantizes the residual input of an Add after a weighted op (for
        # TensorRT's INT8-out fusion): the ops it quantizes are these plus those Adds
        "residual_adds": list(residual_add_inputs(g)),
        "dynamic_weight_convs": [
            {
                "node": labels[i],
                "data": n.input[0],
                "weight": n.input[1],
                "bias": n.input[2] if len(n.input) > 2 else "",
            }
            for i, n in enumerate(nodes)
            if is_dynamic_weight_conv(g, n)
        ],
        "calibration_tensors": {
            "all": len(calibration_tensors(g, "all")),
            "quantizable": len(calibration_tensors(g, "quantizable")),
        },
        "untyped_tensors": untyped_tensors(g),
        "quantized_ops": dict(
            Counter(n.op_type for n in nodes if n.op_type in (*QDQ_OPS, *QUANTIZED_OPS))
        ),
        "not_tensors": [
            f"{v.name}: {type_text(v.type)}"
            for v in (*g.model.graph.input, *g.model.graph.output)
            if not v.type.HasField("tensor_type")
        ],
        "widened_hash": _widened_hash(g),
        "refined_by": refined_passes(g.model),
        # the judging record quantize stored (every pass tried, its score, its layer changes)
        "refine_record": refine_record(g.model),
        **_output_judgement(g),
    }


def _output_judgement(g: Graph) -> dict[str, Any]:
    """How compare, sensitivity and recover can judge the outputs: per output its agreement
    kind (or why none) and whether it is a probability map, and the metrics that follow."""
    declared = declared_support(g.model)
    fixed = dict.fromkeys(value_free_outputs(g.model), (None, VALUE_FREE))
    return {
        "output_agreement": {
            v.name: {"kind": kind, "reason": reason or None, "mask": v.name in declared.masks}
            for v in g.model.graph.output
            for kind, reason in [declared.kinds.get(v.name) or fixed.get(v.name) or (None, "")]
        },
        "output_metrics": declared.defined(None),
    }


def _widened_hash(g: Graph) -> str:
    """The hash of the float32 widening the other commands work on ("" for a float32 model):
    the model hash its tables and statistics record."""
    widened = float32_graph(g)
    return widened.hash if widened is not None else ""


def inspect_table(path: Path, model: Graph | None = None) -> dict[str, Any]:
    table = read_table(path)
    out: dict[str, Any] = {
        "kind": "table",
        "path": str(path),
        "method": table.method,
        "algorithm": table.algorithm,
        "trt_version": table.provenance.trt_version,
        "provenance": table.provenance.to_dict(),
        "num_tensors": len(table),
        "invalid": table.invalid(),
        "tensors": [
            {"name": name, "amax": e.amax, "scale": float(e.scale)}
            for name, e in table.entries.items()
        ],
    }
    if model is not None:
        wanted = calibration_tensors(model, "all")
        quantizable = set(calibration_tensors(model, "quantizable"))
        out["missing"] = [t for t in wanted if t not in table]
        out["missing_quantizable"] = [t for t in wanted if t in quantizable and t not in table]
        known = set(wanted) | {s.name for s in model.inputs}
        out["extra"] = [t for t in table if t not in known]
        made_for = table.provenance.model_hash
        if made_for and made_for not in (model.hash, _widened_hash(model)):
            out["model_mismatch"] = True
    return out


def inspect_stats(path: Path, methods: list[str] | None = None) -> dict[str, Any]:
    s = StatsFile.load(path)
    method_list = registry.expand_methods(methods or ["all"])
    return {
        "kind": "stats",
        "path": str(path),
        "model_hash": s.model_hash,
        "data_fingerprint": s.data_fingerprint,
        "num_samples": s.num_samples,
        "tool_version": s.tool_version,
        "methods": method_list,
        "tensors": [
            {
                **t.summary(),
                "name": t.name,
                "amax": {
                    m: (None if t.count == 0 else registry.compute_amax(m, t)) for m in method_list
                },
            }
            for t in s
        ],
    }


def inspect_path(
    path: str | Path, model: str | Path | None = None, methods: list[str] | None = None
) -> dict[str, Any]:
    p = Path(path)
    kind = kind_of(p)
    if kind == "model":
        return inspect_model(open_graph(p))
    if kind == "stats":
        return inspect_stats(p, methods)
    return inspect_table(p, open_graph(model) if model else None)


# --------------------------------------------------------------------------- rendering


def render(report: dict[str, Any], limit: int = 50) -> None:
    kind = report["kind"]
    if kind == "model":
        _render_model(report)
    elif kind == "table":
        _render_table(report, limit)
    else:
        _render_stats(report, limit)


def _render_model(r: dict[str, Any]) -> None:
    console.print(
        f"[bold]{escape(r['path'])}[/bold]  opset {r['opset']}, {r['num_nodes']} nodes, "
        f"sha256 {r['hash'][:16]}"
    )
    console.print("inputs:  " + escape("; ".join(r["inputs"])))
    console.print("outputs: " + escape("; ".join(r["outputs"])))
    if r.get("widened_hash"):
        console.print(
            "computes in float16/bfloat16: calibrate, quantize, compare, sensitivity and recover "
            f"work on its exact float32 widening, sha256 {r['widened_hash'][:16]} (the hash its "
            "tables record; quantbench rewrite --to float32 writes it)"
        )
    if r.get("refined_by"):
        console.print(_refined_text(r["refined_by"]))
    if isinstance(r.get("refine_record"), dict):
        _render_refinement(r["refine_record"])
    if r.get("output_metrics"):
        console.print(
            "judged by (compare --fail-below, sensitivity --metric, recover --target): "
            + ", ".join(r["output_metrics"])
            + ("; accuracy with --labels" if _has_accuracy(r) else "")
        )
    if r.get("not_tensors"):
        listed = escape("; ".join(r["not_tensors"]))
        console.print(f"[yellow]not tensors (quantbench cannot calibrate them):[/yellow] {listed}")
    if r.get("quantized_ops"):
        ops = escape(", ".join(f"{n} {op}" for op, n in r["quantized_ops"].items()))
        console.print(f"[yellow]already quantized:[/yellow] {ops}")
    ct = r["calibration_tensors"]
    weighted, adds = len(r["quantizable_ops"]), len(r["residual_adds"])
    split = f" ({weighted} weighted, {adds} residual Add)" if adds else ""
    console.print(
        f"{weighted + adds} ops to quantize{split}; tensors to calibrate: {ct['all']} (all) / "
        f"{ct['quantizable']} (quantizable)"
    )
    if r.get("untyped_tensors"):
        names = ", ".join(escape(n) for n in r["untyped_tensors"])
        console.print(f"[yellow]type unknown, cannot be calibrated:[/yellow] {names}")
    t = Table(title="Dynamic-weight convolutions (TensorRT ConvMultiInput)", title_justify="left")
    for col in ("node", "data", "weight", "bias"):
        t.add_column(col)
    for d in r["dynamic_weight_convs"]:
        t.add_row(*(escape(x) for x in (d["node"], d["data"], d["weight"], d["bias"] or "-")))
    if r["dynamic_weight_convs"]:
        console.print(t)
    else:
        console.print("no dynamic-weight convolutions")


def _refined_text(passes: list[str]) -> str:
    """What a refined model's passes mean for its calibration cache."""
    text = "refined by quantbench (" + escape(", ".join(passes)) + ")"
    fp32 = [p for p in passes if p not in QDQ_PASSES]
    if fp32:
        text += (": its weights differ from the model it was refined from; a calibration cache "
                 "of that model does not apply to this one")  # fmt: skip
    if len(fp32) < len(passes):
        text += ("; two-stage activations (a second INT8 stage on a few activations, their "
                 "readers run twice) exist only in this Q/DQ model: a calibration cache cannot "
                 "express them")  # fmt: skip
    return text


def _render_refinement(record: dict[str, Any]) -> None:
    """The passes quantize tried: each one's output SQNR on the held-back calibration samples
    and whether it was kept (``--json`` has the per-layer changes)."""
    trials = [t for t in record.get("trials") or [] if isinstance(t, dict)]
    holdout = record.get("holdout")
    title = "Refinement passes tried (output SQNR against FP32 on the held-back calibration "
    title += f"samples: {holdout})" if holdout else "samples)"
    t = Table(title=escape(title), title_justify="left")
    for col in ("pass", "output SQNR", "kept"):
        t.add_column(col, justify="right" if col == "output SQNR" else "left")
    t.add_row("(unrefined)", _db(record.get("base_output_sqnr_db")), "")
    final = record.get("kept") or []
    for trial in trials:
        note = str(trial.get("note") or "")
        verdict = note or "no"
        if trial.get("kept") is True:  # a later variant of the pass may have replaced it
            verdict = "yes" if trial.get("pass") in final else "replaced by a later variant"
        t.add_row(escape(str(trial.get("pass", "?"))), _db(trial.get("output_sqnr_db")),
                  escape(verdict))  # fmt: skip
    console.print(t)
    if not record.get("kept"):
        console.print("no refinement pass kept: quantized from the unrefined model")


def _db(value: Any) -> str:
    number = from_json_float(value)
    return "-" if number is None else f"{number:.2f} dB"


def _has_accuracy(r: dict[str, Any]) -> bool:
    """Whether an output holds class scores or one probability per sample (labels score it)."""
    kinds = [o.get("kind") for o in r.get("output_agreement", {}).values()]
    return any(k in ("class", "decision", "unknown") for k in kinds)


def _render_table(r: dict[str, Any], limit: int) -> None:
    head = f"[bold]{escape(r['path'])}[/bold]  {r['num_tensors']} tensors, "
    head += escape(f"algorithm {r['algorithm']}")
    if r.get("trt_version"):
        head += f", TensorRT {r['trt_version']}"
    if r.get("method"):
        head += escape(f", method {r['method']}")
    console.print(head)
    t = Table(show_lines=False)
    t.add_column("tensor")
    t.add_column("amax", justify="right")
    t.add_column("scale", justify="right")
    for e in r["tensors"][:limit]:
        t.add_row(escape(e["name"]), f"{e['amax']:.6g}", f"{e['scale']:.6g}")
    console.print(t)
    if len(r["tensors"]) > limit:
        console.print(f"... {len(r['tensors']) - limit} more (use --limit or --json)")
    if r["invalid"]:
        console.print(
            f"[yellow]{len(r['invalid'])} entries are zero/negative/Inf/NaN:[/yellow] "
            + escape(", ".join(r["invalid"][:10]))
        )
    if "missing" in r:
        if r.get("model_mismatch"):
            console.print("[yellow]this table was made for another model (hash differs)[/yellow]")
        console.print(
            f"the model has {len(r['missing'])} tensors the table lacks "
            f"({len(r['missing_quantizable'])} of them inputs of quantizable ops); "
            f"the table has {len(r['extra'])} tensors the model lacks"
        )
        for label, names in (("missing", r["missing"]), ("extra", r["extra"])):
            if names:
                console.print(
                    f"  {label}: "
                    + escape(", ".join(names[:20]))
                    + (" ..." if len(names) > 20 else "")
                )


def _render_stats(r: dict[str, Any], limit: int) -> None:
    console.print(
        f"[bold]{escape(r['path'])}[/bold]  {len(r['tensors'])} tensors, "
        f"{r['num_samples']} samples, model {r['model_hash'][:12]}, "
        f"data {r['data_fingerprint'][:12]}"
    )
    t = Table()
    t.add_column("tensor")
    t.add_column("min", justify="right")
    t.add_column("max", justify="right")
    for m in r["methods"]:
        t.add_column(m, justify="right")
    for e in r["tensors"][:limit]:
        cells = ["NaN/Inf" if v is None else f"{v:.5g}" for v in e["amax"].values()]
        t.add_row(escape(e["name"]), f"{e['min']:.5g}", f"{e['max']:.5g}", *cells)
    console.print(t)
    if len(r["tensors"]) > limit:
        console.print(f"... {len(r['tensors']) - limit} more (use --limit or --json)")
