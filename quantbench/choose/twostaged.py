"""Two-stage activations chosen and judged like every other refinement (issue 38).

:mod:`quantbench.refine.twostage` gives a chosen activation a second INT8 stage on its
rounding error; which tensors deserve it, and whether the result is better, is decided here on
calibration data alone, the way ``auto`` and the other passes decide:

1. rank: each activation of the Q/DQ model quantized alone (every other Q/DQ pair bypassed,
   weights FP32 too), its worst output SQNR against FP32 on :data:`RANK_SAMPLES` calibration
   samples after the held-back slice: the tensors that cost most first;
2. choose: the :data:`RANKED` most costly tried (twice as many with a cap on added MACs of
   twice the default or more, :func:`search_width`), the better of two greedy searches
   (:func:`quantbench.refine.twostage.choose`), each set judged by the worst output SQNR on the
   held-back slice against the original FP32 model, a tensor kept only where it gains
   :data:`~quantbench.choose.refined.MIN_GAIN_DB` there and again on as many calibration
   samples after the ranking ones (:func:`_confirm_source`: a search over dozens of sets
   finds some that win on one slice by chance); at most :data:`MAX_TENSORS` tensors (or
   twice as many) and at most ``max_added_macs`` of the model's linear-op MACs added (each
   chosen tensor's linear readers run twice).

Measured on the corpus (benchmarks/README.md, issue 38, "Session 27"): +2.5 to +3.5 points of
task metric over the default on the four models whose loss sits in a few activations, within
25 % added MACs, where no range could gain more than 0.9.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.choose.autocalib import (
    DEFAULT_HOLDOUT_SAMPLES,
    held_back_count,
    holdout_source,
    output_sqnrs,
    slice_reference,
)
from quantbench.choose.refined import MIN_GAIN_DB, CalibrationSamples, RefineTrial
from quantbench.data.sources import DataSource
from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph
from quantbench.progress import info, progress_bar
from quantbench.refine import TWO_STAGE, LayerChange
from quantbench.refine import twostage as ts

#: calibration samples after the held-back slice that rank the tensors
RANK_SAMPLES = 8
#: the most costly tensors tried by the searches, and the most kept
RANKED = 24
MAX_TENSORS = 16
#: the default cap on the linear-op MACs the second stages add, a fraction of the model's:
#: INT8 keeps most of its speed over FP16 (on the corpus, 25 % kept 94.5 of 94.5 points on
#: basic-pitch and 88.9 of 89.0 on dddd-ocr; P-Net, whose every conv is costly, 87.3 of 89.4)
DEFAULT_MAX_ADDED_MACS = 0.25


def search_width(max_added_macs: float) -> tuple[int, int]:
    """(tensors tried, most kept): :data:`RANKED` and :data:`MAX_TENSORS`, twice both where the
    cap on added MACs is at least twice the default, a user trading more of INT8's speed for
    accuracy (at 100 %, dddd-ocr's search kept 16 tensors, the limit, at +84 % MACs; twice as
    wide it kept 25 at +73 % and matched 94.5 % of FP32's lines against 90.75, the search 2.3x
    as long)."""
    wide = 2 if max_added_macs >= 2 * DEFAULT_MAX_ADDED_MACS else 1
    return RANKED * wide, MAX_TENSORS * wide


@dataclass
class TwoStaged:
    """The model to write (the given one when nothing was kept) and the trial's record."""

    model: onnx.ModelProto
    trial: RefineTrial
    tensors: list[str]
    #: the linear-op MACs the second stages add, a fraction of the model's
    added_macs: float = 0.0
    #: the model's judged output SQNR as given (dB), and where the judging slice came from
    base_db: float = math.nan
    holdout: str = ""


def check_max_added_macs(value: float | None) -> None:
    """``--max-added-macs``: a fraction >= 0 (one line otherwise)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise QuantbenchError(
            f"--max-added-macs must be a fraction >= 0 of the model's linear-op MACs (0.25: "
            f"at most 25 % more), not {value}"
        )


def two_stage_judged(
    qdq: onnx.ModelProto,
    reference: Graph,
    data: object,
    *,
    num_samples: int,
    holdout_data: object | None = None,
    batch_size: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
    max_added_macs: float | None = None,
    show_progress: bool = True,
) -> TwoStaged:
    """Choose the tensors of the Q/DQ model ``qdq`` to quantize in two stages (module doc),
    judged against ``reference`` (the original FP32 model) on the held-back slice of ``data``
    (``num_samples`` calibration samples) or on ``holdout_data``."""
    start = time.perf_counter()
    limit = DEFAULT_MAX_ADDED_MACS if max_added_macs is None else max_added_macs
    tensors = ts.candidates(qdq)
    if not tensors:
        note = "no per-tensor activation Q/DQ pair to give a second stage"
        info(f"refine: {TWO_STAGE}: {note}")
        return TwoStaged(qdq, RefineTrial(TWO_STAGE, None, False, 0.0, note=note), [],
                         holdout="nothing judged")  # fmt: skip
    held = 0 if holdout_data is not None else held_back_count(num_samples)
    held_out = holdout_source(reference, data, holdout_data, batch_size=batch_size,
                              preset=preset, samples=held or DEFAULT_HOLDOUT_SAMPLES)  # fmt: skip
    samples = CalibrationSamples(reference, data, held, num_samples, batch_size, preset)
    ranking, seen = _rank_source(samples)
    cost = _added_macs(qdq, reference, ranking, provider, threads)
    ranked = _ranked(qdq, reference, ranking, tensors, provider, threads, show_progress)
    confirming, confirmed_on = _confirm_source(samples)

    def judge(source: DataSource) -> Callable[[Sequence[str]], float]:
        """A set of tensors -> the worst output SQNR of the model with them in two stages on
        ``source`` against FP32 (FP32 run once, when first asked; each set judged once)."""
        fp32_parts = functools.cache(lambda: slice_reference(reference, source, provider, threads))
        scores: dict[frozenset[str], float] = {}

        def score(chosen: Sequence[str]) -> float:
            key = frozenset(chosen)
            if key not in scores:
                model = ts.two_stage(qdq, list(chosen)) if chosen else qdq
                scores[key] = output_sqnrs(reference, {"candidate": model}, source, provider,
                                           threads, kept=fp32_parts())["candidate"]  # fmt: skip
                advance(1)
            return scores[key]

        return score

    with progress_bar(f"{TWO_STAGE}: judging sets of tensors", None, show_progress,
                      unit="models") as advance:  # fmt: skip
        tried, most = search_width(limit)
        confirm = judge(confirming) if confirming is not None else None
        best, _ = ts.choose(ranked[:tried], judge(held_out), budget=most,
                            min_gain_db=MIN_GAIN_DB, cost=cost, max_cost=limit,
                            confirm=confirm)  # fmt: skip
    model = ts.two_stage(qdq, best.tensors) if best.tensors else qdq
    added = cost(best.tensors)
    note = _note(best, added, limit, f"{seen}; {confirmed_on}")
    info(f"refine: {TWO_STAGE}: {best.score_db:.2f} dB against {best.base_db:.2f} dB: {note}")
    trial = RefineTrial(TWO_STAGE, best.score_db, bool(best.tensors),
                        time.perf_counter() - start, _layers(best, cost, qdq), note)  # fmt: skip
    holdout = "--holdout-data" if holdout_data is not None else f"first {held} calibration samples"
    return TwoStaged(model, trial, list(best.tensors), added, best.base_db, holdout)


def _note(best: ts.Choice, added: float, limit: float, seen: str) -> str:
    """What the record says about the choice."""
    if not best.tensors:
        return f"no tensor gained {MIN_GAIN_DB:g} dB within {limit:.0%} added MACs; {seen}"
    return (f"{len(best.tensors)} tensors in two stages, +{added:.1%} linear-op MACs "
            f"(at most {limit:.0%}); {seen}")  # fmt: skip


def _layers(
    best: ts.Choice, cost: Callable[[Sequence[str]], float], qdq: onnx.ModelProto
) -> list[LayerChange]:
    """Per kept tensor: its readers run twice, the judged score before and after it joined."""
    before = best.base_db
    found = []
    for name, after, kept in best.trials:
        if not kept:
            continue
        names = [name] if name in best.tensors else best.tensors[: int(name.split()[-1])]
        for tensor in names:
            readers = ", ".join(n.name or n.op_type for n in ts.linear_readers(qdq, tensor))
            found.append(LayerChange(
                tensor, f"second INT8 stage; run twice: {readers or 'no linear reader'} "
                f"(+{cost([tensor]):.1%} MACs alone)", before, after,
                "output SQNR on the held-back slice, dB",
            ))  # fmt: skip
        before = after
    return found


def _rank_source(samples: CalibrationSamples) -> tuple[DataSource, str]:
    """The samples that rank the tensors: the first :data:`RANK_SAMPLES` after the held-back
    ones where the data can be cut there; else the data's first (which the slice shares)."""
    held = samples.held
    stop = min(samples.count, held + RANK_SAMPLES)
    cut = samples.cut(held, stop) if stop > held else None
    if cut is not None:
        return cut, "tensors ranked on calibration samples outside the judging slice"
    return samples.first(RANK_SAMPLES), "tensors ranked on the judging slice's first samples"


def _confirm_source(samples: CalibrationSamples) -> tuple[DataSource | None, str]:
    """The samples that confirm each gain the slice finds (:func:`ts.choose_greedy`'s
    ``confirm``): as many as the slice holds (at least :data:`RANK_SAMPLES`) after the ranking
    ones, where the data holds them and can be cut there; else none, and the note says so."""
    start = min(samples.count, samples.held + RANK_SAMPLES)
    stop = min(samples.count, start + (samples.held or DEFAULT_HOLDOUT_SAMPLES))
    source = samples.cut(start, stop) if stop - start >= RANK_SAMPLES else None
    if source is None or not source.num_samples:
        return None, "each gain judged on the slice alone (no calibration samples to confirm it)"
    first, end = source.sample_span or (start, stop)  # whole batches where the batch is static
    return source, f"each gain confirmed on calibration samples {first}-{end - 1}"


def _ranked(
    qdq: onnx.ModelProto,
    reference: Graph,
    ranking: DataSource,
    tensors: list[str],
    provider: str | None,
    threads: int | None,
    show_progress: bool,
) -> list[str]:
    """``tensors``, the one costing the outputs most when quantized alone first."""
    fp32_parts = slice_reference(reference, ranking, provider, threads)
    alone: dict[str, float] = {}
    with progress_bar(f"{TWO_STAGE}: ranking activations", len(tensors), show_progress,
                      unit="tensors") as advance:  # fmt: skip
        for tensor in tensors:
            found = output_sqnrs(reference, {tensor: ts.only(qdq, tensor)}, ranking, provider,
                                 threads, kept=fp32_parts)  # fmt: skip
            alone[tensor] = _worst_first(found[tensor])
            advance(1)
    return sorted(tensors, key=lambda t: alone[t])


def _worst_first(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def _added_macs(
    qdq: onnx.ModelProto,
    reference: Graph,
    ranking: DataSource,
    provider: str | None,
    threads: int | None,
) -> Callable[[Sequence[str]], float]:
    """The linear-op MACs a set of tensors in two stages adds, as a fraction of all linear
    ops' MACs of ``qdq`` (from the shapes of one sample's run of it): a reader with one
    chosen input runs twice, one whose both multiplied inputs are chosen four times."""
    linear = [n for n in qdq.graph.node if n.op_type in ts.LINEAR_READERS]
    constants = {i.name: tuple(i.dims) for i in qdq.graph.initializer}
    inputs = {i.name for i in qdq.graph.input}
    names = list(dict.fromkeys(x for n in linear for x in [*n.input[:2], n.output[0]] if x))
    run = [x for x in names if x not in constants and x not in inputs]
    runner = OnnxRuntimeRunner(expose(qdq, run, reference.elem_types), provider, threads,
                               generated_from=reference.model, arena=False)  # fmt: skip
    try:
        feed = next(iter(ranking.batches()))
        shapes = {k: np.shape(v) for k, v in runner.infer(feed, run).items()}
    finally:
        runner.close()
    shapes.update(constants)
    shapes.update({k: np.shape(v) for k, v in feed.items()})
    dequantized = {dq.output[0]: q.input[0] for q, dq in ts.qdq_pairs(qdq)}
    readers = [(ts.node_macs(n, shapes), [dequantized.get(x) for x in n.input[:2]])
               for n in linear]  # fmt: skip
    total = sum(macs for macs, _ in readers)

    def added(tensors: Sequence[str]) -> float:
        chosen = set(tensors)
        extra = sum(macs * (2 ** sum(t in chosen for t in reads) - 1) for macs, reads in readers)
        return extra / total if total else 0.0

    return added
