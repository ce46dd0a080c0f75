"""The TensorRT backend's device buffers and the calibrator's ``get_batch`` contract on a real GPU.

TensorRT itself is absent: the calibrator base classes come from tests/trt_double.py (which only
drives the documented call sequence), but every pointer is real CUDA memory from cuda-python
(``CudartAllocator``), and what lies behind each pointer is read back through CuPy -- a second,
independent CUDA binding -- the moment ``get_batch`` returns, as TensorRT's builder would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trt_double import drive_calibration, make_fake_tensorrt  # noqa: E402


def _reason() -> str | None:
    try:
        from quantbench.backends.trt.device import _import_cudart

        rt = _import_cudart()
        err, count = rt.cudaGetDeviceCount()
        if err != rt.cudaError_t.cudaSuccess or count < 1:
            return "no CUDA device"
        import cupy  # noqa: F401  (the independent read-back)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _read(ptr: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """What lies at device address ``ptr``, read through CuPy (not through the allocator)."""
    import cupy as cp

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    memory = cp.cuda.UnownedMemory(ptr, nbytes, None)
    return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(memory, 0)).get()


class CountingAllocator:
    """The real cuda-python allocator, counting what it does (and ``read`` for the driver)."""

    def __init__(self) -> None:
        from quantbench.backends.trt.device import CudartAllocator

        self.real = CudartAllocator()
        self.live: set[int] = set()
        self.mallocs = 0

    def malloc(self, nbytes: int) -> int:
        ptr = self.real.malloc(nbytes)
        self.mallocs += 1
        self.live.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.live.remove(ptr)  # KeyError on a double free
        self.real.free(ptr)

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None:
        self.real.memcpy_htod(dst, src)

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None:
        self.real.memcpy_dtoh(dst, src)

    def create_stream(self) -> int:
        return self.real.create_stream()

    def synchronize(self, stream: int) -> None:
        self.real.synchronize(stream)

    def destroy_stream(self, stream: int) -> None:
        self.real.destroy_stream(stream)

    def read(self, ptr: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return _read(ptr, dtype, shape)


def _is_device_pointer(ptr: int) -> bool:
    from quantbench.backends.trt.device import _import_cudart

    rt = _import_cudart()
    err, attributes = rt.cudaPointerGetAttributes(ptr)
    return (
        err == rt.cudaError_t.cudaSuccess
        and attributes.type == rt.cudaMemoryType.cudaMemoryTypeDevice
    )


def test_cudart_allocator_round_trip_and_stream():
    from quantbench.backends.trt.device import CudartAllocator, DeviceBuffer

    allocator = CudartAllocator()
    host = np.arange(1 << 20, dtype=np.float32).reshape(256, 4096)
    buffer = DeviceBuffer(allocator)
    ptr = buffer.upload(host)
    assert _is_device_pointer(ptr)
    np.testing.assert_array_equal(_read(ptr, np.float32, host.shape), host)  # via CuPy
    back = buffer.download(np.empty_like(host))  # via cuda-python
    np.testing.assert_array_equal(back, host)
    assert buffer.upload(host[:10]) == ptr  # smaller: the same allocation, refilled
    stream = allocator.create_stream()
    allocator.synchronize(stream)
    allocator.destroy_stream(stream)
    buffer.free()
    assert buffer.ptr == 0 and buffer.capacity == 0


def test_get_batch_contract_on_real_device_memory():
    """Pointers in ``names`` order, exactly len(names), valid and holding the batch until the
    next call, float inputs as float32, int kept; buffers reused, grown, and freed at the end."""
    from quantbench.backends.trt.calibrator import make_calibrator, raise_for_calibration

    rng = np.random.default_rng(5)
    shapes = [(2, 3, 8, 8), (2, 3, 8, 8), (4, 3, 8, 8), (2, 3, 8, 8)]
    batches = [
        {"ids": rng.integers(0, 1000, (s[0], 7)), "image": rng.standard_normal(s)} for s in shapes
    ]
    allocator = CountingAllocator()
    trt = make_fake_tensorrt("10.16.0")
    calibrator = make_calibrator(trt, "entropy2", iter(batches), allocator=allocator)
    assert type(calibrator).__mro__[1] is trt.IInt8EntropyCalibrator2
    pointers, contents = [], []
    for batch in batches:
        got = calibrator.get_batch(["image", "ids"])
        assert len(got) == 2 and all(_is_device_pointer(p) for p in got)
        pointers.append(got)
        n = batch["image"].shape[0]
        image = _read(got[0], np.float32, (n, 3, 8, 8))
        ids = _read(got[1], np.int64, (n, 7))
        np.testing.assert_array_equal(image, batch["image"].astype(np.float32))
        np.testing.assert_array_equal(ids, batch["ids"])
        contents.append(image)
    assert pointers[1] == pointers[0]  # same size: the buffers are refilled, not reallocated
    assert allocator.mallocs == 4  # 2 inputs, then both grew once for the batch of 4
    assert calibrator.get_batch(["image", "ids"]) is None  # exhausted
    assert not allocator.live  # every device buffer freed
    raise_for_calibration(calibrator)
    assert calibrator.batches_served == 4


def test_driven_like_tensorrt_with_real_buffers():
    """The documented call sequence (tests/trt_double.drive_calibration) on real memory."""
    from quantbench.backends.trt.calibrator import make_calibrator

    rng = np.random.default_rng(9)
    batches = [{"x": rng.standard_normal((1, 16)).astype(np.float64)} for _ in range(5)]
    allocator = CountingAllocator()
    calibrator = make_calibrator(
        make_fake_tensorrt("8.6.1"), "minmax", batches, allocator=allocator
    )
    seen = drive_calibration(calibrator, ["x"], allocator, {"x": ((1, 16), np.float32)})
    assert seen["batch_size"] == 1 and seen["cache"] is None and not seen["swallowed"]
    assert len(seen["data"]) == 5
    for batch, data in zip(batches, seen["data"], strict=True):
        np.testing.assert_array_equal(data["x"], batch["x"].astype(np.float32))
    assert calibrator.feed.written_cache.startswith(b"TRT-")
    assert not allocator.live


def test_a_wrong_batch_fails_the_build_instead_of_ending_calibration():
    from quantbench.backends.trt.calibrator import make_calibrator, raise_for_calibration
    from quantbench.errors import QuantbenchError

    allocator = CountingAllocator()
    batches = [{"x": np.zeros((1, 4), np.float32)}, {"x": np.zeros((1, 5), np.float32)}]
    calibrator = make_calibrator(
        make_fake_tensorrt("10.16.0"), batches=batches, allocator=allocator
    )
    calibrator.set_input_metadata({"x": (np.float32, (1, 4))})
    assert calibrator.get_batch(["x"]) is not None
    assert calibrator.get_batch(["x"]) is None  # TensorRT sees "done"...
    assert not allocator.live
    with pytest.raises(QuantbenchError, match="shape"):  # ...but the build fails, named
        raise_for_calibration(calibrator)
