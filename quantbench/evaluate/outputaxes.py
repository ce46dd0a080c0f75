"""What an ONNX graph says about the axes of its outputs, which argmax agreement reads.

- :func:`channels_first_outputs`: outputs a convolution made (NCHW: classes on axis 1), and
  :func:`channel_class_doubts`: those whose channels no softmax made class scores.
- :func:`class_axis_evidence`: outputs whose last axis the graph gives no reason to read as
  classes, and why (a walk back along that axis through the ops that made it).
- :func:`samples_second_outputs`: outputs declared with the samples on axis 1 (time-major).
- :func:`concat_parts`: outputs that join different kinds of values (a detector head's boxes
  and class scores), and where each part lies.
- :func:`probability_outputs`: outputs a Sigmoid made (through reshapes only): probabilities,
  whose decision at 0.5 a binary classifier's agreement reads.
- :func:`value_free_outputs`: integer outputs no float value reaches (shapes, copies of integer
  inputs), which quantization cannot change.
- :func:`selection_sources`: outputs after an op whose output size depends on the data (NMS,
  NonZero), and the float tensors that op chose from.

Pure graph analysis: no data, no metrics (:mod:`quantbench.evaluate.metrics` uses these).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import onnx

from quantbench.model.graph import constant_tensors, weightless


def channels_first_outputs(model: Any) -> frozenset[str]:
    """Outputs of an ONNX model whose values come from a convolution-family op through
    value-wise ops only (activations, arithmetic with constants, casts), so their layout is
    NCHW: the class axis of a rank-4 one is 1."""
    producer = {out: node for node in model.graph.node for out in node.output}
    constants = constant_tensors(model)
    found = set()
    for value in model.graph.output:
        tensor = value.name
        for _ in range(64):  # a chain of value-wise ops, not a walk of the whole graph
            node = producer.get(tensor)
            if node is None or node.op_type not in _VALUEWISE:
                break
            if node.op_type == "Softmax" and _softmax_axis(node) not in (1, -3):
                break
            data = [i for i in node.input if i and i not in constants]
            if len(data) != 1:
                break
            tensor = data[0]
        node = producer.get(tensor)
        if node is not None and node.op_type in _NCHW_OPS:
            found.add(value.name)
    return frozenset(found)


def channel_class_doubts(
    model: Any, channels_first: Collection[str] | None = None
) -> dict[str, str]:
    """The :func:`channels_first_outputs` (``channels_first`` where the caller has them) whose
    channels the graph gives no reason to read as classes, and why: per-pixel argmax agreement
    is only claimed where a softmax ran over the channels (perhaps before an upsampling).
    CRAFT's ``y`` holds two separate heatmaps (text and link scores, thresholded each on its
    own) and its ``feature`` 32 feature maps: an argmax over their channels gave an
    "agreement" of 0.27 where the maps' masks agreed to 0.99 IoU."""
    producer = {out: node for node in model.graph.node for out in node.output}
    constants = constant_tensors(model)
    return {
        name: (
            "its channels went through no softmax: they may be separate maps (a text "
            "detector's region and link scores, features), not class scores"
        )
        for name in sorted(
            channels_first_outputs(model) if channels_first is None else channels_first
        )
        if not _channel_softmax(name, producer, constants)
    }


def _channel_softmax(tensor: str, producer: Mapping[str, Any], constants: Collection[str]) -> bool:
    """Whether a softmax over axis 1 made ``tensor``, through value-wise ops and resizes."""
    for _ in range(64):
        node = producer.get(tensor)
        if node is None:
            return False
        if node.op_type in ("Softmax", "LogSoftmax"):
            return _softmax_axis(node) in (1, -3)
        if node.op_type in ("Resize", "Upsample"):
            tensor = node.input[0]
            continue
        data = [i for i in node.input if i and i not in constants]
        if node.op_type not in _VALUEWISE or len(data) != 1:
            return False
        tensor = data[0]
    return False


def class_axis_doubts(model: Any) -> dict[str, str]:
    """Outputs whose last axis the graph gives no reason to read as classes, and why: argmax
    agreement per position is only claimed for a last axis that a MatMul/Gemm produced (its
    output features), that a softmax ran over, or that is a convolution's channel axis moved
    last by a Transpose. A detector's ``[N, 4 + classes, anchors]`` head (YOLOv8: a Concat of
    boxes and class scores, anchors last) or a hidden state ``[N, T, D]`` is none of these, and
    an argmax over it would report a meaningless "agreement" (on nudenet's YOLOv8: 0.42 where
    the output's SQNR is 27.7 dB)."""
    return class_axis_evidence(model)[0]


def class_axis_evidence(model: Any) -> tuple[dict[str, str], dict[str, int]]:
    """:func:`class_axis_doubts`, and the outputs whose doubt does not hold where their last
    axis has a given size (a CRNN's ``Reshape(Linear [T*N, C], [T, N, -1])``: only the run
    shows that the -1 is C)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    constants = constant_tensors(model)
    walk = _LastAxisWalk(model, producer, constants)
    doubts, unless = {}, {}
    for value in model.graph.output:
        t = value.type.tensor_type
        rank = len(t.shape.dim) if t.HasField("shape") else None
        if why := walk.doubt(value.name, -1, rank):
            doubts[value.name] = f"its last axis may not hold class scores: {why}"
            if (value.name, -1) in walk.unless:
                unless[value.name] = walk.unless[(value.name, -1)]
    for name, why in _regression_heads(model, producer, constants).items():
        doubts.setdefault(name, f"its last axis may not hold class scores: {why}")
    return doubts, unless


def _regression_heads(
    model: Any, producer: Mapping[str, Any], constants: Collection[str]
) -> dict[str, str]:
    """Outputs a MatMul/Gemm made (plus a bias) beside an output whose softmax makes the
    class scores, of another size: a face or object detector's box and landmark regressions
    (MTCNN's O-Net: boxes [N, 4] and landmarks [N, 10] beside face/no-face softmax [N, 2]),
    whose argmax "agreement" meant nothing. Logits of the softmax's own size stay classes."""
    heads: dict[str, tuple[str, int | None]] = {}  # output -> (op that made it, last dim)
    for value in model.graph.output:
        node = _maker(value.name, producer, constants)
        dims = value.type.tensor_type.shape.dim
        last = dims[-1].dim_value if dims and dims[-1].dim_value > 0 else None
        heads[value.name] = (node.op_type if node is not None else "", last)
    classes = {
        name: size for name, (op, size) in heads.items() if op == "Softmax" and size is not None
    }
    if not classes:
        return {}
    scores, count = next(iter(classes.items()))
    return {
        name: (
            f"output {scores!r} holds the class scores (a softmax over {count}); this one's "
            f"{size} values a {op} made without one read as a regression (boxes, landmarks)"
        )
        for name, (op, size) in heads.items()
        if op in ("MatMul", "Gemm") and size is not None and size not in classes.values()
    }


#: ops that move or relabel values without changing them
_VALUE_KEEPING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


#: ops whose outputs stay within their inputs' range (moved, picked, or interpolated between
#: neighbours): a probability map stays one through them (an upsampled segmentation mask)
_RANGE_KEEPING = _VALUE_KEEPING | {"Transpose", "Slice", "Resize", "Upsample", "MaxPool"}


def _maker(
    tensor: str,
    producer: Mapping[str, Any],
    constants: Collection[str] = (),
    through: Collection[str] = _VALUE_KEEPING,
) -> Any | None:
    """The node that made ``tensor``'s values, seen through ops that only move them
    (``through``) and, with ``constants``, through a bias (Add/Sub of a constant); None for a
    graph input."""
    node = producer.get(tensor)
    for _ in range(64):  # a short chain, not a walk of the whole graph
        biased = node is not None and node.op_type in ("Add", "Sub") and bool(constants)
        if node is None or not (node.op_type in through or biased):
            break
        data = [i for i in node.input if i and i not in constants]
        if biased and len(data) != 1:
            break  # a sum of two computed tensors, not a bias
        node = producer.get(data[0]) if data else None
    return node


def probability_outputs(model: Any) -> frozenset[str]:
    """Outputs whose values a Sigmoid made, through ops that keep values in their range
    (reshapes, transposes, slices, resizes): probabilities in (0, 1), e.g. a wake-word,
    voice-activity or binary classifier's one score per sample, or a probability map."""
    producer = {out: node for node in model.graph.node for out in node.output}
    return frozenset(
        v.name
        for v in model.graph.output
        if (node := _maker(v.name, producer, through=_RANGE_KEEPING)) is not None
        and node.op_type == "Sigmoid"
    )


#: ops that read only their input's shape, never its values
_SHAPE_READERS = frozenset({"Shape", "Size"})
_FLOATS = frozenset(
    getattr(onnx.TensorProto, name) for name in ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")
)


def value_free_outputs(model: Any) -> frozenset[str]:
    """Integer or bool outputs that no float value reaches (a float input, weight or Constant,
    through any op but Shape/Size): a sequence length, an attention mask or token ids passed
    through. INT8 cannot change them, so their agreement (always 1) would prove nothing. One
    pass in graph order (ONNX graphs are topologically sorted); an op with a subgraph (If,
    Loop) counts as reached."""
    reached = {v.name for v in model.graph.input if v.type.tensor_type.elem_type in _FLOATS}
    reached |= {i.name for i in model.graph.initializer if i.data_type in _FLOATS}
    reached |= {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "Constant" and any(a.t.data_type in _FLOATS for a in n.attribute)
    }
    for node in model.graph.node:
        if node.op_type in _SHAPE_READERS:
            continue
        nested = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                     for a in node.attribute)  # fmt: skip
        if nested or any(i in reached for i in node.input if i):
            reached.update(o for o in node.output if o)
    return frozenset(
        v.name
        for v in model.graph.output
        if v.name not in reached and v.type.tensor_type.elem_type not in _FLOATS
    )


#: ops whose output size depends on the values they read: FP32 and INT8 may select differently
_SELECTIONS = frozenset({"NonMaxSuppression", "NonZero", "Compress"})
_COMPARISONS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"})


def selection_sources(model: Any) -> dict[str, list[str]]:
    """Outputs downstream of an op whose output size depends on the data (NonMaxSuppression,
    NonZero, Compress) -> the float tensors that op chose from: NMS's boxes and scores, the
    values a NonZero's or Compress' comparison read. What FP32 and INT8 select differs in size,
    so those outputs cannot be compared value by value; the tensors they select from can."""
    producer = {out: node for node in model.graph.node for out in node.output}
    constants = constant_tensors(model)
    found: dict[str, list[str]] = {}
    for value in model.graph.output:
        sources: list[str] = []
        seen: set[str] = set()
        stack = [value.name]
        while stack:
            node = producer.get(stack.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in _SELECTIONS:
                sources += [t for t in _chosen_from(node, producer, constants) if t not in sources]
            stack += [i for i in node.input if i]
        if sources:
            found[value.name] = sources
    return found


def _chosen_from(node: Any, producer: Mapping[str, Any], constants: Collection[str]) -> list[str]:
    """The float tensors a selection op chose from (see :func:`selection_sources`)."""
    if node.op_type == "NonMaxSuppression":
        return [t for t in node.input[:2] if t]
    condition = node.input[0] if node.op_type == "NonZero" else node.input[1]
    compared = producer.get(condition)
    if compared is None or compared.op_type not in _COMPARISONS:
        return []
    return [t for t in compared.input if t and t not in constants]


def samples_second_outputs(model: Any) -> frozenset[str]:
    """Outputs whose declared axis 1, not 0, is the first input's symbolic batch axis: a
    time-major ``[T, N, C]`` recognizer (PyTorch's CRNN/CTC exports)."""
    inits = {i.name for i in model.graph.initializer}
    feeds = [v for v in model.graph.input if v.name not in inits]
    dims = feeds[0].type.tensor_type.shape.dim if feeds else []
    batch = dims[0].dim_param if dims and dims[0].HasField("dim_param") else ""
    found = set()
    for value in model.graph.output if batch else ():
        out = value.type.tensor_type.shape.dim
        if len(out) >= 3 and out[1].dim_param == batch and out[0].dim_param != batch:
            found.add(value.name)
    return frozenset(found)


#: (axis, ((start, stop, op that made the part), ...)) of one joined output
Parts = tuple[int, tuple[tuple[int, int, str], ...]]
#: output -> its :data:`Parts`: see :func:`concat_parts`
OutputParts = dict[str, Parts]


def concat_parts(model: Any) -> OutputParts:
    """Outputs made by a Concat (perhaps then transposed) of parts that different kinds of op
    made, with the output axis they are joined on and each part's ``[start, stop)`` and op.

    A YOLOv8 head is ``Concat([boxes * stride, Sigmoid(class logits)], axis=1)``: box
    coordinates in pixels beside scores in [0, 1]. One SQNR over the whole output is the
    boxes' (nudenet, INT8: 28.8 dB whole, 8.0 dB for the scores, 2 of 24 detections kept by
    one method the whole-output number ranked close), so each part is also judged alone. Parts
    that one kind of op made (the scales of a YOLOv5 head joined along its anchors) are one
    kind of value and are not split. Needs every part's size on that axis from the graph."""
    producer = {out: node for node in model.graph.node for out in node.output}
    joined: dict[str, tuple[Any, list[int] | None]] = {}
    for value in model.graph.output:
        node, perm = producer.get(value.name), None
        if node is not None and node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            node = producer.get(node.input[0]) if perm is not None else None
        if node is not None and node.op_type == "Concat" and len(node.input) > 1:
            joined[value.name] = (node, perm)
    if not joined:
        return {}
    shapes = _static_shapes(model)  # shape inference: only for models with such an output
    found: OutputParts = {}
    for name, (node, perm) in joined.items():
        parts = _mixed_parts(node, producer, model, shapes)
        parts = parts or _scales_of_one_head(node, producer, model, shapes)
        if parts:
            axis, bounds = parts
            found[name] = (perm.index(axis) if perm else axis, bounds)
    return found


def _mixed_parts(
    node: Any, producer: Mapping[str, Any], model: Any, shapes: Mapping[str, tuple[int | None, ...]]
) -> Parts | None:
    """A Concat's parts where different kinds of op made them and their sizes are known."""
    made = [_made_by(producer, model, t) for t in node.input]
    return _part_bounds(node, shapes, made) if len(set(made)) > 1 else None


def _scales_of_one_head(
    node: Any, producer: Mapping[str, Any], model: Any, shapes: Mapping[str, tuple[int | None, ...]]
) -> Parts | None:
    """A Concat of a detector's scales (YOLOX: each ``Reshape(Concat([boxes, Sigmoid(obj),
    Sigmoid(cls)], axis=1), [N, C, H*W])``, joined along the anchors): the parts of the scales'
    own Concat, on the axis every Reshape keeps, when all the scales have the same parts."""
    found = None
    for tensor in node.input:
        reshape = producer.get(tensor)
        inner = producer.get(reshape.input[0]) if reshape is not None else None
        if reshape is None or reshape.op_type != "Reshape" or inner is None:
            return None
        if inner.op_type != "Concat" or len(inner.input) < 2:
            return None
        parts = _mixed_parts(inner, producer, model, shapes)
        before, after = shapes.get(inner.output[0]), shapes.get(tensor)
        if parts is None or before is None or after is None:
            return None
        axis = parts[0]
        if len(after) <= axis or before[: axis + 1] != after[: axis + 1] or None in after[1:]:
            return None  # the Reshape does not keep the parts' axis where it was
        if found is not None and found != parts:
            return None
        found = parts
    outer = next((a.i for a in node.attribute if a.name == "axis"), None)
    rank = len(shapes.get(node.output[0], ()))
    if found is None or outer is None or not rank or outer % rank == found[0]:
        return None  # scales joined on the parts' own axis: no per-part layout to keep
    return found


def _made_by(producer: Mapping[str, Any], model: Any, tensor: str) -> str:
    node = producer.get(tensor)
    if node is not None:
        return str(node.op_type)
    inputs = {i.name for i in model.graph.input}
    return "input" if tensor in inputs else "constant"


def _part_bounds(
    node: Any, shapes: Mapping[str, tuple[int | None, ...]], made: list[str]
) -> Parts | None:
    """(axis, bounds) of a Concat's parts, or None when a part's size on the axis is unknown."""
    ranks = {len(shapes[t]) for t in node.input if t in shapes}
    if len(ranks) != 1 or any(t not in shapes for t in node.input):
        return None
    rank = ranks.pop()
    attr = next((a.i for a in node.attribute if a.name == "axis"), None)
    if attr is None or not -rank <= attr < rank:
        return None
    axis = attr % rank
    sizes = [shapes[t][axis] for t in node.input]
    if any(size is None for size in sizes):
        return None
    bounds, start = [], 0
    for size, op in zip(sizes, made, strict=True):
        bounds.append((start, start + int(size), op))  # type: ignore[arg-type]
        start += int(size)  # type: ignore[arg-type]
    return axis, tuple(bounds)


@dataclass
class _LastAxisWalk:
    """Follows one axis of a tensor back through the ops that made it (each (tensor, axis)
    once: a residual graph reaches the same tensors by many paths)."""

    model: Any
    producer: Mapping[str, Any]
    constants: Collection[str]
    seen: dict[tuple[str, int], str] = field(default_factory=dict)
    #: (tensor, axis) whose doubt does not hold where the axis has this size at run time
    unless: dict[tuple[str, int], int] = field(default_factory=dict)

    @cached_property
    def shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Tensor -> its dims (None where not static), where shape inference knows its rank
        (run only when a reshape or reduction is met: most heads end in a MatMul first)."""
        return _static_shapes(self.model)

    def doubt(self, tensor: str, axis: int, rank: int | None, depth: int = 64) -> str:
        """'' when ``axis`` (negative, from the end) of ``tensor`` is a class axis by how it
        was made, else what made it instead (the ops walked through, nearest first)."""
        key = (tensor, axis)
        if key not in self.seen:
            self.seen[key] = self._doubt(tensor, axis, rank, depth)
        return self.seen[key]

    def _doubt(self, tensor: str, axis: int, rank: int | None, depth: int) -> str:
        node = self.producer.get(tensor)
        if node is None:
            return "it comes from a graph input"
        if depth <= 0:
            return "its producers are too deep to follow"
        op = node.op_type
        if op in _FEATURES_LAST:
            return "" if axis == -1 else f"it comes from {op}, whose features are its last axis"
        if op in _NCHW_OPS:
            if rank is not None and rank + axis == 1:
                return ""
            return f"it comes from {op}, whose classes would be on axis 1"
        if op in ("Softmax", "LogSoftmax", "Hardmax") and _same_axis(
            _softmax_axis(node), axis, rank
        ):
            return ""
        if op == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if not perm or not -len(perm) <= axis < 0:
                return "it comes from a Transpose this check cannot follow"
            inner = perm[len(perm) + axis] - len(perm)
            return self._via(op, (tensor, axis), node.input[0], inner, len(perm), depth)
        if op in _GLOBAL_POOLS:  # [N, C, H, W] -> [N, C, 1, 1]: the channels go through
            if rank is not None and rank + axis == 1:
                return _through(op, self.doubt(node.input[0], axis, rank, depth - 1))
            return f"it comes from {op}, whose channels are on axis 1"
        data = [i for i in node.input if i and i not in self.constants]
        if op in _RESHAPES and axis == -1 and data:
            # [T*N, C] -> [T, N, C] (a CRNN's head after its Linear), [N, C, 1, 1] -> [N, C] (a
            # convolutional head): the axis goes through when shape inference shows its size
            # is the source's last axis that is not 1
            inner = self._reshaped_from(tensor, data[0])
            if inner is None:
                return self._reshape_doubt(op, tensor, data[0], depth)
            return _through(op, self.doubt(data[0], inner, self._rank(data[0]), depth - 1))
        if op in _REDUCTIONS and data:
            inner = self._reduced_from(node, tensor, axis, rank)
            if inner is None:
                return f"it comes from {op}, which may reduce it"
            return _through(op, self.doubt(data[0], inner, self._rank(data[0]), depth - 1))
        if op == "Concat":
            cat = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if _same_axis(cat, axis, rank):
                return "it is a Concat along it (several heads side by side)"
        elif op not in _VALUEWISE or not data:
            return f"it comes from {op}"
        if op in _BROADCASTING:
            # logits - max, exp / sum (a softmax written out), logits + bias: the scores make
            # the axis, whatever is broadcast against them
            reasons = [self.doubt(source, axis, rank, depth - 1) for source in data]
            if "" in reasons:
                return ""
        for source in data:
            if why := self._via(op, (tensor, axis), source, axis, rank, depth):
                return why
        return ""

    def _via(self, op: str, key: tuple[str, int], source: str, axis: int, rank: int | None,
             depth: int) -> str:  # fmt: skip
        """The doubt of ``axis`` of ``source`` seen through ``op`` (which keeps the axis's
        size), and its size condition carried up to ``key``."""
        why = self.doubt(source, axis, rank, depth - 1)
        if why and (source, axis) in self.unless:
            self.unless[key] = self.unless[(source, axis)]
        return _through(op, why)

    def _reshape_doubt(self, op: str, tensor: str, source: str, depth: int) -> str:
        """Why a reshape may not keep the last axis; where the target size is only known at
        run time (``[T, N, -1]`` from Shape ops) and the source's last axis holds classes,
        the doubt holds only if the output's last axis turns out of another size."""
        out, src = self.shapes.get(tensor), self.shapes.get(source)
        size = src[-1] if src else self._features(source)
        unknown = not out or out[-1] is None
        rank = len(src) if src else None
        if unknown and size and size > 1 and not self.doubt(source, -1, rank, depth - 1):
            self.unless[(tensor, -1)] = size
            return f"it comes from {op}, which keeps it only if its size is {size}, as before it"
        return f"it comes from {op}, which may not keep it"

    def _rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def _reshaped_from(self, tensor: str, source: str) -> int | None:
        """The axis of ``source`` (negative) that ``tensor``'s last axis is, or None: its last
        axis of the same size, or, where the reshape drops axes (``[N, C, 1, 1] -> [N, C]``),
        its last axis that is not of size 1."""
        out, src = self.shapes.get(tensor), self.shapes.get(source)
        if not out or not src or out[-1] is None:
            return None
        kept = len(src)
        while len(out) < len(src) and kept > 1 and src[kept - 1] == 1:
            kept -= 1
        return kept - 1 - len(src) if src[kept - 1] == out[-1] else None

    def _features(self, tensor: str) -> int | None:
        """The output features of the Gemm/MatMul making ``tensor``, read from its weight
        (where shape inference lost the activations' shapes, e.g. after an LSTM)."""
        node = self.producer.get(tensor)
        if node is None or node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2:
            return None
        weight = self.shapes.get(node.input[1])
        if not weight or len(weight) != 2 or node.input[1] not in self.constants:
            return None
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return weight[0] if node.op_type == "Gemm" and trans_b else weight[1]

    def _reduced_from(self, node: Any, tensor: str, axis: int, rank: int | None) -> int | None:
        """The axis of a reduction's input (negative) that ``axis`` of its output is, or None
        (the axis reduced, or the reduced axes unknown)."""
        source_shape = self.shapes.get(node.input[0])
        reduced = _reduction_axes(node, self.model)
        if source_shape is None or reduced is None:
            return None
        source_rank = len(source_shape)
        reduced = {a % source_rank for a in reduced} if reduced else set(range(source_rank))
        keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        kept = (
            list(range(source_rank))
            if keepdims
            else [a for a in range(source_rank) if a not in reduced]
        )
        if not -len(kept) <= axis < 0 or kept[axis] in reduced:
            return None
        return kept[axis] - source_rank


def _static_shapes(model: Any) -> dict[str, tuple[int | None, ...]]:
    """Tensor -> its dims (None where not a static size), from the graph and ONNX shape
    inference on the model without its weights' data (inference reads their dims; the whole
    model went into C++ and back: dddd-ocr's default calibration peaked there), only the
    graph's own where inference fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(weightless(model), strict_mode=False).graph
    except Exception:  # noqa: BLE001 - best effort: without shapes, reshapes stay in doubt
        inferred = model.graph
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        if value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in value.type.tensor_type.shape.dim
            )
    for init in model.graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _reduction_axes(node: Any, model: Any) -> list[int] | None:
    """A reduction's axes (attribute, or constant second input from opset 18); [] for every
    axis; None when they are only known at run time."""
    attr = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if attr is not None:
        return attr
    if len(node.input) < 2 or not node.input[1]:
        noop = next((a.i for a in node.attribute if a.name == "noop_with_empty_axes"), 0)
        return None if noop else []
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return [int(a) for a in onnx.numpy_helper.to_array(init).reshape(-1)]
    return None


#: ops that only reshape: the last axis goes through them when its size stays the same
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: [N, C, H, W] -> [N, C, 1, 1]
_GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
#: reductions: an axis they keep goes through them
_REDUCTIONS = frozenset(
    {
        *("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1"),
        *("ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum"),
    }
)
#: value-wise ops of several data inputs, broadcast against each other
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "PRelu"})


def _through(op: str, why: str) -> str:
    """``why`` as seen from the op above it: ``it comes from Reshape (through Concat, Mul)``."""
    if not why:
        return ""
    head, _, path = why.partition(" (through ")
    return f"{head} (through {op}{', ' + path[:-1] if path else ''})"


def _same_axis(attr: int, axis: int, rank: int | None) -> bool:
    """Whether an op's axis attribute names ``axis`` (negative) of a tensor of ``rank``."""
    if attr < 0:
        return attr == axis
    return rank is not None and attr == rank + axis


#: ops whose last output axis is their output features
_FEATURES_LAST = frozenset(
    {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits"}
)


def _softmax_axis(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), -1)


#: ops whose outputs are NCHW whatever their inputs' layout said
_NCHW_OPS = frozenset(
    {
        *("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "BatchNormalization"),
        *("InstanceNormalization", "MaxPool", "AveragePool", "LpPool", "Resize", "Upsample"),
        *("DepthToSpace", "SpaceToDepth"),
    }
)
#: ops that keep the layout of their (one non-constant) input
_VALUEWISE = frozenset(
    {
        *("Sigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Tanh", "HardSigmoid"),
        *("HardSwish", "Clip", "Softplus", "Exp", "Log", "Neg", "Abs", "Sqrt", "Identity"),
        *("Cast", "Mul", "Add", "Sub", "Div", "Pow", "Softmax", "Dropout"),
    }
)
