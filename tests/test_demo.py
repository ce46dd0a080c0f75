"""`make demo` shows the user what it made: its compare measures the model its quantize wrote,
not an INT8 it calibrated again on its own (issue "A newcomer's first hour", item 3)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _demo_commands() -> tuple[list[list[str]], list[str]]:
    """The demo's quantbench command lines (make -n: printed, not run) and its echo lines."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", "STAMP=", "OUT=out/demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    joined = out.replace("\\\n", " ")
    commands = [shlex.split(line) for line in joined.splitlines() if "bin/quantbench " in line]
    echoes = [line for line in joined.splitlines() if line.startswith("echo ")]
    starts = [next(i for i, w in enumerate(c) if w.endswith("bin/quantbench")) for c in commands]
    args = [c[i + 1 :] for c, i in zip(commands, starts)]
    return args, echoes


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_demo_compares_the_model_it_quantized():
    commands, echoes = _demo_commands()
    quantize = next(c for c in commands if c[0] == "quantize")
    compare = next(c for c in commands if c[0] == "compare")
    written = _option(quantize, "-o")
    assert compare[1:3] == ["fp32", written]  # B is the file the user now holds
    # the table quantize read is the one the demo's calibrate wrote with the default method
    table = _option(quantize, "--table")
    makers = [c for c in commands if c[0] == "calibrate" and _option(c, "-o") == table]
    assert len(makers) == 1 and "--method" not in makers[0] and "-m" not in makers[0]
    # it ends with the report's path, naming the model it compared
    report = _option(compare, "--report")
    assert report in echoes[-1] and written in echoes[-1]
