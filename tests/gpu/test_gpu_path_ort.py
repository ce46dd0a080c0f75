"""onnxruntime-gpu calibration with statistics on the device, end to end, on a real GPU.

* the activations onnxruntime leaves on the GPU, binned there, give exactly the host's bins for
  the same values (copied to the host and binned by TensorStats);
* a whole CUDA calibration against a CPU one: inference differs in the last bits, so the tables
  may differ slightly; the test prints by how much and bounds it;
* GPU memory does not grow with the number of samples;
* the commands (calibrate, quantize --data, compare, sensitivity, recover) with --provider cuda.

Needs onnxruntime-gpu (CUDAExecutionProvider) and CuPy; skips otherwise. Writes a summary to
``$QB_GPU_REPORT`` when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import synthetic  # noqa: E402  (tests/synthetic.py: the small models of the CPU tests)

REPO = Path(__file__).resolve().parents[2]


def _reason() -> str | None:
    try:
        import cupy
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime-gpu is not installed (no CUDAExecutionProvider)"
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
REPORT: dict[str, object] = {}


def _report(key: str, value: object) -> None:
    REPORT[key] = value
    print(f"[gpu-report] {key}: {json.dumps(value, default=str)}")
    path = os.environ.get("QB_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(REPORT, indent=2, default=str))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("gpu-path")
    os.environ["QUANTBENCH_CACHE"] = str(work / "cache")
    synthetic.save(synthetic.small_cnn(), work / "cnn.onnx")
    rng = np.random.default_rng(3)
    # a few outsized samples make the grids widen mid-stream
    images = synthetic.images(96, seed=1)
    images[[5, 50]] *= rng.uniform(20, 200, size=(2, 1, 1, 1)).astype(np.float32)
    np.savez(work / "calib.npz", input=images)
    np.savez(work / "eval.npz", input=synthetic.images(48, seed=2))
    return work


def test_device_bins_equal_host_bins_of_the_same_activations(workdir):
    import cupy as cp

    from quantbench.backends.onnxruntime import expose
    from quantbench.backends.ortdevice import DeviceOutputRunner
    from quantbench.data.sources import open_data
    from quantbench.model.graph import calibration_tensors, open_graph
    from quantbench.stats.devicestats import StatsBank
    from quantbench.stats.tensorstats import TensorStats

    graph = open_graph(workdir / "cnn.onnx")
    inputs = {s.name for s in graph.inputs}
    names = [t for t in calibration_tensors(graph, "all") if t not in inputs]
    runner = DeviceOutputRunner(expose(graph.model, names, graph.elem_types), cp, "cuda")
    bank = StatsBank(cp, names, {names[0]: ["relu_of_first"]})
    host = {n: TensorStats(n) for n in [*names, "relu_of_first"]}
    for feed in open_data(workdir / "calib.npz", graph.inputs, batch_size=16).batches():
        outputs = runner.infer(feed, names)
        for n, value in outputs.items():
            assert isinstance(value, cp.ndarray)  # stayed on the GPU
            added = host[n].update(value.get())
            if n == names[0]:
                host["relu_of_first"].update_relu(added, value.get())
        bank.add(outputs)
        bank.fence().synchronize()
    got = bank.results()
    for n, h in host.items():
        assert (got[n].count, got[n].min, got[n].max, got[n].exponent) == (
            h.count,
            h.min,
            h.max,
            h.exponent,
        ), n
        np.testing.assert_array_equal(got[n].counts, h.counts, err_msg=n)
    _report("same_values_identical_tensors", len(names))


def test_cuda_calibration_against_cpu_calibration(workdir):
    """Same data, CUDA vs CPU inference: statistics and tables, and how far apart they are."""
    from quantbench.calibrate import calibrate

    methods = ["entropy", "minmax", "percentile:99.99", "mse"]
    common = dict(methods=methods, use_cache=False, tensors="all", batch_size=16)
    gpu = calibrate(
        str(workdir / "cnn.onnx"),
        str(workdir / "calib.npz"),
        provider="cuda",
        show_progress=False,
        **common,
    )
    cpu = calibrate(
        str(workdir / "cnn.onnx"),
        str(workdir / "calib.npz"),
        provider="cpu",
        show_progress=False,
        **common,
    )
    stats_rows = []
    for t in cpu.stats:
        g = gpu.stats[t.name]
        differing = int(np.abs(g.counts - t.counts).sum()) // 2 if g.exponent == t.exponent else -1
        stats_rows.append(
            {
                "tensor": t.name,
                "max_abs_rel_diff": abs(g.max_abs - t.max_abs) / max(t.max_abs, 1e-30),
                "same_exponent": g.exponent == t.exponent,
                "values_in_other_bins": differing,
                "count": t.count,
            }
        )
        assert g.count == t.count and g.nan_count == t.nan_count == 0
    table_diff = {}
    for method in methods:
        ta, tb = gpu.tables[method], cpu.tables[method]
        a, b = {k: ta.amax(k) for k in ta}, {k: tb.amax(k) for k in tb}
        assert set(a) == set(b)
        rel = [abs(a[k] - b[k]) / max(abs(b[k]), 1e-30) for k in b]
        table_diff[method] = {
            "tensors": len(rel),
            "max_rel_diff": max(rel),
            "identical": sum(r == 0 for r in rel),
        }
    worst = max(r["max_abs_rel_diff"] for r in stats_rows)
    moved = sum(max(r["values_in_other_bins"], 0) for r in stats_rows)
    total = sum(r["count"] for r in stats_rows)
    _report(
        "cuda_vs_cpu_stats",
        {
            "tensors": len(stats_rows),
            "worst_max_abs_rel_diff": worst,
            "values_in_other_bins": moved,
            "values": total,
        },
    )
    _report("cuda_vs_cpu_tables", table_diff)
    assert worst < 1e-4
    # minmax follows max|x| alone; the histogram methods pick a bin, and a count that moved
    # by one bin may move their choice: reported above, not bounded
    assert table_diff["minmax"]["max_rel_diff"] < 1e-4


def test_cuda_sessions_compute_in_fp32_not_tf32():
    """onnxruntime's CUDA provider rounds MatMul and Conv inputs to TF32 (10-bit mantissa) by
    default; quantbench's sessions must not. 1 + 2^-11 is exact in FP32 (23-bit mantissa) and
    becomes 1 in TF32, and every partial sum j * (1 + 2^-11) is exact in FP32 whatever the
    order: 256 products sum to exactly 256.125 in FP32, to 256 in TF32 (hand-derived)."""
    from onnx import TensorProto, helper, numpy_helper

    from quantbench.backends.onnxruntime import OnnxRuntimeRunner

    k = 256
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "ones_kn"], ["mm"]),
            helper.make_node("Conv", ["img", "ones_conv"], ["conv"]),
        ],
        "tf32_probe",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, k]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [8, k, 16, 16]),
        ],
        [
            helper.make_tensor_value_info("mm", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("conv", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.ones((k, 64), np.float32), "ones_kn"),
            numpy_helper.from_array(np.ones((64, k, 1, 1), np.float32), "ones_conv"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    runner = OnnxRuntimeRunner(model, "cuda")
    assert runner.session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == "0"
    out = runner.infer(
        {
            "x": np.full((64, k), 1 + 2.0**-11, np.float32),
            "img": np.full((8, k, 16, 16), 1 + 2.0**-11, np.float32),
        }
    )
    for name, value in out.items():
        _report(f"tf32_probe_{name}", float(np.abs(value - 256.125).max()))
        np.testing.assert_array_equal(value, np.float32(256.125), err_msg=name)


def test_gpu_memory_does_not_grow_with_samples(workdir, monkeypatch):
    import cupy as cp

    from quantbench.collect import devicecollect
    from quantbench.collect.statspass import collect_stats
    from quantbench.data.sources import open_data
    from quantbench.model.graph import calibration_tensors, open_graph

    graph = open_graph(workdir / "cnn.onnx")
    tensors = calibration_tensors(graph, "all")
    many = np.concatenate([synthetic.images(96, seed=s) for s in range(8)])  # 768 samples
    np.savez(workdir / "many.npz", input=many)
    peaks = {}
    original = devicecollect._DeviceBinner.bin

    def sampled(self, values):
        original(self, values)
        free, total = cp.cuda.runtime.memGetInfo()
        peaks[current[0]] = max(peaks.get(current[0], 0), total - free)

    monkeypatch.setattr(devicecollect._DeviceBinner, "bin", sampled)
    current = [""]
    for n in (96, 768):
        current[0] = str(n)
        source = open_data(workdir / "many.npz", graph.inputs, batch_size=32, max_samples=n)
        collect_stats(graph, source, tensors, provider="cuda", show_progress=False)
    growth = peaks["768"] - peaks["96"]
    _report("gpu_used_bytes_96_vs_768_samples", peaks)
    assert growth < 64 << 20, peaks


def _cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "quantbench", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_commands_with_provider_cuda(workdir):
    w = workdir
    model, calib, ev = w / "cnn.onnx", w / "calib.npz", w / "eval.npz"
    runs = {
        "calibrate": (
            "calibrate",
            model,
            "--data",
            calib,
            "-m",
            "all",
            "--no-cache",
            "--provider",
            "cuda",
            "-o",
            w / "tables",
        ),
        "quantize": ("quantize", model, "--data", calib, "--provider", "cuda", "-o", w / "q.onnx"),
        "compare": (
            "compare",
            "fp32",
            "int8",
            "--model",
            model,
            "--data",
            ev,
            "--calib-data",
            calib,
            "--provider",
            "cuda",
            "--json",
            w / "cmp.json",
        ),
        "sensitivity": (
            "sensitivity",
            model,
            "--data",
            ev,
            "--calib-data",
            calib,
            "--provider",
            "cuda",
            "--json",
            w / "sens.json",
        ),
        "recover": (
            "recover",
            model,
            "--data",
            ev,
            "--calib-data",
            calib,
            "--provider",
            "cuda",
            "-o",
            w / "recovered",
        ),
    }
    codes = {}
    for name, args in runs.items():
        done = _cli(*args, cwd=w)
        codes[name] = done.returncode
        assert done.returncode in (0, 1), f"{name}: {done.returncode}\n{done.stderr[-2000:]}"
    doc = json.loads((w / "cmp.json").read_text())
    assert doc["b"]["provider"] == "CUDAExecutionProvider", doc["b"]
    assert (w / "q.onnx").is_file()
    _report("cli_exit_codes", codes)
