"""SVG primitives: escaped elements, compact coordinates, axis ticks and the colour palette.

Charts are inline SVG strings written by Python, not matplotlib: a few kilobytes per chart, no
dependency, crisp at any zoom, and text stays selectable. Every attribute value and text node
goes through :func:`markupsafe.escape`, because tensor names reach chart labels and tooltips.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from markupsafe import Markup, escape

# Okabe-Ito colours (readable for the common colour-vision deficiencies), darkened slightly so
# thin lines keep contrast on white.
PALETTE = ("#0b6ba8", "#d55e00", "#009e73", "#cc79a7", "#8a6d00", "#56b4e9", "#6b4c9a", "#444444")
ACCUMULATED_COLOUR = "#2f6db5"
ISOLATED_COLOUR = "#d9822b"
WORST_COLOUR = "#c0262d"
A_COLOUR = "#8c9bab"
B_COLOUR = "#2f6db5"
GRID_COLOUR = "#e6e9ee"
AXIS_COLOUR = "#9aa4b1"
TEXT_MUTED = "#5b6675"


def num(value: float) -> str:
    """A coordinate with one decimal and no trailing zero: sub-pixel detail is invisible."""
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return "0" if text == "-0" else text


def _attr_value(value: object) -> str:
    if isinstance(value, float):
        return num(value)
    return str(escape(str(value)))


def tag(name: str, attrs: Mapping[str, object] | None = None, *children: str) -> str:
    """One element; attribute names use ``_`` for ``-`` (stroke_width), None values are dropped.

    Children are inserted as they are: pass them through :func:`text` or :func:`tag` first.
    """
    parts = [name]
    for key, value in (attrs or {}).items():
        if value is None:
            continue
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{_attr_value(value)}"')
    head = " ".join(parts)
    if not children:
        return f"<{head}/>"
    return f"<{head}>{''.join(children)}</{name}>"


def text(content: object) -> str:
    """Escaped character data for an SVG text or title node."""
    return str(escape(str(content)))


def title(content: object) -> str:
    """A native tooltip: costs no script and works in every browser."""
    return tag("title", None, text(content))


def root(width: float, height: float, label: str, children: Iterable[str], css: str = "") -> Markup:
    """An inline ``<svg>`` with explicit pixel size (no xmlns: the HTML parser supplies it)."""
    attrs = {
        "class": ("chart " + css).strip(),
        "width": num(width),
        "height": num(height),
        "viewBox": f"0 0 {num(width)} {num(height)}",
        "role": "img",
        "aria-label": label,
    }
    return Markup(tag("svg", attrs, title(label), *children))


def nice_step(span: float, max_ticks: int) -> float:
    """A 1-2-5 step that cuts ``span`` into at most ``max_ticks`` intervals."""
    if not span > 0:
        return 1.0
    raw = span / max(max_ticks, 1)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def nice_ticks(low: float, high: float, max_ticks: int = 6) -> list[float]:
    """Round tick values covering ``[low, high]`` (the axis is then widened to the outer ticks)."""
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = nice_step(high - low, max_ticks)
    first = math.floor(low / step + 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    count = round((last - first) / step)
    return [round(first + i * step, 10) for i in range(count + 1)]


def tick_label(value: float) -> str:
    """An axis label with no needless decimals (10, 2.5, 0.001)."""
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value)}".replace("-", "−")
    return f"{value:g}".replace("-", "−")


def line(
    x1: float, y1: float, x2: float, y2: float, css: str | None = None, **attrs: object
) -> str:
    """A straight line; ``css`` is its class (styling lives in the page's stylesheet)."""
    return tag("line", {"x1": x1, "y1": y1, "x2": x2, "y2": y2, "class": css, **attrs})


def label(x: float, y: float, content: object, css: str = "tick") -> str:
    """Escaped text at a point; ``css`` picks its style and anchor (``mid``, ``end``)."""
    return tag("text", {"x": x, "y": y, "class": css}, text(content))


def halo_text(x: float, y: float, content: str, **attrs: object) -> str:
    """Text with a white outline, readable where it crosses lines and bars."""
    css = " ".join(["halo", *str(attrs.pop("class_", "")).split()])
    base = {"x": x, "y": y, "class": " ".join(dict.fromkeys(css.split()))}
    base.update(attrs)
    return tag("text", base, text(content))
