"""Calibration as a whole: statistics (collected, cached, loaded or merged) -> tables -> files.

This is the Python twin of ``quantbench calibrate``; ``quantize`` and ``compare`` reuse
:func:`obtain_stats` so the same cached statistics feed every artefact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import __version__
from quantbench import calibrators as registry
from quantbench.collect import cached_stats_path, collect_stats, find_cached_stats
from quantbench.data import open_data
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path
from quantbench.graph import Graph, calibration_tensors, open_graph
from quantbench.progress import info, warn
from quantbench.stats import StatsFile
from quantbench.table import CalibrationTable, Provenance
from quantbench.table.codecs import FORMAT_SUFFIX, write_table

DEFAULT_TRT_VERSION = "10.16.0"
#: per-tensor choice among the calibrators (quantbench.recovery.auto)
AUTO = "auto"
AUTO_HOLDOUT_SAMPLES = 64


@dataclass
class CalibrationResult:
    """Tables per method, the statistics they came from and the files written."""

    tables: dict[str, CalibrationTable]
    stats: StatsFile
    stats_path: Path | None = None
    written: list[Path] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)
    from_cache: bool = False


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
) -> tuple[StatsFile, Path | None, bool]:
    """Statistics for ``graph``: merged shards, a given file, the cache, or one new pass.

    Returns (stats, path it lives at, whether it came from disk without inference).
    """
    if merge:
        merged = StatsFile.merge([_load_for(graph, p) for p in merge])
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
            return _load_for(graph, cached), cached, True
    names = calibration_tensors(graph, tensors)
    result = collect_stats(graph, source, names, provider=provider, show_progress=show_progress)
    path = None
    if use_cache:
        path = cached_stats_path(graph.hash, result.data_fingerprint, tensors)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.save(path)
    return result, path, False


def _load_for(graph: Graph, path: str | Path) -> StatsFile:
    s = StatsFile.load(path)
    if s.model_hash != graph.hash:
        raise QuantbenchError(
            f"{path}: statistics were collected for another model (hash {s.model_hash[:12]}, "
            f"this model is {graph.hash[:12]}); re-run calibrate on this model"
        )
    return s


def build_table(stats: StatsFile, method: str, graph: Graph | None = None) -> CalibrationTable:
    """One method's table; tensors that held NaN/Inf are left out (they cannot be scaled)."""
    spec, _ = registry.parse_method(method)
    name = registry.canonical(method)
    table = CalibrationTable(
        method=name,
        algorithm=spec.trt_algorithm,
        provenance=Provenance(
            model_hash=stats.model_hash,
            data_fingerprint=stats.data_fingerprint,
            num_samples=stats.num_samples,
            tool_version=__version__,
        ),
    )
    for t in stats:
        if t.has_nonfinite:
            continue
        table.set(t.name, registry.compute_amax(method, t), name)
    return table


def auto_method_table(
    graph: Graph,
    stats: StatsFile,
    holdout: object | None,
    *,
    preset: str | Path | None = None,
    provider: str | None = None,
) -> CalibrationTable:
    """``--method auto``: each quantized tensor gets the calibrator with the least isolated error
    on a held-back slice (by default the first 64 samples of the calibration data)."""
    from quantbench.recovery.auto import auto_table

    if holdout is None:
        raise QuantbenchError("--method auto needs data to judge the calibrators on: give --data")
    source = open_data(holdout, graph.inputs, max_samples=AUTO_HOLDOUT_SAMPLES, preset=preset)
    return auto_table(graph, stats, source, provider=provider).table


def method_file_name(method: str, fmt: str) -> str:
    """``percentile:99.99`` -> ``percentile-99.99.cache`` (safe on every file system)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", method) + FORMAT_SUFFIX[fmt]


def default_tensors_mode(fmt: str) -> str:
    """A TensorRT cache should cover every tensor TensorRT may run in INT8 (design.md)."""
    return "all" if fmt in ("trt", "ort-flatbuffers", "json") else "quantizable"


def calibrate(
    model: str | Path | Graph,
    data: object | None = None,
    *,
    methods: list[str] | None = None,
    output: str | Path | None = None,
    fmt: str = "trt",
    trt_version: str = DEFAULT_TRT_VERSION,
    tensors: str | None = None,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    stats: str | Path | None = None,
    merge: list[str | Path] | None = None,
    save_stats: str | Path | None = None,
    use_cache: bool = True,
    show_progress: bool = True,
) -> CalibrationResult:
    """Calibrate ``model`` with every method in ``methods`` from one statistics pass."""
    if fmt not in FORMAT_SUFFIX:
        raise QuantbenchError(f"--format must be one of {', '.join(FORMAT_SUFFIX)}, not {fmt!r}")
    requested = methods or ["entropy"]
    want_auto = any(m.strip() == AUTO for m in requested)
    method_list = registry.expand_methods([m for m in requested if m.strip() != AUTO])
    if want_auto:
        method_list.append(AUTO)
    graph = model if isinstance(model, Graph) else open_graph(model)
    targets = _output_targets(graph, method_list, output, fmt)
    if save_stats is not None:
        check_output_path(save_stats)
    mode = tensors or default_tensors_mode(fmt)
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
    )
    if save_stats is not None:
        stats_path = stats_file.save(save_stats)
    nonfinite = stats_file.nonfinite_tensors()
    if nonfinite:
        warn(
            f"{len(nonfinite)} tensor(s) held NaN/Inf and are left out of the tables: "
            + ", ".join(nonfinite[:8])
            + (" ..." if len(nonfinite) > 8 else "")
        )
    tables = {
        m: auto_method_table(graph, stats_file, data, preset=preset)
        if m == AUTO
        else build_table(stats_file, m, graph)
        for m in method_list
    }
    written = []
    for m, target in targets.items():
        written.append(write_table(tables[m], target, fmt, trt_version=trt_version))
    return CalibrationResult(tables, stats_file, stats_path, written, nonfinite, from_cache)


def _output_targets(
    graph: Graph, methods: list[str], output: str | Path | None, fmt: str
) -> dict[str, Path]:
    """One method: ``output`` is the file. Several: ``output`` is a folder of one file each."""
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
        out.mkdir()
    return {m: out / method_file_name(m, fmt) for m in methods}


def summarize(result: CalibrationResult) -> None:
    """A short human summary on stderr (the CLI shows tables with inspect)."""
    s = result.stats
    origin = "cached statistics" if result.from_cache else "one onnxruntime pass"
    info(
        f"calibrated {len(s)} tensors over {s.num_samples} samples from {origin}; "
        f"methods: {', '.join(result.tables)}"
    )
    for p in result.written:
        info(f"wrote {p}")
