"""The HTML report in a real browser: headless Chromium opens it from disk with the network cut.

Needs Debian's chromium (/usr/bin/chromium) and the playwright Python client; never run
`playwright install` (it downloads browsers): playwright drives the system chromium here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from quantbench.reports import write_report

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
EXAMPLE = Path(__file__).resolve().parent / "data" / "results_example.json"

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="playwright's Python client is not installed (pip install playwright; "
    "do not run `playwright install`)",
)
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)",
        allow_module_level=True,
    )


class Session:
    """The open page and everything it tried to do: requests, console errors, page errors."""

    def __init__(self, page, url: str, folder: Path) -> None:
        self.page = page
        self.url = url
        self.folder = folder
        self.requests: list[str] = []
        self.blocked: list[str] = []
        self.errors: list[str] = []
        #: the only URLs the page may load: the reports under test
        self.allowed = {url}


@contextlib.contextmanager
def open_report(document: dict, folder: Path):
    """Write ``document``'s report into ``folder`` and open it offline; yields the Session."""
    report = write_report(document, folder / "report.html")
    url = report.resolve().as_uri()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        state = Session(page, url, folder)

        def route(request_route) -> None:
            if request_route.request.url in state.allowed:
                request_route.continue_()
            else:
                state.blocked.append(request_route.request.url)
                request_route.abort()

        context.route("**/*", route)
        page.on("request", lambda request: state.requests.append(request.url))
        page.on("console", lambda m: state.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: state.errors.append(str(error)))
        page.goto(url, wait_until="load")
        yield state
        context.close()
        browser.close()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    document = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    with open_report(document, tmp_path_factory.mktemp("report")) as state:
        yield state


def column_values(page, table_id: str, header: str) -> list[float | None]:
    """The sort keys of one column, in the table's current row order (visible rows only)."""
    return page.evaluate(
        """([id, header]) => {
            const table = document.getElementById(id);
            const col = Array.from(table.tHead.rows[0].cells).findIndex(
                th => th.textContent.trim() === header);
            return Array.from(table.tBodies[0].rows).filter(r => !r.hidden).map(r => {
                const v = r.cells[col].getAttribute("data-v");
                return v === null || v === "" ? null : Number(v);
            });
        }""",
        [table_id, header],
    )


def test_opens_offline_without_errors(session):
    assert session.requests == [session.url]
    assert session.blocked == []
    assert session.errors == []


def test_verdict_and_layer_table_are_visible(session):
    page = session.page
    badge = page.locator("#verdict-badge")
    assert badge.is_visible() and badge.inner_text() == "PASS"
    assert page.locator("#verdict .headline").is_visible()
    assert page.locator("#layer-table").is_visible()
    assert page.locator("#layer-table tbody tr").count() == 34


def test_clicking_a_header_sorts_the_layer_table(session):
    page = session.page
    header = page.locator("#layer-table thead th", has_text="SQNR dB")
    before = column_values(page, "layer-table", "SQNR dB")
    header.click()
    ascending = column_values(page, "layer-table", "SQNR dB")
    assert header.get_attribute("aria-sort") == "ascending"
    assert ascending == sorted(before) and ascending != before
    header.click()
    descending = column_values(page, "layer-table", "SQNR dB")
    assert header.get_attribute("aria-sort") == "descending"
    assert descending == sorted(before, reverse=True)
    page.locator("#layer-table thead th").first.click()  # back to network order
    indices = column_values(page, "layer-table", "#")
    assert indices == sorted(indices) and indices[0] == 0


def test_filter_and_view_select_narrow_the_table(session):
    page = session.page
    page.fill("#layer-filter", "relu")
    ops = page.eval_on_selector_all(
        "#layer-table tbody tr:not([hidden])", "rows => rows.map(r => r.cells[3].textContent)"
    )
    assert ops and set(ops) == {"Relu"}
    page.select_option("#layer-view", "isolated")
    views = page.eval_on_selector_all(
        "#layer-table tbody tr:not([hidden])", "rows => rows.map(r => r.cells[4].textContent)"
    )
    assert set(views) == {"isolated"} and len(views) == len(ops) // 2
    assert page.inner_text('[data-count-for="layer-table"]') == f"{len(views)} of 34 rows"
    page.fill("#layer-filter", "")
    page.select_option("#layer-view", "")
    assert page.locator("#layer-table tbody tr:not([hidden])").count() == 34


def test_svg_charts_have_a_size(session):
    charts = session.page.locator("svg.chart")
    assert charts.count() >= 8
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 50 and box["height"] > 50


def test_on_demand_histogram_matches_the_prerendered_one(session):
    page = session.page
    prerendered = page.locator("figure.hist", has_text="worst layer #1").locator("svg")
    name = page.locator("figure.hist", has_text="worst layer #1").locator("code").inner_text()
    page.select_option("#hist-select", "input:0")
    assert page.inner_text("#hist-demand-name") == "input:0"
    page.select_option("#hist-select", name)
    assert page.inner_text("#hist-demand-name") == name
    drawn = page.locator("#hist-demand-chart svg")
    box = drawn.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 100

    def thresholds(svg) -> list[tuple[str, float]]:
        return svg.evaluate(
            """s => Array.from(s.querySelectorAll("line.thr")).map(
                l => [l.getAttribute("class"), Number(l.getAttribute("x1"))])"""
        )

    ours, theirs = thresholds(drawn), thresholds(prerendered)
    assert len(ours) == len(theirs) == 12  # 6 methods: a line and a legend swatch each
    assert sum(cls == "thr used" for cls, _ in ours) == 2
    for (cls_a, x_a), (cls_b, x_b) in zip(ours, theirs, strict=True):
        assert cls_a == cls_b and abs(x_a - x_b) <= 0.2
    assert drawn.locator("text.legend").all_inner_texts() == (
        prerendered.locator("text.legend").all_inner_texts()
    )


def test_full_page_screenshot(session):
    page = session.page
    page.evaluate("window.scrollTo(0, 0)")
    shot = session.folder / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"\nreport screenshot: {shot}")
    artifacts = os.environ.get("QUANTBENCH_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shot, Path(artifacts) / "report.png")
        shutil.copy2(session.folder / "report.html", Path(artifacts) / "report.html")
    from PIL import Image

    with Image.open(shot) as image:
        width, height = image.size
    assert width == 1280 and height > 3000  # every section laid out, none collapsed


@contextlib.contextmanager
def open_another(session: Session, document: dict, folder: Path):
    """Another report in a new tab of the same offline browser; yields (page, errors)."""
    url = write_report(document, folder / "report.html").resolve().as_uri()
    session.allowed.add(url)
    page = session.page.context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url, wait_until="load")
    try:
        yield page, errors
    finally:
        page.close()


def test_flags_and_undefined_values_in_a_browser(session, tmp_path):
    """Issues 10 and 16: the clipping guard's tables sort like the others, undefined values
    read "undefined", and the page still opens offline without errors."""
    from test_report import guard_document, undefined_document

    document = undefined_document()
    guard = guard_document()
    document.update(flags=guard["flags"], sqnr_floor_db=guard["sqnr_floor_db"])
    with open_another(session, document, tmp_path) as (page, errors):
        assert errors == [] and session.blocked == []
        assert page.locator("#nonfinite").is_visible()
        assert page.locator("#floor-flags").is_visible()
        header = page.locator("#floor-flags thead th", has_text="Isolated SQNR")
        header.click()
        assert column_values(page, "floor-flags", "Isolated SQNR") == [6.9, 17.5]
        header.click()
        assert column_values(page, "floor-flags", "Isolated SQNR") == [17.5, 6.9]
        nonfinite = page.locator("#layer-table thead th", has_text="NaN/Inf")
        nonfinite.click()
        nonfinite.click()  # descending: the layer that held NaN/Inf first
        assert column_values(page, "layer-table", "NaN/Inf")[0] == 7
        worst = page.locator("#worst tbody tr").first.inner_text()
        assert "undefined" in worst
