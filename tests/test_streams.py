"""Results on stdout (``| less`` pages them), progress and warnings on stderr."""

from __future__ import annotations

import subprocess
import sys

from conftest import require_example


def _quantbench(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quantbench", *map(str, args)], capture_output=True, text=True
    )


def test_inspect_tables_go_to_stdout():
    ex = require_example()
    done = _quantbench("inspect", ex / "tinycnn.onnx")
    assert done.returncode == 0, done.stderr
    assert "inputs:" in done.stdout and "inputs:" not in done.stderr


def test_compare_summary_on_stdout_warnings_on_stderr(tmp_path):
    ex = require_example()
    done = _quantbench(
        "compare", "fp32", "int8", "--model", ex / "tinycnn.onnx", "--data", ex / "eval.npz",
        "--calib-data", ex / "calib.npz", "-m", "entropy:slides", "--no-latency",
        "--max-samples", "16",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert " vs " in done.stdout and " vs " not in done.stderr
    assert "--clip-warn" in done.stderr and "--clip-warn" not in done.stdout
