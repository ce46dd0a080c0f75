"""Peak memory of ``calibrate`` (the default, ``auto``) against ``--method minmax`` as the
number of calibration samples and the input resolution double (issue 37: the default's peak RSS
within the one-method pass's + 256 MiB, and flat within 10 % as samples and resolution double).

The model is dense and resolution-bound, the kind where judging used to hold the slice's
activations: a 2x super-resolution CNN (seven 3x3 convs, 64 channels, ReLU, DepthToSpace), built
here with seeded He-initialised weights and a dynamic batch and size. Data: smooth random tiles
(bilinear upsampled noise), seeded. Each job is a whole ``quantbench calibrate`` process with an
empty cache, measured by ``zoo/bench_speed.py``'s launcher (wall time, peak RSS from wait4)::

    .venv/bin/python benchmarks/bench_auto_memory.py              # 48/96 tiles, 128/256 px
    .venv/bin/python benchmarks/bench_auto_memory.py --samples 24,48 --sizes 64,128
    .venv/bin/python benchmarks/bench_auto_memory.py --zoo mtcnn-pnet

``--zoo KEY`` measures a real dense model of the corpus instead (made by ``make bench-zoo``):
its calibration data as given, twice the samples (the data and its mirror image along the last
named dim of the input), and twice the resolution (each named non-batch dim of the input
repeated 2x); the model must have one input with named spatial dims and a batch axis.

Writes ``benchmarks/_work/auto_memory.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "zoo"), str(HERE)]

from _jobs import WORK, machine_info, make_console, write_json  # noqa: E402
from bench_speed import (  # noqa: E402
    MIB_KIB,
    ZOO_WORK,
    corpus_subject,
    quantbench_command,
    run_process,
)

CHANNELS, CONVS, SCALE = 64, 7, 2
#: issue 37's targets
RSS_ALLOWANCE_MIB, FLAT = 256, 0.10


def build_sr_cnn(path: Path, seed: int = 0) -> Path:
    """Seven 3x3 convs (3 -> 64 -> ... -> 3 x SCALE^2), ReLU between, then DepthToSpace."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    widths = [3] + [CHANNELS] * (CONVS - 1) + [3 * SCALE * SCALE]
    for i in range(CONVS):
        cin, cout = widths[i], widths[i + 1]
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        y = f"conv{i}"
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], name=y, pads=[1] * 4))
        if i < CONVS - 1:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"relu{i}"))
            y = f"relu{i}"
        x = y
    nodes.append(helper.make_node("DepthToSpace", [x], ["output"], blocksize=SCALE, mode="CRD"))
    graph = helper.make_graph(
        nodes,
        "sr_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 3, "H", "W"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def tiles(count: int, size: int, seed: int = 1) -> np.ndarray:
    """Smooth random RGB tiles in [0, 1]: 8x8 noise upsampled bilinearly to ``size``."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((count, 3, 9, 9)).astype(np.float32)
    t = np.linspace(0, 8, size, dtype=np.float32)
    i0 = np.minimum(t.astype(int), 7)
    f = t - i0
    rows = coarse[:, :, i0, :] * (1 - f)[None, None, :, None] + coarse[:, :, i0 + 1, :] * f[
        None, None, :, None
    ]
    return (rows[:, :, :, i0] * (1 - f) + rows[:, :, :, i0 + 1] * f).astype(np.float32)


def sr_subjects(counts: list[int], sizes: list[int], work: Path) -> list[tuple[dict, Path, Path]]:
    """(row label, model, data) of the synthetic SR CNN: each tile count at each size."""
    model = build_sr_cnn(work / "sr_cnn.onnx")
    out = []
    for size in sizes:
        for count in counts:
            data = work / f"tiles_{count}_{size}.npz"
            np.savez(data, input=tiles(count, size))
            out.append(({"samples": count, "size": size}, model, data))
    return out


def zoo_subjects(key: str, work: Path) -> list[tuple[dict, Path, Path]]:
    """(row label, model, data) of a corpus model: as given, 2x the samples, 2x the resolution."""
    import corpus  # benchmarks/zoo

    spec = next((s for s in corpus.corpus(ZOO_WORK / "pkgs") if s.key == key), None)
    if spec is None:
        raise SystemExit(f"--zoo {key}: no such corpus model")
    subject = corpus_subject(spec, ZOO_WORK)
    if subject.missing:
        raise SystemExit(f"--zoo {key}: {subject.missing}")
    model, calib = subject.model, subject.data
    graph = onnx.load(str(model), load_external_data=False).graph
    first = [i for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    named = [a for a, d in enumerate(first[0].type.tensor_type.shape.dim) if a and d.dim_param]
    with np.load(calib) as z:
        arrays = {k: z[k] for k in z.files}
    if len(first) != 1 or len(arrays) != 1 or not named:
        raise SystemExit(f"--zoo {key}: needs one input with named spatial dims (has {named})")
    ((name, x),) = arrays.items()
    wide = x
    for axis in named:
        wide = wide.repeat(2, axis=axis)
    sets = {
        "samples2.npz": np.concatenate([x, np.flip(x, axis=named[-1])]),
        "resolution2.npz": np.ascontiguousarray(wide),
    }
    for file, array in sets.items():
        np.savez(work / file, **{name: array})
    n, size = len(x), "x".join(str(x.shape[a]) for a in named)
    wide_size = "x".join(str(wide.shape[a]) for a in named)
    return [
        ({"samples": n, "size": size}, model, calib),
        ({"samples": 2 * n, "size": size}, model, work / "samples2.npz"),
        ({"samples": n, "size": wide_size}, model, work / "resolution2.npz"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", default="48,96", help="comma-separated tile counts")
    p.add_argument("--sizes", default="128,256", help="comma-separated tile sizes (pixels)")
    p.add_argument("--repeat", type=int, default=1, help="runs per job; medians count")
    p.add_argument("--quantbench", help="the quantbench executable (default: the venv's)")
    p.add_argument("--zoo", metavar="KEY", help="a dense corpus model instead of the SR CNN")
    p.add_argument("--json", type=Path, default=WORK / "auto_memory.json")
    args = p.parse_args(argv)
    console = make_console()
    qb = quantbench_command(args.quantbench)
    counts = [int(v) for v in args.samples.split(",")]
    sizes = [int(v) for v in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="qb-auto-memory-"))
    subjects = zoo_subjects(args.zoo, work) if args.zoo else sr_subjects(counts, sizes, work)
    rows = []
    for label, model, data in subjects:
        count, size = label["samples"], label["size"]
        row = {"model": args.zoo or "sr_cnn", **label}
        for job, method in (("minmax", ["--method", "minmax"]), ("default", [])):
            runs = []
            for _ in range(args.repeat):
                cache = Path(tempfile.mkdtemp(prefix="qb-auto-memory-cache-"))
                command = [*qb, "calibrate", str(model), "--data", str(data), "--no-cache",
                           "-o", str(work / f"{job}.cache"), *method]  # fmt: skip
                runs.append(run_process(command, cache, 1800.0))
            failed = [r.error for r in runs if r.error]
            if failed:
                raise SystemExit(f"{job} at {count} x {size}px failed: {failed[0]}")
            row[job] = {
                "seconds": statistics.median(r.seconds for r in runs),
                "peak_rss_mib": statistics.median(r.peak_rss_kib for r in runs) / MIB_KIB,
            }
        rows.append(row)
        console.print(
            f"{count} samples of {size}px: minmax {row['minmax']['peak_rss_mib']:.0f} MiB "
            f"{row['minmax']['seconds']:.1f} s, default {row['default']['peak_rss_mib']:.0f} "
            f"MiB {row['default']['seconds']:.1f} s"
        )
    base = rows[0]["default"]["peak_rss_mib"]
    for row in rows:
        extra = row["default"]["peak_rss_mib"] - row["minmax"]["peak_rss_mib"]
        row["default_over_minmax_mib"] = extra
        row["rss_allowance_met"] = extra <= RSS_ALLOWANCE_MIB
        row["default_vs_first"] = row["default"]["peak_rss_mib"] / base - 1
    flat = all(abs(r["default_vs_first"]) <= FLAT for r in rows)
    over = ", ".join(f"{r['default_over_minmax_mib']:+.0f}" for r in rows)
    growth = ", ".join(f"{100 * r['default_vs_first']:+.0f} %" for r in rows)
    console.print(
        f"default over minmax: {over} MiB (allowance +{RSS_ALLOWANCE_MIB}); default against the "
        f"first row: {growth} (flat within {100 * FLAT:.0f} %: {'PASS' if flat else 'MISS'})"
    )
    write_json(args.json, {"machine": machine_info(), "rows": rows, "flat": flat})
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
