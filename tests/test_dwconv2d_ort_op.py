"""DWConv2D run as itself inside onnxruntime (the onnxruntime-extensions PyOp of
quantbench.plugins.dwconv2d.ort_op, device cpu): against a direct loop definition of the
convolution written here, against onnxruntime's own Conv on the lowered model, against a hand-worked
INT8 example; a plain InferenceSession after importing the plugin; compare naming the plugin
layers; the fallback to lowering, said, when onnxruntime-extensions is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_dwconv2d_op import dw_model, dynamic_depthwise, per_sample_reference

from quantbench.errors import QuantbenchError
from quantbench.model import customops

pytest.importorskip("onnxruntime_extensions")  # the plugin extra; `make test` installs it

import quantbench.plugins.dwconv2d as dw  # noqa: E402
from quantbench.backends.onnxruntime import OnnxRuntimeRunner  # noqa: E402

F32 = np.float32


def plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """What a user writes: the library registered on plain session options, the run form."""
    from onnxruntime_extensions import get_library_path

    so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(
        dw.onnxruntime_form(model).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )


def lowered_run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = ort.InferenceSession(
        dw.dwconv2d_to_conv(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)[0]


ATTRS = {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2], "group": 2}
PLAIN = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 4}


@pytest.mark.parametrize(
    ("w_shape", "b_shape"),
    [
        ([6, 2, 3, 3], None),  # shared kernel, no bias
        ([6, 2, 3, 3], [6]),  # shared kernel and bias
        ([6, 2, 3, 3], [3, 6]),  # shared kernel, per-sample bias
        ([3, 6, 2, 3, 3], [3, 6]),  # per-sample kernel and bias
        ([3, 6, 2, 3, 3], [6]),  # per-sample kernel, shared bias
    ],
)
def test_fp32_op_matches_the_loop_definition_and_onnxruntime_conv(w_shape, b_shape):
    model = dw_model([3, 4, 9, 9], w_shape, b_shape, None, **ATTRS)
    rng = np.random.default_rng(0)
    feed = {"X": rng.standard_normal((3, 4, 9, 9)).astype(F32)}
    feed["W"] = rng.standard_normal(w_shape).astype(F32)  # per sample: a kernel each, distinct
    if b_shape:
        feed["B"] = rng.standard_normal(b_shape).astype(F32)
    got = plain_session(model).run(None, feed)[0]
    want = per_sample_reference(feed["X"], feed["W"], feed.get("B"), **ATTRS)
    assert got.dtype == F32 and got.shape == want.shape == (3, 6, 5, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, lowered_run(model, feed), rtol=1e-5, atol=1e-5)


def test_depthwise_with_a_dynamic_batch_runs_per_sample_kernels():
    """Lowering refuses per-sample kernels without a static batch; the op takes them."""
    model = dw_model(["N", 4, 8, 8], ["N", 4, 1, 3, 3], ["N", 4], group=4, pads=[1, 1, 1, 1])
    with pytest.raises(QuantbenchError, match="static kernel shape"):
        dw.dwconv2d_to_conv(model)
    rng = np.random.default_rng(1)
    session = dw.make_session(model)
    for n in (1, 3):
        feed = {
            "X": rng.standard_normal((n, 4, 8, 8)).astype(F32),
            "W": rng.standard_normal((n, 4, 1, 3, 3)).astype(F32),
            "B": rng.standard_normal((n, 4)).astype(F32),
        }
        want = per_sample_reference(feed["X"], feed["W"], feed["B"], **PLAIN)
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-5)


def test_fp16_op_rounds_once_to_float16():
    model = dw_model([2, 4, 6, 6], [4, 1, 3, 3], [4], None, group=4, pads=[1, 1, 1, 1])
    for v in model.graph.input:
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    rng = np.random.default_rng(2)
    feed = {
        "X": rng.standard_normal((2, 4, 6, 6)).astype(np.float16),
        "W": rng.standard_normal((4, 1, 3, 3)).astype(np.float16),
        "B": rng.standard_normal(4).astype(np.float16),
    }
    got = plain_session(model).run(None, feed)[0]
    want = per_sample_reference(feed["X"], feed["W"], feed["B"], **PLAIN)
    assert got.dtype == np.float16
    # one rounding of the exact sum: within half a float16 unit in the last place
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2.0**-11, atol=2.0**-24)


# INT8, worked by hand. X [1, 1, 2, 3], W [2, 1, 2, 2], stride 1, no pads: output [1, 2, 1, 2].
X8 = np.array([[[[10, -20, 30], [40, 50, -60]]]], np.int8)
W8 = np.array([[[[1, 2], [3, 4]]], [[[-128, 127], [0, 1]]]], np.int8)
B8 = np.array([0.25, -0.5], F32)
# sums: k=0: 10*1 - 20*2 + 40*3 + 50*4 = 290 and -20*1 + 30*2 + 50*3 - 60*4 = -50
#       k=1: 10*-128 - 20*127 + 40*0 + 50*1 = -3770 and -20*-128 + 30*127 + 50*0 - 60*1 = 6310
# input_scale 0.5 * weight_scale 0.25 = 0.125: v = sum * 0.125 + bias (all exact in float32)
V8 = np.array([[[[36.5, -6.0]], [[-471.75, 788.25]]]], F32)
# output_scale 1: 36.5 is a tie -> 36 (half to even; half up or away from zero gives 37),
# -471.75 -> -472 saturates to -128, 788.25 -> 788 saturates to 127
Q8 = np.array([[[[36, -6]], [[-128, 127]]]], np.int8)


@pytest.mark.parametrize(("output_scale", "expected"), [(-1.0, V8), (1.0, Q8)])
def test_int8_op_against_a_hand_worked_example(output_scale, expected):
    node = dw.make_dwconv2d_node(
        "X", "W", "Y", "B", input_scale=0.5, weight_scale=0.25, output_scale=output_scale
    )
    out_type = TensorProto.INT8 if output_scale > 0 else TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "int8",
        [
            helper.make_tensor_value_info("X", TensorProto.INT8, [1, 1, 2, 3]),
            helper.make_tensor_value_info("W", TensorProto.INT8, [2, 1, 2, 2]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("Y", out_type, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    got = dw.make_session(model).run(None, {"X": X8, "W": W8, "B": B8})[0]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_scales_reach_the_op_exactly():
    """A float attribute crosses onnxruntime-extensions as 6 decimal digits (0.0039215686 ->
    0.00392157); the run form carries the scales as exact strings."""
    scale = float(np.float32(1 / 255))
    model = dw_model([1, 1, 2, 2], [1, 1, 1, 1], None, None, input_scale=scale, weight_scale=1.0)
    for v in model.graph.input:
        v.type.tensor_type.elem_type = TensorProto.INT8
    x = np.array([[[[127, -128], [1, 77]]]], np.int8)
    got = dw.make_session(model).run(None, {"X": x, "W": np.ones((1, 1, 1, 1), np.int8)})[0]
    np.testing.assert_array_equal(got, x.astype(F32) * np.float32(scale))


def test_plain_session_needs_only_the_import_and_the_library():
    """import quantbench.plugins.dwconv2d declares the op; a user's own session options with
    onnxruntime-extensions' library run the run form; the user's model is left as it was."""
    model = dw_model([1, 4, 6, 6], [4, 1, 3, 3], None, [1, 4, 4, 4], group=4)
    before = model.SerializeToString()
    form = dw.onnxruntime_form(model)
    assert model.SerializeToString() == before
    node = next(n for n in form.graph.node if n.name == "dw")
    assert (node.domain, node.op_type) == ("quantbench", "DWConv2DOrt")
    x = np.random.default_rng(3).standard_normal((1, 4, 6, 6)).astype(F32)
    w = np.random.default_rng(4).standard_normal((4, 1, 3, 3)).astype(F32)
    got = plain_session(model).run(None, {"X": x, "W": w})[0]
    want = per_sample_reference(x, w, None, **{**PLAIN, "pads": [0] * 4})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rewritten_model_runs_through_the_op_like_the_original(run_cli, tmp_path):
    onnx.save(dynamic_depthwise(tail="residual"), str(tmp_path / "dyn.onnx"))
    code, _, err = run_cli(
        "rewrite", tmp_path / "dyn.onnx", "--to", "dwconv2d", "-o", tmp_path / "dw.onnx"
    )
    assert code == 0, err
    rewritten = onnx.load(str(tmp_path / "dw.onnx"))
    runner = OnnxRuntimeRunner(rewritten)
    assert runner.info.to_dict()["custom_ops"] == {"DWConv2D": "plugin op, cpu"}
    original = ort.InferenceSession(str(tmp_path / "dyn.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal((1, 4, 8, 8)).astype(F32)
        want = original.run(None, {"x": x})[0]
        got = runner.infer({"x": x})
        np.testing.assert_allclose(got["z"], want, rtol=1e-5, atol=1e-5)


def test_an_error_inside_the_op_is_one_line_not_a_crash():
    """A PyOp that raises aborts the process; the op records the error and the runner raises
    it (here: a per-sample kernel for 2 samples fed with 3)."""
    model = dw_model(["N", 4, 6, 6], ["M", 4, 1, 3, 3], None, None, group=4)
    runner = OnnxRuntimeRunner(model)
    x = np.zeros((3, 4, 6, 6), F32)
    with pytest.raises(QuantbenchError, match=r"DWConv2D 'dw' \(cpu\): per-sample W has N=2"):
        runner.infer({"X": x, "W": np.zeros((2, 4, 1, 3, 3), F32)})
    assert runner.infer({"X": x, "W": np.zeros((3, 4, 1, 3, 3), F32)})["Y"].shape == (3, 4, 4, 4)


def test_devices_are_checked_before_any_session():
    model = dw_model([1, 4, 6, 6], [4, 1, 3, 3], None, None, group=4)
    with pytest.raises(QuantbenchError, match="device must be cpu or cuda, not 'tpu'"):
        dw.onnxruntime_form(model, "tpu")
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: the cuda device may well work")
    except ImportError:
        with pytest.raises(QuantbenchError, match="DWConv2D on cuda needs CuPy"):
            dw.make_session(model, device="cuda")


def _compare(run_cli, tmp_path, *extra):
    onnx.save(dynamic_depthwise(tail="conv"), str(tmp_path / "dyn.onnx"))
    assert run_cli("rewrite", tmp_path / "dyn.onnx", "--to", "dwconv2d", "-o",
                   tmp_path / "dw.onnx")[0] == 0  # fmt: skip
    rng = np.random.default_rng(6)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((6, 4, 8, 8)).astype(F32))
    code, out, err = run_cli(
        "compare", "fp32", "int8", "--model", tmp_path / "dw.onnx", "--data",
        tmp_path / "eval.npz", "--calib-data", tmp_path / "eval.npz", "--method", "minmax",
        "--no-latency", "--json", tmp_path / "c.json", *extra,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads((tmp_path / "c.json").read_text())
    rows = {r["op_type"] for r in doc["layers"] if r["tensor"] == "d"}
    return doc, rows, err


def test_compare_names_the_plugin_layers(run_cli, tmp_path):
    doc, rows, err = _compare(run_cli, tmp_path)
    assert rows == {"DWConv2D (plugin op, cpu)"}
    assert doc["b"]["custom_ops"] == {"DWConv2D": "plugin op, cpu"}
    assert "lowered" not in err


def test_compare_lowers_when_asked(run_cli, tmp_path):
    doc, rows, _ = _compare(run_cli, tmp_path, "--dwconv2d-op", "lower")
    assert rows == {"DWConv2D (lowered to standard ONNX)"}
    assert doc["a"]["custom_ops"] == doc["b"]["custom_ops"] == {"DWConv2D": "lowered"}
    code, _, err = run_cli("compare", "fp32", "int8", "--model", "m.onnx", "--data", "d.npz",
                           "--dwconv2d-op", "fast")  # fmt: skip
    assert code == 2 and "--dwconv2d-op must be one of plugin, plugin:cpu" in err


def test_without_onnxruntime_extensions_the_op_is_lowered_saying_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)  # import fails
    monkeypatch.setattr(customops, "_SAID", set())
    model = dw_model([1, 4, 6, 6], [4, 1, 3, 3], None, None, group=4)
    runner = OnnxRuntimeRunner(model)
    OnnxRuntimeRunner(model)  # said once per process, not per session
    err = capsys.readouterr().err
    assert err.count("warning") == 1
    assert (
        "DWConv2D: onnxruntime-extensions is not installed (pip install 'quantbench[plugin]'); "
        "onnxruntime runs it lowered to standard ONNX instead of as the plugin op"
    ) in " ".join(err.split())
    assert runner.info.custom_ops == {"DWConv2D": "lowered"}
    x = np.ones((1, 4, 6, 6), F32)
    w = np.ones((4, 1, 3, 3), F32)
    np.testing.assert_array_equal(runner.infer({"X": x, "W": w})["Y"], np.full((1, 4, 4, 4), 9))
    with pytest.raises(QuantbenchError, match=r"onnxruntime-extensions is not installed"):
        dw.session_options()


def test_the_plugin_imports_without_onnxruntime_extensions():
    code = (
        "import sys; sys.modules['onnxruntime_extensions'] = None\n"
        "import quantbench.plugins.dwconv2d as dw\n"
        "print(dw.ort_op.declare(), dw.ort_op.extension_missing())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [
        "False", "onnxruntime-extensions is not installed (pip install 'quantbench[plugin]')\n"
    ]  # fmt: skip


def test_an_onnxruntime_extensions_that_refuses_the_op_means_lowering(monkeypatch):
    """Importing the plugin must not fail on another onnxruntime-extensions API: the reason
    stands where the missing extra's would, and the op is lowered."""
    monkeypatch.setattr(dw.ort_op, "_DECLARED", False)
    monkeypatch.setattr(dw.ort_op, "_DECLARE_ERROR", None)

    def refuse() -> None:
        raise TypeError("attrs must be a list")

    monkeypatch.setattr(dw.ort_op, "_declare", refuse)
    assert dw.ort_op.declare() is False
    assert dw.ort_op.extension_missing() == (
        "onnxruntime-extensions did not take the op (attrs must be a list)"
    )
    monkeypatch.setattr(customops, "_SAID", set())
    runner = OnnxRuntimeRunner(dw_model([1, 4, 6, 6], [4, 1, 3, 3], None, None, group=4))
    assert runner.info.custom_ops == {"DWConv2D": "lowered"}


def test_compare_takes_per_sample_kernels_with_a_dynamic_batch(run_cli, tmp_path):
    """Per-sample kernels computed from each sample, batch dynamic: the lowering refuses the
    model (it folds a static batch into channels), the op runs it in every session compare
    makes, the model's typing included."""
    rng = np.random.default_rng(7)
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal((36, 4)) * 0.5).astype(F32), "hw"),
        onnx.numpy_helper.from_array(np.array([-1, 4, 1, 3, 3], np.int64), "kshape"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["feat"], name="flatten"),
        helper.make_node("Gemm", ["feat", "hw"], ["kflat"], name="hyper", transB=1),
        helper.make_node("Reshape", ["kflat", "kshape"], ["kernel"], name="to_kernel"),
        dw.make_dwconv2d_node("x", "kernel", "y", name="dyn", group=4, pads=[1, 1, 1, 1]),
    ]
    shape = ["N", 4, 8, 8]
    graph = helper.make_graph(
        nodes, "pb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "pb.onnx"))
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((8, 4, 8, 8)).astype(F32))
    args = ["compare", "fp32", "int8", "--model", tmp_path / "pb.onnx", "--data",
            tmp_path / "eval.npz", "--calib-data", tmp_path / "eval.npz", "-m", "minmax",
            "--batch-size", "4", "--no-latency"]  # fmt: skip
    code, _, err = run_cli(*args, "--dwconv2d-op", "lower")
    assert code == 2 and "needs a static kernel shape" in err
    code, _, err = run_cli(*args, "--json", tmp_path / "c.json")
    assert code == 0, err
    layers = json.loads((tmp_path / "c.json").read_text())["layers"]
    row = next(r for r in layers if r["tensor"] == "y")
    assert row["op_type"] == "DWConv2D (plugin op, cpu)" and row["sqnr_db"] > 30
