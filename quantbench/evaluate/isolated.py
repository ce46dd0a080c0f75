"""The *isolated* view in one pass: every quantized (or FP16) op re-run beside the FP32 graph.

For each op that the candidate (a Q/DQ model) quantizes, a copy of the op is appended to the
FP32 reference graph. The copy reads the *FP32* tensors of the reference, passes them through
the candidate's own QuantizeLinear/DequantizeLinear parameters, and writes ``<tensor>::isolated``.
One run of this model therefore yields, for every quantized op, the error it adds by itself
(quantize only that layer, with FP32 inputs) next to the accumulated error of the candidate —
no per-layer models, no second pass over the data per layer.

The same for an FP16 candidate (:func:`build_isolated_fp16`): each op that runs in FP16 is copied
with every float input taken from the FP32 reference and rounded to FP16, and its output rounded
to FP16 too — the error that op's FP16 storage adds by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from quantbench.memo import memo_scope
from quantbench.model.graph import QDQ_OPS, node_labels, second_stage_quantizers
from quantbench.model.opsetconvert import convert_version

SUFFIX = "::isolated"
_PREFIX = "qb_iso/"


@dataclass
class IsolatedModel:
    model: onnx.ModelProto
    #: reference tensor -> its isolated twin
    twins: dict[str, str] = field(default_factory=dict)
    #: reference tensor -> name of the quantized op that produces it
    ops: dict[str, str] = field(default_factory=dict)


def rename_twins(model: onnx.ModelProto, twins: dict[str, str], key: str) -> dict[str, str]:
    """Prefixes ``key:`` to ``twins``' names in ``model``, so that the twins of several
    candidates (compare's A and B, auto's methods) can share one reference graph; returns
    reference tensor -> renamed twin."""
    rename = {twin: f"{key}:{twin}" for twin in twins.values()}
    for n in model.graph.node:
        for i, o in enumerate(n.output):
            if o in rename:
                n.output[i] = rename[o]
    return {t: rename[twin] for t, twin in twins.items()}


def _opset(m: onnx.ModelProto) -> int:
    return next((i.version for i in m.opset_import if i.domain in ("", "ai.onnx")), 0)


@dataclass
class SharedConstants:
    """What the isolated copies of several candidates built into one reference graph may
    share: constants equal by name and value (a weight's values, scales and zero points are the
    same in every calibration table's Q/DQ model) and the Quantize/DequantizeLinear nodes
    reading the same inputs. One copy of each weight, not one a candidate: onnxruntime folds
    each Q/DQ of a constant into a float tensor of its own (MiniLM-L3's 66 MB, once a table);
    an activation two tables give the same scale is quantized once too."""

    #: candidate constant name -> (its name in the isolated model, a copy of the candidate's tensor)
    constants: dict[str, tuple[str, onnx.TensorProto]] = field(default_factory=dict)
    #: a Q or DQ node (its type and attributes, then its inputs) -> its output in the model
    nodes: dict[tuple[str, ...], str] = field(default_factory=dict)
    #: an isolated op copy (its type and attributes, then its inputs) -> its twin's name in the
    #: model: a copy another candidate built on the very same inputs is not built again (two
    #: tables giving an op's inputs the same scales give it the same twin)
    ops: dict[tuple[str, ...], str] = field(default_factory=dict)


class _Builder:
    def __init__(
        self,
        reference: onnx.ModelProto,
        candidate: onnx.ModelProto,
        prefix: str,
        shared: SharedConstants | None = None,
    ):
        self.shared = shared
        self.prefix = prefix
        self.ref = reference
        self.cand = candidate
        self.cand_producer = {o: n for n in candidate.graph.node for o in n.output}
        self.cand_inits = {i.name: i for i in candidate.graph.initializer}
        self.ref_tensors = (
            {i.name for i in reference.graph.input}
            | {i.name for i in reference.graph.initializer}
            | {o for n in reference.graph.node for o in n.output}
        )
        self.ref_producer = {o: n for n in reference.graph.node for o in n.output}
        self._two_stages(candidate)
        self.nodes: list[onnx.NodeProto] = []
        #: op copies built here: (their key in ``shared.ops``, their twin's name here)
        self.built_ops: list[tuple[tuple[str, ...], str]] = []
        #: reference tensor -> the twin an earlier candidate built for the same op copy
        self.reused: dict[str, str] = {}
        self.rebuilt: dict[str, str] = {}  # candidate DQ output -> its rebuilt twin (fan-out)
        self.inits: dict[str, onnx.TensorProto] = {}
        self.const_nodes: dict[str, onnx.NodeProto] = {
            o: n for n in candidate.graph.node if n.op_type == "Constant" for o in n.output
        }

    def constant(self, name: str) -> str | None:
        """Copy a candidate initializer/Constant under a private name; None if not constant.
        FP16 values (a strongly-typed candidate) are copied as FP32: the copy runs on the FP32
        reference's tensors, and every FP16 value is exact in FP32."""
        if name == "":
            return ""
        if name in self.cand_inits and self.shared is not None:
            known = self.shared.constants.get(name)
            if known is not None and known[1] == self.cand_inits[name]:
                return known[0]  # an earlier candidate's copy of the same constant
        if name in self.cand_inits:
            new = self.prefix + name
            if new not in self.inits:
                t = onnx.TensorProto()
                t.CopyFrom(_as_fp32(self.cand_inits[name]))
                t.name = new
                self.inits[new] = t
                if self.shared is not None:  # a copy: a sub-message would keep its model alive
                    kept = onnx.TensorProto()
                    kept.CopyFrom(self.cand_inits[name])
                    self.shared.constants.setdefault(name, (new, kept))
            return new
        if name in self.const_nodes:
            new = self.prefix + name
            if new not in self.inits:
                node = onnx.NodeProto()
                node.CopyFrom(self.const_nodes[name])
                for attr in node.attribute:
                    if attr.name == "value":
                        attr.t.CopyFrom(_as_fp32(attr.t))
                node.output[0] = new
                node.name = self.prefix + (node.name or new)
                self.nodes.append(node)
                self.inits[new] = onnx.TensorProto()  # marker: already emitted
            return new
        return None

    def source(self, name: str) -> str | None:
        """A tensor the isolated copy can read: the reference's FP32 tensor or a constant."""
        if name not in self.ref_tensors:  # a Cast the FP16 conversion added, not the model's own
            name = uncast(name, self.cand_producer)
        if name in self.ref_tensors:
            return name
        return self.constant(name)

    def dequantized(self, tensor: str) -> str | None:
        """Rebuild ``Q -> DQ`` (or ``DQ`` of a constant) of the candidate on reference inputs."""
        if tensor in self.rebuilt:
            return self.rebuilt[tensor]
        dq = self.cand_producer[tensor]
        q = self.cand_producer.get(dq.input[0])
        src = None
        if q is not None and q.op_type == "QuantizeLinear":
            src = self.source(q.input[0])
            if src is None:
                return None
            q_inputs = [src] + [self.constant(i) for i in q.input[1:]]
            if None in q_inputs:
                return None
            dq_in = self._emit(q, q_inputs, self.prefix + q.output[0])
        else:
            dq_in = self.constant(dq.input[0])
            if dq_in is None:
                return None
        dq_inputs = [dq_in] + [self.constant(i) for i in dq.input[1:]]
        if None in dq_inputs:
            return None
        out = self._emit(dq, dq_inputs, self.prefix + dq.output[0])
        if tensor in self.second_of and src is not None:
            out = self._with_second_stage(tensor, src, out)
        self.rebuilt[tensor] = out
        return out

    def _with_second_stage(self, tensor: str, src: str, x1: str) -> str | None:
        """``x1 + x2``: the candidate's second stage of ``tensor`` rebuilt on ``src - x1``."""
        dq2 = self.second_of[tensor]
        q2 = self.cand_producer[dq2.input[0]]
        sub = self.cand_producer[q2.input[0]]
        residual = self._emit(sub, [src, x1], self.prefix + sub.output[0])
        q_inputs = [residual] + [self.constant(i) for i in q2.input[1:]]
        dq_rest = [self.constant(i) for i in dq2.input[1:]]
        if None in q_inputs or None in dq_rest:
            return None
        q_out = self._emit(q2, q_inputs, self.prefix + q2.output[0])
        x2 = self._emit(dq2, [q_out, *dq_rest], self.prefix + dq2.output[0])
        both = helper.make_node("Add", [x1, x2], [tensor + "_both"], name=tensor + "_both")
        return self._emit(both, [x1, x2], self.prefix + tensor + "_both")

    def _emit(self, node: onnx.NodeProto, inputs: list[str], output: str) -> str:
        """Append a copy of ``node`` (a Q or DQ, or a two-stage Sub or Add) reading ``inputs``;
        returns its output, or an
        earlier candidate's where it built the same node on the same inputs."""
        key = (node.op_type, _attributes(node), *inputs)
        if self.shared is not None and key in self.shared.nodes:
            return self.shared.nodes[key]
        self.nodes.append(_clone(node, inputs, [output], self.prefix))
        if self.shared is not None:
            self.shared.nodes[key] = output
        return output

    def _two_stages(self, candidate: onnx.ModelProto) -> None:
        """Two-stage activations (:mod:`quantbench.refine.twostage`): each first stage's DQ
        output -> its second stage's; and each first-stage reader's output -> the reference
        tensor the Adds joining its runs give back. Its isolated copy is the reader on
        ``x1 + x2`` (the sum of its runs), named for that tensor; the runs reading a second
        stage are inside it and get no copy of their own."""
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in candidate.graph.node:
            for i in set(n.input):
                readers.setdefault(i, []).append(n)
        self.second_of: dict[str, onnx.NodeProto] = {}
        for q2 in second_stage_quantizers(candidate):
            first = self.cand_producer[q2.input[0]].input[1]
            for dq2 in readers.get(q2.output[0], []):
                self.second_of[first] = dq2
        self.second_stages = {dq2.output[0] for dq2 in self.second_of.values()}
        self.joined: dict[str, str] = {}
        for n in candidate.graph.node:
            out = n.output[0] if n.output else ""
            if out in self.ref_producer or not self.second_of:
                continue
            name, after = out, readers.get(out, [])
            while name not in self.ref_producer and len(after) == 1 and after[0].op_type == "Add":
                name = after[0].output[0]
                after = readers.get(name, [])
            if name in self.ref_producer:
                self.joined[out] = name

    def isolate(self, node: onnx.NodeProto) -> str | None:
        """Append the isolated copy of one quantized op; returns its reference output."""
        if any(i in self.second_stages for i in node.input):
            return None  # a second-stage run: inside its first stage's copy
        out = self.joined.get(node.output[0], node.output[0])
        ref = self.ref_producer.get(out)
        if ref is None or ref.op_type != node.op_type:
            return None
        mark = len(self.nodes)
        inputs: list[str] = []
        for name in node.input:
            producer = self.cand_producer.get(name)
            if producer is not None and producer.op_type == "DequantizeLinear":
                new = self.dequantized(name)
            else:
                new = self.source(name) if name else ""
            if new is None:
                del self.nodes[mark:]
                self.rebuilt = {k: v for k, v in self.rebuilt.items() if v in self._emitted()}
                return None
            inputs.append(new)
        key = (node.op_type, _attributes(node), str(len(node.output)), *inputs)
        if self.shared is not None and key in self.shared.ops:
            self.reused[out] = self.shared.ops[key]
            return out
        outputs = [o + SUFFIX if o else "" for o in [out, *node.output[1:]]]
        self.nodes.append(_clone(node, inputs, outputs, self.prefix))
        self.built_ops.append((key, outputs[0]))
        return out

    def drop_candidate(self) -> None:
        """Lets go of the candidate model once its copies are built (only they are kept)."""
        self.cand = onnx.ModelProto()
        self.cand_producer, self.cand_inits, self.const_nodes = {}, {}, {}

    def _emitted(self) -> set[str]:
        return {o for n in self.nodes for o in n.output}


def uncast(name: str, producer: Mapping[str, onnx.NodeProto]) -> str:
    """The tensor behind a chain of float Casts (a strongly-typed model casts its FP32 inputs
    to FP16): the name the FP32 reference has."""
    node = producer.get(name)
    while node is not None and node.op_type == "Cast" and node.input:
        name = node.input[0]
        node = producer.get(name)
    return name


def _as_fp32(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type != TensorProto.FLOAT16:
        return t
    from onnx import numpy_helper

    out = numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name)
    return out


def _attributes(node: onnx.NodeProto) -> str:
    """A node's attributes (a DequantizeLinear's axis), comparable."""
    return "".join(sorted(a.SerializeToString(deterministic=True).hex() for a in node.attribute))


def _clone(
    node: onnx.NodeProto, inputs: list[str], outputs: list[str], prefix: str
) -> onnx.NodeProto:
    new = onnx.NodeProto()
    new.CopyFrom(node)
    del new.input[:]
    new.input.extend(inputs)
    del new.output[:]
    new.output.extend(outputs)
    new.name = prefix + (node.name or outputs[0])
    return new


def quantized_ops(candidate: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Ops of the candidate that read at least one DequantizeLinear output."""
    dq_outputs = {
        o for n in candidate.graph.node if n.op_type == "DequantizeLinear" for o in n.output
    }
    return [
        n
        for n in candidate.graph.node
        if n.op_type not in QDQ_OPS and any(i in dq_outputs for i in n.input)
    ]


def build_isolated(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, prefix: str = _PREFIX
) -> IsolatedModel:
    """Reference graph plus an isolated copy of every quantized op of ``candidate``."""
    ref = _reference_for(reference, candidate)
    b = _Builder(ref, candidate, prefix)
    twins, ops = _isolate_all(b, candidate)
    return IsolatedModel(_with_copies(ref, [b]), twins, ops)


@dataclass
class IsolatedMany:
    """Several candidates' isolated copies in one reference graph (:func:`build_isolated_many`)."""

    model: onnx.ModelProto
    #: candidate key -> reference tensor -> its twin of that candidate (``key:tensor::isolated``)
    twins: dict[str, dict[str, str]] = field(default_factory=dict)
    #: candidate key -> reference tensor -> the quantized op producing it
    ops: dict[str, dict[str, str]] = field(default_factory=dict)


def build_isolated_many(
    reference: onnx.ModelProto, candidates: Iterable[tuple[str, onnx.ModelProto]]
) -> IsolatedMany:
    """Reference graph plus the isolated copies of every candidate's quantized ops (``auto``'s
    tables), twins named apart by key. The reference is copied once, each candidate is let go
    once its copies are built (``candidates`` may be a generator), and the copies share equal
    constants, the Q/DQ nodes on the same inputs and the op copies on the same inputs
    (:class:`SharedConstants`): one copy of each quantized weight, not one a candidate, and
    an op whose inputs two candidates quantize alike is run once (both candidates' twins name
    the one copy's output)."""
    shared, builders, out = SharedConstants(), [], IsolatedMany(onnx.ModelProto())
    ref = None
    for index, (key, candidate) in enumerate(candidates):
        if ref is None:
            ref = _reference_for(reference, candidate)
        b = _Builder(ref, candidate, f"qb_iso{index}/", shared)
        twins, out.ops[key] = _isolate_all(b, candidate)
        # every isolated output named apart (a multi-output op's other outputs too)
        named = {o: f"{key}:{o}" for n in b.nodes for o in n.output if o.endswith(SUFFIX)}
        for node in b.nodes:
            node.output[:] = [named.get(o, o) for o in node.output]
        out.twins[key] = {t: named.get(twin, twin) for t, twin in twins.items()}  # or reused
        shared.ops.update((op, named[twin]) for op, twin in b.built_ops)
        b.drop_candidate()
        builders.append(b)
        del candidate  # the last one too: not held beside the copy below (a whole model)
    out.model = _with_copies(reference if ref is None else ref, builders)
    return out


def _reference_for(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> onnx.ModelProto:
    """The reference at the candidate's opset where the candidate's is higher."""
    if _opset(candidate) > _opset(reference):
        return _upgraded(reference, _opset(candidate))
    return reference


def _isolate_all(b: _Builder, candidate: onnx.ModelProto) -> tuple[dict[str, str], dict[str, str]]:
    """Every quantized op of ``candidate`` isolated by ``b``: (tensor -> twin, tensor -> op)."""
    twins, ops = {}, {}
    for node in quantized_ops(candidate):
        out = b.isolate(node)
        if out is not None:
            twins[out] = b.reused.get(out, out + SUFFIX)
            ops[out] = node.name or node.op_type
    return twins, ops


def _with_copies(ref: onnx.ModelProto, builders: list[_Builder]) -> onnx.ModelProto:
    """One copy of ``ref`` holding every builder's nodes and constants."""
    model = onnx.ModelProto()
    model.CopyFrom(ref)
    for b in builders:
        model.graph.node.extend(b.nodes)
        model.graph.initializer.extend(t for t in b.inits.values() if t.name)
    return model


#: inside :func:`shared_upgrades`: (id of a reference, opset) -> (the reference, held so that
#: its id is not reused, and its upgrade)
_UPGRADES: ContextVar[dict[tuple[int, int], tuple[onnx.ModelProto, onnx.ModelProto]] | None] = (
    ContextVar("quantbench_isolated_upgrades", default=None)
)


@contextmanager
def shared_upgrades() -> Iterator[None]:
    """A scope in which :func:`build_isolated` upgrades each reference to each opset once:
    ``--method auto``'s candidates share one reference (0.3 s a conversion on dddd-ocr's
    opset 12). The reference must not change in place inside the scope."""
    with memo_scope(_UPGRADES):
        yield


def _upgraded(reference: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    memo = _UPGRADES.get()
    if memo is None:
        return convert_version(reference, opset)
    key = (id(reference), opset)
    if key not in memo:
        memo[key] = (reference, convert_version(reference, opset))
    return memo[key][1]


def build_isolated_fp16(
    reference: onnx.ModelProto,
    fp16_nodes: Iterable[str],
    float_types: Mapping[str, int],
    prefix: str = _PREFIX,
) -> IsolatedModel:
    """Reference graph plus an FP16-isolated copy of every node named in ``fp16_nodes`` (node
    labels, :func:`quantbench.model.graph.node_labels`): FP32 inputs rounded to FP16 (Cast pair),
    the op computed, each float output rounded to FP16. ``float_types``: the element type of
    every tensor of ``reference`` (only FP32 tensors are rounded)."""
    wanted = set(fp16_nodes)
    nodes: list[onnx.NodeProto] = []
    rounded: dict[str, str] = {}
    twins: dict[str, str] = {}
    ops: dict[str, str] = {}

    def fp32(name: str) -> bool:
        return bool(name) and float_types.get(name) == TensorProto.FLOAT

    def round_input(name: str) -> str:
        if name not in rounded:
            rounded[name] = f"{prefix}{name}::fp16"
            nodes.extend(_round_trip(name, rounded[name], f"{prefix}in/{name}"))
        return rounded[name]

    labels = node_labels(reference.graph.node)
    for label, node in zip(labels, reference.graph.node, strict=True):
        outs = [o for o in node.output if fp32(o)]
        if label not in wanted or not outs:
            continue
        inputs = [round_input(i) if fp32(i) else i for i in node.input]
        outputs = [
            (f"{prefix}{o}::raw" if o in outs else f"{prefix}{o}::unused") if o else ""
            for o in node.output
        ]
        nodes.append(_clone(node, inputs, outputs, prefix))
        for o, raw in zip(node.output, outputs):
            if o in outs:
                nodes.extend(_round_trip(raw, o + SUFFIX, f"{prefix}out/{o}"))
                twins[o] = o + SUFFIX
                ops[o] = label
    model = onnx.ModelProto()
    model.CopyFrom(reference)
    model.graph.node.extend(nodes)
    return IsolatedModel(model, twins, ops)


def _round_trip(src: str, dst: str, name: str) -> list[onnx.NodeProto]:
    """``dst = float32(float16(src))``: what storing a value in FP16 does to it."""
    half = f"{dst}::half"
    return [
        helper.make_node("Cast", [src], [half], name=f"{name}/to_fp16", to=TensorProto.FLOAT16),
        helper.make_node("Cast", [half], [dst], name=f"{name}/to_fp32", to=TensorProto.FLOAT),
    ]
