"""The cuDNN path's bias pass (plugins/dwconv2d/kernels/cudnn.cuh), run on the CPU (CI, no GPU).

The kernel's own source text is cut out of cudnn.cuh and compiled with g++ against the CUDA
shims of bias_pass_emulation.cpp, which runs every block and thread of each launch in turn and
checks the outputs bit for bit (the fill, the add from a float buffer, the FP32 add in place;
16-byte, narrower and 1-element vectors; misaligned pointers; shared and per-batch biases) and
that nothing outside y is written. It holds the indexing (the plane and bias index stepped
without a division per element), not the speed: that is measured on the device
(tests/gpu/dense_bias_probe.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CUDNN = HERE.parents[1] / "plugins" / "dwconv2d" / "kernels" / "cudnn.cuh"
START = "template <class T, int V>\nstruct alignas"
END = "size_t scratch_bytes(DWConv2DParams const& p)"
LAUNCH = "kernel<<<blocks, kBiasThreads, 0, stream>>>("


def bias_pass_source() -> str:
    """The bias pass's part of cudnn.cuh, its launch rewritten for the emulation."""
    text = CUDNN.read_text()
    body = text[text.index(START) : text.index(END)]
    assert body.count(LAUNCH) == 1, "the bias pass launch changed: update the emulation"
    return body.replace(LAUNCH, "emu_launch(kernel, blocks, kBiasThreads, ")


def test_bias_pass_emulated(tmp_path: Path) -> None:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "bias_body.inc").write_text(bias_pass_source())
    shutil.copy(HERE / "bias_pass_emulation.cpp", tmp_path)
    exe = tmp_path / "emu"
    subprocess.run(
        [compiler, "-std=c++17", "-O1", "-o", str(exe), "bias_pass_emulation.cpp"],
        cwd=tmp_path,
        check=True,
        timeout=300,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " 0 failed" in run.stdout
