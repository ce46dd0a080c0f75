"""Regenerate quantbench's bundled example: a tiny CNN with a runtime-weight depthwise convolution.

The model is what makes quantbench's demo and tests interesting: besides ordinary Conv (BatchNorm
folded) + ReLU layers, a residual Add, a MaxPool, an AveragePool and a final Gemm (transB=1), it has
a *dynamic-weight* depthwise convolution. A small hypernetwork (GlobalAveragePool -> Gemm ->
Reshape) computes a [C,1,3,3] kernel from each sample's own features, and an ONNX ``Conv``
(group=C) applies it with that runtime tensor as its weight input. TensorRT imports such a Conv as
"ConvMultiInput" (reference doc section 4.3); quantbench must give it per-tensor Q/DQ on the
kernel, not the per-channel weight treatment of a constant kernel.

Static batch of 1: an ONNX ``Conv`` weight has no batch axis, so one computed kernel serves one
sample. The exported model therefore has input ``image`` [1,3,32,32] and output ``logits``
[1,num_classes]; training uses a batched equivalent (all samples' kernels stacked into one grouped
convolution). The batched case at inference time is what quantbench's DWConv2D plugin handles.

The task is synthetic and generated here (no downloads): 32x32 RGB images of six procedurally drawn
shape classes with random colours, position, size, rotation, clutter and noise, so that the model
is good (~92 %) but not perfect.

Outputs (committed, so torch is needed only to regenerate them):
  examples/tinycnn/tinycnn.onnx       opset 17, constant weights as initializers
  examples/tinycnn/calib.npz          key "image": float32 [256,3,32,32], preprocessed model inputs
  examples/tinycnn/eval.npz           key "image": float32 [500,3,32,32], held out
  examples/tinycnn/eval_labels.npy    int64 [500]
  examples/tinycnn/images/*.png       the first 16 eval samples as 32x32 RGB PNGs
  examples/tinycnn/README.md
  configs/tinycnn.toml                preprocessing preset: PNG -> model input, matches training

Regenerate (CPU torch from the local wheel; about two minutes on 2 cores):
  .venv/bin/pip install torch==2.13.0
  .venv/bin/python examples/make_example.py

Deterministic: fixed seeds and a fixed thread count give the same arrays, PNGs and weights for the
same torch/numpy versions.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from PIL import Image
from torch import nn

from quantbench.fileio import write_bytes_atomic, write_text_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("circle", "ring", "square", "triangle", "cross", "stripes")
IMAGE_SIZE = 32
SUPERSAMPLE = 2  # shapes are drawn at 2x and box-filtered down: anti-aliased edges
N_TRAIN, N_CALIB, N_EVAL, N_PNG = 8000, 256, 500, 16
SEED = 20240611
OPSET = 17
DYNAMIC_CONV_NODE = "/dynamic_dw/Conv"


# ----------------------------------------------------------------------------- synthetic data


def _shape_mask(
    cls: str, u: np.ndarray, v: np.ndarray, size: float, rng: np.random.Generator
) -> np.ndarray:
    """Boolean mask of one shape in rotated, centred coordinates (u, v) of the supersampled grid."""
    radius = np.hypot(u, v)
    if cls == "circle":
        return radius < size
    if cls == "ring":
        return (radius < size) & (radius > size * rng.uniform(0.45, 0.65))
    if cls == "square":
        return np.maximum(np.abs(u), np.abs(v)) < size * 0.8
    if cls == "triangle":
        # Equilateral triangle: three half-planes at 120 degrees, inradius size/2.
        inside = np.ones_like(u, dtype=bool)
        for angle in (np.pi / 2, np.pi / 2 + 2 * np.pi / 3, np.pi / 2 + 4 * np.pi / 3):
            inside &= u * np.cos(angle) + v * np.sin(angle) < size * 0.5
        return inside
    if cls == "cross":
        arm = size * rng.uniform(0.22, 0.32)
        return ((np.abs(u) < arm) & (np.abs(v) < size)) | ((np.abs(v) < arm) & (np.abs(u) < size))
    if cls == "stripes":
        period = size * rng.uniform(0.45, 0.6)
        in_patch = np.maximum(np.abs(u), np.abs(v)) < size * 0.85
        return in_patch & (np.mod(u, period) < period * 0.5)
    raise ValueError(f"unknown class {cls}")


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.0, 1.0, size=3)


def _draw_sample(cls: str, rng: np.random.Generator) -> np.ndarray:
    """One uint8 HWC image: gradient background, clutter blobs, the shape, then noise."""
    n = IMAGE_SIZE * SUPERSAMPLE
    ys, xs = np.mgrid[0:n, 0:n].astype(np.float64) / SUPERSAMPLE
    background = _random_colour(rng)
    gradient = rng.normal(0.0, 0.15, size=(2, 3))
    canvas = background + (xs[..., None] / IMAGE_SIZE - 0.5) * gradient[0]
    canvas = canvas + (ys[..., None] / IMAGE_SIZE - 0.5) * gradient[1]
    for _ in range(rng.integers(0, 4)):  # clutter: small soft blobs that are not the target
        cy, cx = rng.uniform(0, IMAGE_SIZE, size=2)
        blob = np.hypot(ys - cy, xs - cx) < rng.uniform(1.0, 3.0)
        canvas[blob] = _random_colour(rng)
    foreground = _random_colour(rng)
    while np.abs(foreground - background).max() < 0.25:  # keep the shape visible, barely at times
        foreground = _random_colour(rng)
    size = rng.uniform(5.0, 11.0)
    cy, cx = rng.uniform(size * 0.7, IMAGE_SIZE - size * 0.7, size=2)
    theta = rng.uniform(0, 2 * np.pi)
    u = (xs - cx) * np.cos(theta) + (ys - cy) * np.sin(theta)
    v = -(xs - cx) * np.sin(theta) + (ys - cy) * np.cos(theta)
    canvas[_shape_mask(cls, u, v, size, rng)] = foreground
    image = canvas.reshape(IMAGE_SIZE, SUPERSAMPLE, IMAGE_SIZE, SUPERSAMPLE, 3).mean(axis=(1, 3))
    image = image + rng.normal(0.0, rng.uniform(0.02, 0.12), size=image.shape)
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)


def make_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` balanced samples: uint8 images [n,32,32,3] (exactly what the PNGs hold) and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(CLASSES)).astype(np.int64)
    images = np.stack([_draw_sample(CLASSES[label], rng) for label in labels])
    return images, labels


@dataclass(frozen=True)
class Normalisation:
    """Per-channel mean/std in [0,1] units: model input = (pixel / 255 - mean) / std, NCHW."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def fit(cls, images: np.ndarray) -> Normalisation:
        """Training-set statistics, rounded so that the TOML preset states them exactly."""
        pixels = images.reshape(-1, 3).astype(np.float64) / 255.0
        mean_r, mean_g, mean_b = (round(float(m), 3) for m in pixels.mean(axis=0))
        std_r, std_g, std_b = (round(float(s), 3) for s in pixels.std(axis=0))
        return cls(mean=(mean_r, mean_g, mean_b), std=(std_r, std_g, std_b))

    def apply(self, images: np.ndarray) -> np.ndarray:
        scaled = images.astype(np.float32) * np.float32(1.0 / 255.0)
        normalised = (scaled - np.float32(self.mean)) / np.float32(self.std)
        return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2), dtype=np.float32)


# ----------------------------------------------------------------------------- model


class DynamicDepthwise(nn.Module):
    """Depthwise 3x3 conv whose kernel a hypernetwork computes from the sample's pooled features."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.hyper = nn.Linear(channels, channels * 9)
        nn.init.normal_(self.hyper.weight, std=0.02)
        nn.init.normal_(self.hyper.bias, std=(2.0 / 9.0) ** 0.5 * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.hyper(torch.flatten(self.pool(x), 1))  # [B, C*9]
        if torch.onnx.is_in_onnx_export():  # batch 1: one Conv, group=C, weight = runtime tensor
            weight = kernel.reshape(self.channels, 1, 3, 3)
            return F.conv2d(x, weight, padding=1, groups=self.channels)
        # Any batch: every sample's kernel at once, as one grouped conv over [1, B*C, H, W].
        batch, _, height, width = x.shape
        stacked = x.reshape(1, batch * self.channels, height, width)
        weight = kernel.reshape(batch * self.channels, 1, 3, 3)
        out = F.conv2d(stacked, weight, padding=1, groups=batch * self.channels)
        return out.reshape(batch, self.channels, height, width)


def _conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out))


class TinyCNN(nn.Module):
    """32x32 -> stem -> residual block -> MaxPool -> conv -> dynamic DW block -> AvgPool -> head."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 16)
        self.block_conv1 = _conv_bn(16, 16)
        self.block_conv2 = _conv_bn(16, 16)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = _conv_bn(16, 32)
        self.dynamic_dw = DynamicDepthwise(32)
        self.pool2 = nn.AvgPool2d(2)
        self.conv3 = _conv_bn(32, 64)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = F.relu(x + self.block_conv2(F.relu(self.block_conv1(x))))  # residual Add after a conv
        x = self.pool1(x)
        x = F.relu(self.conv2(x))
        x = F.relu(x + self.dynamic_dw(x))  # residual Add after the runtime-kernel conv
        x = self.pool2(x)
        x = F.relu(self.conv3(x))
        return self.fc(torch.flatten(self.gap(x), 1))


def fold_batchnorm(model: TinyCNN) -> TinyCNN:
    """Replace every Conv+BN pair by one Conv with bias (the eval-mode function, exactly)."""
    for name in ("stem", "block_conv1", "block_conv2", "conv2", "conv3"):
        conv, bn = getattr(model, name)
        setattr(model, name, torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn))
    return model


# ----------------------------------------------------------------------------- training


def train(
    model: TinyCNN,
    inputs: np.ndarray,
    labels: np.ndarray,
    epochs: int,
    max_lr: float,
    log: Callable[[str], None],
) -> None:
    """Adam + one-cycle LR, light augmentation (flips, which keep every class's identity)."""
    generator = torch.Generator().manual_seed(SEED)
    x_all = torch.from_numpy(inputs)
    y_all = torch.from_numpy(labels)
    batch_size = 64
    steps = epochs * (len(x_all) // batch_size)
    optimiser = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=max_lr, total_steps=steps)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(x_all), generator=generator)
        correct, seen = 0, 0
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            x, y = x_all[index], y_all[index]
            flip = torch.rand(len(x), generator=generator) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
        log(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}, train acc {correct / seen:.3f}")


# ----------------------------------------------------------------------------- export


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """Move every ``Constant`` node's value into an initializer: all constants look alike."""
    graph = model.graph
    kept = []
    for node in graph.node:
        if (
            node.op_type == "Constant"
            and len(node.attribute) == 1
            and node.attribute[0].name == "value"
        ):
            tensor = numpy_helper.to_array(node.attribute[0].t)
            graph.initializer.append(numpy_helper.from_array(tensor, node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)


def export_onnx(model: TinyCNN, norm: Normalisation) -> onnx.ModelProto:
    """Legacy (TorchScript) exporter: opset 17 directly, constant folding, readable node names."""
    model.eval()
    buffer = io.BytesIO()
    example = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    torch.onnx.export(
        model,
        (example,),
        buffer,
        dynamo=False,
        opset_version=OPSET,
        do_constant_folding=True,
        input_names=["image"],
        output_names=["logits"],
    )
    onnx_model = onnx.load_from_string(buffer.getvalue())
    _constants_to_initializers(onnx_model)
    for node in onnx_model.graph.node:
        node.doc_string = ""
    onnx_model.doc_string = (
        "quantbench example: tiny CNN with a runtime-weight depthwise Conv "
        f"({DYNAMIC_CONV_NODE}); static batch 1; regenerate with examples/make_example.py"
    )
    metadata = {
        "classes": json.dumps(list(CLASSES)),
        "preprocessing": "configs/tinycnn.toml",
        "mean": json.dumps(list(norm.mean)),
        "std": json.dumps(list(norm.std)),
        "dynamic_conv_node": DYNAMIC_CONV_NODE,
    }
    del onnx_model.metadata_props[:]
    for key, value in metadata.items():
        onnx_model.metadata_props.add(key=key, value=value)
    onnx_model = onnx.shape_inference.infer_shapes(onnx_model, strict_mode=True)
    onnx.checker.check_model(onnx_model, full_check=True)
    _check_dynamic_conv(onnx_model)
    return onnx_model


def _check_dynamic_conv(model: onnx.ModelProto) -> None:
    """The export must keep exactly one Conv whose kernel is a runtime tensor, and it is ours."""
    constants = {init.name for init in model.graph.initializer}
    dynamic = [n for n in model.graph.node if n.op_type == "Conv" and n.input[1] not in constants]
    if [n.name for n in dynamic] != [DYNAMIC_CONV_NODE]:
        raise RuntimeError(f"expected one dynamic Conv {DYNAMIC_CONV_NODE}, got {dynamic}")


def onnx_accuracy(model: onnx.ModelProto, inputs: np.ndarray, labels: np.ndarray) -> float:
    """FP32 accuracy with onnxruntime, one sample at a time (the model's batch is 1)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    predictions = [
        int(session.run(["logits"], {"image": sample[None]})[0].argmax()) for sample in inputs
    ]
    return float(np.mean(np.asarray(predictions) == labels))


# ----------------------------------------------------------------------------- outputs


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def preset_toml(norm: Normalisation) -> str:
    """configs/tinycnn.toml: how a 32x32 PNG becomes the model input (what training used)."""
    mean = ", ".join(f"{m}" for m in norm.mean)
    std = ", ".join(f"{s}" for s in norm.std)
    return f"""\
# Preprocessing preset for examples/tinycnn/tinycnn.onnx (written by examples/make_example.py).
# input = (pixel * scale - mean) / std per RGB channel, NCHW, float32; mean/std are in [0,1] units
# (after scaling) and are the training set's statistics. The bundled PNGs are already 32x32.
[input]
name = "image"
layout = "NCHW"
colour = "RGB"
resize = [{IMAGE_SIZE}, {IMAGE_SIZE}]
scale = 0.00392156862745098  # 1/255
mean = [{mean}]
std = [{std}]
dtype = "float32"
"""


def readme(accuracy: float, node_counts: dict[str, int], model_bytes: int) -> str:
    ops = ", ".join(f"{op} {count}" for op, count in sorted(node_counts.items()))
    return f"""\
# tinycnn: the bundled example model

A small CNN ({model_bytes // 1024} KB) classifying 32x32 RGB images of {len(CLASSES)} synthetic
shape classes ({", ".join(CLASSES)}), drawn with random colours,
position, size, rotation, clutter and noise.

What makes it useful for quantbench: besides Conv (BatchNorm folded) + ReLU, a residual Add,
MaxPool, AveragePool and a final Gemm (transB=1), it has a **runtime-weight depthwise
convolution**, node `{DYNAMIC_CONV_NODE}`: a hypernetwork (GlobalAveragePool -> Gemm -> Reshape)
computes a [32,1,3,3] kernel from the sample's features, and `Conv` (group=32) takes that tensor as
its weight. TensorRT imports it as *ConvMultiInput*; it needs per-tensor Q/DQ on the kernel.

- Input `image` float32 [1,3,32,32] (static batch 1: a Conv weight has no batch axis; the DWConv2D
  plugin covers the batched case), output `logits` float32 [1,{len(CLASSES)}].
- Nodes: {ops}.
  All constant weights are initializers.
- Preprocessing: `configs/tinycnn.toml` (x / 255, per-channel mean/std, NCHW).
- FP32 accuracy (onnxruntime) on `eval.npz`: **{accuracy:.3f}** ({N_EVAL} samples).

Files: `tinycnn.onnx` (opset {OPSET}), `calib.npz` (key `image`, float32 [{N_CALIB},3,32,32],
preprocessed), `eval.npz` (key `image`, float32 [{N_EVAL},3,32,32]), `eval_labels.npy` (int64
[{N_EVAL}], index into the class list above, also in the model's `classes` metadata),
`images/NNN_<class>.png` (the first {N_PNG} eval samples; the preset turns each into exactly
`eval.npz["image"][NNN]`).

Made by `examples/make_example.py` with torch {torch.__version__} (about two minutes on 2 CPU
cores; deterministic: same seeds, thread count and versions give the same files):

    .venv/bin/pip install torch==2.13.0
    .venv/bin/python examples/make_example.py
"""


def node_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "examples" / "tinycnn")
    parser.add_argument("--preset", type=Path, default=REPO_ROOT / "configs" / "tinycnn.toml")
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--max-lr", type=float, default=1e-2)
    parser.add_argument("--threads", type=int, default=2, help="fixed for reproducible training")
    args = parser.parse_args()

    started = time.perf_counter()
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    train_images, train_labels = make_split(N_TRAIN, SEED)
    calib_images, _ = make_split(N_CALIB, SEED + 1)
    eval_images, eval_labels = make_split(N_EVAL, SEED + 2)
    norm = Normalisation.fit(train_images)
    log(f"data: {N_TRAIN} train, {N_CALIB} calib, {N_EVAL} eval; mean {norm.mean} std {norm.std}")

    model = TinyCNN(len(CLASSES))
    train(model, norm.apply(train_images), train_labels, args.epochs, args.max_lr, log)
    model.eval()
    eval_inputs = norm.apply(eval_images)
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(eval_inputs)).numpy()  # batched training form
    onnx_model = export_onnx(fold_batchnorm(model), norm)
    accuracy = onnx_accuracy(onnx_model, eval_inputs, eval_labels)
    torch_accuracy = float(np.mean(torch_logits.argmax(1) == eval_labels))
    log(f"FP32 eval accuracy: onnxruntime {accuracy:.4f}, torch (batched) {torch_accuracy:.4f}")
    if abs(accuracy - torch_accuracy) > 1.0 / N_EVAL:
        raise RuntimeError("exported model disagrees with the trained one; export is broken")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "images").mkdir(exist_ok=True)
    model_bytes = onnx_model.SerializeToString()
    write_bytes_atomic(args.out / "tinycnn.onnx", model_bytes)
    write_bytes_atomic(args.out / "calib.npz", _npz_bytes(image=norm.apply(calib_images)))
    write_bytes_atomic(args.out / "eval.npz", _npz_bytes(image=eval_inputs))
    write_bytes_atomic(args.out / "eval_labels.npy", _npy_bytes(eval_labels))
    for index in range(N_PNG):
        name = f"{index:03d}_{CLASSES[eval_labels[index]]}.png"
        write_bytes_atomic(args.out / "images" / name, _png_bytes(eval_images[index]))
    write_text_atomic(args.preset, preset_toml(norm))
    counts = node_counts(onnx_model)
    write_text_atomic(args.out / "README.md", readme(accuracy, counts, len(model_bytes)))
    log(f"wrote {args.out} ({len(model_bytes)} B model) and {args.preset}; nodes {counts}")


if __name__ == "__main__":
    main()
