"""Prototype: per-tensor activation-scale refinement judged end to end at the outputs.

Coordinate descent over multipliers of each activation tensor's scale in the default Q/DQ
model (_work/issue38/KEY-default.onnx), fitted on calibration samples [H:H+N] (H = the held-back
slice auto judged on), checked on the held-back slice [0:H], then scored once on the
evaluation set with the task metric. Objective: the worst output's SQNR (quantbench's rule),
or, with --objective metric-output, the SQNR of the output the task metric reads.

    .venv/bin/python benchmarks/issue38/proto_scales.py KEY [--n 32]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnx
import qdqlab as lab

MULTIPLIERS = (0.6, 0.75, 0.9, 1.1, 1.25)


def objective(ref, out, indices) -> float:
    return min(lab.sqnr(ref, out, i) for i in indices)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--n", type=int, default=32, help="fit samples")
    p.add_argument("--held", type=int, default=None, help="held-back slice (default: auto's)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--top", type=int, default=0, help="only the N most sensitive tensors")
    p.add_argument("--objective", default="worst", choices=("worst", "metric-output"))
    p.add_argument("--tag", default="")
    a = p.parse_args()
    key = a.key
    qdq = onnx.load(lab.WORK / f"{key}-default.onnx")
    held, fit, slice_ = lab.split(key, a.n, a.held)
    fp32 = lab.MODELS[key]
    ref_fit = lab.run(key, fp32, fit)
    n_out = len(ref_fit[0])
    idx = [lab.METRIC_OUTPUT[key]] if a.objective == "metric-output" else list(range(n_out))
    acts = lab.activations(qdq)
    diag = lab.WORK / f"{key}-diag.json"
    if diag.is_file():  # most sensitive first (the diagnosis ran on calibration samples)
        per = json.loads(diag.read_text())["per_tensor"]
        acts.sort(key=lambda t: per.get(t, {}).get("only", 99.0))
    if a.top:
        acts = acts[: a.top]
    t0 = time.perf_counter()
    scales: dict[str, float] = {}

    def score(s: dict[str, float]) -> float:
        return objective(ref_fit, lab.run(key, lab.variant(qdq, scales=s), fit), idx)

    best = base = score(scales)
    print(f"{key}: fit {a.n} samples, held-back {held}; base {base:.2f} dB", flush=True)
    for r in range(a.rounds):
        moved = False
        for t in acts:
            now = scales.get(t, 1.0)
            for m in MULTIPLIERS if r == 0 else (0.9, 1.1):
                trial = {**scales, t: now * m}
                found = score(trial)
                if found > best + 0.01:
                    best, scales, moved = found, trial, True
            print(f"  round {r} {t[-40:]}: x{scales.get(t, 1.0):.3f} -> {best:.2f} dB", flush=True)
        if not moved:
            break
    seconds = time.perf_counter() - t0
    refined = lab.variant(qdq, scales=scales)
    ref_slice = lab.run(key, fp32, slice_)
    before = objective(ref_slice, lab.run(key, qdq, slice_), idx)
    after = objective(ref_slice, lab.run(key, refined, slice_), idx)
    print(
        f"fit {base:.2f} -> {best:.2f} dB; held-back slice {before:.2f} -> {after:.2f} dB; "
        f"{seconds:.0f} s",
        flush=True,
    )
    ev = lab.data(key, "eval")
    ref = lab.run(key, fp32, ev)
    res = {
        "default": lab.score(key, ref, lab.run(key, qdq, ev)),
        "scales": lab.score(key, ref, lab.run(key, refined, ev)),
    }
    for k, v in res.items():
        print(k, v, flush=True)
    onnx.save(refined, lab.WORK / f"{key}-scales{a.tag}.onnx")
    out = {
        "fit_db": [base, best],
        "slice_db": [before, after],
        "seconds": seconds,
        "scales": scales,
        "eval": res,
        "args": vars(a),
    }
    (lab.WORK / f"{key}-scales{a.tag}.json").write_text(json.dumps(out, indent=1, default=float))
    np.set_printoptions(precision=3)


if __name__ == "__main__":
    main()
