"""Sharded calibration and parallel evaluations give exactly the local run's artefacts.

The reference is always the local run (one onnxruntime pass, sequential evaluations) on the
same data: tables are compared as file bytes (TensorRT cache and JSON), statistics as the bytes
of their saved file, rankings and metrics as values.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import synthetic
from test_recover import AGREE_SCRIPT, heavy_tailed_cnn

from quantbench.calibrate import calibrate, method_file_name
from quantbench.collect import sharded
from quantbench.collect.executors import ExecutorSpec, TaskFailed
from quantbench.data.sources import open_data
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.recovery import recover, sensitivity
from quantbench.table.codecs import write_table

METHODS = ["entropy", "minmax", "percentile:99.9", "mse", "entropy:ort-2048"]


@pytest.fixture(scope="module")
def calib(tmp_path_factory) -> dict[str, Path]:
    """A model, one .npz of 37 samples and a folder of two files (21 + 16 samples)."""
    root = tmp_path_factory.mktemp("sharded")
    model = synthetic.save(synthetic.small_cnn(), root / "cnn.onnx")
    x = synthetic.images(37, seed=3)
    x[5, 0, 2, 2] = 40.0  # one outlier: the max lands in one shard only
    np.savez(root / "calib.npz", input=x)
    folder = root / "folder"
    folder.mkdir()
    np.savez(folder / "a.npz", input=x[:21])
    np.save(folder / "b.npy", x[21:])
    return {"model": model, "file": root / "calib.npz", "folder": folder, "root": root}


def _tables(calib: dict[str, Path], data: Path | str, out: Path, spec=None, **kw):
    """Every method's TensorRT cache (written by calibrate) and JSON table, as bytes."""
    result = calibrate(
        calib["model"],
        data,
        methods=METHODS,
        output=out,
        fmt="trt",
        use_cache=False,
        show_progress=False,
        executor=spec,
        **kw,
    )
    for method, table in result.tables.items():
        write_table(table, out / f"{method_file_name(method, 'json')}", "json")
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}, result


@pytest.mark.parametrize(("data", "workers"), [("file", 2), ("folder", 3)])
def test_sharded_tables_are_byte_identical_to_the_local_run(calib, tmp_path, data, workers):
    local, ref = _tables(calib, calib[data], tmp_path / "local", batch_size=4)
    spec = ExecutorSpec("processes", workers=workers)
    got, result = _tables(calib, calib[data], tmp_path / "sharded", spec, batch_size=4)
    assert len(got) == 2 * len(METHODS)
    assert got == local
    # what the statistics record is the local run's: the whole data, not a shard
    assert result.stats.data_fingerprint == ref.stats.data_fingerprint
    assert result.stats.num_samples == ref.stats.num_samples == 37
    assert result.stats.model_path == ref.stats.model_path


def test_shard_order_and_count_do_not_change_the_statistics(calib, tmp_path):
    """Merged in any order, any number of shards gives the local run's statistics file."""
    graph = open_graph(calib["model"])
    tensors = calibration_tensors(graph, "all")
    local = calibrate(
        graph, calib["folder"], use_cache=False, show_progress=False, batch_size=4, max_samples=30
    ).stats
    local.save(tmp_path / "local.stats.npz")
    source = open_data(calib["folder"], graph.inputs, batch_size=4, max_samples=30)
    spec = ExecutorSpec("processes", workers=2)
    job = sharded.shard_job(graph, calib["folder"], tensors, spec, batch_size=4, max_samples=30)
    shards = source.shards(3)  # more shards than workers, in a shuffled order
    assert len(shards) == 3
    random.Random(1).shuffle(shards)
    results = sharded.run_shards(job, shards, spec, "folder", show_progress=False)
    assert [r.shard for r in results] == shards  # results come back in item order
    merged = sharded.merge_shards(results, source, graph)
    merged.save(tmp_path / "sharded.stats.npz")
    assert (tmp_path / "sharded.stats.npz").read_bytes() == (
        tmp_path / "local.stats.npz"
    ).read_bytes()


@pytest.mark.parametrize(("batch", "max_samples"), [(4, None), (5, 33), (1, 7)])
def test_shards_hold_exactly_the_whole_pass_batches(calib, batch, max_samples):
    """No inference: the shards' feeds, concatenated, are the whole pass's feeds."""
    graph = open_graph(calib["model"])
    kw = {"batch_size": batch, "max_samples": max_samples}
    whole = open_data(calib["folder"], graph.inputs, **kw)
    expected = [b["input"] for b in whole.batches()]
    for count in (1, 2, 3, 8, 100):
        shards = whole.shards(count)
        assert shards[0][0] == 0 and shards[-1][1] == whole.num_samples
        assert all(a < b for a, b in shards) and len(shards) <= count
        got = []
        for shard in shards:
            part = open_data(calib["folder"], graph.inputs, sample_range=shard, **kw)
            got.extend(b["input"] for b in part.batches())
        assert len(got) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def fail_second_shard(job: sharded.ShardJob, shard: tuple[int, int]) -> sharded.ShardResult:
    """A shard task whose second shard fails on every attempt (runs in a worker)."""
    if shard[0] > 0:
        raise RuntimeError("worker lost its disk")
    return sharded.collect_shard(job, shard)


def test_a_shard_that_fails_twice_fails_calibrate_in_one_line(calib, tmp_path, monkeypatch):
    monkeypatch.setattr(sharded, "shard_task", fail_second_shard)
    out = tmp_path / "t.cache"
    with pytest.raises(TaskFailed) as err:
        calibrate(
            calib["model"],
            calib["file"],
            output=out,
            use_cache=False,
            show_progress=False,
            batch_size=4,
            executor=ExecutorSpec("processes", workers=2),
        )
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"calibration shard 2/2 ({calib['file']}, samples 20-36) failed twice: "
        "RuntimeError: worker lost its disk"
    )
    assert not out.exists()


def test_a_loader_script_is_calibrated_here_with_a_note(calib, tmp_path, capsys):
    script = tmp_path / "loader.py"
    script.write_text(
        "import numpy as np\n"
        f"X = np.load({str(calib['file'])!r})['input']\n"
        "def load_data():\n"
        "    for i in range(0, len(X), 4):\n"
        "        yield {'input': X[i:i + 4]}\n"
    )
    local, _ = _tables(calib, calib["file"], tmp_path / "local", batch_size=4)
    spec = ExecutorSpec("processes", workers=2)
    got, result = _tables(calib, str(script), tmp_path / "script", spec)
    assert "cannot be split into shards; calibrating it here" in capsys.readouterr().err
    caches = {k: v for k, v in got.items() if k.endswith(".cache")}
    # the JSON tables record the data's fingerprint, which for a stream is the feeds' hash
    assert caches == {k: v for k, v in local.items() if k.endswith(".cache")}
    assert len(caches) == len(METHODS) and result.stats.num_samples == 37


@pytest.fixture(scope="module")
def heavy_small(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heavy-small")
    path = synthetic.save(heavy_tailed_cnn(), root / "heavy.onnx")
    np.savez(root / "calib.npz", input=synthetic.images(16, seed=1))
    np.savez(root / "eval.npz", input=synthetic.images(24, seed=2))
    return {"model": path, "calib": root / "calib.npz", "eval": root / "eval.npz"}


def _without_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_parallel_sensitivity_and_recover_match_the_local_run(heavy_small, tmp_path, monkeypatch):
    d = heavy_small
    spec = ExecutorSpec("processes", workers=2)
    kw = {"batch_size": 8}
    # a metric script given by a relative path: the workers load it by its absolute path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agree.py").write_text(AGREE_SCRIPT)
    script = {"metric": "agree", "metric_script": "agree.py:Agree"}
    local = sensitivity(d["model"], d["calib"], d["eval"], **kw, **script)
    parallel = sensitivity(d["model"], d["calib"], d["eval"], executor=spec, **kw, **script)
    assert [r["node"] for r in parallel] == [r["node"] for r in local]
    assert _without_seconds(parallel) == _without_seconds(local)
    assert all("agree" in r["only_fp32"] for r in parallel)
    target = "sqnr_db=40"
    a = recover(d["model"], d["calib"], d["eval"], target=target, **kw)
    b = recover(d["model"], d["calib"], d["eval"], target=target, executor=spec, **kw)
    assert b.kept == a.kept and b.met == a.met
    assert [s["metrics"] for s in b.steps] == [s["metrics"] for s in a.steps]
    assert _without_seconds(b.ranking) == _without_seconds(a.ranking)
    assert b.context.evaluator.evaluations == a.context.evaluator.evaluations


def test_parallel_auto_chooses_as_the_local_run(heavy_small, tmp_path):
    """--method auto's candidate scorings as tasks: the same scores, choice and table bytes."""
    d = heavy_small
    out = {}
    for name, spec in (("local", None), ("processes", ExecutorSpec("processes", workers=2))):
        result = calibrate(
            d["model"],
            d["calib"],
            methods=["auto"],
            output=tmp_path / f"{name}.cache",
            use_cache=False,
            show_progress=False,
            batch_size=8,
            executor=spec,
        )
        out[name] = (result.auto.to_dict(), (tmp_path / f"{name}.cache").read_bytes())
    assert out["processes"] == out["local"]
    assert len(out["local"][0]["output_sqnr_db"]) >= 5  # the mix and every method were scored


def test_cli_calibrate_with_processes_writes_the_local_bytes(calib, tmp_path, run_cli):
    common = ["calibrate", calib["model"], "--data", calib["folder"], "--no-cache"]
    code, _, err = run_cli(*common, "-o", tmp_path / "local.cache", "--batch-size", "4")
    assert code == 0, err
    code, _, err = run_cli(
        *common,
        "-o",
        tmp_path / "p.cache",
        "--batch-size",
        "4",
        "--executor",
        "processes",
        "--workers",
        "2",
    )
    assert code == 0, err
    assert "calibrated 2 shards on --executor processes" in err
    assert (tmp_path / "p.cache").read_bytes() == (tmp_path / "local.cache").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--executor", "cluster"], "--executor 'cluster': use one of local, processes, ray"),
        (["--executor", "processes", "--workers", "0"], "--workers 0: give at least 1 worker"),
        (["--ray-address", "auto"], "--ray-address needs --executor ray"),
    ],
)
def test_cli_bad_executor_options_are_one_line_before_any_work(
    calib, tmp_path, run_cli, args, message
):
    out = tmp_path / "t.cache"
    for command in (
        ["calibrate", calib["model"], "--data", calib["file"], "-o", out],
        ["sensitivity", calib["model"], "--data", calib["file"], "--calib-data", calib["file"]],
    ):
        code, _, err = run_cli(*command, *args)
        assert code == 2 and err.strip() == f"error: {message}"
    assert not out.exists()
