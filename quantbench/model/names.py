"""Fresh names for what a rewrite adds to a model: never one the model already uses.

One rule for every rewrite (Q/DQ insertion and stripping, the refinement passes, the DWConv2D
lowering and run form): ``base``, else ``base_1``, ``base_2``..., each name reserved once given,
so two additions never collide with each other or with the model's own tensors and nodes.
"""

from __future__ import annotations

from typing import Any

import onnx


def tensor_names(model: onnx.ModelProto) -> set[str]:
    """Every name the main graph uses (tensors and nodes): what a new name must avoid."""
    g = model.graph
    names = {i.name for i in g.initializer} | {v.name for v in [*g.input, *g.output, *g.value_info]}
    names.update(t for n in g.node for t in [*n.input, *n.output, n.name] if t)
    return names


def unique(taken: set[str], base: str) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever no tensor or node uses; reserved."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


class UniqueNames:
    """:func:`unique` over an onnx-graphsurgeon graph's tensors and nodes (the Q/DQ rewrites
    and the DWConv2D lowering edit one)."""

    def __init__(self, graph: Any) -> None:
        #: every name in use or given out
        self.taken: set[str] = set(graph.tensors()) | {n.name for n in graph.nodes}

    def fresh(self, base: str) -> str:
        return unique(self.taken, base)
