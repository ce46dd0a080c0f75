"""Reading a results document ("quantbench-results", schema_version 1) and checking its shape.

The report renders whatever a document holds, so validation checks only what rendering relies
on: the schema tag, the version, the kind, and that each section is the JSON type it should be.
Missing or null sections are normal (no latency run, no labels) and are not errors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quantbench.errors import QuantbenchError

SCHEMA = "quantbench-results"
SCHEMA_VERSION = 1
KINDS = ("compare", "calibration")

_OBJECT_SECTIONS = (
    "model",
    "data",
    "machine",
    "a",
    "b",
    "task",
    "latency",
    "calibration",
    "recovery",
    "refinement",
)
_LIST_SECTIONS = ("layers", "outputs", "thresholds", "excluded", "dynamic_weight_convs")


def as_dict(value: Any) -> dict[str, Any]:
    """The value when it is a JSON object, else an empty one (absent sections render as absent)."""
    return value if isinstance(value, dict) else {}


def as_records(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list, skipping anything else."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


def validate_results(results: Any, source: str = "results") -> dict[str, Any]:
    """Check a results document's identity and section types; return it unchanged.

    ``source`` names the document in messages (a file path, or "results" for a dict).
    """
    if not isinstance(results, dict):
        raise QuantbenchError(
            f"{source}: not a quantbench results file (top level is a {_type_name(results)}, "
            "expected an object)"
        )
    schema = results.get("schema")
    if schema != SCHEMA:
        raise QuantbenchError(
            f"{source}: not a quantbench results file (schema {schema!r}, expected {SCHEMA!r}); "
            "pass the JSON written by `quantbench compare` or `quantbench calibrate`"
        )
    version = results.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise QuantbenchError(
            f"{source}: results file has no integer schema_version (got {version!r})"
        )
    if version > SCHEMA_VERSION:
        raise QuantbenchError(
            f"{source}: results schema_version {version} is newer than this quantbench reads "
            f"({SCHEMA_VERSION}); upgrade quantbench"
        )
    if version < 1:
        raise QuantbenchError(f"{source}: results schema_version {version} is not valid")
    kind = results.get("kind", "compare")
    if kind not in KINDS:
        raise QuantbenchError(
            f"{source}: results of kind {kind!r} have no report page; report renders the --json "
            "of compare and recover's .recovery.json (calibrate writes its page itself with "
            "--report); a sensitivity ranking is what sensitivity prints and writes with --json"
        )
    _check_section_types(results, source)
    return results


def _check_section_types(results: dict[str, Any], source: str) -> None:
    for key in _OBJECT_SECTIONS:
        value = results.get(key)
        if value is not None and not isinstance(value, dict):
            raise QuantbenchError(
                f"{source}: {key!r} must be an object or null, not a {_type_name(value)}"
            )
    for key in _LIST_SECTIONS:
        value = results.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise QuantbenchError(f"{source}: {key!r} must be a list of objects or null")


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results JSON file; every problem is one QuantbenchError line."""
    source = Path(path)
    try:
        raw = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuantbenchError(f"{source}: no such results file") from None
    except IsADirectoryError:
        raise QuantbenchError(f"{source}: is a folder; give the results JSON file") from None
    except UnicodeDecodeError:
        raise QuantbenchError(f"{source}: not a quantbench results file (not UTF-8 text)") from None
    except OSError as exc:
        raise QuantbenchError(f"{source}: cannot read results file ({exc.strerror})") from None
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise QuantbenchError(
            f"{source}: not a quantbench results file (invalid JSON at line {exc.lineno}, "
            f"column {exc.colno}: {exc.msg})"
        ) from None
    return validate_results(document, str(source))
