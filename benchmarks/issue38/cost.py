"""Cost of a two-stage model against its base: the MACs of the linear ops (Conv, MatMul, Gemm)
the second stage adds, and onnxruntime CPU latency per sample (median of a few runs; 2 shared
cores, indicative only: TensorRT fuses differently).

    .venv/bin/python benchmarks/issue38/cost.py KEY [--base default]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnx
import qdqlab as lab
from onnx import helper

LINEAR = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def macs(model: onnx.ModelProto, feed) -> tuple[float, float]:
    """(all linear ops' MACs, the second stage's) for one sample."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    producer = {o: n for n in m.graph.node for o in n.output}
    inits = {i.name: i for i in m.graph.initializer}
    nodes = [n for n in m.graph.node if n.op_type in LINEAR]
    for n in nodes:
        m.graph.output.append(helper.make_tensor_value_info(n.output[0], 1, None))
    s = lab.session(m)
    outs = s.run([n.output[0] for n in nodes], feed)

    def weight_shape(name: str):
        node = producer.get(name)
        while node is not None and node.op_type in ("DequantizeLinear", "QuantizeLinear"):
            name = node.input[0]
            node = producer.get(name)
        return list(inits[name].dims) if name in inits else None

    total = second = 0.0
    for n, y in zip(nodes, outs):
        w = weight_shape(n.input[1])
        if w is None:
            continue
        per = np.prod(w[1:]) if n.op_type.startswith("Conv") else w[0]
        if n.op_type == "Gemm":
            per = w[1] if any(a.name == "transB" and a.i for a in n.attribute) else w[0]
        cost = float(y.size) * float(per)
        total += cost
        if "_stage2_dq" in n.input[0]:
            second += cost
    return total, second


def reader_macs(model: onnx.ModelProto, feed) -> tuple[dict[str, float], float]:
    """Per activation tensor, the MACs of its linear readers (what its second stage adds), as
    a fraction of all linear ops' MACs of the Q/DQ ``model``."""
    from quantbench.refine.twostage import LINEAR_READERS, qdq_pair

    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = [n for n in m.graph.node if n.op_type in LINEAR]
    for n in nodes:
        m.graph.output.append(helper.make_tensor_value_info(n.output[0], 1, None))
    s = lab.session(m)
    outs = dict(zip([n.output[0] for n in nodes], s.run([n.output[0] for n in nodes], feed)))
    producer = {o: n for n in m.graph.node for o in n.output}
    inits = {i.name: i for i in m.graph.initializer}

    def node_macs(n) -> float:
        name = n.input[1]
        while name in producer and producer[name].op_type in ("DequantizeLinear", "QuantizeLinear"):
            name = producer[name].input[0]
        if name not in inits:
            return 0.0
        w = list(inits[name].dims)
        per = np.prod(w[1:]) if n.op_type.startswith("Conv") else w[0]
        if n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute):
            per = w[1]
        return float(outs[n.output[0]].size) * float(per)

    each = {id(n): node_macs(n) for n in nodes}
    total = sum(each.values())
    found = {}
    for t in lab.activations(model):
        _, dq = qdq_pair(model, t)
        found[t] = sum(each[id(n)] for n in nodes if n.op_type in LINEAR_READERS
                       and n.input[0] == dq.output[0]) / total  # fmt: skip
    return found, total


def latency(model, feed, repeats: int = 5) -> float:
    s = lab.session(model)
    s.run(None, feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s.run(None, feed)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--base", default="default")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    key = a.key
    base = onnx.load(lab.WORK / f"{key}-{a.base}.onnx")
    two = onnx.load(lab.WORK / f"{key}-{a.base}-twostage{a.tag}.onnx")
    feed = {k: v[:1] for k, v in lab.data(key, "calib", 1).items()}
    total, second = macs(two, feed)
    found = {"base_gmacs": round((total - second) / 1e9, 4), "added_gmacs": round(second / 1e9, 4),
             "added_pct": round(100 * second / (total - second), 1),
             "ort_ms_base": round(latency(base, feed), 2),
             "ort_ms_twostage": round(latency(two, feed), 2),
             "ort_ms_fp32": round(latency(lab.MODELS[key], feed), 2)}  # fmt: skip
    print(key, found)
    path = lab.WORK / f"{key}-{a.base}-cost{a.tag}.json"
    path.write_text(json.dumps(found))


if __name__ == "__main__":
    main()
