"""Does a table belong to this model? Provenance and coverage, the rule every command applies.

A table records the hash of the model it was calibrated on; applied to another model it would
quantize with foreign scales (or nothing at all) and a comparison would still "pass". Every
command that takes a table (``quantize``, ``compare``, ``recover``/``sensitivity`` through
:func:`quantbench.qdq.quantize_model`, and ``build --table``) refuses such a table, naming the
missing and extra tensors, unless the user passes ``--allow-partial``.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantbench.errors import QuantbenchError
from quantbench.table import CalibrationTable

EXAMPLES = 3


def provenance_problem(table: CalibrationTable, model_hash: str) -> str | None:
    """Why ``table`` was not made for the model of ``model_hash`` (None when it was, or when
    either side does not know: tables of other tools carry no hash)."""
    made_for = table.provenance.model_hash
    if not made_for or not model_hash or made_for == model_hash:
        return None
    return (
        f"the calibration table was made for another model (model hash {made_for[:12]}..., "
        f"this model {model_hash[:12]}...)"
    )


def coverage_problem(
    table: CalibrationTable, needed: Iterable[str], model_tensors: Iterable[str]
) -> tuple[str | None, str | None]:
    """(missing, extra): what the table lacks of ``needed``, and its entries the model does not
    have, each as a message with a few examples (None when there is none)."""
    known = set(model_tensors)
    missing = [t for t in needed if t not in table]
    extra = [t for t in table if t not in known]
    missing_text = (
        f"calibration table lacks tensors to quantize: {len(missing)} missing, e.g. "
        f"{', '.join(missing[:EXAMPLES])}"
        if missing
        else None
    )
    extra_text = (
        f"calibration table has {len(extra)} entries for tensors this model does not have "
        f"(e.g. {', '.join(extra[:EXAMPLES])})"
        if extra
        else None
    )
    return missing_text, extra_text


def check_table(
    table: CalibrationTable,
    *,
    model_hash: str,
    needed: Iterable[str],
    model_tensors: Iterable[str],
    allow_partial: bool,
    label: str,
) -> list[str]:
    """Refuse a foreign or incomplete table (unless ``allow_partial``); the findings otherwise."""
    foreign = provenance_problem(table, model_hash)
    missing, extra = coverage_problem(table, needed, model_tensors)
    problems = [p for p in (foreign, missing) if p]
    if problems and not allow_partial:
        detail = "; ".join(problems + ([extra] if extra else []))
        raise QuantbenchError(
            f"{label}: {detail}; calibrate this model, or use --allow-partial to apply the "
            "tensors the table covers"
        )
    notes = [f"{p}; applied to the tensors it covers (--allow-partial)" for p in problems]
    if extra:
        notes.append(f"{extra}; they are ignored")
    return notes
