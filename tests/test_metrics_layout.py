"""Argmax agreement on rank-4 outputs follows their layout: ONNX convolutions are NCHW, so a map
that comes from one has its classes on axis 1 (a text detector's one-channel probability map has
none), while a transposed NHWC map keeps them last."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.choose.autocalib import _judged_sqnr, judge_description
from quantbench.evaluate.metrics import (
    AgreementAccumulator,
    OutputLayout,
    OutputsAccumulator,
    agreement_kind,
    declared_output_kinds,
)
from quantbench.evaluate.outputaxes import channels_first_outputs, class_axis_doubts, concat_parts


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


def test_channels_no_softmax_made_classes_have_no_agreement():
    """CRAFT: y = Conv -> [1, 2, H, W], a text-score and a link-score heatmap, each thresholded
    on its own; an argmax over its two channels gave 'agreement 27%' as the report's headline
    where the masks agreed to 0.99 IoU. Only a softmax over the channels makes them classes,
    also before an upsampling (a segmentation head)."""
    heatmaps = declared_output_kinds(_conv_model(2, ["Relu"], ["N", 2, 8, 8]))
    kind, reason = heatmaps["y"]
    assert kind is None and "no softmax" in reason
    classes = declared_output_kinds(_conv_model(5, ["Softmax"], ["N", 5, 8, 8]))
    assert classes["y"][0] == "position"
    upsampled = _conv_model(5, ["Softmax"], ["N", 5, 16, 16])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    upsampled.graph.initializer.append(scales)
    last = upsampled.graph.node[-1]  # Identity(t1) -> y becomes Resize(t1, '', scales) -> y
    upsampled.graph.node.remove(last)
    upsampled.graph.node.append(helper.make_node("Resize", ["t1", "", "scales"], ["y"]))
    assert declared_output_kinds(upsampled)["y"][0] == "position"


def test_convolutional_classifier_head_stays_a_classifier():
    assert agreement_kind((4, 10, 1, 1), "y", channels_first=True)[0] == "class"


def test_compare_does_not_report_agreement_for_a_probability_map(run_cli, tmp_path):
    x = np.random.default_rng(1).random((12, 3, 8, 8)).astype(np.float32)
    row = _compare_row(run_cli, tmp_path, _conv_model(1, ["Sigmoid"], ["N", 1, 8, 8]), x)
    assert row["agreement"] is None and "one channel" in row["agreement_note"]
    model, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    code, _, err = run_cli(
        "recover", model, "--data", data, "--calib-data", data, "-m", "minmax",
        "--target", "top1_agreement=0.99", "-o", tmp_path / "rec",
    )  # fmt: skip
    assert code == 2 and "top1_agreement" in err and "one channel" in err


def _graph_of(nodes: list, x_shape: list, y_shape: list, inits: dict) -> onnx.ModelProto:
    """x -> ``nodes`` (op, inputs, output[, attributes]) -> y; ``inits``: float32 arrays, or
    int64 ones for shapes and axes."""
    made = [
        helper.make_node(op, ins, [out], **(extra[0] if extra else {}))
        for op, ins, out, *extra in nodes
    ]
    graph = helper.make_graph(
        made,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _compare_row(run_cli, tmp_path, model: onnx.ModelProto, x: np.ndarray) -> dict:
    """``compare fp32 int8`` (minmax) of ``model`` on ``x`` (also its calibration data): the
    JSON row of its first output. The files stay as ``m.onnx`` and ``d.npz`` in ``tmp_path``."""
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "c.json"
    onnx.save(model, path)
    np.savez(data, x=x)
    args = ["--model", path, "--data", data, "--calib-data", data, "-m", "minmax"]
    code, _, err = run_cli("compare", "fp32", "int8", *args, "--no-latency", "--json", out)
    assert code == 0, err
    return json.loads(out.read_text())["outputs"][0]


SEQ, IMAGE = ["N", 6, 8], ["N", 3, 8, 8]


W = {"w": np.ones((8, 5), np.float32), "v": np.ones((8, 3), np.float32)}


@pytest.mark.parametrize(
    ("nodes", "shape", "doubt"),
    [
        # a CTC/token head: MatMul features, then a softmax over them
        ([("MatMul", ["x", "w"], "t"), ("Softmax", ["t"], "y", {"axis": -1})], [0, 6, 5], ""),
        ([("MatMul", ["x", "w"], "t"), ("Add", ["t", "b"], "y")], [0, 6, 5], ""),
        # a softmax over the time axis says nothing of the last one; the MatMul under it does
        ([("MatMul", ["x", "w"], "t"), ("Softmax", ["t"], "y", {"axis": 1})], [0, 6, 5], ""),
        # two heads side by side along the last axis (YOLOv5: boxes | objectness | classes)
        ([("MatMul", ["x", "w"], "a"), ("MatMul", ["x", "v"], "c"),
          ("Concat", ["a", "c"], "y", {"axis": -1})], [0, 6, 8], "Concat along it"),
        # ... and along another axis: the last one is still the MatMuls' features
        ([("MatMul", ["x", "w"], "a"), ("MatMul", ["x", "w"], "c"),
          ("Concat", ["a", "c"], "y", {"axis": 1})], [0, 12, 5], ""),
        # [N, features, T] (YOLOv8's anchors-last layout): the last axis is the MatMul's time
        ([("MatMul", ["x", "w"], "a"), ("Transpose", ["a"], "y", {"perm": [0, 2, 1]})],
         [0, 5, 6], "whose features are its last axis"),
        # a Transpose that moves the features last again
        ([("MatMul", ["x", "w"], "a"), ("Transpose", ["a"], "b", {"perm": [0, 2, 1]}),
          ("Transpose", ["b"], "y", {"perm": [0, 2, 1]})], [0, 6, 5], ""),
        # a CRNN's head: Linear on [N*T, H], then back to [N, T, C]: the last axis goes through
        ([("Reshape", ["x", "flat"], "f"), ("MatMul", ["f", "w"], "m"),
          ("Reshape", ["m", "seq"], "y")], [0, 6, 5], ""),
        # a reshape that splits the features: the last axis is a part of them
        ([("MatMul", ["x", "w10"], "m"), ("Reshape", ["m", "split"], "y")], [0, 6, 2, 5],
         "Reshape, which may not keep it"),
        # a hidden state or an embedding
        ([("LayerNormalization", ["x", "g"], "y", {"axis": -1})], [0, 6, 8],
         "comes from LayerNormalization"),
        ([("Identity", ["x"], "y")], [0, 6, 8], "graph input"),
    ],
)  # fmt: skip
def test_the_last_axis_holds_classes_only_by_how_it_was_made(nodes, shape, doubt):
    floats = {"b": np.zeros(5), "g": np.ones(8), "w10": np.ones((8, 10))}
    shapes = {"flat": [-1, 8], "seq": [-1, 6, 5], "split": [-1, 6, 2, 5]}
    inits = {
        **W,
        **{k: v.astype(np.float32) for k, v in floats.items()},
        **{k: np.array(v, dtype=np.int64) for k, v in shapes.items()},
    }
    model = _graph_of(nodes, SEQ, ["N", *shape[1:]], inits)
    doubts = class_axis_doubts(model)
    if doubt:
        assert doubt in doubts["y"] and doubts["y"].startswith("its last axis may not hold")
        kind, reason = declared_output_kinds(model)["y"]
        assert kind is None and doubt in reason
    else:
        assert "y" not in doubts
        assert declared_output_kinds(model)["y"][0] == "position"


def test_a_detector_head_has_no_agreement_in_compare(run_cli, tmp_path):
    """YOLO-like [N, 4 + classes, anchors]: Concat(boxes, Sigmoid(scores)) along axis 1 of
    a Reshape of a convolution. An argmax over anchors (or over box coordinates and scores)
    would be a meaningless 'agreement'; drift metrics stand."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, 6, -1], dtype=np.int64), "shape")
    starts, ends, axes = (
        numpy_helper.from_array(np.array([v], dtype=np.int64), n)
        for v, n in ((0, "s0"), (4, "e0"), (1, "ax"))
    )
    e1 = numpy_helper.from_array(np.array([6], dtype=np.int64), "e1")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["r"]),
        helper.make_node("Slice", ["r", "s0", "e0", "ax"], ["boxes"]),
        helper.make_node("Slice", ["r", "e0", "e1", "ax"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 64])],
        [w, shape, starts, ends, axes, e1],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    row = _compare_row(run_cli, tmp_path, model, rng.random((12, 3, 8, 8)).astype(np.float32))
    assert row["agreement"] is None and row["sequence_agreement"] is None
    assert "may not hold class scores" in row["agreement_note"]
    assert row["sqnr_db"] is not None


def test_the_walk_visits_each_tensor_once_in_a_residual_graph():
    """40 residual Adds over one MatMul: 2^40 paths, one tensor each level (finishes at once)."""
    nodes = [("MatMul", ["x", "w"], "t0")]
    nodes += [("Add", [f"t{i}", f"t{i}"], f"t{i + 1}") for i in range(40)]
    nodes.append(("Identity", ["t40"], "y"))
    model = _graph_of(nodes, SEQ, ["N", 6, 5], W)
    assert class_axis_doubts(model) == {}
    nodes[0] = ("Reshape", ["x", "s"], "t0")
    model = _graph_of(nodes, SEQ, ["N", 6, 5], {**W, "s": np.array([0, 6, 5], np.int64)})
    assert "Reshape, which may not keep it (through Identity, Add" in class_axis_doubts(model)["y"]


RANK2_INITS = {
    "w": np.ones((8, 5), np.float32),
    "g": np.ones(8, np.float32),
    "cw": np.ones((10, 3, 3, 3), np.float32),
    "hw": np.ones((3, 4), np.float32),
    "sq": np.array([2, 3], np.int64),
    "flat": np.array([0, -1], np.int64),
    "last": np.array([-1], np.int64),
}
CONV = ("Conv", ["x", "cw"], "c", {"pads": [1, 1, 1, 1]})


@pytest.mark.parametrize(
    ("nodes", "x_shape", "y_shape", "doubt"),
    [
        # a pooled sentence embedding: the mean over tokens of a hidden state
        ([("LayerNormalization", ["x", "g"], "h", {"axis": -1}),
          ("ReduceMean", ["h"], "y", {"axes": [1], "keepdims": 0})], SEQ, ["N", 8],
         "comes from LayerNormalization (through ReduceMean)"),
        ([("ReduceMean", ["x"], "y", {"axes": [1], "keepdims": 0})], SEQ, ["N", 8],
         "graph input (through ReduceMean)"),
        # per-frame logits averaged over time: still the MatMul's classes
        ([("MatMul", ["x", "w"], "m"), ("ReduceMean", ["m"], "y", {"axes": [1], "keepdims": 0})],
         SEQ, ["N", 5], ""),
        # ... averaged over the classes instead: the last axis left is time
        ([("MatMul", ["x", "w"], "m"), ("ReduceMean", ["m"], "y", {"axes": [2], "keepdims": 0})],
         SEQ, ["N", 6], "whose features are its last axis"),
        # logits of every step flattened into one axis (a recognizer's [1, T*C])
        ([("MatMul", ["x", "w"], "m"), ("Reshape", ["m", "flat"], "y")], SEQ, ["N", 30],
         "Reshape, which may not keep it"),
        # a softmax written out (magika, jax2tf): exp(logits - max) / sum
        ([("MatMul", ["x", "w"], "m"), ("ReduceMax", ["m"], "mx", {"axes": [-1]}),
          ("Sub", ["m", "mx"], "s"), ("Exp", ["s"], "e"),
          ("ReduceSum", ["e", "last"], "z"), ("Div", ["e", "z"], "y")],
         ["N", 8], ["N", 5], ""),
        # convolutional classifier heads: the channels of the last convolution are the classes
        ([CONV, ("GlobalAveragePool", ["c"], "p"), ("Flatten", ["p"], "y")], IMAGE, ["N", 10],
         ""),
        ([CONV, ("GlobalAveragePool", ["c"], "p"), ("Squeeze", ["p", "sq"], "y")], IMAGE,
         ["N", 10], ""),
        ([CONV, ("ReduceMean", ["c"], "y", {"axes": [2, 3], "keepdims": 0})], IMAGE, ["N", 10],
         ""),
        # a convolution's map flattened: channels and pixels in one axis
        ([CONV, ("Flatten", ["c"], "y")], IMAGE, ["N", 640], "Flatten, which may not keep it"),
        # a Linear head on [N, features]
        ([("MatMul", ["x", "w"], "y")], ["N", 8], ["N", 5], ""),
        ([("Identity", ["x"], "y")], ["N", 8], ["N", 8], "graph input"),
    ],
)  # fmt: skip
def test_a_rank2_output_holds_classes_only_by_how_it_was_made(nodes, x_shape, y_shape, doubt):
    """Rank-2 outputs ``[N, C]`` are judged as the last axis of longer ones: a pooled
    embedding or flattened logits get no agreement, classifiers (Linear, convolutional and
    written-out-softmax heads) keep theirs."""
    model = _graph_of(nodes, x_shape, y_shape, RANK2_INITS)
    onnx.checker.check_model(model, full_check=True)
    kind, reason = declared_output_kinds(model)["y"]
    if doubt:
        assert kind is None and doubt in reason, reason
    else:
        assert kind == "class", reason


def test_compare_reports_no_agreement_for_a_pooled_embedding(run_cli, tmp_path):
    """A sentence-embedding-like model ``[N, T, 8] -> LayerNorm -> mean over T -> [N, 8]``:
    no top-1 'agreement' over embedding dimensions, with the reason; drift metrics stand."""
    nodes = [
        ("MatMul", ["x", "w8"], "m"),
        ("LayerNormalization", ["m", "g"], "h", {"axis": -1}),
        ("ReduceMean", ["h"], "y", {"axes": [1], "keepdims": 0}),
    ]
    rng = np.random.default_rng(1)
    inits = {"w8": rng.standard_normal((8, 8)).astype(np.float32), "g": np.ones(8, np.float32)}
    model = _graph_of(nodes, SEQ, ["N", 8], inits)
    row = _compare_row(run_cli, tmp_path, model, rng.standard_normal((12, 6, 8)).astype(np.float32))
    assert row["agreement"] is None and row["top5_agreement"] is None
    assert "comes from LayerNormalization (through ReduceMean)" in row["agreement_note"]
    assert row["cosine"] is not None and row["sqnr_db"] is not None


def _crnn_head(target: list) -> onnx.ModelProto:
    """x[T, N, 8] -> Reshape [-1, 8] -> Linear (5 classes) -> Reshape to ``target`` built at
    run time from x's shape (-1: the rest), as PyTorch exports ``y.view(T, b, -1)``."""
    pick = {"T": 0, "N": 1}
    nodes = [
        ("Shape", ["x"], "shape"),
        ("Reshape", ["x", "rows"], "r"),
        ("MatMul", ["r", "w"], "m"),
    ]
    parts = []
    for i, dim in enumerate(target):
        if dim == -1:
            parts.append("minus1")
            continue
        nodes += [
            ("Gather", ["shape", f"i{pick[dim]}"], f"g{i}", {"axis": 0}),
            ("Unsqueeze", [f"g{i}", "zero"], f"u{i}"),
        ]
        parts.append(f"u{i}")
    nodes += [("Concat", parts, "target", {"axis": 0}), ("Reshape", ["m", "target"], "y")]
    inits = {
        "w": np.ones((8, 5), np.float32),
        "rows": np.array([-1, 8], np.int64),
        "minus1": np.array([-1], np.int64),
        "zero": np.array([0], np.int64),
        "i0": np.array(0, np.int64),
        "i1": np.array(1, np.int64),
    }
    return _graph_of(nodes, ["T", "N", 8], [f"d{i}" for i in range(len(target))], inits)


def test_a_run_time_reshape_keeps_the_classes_only_if_the_run_shows_their_size():
    """Only the run tells whether ``-1`` is the Linear's 5 classes: ``[T, N, -1]`` is, and gets
    per-position agreement; ``[T, -1]`` (each step's N x 5 scores in one axis) is not."""
    per_step = OutputLayout.of(_crnn_head(["T", "N", -1]))
    assert per_step.kind(("T", "N", "d2"), "y")[0] == "unknown"  # declared: ask the data
    assert per_step.kind((6, 2, 5), "y") == ("position", "")
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 2, 5)).astype(np.float32)
    acc = per_step.accumulator("y")
    acc.update(a, a + 0.3 * rng.standard_normal(a.shape).astype(np.float32))
    assert acc.kind == "position" and acc.metrics()["agreement"] is not None
    flattened = OutputLayout.of(_crnn_head(["T", -1]))
    kind, reason = flattened.kind((6, 10), "y")
    assert kind is None and "keeps it only if its size is 5" in reason
    acc = flattened.accumulator("y")
    acc.update(a.reshape(6, 10), a.reshape(6, 10))
    assert acc.metrics()["agreement"] is None and "size is 5" in acc.note()


def test_a_time_major_output_counts_sequences_per_sample():
    """A CTC recognizer exported time-major, ``[T, N, C]``: a sequence is one sample's steps
    (axis 1), as the feed's size shows (T=5 steps, N=3 samples) or, without it, as the graph
    declares the batch axis."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 3, 4)).astype(np.float32)
    b = a.copy()
    b[2, 0] = -b[2, 0]  # sample 0 differs at step 2 (its argmax moves); samples 1 and 2 agree
    per_sample = (a.argmax(-1) == b.argmax(-1)).all(axis=0).mean()  # by hand: 2 of 3
    assert per_sample == pytest.approx(2 / 3)
    fed = AgreementAccumulator(name="y")
    fed.update(a, b, batch=3)
    assert fed.metrics()["sequence_agreement"] == pytest.approx(per_sample)
    assert fed.metrics()["agreement"] == pytest.approx(14 / 15)
    assert fed.samples == 3
    model = _graph_of(
        [("Transpose", ["x"], "t", {"perm": [1, 0, 2]}), ("MatMul", ["t", "w"], "y")],
        ["batch", 5, 8], [5, "batch", 4], {"w": np.ones((8, 4), np.float32)},
    )  # fmt: skip
    declared = OutputLayout.of(model).accumulator("y")
    assert declared.samples_second
    declared.update(a, b)  # no feed size: the declaration decides
    assert declared.metrics()["sequence_agreement"] == pytest.approx(per_sample)
    batch_first = AgreementAccumulator(name="y")
    batch_first.update(np.moveaxis(a, 1, 0), np.moveaxis(b, 1, 0), batch=3)
    assert batch_first.metrics()["sequence_agreement"] == pytest.approx(per_sample)


def _head_inits(**more: np.ndarray) -> dict[str, np.ndarray]:
    """The constants of the detector heads below: the box scale, slice bounds 0 and 4 on
    axis 1, and ``more``."""
    return {
        "k100": np.array(100.0, np.float32),
        "s0": np.array([0], np.int64),
        "s4": np.array([4], np.int64),
        "ax": np.array([1], np.int64),
        **more,
    }


def _detector_head(score_op: str = "Sigmoid") -> onnx.ModelProto:
    """x [N, 6, A] -> y = Concat([x[:, :4] * 100 (boxes, pixels), score_op(x[:, 4:])], axis 1):
    a YOLOv8-like head, boxes and class scores joined on axis 1."""
    inits = _head_inits(s6=np.array([6], np.int64))
    nodes = [
        ("Slice", ["x", "s0", "s4", "ax"], "box_in"),
        ("Mul", ["box_in", "k100"], "boxes"),
        ("Slice", ["x", "s4", "s6", "ax"], "cls_in"),
        (score_op, ["cls_in"], "scores"),
        ("Concat", ["boxes", "scores"], "y", {"axis": 1}),
    ]
    return _graph_of(nodes, ["N", 6, 8], ["N", 6, 8], inits)


def test_a_detector_head_is_judged_part_by_part():
    """Boxes (x100) and scores joined in one output: the whole-output SQNR is the boxes'; the
    scores get their own row, and the model is judged on the worse part (hand-derived)."""
    model = _detector_head()
    assert concat_parts(model) == {"y": (1, ((0, 4, "Mul"), (4, 6, "Sigmoid")))}
    # reference: boxes all 100, scores all 0.5; candidate: boxes off by 1 (SQNR 40 dB),
    # scores off by 0.05 (SQNR 20 dB)
    a = np.concatenate([np.full((2, 4, 8), 100.0), np.full((2, 2, 8), 0.5)], axis=1)
    b = np.concatenate([np.full((2, 4, 8), 101.0), np.full((2, 2, 8), 0.55)], axis=1)
    acc = OutputsAccumulator(["y"], layout=OutputLayout.of(model))
    acc.update({"y": a}, {"y": b})
    rows = acc.rows()
    assert list(rows) == ["y", "y[0:4 on axis 1]", "y[4:6 on axis 1]"]
    assert rows["y[0:4 on axis 1]"]["sqnr_db"] == pytest.approx(40.0)
    assert rows["y[4:6 on axis 1]"]["sqnr_db"] == pytest.approx(20.0)
    assert rows["y[4:6 on axis 1]"]["part_made_by"] == "Sigmoid"
    assert rows["y"]["sqnr_db"] == pytest.approx(40.0, abs=0.01)  # the boxes dominate it
    assert acc.model_metrics()["sqnr_db"] == pytest.approx(20.0)
    # auto judges the parts at equal power: noise-to-signal 1e-4 and 1e-2, mean 5.05e-3
    assert _judged_sqnr(acc) == pytest.approx(-10 * np.log10(5.05e-3))  # 22.97 dB
    assert judge_description(model) == (
        "worst output's SQNR, y scored as its parts at equal power"
    )  # what auto's console line says it judged


def test_parts_one_kind_of_op_made_are_not_split_and_odd_batches_unsplit():
    """A Concat of parts the same op made (scales of a YOLOv5 head) is one kind of value; and
    a batch whose output does not hold the declared parts leaves the output judged whole."""
    same = _detector_head(score_op="Sigmoid")
    same.graph.node[1].op_type = "Sigmoid"  # boxes through Sigmoid too (one input: drop k100)
    del same.graph.node[1].input[1]
    assert concat_parts(same) == {}
    acc = OutputsAccumulator(["y"], layout=OutputLayout.of(_detector_head()))
    acc.update({"y": np.ones((2, 6, 8))}, {"y": np.ones((2, 6, 8))})
    acc.update({"y": np.ones((2, 7, 8))}, {"y": np.ones((2, 7, 8))})  # not 4 + 2 rows
    assert list(acc.rows()) == ["y"]


def test_a_yolox_head_keeps_its_parts_through_the_scales():
    """YOLOX (dddd-det): per scale Concat([boxes, Sigmoid(scores)], axis 1) -> Reshape
    [1, 5, H*W]; the scales joined along the anchors (axis 2), then Transpose to [1, A, 5]: the
    parts are on the output's last axis (dddd-det: [0:4] Conv, [4:5] and [5:6] Sigmoid)."""
    inits = _head_inits(s5=np.array([5], np.int64), flat=np.array([1, 5, -1], np.int64))
    nodes = [("MaxPool", ["x"], "x2", {"kernel_shape": [2, 2], "strides": [2, 2]})]
    for scale in ("x", "x2"):
        nodes += [
            ("Slice", [scale, "s0", "s4", "ax"], f"{scale}_box_in"),
            ("Mul", [f"{scale}_box_in", "k100"], f"{scale}_boxes"),
            ("Slice", [scale, "s4", "s5", "ax"], f"{scale}_cls_in"),
            ("Sigmoid", [f"{scale}_cls_in"], f"{scale}_scores"),
            ("Concat", [f"{scale}_boxes", f"{scale}_scores"], f"{scale}_head", {"axis": 1}),
            ("Reshape", [f"{scale}_head", "flat"], f"{scale}_flat"),
        ]
    nodes += [
        ("Concat", ["x_flat", "x2_flat"], "joined", {"axis": 2}),
        ("Transpose", ["joined"], "y", {"perm": [0, 2, 1]}),
    ]
    model = _graph_of(nodes, [1, 5, 4, 4], [1, 20, 5], inits)
    assert concat_parts(model) == {"y": (2, ((0, 4, "Mul"), (4, 5, "Sigmoid")))}
    inits["flat"] = np.array([1, -1], np.int64)  # a Reshape that merges the parts' axis away
    merged = _graph_of(nodes, [1, 5, 4, 4], [1, 100], inits)
    merged.graph.node[-2].attribute[0].i = 1
    merged.graph.node.pop()  # no Transpose: y is the Concat
    merged.graph.node[-1].output[0] = "y"
    assert concat_parts(merged) == {}


def test_a_classifier_without_a_batch_axis_is_judged_per_sample(run_cli, tmp_path):
    """madmom's key_cnn: input [T, 105] -> output [24], fed one sample at a time (data with one
    axis more). Its rank-1 output was refused as 'no class axis': gates and --labels dropped.
    Each run is one sample's class scores."""
    import json


    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 5)).astype(np.float32), "w")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=0),  # over time: [8]
        helper.make_node("MatMul", ["m", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "batchless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "batchless.onnx"
    onnx.save(model, str(path))
    x = rng.normal(size=(30, 6, 8)).astype(np.float32)  # 30 samples of [T=6, 8]
    labels = rng.integers(0, 5, 30)
    np.savez(tmp_path / "d.npz", x=x)
    np.save(tmp_path / "labels.npy", labels)
    assert declared_output_kinds(model)["y"][0] is None  # a batched reading: rank 1
    assert declared_output_kinds(model, unbatched=True)["y"][0] == "class"
    code, out, err = run_cli(
        "compare", "fp32", "int8", "--model", path, "--data", tmp_path / "d.npz",
        "--calib-data", tmp_path / "d.npz", "-m", "minmax", "--labels", tmp_path / "labels.npy",
        "--fail-below", "top1_agreement=0.5", "--no-latency", "--json", tmp_path / "r.json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    [row] = [o for o in doc["outputs"] if o["name"] == "y"]
    # the reference: the same INT8 model written by quantize, run by onnxruntime, numpy's argmax
    q = tmp_path / "q.onnx"
    assert run_cli("quantize", path, "--data", tmp_path / "d.npz", "-m", "minmax", "-o", q)[0] == 0
    from conftest import exact_session

    fp32, int8 = exact_session(path), exact_session(q)
    a = np.array([int(np.argmax(fp32.run(None, {"x": s})[0])) for s in x])
    b = np.array([int(np.argmax(int8.run(None, {"x": s})[0])) for s in x])
    assert row["agreement"] == pytest.approx(float(np.mean(a == b)))
    assert doc["task"]["accuracy"]["A"] == pytest.approx(float(np.mean(a == labels)))


# ----------------------------------------------------------------------------- probabilities


def _binary_classifier(tail: list[tuple], y_shape: list) -> onnx.ModelProto:
    """x[N,16] -> Gemm(16->1) -> ``tail`` -> y: a wake-word / voice-activity style head."""
    w = np.random.default_rng(3).standard_normal((16, 1)).astype(np.float32)
    nodes = [("Gemm", ["x", "w"], "g"), *tail]
    return _graph_of(nodes, ["N", 16], y_shape, {"w": w, "shape": np.array([-1], np.int64)})


@pytest.mark.parametrize(
    ("tail", "y_shape", "kind"),
    [
        ([("Sigmoid", ["g"], "y")], ["N", 1], "decision"),
        ([("Sigmoid", ["g"], "s"), ("Reshape", ["s", "shape"], "y")], ["N"], "decision"),
        ([("Identity", ["g"], "y")], ["N", 1], None),  # a raw score: no threshold to read
        ([("Sigmoid", ["g"], "s"), ("Mul", ["s", "s"], "y")], ["N", 1], None),  # not 0..1 as made
    ],
)
def test_one_probability_per_sample_agrees_by_its_decision(tail, y_shape, kind):
    """openwakeword's alexa_v0.1 ends in Gemm -> Sigmoid [1, 1]: agreement was 'not defined:
    the class axis (last) has size 1', and recover's top1_agreement target refused it."""
    assert declared_output_kinds(_binary_classifier(tail, y_shape))["y"][0] == kind


def test_decision_agreement_and_accuracy_are_counted_at_one_half():
    """Decisions by hand: FP32 [F, T, T, F], INT8 [F, F, T, T]: 2 of 4 agree; labels
    [0, 1, 1, 1]: FP32 right on 3, INT8 on 3."""
    acc = AgreementAccumulator(name="p", probability=True)
    a = np.array([[0.2], [0.7], [0.51], [0.49]], np.float32)
    b = np.array([[0.3], [0.4], [0.52], [0.51]], np.float32)
    acc.update(a, b, labels=np.array([0, 1, 1, 1]))
    assert acc.kind == "decision"
    assert acc.metrics() == {
        "agreement": 0.5,
        "top5_agreement": None,
        "sequence_agreement": None,
        "ctc_agreement": None,
        "mask_iou": None,  # one decision per sample is no map
        "mean_iou": None,
    }
    assert acc.accuracy() == {"A": 0.75, "B": 0.75, "delta": 0.0}
    assert "decisions at 0.5" in acc.note()
    map_acc = AgreementAccumulator(name="m", channels_first=True, probability=True)
    map_acc.update(np.zeros((2, 1, 8, 8), np.float32), np.zeros((2, 1, 8, 8), np.float32))
    assert map_acc.kind is None  # a probability map is many decisions, not one per sample


def test_compare_and_recover_read_a_binary_classifier_by_its_decisions(run_cli, tmp_path):
    model = _binary_classifier([("Sigmoid", ["g"], "y")], ["N", 1])
    x = np.random.default_rng(4).standard_normal((32, 16)).astype(np.float32)
    row = _compare_row(run_cli, tmp_path, model, x)
    assert row["agreement_kind"] == "decision" and row["agreement"] is not None
    assert 0.9 <= row["agreement"] <= 1.0
    data = tmp_path / "d.npz"
    code, _, err = run_cli(
        "recover", tmp_path / "m.onnx", "--data", data, "--calib-data", data, "-m", "minmax",
        "--target", "top1_agreement=0.5", "-o", tmp_path / "rec",
    )  # fmt: skip
    assert code == 0, err
    assert "met top1_agreement=0.5" in " ".join(err.split())


def _face_head(sizes: dict[str, int], softmax_size: int) -> onnx.ModelProto:
    """x[N,16] -> one MatMul + bias per output of ``sizes``, and a softmax head of
    ``softmax_size`` (MTCNN's O-Net: boxes 4, landmarks 10, face/no-face softmax 2)."""
    rng = np.random.default_rng(5)
    nodes, inits, outputs = [], {}, []
    for name, size in {**sizes, "probs": softmax_size}.items():
        inits[f"w_{name}"] = rng.standard_normal((16, size)).astype(np.float32)
        inits[f"b_{name}"] = rng.standard_normal(size).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["x", f"w_{name}"], [f"m_{name}"]))
        last = name if name != "probs" else "logits"
        nodes.append(helper.make_node("Add", [f"m_{name}", f"b_{name}"], [last]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", size]))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_regressions_beside_a_softmax_head_have_no_agreement():
    """MTCNN's O-Net (keras2onnx): argmax 'agreement' 0.98 of its 10 landmark coordinates was
    the model's top1_agreement; the face/no-face softmax is its only class output."""
    kinds = declared_output_kinds(_face_head({"reg": 4, "marks": 10}, 2))
    assert kinds["probs"][0] == "class"
    for name, size in (("reg", 4), ("marks", 10)):
        kind, reason = kinds[name]
        assert kind is None
        assert (
            f"output 'probs' holds the class scores (a softmax over 2); this one's {size}" in reason
        )
    # logits of the softmax's own size, and a model with no softmax output, keep their classes
    same = declared_output_kinds(_face_head({"raw_logits": 3}, 3))
    assert same["raw_logits"][0] == "class"
    alone = declared_output_kinds(_graph_of([("MatMul", ["x", "w"], "y")], ["N", 8], ["N", 5], W))
    assert alone["y"][0] == "class"
