"""``quantbench compare A B``: per-layer drift, task metrics and latency against FP32.

One pass over the evaluation data. Per batch: the FP32 reference runs once with every compared
tensor exposed *and* the isolated copies of each candidate's quantized (or FP16) ops appended
(:mod:`quantbench.evaluate.isolated`); each non-reference candidate runs once with the same tensors
exposed. Streaming accumulators (:mod:`quantbench.evaluate.metrics`) keep memory flat in
the number of samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.backends.ortdevice import DeviceOutputRunner
from quantbench.choose.clipguard import DEFAULT_SQNR_FLOOR_DB, OpDrift, sqnr_flags, sqnr_warning
from quantbench.compare.candidates import CalibrationContext, Candidate, resolve
from quantbench.compare.devicedrift import DeviceDrift, device_arrays, to_host
from quantbench.compare.latency import measure_latency
from quantbench.data.sources import DataSource, Feed, feed_num_samples
from quantbench.errors import QuantbenchError
from quantbench.evaluate.isolated import (
    IsolatedModel,
    build_isolated,
    build_isolated_fp16,
    rename_twins,
    uncast,
)
from quantbench.evaluate.metrics import (
    DECISION_THRESHOLD,
    DRIFT_KEYS,
    MASK_IOU,
    SEQUENCE_KEYS,
    ClipCounter,
    DriftAccumulator,
    OutputLayout,
    OutputsAccumulator,
    labels_accuracy_reason,
)
from quantbench.evaluate.task_metrics import MetricScript, MetricSession
from quantbench.fp16 import FP16, FP16_EMULATED, has_fp16_qdq
from quantbench.jsonsafe import from_json_float, json_float
from quantbench.model.graph import QDQ_OPS, Graph, node_labels, second_stage_quantizers
from quantbench.progress import info, progress_bar, warn
from quantbench.refine import RANGE_CHANGING, refine_record, refined_passes

SIDES = ("A", "B")


@dataclass
class Side:
    """A candidate and what is compared of it."""

    key: str
    candidate: Candidate
    runner: OnnxRuntimeRunner | None = None
    tensors: list[str] = field(default_factory=list)
    isolated: dict[str, str] = field(default_factory=dict)
    accumulated: dict[str, DriftAccumulator] = field(default_factory=dict)
    isolated_acc: dict[str, DriftAccumulator] = field(default_factory=dict)
    outputs: OutputsAccumulator | None = None
    script: MetricSession | None = None
    clip: dict[str, tuple[str, float]] = field(default_factory=dict)
    clip_acc: dict[str, ClipCounter] = field(default_factory=dict)
    pairing: dict[str, str] = field(default_factory=dict)
    #: tensors an NMS/NonZero chose from, judged beside the outputs (both sides compute them)
    chosen_from: list[str] = field(default_factory=list)
    #: reference tensor -> the candidate tensor holding its value under another name, and the
    #: op type of the candidate node behind it (:func:`_dequantized_outputs`)
    aliases: dict[str, str] = field(default_factory=dict)
    alias_ops: dict[str, str] = field(default_factory=dict)

    def fetched(self, tensor: str) -> str:
        """The candidate's name of reference tensor ``tensor``."""
        return self.aliases.get(tensor, tensor)


@dataclass
class CompareResult:
    document: dict[str, Any]

    @property
    def passed(self) -> bool:
        return bool(self.document.get("passed", True))


def _layer_tensors(
    graph: Graph, candidate: onnx.ModelProto, aliases: dict[str, str] | None = None
) -> list[str]:
    """Reference node outputs that the candidate also computes, in network order."""
    cand = {o for n in candidate.graph.node if n.op_type not in QDQ_OPS for o in n.output}
    cand |= set(aliases or ())
    out = []
    for n in graph.model.graph.node:
        for o in n.output:
            if o and o in cand and graph.is_float(o) and o not in graph.constants:
                out.append(o)
    return out


def _dequantized_outputs(
    graph: Graph, candidate: onnx.ModelProto
) -> tuple[dict[str, str], dict[str, str]]:
    """Reference tensor -> candidate tensor, where the candidate's node of the same name outputs
    integers under another name and one DequantizeLinear turns them back into floats: that DQ's
    output is the layer's output (the INT8 DWConv2D plugin form, ``Q -> DWConv2D -> DQ``, whose
    requantization a row then measures); and reference tensor -> that node's op type."""
    reference = {n.name: n for n in graph.model.graph.node if n.name}
    present = {o for n in candidate.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in candidate.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    aliases: dict[str, str] = {}
    ops: dict[str, str] = {}
    for n in candidate.graph.node:
        ref = reference.get(n.name)
        if ref is None or n.op_type in QDQ_OPS or len(n.output) != 1 or len(ref.output) != 1:
            continue
        ours, theirs = ref.output[0], n.output[0]
        if ours == theirs or ours in present or not graph.is_float(ours):
            continue
        after = readers.get(theirs, [])
        if len(after) == 1 and after[0].op_type == "DequantizeLinear":
            aliases[ours] = after[0].output[0]
            ops[ours] = n.op_type
    return aliases, ops


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    return {*(i.name for i in g.input), *(o for n in g.node for o in n.output)}


def _quantized_inputs(
    model: onnx.ModelProto, reference: set[str]
) -> dict[str, tuple[str, float]]:
    """op output -> (its first Q/DQ'd data input as the reference names it, amax) for every
    quantized op (Casts an FP16 conversion put before a Q are looked through; the model's own
    Casts, e.g. bool -> float, are not); the second stage of a two-stage activation, which
    quantizes a residual the reference lacks, is left out."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    second = {q.output[0] for q in second_stage_quantizers(model)}  # no tensor of the reference
    out: dict[str, tuple[str, float]] = {}
    for n in model.graph.node:
        if n.op_type in QDQ_OPS or not n.input:
            continue
        dq = producer.get(n.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] in second:
            continue
        q = producer.get(dq.input[0])
        scale = inits.get(dq.input[1]) if len(dq.input) > 1 else None
        if q is None or q.op_type != "QuantizeLinear" or scale is None or scale.size != 1:
            continue
        amax = float(np.float32(scale.reshape(-1)[0]) * np.float32(127))
        source = q.input[0] if q.input[0] in reference else uncast(q.input[0], producer)
        if source not in reference:  # a tensor a refinement added (smoothing's Mul)
            continue
        out[n.output[0]] = (source, amax)
    return out


def _elem_types(graph: Graph, names: list[str]) -> dict[str, int]:
    return {n: graph.elem_types.get(n, onnx.TensorProto.FLOAT) for n in names}


def prepare_sides(
    graph: Graph,
    cands: list[Candidate],
    provider: str | None,
    threads: int | None,
    device: ModuleType | None = None,
) -> tuple[OnnxRuntimeRunner, list[str], list[Side]]:
    """Build the reference runner (with isolated copies) and one runner per candidate
    (``device``: CuPy, whose runners leave their outputs on the GPU, :mod:`.devicedrift`)."""
    runner = OnnxRuntimeRunner if device is None else partial(DeviceOutputRunner, cupy=device)
    sides = [Side(k, c) for k, c in zip(SIDES, cands)]
    ref_model = graph.model
    ref_tensors: set[str] = set()
    isolated_twins: dict[str, str] = {}
    for side in sides:
        c = side.candidate
        if c.backend != "onnxruntime":
            raise QuantbenchError(
                f"{c.spec}: comparing TensorRT engines needs the TensorRT backend "
                "(--backend tensorrt), which is not available here"
            )
        if c.is_reference:
            continue
        _check_same_inputs(c, graph)
        _note_narrowed_inputs(c, graph)
        side.aliases, side.alias_ops = _dequantized_outputs(graph, c.model)
        rescaled = _rescaled(c, graph)
        layers = _layer_tensors(graph, c.model, side.aliases)
        side.tensors = [t for t in layers if t not in rescaled]
        if not set(side.tensors) - {o.name for o in graph.model.graph.output}:
            warn(f"{c.label}: shares no tensor names with the FP32 model; comparing outputs only")
        ref_tensors.update(side.tensors)
        iso: IsolatedModel | None = None
        if c.quantized:
            iso = build_isolated(ref_model, c.model, f"qb_iso_{side.key}/")
        elif c.fp16 is not None:
            fp16_nodes = [n for n, p in c.fp16.precision.items() if p in (FP16, FP16_EMULATED)]
            iso = build_isolated_fp16(
                ref_model, fp16_nodes, graph.elem_types, f"qb_iso_{side.key}/"
            )
        if iso is not None:
            ref_model = iso.model
            rename_twins(ref_model, iso.twins, side.key)
            moved = _touching(graph, rescaled)
            twins = {t: tw for t, tw in iso.twins.items() if t not in moved}
            side.isolated = {t: f"{side.key}:{twin}" for t, twin in twins.items()}
            isolated_twins.update({f"{side.key}:{twin}": t for t, twin in twins.items()})
        if c.quantized:
            clip = _quantized_inputs(c.model, _tensor_names(graph.model))
            side.clip = {t: v for t, v in clip.items() if v[0] not in rescaled}
            ref_tensors.update(src for src, _ in side.clip.values())
    out_names = [o.name for o in graph.model.graph.output]
    ordered = [t for t in _layer_tensors(graph, graph.model) if t in ref_tensors]
    ordered += [
        t for t in ref_tensors if t not in ordered and t not in {s.name for s in graph.inputs}
    ]
    ref_fetch = list(dict.fromkeys(out_names + ordered + list(isolated_twins)))
    types = _elem_types(graph, ordered + out_names)
    types.update({twin: types.get(t, onnx.TensorProto.FLOAT) for twin, t in isolated_twins.items()})
    ref_runner = runner(
        expose(ref_model, ref_fetch, types),
        provider=provider,
        threads=threads,
        generated_from=graph.model,
    )
    for side in sides:
        if side.candidate.is_reference:
            continue
        fetched = [side.fetched(t) for t in side.tensors]
        cand_fetch = list(dict.fromkeys(_output_names(side.candidate.model) + fetched))
        side.runner = runner(
            expose(side.candidate.model, cand_fetch, _elem_types(graph, cand_fetch)),
            provider=provider,
            threads=threads,
            optimization="none" if has_fp16_qdq(side.candidate.model) else "all",
            generated_from=_origin(side.candidate, graph),
        )
        side.accumulated = {t: DriftAccumulator() for t in side.tensors}
        side.isolated_acc = {t: DriftAccumulator() for t in side.isolated}
        side.clip_acc = {t: ClipCounter(amax) for t, (_, amax) in side.clip.items()}
    return ref_runner, ref_fetch, sides


def _rescaled(candidate: Candidate, graph: Graph) -> set[str]:
    """Tensors ``candidate``'s model computes scaled per channel against ``graph``'s under the
    same names (equalization, smoothing folded into a LayerNorm: its refinement record's
    ``rescaled``), said once; none where ``graph`` is itself a refined model (the FP32 model
    ``quantize --refined-model`` wrote holds them scaled alike)."""
    record = refine_record(candidate.model) if candidate.model is not None else None
    if record is None or refined_passes(graph.model):
        return set()
    kept = [str(k) for k in record.get("kept") or []]
    if "rescaled" not in record and any(k.split(":")[0] in RANGE_CHANGING for k in kept):
        warn(
            f"{candidate.label}: refined by {', '.join(kept)} by an earlier quantbench, whose "
            "record does not list the tensors it rescaled: the per-layer drift of those "
            "compares unlike values (quantize again, or give the refined FP32 model as --model)"
        )
    rescaled = {t for t in record.get("rescaled") or [] if isinstance(t, str)}
    if rescaled:
        passes = ", ".join(kept) or "a refinement"
        info(
            f"{candidate.label}: refined by {passes}: {len(rescaled)} of its tensors hold "
            f"channel-rescaled values, so their per-layer drift against the unrefined FP32 "
            f"model is not shown (the outputs are compared as always); give the refined FP32 "
            f"model (quantize --refined-model) as --model to see every layer"
        )
    return rescaled


def _touching(graph: Graph, rescaled: set[str]) -> set[str]:
    """The outputs of the ops that write or read a rescaled tensor: their isolated twins (the
    candidate's op on the reference's inputs) would compare unlike values."""
    if not rescaled:
        return set()
    return {
        o for n in graph.model.graph.node
        if rescaled.intersection(n.output) or rescaled.intersection(n.input) for o in n.output
    }  # fmt: skip


def _check_same_inputs(candidate: Candidate, graph: Graph) -> None:
    """A candidate fed other inputs, or giving other outputs, than ``--model``'s was made from
    another model: it cannot be compared (and its ops cannot be isolated in the reference)."""
    weights = {i.name for i in candidate.model.graph.initializer}
    sides = (
        ("inputs", [i.name for i in candidate.model.graph.input if i.name not in weights],
         [s.name for s in graph.inputs]),
        ("outputs", [o.name for o in candidate.model.graph.output],
         [o.name for o in graph.model.graph.output]),
    )  # fmt: skip
    for what, theirs, ours in sides:
        if sorted(theirs) != sorted(ours):
            raise QuantbenchError(
                f"{candidate.label}: its {what} ({', '.join(theirs) or 'none'}) are not those "
                f"of {graph.path.name if graph.path else 'the model'} ({', '.join(ours)}): "
                "compare a candidate made from the --model it is given with"
            )


def _note_narrowed_inputs(candidate: Candidate, graph: Graph) -> None:
    """Says once that a candidate taking an input in a narrower float type than ``--model``
    (an FP16 model against FP32) is fed the data rounded to that type, as it would be."""
    ours = {s.name: np.dtype(s.dtype) for s in graph.inputs}
    narrowed = []
    for v in candidate.model.graph.input:
        want = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type or 1)
        have = ours.get(v.name)
        if have is not None and want.kind == have.kind == "f" and want.itemsize < have.itemsize:
            narrowed.append(f"{v.name!r} as {want.name}")
    if narrowed:
        warn(
            f"{candidate.label} takes input {', '.join(narrowed)}: it is fed the data rounded "
            "to that type"
        )


def _output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def _pair_outputs(ref_outputs: list[str], cand_outputs: list[str]) -> dict[str, str]:
    """Outputs match by name, else by position when the counts agree."""
    if set(ref_outputs) <= set(cand_outputs):
        return {o: o for o in ref_outputs}
    if len(ref_outputs) == len(cand_outputs):
        return dict(zip(ref_outputs, cand_outputs))
    raise QuantbenchError(
        f"outputs differ: reference has {', '.join(ref_outputs)}, "
        f"candidate has {', '.join(cand_outputs)}"
    )


def run_comparison(
    graph: Graph,
    source: DataSource,
    specs: tuple[str, str],
    ctx: CalibrationContext,
    *,
    labels: np.ndarray | None = None,
    metric_script: MetricScript | None = None,
    provider: str | None = None,
    threads: int | None = None,
    latency: bool = True,
    latency_runs: int = 100,
    show_progress: bool = True,
    sqnr_floor: float = DEFAULT_SQNR_FLOOR_DB,
    mask_threshold: float = DECISION_THRESHOLD,
) -> dict[str, Any]:
    """Everything ``compare`` measures, as the ``layers/outputs/task/latency/flags`` parts
    (``mask_threshold``: where a probability map's values count as decided)."""
    cands = [resolve(s, graph, ctx) for s in specs]
    xp = device_arrays(provider)
    drift = DeviceDrift(xp) if xp is not None else None
    ref_runner, ref_fetch, sides = prepare_sides(graph, cands, provider, threads, xp)
    ref_out = _output_names(graph.model)
    usable = not labels_accuracy_reason(labels)
    layout = OutputLayout.of(graph.model, source.unbatched, mask_threshold)
    extra = layout.judged_tensors()[1]
    for side in sides:
        if metric_script is not None:
            side.script = metric_script.session()
        if side.runner is not None:
            pairing = _pair_outputs(ref_out, _output_names(side.candidate.model))
            side.chosen_from = [t for t in extra if t in side.tensors]
            judged = [*pairing, *side.chosen_from]
            side.outputs = OutputsAccumulator(judged, labels_usable=usable, layout=layout)
            side.pairing = pairing
    hosted = [*ref_out, *(t for t in extra if any(t in s.chosen_from for s in sides))]
    label_iter = _label_batches(labels)
    acc_ref = OutputsAccumulator(ref_out, labels_usable=usable, layout=layout)
    seen = 0
    first_feed: Feed | None = None
    with progress_bar("Comparing", total=source.num_samples, show=show_progress) as advance:
        for feed in source.batches():
            first_feed = first_feed or feed
            n = feed_num_samples(feed, graph.inputs)
            lab = label_iter(n) if labels is not None else None
            ref = ref_runner.infer(feed, ref_fetch)
            ref.update(feed)
            ref_host = ref if drift is None else {o: to_host(ref[o]) for o in hosted}
            acc_ref.update(ref_host, ref_host, lab, n)
            for side in sides:
                _update_side(side, ref, ref_out, feed, lab, n, drift, ref_host)
            seen += n
            advance(n)
    if seen == 0:
        raise QuantbenchError(f"{source.description}: the evaluation data set is empty")
    if labels is not None and seen != len(labels):
        raise QuantbenchError(f"labels: {len(labels)} labels for {seen} evaluation samples")
    if drift is not None:
        drift.finish()
    doc = _document(graph, sides, ref_out, acc_ref, labels)
    doc["sqnr_floor_db"] = sqnr_floor
    doc["flags"] = _floor_flags(sides, doc["layers"], ctx, sqnr_floor)
    if metric_script is not None:
        doc["metric_script"] = metric_script.where
    doc["eval_samples"] = seen
    for side in sides:
        c = side.candidate
        doc[side.key.lower()] = {
            "spec": c.spec,
            "label": c.label,
            **(side.runner or ref_runner).info.to_dict(),  # how its own session ran
            "method": c.method,
            **c.precision_record(),
        }
    if refinement := _refinement(sides):
        doc["refinement"] = refinement
    quantized = [s.candidate for s in sides if s.candidate.quantized]
    doc["excluded"] = quantized[-1].excluded if quantized else []
    doc["dynamic_weight_convs"] = quantized[-1].dynamic_weight_convs if quantized else []
    doc["method_used"] = quantized[-1].method if quantized else None
    if latency and first_feed is not None:
        doc["latency"] = _latency(graph, sides, first_feed, provider, threads, latency_runs)
    return doc


def _refinement(sides: list[Side]) -> dict[str, Any]:
    """Per side (``A``/``B``) the refinement record its model carries in its metadata
    (:func:`quantbench.refine.refine_record`: a Q/DQ model ``quantize`` refined), as stored."""
    found: dict[str, Any] = {}
    for side in sides:
        model = side.candidate.model
        if model is not None and (record := refine_record(model)) is not None:
            found[side.key] = record
    return found


def _floor_flags(
    sides: list[Side], layers: list[dict[str, Any]], ctx: CalibrationContext, floor: float
) -> list[dict[str, Any]]:
    """The clipping guard's SQNR rule on every quantized op's isolated SQNR, printed grouped by
    candidate, as the JSON ``flags``."""
    out: list[dict[str, Any]] = []
    for side in sides:
        ops = [
            OpDrift(
                r["node"],
                r["op_type"],
                r["tensor"],
                side.clip[r["tensor"]][0],
                side.clip[r["tensor"]][1],
                sqnr,
                r.get("clip_fraction"),
            )
            for r in layers
            if r["candidate"] == side.key
            and r["view"] == "isolated"
            and r["tensor"] in side.clip
            and (sqnr := from_json_float(r.get("sqnr_db"))) is not None  # null: not measured
        ]
        flags = sqnr_flags(ops, floor, ctx.stats, side.candidate.table)
        if text := sqnr_warning(flags, side.candidate.spec, listed_by="--json FILE"):
            warn(text)
        for f in flags:
            row = {"candidate": side.key, **f.to_dict()}
            out.append({k: _clean(v) if isinstance(v, float) else v for k, v in row.items()})
    return out


def _label_batches(labels: np.ndarray | None):
    pos = 0

    def take(n: int) -> np.ndarray:
        nonlocal pos
        assert labels is not None
        chunk = labels[pos : pos + n]
        pos += n
        if len(chunk) != n:
            raise QuantbenchError(
                f"labels: only {len(labels)} labels, more evaluation samples than that"
            )
        return chunk

    return take


def _update_side(
    side: Side,
    ref: dict[str, Any],
    ref_out: list[str],
    feed: Feed,
    labels: np.ndarray | None,
    batch: int,
    drift: DeviceDrift | None = None,
    ref_host: dict[str, np.ndarray] | None = None,
) -> None:
    """One batch (``batch`` samples) of one side. ``drift``: the tensors are on the GPU; the
    per-layer sums are taken there (``ref_host``: the reference's outputs, on the host for the
    output metrics)."""
    ref_outputs = {o: (ref_host or ref)[o] for o in ref_out}
    if side.runner is None:  # the FP32 reference itself: a metric script scores FP32 vs FP32
        if side.script is not None:
            side.script.update(ref_outputs, ref_outputs, labels)
        return
    fetch = [*side.pairing.values(), *(side.fetched(t) for t in side.tensors)]
    got = side.runner.infer(feed, list(dict.fromkeys(fetch)))
    if drift is not None:
        _queue_drift(side, ref, got, drift)
        got = {t: to_host(got[t]) for t in [*side.pairing.values(), *side.chosen_from]}
    else:
        _host_drift(side, ref, got)
    cand_outputs = {ro: got[co] for ro, co in side.pairing.items()}
    assert side.outputs is not None
    chosen = side.chosen_from  # judged beside the outputs; a metric script sees outputs only
    side.outputs.update(
        {**ref_outputs, **{t: (ref_host or ref)[t] for t in chosen}},
        {**cand_outputs, **{t: got[t] for t in chosen}},
        labels,
        batch,
    )
    if side.script is not None:
        side.script.update(ref_outputs, cand_outputs, labels)


def _host_drift(side: Side, ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    for t, acc in side.accumulated.items():
        acc.update(ref[t], got[side.fetched(t)])
    for t, acc in side.isolated_acc.items():
        acc.update(ref[t], ref[side.isolated[t]])
    for t, acc in side.clip_acc.items():
        src = side.clip[t][0]
        if src in ref:
            acc.update(ref[src])


def _queue_drift(side: Side, ref: dict[str, Any], got: dict[str, Any], drift: DeviceDrift) -> None:
    """:func:`_host_drift` on the GPU: both views and the clipping counts in one pass."""
    for t, acc in side.accumulated.items():
        drift.add(acc, ref[t], got[side.fetched(t)])
    for t, acc in side.isolated_acc.items():
        drift.add(acc, ref[t], ref[side.isolated[t]])
    for t, acc in side.clip_acc.items():
        src = side.clip[t][0]
        if src in ref:
            drift.add_clip(acc, ref[src])
    drift.run()


def _origin(candidate: Candidate, graph: Graph) -> onnx.ModelProto | None:
    """The user's model a candidate was built from (fp16, int8): onnxruntime failing on the
    candidate while loading this is quantbench's fault. A user-given .onnx is its own origin."""
    if candidate.spec.lower() in ("fp16",) or candidate.spec.lower().startswith("int8"):
        return graph.model
    return candidate.model


def _node_of(graph: Graph) -> dict[str, tuple[str, str]]:
    labels = node_labels(graph.model.graph.node)
    return {
        o: (labels[i], n.op_type) for i, n in enumerate(graph.model.graph.node) for o in n.output
    }


def _plugin_labels(side: Side) -> dict[str, str]:
    """Tensor -> ``"DWConv2D (plugin op, cpu)"`` (or ``(lowered to standard ONNX)``) for the
    outputs of the candidate's plugin ops, as its session ran them: a layer row then says
    whose arithmetic it measured."""
    how = side.runner.info.custom_ops if side.runner is not None else {}
    words = {"lowered": "lowered to standard ONNX"}
    ops = {o: n.op_type for n in side.candidate.model.graph.node for o in n.output}
    ops.update(side.alias_ops)
    return {t: f"{op} ({words.get(how[op], how[op])})" for t, op in ops.items() if op in how}


def _clean(v: float | None) -> float | None | str:
    return None if v is None else json_float(v)


def _document(
    graph: Graph,
    sides: list[Side],
    ref_out: list[str],
    acc_ref: OutputsAccumulator,
    labels: np.ndarray | None,
) -> dict[str, Any]:
    nodes = _node_of(graph)
    order = {t: i for i, t in enumerate(o for n in graph.model.graph.node for o in n.output)}
    layers: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for side in sides:
        if side.runner is None:
            continue
        plugin_ops = _plugin_labels(side)
        for view, accs in (("accumulated", side.accumulated), ("isolated", side.isolated_acc)):
            for t, acc in accs.items():
                node, op = nodes.get(t, (t, ""))
                op = plugin_ops.get(t, op)
                row: dict[str, Any] = {
                    "candidate": side.key,
                    "index": order.get(t, -1),
                    "tensor": t,
                    "node": node,
                    "op_type": op,
                    "view": view,
                    "quantized": side.candidate.quantized and t in side.isolated,
                    "precision": side.candidate.precisions.get(node),
                }
                row.update(_drift_row(acc))
                clip = side.clip_acc.get(t)
                row["clip_fraction"] = clip.fraction if clip else None
                row["amax"] = side.clip[t][1] if t in side.clip else None
                layers.append(row)
        assert side.outputs is not None
        for o, metrics in side.outputs.rows().items():
            row = {"candidate": side.key, "name": o, **metrics}
            if side.outputs.drift[o].n and not side.outputs.drift[o].defined:
                row.update({k: UNDEFINED for k in DRIFT_KEYS})
                if row["agreement_kind"]:
                    row.update({k: UNDEFINED for k in ("agreement", "top5_agreement")})
                if row["agreement_kind"] == "position":
                    row.update({k: UNDEFINED for k in SEQUENCE_KEYS if row.get(k) is not None})
                if row.get("mask_threshold") is not None:
                    row[MASK_IOU] = UNDEFINED
            outputs.append(row)
    layers.sort(key=lambda r: (r["candidate"], r["index"], r["view"]))
    return {
        "layers": layers,
        "outputs": [
            {k: _clean(v) if isinstance(v, float) else v for k, v in r.items()} for r in outputs
        ],
        "task": _task(sides, acc_ref, labels),
        "ranking": _ranking(layers),
    }


#: JSON text of an undefined metric (a tensor holding NaN/Inf); ``null`` = not applicable.
UNDEFINED = "nan"


def _drift_row(acc: DriftAccumulator) -> dict[str, Any]:
    """Drift metrics of one layer (``"nan"`` when undefined) and its NaN/Inf counts."""
    metrics = acc.metrics()
    row: dict[str, Any] = {
        k: (UNDEFINED if acc.n and not acc.defined else _clean(metrics[k])) for k in DRIFT_KEYS
    }
    row["nonfinite"] = acc.nonfinite()
    if acc.mismatched:  # a variable-size tensor: its values do not pair up
        row["shape_mismatches"] = acc.mismatched
    return row


def _task(
    sides: list[Side], acc_ref: OutputsAccumulator, labels: np.ndarray | None
) -> dict[str, Any]:
    """``accuracy`` (integer labels, a class-score output) and the metric script's numbers, each
    as ``{A, B, delta}``."""
    task: dict[str, dict[str, float | None]] = {}
    ref_acc = acc_ref.accuracy()
    if labels is not None and ref_acc is not None:
        for side in sides:
            acc = ref_acc if side.outputs is None else side.outputs.accuracy()
            task.setdefault("accuracy", {})[side.key] = (
                None if acc is None else (acc["A"] if side.outputs is None else acc["B"])
            )
    elif labels is not None:
        reason = labels_accuracy_reason(labels) or "no output holds class scores [N, C]"
        who = "the metric script only" if sides and sides[0].script else "nothing"
        warn(f"labels: accuracy not computed ({reason}); the labels feed {who}")
    for side in sides:
        if side.script is not None:
            for name, value in side.script.compute().items():
                task.setdefault(name, {})[side.key] = value
    for entry in task.values():
        a, b = entry.get("A"), entry.get("B")
        entry["delta"] = None if a is None or b is None else b - a
    return task


def _ranking(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Layers worst first by isolated SQNR (the error each adds by itself)."""

    def key(r: dict[str, Any]) -> float:
        v = from_json_float(r.get("sqnr_db"))  # undefined (NaN) ranks worst, unknown last
        return math.inf if v is None else (-math.inf if math.isnan(v) else v)

    iso = [r for r in layers if r["view"] == "isolated"]
    acc = {(r["candidate"], r["tensor"]): r for r in layers if r["view"] == "accumulated"}
    out = []
    for rank, r in enumerate(sorted(iso, key=key)):
        a = acc.get((r["candidate"], r["tensor"]))
        out.append(
            {
                "rank": rank + 1,
                "candidate": r["candidate"],
                "tensor": r["tensor"],
                "node": r["node"],
                "op_type": r["op_type"],
                "isolated_sqnr_db": r.get("sqnr_db"),
                "accumulated_sqnr_db": a.get("sqnr_db") if a else None,
            }
        )
    return out


def _latency(
    graph: Graph,
    sides: list[Side],
    feed: Feed,
    provider: str | None,
    threads: int | None,
    runs: int,
) -> dict[str, Any]:
    bs = feed_num_samples(feed, graph.inputs)
    out: dict[str, Any] = {}
    for side in sides:
        runner = OnnxRuntimeRunner(
            side.candidate.model, provider, threads, generated_from=_origin(side.candidate, graph)
        )
        stats = measure_latency(runner.infer, feed, bs, runs=runs)
        stats.update(runner.info.to_dict())
        out[side.key] = stats
        runner.close()
    return out
