"""A ResNet-18-shaped ONNX model and image-like inputs for benchmarks, built with numpy only.

Benchmarks need a model of realistic size and structure (20 Conv, 8 residual Adds, MaxPool,
GlobalAveragePool, Gemm 512->1000; 11.7 M parameters) whose activations behave like a trained
network's: per-channel ranges that differ, ReLU sparsity, a residual stream that grows within a
stage. Pretrained weights cannot be downloaded here, and random weights alone make activations
explode or vanish. So each convolution gets He-initialised weights and a BatchNorm whose statistics
are *measured*: the builder runs a numpy reference forward pass on a few image-like samples, takes
each raw conv output's per-channel mean and variance (perturbed slightly, as trained running
statistics never match a given batch exactly), draws gamma (log-normal around a per-role level)
and beta, and folds the BatchNorm into the conv's weight and bias. The final Gemm is scaled so
logits have a standard deviation of about 3.

Inputs from :func:`make_resnet18_data` are smooth random colour images (1/f amplitude spectrum,
correlated RGB channels, random brightness and contrast) normalised with the ImageNet mean/std: the
statistics calibration sees are image-like, not white noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import QuantbenchError
from quantbench.fileio import check_output_path, write_bytes_atomic

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
IMAGE_SIZE = 224
NUM_CLASSES = 1000
OPSET = 17
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
#: (channels, first block's stride) of the four stages; two basic blocks each.
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
BN_EPS = 1e-5
#: samples the builder's reference pass measures BatchNorm statistics on.
BN_STAT_SAMPLES = 4
LOGIT_STD = 3.0
#: typical gamma of a BatchNorm by position: the last BN of a residual branch (and of a
#: downsample path) is small in trained ResNets, which keeps the residual stream from exploding.
_GAMMA_LEVEL = {"stem": 0.8, "inner": 0.7, "branch_out": 0.35, "downsample": 0.35}
_DATA_STREAM, _BN_STATS_STREAM, _WEIGHT_STREAM = 0, 1, 2


# ----------------------------------------------------------------------------- data


def _smooth_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """One RGB image in [0,1], HWC float64: 1/f^alpha random fields, mixed into correlated RGB."""
    fy = np.fft.fftfreq(size)[:, None]
    fx = np.fft.rfftfreq(size)[None, :]
    radius = np.hypot(fy, fx)
    radius[0, 0] = 1.0 / size  # the DC term: finite, and removed below anyway
    alpha = rng.uniform(1.0, 1.6)  # natural images: amplitude ~ 1/f (power ~ 1/f^2)
    amplitude = radius**-alpha
    spectrum = rng.standard_normal((3, size, size // 2 + 1)) + 1j * rng.standard_normal(
        (3, size, size // 2 + 1)
    )
    fields = np.fft.irfft2(spectrum * amplitude, s=(size, size), axes=(1, 2))
    fields -= fields.mean(axis=(1, 2), keepdims=True)
    fields /= fields.std(axis=(1, 2), keepdims=True)
    # Field 0 is shared luminance (RGB of natural images are strongly correlated), 1-2 add colour.
    mixing = np.concatenate([np.ones((3, 1)), rng.normal(0.0, 0.35, size=(3, 2))], axis=1)
    base_colour = rng.uniform(0.3, 0.65) + rng.normal(0.0, 0.05, size=3)  # grey-ish, tinted
    contrast = rng.uniform(0.08, 0.22)
    image = base_colour[:, None, None] + contrast * np.tensordot(mixing, fields, axes=1)
    return np.clip(image, 0.0, 1.0).transpose(1, 2, 0)


def _images(n: int, seed: int, stream: int) -> np.ndarray:
    """``n`` ImageNet-normalised images; image ``i`` depends only on (seed, stream, i)."""
    if n < 1:
        raise QuantbenchError(f"make_resnet18_data: n={n}; ask for at least one sample")
    out = np.empty((n, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    for index in range(n):
        rng = np.random.default_rng([seed, stream, index])
        image = _smooth_image(rng, IMAGE_SIZE).astype(np.float32)
        out[index] = ((image - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
    return out


def make_resnet18_data(n: int, seed: int) -> np.ndarray:
    """Image-like float32 inputs [n,3,224,224] for :func:`build_resnet18` (ImageNet-normalised).

    Deterministic, and a prefix is stable: ``make_resnet18_data(k, s)`` equals the first ``k``
    samples of ``make_resnet18_data(n, s)`` for ``k <= n``. About 0.6 MB per sample.
    """
    return _images(n, seed, _DATA_STREAM)


# ----------------------------------------------------------------------------- numpy reference ops


def _conv(x: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NCHW convolution (no bias) as im2col + BLAS matmul: the builder's reference pass."""
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kernel = weight.shape[2]
    windows = sliding_window_view(padded, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # [N, Ho, Wo, K]
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _maxpool_3x3_s2(x: np.ndarray) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    return windows.max(axis=(4, 5))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, dtype=np.float32)


# ----------------------------------------------------------------------------- graph builder


@dataclass
class _Builder:
    """Appends nodes and initializers while carrying the reference activations along."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)

    def _add_initializer(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def _folded_batchnorm(self, raw: np.ndarray, role: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (scale, shift) of a BatchNorm with measured, slightly perturbed stats."""
        channels = raw.shape[1]
        batch_mean = raw.mean(axis=(0, 2, 3), dtype=np.float64)
        batch_var = raw.var(axis=(0, 2, 3), dtype=np.float64)
        running_mean = batch_mean + self.rng.normal(0.0, 0.1, channels) * np.sqrt(batch_var)
        running_var = batch_var * np.exp(self.rng.normal(0.0, 0.2, channels))
        level = _GAMMA_LEVEL[role]
        gamma = level * np.exp(self.rng.normal(0.0, 0.4, channels))
        beta = self.rng.normal(-0.1 * level, 0.25 * level, channels)
        scale = gamma / np.sqrt(running_var + BN_EPS)
        return scale, beta - running_mean * scale

    def conv_bn(
        self,
        name: str,
        x: tuple[str, np.ndarray],
        out_channels: int,
        kernel: int,
        stride: int,
        role: str,
        relu: bool,
    ) -> tuple[str, np.ndarray]:
        """Conv (BatchNorm folded into weight and bias), optionally followed by Relu."""
        x_name, x_ref = x
        fan_in = x_ref.shape[1] * kernel * kernel
        weight = self.rng.normal(
            0.0, np.sqrt(2.0 / fan_in), (out_channels, x_ref.shape[1], kernel, kernel)
        )
        weight = weight.astype(np.float32)
        pad = kernel // 2
        raw = _conv(x_ref, weight, stride, pad)
        scale, shift = self._folded_batchnorm(raw, role)
        folded_weight = (weight * scale[:, None, None, None]).astype(np.float32)
        bias = shift.astype(np.float32)
        out_ref = (raw * scale[None, :, None, None] + bias[None, :, None, None]).astype(np.float32)
        out_name = f"{name}_output"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [
                    x_name,
                    self._add_initializer(f"{name}.weight", folded_weight),
                    self._add_initializer(f"{name}.bias", bias),
                ],
                [out_name],
                name=name,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad] * 4,
            )
        )
        if not relu:
            return out_name, out_ref
        return self.relu(f"{name}.relu", (out_name, out_ref))

    def relu(self, name: str, x: tuple[str, np.ndarray]) -> tuple[str, np.ndarray]:
        self.nodes.append(helper.make_node("Relu", [x[0]], [f"{name}_output"], name=name))
        return f"{name}_output", _relu(x[1])

    def basic_block(
        self, name: str, x: tuple[str, np.ndarray], channels: int, stride: int
    ) -> tuple[str, np.ndarray]:
        """torchvision BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, + identity or 1x1 downsample."""
        branch = self.conv_bn(f"{name}.conv1", x, channels, 3, stride, "inner", relu=True)
        branch = self.conv_bn(f"{name}.conv2", branch, channels, 3, 1, "branch_out", relu=False)
        shortcut = x
        if stride != 1 or x[1].shape[1] != channels:
            shortcut = self.conv_bn(
                f"{name}.downsample", x, channels, 1, stride, "downsample", relu=False
            )
        add_name = f"{name}.add"
        # Residual branch first, shortcut second: the order torchvision's export produces.
        self.nodes.append(
            helper.make_node("Add", [branch[0], shortcut[0]], [f"{add_name}_output"], name=add_name)
        )
        return self.relu(f"{name}.relu", (f"{add_name}_output", branch[1] + shortcut[1]))

    def head(self, x: tuple[str, np.ndarray]) -> None:
        """GlobalAveragePool -> Flatten -> Gemm(transB=1) scaled so logits have std ~LOGIT_STD."""
        self.nodes.append(
            helper.make_node("GlobalAveragePool", [x[0]], ["pool_output"], name="avgpool")
        )
        self.nodes.append(
            helper.make_node("Flatten", ["pool_output"], ["flatten_output"], name="flatten", axis=1)
        )
        features = x[1].mean(axis=(2, 3))
        weight = self.rng.standard_normal((NUM_CLASSES, features.shape[1]))
        weight *= LOGIT_STD / float((features @ weight.T).std())
        bias = self.rng.normal(0.0, 0.1, NUM_CLASSES)
        self.nodes.append(
            helper.make_node(
                "Gemm",
                [
                    "flatten_output",
                    self._add_initializer("fc.weight", weight.astype(np.float32)),
                    self._add_initializer("fc.bias", bias.astype(np.float32)),
                ],
                [OUTPUT_NAME],
                name="fc",
                transB=1,
            )
        )


def _build_graph(seed: int, batch_dim: int | str) -> onnx.ModelProto:
    builder = _Builder(rng=np.random.default_rng([seed, _WEIGHT_STREAM]))
    x = (INPUT_NAME, _images(BN_STAT_SAMPLES, seed, _BN_STATS_STREAM))
    x = builder.conv_bn("conv1", x, 64, 7, 2, "stem", relu=True)
    builder.nodes.append(
        helper.make_node(
            "MaxPool",
            [x[0]],
            ["maxpool_output"],
            name="maxpool",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        )
    )
    x = ("maxpool_output", _maxpool_3x3_s2(x[1]))
    for stage, (channels, stride) in enumerate(STAGES, start=1):
        x = builder.basic_block(f"layer{stage}.0", x, channels, stride)
        x = builder.basic_block(f"layer{stage}.1", x, channels, 1)
    builder.head(x)
    graph = helper.make_graph(
        builder.nodes,
        "resnet18",
        [
            helper.make_tensor_value_info(
                INPUT_NAME, TensorProto.FLOAT, [batch_dim, 3, IMAGE_SIZE, IMAGE_SIZE]
            )
        ],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch_dim, NUM_CLASSES])],
        initializer=builder.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="quantbench.benchmarks",
        doc_string=f"ResNet-18-shaped benchmark model, synthetic weights (seed {seed}); "
        "BatchNorm folded; input ImageNet-normalised RGB NCHW (configs/imagenet.toml)",
    )
    model.ir_version = 8  # opset 17's IR version: loadable by older onnxruntime/TensorRT too
    return model


def build_resnet18(
    path: str | os.PathLike[str], batch: int = 1, seed: int = 0, dynamic_batch: bool = False
) -> Path:
    """Write a ResNet-18-shaped FP32 ONNX model (opset 17, ~47 MB) to ``path``; return the path.

    Input ``input`` float32 [batch,3,224,224] (``dynamic_batch``: a symbolic ``N`` instead of
    ``batch``), output ``logits`` [batch,1000]. Deterministic in ``seed``. Takes a few seconds:
    the BatchNorm statistics come from a numpy reference pass (see the module docstring).
    """
    if batch < 1:
        raise QuantbenchError(f"build_resnet18: batch={batch}; use a batch size of at least 1")
    target = check_output_path(path)
    model = _build_graph(seed, "N" if dynamic_batch else batch)
    onnx.checker.check_model(model)
    write_bytes_atomic(target, model.SerializeToString())
    return target
