"""Which calibrated tensors' statistics follow from another's without reading them (shared by
the host pass, :mod:`quantbench.collect.statspass`, and the GPU pass,
:mod:`quantbench.collect.devicecollect`)."""

from __future__ import annotations

from quantbench.model.graph import Graph
from quantbench.stats.tensorstats import TensorStats

#: ops whose output holds exactly the input's values (rearranged): same statistics.
VALUE_PRESERVING = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")


def derivation_plan(graph: Graph, tensors: list[str]) -> dict[str, tuple[str, str]]:
    """Tensors whose statistics follow from another calibrated tensor without reading them.

    ``("same", src)``: a value-preserving op of ``src``; ``("relu", src)``: ``Relu(src)``,
    binned from ``src``'s bins. Neither needs onnxruntime to output the tensor, which saves
    both the copy and the histogram pass (a ResNet has a Relu after almost every conv).
    """
    wanted = set(tensors)
    plan: dict[str, tuple[str, str]] = {}
    for node in graph.model.graph.node:
        if len(node.output) != 1 or not node.input or node.output[0] not in wanted:
            continue
        src = node.input[0]
        if src not in wanted:
            continue
        kind, root = plan.get(src, ("measured", src))
        if node.op_type in VALUE_PRESERVING and kind in ("measured", "same"):
            plan[node.output[0]] = ("same", root)
        elif node.op_type == "Relu" and kind == "measured":
            plan[node.output[0]] = ("relu", src)
    return plan


def read_by_pass(
    graph: Graph, tensors: list[str], plan: dict[str, tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """The tensors a pass must read (those the plan does not derive): the graph inputs among
    them, taken from the feed, and the rest, exposed as session outputs."""
    inputs = {s.name for s in graph.inputs}
    measured = [t for t in tensors if t not in plan]
    return [t for t in measured if t in inputs], [t for t in measured if t not in inputs]


def relus_by_source(plan: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """The plan's ``relu`` tensors, by the tensor whose bins they are binned from."""
    relus_of: dict[str, list[str]] = {}
    for t, (kind, src) in plan.items():
        if kind == "relu":
            relus_of.setdefault(src, []).append(t)
    return relus_of


def with_copies(
    stats: dict[str, TensorStats], plan: dict[str, tuple[str, str]]
) -> dict[str, TensorStats]:
    """``stats`` with the plan's ``same`` tensors added, each a renamed copy of its root."""
    for t, (kind, src) in plan.items():
        if kind == "same":
            stats[t] = stats[src].renamed(t)
    return stats
