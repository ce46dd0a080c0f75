"""Models quantbench cannot calibrate are refused up front, in one line, before any work: a
model another tool already quantized to integer kernels (its "FP32" reference would be INT8)
and a model whose outputs are not tensors (a classifier's ZipMap)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import synthetic
from onnx import TensorProto, helper

DYNAMIC_QUANT = "already quantized"


@pytest.fixture()
def dynamic_int8(tmp_path, cnn_path):
    """The small CNN through onnxruntime's own dynamic quantization (ConvInteger,
    DynamicQuantizeLinear): an artefact of another tool, not of quantbench."""
    from onnxruntime.quantization import quantize_dynamic

    out = tmp_path / "cnn.dyn-int8.onnx"
    quantize_dynamic(str(cnn_path), str(out), op_types_to_quantize=["Conv", "MatMul", "Gemm"])
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert ops & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}, ops
    return out


@pytest.mark.parametrize("command", ["calibrate", "quantize", "compare"])
def test_an_already_quantized_model_is_refused(run_cli, dynamic_int8, cnn_data, tmp_path, command):
    args = {
        "calibrate": ("calibrate", dynamic_int8, "--data", cnn_data, "-o", tmp_path / "t.cache"),
        "quantize": ("quantize", dynamic_int8, "--data", cnn_data, "-o", tmp_path / "q.onnx"),
        "compare": ("compare", "fp32", "int8", "--model", dynamic_int8, "--data", cnn_data),
    }[command]
    code, out, err = run_cli(*args)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "cnn.dyn-int8.onnx" in line and DYNAMIC_QUANT in line and "FP32 model" in line
    assert not (tmp_path / "t.cache").exists() and not (tmp_path / "q.onnx").exists()


def test_the_quantized_model_is_still_a_candidate_against_the_float_one(
    run_cli, dynamic_int8, cnn_path, cnn_data
):
    code, out, err = run_cli("compare", "fp32", dynamic_int8, "--model", cnn_path, "--data",
                             cnn_data, "--no-latency")  # fmt: skip
    assert code == 0, err


def _sequence_output_model() -> onnx.ModelProto:
    """x -> Relu -> y, and y also wrapped in a sequence output (as a ZipMap's list is)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("SequenceConstruct", ["y"], ["ys"]),
    ]
    graph = helper.make_graph(
        nodes,
        "seq_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_sequence_value_info("ys", TensorProto.FLOAT, None),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_with_a_sequence_output_is_refused_naming_it(run_cli, tmp_path):
    path = tmp_path / "seq.onnx"
    onnx.save(_sequence_output_model(), str(path))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(8, 4)).astype("f4"))
    code, out, err = run_cli("calibrate", path, "--data", tmp_path / "d.npz", "-o",
                             tmp_path / "t.cache")  # fmt: skip
    assert code == 2
    assert "output 'ys' is a seq(float), not a tensor" in err
    assert not (tmp_path / "t.cache").exists()


def test_float_models_pass(cnn_path):
    from quantbench.model.graph import check_float_model, open_graph

    check_float_model(open_graph(cnn_path))  # no error
    check_float_model(open_graph(synthetic.small_cnn(seed=1)))
