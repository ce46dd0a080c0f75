"""Issue 38 diagnosis helpers: variants of a Q/DQ model (some Q/DQ pairs removed), run and scored
with the corpus' own runner and task metric (benchmarks/zoo/corpus.py), or by output SQNR.

Research code of session 26 (issue 38), not part of quantbench: the corpus must be built
(``make bench-zoo``); models and records go to benchmarks/_work/issue38.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

from quantbench.refine.twostage import qdq_pairs

ZOO_DIR = Path(__file__).resolve().parents[1] / "zoo"
sys.path[:0] = [str(ZOO_DIR), str(ZOO_DIR.parent)]

import corpus as zoo  # noqa: E402

DATA = ZOO_DIR.parent / "_work" / "zoo"
PKGS = DATA / "pkgs"
WORK = ZOO_DIR.parent / "_work" / "issue38"
MODELS = {m.key: str(PKGS / m.file) for m in zoo.corpus(PKGS)}
#: the output the task metric reads, per model (index into the outputs)
METRIC_OUTPUT = {"mtcnn-pnet": 1, "dddd-ocr": 0, "basic-pitch": 1, "dddd-det": 0, "minilm-l3": 2}


def spec(key: str) -> zoo.ZooModel:
    return next(m for m in zoo.corpus(PKGS) if m.key == key)


def layout(key: str) -> str:
    import json

    return json.loads((DATA / key / "data.json").read_text())["layout"]


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files}


def data(key: str, which: str, count: int | None = None) -> dict[str, np.ndarray]:
    arrays = load(DATA / key / f"{which}.npz")
    if count is not None:
        arrays = {k: v[:count] for k, v in arrays.items()}
    return arrays


def pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto, bool]]:
    """(Q, DQ, is_weight) for every QuantizeLinear whose output one DequantizeLinear reads."""
    inits = {i.name for i in model.graph.initializer}
    return [(q, dq, q.input[0] in inits) for q, dq in qdq_pairs(model)]


def activations(model: onnx.ModelProto) -> list[str]:
    return [q.input[0] for q, _, w in pairs(model) if not w]


def weight_names(model: onnx.ModelProto) -> list[str]:
    return [q.input[0] for q, _, w in pairs(model) if w]


def variant(
    model: onnx.ModelProto,
    keep_acts: set[str] | None = None,
    weights: bool | set[str] = True,
    scales: dict[str, float] | None = None,
) -> onnx.ModelProto:
    """A copy with only the activation pairs in ``keep_acts`` (None: all) and, unless
    ``weights`` is False, the weight pairs (a set: those weights only); ``scales`` multiplies
    an activation's scale."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    drop: set[str] = set()
    rename: dict[str, str] = {}
    for q, dq, is_weight in pairs(m):
        src = q.input[0]
        wanted = src in weights if isinstance(weights, set) else weights
        keep = wanted if is_weight else (keep_acts is None or src in keep_acts)
        if keep:
            if scales and src in scales and not is_weight:
                t = inits[q.input[1]]
                value = onnx.numpy_helper.to_array(t) * np.float32(scales[src])
                t.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), t.name))
            continue
        drop.update((q.name or id(q), dq.name or id(dq)))
        rename[dq.output[0]] = src
    nodes = [n for n in m.graph.node if (n.name or id(n)) not in drop]
    outputs = {o.name for o in m.graph.output}
    extra = []
    for n in nodes:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
    for old, new in rename.items():
        if old in outputs:
            extra.append(onnx.helper.make_node("Identity", [new], [old]))
    del m.graph.node[:]
    m.graph.node.extend(nodes + extra)
    return m


def session(model: onnx.ModelProto | str | Path):
    import onnxruntime as ort

    from quantbench.backends.onnxruntime import disabled_optimizers, session_config

    options = ort.SessionOptions()
    options.log_severity_level = 3
    for entry, value in session_config().items():
        options.add_session_config_entry(entry, value)
    source = model if isinstance(model, (str, Path)) else model.SerializeToString()
    # as written, as the zoo's harness and quantbench's own sessions run a Q/DQ model: fused,
    # onnxruntime rounds an FP32 bias to int32 and (x86 without VNNI) saturates
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled_optimizers())  # fmt: skip


def run(key: str, model, arrays: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    s = spec(key)
    return (s.run or zoo.run_samples)(session(model), arrays, layout(key))


def labels(key: str) -> np.ndarray | None:
    p = DATA / key / "labels.npy"
    return np.load(p) if p.is_file() else None


def score(key: str, reference, outputs) -> dict[str, float]:
    return spec(key).score(reference, outputs, labels(key))


def sqnr(reference, outputs, index: int) -> float:
    """Output SQNR (dB) of output ``index`` over all samples."""
    sig = sum(float(np.sum(np.square(r[index].astype(np.float64)))) for r in reference)
    err = sum(
        float(np.sum(np.square(r[index].astype(np.float64) - c[index])))
        for r, c in zip(reference, outputs)
    )
    return 10 * np.log10(sig / max(err, 1e-30))


def split(key: str, n: int, held: int | None = None) -> tuple[int, dict, dict]:
    """auto's held-back slice size (as quantbench takes it: up to 64, at most half), the ``n``
    calibration samples after it and the slice itself."""
    calib = load(DATA / key / "calib.npz")
    total = len(next(iter(calib.values())))
    held = held if held is not None else min(64, total // 2)
    fit = {k: v[held : held + n] for k, v in calib.items()}
    return held, fit, {k: v[:held] for k, v in calib.items()}
