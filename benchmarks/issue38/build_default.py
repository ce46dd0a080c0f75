"""Build quantbench's default Q/DQ model (quantize with no option) for corpus models into
benchmarks/_work/issue38.

.venv/bin/python benchmarks/issue38/build_default.py mtcnn-pnet dddd-ocr
"""

from __future__ import annotations

import json
import sys
import time

from qdqlab import DATA as ZOO
from qdqlab import MODELS
from qdqlab import WORK as OUT

from quantbench.quantize import quantize


def main(keys: list[str]) -> None:
    """KEY builds the default; KEY:refine-all builds ``--refine all`` (KEY-refine-all.onnx)."""
    OUT.mkdir(parents=True, exist_ok=True)
    for item in keys:
        key, _, variant = item.partition(":")
        name = variant or "default"
        extra = {"refine": "all"} if variant == "refine-all" else {}
        t0 = time.perf_counter()
        outcome = quantize(
            MODELS[key],
            OUT / f"{key}-{name}.onnx",
            data=ZOO / key / "calib.npz",
            show_progress=False,
            **extra,
        )
        seconds = time.perf_counter() - t0
        doc = {
            "seconds": round(seconds, 1),
            "refine": outcome.refine.to_dict() if outcome.refine else None,
            "table": {
                n: {"amax": e.amax, "method": e.method} for n, e in outcome.table.entries.items()
            },
        }
        (OUT / f"{key}-{name}.json").write_text(json.dumps(doc, indent=1, default=str))
        print(key, f"{seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
