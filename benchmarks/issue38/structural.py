"""Issue 38: what structural changes to a few activation tensors' quantization would buy, measured
on the default Q/DQ model (_work/issue38/KEY-default.onnx), the activation's scale from its table:

* ``fp32@T``       T's Q/DQ removed (the ceiling for T);
* ``pc@T``         T quantized per channel (axis 1; the channel maxima of the fit samples, each
                   capped at the table's amax): what TensorRT cannot do, the ceiling of groups;
* ``groups@T@G``   T's channels in G groups by their maxima (sorted, equal-log-range cuts), one
                   per-tensor scale per group: what splitting T's readers (Conv over channel
                   groups, outputs summed) would give, every op INT8;
* ``res@T``        two-stage (residual) INT8: x1 = DQ(Q(T)), x2 = DQ(Q(T - x1)) at a 1/64 scale,
                   readers read x1 + x2 (= each reader run twice in INT8 and summed: linear ops).

Several specs joined by '+' apply together. Scored on the evaluation set (task metric) and the
held-back calibration slice (metric-output SQNR).

    .venv/bin/python benchmarks/issue38/structural.py KEY SPEC [SPEC ...]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnx
import qdqlab as lab
from onnx import helper, numpy_helper

from quantbench.model.graph import toposorted
from quantbench.refine.twostage import qdq_pair


def channel_max(key: str, fp32: str, tensors: list[str], fit) -> dict[str, np.ndarray]:
    m = onnx.load(fp32)
    for t in tensors:
        m.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    s = lab.session(m)
    names = [i.name for i in s.get_inputs()]
    count = len(next(iter(fit.values())))
    found: dict[str, np.ndarray] = {}
    for i in range(count):
        feed = {k: v[i : i + 1] for k, v in fit.items() if k in names}
        for t, v in zip(tensors, s.run(tensors, feed)):
            cm = np.abs(v).reshape(v.shape[0], v.shape[1], -1).max(axis=(0, 2))
            found[t] = cm if t not in found else np.maximum(found[t], cm)
    return found


def per_channel(m: onnx.ModelProto, tensor: str, scales: np.ndarray) -> None:
    q, dq = qdq_pair(m, tensor)
    inits = {i.name: i for i in m.graph.initializer}
    name_s, name_z = f"{tensor}_pc_scale", f"{tensor}_pc_zp"
    m.graph.initializer.extend([
        numpy_helper.from_array(scales.astype(np.float32), name_s),
        numpy_helper.from_array(np.zeros(len(scales), np.int8), name_z),
    ])  # fmt: skip
    del inits
    for n in (q, dq):
        n.input[1], n.input[2] = name_s, name_z
        n.attribute.append(helper.make_attribute("axis", 1))


def grouped(amax: float, cmax: np.ndarray, groups: int) -> np.ndarray:
    """Per-channel scales where the channels share G scales: sorted by maximum, cut at equal
    steps of log range; each group's scale its largest member's (capped at the table's)."""
    c = np.minimum(cmax, amax)
    if groups >= len(c):
        return np.maximum(c, 1e-8) / 127
    logs = np.log(np.maximum(c, 1e-8))
    edges = np.linspace(logs.min(), logs.max(), groups + 1)[1:-1]
    which = np.searchsorted(edges, logs)
    out = np.empty_like(c)
    for g in np.unique(which):
        out[which == g] = c[which == g].max()
    return out / 127


def residual(m: onnx.ModelProto, tensor: str, ratio: float = 64.0) -> None:
    q, dq = qdq_pair(m, tensor)
    inits = {i.name: i for i in m.graph.initializer}
    scale = float(numpy_helper.to_array(inits[q.input[1]]))
    d1 = dq.output[0]
    r, d2, s2, z2, both = (f"{tensor}_{x}" for x in ("res", "res_dq", "res_scale", "res_zp",
                                                     "two_stage"))  # fmt: skip
    m.graph.initializer.extend([numpy_helper.from_array(np.float32(scale / ratio), s2),
                                numpy_helper.from_array(np.int8(0), z2)])  # fmt: skip
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            if i == d1:
                n.input[k] = both
    m.graph.node.extend([
        helper.make_node("Sub", [tensor, d1], [r]),
        helper.make_node("QuantizeLinear", [r, s2, z2], [r + "_q"]),
        helper.make_node("DequantizeLinear", [r + "_q", s2, z2], [d2]),
        helper.make_node("Add", [d1, d2], [both]),
    ])  # fmt: skip
    for o in m.graph.output:
        if o.name == d1:
            raise ValueError("output")




def build(key: str, specs: list[str], fit) -> onnx.ModelProto:
    base = onnx.load(lab.WORK / f"{key}-default.onnx")
    table = json.loads((lab.WORK / f"{key}-default.json").read_text())["table"]
    m = base
    drop = {s.split("@")[1] for s in specs if s.startswith("fp32@")}
    if drop:
        m = lab.variant(base, set(lab.activations(base)) - drop)
    need = [s.split("@")[1] for s in specs if s.split("@")[0] in ("pc", "groups")]
    cmax = channel_max(key, lab.MODELS[key], need, fit) if need else {}
    for s in specs:
        kind, tensor, *rest = s.split("@")
        if kind == "pc":
            per_channel(m, tensor, grouped(table[tensor]["amax"], cmax[tensor], 10**9))
        elif kind == "groups":
            per_channel(m, tensor, grouped(table[tensor]["amax"], cmax[tensor], int(rest[0])))
        elif kind == "res":
            residual(m, tensor)
    return toposorted(m)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("specs", nargs="+", help="e.g. pc@140 groups@140@2 res@140 fp32@140+fp32@144")
    p.add_argument("--no-eval", action="store_true")
    a = p.parse_args()
    key = a.key
    idx = lab.METRIC_OUTPUT[key]
    calib = lab.load(lab.DATA / key / "calib.npz")
    total = len(next(iter(calib.values())))
    held = min(64, total // 2)
    fit = {k: v[held:] for k, v in calib.items()}
    slice_ = {k: v[:held] for k, v in calib.items()}
    ref_slice = lab.run(key, lab.MODELS[key], slice_)
    default = onnx.load(lab.WORK / f"{key}-default.onnx")
    models = {"default": default}
    for spec in a.specs:
        models[spec] = build(key, spec.split("+"), fit)
    ev = None if a.no_eval else lab.data(key, "eval")
    ref = None if ev is None else lab.run(key, lab.MODELS[key], ev)
    results = {}
    for name, m in models.items():
        t0 = time.perf_counter()
        row = {"slice_db": round(lab.sqnr(ref_slice, lab.run(key, m, slice_), idx), 2)}
        if ev is not None:
            row.update(lab.score(key, ref, lab.run(key, m, ev)))
        row["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = row
        print(name, row, flush=True)
    path = lab.WORK / f"{key}-structural.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**earlier, **results}, indent=1))


if __name__ == "__main__":
    main()
