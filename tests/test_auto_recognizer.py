"""``--method auto`` on a recognizer (CTC posteriors per position): candidates are ranked by the
share of held-back lines whose decode agrees with FP32's, their SQNR breaking ties. The
posteriors' SQNR can reward a table that clips a rare character's logit: on PP-OCRv4's
recognizer percentile scored 13.6 dB and 97.6 % of lines, minmax 13.4 dB and 99.3 %.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench import calibrate as cal
from quantbench.choose import autocalib
from quantbench.choose.autocalib import MIX, RECOGNIZER_JUDGE, choose_auto
from quantbench.evaluate.metrics import OutputLayout, ctc_agreement
from quantbench.model.graph import open_graph

STEPS, FEATURES, CLASSES = 12, 8, 5


def _model(tmp_path, classifier: bool = False):
    """x[N, 12, 8] -> MatMul -> Relu -> MatMul (5 classes) -> Softmax: per-position class
    scores as a CRNN ends (``classifier``: pooled over the positions first, one class a
    sample)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
    ]
    shape = ["N", STEPS, CLASSES]
    if classifier:
        nodes.append(helper.make_node("ReduceMean", ["m"], ["p"], axes=[1], keepdims=0))
        shape = ["N", CLASSES]
    nodes.append(helper.make_node("Softmax", ["p" if classifier else "m"], ["y"], axis=-1))
    inits = [
        numpy_helper.from_array(rng.standard_normal((FEATURES, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((16, CLASSES)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", STEPS, FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((40, STEPS, FEATURES)).astype(np.float32))
    return open_graph(path), data


def _judged(graph, data):
    stats, _, _ = cal.obtain_stats(graph, data, tensors="all", use_cache=False)
    return choose_auto(graph, stats, data, use_cache=False)


def test_a_recognizers_candidates_carry_their_decoded_lines(tmp_path, monkeypatch):
    """A recognizer's record keeps each candidate's share of the 20 held-back lines; a candidate
    stops only once the lines it could still agree on fall below the best finished one's, so
    the choice and the table are those of the run where none stops."""
    graph, data = _model(tmp_path)
    early = _judged(graph, data)
    assert early.judged_by == RECOGNIZER_JUDGE
    assert set(early.lines_agreed) == {MIX, *early.methods}
    assert all(0 <= v <= 1 for v in early.lines_agreed.values())
    assert early.to_dict()["line_agreement"] == early.lines_agreed
    monkeypatch.setattr(autocalib, "_lines_bound", lambda *a: lambda acc, read: math.inf)
    full = _judged(graph, data)
    assert not full.stopped and early.chosen == full.chosen
    assert early.table.entries == full.table.entries
    best = full.lines_agreed[full.chosen]
    for name, share in full.lines_agreed.items():
        assert round(share * 20) == share * 20  # whole lines of 20
        if name in early.stopped:  # its bound: at least its true share, below the best's
            assert share <= early.lines_agreed[name] < best
        else:
            assert early.lines_agreed[name] == share


def test_the_lines_bound_counts_every_line_left_as_agreeing():
    """After 5 of 20 lines with 3 agreeing, at most (3 + 15) / 20 can agree."""
    a = np.zeros((5, 4, 3), np.float32)
    b = np.zeros((5, 4, 3), np.float32)
    a[:, :, 0] = b[:, :, 0] = 1  # blank everywhere ...
    a[:, 1, 0] = a[:, 1, 1] = 0
    a[:, 1, 1] = 1  # ... FP32 reads class 1 on every line, the candidate on the first three
    b[:3, 1, 0], b[:3, 1, 1] = 0, 1
    layout = OutputLayout()
    acc = autocalib.OutputsAccumulator(["y"], False, layout)
    acc.update({"y": a}, {"y": b}, batch=5)
    sequences = autocalib._sequences([{"y": a}], ["y"], layout)
    assert sequences == {"y"}
    most = autocalib._lines_bound(sequences, 20)
    assert math.isclose(most(acc, 5), 18 / 20)
    assert math.isclose(autocalib._lines_agreed(acc, sequences), 3 / 5)


def test_a_classifier_is_judged_by_sqnr_alone(tmp_path):
    graph, data = _model(tmp_path, classifier=True)
    got = _judged(graph, data)
    assert got.judged_by != RECOGNIZER_JUDGE and not got.lines_agreed


def test_the_most_lines_win_over_the_best_sqnr(tmp_path, monkeypatch):
    """The output pass's scores replaced (every table judged apart): among the most lines the
    better SQNR wins; with fewer lines, the best SQNR loses to minmax's worst."""
    graph, data = _model(tmp_path)
    sqnr = {"minmax": 10.0, "entropy": 30.0, "percentile:99.99": 20.0, MIX: 25.0}
    lines = {"minmax": 0.95, "entropy": 0.90, "percentile:99.99": 0.95, MIX: 0.90}

    def scored(graph, tables, held_out, *args, decoded=None, **kwargs):
        if decoded is not None:
            decoded.update({n: lines.get(n, 0.5) for n in tables})
        return {n: sqnr.get(n, 5.0) for n in tables}

    monkeypatch.setattr(autocalib, "output_sqnrs", scored)
    apart = lambda tables, readers: {n: n for n in tables}  # noqa: E731
    monkeypatch.setattr(autocalib, "_identical_tables", apart)
    got = _judged(graph, data)
    assert got.chosen == "percentile:99.99"  # 0.95 of lines, 20 dB against minmax's 10
    lines["percentile:99.99"] = 0.9
    assert _judged(graph, data).chosen == "minmax"


def test_the_line_agreement_is_the_decoders(tmp_path):
    """:func:`autocalib._lines_agreed` against the decodes by hand (class 0, FP32's most
    frequent, the blank): two of three lines decode alike (the second differs only in a
    repeat, which CTC merges; the third loses its 1)."""
    layout = OutputLayout()
    a = np.zeros((3, 4, 3), np.float32)
    b = np.zeros((3, 4, 3), np.float32)
    for i, (pa, pb) in enumerate([([1, 0, 2, 0], [1, 0, 2, 0]), ([1, 1, 0, 2], [1, 0, 0, 2]),
                                  ([2, 0, 1, 0], [2, 0, 0, 0])]):  # fmt: skip
        a[i, range(4), pa] = 1
        b[i, range(4), pb] = 1
    acc = autocalib.OutputsAccumulator(["y"], False, layout)
    acc.update({"y": a}, {"y": b})
    got = autocalib._lines_agreed(acc, autocalib._sequences([{"y": a}], ["y"], layout))
    assert math.isclose(got, 2 / 3)
    paths = acc.agreement["y"]
    assert math.isclose(ctc_agreement(paths.paths_a, paths.paths_b), 2 / 3)

