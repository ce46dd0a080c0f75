"""Table cells that carry both what a person reads and what the page's script sorts by.

A cell shows rounded text ("0.9995") but sorts by the exact value, so two layers that print
alike still sort in their true order; missing values sort last in either direction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantbench.reports.formatting import MISSING, as_number


@dataclass(frozen=True)
class Cell:
    """One table cell: display text, sort key ("" = missing), optional class, numeric or not."""

    text: str
    sort: str = ""
    css: str = ""
    title: str = ""
    numeric: bool = False


@dataclass(frozen=True)
class Column:
    """A table column: header text, the type its sort compares as ("num"/"str"), a tooltip."""

    header: str
    kind: str = "num"
    title: str = ""


def sort_key(value: Any) -> str:
    """The number as text for JavaScript's ``Number()`` ("Infinity" included), else "".

    Nine significant digits: more than float32 results carry, fewer bytes than ``repr``.
    """
    number = as_number(value)
    if number is None or math.isnan(number):
        return ""
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return str(int(number)) if number == int(number) and abs(number) < 1e15 else f"{number:.9g}"


def number_cell(value: Any, formatter: Callable[[Any], str], css: str = "") -> Cell:
    """A numeric cell: formatted text and a sort key that keeps the precision the text drops."""
    return Cell(formatter(value), sort_key(value), css, numeric=True)


def text_cell(value: Any, css: str = "", title: str = "") -> Cell:
    """A text cell; None reads as a dash and sorts last."""
    if value is None or value == "":
        return Cell(MISSING, "", css, title)
    text = str(value)
    return Cell(text, text.lower(), css, title)
