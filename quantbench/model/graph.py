"""ONNX model loading and the questions calibration and quantization ask of a graph.

Which tensors are constant (initializers, ``Constant`` outputs, and constant-foldable chains of
them — some exporters write every weight as a ``Constant`` node), which ops are quantizable,
which convolutions take a runtime weight (TensorRT's *ConvMultiInput*), which tensors to
calibrate, and the residual inputs of ``Add`` nodes that follow a weighted op.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper, shape_inference
from onnx.external_data_helper import load_external_data_for_model

from quantbench.errors import QuantbenchError, first_line
from quantbench.model.customops import checkable, for_onnxruntime, ops_in
from quantbench.model.protosize import digest as proto_digest
from quantbench.model.protosize import loadable

#: ops whose inputs TensorRT quantizes (weighted ops: Q/DQ on data and weight).
WEIGHTED_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: what calibration collects statistics for: the weighted ops plus the DWConv2D plugin op, which
#: quantize quantizes on request (--dwconv2d, or DWConv2D in op_types); without its inputs in the
#: statistics a model whose depthwise convs were rewritten to the op could not be quantized
CALIBRATED_OP_TYPES = (*WEIGHTED_OP_TYPES, "DWConv2D")
FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
}
#: ops never folded into constants (their output changes from run to run).
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}
_NP_DTYPES = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.BOOL: np.bool_,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64,
    # numpy's through ml_dtypes: a bfloat16 model opens, then its float32 widening is fed
    onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16,
}


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, numpy dtype and shape (``None`` / str = dynamic dim)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def is_float(self) -> bool:
        return np.issubdtype(self.dtype, np.floating)

    def describe(self) -> str:
        """``name dtype[dims]`` on one line: a symbolic dim that exporters write as a whole
        shape formula (torch.onnx: "(floor(floor(height/2 - 1/2)/2) + 1)*...", hundreds of
        characters) is cut to its start."""
        dims = ",".join(_dim_text(d) for d in self.shape)
        return f"{self.name} {np.dtype(self.dtype).name}[{dims}]"


#: longest symbolic dim shown whole in a signature
DIM_TEXT_CHARS = 24


def _dim_text(d: int | str | None) -> str:
    if d is None:
        return "?"
    text = str(d)
    return text if len(text) <= DIM_TEXT_CHARS else text[: DIM_TEXT_CHARS - 1] + "…"


@dataclass
class Graph:
    """A loaded model plus the facts derived from it once (types, constants, consumers)."""

    model: onnx.ModelProto
    path: Path | None = None
    hash: str = ""
    #: the hash of the half-precision file this graph is the float32 widening of
    #: (quantbench.model.widen.float32_graph): tables and statistics made for that file apply to it
    #: too (see made_for)
    widened_from: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    elem_types: dict[str, int] = field(default_factory=dict)
    constants: set[str] = field(default_factory=set)
    #: bytes that parse to exactly ``model`` (the file's, when quantbench changed nothing), or
    #: None; whoever rewrites ``model`` in place must clear it
    source: bytes | None = field(default=None, repr=False)
    #: ``onnx.checker`` not yet run (``open_graph(..., defer_check=True)``): :meth:`finish_check`
    pending_check: Callable[[], None] | None = field(default=None, repr=False)

    @contextmanager
    def checked(self) -> Iterator[None]:
        """A block that reads the model before its deferred check ran: the check runs at its
        end, and first should anything in it fail (:func:`_invalid_first`)."""
        with _invalid_first(self.finish_check):
            yield
        self.finish_check()

    def finish_check(self) -> None:
        """Run the deferred model check, once: raises the one-line error of an invalid model.
        Whoever deferred it runs it before anything can fail on the model, or, where
        something did, before reporting that (the check's error names the real fault)."""
        check, self.pending_check = self.pending_check, None
        if check is not None:
            check()

    def take_source(self) -> bytes | None:
        """:attr:`source`, handed over once: its use is the statistics pass's session, and
        keeping it through the pass would add the model's size to the peak memory (133 MB for
        the BERT-like encoder); a later session serialises the model instead."""
        source, self.source = self.source, None
        return source

    def made_for(self, model_hash: str) -> bool:
        """Whether a table or statistics recording ``model_hash`` were made for this model
        (its own file, or the half-precision file it was widened from)."""
        return model_hash in (self.hash, self.widened_from) and bool(model_hash)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.model.graph.node)

    @property
    def opset(self) -> int:
        for imp in self.model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return int(imp.version)
        return 0

    @property
    def name(self) -> str:
        return self.path.stem if self.path else (self.model.graph.name or "model")

    def producers(self) -> dict[str, onnx.NodeProto]:
        return {out: n for n in self.model.graph.node for out in n.output if out}

    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        out: dict[str, list[onnx.NodeProto]] = {}
        for n in self.model.graph.node:
            for name in n.input:
                if name:
                    out.setdefault(name, []).append(n)
        return out

    def is_float(self, tensor: str) -> bool:
        return self.elem_types.get(tensor) in FLOAT_TYPES

    def initializer(self, name: str) -> np.ndarray | None:
        for init in self.model.graph.initializer:
            if init.name == name:
                return numpy_helper.to_array(init)
        return None

    def node_names(self) -> list[str]:
        return node_labels(self.model.graph.node)


#: the ops of the Q/DQ form (TensorRT's explicit quantization, and quantbench's own output)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")

#: ops of a model another tool already quantized to integer kernels (QOperator format,
#: onnxruntime's dynamic quantization, weight-only 4-bit): it has no float form to calibrate
QUANTIZED_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QLinearConvTranspose",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QGemm",
        "QAttention",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
        "MatMulNBits",
    }
)


def check_float_model(g: Graph, role: str = "the model") -> None:
    """Refuses, in one line, what quantbench cannot calibrate or quantize: inputs or outputs
    that are not tensors (a ZipMap's sequence of maps), or a model already quantized to integer
    kernels (whose calibration and "FP32" reference would measure nothing). ``role`` names the
    model in the message (e.g. "the reference (--model)")."""
    label = str(g.path) if g.path else f"model {g.name!r}"
    for kind, values in (("input", g.model.graph.input), ("output", g.model.graph.output)):
        for v in values:
            if not v.type.HasField("tensor_type"):
                raise QuantbenchError(
                    f"{label}: {kind} {v.name!r} is a {type_text(v.type)}, not a "
                    "tensor; quantbench works on tensor models: export it without that "
                    "conversion (e.g. zipmap=False for a classifier's ZipMap)"
                )
    found = Counter(n.op_type for n in g.model.graph.node if n.op_type in QUANTIZED_OPS)
    if found:
        listed = ", ".join(f"{count} {op}" for op, count in found.most_common(4))
        raise QuantbenchError(
            f"{label}: {role} is already quantized ({listed}); quantbench calibrates and "
            "quantizes float models: give the FP32 model it was made from (a quantized model "
            "can be compared as a candidate .onnx against it)"
        )


def rename_tensors(
    graph: onnx.GraphProto, rename: Mapping[str, str], node_names: bool = False
) -> None:
    """Tensors renamed where nodes read and write them (subgraphs' captures of outer tensors
    included), in value_info and initializers; the graph's inputs and outputs keep their
    names. ``node_names``: node names found in ``rename`` too."""
    for node in graph.node:
        if node_names:
            node.name = rename.get(node.name, node.name)
        node.input[:] = [rename.get(i, i) for i in node.input]
        node.output[:] = [rename.get(o, o) for o in node.output]
        for attr in node.attribute:
            for sub in (attr.g,) if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                rename_tensors(sub, rename, node_names)
    for item in (*graph.value_info, *graph.initializer):
        item.name = rename.get(item.name, item.name)


def type_text(t: onnx.TypeProto) -> str:
    """An ONNX value type in words: ``seq(map(int64, float))``."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return onnx.TensorProto.DataType.Name(t.tensor_type.elem_type).lower()
    if kind == "sequence_type":
        return f"seq({type_text(t.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(t.map_type.key_type).lower()
        return f"map({key}, {type_text(t.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_text(t.optional_type.elem_type)})"
    return (kind or "untyped value").replace("_type", "").replace("_", " ")


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or a stable stand-in for unnamed nodes (``Conv_12``)."""
    return node.name or f"{node.op_type}_{index}"


def node_labels(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    """Every node's :func:`node_label`, made unique (``name``, ``name_1``, ...): the one naming
    rule; ``quantize`` writes these names into its models, reports and artefacts read them."""
    seen: set[str] = set()
    labels: list[str] = []
    for index, node in enumerate(nodes):
        base = node_label(node, index)
        name, k = base, 1
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        labels.append(name)
    return labels


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class LoadedModel:
    """A checked model and, when it was parsed from the file alone (no external data), the
    file's bytes: onnxruntime can take those, plus a few appended fields, instead of the model
    serialised again (:func:`quantbench.backends.onnxruntime.expose_for_session`)."""

    model: onnx.ModelProto
    source: bytes | None
    hash: str
    #: the model's check, when the caller deferred it (:func:`read_model`)
    check: Callable[[], None] | None = None


def load_model(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX file; every failure is one line naming the file."""
    return read_model(path).model


def read_model(path: str | Path, defer_check: bool = False) -> LoadedModel:
    """:func:`load_model` reading the file once: parsed, checked (``onnx.checker`` on the bytes,
    not the path, which would read and parse the file again) and hashed (on a thread, as hashlib
    lets go of the GIL) from the same bytes. ``defer_check``: the check is returned undone,
    as :attr:`LoadedModel.check`, for a caller that runs it beside work that lets go of the GIL
    (the checker holds it)."""
    p = Path(path)
    if p.is_dir():
        raise QuantbenchError(f"{p}: a folder, not a model file; give the .onnx file's path")
    if not p.is_file():
        raise QuantbenchError(f"{p}: model file not found")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise QuantbenchError(f"{p}: cannot read the model file ({exc.strerror})") from None
    fmt = onnx.serialization.registry.get_format_from_file_extension(p.suffix) or "protobuf"
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-hash") as hasher:
        digest = hasher.submit(lambda: hashlib.sha256(raw).hexdigest())
        model = _parsed(raw, fmt, p)
        external = _external_files(model)
        if external:
            digest = hasher.submit(_digest, raw, p.parent, external)
            load_external_data_for_model(model, str(p.parent))
        source = raw if fmt == "protobuf" and not external else None
        _check_input_ranks(model, p)
        checked = checkable(model)
        if checked is model:  # with external data, the path: it says where the data is
            checked = source or (str(p) if external and fmt == "protobuf" else model)
        check = functools.partial(_check, checked, p)
        if not defer_check:
            check()
        return LoadedModel(model, source, digest.result(), check if defer_check else None)


@contextmanager
def _invalid_first(check: Callable[[], None] | None) -> Iterator[None]:
    """Should the block fail, ``check`` (a model's deferred check) runs first: an invalid
    model is reported as such, not by what failed on it."""
    try:
        yield
    except BaseException:
        if check is not None:
            check()
        raise


def _check(checked: onnx.ModelProto | bytes | str, p: Path) -> None:
    try:
        onnx.checker.check_model(checked)
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{p}: invalid ONNX model: {first_line(exc)}") from None


def _external_files(model: onnx.ModelProto) -> list[str]:
    """The files (``location``s, relative to the model's folder) where tensors of ``model``
    (initializers or tensor attributes, in any subgraph) keep their data; empty when none."""
    found: dict[str, None] = {}

    def visit(g: onnx.GraphProto) -> None:
        tensors = list(g.initializer)
        for node in g.node:
            for a in node.attribute:
                tensors += [a.t] if a.HasField("t") else []
                tensors += list(a.tensors)
                for sub in [a.g] if a.HasField("g") else []:
                    visit(sub)
                for sub in a.graphs:
                    visit(sub)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                entries = {e.key: e.value for e in t.external_data}
                found.setdefault(entries.get("location", ""), None)

    visit(model.graph)
    return list(found)


def _digest(raw: bytes, folder: Path, external: list[str]) -> str:
    """sha256 of the model file and of every file holding its external data, so that a
    cache keyed by it goes stale when the weights change in either."""
    h = hashlib.sha256(raw)
    for location in sorted(external):
        h.update(f"\0{location}\0".encode())
        try:
            with open(folder / location, "rb") as f:
                data = hashlib.sha256()
                while chunk := f.read(1 << 24):
                    data.update(chunk)
                h.update(data.digest())
        except OSError:
            h.update(b"missing")  # loading the data reports it
    return h.hexdigest()


def _parsed(raw: bytes, fmt: str, p: Path) -> onnx.ModelProto:
    """``raw`` parsed in ``fmt``, the format ``p``'s extension names (binary protobuf unless it
    is a text format's, as ``onnx.load`` decides)."""
    try:
        model = onnx.load_model_from_string(raw, format=fmt)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many kinds
        raise QuantbenchError(
            f"{p}: not a readable ONNX model ({type(exc).__name__}); is the file truncated?"
        ) from None
    if not model.graph.node and not model.graph.output:
        raise QuantbenchError(f"{p}: not an ONNX model (empty graph); is the file truncated?")
    return model


def _check_input_ranks(model: onnx.ModelProto, p: Path | None) -> None:
    inits = {i.name for i in model.graph.initializer}
    for v in model.graph.input:
        if v.name not in inits and not v.type.tensor_type.HasField("shape"):
            raise QuantbenchError(
                f"{p or 'model'}: input {v.name!r} has no fixed rank; export the model with a "
                "static input rank (dynamic dimension sizes are fine)"
            )


def open_graph(
    path: str | Path | onnx.ModelProto, require_fixed_rank: bool = True, defer_check: bool = False
) -> Graph:
    """Load a model and derive types and constants once. ``defer_check``: the model's check is
    left to :meth:`Graph.finish_check` (a file's; a proto is not checked here)."""
    source: bytes | None = None
    check = None
    if isinstance(path, onnx.ModelProto):
        model, p, digest = path, None, proto_digest(path)
    else:
        p = Path(path)
        loaded = read_model(p, defer_check)
        model, source, digest, check = loaded.model, loaded.source, loaded.hash, loaded.check
    with _invalid_first(check):
        g = _derived_graph(model, p, digest, source, not isinstance(path, (str, Path)))
        if require_fixed_rank:
            _check_input_ranks(g.model, p)
        g.inputs = _graph_inputs(g.model, p)
    g.pending_check = check
    return g


def _derived_graph(
    model: onnx.ModelProto, p: Path | None, digest: str, source: bytes | None, copy: bool
) -> Graph:
    """The graph of ``model`` with its types, outputs and constants (``copy``: a caller's
    proto is left untouched by the dynamic-dim rewrite)."""
    model, rewritten = _dynamic_dims(model, copy=copy)
    g = Graph(model=model, path=p, hash=digest, source=None if rewritten else source)
    g.elem_types = _elem_types(model)
    g.outputs = [_spec(v) for v in model.graph.output]
    g.constants = constant_tensors(model)
    return g


def _dynamic_dims(model: onnx.ModelProto, copy: bool) -> tuple[onnx.ModelProto, bool]:
    """Exporters write a dynamic dim as ``dim_value: -1`` (paddle2onnx) or ``0``; onnxruntime
    takes -1 as dynamic but 0 as a static size of zero, so both become unnamed dynamic dims of
    the graph's inputs, outputs and value_info (``copy``: leave a caller's proto untouched);
    also says whether anything was rewritten."""

    def nonpositive(m: onnx.ModelProto) -> list[onnx.TensorShapeProto.Dimension]:
        values = [*m.graph.input, *m.graph.output, *m.graph.value_info]
        return [
            d
            for v in values
            for d in v.type.tensor_type.shape.dim
            if d.HasField("dim_value") and d.dim_value <= 0
        ]

    if not nonpositive(model):
        return model, False
    if copy:
        clone = onnx.ModelProto()
        clone.CopyFrom(model)
        model = clone
    for d in nonpositive(model):
        d.ClearField("dim_value")
    return model, True


def _spec(v: onnx.ValueInfoProto) -> TensorSpec:
    """A value's signature; a dim is static only when it is a positive ``dim_value``."""
    t = v.type.tensor_type
    dims: list[int | str | None] = []
    if t.HasField("shape"):
        for d in t.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
    return TensorSpec(v.name, np.dtype(_NP_DTYPES.get(t.elem_type, np.float32)), tuple(dims))


def _graph_inputs(model: onnx.ModelProto, p: Path | None = None) -> list[TensorSpec]:
    """The inputs data must feed (initializers listed as inputs are not), with types numpy
    can hold: an input of another type (string, float8, ...) is refused by name."""
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        elem = v.type.tensor_type.elem_type
        if elem not in _NP_DTYPES:
            kind = onnx.TensorProto.DataType.Name(elem) if elem else "no tensor type"
            raise QuantbenchError(
                f"{p or 'model'}: input {v.name!r} has element type {kind}; quantbench feeds "
                f"only {', '.join(sorted(np.dtype(t).name for t in _NP_DTYPES.values()))} inputs"
            )
        specs.append(_spec(v))
    return specs


def inferred_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types ONNX shape inference gives ``model``'s tensors, best effort (an op it does
    not know: what the graph itself declares), initializers included; inferred on
    :func:`weightless` ``model``."""
    try:
        inferred = shape_inference.infer_shapes(weightless(model), strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is best effort (custom ops, > 2 GiB)
        inferred = model
    g = inferred.graph
    types = {i.name: i.data_type for i in g.initializer}
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    return types


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor, from shape inference where the graph does not say.

    ONNX shape inference knows no contrib op (``com.microsoft.Gelu`` ...), so node outputs it
    leaves untyped are asked of onnxruntime, which types every op it can run.
    """
    try:
        inferred = shape_inference.infer_shapes(weightless(model), strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is best effort (custom ops)
        inferred = model
    types: dict[str, int] = {}
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    for init in g.initializer:
        types[init.name] = init.data_type
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    missing = [o for n in g.node for o in n.output if o and o not in types]
    if missing:
        types.update(onnxruntime_types(model, missing))
    return types


#: an initializer larger than this (serialised bytes) loses its payload in :func:`weightless`
WEIGHTLESS_ABOVE = 1024


def weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large initializers keep their name, type and dims but no data;
    every other field as it was.

    Type inference reads no weight (a shape input is small, and kept), but ``infer_shapes``
    serialises the whole model into C++ and back: 0.2 s for a 46 MB ResNet-18, against 0.02 s
    for this copy and 1 ms to infer it (the same types on every model of the corpus).
    """
    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip="graph")
    _copy_fields(model.graph, copy.graph, skip="initializer")
    for init in model.graph.initializer:
        stub = copy.graph.initializer.add()
        if init.ByteSize() <= WEIGHTLESS_ABOVE:
            stub.CopyFrom(init)
        else:
            stub.name, stub.data_type = init.name, init.data_type
            stub.dims.extend(init.dims)
    return copy


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    """Every set field of ``source`` but ``skip`` into ``target`` (scalars set, repeated fields
    extended: a ModelProto's and GraphProto's only singular message field is the graph)."""
    for field_, value in source.ListFields():
        if field_.name == skip:
            continue
        if isinstance(value, (str, int, float, bytes)):
            setattr(target, field_.name, value)
        else:
            getattr(target, field_.name).extend(value)


#: onnxruntime's type strings -> ONNX element types (the float types calibration cares about,
#: and the integer/bool types that must be told apart from them).
_ORT_TYPES = {
    "tensor(float)": onnx.TensorProto.FLOAT,
    "tensor(float16)": onnx.TensorProto.FLOAT16,
    "tensor(double)": onnx.TensorProto.DOUBLE,
    "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
    "tensor(int64)": onnx.TensorProto.INT64,
    "tensor(int32)": onnx.TensorProto.INT32,
    "tensor(int8)": onnx.TensorProto.INT8,
    "tensor(uint8)": onnx.TensorProto.UINT8,
    "tensor(bool)": onnx.TensorProto.BOOL,
}


def onnxruntime_types(model: onnx.ModelProto, names: list[str]) -> dict[str, int]:
    """Types of ``names`` as onnxruntime resolves them: exposed as untyped graph outputs, typed
    by the session's own inference (no inference is run), plugin ops as onnxruntime runs them
    (the op itself, or lowered: :func:`for_onnxruntime`; a per-sample DWConv2D with a dynamic
    batch has no lowering). Empty when onnxruntime cannot load the model (an op it does not
    know); those tensors stay untyped (:func:`untyped_tensors`)."""
    import onnxruntime as ort

    plan = for_onnxruntime(model) if ops_in(model) else None
    probe = onnx.ModelProto()  # a copy: the caller's model is never changed
    probe.CopyFrom(plan.model if plan is not None else model)
    present = {o.name for o in probe.graph.output}
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    if plan is not None:
        plan.register(options)
    try:  # an op onnxruntime lacks: the tensors stay untyped
        with loadable(probe) as source:
            session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return {}
    wanted = set(names)
    return {
        o.name: _ORT_TYPES[o.type]
        for o in session.get_outputs()
        if o.name in wanted and o.type in _ORT_TYPES
    }


def untyped_tensors(g: Graph) -> list[str]:
    """Non-constant node outputs whose type neither ONNX nor onnxruntime could tell: they
    cannot be calibrated, and callers name them instead of dropping them silently."""
    return [
        o
        for n in g.model.graph.node
        for o in n.output
        if o and o not in g.elem_types and o not in g.constants
    ]


def constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Initializers, Constant outputs and outputs of nodes fed only by constants."""
    graph_inputs = {v.name for v in model.graph.input}
    const = {i.name for i in model.graph.initializer if i.name not in graph_inputs}
    for n in model.graph.node:  # nodes are topologically sorted in a valid model
        if n.op_type in _NONDETERMINISTIC:
            continue
        real_inputs = [i for i in n.input if i]
        if n.op_type == "Constant" or (real_inputs and all(i in const for i in real_inputs)):
            const.update(o for o in n.output if o)
    return const


# --------------------------------------------------------------------------- graph questions


def weighted_nodes(g: Graph, op_types: Iterable[str] = WEIGHTED_OP_TYPES) -> list[onnx.NodeProto]:
    wanted = set(op_types)
    return [n for n in g.model.graph.node if n.op_type in wanted]


def is_dynamic_weight_conv(g: Graph, node: onnx.NodeProto) -> bool:
    """A Conv whose kernel (or bias) is a runtime tensor: TensorRT's ConvMultiInput."""
    if node.op_type not in ("Conv", "ConvTranspose"):
        return False
    return any(name and name not in g.constants for name in node.input[1:3])


def dynamic_weight_convs(g: Graph) -> list[onnx.NodeProto]:
    return [n for n in g.model.graph.node if is_dynamic_weight_conv(g, n)]


def activation_inputs(g: Graph, node: onnx.NodeProto) -> list[str]:
    """The runtime float inputs a weighted op quantizes: data, and a runtime weight if any."""
    if node.op_type in ("Conv", "ConvTranspose", "DWConv2D", "Gemm", "MatMul"):
        candidates = list(node.input[:2])
    else:
        candidates = list(node.input)
    return [t for t in candidates if t and t not in g.constants and g.is_float(t)]


def residual_add_inputs(g: Graph, op_types: Iterable[str] = WEIGHTED_OP_TYPES) -> dict[str, str]:
    """``{add_node_name: residual_tensor}`` for each Add that follows a weighted op.

    TensorRT fuses ``Conv -> Add`` and the precision of the Add's *other* input decides whether
    the fused layer can output INT8, so that input is quantized too (reference §4.2 item 4).
    """
    producers = g.producers()
    weighted = set(op_types)
    out: dict[str, str] = {}
    labels = node_labels(g.model.graph.node)
    for i, n in enumerate(g.model.graph.node):
        if n.op_type != "Add" or len(n.input) != 2:
            continue
        kinds = [producers.get(t) for t in n.input]
        from_weighted = [k is not None and k.op_type in weighted for k in kinds]
        if any(from_weighted) and not all(from_weighted):
            residual = n.input[from_weighted.index(False)]
        elif all(from_weighted):
            residual = n.input[1]
        else:
            continue
        if residual not in g.constants and g.is_float(residual):
            out[labels[i]] = residual
    return out


def calibration_tensors(g: Graph, mode: str = "all") -> list[str]:
    """Tensors to collect statistics for, in network order.

    ``all``: every float graph input and every float node output (what a TensorRT cache for
    implicit INT8 should cover). ``quantizable``: only what the Q/DQ path needs — the runtime
    inputs of weighted ops (dynamic weights included) and residual Add inputs.
    """
    if mode not in ("all", "quantizable"):
        raise QuantbenchError(f"--tensors must be 'all' or 'quantizable', not {mode!r}")
    names: list[str] = []
    if mode == "all":
        names += [s.name for s in g.inputs if s.is_float]
        for n in g.model.graph.node:
            names += [o for o in n.output if o and o not in g.constants and g.is_float(o)]
    else:
        residual = set(residual_add_inputs(g, CALIBRATED_OP_TYPES).values())
        wanted = set()
        for n in weighted_nodes(g, CALIBRATED_OP_TYPES):
            wanted.update(activation_inputs(g, n))
        wanted |= residual
        order = [s.name for s in g.inputs] + [o for n in g.model.graph.node for o in n.output]
        names = [t for t in order if t in wanted]
    return list(dict.fromkeys(names))


def tensor_order(g: Graph) -> dict[str, int]:
    """Position of every tensor in network order (graph inputs first)."""
    order = [s.name for s in g.inputs] + [o for n in g.model.graph.node for o in n.output if o]
    return {name: i for i, name in enumerate(dict.fromkeys(order))}


def toposorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes in an order where each follows its inputs' producers (a rewrite
    that appends nodes leaves them last): onnx-graphsurgeon's sort, the model's IR version and
    opsets kept."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    graph.toposort()
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    return out


def second_stage_quantizers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The QuantizeLinear nodes of second stages: each reads ``Sub(x, DQ(Q(x)))``, the first
    stage's rounding error (:mod:`quantbench.refine.twostage`). A TensorRT calibration cache
    cannot express them: the residual is no tensor of the FP32 model."""
    producer = {o: n for n in model.graph.node for o in n.output}
    found = []
    for n in model.graph.node:
        sub = producer.get(n.input[0]) if n.op_type == "QuantizeLinear" else None
        if sub is None or sub.op_type != "Sub" or len(sub.input) != 2:
            continue
        dq = producer.get(sub.input[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q = producer.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] == sub.input[0]:
            found.append(n)
    return found
