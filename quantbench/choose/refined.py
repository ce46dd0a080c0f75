"""Refinement passes judged like every other candidate: kept only where the outputs gain.

A pass (:mod:`quantbench.refine`) rewrites the FP32 model; whether its INT8 form is better is
an empirical question, answered the way ``auto`` answers it for ranges: the Q/DQ model of the
refined FP32 model is run on the held-back slice and scored at the outputs against the
*original* FP32 model (:func:`quantbench.choose.autocalib.output_sqnrs`, same score, same
slice). Passes are tried greedily in :data:`quantbench.refine.PASSES` order, each on top of
what was kept; a pass is kept when it raises the score by at least :data:`MIN_GAIN_DB`.

Tables: a pass that keeps activation ranges (bias correction, rounding) is judged with the
table already chosen; one that moves them (equalization, smoothing) gets a table calibrated on
the refined model from one statistics pass, each tensor with the method the chosen table used
for it. The passes that read data, and those statistics, see the calibration samples after the
held-back ones (when the data can be cut there), so the slice stays unseen by what is judged.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx

from quantbench import calibrators as registry
from quantbench.choose.autocalib import (
    DEFAULT_HOLDOUT_SAMPLES,
    held_back_count,
    holdout_source,
    output_sqnrs,
    slice_reference,
)
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import DataSource, open_data
from quantbench.errors import QuantbenchError
from quantbench.jsonsafe import json_float
from quantbench.model.graph import Graph, calibration_tensors, open_graph
from quantbench.progress import info
from quantbench.refine import (
    BIAS,
    CHEAP,
    EQUALIZE,
    PASSES,
    QDQ_PASSES,
    RANGE_CHANGING,
    ROUNDING,
    SMOOTH,
    LayerChange,
    Refined,
)
from quantbench.table import CalibrationTable
from quantbench.table.build import build_table

#: a pass must raise the judged output SQNR by this much to be kept (a smaller change is
#: within the slice's noise and not worth a different model)
MIN_GAIN_DB = 0.01
#: SmoothQuant's migration strengths tried (0.5 balances; larger moves more onto the weights)
SMOOTH_ALPHAS = (0.5, 0.8)
#: equalization's activation-driven variant: its name after ``equalize:`` and its alpha (of 0.5,
#: 0.75 and 1 on mtcnn-pnet and basic-pitch, 0.5 scored best on both)
ACTIVATIONS = "activations"
EQUALIZE_ALPHA = 0.5


def parse_refine(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``--refine``: None (the default: the cheap passes where ``auto`` judges), ``none``,
    ``all`` or a comma list of pass names and ``cheap`` (the cheap ones: ``cheap,two-stage``);
    one line naming a wrong one."""
    if text is None:
        return None
    words = text.split(",") if isinstance(text, str) else list(text)
    names = [w.strip().lower() for w in words if w.strip()]
    if names in (["none"], []):
        return ()
    if names == ["all"]:
        return PASSES
    wrong = [n for n in names if n not in PASSES and n != "cheap"]
    if wrong:
        raise QuantbenchError(
            f"--refine: unknown pass {', '.join(map(repr, wrong))}; choose from "
            f"{', '.join(PASSES)}, or cheap, all, none"
        )
    asked = set(names) | (set(CHEAP) if "cheap" in names else set())
    return tuple(p for p in PASSES if p in asked)


def passes_to_try(
    refine: str | Sequence[str] | None, method: str, *, table_given: bool = False
) -> tuple[str, ...]:
    """The passes a command tries: the asked ones, or by default the cheap ones when ``auto``
    calibrates (it judges candidates anyway); none from a given table (no data to judge on,
    and the table was calibrated on the unrefined model)."""
    asked = parse_refine(refine)
    if asked is None:
        auto = method.strip().lower() == registry.AUTO
        return CHEAP if auto and not table_given else ()
    if asked and table_given:
        raise QuantbenchError(
            "--refine needs --data: each pass reads the calibration data and is judged on it "
            "(a given table was calibrated on the unrefined model); drop --table or --refine"
        )
    return asked


@dataclass
class RefineTrial:
    """One pass tried: its judged output SQNR on the slice, and whether it was kept."""

    name: str
    score_db: float | None
    kept: bool
    seconds: float
    layers: list[LayerChange] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.name,
            "output_sqnr_db": json_float(self.score_db) if self.score_db is not None else None,
            "kept": self.kept,
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "layers": [
                {"node": c.node, "detail": c.detail, "measure": c.measure,
                 "before": json_float(c.before) if c.before is not None else None,
                 "after": json_float(c.after) if c.after is not None else None}
                for c in self.layers
            ],
        }  # fmt: skip


@dataclass
class RefineOutcome:
    """The model to quantize (the original when no pass was kept), its table, and the record."""

    graph: Graph
    table: CalibrationTable
    kept: list[str]
    trials: list[RefineTrial]
    base_score_db: float
    holdout: str = ""
    #: the model before a kept rounding pass (``recover`` gives a layer it keeps in high
    #: precision its unrounded weights back)
    unrounded: onnx.ModelProto | None = None
    #: tensors the kept passes left scaled per channel under their original names
    #: (:attr:`quantbench.refine.Refined.rescaled`): ``compare`` leaves them out of its
    #: layer-by-layer views against the unrefined model
    rescaled: list[str] = field(default_factory=list)

    @property
    def refined(self) -> bool:
        return bool(self.kept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": list(self.kept),
            "base_output_sqnr_db": json_float(self.base_score_db),
            "holdout": self.holdout,
            "trials": [t.to_dict() for t in self.trials],
            "rescaled": list(self.rescaled),
        }


@dataclass
class _State:
    graph: Graph
    table: CalibrationTable
    score: float
    #: the model before a kept rounding pass (bias correction measures the shift of the
    #: rounded weights against these); None while no rounding was kept
    unrounded: onnx.ModelProto | None = None
    #: tensors the kept passes rescaled so far
    rescaled: tuple[str, ...] = ()


def refine_judged(
    graph: Graph,
    table: CalibrationTable,
    data: object,
    passes: Sequence[str],
    *,
    num_samples: int,
    holdout_data: object | None = None,
    batch_size: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
) -> RefineOutcome:
    """Try ``passes`` on ``graph`` (quantized with ``table``) and keep those that help (module
    doc). ``num_samples``: how many calibration samples ``data`` holds (the statistics')."""
    held = 0 if holdout_data is not None else held_back_count(num_samples)
    held_out = holdout_source(
        graph, data, holdout_data, batch_size=batch_size, preset=preset,
        samples=held or DEFAULT_HOLDOUT_SAMPLES,
    )  # fmt: skip
    samples = CalibrationSamples(graph, data, held, num_samples, batch_size, preset)
    fit, holdout_note = _fit_source(samples)

    fp32_parts = slice_reference(graph, held_out, provider, threads)

    def score(g: Graph, t: CalibrationTable) -> float:
        """The INT8 form of ``g`` against the original FP32 model: its outputs on the slice
        computed once where they fit (:func:`slice_reference`), else FP32 run beside each
        trial in bounded parts."""
        found = output_sqnrs(g, {"candidate": t}, held_out, provider, threads,
                             reference_graph=graph, kept=fp32_parts)  # fmt: skip
        return found["candidate"]

    state = _State(graph, table, score(graph, table))
    base = state.score
    info(f"refine: unrefined INT8 scores {base:.2f} dB at the outputs on the held-back slice")
    trials: list[RefineTrial] = []
    kept: list[str] = []
    for name in PASSES:
        if name not in passes or name in QDQ_PASSES:  # those rewrite the Q/DQ model, later
            continue
        best: tuple[RefineTrial, _State] | None = None
        tried: list[RefineTrial] = []
        for variant, run in _variants(name, state, fit, provider):
            start = time.perf_counter()
            trial, moved = _try(variant, run, state, fit, score, provider)
            trial.seconds = time.perf_counter() - start
            tried.append(trial)
            if trial.score_db is None:
                break  # nothing to change: the pass's other variants would say the same
            if moved is not None and (best is None or moved.score > best[1].score):
                best = (trial, moved)  # a gain is never NaN
        trials.extend(tried)
        if best is not None:
            for trial in tried:
                if trial.kept and trial is not best[0]:
                    trial.kept, trial.note = False, f"{best[0].name} scored higher"
            state = best[1]
            kept.append(best[0].name)
    return RefineOutcome(
        state.graph, state.table, kept, trials, base, holdout_note, state.unrounded,
        list(state.rescaled),
    )  # fmt: skip


def _variants(
    name: str, state: _State, fit: DataSource, provider: str | None
) -> list[tuple[str, Callable[[onnx.ModelProto], Refined]]]:
    """The pass's candidates: one run, or one per SmoothQuant alpha (the activation maxima
    measured once for all of them)."""
    if name == EQUALIZE:
        return _equalize_variants(fit, provider)
    if name == BIAS:
        from quantbench.refine import biascorrect

        return [(name, lambda m: biascorrect.correct_bias(m, fit, provider=provider,
                                                           original=state.unrounded))]  # fmt: skip
    if name == ROUNDING:
        from quantbench.refine import rounding

        return [(name, lambda m: rounding.round_weights(m, fit, provider=provider))]
    from quantbench.refine import smooth

    maxima: dict[str, Any] = {}

    def smoothed(alpha: float) -> Callable[[onnx.ModelProto], Refined]:
        def run(m: onnx.ModelProto) -> Refined:
            if not maxima:
                tensors = smooth.smoothable_tensors(m)
                maxima["found"] = (
                    smooth.activation_channel_max(m, fit, tensors, provider=provider)
                    if tensors
                    else {}
                )
            return smooth.smooth(m, fit, alpha=alpha, provider=provider,
                                 channel_max=maxima["found"])  # fmt: skip

        return run

    return [(f"{SMOOTH}:{alpha:g}", smoothed(alpha)) for alpha in SMOOTH_ALPHAS]


def _equalize_variants(
    fit: DataSource, provider: str | None
) -> list[tuple[str, Callable[[onnx.ModelProto], Refined]]]:
    """Weight-driven CLE (data-free) and the activation-driven variant, whose per-channel
    activation maxima one FP32 pass measures (only for a model with a pair to equalize)."""
    from quantbench.refine import equalize as eq
    from quantbench.refine.activations import channel_max

    def by_activations(m: onnx.ModelProto) -> Refined:
        tensors = eq.activation_tensors(m)
        if not tensors:
            return eq.equalize(m)  # nothing eligible: says so
        maxima = channel_max(m, fit, tensors, axis=1, provider=provider)
        return eq.equalize(m, activation_max=maxima, alpha=EQUALIZE_ALPHA)

    # the activation variant first: where it finds no pair, neither does the other (the loop
    # stops at a variant that changes nothing)
    return [(f"{EQUALIZE}:{ACTIVATIONS}", by_activations), (EQUALIZE, eq.equalize)]


def _try(
    name: str,
    run: Callable[[onnx.ModelProto], Refined],
    state: _State,
    fit: DataSource,
    score: Callable[[Graph, CalibrationTable], float],
    provider: str | None,
) -> tuple[RefineTrial, _State | None]:
    """Run one pass on the state's model and judge it: the trial, and the state it would move
    to when it gains (None otherwise). Every variant of a pass starts from the same state, so
    SmoothQuant's alphas are alternatives, not a stack."""
    refined = run(state.graph.model)
    if not refined.changed:
        info(f"refine: {name}: {refined.skipped or 'nothing to change'}")
        note = refined.skipped or "nothing to change"
        return RefineTrial(name, None, False, 0.0, note=note), None
    graph = open_graph(refined.model, require_fixed_rank=False)
    if name.split(":")[0] in RANGE_CHANGING:
        table = retabled(graph, state.table, fit, provider)
    else:
        table = restamped(state.table, graph)
    found = score(graph, table)
    gained = _ranked(found) >= _ranked(state.score) + MIN_GAIN_DB
    verdict = "gains" if gained else "not kept"
    info(f"refine: {name}: {found:.2f} dB against {state.score:.2f} dB: {verdict}")
    trial = RefineTrial(name, found, gained, 0.0, refined.layers)
    if not gained:
        return trial, None
    unrounded = state.graph.model if name == ROUNDING else state.unrounded
    rescaled = tuple(dict.fromkeys([*state.rescaled, *refined.rescaled]))
    return trial, _State(graph, table, found, unrounded, rescaled)


def _ranked(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def restamped(table: CalibrationTable, graph: Graph) -> CalibrationTable:
    """``table`` recorded as made for ``graph``: a pass that keeps the activation ranges
    (bias correction, rounding) carries the ranges over to the model it refined."""
    return replace(table, entries=dict(table.entries),
                   provenance=replace(table.provenance, model_hash=graph.hash))  # fmt: skip


def retabled(
    graph: Graph, chosen: CalibrationTable, fit: DataSource, provider: str | None
) -> CalibrationTable:
    """A table of the refined ``graph`` from one statistics pass over ``fit``: each tensor
    with the method ``chosen`` used for it; a tensor the pass added (a smoothing Mul) with the
    method ``chosen`` used most."""
    stats = collect_stats(
        graph, fit, calibration_tensors(graph, "quantizable"), provider=provider,
        show_progress=False,
    )  # fmt: skip
    methods = {name: entry.method or chosen.method for name, entry in chosen.entries.items()}
    common = Counter(methods.values()).most_common(1)[0][0] if methods else "entropy"
    per_method: dict[str, CalibrationTable] = {}
    table = build_table(stats, common)
    table.method = chosen.method
    for tensor in list(table.entries):
        method = methods.get(tensor, common)
        if method not in per_method:
            per_method[method] = build_table(stats, method)
        if tensor in per_method[method]:
            table.set(tensor, per_method[method].amax(tensor), method)
    return table


@dataclass(frozen=True)
class CalibrationSamples:
    """The calibration data as the passes read it again after the statistics pass: ``count``
    samples, the first ``held`` of them the judging slice (0: the slice is other data)."""

    graph: Graph
    data: object
    held: int
    count: int
    batch_size: int | None
    preset: str | None

    def cut(self, start: int, stop: int) -> DataSource | None:
        """Samples ``[start, stop)``; None where the data cannot be cut there."""
        return calibration_source(self.graph, self.data, self.batch_size, self.preset,
                                  sample_range=(start, stop))  # fmt: skip

    def first(self, n: int | None = None) -> DataSource:
        """The first ``n`` samples (all of them: None)."""
        return calibration_source(self.graph, self.data, self.batch_size, self.preset,
                                  max_samples=n)  # fmt: skip


def _fit_source(samples: CalibrationSamples) -> tuple[DataSource, str]:
    """The data the passes read: the calibration samples after the held-back ones where the
    data can be cut there (a file, a folder, a dict of arrays); else all of it (and the record
    says the slice was seen)."""
    held = samples.held
    cut = samples.cut(held, samples.count) if held else None
    if cut is not None:
        return cut, f"first {held} calibration samples held back from the passes"
    return samples.first(), "the passes read every calibration sample, the judging slice included"


def calibration_source(
    graph: Graph,
    data: object,
    batch_size: int | None,
    preset: str | None,
    *,
    sample_range: tuple[int, int] | None = None,
    max_samples: int | None = None,
) -> DataSource | None:
    """``data`` opened again after the statistics pass (which reported its non-finite values
    once); with ``sample_range``, None where the data cannot be cut there (not a file or
    folder, or a range it cannot give)."""
    if sample_range is not None and not isinstance(data, (str, Path, Mapping)):
        return None
    try:
        source = open_data(data, graph.inputs, batch_size=batch_size, preset=preset,
                           sample_range=sample_range, max_samples=max_samples)  # fmt: skip
    except QuantbenchError:
        if sample_range is None:
            raise
        return None
    source.on_nonfinite = None
    return source
