"""Render a results document into one self-contained HTML file.

The page inlines its CSS, charts (SVG) and script, so it opens from disk, from an e-mail
attachment or on an air-gapped machine exactly as it was written: no CDN, no fonts, no requests.
Rendering is deterministic (no clock, no randomness): the same document gives the same bytes.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from quantbench.fileio import check_output_path, write_text_atomic
from quantbench.reports.formatting import fmt_db
from quantbench.reports.results import validate_results
from quantbench.reports.view import build_view

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"


def breakable(text: object, after: str = "/.:") -> Markup:
    """Escaped text with line-break opportunities after each character of ``after``, so long
    ONNX names ("/backbone/stage3/conv/Output_0") wrap at separators instead of mid-word."""
    pattern = "([" + re.escape(after) + "])"
    return Markup(re.sub(pattern, r"\1<wbr>", str(escape(str(text)))))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["db"] = fmt_db
    env.filters["breakable"] = breakable
    # Embedded data keeps its key order (legend order) and drops the spaces json adds.
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    return env


@lru_cache(maxsize=4)
def _asset(name: str, closing_tag: str) -> Markup:
    """A CSS or JS file to inline; it must not close its own element early."""
    content = (TEMPLATES / name).read_text(encoding="utf-8")
    if closing_tag in content.lower():
        raise RuntimeError(f"{name} contains {closing_tag}, which would end the inline block")
    return Markup(content)


def render_report(results: dict[str, Any]) -> str:
    """The HTML report for a results document (validated first; QuantbenchError if malformed)."""
    document = validate_results(results)
    context = build_view(document)
    context["css"] = _asset("report.css", "</style")
    context["js"] = _asset("report.js", "</script")
    return _environment().get_template(TEMPLATE).render(context)


def write_report(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Render and write the report atomically; a failed render leaves no file behind."""
    target = check_output_path(path)
    html = render_report(results)
    return write_text_atomic(target, html)
