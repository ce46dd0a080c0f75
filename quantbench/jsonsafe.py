"""Non-finite floats in JSON: the one rule every quantbench JSON output follows.

JSON has no infinity or NaN, so ``json.dumps`` either writes invalid JSON (``Infinity``) or, with
``allow_nan=False``, raises. quantbench writes them as the strings ``"inf"``, ``"-inf"`` and
``"nan"`` (an SQNR of identical outputs is ``"inf"``; a metric that is undefined, e.g. on a tensor
holding NaN, is ``"nan"``). ``null`` keeps its own meaning: not computed or not applicable.
This module imports nothing from quantbench, so any layer may use it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

#: The text of each non-finite float in quantbench's JSON documents.
NONFINITE_TEXT = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def json_float(value: float) -> float | str:
    """A float as JSON can hold it: itself when finite, else "inf", "-inf" or "nan"."""
    value = float(value)
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def to_json(value: Any) -> Any:
    """``value`` with every float (Python or numpy, at any depth) JSON-safe and numpy scalars,
    arrays, tuples and paths turned into their JSON forms."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float | np.floating):
        return json_float(float(value))
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_json(v) for v in value.tolist()]
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(document: Any) -> str:
    """Strict JSON text of ``document`` (indented, newline-terminated): never ``Infinity``."""
    return json.dumps(to_json(document), indent=2, allow_nan=False) + "\n"


def from_json_float(value: Any) -> float | None:
    """The float a JSON value stands for ("inf"/"-inf"/"nan" included); None when it is no
    number (null, another string, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return NONFINITE_TEXT.get(value)
    return None
