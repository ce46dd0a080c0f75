"""HTML report: structure, self-containment, escaping, scale and file handling (no browser)."""

from __future__ import annotations

import copy
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from quantbench.errors import QuantbenchError
from quantbench.reports import load_results, render_report, write_report
from quantbench.reports.formatting import fmt_delta_pp, fmt_num, fmt_pct
from quantbench.reports.tables import sort_key

EXAMPLE = Path(__file__).resolve().parent / "data" / "results_example.json"
NASTY = 'a<b>:0 "x"'
SECTION_IDS = (
    "verdict",
    "drift",
    "layers",
    "calibration",
    "precision",
    "latency",
    "recovery",
    "provenance",
)


class Page(HTMLParser):
    """Every start tag with its attributes, and each id's element."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.tags if a.get("id")}

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def minimal() -> dict:
    return {"schema": "quantbench-results", "schema_version": 1}


def calibration_only() -> dict:
    doc = example()
    keep = (
        "schema",
        "schema_version",
        "tool_version",
        "created",
        "command",
        "model",
        "data",
        "machine",
        "calibration",
    )
    out = {k: doc[k] for k in keep}
    out["kind"] = "calibration"
    out["command"] = "quantbench calibrate --model m.onnx --calib calib.npz --method all"
    return out


def synthetic_results(layers: int = 200, tensors: int = 200, bins: int = 128) -> dict:
    """A large model's results with long ONNX-style names, both views and full calibration."""
    rng = np.random.default_rng(0)
    ops = ("Conv", "Relu", "Conv", "Add", "Relu", "MatMul")
    methods = ["entropy", "entropy:pytorch", "entropy:ort", "minmax", "percentile:99.99", "mse"]
    names = [
        f"/backbone/stage{i // 40}/block{i % 40}/{ops[i % 6].lower()}/Output_0"
        for i in range(max(layers, tensors))
    ]
    entries = []
    for i in range(layers):
        accumulated = 42 - 18 * i / layers + rng.normal(0, 1.0)
        isolated = 38 + rng.normal(0, 6.0)
        for view, sqnr in (("accumulated", accumulated), ("isolated", isolated)):
            rel = 10 ** (-sqnr / 20)
            entries.append(
                {
                    "index": i,
                    "tensor": names[i],
                    "node": f"{ops[i % 6]}_{i}",
                    "op_type": ops[i % 6],
                    "view": view,
                    "cosine": 1 - rel * rel / 2,
                    "sqnr_db": sqnr,
                    "rel_l2": rel,
                    "max_abs": rel * rng.uniform(3, 9),
                    "mean_abs": rel * 0.3,
                    "clip_fraction": rng.uniform(0, 1e-3),
                    "amax": rng.uniform(1, 12),
                }
            )
    calib = []
    for i in range(tensors):
        upper = float(rng.uniform(1, 30))
        shape = np.exp(-np.arange(bins) / rng.uniform(4, 30)) * 4e6
        counts = np.maximum(np.round(shape * rng.uniform(0.5, 1.5, bins)), 0).astype(int)
        entropy = upper * rng.uniform(0.3, 0.9)
        amax = {
            m: entropy * f
            for m, f in zip(methods, (1, 1.01, 0.99, upper / entropy, 1.2, 1.1), strict=True)
        }
        calib.append(
            {
                "name": names[i],
                "count": int(counts.sum()),
                "min": -upper,
                "max": upper,
                "nan_count": 0,
                "inf_count": 0,
                "amax": amax,
                "used_method": "entropy",
                "histogram": {"upper": upper, "counts": counts.tolist()},
            }
        )
    doc = example()
    doc["layers"] = entries
    doc["calibration"] = {"methods": methods, "method_used": "entropy", "tensors": calib}
    return doc


def table_rows(html: str, table_id: str) -> int:
    start = html.index(f'id="{table_id}"')
    body = html[html.index("<tbody>", start) : html.index("</tbody>", start)]
    return body.count("<tr")


def assert_self_contained(html: str) -> None:
    page = Page(html)
    assert "http://" not in html and "https://" not in html
    assert not [a for _, a in page.tags if "src" in a or "srcset" in a], "no element loads a file"
    assert not page.all("link") and not page.all("iframe") and not page.all("object")
    assert not page.all("img") and not page.all("embed")
    style = html[html.index("<style>") : html.index("</style>")]
    assert "url(" not in style and "@import" not in style and "@font-face" not in style
    assert all("src" not in a for a in page.all("script"))


def assert_svgs_sized(html: str) -> int:
    svgs = Page(html).all("svg")
    for attrs in svgs:
        assert float(attrs["width"]) > 0 and float(attrs["height"]) > 0
        assert attrs.get("viewbox"), "charts scale with their viewBox"
    return len(svgs)


def test_example_report_has_every_section():
    doc = example()
    html = render_report(load_results(EXAMPLE))
    assert set(SECTION_IDS) <= Page(html).ids()
    assert '<span class="badge badge-pass" id="verdict-badge">PASS</span>' in html
    assert "INT8 (entropy) vs FP32: top-1 agreement 99.20% on logits" in html
    assert "accuracy 94.00% → 93.60% (−0.40 pp)" in html
    # onnxruntime CPU's times: a secondary card, not the headline (tests/test_timing_note.py)
    assert "1.85× faster at the median" not in html and "1.85× faster" in html
    assert table_rows(html, "layer-table") == len(doc["layers"])
    assert table_rows(html, "amax-table") == len(doc["calibration"]["tensors"])
    assert table_rows(html, "thresholds") == len(doc["thresholds"])
    assert html.count("<option>") + html.count("<option selected>") >= len(
        doc["calibration"]["tensors"]
    )
    assert doc["model"]["hash"] in html
    assert '<code id="command">quantbench compare fp32 int8:entropy' in html
    for excluded in doc["excluded"]:
        assert excluded["reason"] in html
    assert "head/weight_gen:0" in html  # the dynamic-weight conv's weight tensor
    assert "Conv_10" in html and "Add_11" in html  # kept in high precision by recovery


def test_worst_layers_follow_isolated_sqnr_then_accumulated():
    doc = example()
    isolated = sorted(
        (e for e in doc["layers"] if e["view"] == "isolated"), key=lambda e: e["sqnr_db"]
    )
    html = render_report(doc)
    worst = html[html.index('id="worst"') : html.index("</table>", html.index('id="worst"'))]
    order = [worst.index(f">{e['tensor']}<") for e in isolated[:5]]
    assert order == sorted(order)
    assert 'data-worst="1"' in html and "worst 5 by isolated SQNR" in html

    doc["layers"] = [e for e in doc["layers"] if e["view"] == "accumulated"]
    html = render_report(doc)
    assert "Worst layers by accumulated SQNR" in html
    assert 'id="layer-view"' not in html  # one view: no view selector


@pytest.mark.parametrize("make", [example, minimal, calibration_only, synthetic_results])
def test_reports_are_self_contained_and_charts_sized(make):
    html = render_report(make())
    assert_self_contained(html)
    assert_svgs_sized(html)
    assert html.count("<script") == html.count("</script>") <= 2


def test_example_charts_present():
    html = render_report(example())
    page = Page(html)
    classes = [a.get("class", "") for a in page.all("svg")]
    assert "chart drift" in classes
    assert classes.count("chart hist") == 4  # pre-rendered worst-layer histograms
    assert classes.count("chart bars") == 2  # latency and throughput
    assert "chart recovery" in classes
    assert assert_svgs_sized(html) == 8


def test_minimal_document_renders_only_what_it_has():
    html = render_report(minimal())
    ids = Page(html).ids()
    assert {"verdict", "provenance"} <= ids
    assert not ids & {"drift", "layers", "calibration", "precision", "latency", "recovery"}
    assert ">NO GATE<" in html and "No thresholds were set" in html
    assert "No model outputs were compared." in html


def test_calibration_only_report():
    doc = calibration_only()
    html = render_report(doc)
    ids = Page(html).ids()
    assert {"verdict", "calibration", "provenance", "hist-select"} <= ids
    assert not ids & {"drift", "layers", "latency", "recovery", "verdict-badge"}
    assert ">CALIBRATION<" in html
    assert "range cut most by calibration" in html  # no layers: picks by how much was clipped
    assert Page(html).all("svg").__len__() == 4
    assert "Tensors calibrated" in html and ">18<" in html


def test_nasty_names_are_escaped_everywhere():
    doc = example()
    doc["layers"][20]["tensor"] = NASTY  # block 2/downsample, isolated: the worst layer
    doc["layers"][21]["tensor"] = NASTY
    doc["calibration"]["tensors"][11]["name"] = NASTY
    doc["calibration"]["tensors"][12]["name"] = "</script><script>alert(1)</script>"
    doc["model"]["name"] = "<img src=x onerror=alert(1)>"
    doc["command"] = "quantbench compare --model 'a&b <c>.onnx'"
    html = render_report(doc)
    assert "a<b>" not in html and "<img" not in html and "<c>" not in html
    assert "a&lt;b&gt;:0 &#34;x&#34;" in html  # table cell, option, SVG label
    assert html.count("<script") == 2
    data = json.loads(re.search(r'id="qb-histograms">(.*?)</script>', html, re.S).group(1))
    names = [t[0] for t in data["tensors"]]
    assert NASTY in names and "</script><script>alert(1)</script>" in names
    svg_text = re.findall(r"<svg class=\"chart drift\".*?</svg>", html, re.S)[0]
    assert "a&lt;b&gt;:0 &#34;x&#34;" in svg_text  # worst-layer label and tooltip
    assert "quantbench compare --model &#39;a&amp;b &lt;c&gt;.onnx&#39;" in html


def test_odd_values_render_gracefully():
    doc = example()
    doc["layers"][0]["sqnr_db"] = math.inf  # exact match
    doc["layers"][1]["sqnr_db"] = None
    doc["layers"][2]["cosine"] = "n/a"
    doc["layers"][3]["sqnr_db"] = math.nan
    doc["task"] = {"accuracy": {"A": 0.94, "B": 0.936}}  # no delta: computed
    doc["latency"] = {"A": {"median_ms": 2.0}}  # B missing
    doc["thresholds"] = [{"metric": "top1_agreement", "min": 0.99, "value": None, "passed": None}]
    doc["passed"] = None
    doc["outputs"] = [{"name": "logits"}]
    doc["calibration"]["tensors"][0]["histogram"] = {"upper": 0, "counts": []}
    doc["calibration"]["tensors"][1]["amax"] = {"entropy": None, "weird": 1.5}
    doc["recovery"] = {"target": "something odd", "steps": [{"metric": None}]}
    html = render_report(doc)
    assert "−0.40 pp" in html
    assert 'data-v="Infinity"' in html and ">∞<" in html
    assert ">NO GATE<" in html
    assert ">weird<" in html  # a method only one tensor has still gets a column
    data = json.loads(re.search(r'id="qb-histograms">(.*?)</script>', html, re.S).group(1))
    assert len(data["tensors"]) == len(doc["calibration"]["tensors"]) - 1
    assert_svgs_sized(html)


def test_fail_badge_names_the_missed_gate():
    doc = example()
    doc["passed"] = False
    doc["thresholds"][0].update(value=0.982, passed=False)
    html = render_report(doc)
    assert '<span class="badge badge-fail" id="verdict-badge">FAIL</span>' in html
    assert "1 of 2 thresholds missed: top1_agreement" in html
    assert '<span class="pill pill-fail">FAIL</span>' in html


def test_on_demand_histogram_data_is_compact_json():
    html = render_report(example())
    raw = re.search(r'id="qb-histograms">(.*?)</script>', html, re.S).group(1)
    data = json.loads(raw)
    assert data["methods"][0] == "entropy" and set(data["colours"]) == set(data["methods"])
    assert all(len(t[2]) == 128 and t[1] > 0 for t in data["tensors"])
    assert "NaN" not in raw and "Infinity" not in raw


def test_render_is_deterministic():
    assert render_report(example()) == render_report(example())


def test_200_layer_report_stays_small_and_readable(capsys):
    doc = synthetic_results(layers=200, tensors=200)
    html = render_report(doc)
    size = len(html.encode("utf-8"))
    with capsys.disabled():
        print(f"\n200 layers x 2 views + 200 calibrated tensors: {size / 1024:.0f} KiB")
    assert size < 2 * 1024 * 1024
    drift = re.search(r'<svg class="chart drift" width="(\d+)"(.*?)</svg>', html, re.S)
    assert int(drift.group(1)) >= 200 * 6  # the chart widens instead of squeezing layers
    x_labels = re.findall(r'class="tick mid">\d+</text>', drift.group(2))
    assert 10 <= len(x_labels) <= 40  # thinned: not one label per layer
    assert table_rows(html, "layer-table") == 400


def test_write_report_is_atomic(tmp_path):
    target = tmp_path / "report.html"
    written = write_report(example(), target)
    assert written == target
    assert target.read_text(encoding="utf-8") == render_report(example())
    before = target.read_bytes()
    with pytest.raises(QuantbenchError):
        write_report({"schema": "something-else"}, target)
    assert target.read_bytes() == before  # a failed render leaves the old report alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temp files
    with pytest.raises(QuantbenchError, match="does not exist"):
        write_report(example(), tmp_path / "missing" / "report.html")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON at line 1"),
        ("[1, 2]", "top level is a list"),
        ('{"schema": "quantbench-stats", "schema_version": 1}', "schema 'quantbench-stats'"),
        ('{"schema_version": 1}', "schema None"),
        ('{"schema": "quantbench-results", "schema_version": 2}', "newer than this quantbench"),
        ('{"schema": "quantbench-results", "schema_version": "1"}', "no integer schema_version"),
        ('{"schema": "quantbench-results", "schema_version": 1, "kind": "x"}', "kind 'x'"),
        ('{"schema": "quantbench-results", "schema_version": 1, "layers": {}}', "'layers' must"),
        ('{"schema": "quantbench-results", "schema_version": 1, "model": []}', "'model' must"),
    ],
)
def test_bad_results_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(QuantbenchError) as error:
        load_results(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_missing_and_binary_results_files(tmp_path):
    with pytest.raises(QuantbenchError, match="no such results file"):
        load_results(tmp_path / "absent.json")
    binary = tmp_path / "results.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(QuantbenchError, match="not UTF-8"):
        load_results(binary)
    with pytest.raises(QuantbenchError, match="is a folder"):
        load_results(tmp_path)
    with pytest.raises(QuantbenchError, match="not a quantbench results file"):
        render_report({"schema": "nope"})


def test_render_does_not_mutate_the_document():
    for doc in (example(), calibration_only(), minimal()):
        original = copy.deepcopy(doc)
        render_report(doc)
        assert doc == original


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (math.inf, "∞"),
        (-math.inf, "−∞"),
        (math.nan, "undefined"),
        (0.0, "0"),
        (123456, "123,456"),
        (-0.004, "−0.004"),
        (1e-5, "1.000e-05"),
        (True, "True"),
    ],
)
def test_fmt_num_never_raises(value, text):
    assert fmt_num(value) == text


def test_percent_and_sort_helpers():
    assert fmt_pct(0.992) == "99.20%" and fmt_delta_pp(-0.004) == "−0.40 pp"
    assert fmt_delta_pp(0.01) == "+1.00 pp"
    assert sort_key(math.inf) == "Infinity" and sort_key(None) == "" and sort_key(math.nan) == ""
    # Two cosines that print alike ("0.999999") still sort apart by their keys.
    assert float(sort_key(0.9999991)) < float(sort_key(0.9999992))


def _cards(html: str) -> list[tuple[str, str]]:
    """(label, value) of each verdict card, tags stripped."""
    found = re.findall(
        r'<div class="card-label">(.*?)</div>\s*<div class="card-value">(.*?)</div>', html, re.S
    )
    return [(re.sub("<[^>]+>", "", a).strip(), re.sub("<[^>]+>", "", b).strip()) for a, b in found]


def test_speed_card_and_headline_state_one_quantity_one_direction():
    """Issue 14: the card read "SLOW-DOWN 0.31×" above "3.21× slower at the median". (A
    TensorRT engine's times: onnxruntime's are a secondary card, tests/test_timing_note.py.)"""
    doc = example()
    for side in ("a", "b"):
        doc[side]["backend"] = "tensorrt"
    doc["latency"]["A"]["median_ms"] = 1.0
    doc["latency"]["B"]["median_ms"] = 3.21
    html = render_report(doc)
    assert "3.21× slower at the median" in html
    speed = [(label, value) for label, value in _cards(html) if "latency" in label.lower()]
    assert speed == [("Median latency, INT8 (entropy) vs FP32", "3.21× slower")]
    assert "0.31×" not in html.split('id="latency"')[0]  # nothing above the latency table


def test_nonfinite_json_strings_render_as_symbols():
    """The JSON writes infinite SQNR as "inf" and undefined as "nan" (quantbench.jsonsafe)."""
    assert fmt_num("inf") == "∞" and fmt_num("-inf") == "−∞" and fmt_num("nan") == "undefined"
    assert fmt_num("n/a") == "n/a"


# --------------------------------------------------------------------------- issue 16 / 10


def undefined_document() -> dict:
    """A compare document as quantbench writes it when NaN/Inf reach the compared tensors: one
    isolated layer undefined ("nan") while the others are exact ("inf"), an undefined output, a
    sequence output, an output without agreement, a gate failed on an undefined value."""
    doc = example()
    isolated = [r for r in doc["layers"] if r["view"] == "isolated"]
    for r in isolated:
        r["sqnr_db"] = "inf"
    bad = isolated[2]
    bad.update(sqnr_db="nan", cosine="nan", nonfinite={"fp32": 0, "candidate": 7, "elements": 100})
    for r in doc["layers"]:
        r.setdefault("nonfinite", {"fp32": 0, "candidate": 0, "elements": 100})
    base = {"rel_l2": 0.01, "max_abs": 0.1, "mean_abs": 0.01, "top5_agreement": None}
    doc["outputs"] = [
        {**base, "candidate": "B", "name": "logits", "agreement": "nan", "top5_agreement": "nan",
         "sequence_agreement": None, "cosine": "nan", "sqnr_db": "nan", "rel_l2": "nan",
         "agreement_kind": "class", "agreement_note": None,
         "nonfinite": {"fp32": 0, "candidate": 58, "elements": 120}},
        {**base, "candidate": "B", "name": "ctc", "agreement": 0.9, "top5_agreement": 0.99,
         "sequence_agreement": 0.5, "cosine": 0.99, "sqnr_db": 21.0, "agreement_kind": "position",
         "agreement_note": None, "nonfinite": {"fp32": 0, "candidate": 0, "elements": 500}},
        {**base, "candidate": "B", "name": "boxes", "agreement": None, "sequence_agreement": None,
         "cosine": 0.995, "sqnr_db": 23.0, "agreement_kind": None,
         "agreement_note": "boxes/coordinates: argmax means nothing",
         "nonfinite": {"fp32": 0, "candidate": 0, "elements": 40}},
    ]  # fmt: skip
    doc["thresholds"] = [
        {"metric": "cosine", "min": 0.999, "value": None, "passed": False,
         "reason": "output logits: 58 of 120 values NaN/Inf in candidate"},
    ]  # fmt: skip
    doc["passed"] = False
    doc["task"] = {
        "cer_drop": {"A": 0.0, "B": 0.05, "delta": 0.05},
        "wer_drop": {"A": 0.2, "B": 0.1, "delta": -0.1},
        "line_accuracy": {"A": 0.95, "B": "nan", "delta": "nan"},
    }
    return doc


def test_undefined_values_read_undefined_and_rank_worst():
    """Issue 16: "nan" (undefined) must not read as "—" (not applicable), and the worst-layer
    card picked an exact (∞ dB) layer while another layer was undefined."""
    doc = undefined_document()
    bad = next(r for r in doc["layers"] if r["view"] == "isolated" and r["sqnr_db"] == "nan")
    html = render_report(doc)
    cards = dict(_cards(html))
    assert cards["Worst layer (isolated)"] == "undefined"
    cards_text = re.sub("<[^>]+>", "", html.split('class="cards"')[1].split('class="grid-2"')[0])
    assert f"{bad['tensor']} · {bad['op_type']}" in cards_text
    assert cards["Top-1 agreement"] == "undefined"
    worst = re.search(r'id="worst">.*?</table>', html, re.S).group(0)
    first = re.search(r"<tbody>\s*<tr>(.*?)</tr>", worst, re.S).group(1)
    assert bad["tensor"] in first and ">undefined<" in first
    outputs = re.search(r'id="outputs">.*?</table>', html, re.S).group(0)
    assert outputs.count(">undefined<") >= 4 and "—" in outputs  # null stays a dash


def test_nonfinite_counts_in_tables_and_verdict():
    html = render_report(undefined_document())
    callout = re.search(r'id="nonfinite">.*?</div>', html, re.S).group(0)
    assert "output logits: 58 of 120 values NaN/Inf in B" in callout
    assert "1 layer(s) hold NaN/Inf" not in callout  # the bad layer is isolated-only here
    layer_table = re.search(r'id="layer-table">.*?</table>', html, re.S).group(0)
    assert ">NaN/Inf<" in layer_table and 'data-v="7"' in layer_table and ">B 7<" in layer_table
    outputs = re.search(r'id="outputs">.*?</table>', html, re.S).group(0)
    assert ">NaN/Inf<" in outputs and ">B 58<" in outputs
    assert "NaN/Inf" in dict(_cards(html))


def test_threshold_reason_and_undefined_value_are_shown():
    html = render_report(undefined_document())
    table = re.search(r'id="thresholds">.*?</table>', html, re.S).group(0)
    assert ">Why<" in table
    assert "output logits: 58 of 120 values NaN/Inf in candidate" in table
    assert '<td class="num">undefined</td>' in table
    assert '<span class="badge badge-fail" id="verdict-badge">FAIL</span>' in html


def test_outputs_table_has_sequence_agreement_and_the_note():
    html = render_report(undefined_document())
    outputs = re.search(r'id="outputs">.*?</table>', html, re.S).group(0)
    assert ">Sequence<" in outputs and ">50.00%<" in outputs
    assert "boxes/coordinates: argmax means nothing" in outputs
    # a document without rank-3 outputs keeps the old columns
    assert ">Sequence<" not in render_report(example())


def test_task_metrics_ending_in_drop_are_lower_is_better():
    html = render_report(undefined_document())
    rows = dict(
        re.findall(r'<tr><td>([a-z ]+)</td>.*?<td class="num delta ?([a-z]*)">', html, re.S)
    )
    assert rows["cer drop"] == "bad"  # the loss went up
    assert rows["wer drop"] == "good"  # the loss went down
    assert rows["line accuracy"] == "bad"  # B undefined


def guard_document() -> dict:
    doc = example()
    doc["sqnr_floor_db"] = 20.0
    doc["flags"] = [
        {"candidate": "B", "rule": "sqnr_floor", "node": "Conv_7", "op_type": "Conv",
         "output": "conv3/out", "tensor": "pool2:0", "isolated_sqnr_db": 6.9, "floor_db": 20.0,
         "method": "entropy", "amax": 0.061, "clip_fraction": 0.123, "suggestion": "mse",
         "suggestion_amax": 0.41, "suggestion_clip_fraction": 1e-5},
        {"candidate": "B", "rule": "sqnr_floor", "node": "Gemm_9", "op_type": "Gemm",
         "output": "fc/out", "tensor": "flat", "isolated_sqnr_db": 17.5, "floor_db": 20.0,
         "method": "entropy", "amax": 3.0, "clip_fraction": 0.0, "suggestion": None,
         "suggestion_amax": None, "suggestion_clip_fraction": None},
    ]  # fmt: skip
    doc["calibration"]["clip_warn"] = 0.001
    doc["calibration"]["clipping"] = [
        {"candidate": "int8:entropy", "tensor": "pool2:0", "method": "entropy", "amax": 0.061,
         "clip_fraction": 0.118, "suggestion": "mse", "suggestion_amax": 0.41,
         "suggestion_clip_fraction": 1e-5},
    ]  # fmt: skip
    names = [t["name"] for t in doc["calibration"]["tensors"]]
    doc["calibration"]["method_used"] = "auto"
    for t in doc["calibration"]["tensors"]:
        t["used_method"] = "auto"
    doc["calibration"]["auto"] = {
        "methods": ["minmax", "entropy", "mse"],
        "holdout": "first 64 calibration samples (also in the statistics)",
        "output_sqnr_db": {"mix": 30.4, "minmax": 29.3, "entropy": 21.5, "mse": 29.4},
        "chosen": "mix",
        "fallback": False,
        "tensors": [
            {"tensor": names[0], "method": "minmax", "isolated_best": "minmax",
             "readers": ["Conv_0"], "isolated_sqnr_db": {"minmax": 40.7, "entropy": 38.0,
                                                         "mse": 40.1}},
        ],
    }  # fmt: skip
    return doc


def test_clipping_guard_flags_are_shown():
    html = render_report(guard_document())
    assert 'href="#clipping"' in html and 'id="clipping"' in html
    floor = re.search(r'id="floor-flags">.*?</table>', html, re.S).group(0).replace("<wbr>", "")
    assert ">Conv_7<" in floor and ">pool2:0<" in floor and ">6.9 dB<" in floor
    assert ">12.3%<" in floor and ">mse<" in floor and ">none better<" in floor
    clip = re.search(r'id="clip-flags">.*?</table>', html, re.S).group(0).replace("<wbr>", "")
    assert ">11.8%<" in clip and ">mse<" in clip
    # one candidate: named once in the summary ("B" and its spec are the same side)
    assert "INT8 (entropy): 1 tensor(s) clip more than 0.1% of their values" in html
    assert "2 quantized op(s) below 20.0 dB isolated SQNR (--sqnr-floor)" in html
    assert ">Side<" not in floor
    assert dict(_cards(html))["Clipping guard"] == "3 flag(s)"
    assert "Conv_7: 6.9 dB isolated (mse does better)" in html
    # the flagged tensor's histogram is drawn first, saying why
    captions = re.findall(r"<figcaption><code>(.*?)</code><span>(.*?)</span>", html)
    assert captions[0] == ("flat", "flagged: Gemm_9 at 17.5 dB")


def test_auto_record_and_method_note_are_shown():
    doc = guard_document()
    html = render_report(doc)
    candidates = re.search(r'id="auto-candidates">.*?</table>', html, re.S).group(0)
    names = re.findall(r'<td class="name[^"]*">([^<]+)</td>', candidates)
    assert names == ["mix (per-tensor mix)", "mse", "minmax", "entropy"]  # best first
    assert ">chosen<" in candidates
    tensors = re.search(r'id="auto-tensors">.*?</table>', html, re.S).group(0).replace("<wbr>", "")
    assert ">40.7 dB<" in tensors and ">Conv_0<" in tensors
    # the amax table marks the method auto gave the tensor, not a column named "auto"
    amax = re.search(r'id="amax-table">.*?</table>', html, re.S).group(0)
    first = re.search(r"<tbody>\s*<tr>(.*?)</tr>", amax, re.S).group(1)
    assert ">auto → minmax<" in first and first.count('class="used"') == 1
    assert "quantbench&#39;s variant of TensorRT&#39;s EntropyCalibration2" in html
    assert 'id="method-note"' in html


def test_no_threshold_means_no_verdict_even_if_passed_is_true():
    """compare writes passed: true when no gate was set; the badge must not claim PASS."""
    doc = example()
    doc["thresholds"], doc["passed"] = [], True
    html = render_report(doc)
    assert ">NO GATE<" in html and ">PASS<" not in html


def test_layers_csv_keeps_its_columns_and_adds_the_nonfinite_counts(tmp_path):
    import csv

    from quantbench.results import write_layers_csv

    doc = undefined_document()
    path = write_layers_csv(doc, tmp_path / "layers.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [
        "candidate", "index", "tensor", "node", "op_type", "view", "quantized", "cosine",
        "sqnr_db", "rel_l2", "max_abs", "mean_abs", "clip_fraction", "amax",
    ]  # fmt: skip
    header = list(rows[0])
    assert [c for c in header if c in kept] == kept  # every earlier column, in its order
    assert {"nonfinite_fp32", "nonfinite_candidate"} <= set(header)
    assert len(rows) == len(doc["layers"])
    bad = [r for r in rows if r["nonfinite_candidate"] != "0"]
    undefined = next(x["tensor"] for x in doc["layers"] if x["sqnr_db"] == "nan")
    got = [(r["tensor"], r["view"], r["nonfinite_fp32"], r["nonfinite_candidate"]) for r in bad]
    assert got == [(undefined, "isolated", "0", "7")]
    assert bad[0]["sqnr_db"] == "nan"  # undefined stays "nan", as in the JSON


def test_calibration_report_shows_the_clipping_flags_of_each_table():
    doc = calibration_only()
    doc["calibration"]["clip_warn"] = 0.001
    doc["calibration"]["clipping"] = [
        {"candidate": m, "tensor": "relu1:0", "method": m, "amax": 0.1, "clip_fraction": 0.1,
         "suggestion": "mse", "suggestion_amax": 1.0, "suggestion_clip_fraction": 0.0}
        for m in ("entropy", "entropy:slides")
    ]  # fmt: skip
    html = render_report(doc)
    clip = re.search(r'id="clip-flags">.*?</table>', html, re.S).group(0)
    assert ">Table<" in clip and ">entropy:slides<" in clip and clip.count(">mse<") == 2
    assert dict(_cards(html))["Clipping guard"] == "2 flag(s)"


def test_layer_table_shows_each_ops_precision_when_the_results_have_it():
    def layer_table(html: str) -> str:
        start = html.index('id="layer-table"')
        return html[start : html.index("</table>", start)]

    doc = example()
    assert ">Precision<" not in layer_table(render_report(doc))
    kinds = ["int8", "fp16-emulated", "fp32", None]
    for i, entry in enumerate(doc["layers"]):
        entry["precision"] = kinds[i % len(kinds)]
    table = layer_table(render_report(doc))
    assert ">Precision<" in table and ">fp16-emulated<" in table and ">int8<" in table


def test_a_report_of_several_methods_names_no_single_method_used(run_cli, cnn_path, cnn_data,
                                                                  tmp_path):  # fmt: skip
    """'calibrate -m all --report' said 'Method used: minmax' (the first table of seven)."""
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "all", "-o",
                           tmp_path / "tables", "--report", tmp_path / "r.html")  # fmt: skip
    assert code == 0, err
    html = (tmp_path / "r.html").read_text()
    assert "Tables written" in html and "Method used" not in html
    code, _, err = run_cli("calibrate", cnn_path, "--data", cnn_data, "-m", "mse", "-o",
                           tmp_path / "one.cache", "--report", tmp_path / "one.html")  # fmt: skip
    assert code == 0 and "Method used" in (tmp_path / "one.html").read_text()


def _drift_svg(values: list[float]) -> str:
    from quantbench.reports.charts import DriftPoint, drift_chart

    points = [DriftPoint(i, f"t{i}", f"n{i}", "Conv", v, None) for i, v in enumerate(values)]
    return str(drift_chart(points, [], "isolated"))


def _y_ticks(svg_text: str) -> list[float]:
    labels = re.findall(r'class="tick end">([−\d.]+)</text>', svg_text)  # the y axis
    return [float(t.replace("−", "-")) for t in labels]


def test_drift_scale_stops_at_100_db_and_says_what_the_top_edge_holds():
    """MiniLM: tensors one subnormal away from FP32 read 780 dB; the axis went to 800 and the
    INT8 layers (2.7 to 40 dB) lay flat along the bottom."""
    svg_text = _drift_svg([31.0, 2.7, 780.0, math.inf, 22.0])
    assert max(_y_ticks(svg_text)) == 100.0
    assert "top edge: exact, or above 100 dB" in svg_text
    plain = _drift_svg([31.0, 2.7, 40.0, 22.0])
    assert max(_y_ticks(plain)) == 40.0 and "top edge" not in plain
    exact = _drift_svg([31.0, math.inf, 22.0])  # an exact match: drawn at the top edge
    assert max(_y_ticks(exact)) == 32.0 and "top edge: exact, or above 32 dB" in exact
