"""FP16 candidates: what onnxruntime really runs in FP16, and the ops it cannot.

Two ways, chosen by :func:`fp16_model` from what the provider can do:

* **native** (:func:`convert_fp16`): onnxruntime's float16 converter
  (``onnxruntime.transformers.float16``), I/O kept FP32. What the converter misses is which ops
  onnxruntime has no FP16 kernel for: a missing kernel either fails the session (the op type is
  then kept in FP32 and the conversion retried) or is loaded through Casts that onnxruntime
  inserts around the op — and then removes between neighbours, so the op silently computes in
  FP32 and its output is never rounded to FP16. The session's own graph tells which nodes that
  happened to; they are listed by name.
* **emulated** (:func:`emulate_fp16`), used where most ops have no FP16 kernel (onnxruntime's CPU
  provider has none for Conv, Gemm, Add, Relu, ...): the FP32 graph with FP16 storage — weights
  and graph inputs rounded to FP16, every op's float output rounded to FP16 by a Cast pair that
  onnxruntime keeps. Arithmetic inside an op is FP32 (TensorRT's FP16 convolutions accumulate in
  FP32 too); for elementwise ops FP32 arithmetic rounded to FP16 equals FP16 arithmetic.

Either way every compute node gets a precision (``fp16``, ``fp16-emulated`` or ``fp32`` with the
reason), so "FP16" in a comparison says exactly what was computed how.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from quantbench.backends.onnxruntime import session_providers
from quantbench.errors import InternalError, QuantbenchError, first_line
from quantbench.fp16range import RangeLoss, constant_losses, stored_constants, to_fp16
from quantbench.model.graph import QDQ_OPS, node_labels, rename_tensors, toposorted
from quantbench.model.protosize import loadable

#: onnx-ml ops the converter cannot handle at all (they take or make maps/sequences)
ML_OPS = (
    "ArrayFeatureExtractor",
    "Binarizer",
    "CastMap",
    "CategoryMapper",
    "DictVectorizer",
    "FeatureVectorizer",
    "Imputer",
    "LabelEncoder",
    "LinearClassifier",
    "LinearRegressor",
    "Normalizer",
    "OneHotEncoder",
    "SVMClassifier",
    "SVMRegressor",
    "Scaler",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "TreeEnsemble",
    "ZipMap",
)
_MISSING_KERNEL = re.compile(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_TYPE_MISMATCH = re.compile(r"of node \(([^)]*)\) does not match expected type")
_HALF = TensorProto.FLOAT16
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
#: ops that only move values or cast: not counted when reporting the FP16 share of the compute
_BOOKKEEPING = frozenset({"Cast", "Identity", "Constant", "Shape", "Reshape", "Flatten"})


FP16 = "fp16"
FP16_EMULATED = "fp16-emulated"
FP32 = "fp32"
INT8 = "int8"
NATIVE = "native"
EMULATED = "emulated"


@dataclass
class Fp16Model:
    """A model converted to FP16 (I/O kept FP32) and what stayed in FP32, with reasons."""

    model: onnx.ModelProto
    #: node name -> why it computes in FP32
    fp32_nodes: dict[str, str] = field(default_factory=dict)
    #: node name -> "fp16" | "fp16-emulated" | "fp32" (| "int8" for a Q/DQ model) for every
    #: compute node of the original
    precision: dict[str, str] = field(default_factory=dict)
    #: "native" (onnxruntime's FP16 kernels) or "emulated" (FP16 storage, FP32 arithmetic)
    mode: str = NATIVE
    #: node name -> op type (for the report)
    op_types: dict[str, str] = field(default_factory=dict)
    #: constants read in FP16 that FP16 cannot hold (Inf, 0, or imprecise), with counts
    out_of_range: list[RangeLoss] = field(default_factory=list)

    @property
    def fp16_share(self) -> float:
        """Fraction of the original model's compute nodes that run in FP16."""
        if not self.precision:
            return 0.0
        fp16 = sum(p in (FP16, FP16_EMULATED) for p in self.precision.values())
        return fp16 / len(self.precision)

    def to_dict(self, provider: str = "CPUExecutionProvider") -> dict[str, object]:
        """The candidate record of a results document: how FP16 was computed, what stayed FP32."""
        return {
            "mode": self.mode,
            "provider": provider,
            "compute_ops": len(self.precision),
            "fp16_ops": sum(p in (FP16, FP16_EMULATED) for p in self.precision.values()),
            "fp16_share": self.fp16_share,
            "fp32_ops": [
                {"node": n, "op_type": self.op_types.get(n, ""), "reason": r}
                for n, r in self.fp32_nodes.items()
            ],
            "out_of_range_constants": [x.to_dict() for x in self.out_of_range],
        }


def describe(record: dict[str, object]) -> str:
    """One console line from :meth:`Fp16Model.to_dict`: native vs emulated, share, FP32 ops."""
    provider = _short(str(record.get("provider", "")))
    how = (
        f"native: onnxruntime's {provider} FP16 kernels"
        if record.get("mode") == NATIVE
        else f"emulated (onnxruntime {provider} lacks FP16 kernels for most ops): FP16 "
        "storage, i.e. weights, inputs and every op output rounded to FP16, FP32 arithmetic"
    )
    left = record.get("fp32_ops") or []
    assert isinstance(left, list)
    kept = ", ".join(str(x["node"]) for x in left[:5]) + (" ..." if len(left) > 5 else "")
    share = float(record.get("fp16_share") or 0.0)  # type: ignore[arg-type]
    timing = "" if record.get("mode") == NATIVE else "; its latency times the emulation"
    return (
        f"FP16 {how}; {record.get('fp16_ops')}/{record.get('compute_ops')} compute "
        f"ops in FP16 ({100 * share:.0f}%)" + (f"; left in FP32: {kept}" if left else "") + timing
    )


def fp16_model(
    model: onnx.ModelProto,
    *,
    keep_fp32: list[str] | tuple[str, ...] = (),
    provider: str = "CPUExecutionProvider",
    types: Mapping[str, int] | None = None,
) -> Fp16Model:
    """The FP16 candidate for ``provider``: native where its FP16 kernels run most compute nodes,
    else emulated (FP16 storage, FP32 arithmetic). ``types``: known element types (e.g.
    :attr:`quantbench.model.graph.Graph.elem_types`) for tensors ONNX shape inference cannot
    type."""
    if provider != "CPUExecutionProvider":
        native = convert_fp16(model, keep_fp32=keep_fp32, provider=provider)
        if native.fp16_share >= 0.5:
            return native
    return emulate_fp16(model, keep_fp32=keep_fp32, types=types)


def emulate_fp16(
    model: onnx.ModelProto,
    *,
    keep_fp32: list[str] | tuple[str, ...] = (),
    types: Mapping[str, int] | None = None,
) -> Fp16Model:
    """``model`` with FP16 storage: float weights and inputs rounded to FP16, and every float
    output of a compute node not in ``keep_fp32`` rounded to FP16 (Cast to FP16 and back).

    Tensor types come from ONNX shape inference, then ``types`` (contrib ops); a node whose
    output nothing types is reported in FP32 with that reason, never dropped silently."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _name_nodes(out)
    graph = out.graph
    dq_outputs = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    kept = set(keep_fp32)
    known = {**dict(types or {}), **_tensor_types(out)}
    floats_of = {k: t for k, t in known.items() if t in _FLOATS}
    fp16_reads = {i for n in graph.node if n.name not in kept for i in n.input}
    lost = [x for x in constant_losses(out) if x.tensor in fp16_reads]
    for init in graph.initializer:  # one read by FP32 nodes only stays FP32, as converted
        if init.data_type == TensorProto.FLOAT and init.name in fp16_reads:
            init.CopyFrom(_rounded_initializer(init))
    new_nodes: list[onnx.NodeProto] = []
    rounded_inputs = [i.name for i in graph.input if floats_of.get(i.name) == TensorProto.FLOAT]
    rename = {name: f"{name}__fp16" for name in rounded_inputs}
    for name in rounded_inputs:
        new_nodes.extend(_round_trip(name, rename[name], f"qb_fp16_in/{name}"))
    precision: dict[str, str] = {}
    fp32_nodes: dict[str, str] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        if node.op_type == "Constant" and node.name not in kept:
            _round_constant(node)
        new_nodes.append(node)
        floats = [o for o in node.output if floats_of.get(o) == TensorProto.FLOAT]
        if node.op_type in _BOOKKEEPING:
            continue
        if not floats:
            if any(o and o not in known for o in node.output):  # never dropped silently
                precision[node.name] = FP32
                fp32_nodes[node.name] = (
                    "output type unknown to ONNX shape inference (custom op?): not rounded"
                )
            continue
        if node.name in kept:
            precision[node.name] = FP32
            fp32_nodes[node.name] = "kept in FP32 on request"
            continue
        if node.op_type not in QDQ_OPS:  # a DQ output is rounded (FP16 scale) but is no op
            int8 = any(i in dq_outputs for i in node.input)
            precision[node.name] = INT8 if int8 else FP16_EMULATED
        for j, name in enumerate(node.output):
            if name in floats:
                node.output[j] = f"{name}__fp32"
                new_nodes.extend(_round_trip(f"{name}__fp32", name, f"qb_fp16/{node.name}/{j}"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    op_types = {n.name: n.op_type for n in graph.node if n.name in precision}
    return Fp16Model(out, fp32_nodes, precision, EMULATED, op_types, lost)


def _round_trip(src: str, dst: str, name: str) -> list[onnx.NodeProto]:
    """``dst = float32(float16(src))``: the rounding FP16 storage applies."""
    half = f"{dst}__half"
    make = onnx.helper.make_node
    return [
        make("Cast", [src], [half], name=f"{name}/to_fp16", to=TensorProto.FLOAT16),
        make("Cast", [half], [dst], name=f"{name}/to_fp32", to=TensorProto.FLOAT),
    ]


def _rounded_initializer(init: onnx.TensorProto) -> onnx.TensorProto:
    """``init`` stored in FP16 (IEEE: Inf beyond 65504, tiny values to 0), kept FP32-typed."""
    rounded = to_fp16(onnx.numpy_helper.to_array(init))
    return onnx.numpy_helper.from_array(rounded, init.name)


def _round_constant(node: onnx.NodeProto) -> None:
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
            attr.t.CopyFrom(_rounded_initializer(attr.t))


#: ops that pass a constant on unchanged in value: one FP16 cannot hold breaks what reads them
_PASS_ON = frozenset({"Identity", "Reshape", "Flatten", "Cast", "Squeeze", "Unsqueeze"})


def out_of_range_nodes(model: onnx.ModelProto) -> tuple[list[str], list[RangeLoss]]:
    """The nodes (labels) that must stay FP32 for ``model``'s FP16 artefact to compute what it
    computes, and the constants that force them: every constant FP16 breaks
    (:attr:`RangeLoss.breaks`: Inf, or values lost), its Constant node, and what reads it
    (through reshapes and casts). The artefact keeps them FP32 and says so: TensorRT builds a
    strongly-typed model as given, and an FP16 copy of such a constant runs as Inf or 0."""
    named = onnx.ModelProto()
    named.CopyFrom(model)
    _name_nodes(named)
    broken = [x for x in constant_losses(named) if x.breaks]
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in named.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producer = {o: n for n in named.graph.node for o in n.output}
    keep: list[str] = []
    todo = [x.tensor for x in broken]
    for name in todo:
        if name in producer and producer[name].op_type == "Constant":
            keep.append(producer[name].name)
    seen: set[str] = set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for n in consumers.get(tensor, []):
            if n.name not in keep:
                keep.append(n.name)
            if n.op_type in _PASS_ON:
                todo.extend(n.output)
    return keep, broken


def _faithful_constants(source: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """The float16 converter clamps (65504) and raises (5.96e-8) what FP16 cannot hold; each
    FP16 constant of ``converted`` is cast again from its FP32 original, as IEEE FP16 does."""
    originals = {
        name: t for name, t in stored_constants(source.graph) if t.data_type == TensorProto.FLOAT
    }
    for name, t in stored_constants(converted.graph):
        if t.data_type == TensorProto.FLOAT16 and name in originals:
            half = to_fp16(onnx.numpy_helper.to_array(originals[name])).astype("float16")
            t.CopyFrom(onnx.numpy_helper.from_array(half, t.name))


def convert_fp16(
    model: onnx.ModelProto,
    *,
    keep_fp32: list[str] | tuple[str, ...] = (),
    provider: str = "CPUExecutionProvider",
    max_rounds: int = 64,
) -> Fp16Model:
    """``model`` in FP16 except ``keep_fp32`` (node names) and ops onnxruntime has no FP16
    kernel for on ``provider``; inputs and outputs stay FP32 (Casts at the boundary)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    named = onnx.ModelProto()
    named.CopyFrom(model)
    _name_nodes(named)
    model = named
    blocked_ops: set[str] = set(ML_OPS)
    blocked_nodes: set[str] = set(keep_fp32)
    reasons = {n: "kept in FP32 on request" for n in keep_fp32}
    by_name = {n.name: n for n in model.graph.node}
    for _ in range(max_rounds):
        converted = convert_float_to_float16(
            model,
            keep_io_types=True,
            op_block_list=sorted(blocked_ops),
            node_block_list=sorted(blocked_nodes),
        )
        _faithful_constants(model, converted)
        problem = _load_problem(converted, provider)
        if problem is None:
            result = _result(model, converted, blocked_ops, blocked_nodes, reasons, provider)
            half = {n for n, t in stored_constants(converted.graph) if t.data_type == _HALF}
            result.out_of_range = [x for x in constant_losses(model) if x.tensor in half]
            return result
        op_type, node = problem
        if op_type is not None and op_type not in blocked_ops:
            blocked_ops.add(op_type)
            for n in model.graph.node:
                if n.op_type == op_type:
                    reasons[n.name] = f"onnxruntime ({_short(provider)}) has no FP16 {op_type}"
        elif node is not None and node in by_name and node not in blocked_nodes:
            blocked_nodes.add(node)
            reasons[node] = "onnxruntime rejects this node's FP16 typing"
        else:
            break
    raise InternalError(
        f"the FP16 conversion does not load in onnxruntime even with {len(blocked_ops)} op "
        f"types and {len(blocked_nodes)} nodes kept in FP32"
    )


def _name_nodes(model: onnx.ModelProto) -> None:
    """Every node gets its label (:func:`quantbench.model.graph.node_labels`, the names the plan and
    the reports use): the block list and the report address nodes by name. Names in the float16
    converter's own scheme are moved aside first (:func:`_free_converter_names`)."""
    _free_converter_names(model)
    for node, label in zip(model.graph.node, node_labels(model.graph.node), strict=True):
        node.name = label


#: the names onnxruntime's float16 converter gives the Casts it inserts (and their outputs)
_CONVERTER_NAMES = re.compile(r"^graph_(input|output)_cast|_cast_to_fp(16|32)(_node)?$")


def _free_converter_names(model: onnx.ModelProto) -> None:
    """A model converted to FP16 by onnxruntime's converter before (an FP16 export, widened to
    FP32 by quantbench) still holds its Casts' names, ``graph_output_cast_0`` ...; converting
    it again would give new Casts the same names (two nodes writing one tensor). Those tensors
    and nodes are renamed, the model's inputs and outputs excepted."""
    graph = model.graph
    io = {v.name for v in (*graph.input, *graph.output)}
    taken = {t for n in graph.node for t in (*n.input, *n.output)} | io
    taken |= {n.name for n in graph.node}
    rename: dict[str, str] = {}
    for name in sorted(taken - io):
        if _CONVERTER_NAMES.search(name):
            fresh = f"qb__{name}__"
            while fresh in taken:
                fresh += "_"
            rename[name] = fresh
            taken.add(fresh)
    if rename:
        rename_tensors(graph, rename, node_names=True)


def _load_problem(model: onnx.ModelProto, provider: str) -> tuple[str | None, str | None] | None:
    """None when onnxruntime loads ``model``; else (op type without FP16 kernel, node)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        with loadable(model) as source:
            ort.InferenceSession(source, sess_options=opts, providers=session_providers(provider))
    except Exception as exc:  # noqa: BLE001 - ORT reports everything as generic errors
        text = str(exc)
        missing = _MISSING_KERNEL.search(text)
        if missing:
            return missing.group(1), missing.group(3)
        mismatch = _TYPE_MISMATCH.search(text)
        if mismatch:
            return None, mismatch.group(1)
        raise QuantbenchError(
            f"onnxruntime cannot load the FP16 model: {first_line(exc)}"
        ) from None
    return None


def _short(provider: str) -> str:
    return provider.replace("ExecutionProvider", "")


def _result(
    original: onnx.ModelProto,
    converted: onnx.ModelProto,
    blocked_ops: set[str],
    blocked_nodes: set[str],
    reasons: dict[str, str],
    provider: str,
) -> Fp16Model:
    """Per compute node of ``original``: the precision onnxruntime really executes it in.

    onnxruntime loads an FP16 node it has no FP16 kernel for by inserting Casts around it (its
    InsertCastTransformer): that node computes in FP32 on FP16-rounded values. The session's
    own graph (before fusions) shows which nodes got those Casts.
    """
    executed = _executed_types(converted, provider)
    precision: dict[str, str] = {}
    fp32: dict[str, str] = {}
    for n in original.graph.node:
        if n.op_type in _BOOKKEEPING:
            continue
        kind = executed.get(n.name)
        if kind is None:
            continue  # integer, shape-only, or folded away
        precision[n.name] = kind
        if kind == FP32:
            if n.name in reasons:
                fp32[n.name] = reasons[n.name]
            elif n.op_type in blocked_ops or n.name in blocked_nodes:
                fp32[n.name] = f"the FP16 converter keeps {n.op_type} in FP32"
            else:
                fp32[n.name] = (
                    f"onnxruntime ({_short(provider)}) has no FP16 {n.op_type} kernel: it runs "
                    "FP32 on FP16-rounded inputs"
                )
    op_types = {n.name: n.op_type for n in original.graph.node if n.name in precision}
    return Fp16Model(converted, fp32, precision, NATIVE, op_types)


def _executed_types(model: onnx.ModelProto, provider: str) -> dict[str, str]:
    """Node name -> "fp16"/"fp32" as the session runs it (float nodes only)."""
    import tempfile
    from pathlib import Path

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.onnx"
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(path)
        with loadable(model) as source:
            ort.InferenceSession(source, sess_options=opts, providers=session_providers(provider))
        session_graph = onnx.load(str(path))
    types = _float_types(session_graph)
    out: dict[str, str] = {}
    for n in session_graph.graph.node:
        floats = [types[t] for t in (*n.input, *n.output) if t in types]
        if floats:
            native = all(t == TensorProto.FLOAT16 for t in floats)
            out[n.name] = FP16 if native else FP32
    return out


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of ``model`` that ONNX shape inference can type."""
    try:
        graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - best effort: what it cannot type is reported as such
        graph = model.graph
    out: dict[str, int] = {}
    for init in graph.initializer:
        out[init.name] = init.data_type
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        if vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    return out


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every float tensor of ``model`` (after shape inference)."""
    return {k: t for k, t in _tensor_types(model).items() if t in _FLOATS}


def declared_precisions(model: onnx.ModelProto) -> dict[str, str]:
    """Node label -> the precision ``model`` declares for it, as TensorRT builds it strongly
    typed: ``int8`` (reads a DequantizeLinear output), ``fp16`` (FP16 float tensors) or
    ``fp32``; Q/DQ, casts, shape ops and integer-only nodes are left out."""
    types = _float_types(model)
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    out: dict[str, str] = {}
    for node, label in zip(model.graph.node, node_labels(model.graph.node), strict=True):
        if node.op_type in _BOOKKEEPING or node.op_type in QDQ_OPS:
            continue
        floats = [types[t] for t in node.output if t in types]
        if not floats:
            continue
        if any(i in dq_outputs for i in node.input):
            out[label] = INT8
        else:
            out[label] = FP16 if all(t == TensorProto.FLOAT16 for t in floats) else FP32
    return out


def fp16_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors ``model`` holds in FP16: FP16-typed ones, and the FP32 ones it casts to FP16
    (its inputs: a strongly-typed model keeps its I/O FP32; outputs of nodes kept FP32)."""
    types = _float_types(model)
    out = {k for k, t in types.items() if t == TensorProto.FLOAT16}
    for n in model.graph.node:
        if n.op_type == "Cast" and n.input and n.output[0] in out:
            out.add(n.input[0])
    return out


def has_fp16_qdq(model: onnx.ModelProto) -> bool:
    """Whether a DequantizeLinear of ``model`` has an FP16 scale (a strongly-typed model).

    onnxruntime 1.32's graph optimizations (level basic and above: the QDQ bias quantization
    with precision-free Casts) return wrong values for an intermediate Conv output exposed as
    a graph output of such a model (the final outputs stay right); intermediate tensors of it
    are therefore read with optimizations off."""
    inits = {i.name: i.data_type for i in model.graph.initializer}
    return any(
        n.op_type == "DequantizeLinear"
        and len(n.input) > 1
        and inits.get(n.input[1]) == TensorProto.FLOAT16
        for n in model.graph.node
    )


#: what the ops a Q/DQ model leaves unquantized may run in (quantize --high-precision,
#: recover --precision)
HIGH_PRECISIONS = (FP32, FP16)


def check_high_precision(value: str, option: str) -> None:
    """A precision for the unquantized ops must be one of :data:`HIGH_PRECISIONS`."""
    if value not in HIGH_PRECISIONS:
        raise QuantbenchError(f"{option} {value!r}: choose one of {', '.join(HIGH_PRECISIONS)}")


#: DequantizeLinear takes an FP16 scale (and so outputs FP16) from opset 19 on
FP16_SCALE_OPSET = 19


def strongly_typed_fp16(
    model: onnx.ModelProto, keep_fp32: list[str] | tuple[str, ...] = ()
) -> onnx.ModelProto:
    """A Q/DQ (or plain) model whose high-precision ops are FP16: the form TensorRT 10/11 builds
    as given in strongly-typed mode. Q/DQ scales become FP16 (opset >= 19), so each
    DequantizeLinear outputs FP16 straight into its FP16 consumer; I/O stays FP32. The nodes
    :func:`out_of_range_nodes` names stay FP32; every FP16 constant is IEEE-cast, unclamped."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from quantbench.qdq.opset import convert, default_opset

    source = onnx.ModelProto()
    source.CopyFrom(model)
    _name_nodes(source)
    if default_opset(source) < FP16_SCALE_OPSET:
        try:
            source = convert(source, FP16_SCALE_OPSET)
        except Exception as exc:  # noqa: BLE001 - the version converter raises many kinds
            raise QuantbenchError(
                f"FP16 high precision needs opset {FP16_SCALE_OPSET} (FP16 Q/DQ scales) and the "
                f"model cannot be upgraded from opset {default_opset(model)}: {first_line(exc)}"
            ) from None
    unsafe, _ = out_of_range_nodes(source)  # callers warn; kept here too, never written Inf
    converted = toposorted(
        convert_float_to_float16(
            source,
            keep_io_types=True,
            op_block_list=list(ML_OPS),
            node_block_list=sorted({*keep_fp32, *unsafe}),
        )
    )
    _faithful_constants(source, converted)
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as exc:  # noqa: BLE001 - checker and inference raise several kinds
        raise InternalError(
            f"the strongly-typed FP16 model fails onnx.checker: {first_line(exc)}"
        ) from exc
    return converted


