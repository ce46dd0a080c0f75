"""The GPU path's logic on the CPU: device statistics (run on numpy) equal the host TensorStats,
the device pass's plan handling equals the host pass, and ``--provider cuda`` without a usable
CUDA provider fails in one line. The same code on CuPy is checked on a GPU (tests/gpu)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from quantbench.backends import onnxruntime as ortbackend
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.collect import devicecollect
from quantbench.collect.devicecollect import _DeviceBinner, wants_device_stats
from quantbench.collect.statspass import collect_stats
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.stats import binning, devicestats
from quantbench.stats.binning import HALF_BINS
from quantbench.stats.derivation import derivation_plan
from quantbench.stats.devicestats import StatsBank
from quantbench.stats.tensorstats import TensorStats

TINY = np.float32(2.0**-149)  # the smallest float32 subnormal


def _sequences() -> dict[str, list[np.ndarray]]:
    """Batches that exercise every branch of TensorStats.update (hand-picked, not random only)."""
    rng = np.random.default_rng(7)
    edges = np.array([k * 2.0**-3 for k in range(-20, 21)], dtype=np.float32)
    return {
        "zeros-then-growth": [
            np.array([0.0, -0.0, 0.0], np.float32),
            np.array([TINY, -TINY, 2 * TINY], np.float32),
            edges,
            np.nextafter(edges, np.float32(np.inf)),
            np.nextafter(edges, np.float32(-np.inf)),
            rng.normal(0, 1e3, 5000).astype(np.float32),
            np.array([3.0e38, -3.0e38], np.float32),
        ],
        "nonfinite": [
            np.array([np.nan, np.nan], np.float32),
            np.array([np.inf, -np.inf, 1.0], np.float32),
            np.array([np.nan, -2.5, 7.0, np.inf], np.float32),
            rng.normal(size=(4, 8)).astype(np.float32),
        ],
        "powers-of-two": [
            np.array([2.0**k for k in range(-30, 31)], np.float32),
            -np.array([2.0**k for k in range(-30, 31)], np.float32),
            np.array([16384.0 * 2.0**-14, 16383.0 * 2.0**-14], np.float32),
        ],
        "float16": [
            rng.normal(size=300).astype(np.float16),
            np.array([6.0e-8, -6.0e-8, 65504.0, np.nan], np.float16),
        ],
        "float64": [
            rng.normal(size=300),
            np.array([1e-300, -1e-300, 1e300], np.float64),
        ],
        "empty": [np.zeros(0, np.float32), np.array([1.5], np.float32)],
    }


def _same(host: TensorStats, dev: TensorStats) -> None:
    fields = ("count", "min", "max", "nan_count", "inf_count", "exponent")
    assert [getattr(dev, f) for f in fields] == [getattr(host, f) for f in fields]
    assert dev.counts.dtype == host.counts.dtype  # int32 while the count fits one
    assert np.array_equal(dev.counts, host.counts)


def _bank_pair(batches: list[np.ndarray], relus: int = 1) -> tuple[TensorStats, ...]:
    bank = StatsBank(np, ["x"], {"x": [f"r{k}" for k in range(relus)]})
    for batch in batches:
        bank.add({"x": batch})
    got = bank.results()
    return (got["x"], *(got[f"r{k}"] for k in range(relus)))


@pytest.mark.parametrize("name", sorted(_sequences()))
def test_bank_on_numpy_equals_the_host_update(name):
    batches = _sequences()[name]
    host, relu_host = TensorStats("x"), TensorStats("r")
    for batch in batches:
        relu_host.update_relu(host.update(batch), batch)
    got, relu = _bank_pair(batches)
    _same(host, got)
    _same(relu_host, relu)


def test_relu_finer_than_its_source_and_all_nonfinite_batches():
    """The Relu's grid is finer than its source's (negatives wide); a batch without a finite
    value adds NaN/Inf to the source only (update() returns None, update_relu skips it)."""
    batches = [
        np.array([-1000.0, 0.25, 0.5, 1.0], np.float32),
        np.array([np.nan, -np.inf], np.float32),
        np.array([-np.inf, np.inf, np.nan, 0.75], np.float32),
    ]
    host, relu_host = TensorStats("x"), TensorStats("r")
    for batch in batches:
        relu_host.update_relu(host.update(batch), batch)
    assert (host.exponent, relu_host.exponent) == (-4, -13)
    got, relu = _bank_pair(batches)
    _same(host, got)
    _same(relu_host, relu)
    assert relu.count == 4 + 2 and relu.nan_count == 1 and relu.inf_count == 1  # -Inf -> 0


class _Fake:
    """A flat array with a device-style address (``.data.ptr``), for the table tests."""

    def __init__(self, values: np.ndarray, ptr: int):
        self.values, self.size, self.dtype = values, values.size, values.dtype
        self.data = type("P", (), {"ptr": ptr})()


def _emulate_count(ints, reals, ntasks, ntensors, arrays, counts):
    """qb_count's reading of its tables, in numpy (the kernel's arithmetic is the host's): the
    tensor's chunk binned, derived Relus from the chunk's bins (non-negative bins kept, the
    negative ones and -Inf into bin 0), binned Relus from max(x, 0)."""
    tasks = ints[: 8 * ntasks].reshape(ntasks, 8)
    tptr = ints[8 * ntasks : 8 * ntasks + ntensors]
    trow = ints[8 * ntasks + ntensors : 8 * ntasks + 2 * ntensors]
    rrow = ints[8 * ntasks + 2 * ntensors :]
    tscale, rscale = reals[:ntensors], reals[ntensors:]
    by_ptr = {a.data.ptr: a.values for a in arrays}
    for t, start, end, own, r0, r1, d0, d1 in tasks:
        x = by_ptr[int(tptr[t])][start:end]
        assert r1 - r0 <= devicestats.MAX_RELUS
        assert own or d0 == d1  # derived Relus need the tensor's bins
        if own:
            exponent = -int(np.log2(tscale[t]))
            chunk = binning.numpy_finite_counts(x, exponent)
            counts[trow[t]] += chunk
            for r in range(d0, d1):
                assert rscale[r] == tscale[t]  # derived only on the tensor's own grid
                counts[rrow[r], HALF_BINS:] += chunk[HALF_BINS:]
                counts[rrow[r], HALF_BINS] += chunk[:HALF_BINS].sum() + np.sum(x == -np.inf)
        for r in range(r0, r1):
            exponent = -int(np.log2(rscale[r]))
            counts[rrow[r]] += binning.numpy_finite_counts(np.maximum(x, 0), exponent)


def test_count_tables_cover_every_value_once(monkeypatch):
    """The count kernel's tables (chunks, Relus derived from the tensor's bins or binned
    MAX_RELUS at a time, rows, scales), read the way qb_count reads them, give the counts of
    the numpy path: a source with 7 Relus of which some share its grid (a Relu's grid follows
    its own past maximum), -Inf and NaN values, chunks cut mid-tensor, two parts."""
    monkeypatch.setattr(devicestats, "COUNT_CHUNK", 1000)
    rng = np.random.default_rng(5)
    relus = {"a": [f"ra{k}" for k in range(7)], "b": ["rb"]}
    reference = StatsBank(np, ["a", "b"], relus)
    bank = StatsBank(np, ["a", "b"], relus)
    for k in range(6):  # this Relu's grid is made coarser by a larger earlier maximum
        bank.slots[f"ra{k}"].exponent = reference.slots[f"ra{k}"].exponent = -3 - k % 3
    derived_seen = binned_seen = 0
    for step in range(2):
        a = rng.normal(-20 * step, 3, 4321).astype(np.float32)
        a[[7, 1500]] = -np.inf
        a[99] = np.nan
        values = {"a": a, "b": rng.normal(0, 1, 999)}
        reference.add(values)
        flat = {n: bank._flat(v) for n, v in values.items()}
        ranges = bank._ranges(list(flat.values()))
        fakes = [_Fake(x, 4096 * (i + 1)) for i, x in enumerate(flat.values())]
        work = [bank._rules(bank.slots[n], f, r) for n, f, r in zip(flat, fakes, ranges)]
        ints, reals, ntasks = devicestats._count_tables(work)
        tasks = ints[: 8 * ntasks].reshape(ntasks, 8)
        derived_seen += int((tasks[:, 7] - tasks[:, 6]).sum())
        binned_seen += int((tasks[:, 5] - tasks[:, 4]).sum())
        _emulate_count(ints, reals, ntasks, len(work), fakes, bank.counts)
    assert derived_seen and binned_seen  # both kinds of Relu were exercised
    want, got = reference.results(), bank.results()
    for name in want:
        _same(want[name], got[name])


def test_range_blocks_reduce_to_the_tensor_range(monkeypatch):
    monkeypatch.setattr(devicestats, "CHUNK", 7)
    x = np.array([np.nan, 1, -2, np.inf, 5, -np.inf, 0, 3, 9, -7, np.nan, 4, 2, 1, 0], np.float64)
    y = np.array([np.inf, np.inf], np.float32)
    tasks = devicestats._tasks([x, y])
    assert tasks.tolist() == [[0, 0, 7], [0, 7, 14], [0, 14, 15], [1, 0, 2]]
    blocks = np.array([devicestats._numpy_range(([x, y][t])[a:b]) for t, a, b in tasks])
    got = devicestats._reduce_blocks(blocks, tasks[:, 0], 2)
    assert got.tolist() == [[-7, 9, 2, 1, 1], [np.inf, -np.inf, 0, 2, 0]]


def test_device_binner_equals_the_host_pass(cnn_path, cnn_data):
    """The device pass's plan handling (measured, Relu from bins, renamed copies), on numpy,
    against the host collect_stats over the same activations."""
    graph = open_graph(cnn_path)
    tensors = calibration_tensors(graph, "all")
    plan = derivation_plan(graph, tensors)
    assert {kind for kind, _ in plan.values()} == {"relu", "same"}
    host = collect_stats(
        graph, open_data(cnn_data, graph.inputs, batch_size=7), tensors, show_progress=False
    )
    inputs = {s.name for s in graph.inputs}
    measured = [t for t in tensors if t not in plan and t not in inputs]
    runner = OnnxRuntimeRunner(expose(graph.model, measured, graph.elem_types))
    binner = _DeviceBinner(np, tensors, plan)
    for feed in open_data(cnn_data, graph.inputs, batch_size=7).batches():
        binner.bin({**{t: feed[t] for t in tensors if t in inputs}, **runner.infer(feed, measured)})
    got = binner.results()
    assert list(got) == tensors
    for name in tensors:
        _same(host[name], got[name])


def test_device_parts_respect_the_budget(monkeypatch):
    from quantbench.model.graph import TensorSpec

    monkeypatch.setattr(devicecollect, "DEVICE_ACTIVATION_BUDGET", 1000)
    spec = [TensorSpec("x", "float32", ["N", 4])]
    feed = {"x": np.arange(100 * 4, dtype=np.float32).reshape(100, 4)}
    sizes = [p.num_samples for p in devicecollect._parts(feed, spec, lambda: 300)]
    assert sizes == [3] * 33 + [1]  # 1000 // 300 samples a part
    whole = list(devicecollect._parts(feed, spec, lambda: 0))
    assert [p.num_samples for p in whole[:2]] == [64, 36]  # unknown size: FIRST_PART first
    small = {"x": feed["x"][:40]}
    assert next(devicecollect._parts(small, spec, lambda: 0)) is small  # one shape: whole


def test_cuda_without_onnxruntime_gpu_fails_in_one_line(run_cli, cnn_path, cnn_data):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    for command in (
        ["calibrate", cnn_path, "--data", cnn_data, "--provider", "cuda"],
        ["compare", "fp32", "int8", "--model", cnn_path, "--data", cnn_data]
        + ["--calib-data", cnn_data, "--provider", "cuda"],
    ):
        code, out, err = run_cli(*command)
        assert code == 2, (command, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "CUDAExecutionProvider is not available" in lines[0]
        assert "quantbench[gpu]" in lines[0]


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_provider_that_falls_back_to_the_cpu_is_an_error(monkeypatch, cnn_path):
    """onnxruntime-gpu on a machine where CUDA does not start: the session silently runs on the
    CPU; quantbench must say so instead of reporting a CUDA run."""
    available = [*ort.get_available_providers(), "CUDAExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    monkeypatch.setattr(ortbackend, "_preload_cuda_libraries", lambda: None)
    with pytest.raises(QuantbenchError, match="could not start CUDAExecutionProvider"):
        OnnxRuntimeRunner(str(cnn_path), "cuda")


def test_device_binning_choice(monkeypatch):
    assert not wants_device_stats(None)
    assert not wants_device_stats("cpu")
    monkeypatch.setenv("QUANTBENCH_DEVICE_BINNING", "0")
    assert not wants_device_stats("cuda")  # opted out: not even the provider is looked at


def test_missing_cupy_falls_back_to_host_binning_with_a_warning(monkeypatch, capsys):
    available = [*ort.get_available_providers(), "CUDAExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    monkeypatch.setattr(ortbackend, "_preload_cuda_libraries", lambda: None)

    def no_cupy():
        raise QuantbenchError("statistics on the GPU need CuPy: pip install 'quantbench[gpu]'")

    monkeypatch.setattr(devicecollect, "import_cupy", no_cupy)
    assert not wants_device_stats("cuda")
    err = capsys.readouterr().err
    assert "need CuPy" in err and "binning on the host instead" in err



def test_provider_start_is_for_cuda_only_and_leaves_failures_to_the_session(capsys):
    """``start_provider`` pays CUDA's first-session costs on a thread; elsewhere it does
    nothing, and where CUDA cannot start it fails silently (the real session says why:
    ``test_cuda_without_onnxruntime_gpu_fails_in_one_line`` goes through it). stdout, which
    the preload redirects while it runs, is ours again afterwards."""
    from quantbench.backends.onnxruntime import start_provider

    assert start_provider(None) is None
    assert start_provider("cpu") is None
    started = start_provider("cuda")
    assert started is not None and started.result(timeout=60) is None
    assert start_provider("CUDA") is not None
    print("still here")
    assert "still here" in capsys.readouterr().out
