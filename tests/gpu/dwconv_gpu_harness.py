"""Shared code of the DWConv2D GPU checks: the problem grid, references, one-case runner, timing.

tests/gpu/test_dwconv_kernels.py asserts on it; tests/gpu/run_gpu_checks.py turns the same rows
into results.json / results.md on the device machine. torch (with CUDA) provides device buffers
and the cuDNN baseline; references are computed on the CPU: float64 torch convolution (exact
integers for INT8 inputs) and, where installed, onnxruntime's float32 Conv.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARY_ENV = "QUANTBENCH_DWCONV_LIB"  # a prebuilt libdwconv2d_kernels.so (e.g. from `make`)


def _load_kernel_lib() -> ModuleType:
    """quantbench.plugins.dwconv2d.kernel_lib, or the same file when quantbench is not installed.

    The device machine gets the working tree but not the editable install, so the module is loaded
    by path there (it needs only the standard library and quantbench.errors).
    """
    try:
        return importlib.import_module("quantbench.plugins.dwconv2d.kernel_lib")
    except ImportError:
        pass
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    name = "quantbench_dwconv2d_kernel_lib"
    spec = importlib.util.spec_from_file_location(
        name, REPO_ROOT / "plugins" / "dwconv2d" / "kernel_lib.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kl = _load_kernel_lib()
ConvSpec = kl.ConvSpec


def gpu_unavailable_reason() -> str | None:
    """Why the GPU checks cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (the GPU checks use torch CUDA tensors)"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch (run on the device machine, see README)"
    if os.environ.get(LIBRARY_ENV) is None and kl.find_nvcc() is None:
        return f"nvcc not found and ${LIBRARY_ENV} not set"
    return None


@functools.cache
def get_library() -> Any:
    """The kernels: $QUANTBENCH_DWCONV_LIB if set, else built once per process into a temp dir.

    torch's cuDNN is loaded first, so that the library's cuDNN path (which takes a cuDNN already
    in the process before searching) uses the same cuDNN as the torch baseline.
    """
    try:
        import torch

        torch.backends.cudnn.version()
    except ImportError:
        pass
    prebuilt = os.environ.get(LIBRARY_ENV)
    if prebuilt:
        return kl.KernelLibrary(Path(prebuilt))
    out_dir = Path(tempfile.mkdtemp(prefix="dwconv2d_gpu_"))
    return kl.KernelLibrary(kl.build_kernels(out_dir))


# ---------------------------------------------------------------------------------------------
# The grid: depthwise (fast path), grouped, dense; strides, asymmetric pads, dilation, per-batch
# weights and bias, and shapes that take each kernel path.
# ---------------------------------------------------------------------------------------------

S, PB = kl.BIAS_SHARED, kl.BIAS_PER_BATCH
CASES: dict[str, Any] = {
    "dw_k3_s1_p1": ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1, 1, 1, 1), group=32, bias_mode=S),
    "dw_k3_s2_asym": ConvSpec(3, 48, 15, 17, 48, (3, 3), (2, 2), (0, 1, 1, 0), group=48),
    "dw_k5_d2_p4": ConvSpec(1, 64, 28, 28, 64, (5, 5), (1, 1), (4, 4, 4, 4), (2, 2), 64, False, S),
    "dw_k7_s1_p3_c256": ConvSpec(4, 256, 56, 56, 256, (7, 7), pads=(3,) * 4, group=256),
    "dw_k7_s2_d2": ConvSpec(2, 96, 64, 64, 96, (7, 7), (2, 2), (6, 5, 6, 7), (2, 2), 96, False, S),
    "dw_k1_s2_7x7": ConvSpec(2, 16, 7, 7, 16, (1, 1), (2, 2), group=16, bias_mode=S),
    "dw_k3_7x7_c256": ConvSpec(4, 256, 7, 7, 256, (3, 3), pads=(1,) * 4, group=256, bias_mode=S),
    "dw_k5_s2_asym": ConvSpec(2, 40, 33, 31, 40, (5, 5), (2, 2), (1, 2, 2, 1), group=40),
    "dw_k3_s1_d2_s2h": ConvSpec(2, 24, 20, 21, 24, (3, 3), (2, 1), (2, 2, 2, 2), (2, 2), 24),
    "dw_mult2_k3": ConvSpec(2, 16, 18, 18, 32, (3, 3), pads=(1,) * 4, group=16, bias_mode=S),
    "dw_k1x7_runtime": ConvSpec(2, 32, 12, 40, 32, (1, 7), pads=(0, 3, 0, 3), group=32),
    "dw_k9_runtime": ConvSpec(1, 8, 30, 30, 8, (9, 9), pads=(4,) * 4, group=8, bias_mode=S),
    "dw_k41_d3_direct": ConvSpec(1, 8, 64, 64, 8, (41, 41), (1, 1), (60,) * 4, (3, 3), 8),
    "dw_pb_k3": ConvSpec(4, 32, 24, 24, 32, (3, 3), (1, 1), (1,) * 4, (1, 1), 32, True, PB),
    "dw_pb_k5_s2": ConvSpec(3, 64, 29, 29, 64, (5, 5), (2, 2), (2, 1, 2, 1), (1, 1), 64, True, S),
    "g8_k3_direct": ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8, bias_mode=S),
    "g4_k5_s2_asym": ConvSpec(3, 32, 20, 20, 48, (5, 5), (2, 2), (2, 1, 1, 2), group=4),
    "g3_kg6_d2": ConvSpec(2, 12, 9, 11, 18, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 3, False, S),
    "g2_gemm_k3": ConvSpec(2, 128, 14, 14, 128, (3, 3), pads=(1,) * 4, group=2, bias_mode=S),
    "g2_gemm_kg48_s2": ConvSpec(1, 64, 13, 13, 96, (3, 3), (2, 2), (1,) * 4, group=2),
    "g2_pb_gemm": ConvSpec(2, 64, 12, 12, 64, (3, 3), (1, 1), (1,) * 4, (1, 1), 2, True, PB),
    "g8_pb_direct": ConvSpec(2, 32, 10, 10, 32, (3, 3), (1, 1), (0, 1, 2, 1), (1, 1), 8, True, S),
    "dense_k1": ConvSpec(2, 64, 32, 32, 64, (1, 1), bias_mode=S),
    "dense_k3_p1": ConvSpec(4, 32, 28, 28, 64, (3, 3), pads=(1,) * 4, bias_mode=S),
    "dense_k7_s2_stem": ConvSpec(1, 8, 64, 64, 32, (7, 7), (2, 2), (3,) * 4, bias_mode=S),
    "dense_k5_d2_asym": ConvSpec(2, 16, 24, 20, 40, (5, 5), (1, 1), (3, 1, 4, 2), (2, 2), 1),
    "dense_small_direct": ConvSpec(2, 8, 12, 12, 16, (3, 3), pads=(1,) * 4, bias_mode=S),
    "dense_pb_k3": ConvSpec(2, 16, 16, 16, 32, (3, 3), (1, 1), (1,) * 4, (1, 1), 1, True, PB),
    # depthwise_rows: stride 2 with 4-byte (int8) loads and scalar stores (Wo = 10), per-batch
    # 5x5 with uneven pads, 7x7 stride 2 with 8/4-byte loads, channel multiplier with rows cut off
    # at the bottom (Wo = 23), several row bands per plane, 5 x 4 planes over 3-plane blocks.
    "dwr_k3_s2_w20": ConvSpec(2, 24, 21, 20, 24, (3, 3), (2, 2), (1,) * 4, group=24, bias_mode=S),
    "dwr_pb_k5_s2": ConvSpec(2, 16, 28, 28, 16, (5, 5), (2, 2), (2, 2, 1, 2), (1, 1), 16, True, PB),
    "dwr_k7_s2_w36": ConvSpec(2, 8, 40, 36, 8, (7, 7), (2, 2), (3,) * 4, group=8, bias_mode=S),
    "dwr_mult2_asym": ConvSpec(2, 8, 19, 24, 16, (3, 3), (1, 1), (0, 1, 2, 0), group=8),
    "dwr_bands_k3": ConvSpec(1, 3, 150, 200, 3, (3, 3), pads=(1,) * 4, group=3),
    "dwr_pb_k5_w44": ConvSpec(3, 12, 13, 44, 12, (5, 5), (1, 1), (2,) * 4, (1, 1), 12, True, PB),
    "dwr_k7_c20": ConvSpec(5, 4, 14, 16, 4, (7, 7), pads=(3, 3, 2, 4), group=4, bias_mode=S),
    # depthwise_rows with INT8 weight tensors that end inside a 4-byte word (45, 75, 147 bytes:
    # a word-wide load of the last filter would read past the tensor; tests/gpu/sanitize_dwconv.py
    # runs them with exactly sized buffers under compute-sanitizer), and rows of 12 and 16 bytes.
    "dwr_odd_k3_c5": ConvSpec(1, 5, 8, 16, 5, (3, 3), pads=(1,) * 4, group=5, bias_mode=S),
    "dwr_odd_k5_c3_s2": ConvSpec(2, 3, 16, 16, 3, (5, 5), (2, 2), (2,) * 4, group=3),
    "dwr_odd_k7_pb_w12": ConvSpec(3, 1, 12, 12, 1, (7, 7), (1, 1), (3,) * 4, (1, 1), 1, True, PB),
    # depthwise_rows storing each output row as soon as it is summed (rows_stream): a thread's
    # last rows past the image (Ho = 13, 12, 9, 14: not a multiple of its 7 rows), the last
    # thread of a row with fewer than V outputs (Wo = 52, 30, 20, 14 against V = 8, 4, 4, 8),
    # uneven top/bottom pads, per-batch weights whose filters start at every byte offset in a
    # word (7 channels of 9 bytes), and 5 x 7 planes over blocks of several planes.
    "dws_k3_pb_w52_h13": ConvSpec(3, 7, 13, 52, 7, (3, 3), (1, 1), (1,) * 4, (1, 1), 7, True, PB),
    "dws_k5_s2_w60_h23": ConvSpec(
        2, 6, 23, 60, 6, (5, 5), (2, 2), (1, 2, 3, 2), group=6, bias_mode=S
    ),
    "dws_k7_w20_h9_pb": ConvSpec(5, 7, 9, 20, 7, (7, 7), (1, 1), (2, 3, 4, 3), (1, 1), 7, True, S),
    "dws_k3_s2_w28_h29": ConvSpec(2, 10, 29, 28, 10, (3, 3), (2, 2), (0, 1, 1, 1), group=10),
    # depthwise_global (rows read straight from global memory, whole V-wide row segments): 3x3
    # and 7x7 stride 2 with the last thread's rows past the image (Ho = 15, 11), a top pad of 0
    # with per-batch weights and bias (Ho = 9), a channel multiplier of 3 on rows of one segment
    # (W = 8: no quad either side), and a top pad of 2 (a thread's first two rows above the image).
    "dwg_k3_s2_h31": ConvSpec(
        2, 10, 31, 32, 10, (3, 3), (2, 2), (1, 1, 0, 1), group=10, bias_mode=S
    ),
    "dwg_k7_s2_h23": ConvSpec(2, 6, 23, 24, 6, (7, 7), (2, 2), (3, 3, 2, 3), group=6),
    "dwg_k5_pb_top0": ConvSpec(3, 5, 13, 16, 5, (5, 5), (1, 1), (0, 2, 0, 2), (1, 1), 5, True, PB),
    "dwg_mult3_w8": ConvSpec(2, 4, 10, 8, 12, (3, 3), pads=(1,) * 4, group=4, bias_mode=S),
    "dwg_k3_top2": ConvSpec(1, 6, 12, 24, 6, (3, 3), (1, 1), (2, 1, 0, 1), group=6),
}
MODES = ("f32", "f16", "int8_i8", "int8_f32", "int8_tie")

INPUT_SCALE = 0.02
WEIGHT_SCALE = 0.005
# int8_tie: INT8 -> INT8 with power-of-two scales, small inputs and biases that are multiples of
# 2^-8, so v / output_scale = (acc + 256 b) / 8 exactly and about one output in eight is a
# rounding tie, which must be rounded half to even (the kernels' fast requantization must find
# every tie and hand it to the exact chain).
TIE_INPUT_SCALE = 2.0**-4
TIE_WEIGHT_SCALE = 2.0**-4
TIE_OUTPUT_SCALE = 2.0**-5


def int8_scales(mode: str) -> tuple[float, float]:
    """(input_scale, weight_scale) of an INT8 mode."""
    if mode == "int8_tie":
        return TIE_INPUT_SCALE, TIE_WEIGHT_SCALE
    return INPUT_SCALE, WEIGHT_SCALE


# ---------------------------------------------------------------------------------------------
# References (CPU)
# ---------------------------------------------------------------------------------------------


def reference_f64(spec: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """ONNX Conv semantics (plus per-batch W and B) in float64 numpy, one kernel tap at a time.

    Integer-valued inputs give exact integer sums (|sum| < 2^53), which the INT8 check relies on.
    """
    top, left, bottom, right = spec.pads
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    (sh, sw), (dh, dw) = spec.strides, spec.dilations
    out_h, out_w = spec.out_hw
    g, cg = spec.group, spec.in_channels // spec.group
    kg = spec.out_channels // g
    wf = w.astype(np.float64)
    wf = (
        wf.reshape(spec.batch, g, kg, cg, *spec.kernel)
        if spec.weight_per_batch
        else (wf.reshape(g, kg, cg, *spec.kernel))
    )
    y = np.zeros((spec.batch, g, kg, out_h, out_w))
    for i in range(spec.kernel[0]):
        for j in range(spec.kernel[1]):
            taps = padded[
                :,
                :,
                i * dh : i * dh + sh * (out_h - 1) + 1 : sh,
                j * dw : j * dw + sw * (out_w - 1) + 1 : sw,
            ]
            taps = taps.reshape(spec.batch, g, cg, out_h, out_w)
            if spec.weight_per_batch:
                y += np.einsum("ngchw,ngkc->ngkhw", taps, wf[..., i, j])
            else:
                y += np.einsum("ngchw,gkc->ngkhw", taps, wf[..., i, j])
    y = y.reshape(spec.output_shape)
    if b is not None:
        bias = b.astype(np.float64)
        y += bias.reshape(1, -1, 1, 1) if bias.ndim == 1 else bias.reshape(spec.batch, -1, 1, 1)
    return y


def onnxruntime_reference_f32(
    spec: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None
) -> np.ndarray | None:
    """onnxruntime's CPU Conv (float32) with W (and B) as graph inputs; None if ORT is missing."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node(
        "Conv",
        inputs,
        ["y"],
        strides=list(spec.strides),
        pads=list(spec.pads),
        dilations=list(spec.dilations),
        group=spec.group,
    )
    item_w = w.shape[1:] if spec.weight_per_batch else w.shape
    infos = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, *x.shape[1:]]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, list(item_w)),
    ]
    if b is not None:
        infos.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [spec.out_channels]))
    graph = helper.make_graph(
        [node], "conv", infos, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def item(array: np.ndarray | None, i: int, per_item: bool) -> np.ndarray | None:
        return None if array is None else (array[i] if per_item else array)

    per_batch_bias = b is not None and b.ndim == 2
    if not spec.weight_per_batch and not per_batch_bias:
        feed = {"x": x, "w": w} | ({} if b is None else {"b": b})
        return session.run(None, feed)[0]
    outputs = []
    for i in range(spec.batch):
        feed = {"x": x[i : i + 1], "w": item(w, i, spec.weight_per_batch)}
        if b is not None:
            feed["b"] = item(b, i, per_batch_bias)
        outputs.append(session.run(None, feed)[0])
    return np.concatenate(outputs)


def requantize_reference(
    acc: np.ndarray,
    bias: np.ndarray | None,
    spec: Any,
    output_scale: float | None,
    scales: tuple[float, float] = (INPUT_SCALE, WEIGHT_SCALE),
) -> np.ndarray:
    """The INT8 epilogue of dwconv2d.h in numpy float32, one rounding per step, no FMA."""
    acc_scale = np.float32(scales[0]) * np.float32(scales[1])
    v = acc.astype(np.float32) * acc_scale
    if bias is not None:
        shaped = bias.reshape(1, -1, 1, 1) if bias.ndim == 1 else bias.reshape(spec.batch, -1, 1, 1)
        v = (v + shaped.astype(np.float32)).astype(np.float32)
    if output_scale is None:
        return v
    q = np.rint(v / np.float32(output_scale))
    return np.clip(q, -128, 127).astype(np.int8)


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------


@dataclass
class CaseInputs:
    """Host arrays for one run: x, w, optional b, in the dtype the kernel takes."""

    x: np.ndarray
    w: np.ndarray
    b: np.ndarray | None


# runner(spec, mode, inputs, output_scale, poison) -> host output array
Runner = Callable[[Any, str, CaseInputs, float, float], np.ndarray]


def make_inputs(spec: Any, mode: str, seed: int) -> CaseInputs:
    """Fresh random inputs (never zeros) for ``mode``; INT8 uses the full [-128, 127] range."""
    rng = np.random.default_rng(seed)
    bias_shape = spec.bias_shape
    if mode == "int8_tie":
        x = rng.integers(-8, 9, spec.input_shape, dtype=np.int8)
        w = rng.integers(-8, 9, spec.weight_shape, dtype=np.int8)
        b = None if bias_shape is None else rng.integers(-256, 257, bias_shape) * 2.0**-8
        return CaseInputs(x, w, None if b is None else b.astype(np.float32))
    if mode.startswith("int8"):
        x = rng.integers(-128, 128, spec.input_shape, dtype=np.int8)
        w = rng.integers(-128, 128, spec.weight_shape, dtype=np.int8)
        b = None if bias_shape is None else (rng.standard_normal(bias_shape) * 0.5)
        return CaseInputs(x, w, None if b is None else b.astype(np.float32))
    fan_in = spec.in_channels // spec.group * spec.kernel[0] * spec.kernel[1]
    dtype = np.float16 if mode == "f16" else np.float32
    x = rng.standard_normal(spec.input_shape).astype(dtype)
    w = (rng.standard_normal(spec.weight_shape) / math.sqrt(fan_in)).astype(dtype)
    b = None if bias_shape is None else (rng.standard_normal(bias_shape) * 0.1).astype(dtype)
    return CaseInputs(x, w, b)


def kernel_dtype(mode: str) -> str:
    """The forward entry point a mode uses: 'f32', 'f16' or 'int8'."""
    return "int8" if mode.startswith("int8") else mode


def mode_params(spec: Any, mode: str, output_scale: float) -> Any:
    if mode == "int8_i8":
        return spec.to_params(INPUT_SCALE, WEIGHT_SCALE, output_scale)
    if mode == "int8_tie":
        return spec.to_params(TIE_INPUT_SCALE, TIE_WEIGHT_SCALE, output_scale)
    if mode == "int8_f32":
        return spec.to_params(INPUT_SCALE, WEIGHT_SCALE, -1.0)
    return spec.to_params()


def gpu_runner(lib: Any, stream: Any | None = None) -> Runner:
    """A runner that copies the inputs to the GPU and calls the kernels on ``stream``."""

    def run(
        spec: Any, mode: str, inputs: CaseInputs, output_scale: float, poison: float
    ) -> np.ndarray:
        import torch

        dev = torch.device("cuda")
        x = torch.from_numpy(np.ascontiguousarray(inputs.x)).to(dev)
        w = torch.from_numpy(np.ascontiguousarray(inputs.w)).to(dev)
        b = None if inputs.b is None else torch.from_numpy(np.ascontiguousarray(inputs.b)).to(dev)
        out_dtype = {
            "f32": torch.float32,
            "f16": torch.float16,
            "int8_i8": torch.int8,
            "int8_f32": torch.float32,
            "int8_tie": torch.int8,
        }[mode]
        y = torch.full(spec.output_shape, poison, dtype=out_dtype, device=dev)
        on = stream or torch.cuda.current_stream()
        torch.cuda.synchronize()  # inputs and poison are in place before the side stream reads
        params = mode_params(spec, mode, output_scale)
        code = launch(lib, mode, (x, w, b), y, params, on.cuda_stream)
        if code != 0:
            raise RuntimeError(f"dwconv2d_forward_{kernel_dtype(mode)} returned CUDA error {code}")
        on.synchronize()
        torch.cuda.synchronize()  # surfaces asynchronous faults of the launch
        return y.cpu().numpy()

    return run


def float64_chain(
    acc: np.ndarray,
    bias: np.ndarray | None,
    spec: Any,
    output_scale: float,
    scales: tuple[float, float] = (INPUT_SCALE, WEIGHT_SCALE),
) -> np.ndarray:
    """The INT8 output of the same requantization carried out in float64 (the old, stricter
    reference): what the float32 epilogue is compared against, to say how often and by how
    much one float32 rounding per step moves an output."""
    v = acc.astype(np.float64) * (np.float64(scales[0]) * np.float64(scales[1]))
    if bias is not None:
        shaped = bias.reshape(1, -1, 1, 1) if bias.ndim == 1 else bias.reshape(spec.batch, -1, 1, 1)
        v = v + shaped.astype(np.float64)
    return np.clip(np.rint(v / np.float64(output_scale)), -128, 127).astype(np.int8)


def chain_gap(
    acc: np.ndarray, bias: np.ndarray | None, spec: Any, output_scale: float
) -> dict[str, float | int]:
    """How the float32 epilogue's outputs differ from the float64 chain's: the share that
    differ and by how many LSB at most."""
    ours = requantize_reference(acc, bias, spec, output_scale).astype(np.int32)
    gap = np.abs(ours - float64_chain(acc, bias, spec, output_scale).astype(np.int32))
    return {"f64_chain_differs": float(np.mean(gap > 0)), "f64_chain_max_lsb": int(gap.max())}


def _int8_output_scale(v: np.ndarray) -> float:
    """A scale that saturates about 1% of the outputs, so clamping is exercised too."""
    amax = float(np.percentile(np.abs(v), 99.0))
    return float(np.float32(max(amax, 1e-3) / 127.0))


def describe(name: str, spec: Any) -> dict[str, Any]:
    return {
        "case": name,
        "input": list(spec.input_shape),
        "weight": list(spec.weight_shape),
        "bias": None if spec.bias_shape is None else list(spec.bias_shape),
        "output": list(spec.output_shape),
        "kernel": list(spec.kernel),
        "strides": list(spec.strides),
        "pads": list(spec.pads),
        "dilations": list(spec.dilations),
        "group": spec.group,
    }


def check_case(
    runner: Runner, name: str, mode: str, seed: int = 0, spec: Any | None = None
) -> dict[str, Any]:
    """Run one (case, mode) against its reference: what was measured, and whether it passed."""
    spec = spec if spec is not None else CASES[name]
    inputs = make_inputs(spec, mode, seed)
    row = describe(name, spec) | {"mode": mode}
    if mode == "int8_tie":
        row.update(_check_int8_ties(runner, spec, inputs))
    elif mode.startswith("int8"):
        row.update(_check_int8(runner, spec, mode, inputs))
    else:
        row.update(_check_float(runner, spec, mode, inputs))
    return row


def _check_float(runner: Runner, spec: Any, mode: str, inputs: CaseInputs) -> dict[str, Any]:
    ref = reference_f64(spec, inputs.x, inputs.w, inputs.b)
    out = runner(spec, mode, inputs, -1.0, math.nan).astype(np.float64)
    unwritten = int(np.isnan(out).sum())
    scale = float(np.abs(ref).max())
    err = np.abs(out - ref)
    max_err = float(np.nanmax(err)) if unwritten < err.size else math.inf
    result: dict[str, Any] = {
        "unwritten": unwritten,
        "max_abs_ref": scale,
        "max_abs_err": max_err,
        "max_err_over_max_ref": max_err / scale,
        "rel_l2": float(np.sqrt(np.nansum(err**2)) / np.linalg.norm(ref)),
    }
    if mode == "f32":
        tolerance = 1e-5
        passed = unwritten == 0 and result["max_err_over_max_ref"] <= tolerance
        ort = onnxruntime_reference_f32(spec, inputs.x, inputs.w, inputs.b)
        if ort is not None:
            ort_err = float(np.abs(out - ort.astype(np.float64)).max() / scale)
            result["ort_max_err_over_max_ref"] = ort_err
            passed = passed and ort_err <= tolerance
        result["tolerance"] = f"max|y-ref| <= {tolerance} * max|ref| (float64 ref, onnxruntime)"
    else:
        # One binary16 rounding of the output (<= 2^-11 relative) plus float32 accumulation slack.
        bound = 2.0**-11 * np.abs(ref) + 2e-5 * scale + 2.0**-24
        violations = int((err > bound).sum())
        result["violations"] = violations
        result["tolerance"] = "|y-ref| <= 2^-11*|ref| + 2e-5*max|ref| + 2^-24 (float64 ref)"
        passed = unwritten == 0 and violations == 0
    result["passed"] = bool(passed)
    return result


def int8_expected(
    spec: Any, inputs: CaseInputs, scales: tuple[float, float] = (INPUT_SCALE, WEIGHT_SCALE)
) -> tuple[np.ndarray, np.ndarray]:
    """Exact int32 sums and the float32 epilogue value v for INT8 inputs."""
    acc_f64 = reference_f64(spec, inputs.x, inputs.w, None)
    acc = np.rint(acc_f64).astype(np.int64)
    if not np.array_equal(acc.astype(np.float64), acc_f64):
        raise AssertionError("float64 reference of integer inputs is not integral")
    return acc, requantize_reference(acc, inputs.b, spec, None, scales)


def _check_int8(runner: Runner, spec: Any, mode: str, inputs: CaseInputs) -> dict[str, Any]:
    acc, v = int8_expected(spec, inputs)
    result: dict[str, Any] = {"max_abs_acc": int(np.abs(acc).max())}
    if mode == "int8_f32":
        out = runner(spec, mode, inputs, -1.0, math.nan)
        unwritten = int(np.isnan(out).sum())
        mismatches = int((out != v).sum()) - unwritten
        result.update(
            unwritten=unwritten,
            mismatches=mismatches,
            max_abs_err=float(np.nanmax(np.abs(out.astype(np.float64) - v))),
            tolerance="bit-exact vs the float32 epilogue of dwconv2d.h on exact int32 sums",
            passed=unwritten == 0 and mismatches == 0,
        )
        return result
    output_scale = _int8_output_scale(v)
    expected = requantize_reference(acc, inputs.b, spec, output_scale)
    first = runner(spec, mode, inputs, output_scale, 85)
    second = runner(spec, mode, inputs, output_scale, -86)
    unwritten = int((first != second).sum())  # an element left alone keeps its poison
    diff = np.abs(first.astype(np.int32) - expected.astype(np.int32))
    scaled = (v / np.float32(output_scale)).astype(np.float64)
    tie_distance = np.abs(np.abs(scaled - np.floor(scaled)) - 0.5)
    near_tie = tie_distance <= 1e-6 * np.maximum(1, np.abs(scaled))
    off_tie = int(((diff > 0) & ~near_tie).sum())
    result.update(
        **chain_gap(acc, inputs.b, spec, output_scale),
        output_scale=output_scale,
        unwritten=unwritten,
        saturated_fraction=float(np.mean(np.abs(expected.astype(np.int32)) >= 127)),
        exact_fraction=float(np.mean(diff == 0)),
        max_lsb_diff=int(diff.max()),
        mismatches_off_ties=off_tie,
        tolerance="bit-exact vs the float32 epilogue of dwconv2d.h on exact int32 sums",
        passed=unwritten == 0 and int(diff.max()) == 0,
    )
    return result


def _check_int8_ties(runner: Runner, spec: Any, inputs: CaseInputs) -> dict[str, Any]:
    """INT8 -> INT8 where many outputs are exact rounding ties: every element must be exact."""
    scales = int8_scales("int8_tie")
    acc, v = int8_expected(spec, inputs, scales)
    expected = requantize_reference(acc, inputs.b, spec, TIE_OUTPUT_SCALE, scales)
    first = runner(spec, "int8_tie", inputs, TIE_OUTPUT_SCALE, 85)
    second = runner(spec, "int8_tie", inputs, TIE_OUTPUT_SCALE, -86)
    unwritten = int((first != second).sum())
    quotient = v.astype(np.float64) / TIE_OUTPUT_SCALE
    ties = int(np.sum(quotient - np.floor(quotient) == 0.5))
    mismatches = int((first != expected).sum())
    return {
        "max_abs_acc": int(np.abs(acc).max()),
        "output_scale": TIE_OUTPUT_SCALE,
        "ties": ties,
        "unwritten": unwritten,
        "saturated_fraction": float(np.mean(np.abs(expected.astype(np.int32)) >= 127)),
        "exact_fraction": float(np.mean(first == expected)),
        "mismatches": mismatches,
        "max_lsb_diff": int(np.abs(first.astype(np.int32) - expected.astype(np.int32)).max()),
        "tolerance": "bit-exact (ties half to even) vs the float32 epilogue on exact int32 sums",
        "passed": unwritten == 0 and mismatches == 0 and ties > 0,
    }


# ---------------------------------------------------------------------------------------------
# Timing against cuDNN (torch.nn.functional.conv2d)
# ---------------------------------------------------------------------------------------------

BENCH_CASES: dict[str, Any] = {
    "dw3x3_s1_mobilenet": ConvSpec(
        32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256, bias_mode=S
    ),
    "dw5x5_s2": ConvSpec(32, 240, 56, 56, 240, (5, 5), (2, 2), (2,) * 4, group=240, bias_mode=S),
    "dw7x7_convnext": ConvSpec(32, 384, 28, 28, 384, (7, 7), pads=(3,) * 4, group=384, bias_mode=S),
    "dw3x3_per_batch_w": ConvSpec(
        32, 256, 56, 56, 256, (3, 3), (1, 1), (1,) * 4, (1, 1), 256, True, PB
    ),
    "grouped3x3_g32_resnext": ConvSpec(32, 256, 28, 28, 256, (3, 3), pads=(1,) * 4, group=32),
    "dense3x3_c128": ConvSpec(32, 128, 28, 28, 128, (3, 3), pads=(1,) * 4, bias_mode=S),
}


L2_BYTES = 60 * 2**20  # H200 (torch.cuda.get_device_properties(0).L2_cache_size where known)
LAST_TIMING: dict[str, bool] = {"graph": False}  # whether time_cuda's last call replayed a graph


def time_cuda(fn: Callable[[], None], warmup: int = 5, reps: int = 30, inner: int = 10) -> float:
    """Median over ``reps`` of the mean time of ``inner`` back-to-back calls, in microseconds.

    The ``inner`` calls are captured once in a CUDA graph and replayed, so launch overhead (ctypes
    and Python for ours, the framework for cuDNN) is left out of both; where capture fails they are
    launched one by one. ``fn`` must launch on torch's current stream.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    replay: Callable[[], None] | None = None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        replay = graph.replay
    except Exception:  # capture is an optimisation of the timing loop only
        torch.cuda.synchronize()
        replay = None

    LAST_TIMING["graph"] = replay is not None

    def once() -> None:
        if replay is not None:
            replay()
        else:
            for _ in range(inner):
                fn()

    once()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        once()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / inner)
    return statistics.median(samples)


def torch_conv(spec: Any, x: Any, w: Any, b: Any | None) -> Any:
    """cuDNN: grouped conv; per-batch weights via the usual fold of N into the groups."""
    import torch.nn.functional as F

    top, left, bottom, right = spec.pads
    if top == bottom and left == right:
        padded, padding = x, (top, left)
    else:
        padded, padding = F.pad(x, (left, right, top, bottom)), (0, 0)
    if not spec.weight_per_batch:
        bias = b if (b is None or b.dim() == 1) else None
        y = F.conv2d(padded, w, bias, spec.strides, padding, spec.dilations, spec.group)
    else:
        n, c, h, wd = padded.shape
        folded = padded.reshape(1, n * c, h, wd)
        y = F.conv2d(
            folded,
            w.reshape(-1, *w.shape[2:]),
            None,
            spec.strides,
            padding,
            spec.dilations,
            spec.group * n,
        )
        y = y.reshape(n, spec.out_channels, *y.shape[2:])
    if b is not None and (spec.weight_per_batch or b.dim() == 2):
        y = y + b.reshape(spec.batch if b.dim() == 2 else 1, -1, 1, 1)
    return y


def device_inputs(spec: Any, mode: str, gen: Any) -> tuple[Any, Any, Any | None]:
    """Random device tensors for timing (generated on the GPU: the timed shapes are large)."""
    import torch

    dev = torch.device("cuda")
    bias_shape = spec.bias_shape
    if mode.startswith("int8"):
        x = torch.randint(-128, 128, spec.input_shape, generator=gen, device=dev, dtype=torch.int8)
        w = torch.randint(-128, 128, spec.weight_shape, generator=gen, device=dev, dtype=torch.int8)
        b = None if bias_shape is None else torch.randn(bias_shape, generator=gen, device=dev)
        return x, w, b
    dtype = torch.float16 if mode == "f16" else torch.float32
    x = torch.randn(spec.input_shape, generator=gen, device=dev).to(dtype)
    w = torch.randn(spec.weight_shape, generator=gen, device=dev).to(dtype) * 0.1
    b = None if bias_shape is None else torch.randn(bias_shape, generator=gen, device=dev).to(dtype)
    return x, w, b


def device_forward(lib: Any, spec: Any, mode: str, tensors: tuple, params: Any) -> Any:
    """One forward of ``lib`` on the device tensors (x, w, b) on torch's current stream; returns
    the output tensor (the call's return code checked)."""
    import torch

    y = torch.empty(spec.output_shape, dtype=tensors[0].dtype, device="cuda")
    code = launch(lib, mode, tensors, y, params, torch.cuda.current_stream().cuda_stream)
    assert code == 0, code
    return y


def launch(lib: Any, mode: str, tensors: tuple, y: Any, params: Any, stream: int) -> int:
    """``lib``'s forward for ``mode`` on the device tensors (x, w, b) into ``y``; its CUDA error
    code (0: launched)."""
    x, w, b = tensors
    return lib.forward(
        kernel_dtype(mode),
        x.data_ptr(),
        w.data_ptr(),
        None if b is None else b.data_ptr(),
        y.data_ptr(),
        params,
        stream,
    )


def rotation_sets(bytes_per_set: int) -> int:
    """How many input/output sets to cycle through so that one pass over them is >= 4x the L2."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or L2_BYTES
    return max(1, min(8, -(-4 * l2 // max(bytes_per_set, 1))))


@contextmanager
def _switched(set_mode: Callable[[int], int], mode: int) -> Iterator[None]:
    """The block runs with ``set_mode(mode)``; the previous mode is restored after it."""
    previous = set_mode(mode)
    try:
        yield
    finally:
        set_mode(previous)


def cudnn_mode(lib: Any, mode: int) -> AbstractContextManager[None]:
    """``with cudnn_mode(lib, kl.CUDNN_OFF):`` runs the block with that dispatch mode."""
    return _switched(lib.set_cudnn_mode, mode)


def mma_mode(lib: Any, mode: int) -> AbstractContextManager[None]:
    """``with mma_mode(lib, kl.MMA_OFF):`` runs the block with depthwise_mma switched off
    (MMA_ON: on wherever the plane fits; MMA_AUTO, the default: the library's per-shape table)."""
    return _switched(lib.set_mma_mode, mode)


GLOBAL_ENV = "QUANTBENCH_DWCONV_GLOBAL"  # "0": depthwise_rows instead of depthwise_global
PDL_ENV = "QUANTBENCH_DWCONV_PDL"  # "0": depthwise_global launched plainly, not as a PDL dependent


@contextmanager
def global_off() -> Iterator[None]:
    """``with global_off():`` runs the block with depthwise_global switched off (the library
    reads $QUANTBENCH_DWCONV_GLOBAL at every forward): depthwise_rows takes its shapes."""
    previous = os.environ.get(GLOBAL_ENV)
    os.environ[GLOBAL_ENV] = "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[GLOBAL_ENV]
        else:
            os.environ[GLOBAL_ENV] = previous


def bench_case(
    lib: Any, name: str, reps: int = 30, cudnn: bool = True, other: bool = True
) -> list[dict[str, Any]]:
    """Ours (f32, f16, int8) against cuDNN (f32 without TF32, f16) on one shape; ``other``: also
    our other kernel for the shape (cuDNN off, depthwise_mma against depthwise_rows, depthwise_rows
    against depthwise_global)."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(1)
    return [
        _bench_mode(lib, name, mode, gen, reps, cudnn, other) for mode in ("f32", "f16", "int8_i8")
    ]


def _bench_mode(
    lib: Any, name: str, mode: str, gen: Any, reps: int, cudnn: bool = True, other: bool = True
) -> dict[str, Any]:
    """One shape in one mode. Each timed call reads fresh inputs and writes a fresh output (sets
    rotated, 4x the L2 in all), so no precision is timed out of the cache."""
    import torch

    spec = BENCH_CASES[name]
    x, w, b = device_inputs(spec, mode, gen)
    elem = x.element_size()
    dtype = kernel_dtype(mode)
    params = mode_params(spec, mode, 0.05)
    moved = (x.numel() + w.numel() + math.prod(spec.output_shape)) * elem
    sets = [(x, w, b)] + [device_inputs(spec, mode, gen) for _ in range(rotation_sets(moved) - 1)]
    outs = [torch.empty(spec.output_shape, dtype=x.dtype, device=x.device) for _ in sets]
    args = [
        (xs.data_ptr(), ws.data_ptr(), None if bs is None else bs.data_ptr(), ys.data_ptr())
        for (xs, ws, bs), ys in zip(sets, outs, strict=True)
    ]
    turn = {"ours": 0, "cudnn": 0}

    def launch(i: int) -> None:
        code = lib.forward(dtype, *args[i], params, torch.cuda.current_stream().cuda_stream)
        if code != 0:
            raise RuntimeError(f"{name} {mode}: CUDA error {code}")

    def ours() -> None:
        turn["ours"] += 1
        launch(turn["ours"] % len(args))

    def theirs() -> None:
        turn["cudnn"] += 1
        torch_conv(spec, *sets[turn["cudnn"] % len(sets)])

    ours_us = time_cuda(ours, reps=reps)
    graphed = LAST_TIMING["graph"]
    path = lib.last_path()  # the dispatch's choice, as the last timed launch took it
    row: dict[str, Any] = {
        "case": name,
        "mode": mode,
        "path": path,
        "input": list(spec.input_shape),
        "weight": list(spec.weight_shape),
        "rotated_sets": len(sets),
        "ours_us": ours_us,
        "ours_GBps": moved / ours_us / 1e3,
        "ours_graph_replay": graphed,
    }
    if other and path == "cudnn":  # our own kernels on the same shape, for the record
        with cudnn_mode(lib, kl.CUDNN_OFF):
            row["kernels_us"] = time_cuda(ours, reps=reps)
            row["kernels_path"] = lib.last_path()
    if other and path == "depthwise_rows" and dtype != "f32" and getattr(lib, "has_mma", False):
        with mma_mode(lib, kl.MMA_ON):  # the tensor-core kernel, where the table does not take it
            if lib.forward_path(params, dtype) == "depthwise_mma":
                row["kernels_us"] = time_cuda(ours, reps=reps)
                row["kernels_path"] = lib.last_path()
    if other and path == "depthwise_global":  # the shared-memory kernel it replaced
        with global_off():
            row["kernels_us"] = time_cuda(ours, reps=reps)
            row["kernels_path"] = lib.last_path()
    if other and path in ("depthwise_mma", "gemm_mma"):  # tensor cores: the CUDA-core kernel
        with mma_mode(lib, kl.MMA_OFF):
            row["kernels_us"] = time_cuda(ours, reps=reps)
            row["kernels_path"] = lib.last_path()
    if dtype != "int8" and cudnn:
        launch(0)
        y_ref = torch_conv(spec, x, w, b)
        torch.cuda.synchronize()
        diff = (outs[0].double() - y_ref.double()).abs().max().item()
        row["max_diff_vs_cudnn_over_max"] = diff / y_ref.double().abs().max().item()
        row["cudnn_us"] = time_cuda(theirs, reps=reps)
        row["speedup_vs_cudnn"] = row["cudnn_us"] / ours_us
    return row
