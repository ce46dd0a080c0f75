"""The calibration table a Q/DQ model was made from, kept in the model's ``metadata_props``.

A Q/DQ model stores scales, and ``float32(amax) / 127 * 127`` is not always ``amax`` again (about
0.5% of random amaxes come back one ulp off). Keeping the amax values beside the scales makes
``table -> Q/DQ -> table`` exact for quantbench's own models; the scales stay the authority, so an
entry whose scale was edited after export is read from the scale instead.
"""

from __future__ import annotations

import json

import onnx

from quantbench.table import CalibrationTable, Provenance

METADATA_KEY = "quantbench.calibration"


def embed_table(model: onnx.ModelProto, table: CalibrationTable, tensors: list[str]) -> None:
    """Record the amax of ``tensors`` (those that got Q/DQ) plus the table's provenance."""
    payload = {
        "method": table.method,
        "algorithm": table.algorithm,
        "provenance": table.provenance.to_dict(),
        "amax": {name: table.amax(name) for name in tensors},
    }
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(payload, sort_keys=True)


def embedded_table(model: onnx.ModelProto) -> CalibrationTable | None:
    """The embedded table, or None when absent or unreadable (then the scales alone are used)."""
    for prop in model.metadata_props:
        if prop.key != METADATA_KEY:
            continue
        try:
            payload = json.loads(prop.value)
            table = CalibrationTable(
                method=str(payload.get("method", "")),
                algorithm=str(payload.get("algorithm", "EntropyCalibration2")),
                provenance=Provenance.from_dict(payload.get("provenance", {})),
            )
            for name, amax in payload["amax"].items():
                table.set(name, float(amax))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return table
    return None
