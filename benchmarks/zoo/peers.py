"""The corpus' peers: other tools' post-training quantization, run in a venv of their own.

Why a separate venv (``benchmarks/_work/peers-venv``, made by ``run_zoo.py --setup-peers``):
the peers pull in torch, AMD Quark and Intel Neural Compressor, whose pins fight the project's
(Quark wants ``onnx<=1.22``, Neural Compressor's ONNX SmoothQuant wants ``numpy<2``), and none of
them is a dependency of quantbench. The venv gets the very onnxruntime release of the project's
venv, so "ort SmoothQuant" differs from the "ort" group's MinMax job by SmoothQuant alone.

The peers (``run_zoo.py --jobs peers``), each a job of ``jobs.py`` run by the venv's python:

* ``ort SmoothQuant``: onnxruntime ``quantize_static`` as the ``ort`` group's MinMax job (QDQ,
  per-channel, symmetric INT8 activations and weights) with ``SmoothQuant`` (alpha 0.5). ORT
  imports Neural Compressor's ``adaptor.ox_utils.smooth_quant``, which 3.8+ no longer ship:
  3.7.1 is the newest that has it. It smooths MatMul, Gemm and non-grouped Conv whose weight is
  an initializer; a model without one is "not applicable".
* ``quark MinMax`` / ``quark AdaRound``: AMD Quark for ONNX, INT8 Q/DQ with symmetric per-tensor
  MinMax activations and symmetric per-channel MinMax weights, without and with AdaRound (Quark's
  "fast finetune": each layer's rounding learned on the calibration samples against the float
  layer's output). The pair shows what AdaRound adds to Quark's own calibration.

This module imports only the standard library at the top: ``run_zoo.py`` (project venv) uses
its setup half, ``jobs.py`` (peers venv) its job half.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

PEERS_VENV = Path(__file__).resolve().parent.parent / "_work" / "peers-venv"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
#: the newest Neural Compressor with the ONNX SmoothQuant module onnxruntime imports
INC = "neural-compressor==3.7.1"
#: what INC's ONNX code imports (its numpy<2 pin is why it goes in with --no-deps; pillow for its
#: datasets module, which no longer came in with the others on 2026-12-07)
INC_IMPORTS = ("deprecated", "schema", "prettytable", "py-cpuinfo", "pyyaml", "scikit-learn",
               "setuptools<81", "opencv-python-headless", "six", "pycocotools",
               "pillow")  # fmt: skip
QUARK = ("amd-quark==0.13", "onnx<=1.22.0")
#: the op types onnxruntime's SmoothQuant (INC's ORTSmoothQuant.transform default) acts on
SMOOTHABLE = ("MatMul", "Gemm", "Conv", "FusedConv")
ADAROUND_ITERATIONS = 1000  # Quark's own default (AdaRoundConfig.num_iterations)


# ----------------------------------------------------------------------------- setup (project venv)


def setup_peers(torch_spec: str = "torch", log: Any = print) -> Path:
    """Create the peers venv and install the peers, once (a marker file records what went in).

    ``torch_spec`` is the pip requirement for torch: plain ``torch`` from PyPI is the CUDA build
    (gigabytes of CUDA libraries, never used here); where a CPU wheel is reachable (a find-links
    folder, a local file), name it."""
    wanted = "\n".join((torch_spec, _ort_requirement(), *QUARK, INC, *INC_IMPORTS))
    marker = PEERS_VENV / ".installed"
    if marker.is_file() and marker.read_text() == wanted:
        return PEERS_PYTHON
    log(f"creating {PEERS_VENV} (torch, onnxruntime, AMD Quark, Neural Compressor)")
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    pip = [str(PEERS_PYTHON), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, torch_spec], check=True)  # first, so that nothing pulls another build
    subprocess.run([*pip, _ort_requirement(), *QUARK, _pin("torch")], check=True)
    subprocess.run([*pip, "--no-deps", INC], check=True)
    subprocess.run([*pip, *INC_IMPORTS, _pin("torch")], check=True)
    check = "import quark.onnx, neural_compressor.adaptor.ox_utils.smooth_quant"
    subprocess.run([str(PEERS_PYTHON), "-c", check], check=True, capture_output=True)
    marker.write_text(wanted)
    return PEERS_PYTHON


def _ort_requirement() -> str:
    """The project venv's onnxruntime release, so both ORT jobs quantize with the same code."""
    return f"onnxruntime=={metadata.version('onnxruntime')}"


def _pin(package: str) -> str:
    """``package==<version installed in the peers venv>``: later installs must keep it."""
    code = f"from importlib.metadata import version; print(version('{package}'))"
    found = subprocess.run([str(PEERS_PYTHON), "-c", code], check=True, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return f"{package}=={found}"


def peers_ready() -> str | None:
    """None when the peers venv is there, else the one line a FAILED cell shows."""
    if (PEERS_VENV / ".installed").is_file():
        return None
    return f"no peers venv at {PEERS_VENV}: run run_zoo.py --setup-peers"


# ----------------------------------------------------------------------------- jobs (peers venv)


class NotApplicable(Exception):
    """The peer has nothing to do on this model (reported, not a failure)."""


def smoothable_ops(model: str) -> int:
    """How many nodes onnxruntime's SmoothQuant can smooth: MatMul, Gemm or non-grouped Conv
    whose weight is an initializer (INC's ``_get_input_tensor_of_ops``); weights held in
    ``Constant`` nodes, as several exporters write them, are out of its reach."""
    import onnx

    graph = onnx.load(model, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}

    def grouped(node: Any) -> bool:
        return any(a.name == "group" and a.i > 1 for a in node.attribute)

    return sum(
        1
        for n in graph.node
        if n.op_type in SMOOTHABLE and len(n.input) > 1 and n.input[1] in inits
        and not (n.op_type in ("Conv", "FusedConv") and grouped(n))
    )  # fmt: skip


def quark_quantize(model: str, reader: Any, output: str, adaround_iterations: int) -> dict:
    """Quark INT8 Q/DQ, TensorRT's scheme (symmetric per-tensor activations, symmetric
    per-channel weights, both MinMax), with AdaRound when ``adaround_iterations`` > 0."""
    from quark.onnx import AdaRoundConfig, ModelQuantizer, QConfig
    from quark.onnx.quantization.config.spec import (
        CalibMethod,
        Int8Spec,
        QLayerConfig,
        QuantGranularity,
    )

    activation = Int8Spec(symmetric=True, calibration_method=CalibMethod.MinMax)
    weight = Int8Spec(symmetric=True, calibration_method=CalibMethod.MinMax,
                      quant_granularity=QuantGranularity.Channel)  # fmt: skip
    algorithms = []
    if adaround_iterations > 0:
        algorithms.append(AdaRoundConfig(num_iterations=adaround_iterations, learning_rate=0.1))
    config = QConfig(QLayerConfig(activation=activation, weight=weight), algo_config=algorithms)
    source, opset = at_least_opset_13(model)
    with captured_output() as log:
        ModelQuantizer(config).quantize_model(source, output, reader)
    if not Path(output).is_file():  # lac: Quark returned, logged its error and wrote nothing
        errors = re.findall(r"(?:Error|error)[^\n\x1b]*", log["text"])
        raise RuntimeError(f"Quark wrote no model ({errors[-1] if errors else 'see its log'})")
    found = {"adaround_iterations": adaround_iterations, "quark": metadata.version("amd-quark")}
    if adaround_iterations > 0:
        found["adaround_layers"] = adaround_layers(log["text"])
    if source != model:
        found["converted_from_opset"] = opset
    return found


def adaround_layers(log: str) -> dict[str, Any]:
    """How many layers Quark's fast finetune tried and how many it skipped, from its log.

    Quark skips a layer it cannot train (an error logged, "Optimizing #i module failed ...")
    and still writes a model: on mtcnn-pnet every Conv failed ("auto_pad=VALID functionality
    not implemented") and the "AdaRound" model equalled the MinMax one. A run that trained no
    layer is therefore a failure, not an AdaRound score."""
    tried = len(re.findall(r"finetuning layer \d+, torch training", log))
    skipped = len(re.findall(r"Optimizing #\d+ module failed", log))
    errors = re.findall(r"Encountered an error: ([^\n\x1b]*)", log)
    if tried and skipped == tried:
        raise RuntimeError(f"AdaRound trained none of {tried} layers (Quark skipped each: "
                           f"{errors[0] if errors else 'see its log'})")  # fmt: skip
    return {"tried": tried, "skipped": skipped, **({"first_error": errors[0]} if errors else {})}


@contextmanager
def captured_output() -> Iterator[dict[str, str]]:
    """This process' stdout and stderr (file descriptors, so C++ and logging handlers too) go
    to a file; on exit its text is in the yielded dict's ``text`` and passed on to stderr, where
    the parent keeps the tail of a failed job."""
    captured: dict[str, str] = {}
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.NamedTemporaryFile("w+b", suffix=".log", dir=Path.cwd()) as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            captured["text"] = sink.read().decode(errors="replace")
            sys.stderr.write(captured["text"])
            sys.stderr.flush()


def at_least_opset_13(model: str) -> tuple[str, int]:
    """The model, or below opset 13 a copy converted to 13 (in the working folder) and its old
    opset. Quark refuses per-channel Q/DQ below 13 ("Per-Channel support with QDQ format
    requires onnx opset version 13 or above": DequantizeLinear has no ``axis`` before), and the
    conversion is the step it asks its user for."""
    import onnx
    from onnx import version_converter

    loaded = onnx.load(model)
    opset = next((o.version for o in loaded.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model, opset
    converted = str(Path.cwd() / f"opset13-{Path(model).name}")
    onnx.save(version_converter.convert_version(loaded, 13), converted)
    return converted, opset
