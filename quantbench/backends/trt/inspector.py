"""What a TensorRT engine really runs: its fused layers, their precision, and the ONNX nodes
inside each.

Input is the JSON of ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)``
(``trtexec --exportLayerInfo``): ``{"Layers": [...], "Bindings": [...]}`` where a layer is a
dict when the engine was built with ProfilingVerbosity.DETAILED and a bare name string with
LAYER_NAMES_ONLY. TensorRT names a fused layer after its parts, for example
``features.0.0.weight + QuantizeLinear_7 + Conv_9 + PWN(Clip_13)`` (an initializer, two ONNX nodes
and a pointwise fusion), ``Reformatting CopyNode for Input Tensor 0 to <layer>`` (a layout
conversion TensorRT inserted) or ``{ForeignNode[<first>...<last>]}`` (a Myelin region). From 10.0
a detailed layer also carries ``Metadata`` = ``[ONNX Layer: <node>]`` entries separated by
``\\x1f``/``\\x1e``, which is exact and preferred over reading the name.

Only tensors a layer writes exist in the engine: comparing an INT8 engine with the ONNX model is
meaningful only at :func:`comparable_tensors`, never at every ONNX tensor (marking every tensor
as an output would disable the very fusions being measured).

Also parses ``trtexec --dumpProfile --exportProfile`` JSON (``[{"count": N}, {"name", "timeMs",
"averageMs", "medianMs", "percentage"}, ...]``) and joins it to the layers by name.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from quantbench.errors import QuantbenchError

# -- precision ----------------------------------------------------------------------------------

_PRECISION_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), precision)
    for pattern, precision in (
        (r"\b(?:BFloat16|BF16)\b", "bf16"),
        (r"\bFP8\b", "fp8"),
        (r"\b(?:FP4|FP4E2M1)\b", "fp4"),
        (r"\b(?:FP16|Half)\b", "fp16"),
        (r"\b(?:FP32|Float)\b", "fp32"),
        (r"\bDouble\b", "fp64"),
        (r"\b(?:UInt8|UINT8)\b", "uint8"),
        (r"\b(?:Int8|INT8)\b", "int8"),
        (r"\b(?:Int4|INT4)\b", "int4"),
        (r"\b(?:Int32|INT32)\b", "int32"),
        (r"\b(?:Int64|INT64)\b", "int64"),
        (r"\b(?:Bool|BOOL)\b", "bool"),
    )
)


def parse_precision(format_datatype: str | None) -> str | None:
    """``"Thirty-two wide channel vectorized row major Int8 format"`` -> ``"int8"``.

    Accepts both the long layout descriptions of TensorRT 8.x and the bare type names
    (``Half``, ``Float``) newer versions print; None when no type is named.
    """
    if not format_datatype:
        return None
    for pattern, precision in _PRECISION_PATTERNS:
        if pattern.search(format_datatype):
            return precision
    return None


# -- layers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineTensor:
    name: str
    dimensions: tuple[int, ...] | None = None
    format: str | None = None
    location: str | None = None

    @property
    def precision(self) -> str | None:
        return parse_precision(self.format)


@dataclass(frozen=True)
class EngineLayer:
    index: int
    name: str
    layer_type: str | None = None
    inputs: tuple[EngineTensor, ...] = ()
    outputs: tuple[EngineTensor, ...] = ()
    tactic: str | None = None
    origin: str | None = None
    metadata_nodes: tuple[str, ...] = ()  # ONNX node names from "Metadata" (TensorRT >= 10)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def input_precision(self) -> str | None:
        """Precision of the first input: the type the layer computes in (TREx's convention)."""
        return self.inputs[0].precision if self.inputs else None

    @property
    def output_precision(self) -> str | None:
        return self.outputs[0].precision if self.outputs else None


def _tensor(raw: Mapping[str, Any]) -> EngineTensor:
    dims = raw.get("Dimensions")
    return EngineTensor(
        name=str(raw.get("Name", "")),
        dimensions=tuple(int(d) for d in dims) if isinstance(dims, list) else None,
        format=raw.get("Format/Datatype"),
        location=raw.get("Location"),
    )


def metadata_onnx_nodes(metadata: str | None) -> tuple[str, ...]:
    """``"[ONNX Layer: a]\\x1f[ONNX Layer: b]"`` -> ``("a", "b")``."""
    if not metadata:
        return ()
    names = []
    for entry in re.split(r"[\x1e\x1f]", metadata):
        entry = entry.strip()
        prefix = "[ONNX Layer: "
        if entry.startswith(prefix) and entry.endswith("]"):
            names.append(entry[len(prefix) : -1])
    return tuple(names)


def _layer(index: int, raw: Any) -> EngineLayer:
    if isinstance(raw, str):  # ProfilingVerbosity.LAYER_NAMES_ONLY
        return EngineLayer(index=index, name=raw)
    if not isinstance(raw, Mapping) or "Name" not in raw:
        raise QuantbenchError(f"engine layer #{index} has no 'Name': not engine-inspector JSON")
    return EngineLayer(
        index=index,
        name=str(raw["Name"]),
        layer_type=raw.get("LayerType"),
        inputs=tuple(_tensor(t) for t in raw.get("Inputs", [])),
        outputs=tuple(_tensor(t) for t in raw.get("Outputs", [])),
        tactic=raw.get("TacticName") or raw.get("TacticValue"),
        origin=raw.get("Origin"),
        metadata_nodes=metadata_onnx_nodes(raw.get("Metadata")),
        raw=raw,
    )


def engine_layers(graph_json: Mapping[str, Any] | Sequence[Any] | str) -> list[EngineLayer]:
    """Parse engine-inspector JSON (dict, its text, or the bare ``Layers`` list)."""
    if isinstance(graph_json, str):
        try:
            graph_json = json.loads(graph_json)
        except json.JSONDecodeError as exc:
            raise QuantbenchError(f"engine layer information is not JSON: {exc}") from exc
    if isinstance(graph_json, Mapping):
        if "Layers" not in graph_json:
            raise QuantbenchError("engine layer information has no 'Layers' (not inspector JSON)")
        raw_layers = graph_json["Layers"]
    else:
        raw_layers = graph_json
    return [_layer(index, raw) for index, raw in enumerate(raw_layers)]


def engine_bindings(graph_json: Mapping[str, Any]) -> list[str]:
    """Names of the engine's I/O tensors (``Bindings``)."""
    return [str(name) for name in graph_json.get("Bindings", [])]


def precision_counts(
    layers: Iterable[EngineLayer], which: Literal["input", "output"] = "input"
) -> Counter[str | None]:
    """How many layers compute in (``input``) or write (``output``) each precision."""
    attribute = "input_precision" if which == "input" else "output_precision"
    return Counter(getattr(layer, attribute) for layer in layers)


def engine_graph_json(engine_bytes: bytes, trt_module: ModuleType | None = None) -> dict[str, Any]:
    """Run TensorRT's IEngineInspector on a serialized engine and return its JSON."""
    from quantbench.backends.trt.log import make_logger
    from quantbench.backends.trt.version import import_tensorrt

    trt = trt_module if trt_module is not None else import_tensorrt()
    runtime = trt.Runtime(make_logger(trt))
    engine = runtime.deserialize_cuda_engine(bytes(engine_bytes))
    if engine is None:
        raise QuantbenchError("TensorRT could not load the engine to inspect it")
    inspector = engine.create_engine_inspector()
    return json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


# -- layer names --------------------------------------------------------------------------------

LayerKind = Literal["layer", "reformat", "foreign"]

_REFORMAT = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor (\d+) to (.+)$", re.S)
_FOREIGN = re.compile(r"^\{ForeignNode\[(.*)\]\}$", re.S)
_PWN = re.compile(r"^PWN\((.*)\)$", re.S)
_UNNAMED = re.compile(r"^\(Unnamed Layer\* \d+\) \[[^\]]*\]")
_MYELIN_INTERNAL = re.compile(r"^__my[el]")
# Helper layers the ONNX parser / builder add next to an ONNX node (seen in TREx's sample engines).
_HELPER_PREFIXES = (
    "copied_squeeze_after_",
    "unsqueeze_node_after_",
    "squeeze_after_",
    "reshape_after_",
    "reshape_before_",
    "transpose_before_",
    "transpose_after_",
)


@dataclass(frozen=True)
class NameParts:
    """A layer name split into what may be ONNX names and what TensorRT made up."""

    kind: LayerKind
    candidates: tuple[str, ...]  # tokens that may be ONNX node or initializer names, in order
    trt_parts: tuple[str, ...]  # tokens TensorRT generated (no ONNX counterpart)
    related: tuple[str, ...] = ()  # ONNX-name candidates a helper/reformat layer serves
    direction: str | None = None  # reformat: "Input"/"Output" tensor of the related layer
    foreign_range: tuple[str, str] | None = None  # Myelin region: first and last node


def _split_top_level(text: str, separators: Sequence[str]) -> list[str]:
    """Split on separators outside parentheses/brackets; plain split if brackets don't balance."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                break
        elif depth == 0:
            sep = next((s for s in separators if text.startswith(s, i)), None)
            if sep is not None:
                parts.append(text[start:i])
                i += len(sep)
                start = i
                continue
        i += 1
    else:
        if depth == 0:
            parts.append(text[start:])
            return [p for p in parts if p]
    return [p for p in text.split(separators[0]) if p]


def _classify(token: str, candidates: list[str], trt_parts: list[str], related: list[str]) -> None:
    token = token.strip()
    pointwise = _PWN.match(token)
    if pointwise:
        for inner in _split_top_level(pointwise.group(1), (" + ", ", ")):
            _classify(inner, candidates, trt_parts, related)
        return
    if _UNNAMED.match(token) or _MYELIN_INTERNAL.match(token):
        trt_parts.append(token)
        return
    for prefix in _HELPER_PREFIXES:
        if token.startswith(prefix):
            trt_parts.append(token)
            inner: list[str] = []
            _classify(token[len(prefix) :], inner, [], [])
            related.extend(inner)
            return
    candidates.append(token)


def parse_layer_name(name: str) -> NameParts:
    """Split a TensorRT layer name into ONNX-name candidates and TensorRT-made parts."""
    reformat = _REFORMAT.match(name)
    if reformat:
        target = parse_layer_name(reformat.group(3))
        return NameParts(
            kind="reformat",
            candidates=(),
            trt_parts=(name,),
            related=target.candidates + target.related,
            direction=reformat.group(1),
        )
    foreign = _FOREIGN.match(name)
    if foreign:
        inner = foreign.group(1)
        first, sep, last = inner.partition("...")
        ends = (first, last) if sep else (inner, inner)
        return NameParts(
            kind="foreign",
            candidates=tuple(dict.fromkeys(ends)),
            trt_parts=(),
            foreign_range=ends,
        )
    candidates: list[str] = []
    trt_parts: list[str] = []
    related: list[str] = []
    for token in _split_top_level(name, (" + ",)):
        _classify(token, candidates, trt_parts, related)
    return NameParts("layer", tuple(candidates), tuple(trt_parts), tuple(related))


# -- mapping to ONNX ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OnnxIndex:
    """Names in an ONNX graph as TensorRT's ONNX parser names them."""

    node_order: tuple[str, ...]
    node_outputs: Mapping[str, tuple[str, ...]]
    initializers: frozenset[str]
    tensors: frozenset[str]  # graph inputs and node outputs: what an engine layer can write
    producers: Mapping[str, str]

    @classmethod
    def from_model(cls, model: Any) -> OnnxIndex:
        graph = model.graph
        order, outputs, producers = [], {}, {}
        for node in graph.node:
            # onnx-tensorrt names an unnamed node "node_of_<first output>" (importerUtils.cpp).
            name = node.name or (f"node_of_{node.output[0]}" if node.output else "")
            order.append(name)
            outputs[name] = tuple(o for o in node.output if o)
            for out in outputs[name]:
                producers[out] = name
        initializers = frozenset(init.name for init in graph.initializer)
        tensors = frozenset(producers) | (frozenset(i.name for i in graph.input) - initializers)
        return cls(tuple(order), outputs, initializers, tensors, producers)


@dataclass(frozen=True)
class MappedTensor:
    name: str
    precision: str | None
    format: str | None
    dimensions: tuple[int, ...] | None
    onnx_tensor: bool | None  # None when no ONNX model was given
    onnx_producer: str | None = None


@dataclass(frozen=True)
class LayerMapping:
    """One engine layer and the ONNX graph elements it stands for."""

    layer: EngineLayer
    kind: LayerKind
    source: Literal["metadata", "name"]
    onnx_nodes: tuple[str, ...]  # exact ONNX node names (all candidates when no model is known)
    initializers: tuple[str, ...]
    trt_parts: tuple[str, ...]
    unmatched: tuple[str, ...]  # name tokens that are in neither the ONNX nodes nor initializers
    related_nodes: tuple[str, ...]  # the node a reformat/helper layer serves
    outputs: tuple[MappedTensor, ...]

    @property
    def name(self) -> str:
        return self.layer.name


def map_layers_to_onnx(layers: Iterable[EngineLayer], onnx_model: Any = None) -> list[LayerMapping]:
    """Map each engine layer to the ONNX nodes/initializers it contains.

    With ``onnx_model`` (an ``onnx.ModelProto``) names are checked against the graph; without one
    ``onnx_nodes`` holds the candidates read off the layer name and ``onnx_tensor`` is None.
    """
    index = OnnxIndex.from_model(onnx_model) if onnx_model is not None else None
    return [_map_layer(layer, index) for layer in layers]


def _map_layer(layer: EngineLayer, index: OnnxIndex | None) -> LayerMapping:
    parts = parse_layer_name(layer.name)
    nodes: list[str] = []
    initializers: list[str] = []
    unmatched: list[str] = []
    if index is None:
        nodes = list(parts.candidates)
    else:
        known_nodes = set(index.node_order)
        for token in parts.candidates:
            if token in known_nodes:
                nodes.append(token)
            elif token in index.initializers:
                initializers.append(token)
            else:
                unmatched.append(token)
        if parts.foreign_range is not None:
            nodes = _node_range(index, parts.foreign_range) or nodes
    source: Literal["metadata", "name"] = "name"
    if layer.metadata_nodes:
        nodes, source = list(dict.fromkeys(layer.metadata_nodes)), "metadata"
        unmatched = [t for t in unmatched if t not in layer.metadata_nodes]
    related = [r for r in parts.related if index is None or r in set(index.node_order)]
    return LayerMapping(
        layer=layer,
        kind=parts.kind,
        source=source,
        onnx_nodes=tuple(dict.fromkeys(nodes)),
        initializers=tuple(dict.fromkeys(initializers)),
        trt_parts=parts.trt_parts,
        unmatched=tuple(unmatched),
        related_nodes=tuple(dict.fromkeys(related)),
        outputs=tuple(_mapped_tensor(t, index) for t in layer.outputs),
    )


def _node_range(index: OnnxIndex, ends: tuple[str, str]) -> list[str]:
    """Nodes from ``first`` to ``last`` in graph order: a Myelin region's nodes (approximate:
    TensorRT names only the ends, and graph order may interleave other branches)."""
    order = index.node_order
    if ends[0] not in order or ends[1] not in order:
        return []
    start, stop = order.index(ends[0]), order.index(ends[1])
    return list(order[min(start, stop) : max(start, stop) + 1])


def _mapped_tensor(tensor: EngineTensor, index: OnnxIndex | None) -> MappedTensor:
    is_onnx = None if index is None else tensor.name in index.tensors
    producer = index.producers.get(tensor.name) if index is not None else None
    return MappedTensor(
        tensor.name, tensor.precision, tensor.format, tensor.dimensions, is_onnx, producer
    )


def comparable_tensors(mappings: Iterable[LayerMapping]) -> list[MappedTensor]:
    """ONNX tensors the engine really writes (one entry per tensor, first writer wins)."""
    seen: dict[str, MappedTensor] = {}
    for mapping in mappings:
        for tensor in mapping.outputs:
            if tensor.onnx_tensor and tensor.name not in seen:
                seen[tensor.name] = tensor
    return list(seen.values())


# -- trtexec profile ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTiming:
    name: str
    average_ms: float
    time_ms: float | None = None
    median_ms: float | None = None
    percentage: float | None = None


@dataclass(frozen=True)
class EngineProfile:
    count: int | None  # number of profiled inference runs
    layers: tuple[LayerTiming, ...]

    @property
    def total_average_ms(self) -> float:
        return sum(t.average_ms for t in self.layers)


def _optional_float(raw: Mapping[str, Any], key: str) -> float | None:
    return float(raw[key]) if key in raw else None


def parse_profile(profile_json: Sequence[Any] | str) -> EngineProfile:
    """Parse ``trtexec --exportProfile`` JSON: ``[{"count": N}, {"name": ..., ...}, ...]``."""
    if isinstance(profile_json, str):
        profile_json = json.loads(profile_json)
    if not isinstance(profile_json, list):
        raise QuantbenchError('a trtexec profile is a JSON list ([{"count": N}, {...}, ...])')
    count = None
    timings = []
    for position, entry in enumerate(profile_json):
        if "name" not in entry:
            if "count" in entry:
                count = int(entry["count"])
                continue
            raise QuantbenchError(f"profile entry #{position} has neither 'name' nor 'count'")
        if "averageMs" not in entry:
            raise QuantbenchError(f"profile entry {entry['name']!r} has no 'averageMs'")
        timings.append(
            LayerTiming(
                name=str(entry["name"]),
                average_ms=float(entry["averageMs"]),
                time_ms=_optional_float(entry, "timeMs"),
                median_ms=_optional_float(entry, "medianMs"),
                percentage=_optional_float(entry, "percentage"),
            )
        )
    return EngineProfile(count, tuple(timings))


@dataclass(frozen=True)
class ProfileJoin:
    matched: tuple[tuple[EngineLayer, LayerTiming], ...]
    layers_without_timing: tuple[str, ...]
    timings_without_layer: tuple[str, ...]


def join_profile(layers: Sequence[EngineLayer], profile: EngineProfile) -> ProfileJoin:
    """Pair layers with timings by name; a name occurring k times pairs its k-th occurrences."""
    pending: dict[str, list[LayerTiming]] = {}
    for timing in profile.layers:
        pending.setdefault(timing.name, []).append(timing)
    matched, missing = [], []
    for layer in layers:
        queue = pending.get(layer.name)
        if queue:
            matched.append((layer, queue.pop(0)))
        else:
            missing.append(layer.name)
    leftover = [t.name for queue in pending.values() for t in queue]
    return ProfileJoin(tuple(matched), tuple(missing), tuple(leftover))
