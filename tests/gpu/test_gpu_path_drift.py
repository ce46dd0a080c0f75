"""compare's per-layer drift summed on the GPU (quantbench.compare.devicedrift) against float64
numpy on the same arrays, and ``compare --provider cuda`` with device sums against the same
comparison with the tensors copied to the host (QUANTBENCH_DEVICE_BINNING=0).

Needs CuPy (and onnxruntime-gpu for the end-to-end test); skips otherwise.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from cupy_probe import cupy_or_reason  # noqa: E402  (sibling helper module)
from test_devicedrift import _batches, _check, _reference  # noqa: E402

from quantbench.evaluate.metrics import ClipCounter, DriftAccumulator  # noqa: E402

cp, REASON = cupy_or_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=REASON or "")]


@pytest.mark.parametrize("amax", [None, 12.5])
def test_device_sums_equal_float64_numpy(amax):
    from quantbench.compare.devicedrift import DeviceDrift

    rng = np.random.default_rng(8)
    batches = _batches() + [
        (np.array([1.0, np.nan, 2.0], np.float32), np.array([1.0, 2.0, 3.0], np.float32)),
        (rng.normal(0, 1e19, 300_000).astype(np.float32), np.zeros(300_000, np.float32)),
    ]
    acc, clip = DriftAccumulator(amax=amax), ClipCounter(0.75)
    drift = DeviceDrift(cp)
    for a, b in batches:
        drift.add(acc, cp.asarray(a), cp.asarray(b))
        drift.add_clip(clip, cp.asarray(a))
        drift.run()
    drift.finish()
    _check(acc, _reference(batches, amax))
    want = sum(int(np.sum(a > 0.75) + np.sum(a < -0.75)) for a, _ in batches)
    assert (clip.clipped, clip.n) == (want, sum(a.size for a, _ in batches))


def _ort_cuda() -> bool:
    try:
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _ort_cuda(), reason="onnxruntime-gpu is not installed")
def test_compare_with_device_sums_equals_the_host_sums(tmp_path, monkeypatch):
    from quantbench.compare import compare

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    synthetic.save(synthetic.small_cnn(), tmp_path / "cnn.onnx")
    np.savez(tmp_path / "calib.npz", input=synthetic.images(64, seed=1))
    np.savez(tmp_path / "eval.npz", input=synthetic.images(40, seed=2))
    docs = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("QUANTBENCH_DEVICE_BINNING", mode)
        result = compare(
            "fp32",
            "int8",
            model=str(tmp_path / "cnn.onnx"),
            data=str(tmp_path / "eval.npz"),
            calib_data=str(tmp_path / "calib.npz"),
            provider="cuda",
            batch_size=16,
            latency=False,
            show_progress=False,
        )
        docs[mode] = result
    device, host = docs["1"]["layers"], docs["0"]["layers"]
    assert [(r["tensor"], r["view"]) for r in device] == [(r["tensor"], r["view"]) for r in host]
    worst = 0.0
    for d, h in zip(device, host):
        for key in ("sqnr_db", "cosine", "rel_l2", "mean_abs", "max_abs", "clip_fraction"):
            a, b = d.get(key), h.get(key)
            if isinstance(a, float) and isinstance(b, float) and math.isfinite(b):
                worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
            else:
                assert a == b, (d["tensor"], d["view"], key, a, b)
    print(f"[gpu-report] compare device vs host sums: worst relative difference {worst:.2e}")
    assert worst < 1e-4
