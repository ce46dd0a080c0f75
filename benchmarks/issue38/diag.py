"""Issue 38 diagnosis of one corpus model's default Q/DQ model (_work/issue38/KEY-default.onnx):

* on the evaluation set: task metric and metric-output SQNR of the default, weights-only INT8
  (activation Q/DQ removed) and activations-only INT8 (weight Q/DQ removed);
* on the first N calibration samples: per activation tensor, the metric-output SQNR with only
  that tensor quantized (weights FP32) and, with --loo, with only that tensor left FP32 in the
  default model.

    .venv/bin/python benchmarks/issue38/diag.py KEY [--n 16] [--loo]
"""

from __future__ import annotations

import argparse
import json
import time

import onnx
import qdqlab as lab


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--loo", action="store_true")
    p.add_argument("--skip-eval", action="store_true")
    p.add_argument("--weights-attr", action="store_true", help="also per weight, only it INT8")
    a = p.parse_args()
    key, idx = a.key, lab.METRIC_OUTPUT[a.key]
    fp32 = lab.MODELS[key]
    qdq = onnx.load(lab.WORK / f"{key}-default.onnx")
    acts = lab.activations(qdq)
    out: dict = {
        "key": key,
        "activations": len(acts),
        "weights": sum(w for _, _, w in lab.pairs(qdq)),
    }
    print(key, out, flush=True)
    if not a.skip_eval:
        ev = lab.data(key, "eval")
        t0 = time.perf_counter()
        ref = lab.run(key, fp32, ev)
        out["eval_fp32_seconds"] = round(time.perf_counter() - t0, 1)
        rows = {}
        for name, m in (
            ("default", qdq),
            ("weights-only", lab.variant(qdq, set())),
            ("activations-only", lab.variant(qdq, None, weights=False)),
        ):
            o = lab.run(key, m, ev)
            rows[name] = {**lab.score(key, ref, o), "sqnr_db": round(lab.sqnr(ref, o, idx), 2)}
            print(name, rows[name], flush=True)
        out["eval"] = rows
        del ref, ev
    cal = lab.data(key, "calib", a.n)
    ref = lab.run(key, fp32, cal)
    per = {}
    t0 = time.perf_counter()
    full = lab.sqnr(ref, lab.run(key, qdq, cal), idx)
    acts_only = lab.sqnr(ref, lab.run(key, lab.variant(qdq, None, weights=False), cal), idx)
    w_only = lab.sqnr(ref, lab.run(key, lab.variant(qdq, set()), cal), idx)
    out["calib"] = {
        "n": a.n,
        "default_db": round(full, 2),
        "acts_only_db": round(acts_only, 2),
        "weights_only_db": round(w_only, 2),
    }
    print(out["calib"], flush=True)
    for t in acts:
        row = {
            "only": round(
                lab.sqnr(ref, lab.run(key, lab.variant(qdq, {t}, weights=False), cal), idx), 2
            )
        }
        if a.loo:
            row["leave_out"] = round(
                lab.sqnr(ref, lab.run(key, lab.variant(qdq, set(acts) - {t}), cal), idx), 2
            )
        per[t] = row
        print(t, row, flush=True)
    if a.weights_attr:
        wper = {}
        for w in lab.weight_names(qdq):
            wper[w] = round(
                lab.sqnr(ref, lab.run(key, lab.variant(qdq, set(), weights={w}), cal), idx), 2
            )
            print("weight", w, wper[w], flush=True)
        out["per_weight_only"] = dict(sorted(wper.items(), key=lambda kv: kv[1]))
    out["per_tensor_seconds"] = round(time.perf_counter() - t0, 1)
    out["per_tensor"] = dict(sorted(per.items(), key=lambda kv: kv[1]["only"]))
    path = lab.WORK / f"{key}-diag.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**earlier, **out}, indent=1))


if __name__ == "__main__":
    main()
