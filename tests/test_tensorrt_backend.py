"""TensorRT backend: version gates, the IInt8Calibrator adapter, the builder's API calls, and the
runner's plumbing -- against tests/trt_double.py (a test double, not TensorRT), plus end-to-end
tests marked ``tensorrt`` that run wherever real TensorRT and a GPU exist.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from synthetic import images, save, small_cnn
from trt_double import FakeAllocator, drive_calibration, make_fake_tensorrt

from quantbench.backends import tensorrt as qtrt
from quantbench.backends.trt.calibrator import CalibrationFeed
from quantbench.errors import QuantbenchError

NO_TRT_REASON = (
    "TensorRT is not installed (pip install 'quantbench[tensorrt]' where NVIDIA's index is "
    "reachable)"
)
HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


# -- version detection and feature gates --------------------------------------------------------


def test_version_parse_and_cache_header_number():
    v = qtrt.TrtVersion.parse("10.3.0.26")
    assert (v.major, v.minor, v.patch, v.build) == (10, 3, 0, 26)
    assert str(qtrt.TrtVersion.parse("8.6.1.post1")) == "8.6.1"
    assert qtrt.TrtVersion.parse("8.6.1").header_number == 8601
    assert qtrt.TrtVersion.parse("10.3.0").header_number == 100300
    assert qtrt.TrtVersion.parse("11.1").header_number == 110100
    with pytest.raises(QuantbenchError, match="cannot read a TensorRT version"):
        qtrt.TrtVersion.parse("unknown")


# version: (implicit_int8, calibrators, strongly_typed_flag, always_strongly_typed,
#           explicit_batch_flag, fp16_flag, ipluginv3, parser node_name)
FEATURE_TABLE = {
    "8.6.1": (True, True, False, False, True, True, False, False),
    "10.0.1": (True, True, True, False, False, True, True, True),
    "10.16.0": (True, True, True, False, False, True, True, True),
    "11.1.0": (False, False, False, True, False, False, True, True),
}


@pytest.mark.parametrize("version", sorted(FEATURE_TABLE))
def test_feature_gates(version):
    f = qtrt.TrtFeatures.from_version(version)
    got = (
        f.implicit_int8,
        f.calibrator_classes,
        f.strongly_typed_flag,
        f.always_strongly_typed,
        f.explicit_batch_flag,
        f.fp16_flag,
        f.ipluginv3,
        f.parser_error_node_name,
    )
    assert got == FEATURE_TABLE[version]
    assert f.explicit_qdq and f.supported
    assert f.can_be_strongly_typed == (version != "8.6.1")


def test_feature_gates_edges():
    assert qtrt.TrtFeatures.from_version("9.0.1").strongly_typed_flag  # kSTRONGLY_TYPED in 9.0
    assert not qtrt.TrtFeatures.from_version("8.5.3").supported
    assert qtrt.TrtFeatures.from_version("10.16.0").calibration_profile
    assert not qtrt.TrtFeatures.from_version("11.0.0").calibration_profile


def test_explain_missing_says_what_to_do():
    f = qtrt.TrtFeatures.from_version("11.1.0")
    assert f.explain_missing("implicit_int8") == (
        "TensorRT 11.1 removed implicit INT8 (IInt8Calibrator, BuilderFlag.INT8): "
        "use the explicit Q/DQ model (quantbench quantize) instead"
    )
    assert "removed BuilderFlag.FP16" in f.explain_missing("fp16_flag")
    assert "arrived in 9.0" in qtrt.TrtFeatures.from_version("8.6").explain_missing(
        "strongly_typed"
    )
    assert "added in 10.0" in qtrt.TrtFeatures.from_version("8.6").explain_missing("ipluginv3")
    with pytest.raises(ValueError):
        f.explain_missing("warp_drive")


def test_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail
    with pytest.raises(QuantbenchError) as info:
        qtrt.import_tensorrt()
    assert str(info.value) == (
        "TensorRT is not installed: pip install 'quantbench[tensorrt]' (needs an NVIDIA GPU)"
    )


def test_too_old_tensorrt_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", make_fake_tensorrt("8.5.3"))
    with pytest.raises(QuantbenchError, match="older than quantbench supports"):
        qtrt.import_tensorrt()


def test_backend_import_is_lazy():
    code = (
        "import sys, quantbench.backends.tensorrt;"
        "bad = [m for m in ('tensorrt', 'pycuda', 'cuda') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- build plans per version ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "precision", "kwargs", "network_flags", "builder_flags", "typed"),
    [
        ("8.6.1", "fp32", {}, ("EXPLICIT_BATCH",), (), False),
        ("8.6.1", "int8-qdq", {}, ("EXPLICIT_BATCH",), ("INT8",), False),
        (
            "8.6.1",
            "int8-implicit",
            {"allow_fp16": True},
            ("EXPLICIT_BATCH",),
            ("INT8", "FP16"),
            False,
        ),
        ("10.0.1", "fp16", {}, (), ("FP16",), False),
        ("10.16.0", "int8-qdq", {}, ("STRONGLY_TYPED",), (), True),
        ("10.16.0", "int8-qdq", {"allow_fp16": True}, (), ("INT8", "FP16"), False),
        ("10.16.0", "int8-qdq", {"strongly_typed": False}, (), ("INT8",), False),
        ("10.16.0", "fp32", {"strongly_typed": True}, ("STRONGLY_TYPED",), (), True),
        ("10.16.0", "int8-implicit", {}, (), ("INT8",), False),
        ("11.1.0", "fp32", {}, (), (), True),
        ("11.1.0", "int8-qdq", {}, (), (), True),
    ],
)
def test_plan_build(version, precision, kwargs, network_flags, builder_flags, typed):
    plan = qtrt.plan_build(qtrt.TrtFeatures.from_version(version), precision, **kwargs)
    assert plan.network_flags == network_flags
    assert plan.builder_flags == builder_flags
    assert plan.strongly_typed is typed
    assert plan.calibrate is (precision == "int8-implicit")


@pytest.mark.parametrize(
    ("version", "precision", "kwargs", "message"),
    [
        ("11.1.0", "int8-implicit", {}, "TensorRT 11.1 removed implicit INT8"),
        ("11.1.0", "fp16", {}, "removed BuilderFlag.FP16"),
        ("11.1.0", "int8-qdq", {"allow_fp16": True}, "removed BuilderFlag.FP16"),
        ("11.1.0", "int8-qdq", {"strongly_typed": False}, "always strongly typed"),
        ("8.6.1", "int8-qdq", {"strongly_typed": True}, "arrived in 9.0"),
        ("10.16.0", "fp16", {"strongly_typed": True}, "strongly typed network takes its precision"),
        ("10.16.0", "int8-implicit", {"strongly_typed": True}, "strongly typed network"),
        ("10.16.0", "fp32", {"allow_fp16": True}, "allow_fp16 applies to INT8"),
        ("10.16.0", "int4", {}, "unknown precision"),
    ],
)
def test_plan_build_refuses_impossible_builds(version, precision, kwargs, message):
    with pytest.raises(QuantbenchError, match=message):
        qtrt.plan_build(qtrt.TrtFeatures.from_version(version), precision, **kwargs)


# -- the calibrator adapter ---------------------------------------------------------------------


def _calibrator(version="10.16.0", base="entropy2", batches=None, **kwargs):
    allocator = kwargs.pop("allocator", FakeAllocator())
    trt = make_fake_tensorrt(version)
    cal = qtrt.make_calibrator(trt, base, batches, allocator=allocator, **kwargs)
    return trt, cal, allocator


@pytest.mark.parametrize(
    ("base", "class_name", "algo"),
    [
        ("entropy2", "IInt8EntropyCalibrator2", 2),
        ("entropy", "IInt8EntropyCalibrator", 1),
        ("minmax", "IInt8MinMaxCalibrator", 3),
        ("legacy", "IInt8LegacyCalibrator", 0),
    ],
)
def test_factory_derives_from_the_chosen_base(base, class_name, algo):
    trt, cal, _ = _calibrator(base=base)
    assert isinstance(cal, getattr(trt, class_name))
    assert cal._double_base_initialised  # base __init__ was called explicitly
    assert int(cal.get_algorithm()) == algo
    assert cal.get_batch_size() == 1
    assert hasattr(cal, "get_quantile") is (base == "legacy")


def test_legacy_calibrator_defaults():
    _, cal, _ = _calibrator(base="legacy")
    assert cal.get_quantile() == 0.5
    assert cal.get_regression_cutoff() == 0.5
    assert cal.read_histogram_cache(16) is None
    assert cal.write_histogram_cache(b"x", 1) is None
    _, tuned, _ = _calibrator(base="legacy", quantile=0.9999, regression_cutoff=1.0)
    assert (tuned.get_quantile(), tuned.get_regression_cutoff()) == (0.9999, 1.0)


def test_unknown_base_and_tensorrt_11_are_refused():
    with pytest.raises(QuantbenchError, match="unknown calibrator"):
        qtrt.make_calibrator(make_fake_tensorrt("10.16.0"), "percentile")
    with pytest.raises(QuantbenchError, match="TensorRT 11.1 has no IInt8Calibrator classes"):
        qtrt.make_calibrator(make_fake_tensorrt("11.1.0"), "entropy2", [])


def test_pointers_follow_names_order_and_count():
    rng = np.random.default_rng(0)
    batches = [
        {"b": rng.standard_normal((1, 4)), "a": rng.standard_normal((2, 3))} for _ in range(3)
    ]
    _, cal, allocator = _calibrator(batches=batches)
    shapes = {"a": ((2, 3), np.float32), "b": ((1, 4), np.float32)}
    seen = drive_calibration(cal, ["a", "b"], allocator, shapes)
    assert len(seen["pointers"]) == 3 and all(len(p) == 2 for p in seen["pointers"])
    for batch, data in zip(batches, seen["data"], strict=True):
        np.testing.assert_array_equal(data["a"], batch["a"].astype(np.float32))
        np.testing.assert_array_equal(data["b"], batch["b"].astype(np.float32))
    assert cal.batches_served == 3 and cal.error is None


def test_buffers_stay_alive_are_reused_and_resized():
    shapes = [(1, 8), (1, 8), (4, 8), (1, 8)]
    batches = [{"x": np.full(s, i, np.float32)} for i, s in enumerate(shapes)]
    _, cal, allocator = _calibrator(batches=batches)
    first = cal.get_batch(["x"])
    assert allocator.live == 1
    second = cal.get_batch(["x"])
    assert second == first and allocator.mallocs == 1  # same buffer, refilled
    np.testing.assert_array_equal(allocator.read(first[0], np.float32, (1, 8)), np.ones((1, 8)))
    third = cal.get_batch(["x"])  # 4x larger: the buffer grows, the old one is freed
    assert third != first and allocator.mallocs == 2 and allocator.frees == 1
    np.testing.assert_array_equal(allocator.read(third[0], np.float32, (4, 8)), np.full((4, 8), 2))
    fourth = cal.get_batch(["x"])  # smaller again: no new allocation
    assert fourth == third and allocator.mallocs == 2
    assert cal.get_batch(["x"]) is None  # exhausted: buffers released
    assert allocator.live == 0 and cal.get_batch(["x"]) is None
    assert cal.error is None and cal.batches_served == 4


def test_dtypes_floats_become_float32_integers_are_kept():
    batch = {
        "f64": np.linspace(0, 1, 6).reshape(2, 3),
        "f16": np.array([[1.5, -2.25]], np.float16),
        "i64": np.array([[7, -9]], np.int64),
        "i32": np.array([3], np.int32),
        "flag": np.array([True, False]),
    }
    _, cal, allocator = _calibrator(batches=[batch])
    names = list(batch)
    ptrs = cal.get_batch(names)
    got = dict(zip(names, ptrs, strict=True))
    np.testing.assert_array_equal(
        allocator.read(got["f64"], np.float32, (2, 3)), batch["f64"].astype(np.float32)
    )
    np.testing.assert_array_equal(allocator.read(got["f16"], np.float32, (1, 2)), [[1.5, -2.25]])
    np.testing.assert_array_equal(allocator.read(got["i64"], np.int64, (1, 2)), [[7, -9]])
    np.testing.assert_array_equal(allocator.read(got["i32"], np.int32, (1,)), [3])
    np.testing.assert_array_equal(allocator.read(got["flag"], np.bool_, (2,)), [True, False])
    sizes = sorted(len(allocator.memory[p]) for p in ptrs)
    assert sizes == [2, 4, 8, 16, 24]  # bool, i32, f16->f32, i64, f64->f32 (6 values)


def test_unsupported_dtype_is_recorded_not_raised():
    _, cal, _ = _calibrator(batches=[{"s": np.array(["a", "b"])}])
    assert cal.get_batch(["s"]) is None
    assert "dtype <U1 cannot be fed to TensorRT" in cal.error


def test_loader_exception_is_recorded_and_ends_calibration():
    def loader():
        yield {"x": np.zeros((1, 2), np.float32)}
        yield {"x": np.ones((1, 2), np.float32)}
        raise ValueError("image 17 is corrupt")

    _, cal, allocator = _calibrator(batches=loader())
    seen = drive_calibration(cal, ["x"])
    assert seen["swallowed"] == []  # nothing escaped into TensorRT's trampoline
    assert len(seen["pointers"]) == 2
    assert cal.error == "batch 3: ValueError: image 17 is corrupt"
    assert allocator.live == 0
    with pytest.raises(QuantbenchError, match=r"after 2 good batch\(es\)\): batch 3: ValueError"):
        qtrt.raise_for_calibration(cal)


def test_missing_input_and_wrong_shape_are_named():
    _, cal, _ = _calibrator(batches=[{"x": np.zeros((1, 2))}])
    assert cal.get_batch(["x", "mask"]) is None
    assert "no data for input(s) ['mask']" in cal.error
    _, cal, _ = _calibrator(batches=[{"x": np.zeros((2, 2))}])
    cal.set_input_metadata({"x": (np.float32, (1, 2))})
    assert cal.get_batch(["x"]) is None
    assert "input 'x': shape (2, 2), TensorRT calibrates at (1, 2)" in cal.error
    _, cal, _ = _calibrator(batches=[{"ids": np.zeros((1, 2), np.int64)}])
    cal.set_input_metadata({"ids": (np.int32, (1, 2))})
    assert cal.get_batch(["ids"]) is None
    assert "dtype int64, the network expects int32" in cal.error


def test_sequence_batches_use_input_order():
    batches = [(np.full((1, 1), 1.0), np.full((1, 1), 2.0))]
    _, cal, allocator = _calibrator(batches=batches, input_order=["a", "b"])
    ptrs = cal.get_batch(["b", "a"])
    assert allocator.read(ptrs[0], np.float32, (1, 1))[0, 0] == 2.0
    _, cal, _ = _calibrator(batches=batches)
    assert cal.get_batch(["a", "b"]) is None and "needs input_order" in cal.error


def test_empty_data_and_no_data_are_errors():
    _, cal, _ = _calibrator(batches=[])
    assert cal.get_batch(["x"]) is None and cal.error == "the calibration data produced no batches"
    cache = b"TRT-8601-EntropyCalibration2\nx: 3c010a14\n"
    _, cal, _ = _calibrator(batches=None, cache_bytes=cache)
    assert cal.get_batch(["x"]) is None
    assert (
        "did not accept the calibration cache (header 'TRT-8601-EntropyCalibration2')" in cal.error
    )


def test_cache_bytes_are_returned_verbatim_and_skip_calibration():
    cache = b"TRT-100300-EntropyCalibration2\ninput: 3c010a14\nconv1: 3d8c0c8f\n"
    _, cal, _ = _calibrator(batches=[{"input": np.zeros(1)}], cache_bytes=cache)
    seen = drive_calibration(cal, ["input"])
    assert seen["cache"] == cache and seen["pointers"] == []
    assert cal.read_calibration_cache() == cache


def test_write_calibration_cache_keeps_a_copy_and_writes_atomically(tmp_path):
    out = tmp_path / "model.cache"
    _, cal, _ = _calibrator(batches=[{"x": np.zeros(1)}], cache_path=out)
    owned_by_trt = bytearray(b"TRT-100300-EntropyCalibration2\nx: 3c010a14\n")
    cal.write_calibration_cache(memoryview(owned_by_trt))
    owned_by_trt[:3] = b"XXX"  # TensorRT reuses its memory after the call
    assert cal.feed.written_cache.startswith(b"TRT-100300")
    assert out.read_bytes().startswith(b"TRT-100300")
    assert [p.name for p in tmp_path.iterdir()] == ["model.cache"]  # no temp file left behind


def test_cache_path_folder_is_checked_up_front(tmp_path):
    with pytest.raises(QuantbenchError, match="does not exist"):
        _calibrator(batches=[], cache_path=tmp_path / "missing" / "c.cache")


def test_base_for_cache_header():
    assert qtrt.base_for_cache(b"TRT-100300-MinMaxCalibration\n") == "minmax"
    assert qtrt.base_for_cache(b"TRT-8601-EntropyCalibration2\nx: 0\n") == "entropy2"
    with pytest.raises(QuantbenchError, match="not a TensorRT calibration cache"):
        qtrt.base_for_cache(b'{"x": 1.0}')
    with pytest.raises(QuantbenchError, match="unknown"):
        qtrt.base_for_cache(b"TRT-8601-Magic\n")


def test_feed_accepts_an_allocator_factory():
    made = []

    def factory():
        made.append(FakeAllocator())
        return made[-1]

    feed = CalibrationFeed([{"x": np.zeros(2)}], allocator=factory)
    assert made == []  # lazily, on the first upload
    assert feed.get_batch(["x"]) and len(made) == 1


# -- the builder against the double -------------------------------------------------------------


def _qdq_model() -> onnx.ModelProto:
    scale = numpy_helper.from_array(np.array(0.02, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
        helper.make_node("Relu", ["xd"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[scale, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _unsupported_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="ok"),
        helper.make_node("UnsupportedOp", ["r"], ["y"], name="bad", domain="custom"),
    ]
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def cnn_static(tmp_path):
    return save(small_cnn(batch=1), tmp_path / "cnn1.onnx")


@pytest.fixture
def cnn_dynamic(tmp_path):
    return save(small_cnn(), tmp_path / "cnn.onnx")


def test_fp32_build_on_8_6_uses_explicit_batch_and_detailed_profile(cnn_static):
    trt = make_fake_tensorrt("8.6.1")
    engine = qtrt.build_engine(cnn_static, precision="fp32", workspace_mb=256, trt_module=trt)
    assert engine.startswith(b"{")  # the double's JSON record, not a TensorRT engine
    assert ("create_network", 1 << trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) in trt.calls
    state = trt.built[-1]["state"]
    assert state["flags"] == []
    assert state["pools"] == {trt.MemoryPoolType.WORKSPACE: 256 << 20}
    assert state["profiling_verbosity"] == trt.ProfilingVerbosity.DETAILED
    assert ("init_libnvinfer_plugins", "") in trt.calls


def test_qdq_build_on_10_is_strongly_typed_and_on_11_plain(tmp_path):
    model = save(_qdq_model(), tmp_path / "qdq.onnx")
    for version, bits, flags in (("10.16.0", 1 << 1, []), ("11.1.0", 0, []), ("8.6.1", 1, [1])):
        trt = make_fake_tensorrt(version)
        qtrt.build_engine(model, precision="int8-qdq", trt_module=trt)
        assert trt.built[-1]["network_flags"] == bits, version
        assert trt.built[-1]["state"]["flags"] == flags, version


def test_implicit_int8_calibrates_at_the_opt_shape(cnn_dynamic):
    allocator = FakeAllocator()
    trt = make_fake_tensorrt("10.16.0", allocator)
    data = [{"input": images(4, seed=s)} for s in range(3)]
    cal = qtrt.make_calibrator(trt, "entropy2", data, allocator=allocator)
    qtrt.build_engine(
        cnn_dynamic,
        precision="int8-implicit",
        calibrator=cal,
        trt_module=trt,
        shapes={"input": ((1, 3, 16, 16), (4, 3, 16, 16), (8, 3, 16, 16))},
    )
    built = trt.built[-1]
    assert built["state"]["flags"] == [trt.BuilderFlag.INT8]
    assert built["state"]["int8_calibrator"] is cal
    assert built["state"]["calibration_profile"].shapes["input"][1] == (4, 3, 16, 16)
    seen = built["calibration"]
    assert len(seen["data"]) == 3
    np.testing.assert_array_equal(seen["data"][1]["input"], data[1]["input"])
    assert cal.feed.written_cache.startswith(b"TRT-double")
    assert allocator.live == 0  # calibration buffers freed after the build


def test_calibration_failure_fails_the_build(cnn_static):
    def loader():
        yield {"input": images(1)}
        raise OSError("calibration folder vanished")

    allocator = FakeAllocator()
    trt = make_fake_tensorrt("10.16.0", allocator)
    cal = qtrt.make_calibrator(trt, "minmax", loader(), allocator=allocator)
    with pytest.raises(
        QuantbenchError, match="INT8 calibration failed .*OSError: calibration folder"
    ):
        qtrt.build_engine(cnn_static, precision="int8-implicit", calibrator=cal, trt_module=trt)


def test_wrong_calibration_shape_fails_the_build(cnn_static):
    allocator = FakeAllocator()
    trt = make_fake_tensorrt("8.6.1", allocator)
    cal = qtrt.make_calibrator(trt, "entropy2", [{"input": images(2)}], allocator=allocator)
    with pytest.raises(QuantbenchError, match=r"shape \(2, 3, 16, 16\), TensorRT calibrates at"):
        qtrt.build_engine(cnn_static, precision="int8-implicit", calibrator=cal, trt_module=trt)


def test_table_only_build_picks_the_base_from_the_header(cnn_static):
    trt = make_fake_tensorrt("10.3.0", FakeAllocator())
    cache = b"TRT-100300-MinMaxCalibration\ninput: 3c010a14\n"
    qtrt.build_engine(cnn_static, precision="int8-implicit", table_bytes=cache, trt_module=trt)
    built = trt.built[-1]
    assert isinstance(built["state"]["int8_calibrator"], trt.IInt8MinMaxCalibrator)
    assert built["calibration"]["cache"] == cache and built["calibration"]["pointers"] == []


def test_implicit_int8_on_11_fails_before_touching_tensorrt(cnn_static):
    trt = make_fake_tensorrt("11.1.0")
    with pytest.raises(QuantbenchError, match="TensorRT 11.1 removed implicit INT8"):
        qtrt.build_engine(
            cnn_static, precision="int8-implicit", table_bytes=b"TRT-1-X\n", trt_module=trt
        )
    assert trt.calls == []


def test_quantization_mode_must_match_the_model(tmp_path, cnn_static):
    trt = make_fake_tensorrt("10.16.0", FakeAllocator())
    with pytest.raises(QuantbenchError, match="no QuantizeLinear/DequantizeLinear nodes"):
        qtrt.build_engine(cnn_static, precision="int8-qdq", trt_module=trt)
    qdq = save(_qdq_model(), tmp_path / "qdq.onnx")
    with pytest.raises(QuantbenchError, match="has Q/DQ nodes"):
        qtrt.build_engine(
            qdq, precision="int8-implicit", table_bytes=b"TRT-1-MinMaxCalibration\n", trt_module=trt
        )
    with pytest.raises(QuantbenchError, match="needs a calibration table or calibration data"):
        qtrt.build_engine(cnn_static, precision="int8-implicit", trt_module=trt)
    with pytest.raises(QuantbenchError, match="applies to int8-implicit builds"):
        qtrt.build_engine(qdq, precision="int8-qdq", table_bytes=b"TRT-", trt_module=trt)


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("10.16.0", "node 'bad' (UnsupportedOp): No importer registered for op: UnsupportedOp"),
        ("8.6.1", "node 'bad': No importer registered for op: UnsupportedOp"),
    ],
)
def test_parse_errors_one_line_each(tmp_path, version, line):
    model = save(_unsupported_model(), tmp_path / "bad.onnx")
    with pytest.raises(qtrt.ParseFailed) as info:
        qtrt.build_engine(model, trt_module=make_fake_tensorrt(version))
    assert info.value.errors == [line]
    assert (
        str(info.value).splitlines()[0].endswith("TensorRT could not parse the model (1 error(s)):")
    )


def test_plugin_libraries(tmp_path, cnn_static):
    good, broken = tmp_path / "libdw.so", tmp_path / "broken.so"
    good.write_bytes(b"\x7fELF")
    broken.write_bytes(b"\x7fELF")
    trt = make_fake_tensorrt("10.16.0")
    qtrt.build_engine(cnn_static, plugin_libraries=[good], trt_module=trt)
    assert trt.loaded_libraries == [str(good)]
    with pytest.raises(QuantbenchError, match="could not load the plugin library"):
        qtrt.build_engine(cnn_static, plugin_libraries=[broken], trt_module=trt)
    with pytest.raises(QuantbenchError, match="plugin library not found"):
        qtrt.build_engine(cnn_static, plugin_libraries=[tmp_path / "nope.so"], trt_module=trt)


def test_timing_cache_is_loaded_and_saved(tmp_path, cnn_static):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"old")
    qtrt.build_engine(cnn_static, timing_cache=cache, trt_module=make_fake_tensorrt("10.16.0"))
    assert cache.read_bytes() == b"old+timed"
    fresh = tmp_path / "fresh.cache"
    qtrt.build_engine(cnn_static, timing_cache=fresh, trt_module=make_fake_tensorrt("8.6.1"))
    assert fresh.read_bytes() == b"+timed"


def test_dynamic_shapes_need_valid_ranges(cnn_dynamic):
    trt = make_fake_tensorrt("10.16.0")
    with pytest.raises(QuantbenchError, match=r"dynamic input\(s\) input \[-1, 3, 16, 16\]"):
        qtrt.build_engine(cnn_dynamic, trt_module=trt)
    with pytest.raises(QuantbenchError, match="need min <= opt <= max"):
        qtrt.build_engine(
            cnn_dynamic,
            trt_module=trt,
            shapes={"input": ((4, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))},
        )
    with pytest.raises(QuantbenchError, match="changes static dims"):
        qtrt.build_engine(
            cnn_dynamic,
            trt_module=trt,
            shapes={"input": ((1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))},
        )
    with pytest.raises(QuantbenchError, match="unknown input"):
        qtrt.build_engine(cnn_dynamic, trt_module=trt, shapes={"images": ((1,), (1,), (1,))})
    qtrt.build_engine(
        cnn_dynamic,
        trt_module=trt,
        shapes={"input": ((1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))},
    )
    profile = trt.built[-1]["state"]["profiles"][0]
    assert profile.shapes["input"] == ((1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))


def test_build_failure_quotes_tensorrt(cnn_static, monkeypatch):
    trt = make_fake_tensorrt("10.16.0")
    monkeypatch.setattr(trt.Builder, "fail_with", "no implementation for conv1", raising=False)
    with pytest.raises(QuantbenchError, match="could not build the engine: no implementation"):
        qtrt.build_engine(cnn_static, trt_module=trt)


def test_build_api_writes_the_engine_atomically(tmp_path, cnn_static):
    out = tmp_path / "cnn.engine"
    trt = make_fake_tensorrt("10.16.0", FakeAllocator())
    table = tmp_path / "cnn.cache"
    table.write_bytes(b"TRT-101600-EntropyCalibration2\ninput: 3c010a14\n")
    result = qtrt.build(cnn_static, out, int8=True, table=table, fp16=True, trt_module=trt)
    assert out.read_bytes()[:1] == b"{" and result.engine_bytes == out.stat().st_size
    assert (result.precision, result.strongly_typed, result.trt_version) == (
        "int8-implicit",
        False,
        "10.16.0",
    )
    assert trt.built[-1]["state"]["flags"] == [trt.BuilderFlag.INT8, trt.BuilderFlag.FP16]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.cache", "cnn.engine", "cnn1.onnx"]


def test_build_api_table_formats(tmp_path, cnn_static):
    trt = make_fake_tensorrt("10.16.0", FakeAllocator())
    json_table = tmp_path / "t.json"
    json_table.write_text('{"input": 1.0}')
    with pytest.raises(QuantbenchError, match="not a TensorRT calibration cache"):
        qtrt.build(cnn_static, tmp_path / "e.engine", int8=True, table=json_table, trt_module=trt)
    encoded = []

    def encoder(path, version):
        encoded.append((path, version))
        return b"TRT-101600-MinMaxCalibration\ninput: 3c010a14\n"

    qtrt.build(
        cnn_static,
        tmp_path / "e.engine",
        int8=True,
        table=json_table,
        table_encoder=encoder,
        trt_module=trt,
    )
    assert encoded == [(json_table, "10.16.0")]
    with pytest.raises(QuantbenchError, match="applies to implicit INT8"):
        qtrt.build(cnn_static, tmp_path / "e.engine", qdq=True, table=json_table, trt_module=trt)
    with pytest.raises(QuantbenchError, match="does not exist"):
        qtrt.build(cnn_static, tmp_path / "no" / "e.engine", trt_module=trt)


def test_build_api_with_calibration_data(tmp_path, cnn_static):
    allocator = FakeAllocator()
    trt = make_fake_tensorrt("8.6.1", allocator)
    cache_out = tmp_path / "written.cache"
    result = qtrt.build(
        cnn_static,
        tmp_path / "e.engine",
        int8=True,
        trt_module=trt,
        allocator=allocator,
        calibration_data=[{"input": images(1, seed=i)} for i in range(5)],
        calibration_cache_out=cache_out,
    )
    assert result.calibration_batches == 5
    assert cache_out.read_bytes().startswith(b"TRT-double")


def test_select_precision():
    assert qtrt.select_precision(int8=False, qdq=False, fp16=False) == ("fp32", False)
    assert qtrt.select_precision(int8=False, qdq=False, fp16=True) == ("fp16", False)
    assert qtrt.select_precision(int8=True, qdq=False, fp16=True) == ("int8-implicit", True)
    assert qtrt.select_precision(int8=False, qdq=True, fp16=False) == ("int8-qdq", False)


# -- the runner against the double ---------------------------------------------------------------


def test_runner_plumbing(cnn_dynamic):
    allocator = FakeAllocator()
    trt = make_fake_tensorrt("10.16.0", allocator)
    engine = qtrt.build_engine(
        cnn_dynamic,
        trt_module=trt,
        shapes={"input": ((1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))},
    )
    runner = qtrt.TensorRTRunner(engine, trt_module=trt, allocator=allocator)
    assert runner.input_metadata() == {"input": (np.dtype(np.float32), (-1, 3, 16, 16))}
    x = images(3).astype(np.float64)
    out = runner.infer({"input": x})
    np.testing.assert_array_equal(out["y"], (x.astype(np.float32) + 1))  # the double's y = x + 1
    out2 = runner.infer({"input": images(2)})
    assert out2["y"].shape == (2, 3, 16, 16)
    with pytest.raises(QuantbenchError, match=r"missing \['input'\], unknown \['x'\]"):
        runner.infer({"x": x})
    with pytest.raises(QuantbenchError, match="outside the engine's profile"):
        runner.infer({"input": images(9)})
    with pytest.raises(QuantbenchError, match="engine expects"):
        runner.infer({"input": images(1, shape=(3, 8, 8))})
    assert len(runner.time_inference({"input": images(1)}, iterations=3, warmup=1)) == 3
    runner.close()
    assert allocator.live == 0 and allocator.streams == set()
    with pytest.raises(QuantbenchError, match="closed"):
        runner.infer({"input": x})


def test_runner_reports_an_unloadable_engine():
    trt = make_fake_tensorrt("10.16.0", FakeAllocator())
    with pytest.raises(
        QuantbenchError, match="could not load the engine: double: not a serialized"
    ):
        qtrt.TensorRTRunner(b"\x00garbage", trt_module=trt, allocator=FakeAllocator())


# -- real CUDA memory (device machine) -----------------------------------------------------------


def _cuda_python_device() -> bool:
    try:
        alloc = qtrt.CudartAllocator()
        alloc.free(alloc.malloc(16))
        return True
    except Exception:  # noqa: BLE001 - no binding, no driver or no GPU: skip
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_python_device(), reason="needs cuda-python and an NVIDIA GPU")
def test_cudart_allocator_round_trip_and_calibrator_buffers():
    allocator = qtrt.CudartAllocator()
    buffer = qtrt.DeviceBuffer(allocator)
    host = np.arange(1000, dtype=np.float32)
    buffer.upload(host)
    back = buffer.download(np.empty_like(host))
    np.testing.assert_array_equal(back, host)
    stream = allocator.create_stream()
    allocator.synchronize(stream)
    allocator.destroy_stream(stream)
    feed = CalibrationFeed([{"x": host.reshape(10, 100).astype(np.float64)}], allocator=allocator)
    (ptr,) = feed.get_batch(["x"])
    check = np.empty((10, 100), np.float32)
    allocator.memcpy_dtoh(check, ptr)
    np.testing.assert_array_equal(check, host.reshape(10, 100))
    assert feed.get_batch(["x"]) is None and feed.error is None
    buffer.free()


# -- real TensorRT (skipped here) -----------------------------------------------------------------


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAVE_TRT, reason=NO_TRT_REASON)
def test_real_tensorrt_fp32_and_int8_engines_run(tmp_path):
    import onnxruntime as ort

    model = save(small_cnn(batch=1), tmp_path / "cnn.onnx")
    x = images(1, seed=42)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"input": x})

    fp32 = qtrt.build(model, tmp_path / "fp32.engine")
    with qtrt.TensorRTRunner(qtrt.load_engine(fp32.engine_path)) as runner:
        assert runner.input_metadata() == {"input": (np.dtype(np.float32), (1, 3, 16, 16))}
        np.testing.assert_allclose(runner.infer({"input": x})["logits"], reference, atol=1e-3)

    trt = qtrt.import_tensorrt()
    features = qtrt.features_of(trt)
    if features.implicit_int8:
        cache = tmp_path / "int8.cache"
        int8 = qtrt.build(
            model,
            tmp_path / "int8.engine",
            int8=True,
            calibration_data=[{"input": images(1, seed=s)} for s in range(16)],
            calibration_cache_out=cache,
        )
        assert int8.calibration_batches == 16
        assert cache.read_bytes().startswith(f"TRT-{features.version.header_number}-".encode())
        engine = qtrt.load_engine(int8.engine_path)
        with qtrt.TensorRTRunner(engine) as runner:
            out = runner.infer({"input": x})["logits"]
        assert out.shape == reference.shape and np.all(np.isfinite(out))
        assert np.abs(out - reference).max() < 0.5 * np.abs(reference).max() + 1e-3
        layers = qtrt.engine_layers(qtrt.engine_graph_json(engine))
        assert layers and all(layer.name for layer in layers)
    qdq = save(_qdq_model(), tmp_path / "qdq.onnx")
    engine = qtrt.build_engine(qdq, precision="int8-qdq")
    with qtrt.TensorRTRunner(engine) as runner:
        x4 = np.array([[-1.0, 0.013, 0.5, 3.0]], np.float32)
        expected = np.maximum(np.clip(np.round(x4 / 0.02), -128, 127) * 0.02, 0)
        np.testing.assert_allclose(runner.infer({"x": x4})["y"], expected, atol=1e-6)
