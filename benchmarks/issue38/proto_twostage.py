"""Prototype of quantbench.refine.twostage on a corpus model's default Q/DQ model.

Everything chosen on calibration data only: the tensors ranked by their metric-free
sensitivity (worst output SQNR with only that activation quantized, weights FP32) on the fit
samples (the calibration samples after auto's held-back slice), then tried greedily, each kept
when the worst output SQNR on the held-back slice gains >= 0.01 dB (quantbench's refine rule).
The chosen model is then scored once on the evaluation set with the task metric.

    .venv/bin/python benchmarks/issue38/proto_twostage.py KEY \
        [--base default|refine-all] [--budget 16] [--rank-samples 8]
"""

from __future__ import annotations

import argparse
import json
import time

import onnx
import qdqlab as lab

from quantbench.refine.twostage import PREFIXES, choose, choose_greedy, two_stage


def worst(ref, out) -> float:
    return min(lab.sqnr(ref, out, i) for i in range(len(ref[0])))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--base", default="default")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--rank-samples", type=int, default=8)
    p.add_argument("--candidates", type=int, default=24, help="the N most sensitive tried")
    p.add_argument("--tensors", default="", help="comma list: skip the choice, use these")
    p.add_argument(
        "--strategy",
        default="best",
        choices=("best", "greedy", "prefix"),
        help="one at a time, best prefix first, or the better of both on the slice",
    )
    p.add_argument(
        "--max-macs",
        type=float,
        default=None,
        help="at most this fraction of the model's linear-op MACs added",
    )
    p.add_argument("--tag", default="")
    a = p.parse_args()
    key = a.key
    qdq = onnx.load(lab.WORK / f"{key}-{a.base}.onnx")
    held, fit, slice_ = lab.split(key, a.rank_samples)
    fp32 = lab.MODELS[key]
    t0 = time.perf_counter()
    other = None
    if a.tensors:
        ranked, choice = a.tensors.split(","), None
        chosen = ranked
    else:
        ref_fit = lab.run(key, fp32, fit)
        acts = lab.activations(qdq)
        only = {t: worst(ref_fit, lab.run(key, lab.variant(qdq, {t}, weights=False), fit))
                for t in acts}  # fmt: skip
        ranked = sorted(acts, key=only.get)[: a.candidates]
        t_rank = time.perf_counter() - t0
        ref_slice = lab.run(key, fp32, slice_)

        def judged(tensors) -> float:
            m = two_stage(qdq, list(tensors)) if tensors else qdq
            return worst(ref_slice, lab.run(key, m, slice_))

        other = None
        limits = {"budget": a.budget}
        if a.max_macs is not None:
            from cost import reader_macs

            first = {k: v[:1] for k, v in fit.items()}
            each = reader_macs(qdq, first)[0]
            limits.update(cost=lambda ts: sum(each.get(t, 0.0) for t in ts), max_cost=a.max_macs)
        if a.strategy == "best":
            choice, other = choose(ranked, judged, **limits)
        else:
            prefixes = PREFIXES if a.strategy == "prefix" else ()
            choice = choose_greedy(ranked, judged, prefixes=prefixes, **limits)
        chosen = choice.tensors
        if other is not None:
            print(
                f"other search: {other.score_db:.2f} dB with {len(other.tensors)} tensors: "
                f"{other.tensors}",
                flush=True,
            )
        for t, s, k in choice.trials:
            print(f"  {t[-50:]}: {s:.2f} dB {'kept' if k else ''}", flush=True)
        print(
            f"rank {t_rank:.0f} s; slice {choice.base_db:.2f} -> {choice.score_db:.2f} dB, "
            f"{len(chosen)} tensors",
            flush=True,
        )
    seconds = time.perf_counter() - t0
    model = two_stage(qdq, chosen)
    onnx.save(model, lab.WORK / f"{key}-{a.base}-twostage{a.tag}.onnx")
    other_model = None if a.tensors or other is None else two_stage(qdq, other.tensors)
    ev = lab.data(key, "eval")
    ref = lab.run(key, fp32, ev)
    res = {
        a.base: lab.score(key, ref, lab.run(key, qdq, ev)),
        "twostage": lab.score(key, ref, lab.run(key, model, ev)),
    }
    if other_model is not None:  # for the record only: not the chosen model
        res["other search (not chosen)"] = lab.score(key, ref, lab.run(key, other_model, ev))
    for k, v in res.items():
        print(k, v, flush=True)
    doc = {
        "chosen": chosen,
        "seconds": round(seconds, 1),
        "eval": res,
        "args": vars(a),
        "trials": choice.trials if choice else None,
        "slice_db": [choice.base_db, choice.score_db] if choice else None,
        "other": None
        if other is None
        else {"tensors": other.tensors, "slice_db": other.score_db, "trials": other.trials},
    }
    (lab.WORK / f"{key}-{a.base}-twostage{a.tag}.json").write_text(
        json.dumps(doc, indent=1, default=float)
    )


if __name__ == "__main__":
    main()
