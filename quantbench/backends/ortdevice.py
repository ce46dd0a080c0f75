"""onnxruntime on CUDA with outputs that stay on the GPU (IOBinding), as CuPy arrays.

``session.run`` copies every output to the host. Calibration exposes dozens of activations per
batch, so on a GPU that copy (and then binning on the host) costs many times the inference.
:class:`DeviceOutputRunner` binds each wanted output to CUDA memory that onnxruntime allocates
from its arena, runs, and wraps each result as a CuPy array over the same memory (no copy); the
OrtValue stays referenced by the CuPy array, so the memory goes back to the arena when the
caller drops the array.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, RunnerInfo
from quantbench.errors import QuantbenchError, first_line
from quantbench.model import customops

CUDA_PROVIDER = "CUDAExecutionProvider"

#: onnxruntime element types CuPy can hold (bfloat16 and the 8-bit floats it cannot).
_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


class DeviceOutputRunner:
    """An onnxruntime CUDA session whose ``infer`` returns CuPy arrays on the GPU."""

    def __init__(
        self,
        model: onnx.ModelProto | bytes | OnnxRuntimeRunner,
        cupy: ModuleType,
        provider: str | None = "cuda",
        generated_from: onnx.ModelProto | None = None,
        threads: int | None = None,
        optimization: str = "all",
    ):
        """``model``: a model, or a session already started over it (elsewhere, e.g. on a
        thread beside other start-up work); the other options are for a model."""
        self.runner = (
            model
            if isinstance(model, OnnxRuntimeRunner)
            else OnnxRuntimeRunner(
                model, provider, threads, optimization, spin=False, generated_from=generated_from
            )
        )
        if self.runner.provider != CUDA_PROVIDER:
            raise QuantbenchError(
                f"outputs on the GPU need the CUDA provider, not {self.runner.provider}"
            )
        self.cupy = cupy
        self.device_id = int(cupy.cuda.runtime.getDevice())

    @property
    def info(self) -> RunnerInfo:
        return self.runner.info

    def infer(self, feeds: Mapping[str, Any], outputs: list[str]) -> dict[str, Any]:
        """Run one batch; ``outputs`` come back as CuPy arrays that own their OrtValues.

        A feed may be a CuPy array already on this GPU (its writes complete): onnxruntime
        reads it where it lies, so an input that is also calibrated crosses the bus once."""
        session = self.runner.session
        binding = session.io_binding()
        for name, value in self.runner.typed_feeds(feeds).items():
            if isinstance(value, self.cupy.ndarray):
                self._bind_device_input(binding, name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in outputs:
            binding.bind_output(name, "cuda", self.device_id)
        try:
            with customops.collecting():
                session.run_with_iobinding(binding)
        except Exception as exc:  # noqa: BLE001 - ORT reports every failure the same way
            customops.raise_run_errors()  # a plugin op's own error explains onnxruntime's
            raise QuantbenchError(f"onnxruntime inference failed: {first_line(exc)}") from None
        customops.raise_run_errors()  # a plugin op cannot raise inside onnxruntime
        binding.synchronize_outputs()  # onnxruntime's stream is done before CuPy reads
        values = binding.get_outputs()
        return {name: self._wrap(name, value) for name, value in zip(outputs, values)}

    def _bind_device_input(self, binding: Any, name: str, value: Any) -> None:
        value = self.cupy.ascontiguousarray(value)
        binding.bind_input(
            name, "cuda", self.device_id, value.dtype, list(value.shape), value.data.ptr
        )

    def _wrap(self, name: str, value: Any) -> Any:
        """A CuPy view of an OrtValue's CUDA memory (kept alive by the view)."""
        cp = self.cupy
        kind = value.data_type()
        dtype = _DTYPES.get(kind)
        if dtype is None:
            raise QuantbenchError(
                f"tensor {name}: element type {kind} cannot be binned on the GPU; "
                "set QUANTBENCH_DEVICE_BINNING=0 to bin it on the host"
            )
        shape = tuple(value.shape())
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes == 0:
            return cp.empty(shape, dtype=dtype)
        memory = cp.cuda.UnownedMemory(value.data_ptr(), nbytes, value, self.device_id)
        return cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(memory, 0))

    def close(self) -> None:
        self.runner.close()
