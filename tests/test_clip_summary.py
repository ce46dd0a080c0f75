"""``calibrate --method all`` names the clipping of methods the user did not choose in a line
each, not a line per tensor (the bundled demo opened with a screen of them); the per-tensor
lines stay in the report and in a single method's warning, capped."""

from __future__ import annotations

import re

from conftest import require_example


def _clip_block(err: str) -> list[str]:
    """The clipping warning: its header and its indented lines."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if "--clip-warn" in line)
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_all_methods_get_one_line_each_and_the_report_keeps_the_tensors(run_cli, tmp_path):
    ex = require_example()
    args = [ex / "tinycnn.onnx", "--data", ex / "calib.npz", "--no-cache"]
    code, _, err = run_cli("calibrate", *args, "-m", "entropy:slides", "-o", tmp_path / "s.cache")
    assert code == 0
    single = _clip_block(err)
    count = int(re.search(r"entropy:slides: (\d+) tensor\(s\) clip", single[0]).group(1))
    tensors = [line.split(":")[0].strip() for line in single[1:] if "threshold" in line]
    assert count >= 2 and len(tensors) == min(count, 10)
    report = tmp_path / "all.html"
    code, _, err = run_cli(
        "calibrate", *args, "-m", "all", "-o", tmp_path / "all", "--report", report
    )
    assert code == 0
    block = _clip_block(err)
    assert "--report PAGE" in block[0]
    methods = [line.strip().split(": ")[0] for line in block[1:]]
    assert len(methods) == len(set(methods)) and "entropy:slides" in methods
    assert not any("threshold" in line for line in block[1:])  # no per-tensor line
    line = next(line for line in block[1:] if line.strip().startswith("entropy:slides:"))
    assert f"entropy:slides: {count} tensor(s)" in line
    html = report.read_text(encoding="utf-8").replace("<wbr>", "")
    assert all(f">{t}<" in html for t in tensors)


def test_a_single_method_lists_ten_tensors_and_says_how_many_more(run_cli, tmp_path):
    ex = require_example()
    code, _, err = run_cli(
        "calibrate", ex / "tinycnn.onnx", "--data", ex / "calib.npz", "--no-cache",
        "-m", "entropy", "--clip-warn", "0", "-o", tmp_path / "e.cache",
    )  # fmt: skip
    assert code == 0
    block = _clip_block(err)
    count = int(re.search(r"(\d+) tensor\(s\) clip", block[0]).group(1))
    assert count > 10
    assert len(block) == 1 + 10 + 1
    assert block[-1].strip().startswith(f"... and {count - 10} more")


def test_auto_says_why_its_table_can_clip(run_cli, cnn_path, tmp_path):
    """auto's candidates are calibrated without the samples it judges on: where those hold
    the largest values, even a minmax range clips them, and the warning says why (the EEG
    spindle detector's warning read "minmax threshold 8.453 clips 0.25%", unexplained)."""
    import numpy as np
    import synthetic

    x = synthetic.images(40, seed=4)
    x[:20] *= 4  # the first 20 samples, auto's held-back slice, hold the largest values
    np.savez(tmp_path / "d.npz", input=x)
    code, _, err = run_cli("calibrate", cnn_path, "--data", tmp_path / "d.npz",
                           "-o", tmp_path / "t.cache")  # fmt: skip
    assert code == 0, err
    block = _clip_block(err)
    assert any(line.startswith("  input:") for line in block), block
    assert block[-1] == (
        "  (auto's table is calibrated without the 20 samples it judges on, held back: their "
        "values can exceed its ranges, minmax's too)"
    )
    # the same data judged on a separate slice holds nothing back: no such line
    np.savez(tmp_path / "h.npz", input=x[:20])
    code, _, err = run_cli("calibrate", cnn_path, "--data", tmp_path / "d.npz", "--holdout-data",
                           tmp_path / "h.npz", "-o", tmp_path / "u.cache")  # fmt: skip
    assert code == 0 and "held back: their values" not in err, err
