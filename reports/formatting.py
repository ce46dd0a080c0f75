"""Number formatting for the report: one place decides how a metric reads to a person.

Results documents come from other tools and may hold ``null``, strings or non-finite floats where a
number is expected; every formatter accepts anything and never raises, so one odd field cannot
stop a report from rendering.
"""

from __future__ import annotations

import math
from typing import Any

from quantbench.jsonsafe import from_json_float

MISSING = "—"
#: A metric quantbench could not define (NaN/Inf in the tensor: "nan" in the JSON); MISSING is
#: for what does not apply or was not measured (null).
UNDEFINED = "undefined"
MINUS = "−"  # U+2212: a real minus sign lines up with digits in tables, a hyphen does not.


def as_number(value: Any) -> float | None:
    """The value as a float when it is a JSON number or one of quantbench's non-finite strings
    ("inf", "-inf", "nan": :mod:`quantbench.jsonsafe`); bools and other strings are None."""
    return from_json_float(value)


def as_finite(value: Any) -> float | None:
    """The value as a finite float, else None (charts cannot place NaN or infinity)."""
    number = as_number(value)
    return number if number is not None and math.isfinite(number) else None


def _signed(text: str) -> str:
    return MINUS + text[1:] if text.startswith("-") else text


def _special(value: Any) -> str | None:
    """The text for a value that is not a finite number, or None when it is one."""
    number = as_number(value)
    if number is None:
        return MISSING if value is None else str(value)
    if math.isnan(number):
        return UNDEFINED
    if math.isinf(number):
        return "∞" if number > 0 else MINUS + "∞"
    return None


def fmt_num(value: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits; scientific only when fixed would mislead."""
    special = _special(value)
    if special is not None:
        return special
    if isinstance(value, int):
        return _signed(f"{value:,}")
    number = float(value)
    if number == 0:
        return "0"
    magnitude = abs(number)
    if magnitude >= 1e9 or magnitude < 1e-3:
        return _signed(f"{number:.{max(digits - 1, 0)}e}")
    if magnitude >= 10**digits:
        return _signed(f"{number:,.0f}")
    return _signed(f"{number:.{digits}g}")


def fmt_sig(value: Any, digits: int = 3) -> str:
    """Exactly ``digits`` significant digits, trailing zeros kept, so a column reads evenly."""
    special = _special(value)
    if special is not None:
        return special
    number = float(value)
    if number == 0:
        return "0"
    if abs(number) < 1e-3 or abs(number) >= 1e9:
        return _signed(f"{number:.{max(digits - 1, 0)}e}")
    if abs(number) >= 10**digits:
        return _signed(f"{number:,.0f}")
    return _signed(f"{number:#.{digits}g}".rstrip("."))


def fmt_fixed(value: Any, decimals: int) -> str:
    """A number with a fixed count of decimals, so a table column lines up."""
    special = _special(value)
    return special if special is not None else _signed(f"{float(value):.{decimals}f}")


def fmt_int(value: Any) -> str:
    """A count with thousands separators."""
    special = _special(value)
    if special is not None:
        return special
    return _signed(f"{round(float(value)):,}")


def fmt_pct(value: Any, decimals: int = 2) -> str:
    """A fraction in [0, 1] as a percentage."""
    special = _special(value)
    return special if special is not None else _signed(f"{float(value) * 100:.{decimals}f}%")


def fmt_small_pct(value: Any) -> str:
    """A small fraction (clipped values) as a percentage that keeps its leading digits."""
    special = _special(value)
    if special is not None:
        return special
    pct = float(value) * 100
    if pct == 0:
        return "0%"
    if abs(pct) < 0.001:
        return _signed(f"{pct:.1e}%")
    return _signed(f"{pct:.3g}%")


def fmt_delta_pp(value: Any) -> str:
    """A difference of two fractions in percentage points, always signed."""
    special = _special(value)
    if special is not None:
        return special
    pp = float(value) * 100
    return ("+" if pp > 0 else "") + _signed(f"{pp:.2f}") + " pp"


def fmt_delta(value: Any, digits: int = 4) -> str:
    """A signed difference (plus sign for gains, so the direction reads at a glance)."""
    text = fmt_num(value, digits)
    number = as_finite(value)
    return "+" + text if number is not None and number > 0 else text


def fmt_db(value: Any) -> str:
    special = _special(value)
    return special if special is not None else _signed(f"{float(value):.1f}") + " dB"


def fmt_ms(value: Any) -> str:
    special = _special(value)
    if special is not None:
        return special
    number = float(value)
    decimals = 2 if abs(number) < 10 else 1 if abs(number) < 100 else 0
    return _signed(f"{number:,.{decimals}f}") + " ms"


def fmt_ratio(value: Any) -> str:
    special = _special(value)
    return special if special is not None else f"{float(value):.2f}×"


def is_fraction_metric(name: str) -> bool:
    """Whether a task/threshold metric is a fraction best read as a percentage (accuracy...)."""
    lowered = name.lower()
    return any(hint in lowered for hint in ("acc", "agreement", "top1", "top5", "recall", "prec"))


def fmt_metric(name: str, value: Any) -> str:
    """A task or threshold metric: a percentage for accuracy-like names, else a plain number."""
    number = as_finite(value)
    if number is not None and is_fraction_metric(name) and 0.0 <= number <= 1.0:
        return fmt_pct(number)
    return fmt_num(value)


def fmt_metric_delta(name: str, value: Any) -> str:
    """A task metric's delta in the unit its values are shown in."""
    number = as_finite(value)
    if number is not None and is_fraction_metric(name) and -1.0 <= number <= 1.0:
        return fmt_delta_pp(number)
    return fmt_delta(value)


def nonfinite_counts(value: Any) -> tuple[int, int, int] | None:
    """A ``nonfinite: {fp32, candidate, elements}`` field as three counts; None when absent."""
    if not isinstance(value, dict):
        return None
    return tuple(  # type: ignore[return-value]
        max(int(as_finite(value.get(k)) or 0), 0) for k in ("fp32", "candidate", "elements")
    )


def fmt_nonfinite(value: Any, side: str = "B") -> str:
    """NaN/Inf counts as a short cell ("0", "FP32 3 · B 120"); MISSING when not counted."""
    counts = nonfinite_counts(value)
    if counts is None:
        return MISSING
    fp32, candidate, _ = counts
    if not fp32 and not candidate:
        return "0"
    parts = [f"FP32 {fp32:,}"] if fp32 else []
    return " · ".join(parts + ([f"{side} {candidate:,}"] if candidate else []))


def nonfinite_sentence(value: Any, side: str = "B") -> str:
    """The counts in words ("3 of 1,000 values NaN/Inf in FP32 itself; ..."); '' when none."""
    counts = nonfinite_counts(value)
    if counts is None:
        return ""
    fp32, candidate, elements = counts
    parts = []
    if fp32:
        parts.append(f"{fp32:,} of {elements:,} values NaN/Inf in FP32 itself")
    if candidate:
        parts.append(f"{candidate:,} of {elements:,} values NaN/Inf in {side}")
    return "; ".join(parts)


def shorten(text: str, limit: int) -> str:
    """Cut a long name in the middle, keeping both ends (tensor names differ at either end)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 1, 2)
    head = (keep + 1) // 2
    return text[:head] + "…" + text[len(text) - (keep - head) :]
