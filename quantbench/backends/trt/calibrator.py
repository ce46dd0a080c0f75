"""The IInt8Calibrator adapter: one factory, any of TensorRT's four calibrator bases.

TensorRT drives a calibrator through a pybind trampoline (python/src/infer/pyInt8.cpp) that
swallows every Python exception: a failing ``get_batch`` is printed as
``[ERROR] Exception caught in get_batch()`` and silently treated as "no more data", so a broken
data loader yields a quietly wrong INT8 engine. Here every call is wrapped; the first failure is
recorded on ``calibrator.error`` and :func:`raise_for_calibration` turns it into a
QuantbenchError after the build.

Contract followed (reference §6.2): call the base ``__init__`` explicitly; ``get_batch_size`` is 1
(explicit batch); ``get_batch(names)`` returns exactly ``len(names)`` device pointers in ``names``
order, kept alive until the next call, or None when done; ``read_calibration_cache`` returns bytes
or None; ``write_calibration_cache`` copies the memoryview TensorRT lends.

All logic lives in :class:`CalibrationFeed`, a plain class; the TensorRT subclass made by
:func:`make_calibrator` only forwards to it, so the behaviour is testable without TensorRT.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np

from quantbench.backends.trt.device import DeviceAllocator, DeviceBuffer, default_allocator
from quantbench.backends.trt.version import features_of
from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path, write_bytes_atomic

CalibratorBase = Literal["entropy2", "entropy", "minmax", "legacy"]

BASE_CLASS_NAMES: dict[str, str] = {
    "entropy2": "IInt8EntropyCalibrator2",
    "entropy": "IInt8EntropyCalibrator",
    "minmax": "IInt8MinMaxCalibrator",
    "legacy": "IInt8LegacyCalibrator",
}

# Cache-header algorithm token -> calibrator base that reads it. The first two are seen in real
# caches (reference §2.1); the tokens of EntropyCalibrator (v1) and Legacy are unverified (§8.3).
CACHE_ALGORITHM_BASES: dict[str, CalibratorBase] = {
    "EntropyCalibration2": "entropy2",
    "MinMaxCalibration": "minmax",
    "EntropyCalibration": "entropy",
    "LegacyCalibration": "legacy",
}

Batch = Mapping[str, np.ndarray] | Sequence[np.ndarray]
_END = object()
InputMetadata = Mapping[str, tuple[np.dtype, tuple[int, ...]]]


def cache_header(cache: bytes) -> str:
    """First line of a TensorRT calibration cache (``TRT-100300-EntropyCalibration2``)."""
    return cache.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def base_for_cache(cache: bytes) -> CalibratorBase:
    """The calibrator base whose ``getAlgorithm()`` matches the cache's header token.

    TensorRT ignores a cache written for another algorithm and recalibrates, so a cache-only
    build must use the matching base.
    """
    header = cache_header(cache)
    parts = header.split("-")
    if len(parts) < 3 or parts[0] != "TRT":
        raise QuantbenchError(
            f"not a TensorRT calibration cache (first line {header[:60]!r}, expected "
            "TRT-<version>-<Algorithm>): write the table in the trt-cache format"
        )
    algorithm = "-".join(parts[2:])
    if algorithm not in CACHE_ALGORITHM_BASES:
        known = ", ".join(CACHE_ALGORITHM_BASES)
        raise QuantbenchError(f"calibration cache algorithm {algorithm!r} unknown (known: {known})")
    return CACHE_ALGORITHM_BASES[algorithm]


class CalibrationFeed:
    """Serves calibration batches to TensorRT as device pointers and records the first failure."""

    def __init__(
        self,
        batches: Iterable[Batch] | None,
        cache_bytes: bytes | None = None,
        cache_path: str | os.PathLike[str] | None = None,
        input_order: Sequence[str] | None = None,
        allocator: DeviceAllocator | Callable[[], DeviceAllocator] | None = None,
    ) -> None:
        self._batches: Iterator[Batch] | None = iter(batches) if batches is not None else None
        self._cache_bytes = bytes(cache_bytes) if cache_bytes is not None else None
        self._cache_path = check_output_path(cache_path) if cache_path is not None else None
        self._input_order = tuple(input_order) if input_order is not None else None
        self._allocator_source = allocator
        self._allocator: DeviceAllocator | None = None
        self._buffers: dict[str, DeviceBuffer] = {}
        self._metadata: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self.error: str | None = None
        self.batches_served = 0
        self.exhausted = False
        self.cache_reads = 0
        self.written_cache: bytes | None = None

    # -- set by the builder -------------------------------------------------------------------
    def set_input_metadata(self, metadata: InputMetadata) -> None:
        """Expected dtype and (OPT) shape per input, from the network: wrong batches then fail
        with a named error instead of TensorRT reading past a too-small buffer."""
        self._metadata = {
            name: (np.dtype(dt), tuple(shape)) for name, (dt, shape) in metadata.items()
        }

    # -- TensorRT calls -----------------------------------------------------------------------
    def get_batch(self, names: Sequence[str]) -> list[int] | None:
        if self.error is not None or self.exhausted:
            return None
        try:
            return self._next_pointers(list(names))
        except Exception as exc:  # noqa: BLE001 - TensorRT would swallow it; we record it.
            self._fail(f"batch {self.batches_served + 1}: {type(exc).__name__}: {exc}")
            return None

    def read_calibration_cache(self) -> bytes | None:
        self.cache_reads += 1
        return self._cache_bytes

    def write_calibration_cache(self, cache: Any) -> None:
        try:
            data = bytes(cache)
            self.written_cache = data
            if self._cache_path is not None:
                write_bytes_atomic(self._cache_path, data)
        except Exception as exc:  # noqa: BLE001 - swallowed by TensorRT otherwise.
            self._fail(f"writing the calibration cache: {type(exc).__name__}: {exc}")

    # -- internals ----------------------------------------------------------------------------
    def _next_pointers(self, names: list[str]) -> list[int] | None:
        if self._batches is None:
            self._fail(self._no_data_message())
            return None
        batch = next(self._batches, _END)
        if batch is _END:
            self.exhausted = True
            if self.batches_served == 0:
                self._fail("the calibration data produced no batches")
            self.release()
            return None
        arrays = self._named(batch)
        missing = [name for name in names if name not in arrays]
        if missing:
            raise KeyError(f"no data for input(s) {missing}; the batch has {sorted(arrays)}")
        pointers = [self._upload(name, arrays[name]) for name in names]
        self.batches_served += 1
        return pointers

    def _no_data_message(self) -> str:
        if self._cache_bytes is None:
            return "TensorRT asked for calibration data, but neither data nor a cache was given"
        header = cache_header(self._cache_bytes)
        return (
            f"TensorRT did not accept the calibration cache (header {header!r})"
            " and asked for calibration data; write the table for this TensorRT version and "
            "calibrator algorithm, or pass calibration data"
        )

    def _named(self, batch: Batch) -> Mapping[str, np.ndarray]:
        if isinstance(batch, Mapping):
            return batch
        if self._input_order is None:
            raise TypeError("a batch given as a sequence needs input_order (the input names)")
        if len(batch) != len(self._input_order):
            raise ValueError(f"batch has {len(batch)} arrays for inputs {list(self._input_order)}")
        return dict(zip(self._input_order, batch, strict=True))

    def _upload(self, name: str, value: np.ndarray) -> int:
        host = self._prepare(name, np.asarray(value))
        if name not in self._buffers:
            self._buffers[name] = DeviceBuffer(self._get_allocator())
        return self._buffers[name].upload(host)

    def _prepare(self, name: str, host: np.ndarray) -> np.ndarray:
        """Float inputs become float32 (TensorRT calibrates in FP32); integer/bool are kept."""
        if host.dtype.kind == "f":
            host = host.astype(np.float32, copy=False)
        elif host.dtype.kind not in "biu":
            raise TypeError(f"input {name!r}: dtype {host.dtype} cannot be fed to TensorRT")
        expected = self._metadata.get(name)
        if expected is not None:
            dtype, shape = expected
            if dtype.kind != "f" and host.dtype != dtype:
                raise TypeError(f"input {name!r}: dtype {host.dtype}, the network expects {dtype}")
            if tuple(host.shape) != shape:
                raise ValueError(
                    f"input {name!r}: shape {tuple(host.shape)}, TensorRT calibrates at {shape}"
                )
        return np.ascontiguousarray(host)

    def _get_allocator(self) -> DeviceAllocator:
        if self._allocator is None:
            source = self._allocator_source
            if source is None:
                self._allocator = default_allocator()
            elif hasattr(source, "malloc") and not isinstance(source, type):
                self._allocator = source  # type: ignore[assignment]
            else:
                self._allocator = source()  # type: ignore[operator]
        return self._allocator

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        self.release()

    def release(self) -> None:
        """Free every device buffer (TensorRT is done with them once it got None)."""
        for buffer in self._buffers.values():
            buffer.free()
        self._buffers.clear()


def make_calibrator(
    trt_module: ModuleType,
    base: CalibratorBase = "entropy2",
    batches: Iterable[Batch] | None = None,
    cache_bytes: bytes | None = None,
    cache_path: str | os.PathLike[str] | None = None,
    input_order: Sequence[str] | None = None,
    *,
    allocator: DeviceAllocator | Callable[[], DeviceAllocator] | None = None,
    quantile: float = 0.5,
    regression_cutoff: float = 0.5,
) -> Any:
    """An instance of a class deriving from ``trt.<BASE_CLASS_NAMES[base]>`` that feeds ``batches``.

    ``cache_bytes`` (a TensorRT cache, e.g. from quantbench's trt-cache codec) is returned verbatim
    by ``read_calibration_cache``; TensorRT then skips calibration when it accepts it.
    ``cache_path`` receives the cache TensorRT writes (atomically). ``batches`` yields dicts
    name -> array, or sequences in ``input_order``.
    """
    if base not in BASE_CLASS_NAMES:
        raise QuantbenchError(
            f"unknown calibrator {base!r}; choose one of {sorted(BASE_CLASS_NAMES)}"
        )
    features = features_of(trt_module)
    features.require("calibrator_classes", features.calibrator_classes)
    base_class = getattr(trt_module, BASE_CLASS_NAMES[base], None)
    if base_class is None:
        raise QuantbenchError(features.explain_missing("calibrator_classes"))
    feed = CalibrationFeed(batches, cache_bytes, cache_path, input_order, allocator)
    calibrator_class = _calibrator_class(base_class, base == "legacy", quantile, regression_cutoff)
    return calibrator_class(feed)


def _calibrator_class(
    base_class: type, legacy: bool, quantile: float, regression_cutoff: float
) -> type:
    """Define the TensorRT subclass for ``base_class`` (Polygraphy's factory pattern)."""

    class QuantbenchCalibrator(base_class):  # type: ignore[misc, valid-type]
        """Forwards TensorRT's calibrator calls to a :class:`CalibrationFeed`."""

        def __init__(self, feed: CalibrationFeed) -> None:
            base_class.__init__(self)  # required by the pybind trampoline, else it crashes
            self.feed = feed

        @property
        def error(self) -> str | None:
            return self.feed.error

        @property
        def batches_served(self) -> int:
            return self.feed.batches_served

        def set_input_metadata(self, metadata: InputMetadata) -> None:
            self.feed.set_input_metadata(metadata)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            return self.feed.get_batch(names)

        def read_calibration_cache(self) -> bytes | None:
            return self.feed.read_calibration_cache()

        def write_calibration_cache(self, cache: Any) -> None:
            self.feed.write_calibration_cache(cache)

        def release(self) -> None:
            self.feed.release()

        if legacy:

            def get_quantile(self) -> float:
                return quantile

            def get_regression_cutoff(self) -> float:
                return regression_cutoff

            def read_histogram_cache(self, length: int) -> None:
                return None

            def write_histogram_cache(self, data: Any, length: int) -> None:
                return None

    QuantbenchCalibrator.__name__ = f"Quantbench{base_class.__name__}"
    QuantbenchCalibrator.__qualname__ = QuantbenchCalibrator.__name__
    return QuantbenchCalibrator


def raise_for_calibration(calibrator: Any) -> None:
    """After a build: turn a recorded calibration failure into a QuantbenchError."""
    error = getattr(calibrator, "error", None)
    if error:
        served = getattr(calibrator, "batches_served", None)
        after = f" (after {served} good batch(es))" if served else ""
        raise QuantbenchError(f"INT8 calibration failed{after}: {error}")
