"""Argmax agreement on rank-4 outputs follows their layout: ONNX convolutions are NCHW, so a map
that comes from one has its classes on axis 1 (a text detector's one-channel probability map has
none), while a transposed NHWC map keeps them last."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.metrics import (
    AgreementAccumulator,
    agreement_kind,
    channels_first_outputs,
    declared_output_kinds,
)


def _conv_model(channels: int, tail: list[str], out_shape: list) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv(3->channels) -> tail ops -> y."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["t0"], pads=[1, 1, 1, 1])]
    for i, op in enumerate(tail):
        attrs = {"perm": [0, 2, 3, 1]} if op == "Transpose" else {}
        attrs = {"axis": 1} if op == "Softmax" else attrs
        nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], **attrs))
    nodes.append(helper.make_node("Identity", [f"t{len(tail)}"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_layout_is_read_from_the_producing_op():
    assert channels_first_outputs(_conv_model(1, ["Sigmoid"], ["N", 1, 8, 8])) == {"y"}
    assert channels_first_outputs(_conv_model(5, ["Softmax"], ["N", 5, 8, 8])) == {"y"}
    nhwc = _conv_model(5, ["Transpose", "Relu"], ["N", 8, 8, 5])
    assert channels_first_outputs(nhwc) == frozenset()


def test_one_channel_probability_map_has_no_agreement():
    kinds = declared_output_kinds(_conv_model(1, ["Sigmoid"], ["N", 1, 8, 8]))
    kind, reason = kinds["y"]
    assert kind is None and "one channel" in reason
    # without the layout, the last axis (width) would have been taken for classes
    assert agreement_kind(("N", 1, 8, 8), "y")[0] == "position"


def test_segmentation_map_agreement_is_per_pixel_over_axis_1():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 5, 4, 6)).astype(np.float32)
    b = a + rng.standard_normal(a.shape).astype(np.float32) * 0.5
    acc = AgreementAccumulator(name="y", channels_first=True)
    acc.update(a, b)
    expected = (a.argmax(axis=1) == b.argmax(axis=1)).mean()  # hand-written reference
    assert acc.kind == "position"
    assert acc.metrics()["agreement"] == pytest.approx(expected)
    per_sample = (a.argmax(axis=1) == b.argmax(axis=1)).reshape(2, -1).all(axis=1).mean()
    assert acc.metrics()["sequence_agreement"] == pytest.approx(per_sample)


def test_convolutional_classifier_head_stays_a_classifier():
    assert agreement_kind((4, 10, 1, 1), "y", channels_first=True)[0] == "class"


def test_compare_does_not_report_agreement_for_a_probability_map(run_cli, tmp_path):
    model = tmp_path / "det.onnx"
    onnx.save(_conv_model(1, ["Sigmoid"], ["N", 1, 8, 8]), model)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(1).random((12, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "c.json"
    args = ["--model", model, "--data", data, "--calib-data", data, "-m", "minmax"]
    code, _, err = run_cli("compare", "fp32", "int8", *args, "--no-latency", "--json", out)
    assert code == 0, err
    row = json.loads(out.read_text())["outputs"][0]
    assert row["agreement"] is None and "one channel" in row["agreement_note"]
    code, _, err = run_cli(
        "recover", model, "--data", data, "--calib-data", data, "-m", "minmax",
        "--target", "top1_agreement=0.99", "-o", tmp_path / "rec",
    )  # fmt: skip
    assert code == 2 and "top1_agreement" in err and "one channel" in err
