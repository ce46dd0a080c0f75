"""``--auto-budget``: auto's judging capped in time, on the first held-back samples that fit.

The reference for a cut judgement is the same judging run on a slice that holds only those
first samples (``max_samples``): every pass must have read exactly them.
"""

from __future__ import annotations

import time

import pytest

from quantbench.calibrate import calibrate
from quantbench.choose.autocalib import JudgingBudget, output_sqnrs
from quantbench.data.sources import open_data
from quantbench.model.graph import open_graph
from quantbench.table.build import build_table


@pytest.fixture()
def example():
    from conftest import require_example

    return require_example()


def test_a_budget_that_is_not_reached_changes_nothing(example, tmp_path):
    model, data = example / "tinycnn.onnx", example / "calib.npz"
    plain = calibrate(model, data, output=tmp_path / "plain.json", use_cache=False,
                      show_progress=False)  # fmt: skip
    budgeted = calibrate(model, data, output=tmp_path / "budget.json", use_cache=False,
                         show_progress=False, auto_budget=600)  # fmt: skip
    assert budgeted.auto.cut == ""
    exact = {k: v for k, v in plain.auto.output_sqnr_db.items() if k not in plain.auto.stopped}
    assert exact == {k: budgeted.auto.output_sqnr_db[k] for k in exact}  # the rest: bounds
    assert (tmp_path / "plain.json").read_bytes() == (tmp_path / "budget.json").read_bytes()


def test_a_cut_pass_reads_exactly_the_first_samples(example):
    graph = open_graph(example / "tinycnn.onnx")
    from quantbench.collect.statspass import collect_stats
    from quantbench.model.graph import calibration_tensors

    data = example / "calib.npz"
    stats = collect_stats(graph, open_data(data, graph.inputs), calibration_tensors(graph, "all"),
                          show_progress=False)  # fmt: skip
    tables = {m: build_table(stats, m) for m in ("minmax", "entropy")}
    budget = JudgingBudget(3600.0, samples=5)
    cut = output_sqnrs(graph, tables, open_data(data, graph.inputs), budget=budget)
    first5 = output_sqnrs(graph, tables, open_data(data, graph.inputs,
                                                   max_samples=5))  # fmt: skip
    assert cut == first5
    assert budget.read == 5 and "first 5 of 256" in budget.cut()
    whole = output_sqnrs(graph, tables, open_data(data, graph.inputs))
    assert whole != cut


def test_a_tiny_budget_cuts_the_slice_says_so_and_is_not_remembered(example, tmp_path, capsys):
    model, data = example / "tinycnn.onnx", example / "calib.npz"
    first = calibrate(model, data, output=tmp_path / "a.json", auto_budget=0.01,
                      show_progress=False)  # fmt: skip
    assert first.auto.cut.startswith("--auto-budget 0.01 s: judged on the first ")
    assert "of 64 held-back samples, the rest skipped" in first.auto.cut
    assert "--auto-budget 0.01 s" in capsys.readouterr().err
    assert first.auto.to_dict()["budget_cut"] == first.auto.cut
    again = calibrate(model, data, output=tmp_path / "b.json", show_progress=False)
    assert not again.auto.reused and again.auto.cut == ""  # judged in full, not the cut one
    full = calibrate(model, data, output=tmp_path / "c.json", use_cache=False,
                     show_progress=False)  # fmt: skip
    assert again.auto.output_sqnr_db == full.auto.output_sqnr_db


def test_the_output_pass_stops_at_the_deadline_after_one_part():
    budget = JudgingBudget(1.0, started=time.perf_counter() - 5)
    assert not budget.reached(0, deadline=True)  # one part at least
    assert budget.reached(1, deadline=True)
    assert not budget.reached(1, deadline=False)  # isolated passes read the estimated count
    budget.samples = 3
    assert budget.reached(3, deadline=False) and not budget.reached(2, deadline=False)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--auto-budget", "0"], "--auto-budget 0: give a number of seconds > 0"),
        (["--auto-budget", "5", "--method", "minmax"], "the method here is minmax"),
    ],
)
def test_bad_budgets_are_one_line(example, tmp_path, run_cli, args, says):
    code, _, err = run_cli("calibrate", example / "tinycnn.onnx", "--data",
                           example / "calib.npz", "-o", tmp_path / "t.json", *args)  # fmt: skip
    assert code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


def test_quantize_takes_the_budget_and_refuses_it_with_a_table(example, tmp_path, run_cli):
    code, _, err = run_cli("quantize", example / "tinycnn.onnx", "--data", example / "calib.npz",
                           "--auto-budget", "0.01", "--refine", "none", "-o",
                           tmp_path / "q.onnx")  # fmt: skip
    assert code == 0 and "--auto-budget 0.01 s: judged on the first" in err
    table = tmp_path / "t.json"
    run_cli("calibrate", example / "tinycnn.onnx", "--data", example / "calib.npz", "--method",
            "minmax", "-o", table)  # fmt: skip
    code, _, err = run_cli("quantize", example / "tinycnn.onnx", "--table", table,
                           "--auto-budget", "5", "-o", tmp_path / "q2.onnx")  # fmt: skip
    assert code == 2 and "drop it with --table" in err and not (tmp_path / "q2.onnx").exists()


@pytest.mark.parametrize("command", ["compare", "sensitivity", "recover"])
def test_the_commands_that_calibrate_with_auto_take_the_budget(example, tmp_path, run_cli, command):
    """compare, sensitivity and recover judge ``auto`` as calibrate does: the same cap, said."""
    model, calib, data = (example / n for n in ("tinycnn.onnx", "calib.npz", "eval.npz"))
    common = ["--data", data, "--calib-data", calib, "--auto-budget", "0.01", "--max-samples", "4"]
    args = {
        "compare": ["compare", "fp32", "int8", "--model", model, *common],
        "sensitivity": ["sensitivity", model, *common],
        "recover": ["recover", model, *common, "-o", tmp_path / "r", "--refine", "none"],
    }
    code, _, err = run_cli(*args[command])
    assert "--auto-budget 0.01 s: judged on the first" in err, err
    assert code in (0, 1)  # recover may miss its target on 4 samples: exit 1, not a refusal


def test_compare_refuses_a_budget_no_candidate_uses(example, tmp_path, run_cli):
    code, _, err = run_cli("compare", "fp32", "int8:minmax", "--model", example / "tinycnn.onnx",
                           "--data", example / "eval.npz", "--calib-data",
                           example / "calib.npz", "--auto-budget", "5")  # fmt: skip
    assert code == 2 and "the method here is minmax: drop --auto-budget" in err
