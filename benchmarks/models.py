"""Benchmark models built with numpy only: a ResNet-18-shaped CNN and a BERT-like encoder.

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

:func:`build_bert` is a BERT-base-like encoder (12 layers, hidden 384, 6 heads, FFN 1536; 33 M
parameters) exported the way torch exports BERT: int64 ``input_ids``/``attention_mask`` with
dynamic batch and sequence, embedding Gathers, LayerNormalization, Erf GELU, MatMul + bias Add,
softmax attention with an additive padding mask. LayerNorm keeps every block's scale, so drawn
weights suffice; a few hidden dimensions get outsized LayerNorm gains, as trained BERTs have.
:func:`make_bert_data` makes Zipf-distributed token ids of varied length, padded at the end.
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


# ============================================================================ transformer encoder

#: BERT-base-like encoder at MiniLM size: 12 layers (BERT-base's depth), hidden 384, 6 heads of
#: 64 (BERT's head size), FFN 1536, BERT's WordPiece vocabulary size. 12 layers x 8 quantized
#: MatMul inputs + the pooler's and classifier's Gemm inputs = 98 tensors in ``quantizable``.
BERT_LAYERS = 12
BERT_HIDDEN = 384
BERT_HEADS = 6
BERT_FFN = 1536
BERT_VOCAB = 30522
BERT_MAX_POSITIONS = 512
BERT_LABELS = 2
BERT_SEQUENCE = 128
BERT_LN_EPS = 1e-12
#: BERT's special token ids ([PAD], [CLS], [SEP]); ids below 1000 are [unused*] and never drawn.
PAD_ID, CLS_ID, SEP_ID, FIRST_WORD_ID = 0, 101, 102, 1000
#: trained BERTs carry a few hidden dimensions with outsized LayerNorm gain (the well-known
#: "outlier dimensions" that make activation quantization of transformers hard).
_OUTLIER_DIMS = (77, 250)
_OUTLIER_GAIN = 8.0
_TOKEN_STREAM, _BERT_WEIGHT_STREAM = 3, 4


def make_bert_data(n: int, seed: int, sequence: int = BERT_SEQUENCE) -> dict[str, np.ndarray]:
    """Token inputs for :func:`build_bert`: ``input_ids`` and ``attention_mask``, int64 [n,seq].

    Each sample is ``[CLS] w1 .. wk [SEP]`` then ``[PAD]`` to ``sequence`` (mask 1 on the real
    tokens, 0 on the padding at the end). Lengths are log-normal (median ~50 tokens, some full);
    word ids follow a Zipf law over the vocabulary's word range, as real text does. Sample ``i``
    depends only on (seed, i), so a prefix of ``n`` samples is stable.
    """
    if n < 1 or sequence < 3:
        raise QuantbenchError(f"make_bert_data: n={n}, sequence={sequence}; need n>=1, seq>=3")
    ids = np.full((n, sequence), PAD_ID, dtype=np.int64)
    mask = np.zeros((n, sequence), dtype=np.int64)
    words = BERT_VOCAB - FIRST_WORD_ID
    for index in range(n):
        rng = np.random.default_rng([seed, _TOKEN_STREAM, index])
        length = int(np.clip(round(rng.lognormal(np.log(50.0), 0.6)), 3, sequence))
        ranks = rng.zipf(1.1, size=length - 2)
        ranks = np.where(ranks > words, rng.integers(1, words + 1, size=length - 2), ranks)
        ids[index, :length] = np.concatenate([[CLS_ID], FIRST_WORD_ID + ranks - 1, [SEP_ID]])
        mask[index, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


@dataclass
class _BertBuilder:
    """Appends the encoder's nodes and initializers (no reference pass: LayerNorm keeps scales)."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)

    def const(self, name: str, array: np.ndarray | np.generic) -> str:
        """An initializer; numpy scalars stay 0-d (``np.ascontiguousarray`` would make them 1-d)."""
        array = np.asarray(array)
        self.initializers.append(numpy_helper.from_array(np.require(array, requirements="C"), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_output"], name=name, **attrs))
        return f"{name}_output"

    def dense(
        self,
        name: str,
        x: str,
        fan_in: int,
        fan_out: int,
        gain: float = 1.0,
        bias_mean: float = 0.0,
    ) -> str:
        """MatMul by an [in,out] weight, then Add of the bias: the layout of exported BERTs."""
        weight = self.rng.normal(0.0, gain / np.sqrt(fan_in), (fan_in, fan_out))
        bias = self.rng.normal(bias_mean, 0.1, fan_out)
        product = self.node(
            "MatMul", [x, self.const(f"{name}.weight", weight.astype(np.float32))], f"{name}.matmul"
        )
        return self.node(
            "Add",
            [product, self.const(f"{name}.bias", bias.astype(np.float32))],
            f"{name}.bias_add",
        )

    def layer_norm(self, name: str, x: str) -> str:
        gamma = np.exp(self.rng.normal(0.0, 0.2, BERT_HIDDEN))
        gamma[list(_OUTLIER_DIMS)] *= _OUTLIER_GAIN
        beta = self.rng.normal(0.0, 0.1, BERT_HIDDEN)
        return self.node(
            "LayerNormalization",
            [
                x,
                self.const(f"{name}.gamma", gamma.astype(np.float32)),
                self.const(f"{name}.beta", beta.astype(np.float32)),
            ],
            name,
            axis=-1,
            epsilon=BERT_LN_EPS,
        )

    def heads(self, name: str, x: str, perm: list[int]) -> str:
        """[B,S,H] -> [B,S,heads,64] -> transposed by ``perm``."""
        shape = self.const(f"{name}.shape", np.array([0, 0, BERT_HEADS, -1], dtype=np.int64))
        split = self.node("Reshape", [x, shape], f"{name}.reshape")
        return self.node("Transpose", [split], f"{name}.transpose", perm=perm)

    def gelu(self, name: str, x: str) -> str:
        """GELU in its Erf form, as torch exports it: x * 0.5 * (1 + erf(x / sqrt 2))."""
        scaled = self.node(
            "Div", [x, self.const(f"{name}.sqrt2", np.float32(np.sqrt(2.0)))], f"{name}.div"
        )
        erf = self.node("Erf", [scaled], f"{name}.erf")
        shifted = self.node("Add", [erf, self.const(f"{name}.one", np.float32(1.0))], f"{name}.add")
        product = self.node("Mul", [x, shifted], f"{name}.mul")
        return self.node(
            "Mul", [product, self.const(f"{name}.half", np.float32(0.5))], f"{name}.mul_half"
        )

    def attention(self, name: str, x: str, mask: str) -> str:
        """Softmax self-attention; Q and K weights scaled so scores have a spread of ~2."""
        query = self.heads(
            f"{name}.q",
            self.dense(f"{name}.query", x, BERT_HIDDEN, BERT_HIDDEN, gain=1.4),
            [0, 2, 1, 3],
        )
        key = self.heads(
            f"{name}.k",
            self.dense(f"{name}.key", x, BERT_HIDDEN, BERT_HIDDEN, gain=1.4),
            [0, 2, 3, 1],
        )
        value = self.heads(
            f"{name}.v", self.dense(f"{name}.value", x, BERT_HIDDEN, BERT_HIDDEN), [0, 2, 1, 3]
        )
        scores = self.node("MatMul", [query, key], f"{name}.scores")
        head_size = BERT_HIDDEN // BERT_HEADS
        scaled = self.node(
            "Div",
            [scores, self.const(f"{name}.scale", np.float32(np.sqrt(head_size)))],
            f"{name}.scaled",
        )
        masked = self.node("Add", [scaled, mask], f"{name}.masked")
        probs = self.node("Softmax", [masked], f"{name}.softmax", axis=-1)
        context = self.node("MatMul", [probs, value], f"{name}.context")
        merged = self.node("Transpose", [context], f"{name}.merge_transpose", perm=[0, 2, 1, 3])
        shape = self.const(f"{name}.merge_shape", np.array([0, 0, BERT_HIDDEN], dtype=np.int64))
        merged = self.node("Reshape", [merged, shape], f"{name}.merge")
        out = self.dense(f"{name}.output", merged, BERT_HIDDEN, BERT_HIDDEN)
        return self.layer_norm(f"{name}.ln", self.node("Add", [out, x], f"{name}.residual"))

    def encoder_layer(self, name: str, x: str, mask: str) -> str:
        x = self.attention(f"{name}.attention", x, mask)
        inner = self.gelu(
            f"{name}.gelu",
            self.dense(f"{name}.intermediate", x, BERT_HIDDEN, BERT_FFN, bias_mean=-0.5),
        )
        out = self.dense(f"{name}.output", inner, BERT_FFN, BERT_HIDDEN)
        return self.layer_norm(f"{name}.ln", self.node("Add", [out, x], f"{name}.residual"))

    def embeddings(self) -> str:
        """Word Gather + position Gather (Range over the runtime sequence length) + type row."""
        words = self.rng.normal(0.0, 1.0, (BERT_VOCAB, BERT_HIDDEN)).astype(np.float32)
        positions = self.rng.normal(0.0, 0.5, (BERT_MAX_POSITIONS, BERT_HIDDEN))
        token_type = self.rng.normal(0.0, 0.5, BERT_HIDDEN).astype(np.float32)
        word = self.node(
            "Gather",
            [self.const("embeddings.word", words), "input_ids"],
            "embeddings.word_gather",
            axis=0,
        )
        shape = self.node("Shape", ["input_ids"], "embeddings.shape")
        length = self.node(
            "Gather",
            [shape, self.const("embeddings.seq_axis", np.int64(1))],
            "embeddings.seq_len",
            axis=0,
        )
        index = self.node(
            "Range",
            [
                self.const("embeddings.zero", np.int64(0)),
                length,
                self.const("embeddings.step", np.int64(1)),
            ],
            "embeddings.range",
        )
        position = self.node(
            "Gather",
            [self.const("embeddings.position", positions.astype(np.float32)), index],
            "embeddings.position_gather",
            axis=0,
        )
        summed = self.node("Add", [word, position], "embeddings.add_position")
        summed = self.node(
            "Add", [summed, self.const("embeddings.token_type", token_type)], "embeddings.add_type"
        )
        return self.layer_norm("embeddings.ln", summed)

    def extended_mask(self) -> str:
        """[B,S] int64 mask -> additive [B,1,1,S] float: 0 on tokens, -10000 on padding."""
        mask = self.node("Cast", ["attention_mask"], "mask.cast", to=TensorProto.FLOAT)
        inverted = self.node("Sub", [self.const("mask.one", np.float32(1.0)), mask], "mask.sub")
        scaled = self.node(
            "Mul", [inverted, self.const("mask.min", np.float32(-10000.0))], "mask.mul"
        )
        return self.node(
            "Unsqueeze",
            [scaled, self.const("mask.axes", np.array([1, 2], dtype=np.int64))],
            "mask.unsqueeze",
        )

    def head(self, x: str) -> None:
        """BERT pooler ([CLS] -> Gemm -> Tanh) and a classifier Gemm to ``logits``."""
        first = self.node(
            "Gather", [x, self.const("pooler.cls", np.int64(0))], "pooler.cls_gather", axis=1
        )
        for name, fan_out in (("pooler.dense", BERT_HIDDEN), ("classifier", BERT_LABELS)):
            weight = self.rng.normal(0.0, 1.0 / np.sqrt(BERT_HIDDEN), (fan_out, BERT_HIDDEN))
            bias = self.rng.normal(0.0, 0.1, fan_out)
            out = [OUTPUT_NAME] if name == "classifier" else [f"{name}_output"]
            self.nodes.append(
                helper.make_node(
                    "Gemm",
                    [
                        first,
                        self.const(f"{name}.weight", weight.astype(np.float32)),
                        self.const(f"{name}.bias", bias.astype(np.float32)),
                    ],
                    out,
                    name=name,
                    transB=1,
                )
            )
            if name == "pooler.dense":
                first = self.node("Tanh", [out[0]], "pooler.tanh")


def build_bert(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write a BERT-base-like FP32 encoder (opset 17, ~135 MB) to ``path``; return the path.

    Inputs ``input_ids`` and ``attention_mask`` int64 [batch,sequence] (both dynamic); outputs
    ``last_hidden_state`` [batch,sequence,384] and ``logits`` [batch,2]. Embedding Gathers,
    LayerNormalization, Erf GELU, softmax attention with the additive padding mask, BERT's
    pooler. Deterministic in ``seed``; weights are drawn, nothing is downloaded.
    """
    target = check_output_path(path)
    builder = _BertBuilder(rng=np.random.default_rng([seed, _BERT_WEIGHT_STREAM]))
    mask = builder.extended_mask()
    x = builder.embeddings()
    for layer in range(BERT_LAYERS):
        x = builder.encoder_layer(f"encoder.layer{layer}", x, mask)
    builder.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    builder.head(x)
    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        builder.nodes,
        "bert",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, dims)
            for name in ("input_ids", "attention_mask")
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, [*dims, BERT_HIDDEN]
            ),
            helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", BERT_LABELS]),
        ],
        initializer=builder.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="quantbench.benchmarks",
        doc_string=f"BERT-base-like encoder ({BERT_LAYERS} layers, hidden {BERT_HIDDEN}, "
        f"{BERT_HEADS} heads), synthetic weights (seed {seed})",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_bytes_atomic(target, model.SerializeToString())
    return target
