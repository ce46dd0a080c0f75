"""``--method auto``'s judgements kept between runs, beside the statistics cache.

Judging takes minutes on a large model (a pass over the held-back samples, one isolated pass
per distinct table, one end-to-end pass per candidate), and ``calibrate``, ``compare``,
``quantize``, ``sensitivity`` and ``recover`` each judge again with the same inputs. A judgement
is reused only when everything it depends on is the same: the model's hash (its external data
included), the statistics (model, data fingerprint, samples, tensors), the fingerprints of the
calibration data and of ``--holdout-data`` (files and folders only: a loader script or a
Python reader has none up front, and is judged every time), the batch size, preset, provider,
candidate methods, and quantbench's code (its version and its source files' sizes and times,
so that an upgrade or an edited calibrator never reuses an older build's judgement).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from quantbench import __version__
from quantbench.backends.onnxruntime import disabled_optimizers, session_config
from quantbench.collect.statspass import stats_cache_dir
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.fileio import write_text_atomic
from quantbench.model.graph import Graph
from quantbench.stats.tensorstats import StatsFile


def judgement_key(
    graph: Graph,
    stats: StatsFile,
    calib_data: object | None,
    holdout_data: object | None,
    *,
    batch_size: int | None,
    preset: str | None,
    provider: str | None,
    methods: list[str],
) -> str | None:
    """The key of a judgement with these inputs; None when one of them cannot be identified
    (data that is not a file or folder, a model without a hash)."""
    data = [_data_fingerprint(graph, d, preset) for d in (calib_data, holdout_data)]
    if not graph.hash or any(f is None for f in data):
        return None
    identity = {
        "version": __version__,
        "code": _code_fingerprint(),
        "model": graph.hash,
        "stats": [
            stats.model_hash,
            stats.data_fingerprint,
            stats.num_samples,
            sorted(stats.tensors),
        ],
        "calib_data": data[0],
        "holdout_data": data[1],
        "batch_size": batch_size,
        "preset": str(preset) if preset is not None else None,
        "provider": provider,
        "methods": methods,
        # the scores are onnxruntime's arithmetic: a new release, or other session settings,
        # judges anew
        "onnxruntime": _onnxruntime_version(),
        "disabled_optimizers": disabled_optimizers(),
        "session_config": session_config(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def load_judgement(key: str) -> dict[str, Any] | None:
    """The judgement stored under ``key``, or None (absent or unreadable: judged again)."""
    try:
        found = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("key") == key else None


def store_judgement(key: str, judgement: dict[str, Any]) -> None:
    """Keeps ``judgement`` (a JSON-ready dict) under ``key``; a cache that cannot be written
    only costs the next run its time."""
    try:
        _path(key).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(_path(key), json.dumps({**judgement, "key": key}))
    except (OSError, QuantbenchError):
        pass


def _onnxruntime_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


@functools.cache
def _code_fingerprint() -> str:
    """quantbench's and its calibrators' source files, by name, size and modification time."""
    import quantbench
    from quantbench import calibrators

    h = hashlib.sha256()
    for package in (quantbench, calibrators):
        root = Path(package.__file__).resolve().parent
        for f in sorted(root.rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    return stats_cache_dir().parent / "auto" / f"{key[:32]}.json"


def _data_fingerprint(graph: Graph, data: object | None, preset: str | None) -> str | None:
    """A file or folder's fingerprint ("" for no data); None where there is none up front."""
    if data is None:
        return ""
    if not isinstance(data, (str, Path)) or str(data).endswith(".py") or ".py:" in str(data):
        return None  # a loader script: a stream, known only once read
    try:
        return open_data(data, graph.inputs, preset=preset).fingerprint
    except QuantbenchError:
        return None
