"""Which of a two-stage search's tensors helps, and where (issue 38): each subset of the given
tensors put in two stages on a Q/DQ model, scored on the evaluation set (the corpus' task
metric) and by the worst output SQNR against FP32 on calibration sample ranges.

    .venv/bin/python benchmarks/issue38/twostage_subsets.py KEY QDQ.onnx TENSOR [TENSOR ...] \
        [--ranges 0:64,64:300] [--max-size 2]

Found with it (Session 34, on the default's Q/DQ model): on silero-vad the first encoder
activation alone costs the recording 1.4 points and 12.9 dB over calibration chunks 64-300 (2.2
on the 64-chunk slice); added to the second activation, the slice scores it +0.35 dB and chunks
64-300 -6.9 dB.
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import onnx
import qdqlab as lab

from quantbench.refine import twostage as ts


def _worst_sqnr(reference: list, outputs: list) -> float:
    """The worst output's SQNR (dB) over the given runs."""
    worst = np.inf
    for k in range(len(reference[0])):
        r = np.concatenate([np.ravel(x[k]).astype(np.float64) for x in reference])
        c = np.concatenate([np.ravel(x[k]).astype(np.float64) for x in outputs])
        worst = min(worst, 10 * np.log10(np.sum(r**2) / max(np.sum((r - c) ** 2), 1e-30)))
    return float(worst)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("qdq")
    p.add_argument("tensors", nargs="+")
    p.add_argument("--ranges", default="0:64,64:", help="calibration sample ranges to score on")
    p.add_argument("--max-size", type=int, default=None, help="largest subset (default: all)")
    a = p.parse_args()
    base = onnx.load(a.qdq)
    evals = lab.data(a.key, "eval")
    reference = lab.run(a.key, lab.MODELS[a.key], evals)
    calib = lab.data(a.key, "calib")
    total = len(next(iter(calib.values())))
    feeds = [{k: v[i] for k, v in calib.items()} for i in range(total)]
    fp32 = lab.session(lab.MODELS[a.key])
    calib_ref = [fp32.run(None, f) for f in feeds]
    ranges = [tuple(int(x) if x else None for x in r.split(":")) for r in a.ranges.split(",")]
    top = a.max_size or len(a.tensors)
    for size in range(top + 1):
        for subset in itertools.combinations(a.tensors, size):
            model = ts.two_stage(base, list(subset)) if subset else base
            got = lab.score(a.key, reference, lab.run(a.key, model, evals))
            session = lab.session(model)
            outs = [session.run(None, f) for f in feeds]
            sqnr = {f"{lo or 0}:{hi or total}": round(_worst_sqnr(calib_ref[lo:hi], outs[lo:hi]), 2)
                    for lo, hi in ranges}  # fmt: skip
            print(json.dumps({"tensors": list(subset), **got, "calib_sqnr_db": sqnr}), flush=True)


if __name__ == "__main__":
    main()
