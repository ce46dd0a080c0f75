"""DWConv2D on the CPU in numpy: the op's reference semantics in FP32, FP16 and INT8.

Why: onnxruntime runs a model's DWConv2D through this code (:mod:`.ort_op`, device ``cpu``), so
CI runs the model through the op itself rather than through its lowering to Conv, and the CUDA
kernels (device ``cuda``) are held to it. The arithmetic is the contract of
``kernels/dwconv2d.h``:

* FP32: float32 inputs; the sums are taken in float64 and rounded once to float32 (the kernels
  sum in float32, so they agree within FP32 rounding).
* FP16: float16 inputs, bias and output; float64 sums, one rounding to float16 at the end (the
  kernels: float32 sums, one rounding to float16).
* INT8: int8 X and W (symmetric, zero point 0), float32 bias in real units; exact integer sums
  (every partial sum is an integer below 2^31 in magnitude, so float64 holds it exactly whatever
  the order), then ``v = fl(fl(float(acc) * fl(input_scale * weight_scale)) + b)`` and, for an
  INT8 output, ``clamp(round_half_even(fl(v / output_scale)), -128, 127)``, each ``fl`` one
  float32 rounding (numpy's float32 ufuncs round each operation once and never fuse), which is
  what the kernels compute bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantbench.errors import QuantbenchError

#: the longest INT8 reduction (C/group * kH * kW) the kernels take: longer could overflow int32
INT8_MAX_REDUCTION = (1 << 17) - 1
PRECISIONS = ("f32", "f16", "int8")


@dataclass(frozen=True)
class ConvAttrs:
    """A DWConv2D node's attributes (pads top, left, bottom, right; scale <= 0: not INT8)."""

    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    group: int = 1
    input_scale: float = -1.0
    weight_scale: float = -1.0
    output_scale: float = -1.0

    @property
    def int8(self) -> bool:
        return self.input_scale > 0 and self.weight_scale > 0


def output_extent(size: int, begin: int, end: int, kernel: int, stride: int, dilation: int) -> int:
    """ONNX Conv: floor((size + pads - dilation * (kernel - 1) - 1) / stride) + 1."""
    return (size + begin + end - dilation * (kernel - 1) - 1) // stride + 1


def check_shapes(
    x: tuple[int, ...], w: tuple[int, ...], b: tuple[int, ...] | None, attrs: ConvAttrs
) -> tuple[int, int]:
    """(Ho, Wo) of a run with these shapes; a one-line QuantbenchError for any mismatch."""
    if len(x) != 4:
        raise QuantbenchError(f"X must be [N, C, H, W], got shape {list(x)}")
    if len(w) not in (4, 5):
        raise QuantbenchError(
            f"W must be [K, C/group, kH, kW] or [N, K, C/group, kH, kW], got shape {list(w)}"
        )
    n, c, h, width = x
    k, cg, kh, kw = w[-4:]
    g = attrs.group
    if c % g or k % g or cg * g != c:
        raise QuantbenchError(
            f"X has C={c} and W {list(w)}: group {g} must divide C and K, and W's channel dim "
            "must be C/group"
        )
    if len(w) == 5 and w[0] != n:
        raise QuantbenchError(f"per-sample W has N={w[0]} but X has N={n}")
    if b is not None and b != (k,) and b != (n, k):
        raise QuantbenchError(f"bias must be [K] = [{k}] or [N, K] = [{n}, {k}], got {list(b)}")
    ho = output_extent(h, attrs.pads[0], attrs.pads[2], kh, attrs.strides[0], attrs.dilations[0])
    wo = output_extent(
        width, attrs.pads[1], attrs.pads[3], kw, attrs.strides[1], attrs.dilations[1]
    )
    if ho < 1 or wo < 1:
        raise QuantbenchError(
            f"the output would be {ho}x{wo}: the {kh}x{kw} kernel (dilated) is larger than the "
            f"padded {h}x{width} input"
        )
    if attrs.int8 and cg * kh * kw > INT8_MAX_REDUCTION:
        raise QuantbenchError(
            f"INT8 reduction C/group*kH*kW = {cg * kh * kw} exceeds {INT8_MAX_REDUCTION} "
            "(int32 sums could overflow)"
        )
    return ho, wo


def sums(x: np.ndarray, w: np.ndarray, attrs: ConvAttrs) -> np.ndarray:
    """The convolution sums in float64, [N, K, Ho, Wo] (no bias): one tap of the kernel at a
    time, so memory stays at the output's size whatever the kernel."""
    ho, wo = check_shapes(x.shape, w.shape, None, attrs)
    n, c, h, width = x.shape
    k, cg, kh, kw = w.shape[-4:]
    g = attrs.group
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilations
    top, left, bottom, right = attrs.pads
    padded = np.zeros((n, c, h + top + bottom, width + left + right), np.float64)
    padded[:, :, top : top + h, left : left + width] = x
    # shared [G, K/G, C/G, kH, kW] or per sample [N, G, K/G, C/G, kH, kW]
    kernel = w.astype(np.float64).reshape(*w.shape[:-4], g, k // g, cg, kh, kw)
    acc = np.zeros((n, g, k // g, ho * wo), np.float64)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            taps = padded[:, :, rows, cols].reshape(n, g, cg, ho * wo)
            tap = kernel[..., i, j]  # [(N,) G, K/G, C/G]
            if cg == 1:  # depthwise: a broadcast product, no matrix product per channel
                acc += tap * taps
            else:
                acc += tap @ taps
    return acc.reshape(n, k, ho, wo)


def _bias(b: np.ndarray | None, dtype: type) -> np.ndarray | float:
    """[K] or [N, K] as [1 or N, K, 1, 1] (0 without a bias)."""
    if b is None:
        return 0.0
    return np.asarray(b, dtype).reshape(b.shape[0] if b.ndim == 2 else 1, -1, 1, 1)


def forward(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: ConvAttrs, precision: str
) -> np.ndarray:
    """DWConv2D of ``precision`` ('f32', 'f16', 'int8'): float32, float16, and int8 (an
    ``output_scale`` > 0) or float32 out."""
    check_shapes(x.shape, w.shape, None if b is None else b.shape, attrs)
    if precision == "int8":
        if x.dtype != np.int8 or w.dtype != np.int8:
            raise QuantbenchError(f"INT8 takes int8 X and W, got {x.dtype} and {w.dtype}")
        return requantize(sums(x, w, attrs), b, attrs)
    if precision not in ("f32", "f16"):
        raise QuantbenchError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision}")
    dtype = np.float16 if precision == "f16" else np.float32
    # FP16: the inputs are float16 values (any float type holding them is widened exactly)
    x, w = x.astype(dtype, copy=False), w.astype(dtype, copy=False)
    bias = _bias(None if b is None else b.astype(dtype, copy=False), np.float64)
    return (sums(x, w, attrs) + bias).astype(dtype)


def requantize(acc: np.ndarray, b: np.ndarray | None, attrs: ConvAttrs) -> np.ndarray:
    """The INT8 epilogue of ``kernels/dwconv2d.h`` on exact integer sums ``acc``."""
    f32 = np.float32
    acc_scale = f32(attrs.input_scale) * f32(attrs.weight_scale)  # one float32 rounding
    v = acc.astype(f32) * acc_scale  # float(acc) rounds to nearest even, as __int2float_rn
    if b is not None:
        v = v + _bias(b, f32)  # type: ignore[operator]
    if attrs.output_scale <= 0:
        return v.astype(f32)
    q = np.rint(v / f32(attrs.output_scale))  # float32 quotient, round half to even
    return np.clip(q, -128, 127).astype(np.int8)
