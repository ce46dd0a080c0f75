"""``--method auto``: per tensor, the calibrator whose threshold hurts its layer least.

For each candidate method: its table, its Q/DQ model, and the isolated model of
:mod:`quantbench.compare.isolated` (every quantized op re-run beside FP32 on FP32 inputs), run
once over a held-back slice. That gives, per method and op, the SQNR the op loses by itself.
Each activation tensor then takes the method that maximises the *worst* isolated SQNR among the
quantized ops reading it (a tensor shared by several ops has one scale). Isolated errors do not
add up exactly, so a guard compares the mixed table's output SQNR with the base method's on the
same slice and keeps the base method's values when the mix is worse (``fallback``).

Cost: one table, one Q/DQ model and one pass over the slice per method (the FP32 part of each
pass is repeated per method because the isolated copies live in the same graph), plus two
full-model passes for the guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from quantbench import calibrators as registry
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.calibrate import AUTO, build_table
from quantbench.compare.isolated import build_isolated
from quantbench.compare.metrics import DriftAccumulator
from quantbench.data import DataSource
from quantbench.errors import QuantbenchError
from quantbench.graph import Graph
from quantbench.qdq import ACTIVATION, RESIDUAL, RUNTIME_WEIGHT, quantize_model
from quantbench.stats import StatsFile
from quantbench.table import CalibrationTable

#: near-duplicates of ``entropy`` that cost a full entropy search each and rarely differ from it.
SLOW_METHODS = frozenset({"entropy:slides", "entropy:pytorch"})
_RUNTIME_ROLES = (ACTIVATION, RESIDUAL, RUNTIME_WEIGHT)


def default_auto_methods() -> list[str]:
    """Every registered method except :data:`SLOW_METHODS`."""
    return [m for m in registry.all_methods() if m not in SLOW_METHODS]


@dataclass
class AutoTable:
    """The mixed table, and per tensor which method won and what each method scored."""

    table: CalibrationTable
    methods: list[str]
    #: tensor -> {"method" (used), "isolated_best", "readers",
    #: "isolated_sqnr_db": {method: worst reader SQNR}}
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: output SQNR on the held-out slice of the mixed table and of the base method alone
    output_sqnr_db: dict[str, float | str] = field(default_factory=dict)
    #: True when the mixed table lost to the base method and the base method's values are used
    fallback: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "methods": list(self.methods),
            "output_sqnr_db": dict(self.output_sqnr_db),
            "fallback": self.fallback,
            "tensors": [{"tensor": t, **c} for t, c in self.choices.items()],
        }


def isolated_sqnr(
    graph: Graph,
    table: CalibrationTable,
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
) -> dict[str, float]:
    """Node name -> SQNR (dB) of that op quantized alone with FP32 inputs, over ``held_out``."""
    plan = quantize_model(graph, table, allow_partial=True)
    iso = build_isolated(graph.model, plan.model)
    fetch = list(dict.fromkeys([*iso.twins, *iso.twins.values()]))
    types = {
        t: graph.elem_types.get(src, 1) for src, twin in iso.twins.items() for t in (src, twin)
    }
    runner = OnnxRuntimeRunner(expose(iso.model, fetch, types), provider, threads)
    accs = {t: DriftAccumulator() for t in iso.twins}
    for feed in held_out.batches():
        got = runner.infer(feed, fetch)
        for tensor, acc in accs.items():
            acc.update(got[tensor], got[iso.twins[tensor]])
    runner.close()
    out: dict[str, float] = {}
    for tensor, acc in accs.items():
        sqnr = acc.metrics()["sqnr_db"]
        out[iso.ops[tensor]] = -math.inf if sqnr is None else float(sqnr)
    return out


def auto_table(
    graph: Graph,
    stats: StatsFile,
    held_out: DataSource,
    methods: list[str] | None = None,
    *,
    base: str = "entropy",
    provider: str | None = None,
    threads: int | None = None,
) -> AutoTable:
    """A table whose quantized activation tensors each use their best method (see module doc).

    Tensors no quantized op reads keep ``base``'s amax (a TensorRT cache still lists them).
    """
    method_list = registry.expand_methods(methods or default_auto_methods())
    if not method_list:
        raise QuantbenchError("--method auto: no calibration method to choose from")
    base_name = registry.canonical(base)
    if base_name not in method_list:
        method_list.insert(0, base_name)
    tables = {m: build_table(stats, m, graph) for m in method_list}
    scores = {m: isolated_sqnr(graph, tables[m], held_out, provider, threads) for m in method_list}
    mixed = _relabelled(tables[base_name], base_name)
    readers = _readers(graph, tables[base_name])
    choices: dict[str, dict[str, Any]] = {}
    for tensor, nodes in readers.items():
        worst = {m: min(scores[m].get(n, -math.inf) for n in nodes) for m in method_list}
        # ties go to the earliest method in the list, i.e. base first
        best = max(method_list, key=lambda m: (worst[m], -method_list.index(m)))
        if tensor in tables[best]:
            mixed.set(tensor, tables[best].amax(tensor), best)
        choices[tensor] = {
            "method": best,
            "isolated_best": best,
            "readers": nodes,
            "isolated_sqnr_db": {m: _finite(v) for m, v in worst.items()},
        }
    guard = {
        AUTO: output_sqnr(graph, mixed, held_out, provider, threads),
        base_name: output_sqnr(graph, tables[base_name], held_out, provider, threads),
    }
    fallback = guard[AUTO] < guard[base_name]
    if fallback:
        mixed = _relabelled(tables[base_name], base_name)
        for choice in choices.values():
            choice["method"] = base_name
    return AutoTable(
        mixed, method_list, choices, {k: _finite(v) for k, v in guard.items()}, fallback
    )


def output_sqnr(
    graph: Graph,
    table: CalibrationTable,
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
) -> float:
    """SQNR (dB) of the full Q/DQ model's outputs against FP32 over ``held_out``."""
    plan = quantize_model(graph, table, allow_partial=True)
    outputs = [o.name for o in graph.model.graph.output]
    reference = OnnxRuntimeRunner(graph.model, provider, threads)
    candidate = OnnxRuntimeRunner(plan.model, provider, threads)
    acc = DriftAccumulator()
    for feed in held_out.batches():
        ref, got = reference.infer(feed, outputs), candidate.infer(feed, outputs)
        for name in outputs:
            acc.update(ref[name], got[name])
    sqnr = acc.metrics()["sqnr_db"]
    return -math.inf if sqnr is None else float(sqnr)


def _relabelled(table: CalibrationTable, method: str) -> CalibrationTable:
    """``table`` named ``auto`` (what was asked for), every entry recording ``method``."""
    out = CalibrationTable(
        entries={}, method=AUTO, algorithm=table.algorithm, provenance=table.provenance
    )
    for name, entry in table.entries.items():
        out.set(name, entry.amax, method)
    return out


def _readers(graph: Graph, table: CalibrationTable) -> dict[str, list[str]]:
    """Runtime tensor given a Q/DQ pair -> the quantized nodes reading it."""
    plan = quantize_model(graph, table, allow_partial=True)
    out: dict[str, list[str]] = {}
    for q in plan.quantized:
        for qi in q.inputs:
            if qi.role in _RUNTIME_ROLES and q.node not in out.get(qi.tensor, []):
                out.setdefault(qi.tensor, []).append(q.node)
    return out


def _finite(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "inf" if value > 0 else "-inf"
