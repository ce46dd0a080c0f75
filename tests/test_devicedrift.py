"""compare's device drift (quantbench.compare.devicedrift) on the CPU: its bookkeeping on numpy
and its kernel tables read the way the kernels read them, against the host accumulators of
quantbench.evaluate.metrics and float64 numpy references. The kernels themselves run in
tests/gpu/test_gpu_path_drift.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantbench.compare import devicedrift
from quantbench.compare.devicedrift import FIELDS, DeviceDrift, device_arrays
from quantbench.evaluate.metrics import ClipCounter, DriftAccumulator


def _batches(seed: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for size, scale in ((5000, 1.0), (1, 3.0), (0, 1.0), (70_000, 20.0)):
        a = rng.normal(0, scale, size).astype(np.float32)
        out.append((a, (a + rng.normal(0, 0.05 * scale, size)).astype(np.float32)))
    return out


def _reference(batches: list[tuple[np.ndarray, np.ndarray]], amax: float | None) -> dict:
    """float64 numpy over the finite batches (a batch with NaN/Inf adds only its counts)."""
    ref = dict.fromkeys(("aa", "bb", "ab", "dd", "abs", "max", "clipped", "bad_a", "bad_b"), 0.0)
    ref["n"] = 0
    for a, b in batches:
        ref["n"] += a.size
        bad_a, bad_b = int((~np.isfinite(a)).sum()), int((~np.isfinite(b)).sum())
        ref["bad_a"] += bad_a
        ref["bad_b"] += bad_b
        if bad_a or bad_b or not a.size:
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        ref["aa"] += float(np.sum(x * x))
        ref["bb"] += float(np.sum(y * y))
        ref["ab"] += float(np.sum(x * y))
        ref["dd"] += float(np.sum((x - y) ** 2))
        ref["abs"] += float(np.sum(np.abs(x - y)))
        ref["max"] = max(ref["max"], float(np.max(np.abs(x - y))))
        if amax:
            ref["clipped"] += int(np.sum(np.abs(x) > np.float32(amax)))
    return ref


def _check(acc: DriftAccumulator, ref: dict) -> None:
    assert acc.n == ref["n"]
    assert (acc.nonfinite_a, acc.nonfinite_b) == (ref["bad_a"], ref["bad_b"])
    for field, key in (("sum_aa", "aa"), ("sum_bb", "bb"), ("sum_ab", "ab"),
                       ("sum_dd", "dd"), ("sum_abs_d", "abs")):  # fmt: skip
        assert math.isclose(getattr(acc, field), ref[key], rel_tol=1e-12), field
    assert math.isclose(acc.max_abs_d, ref["max"], rel_tol=1e-7)
    assert acc.clipped == ref["clipped"]


@pytest.mark.parametrize("amax", [None, 12.5])
def test_numpy_drift_equals_float64_reference_and_the_host_accumulator(amax):
    batches = _batches()
    dev, host = DriftAccumulator(amax=amax), DriftAccumulator(amax=amax)
    drift = DeviceDrift(np)
    for a, b in batches:
        drift.add(dev, a.reshape(10, -1) if a.size == 5000 else a, b)
        drift.run()
        host.update(a, b)
    drift.finish()
    _check(dev, _reference(batches, amax))
    # the host path (float32 BLAS) within float summation-order rounding: same metrics
    for key, value in host.metrics().items():
        got = dev.metrics()[key]
        assert (value is None and got is None) or math.isclose(got, value, rel_tol=1e-5), key


def test_nonfinite_batches_add_counts_only_and_clip_counters_always():
    a = np.array([1.0, np.nan, 3.0, -40.0], np.float32)
    b = np.array([1.0, 2.0, np.inf, 5.0], np.float32)
    batches = [(a, b), *_batches(9)[:1]]
    acc, clip, host_clip = DriftAccumulator(), ClipCounter(2.5), ClipCounter(2.5)
    drift = DeviceDrift(np)
    for x, y in batches:
        drift.add(acc, x, y)
        drift.add_clip(clip, x)
        drift.run()
        host_clip.update(x)
    drift.finish()
    _check(acc, _reference(batches, None))
    assert (acc.nonfinite_a, acc.nonfinite_b) == (1, 1)
    assert not acc.defined
    # values beyond 2.5 in magnitude, NaN never: 3, -40 in the first batch, then the normals
    want = 2 + int(np.sum(np.abs(batches[1][0]) > 2.5))
    assert (clip.clipped, clip.n) == (want, 4 + batches[1][0].size)
    assert (clip.clipped, clip.n) == (host_clip.clipped, host_clip.n)


class _Fake:
    def __init__(self, values: np.ndarray, ptr: int):
        self.values, self.size = values, values.size
        self.data = type("P", (), {"ptr": ptr})()


def test_tables_read_like_the_kernels_give_the_numpy_sums(monkeypatch):
    """``_tables`` read as qb_drift / qb_drift_fold read them (entries, first task, chunks)."""
    monkeypatch.setattr(devicedrift, "CHUNK", 1000)
    rng = np.random.default_rng(2)
    accs = [DriftAccumulator(), DriftAccumulator(amax=1.0), ClipCounter(0.5)]
    arrays = [rng.normal(size=n).astype(np.float32) for n in (2500, 999, 2500, 1001, 3000)]
    fakes = [_Fake(x, 64 * (i + 1)) for i, x in enumerate(arrays)]
    batch = [(accs[0], fakes[0], fakes[2]), (accs[1], fakes[1], fakes[1]),
             (accs[2], fakes[4], None)]  # fmt: skip
    rows = {id(acc): k for k, acc in enumerate(accs)}
    entries, amax, tasks = devicedrift._tables(batch, rows)
    assert len(tasks) == 3 + 1 + 3 and entries.shape == (3, 5)
    by_ptr = {f.data.ptr: f.values for f in fakes}
    out = np.zeros((len(tasks), FIELDS))
    for t, (k, start, end) in enumerate(tasks):
        a = by_ptr[int(entries[k, 0])][start:end]
        b = by_ptr[int(entries[k, 1])][start:end] if entries[k, 1] else None
        out[t] = devicedrift._numpy_sums(a, b, float(amax[k]))
    totals = np.zeros((3, FIELDS))
    for k in range(3):
        first = entries[k, 4]
        last = entries[k + 1, 4] if k + 1 < 3 else len(tasks)
        s = out[first:last].sum(axis=0)
        s[5] = out[first:last, 5].max()
        totals[entries[k, 3]] = devicedrift._fold(totals[entries[k, 3]], s, bool(entries[k, 2]))
    for k, (acc, a, b) in enumerate(batch):
        whole = devicedrift._numpy_sums(a.values, None if b is None else b.values, _amax(acc))
        np.testing.assert_allclose(totals[k], whole, rtol=1e-12)


def _amax(acc) -> float:
    return float(np.float32(acc.amax)) if acc.amax else 0.0


def test_host_path_without_cuda():
    assert device_arrays(None) is None
    assert device_arrays("cpu") is None


def test_compare_wiring_with_numpy_sums_equals_the_host_path(monkeypatch, tmp_path):
    """run_comparison's device branch (runners, both views, clipping, outputs to the host), on
    numpy: the same document as the host path within float summation-order rounding."""
    import synthetic

    from quantbench.backends.onnxruntime import OnnxRuntimeRunner
    from quantbench.compare import compare, run

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    synthetic.save(synthetic.small_cnn(), tmp_path / "cnn.onnx")
    np.savez(tmp_path / "calib.npz", input=synthetic.images(32, seed=1))
    np.savez(tmp_path / "eval.npz", input=synthetic.images(20, seed=2))

    def runner(model, cupy, **kw):
        return OnnxRuntimeRunner(model, **kw)

    docs = {}
    for mode in ("device", "host"):
        if mode == "device":
            monkeypatch.setattr(run, "device_arrays", lambda provider: np)
            monkeypatch.setattr(run, "DeviceOutputRunner", runner)
        else:
            monkeypatch.undo()
            monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
        docs[mode] = compare(
            "fp32", "int8", model=str(tmp_path / "cnn.onnx"), data=str(tmp_path / "eval.npz"),
            calib_data=str(tmp_path / "calib.npz"), batch_size=8, latency=False,
            show_progress=False,
        )  # fmt: skip
    device, host = docs["device"]["layers"], docs["host"]["layers"]
    assert len(device) == len(host) > 0
    assert any(r["clip_fraction"] is not None for r in host)
    for d, h in zip(device, host):
        assert (d["tensor"], d["view"]) == (h["tensor"], h["view"])
        for key in ("sqnr_db", "cosine", "rel_l2", "mean_abs", "max_abs", "clip_fraction"):
            a, b = d[key], h[key]
            if isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-12), (d["tensor"], key)
            else:
                assert a == b, (d["tensor"], key)
    assert docs["device"]["outputs"] == docs["host"]["outputs"]


def test_a_tensor_whose_size_differs_is_undefined_not_an_exception():
    """A variable-size output (NonZero, NMS) of another length in the candidate: the device path
    raised ValueError (compare's internal error); it is now undefined, as on the host."""
    acc = DriftAccumulator()
    drift = DeviceDrift(np)
    drift.add(acc, np.ones(6, np.float32), np.ones(6, np.float32))
    drift.run()
    drift.add(acc, np.ones((3, 4), np.float32), np.ones((3, 5), np.float32))
    drift.run()
    drift.finish()
    assert acc.mismatched == 1 and acc.n == 6 + 15
    assert acc.metrics()["cosine"] is None
