"""``--method auto`` judges at a bounded memory: the slice's batches run in parts of at most
:data:`autocalib.JUDGE_BUDGET` bytes of returned activations, whatever the resolution and the
number of held-back samples, and the parts change neither the choice nor a table.

The reference here is the unbounded judgement (a budget no batch reaches: one run per batch,
every table's twins in one pass, as before the bound); the bounded one must agree with it.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import synthetic

from quantbench import calibrate as cal
from quantbench.choose import autocalib
from quantbench.choose.autocalib import choose_auto
from quantbench.evaluate import variants
from quantbench.model.graph import open_graph
from quantbench.table.json_table import encode_json_table

HUGE = 1 << 40


def _judge(graph, data, monkeypatch, budget, twin_budget, per_tensor=0):
    """``auto`` with its judging parts at most ``budget`` bytes (``per_tensor``: the part
    size grows by that much a returned tensor, as :func:`autocalib.judging_part_bytes` does;
    0 here, so that the parts are exactly ``budget``)."""
    monkeypatch.setattr(autocalib, "JUDGE_BUDGET", budget)
    monkeypatch.setattr(autocalib, "ACTIVATION_BUDGET", max(budget, 256 << 20))
    monkeypatch.setattr(autocalib, "JUDGE_BYTES_PER_TENSOR", per_tensor)
    monkeypatch.setattr(autocalib, "ISOLATED_TWIN_BUDGET", twin_budget)
    stats, _, _ = cal.obtain_stats(graph, data, tensors="all", use_cache=False)
    return choose_auto(graph, stats, data, use_cache=False)


def _runs(monkeypatch):
    """(samples, bytes returned) of every onnxruntime run auto's judging makes (not the
    statistics passes, which have their own budget)."""
    seen: list[tuple[int, int]] = []
    infer = autocalib.OnnxRuntimeRunner.infer

    def spy(self, feed, *args, **kwargs):
        got = infer(self, feed, *args, **kwargs)
        if sys._getframe(1).f_globals["__name__"] not in (autocalib.__name__, variants.__name__):
            return got
        samples = int(next(iter(feed.values())).shape[0])
        seen.append((samples, sum(np.asarray(v).nbytes for v in got.values())))
        return got

    monkeypatch.setattr(autocalib.OnnxRuntimeRunner, "infer", spy)
    return seen


def test_parts_change_no_choice_and_no_table(cnn_path, tmp_path, monkeypatch):
    np.savez(tmp_path / "d.npz", input=synthetic.images(40, seed=3))
    graph = open_graph(cnn_path)
    whole = _judge(graph, tmp_path / "d.npz", monkeypatch, HUGE, HUGE)
    parts = _judge(graph, tmp_path / "d.npz", monkeypatch, 1, 1)  # one sample, one table a run
    assert encode_json_table(parts.table) == encode_json_table(whole.table)
    assert parts.chosen == whole.chosen
    assert {t: c["method"] for t, c in parts.choices.items()} == {
        t: c["method"] for t, c in whole.choices.items()
    }
    assert parts.output_sqnr_db.keys() == whole.output_sqnr_db.keys()
    for name, db in whole.output_sqnr_db.items():  # only the float32 rounding of sums differs
        if name in parts.stopped or name in whole.stopped:
            continue  # a bound where it stopped (test_early_stops_change_no_choice)
        assert parts.output_sqnr_db[name] == pytest.approx(db, rel=1e-5), name
    for tensor, choice in whole.choices.items():
        for method, db in choice["isolated_sqnr_db"].items():
            got = parts.choices[tensor]["isolated_sqnr_db"][method]
            assert got == pytest.approx(db, rel=1e-5), (tensor, method)


@pytest.mark.parametrize("samples", [16, 40])
def test_a_run_returns_at_most_the_budget(cnn_path, tmp_path, monkeypatch, samples):
    """With a budget of 3 samples' activations, no judging run returns more than the budget
    (or one sample), with 8 or 20 samples held back alike."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(samples, seed=1))
    graph = open_graph(cnn_path)
    seen = _runs(monkeypatch)
    _judge(graph, tmp_path / "d.npz", monkeypatch, HUGE, HUGE)
    biggest = max(b for _, b in seen)
    per_sample = max(b // n for n, b in seen)
    assert max(n for n, _ in seen) >= 8  # unbounded: whole batches of the slice
    seen.clear()
    budget = 3 * per_sample
    _judge(graph, tmp_path / "d.npz", monkeypatch, budget, HUGE)
    assert seen
    for n, returned in seen:
        assert n == 1 or returned <= budget, (n, returned, budget)
    assert max(b for _, b in seen) <= budget < biggest


def test_judging_parts_grow_with_the_tensors_a_run_returns():
    """A judging pass returning many tensors (a model of many small ops, whose runs cost
    onnxruntime per node) runs larger parts: 256 KiB a returned tensor (a quarter of the
    statistics pass's rate), at least 32 MiB, at most the statistics pass's 256 MiB part."""
    mib = 1 << 20
    assert autocalib.judging_part_bytes(0) == 32 * mib
    assert autocalib.judging_part_bytes(100) == 32 * mib
    assert autocalib.judging_part_bytes(160) == 40 * mib  # basic-pitch's isolated pass
    assert autocalib.judging_part_bytes(740) == 185 * mib  # captcha-crnn's
    assert autocalib.judging_part_bytes(1100) == 256 * mib


def test_the_isolated_and_output_passes_run_parts_of_the_grown_size(
    cnn_path, tmp_path, monkeypatch
):
    """With 32 bytes a returned tensor allowed on top of a budget no part fits, the isolated
    pass's parts hold as many samples as its returned tensors' share allows, and the output
    pass (which returns few tensors) runs parts of the size the isolated pass chose."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(40, seed=1))
    graph = open_graph(cnn_path)
    sizes: list[int] = []
    real = autocalib.feed_parts

    def spy(feed, inputs, per_sample, budget, *args, **kwargs):
        if sys._getframe(1).f_globals["__name__"] == autocalib.__name__:
            sizes.append(budget)
        return real(feed, inputs, per_sample, budget, *args, **kwargs)

    monkeypatch.setattr(autocalib, "feed_parts", spy)
    _judge(graph, tmp_path / "d.npz", monkeypatch, 1, HUGE, per_tensor=32)
    assert sizes and len(set(sizes)) == 1  # one part size for every judging pass
    (size,) = set(sizes)
    assert size > 32 and size % 32 == 0  # 32 bytes for each of the isolated pass's tensors


def test_auto_judges_alike_with_and_without_exact_integer_kernels(cnn_path, cnn_data, monkeypatch):
    """``auto``'s judging runs every Q/DQ model as written (onnxruntime's fusion off) on every
    machine, so one whose integer kernels are exact (VNNI) and one where they saturate give
    the same scores and the same table (before, the fusion stayed on with VNNI)."""
    from quantbench.backends import onnxruntime as backend

    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, cnn_data, use_cache=False)
    got = {}
    for exact in (True, False):
        monkeypatch.setattr(backend, "saturating_int8_kernels", lambda exact=exact: not exact)
        got[exact] = choose_auto(graph, stats, cnn_data, use_cache=False)
    assert got[True].output_sqnr_db == got[False].output_sqnr_db
    assert encode_json_table(got[True].table) == encode_json_table(got[False].table)


def _open_candidates(monkeypatch):
    """Most candidate sessions (those auto's output pass opens for a Q/DQ model) alive at once."""
    alive, most = [0], [0]
    build, close = autocalib.OnnxRuntimeRunner.__init__, autocalib.OnnxRuntimeRunner.close

    def opened(self, model, *args, **kwargs):
        build(self, model, *args, **kwargs)
        self._candidate = sys._getframe(1).f_code.co_name == "session"
        alive[0] += self._candidate
        most[0] = max(most[0], alive[0])

    def closed(self):
        alive[0] -= getattr(self, "_candidate", False)
        self._candidate = False
        close(self)

    monkeypatch.setattr(autocalib.OnnxRuntimeRunner, "__init__", opened)
    monkeypatch.setattr(autocalib.OnnxRuntimeRunner, "close", closed)
    return most


@pytest.mark.parametrize("kept", [HUGE, 0])
def test_output_pass_keeps_one_candidate_session_where_the_reference_fits(
    cnn_path, tmp_path, monkeypatch, kept
):
    """A slice whose parts and FP32 outputs fit the budget is scored one candidate at a time;
    one that does not runs every candidate on each part. Both give the same sums: the same
    scores to the last bit, the same table. The candidates (one Q/DQ graph with other scales)
    share one session either way; kept apart, each has its own, all alive at once on each
    part where the reference does not fit."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(24, seed=5))
    graph = open_graph(cnn_path)
    monkeypatch.setattr(autocalib, "KEPT_REFERENCE_BUDGET", HUGE)
    baseline = _judge(graph, tmp_path / "d.npz", monkeypatch, 1 << 20, HUGE)
    monkeypatch.setattr(autocalib, "KEPT_REFERENCE_BUDGET", kept)
    most = _open_candidates(monkeypatch)
    got = _judge(graph, tmp_path / "d.npz", monkeypatch, 1 << 20, HUGE)
    assert most[0] == 1
    assert got.output_sqnr_db == baseline.output_sqnr_db
    assert encode_json_table(got.table) == encode_json_table(baseline.table)
    monkeypatch.setattr(variants, "SMALL_ELEMENTS", -1)  # every initializer compared whole
    most = _open_candidates(monkeypatch)
    apart = _judge(graph, tmp_path / "d.npz", monkeypatch, 1 << 20, HUGE)
    if kept:
        assert most[0] == 1
    else:  # the mix and at least two distinct methods' tables, all at once
        assert most[0] >= 3
    assert apart.output_sqnr_db == baseline.output_sqnr_db
    assert encode_json_table(apart.table) == encode_json_table(baseline.table)


def _tables_seen(monkeypatch, function: str, view):
    """``view(tables)`` of every call of ``autocalib.<function>(graph, tables, ...)``."""
    seen: list = []
    real = getattr(autocalib, function)

    def spy(graph, tables, *args, **kwargs):
        seen.append(view(tables))
        return real(graph, tables, *args, **kwargs)

    monkeypatch.setattr(autocalib, function, spy)
    return seen


def _scored_tables(monkeypatch) -> list[list[str]]:
    """The candidate names each output pass scored."""
    return _tables_seen(monkeypatch, "output_sqnrs", list)


def test_a_mix_of_one_method_is_that_methods_model_and_scored_once(
    cnn_path, cnn_data, monkeypatch
):
    """With entropy the only method, the mix takes entropy on every read tensor: the same
    Q/DQ model, so it is not run again; its score is entropy's and (ties go to the mix) it is
    still the choice."""
    graph = open_graph(cnn_path)
    seen = _scored_tables(monkeypatch)
    stats, _, _ = cal.obtain_stats(graph, cnn_data, use_cache=False)
    got = choose_auto(graph, stats, cnn_data, use_cache=False, methods=["entropy"])
    assert seen == [["entropy"]]
    assert got.output_sqnr_db[autocalib.MIX] == got.output_sqnr_db["entropy"]
    assert got.chosen == autocalib.MIX


def test_tables_that_differ_only_where_no_quantized_op_reads_are_scored_once(
    cnn_path, cnn_data, monkeypatch
):
    """mse's table made entropy's but for a tensor no quantized op reads: one Q/DQ model,
    scored once (in isolation and at the outputs), the same scores for both."""
    graph = open_graph(cnn_path)
    stats, _, _ = cal.obtain_stats(graph, cnn_data, use_cache=False)
    real = autocalib.build_table
    read = set(autocalib._readers(graph, real(stats, "entropy")))
    unread = sorted(set(real(stats, "entropy").entries) - read)
    assert unread  # the CNN's output (and what only its float ops read)

    def build(stats_file, methods):
        tables = {m: real(stats_file, m) for m in methods}
        tables["mse"] = real(stats_file, "entropy")
        tables["mse"].set(unread[0], tables["mse"].amax(unread[0]) * 3, "mse")
        return tables

    monkeypatch.setattr(autocalib, "build_tables", build)
    seen = _scored_tables(monkeypatch)
    got = choose_auto(graph, stats, cnn_data, use_cache=False, methods=["entropy", "mse"])
    assert "mse" not in seen[0]
    assert got.output_sqnr_db["mse"] == got.output_sqnr_db["entropy"]


def _with_a_poor_minmax(real):
    """``build_tables`` with minmax's ranges 16x wider: far behind the other methods."""

    def poor(stats_file, methods):
        tables = real(stats_file, methods)
        for name in tables["minmax"].entries:
            tables["minmax"].set(name, tables["minmax"].amax(name) * 16, "minmax")
        return tables

    return poor


def test_early_stops_change_no_choice_and_no_table(cnn_path, tmp_path, monkeypatch):
    """A candidate stopped once it could no longer win reports the most it could still have
    reached: at least its true score (from the run with no early stop), below the winner's;
    the choice, every other score and the table are those of the full run."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(40, seed=6))
    graph = open_graph(cnn_path)
    monkeypatch.setattr(autocalib, "build_tables", _with_a_poor_minmax(autocalib.build_tables))
    early = _judge(graph, tmp_path / "d.npz", monkeypatch, 1, HUGE)  # one sample a part
    monkeypatch.setattr(autocalib, "_score_bound", lambda acc, whole: float("inf"))
    full = _judge(graph, tmp_path / "d.npz", monkeypatch, 1, HUGE)
    assert "minmax" in early.stopped and not full.stopped
    assert early.chosen == full.chosen
    assert encode_json_table(early.table) == encode_json_table(full.table)
    best = early.output_sqnr_db[early.chosen]
    for name, db in full.output_sqnr_db.items():
        if name in early.stopped:
            assert db <= early.output_sqnr_db[name] < best, name
            assert 0 < early.stopped[name] < 20  # samples read, of the 20 held back
        else:
            assert early.output_sqnr_db[name] == db, name
    assert early.to_dict()["stopped_early"] == early.stopped


def test_a_mix_that_cannot_win_stops_early_too(cnn_path, tmp_path, monkeypatch):
    """The mix (judged last, setting no bar) stops once it can no longer win, as the methods
    do: its score is then a bound, at least its true score and below the winner's, and the
    choice and the table are those of the full run."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(40, seed=6))
    graph = open_graph(cnn_path)
    real_worst, real_best = autocalib._worst_readers, autocalib._best_method

    def marked(nodes, scores, methods):  # the model's input (read by conv1) keeps its pick
        worst = real_worst(nodes, scores, methods)
        return {**worst, "keep": nodes == ["conv1"]}

    def mostly_minmax(worst, methods):  # a mix of the poor minmax but for the input
        kept = worst.pop("keep")
        return real_best(worst, methods) if kept else "minmax"

    monkeypatch.setattr(autocalib, "build_tables", _with_a_poor_minmax(autocalib.build_tables))
    monkeypatch.setattr(autocalib, "_worst_readers", marked)
    monkeypatch.setattr(autocalib, "_best_method", mostly_minmax)
    early = _judge(graph, tmp_path / "d.npz", monkeypatch, 1, HUGE)  # one sample a part
    monkeypatch.setattr(autocalib, "_score_bound", lambda acc, whole: float("inf"))
    full = _judge(graph, tmp_path / "d.npz", monkeypatch, 1, HUGE)
    assert autocalib.MIX in early.stopped and not full.stopped
    assert 0 < early.stopped[autocalib.MIX] < 20  # samples read, of the 20 held back
    assert early.chosen == full.chosen != autocalib.MIX
    assert encode_json_table(early.table) == encode_json_table(full.table)
    mix = full.output_sqnr_db[autocalib.MIX]
    assert mix <= early.output_sqnr_db[autocalib.MIX] < early.output_sqnr_db[early.chosen]


def _isolated_passes(monkeypatch) -> list[int]:
    """The number of tables each isolated pass of auto's judging scores."""
    return _tables_seen(monkeypatch, "_isolated_pass", len)


@pytest.mark.parametrize(("twin_budget", "one_pass"), [(HUGE, True), (1, False)])
def test_twins_of_unknown_size_are_measured_by_the_first_sample(
    cnn_path, tmp_path, monkeypatch, twin_budget, one_pass
):
    """quantize calibrates only the tensors quantized ops read, so the size of their outputs
    (the twins) is not known beforehand: every table goes in one pass where the first sample's
    twins fit the budget, else the pass gives up and a few passes score them; either way the
    scores and the table are those of calibrating every tensor."""
    np.savez(tmp_path / "d.npz", input=synthetic.images(40, seed=3))
    graph = open_graph(cnn_path)
    whole = _judge(graph, tmp_path / "d.npz", monkeypatch, HUGE, HUGE)
    passes = _isolated_passes(monkeypatch)
    stats, _, _ = cal.obtain_stats(graph, tmp_path / "d.npz", tensors="quantizable",
                                   use_cache=False)  # fmt: skip
    monkeypatch.setattr(autocalib, "ISOLATED_TWIN_BUDGET", twin_budget)
    got = choose_auto(graph, stats, tmp_path / "d.npz", use_cache=False)
    assert passes and passes[0] > 1  # every distinct table at once, first
    if one_pass:
        assert len(passes) == 1
    else:  # the pass that gave up, then one table, then the others the budget allows: one each
        assert passes[1:] == [1] * passes[0]
    assert got.chosen == whole.chosen
    for tensor, choice in whole.choices.items():
        assert got.choices[tensor]["isolated_sqnr_db"] == pytest.approx(
            choice["isolated_sqnr_db"], rel=1e-5
        ), tensor
