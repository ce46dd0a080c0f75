"""What ``compare`` prints for a person: verdict, outputs, worst layers, latency (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from quantbench.progress import console


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def print_summary(doc: dict[str, Any], worst: int = 5) -> None:
    a, b = doc.get("a", {}), doc.get("b", {})
    console.print(
        f"[bold]{doc['model']['name']}[/bold]: {a.get('label')} vs {b.get('label')} "
        f"on {doc['data'].get('eval_samples')} samples ({b.get('backend')}, {b.get('provider')})"
    )
    acc = doc.get("task", {}).get("accuracy")
    if acc:
        console.print(
            f"accuracy: A {acc.get('A', 0):.4f}  B {acc.get('B', 0):.4f}  "
            f"delta {acc.get('delta', 0):+.4f}"
        )
    t = Table(title="Outputs against FP32", title_justify="left")
    for col in ("candidate", "output", "top-1 agree", "top-5 agree", "cosine", "SQNR dB"):
        t.add_column(col)
    for o in doc.get("outputs", []):
        t.add_row(
            o["candidate"],
            escape(o["name"]),
            _fmt(o.get("agreement")),
            _fmt(o.get("top5_agreement")),
            _fmt(o.get("cosine"), 6),
            _fmt(o.get("sqnr_db")),
        )
    console.print(t)
    ranking = doc.get("ranking", [])[:worst]
    if ranking:
        t = Table(
            title="Worst layers (isolated SQNR: the error each layer adds by itself)",
            title_justify="left",
        )
        for col in ("rank", "node", "op", "isolated dB", "accumulated dB"):
            t.add_column(col)
        for r in ranking:
            t.add_row(
                str(r["rank"]),
                escape(r["node"]),
                r["op_type"],
                _fmt(r["isolated_sqnr_db"]),
                _fmt(r["accumulated_sqnr_db"]),
            )
        console.print(t)
    lat = doc.get("latency")
    if lat:
        t = Table(title="Latency", title_justify="left")
        for col in ("side", "median ms", "p90 ms", "p99 ms", "throughput/s"):
            t.add_column(col)
        for side, v in lat.items():
            t.add_row(
                side,
                _fmt(v["median_ms"]),
                _fmt(v["p90_ms"]),
                _fmt(v["p99_ms"]),
                _fmt(v["throughput"]),
            )
        console.print(t)
    for g in doc.get("thresholds", []):
        mark = "[green]PASS[/green]" if g["passed"] else "[red]FAIL[/red]"
        console.print(f"{mark} {g['metric']} = {_fmt(g['value'])} (min {g['min']})")
