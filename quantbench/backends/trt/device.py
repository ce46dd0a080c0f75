"""GPU memory for the calibrator and the runner, behind a six-method protocol.

TensorRT only ever sees integer device pointers, so quantbench needs very little CUDA: allocate,
free, copy each way, and one stream. :class:`CudartAllocator` does it with NVIDIA's cuda-python
(``cuda.bindings.runtime``, or the older ``cuda.cudart``); :class:`PycudaAllocator` with pycuda's
driver API on the device's primary context, the context TensorRT itself uses. Both are imported
lazily; tests inject a fake allocator instead.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol

import numpy as np

from quantbench.errors import QuantbenchError

NO_BINDING_HINT = (
    "no CUDA Python binding found: pip install cuda-python (or pycuda) next to TensorRT"
)


class DeviceAllocator(Protocol):
    """What quantbench needs from CUDA. Pointers and stream handles are plain ints."""

    def malloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None: ...

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None: ...

    def create_stream(self) -> int: ...

    def synchronize(self, stream: int) -> None: ...

    def destroy_stream(self, stream: int) -> None: ...


class DeviceBuffer:
    """One reusable device allocation that grows when a larger array arrives.

    The calibrator keeps one per input name, so the pointer handed to TensorRT stays valid until
    the next ``get_batch`` call, and memory is not reallocated for every batch.
    """

    def __init__(self, allocator: DeviceAllocator) -> None:
        self._allocator = allocator
        self.ptr = 0
        self.capacity = 0

    def reserve(self, nbytes: int) -> int:
        """Pointer to at least ``nbytes`` bytes (one byte minimum: TensorRT rejects null)."""
        needed = max(int(nbytes), 1)
        if needed > self.capacity:
            self.free()
            self.ptr = self._allocator.malloc(needed)
            self.capacity = needed
        return self.ptr

    def upload(self, host: np.ndarray) -> int:
        contiguous = np.ascontiguousarray(host)
        ptr = self.reserve(contiguous.nbytes)
        if contiguous.nbytes:
            self._allocator.memcpy_htod(ptr, contiguous)
        return ptr

    def download(self, host: np.ndarray) -> np.ndarray:
        if host.nbytes > self.capacity:
            raise ValueError(f"device buffer holds {self.capacity} bytes, asked for {host.nbytes}")
        if host.nbytes:
            self._allocator.memcpy_dtoh(host, self.ptr)
        return host

    def free(self) -> None:
        if self.ptr:
            self._allocator.free(self.ptr)
        self.ptr = 0
        self.capacity = 0


def _import_cudart() -> ModuleType:
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6 layout

        return runtime
    except ImportError:
        from cuda import cudart  # older cuda-python layout

        return cudart


class CudartAllocator:
    """cuda-python's runtime API (the same one TensorRT's own Python samples use)."""

    def __init__(self, cudart: ModuleType | None = None) -> None:
        self._rt = cudart if cudart is not None else _import_cudart()
        self._streams: dict[int, Any] = {}

    def _check(self, result: tuple[Any, ...], call: str) -> Any:
        err, *values = result
        if err != self._rt.cudaError_t.cudaSuccess:
            name = self._rt.cudaGetErrorName(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
            raise QuantbenchError(f"CUDA error in {call}: {name} (is an NVIDIA GPU visible?)")
        return values[0] if len(values) == 1 else None

    def malloc(self, nbytes: int) -> int:
        return int(self._check(self._rt.cudaMalloc(nbytes), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self._check(self._rt.cudaFree(ptr), "cudaFree")

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self._rt.cudaMemcpy(dst, src.ctypes.data, src.nbytes, kind), "cudaMemcpy")

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self._rt.cudaMemcpy(dst.ctypes.data, src, dst.nbytes, kind), "cudaMemcpy")

    def create_stream(self) -> int:
        stream = self._check(self._rt.cudaStreamCreate(), "cudaStreamCreate")
        handle = int(stream)
        self._streams[handle] = stream
        return handle

    def synchronize(self, stream: int) -> None:
        self._check(self._rt.cudaStreamSynchronize(self._streams.get(stream, stream)), "sync")

    def destroy_stream(self, stream: int) -> None:
        handle = self._streams.pop(stream, stream)
        self._check(self._rt.cudaStreamDestroy(handle), "cudaStreamDestroy")


class PycudaAllocator:
    """pycuda's driver API on device 0's primary context (shared with TensorRT's runtime)."""

    def __init__(self, driver: ModuleType | None = None, device: int = 0) -> None:
        if driver is None:
            import pycuda.driver as driver
        self._drv = driver
        self._drv.init()
        self._context = self._drv.Device(device).retain_primary_context()
        self._context.push()
        self._allocations: dict[int, Any] = {}
        self._streams: dict[int, Any] = {}

    def malloc(self, nbytes: int) -> int:
        allocation = self._drv.mem_alloc(nbytes)
        ptr = int(allocation)
        self._allocations[ptr] = allocation
        return ptr

    def free(self, ptr: int) -> None:
        allocation = self._allocations.pop(ptr, None)
        if allocation is not None:
            allocation.free()

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None:
        self._drv.memcpy_htod(dst, src)

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None:
        self._drv.memcpy_dtoh(dst, src)

    def create_stream(self) -> int:
        stream = self._drv.Stream()
        self._streams[int(stream.handle)] = stream
        return int(stream.handle)

    def synchronize(self, stream: int) -> None:
        self._streams[stream].synchronize()

    def destroy_stream(self, stream: int) -> None:
        self._streams.pop(stream, None)

    def close(self) -> None:
        """Pop the primary context pushed in ``__init__`` (pycuda warns at exit otherwise)."""
        if self._context is not None:
            self._context.pop()
            self._context = None


def default_allocator() -> DeviceAllocator:
    """cuda-python if importable, else pycuda; a QuantbenchError with an install hint if neither."""
    try:
        return CudartAllocator()
    except ImportError:
        pass
    try:
        return PycudaAllocator()
    except ImportError as exc:
        raise QuantbenchError(NO_BINDING_HINT) from exc
