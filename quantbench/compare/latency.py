"""Latency of a runner on one batch: warm-up, then timed runs (median / p90 / p99)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

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


_PROVIDERS = {"CPUExecutionProvider": "CPU", "CUDAExecutionProvider": "CUDA"}


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def timing_note(doc: Mapping[str, Any]) -> str | None:
    """What a results document's latency numbers are, where no TensorRT engine was timed:
    onnxruntime runs a Q/DQ model's ops mostly in float around QuantizeLinear/DequantizeLinear
    (``quantize --int-ops`` lists the exceptions) and on CPU computes an FP16 candidate as FP32
    with FP16 rounding, so its times say nothing of TensorRT's INT8 or FP16 speed, e.g.
    "onnxruntime CPU, Q/DQ emulated: not TensorRT's speed". None where a side ran on TensorRT
    or nothing was timed."""
    latency = _dict(doc.get("latency"))
    if not latency:
        return None
    sides = [{**_dict(doc.get(key.lower())), **_dict(latency.get(key))} for key in ("A", "B")]
    backends = {str(side["backend"]) for side in sides if side.get("backend")}
    if "tensorrt" in backends:
        return None
    emulated: list[str] = []
    for side in sides:
        precisions = _dict(side.get("op_precisions"))
        if precisions.get("int8") or str(side.get("spec") or "").startswith("int8"):
            emulated.append("Q/DQ")
        if _dict(side.get("fp16")).get("mode") == "emulated" or precisions.get("fp16-emulated"):
            emulated.append("FP16")
    what = " and ".join(dict.fromkeys(emulated))
    providers = sorted(
        {_PROVIDERS.get(str(s["provider"]), str(s["provider"])) for s in sides if s.get("provider")}
    )
    where = " ".join(["onnxruntime", "/".join(providers)]).strip()
    if backends - {"onnxruntime"}:
        where = "no TensorRT engine timed"
    return f"{where}{', ' + what + ' emulated' if what else ''}: not TensorRT's speed"
