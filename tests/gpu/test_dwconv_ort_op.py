"""DWConv2D inside onnxruntime on the GPU: the ``cuda`` device (the plugin's kernels through CuPy)
against the ``cpu`` device (the numpy reference) in one session each, for FP32, FP16 and INT8
(int8 and float32 out), shared and per-sample kernels, depthwise, grouped and dense; and
``compare --dwconv2d-op plugin:cuda`` end to end.

Needs onnxruntime-extensions (the plugin extra; on the device machine, installed from a wheel
carried there), CuPy with a GPU, and the kernel library: ``$QUANTBENCH_DWCONV_LIB``, else
``plugins/dwconv2d/build/libdwconv2d_kernels.so`` (``make -C plugins/dwconv2d``), else nvcc to
build it; skips otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _reason() -> str | None:
    try:
        import onnxruntime_extensions  # noqa: F401
    except ImportError:
        return "onnxruntime-extensions is not installed (pip install 'quantbench[plugin]')"
    try:
        import torch  # noqa: F401  (its cuDNN first, as the other GPU tests: see the README)

        torch.backends.cudnn.version()
    except ImportError:
        pass
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # noqa: BLE001
        return f"CuPy with a GPU is needed: {type(exc).__name__}: {exc}"
    try:
        from quantbench.plugins.dwconv2d import cuda, kernel_lib
    except ImportError as exc:  # the device machine lacks a dependency: carry its wheel
        return f"quantbench.plugins.dwconv2d does not import: {exc}"

    if not (
        os.environ.get(cuda.LIBRARY_ENV) or cuda.IN_TREE_LIBRARY.is_file() or kernel_lib.find_nvcc()
    ):
        return f"no kernel library (${cuda.LIBRARY_ENV}, make -C plugins/dwconv2d) and no nvcc"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

# name: (X shape, W shape, bias shape, attributes)
CASES = {
    "dw_k3_p1_bias": ([2, 32, 16, 16], [32, 1, 3, 3], [32], {"pads": [1] * 4, "group": 32}),
    "dw_pb_k5_s2_asym": (
        [3, 24, 19, 17], [3, 24, 1, 5, 5], [3, 24],
        {"strides": [2, 2], "pads": [2, 1, 1, 2], "group": 24},
    ),
    "dw_k3_d2_w20": (
        [2, 16, 21, 20], [16, 1, 3, 3], None, {"pads": [2] * 4, "dilations": [2, 2], "group": 16}
    ),
    "g4_k3": ([2, 32, 12, 12], [48, 8, 3, 3], [48], {"pads": [1] * 4, "group": 4}),
    "g2_pb_k3": ([2, 16, 10, 10], [2, 16, 8, 3, 3], [2, 16], {"pads": [1] * 4, "group": 2}),
    "dense_k3_s2_pbias": (
        [2, 8, 14, 14], [16, 8, 3, 3], [2, 16], {"strides": [2, 2], "pads": [1] * 4}
    ),
}  # fmt: skip
MODES = ("f32", "f16", "int8_f32", "int8_i8")


def _model(name: str, mode: str):
    from onnx import TensorProto, helper

    from quantbench.plugins.dwconv2d import make_dwconv2d_node

    x_shape, w_shape, b_shape, attrs = CASES[name]
    elem = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16}.get(mode, TensorProto.INT8)
    b_elem = TensorProto.FLOAT16 if mode == "f16" else TensorProto.FLOAT
    out_elem = {"int8_i8": TensorProto.INT8, "int8_f32": TensorProto.FLOAT}.get(mode, elem)
    scales = {}
    if mode.startswith("int8"):
        scales = {"input_scale": 0.02, "weight_scale": 0.01}
        if mode == "int8_i8":
            # about a quarter of the outputs saturate, the rest spread over the int8 range
            scales["output_scale"] = 0.01 * (w_shape[-3] * w_shape[-1] * w_shape[-2]) ** 0.5
    node = make_dwconv2d_node("X", "W", "Y", "B" if b_shape else None, name=name, **attrs,
                              **scales)  # fmt: skip
    inputs = [helper.make_tensor_value_info("X", elem, x_shape),
              helper.make_tensor_value_info("W", elem, w_shape)]  # fmt: skip
    if b_shape:
        inputs.append(helper.make_tensor_value_info("B", b_elem, b_shape))
    graph = helper.make_graph([node], name, inputs, [helper.make_tensor_value_info("Y", out_elem,
                                                                                   None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feed(name: str, mode: str, seed: int) -> dict[str, np.ndarray]:
    x_shape, w_shape, b_shape, _ = CASES[name]
    rng = np.random.default_rng(seed)
    if mode.startswith("int8"):
        feed = {
            "X": rng.integers(-128, 128, x_shape).astype(np.int8),
            "W": rng.integers(-128, 128, w_shape).astype(np.int8),
        }
        bias_type = np.float32
    else:
        dtype = np.float16 if mode == "f16" else np.float32
        feed = {
            "X": rng.standard_normal(x_shape).astype(dtype),
            "W": rng.standard_normal(w_shape).astype(dtype),
        }
        bias_type = dtype
    if b_shape:
        feed["B"] = (rng.standard_normal(b_shape) * 4).astype(bias_type)
    return feed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_op_matches_the_cpu_op(name: str, mode: str) -> None:
    from quantbench.plugins.dwconv2d import make_session

    model = _model(name, mode)
    cpu, gpu = make_session(model, "cpu"), make_session(model, "cuda")
    for seed in (0, 1):
        feed = _feed(name, mode, seed)
        want = cpu.run(None, feed)[0]
        got = gpu.run(None, feed)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        if mode.startswith("int8"):  # the kernels reproduce the float32 epilogue bit for bit
            np.testing.assert_array_equal(got, want)
            continue
        ref, out = want.astype(np.float64), got.astype(np.float64)
        scale = float(np.abs(ref).max())
        if mode == "f32":  # float32 sums against one rounding of float64 sums
            assert float(np.abs(out - ref).max()) <= 1e-5 * scale
        else:  # each within one binary16 rounding of the exact value (plus float32 sums)
            bound = 2.0**-10 * np.abs(ref) + 2e-5 * scale + 2.0**-24
            assert int((np.abs(out - ref) > bound).sum()) == 0


def test_int8_output_saturates_somewhere() -> None:
    """The INT8-out cases are not all small values: some outputs hit -128 or 127."""
    from quantbench.plugins.dwconv2d import make_session

    name = "dense_k3_s2_pbias"
    got = make_session(_model(name, "int8_i8"), "cuda").run(None, _feed(name, "int8_i8", 0))[0]
    assert np.isin(got, (-128, 127)).any() and not np.isin(got, (-128, 127)).all()


def test_compare_runs_the_kernels_in_the_model(tmp_path: Path) -> None:
    import onnx

    from quantbench.plugins.dwconv2d import conv_to_dwconv2d

    try:
        from quantbench.compare import compare
    except ModuleNotFoundError as exc:
        pytest.skip(f"compare needs {exc.name} here (carry its wheel)")
    sys.path.insert(0, str(REPO / "tests"))
    from test_dwconv2d_op import dynamic_depthwise

    onnx.save(conv_to_dwconv2d(dynamic_depthwise(tail="conv")), str(tmp_path / "dw.onnx"))
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((6, 4, 8, 8)).astype(np.float32))
    try:
        doc = compare(
            "fp32", "int8", model=tmp_path / "dw.onnx", data=tmp_path / "eval.npz",
            calib_data=tmp_path / "eval.npz", method="minmax", latency=False,
            show_progress=False, dwconv2d_op="plugin:cuda",
        )  # fmt: skip
    except ModuleNotFoundError as exc:  # compare's own dependencies, not the op's
        pytest.skip(f"compare needs {exc.name} here (carry its wheel)")
    rows = {r["op_type"] for r in doc["layers"] if r["tensor"] == "d"}
    assert rows == {"DWConv2D (plugin op, cuda)"}, json.dumps(doc["layers"])[:400]
    assert doc["b"]["custom_ops"] == {"DWConv2D": "plugin op, cuda"}
