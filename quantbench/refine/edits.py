"""Small graph edits the refinement passes share: constants' values, fresh names, and
initializers a rewrite left unused.

Each pass edits its own copy of the model's proto in place; these keep the edits honest: a
new tensor never takes a name already in use, and a replaced constant leaves the model only
where nothing (a subgraph included) still reads it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantbench.model.graph import Graph
from quantbench.model.names import unique
from quantbench.qdq.weights import constant_values


def constant(model: onnx.ModelProto, graph: Graph, name: str) -> np.ndarray | None:
    """The value of a constant tensor (initializer, Constant, foldable chain), else None."""
    if name not in graph.constants:
        return None
    value = constant_values(model, [name])[name]
    return None if isinstance(value, str) else value


def attr(node: onnx.NodeProto, name: str, default: float) -> float:
    """A node's attribute value, or ``default`` where the node leaves it out."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def opset(model: onnx.ModelProto) -> int:
    """The default domain's opset (what a new standard node must be written for)."""
    return next((int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


def consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """The nodes reading each tensor, as references into ``model`` (edits land in it)."""
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name:
                out.setdefault(name, []).append(node)
    return out


def add_initializer(model: onnx.ModelProto, value: np.ndarray, base: str, taken: set[str]) -> str:
    """Adds ``value`` as a new initializer named after ``base`` (never overwriting one: the old
    constant may be shared); returns its name."""
    name = unique(taken, base)
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def drop_unused_initializers(model: onnx.ModelProto, names: list[str]) -> None:
    """Removes the initializers among ``names`` (constants a rewrite replaced) that no node,
    in any subgraph, and no graph output still reads."""
    used = _used_names(model.graph) | {o.name for o in model.graph.output}
    drop = set(names) - used
    keep = [i for i in model.graph.initializer if i.name not in drop]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used: set[str] = set()
    for node in graph.node:
        used.update(node.input)
        for a in node.attribute:
            subgraphs = [*([a.g] if a.HasField("g") else []), *a.graphs]
            for sub in subgraphs:
                used |= _used_names(sub) | {o.name for o in sub.output}
    return used
