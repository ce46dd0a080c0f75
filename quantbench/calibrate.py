"""Calibration as a whole: statistics (collected, cached, loaded or merged) -> tables -> files.

This is the Python twin of ``quantbench calibrate``; ``quantize`` and ``compare`` reuse
:func:`obtain_stats` so the same cached statistics feed every artefact.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import calibrators as registry
from quantbench.backends.onnxruntime import start_provider
from quantbench.choose.autocalib import (
    AUTO,
    ISOLATED_FIRST_CHECK,
    AutoTable,
    choose_auto,
    held_back_samples,
)
from quantbench.choose.clipguard import (
    DEFAULT_CLIP_WARN,
    ClipFlag,
    check_clip_warn,
    clip_flags,
    clip_summary,
    clip_warning,
)
from quantbench.collect.devicecollect import table_device
from quantbench.collect.executors import ExecutorSpec
from quantbench.collect.sharded import collect_sharded
from quantbench.collect.statspass import cached_stats_path, collect_stats, find_cached_stats
from quantbench.data.sources import can_reread, open_data
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_not_an_input, check_output_path, write_bytes_atomic
from quantbench.model.graph import (
    Graph,
    calibration_tensors,
    check_float_model,
    open_graph,
    untyped_tensors,
)
from quantbench.model.widen import float32_work_graph
from quantbench.progress import info, warn
from quantbench.stats.tensorstats import StatsFile, settled
from quantbench.table import CalibrationTable
from quantbench.table.build import build_table, no_finite_tensors, nonfinite_report
from quantbench.table.codecs import FORMAT_SUFFIX, encode_table, output_format
from quantbench.table.trt_cache import DEFAULT_TRT_VERSION, check_cache_target

__all__ = ["AUTO", "build_table", "calibrate", "obtain_stats", "CalibrationResult"]


@dataclass
class CalibrationResult:
    """Tables per method, the statistics they came from, the files written and the warnings."""

    tables: dict[str, CalibrationTable]
    stats: StatsFile
    stats_path: Path | None = None
    written: list[Path] = field(default_factory=list)
    #: tensors that held NaN/Inf (calibrated from their finite values unless none was finite)
    nonfinite: list[str] = field(default_factory=list)
    from_cache: bool = False
    #: method -> tensors whose threshold clips more than ``clip_warn`` of their values
    clipping: dict[str, list[ClipFlag]] = field(default_factory=dict)
    #: ``--method auto``: every candidate's score and the per-tensor choices
    auto: AutoTable | None = None
    #: node outputs of unknown type: not calibrated
    untyped: list[str] = field(default_factory=list)
    clip_warn: float = DEFAULT_CLIP_WARN


def auto_head(
    graph: Graph, method_list: list[str], holdout_data: object | None
) -> Callable[[int], int] | None:
    """:func:`obtain_stats`'s ``keep_head`` where ``--method auto`` will hold the first
    calibration samples back (no ``--holdout-data``): its pass keeps their statistics apart."""
    if AUTO not in method_list or holdout_data is not None:
        return None
    return functools.partial(held_back_samples, graph)


def obtain_stats(
    graph: Graph,
    data: object | None = None,
    *,
    tensors: str = "all",
    stats: str | Path | None = None,
    merge: list[str | Path] | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    use_cache: bool = True,
    show_progress: bool = True,
    executor: ExecutorSpec | None = None,
    before_inference: Callable[[], None] | None = None,
    keep_head: Callable[[int], int] | None = None,
    ranges_only: bool = False,
) -> tuple[StatsFile, Path | None, bool]:
    """Statistics for ``graph``: merged shards, a given file, the cache, or one new pass
    (``executor``: in shards on worker processes or a Ray cluster,
    :mod:`quantbench.collect.sharded`).
    ``before_inference`` runs once the session is ready, before the first batch (a check that
    must pass before any inference, overlapping the start-up). ``keep_head(samples)``: how
    many first samples a new local pass keeps apart as :attr:`StatsFile.head` (``--method
    auto``'s held-back slice, :func:`quantbench.choose.autocalib.held_back_samples`).
    ``ranges_only``: every method to come reads ranges only; a new local pass then skips the
    histograms (:func:`~quantbench.collect.statspass.collect_stats`) and is not cached, while
    cached full statistics still serve.

    Returns (stats, path it lives at, whether it came from disk without inference). An
    unreadable cache file is a miss: recomputed and overwritten (an explicit file is an error).
    """
    check_float_model(graph)
    if merge:
        merged = StatsFile.merge(_distinct_shards(graph, merge))
        return merged, None, True
    if stats is not None:
        return _load_for(graph, stats), Path(stats), True
    if data is None:
        raise QuantbenchError("no calibration data: give --data PATH (or --stats / --merge)")
    source = open_data(
        data, graph.inputs, batch_size=batch_size, max_samples=max_samples, preset=preset
    )
    if use_cache and source.fingerprint:
        cached = find_cached_stats(graph.hash, source.fingerprint, tensors)
        if cached is not None:
            try:
                loaded = _load_for(graph, cached)
            except QuantbenchError as exc:
                warn(f"ignoring an unreadable statistics cache file, recomputing: {exc}")
            else:
                # a file written before the tensor set grew (DWConv2D inputs) would otherwise
                # fail later as "calibration table lacks tensors"
                lacking = set(calibration_tensors(graph, tensors)) - set(loaded.tensors)
                if not lacking:
                    return loaded, cached, True
                info(f"{cached.name}: lacks {len(lacking)} tensor(s) to calibrate; recomputing")
    _name_untyped(graph)
    names = calibration_tensors(graph, tensors)
    if executor is not None and not executor.is_local:
        if before_inference is not None:
            before_inference()
        result = collect_sharded(
            graph,
            data,
            source,
            names,
            executor,
            batch_size=batch_size,
            max_samples=max_samples,
            preset=preset,
            provider=provider,
            show_progress=show_progress,
        )
    else:
        total = source.num_samples
        result = collect_stats(
            graph,
            source,
            names,
            provider=provider,
            show_progress=show_progress,
            before_inference=before_inference,
            head_samples=keep_head(total) if keep_head is not None and total else 0,
            join_feeds=batch_size is None,
            ranges_only=ranges_only,
        )
    path = None
    # a stream's fingerprint is known only after the pass; a range-only pass is never cached
    if use_cache and source.fingerprint and result.has_histograms:
        path = cached_stats_path(graph.hash, result.data_fingerprint, tensors)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.save(path)
    return result, path, False


def _distinct_shards(graph: Graph, paths: list[str | Path]) -> list[StatsFile]:
    """The ``--merge`` files, refused when two hold the same data (their fingerprints agree):
    merged, its samples would count twice; silently dropping one would hide the mistake."""
    seen: dict[str, str | Path] = {}
    shards = []
    for path in paths:
        shard = _load_for(graph, path)
        first = seen.setdefault(shard.data_fingerprint, path)
        if first is not path:
            raise QuantbenchError(
                f"{first} and {path} hold the same data ({shard.num_samples} samples, data "
                f"fingerprint {shard.data_fingerprint[:12]}): merged, it would count twice; "
                "give each shard once"
            )
        shards.append(shard)
    return shards


def _load_for(graph: Graph, path: str | Path) -> StatsFile:
    s = StatsFile.load(path)
    if not graph.made_for(s.model_hash):
        raise QuantbenchError(
            f"{path}: statistics were collected for another model (hash {s.model_hash[:12]}, "
            f"this model is {graph.hash[:12]}); re-run calibrate on this model"
        )
    if s.data_note:  # the pass that made them said it; reusing them says it again
        warn(f"{s.data_note} (found by the pass that made {Path(path).name})")
    return s


def _name_untyped(graph: Graph) -> list[str]:
    """Warn about node outputs whose type nothing could tell: they cannot be calibrated."""
    untyped = untyped_tensors(graph)
    if untyped:
        shown = ", ".join(untyped[:8]) + (" ..." if len(untyped) > 8 else "")
        warn(
            f"{len(untyped)} tensor(s) have no known type (neither ONNX shape inference nor "
            f"onnxruntime can type their ops) and are not calibrated: {shown}"
        )
    return untyped


def check_methods(methods: list[str] | None) -> list[str]:
    """Canonical method list (``all`` expanded, ``auto`` last), every name and option tried
    before any inference."""
    checks = MethodChecks(methods)
    checks.wait()
    return checks.methods


class MethodChecks:
    """:func:`check_methods` without holding up the start: the names and every option a
    calibrator can check alone (all built-ins) now; a plugin calibrator's trial run on a thread.

    :meth:`wait` comes before the first inference, so a bad option still fails before any; it
    then starts the methods' first-use costs (mse's 31 MiB step matrix; SciPy's import, 0.3-1
    s, where the TensorRT entropy's tie check needs it) on that thread, beside inference, which
    releases the GIL. Paid in the trial runs before inference, they slowed the model's loading
    by holding the GIL.
    """

    _THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-methods")

    def __init__(self, methods: list[str] | None, provider: str | None = None):
        self._provider = provider
        requested = methods or [registry.DEFAULT_METHOD]
        want_auto = any(m.strip() == AUTO for m in requested)
        # canonical names; an unknown one fails here, now
        names = registry.expand_methods([m for m in requested if m.strip() != AUTO])
        self.methods = [*names, AUTO] if want_auto else names
        tried = []
        for m in names:
            if registry.cheap_to_check(m):
                registry.check_method(m)
            else:
                tried.append(m)
        self._names = names
        self._trials = self._THREAD.submit(lambda: [registry.check_method(m) for m in tried])
        self._warming: Future | None = None

    def wait(self) -> None:
        """Re-raises the first bad option's error; then warms the methods up (once)."""
        self._trials.result()
        if self._warming is None:
            device = table_device(self._provider)
            self._warming = self._THREAD.submit(registry.warm_up, self._names, device)


def method_file_name(method: str, fmt: str) -> str:
    """``percentile:99.99`` -> ``percentile-99.99.cache`` (safe on every file system)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", method) + FORMAT_SUFFIX[fmt]


def default_tensors_mode(fmt: str) -> str:
    """A TensorRT cache should cover every tensor TensorRT may run in INT8 (design.md)."""
    return "all" if fmt in ("trt", "ort-flatbuffers", "json") else "quantizable"


def method_table(
    graph: Graph,
    stats: StatsFile,
    method: str,
    calib_data: object | None,
    holdout_data: object | None = None,
    *,
    batch_size: int | None = None,
    preset: str | None = None,
    provider: str | None = None,
    threads: int | None = None,
    executor: ExecutorSpec | None = None,
    use_cache: bool = True,
    auto_budget: float | None = None,
) -> tuple[CalibrationTable, AutoTable | None]:
    """One method's table; ``auto`` through :func:`quantbench.choose.autocalib.choose_auto`
    (``use_cache``: an earlier identical judgement may be reused, and this one is kept;
    ``auto_budget``: seconds its judging may take).

    ``auto`` judges candidates on data; with statistics alone (``--stats``/``--merge``, no
    data) it falls back, saying so, to :data:`~quantbench.calibrators.DATA_FREE_METHOD`.
    """
    if method == AUTO and holdout_data is None and (why := _cannot_judge(calib_data)):
        warn(why)
        return build_table(stats, registry.DATA_FREE_METHOD), None
    if method != AUTO:
        return build_table(stats, method), None
    auto = choose_auto(
        graph,
        stats,
        calib_data,
        holdout_data,
        batch_size=batch_size,
        preset=preset,
        provider=provider,
        threads=threads,
        executor=executor,
        use_cache=use_cache,
        budget_s=auto_budget,
    )
    return auto.table, auto


def check_auto_budget(seconds: float | None, methods: list[str]) -> None:
    """``--auto-budget`` times ``auto``'s judging: a positive number, with ``auto`` asked."""
    if seconds is None:
        return
    if not seconds > 0:
        raise QuantbenchError(f"--auto-budget {seconds:g}: give a number of seconds > 0")
    if AUTO not in methods:
        here = f"the method here is {', '.join(methods)}" if methods else "nothing here uses it"
        raise QuantbenchError(
            f"--auto-budget times --method auto's judging; {here}: drop --auto-budget"
        )


def _check_data_with_stats(
    data: object | None,
    stats: object | None,
    merge: list[str | Path] | None,
    methods: list[str],
    holdout_data: object | None,
) -> None:
    """``--data`` beside ``--stats``/``--merge`` is never calibrated on: it serves only
    ``auto``'s judging (said), and is refused where nothing reads it."""
    if data is None or (stats is None and not merge):
        return
    given = "--stats" if stats is not None else "--merge"
    if AUTO not in methods or holdout_data is not None:
        raise QuantbenchError(
            f"--data {data}: not read, the statistics come from {given}; drop --data, or drop "
            f"{given} to calibrate on that data"
        )
    info(
        f"statistics from {given}; --data {data} serves only --method auto, as the samples it "
        "judges the calibrators on"
    )


def _cannot_judge(calib_data: object | None) -> str:
    """Why ``auto`` cannot judge on ``calib_data`` (and so falls back to the data-free
    method), or ''."""
    if calib_data is None:
        return (
            "--method auto needs data to judge the calibrators on and only statistics were "
            f"given: using {registry.DATA_FREE_METHOD} (the most robust method that needs no "
            "data on the real-model corpus); give --data or --holdout-data for auto"
        )
    if not can_reread(calib_data):
        return (
            f"method auto reads the calibration data again to judge the calibrators, and a "
            f"{type(calib_data).__name__} can be read only once (a reader without rewind(), or "
            f"a generator): using {registry.DATA_FREE_METHOD}; give holdout data, or a reader "
            "with rewind(), for auto"
        )
    return ""


def calibrate(
    model: str | Path | Graph,
    data: object | None = None,
    *,
    methods: list[str] | None = None,
    output: str | Path | None = None,
    fmt: str | None = None,
    trt_version: str = DEFAULT_TRT_VERSION,
    tensors: str | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    stats: str | Path | None = None,
    merge: list[str | Path] | None = None,
    save_stats: str | Path | None = None,
    holdout_data: object | None = None,
    clip_warn: float = DEFAULT_CLIP_WARN,
    use_cache: bool = True,
    show_progress: bool = True,
    executor: ExecutorSpec | None = None,
    auto_budget: float | None = None,
    keep_histograms: bool = False,
) -> CalibrationResult:
    """Calibrate ``model`` with every method in ``methods`` from one statistics pass
    (``auto_budget``: seconds ``auto``'s judging may take; it then judges on fewer samples).
    Where every method reads ranges only (``minmax``) and a table is written, a new pass keeps
    no histograms, nor caches its statistics, unless ``keep_histograms`` (a report of them) or
    ``save_stats`` asks for them.

    Every option (methods and their options, format, TensorRT version, output paths) is checked
    before any inference, so a bad one costs nothing and leaves nothing behind.
    """
    checks = MethodChecks(methods, provider)
    method_list = checks.methods
    # one method into a file: its suffix names the format unless --format does; a folder of
    # several (or one) gets --format, else trt, in files named <method><suffix>
    into_file = output is not None and len(method_list) == 1 and not Path(output).is_dir()
    fmt = output_format(output if into_file else None, fmt)
    if fmt == "trt":
        check_cache_target(trt_version)
    check_clip_warn(clip_warn)
    if executor is not None:
        executor.validate()
    check_auto_budget(auto_budget, method_list)
    if AUTO in method_list and data is None and holdout_data is None:
        if methods:  # asked for by name: say what is missing
            raise QuantbenchError(
                "--method auto needs data to judge the calibrators on: give --data or "
                "--holdout-data"
            )
        method_list = [registry.DATA_FREE_METHOD]  # the default, from statistics alone
        warn(
            f"no data to judge the default method (auto) on: using {registry.DATA_FREE_METHOD}, "
            "the most robust method that needs no data on the real-model corpus"
        )
    _check_data_with_stats(data, stats, merge, method_list, holdout_data)
    if data is not None and stats is None and not merge:
        start_provider(provider)  # CUDA starts while the model loads
    # the model's check runs beside the pass's session start (collect_stats)
    graph = (
        model
        if isinstance(model, Graph)
        else float32_work_graph(open_graph(model, defer_check=True), "calibrate")
    )
    with graph.checked():
        mode = tensors or default_tensors_mode(fmt)
        calibration_tensors(graph, mode)  # a bad --tensors fails here
        targets = _output_targets(graph, method_list, output, fmt)
        if save_stats is not None:
            check_output_path(save_stats)
        own_inputs = (model, data, stats, holdout_data, *(merge or []))
        for target in (*targets.values(), save_stats):
            check_not_an_input(target, *own_inputs)
        stats_file, stats_path, from_cache = obtain_stats(
            graph,
            data,
            tensors=mode,
            stats=stats,
            merge=merge,
            batch_size=batch_size,
            max_samples=max_samples,
            preset=preset,
            provider=provider,
            use_cache=use_cache,
            show_progress=show_progress,
            executor=executor,
            before_inference=checks.wait,
            keep_head=auto_head(graph, method_list, holdout_data),
            ranges_only=_ranges_suffice(
                method_list, targets, keep_histograms or save_stats is not None
            ),
        )
    checks.wait()  # statistics from a file or the cache: no inference ran, the check still holds
    if save_stats is not None:
        stats_path = stats_file.save(save_stats)
    for line in nonfinite_report(stats_file):
        warn(line)
    tables: dict[str, CalibrationTable] = {}
    auto = None
    # the tables and the clip check read each tensor's histograms once; where the pass ran on
    # the GPU, the calibrators' candidate scores are computed there too
    with settled(), registry.tables_on(table_device(provider)):
        for m in method_list:
            tables[m], found = method_table(
                graph,
                stats_file,
                m,
                data,
                holdout_data,
                batch_size=batch_size,
                preset=preset,
                provider=provider,
                executor=executor,
                use_cache=use_cache,
                auto_budget=auto_budget,
            )
            auto = found or auto
        clipping = {
            m: clip_flags(stats_file, t, clip_warn, known=tables) for m, t in tables.items()
        }
    if len(clipping) > 1:  # --method all: a line per method; the tensors are in the report
        text = clip_summary(clipping, clip_warn, listed_by="--report PAGE")
    else:
        note = auto.clip_note() if auto is not None else ""
        text = "".join(clip_warning(f, clip_warn, m, listed_by="--report PAGE",
                                    note=note if m == AUTO else "")
                       for m, f in clipping.items())  # fmt: skip
    if text:
        warn(text)
    # every table is encoded (and so checked) before any file is written: one that cannot be
    # written must not leave the others of --method all behind
    encoded = {m: encode_table(tables[m], fmt, trt_version) for m in targets}
    if targets and len(method_list) > 1:
        next(iter(targets.values())).parent.mkdir(exist_ok=True)
    written = [write_bytes_atomic(target, encoded[m]) for m, target in targets.items()]
    return CalibrationResult(
        tables,
        stats_file,
        stats_path,
        written,
        stats_file.nonfinite_tensors(),
        from_cache,
        clipping,
        auto,
        untyped_tensors(graph),
        clip_warn,
    )


def _ranges_suffice(methods: list[str], targets: dict[str, Path], histograms: bool) -> bool:
    """Whether a new pass may keep ranges only: every method reads nothing else, a table is
    written (without one, the cached statistics are the run's one product) and nothing asks
    for the histograms (a report, ``--save-stats``)."""
    return bool(targets) and not histograms and registry.ranges_suffice(methods)


def _output_targets(
    graph: Graph, methods: list[str], output: str | Path | None, fmt: str
) -> dict[str, Path]:
    """One method: ``output`` is the file. Several: ``output`` is a folder of one file each
    (checked here, created only when the tables are written)."""
    if output is None:
        return {}
    out = Path(output)
    if len(methods) == 1:
        if out.is_dir():
            return {methods[0]: out / f"{graph.name}.{method_file_name(methods[0], fmt)}"}
        check_output_path(out)
        return {methods[0]: out}
    if out.exists() and not out.is_dir():
        raise QuantbenchError(f"{out}: with several methods -o names a folder, but this is a file")
    if not out.exists():
        check_output_path(out)  # the parent must exist
    return {m: out / method_file_name(m, fmt) for m in methods}


def summarize(result: CalibrationResult) -> None:
    """A short human summary on stderr (the CLI shows tables with inspect)."""
    s = result.stats
    origin = "cached statistics" if result.from_cache else "one onnxruntime pass"
    empty = no_finite_tensors(s)
    left_out = f" ({len(empty)} of them left out: no finite value)" if empty else ""
    info(
        f"calibrated {len(s)} tensors{left_out} over {s.num_samples} samples from {origin}; "
        f"methods: {', '.join(result.tables)}"
    )
    if result.auto is not None:
        auto = result.auto
        lines = auto.lines_agreed
        scores = ", ".join(  # a stopped candidate's figures are the most it could still reach
            f"{k} {'<= ' if k in auto.stopped else ''}"
            f"{f'{100 * lines[k]:.1f} % of lines, ' if k in lines else ''}{v:.2f} dB"
            for k, v in auto.output_sqnr_db.items()
        )
        if scores and auto.judged:
            on = f"{auto.holdout}; {auto.cut}" if auto.cut else auto.holdout
            info(f"auto: chose {auto.chosen} ({auto.judged_by} on {on}: {scores})")
            if auto.stopped:
                info(
                    "auto: stopped early, once they could no longer win: "
                    + ", ".join(
                        f"{k} (after {n} sample{'s' if n != 1 else ''})"
                        for k, n in auto.stopped.items()
                    )
                )
            if auto.isolated_samples:
                info(
                    f"auto: the mix's per-tensor scores stood on the first "
                    f"{auto.isolated_samples} held-back samples (checked after "
                    f"{ISOLATED_FIRST_CHECK} and at each doubling: read on until two checks "
                    "agreed or the slice ended)"
                )
        else:
            info(f"auto: {auto.chosen} ({auto.judged_by})")
        if auto.reused:
            info(
                "auto: that judgement is an earlier run's with the same model, statistics, data "
                "and options (kept beside the statistics cache; --no-cache judges again)"
            )
    by_path = dict(zip(result.written, result.tables, strict=False))
    for p in result.written:
        method = by_path.get(p, "?")
        note = registry.method_note(method) if method != "?" else ""
        info(f"wrote {p} (method {method}{': ' + note if note else ''})")
    if not result.written:
        kept = f"; statistics kept in {result.stats_path}" if result.stats_path else ""
        info(
            "no table was written (no -o): give -o FILE to write it (-o FOLDER for several "
            f"methods){kept}"
        )
