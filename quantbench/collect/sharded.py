"""Sharded calibration: the data cut into sample ranges, one onnxruntime pass per shard on the
executor's workers, the statistics merged exactly on the driver.

Each worker opens the data where it is (an absolute path it can read: a shared file system on a
cluster), reads only its shard's batches — the same batches, batched the same way, as one
local pass (:meth:`quantbench.data.sources.DataSource.shards`) — and returns its :class:`StatsFile`.
Binning is exact and merging is exact and order-independent, so the merged statistics, and
every table made from them, are byte-identical to a local run whatever the number of workers
and the order the shards finish in. The driver records what a local run records: the whole
data's fingerprint, its sample count and the model's path.

A source the workers cannot open by path (a data-loader script, a Python reader) is one stream:
it is calibrated here, in one pass, with a one-line note.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from quantbench.collect.executors import ExecutorSpec, run_tasks, task_threads, width
from quantbench.collect.statspass import collect_stats
from quantbench.collect.workerinput import WorkerInput
from quantbench.data.sources import DataSource, NonFiniteSamples
from quantbench.model.graph import Graph
from quantbench.progress import info, warn
from quantbench.stats.tensorstats import StatsFile


@dataclass(frozen=True)
class ShardJob:
    """What every shard needs, sent to the workers once (Ray's object store, or the worker
    processes' initialiser): the model and data (:class:`WorkerInput`) and the tensors."""

    input: WorkerInput
    tensors: tuple[str, ...]


@dataclass
class ShardResult:
    """One shard's statistics, its NaN/Inf input samples and how long its pass took."""

    shard: tuple[int, int]
    stats: StatsFile
    nonfinite: NonFiniteSamples
    seconds: float


def collect_shard(job: ShardJob, shard: tuple[int, int]) -> ShardResult:
    """One shard's onnxruntime pass (runs on a worker)."""
    graph, source = job.input.graph(), job.input.source(sample_range=shard)
    source.on_nonfinite = None  # reported once, by the driver, for the whole data
    start = time.perf_counter()
    stats = collect_stats(
        graph,
        source,
        list(job.tensors),
        provider=job.input.provider,
        threads=job.input.threads,
        binning_threads=job.input.threads,
        show_progress=False,
    )
    return ShardResult(shard, stats, source.nonfinite, time.perf_counter() - start)


#: the task each shard runs (a module attribute, so a test can make one shard fail)
shard_task = collect_shard


def shard_job(
    graph: Graph,
    data: str | Path,
    tensors: list[str],
    spec: ExecutorSpec,
    *,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
) -> ShardJob:
    """The shards' common input (paths made absolute by :class:`WorkerInput`)."""
    where = WorkerInput.of(
        graph,
        data,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
        threads=task_threads(spec),
    )
    return ShardJob(where, tuple(tensors))


def run_shards(
    job: ShardJob,
    shards: list[tuple[int, int]],
    spec: ExecutorSpec,
    origin: str,
    show_progress: bool = True,
) -> list[ShardResult]:
    """Every shard on the executor, results in shard order; a shard that fails twice fails the
    command in one line naming it."""
    total = len(shards)
    order = {s: i for i, s in enumerate(shards)}

    def describe(shard: tuple[int, int]) -> str:
        first, last = shard[0], shard[1] - 1
        return f"calibration shard {order[shard] + 1}/{total} ({origin}, samples {first}-{last})"

    return run_tasks(
        spec,
        shard_task,
        shards,
        shared=job,
        describe=describe,
        description=f"Calibrating {total} shards",
        show_progress=show_progress,
    )


def merge_shards(results: list[ShardResult], source: DataSource, graph: Graph) -> StatsFile:
    """The shards' statistics merged, recorded as a local run records the whole data."""
    merged = StatsFile.merge(r.stats for r in results)
    merged.data_fingerprint = source.fingerprint or merged.data_fingerprint
    merged.model_hash = graph.hash
    merged.model_path = str(graph.path or "")
    if merged.num_samples != source.num_samples:  # the shards must cover the data exactly
        raise AssertionError(
            f"shards hold {merged.num_samples} samples, the data {source.num_samples}"
        )
    record = NonFiniteSamples()
    for r in sorted(results, key=lambda r: r.shard):
        for key, n in r.nonfinite.count.items():
            record.count[key] = record.count.get(key, 0) + n
            kept = record.first.setdefault(key, [])
            kept.extend(r.nonfinite.first[key][: max(0, 20 - len(kept))])
    source.nonfinite = record
    if record and source.on_nonfinite is not None:
        source.on_nonfinite(record.message())
    return merged


def collect_sharded(
    graph: Graph,
    data: object,
    source: DataSource,
    tensors: list[str],
    spec: ExecutorSpec,
    *,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    provider: str | None = None,
    show_progress: bool = True,
) -> StatsFile:
    """Statistics of ``source`` (opened on the driver from ``data``) computed shard by shard on
    the executor ``spec`` names; a stream is calibrated here with a one-line note."""
    if spec.is_local or not isinstance(data, (str, Path)) or not source.splittable:
        if not spec.is_local:
            warn(
                f"{source.description}: a data-loader script or Python reader cannot be split "
                f"into shards; calibrating it here in one pass (not with --executor {spec.kind})"
            )
        return collect_stats(graph, source, tensors, provider=provider, show_progress=show_progress)
    shards = source.shards(width(spec))
    job = shard_job(
        graph,
        data,
        tensors,
        spec,
        batch_size=batch_size,
        max_samples=max_samples,
        preset=preset,
        provider=provider,
    )
    results = run_shards(job, shards, spec, str(data), show_progress)
    merged = merge_shards(results, source, graph)
    if show_progress:
        slowest = max(r.seconds for r in results)
        info(f"calibrated {len(shards)} shards on --executor {spec.kind} (slowest {slowest:.1f} s)")
    return merged
