"""The statistics pass joins one-sample feeds of a dynamic-batch model into batches, only where
the model's outputs for two samples run together match theirs run apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from synthetic import images, save, small_cnn

from quantbench.backends.onnxruntime import OnnxRuntimeRunner
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import Batch, joined_feeds, open_data
from quantbench.model.graph import TensorSpec, calibration_tensors, open_graph

INPUTS = [TensorSpec("x", np.float32, ["N", 3])]


def _feeds(*shapes: tuple[int, ...]) -> list[Batch]:
    return [Batch({"x": np.full(s, i, np.float32)}, s[0]) for i, s in enumerate(shapes)]


def _sizes(feeds) -> list[int]:
    return [f.num_samples for f in feeds]


def test_feeds_join_up_to_the_limits_and_never_across_the_boundary() -> None:
    five = _feeds(*[(1, 3)] * 5)
    assert _sizes(joined_feeds(five, INPUTS, 2, 1 << 20)) == [2, 2, 1]
    assert _sizes(joined_feeds(five, INPUTS, 16, 7)) == [2, 2, 1]  # 3 values a sample
    assert _sizes(joined_feeds(five, INPUTS, 16, 1 << 20, boundary=3)) == [3, 2]
    assert _sizes(joined_feeds(five, INPUTS, 16, 1 << 20, enabled=lambda: False)) == [1] * 5
    joined = list(joined_feeds(five, INPUTS, 16, 1 << 20))
    assert np.array_equal(joined[0]["x"][:, 0], [0, 1, 2, 3, 4])  # in order


def test_feeds_of_other_shapes_or_dtypes_are_not_joined() -> None:
    feeds = _feeds((1, 3), (1, 3), (1, 4), (1, 4), (1, 3))
    feeds.insert(4, Batch({"x": np.zeros((1, 4), np.float16)}, 1))
    assert _sizes(joined_feeds(feeds, INPUTS, 16, 1 << 20)) == [2, 2, 1, 1]


def _model(tmp_path: Path, kind: str) -> Path:
    """x [N, 4] -> y: "mixes" adds the batch's mean (a batch changes every value), "refuses"
    reshapes to a batch of 1 (a batch fails), "time-major" puts the batch on axis 1."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 4])
    nodes = {
        "mixes": [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Add", ["x", "m"], ["h"]),
        ],
        "refuses": [helper.make_node("Reshape", ["x", "shape"], ["h"])],
        "time-major": [helper.make_node("Transpose", ["x"], ["h"], perm=[1, 0])],
    }[kind]
    nodes.append(helper.make_node("Relu", ["h"], ["y"]))
    out_shape = {"mixes": ["N", 4], "refuses": [1, 4], "time-major": [4, "N"]}[kind]
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return save(model, tmp_path / f"{kind}.onnx")


def _recorded_runs(monkeypatch) -> list[int]:
    """The batch of every inference run from now on (until ``monkeypatch`` undoes it)."""
    runs: list[int] = []
    infer = OnnxRuntimeRunner.infer

    def recorded(self, feeds, outputs=None):
        runs.append(int(next(iter(feeds.values())).shape[0]))
        return infer(self, feeds, outputs)

    monkeypatch.setattr(OnnxRuntimeRunner, "infer", recorded)
    return runs


def _pass(model: Path, data: Path, join: bool, monkeypatch) -> tuple[dict, list[int]]:
    """The statistics of one pass and the batch of every inference it ran."""
    infer = OnnxRuntimeRunner.infer
    runs = _recorded_runs(monkeypatch)
    graph = open_graph(model)
    source = open_data(data, graph.inputs)
    names = calibration_tensors(graph, "all")
    stats = collect_stats(graph, source, names, show_progress=False, join_feeds=join)
    monkeypatch.setattr(OnnxRuntimeRunner, "infer", infer)
    return stats.tensors, runs


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        assert (x.count, x.min, x.max, x.exponent) == (y.count, y.min, y.max, y.exponent), name
        assert np.array_equal(x.counts, y.counts), name


def test_a_cnn_is_calibrated_in_batches_with_the_same_bins(tmp_path: Path, monkeypatch) -> None:
    model = save(small_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", input=images(40, seed=2) * 3)
    joined, runs = _pass(model, tmp_path / "d.npz", True, monkeypatch)
    apart, single = _pass(model, tmp_path / "d.npz", False, monkeypatch)
    assert single == [1] * 40
    assert max(runs) == 16 and sum(runs[3:]) == 40  # 2 + 1 + 2 checked, then the batches
    _same(joined, apart)  # a CNN's convolutions round the same at any batch


def test_a_joined_batch_is_run_in_parts_of_its_own_budget(tmp_path: Path, monkeypatch) -> None:
    """The batches the pass joins hold at most JOINED_ACTIVATION_BUDGET of activations a run
    (a dense model's large samples gain little from joining and would cost memory): with a
    budget below one sample's, every joined batch runs a sample at a time, same bins."""
    from quantbench.collect import statspass

    model = save(small_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", input=images(20, seed=3))
    monkeypatch.setattr(statspass, "JOINED_ACTIVATION_BUDGET", 1)
    monkeypatch.setattr(statspass, "JOINED_BUDGET_PER_TENSOR", 0)
    joined, runs = _pass(model, tmp_path / "d.npz", True, monkeypatch)
    apart, _ = _pass(model, tmp_path / "d.npz", False, monkeypatch)
    assert runs[:3] == [1, 1, 2] and runs[3:] == [1] * 20  # checked, then one sample a run
    _same(joined, apart)


def test_a_joined_part_may_hold_more_for_a_model_of_many_tensors() -> None:
    """1 MiB a returned tensor, at least 64 MiB (a dense CNN of 13 tensors) and at most the
    256 MiB of a user's batch (a CRNN of 832)."""
    from quantbench.collect.statspass import joined_budget

    mib = 1 << 20
    assert [joined_budget(["t"] * n) // mib for n in (13, 100, 255, 832)] == [64, 100, 255, 256]


@pytest.mark.parametrize("kind", ["mixes", "refuses"])
def test_a_model_that_does_not_batch_is_run_a_sample_at_a_time(
    tmp_path: Path, monkeypatch, kind: str
) -> None:
    """A model that mixes a batch's samples (or fails on a batch) keeps the statistics of
    one sample a run: the check refuses the join, every feed after it runs alone."""
    model = _model(tmp_path, kind)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((20, 4)).astype(np.float32))
    joined, runs = _pass(model, tmp_path / "d.npz", True, monkeypatch)
    apart, _ = _pass(model, tmp_path / "d.npz", False, monkeypatch)
    assert runs[:3] == [1, 1, 2] and set(runs[3:]) == {1} and len(runs[3:]) == 20
    _same(joined, apart)


def test_a_time_major_output_still_batches(tmp_path: Path, monkeypatch) -> None:
    model = _model(tmp_path, "time-major")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((20, 4)).astype(np.float32))
    joined, runs = _pass(model, tmp_path / "d.npz", True, monkeypatch)
    apart, _ = _pass(model, tmp_path / "d.npz", False, monkeypatch)
    assert runs == [1, 1, 2, 1, 15, 4]  # checked; 16 joined (one measures the activations), 4
    _same(joined, apart)


def test_a_batch_size_asked_for_is_kept(tmp_path: Path, monkeypatch) -> None:
    """``calibrate --batch-size 4`` feeds 4 samples a run: nothing is joined."""
    from quantbench.calibrate import obtain_stats

    model = save(small_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", input=images(12, seed=2))
    runs = _recorded_runs(monkeypatch)
    obtain_stats(open_graph(model), tmp_path / "d.npz", batch_size=4, use_cache=False,
                 show_progress=False)  # fmt: skip
    assert runs == [1, 3, 4, 4]  # the first part of one sample measures the activations
    assert onnx.load(str(model))  # the user's model untouched
