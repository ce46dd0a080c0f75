"""Run a serialized TensorRT engine on NumPy inputs.

Same small interface as quantbench's onnxruntime runner (``input_metadata``, ``infer``,
``close``), so compare code does not care which backend it holds. Uses the name-based I/O API
(``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``), present from TensorRT 8.5
through 11.x, with one device buffer per input and per output, reused across calls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import ModuleType

import numpy as np

from quantbench.backends.trt.device import DeviceAllocator, DeviceBuffer, default_allocator
from quantbench.backends.trt.log import last_error, make_logger
from quantbench.backends.trt.version import import_tensorrt
from quantbench.errors import QuantbenchError


class TensorRTRunner:
    """Deserializes an engine once; ``infer`` copies inputs in, executes, copies outputs out."""

    def __init__(
        self,
        engine_bytes: bytes,
        *,
        trt_module: ModuleType | None = None,
        allocator: DeviceAllocator | None = None,
    ) -> None:
        self._trt = trt_module if trt_module is not None else import_tensorrt()
        self._logger = make_logger(self._trt)
        self._runtime = self._trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(bytes(engine_bytes))
        if self._engine is None:
            detail = last_error(
                self._logger, "built by another TensorRT version or for another GPU?"
            )
            raise QuantbenchError(f"TensorRT could not load the engine: {detail}")
        self._context = self._engine.create_execution_context()
        self._allocator = allocator if allocator is not None else default_allocator()
        self._stream = self._allocator.create_stream()
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        for index in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(index)
            mode = self._engine.get_tensor_mode(name)
            (self._inputs if mode == self._trt.TensorIOMode.INPUT else self._outputs).append(name)
        self._buffers = {
            name: DeviceBuffer(self._allocator) for name in self._inputs + self._outputs
        }
        self._closed = False

    # -- interface shared with the onnxruntime runner ------------------------------------------
    def input_metadata(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Input name -> (dtype, shape); dynamic dimensions are -1."""
        return {name: (self._dtype(name), self._engine_shape(name)) for name in self._inputs}

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._bind(feeds)
        self._execute()
        return {name: self._fetch(name) for name in self._outputs}

    def close(self) -> None:
        if self._closed:
            return
        for buffer in self._buffers.values():
            buffer.free()
        self._allocator.destroy_stream(self._stream)
        self._context = None
        self._engine = None
        self._closed = True

    def __enter__(self) -> TensorRTRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- latency ----------------------------------------------------------------------------
    def time_inference(
        self, feeds: Mapping[str, np.ndarray], *, iterations: int = 100, warmup: int = 10
    ) -> list[float]:
        """Milliseconds per ``execute_async_v3`` + stream sync, inputs already on the device.

        Host wall-clock around an enqueue and its synchronize: it includes launch overhead, the
        same quantity trtexec reports as "Latency" with data transfers disabled.
        """
        self._bind(feeds)
        for _ in range(warmup):
            self._execute()
        timings = []
        for _ in range(iterations):
            start = time.perf_counter()
            self._execute()
            timings.append((time.perf_counter() - start) * 1e3)
        return timings

    # -- internals --------------------------------------------------------------------------
    def _dtype(self, name: str) -> np.dtype:
        trt_dtype = self._engine.get_tensor_dtype(name)
        try:
            return np.dtype(self._trt.nptype(trt_dtype))
        except TypeError as exc:
            raise QuantbenchError(
                f"tensor {name!r}: TensorRT type {trt_dtype} has no NumPy type"
            ) from exc

    def _engine_shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._engine.get_tensor_shape(name))

    def _bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        if self._closed:
            raise QuantbenchError("the TensorRT runner is closed")
        missing = [name for name in self._inputs if name not in feeds]
        extra = sorted(set(feeds) - set(self._inputs))
        if missing or extra:
            raise QuantbenchError(
                f"engine inputs are {self._inputs}; missing {missing}, unknown {extra}"
            )
        for name in self._inputs:
            host = self._host_input(name, feeds[name])
            if not self._context.set_input_shape(name, host.shape):
                raise QuantbenchError(
                    f"input {name!r}: shape {host.shape} is outside the engine's profile"
                )
            self._context.set_tensor_address(name, self._buffers[name].upload(host))
        for name in self._outputs:
            shape = tuple(int(d) for d in self._context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise QuantbenchError(
                    f"output {name!r}: data-dependent shape {shape} is not supported"
                )
            nbytes = int(np.prod(shape, dtype=np.int64)) * self._dtype(name).itemsize
            self._context.set_tensor_address(name, self._buffers[name].reserve(nbytes))

    def _host_input(self, name: str, value: np.ndarray) -> np.ndarray:
        expected_dtype = self._dtype(name)
        host = np.asarray(value)
        if host.dtype != expected_dtype:
            if not (host.dtype.kind == expected_dtype.kind == "f"):
                raise QuantbenchError(
                    f"input {name!r}: dtype {host.dtype}, engine expects {expected_dtype}"
                )
            host = host.astype(expected_dtype)
        engine_shape = self._engine_shape(name)
        if len(host.shape) != len(engine_shape) or any(
            e >= 0 and e != d for e, d in zip(engine_shape, host.shape, strict=True)
        ):
            raise QuantbenchError(
                f"input {name!r}: shape {host.shape}, engine expects {engine_shape}"
            )
        return np.ascontiguousarray(host)

    def _execute(self) -> None:
        if not self._context.execute_async_v3(self._stream):
            raise QuantbenchError(
                f"TensorRT execution failed: {last_error(self._logger, 'no detail')}"
            )
        self._allocator.synchronize(self._stream)

    def _fetch(self, name: str) -> np.ndarray:
        shape = tuple(int(d) for d in self._context.get_tensor_shape(name))
        host = np.empty(shape, dtype=self._dtype(name))
        return self._buffers[name].download(host)
