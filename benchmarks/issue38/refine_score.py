"""Quantize one corpus model with the given refinement passes and added-MACs cap, then score it
on the evaluation set with the corpus' own runner and task metric (issue 38 research).

    .venv/bin/python benchmarks/issue38/refine_score.py KEY [--refine all] [--max-added-macs 1.0]
"""

from __future__ import annotations

import argparse
import json
import time

import qdqlab as lab

from quantbench.quantize import quantize


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--refine", default="all")
    p.add_argument("--max-added-macs", type=float, default=None)
    a = p.parse_args()
    lab.WORK.mkdir(parents=True, exist_ok=True)
    tag = f"{a.key}-{a.refine.replace(',', '+')}-{a.max_added_macs}"
    out = lab.WORK / f"{tag}.onnx"
    t0 = time.perf_counter()
    outcome = quantize(
        lab.MODELS[a.key],
        out,
        data=lab.DATA / a.key / "calib.npz",
        refine=a.refine,
        max_added_macs=a.max_added_macs,
        show_progress=False,
    )
    seconds = time.perf_counter() - t0
    ev = lab.data(a.key, "eval")
    ref = lab.run(a.key, lab.MODELS[a.key], ev)
    got = lab.score(a.key, ref, lab.run(a.key, str(out), ev))
    kept = [t.name for t in outcome.refine.trials if t.kept] if outcome.refine else []
    doc = {"key": a.key, "refine": a.refine, "max_added_macs": a.max_added_macs,
           "seconds": round(seconds, 1), "kept": kept, **got}  # fmt: skip
    print(json.dumps(doc), flush=True)
    (lab.WORK / f"{tag}.json").write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
