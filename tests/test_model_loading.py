"""Loading a model reads its file once: parsed, checked and hashed from the same bytes, and
those bytes (plus appended outputs) are what onnxruntime loads for the statistics pass."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
import synthetic
from onnx import numpy_helper

from quantbench.backends.onnxruntime import OnnxRuntimeRunner, expose, expose_for_session
from quantbench.errors import QuantbenchError
from quantbench.model.graph import calibration_tensors, open_graph


def _exposable(g) -> list[str]:
    inputs = {s.name for s in g.inputs}
    return [t for t in calibration_tensors(g, "all") if t not in inputs]


def test_the_hash_is_the_files_sha256_and_the_bytes_are_the_files(cnn_path):
    raw = cnn_path.read_bytes()
    g = open_graph(cnn_path)
    assert g.hash == hashlib.sha256(raw).hexdigest()
    assert g.source == raw


def test_exposed_bytes_parse_to_the_exposed_model_and_run(cnn_path, cnn_data):
    """The file's bytes with the new outputs appended parse to exactly the model ``expose``
    builds, and onnxruntime returns the same values for them."""
    g = open_graph(cnn_path)
    names = _exposable(g)
    payload = expose_for_session(g.model, names, g.elem_types, source=g.source)
    assert isinstance(payload, bytes) and payload.startswith(g.source)
    built = expose(g.model, names, g.elem_types)
    assert onnx.load_from_string(payload) == built
    feed = {"input": np.load(cnn_data)["input"][:3]}
    got = OnnxRuntimeRunner(payload).infer(feed)
    want = OnnxRuntimeRunner(built).infer(feed)
    assert set(names) <= set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_model_quantbench_rewrote_is_not_served_from_the_files_bytes(tmp_path):
    """A ``dim_value: -1`` batch axis is rewritten on load: the file's bytes no longer parse
    to the model, so the session gets the rewritten model serialised."""
    model = synthetic.small_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    path = synthetic.save(model, tmp_path / "minus_one.onnx")
    g = open_graph(path)
    assert g.source is None
    payload = expose_for_session(g.model, _exposable(g), g.elem_types, source=g.source)
    assert isinstance(payload, onnx.ModelProto)
    assert not payload.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")


def test_plugin_ops_are_lowered_not_served_from_the_bytes(tmp_path):
    from test_dwconv2d_op import dynamic_depthwise

    from quantbench.plugins.dwconv2d import conv_to_dwconv2d

    path = tmp_path / "dw.onnx"
    onnx.save(conv_to_dwconv2d(dynamic_depthwise()), str(path))
    g = open_graph(path)
    payload = expose_for_session(g.model, _exposable(g), g.elem_types, source=g.source)
    assert isinstance(payload, onnx.ModelProto)  # OnnxRuntimeRunner lowers it


def test_external_data_is_loaded_from_beside_the_model(tmp_path):
    model = synthetic.small_cnn()
    weight = model.graph.initializer[0]
    expected = numpy_helper.to_array(weight).copy()
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, size_threshold=0, location="w.bin")
    assert (tmp_path / "w.bin").stat().st_size > 0
    g = open_graph(path)
    assert g.source is None  # its bytes lack the data
    np.testing.assert_array_equal(g.initializer(weight.name), expected)


def test_changed_external_weights_change_the_model_hash(tmp_path):
    """The statistics cache is keyed by the model's hash: weights that change in the external
    data file alone (the .onnx bytes stay the same) must change it, or a stale cache is used."""
    path = tmp_path / "ext.onnx"
    onnx.save(synthetic.small_cnn(), str(path), save_as_external_data=True, size_threshold=0,
              location="w.bin")  # fmt: skip
    first, onnx_bytes = open_graph(path).hash, path.read_bytes()
    data = bytearray((tmp_path / "w.bin").read_bytes())
    data[-1] ^= 0x01  # one weight changes
    (tmp_path / "w.bin").write_bytes(bytes(data))
    assert path.read_bytes() == onnx_bytes
    assert open_graph(path).hash != first


def test_a_folder_given_as_the_model_says_so(tmp_path):
    with pytest.raises(QuantbenchError, match="a folder, not a model file"):
        open_graph(tmp_path)


def test_a_text_format_model_loads_as_onnx_load_reads_it(tmp_path):
    model = synthetic.small_cnn()
    path = tmp_path / "cnn.onnxtxt"
    onnx.save(model, str(path))
    assert not path.read_bytes().startswith(model.SerializeToString()[:8])
    assert open_graph(path).model == onnx.load(str(path))


def test_a_truncated_model_fails_in_one_line_naming_it(cnn_path):
    cnn_path.write_bytes(cnn_path.read_bytes()[:1000])
    with pytest.raises(QuantbenchError, match=r"cnn\.onnx: .*(truncated|invalid)") as info:
        open_graph(cnn_path)
    assert "\n" not in str(info.value)


def test_an_unreadable_model_file_fails_in_one_line(cnn_path, monkeypatch):
    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(cnn_path), "read_bytes", refuse)
    with pytest.raises(QuantbenchError, match=r"cnn\.onnx: cannot read the model file"):
        open_graph(cnn_path)


def test_a_workers_graph_keeps_the_bytes_it_was_sent(cnn_path):
    """A sharded run sends the file's bytes (not a re-serialised model) and the worker's graph
    serves its statistics session from them."""
    from quantbench.collect.workerinput import WorkerInput

    g = open_graph(cnn_path)
    sent = WorkerInput.of(
        g, cnn_path, batch_size=None, max_samples=None, preset=None, provider=None, threads=None
    )
    assert sent.model == cnn_path.read_bytes()
    worker = sent.graph()
    assert worker.source == sent.model and worker.hash == g.hash
    assert onnx.load_from_string(worker.source) == worker.model


def test_the_statistics_pass_takes_the_bytes_it_hands_to_onnxruntime(cnn_path, cnn_data):
    """Kept through the pass, the bytes would add the model's size to the peak memory."""
    from quantbench.collect.statspass import collect_stats
    from quantbench.data.sources import open_data

    g = open_graph(cnn_path)
    assert g.source is not None
    stats = collect_stats(
        g, open_data(cnn_data, g.inputs, batch_size=8), calibration_tensors(g, "all"),
        show_progress=False,
    )  # fmt: skip
    assert stats.num_samples == 40 and g.source is None


def _invalid_for_the_checker(cnn_path):
    """The CNN with a node of an op no ONNX opset has, feeding nothing: it parses and its graph
    derives, but onnx.checker (and onnxruntime) refuse it."""
    model = onnx.load(str(cnn_path))
    first = model.graph.node[0].output[0]
    model.graph.node.append(onnx.helper.make_node("NoSuchOp", [first], ["dangling"]))
    onnx.save(model, str(cnn_path))
    return cnn_path


def test_a_deferred_check_still_reports_an_invalid_model_first(cnn_path):
    """``open_graph(defer_check=True)`` leaves the check to ``Graph.checked()``, which runs it
    at the block's end, or first when anything in the block fails on the model."""
    path = _invalid_for_the_checker(cnn_path)
    with pytest.raises(QuantbenchError, match=r"cnn\.onnx: invalid ONNX model"):
        open_graph(path)
    g = open_graph(path, defer_check=True)  # not checked yet
    with pytest.raises(QuantbenchError, match=r"cnn\.onnx: invalid ONNX model"), g.checked():
        raise RuntimeError("something that failed on the invalid model")
    g = open_graph(path, defer_check=True)
    with pytest.raises(QuantbenchError, match=r"cnn\.onnx: invalid ONNX model"), g.checked():
        pass  # nothing failed: the check still runs at the end


def test_calibrate_names_an_invalid_model_not_what_failed_on_it(cnn_path, cnn_data, run_cli):
    """The check runs beside the session's start; onnxruntime refuses the model too, but the
    user is told the model is invalid (one line, exit 2), and no table is written."""
    path = _invalid_for_the_checker(cnn_path)
    out = path.parent / "t.cache"
    code, _, err = run_cli("calibrate", path, "--data", cnn_data, "-m", "minmax", "-o", out)
    assert code == 2
    assert "invalid ONNX model" in err and "NoSuchOp" in err
    assert "cannot load" not in err and not out.exists()  # not onnxruntime's refusal


def test_a_shape_formula_dim_is_cut_in_signatures():
    """nudenet's YOLOv8 (torch.onnx) declares its anchor dim as a 312-character formula of
    height and width, which inspect and every shape error printed whole."""
    import numpy as np

    from quantbench.model.graph import TensorSpec

    formula = (
        "(floor(floor(floor(height/2 - 1/2)/2)/2) + 1)*(floor(floor(floor(width/2 - 1/2)/2)/2) + 1)"
    )
    spec = TensorSpec("output0", np.dtype(np.float32), ("batch", 22, formula, None))
    assert spec.describe() == "output0 float32[batch,22,(floor(floor(floor(heig…,?]"
    assert TensorSpec("x", np.dtype(np.float32), ("sequence_length",)).describe() == (
        "x float32[sequence_length]"
    )
