"""Latency of a runner on one batch: warm-up, then timed runs (median / p90 / p99)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np


def measure_latency(
    infer: Callable[[Mapping[str, np.ndarray]], object],
    feed: Mapping[str, np.ndarray],
    batch_size: int,
    *,
    warmup: int = 10,
    runs: int = 100,
    max_seconds: float = 5.0,
) -> dict[str, float | int]:
    """Time ``infer(feed)``; stops after ``runs`` or ``max_seconds`` (at least 10 runs)."""
    for _ in range(warmup):
        infer(feed)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs and (len(times) < 10 or time.perf_counter() - start < max_seconds):
        t0 = time.perf_counter()
        infer(feed)
        times.append((time.perf_counter() - t0) * 1000.0)
    ms = np.asarray(times)
    median = float(np.median(ms))
    return {
        "median_ms": median,
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "throughput": batch_size * 1000.0 / median if median > 0 else 0.0,
        "batch_size": batch_size,
        "runs": len(times),
        "warmup": warmup,
    }
