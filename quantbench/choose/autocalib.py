"""``--method auto``: the calibrator choice per tensor, judged at the outputs on a data slice.

Step 1, per tensor. For each candidate method: its table, its Q/DQ model, and the isolated model
of :mod:`quantbench.evaluate.isolated` (every quantized op re-run beside FP32 on FP32 inputs), run
over the judging slice. That gives, per method and op, the SQNR the op loses by itself.
Each activation tensor takes the method that maximises the *worst* isolated SQNR among the
quantized ops reading it (a tensor shared by several ops has one scale): the *mix*. The pass
stops once the mix has settled: it checks the mix after :data:`ISOLATED_FIRST_CHECK` samples and
at every doubling, and stops when two checks in a row give the same mix (an op's isolated SQNR
is a ratio of sums over every value it outputs, which a few samples fix on most models).

Step 2, whole model. Isolated errors do not add up exactly, so the mix and every single method's
full table are each run end to end on the same slice and judged by their output SQNR against
FP32; the best candidate is the ``auto`` table. ``auto`` is therefore never worse at the outputs,
on that slice, than the best single built-in method; the record keeps every candidate's score.

The slice (:func:`holdout_source`, the one place it is built): ``--holdout-data`` when given,
else the first calibration samples, **held back** (:func:`held_back_count`: up to
:data:`DEFAULT_HOLDOUT_SAMPLES`, at most half of them). Held back means the candidates judged on
the slice are calibrated without it: the slice's statistics (one pass over it) are taken out of
the data set's (:meth:`StatsFile.without`, exact), so a method that fits its own calibration
samples best gains nothing from it, and the table ``auto`` returns is the candidate that was
judged, not the same recipe re-applied to all the data: on the real-model corpus a recipe
re-applied to all the samples lost up to 2.8 points that the judged table kept (a 99.99th
percentile of a few thousand LSTM gate values moves a lot with 64 more samples), and the judged
tables were as good or better on 9 of 10 models (benchmarks/README.md). With too few samples,
or statistics that are not of this data, the slice is judged in-sample, and the record says so.

Cost: one table per method; candidates whose Q/DQ models are the same (equal amax on every
tensor a quantized op reads, a mix that took one method everywhere) are judged once. The held-back
slice's statistics come from the calibration pass itself (:attr:`StatsFile.head`, a snapshot when
it reaches them), not a second pass. One isolated pass scores every distinct table where their
twins fit :data:`ISOLATED_TWIN_BUDGET` (else a few passes), keeping only each pair's SQNR sums;
then the slice runs FP32 once and every candidate, one candidate session at a time where the
slice's FP32 outputs fit :data:`KEPT_REFERENCE_BUDGET`. With ``--executor`` the isolated
scoring (every table, settling as here) is one task and each candidate's output pass another
on the workers (the slice's FP32 outputs computed once here and sent along); the scores are the
same.

Memory: every pass streams the slice and accumulates its sums (:class:`SqnrAccumulator`,
:class:`OutputsAccumulator`), and each batch runs in parts of at most :data:`JUDGE_BUDGET` of
activations, more for a pass returning many tensors (:func:`judging_part_bytes`, at most the
statistics pass's part; one sample where one is larger), in sessions without onnxruntime's CPU
arena, so judging holds a bounded amount whatever the number of held-back samples. The parts
change only the float32 rounding of the sums (at most 4e-5 dB on a 7-conv SR CNN): the choice
and the tables came out byte-identical.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantbench import calibrators as registry
from quantbench.backends.onnxruntime import (
    OnnxRuntimeRunner,
    expose,
    serialized_for_session,
    with_outputs,
)
from quantbench.choose.automemo import judgement_key, load_judgement, store_judgement
from quantbench.collect.executors import ExecutorSpec, run_tasks, task_threads
from quantbench.collect.statspass import ACTIVATION_BUDGET, collect_stats
from quantbench.collect.workerinput import WorkerInput
from quantbench.data.sources import (
    DataSource,
    Feed,
    dynamic_batch,
    feed_num_samples,
    feed_parts,
    feed_slice,
    open_data,
    samples_first,
)
from quantbench.errors import QuantbenchError, first_line
from quantbench.evaluate.isolated import build_isolated_many, shared_upgrades
from quantbench.evaluate.metrics import (
    OutputLayout,
    OutputsAccumulator,
    OutputSupport,
    SqnrAccumulator,
    ctc_agreement,
    power32,
    sqnr_of_sums,
)
from quantbench.evaluate.variants import Runner, VariantSessions
from quantbench.jsonsafe import json_float
from quantbench.machine import give_back_freed_memory
from quantbench.model.graph import Graph
from quantbench.model.protosize import SharedWeights
from quantbench.progress import progress_bar, warn
from quantbench.qdq import ACTIVATION, RESIDUAL, RUNTIME_WEIGHT, quantize_model
from quantbench.qdq.opset import default_opset
from quantbench.qdq.quantize import qdq_ready_model
from quantbench.stats.tensorstats import StatsFile
from quantbench.table import CalibrationTable
from quantbench.table.build import build_table, build_tables
from quantbench.table.json_table import decode_json_table, encode_json_table
from quantbench.table.trt_cache import TRTEXEC_ALGORITHM

AUTO = registry.AUTO
#: name of the per-tensor mix among the whole-model candidates
MIX = "mix"
#: the first choice among methods on ties: TensorRT's own calibrator
MIX_BASE = "entropy"
#: calibration samples judged on when no ``--holdout-data`` is given (at most half of them)
DEFAULT_HOLDOUT_SAMPLES = 64
#: fewest calibration samples of which a slice is held back (else it is judged in-sample)
MIN_HOLDBACK_SAMPLES = 8
#: batch size of the slice when the model's batch axis is dynamic and none was asked for ...
HOLDOUT_BATCH = 16
#: ... bounded by the input values per feed (a 224x224 RGB image is 150,528)
HOLDOUT_ELEMENTS = 1 << 21
#: near-duplicates of ``entropy`` that cost a full entropy search each and rarely differ from it.
SLOW_METHODS = frozenset({"entropy:slides", "entropy:pytorch"})
_RUNTIME_ROLES = (ACTIVATION, RESIDUAL, RUNTIME_WEIGHT)
#: how a recognizer's candidates are judged (:attr:`AutoTable.lines_agreed`)
RECOGNIZER_JUDGE = "CTC-decoded lines agreeing with FP32, then worst output's SQNR"
#: what the output pass judges: a table (its Q/DQ model is built from the FP32 graph) or a
#: ready Q/DQ model of that graph (a two-stage rewrite: :mod:`quantbench.choose.twostaged`)
Candidate = CalibrationTable | onnx.ModelProto


@dataclass
class JudgingBudget:
    """``--auto-budget``: the seconds auto's judging may take. The slice is cut to the samples
    that fit, the same first samples for every pass (so the candidates stay comparable): the
    count is estimated from the first part of the first pass, from the passes still to come;
    the output pass also stops at the deadline (after its first part). What was left is said.
    """

    seconds: float
    #: distinct tables to score in isolation (the first pass scores one)
    tables: int = 1
    started: float = field(default_factory=time.perf_counter)
    #: samples every pass reads, once estimated (None: the whole slice)
    samples: int | None = None
    #: samples the passes read, the fewest (what the judgement stood on)
    read: int | None = None
    #: samples in the slice, when a pass read it to the end
    whole: int | None = None

    def estimate(self, samples: int, seconds: float, per_table: int) -> None:
        """After the first pass's first part (``samples`` in ``seconds``, ``per_table`` bytes
        of one table's twins a sample): how many samples every pass can read. An isolated
        pass runs the FP32 model and a twin per quantized op (about two model runs a sample);
        the output pass runs FP32 and every candidate (the tables and the mix)."""
        group = max(1, ISOLATED_TWIN_BUDGET // max(per_table, 1))
        passes = 1 + math.ceil((self.tables - 1) / group) + (self.tables + 2) / 2
        per_sample = seconds / max(samples, 1) * passes
        left = self.seconds - (time.perf_counter() - self.started)
        self.samples = max(samples, int(left / per_sample)) if per_sample > 0 else None

    def reached(self, read: int, *, deadline: bool) -> bool:
        """Whether a pass that has read ``read`` samples stops here (it reads one part at
        least); ``deadline``: the output pass, which also stops when the time is up."""
        if read == 0:
            return False
        if self.samples is not None and read >= self.samples:
            return True
        return deadline and time.perf_counter() - self.started > self.seconds

    def finished(self, read: int, whole: bool, slice_samples: int | None) -> None:
        """A pass read ``read`` samples (``whole``: the slice to its end; ``slice_samples``:
        its size where the source knows it)."""
        self.read = read if self.read is None else min(self.read, read)
        size = read if whole else slice_samples
        if size:
            self.whole = max(self.whole or 0, size)

    def cut(self) -> str:
        """What the budget left out, in words ('' when every pass read the whole slice)."""
        if self.read is None or (self.whole is not None and self.read >= self.whole):
            return ""
        of = f" of {self.whole}" if self.whole else ""
        took = time.perf_counter() - self.started
        return (
            f"--auto-budget {self.seconds:g} s: judged on the first {self.read}{of} held-back "
            f"samples, the rest skipped (judging took {took:.1f} s)"
        )


def _slice_parts(
    held_out: DataSource,
    inputs: list[Any],
    per_sample: list[int],
    budget: JudgingBudget | None,
    *,
    deadline: bool = False,
    part_bytes: int | None = None,
) -> Iterator[Feed]:
    """The slice's batches in parts of at most ``part_bytes`` (default :data:`JUDGE_BUDGET`;
    ``per_sample[0]`` bytes a sample once measured), as many as ``budget`` allows."""
    read, whole = 0, True
    size = JUDGE_BUDGET if part_bytes is None else part_bytes
    for feed in held_out.batches():
        for part in feed_parts(feed, inputs, lambda: per_sample[0], size):
            if budget is not None and budget.reached(read, deadline=deadline):
                whole = False
                break
            yield part
            read += max(1, feed_num_samples(part, inputs))
        if not whole:
            break
    if budget is not None:
        budget.finished(read, whole, held_out.num_samples)


def default_auto_methods() -> list[str]:
    """Every registered method except :data:`SLOW_METHODS`."""
    return [m for m in registry.all_methods() if m not in SLOW_METHODS]


@dataclass
class AutoTable:
    """The chosen table, per tensor which method the mix picked, and every candidate's score."""

    table: CalibrationTable
    methods: list[str]
    #: tensor -> {"method" (used), "isolated_best", "readers",
    #: "isolated_sqnr_db": {method: worst reader SQNR}}
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: output SQNR (dB) on the judging slice of every whole-model candidate (:data:`MIX` and
    #: each method's full table)
    output_sqnr_db: dict[str, float] = field(default_factory=dict)
    #: the winning candidate: :data:`MIX` or a method name
    chosen: str = MIX
    holdout: str = ""
    #: how the candidates were scored, in words (:func:`judge_description`), or why they
    #: were not ("not judged: ...")
    judged_by: str = ""
    #: taken from an earlier run's identical judgement (:mod:`quantbench.choose.automemo`)
    reused: bool = False
    #: what ``--auto-budget`` left out of the judging, in words ('' when nothing)
    cut: str = ""
    #: candidates whose output pass stopped once they could no longer win: samples they read
    #: (their :attr:`output_sqnr_db` is the most they could still have reached)
    stopped: dict[str, int] = field(default_factory=dict)
    #: samples of the slice the isolated scores (the mix) stood on (None: an older record)
    isolated_samples: int | None = None
    #: calibration samples held back from the candidates' statistics (the slice they were
    #: judged on); 0 where the slice was ``--holdout-data`` or judged in-sample
    held_back: int = 0
    #: a recognizer's candidates (CTC posteriors): the share of held-back lines whose decode
    #: agrees with FP32's, which ranks them before their SQNR does (empty otherwise)
    lines_agreed: dict[str, float] = field(default_factory=dict)

    def clip_note(self) -> str:
        """Why this table's ranges can clip the calibration data, even minmax's: the slice's
        values were never in its statistics ('' where nothing was held back)."""
        if not self.held_back:
            return ""
        return (
            f"(auto's table is calibrated without the {self.held_back} samples it judges on, "
            "held back: their values can exceed its ranges, minmax's too)"
        )

    @property
    def judged(self) -> bool:
        """False when no candidate could be scored and a data-free method was used."""
        return not self.judged_by.startswith("not judged")

    @property
    def fallback(self) -> bool:
        """True when a single method's full table beat the per-tensor mix."""
        return self.chosen != MIX

    def to_dict(self) -> dict[str, Any]:
        return {
            "methods": list(self.methods),
            "holdout": self.holdout,
            "judged_by": self.judged_by,
            "reused": self.reused,
            "budget_cut": self.cut,
            "output_sqnr_db": {k: json_float(v) for k, v in self.output_sqnr_db.items()},
            "stopped_early": dict(self.stopped),
            "isolated_samples": self.isolated_samples,
            "held_back": self.held_back,
            "line_agreement": {k: json_float(v) for k, v in self.lines_agreed.items()},
            "chosen": self.chosen,
            "fallback": self.fallback,
            "tensors": [{"tensor": t, **c} for t, c in self.choices.items()],
        }

    def stored(self) -> dict[str, Any]:
        """Everything :meth:`restored` needs: :meth:`to_dict` and the table itself."""
        table = json.loads(encode_json_table(self.table))
        return {**self.to_dict(), "table": table}

    @classmethod
    def restored(cls, d: dict[str, Any], source: str) -> AutoTable:
        """The :meth:`stored` judgement, marked :attr:`reused`."""
        table = decode_json_table(json.dumps(d["table"]).encode(), source)
        choices = {c["tensor"]: {k: v for k, v in c.items() if k != "tensor"} for c in d["tensors"]}
        return cls(
            table,
            list(d["methods"]),
            choices,
            {k: float(v) for k, v in d["output_sqnr_db"].items()},
            str(d["chosen"]),
            str(d["holdout"]),
            str(d["judged_by"]),
            reused=True,
            stopped={str(k): int(v) for k, v in d.get("stopped_early", {}).items()},
            isolated_samples=d.get("isolated_samples"),
            held_back=int(d.get("held_back", 0)),
            lines_agreed={str(k): float(v) for k, v in (d.get("line_agreement") or {}).items()},
        )


def _checkpointed(
    parts: Iterable[Feed], inputs: list[Any], first: int
) -> Iterator[tuple[Feed, bool]]:
    """``parts``, each with whether it ends at a checkpoint: after ``first`` samples and at
    every doubling. A part is cut at a checkpoint where it can be (a fixed batch, or a feed
    without a batch axis, ends at the first checkpoint it passes)."""
    read, check = 0, first
    for part in parts:
        n = max(1, feed_num_samples(part, inputs))
        cuttable = n > 1 and dynamic_batch(inputs) and samples_first(part, n)
        start = 0
        while start < n:
            stop = min(n, start + check - read) if cuttable else n
            piece = part if start == 0 and stop == n else feed_slice(part, start, stop)
            read += stop - start
            reached = read >= check
            while check <= read:
                check *= 2
            yield piece, reached
            start = stop


def held_back_count(num_samples: int) -> int:
    """How many of the first calibration samples ``auto`` holds back to judge on: up to
    :data:`DEFAULT_HOLDOUT_SAMPLES` and at most half, so that the candidates are calibrated on
    at least as many; 0 below :data:`MIN_HOLDBACK_SAMPLES`."""
    if num_samples < MIN_HOLDBACK_SAMPLES:
        return 0
    return min(DEFAULT_HOLDOUT_SAMPLES, num_samples // 2)


def held_back_samples(graph: Graph, num_samples: int) -> int:
    """:func:`held_back_count`, whole batches of a model with a fixed batch of N."""
    held = held_back_count(num_samples)
    return held - held % _static_batch(graph)


def holdout_source(
    graph: Graph,
    calib_data: object | None,
    holdout_data: object | None = None,
    *,
    batch_size: int | None = None,
    preset: str | None = None,
    samples: int = DEFAULT_HOLDOUT_SAMPLES,
) -> DataSource:
    """The slice ``auto`` judges on: ``holdout_data`` whole, else the first ``samples``
    samples of ``calib_data`` (same preset and batch size)."""
    if holdout_data is not None:
        return open_data(holdout_data, graph.inputs, batch_size=batch_size, preset=preset)
    if calib_data is None:
        raise QuantbenchError(
            "--method auto needs data to judge the calibrators on: give calibration data "
            "(--data / --calib-data) or --holdout-data"
        )
    source = open_data(
        calib_data, graph.inputs, batch_size=batch_size, max_samples=samples, preset=preset
    )
    source.on_nonfinite = None  # the calibration pass, or its cached record, said it once
    return source


def _holdout_batch(
    graph: Graph,
    calib_data: object | None,
    holdout_data: object | None,
    preset: str | None,
    samples: int = DEFAULT_HOLDOUT_SAMPLES,
    provider: str | None = None,
    threads: int | None = None,
    batches_agree: bool | None = None,
) -> int | None:
    """A batch size for the slice when the model's batch axis is dynamic and the data (a file or
    folder) has one: up to :data:`HOLDOUT_BATCH` samples, at most :data:`HOLDOUT_ELEMENTS` input
    values per feed (the slice is run a dozen times: batches amortise onnxruntime's per-run
    cost, while a detector's large images stay one per feed). None: feed as the data comes.
    ``batches_agree``: True where the statistics pass ran two samples together and got their
    outputs run apart (:attr:`StatsFile.batches_agree`): no session is started to try the
    model on a batch again (0.2-0.4 s on captcha-crnn)."""
    if not dynamic_batch(graph.inputs):
        return None
    try:
        probe = holdout_source(
            graph, calib_data, holdout_data, batch_size=1, preset=preset, samples=samples
        )
        if not probe.splittable:  # a loader script or reader: fed as it yields
            return None
        first = next(iter(probe.batches()))
    except (QuantbenchError, StopIteration):
        return None  # e.g. data without a batch axis (one sample per feed)
    per_sample = sum(np.asarray(a).size for a in first.values())
    batch = max(1, min(HOLDOUT_BATCH, HOLDOUT_ELEMENTS // max(1, per_sample)))
    if batch == 1:
        return None
    try:  # data without a batch axis (one sample per feed) refuses a batch size
        batched = holdout_source(
            graph, calib_data, holdout_data, batch_size=batch, preset=preset, samples=samples
        )
    except QuantbenchError:
        return None
    if batches_agree:
        return batch
    return batch if _runs_batched(graph, batched, batch, provider, threads) else None


def _runs_batched(
    graph: Graph, source: DataSource, batch: int, provider: str | None, threads: int | None
) -> bool:
    """Whether the model runs ``batch`` samples in one feed, tried on the first two samples of
    the slice's first one: some declare a dynamic batch axis and reshape to a batch of 1
    inside (khmersm), and the statistics pass, fed as ``--batch-size`` says, never tried more.
    Two show it as well as ``batch`` (the judging passes run parts of 1 to ``batch`` samples)
    without holding ``batch`` samples' activations (1.6 GiB for 16 tiles of 256x256 through a
    64-channel CNN)."""
    try:
        feed = next(iter(source.batches()))
    except QuantbenchError:  # data that does not batch (images of several sizes): not the model
        return False
    feed = {name: np.asarray(value)[:2] for name, value in feed.items()}
    runner = OnnxRuntimeRunner(graph.model, provider, threads, arena=False)
    try:
        runner.infer(feed, [graph.model.graph.output[0].name])
    except QuantbenchError as exc:
        why = first_line(exc)
        warn(
            f"{graph.path.name if graph.path else 'the model'} declares a dynamic batch axis but "
            f"does not run {batch} samples at once ({why[:160]}{'...' * (len(why) > 160)}); "
            "--method auto runs its slice one sample at a time"
        )
        return False
    finally:
        runner.close()
    return True


def judge_auto(
    graph: Graph,
    stats: StatsFile,
    calib_data: object | None,
    holdout_data: object | None = None,
    *,
    batch_size: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
    methods: list[str] | None = None,
    executor: ExecutorSpec | None = None,
    budget_s: float | None = None,
) -> AutoTable:
    """``--method auto`` as every command runs it: the slice (held back from the candidates'
    statistics when it comes from the calibration data), then :func:`auto_table` (with
    ``executor``, its candidate evaluations are tasks on the workers; with ``budget_s``,
    judged here on as much of the slice as fits, :class:`JudgingBudget`)."""
    unjudgeable = _nothing_to_judge(graph, stats, methods)
    if unjudgeable is not None:
        return unjudgeable
    held = 0 if holdout_data is not None else held_back_samples(graph, stats.num_samples)
    samples = held or DEFAULT_HOLDOUT_SAMPLES
    fit, note = stats, ""
    if holdout_data is None:
        fit, note = _held_back_stats(
            graph, stats, calib_data, held, batch_size=batch_size, preset=preset, provider=provider
        )
    batch_size = batch_size or _holdout_batch(
        graph, calib_data, holdout_data, preset, samples, provider, threads, stats.batches_agree
    )
    source = holdout_source(
        graph, calib_data, holdout_data, batch_size=batch_size, preset=preset, samples=samples
    )
    slice_path = holdout_data if holdout_data is not None else calib_data
    job = None
    budget = JudgingBudget(budget_s) if budget_s is not None else None
    if budget is not None:
        executor = None  # the budget times the judging where it runs: here
    if executor is not None and not executor.is_local:
        if isinstance(slice_path, (str, Path)) and source.splittable:
            where = WorkerInput.of(
                graph,
                slice_path,
                batch_size=batch_size,
                max_samples=None if holdout_data is not None else samples,
                preset=preset,
                provider=provider,
                threads=threads or task_threads(executor),
            )
            job = AutoJob(where)
        else:
            warn(
                f"{source.description}: a data-loader script or Python reader cannot be "
                f"reopened by the workers; --method auto is judged here"
            )
    result = auto_table(
        graph, fit, source, methods, provider=provider, threads=threads, executor=executor,
        job=job, budget=budget,
    )  # fmt: skip
    result.holdout = source.description if holdout_data is not None else note
    result.held_back = held if fit is not stats else 0
    result.judged_by = result.judged_by or judge_description(graph.model)
    if budget is not None and (cut := budget.cut()):
        result.cut = cut
        warn(cut)
    return result


def choose_auto(
    graph: Graph,
    stats: StatsFile,
    calib_data: object | None,
    holdout_data: object | None = None,
    *,
    use_cache: bool = True,
    **options: Any,
) -> AutoTable:
    """:func:`judge_auto` (``options``: its keyword arguments), or an earlier run's identical
    judgement (:mod:`quantbench.choose.automemo`; ``use_cache=False``: neither read nor written)."""
    candidates = registry.expand_methods(options.get("methods") or default_auto_methods())
    key = None
    if use_cache:
        key = judgement_key(
            graph, stats, calib_data, holdout_data, batch_size=options.get("batch_size"),
            preset=options.get("preset"), provider=options.get("provider"), methods=candidates,
        )  # fmt: skip
    if key is not None and (found := load_judgement(key)) is not None:
        try:
            return AutoTable.restored(found, "--method auto's cached judgement")
        except (KeyError, TypeError, ValueError, QuantbenchError):
            pass  # an older or damaged record: judged again
    result = judge_auto(graph, stats, calib_data, holdout_data, **options)
    if key is not None and not result.cut:  # a judgement cut short is not the slice's
        store_judgement(key, result.stored())
    return result


def judge_description(model: Any) -> str:
    """What :func:`_judged_sqnr` scores on ``model``, in words: the worst output's SQNR, and
    which outputs count as their parts at equal power."""
    layout = OutputLayout.of(model)
    parts = layout.parts
    floats = {o.name for o in model.graph.output} - layout.exact - layout.value_free
    if not floats:
        return "worst integer output's share of changed values, in dB"
    which = "worst float output's SQNR" if layout.exact else "worst output's SQNR"
    if layout.chosen_from:
        listed = ", ".join(f"{o} on {', '.join(t)}" for o, t in layout.chosen_from.items())
        which += f" ({listed}: the tensors its NMS/NonZero chose from)"
    if not parts:
        return which
    whose = "its" if len(parts) == 1 else "their"
    return f"{which}, {', '.join(parts)} scored as {whose} parts at equal power"


def _static_batch(graph: Graph) -> int:
    """The model's fixed batch size when every input declares the same one, else 1."""
    sizes = {spec.shape[0] if spec.shape else None for spec in graph.inputs}
    size = sizes.pop() if len(sizes) == 1 else None
    return size if isinstance(size, int) and size > 1 else 1


def _held_back_stats(
    graph: Graph,
    stats: StatsFile,
    calib_data: object | None,
    held: int,
    *,
    batch_size: int | None,
    preset: str | None,
    provider: str | None,
) -> tuple[StatsFile, str]:
    """The statistics of the calibration samples after the first ``held`` (one pass over
    those, taken out of ``stats``) and the record's description of the slice; ``stats``
    itself, described as in-sample, when nothing can be held back."""
    total = stats.num_samples
    if held == 0:
        shown = min(total, DEFAULT_HOLDOUT_SAMPLES)
        return stats, (
            f"first {shown} calibration samples, also in the statistics ({total} samples are "
            "too few to hold some back; give --holdout-data)"
        )
    part_source = open_data(
        calib_data, graph.inputs, batch_size=batch_size, max_samples=held, preset=preset
    )
    part_source.on_nonfinite = None  # the calibration pass said it once
    part, stats.head = stats.head, None  # used once: not held through the judging
    if part is not None and part.num_samples == held and part_source.fingerprint:
        # kept apart by the calibration pass itself (no second pass): named as its data
        part = replace(part, data_fingerprint=part_source.fingerprint, head=None)
    else:
        part = collect_stats(
            graph, part_source, list(stats.tensors), provider=provider, show_progress=False
        )
    rest = stats.without(part) if part.num_samples == held else None
    if rest is None:
        warn(
            f"--method auto: the statistics are not those of {part_source.description} (given "
            "with --stats or --merge?): its first samples cannot be held back, so the candidates "
            "are judged on samples they were calibrated on"
        )
        return stats, f"first {held} calibration samples, also in the statistics"
    return rest, (
        f"first {held} of {total} calibration samples, held back: the candidates, and so the "
        f"table, are calibrated on the other {rest.num_samples}"
    )


def auto_table(
    graph: Graph,
    stats: StatsFile,
    held_out: DataSource,
    methods: list[str] | None = None,
    *,
    base: str = MIX_BASE,
    provider: str | None = None,
    threads: int | None = None,
    executor: ExecutorSpec | None = None,
    job: AutoJob | None = None,
    budget: JudgingBudget | None = None,
) -> AutoTable:
    """The best whole-model table among the mix and each method alone (see module doc),
    every candidate calibrated on ``stats``.

    When the mix wins, tensors no quantized op reads (a TensorRT cache still lists them) take
    the values of the best single method at the outputs. With ``executor`` and ``job``, the
    isolated scoring is one task and each candidate's output scoring another (the FP32 outputs
    of the slice computed once, here, and sent with the job); the scores, and so the choice,
    are the same.
    """
    method_list = registry.expand_methods(methods or default_auto_methods())
    if not method_list:
        raise QuantbenchError("--method auto: no calibration method to choose from")
    base_name = registry.canonical(base)
    if base_name not in method_list:
        method_list.insert(0, base_name)
    tables = build_tables(stats, method_list)  # its histograms not held through the judging
    readers = _readers(graph, tables[base_name])
    same_as = _identical_tables(tables, readers)
    judged = list(dict.fromkeys(same_as.values()))  # each distinct table scored once
    parallel = executor is not None and not executor.is_local and job is not None
    if budget is not None:
        parallel, budget.tables = False, len(judged)
    activations, part_bytes = 0, None
    stopped: dict[str, int] = {}  # candidates the output pass stopped early: samples read
    lines: dict[str, float] = {}  # a recognizer's candidates: decoded line agreement
    with ExitStack() as stack:  # the local judging's own progress (the workers' has its own)
        advance = None
        if not parallel:
            advance = stack.enter_context(
                progress_bar(_judging(len(judged) + 1, held_out), total=2 * len(judged) + 1,
                             unit="scores")
            )  # fmt: skip
        isolated = _IsolatedTask(
            {m: tables[m] for m in judged}, _twin_bytes(graph, stats, readers), readers,
            same_as, method_list,
        )  # fmt: skip
        if parallel:  # one task, as the local pass: the mix settles on every table's scores
            ((judged_scores, isolated_read),) = run_tasks(
                executor,
                _isolated_task,
                [isolated],
                shared=job,
                describe=lambda t: "--method auto: isolated scoring",
                description="auto: per-tensor scores",
            )
        else:
            with shared_upgrades():  # the candidates share one reference: upgraded once
                one = isolated.run(graph, held_out, provider, threads, advance, budget)
            give_back_freed_memory()  # the isolated model's session and its parts
            judged_scores, activations, isolated_read = one.scores, one.activations, one.samples
            part_bytes = one.part_bytes
        scores = {m: judged_scores[same_as[m]] for m in method_list}
        mixed = _relabelled(tables[base_name], base_name)
        choices: dict[str, dict[str, Any]] = {}
        for tensor, nodes in readers.items():
            worst = _worst_readers(nodes, scores, method_list)
            best = _best_method(worst, method_list)
            if tensor in tables[best]:
                mixed.set(tensor, tables[best].amax(tensor), best)
            choices[tensor] = {
                "method": best,
                "isolated_best": best,
                "readers": nodes,
                "isolated_sqnr_db": {m: json_float(v) for m, v in worst.items()},
            }
        # the methods the mix took most first: a strong method finished early stops the weak
        # ones sooner (the order changes no score)
        picks = Counter(c["method"] for c in choices.values())
        ranked = sorted(judged, key=lambda m: -sum(picks[x] for x in same_as if same_as[x] == m))
        scored = {**{m: tables[m] for m in ranked}, MIX: mixed}
        # a mix that took one method on every read tensor is that method's Q/DQ model
        mix_as = _identical_tables({**{m: tables[m] for m in judged}, MIX: mixed}, readers)[MIX]
        if mix_as != MIX:
            del scored[MIX]
            if advance is not None:
                advance(1)
        if parallel:
            job = replace(job, reference=reference_outputs(graph, held_out, provider, threads))
            found = run_tasks(
                executor,
                _output_task,
                list(scored.items()),
                shared=job,
                describe=lambda c: f"--method auto: output scoring of {c[0]}",
                description="auto: candidates",
            )
            scored_output = {name: score for name, (score, _) in zip(scored, found)}
            lines = {n: agreed for n, (_, agreed) in zip(scored, found) if agreed is not None}
        else:
            scored_output = output_sqnrs(
                graph,
                scored,
                held_out,
                provider,
                threads,
                advance=advance,
                activation_bytes=activations,
                part_bytes=part_bytes,
                budget=budget,
                stopped=stopped,
                no_bar={MIX},
                decoded=lines,
            )
    output = {MIX: scored_output[mix_as], **{m: scored_output[same_as[m]] for m in method_list}}
    # a recognizer is judged by its decoded lines first (CTC posteriors' SQNR rewards a table
    # that clips a rare character's logit: PP-OCRv4's recognizer, percentile 13.6 dB and 97.6 %
    # of lines against minmax's 13.4 dB and 99.3 %), its SQNR breaking ties
    agreed = {MIX: lines[mix_as], **{m: lines[same_as[m]] for m in method_list}} if lines else {}
    stopped_early = {m: stopped[same_as[m]] for m in method_list if same_as[m] in stopped}
    if mix_as in stopped:  # the mix too can stop once it can no longer win
        stopped_early = {MIX: stopped[mix_as], **stopped_early}
    # the highest output SQNR wins; ties go to the mix, then to the methods in list order
    order = [MIX, *tables]
    chosen = max(order, key=lambda c: (_ranked(agreed.get(c, 0.0)), _ranked(output[c]),
                                       -order.index(c)))  # fmt: skip
    unjudged = ""
    if all(_ranked(v) == -math.inf for v in output.values()):
        varied = any(math.isnan(v) for v in output.values())
        chosen, unjudged = _unjudged(method_list, base_name, varied)
    table = mixed
    if chosen != MIX:
        table = _relabelled(tables[chosen], chosen)
        for choice in choices.values():
            choice["method"] = chosen
    else:
        # tensors no quantized op reads (a TensorRT cache still lists them: TensorRT may run
        # their layers in INT8) take the best whole-model single method, not the tie-break base
        single = max(
            method_list,
            key=lambda m: (_ranked(agreed.get(m, 0.0)), _ranked(output[m]), -method_list.index(m)),
        )
        for name, entry in tables[single].entries.items():
            if name not in choices:
                table.set(name, entry.amax, single)
    return AutoTable(
        table,
        method_list,
        choices,
        output,
        chosen,
        judged_by=unjudged or (RECOGNIZER_JUDGE if agreed else ""),
        stopped=stopped_early,
        isolated_samples=isolated_read,
        lines_agreed=agreed,
    )


def _worst_readers(
    nodes: list[str], scores: dict[str, dict[str, float]], method_list: list[str]
) -> dict[str, float]:
    """Method -> the worst isolated SQNR among a tensor's quantized readers ``nodes``."""
    return {m: min(scores[m].get(n, -math.inf) for n in nodes) for m in method_list}


def _best_method(worst: dict[str, float], method_list: list[str]) -> str:
    """The mix's method for a tensor: the best worst reader; ties go to the earliest method in
    the list, i.e. the base first."""
    return max(method_list, key=lambda m: (worst[m], -method_list.index(m)))


def _mix_settled(
    readers: dict[str, list[str]], same_as: dict[str, str], method_list: list[str]
) -> Callable[[dict[str, dict[str, float]]], bool]:
    """For the isolated pass: given the distinct tables' scores so far, whether the mix they
    make (each tensor's method) is the one the previous check made."""
    last: list[dict[str, str]] = []

    def settled(judged_scores: dict[str, dict[str, float]]) -> bool:
        scores = {m: judged_scores[same_as[m]] for m in method_list}
        mix = {t: _best_method(_worst_readers(n, scores, method_list), method_list)
               for t, n in readers.items()}  # fmt: skip
        same = bool(last) and last[0] == mix
        last[:] = [mix]
        return same

    return settled


def _nothing_to_judge(
    graph: Graph, stats: StatsFile, methods: list[str] | None
) -> AutoTable | None:
    """The unjudged choice when no op of the model would be quantized (float16 tensors, no
    Conv/Gemm/MatMul): every candidate's Q/DQ model would be the FP32 one and score inf dB,
    a judgement that checked nothing. None when there is something to judge."""
    method_list = registry.expand_methods(methods or default_auto_methods())
    if not method_list:
        return None  # auto_table says so
    fallback = _data_free_or(method_list, method_list[0])
    table = build_table(stats, fallback)
    plan = quantize_model(graph, table, allow_partial=True, checked=False)
    if plan.quantized:
        return None
    why = f" (e.g. {plan.skipped[0].node}: {plan.skipped[0].reason})" if plan.skipped else ""
    warn(
        f"--method auto: nothing to judge: no op of the model would be quantized{why}; "
        f"using {fallback}, unjudged"
    )
    return AutoTable(
        _relabelled(table, fallback),
        method_list,
        chosen=fallback,
        judged_by="not judged: no op of the model would be quantized",
    )


def _data_free_or(method_list: list[str], otherwise: str) -> str:
    """The method an unjudged ``auto`` uses: the most robust one that needs no data, where
    it is a candidate."""
    return registry.DATA_FREE_METHOD if registry.DATA_FREE_METHOD in method_list else otherwise


def _unjudged(method_list: list[str], base_name: str, varied: bool) -> tuple[str, str]:
    """The choice when no candidate's output SQNR is defined (NaN or Inf in the slice's FP32
    outputs; ``varied``: outputs whose size differs between FP32 and the candidates, such as
    NonZero or NMS indices): the most robust method that needs no data, not the first in
    line, and said; and why, for :attr:`AutoTable.judged_by`."""
    fallback = _data_free_or(method_list, base_name)
    why = (
        "the outputs' sizes differ between FP32 and the candidates (a variable-size output: "
        "NonZero, NMS), so no value pairs up"
        if varied
        else "its FP32 outputs hold NaN or Inf: see the non-finite samples above"
    )
    warn(
        f"--method auto: no candidate's output SQNR is defined on the judging slice ({why}); "
        f"using {fallback}, unjudged"
    )
    return fallback, f"not judged: {why}"


def _ranked(score: float) -> float:
    """A candidate's score for ranking: an undefined one (NaN) ranks with the worst."""
    return -math.inf if math.isnan(score) else score


def isolated_sqnr(
    graph: Graph,
    table: CalibrationTable,
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
) -> dict[str, float]:
    """Node name -> SQNR (dB) of that op quantized alone with FP32 inputs, over ``held_out``."""
    return _isolated_pass(graph, {"table": table}, held_out, provider, threads).scores["table"]


def isolated_sqnrs(
    graph: Graph,
    tables: dict[str, CalibrationTable],
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
    advance: Callable[[int], None] | None = None,
) -> dict[str, dict[str, float]]:
    """:func:`isolated_sqnr` of every table (by name), in as few passes as memory allows: the
    twins of several tables share one reference graph, whose FP32 ops then run once instead of
    once a table. The first table runs alone and measures the bytes one table's twins add to
    a feed; the others go :data:`ISOLATED_TWIN_BUDGET` worth at a time (auto, which knows that
    size from the statistics, runs all tables in one pass where they fit). ``advance(n)``: n
    tables scored (after each pass)."""
    return _isolated_scores(graph, tables, held_out, provider, threads, advance).scores


@dataclass
class IsolatedPass:
    """What an isolated scoring found (:func:`_isolated_pass`, :func:`_isolated_scores`)."""

    #: table -> op -> isolated SQNR (dB)
    scores: dict[str, dict[str, float]]
    #: bytes a sample's twins of one table take
    per_table: int
    #: bytes a sample's FP32 tensors read by quantized ops take (they size the output pass's
    #: parts)
    activations: int
    #: samples the scores stood on
    samples: int
    #: the part size it ran (:func:`judging_part_bytes`), which the output pass takes too
    #: (None: it ran nothing; the output pass then takes :data:`JUDGE_BUDGET`)
    part_bytes: int | None = None


def _isolated_scores(
    graph: Graph,
    tables: dict[str, CalibrationTable],
    held_out: DataSource,
    provider: str | None,
    threads: int | None,
    advance: Callable[[int], None] | None = None,
    budget: JudgingBudget | None = None,
    twin_bytes: int | None = None,
    settled: Callable[[dict[str, dict[str, float]]], bool] | None = None,
) -> IsolatedPass:
    """:func:`isolated_sqnrs`, with what else the pass measured (the first pass's, where the
    tables took several). ``twin_bytes``: a sample's twins of one table, where known
    beforehand: every table in one pass where all fit the budget. ``settled``: where every
    table is in that one pass, it may stop at a checkpoint once ``settled(scores so far)``
    (:func:`_mix_settled`)."""
    names = list(tables)
    if not names:
        return IsolatedPass({}, 0, 0, 0)
    step = advance or (lambda n: None)
    fits = twin_bytes is not None and twin_bytes * len(names) <= ISOLATED_TWIN_BUDGET
    if budget is None and len(names) > 1 and (fits or twin_bytes is None):
        # every table's twins in one pass; where their size is not known beforehand (the
        # quantized ops' outputs have no statistics: quantize calibrates only the tensors
        # they read) the first sample measures it, and the pass gives up if it is too large
        limit = None if fits else ISOLATED_TWIN_BUDGET
        try:
            one = _isolated_pass(graph, tables, held_out, provider, threads, settled=settled,
                                 twin_limit=limit)  # fmt: skip
        except _TwinsTooLarge:
            pass  # a few passes instead, each table's twins measured by the first
        else:
            step(len(names))
            return one
    first = _isolated_pass(graph, {names[0]: tables[names[0]]}, held_out, provider, threads, budget)
    step(1)
    group = max(1, ISOLATED_TWIN_BUDGET // max(first.per_table, 1))
    for start in range(1, len(names), group):
        chunk = {n: tables[n] for n in names[start : start + group]}
        first.scores.update(
            _isolated_pass(graph, chunk, held_out, provider, threads, budget).scores
        )
        step(len(chunk))
    return first


#: bytes of a sample's isolated twins (INT8 ops' outputs) auto's combined isolated pass may
#: return: more tables' twins in one pass share the FP32 ops, but make its parts smaller.
#: The statistics pass's own part, :data:`~quantbench.collect.statspass.ACTIVATION_BUDGET`, so
#: that judging holds no more than calibrating did. At 96 MiB (orinet's three distinct tables
#: at 320x320, about 30 MiB of twins a sample each, in one pass: 4.8 -> 3.9 s) dddd-det's four
#: tables (36 MiB each at 416x416) took three passes, 4.4 s; in one 3.5 s, peak RSS 783 MiB
#: against its statistics pass's 845, the same table
ISOLATED_TWIN_BUDGET = ACTIVATION_BUDGET
#: samples of the slice after which ``auto``'s isolated pass first checks whether its mix has
#: settled (then at every doubling: 8, 16, 32, ...; it stops when two checks agree). On the
#: real-model corpus the isolated pass (FP32 plus a twin per table and quantized op over the
#: whole slice) was 40-50 % of the default's time; a fixed 8 samples gave the same mix on 9 of
#: 11 models, and a worse one on captcha-crnn (832 tensors, 2.5 dB lost at the outputs)
ISOLATED_FIRST_CHECK = 8
#: bytes of activations one run of a judging pass may return (the isolated pass's FP32 tensors
#: and twins) or, for an output pass, hold (the FP32 activations of the samples it runs): the
#: slice's batches are run in parts of at most this, so that judging holds a bounded amount
#: whatever the resolution and the number of held-back samples (the sums are streaming:
#: only their float32 rounding sees the parts)
JUDGE_BUDGET = 32 << 20
#: ... grown by this much a returned tensor (:func:`judging_part_bytes`)
JUDGE_BYTES_PER_TENSOR = 256 << 10


def judging_part_bytes(returned: int) -> int:
    """The part size of a judging pass whose runs return ``returned`` tensors:
    :data:`JUDGE_BYTES_PER_TENSOR` a tensor, at least :data:`JUDGE_BUDGET` and at most the
    statistics pass's own part, :data:`~quantbench.collect.statspass.ACTIVATION_BUDGET` (so
    judging never holds more than calibrating did). Why it grows: onnxruntime's cost per run
    grows with the nodes a run goes through, and a model of many small ops run one sample at a
    time pays it per sample: captcha-crnn's isolated model (2,720 nodes, 740 tensors returned)
    ran 90-270 ms a sample at batch 1, 50 ms at batch 8. Why by a quarter of the statistics
    pass's 1 MiB a tensor: at 1 MiB, minilm-l3's and basic-pitch's isolated parts (120 and 160
    MiB) set the default's peak (706 and 530-660 MiB); at 256 KiB it fell to 642 and 473 MiB,
    the time within the spread (captcha-crnn, dddd-det, minilm-l3: three runs each), the
    tables identical on the 11 corpus models."""
    return min(ACTIVATION_BUDGET, max(JUDGE_BUDGET, returned * JUDGE_BYTES_PER_TENSOR))


def _isolation_reference(graph: Graph, candidate: onnx.ModelProto) -> onnx.ModelProto:
    """The FP32 model the isolated twins join: ``graph``'s own, or where the Q/DQ models had
    to be upgraded to a higher opset, the upgraded copy quantizing keeps (the same model at
    their opset, its nodes named) rather than a second conversion held beside it."""
    upgraded = qdq_ready_model(graph)
    if upgraded is not None and default_opset(upgraded) == default_opset(candidate) > default_opset(
        graph.model
    ):
        return upgraded
    return graph.model


class _TwinsTooLarge(Exception):
    """An isolated pass's first sample measured more twin bytes than its limit allows."""


def _isolated_pass(
    graph: Graph,
    tables: dict[str, CalibrationTable],
    held_out: DataSource,
    provider: str | None,
    threads: int | None,
    budget: JudgingBudget | None = None,
    *,
    settled: Callable[[dict[str, dict[str, float]]], bool] | None = None,
    twin_limit: int | None = None,
) -> IsolatedPass:
    """One pass over ``held_out`` scoring every table's isolated ops (their twins renamed apart
    in one reference graph). Each batch runs in parts of at most :data:`JUDGE_BUDGET` bytes of
    returned tensors (measured on a first one-sample part); the first part also sizes a
    ``budget``'s slice. ``settled``: asked with the scores so far at each checkpoint
    (:func:`_checkpointed`); the pass stops where it says so. ``twin_limit``: raises
    :class:`_TwinsTooLarge` where the first sample's twins of all the tables take more bytes."""
    qdq_models = (  # one at a time: each is let go once its twins are built
        (f"t{index}", quantize_model(graph, table, allow_partial=True, checked=False).model)
        for index, table in enumerate(tables.values())
    )
    first = next(qdq_models, None)  # prepares the Q/DQ-ready form of the graph
    reference = graph.model if first is None else _isolation_reference(graph, first[1])
    many = build_isolated_many(reference, chain([first] if first else [], qdq_models))
    del first, reference
    twins_of = {name: many.twins[f"t{i}"] for i, name in enumerate(tables)}
    ops_of = {name: many.ops[f"t{i}"] for i, name in enumerate(tables)}
    sources = list(dict.fromkeys(t for twins in twins_of.values() for t in twins))
    fetch = list(dict.fromkeys([*sources, *(w for tw in twins_of.values() for w in tw.values())]))
    # a twin is its source's op on its source's FP32 inputs: its type is the source's, so
    # where the graph types every source no shape inference of the isolated model is needed
    # (0.23 s a candidate on dddd-ocr)
    types = {t: graph.elem_types[t] for t in sources if t in graph.elem_types}
    types.update(
        {w: graph.elem_types[t] for tw in twins_of.values() for t, w in tw.items()
         if t in graph.elem_types}
    )  # fmt: skip
    # the FP32 weights the session reads are the graph's own arrays, not the copy the isolated
    # model's proto holds (dddd-ocr: 54 MB less through the pass)
    loadable = serialized_for_session(
        expose(many.model, fetch, types, types_of_model=True, in_place=True),
        SharedWeights(graph.model),
    )
    del many  # the proto goes before onnxruntime parses the bytes
    runner = OnnxRuntimeRunner(loadable, provider, threads, generated_from=graph.model, arena=False)
    del loadable
    # one accumulator per distinct twin: tables that quantize an op's inputs alike share it
    accs = {(t, w): SqnrAccumulator() for tw in twins_of.values() for t, w in tw.items()}
    per_table, per_sample, activations, read = 0, [0], 0, 0

    def scores_now() -> dict[str, dict[str, float]]:
        return {
            name: {ops_of[name][t]: _ranked(accs[t, w].sqnr_db()) for t, w in twins.items()}
            for name, twins in twins_of.items()
        }

    part_bytes = judging_part_bytes(len(fetch))
    parts = _slice_parts(held_out, graph.inputs, per_sample, budget, part_bytes=part_bytes)
    checked = _checkpointed(parts, graph.inputs, ISOLATED_FIRST_CHECK) if settled else None
    for part, check in checked or ((p, False) for p in parts):
        start = time.perf_counter()
        got = runner.infer(part, fetch)
        samples = max(1, feed_num_samples(part, graph.inputs))
        read += samples
        first = not per_sample[0]
        if first:
            per_sample[0] = max(1, sum(np.asarray(v).nbytes for v in got.values()) // samples)
            activations = sum(np.asarray(got[t]).nbytes for t in sources) // samples
        power = {t: power32(got[t]) for t in sources}  # each source's once, for every table
        for twins in twins_of.values():
            twin_bytes = sum(np.asarray(got[w]).nbytes for w in twins.values())
            per_table = max(per_table, twin_bytes // samples)
        if first and twin_limit is not None and per_table * len(twins_of) > twin_limit:
            runner.close()
            raise _TwinsTooLarge
        for (tensor, twin), acc in accs.items():
            acc.update(got[tensor], got[twin], power[tensor])
        del got
        if first and budget is not None and budget.samples is None:
            budget.estimate(samples, time.perf_counter() - start, per_table)
        if check and settled is not None and settled(scores_now()):
            break
    runner.close()
    return IsolatedPass(scores_now(), per_table, activations, read, part_bytes)


def output_sqnr(
    graph: Graph,
    table: CalibrationTable,
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
) -> float:
    """SQNR (dB) of one table's full Q/DQ model's outputs against FP32 over ``held_out``."""
    return output_sqnrs(graph, {"table": table}, held_out, provider, threads)["table"]


def output_sqnrs(
    graph: Graph,
    tables: dict[str, Candidate],
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
    reference: list[dict[str, np.ndarray]] | None = None,
    advance: Callable[[int], None] | None = None,
    *,
    activation_bytes: int = 0,
    part_bytes: int | None = None,
    reference_graph: Graph | None = None,
    budget: JudgingBudget | None = None,
    stopped: dict[str, int] | None = None,
    no_bar: Collection[str] = (),
    kept: list[tuple[Feed, dict[str, np.ndarray]]] | None = None,
    decoded: dict[str, float] | None = None,
) -> dict[str, float]:
    """Candidate -> SQNR (dB) of its full Q/DQ model (built from its table, or given)
    against FP32 over ``held_out``: its worst
    output's, an output joining kinds of values (a detector's boxes and scores,
    :func:`quantbench.evaluate.outputaxes.concat_parts`) judged over its parts
    (:func:`_judged_sqnr`;
    ``-inf`` when one is undefined, e.g. holds NaN). The slice runs FP32 once (or
    ``reference``: FP32 outputs per batch computed before), in parts of at most
    ``part_bytes`` (default :data:`JUDGE_BUDGET`) of FP32 activations (``activation_bytes`` a
    sample; else the outputs' bytes, measured on a first one-sample part), so that no session
    holds a whole batch's activations. Where the parts and their FP32 outputs fit
    :data:`KEPT_REFERENCE_BUDGET` (or ``reference`` is given) the candidates then run one after
    another, one session alive at a time; else each part runs through every candidate in turn.
    The sums, and so the scores, are the same either way; except that one at a time, a
    candidate that can no longer win stops early (its score is then the most it could still
    have reached: ``stopped`` gets its name and the samples it read; ``no_bar`` ones set no
    bar for the others). Without ``stopped`` every score is exact: no candidate stops.
    ``reference_graph``: the FP32 model judged against, when not ``graph`` itself (a refined
    model's INT8 form is judged against the model it was refined from). ``budget``: the
    samples it may read, and a deadline (not with ``reference``). ``kept``: the slice's parts
    with their FP32 outputs as :func:`slice_reference` gave them, for callers judging many
    candidates one call at a time (the refinement passes): FP32 then runs once, not a call.
    ``decoded``: where the outputs are a recognizer's (:attr:`OutputSupport.recognizer`, by the
    shapes FP32 gave: CTC posteriors), filled with each candidate's CTC-decoded line agreement
    with FP32 (its worst output's), which then ranks them first: a candidate stops once the
    lines it could still agree on fall below the best finished one's (its share is then that
    bound)."""
    layout = OutputLayout.of(graph.model, held_out.unbatched)
    outputs, extra = layout.judged_tensors()
    accs = {name: OutputsAccumulator(outputs, False, layout) for name in tables}
    ended: dict[str, tuple[int, float]] = {}
    shared = SharedWeights(graph.model)  # the weights each candidate took unchanged, once

    def built(name: str) -> onnx.ModelProto:
        """A candidate's Q/DQ model, also giving the extra tensors judged."""
        candidate = tables[name]
        if isinstance(candidate, onnx.ModelProto):
            qdq = onnx.ModelProto()
            qdq.CopyFrom(candidate)  # with_outputs edits it
        else:
            qdq = quantize_model(graph, candidate, allow_partial=True, checked=False).model
        return with_outputs(qdq, extra, graph.elem_types, in_place=True)

    def session(model: onnx.ModelProto) -> OnnxRuntimeRunner:
        """A candidate's session, without an arena (it holds only what one run needs)."""
        loadable = serialized_for_session(model, shared)
        del model  # the proto goes before onnxruntime parses the bytes
        return OnnxRuntimeRunner(
            loadable, provider, threads, generated_from=graph.model, arena=False
        )

    runner_of = VariantSessions(list(tables), built, session, graph.model).runner

    seen: list[dict[str, np.ndarray]] = []  # the first FP32 outputs: their shapes
    lines = None  # a recognizer's bound on the lines a candidate can still agree on
    # (given FP32 outputs: a recognizer's candidates do not stop, its slice's length unknown)
    if reference is not None:  # the slice's batches, the FP32 outputs of each given
        given = reference
        seen = given[:1]
        ended = _score_in_turn(
            tables, accs, runner_of, lambda: zip(held_out.batches(), given, strict=False),
            outputs, graph.inputs, no_bar,
            stop_early=stopped is not None and not _reads_text(seen, outputs, layout, decoded),
        )  # fmt: skip
    else:
        against = reference_graph or graph
        fp32 = None
        if kept is None:
            fp32 = _fp32_runner(against, extra, provider, threads, shared)
            kept = None if budget is not None else _kept_reference(
                fp32, held_out, graph.inputs, outputs, activation_bytes, part_bytes
            )  # fmt: skip
        if kept is not None:
            if fp32 is not None:
                fp32.close()
            seen = [ref for _, ref in kept[:1]]
            if _reads_text(seen, outputs, layout, decoded):
                total = sum(max(1, feed_num_samples(part, graph.inputs)) for part, _ in kept)
                lines = _lines_bound(_sequences(seen, outputs, layout), total)
            ended = _score_in_turn(
                tables, accs, runner_of, lambda: kept, outputs, graph.inputs, no_bar,
                stop_early=stopped is not None, lines=lines,
            )  # fmt: skip
        else:
            _score_together(tables, accs, runner_of, fp32, held_out, graph.inputs, outputs,
                            activation_bytes, budget, part_bytes, seen)  # fmt: skip
    if advance is not None:
        advance(len(tables))
    if stopped is not None:
        stopped.update({name: read for name, (read, _) in ended.items()})
    if decoded is not None and _reads_text(seen, outputs, layout, decoded):
        sequences = _sequences(seen, outputs, layout)
        decoded.update({name: _lines_agreed(acc, sequences) for name, acc in accs.items()})
        if lines is not None:  # a stopped candidate: the most lines it could still agree on
            decoded.update({name: lines(accs[name], read) for name, (read, _) in ended.items()})
    scores = {name: _judged_sqnr(acc) for name, acc in accs.items()}
    return {**scores, **{name: bound for name, (_, bound) in ended.items()}}


def _reads_text(
    seen: list[dict[str, np.ndarray]],
    outputs: list[str],
    layout: OutputLayout,
    decoded: dict[str, float] | None,
) -> bool:
    """Whether a caller asking for ``decoded`` judges a recognizer: the outputs FP32 gave
    (``seen``: the first part's) are CTC posteriors (:attr:`OutputSupport.recognizer`)."""
    if decoded is None or not seen:
        return False
    return _support(seen, outputs, layout).recognizer


def _support(seen: list[dict[str, np.ndarray]], outputs: list[str], layout: OutputLayout
             ) -> OutputSupport:  # fmt: skip
    """:class:`OutputSupport` of the outputs by the shapes of ``seen``'s first FP32 outputs."""
    return OutputSupport.of({o: np.shape(seen[0][o]) for o in outputs if o in seen[0]}, layout)


def _sequences(seen: list[dict[str, np.ndarray]], outputs: list[str], layout: OutputLayout
               ) -> frozenset[str]:  # fmt: skip
    """The outputs a CTC decoder reads (``(N, T, C)`` scores per position)."""
    return _support(seen, outputs, layout).sequences


def _lines_agreed(acc: OutputsAccumulator, sequences: Collection[str]) -> float:
    """A candidate's worst CTC-decoded line agreement with FP32 over the ``sequences``."""
    found = [agreed / n for agreed, n in _lines_counted(acc, sequences)]
    return min(found) if found else math.nan


def _lines_counted(acc: OutputsAccumulator, sequences: Collection[str]
                   ) -> list[tuple[float, int]]:  # fmt: skip
    """Per sequence output: (lines whose decode agrees, lines read)."""
    paths = [acc.agreement[n] for n in sequences if n in acc.agreement and acc.agreement[n].paths_a]
    return [(ctc_agreement(p.paths_a, p.paths_b) * len(p.paths_a), len(p.paths_a)) for p in paths]


def _lines_bound(sequences: Collection[str], total: int
                 ) -> Callable[[OutputsAccumulator, int], float]:  # fmt: skip
    """``lines(acc, read)`` of :func:`_score_in_turn`: the share of the slice's ``total`` lines
    a candidate can still agree on, every line after its ``read`` samples agreeing (exact once
    it has read them all)."""

    def most(acc: OutputsAccumulator, read: int) -> float:
        counted = _lines_counted(acc, sequences)
        left = max(0, total - read)
        return min((agreed + left) / total for agreed, _ in counted) if counted else math.nan

    return most


#: bytes of the slice's parts and their FP32 outputs the output pass may keep, so that it scores
#: one candidate at a time (one candidate session alive: each holds its own copy of the weights,
#: 60-90 MiB a session for a 30 MB model); a slice that does not fit runs every candidate on
#: each part in turn instead (all sessions alive, nothing kept)
KEPT_REFERENCE_BUDGET = 64 << 20


def _kept_reference(
    fp32: OnnxRuntimeRunner,
    held_out: DataSource,
    inputs: list[Any],
    outputs: list[str],
    activation_bytes: int,
    part_bytes: int | None = None,
) -> list[tuple[Feed, dict[str, np.ndarray]]] | None:
    """The slice's parts (those :func:`_score_together` would run) with their FP32 outputs,
    or None once they outgrow :data:`KEPT_REFERENCE_BUDGET` (the FP32 runs done are lost)."""
    kept, held, per_sample = [], 0, [activation_bytes]
    for part in _slice_parts(held_out, inputs, per_sample, None, part_bytes=part_bytes):
        ref = fp32.infer(part, outputs)
        _size_parts(per_sample, part, ref, inputs)
        held += sum(np.asarray(v).nbytes for v in [*part.values(), *ref.values()])
        if held > KEPT_REFERENCE_BUDGET:
            return None
        kept.append((part, ref))
    return kept


def slice_reference(
    graph: Graph,
    held_out: DataSource,
    provider: str | None = None,
    threads: int | None = None,
    activation_bytes: int = 0,
) -> list[tuple[Feed, dict[str, np.ndarray]]] | None:
    """The parts of ``held_out`` that :func:`output_sqnrs` would run, each with the FP32
    outputs of ``graph``, computed once to judge many candidates (``output_sqnrs(kept=)``);
    None once they outgrow :data:`KEPT_REFERENCE_BUDGET` (each call then runs FP32 itself)."""
    outputs, extra = OutputLayout.of(graph.model, held_out.unbatched).judged_tensors()
    fp32 = _fp32_runner(graph, extra, provider, threads)
    try:
        return _kept_reference(fp32, held_out, graph.inputs, outputs, activation_bytes)
    finally:
        fp32.close()


def _fp32_runner(
    graph: Graph,
    extra: list[str],
    provider: str | None,
    threads: int | None,
    shared: SharedWeights | None = None,
) -> OnnxRuntimeRunner:
    """The FP32 side of the output pass: ``graph`` also giving the ``extra`` tensors judged in
    an NMS/NonZero output's place, without an arena; its weights ``shared``'s arrays where
    they are the same."""
    model = serialized_for_session(with_outputs(graph.model, extra, graph.elem_types), shared)
    return OnnxRuntimeRunner(model, provider, threads, arena=False)


def _size_parts(
    per_sample: list[int], part: Feed, ref: dict[str, np.ndarray], inputs: list[Any]
) -> None:
    """After the first part (one sample), the bytes a sample's FP32 outputs take, which size
    the slice's later parts (:func:`_slice_parts`), where no activation size was known."""
    if not per_sample[0]:
        samples = max(1, feed_num_samples(part, inputs))
        per_sample[0] = max(1, sum(np.asarray(v).nbytes for v in ref.values()) // samples)


def _score_in_turn(
    tables: dict[str, Candidate],
    accs: dict[str, OutputsAccumulator],
    runner_of: Callable[[str], Runner],
    pairs: Callable[[], Iterable[tuple[Feed, dict[str, np.ndarray]]]],
    outputs: list[str],
    inputs: list[Any],
    no_bar: Collection[str] = (),
    *,
    stop_early: bool = False,
    lines: Callable[[OutputsAccumulator, int], float] | None = None,
) -> dict[str, tuple[int, float]]:
    """Each candidate over every (part, FP32 outputs) pair of ``pairs()``, one session alive
    at a time. Each candidate's sums see the same pairs in the same order as
    :func:`_score_together`'s. With ``stop_early``, a candidate scored by SQNR stops as soon
    as it can no longer win (:func:`_score_bound` below the best finished candidate's score:
    not even a tie); returns those: name -> (samples it read, that bound). The winner, and
    any tie for it, reads every pair. ``no_bar`` candidates set no bar for the others (auto's
    mix: the best single method must be known exactly beside it, for the tensors no quantized
    op reads) but stop, as any, once they can no longer win against the others' bar.
    ``lines(acc, read)``: a recognizer's ranking, lines first: the most of the slice's lines a
    candidate's decode can still agree on after ``read`` samples (every line left agreeing);
    one stops once that is below the best finished candidate's share (its SQNR's bound is
    then returned as before, the most it could still reach)."""
    stopped: dict[str, tuple[int, float]] = {}
    whole: OutputsAccumulator | None = None
    best = best_lines = -math.inf
    for name in tables:
        acc, runner, read = accs[name], runner_of(name), 0
        for (part, ref), last in _with_last(pairs()):
            samples = max(1, feed_num_samples(part, inputs))
            # the part's samples tell a time-major [T, N, C] output's lines from its steps
            acc.update(ref, runner.infer(part, outputs), batch=samples)
            read += samples
            scored = stop_early and not last and whole is not None
            scored = scored and bool(_measured_outputs(acc))
            bound = _score_bound(acc, whole) if scored else math.inf
            beaten = lines(acc, read) < best_lines if lines is not None else bound < best
            if scored and beaten:
                stopped[name] = (read, bound)
                break
        runner.close()
        if name not in stopped:
            whole = whole or acc
            if name not in no_bar:
                best = max(best, _ranked(_judged_sqnr(acc)))
                if lines is not None:
                    best_lines = max(best_lines, _ranked(lines(acc, read)))
    return stopped


def _with_last(items: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """Each item and whether it is the last."""
    it = iter(items)
    try:
        item = next(it)
    except StopIteration:
        return
    for following in it:
        yield item, False
        item = following
    yield item, True


def _score_together(
    tables: dict[str, Candidate],
    accs: dict[str, OutputsAccumulator],
    runner_of: Callable[[str], Runner],
    fp32: OnnxRuntimeRunner,
    held_out: DataSource,
    inputs: list[Any],
    outputs: list[str],
    activation_bytes: int,
    budget: JudgingBudget | None,
    part_bytes: int | None = None,
    seen: list[dict[str, np.ndarray]] | None = None,
) -> None:
    """Each part of the slice through FP32 and then every candidate (all sessions alive):
    nothing kept but one part's outputs, and a ``budget``'s deadline cuts every candidate at
    the same sample. ``seen`` gets the first part's FP32 outputs."""
    runners = {name: runner_of(name) for name in tables}
    per_sample = [activation_bytes]
    for part in _slice_parts(
        held_out, inputs, per_sample, budget, deadline=True, part_bytes=part_bytes
    ):
        ref = fp32.infer(part, outputs)
        _size_parts(per_sample, part, ref, inputs)
        if seen is not None and not seen:
            seen.append(ref)
        batch = max(1, feed_num_samples(part, inputs))
        for name, runner in runners.items():
            accs[name].update(ref, runner.infer(part, outputs), batch=batch)
    for runner in [*runners.values(), fp32]:
        runner.close()


def _judging(candidates: int, held_out: DataSource) -> str:
    """What the judging's progress bar says it is doing."""
    n = held_out.num_samples
    on = f"{n} held-back samples" if n else "the held-back samples"
    return f"auto: judging {candidates} candidates on {on}"


def _judged_sqnr(acc: OutputsAccumulator, sqnr_of: Callable[[str], float] | None = None) -> float:
    """A candidate's score: its worst output's SQNR, where an output joining kinds of values
    counts as the SQNR it would have with each part scaled to the same power (the mean of the
    parts' noise-to-signal ratios). One ruined part drags that down; a near-tie in one part
    does not decide alone: on dddd-det the worst part alone chose the mix (objectness 17.4 dB
    against mse's 17.0) over mse, which was 5 dB better on the boxes, and lost 2.6 points of
    box F1. ``sqnr_of``: each output's (or part's) SQNR by name, else its accumulator's."""
    measured = _measured_outputs(acc)
    if not measured:  # integers only (class ids): fewer changed values score higher
        ids = [name for name in acc.names if name in acc.layout.exact]
        return min((_agreement_db(acc.agreement[name]) for name in ids), default=math.inf)
    if any(acc.drift[name].mismatched for name in measured):
        return math.nan  # an output's size varied: nothing pairs up, said by _unjudged
    of = sqnr_of or (lambda name: _sqnr(acc.drift[name]))
    scores = []
    for name in measured:
        parts = acc.parts_of(name)
        if not parts:
            scores.append(of(name))
            continue
        noise = [10 ** (-of(row) / 10) for row in parts]
        scores.append(-10 * math.log10(sum(noise) / len(noise)))
    return min(scores)


def _measured_outputs(acc: OutputsAccumulator) -> list[str]:
    """The float outputs a candidate is scored on by SQNR (none: integer outputs only)."""
    layout = acc.layout
    return [
        name
        for name in acc.names
        if name not in layout.exact | layout.value_free and not layout.stands_in(name, acc.names)
    ]


def _score_bound(acc: OutputsAccumulator, whole: OutputsAccumulator) -> float:
    """The highest score ``acc``'s candidate can still reach on the slice: each output's (and
    part's) noise so far against the signal of the whole slice (``whole``: a candidate that
    read all of it; the FP32 side is every candidate's). Noise only grows as samples are added
    and the score falls as any noise grows, so the final score is at most this. Only for
    candidates scored by SQNR (:func:`_measured_outputs`)."""

    def bound(name: str) -> float:
        part, full = acc.drift[name], whole.drift[name]
        if part.nonfinite_a or part.nonfinite_b:
            return -math.inf  # undefined from now on: the worst
        return sqnr_of_sums(full.sum_aa, part.sum_dd)

    return _judged_sqnr(acc, bound)


def reference_outputs(
    graph: Graph, held_out: DataSource, provider: str | None, threads: int | None
) -> list[dict[str, np.ndarray]]:
    """FP32 outputs of every batch of ``held_out`` (computed once, sent to the workers), and
    the tensors an NMS/NonZero chose from (:meth:`OutputLayout.judged_tensors`)."""
    outputs, extra = OutputLayout.of(graph.model, held_out.unbatched).judged_tensors()
    model = with_outputs(graph.model, extra, graph.elem_types)
    runner = OnnxRuntimeRunner(model, provider, threads)
    found = [runner.infer(feed, outputs) for feed in held_out.batches()]
    runner.close()
    return found


@dataclass(frozen=True)
class AutoJob:
    """What the workers need to score ``auto``'s candidates: the model and the slice
    (:class:`WorkerInput`) and, for the output scores, the slice's FP32 outputs per batch."""

    input: WorkerInput
    reference: list[dict[str, np.ndarray]] | None = None


def _job_graph_and_slice(job: AutoJob) -> tuple[Graph, DataSource]:
    return job.input.graph(), job.input.source()


@dataclass
class _IsolatedTask:
    """``auto``'s isolated scoring of its distinct tables (:func:`_isolated_scores`, settling
    with :func:`_mix_settled`), here or as one task on a worker."""

    tables: dict[str, CalibrationTable]
    twin_bytes: int | None
    readers: dict[str, list[str]]
    same_as: dict[str, str]
    methods: list[str]

    def run(
        self,
        graph: Graph,
        held_out: DataSource,
        provider: str | None,
        threads: int | None,
        advance: Callable[[int], None] | None = None,
        budget: JudgingBudget | None = None,
    ) -> IsolatedPass:
        settled = _mix_settled(self.readers, self.same_as, self.methods)
        return _isolated_scores(
            graph, self.tables, held_out, provider, threads, advance, budget, self.twin_bytes,
            settled,
        )  # fmt: skip


def _isolated_task(job: AutoJob, task: _IsolatedTask) -> tuple[dict[str, dict[str, float]], int]:
    graph, source = _job_graph_and_slice(job)
    with shared_upgrades():
        done = task.run(graph, source, job.input.provider, job.input.threads)
    return done.scores, done.samples


def _output_task(
    job: AutoJob, candidate: tuple[str, CalibrationTable]
) -> tuple[float, float | None]:
    """One candidate's output SQNR and, for a recognizer, its decoded line agreement."""
    graph, source = _job_graph_and_slice(job)
    name, table = candidate
    where = job.input
    lines: dict[str, float] = {}
    scores = output_sqnrs(
        graph, {name: table}, source, where.provider, where.threads, job.reference,
        decoded=lines,
    )  # fmt: skip
    return scores[name], lines.get(name)


def _agreement_db(acc: Any) -> float:
    """An integer output's score in dB: -10 log10 of the share of values that changed (1 %
    changed scores 20 dB, none 120 dB); undefined counts as the worst."""
    agreement = acc.metrics()["agreement"]
    if agreement is None:
        return -math.inf
    return -10 * math.log10(max(1.0 - agreement, 1e-12))


def _sqnr(acc: Any) -> float:
    """An accumulator's SQNR as a float; undefined (None, NaN) counts as the worst."""
    value = acc.metrics()["sqnr_db"]
    value = math.nan if value is None else float(value)
    return -math.inf if math.isnan(value) else value


def _identical_tables(
    tables: dict[str, CalibrationTable], readers: dict[str, list[str]]
) -> dict[str, str]:
    """Method -> the first method whose Q/DQ model is the same: a table with the same tensors
    and the same amax on every tensor a quantized op reads (``readers``; e.g. ``entropy:ort``
    with its defaults equals ``minmax``, and two tables that differ only on tensors no
    quantized op reads give the same model). Such tables score the same: scored once."""
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for method, table in tables.items():
        out[method] = first.setdefault(_qdq_key(table, readers), method)
    return out


def _qdq_key(table: CalibrationTable, readers: dict[str, list[str]]) -> tuple:
    """What of ``table`` its Q/DQ model holds: the tensors it has (where Q/DQ may go) and the
    amax of those a quantized op reads."""
    read = tuple((name, table.amax(name)) for name in sorted(readers) if name in table)
    return tuple(sorted(table.entries)), read


def _relabelled(table: CalibrationTable, method: str) -> CalibrationTable:
    """``table`` named ``auto`` (what was asked for), every entry recording ``method``. Its
    cache header is the one trtexec reads whichever method won: ``auto`` is no TensorRT
    calibrator, and a ``MinMaxCalibration`` header (minmax winning) would make trtexec drop the
    cache and calibrate on random data."""
    out = CalibrationTable(
        entries={}, method=AUTO, algorithm=TRTEXEC_ALGORITHM, provenance=table.provenance
    )
    for name, entry in table.entries.items():
        out.set(name, entry.amax, method)
    return out


def _twin_bytes(graph: Graph, stats: StatsFile, readers: dict[str, list[str]]) -> int | None:
    """Bytes a sample's isolated twins of one table take (the outputs of the quantized ops
    ``readers`` name, sized by the statistics' value counts), or None where an output has no
    statistics."""
    nodes = {n for names in readers.values() for n in names}
    outputs = {o for node in graph.model.graph.node if node.name in nodes for o in node.output if o}
    if not outputs or not stats.num_samples or not outputs <= set(stats.tensors):
        return None
    return sum(4 * stats[o].count for o in outputs) // stats.num_samples


def _readers(graph: Graph, table: CalibrationTable) -> dict[str, list[str]]:
    """Runtime tensor given a Q/DQ pair -> the quantized nodes reading it."""
    plan = quantize_model(graph, table, allow_partial=True, checked=False)
    out: dict[str, list[str]] = {}
    for q in plan.quantized:
        for qi in q.inputs:
            if qi.role in _RUNTIME_ROLES and q.node not in out.get(qi.tensor, []):
                out.setdefault(qi.tensor, []).append(q.node)
    return out
