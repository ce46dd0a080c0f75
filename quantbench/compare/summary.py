"""What ``compare`` prints for a person: verdict, outputs, worst layers, latency (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from quantbench.compare.latency import timing_note
from quantbench.evaluate.metrics import OPTIONAL_KEYS, carried_metrics, nonfinite_text
from quantbench.fp16 import FP16, FP16_EMULATED, describe
from quantbench.fp16range import RangeLoss, losses_text
from quantbench.progress import results as console
from quantbench.progress import warn


def _standing(output: dict[str, Any]) -> str:
    """What still judges an output without argmax agreement."""
    if output.get("value_free") or output.get("judged_on"):
        return ""
    if output.get("mask_threshold") is not None:
        return f"; mask IoU (decisions at {output['mask_threshold']}), cosine and SQNR stand"
    return "; cosine and SQNR stand"


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if v == "nan":
        return "undef"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _print_parts(outputs: list[dict]) -> None:
    """Says why an output has part rows (once per output)."""
    parts: dict[str, dict[str, str]] = {}
    for o in outputs:
        if o.get("part_of"):
            where = o["name"][len(o["part_of"]) :]
            parts.setdefault(o["part_of"], {})[where] = f"{o.get('part_made_by')} {where}"
    masked = {o["part_of"] for o in outputs if o.get("part_of") and o.get("mask_decisions")}
    for name, made in parts.items():
        worst = "SQNR, cosine and mask IoU" if name in masked else "SQNR and cosine"
        console.print(
            f"output {escape(name)} joins values that different ops made "
            f"({escape(', '.join(made.values()))}): each part is judged too, and the model's "
            f"{worst} are its worst part's"
        )


def _print_masks(outputs: list[dict]) -> None:
    """What each mask IoU rests on: the values each side decided (a few make a fragile IoU)."""
    for o in outputs:
        counts = o.get("mask_decisions")
        if not counts:
            continue
        console.print(
            f"mask {escape(o['name'])} ({o['candidate']}), decisions at {o['mask_threshold']:g}: "
            f"FP32 {counts['fp32']:,}, {o['candidate']} {counts['candidate']:,}, both "
            f"{counts['both']:,} of {counts['values']:,} values"
        )


def _nonfinite_cell(counts: dict[str, int] | None) -> str:
    counts = counts or {}
    bad = counts.get("fp32", 0) + counts.get("candidate", 0)
    return "0" if not bad else f"[red]{bad}[/red]"


def print_summary(doc: dict[str, Any], worst: int = 5) -> None:
    a, b = doc.get("a", {}), doc.get("b", {})
    console.print(
        f"[bold]{doc['model']['name']}[/bold]: {a.get('label')} vs {b.get('label')} "
        f"on {doc['data'].get('eval_samples')} samples ({b.get('backend')}, {b.get('provider')})"
    )
    for side in ("a", "b"):
        if (doc.get(side) or {}).get("fp16"):
            console.print(f"{side.upper()}: {escape(describe(doc[side]['fp16']))}")
            lost = [
                RangeLoss.from_dict(r) for r in doc[side]["fp16"].get("out_of_range_constants", [])
            ]
            if text := losses_text(lost, f"of {side.upper()}"):
                warn(text)
    for name, entry in (doc.get("task") or {}).items():
        console.print(
            f"{escape(name)}: A {_fmt(entry.get('A'))}  B {_fmt(entry.get('B'))}  "
            f"delta {_fmt(entry.get('delta'))}"
        )
    t = Table(title="Outputs against FP32", title_justify="left")
    outputs = doc.get("outputs", [])
    columns = [
        *("side", "output", "agree", "top-5", "seq", "ctc", "mask IoU", "mIoU"),
        *("cosine", "SQNR dB", "NaN/Inf"),
    ]
    carried = carried_metrics(outputs)
    optional = dict(zip(("seq", "ctc", "mask IoU", "mIoU"), OPTIONAL_KEYS, strict=True))
    shown = [c for c in columns if c not in optional or optional[c] in carried]
    for col in shown:
        # output names often differ only at their end (StatefulPartitionedCall:0/:1/:2):
        # folded onto more lines, never cut
        t.add_column(col, overflow="fold" if col == "output" else "ellipsis")
    notes: dict[str, str] = {}
    for o in outputs:
        values = [
            o["candidate"],
            escape(o["name"]),
            _fmt(o.get("agreement")),
            _fmt(o.get("top5_agreement")),
            _fmt(o.get("sequence_agreement")),
            _fmt(o.get("ctc_agreement")),
            _fmt(o.get("mask_iou")),
            _fmt(o.get("mean_iou")),
            _fmt(o.get("cosine"), 6),
            _fmt(o.get("sqnr_db")),
            _nonfinite_cell(o.get("nonfinite")),
        ]
        cells = dict(zip(columns, values, strict=True))
        t.add_row(*(cells[c] for c in shown))
        if o.get("agreement_note") and not nonfinite_text(o.get("nonfinite") or {}):
            stand = "" if o.get("agreement_kind") else _standing(o)  # a meaning
            notes.setdefault(o["name"], o["agreement_note"] + stand)
    console.print(t)
    for name, note in notes.items():
        console.print(f"output {escape(name)}: {escape(note)}")
    _print_parts(outputs)
    _print_masks(outputs)
    _print_nonfinite(doc)
    ranking = doc.get("ranking", [])[:worst]
    if ranking:
        t = Table(
            title="Worst layers (isolated SQNR: the error each layer adds by itself)",
            title_justify="left",
        )
        for col in ("rank", "node", "op", "isolated dB", "accumulated dB"):
            # exporters' node names share long prefixes (StatefulPartitionedCall/model/...):
            # folded onto more lines, never cut to their common start
            t.add_column(col, overflow="fold" if col == "node" else "ellipsis")
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
        note = timing_note(doc)
        title = f"Latency ({note})" if note else "Latency"
        t = Table(title=escape(title), title_justify="left")
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
        limit = g["max"] if "max" in g else g["min"]
        bound = f"max {limit}" if "max" in g else f"min {limit}"
        value = "undefined" if g["value"] is None else _against(g["value"], limit)
        reason = f": {escape(g['reason'])}" if g.get("reason") else ""
        console.print(f"{mark} {escape(g['metric'])} = {value} ({bound}){reason}")


def _against(value: float, limit: float) -> str:
    """``value`` with a digit more than ``limit`` shows (at least 4 significant), more where
    needed for the shown number to sit on the same side of ``limit`` as the value itself:
    ``0.999921 (min 0.99993)``, not ``0.9999 (min 0.99993)``."""
    shown_digits = len(str(limit).split("e")[0].replace("-", "").replace(".", "").lstrip("0"))
    for digits in range(max(4, shown_digits + 1), 18):
        text = f"{value:.{digits}g}"
        if (float(text) < limit) == (value < limit) and (float(text) == limit) == (value == limit):
            return text
    return repr(value)


def _print_nonfinite(doc: dict[str, Any]) -> None:
    """Every NaN/Inf seen, said loudly: its metrics are undefined and its gates fail."""
    for o in doc.get("outputs", []):
        text = nonfinite_text(o.get("nonfinite") or {}, f"candidate {o['candidate']}")
        if text:
            console.print(
                f"[red]output {escape(o['name'])}[/red]: {escape(text)}; its metrics are "
                "undefined and every gate on it fails"
            )
    for side in ("A", "B"):
        bad = [
            r
            for r in doc.get("layers", [])
            if r.get("candidate") == side
            and r.get("view") == "accumulated"
            and nonfinite_text(r.get("nonfinite") or {})
        ]
        if bad:
            first = bad[0]
            why = (
                "; it runs in FP16, whose largest value is 65504: FP16 overflows there"
                if first.get("precision") in (FP16, FP16_EMULATED)
                and not first["nonfinite"].get("fp32")
                else ""
            )
            console.print(
                f"[red]{len(bad)} layer(s) of {side} hold NaN/Inf[/red], first "
                f"{escape(first['tensor'])}: {escape(nonfinite_text(first['nonfinite']))}{why}"
            )
