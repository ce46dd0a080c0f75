"""The GPU path's logic on the CPU: device statistics (run on numpy) equal the host TensorStats,
the device pass's plan handling equals the host pass, and ``--provider cuda`` without a usable
CUDA provider fails in one line. The same code on CuPy is checked on a GPU (tests/gpu)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from quantbench import devicecollect
from quantbench.backends import onnxruntime as ortbackend
from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose
from quantbench.collect import collect_stats, derivation_plan
from quantbench.data import open_data
from quantbench.devicecollect import _DeviceBinner, wants_device_stats
from quantbench.devicestats import BinOps, DeviceTensorStats
from quantbench.errors import QuantbenchError
from quantbench.graph import calibration_tensors, open_graph
from quantbench.stats import TensorStats

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
    assert dev.counts.dtype == np.int64
    assert np.array_equal(dev.counts, host.counts)


@pytest.mark.parametrize("name", sorted(_sequences()))
def test_device_stats_on_numpy_equal_the_host_update(name):
    batches = _sequences()[name]
    ops = BinOps(np)
    host, relu_host = TensorStats("x"), TensorStats("r")
    dev, relu_dev = DeviceTensorStats("x", ops), DeviceTensorStats("r", ops)
    for batch in batches:
        relu_host.update_relu(host.update(batch), batch)
        relu_dev.update_relu(dev.update(batch), batch)
        _same(host, dev.to_host())
    _same(relu_host, relu_dev.to_host())


def test_relu_from_a_coarser_source_grid_bins_the_values():
    """update_relu's other branch: the Relu's grid is finer than its source's (negatives wide)."""
    values = np.array([-1000.0, 0.25, 0.5, 1.0], np.float32)
    ops = BinOps(np)
    host, dev = TensorStats("r"), DeviceTensorStats("r", ops)
    source = TensorStats("x")
    host.update_relu(source.update(values), values)
    dev.update_relu(DeviceTensorStats("x", ops).update(values), values)
    # 1000 < 16384 * 2**-4 needs e = -4 for the source; 1.0 < 16384 * 2**-13 only e = -13
    assert (source.exponent, host.exponent) == (-4, -13)
    _same(host, dev.to_host())


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
    from quantbench.graph import TensorSpec

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
