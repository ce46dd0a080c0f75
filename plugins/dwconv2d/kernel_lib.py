"""Build the DWConv2D CUDA kernels with nvcc and call their C entry points through ctypes.

Why: the TensorRT plugin is a thin shell around these entry points, so the GPU tests (and any
Python user with a GPU but no TensorRT) exercise exactly the code the plugin runs. This module
imports only the standard library and :mod:`quantbench.errors`, so it also loads on a machine where
quantbench is not installed (the tests load it by file path there).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantbench.errors import QuantbenchError

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
KERNEL_SOURCE = KERNEL_DIR / "dwconv2d.cu"
KERNEL_HEADER = KERNEL_DIR / "dwconv2d.h"
LIBRARY_NAME = "libdwconv2d_kernels.so"

# Hopper machine code plus compute_90 PTX, which newer GPUs compile at load time. Keep in step
# with GENCODE in plugins/dwconv2d/Makefile.
DEFAULT_GENCODE: tuple[str, ...] = (
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
)

ABI_VERSION = 1
EXPORTED_SYMBOLS: tuple[str, ...] = (
    "dwconv2d_abi_version",
    "dwconv2d_params_size",
    "dwconv2d_infer_output_shape",
    "dwconv2d_validate",
    "dwconv2d_kernel_path",
    "dwconv2d_forward_path",
    "dwconv2d_last_path",
    "dwconv2d_set_cudnn_mode",
    "dwconv2d_set_mma_mode",
    "dwconv2d_cudnn_version",
    "dwconv2d_forward_f32",
    "dwconv2d_forward_f16",
    "dwconv2d_forward_int8",
)

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1

WEIGHT_SHARED = 0
WEIGHT_PER_BATCH = 1
BIAS_NONE = 0
BIAS_SHARED = 1
BIAS_PER_BATCH = 2

KERNEL_PATHS = {
    -1: "invalid",
    0: "depthwise_tiled",
    1: "direct",
    2: "implicit_gemm",
    3: "depthwise_rows",
    4: "cudnn",
    5: "depthwise_mma",
    6: "gemm_mma",
    7: "depthwise_global",
}
DTYPES = {"f32": 0, "f16": 1, "int8": 2}  # DWCONV2D_DTYPE_*
CUDNN_OFF = 0  # DWCONV2D_CUDNN_OFF: our kernels only
CUDNN_AUTO = 1  # DWCONV2D_CUDNN_AUTO: the dispatch table (cuDNN for grouped/dense f32/f16)
MMA_OFF = 0  # dwconv2d_set_mma_mode: none of our tensor-core kernels (CUDA cores only)
MMA_ON = 1  # depthwise FP16/INT8 on depthwise_mma where the plane fits; INT8 grouped on gemm_mma
MMA_AUTO = 2  # default: depthwise_mma by the per-shape table (FP16 7x7 s1); INT8 grouped gemm_mma


class DWConv2DParams(ctypes.Structure):
    """Mirror of ``DWConv2DParams`` in kernels/dwconv2d.h (checked against the library's size)."""

    _fields_ = [
        ("batch", ctypes.c_int32),
        ("in_channels", ctypes.c_int32),
        ("in_h", ctypes.c_int32),
        ("in_w", ctypes.c_int32),
        ("out_channels", ctypes.c_int32),
        ("kernel_h", ctypes.c_int32),
        ("kernel_w", ctypes.c_int32),
        ("stride_h", ctypes.c_int32),
        ("stride_w", ctypes.c_int32),
        ("pad_top", ctypes.c_int32),
        ("pad_left", ctypes.c_int32),
        ("pad_bottom", ctypes.c_int32),
        ("pad_right", ctypes.c_int32),
        ("dilation_h", ctypes.c_int32),
        ("dilation_w", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("weight_mode", ctypes.c_int32),
        ("bias_mode", ctypes.c_int32),
        ("out_h", ctypes.c_int32),
        ("out_w", ctypes.c_int32),
        ("input_scale", ctypes.c_float),
        ("weight_scale", ctypes.c_float),
        ("output_scale", ctypes.c_float),
    ]


def conv_output_extent(
    size: int, pad_begin: int, pad_end: int, kernel: int, stride: int, dilation: int
) -> int:
    """ONNX Conv output extent: floor((in + pads - dilation*(kernel-1) - 1) / stride) + 1.

    A stride below 1 gives 0 (the library rejects such parameters anyway).
    """
    if stride < 1:
        return 0
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True)
class ConvSpec:
    """One DWConv2D problem: shapes and ONNX attributes (pads as top, left, bottom, right)."""

    batch: int
    in_channels: int
    in_h: int
    in_w: int
    out_channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    group: int = 1
    weight_per_batch: bool = False
    bias_mode: int = BIAS_NONE

    @property
    def out_hw(self) -> tuple[int, int]:
        return (
            conv_output_extent(
                self.in_h,
                self.pads[0],
                self.pads[2],
                self.kernel[0],
                self.strides[0],
                self.dilations[0],
            ),
            conv_output_extent(
                self.in_w,
                self.pads[1],
                self.pads[3],
                self.kernel[1],
                self.strides[1],
                self.dilations[1],
            ),
        )

    @property
    def weight_shape(self) -> tuple[int, ...]:
        per_item = (self.out_channels, self.in_channels // self.group, *self.kernel)
        return (self.batch, *per_item) if self.weight_per_batch else per_item

    @property
    def bias_shape(self) -> tuple[int, ...] | None:
        if self.bias_mode == BIAS_SHARED:
            return (self.out_channels,)
        if self.bias_mode == BIAS_PER_BATCH:
            return (self.batch, self.out_channels)
        return None

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_channels, self.in_h, self.in_w)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.out_channels, *self.out_hw)

    def to_params(
        self, input_scale: float = -1.0, weight_scale: float = -1.0, output_scale: float = -1.0
    ) -> DWConv2DParams:
        """Parameters for the C entry points, out_h/out_w from the ONNX formula."""
        out_h, out_w = self.out_hw
        return DWConv2DParams(
            batch=self.batch,
            in_channels=self.in_channels,
            in_h=self.in_h,
            in_w=self.in_w,
            out_channels=self.out_channels,
            kernel_h=self.kernel[0],
            kernel_w=self.kernel[1],
            stride_h=self.strides[0],
            stride_w=self.strides[1],
            pad_top=self.pads[0],
            pad_left=self.pads[1],
            pad_bottom=self.pads[2],
            pad_right=self.pads[3],
            dilation_h=self.dilations[0],
            dilation_w=self.dilations[1],
            group=self.group,
            weight_mode=WEIGHT_PER_BATCH if self.weight_per_batch else WEIGHT_SHARED,
            bias_mode=self.bias_mode,
            out_h=out_h,
            out_w=out_w,
            input_scale=input_scale,
            weight_scale=weight_scale,
            output_scale=output_scale,
        )


def find_nvcc() -> str | None:
    """nvcc from $NVCC, the PATH, or the usual CUDA install folder; None when there is none."""
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_command(
    output: Path, gencode: Sequence[str] = DEFAULT_GENCODE, nvcc: str = "nvcc"
) -> list[str]:
    """The one nvcc line that builds the shared library (the Makefile uses the same flags)."""
    return [
        nvcc,
        "-O3",
        "-std=c++17",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Xcompiler",
        "-fvisibility=hidden",
        *gencode,
        str(KERNEL_SOURCE),
        "-o",
        str(output),
    ]


def build_kernels(
    out_dir: Path,
    gencode: Sequence[str] = DEFAULT_GENCODE,
    nvcc: str | None = None,
    timeout_s: float = 600.0,
) -> Path:
    """Compile kernels/dwconv2d.cu into ``out_dir/libdwconv2d_kernels.so`` and return its path."""
    compiler = nvcc or find_nvcc()
    if compiler is None:
        raise QuantbenchError(
            "nvcc not found: install the CUDA toolkit or set NVCC=/path/to/nvcc to build DWConv2D"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / LIBRARY_NAME
    command = nvcc_command(output, gencode, compiler)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-20:]
        raise QuantbenchError(
            f"{KERNEL_SOURCE}: nvcc failed (exit {result.returncode}): " + " | ".join(tail)
        )
    return output


def _pointer(value: int | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(value or None)


class KernelLibrary:
    """ctypes view of libdwconv2d_kernels.so; device pointers and streams are plain ints."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise QuantbenchError(f"{self.path}: cannot load the DWConv2D kernels: {exc}") from exc
        self._declare()
        abi = self._lib.dwconv2d_abi_version()
        size = self._lib.dwconv2d_params_size()
        if abi != ABI_VERSION or size != ctypes.sizeof(DWConv2DParams):
            raise QuantbenchError(
                f"{self.path}: ABI {abi} with a {size}-byte DWConv2DParams, expected ABI "
                f"{ABI_VERSION} with {ctypes.sizeof(DWConv2DParams)} bytes; rebuild the library"
            )

    def _declare(self) -> None:
        lib = self._lib
        params_p = ctypes.POINTER(DWConv2DParams)
        void_p = ctypes.c_void_p
        lib.dwconv2d_abi_version.restype = ctypes.c_int
        lib.dwconv2d_abi_version.argtypes = []
        lib.dwconv2d_params_size.restype = ctypes.c_size_t
        lib.dwconv2d_params_size.argtypes = []
        for name in ("dwconv2d_infer_output_shape", "dwconv2d_validate", "dwconv2d_kernel_path"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = [params_p]
        # The dispatch entry points (absent from builds before the cuDNN path; such a build
        # still loads, for comparisons, and these methods then raise).
        self.has_dispatch = hasattr(lib, "dwconv2d_last_path")
        if self.has_dispatch:
            lib.dwconv2d_forward_path.restype = ctypes.c_int
            lib.dwconv2d_forward_path.argtypes = [params_p, ctypes.c_int]
            for name in ("dwconv2d_last_path", "dwconv2d_cudnn_version"):
                getattr(lib, name).restype = ctypes.c_int
                getattr(lib, name).argtypes = []
            lib.dwconv2d_set_cudnn_mode.restype = ctypes.c_int
            lib.dwconv2d_set_cudnn_mode.argtypes = [ctypes.c_int]
        self.has_mma = hasattr(lib, "dwconv2d_set_mma_mode")  # absent before depthwise_mma
        if self.has_mma:
            lib.dwconv2d_set_mma_mode.restype = ctypes.c_int
            lib.dwconv2d_set_mma_mode.argtypes = [ctypes.c_int]
        for name in ("dwconv2d_forward_f32", "dwconv2d_forward_f16", "dwconv2d_forward_int8"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = [void_p, void_p, void_p, void_p, params_p, void_p]

    def infer_output_shape(self, params: DWConv2DParams) -> tuple[int, int]:
        """(out_h, out_w) the library computes; QuantbenchError when the parameters are invalid."""
        work = DWConv2DParams.from_buffer_copy(params)
        code = self._lib.dwconv2d_infer_output_shape(ctypes.byref(work))
        if code != CUDA_SUCCESS:
            raise QuantbenchError(f"DWConv2D: invalid parameters {params_repr(params)}")
        return work.out_h, work.out_w

    def validate(self, params: DWConv2DParams) -> int:
        return self._lib.dwconv2d_validate(ctypes.byref(params))

    def kernel_path(self, params: DWConv2DParams) -> str:
        """Which of our kernels serves ``params`` when cuDNN is not used."""
        return KERNEL_PATHS[self._lib.dwconv2d_kernel_path(ctypes.byref(params))]

    def forward_path(self, params: DWConv2DParams, dtype: str) -> str:
        """The path a ``dtype`` forward takes now: 'cudnn' where the dispatch table picks it."""
        return KERNEL_PATHS[self._lib.dwconv2d_forward_path(ctypes.byref(params), DTYPES[dtype])]

    def last_path(self) -> str:
        """The path the calling thread's last forward took ('invalid' before any)."""
        return KERNEL_PATHS[self._lib.dwconv2d_last_path()]

    def set_cudnn_mode(self, mode: int) -> int:
        """CUDNN_OFF or CUDNN_AUTO for the process; returns the previous mode."""
        return int(self._lib.dwconv2d_set_cudnn_mode(mode))

    def set_mma_mode(self, mode: int) -> int:
        """MMA_OFF, MMA_ON or MMA_AUTO (depthwise_mma, gemm_mma) for the process; returns the
        previous mode (a build without depthwise_mma answers MMA_OFF and ignores the call)."""
        if not self.has_mma:
            return MMA_OFF
        return int(self._lib.dwconv2d_set_mma_mode(mode))

    def cudnn_version(self) -> int:
        """cudnnGetVersion() of the cuDNN the library loaded, 0 when none loads."""
        return int(self._lib.dwconv2d_cudnn_version())

    def forward(
        self,
        dtype: str,
        x: int,
        w: int,
        b: int | None,
        y: int,
        params: DWConv2DParams,
        stream: int = 0,
    ) -> int:
        """Launch the ``dtype`` ('f32', 'f16', 'int8') forward; returns its cudaError_t code."""
        function = {
            "f32": self._lib.dwconv2d_forward_f32,
            "f16": self._lib.dwconv2d_forward_f16,
            "int8": self._lib.dwconv2d_forward_int8,
        }[dtype]
        return function(
            _pointer(x),
            _pointer(w),
            _pointer(b),
            _pointer(y),
            ctypes.byref(params),
            _pointer(stream),
        )


def params_repr(params: DWConv2DParams) -> str:
    """The fields as name=value, for error messages and reports."""
    return ", ".join(f"{name}={getattr(params, name)}" for name, _ in params._fields_)
