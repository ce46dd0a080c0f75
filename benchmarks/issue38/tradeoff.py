"""Metric against cost along a chosen two-stage list: the first k tensors (in the order the
choice kept them) for a few k, each scored on the evaluation set. For the record only (the
choice itself never reads the evaluation set).

    .venv/bin/python benchmarks/issue38/tradeoff.py KEY 4 8 [--base default]
"""

from __future__ import annotations

import argparse
import json

import onnx
import qdqlab as lab
from cost import macs

from quantbench.refine.twostage import two_stage


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("sizes", nargs="+", type=int)
    p.add_argument("--base", default="default")
    a = p.parse_args()
    key = a.key
    base = onnx.load(lab.WORK / f"{key}-{a.base}.onnx")
    chosen = json.loads((lab.WORK / f"{key}-{a.base}-twostage.json").read_text())["chosen"]
    feed = {k: v[:1] for k, v in lab.data(key, "calib", 1).items()}
    ev = lab.data(key, "eval")
    ref = lab.run(key, lab.MODELS[key], ev)
    rows = {}
    for k in a.sizes:
        m = two_stage(base, chosen[:k])
        total, second = macs(m, feed)
        rows[k] = {"added_pct": round(100 * second / (total - second), 1),
                   **lab.score(key, ref, lab.run(key, m, ev))}  # fmt: skip
        print(key, k, rows[k], flush=True)
    (lab.WORK / f"{key}-{a.base}-tradeoff.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
