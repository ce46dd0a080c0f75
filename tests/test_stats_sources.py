"""Where ``calibrate``'s statistics come from: ``--merge`` of one file twice said 256 samples
where there were 128, and ``--data`` beside ``--stats`` was silently not read."""

from __future__ import annotations

import numpy as np

from quantbench.stats.tensorstats import StatsFile


def _shard(run_cli, cnn_path, tmp_path, name: str, seed: int) -> tuple:
    import synthetic

    data = tmp_path / f"{name}.npz"
    np.savez(data, input=synthetic.images(16, seed=seed))
    stats = tmp_path / f"{name}.stats"
    code, _, err = run_cli("calibrate", cnn_path, "--data", data, "-m", "minmax",
                           "--save-stats", stats)  # fmt: skip
    assert code == 0, err
    return data, stats


def test_merging_the_same_data_twice_is_refused(run_cli, cnn_path, tmp_path):
    _, h1 = _shard(run_cli, cnn_path, tmp_path, "h1", 1)
    copy = tmp_path / "copy.stats"
    copy.write_bytes(h1.read_bytes())
    out = tmp_path / "t.cache"
    for twice in ((h1, h1), (h1, copy)):
        code, _, err = run_cli("calibrate", cnn_path, "--merge", twice[0], "--merge", twice[1],
                               "-m", "minmax", "-o", out)  # fmt: skip
        line = " ".join(err.split())
        assert code == 2, err
        assert f"{twice[0]} and {twice[1]} hold the same data" in line and "16 samples" in line
        assert not out.exists()


def test_distinct_shards_still_merge_to_their_sum(run_cli, cnn_path, tmp_path):
    _, h1 = _shard(run_cli, cnn_path, tmp_path, "h1", 1)
    _, h2 = _shard(run_cli, cnn_path, tmp_path, "h2", 2)
    merged = tmp_path / "m.stats"
    code, _, err = run_cli("calibrate", cnn_path, "--merge", h1, "--merge", h2, "-m", "minmax",
                           "--save-stats", merged)  # fmt: skip
    assert code == 0, err
    assert StatsFile.load(merged).num_samples == 32


def test_data_beside_stats_is_refused_where_nothing_reads_it(run_cli, cnn_path, tmp_path):
    data, h1 = _shard(run_cli, cnn_path, tmp_path, "h1", 1)
    out = tmp_path / "t.cache"
    code, _, err = run_cli("calibrate", cnn_path, "--stats", h1, "--data", data, "-m", "minmax",
                           "-o", out)  # fmt: skip
    assert code == 2, err
    assert f"--data {data}: not read, the statistics come from --stats" in " ".join(err.split())
    assert not out.exists()


def test_data_beside_stats_is_said_to_serve_auto(run_cli, cnn_path, tmp_path):
    data, h1 = _shard(run_cli, cnn_path, tmp_path, "h1", 1)
    code, _, err = run_cli("calibrate", cnn_path, "--stats", h1, "--data", data, "-m", "auto",
                           "-o", tmp_path / "t.cache")  # fmt: skip
    assert code == 0, err
    assert f"--data {data} serves only --method auto" in " ".join(err.split())
