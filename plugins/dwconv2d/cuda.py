"""DWConv2D on the GPU for the onnxruntime op: the plugin's own kernels through CuPy.

Why: the device ``cuda`` of :mod:`.ort_op` runs exactly the code the TensorRT plugin runs (the C
ABI of ``kernels/dwconv2d.h`` through :class:`.kernel_lib.KernelLibrary`), inside an onnxruntime
session, so ``compare`` measures the kernels' FP16 rounding and INT8 requantization in a model.
onnxruntime hands the op host arrays: each call copies them to the GPU (CuPy), launches the
forward on CuPy's current stream and copies the output back.

The kernel library: ``$QUANTBENCH_DWCONV_LIB`` (a prebuilt ``libdwconv2d_kernels.so``, as the GPU
tests take it), else ``plugins/dwconv2d/build/libdwconv2d_kernels.so`` (``make kernels``), else
built once with nvcc (:func:`.kernel_lib.build_kernels`) into
``$XDG_CACHE_HOME/quantbench/dwconv2d-<hash of the sources>/``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from quantbench.errors import QuantbenchError, first_line
from quantbench.plugins.dwconv2d import kernel_lib as kl
from quantbench.plugins.dwconv2d.reference import ConvAttrs, check_shapes
from quantbench.progress import info

LIBRARY_ENV = "QUANTBENCH_DWCONV_LIB"
IN_TREE_LIBRARY = Path(__file__).resolve().parent / "build" / kl.LIBRARY_NAME


def cupy_module() -> ModuleType:
    """CuPy with a visible GPU, else a one-line QuantbenchError saying what is missing."""
    try:
        import cupy
    except ImportError:
        raise QuantbenchError(
            "DWConv2D on cuda needs CuPy (pip install 'quantbench[gpu]', or cupy-cuda12x for "
            "CUDA 12); run it on cpu, or lowered (--dwconv2d-op lower)"
        ) from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - CUDA reports a missing driver as a runtime error
        raise QuantbenchError(f"DWConv2D on cuda: no usable GPU ({first_line(exc)})") from None
    if count < 1:
        raise QuantbenchError("DWConv2D on cuda: no GPU is visible")
    return cupy


def _sources_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(kl.KERNEL_DIR.iterdir()):
        if path.suffix in (".cu", ".cuh", ".h"):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def library_path() -> Path:
    """The kernel library to load (see the module docstring), built here if there is none."""
    given = os.environ.get(LIBRARY_ENV)
    if given:
        if not Path(given).is_file():
            raise QuantbenchError(f"${LIBRARY_ENV}={given}: no such file")
        return Path(given)
    if IN_TREE_LIBRARY.is_file():
        return IN_TREE_LIBRARY
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quantbench"
    folder = cache / f"dwconv2d-{_sources_hash()}"
    built = folder / kl.LIBRARY_NAME
    if not built.is_file():
        info(f"building the DWConv2D CUDA kernels with nvcc into {folder} (once; minutes)")
        kl.build_kernels(folder)
    return built


@functools.cache
def kernels() -> kl.KernelLibrary:
    """The loaded kernel library (once per process); one-line errors when it cannot be."""
    cupy_module()
    return kl.KernelLibrary(library_path())


def check_available() -> None:
    """Raise the one-line reason the cuda device cannot run DWConv2D here (before a session
    starts: inside onnxruntime the op cannot raise)."""
    kernels()


def forward(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: ConvAttrs, precision: str
) -> np.ndarray:
    """The plugin kernels' ``precision`` forward ('f32', 'f16', 'int8') on host arrays of the
    types the kernels take (f16: float16 x, w, b; int8: int8 x, w and float32 b)."""
    cp = cupy_module()
    lib = kernels()
    ho, wo = check_shapes(x.shape, w.shape, None if b is None else b.shape, attrs)
    n, c, h, width = x.shape
    k, _, kh, kw = w.shape[-4:]
    bias_mode = kl.BIAS_NONE
    if b is not None:
        bias_mode = kl.BIAS_PER_BATCH if b.ndim == 2 else kl.BIAS_SHARED
    spec = kl.ConvSpec(
        batch=n, in_channels=c, in_h=h, in_w=width, out_channels=k, kernel=(kh, kw),
        strides=attrs.strides, pads=attrs.pads, dilations=attrs.dilations, group=attrs.group,
        weight_per_batch=w.ndim == 5, bias_mode=bias_mode,
    )  # fmt: skip
    params = spec.to_params(attrs.input_scale, attrs.weight_scale, attrs.output_scale)
    if precision == "int8":
        out_dtype: Any = np.int8 if attrs.output_scale > 0 else np.float32
    else:
        out_dtype = np.float16 if precision == "f16" else np.float32
    device = [cp.asarray(np.ascontiguousarray(a)) for a in (x, w)]
    bias = None if b is None else cp.asarray(np.ascontiguousarray(b))
    y = cp.empty((n, k, ho, wo), dtype=out_dtype)
    stream = cp.cuda.get_current_stream()
    code = lib.forward(
        precision,
        device[0].data.ptr,
        device[1].data.ptr,
        None if bias is None else bias.data.ptr,
        y.data.ptr,
        params,
        stream.ptr,
    )
    if code != kl.CUDA_SUCCESS:
        raise QuantbenchError(
            f"the {precision} kernel returned CUDA error {code} for {kl.params_repr(params)}"
        )
    return cp.asnumpy(y, stream=stream)  # waits for the kernel on that stream
