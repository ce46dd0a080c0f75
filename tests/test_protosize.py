"""Models over protobuf's 2 GiB limit (a 2.35 GB model made calibrate fail with EncodeError).

A model that size cannot be built in a test, so protobuf's refusal is simulated: `serialized`
says None (as it does past 2 GiB) for every model holding a large initializer, and the checker
raises EncodeError for a proto, as protobuf does. The expected values come from the same work
on the same model with nothing simulated.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf.message import EncodeError
from onnx import numpy_helper

from quantbench.calibrate import calibrate
from quantbench.compare import compare
from quantbench.errors import QuantbenchError
from quantbench.model import protosize
from quantbench.quantize import quantize

REAL_SERIALIZED = protosize.serialized


def _refuse_large(model: onnx.ModelProto) -> bytes | None:
    """protobuf's answer for a model past 2 GiB, for any model with an initializer >= 1 KiB."""
    if any(t.ByteSize() >= 1024 for t in model.graph.initializer):
        return None
    return REAL_SERIALIZED(model)


@pytest.fixture()
def too_large(monkeypatch):
    monkeypatch.setattr(protosize, "serialized", _refuse_large)
    real_check = onnx.checker.check_model

    def check(model, *args, **kwargs):
        if isinstance(model, onnx.ModelProto) and _refuse_large(model) is None:
            raise EncodeError("Failed to serialize proto")
        return real_check(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", check)


def test_onnxruntime_gets_a_file_with_the_tensors_beside_it(cnn_path, cnn_data, too_large):
    model = onnx.load(str(cnn_path))
    before = model.SerializeToString()
    x = np.load(cnn_data)["input"][:4]
    want = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"input": x})
    with protosize.loadable(model) as source:
        assert isinstance(source, str) and source.endswith("model.onnx")
        light = onnx.load(source, load_external_data=False)
        assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in light.graph.initializer)
        got = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(
            None, {"input": x}
        )
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    assert model.SerializeToString() == before  # read, never changed


def test_save_model_writes_the_weights_beside_the_model(cnn_path, tmp_path, too_large):
    model = onnx.load(str(cnn_path))
    (tmp_path / "out").mkdir()
    out = protosize.save_model(model, tmp_path / "out" / "big.onnx")
    assert (out.parent / "big.onnx.data").is_file()
    assert out.stat().st_size < (out.parent / "big.onnx.data").stat().st_size
    back = onnx.load(str(out))
    for a, b in zip(model.graph.initializer, back.graph.initializer, strict=True):
        assert a.name == b.name
        assert np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    assert sorted(p.name for p in out.parent.iterdir()) == ["big.onnx", "big.onnx.data"]


def test_calibrate_quantize_and_compare_run_as_on_a_small_model(
    cnn_path, cnn_data, tmp_path, monkeypatch, too_large
):
    """The same table and the same output metrics as with nothing simulated."""
    large = calibrate(cnn_path, cnn_data, methods=["minmax"], use_cache=False, show_progress=False)
    quantize(cnn_path, tmp_path / "q.onnx", table=None, data=cnn_data, method="minmax",
             show_progress=False)  # fmt: skip
    assert (tmp_path / "q.onnx.data").is_file()
    doc = compare("fp32", str(tmp_path / "q.onnx"), model=cnn_path, data=cnn_data,
                  latency=False, show_progress=False)  # fmt: skip
    monkeypatch.setattr(protosize, "serialized", REAL_SERIALIZED)
    small = calibrate(cnn_path, cnn_data, methods=["minmax"], use_cache=False, show_progress=False)
    wide, narrow = large.tables["minmax"], small.tables["minmax"]
    assert {n: e.amax for n, e in wide.entries.items()} == {
        n: e.amax for n, e in narrow.entries.items()
    }
    quantize(cnn_path, tmp_path / "q2.onnx", data=cnn_data, method="minmax", show_progress=False)
    doc2 = compare("fp32", str(tmp_path / "q2.onnx"), model=cnn_path, data=cnn_data,
                   latency=False, show_progress=False)  # fmt: skip
    assert doc["outputs"][0]["sqnr_db"] == doc2["outputs"][0]["sqnr_db"]
    assert doc["outputs"][0]["agreement"] == doc2["outputs"][0]["agreement"]


def test_piecewise_digest_is_stable_and_tells_models_apart(cnn_path, too_large):
    model = onnx.load(str(cnn_path))
    first = protosize.digest(model)
    assert first == protosize.digest(onnx.load(str(cnn_path)))
    model.graph.initializer[0].raw_data = bytes(len(model.graph.initializer[0].raw_data))
    assert protosize.digest(model) != first


def test_digest_of_a_model_still_too_large_without_initializers_is_a_clear_error(
    cnn_path, monkeypatch
):
    """Large Constant nodes keep a model over 2 GiB with its initializers apart: digest says so
    in one line (as save and load do), not with protobuf's EncodeError."""
    monkeypatch.setattr(protosize, "serialized", lambda model: None)
    with pytest.raises(QuantbenchError, match="over 2 GiB even with its initializers apart"):
        protosize.digest(onnx.load(str(cnn_path)))


def test_weights_apart_runs_bit_for_bit_as_the_bytes_do(cnn_path, cnn_data):
    """A session given the weights apart (read in place, not copied) computes what the
    serialised model computes, and the model is only read."""
    from quantbench.backends.onnxruntime import OnnxRuntimeRunner

    model = onnx.load(str(cnn_path))
    before = model.SerializeToString()
    x = np.load(cnn_data)["input"][:4]
    want = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"input": x})
    apart = protosize.weights_apart(model)
    assert apart is not None and len(apart.light) < len(before) // 2
    big = {t.name for t in model.graph.initializer if t.ByteSize() >= 1024}
    assert set(apart.weights) == big
    runner = OnnxRuntimeRunner(apart, "cpu")
    got = runner.infer({"input": x})
    assert all(np.array_equal(a, got[n]) for a, n in zip(want, runner.output_names, strict=True))
    assert model.SerializeToString() == before


def test_shared_weights_give_an_equal_tensor_the_same_array_and_a_changed_one_its_own(cnn_path):
    model = onnx.load(str(cnn_path))
    shared = protosize.SharedWeights(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    big = next(t for t in copy.graph.initializer if t.ByteSize() >= 1024)
    first = protosize.weights_apart(model, shared)
    second = protosize.weights_apart(copy, shared)
    assert first is not None and second is not None
    assert all(first.weights[n] is second.weights[n] for n in first.weights)  # one array each
    changed = numpy_helper.to_array(big) + np.float32(1)
    big.CopyFrom(numpy_helper.from_array(changed, big.name))  # same name, other values
    third = protosize.weights_apart(copy, shared)
    assert third is not None and third.weights[big.name] is not first.weights[big.name]
    assert np.array_equal(third.weights[big.name], changed)


def test_weights_apart_keeps_an_unread_initializer_in_the_model(cnn_path, cnn_data):
    """onnxruntime prunes an initializer no node reads before it takes the external ones, then
    refuses that name ("Failed to find existing initializer"): a refinement pass left such a
    weight behind on minilm-l3. It stays in the light model; the session runs."""
    from quantbench.backends.onnxruntime import OnnxRuntimeRunner

    model = onnx.load(str(cnn_path))
    unread = np.arange(1024, dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(unread, "left_behind"))
    apart = protosize.weights_apart(model)
    assert apart is not None and "left_behind" not in apart.weights
    x = np.load(cnn_data)["input"][:2]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = OnnxRuntimeRunner(apart, "cpu").infer({"input": x})
    assert all(np.array_equal(a, got[o.name]) for a, o in
               zip(want.run(None, {"input": x}), want.get_outputs(), strict=True))  # fmt: skip


def test_a_session_refusing_the_weights_apart_gets_the_whole_model(cnn_path, cnn_data, monkeypatch):
    """An onnxruntime that refuses the external weights (another release, an edge case) gets
    the model with its weights back in it, and computes the same."""
    from quantbench.backends import onnxruntime as backend

    model = onnx.load(str(cnn_path))
    apart = protosize.weights_apart(model)
    assert apart is not None
    assert apart.whole().SerializeToString() == model.SerializeToString()

    def refuse(*_args):
        raise RuntimeError("Failed to find existing initializer")

    monkeypatch.setattr(backend, "_session_apart", refuse)
    x = np.load(cnn_data)["input"][:2]
    got = backend.OnnxRuntimeRunner(apart, "cpu").infer({"input": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(np.array_equal(a, got[o.name]) for a, o in
               zip(want.run(None, {"input": x}), want.get_outputs(), strict=True))  # fmt: skip
