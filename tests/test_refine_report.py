"""A refined Q/DQ model's record shown where people look (issue 38 items 2 and 3): compare's
report has a Refinement section and its JSON a ``refinement`` section; inspect prints the trials
and puts the record in its JSON. The expected values are read from the model's own metadata
(``quantbench.refine_record``), never from the renderer; the HTML is parsed, no browser."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from pathlib import Path

import onnx
import pytest
from conftest import require_example

from quantbench.compare import compare
from quantbench.inspection import inspect_path
from quantbench.progress import results as results_console
from quantbench.quantize import quantize
from quantbench.refine import RECORD_KEY, REFINED_KEY
from quantbench.reports import load_results, render_report
from quantbench.reports.refinement import LAYER_LIMIT
from quantbench.results import write_json

NASTY = '<script>alert("x")</script> & a<b>'


class Tables(HTMLParser):
    """Each table's rows (cell texts) by id, the section ids, and all text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.sections: list[str] = []
        self.text: list[str] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._in_body = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and found.get("id"):
            self.sections.append(str(found["id"]))
        if tag == "table":
            self._table = found.get("id")
            if self._table:
                self.tables[self._table] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table and self._in_body:
            self.tables[self._table].append([])
        elif tag == "td" and self._table and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._table:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def all_text(self) -> str:
        return " ".join("".join(self.text).split())


@pytest.fixture(scope="module")
def refined(tmp_path_factory) -> tuple[Path, dict, dict]:
    """tinycnn quantized with equalize and bias tried: (its path, its stored record, the
    results of compare fp32 against it)."""
    example = require_example()
    out = tmp_path_factory.mktemp("refined") / "refined.onnx"
    quantize(
        example / "tinycnn.onnx", out, data=example / "calib.npz", refine="equalize,bias",
        show_progress=False,
    )  # fmt: skip
    stored = {p.key: p.value for p in onnx.load(out).metadata_props}
    record = json.loads(stored[RECORD_KEY])
    doc = compare(
        "fp32", str(out), model=example / "tinycnn.onnx", data=example / "eval.npz",
        latency=False, show_progress=False,
    )  # fmt: skip
    return out, record, doc


@pytest.fixture(scope="module")
def unrefined(refined, tmp_path_factory) -> tuple[Path, dict]:
    """The same Q/DQ model without its refinement metadata, and compare's results for it."""
    path, _, _ = refined
    model = onnx.load(path)
    for prop in list(model.metadata_props):
        if prop.key in (RECORD_KEY, REFINED_KEY):
            model.metadata_props.remove(prop)
    out = tmp_path_factory.mktemp("plain") / "plain.onnx"
    onnx.save(model, out)
    example = require_example()
    doc = compare(
        "fp32", str(out), model=example / "tinycnn.onnx", data=example / "eval.npz",
        latency=False, show_progress=False,
    )  # fmt: skip
    return out, doc


def _expected_verdict(trial: dict) -> str:
    if trial["kept"]:
        return "kept"
    if trial["output_sqnr_db"] is None:
        return "changed nothing"
    return "not kept"


def test_the_record_stored_is_the_one_asked_for(refined):
    _, record, _ = refined
    tried = {t["pass"].split(":")[0] for t in record["trials"]}
    assert {"equalize", "bias"} <= tried
    assert set(record["kept"]) <= {t["pass"] for t in record["trials"] if t["kept"]}


def test_compare_json_carries_the_record_as_stored(refined, tmp_path):
    _, record, doc = refined
    assert doc["refinement"] == {"B": record}  # A is FP32: it carries none
    written = tmp_path / "results.json"
    write_json(doc, written)
    assert load_results(written)["refinement"]["B"] == record


def test_the_report_lists_every_pass_tried_with_its_score_and_verdict(refined):
    _, record, doc = refined
    page = Tables(render_report(doc))
    assert "refinement" in page.sections
    rows = page.tables["refine-trials-B"]
    base = rows[0]
    assert base[0] == "(unrefined)" and base[1] == f"{record['base_output_sqnr_db']:.2f} dB"
    assert len(rows) == 1 + len(record["trials"])
    for row, trial in zip(rows[1:], record["trials"], strict=True):
        assert row[0] == trial["pass"]
        score = trial["output_sqnr_db"]
        assert row[1] == ("—" if score is None else f"{score:.2f} dB")
        assert row[3].startswith(_expected_verdict(trial)), (row, trial)
        if trial["kept"]:
            assert row[3] == "kept" and trial["pass"] in record["kept"]
        assert row[4] == str(len(trial["layers"]))
    text = page.all_text()
    kept = ", ".join(record["kept"])
    assert (f"kept: {kept}" if record["kept"] else "none kept") in text
    assert "held-back calibration samples" in text and record["holdout"] in text


def test_the_report_shows_each_pass_layer_by_layer(refined):
    _, record, doc = refined
    page = Tables(render_report(doc))
    shown = 0
    for i, trial in enumerate(record["trials"]):
        table = page.tables.get(f"refine-layers-B-{i}")
        if not trial["layers"]:
            assert table is None
            continue
        shown += 1
        assert [r[0] for r in table] == [c["node"] for c in trial["layers"]]
        for row, change in zip(table, trial["layers"], strict=True):
            assert row[1] == change["detail"]
            assert row[-3] == f"{change['before']:.2f}".replace("-", "−")
            assert row[-2] == f"{change['after']:.2f}".replace("-", "−")
        assert trial["layers"][0]["measure"] in page.all_text()
    assert shown  # bias correction changes tinycnn's layers


def test_a_long_layer_list_is_cut_with_a_count(refined):
    _, record, doc = refined
    doc = copy.deepcopy(doc)
    trials = doc["refinement"]["B"]["trials"]
    i = next(i for i, t in enumerate(trials) if t["layers"])
    trials[i]["layers"] = [dict(trials[i]["layers"][0], node=f"n{k}") for k in range(40)]
    page = Tables(render_report(doc))
    assert [r[0] for r in page.tables[f"refine-layers-B-{i}"]] == [
        f"n{k}" for k in range(LAYER_LIMIT)
    ]
    assert f"{40 - LAYER_LIMIT} more layers not shown" in page.all_text()


def test_record_text_is_escaped(refined):
    _, _, doc = refined
    doc = copy.deepcopy(doc)
    record = doc["refinement"]["B"]
    record["trials"][0]["note"] = NASTY
    record["trials"][0]["pass"] = NASTY
    record["holdout"] = NASTY
    html = render_report(doc)
    assert NASTY not in html and "<script>alert" not in html
    assert Tables(html).tables["refine-trials-B"][1][0] == NASTY


def test_a_malformed_record_still_renders(refined):
    _, _, doc = refined
    doc = copy.deepcopy(doc)
    doc["refinement"] = {"B": {"kept": "bias", "trials": [None, {"pass": 3, "layers": 7}]}}
    page = Tables(render_report(doc))
    assert "refinement" in page.sections
    assert len(page.tables["refine-trials-B"]) == 2


def test_a_model_without_a_record_has_no_refinement_section(unrefined):
    _, doc = unrefined
    assert "refinement" not in doc
    page = Tables(render_report(doc))
    assert "refinement" not in page.sections
    assert not any(t.startswith("refine-") for t in page.tables)
    assert 'href="#refinement"' not in render_report(doc)


def test_inspect_prints_the_trials_and_its_json_has_the_record(refined, run_cli, monkeypatch):
    path, record, _ = refined
    assert inspect_path(path)["refine_record"] == record
    code, out, err = run_cli("inspect", path, "--json")
    assert code == 0, err
    assert json.loads(out)["refine_record"] == record
    monkeypatch.setattr(results_console, "width", 240)  # rich wraps to the terminal
    code, out, err = run_cli("inspect", path)
    assert code == 0, err
    assert "Refinement passes tried" in out
    lines = out.splitlines()
    base = f"{record['base_output_sqnr_db']:.2f} dB"
    assert any("(unrefined)" in line and base in line for line in lines)
    for trial in record["trials"]:
        line = next(x for x in lines if f" {trial['pass']} " in x and "│" in x)
        score = trial["output_sqnr_db"]
        assert ("-" if score is None else f"{score:.2f} dB") in line
        if trial["kept"]:
            assert "yes" in line
        else:
            assert (trial["note"] or "no") in line
    if record["kept"]:
        assert f"refined by quantbench ({', '.join(record['kept'])})" in out


def test_inspect_of_a_model_without_a_record(unrefined, run_cli):
    path, _ = unrefined
    assert inspect_path(path)["refine_record"] is None
    code, out, err = run_cli("inspect", path)
    assert code == 0, err
    assert "Refinement passes tried" not in out and "refined by" not in out


def test_the_same_quantize_writes_the_same_bytes(refined, tmp_path):
    """The stored record leaves out each trial's seconds (the printed table keeps them): a
    second run of the same command writes the same file, byte for byte."""
    path, record, _ = refined
    assert record["trials"] and all("seconds" not in t for t in record["trials"])
    example = require_example()
    again = tmp_path / "again.onnx"
    quantize(
        example / "tinycnn.onnx", again, data=example / "calib.npz", refine="equalize,bias",
        show_progress=False,
    )  # fmt: skip
    assert again.read_bytes() == path.read_bytes()
