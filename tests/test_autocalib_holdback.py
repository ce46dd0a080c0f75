"""``--method auto`` judges its candidates on calibration samples they were not calibrated on.

The slice's statistics are taken out of the data set's (:meth:`StatsFile.without`); the expected
values here come from statistics computed directly on the other samples, an independent pass.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import synthetic
from onnx import TensorProto, helper, numpy_helper

from quantbench import calibrate as cal
from quantbench.choose import autocalib
from quantbench.choose.autocalib import MIX, choose_auto, held_back_count
from quantbench.model.graph import open_graph
from quantbench.stats.tensorstats import TensorStats
from quantbench.table.build import build_table


def _stats(values: np.ndarray) -> TensorStats:
    t = TensorStats("x")
    t.update(values)
    return t


@pytest.mark.parametrize("seed", range(6))
def test_without_gives_the_rest_exactly(seed):
    rng = np.random.default_rng(seed)
    part = rng.standard_normal(3000).astype(np.float32) * rng.uniform(0.1, 10)
    rest = rng.standard_normal(5000).astype(np.float32) * rng.uniform(0.1, 10)
    rest[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0**-140, -(2.0**-130)]
    whole = _stats(part)
    whole.update(rest)
    got = whole.without(_stats(part))
    direct = _stats(rest)
    direct._grow(got.exponent)  # the rest binned on the whole's (coarser or equal) grid
    assert got.count == direct.count and got.nan_count == 1 and got.inf_count == 2
    assert np.array_equal(got.counts, direct.counts)
    w = got.bin_width
    for mine, true in ((got.max, direct.max), (-got.min, -direct.min)):
        assert true <= mine <= true + w  # exact, or the outer edge of the rest's last bin


def test_without_is_exact_on_the_range_when_the_rest_holds_the_extremes():
    whole = _stats(np.array([-1.0, 0.5, 0.25], np.float32))
    whole.update(np.array([-3.0, 7.0, 0.0], np.float32))
    got = whole.without(_stats(np.array([-1.0, 0.5, 0.25], np.float32)))
    assert (got.min, got.max, got.count) == (-3.0, 7.0, 3)


def test_without_refuses_a_part_that_is_not_a_subset():
    whole = _stats(np.linspace(-1, 1, 100, dtype=np.float32))
    assert whole.without(_stats(np.array([5.0], np.float32))) is None  # wider grid
    assert whole.without(_stats(np.array([0.123456], np.float32))) is None  # a bin it lacks
    assert whole.without(_stats(np.linspace(-1, 1, 200, dtype=np.float32))) is None


@pytest.mark.parametrize(("n", "held"), [(4, 0), (7, 0), (8, 4), (40, 20), (128, 64), (10**5, 64)])
def test_held_back_count(n, held):
    assert held_back_count(n) == held


def test_auto_candidates_are_calibrated_without_the_slice(cnn_path, tmp_path, monkeypatch):
    """40 calibration samples: the first 20 are held back; the statistics the candidates are
    built from equal a direct pass over the other 20, and the table auto returns is the judged
    candidate: each tensor's amax is its method's on those 20 samples."""
    images = synthetic.images(40)
    np.savez(tmp_path / "all.npz", input=images)
    np.savez(tmp_path / "rest.npz", input=images[20:])
    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, tmp_path / "all.npz", tensors="all", use_cache=False)
    rest, _, _ = cal.obtain_stats(graph, tmp_path / "rest.npz", tensors="all", use_cache=False)
    seen = {}
    judge = autocalib.auto_table

    def spy(g, fit, held_out, *args, **kwargs):
        seen["fit"], seen["slice"] = fit, held_out.num_samples
        return judge(g, fit, held_out, *args, **kwargs)

    monkeypatch.setattr(autocalib, "auto_table", spy)
    methods = ["minmax", "percentile:99.99"]
    auto = choose_auto(graph, stats, tmp_path / "all.npz", methods=methods)
    assert seen["slice"] == 20 and seen["fit"].num_samples == 20
    for name, direct in rest.tensors.items():
        got = seen["fit"].tensors[name]
        direct._grow(got.exponent)
        assert np.array_equal(got.counts, direct.counts), name
        assert got.min <= direct.min and got.max >= direct.max, name
        assert math.isclose(got.max, direct.max, abs_tol=got.bin_width), name
    assert "first 20 of 40 calibration samples, held back" in auto.holdout
    assert "other 20" in auto.holdout
    for tensor, choice in auto.choices.items():
        method = auto.chosen if auto.chosen != MIX else choice["method"]
        expected = build_table(rest, method).amax(tensor)  # the rest's range is exact or
        width = seen["fit"].tensors[tensor].bin_width  # bounded within one fine bin
        assert abs(auto.table.amax(tensor) - expected) <= width, tensor


def test_auto_with_too_few_samples_says_it_judges_in_sample(cnn_path, tmp_path):
    np.savez(tmp_path / "few.npz", input=synthetic.images(5))
    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, tmp_path / "few.npz", tensors="all", use_cache=False)
    auto = choose_auto(graph, stats, tmp_path / "few.npz", methods=["minmax", "mse"])
    assert "also in the statistics" in auto.holdout and "too few" in auto.holdout


def test_auto_with_statistics_of_other_data_warns_and_judges_in_sample(
    cnn_path, tmp_path, capsys
):
    np.savez(tmp_path / "a.npz", input=synthetic.images(20, seed=1))
    np.savez(tmp_path / "b.npz", input=synthetic.images(20, seed=2))
    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, tmp_path / "a.npz", tensors="all", use_cache=False)
    auto = choose_auto(graph, stats, tmp_path / "b.npz", methods=["minmax", "mse"])
    assert "also in the statistics" in auto.holdout
    assert "cannot be held back" in " ".join(capsys.readouterr().err.split())


def test_a_fixed_batch_holds_back_whole_batches(tmp_path):
    """Batch fixed at 8, 40 samples: 20 would be held back, 16 (two batches) are."""
    model = synthetic.save(synthetic.small_cnn(batch=8), tmp_path / "b8.onnx")
    np.savez(tmp_path / "d.npz", input=synthetic.images(40))
    graph = open_graph(model)
    stats, _, _ = cal.obtain_stats(graph, tmp_path / "d.npz", tensors="all", use_cache=False)
    auto = choose_auto(graph, stats, tmp_path / "d.npz", methods=["minmax", "mse"])
    assert "first 16 of 40 calibration samples, held back" in auto.holdout
    assert "other 24" in auto.holdout


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over 40 images, one per feed."""

    def __init__(self, images: np.ndarray, rewindable: bool):
        self.images, self.i = images, 0
        if rewindable:
            self.rewind = self._rewind

    def get_next(self):
        if self.i >= len(self.images):
            return None
        self.i += 1
        return {"input": self.images[self.i - 1 : self.i]}

    def _rewind(self):
        self.i = 0


def test_auto_with_a_reader_that_rewinds_holds_back(cnn_path):
    result = cal.calibrate(
        cnn_path, _Reader(synthetic.images(40), True), methods=["auto"], show_progress=False
    )
    assert "first 20 of 40 calibration samples, held back" in result.auto.holdout


def test_auto_with_a_read_once_reader_falls_back_and_says_so(cnn_path, capsys):
    """A reader without rewind() cannot be read again: auto would judge on nothing."""
    result = cal.calibrate(
        cnn_path, _Reader(synthetic.images(40), False), methods=["auto"], show_progress=False
    )
    assert result.auto is None
    table = result.tables["auto"]
    assert {e.method for e in table.entries.values()} == {"percentile:99.99"}
    assert "can be read only once" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("budget", [1, 1 << 30])  # one table a pass; all the rest in one
def test_isolated_scores_of_several_tables_in_one_pass_are_each_tables_own(
    cnn_path, tmp_path, monkeypatch, budget
):
    """auto scores every method's isolated ops; sharing one reference graph between the
    methods' twins (its FP32 ops run once, not once a method) must give each method the
    scores its own pass gives."""
    from quantbench.collect.statspass import collect_stats
    from quantbench.data.sources import open_data
    from quantbench.model.graph import calibration_tensors

    graph = open_graph(cnn_path)
    np.savez(tmp_path / "d.npz", input=synthetic.images(24))
    source = open_data(tmp_path / "d.npz", graph.inputs, batch_size=8)
    stats = collect_stats(graph, source, calibration_tensors(graph, "all"), show_progress=False)
    tables = {m: build_table(stats, m) for m in ("minmax", "entropy", "mse", "percentile:99.9")}
    alone = {m: autocalib.isolated_sqnr(graph, t, source) for m, t in tables.items()}
    monkeypatch.setattr(autocalib, "ISOLATED_TWIN_BUDGET", budget)
    together = autocalib.isolated_sqnrs(graph, tables, source)
    assert together.keys() == alone.keys()
    for m in tables:
        assert together[m].keys() == alone[m].keys()
        for node, db in alone[m].items():
            assert together[m][node] == pytest.approx(db, rel=1e-9, abs=1e-9), (m, node)


def _float16_conv(path):
    """y = Relu(Conv(x, w)) with float16 input, weights and output (a model exported in half)."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float16)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_auto_with_nothing_quantized_says_it_judged_nothing(run_cli, tmp_path):
    """A float16 graph as it is (the API's Graph; files are widened first): no op gets Q/DQ,
    every candidate was the FP32 model and auto reported 'mix inf dB, minmax inf dB, ...' and
    chose the mix, a judgement that checked nothing. From the CLI, a model with no op to
    quantize at all says so."""
    model = _float16_conv(tmp_path / "half.onnx")
    x = np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float16)
    np.savez(tmp_path / "calib.npz", x=x)
    result = cal.calibrate(
        open_graph(model), tmp_path / "calib.npz", methods=["auto"], show_progress=False
    )
    assert result.auto is not None
    assert result.auto.output_sqnr_db == {} and result.auto.choices == {}
    assert result.auto.chosen == "percentile:99.99"
    direct = build_table(result.stats, "percentile:99.99")
    assert result.tables["auto"].amax("x") == direct.amax("x")
    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])],
    )  # fmt: skip
    relu_model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)])
    relu_model.ir_version = 8
    onnx.save(relu_model, str(tmp_path / "relu.onnx"))
    np.savez(tmp_path / "relu.npz", x=x.astype(np.float32))
    code, _, err = run_cli(
        "calibrate", tmp_path / "relu.onnx", "--data", tmp_path / "relu.npz",
        "-o", tmp_path / "t.cache", "--no-cache",
    )  # fmt: skip
    text = " ".join(err.split())
    assert code == 0, err
    assert "nothing to judge: no op of the model would be quantized" in text
    assert "inf dB" not in text


def test_auto_judging_has_its_own_progress_bar(cnn_path, cnn_data, monkeypatch):
    """auto's judging, the longest part of a default calibrate, showed no progress. minmax and
    mse plus the mix's base (entropy): 3 tables each scored alone, then 3 + the mix at the
    outputs, on the 40 samples of cnn_data (fewer than the 64 held back at most)."""
    from contextlib import contextmanager

    from quantbench.choose.autocalib import auto_table, holdout_source

    bars: list[tuple[str, int | None, list[int]]] = []

    @contextmanager
    def recording_bar(description, total, show=True, unit="samples"):
        steps: list[int] = []
        bars.append((description, total, steps))
        yield steps.append

    monkeypatch.setattr(autocalib, "progress_bar", recording_bar)
    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, cnn_data, tensors="all", show_progress=False)
    auto_table(graph, stats, holdout_source(graph, cnn_data), ["minmax", "mse"])
    assert len(bars) == 1
    description, total, steps = bars[0]
    assert description == "auto: judging 4 candidates on 40 held-back samples"
    assert total == 3 + 4 and sum(steps) == total and len(steps) >= 2


@pytest.mark.parametrize("batch", [None, 7])
def test_the_pass_keeps_the_held_back_samples_statistics_apart(cnn_path, tmp_path, batch):
    """The statistics pass snapshots the first 10 samples (a batch of 7 cut at the boundary):
    exactly what an independent pass over those 10 samples bins, and the whole is unchanged."""
    images = synthetic.images(24, seed=9)
    np.savez(tmp_path / "all.npz", input=images)
    np.savez(tmp_path / "head.npz", input=images[:10])
    graph = open_graph(cnn_path)
    whole, _, _ = cal.obtain_stats(
        graph, tmp_path / "all.npz", batch_size=batch, use_cache=False, keep_head=lambda n: 10
    )
    plain, _, _ = cal.obtain_stats(graph, tmp_path / "all.npz", batch_size=batch, use_cache=False)
    alone, _, _ = cal.obtain_stats(graph, tmp_path / "head.npz", batch_size=batch, use_cache=False)
    assert whole.head is not None and whole.head.num_samples == 10
    assert plain.head is None
    for name, stats in alone.tensors.items():
        kept = whole.head.tensors[name]
        assert (kept.exponent, kept.count, kept.min, kept.max) == (
            stats.exponent, stats.count, stats.min, stats.max
        ), name  # fmt: skip
        assert np.array_equal(kept.counts, stats.counts), name
        full = whole.tensors[name]
        assert np.array_equal(full.counts, plain.tensors[name].counts), name


def test_auto_takes_the_held_back_statistics_from_the_pass(cnn_path, cnn_data, monkeypatch):
    """With the pass's snapshot auto runs no second statistics pass, and its table is the one
    the second pass gives (byte for byte)."""
    from quantbench.table.json_table import encode_json_table

    graph = open_graph(cnn_path)
    passes = []
    real = autocalib.collect_stats
    monkeypatch.setattr(
        autocalib, "collect_stats", lambda *a, **k: passes.append(1) or real(*a, **k)
    )
    held = autocalib.held_back_samples(graph, 40)
    kept, _, _ = cal.obtain_stats(graph, cnn_data, use_cache=False, keep_head=lambda n: held)
    snap = choose_auto(graph, kept, cnn_data, use_cache=False)
    assert passes == []
    plain, _, _ = cal.obtain_stats(graph, cnn_data, use_cache=False)
    again = choose_auto(graph, plain, cnn_data, use_cache=False)
    assert passes == [1]
    assert encode_json_table(snap.table) == encode_json_table(again.table)
    assert snap.output_sqnr_db == again.output_sqnr_db and snap.holdout == again.holdout


def test_compare_int8_auto_reads_the_held_back_slice_once(cnn_path, cnn_data, monkeypatch):
    """compare's int8 (auto) keeps the held-back statistics apart in its calibration pass, as
    calibrate does: auto runs no second statistics pass over the slice."""
    from quantbench.compare import compare

    passes = []
    real = autocalib.collect_stats
    monkeypatch.setattr(
        autocalib, "collect_stats", lambda *a, **k: passes.append(1) or real(*a, **k)
    )
    doc = compare("fp32", "int8", model=cnn_path, data=cnn_data, calib_data=cnn_data,
                  latency=False, show_progress=False)  # fmt: skip
    assert passes == []
    assert doc["calibration"]["auto"]["holdout"].startswith("first 20 of 40 calibration samples")


def _spec(name: str, batch: object):
    from quantbench.model.graph import TensorSpec

    return TensorSpec(name, np.dtype(np.float32), [batch, 3])


def test_checkpointed_cuts_parts_at_8_16_32():
    """Parts of a dynamic batch are cut so that one ends after 8, 16 and 32 samples (by hand:
    12 -> 8 + 4, 12 -> 4 + 8, 12 -> 8 + 4)."""
    from quantbench.data.sources import Batch

    inputs = [_spec("x", "n")]
    parts = [Batch({"x": np.full((12, 3), i, np.float32)}, 12) for i in range(3)]
    got = [(len(p["x"]), int(p["x"][0, 0]), check)
           for p, check in autocalib._checkpointed(parts, inputs, 8)]  # fmt: skip
    assert got == [(8, 0, True), (4, 0, False), (4, 1, True), (8, 1, False), (8, 2, True),
                   (4, 2, False)]  # fmt: skip


def test_checkpointed_keeps_a_fixed_batch_whole():
    """A fixed batch of 12 cannot be cut: each part ends at the first checkpoint it passes."""
    from quantbench.data.sources import Batch

    inputs = [_spec("x", 12)]
    parts = [Batch({"x": np.zeros((12, 3), np.float32)}, 12) for _ in range(3)]
    got = [(len(p["x"]), check) for p, check in autocalib._checkpointed(parts, inputs, 8)]
    assert got == [(12, True), (12, True), (12, True)]  # read 12 >= 8, 24 >= 16, 36 >= 32


def test_isolated_pass_stops_once_two_checks_agree(cnn_path, tmp_path):
    """With a settle test that agrees from its second check, the pass reads 16 of 40 samples;
    one that never agrees reads all 40 and scores as the whole-slice pass does."""
    from quantbench.collect.statspass import collect_stats
    from quantbench.data.sources import open_data
    from quantbench.model.graph import calibration_tensors

    graph = open_graph(cnn_path)
    np.savez(tmp_path / "d.npz", input=synthetic.images(40))
    source = open_data(tmp_path / "d.npz", graph.inputs, batch_size=16)
    stats = collect_stats(graph, source, calibration_tensors(graph, "all"), show_progress=False)
    tables = {m: build_table(stats, m) for m in ("minmax", "mse")}
    asked: list[int] = []

    def agrees_second(scores):
        asked.append(len(asked))
        return len(asked) >= 2

    early = autocalib._isolated_pass(graph, tables, source, None, None, settled=agrees_second)
    assert (early.samples, len(asked)) == (16, 2)
    never = autocalib._isolated_pass(graph, tables, source, None, None, settled=lambda s: False)
    whole = autocalib._isolated_pass(graph, tables, source, None, None)
    assert never.samples == whole.samples == 40
    for m in tables:  # the same sums, cut into other parts: float32 rounding only
        for node, db in whole.scores[m].items():
            assert never.scores[m][node] == pytest.approx(db, rel=1e-7)
            assert early.scores[m][node] != pytest.approx(db, rel=1e-7)  # 16 are not 40


def test_isolated_pass_of_an_opset_12_model_joins_the_upgraded_copy_quantizing_keeps(
    tmp_path, monkeypatch
):
    """Below opset 13 the Q/DQ models are upgraded; the isolated pass joins their twins to the
    upgraded copy quantize_model keeps instead of converting the reference again (a whole
    model held twice), and scores every op exactly as the conversion of its own did."""
    from quantbench.collect.statspass import collect_stats
    from quantbench.data.sources import open_data
    from quantbench.evaluate import isolated
    from quantbench.model.graph import calibration_tensors

    path = synthetic.save(synthetic.small_cnn(opset=12), tmp_path / "cnn12.onnx")
    graph = open_graph(path)
    np.savez(tmp_path / "d.npz", input=synthetic.images(16))
    source = open_data(tmp_path / "d.npz", graph.inputs, batch_size=8)
    stats = collect_stats(graph, source, calibration_tensors(graph, "all"), show_progress=False)
    tables = {m: build_table(stats, m) for m in ("minmax", "entropy", "mse")}
    with monkeypatch.context() as m:
        m.setattr(autocalib, "qdq_ready_model", lambda _graph: None)  # convert a copy, as before
        converted = autocalib.isolated_sqnrs(graph, tables, source)
    conversions = []
    real = isolated.convert_version
    monkeypatch.setattr(isolated, "convert_version", lambda *a: conversions.append(a) or real(*a))
    joined = autocalib.isolated_sqnrs(graph, tables, source)
    assert conversions == []  # the kept upgrade was used
    assert joined == converted and all(joined[m] for m in tables)
