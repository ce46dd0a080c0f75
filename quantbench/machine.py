"""What this process may use of the machine it runs on (lowest layer: imports nothing of ours)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware where the platform tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None


def give_back_freed_memory() -> None:
    """Return the heap memory freed so far to the system (glibc's ``malloc_trim``), between
    phases that free a lot: glibc keeps freed blocks in its arenas (once a large block is
    freed its mmap threshold rises, and later ones of that size come from the heap), so a
    finished pass would otherwise weigh on the next pass's peak (auto's judging on magika:
    389 MiB resident before its output pass, 301 after a trim). A no-op elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: datasheet memory bandwidth in GB/s, by a part of the name the device reports (the longest
#: part that matches wins: "NVIDIA H100 NVL" is an H100 NVL, not an H100 80GB HBM3)
GPU_PEAK_GBPS = {"H100 80GB HBM3": 3350.0, "H100 NVL": 3900.0, "H200": 4800.0}
ESTIMATE = "estimate: memory clock x bus width x 2"


@dataclass(frozen=True)
class GpuPeak:
    """A GPU's name and the memory bandwidth that percentages of peak divide by."""

    name: str
    gbps: float  # NaN when neither the table nor the device's memory clock tells
    source: str  # "datasheet", ESTIMATE or "unknown"

    @property
    def label(self) -> str:
        """``"NVIDIA H200, peak 4800 GB/s (datasheet)"``, for titles."""
        if math.isnan(self.gbps):
            return f"{self.name}, peak unknown"
        return f"{self.name}, peak {self.gbps:.0f} GB/s ({self.source})"


def gpu_peak(name: str, memory_clock_khz: int | None, bus_width_bits: int | None) -> GpuPeak:
    """The datasheet peak of a device named ``name`` (:data:`GPU_PEAK_GBPS`), else an estimate
    from its memory clock (kHz, as CUDA reports it) and bus width: clock x bytes per transfer x 2
    transfers per clock (double data rate), labelled as an estimate."""
    for key in sorted(GPU_PEAK_GBPS, key=len, reverse=True):
        if key in name:
            return GpuPeak(name, GPU_PEAK_GBPS[key], "datasheet")
    if memory_clock_khz and bus_width_bits:
        gbps = memory_clock_khz * 1e3 * (bus_width_bits / 8) * 2 / 1e9
        return GpuPeak(name, gbps, ESTIMATE)
    return GpuPeak(name, math.nan, "unknown")


#: cudaDevAttrMemoryClockRate and cudaDevAttrGlobalMemoryBusWidth (CUDA 13 dropped the clock
#: from cudaDeviceProp; the attribute stays)
_CLOCK_ATTR, _BUS_ATTR = 36, 37


def describe_gpu(device: int = 0) -> GpuPeak:
    """Name and peak of GPU ``device``, read from the device through CuPy, else torch."""
    try:
        import cupy

        runtime = cupy.cuda.runtime
        name = runtime.getDeviceProperties(device)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            clock = int(runtime.deviceGetAttribute(_CLOCK_ATTR, device))
            bus = int(runtime.deviceGetAttribute(_BUS_ATTR, device))
        except Exception:  # noqa: BLE001 - no estimate then; a named device needs none
            clock = bus = None
        return gpu_peak(name, clock, bus)
    except ImportError:
        pass
    import torch

    props = torch.cuda.get_device_properties(device)
    clock = getattr(props, "memory_clock_rate", None)  # kHz, where torch reports it
    return gpu_peak(props.name, clock, getattr(props, "memory_bus_width", None))
