"""--method auto's judgement is reused only with the same model, statistics, data and options
(it takes minutes on a large model, and every command judged again: CRAFT 1m31 per command)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import synthetic

REUSED = "that judgement is an earlier run's"


def _calibrate(run_cli, model, data, out, *more):
    code, _, err = run_cli("calibrate", model, "--data", data, "-o", out, *more)
    assert code == 0, err
    return err


def test_the_same_judgement_is_reused_and_gives_the_same_table(run_cli, cnn_path, cnn_data,
                                                               tmp_path):  # fmt: skip
    first = _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "a.cache")
    assert REUSED not in first
    again = _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "b.cache", "--report",
                       tmp_path / "b.html")  # fmt: skip
    assert REUSED in again
    assert "earlier run's with the same model, statistics, data and options, reused" in (
        tmp_path / "b.html"
    ).read_text()
    assert (tmp_path / "a.cache").read_bytes() == (tmp_path / "b.cache").read_bytes()
    fresh = _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "c.cache", "--no-cache")
    assert REUSED not in fresh
    assert (tmp_path / "c.cache").read_bytes() == (tmp_path / "a.cache").read_bytes()


def test_other_data_or_options_are_judged_again(run_cli, cnn_path, cnn_data, tmp_path):
    _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "a.cache")
    other = tmp_path / "other.npz"
    np.savez(other, input=synthetic.images(64, seed=9))
    assert REUSED not in _calibrate(run_cli, cnn_path, other, tmp_path / "b.cache")
    batched = _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "c.cache", "--batch-size", "4")
    assert REUSED not in batched


def test_a_damaged_record_is_judged_again(run_cli, cnn_path, cnn_data, tmp_path):
    _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "a.cache")
    records = list((Path(os.environ["QUANTBENCH_CACHE"]) / "auto").glob("*.json"))
    assert len(records) == 1
    records[0].write_text('{"key": "truncated')
    err = _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "b.cache")
    assert REUSED not in err
    assert (tmp_path / "a.cache").read_bytes() == (tmp_path / "b.cache").read_bytes()


def test_another_build_of_quantbench_judges_again(run_cli, cnn_path, cnn_data, tmp_path,
                                                  monkeypatch):  # fmt: skip
    """An upgrade or an edited calibrator must not reuse an older build's judgement."""
    from quantbench.choose import automemo

    _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "a.cache")
    monkeypatch.setattr(automemo, "_code_fingerprint", lambda: "another build")
    assert REUSED not in _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "b.cache")
    assert REUSED in _calibrate(run_cli, cnn_path, cnn_data, tmp_path / "c.cache")
