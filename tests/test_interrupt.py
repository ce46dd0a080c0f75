"""Ctrl-C: exit 130 and one word of what happened. typer turned the interrupt into Exit(130)
before quantbench's handler saw it, so the run ended silently."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import synthetic

LOADER = """
import time
from pathlib import Path

import numpy as np


def load_data():
    yield {{"input": np.zeros((1, 3, 16, 16), np.float32)}}
    # the next read, on the read-ahead thread: the signal comes while the pass waits for it
    Path({started!r}).write_text("started")
    time.sleep(40)
    for i in range(600):
        time.sleep(0.1)
        yield {{"input": np.full((1, 3, 16, 16), i % 7, np.float32)}}
"""


def test_ctrl_c_says_nothing_was_written(tmp_path):
    """Exit 130 at once, without waiting for the loader's read in flight (40 s here)."""
    model = synthetic.save(synthetic.small_cnn(), tmp_path / "cnn.onnx")
    started, out = tmp_path / "started", tmp_path / "out.cache"
    loader = tmp_path / "loader.py"
    loader.write_text(LOADER.format(started=str(started)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantbench", "calibrate", str(model), "--data", str(loader),
         "-m", "minmax", "-o", str(out), "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=5)
        time.sleep(0.3)  # inside the pass
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        _, err = proc.communicate(timeout=90)
        waited = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert waited < 20, f"exit took {waited:.1f} s: it waited for the loader's 40 s read"
    assert "interrupted: nothing was written" in " ".join(err.split())
    assert "Traceback" not in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "loader.py", "started"]


def test_interrupt_after_a_write_names_what_was_written(tmp_path, monkeypatch, capsys):
    """A command writing several files (calibrate --method all, recover) interrupted between
    two says which complete files it left, rather than "nothing was written"."""
    from quantbench import cli, fileio

    monkeypatch.setattr(fileio, "_WRITTEN", [])
    fileio.write_text_atomic(tmp_path / "a.cache", "x")
    assert cli._interrupted() == 130
    err = " ".join(capsys.readouterr().err.split())
    assert f"only {tmp_path / 'a.cache'} written before it" in err
    assert "nothing was written" not in err
