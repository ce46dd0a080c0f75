"""Honest speed cards (issue "A newcomer's first hour", item 4): compare times onnxruntime,
whose CPU provider runs a Q/DQ model's ops mostly in float around the Q/DQ pairs; "2.58x
slower" for INT8 is that emulation, not TensorRT. The report and the console say what was
timed, and without an engine the report's headline leads with accuracy, speed left out."""

from __future__ import annotations

import json
import re
from pathlib import Path

from quantbench.compare.summary import print_summary
from quantbench.reports import render_report

EXAMPLE = Path(__file__).resolve().parent / "data" / "results_example.json"
HONEST = "onnxruntime CPU, Q/DQ emulated: not TensorRT's speed"


def slower_int8() -> dict:
    """The example results (FP32 vs INT8 entropy, both onnxruntime CPU), INT8 2.58x slower."""
    doc = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    doc["latency"]["A"].update(median_ms=1.0, backend="onnxruntime")
    doc["latency"]["B"].update(median_ms=2.58, backend="onnxruntime")
    doc["latency"]["A"]["provider"] = doc["latency"]["B"]["provider"] = "CPUExecutionProvider"
    return doc


def _cards(html: str) -> list[tuple[str, str, str, str]]:
    """(class, label, value, detail) of each verdict card, tags stripped."""
    found = re.findall(
        r'<div class="card ?([\w ]*)">\s*<div class="card-label">(.*?)</div>\s*'
        r'<div class="card-value">(.*?)</div>\s*(?:<div class="card-detail">(.*?)</div>)?',
        html,
        re.S,
    )
    strip = lambda text: re.sub("<[^>]+>", "", text).strip()  # noqa: E731
    return [(tone.strip(), strip(a), strip(b), strip(c)) for tone, a, b, c in found]


def _headline(html: str) -> str:
    return re.search(r'<p class="headline">(.*?)</p>', html, re.S)[1]


def test_a_report_without_an_engine_says_what_was_timed():
    html = render_report(slower_int8()).replace("&#39;", "'")
    headline = _headline(html)
    assert "slower" not in headline and "faster" not in headline
    assert headline.startswith("INT8 (entropy) vs FP32: top-1 agreement")  # accuracy first
    cards = _cards(html)
    speed = [card for card in cards if "latency" in card[1].lower()]
    assert len(speed) == 1
    tone, _label, value, detail = speed[0]
    assert value == "2.58× slower" and HONEST in detail
    assert tone == "secondary"  # neither good nor bad, and after every accuracy card
    assert cards[-1] == speed[0]
    latency = html.split('id="latency"', 1)[1]
    assert HONEST in latency.split("</section>", 1)[0]


def test_an_fp16_candidate_is_said_to_be_emulated():
    doc = slower_int8()
    doc["b"] = {**doc["b"], "spec": "fp16", "label": "FP16", "method": None}
    doc["b"]["fp16"] = {"mode": "emulated", "provider": "CPUExecutionProvider"}
    html = render_report(doc).replace("&#39;", "'")
    assert "onnxruntime CPU, FP16 emulated: not TensorRT's speed" in html


def test_a_tensorrt_engine_keeps_its_speed_verdict():
    doc = slower_int8()
    doc["latency"]["B"]["backend"] = "tensorrt"
    html = render_report(doc).replace("&#39;", "'")
    assert "2.58× slower at the median" in _headline(html)
    assert "not TensorRT's speed" not in html


def test_the_console_says_what_was_timed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    doc = slower_int8()
    for row in (*doc["outputs"], *doc.get("ranking", [])):
        row.setdefault("candidate", "B")  # the example predates the field
    print_summary(doc)
    shown = " ".join(capsys.readouterr().out.split())
    assert f"Latency ({HONEST})" in shown
