"""Model signatures as exporters write them, the one batch-axis rule, what the data fingerprint
covers, non-finite input samples and presets (issues 10 and 16). Models are built in code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from quantbench.calibrate import calibrate
from quantbench.data import sources as data
from quantbench.data.presets import Preset, preset_names
from quantbench.data.sources import Batch, open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import calibration_tensors, open_graph

REPO = Path(__file__).resolve().parents[1]


def _model(inputs, outputs, nodes, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _scale_relu(dims: list, name: str = "x") -> onnx.ModelProto:
    """y = Relu(x * 2) on an input of the given dims (any rank, no op needs a batch axis)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return _model(
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [
            helper.make_node("Mul", [name, "two"], ["h"], name="mul"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        [two],
    )


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _feeds(source) -> list[Batch]:
    return list(source.batches())


# ----------------------------------------------------------------------------- dynamic dims


@pytest.mark.parametrize("dim", [-1, 0, "batch", None])
def test_exporters_dynamic_batch_dims_calibrate_every_sample(tmp_path, dim):
    """Issue 10 item 1: paddle2onnx writes ``dim_value: -1`` (others 0 or a dim_param); the
    batch size resolved to -1 and reading failed with 'file is truncated'."""
    dims = [dim, 3, 4, 4]
    model = _scale_relu(dims)
    if dim is None:  # a dim with neither value nor param
        model.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    path = _save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((10, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    result = calibrate(path, tmp_path / "calib.npz", methods=["minmax"], show_progress=False)
    assert open_graph(path).inputs[0].shape[0] in (None, "batch")
    assert result.stats.num_samples == 10
    assert result.tables["minmax"].amax("x") == pytest.approx(float(np.abs(x).max()), rel=1e-6)
    assert result.tables["minmax"].amax("y") == pytest.approx(2 * float(x.max()), rel=1e-6)


def test_dynamic_dims_of_a_callers_proto_are_left_alone():
    model = _scale_relu([0, 3])
    g = open_graph(model)
    assert g.inputs[0].shape == (None, 3)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 0  # not mutated
    assert not g.model.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")


def test_fixed_batch_of_one_feeds_one_sample_at_a_time(tmp_path):
    path = _save(_scale_relu([1, 3, 4, 4]), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.ones((5, 3, 4, 4), np.float32))
    feeds = _feeds(open_data(tmp_path / "d.npz", open_graph(path).inputs))
    assert [f["x"].shape for f in feeds] == [(1, 3, 4, 4)] * 5
    assert [f.num_samples for f in feeds] == [1] * 5


# ----------------------------------------------------------------------------- batch axis


def test_model_without_batch_axis_uses_every_sample(tmp_path):
    """Issue 16 item 3: input x[3,16,16], data [10,3,16,16]: the channel dim (3) was taken as a
    fixed batch and arr[0] kept of each read: 4 of 10 samples, minmax amax 3.90 (true 319.7)."""
    path = _save(_scale_relu([3, 16, 16]), tmp_path / "chw.onnx")
    x = np.random.default_rng(1).standard_normal((10, 3, 16, 16)).astype(np.float32)
    x[7, 2, 5, 9] = 319.7
    np.savez(tmp_path / "d.npz", x=x)
    g = open_graph(path)
    feeds = _feeds(open_data(tmp_path / "d.npz", g.inputs))
    assert len(feeds) == 10 and all(f["x"].shape == (3, 16, 16) for f in feeds)
    assert all(f.num_samples == 1 for f in feeds)
    np.testing.assert_array_equal(np.stack([f["x"] for f in feeds]), x)
    result = calibrate(path, tmp_path / "d.npz", methods=["minmax"], show_progress=False)
    assert result.stats.num_samples == 10
    assert result.tables["minmax"].amax("x") == pytest.approx(319.7, rel=1e-6)
    assert result.tables["minmax"].amax("y") == pytest.approx(2 * 319.7, rel=1e-6)
    with pytest.raises(QuantbenchError, match="--batch-size 4 cannot be used.*one at a time"):
        open_data(tmp_path / "d.npz", g.inputs, batch_size=4)


def test_same_rule_for_loader_scripts_and_readers(tmp_path):
    g = open_graph(_scale_relu([3, 16, 16]))
    script = tmp_path / "loader.py"
    script.write_text(
        "import numpy as np\n"
        "def load_data():\n"
        "    for i in range(2):\n"
        "        yield {'x': np.full((5, 3, 16, 16), i, np.float32)}\n"
    )
    feeds = _feeds(open_data(script, g.inputs))
    assert len(feeds) == 10 and {f["x"].shape for f in feeds} == {(3, 16, 16)}
    assert [float(f["x"][0, 0, 0]) for f in feeds] == [0.0] * 5 + [1.0] * 5
    cut = _feeds(open_data(script, g.inputs, max_samples=7))
    assert len(cut) == 7
    reader = [{"x": np.zeros((4, 3, 16, 16), np.float32)}]
    assert len(_feeds(open_data(reader, g.inputs))) == 4


def test_same_rule_for_image_folders(tmp_path):
    """A model without a batch axis gets one image per feed; with one, batches."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.full((8, 8, 3), 50 * i, np.uint8)).save(folder / f"{i}.png")
    preset = tmp_path / "p.toml"
    preset.write_text("[input]\nscale = 1.0\n")
    chw = open_graph(_scale_relu([3, 8, 8], name="pixels"))
    feeds = _feeds(open_data(folder, chw.inputs, preset=preset))
    assert [f["pixels"].shape for f in feeds] == [(3, 8, 8)] * 3
    assert [float(f["pixels"].max()) for f in feeds] == [0.0, 50.0, 100.0]
    nchw = open_graph(_scale_relu(["N", 3, 8, 8], name="pixels"))
    feeds = _feeds(open_data(folder, nchw.inputs, preset=preset, batch_size=2))
    assert [f["pixels"].shape for f in feeds] == [(2, 3, 8, 8), (1, 3, 8, 8)]


def test_fixed_batch_larger_than_one_feeds_exact_batches(tmp_path, monkeypatch):
    g = open_graph(_scale_relu([2, 3]))
    np.savez(tmp_path / "ten.npz", x=np.arange(30, dtype=np.float32).reshape(10, 3))
    feeds = _feeds(open_data(tmp_path / "ten.npz", g.inputs))
    assert [f["x"].shape for f in feeds] == [(2, 3)] * 5
    assert sum(f.num_samples for f in feeds) == 10
    np.savez(tmp_path / "nine.npz", x=np.zeros((9, 3), np.float32))
    with pytest.raises(
        QuantbenchError, match=r"nine.npz: 9 samples .* fixed batch size 2 \(1 left"
    ):
        open_data(tmp_path / "nine.npz", g.inputs)
    # a sample cap is whole batches (down, at least one), and says so
    warned: list[str] = []
    monkeypatch.setattr(data, "warn", warned.append)
    assert len(_feeds(open_data(tmp_path / "ten.npz", g.inputs, max_samples=5))) == 2
    assert len(_feeds(open_data(tmp_path / "ten.npz", g.inputs, max_samples=1))) == 1
    assert warned == [
        f"{tmp_path / 'ten.npz'}: the model has a fixed batch size of 2: reading 4 samples for "
        "--max-samples 5",
        f"{tmp_path / 'ten.npz'}: the model has a fixed batch size of 2: reading 2 samples for "
        "--max-samples 1",
    ]


@pytest.mark.parametrize(
    ("dims", "data_shape", "match"),
    [
        (
            [3, 16, 16],
            (10, 16, 16, 3, 1),
            r"rank 3 \(first axis = the model's batch axis\) or rank 4",
        ),
        ([3, 16, 16], (10, 16), "rank 3 .* or rank 4"),
        (["N", 3, 4], (10, 4, 4), r"does not match model input x float32\[N,3,4\]"),
        ([3, 4], (10, 3, 5), r"does not match model input x float32\[3,4\]"),
    ],
)
def test_layout_mismatch_is_one_line(tmp_path, dims, data_shape, match):
    g = open_graph(_scale_relu(dims))
    np.save(tmp_path / "d.npy", np.zeros(data_shape, np.float32))
    with pytest.raises(QuantbenchError, match=match) as info:
        open_data(tmp_path / "d.npy", g.inputs)
    assert "\n" not in str(info.value) and "d.npy[x]" in str(info.value)


# ----------------------------------------------------------------------------- several inputs


def _three_input_model() -> onnx.ModelProto:
    """x float[N,4], ids int64[N,4], mask bool[N,4] -> outputs of rank 3, 2 and 1."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["x", "idsf"], ["s"], name="add"),
        helper.make_node("Where", ["mask", "s", "x"], ["w"], name="where"),
        helper.make_node("Unsqueeze", ["w", "axes"], ["seq"], name="unsq"),
        helper.make_node("ReduceSum", ["w", "axes"], ["vec"], keepdims=0, name="sum"),
    ]
    return _model(
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [-1, 4]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [-1, 4]),
        ],
        [
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, [-1, 4, 1]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [-1, 4]),
            helper.make_tensor_value_info("vec", TensorProto.FLOAT, [-1]),
        ],
        nodes,
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )


def test_integer_and_bool_inputs_are_fed_through_not_calibrated(tmp_path):
    path = _save(_three_input_model(), tmp_path / "multi.onnx")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    ids = rng.integers(0, 50, (6, 4)).astype(np.int32)  # int32 data for an int64 input: cast
    mask = rng.integers(0, 2, (6, 4)).astype(bool)
    np.savez(tmp_path / "d.npz", x=x, ids=ids, mask=mask)
    g = open_graph(path)
    assert [s.describe() for s in g.inputs] == [
        "x float32[?,4]",
        "ids int64[?,4]",
        "mask bool[?,4]",
    ]
    assert [len(s.shape) for s in g.outputs] == [3, 2, 1]
    assert "ids" not in calibration_tensors(g) and "mask" not in calibration_tensors(g)
    feeds = _feeds(open_data(tmp_path / "d.npz", g.inputs, batch_size=4))
    assert feeds[0]["ids"].dtype == np.int64 and feeds[0]["mask"].dtype == np.bool_
    result = calibrate(path, tmp_path / "d.npz", methods=["minmax"], show_progress=False)
    table = result.tables["minmax"]
    assert "ids" not in set(table) and "mask" not in set(table)
    w = np.where(mask, x + ids, x)  # the model by hand
    assert table.amax("w") == pytest.approx(float(np.abs(w).max()), rel=1e-6)
    assert table.amax("vec") == pytest.approx(float(np.abs(w.sum(axis=1)).max()), rel=1e-5)


def test_input_type_errors_name_the_cause(tmp_path):
    g = open_graph(_three_input_model())
    base = {
        "x": np.zeros((2, 4), np.float32),
        "ids": np.zeros((2, 4), np.int64),
        "mask": np.zeros((2, 4), bool),
    }
    cases = [
        ({"ids": np.full((2, 4), 2**40, np.int64)}, None, None),
        (
            {"mask": np.zeros((2, 4), np.int64)},
            "d.npz[mask]: dtype int64",
            "convert the data to bool",
        ),
        ({"ids": np.zeros((2, 4), np.float32)}, "d.npz[ids]: dtype float32", "int64"),
        ({"x": np.zeros((3, 4), np.float32)}, "different sample counts", "x: 3, ids: 2"),
    ]
    for change, first, second in cases:
        np.savez(tmp_path / "d.npz", **{**base, **change})
        if first is None:
            continue  # int64 values for an int64 input: fine whatever their size
        with pytest.raises(QuantbenchError) as info:
            open_data(tmp_path / "d.npz", g.inputs)
        assert first in str(info.value) and second in str(info.value), str(info.value)


def test_integer_values_that_do_not_fit_are_refused(tmp_path):
    model = _model(
        [helper.make_tensor_value_info("ids", TensorProto.INT32, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["N", 2])],
        [helper.make_node("Identity", ["ids"], ["y"])],
    )
    g = open_graph(model)
    np.savez(tmp_path / "d.npz", ids=np.array([[1, 2**40]], np.int64))
    with pytest.raises(QuantbenchError, match=r"d.npz\[ids\]: values in \[1, 1099511627776\]"):
        _feeds(open_data(tmp_path / "d.npz", g.inputs))


def test_input_of_an_unfeedable_type_is_named():
    model = _model(
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N"])],
        [helper.make_node("Identity", ["text"], ["y"])],
    )
    with pytest.raises(QuantbenchError, match="input 'text' has element type STRING"):
        open_graph(model)


# ----------------------------------------------------------------------------- fingerprints


def _loader(tmp_path: Path) -> Path:
    script = tmp_path / "loader.py"
    script.write_text(
        "from pathlib import Path\n"
        "import numpy as np\n"
        "def load_data():\n"
        "    x = np.load(Path(__file__).with_name('raw.npy'))\n"
        "    for i in range(0, len(x), 4):\n"
        "        yield {'x': x[i:i + 4]}\n"
    )
    return script


def test_script_data_that_changed_is_not_served_from_the_cache(tmp_path):
    """Issue 16 item 2: the fingerprint of a loader script was the script's bytes, so after the
    data it reads was multiplied by 10 calibrate said 'from cached statistics', old table."""
    path = _save(_scale_relu(["N", 3]), tmp_path / "m.onnx")
    script = _loader(tmp_path)
    x = np.random.default_rng(3).standard_normal((12, 3)).astype(np.float32)
    np.save(tmp_path / "raw.npy", x)
    first = calibrate(path, script, methods=["minmax"], show_progress=False)
    np.save(tmp_path / "raw.npy", x * 10)
    second = calibrate(path, script, methods=["minmax"], show_progress=False)
    assert not second.from_cache
    assert first.tables["minmax"].amax("x") == pytest.approx(float(np.abs(x).max()), rel=1e-6)
    assert second.tables["minmax"].amax("x") == pytest.approx(10 * float(np.abs(x).max()), rel=1e-6)
    # the statistics carry the fingerprint of what was fed, which differs with the data
    assert first.stats.data_fingerprint != second.stats.data_fingerprint
    assert open_data(script, open_graph(path).inputs).fingerprint is None


def test_script_data_cli_says_one_pass_each_time(run_cli, tmp_path):
    path = _save(_scale_relu(["N", 3]), tmp_path / "m.onnx")
    script = _loader(tmp_path)
    np.save(tmp_path / "raw.npy", np.ones((8, 3), np.float32))
    for _ in range(2):
        code, _, err = run_cli("calibrate", path, "--data", script, "-m", "minmax")
        assert code == 0, err
        assert "one onnxruntime pass" in err and "cached statistics" not in err


def test_file_data_that_changed_is_not_served_from_the_cache(tmp_path):
    path = _save(_scale_relu(["N", 3]), tmp_path / "m.onnx")
    x = np.ones((4, 3), np.float32)
    np.save(tmp_path / "d.npy", x)
    calibrate(path, tmp_path / "d.npy", methods=["minmax"], show_progress=False)
    again = calibrate(path, tmp_path / "d.npy", methods=["minmax"], show_progress=False)
    assert again.from_cache  # same bytes: the cache is right to answer
    np.save(tmp_path / "d.npy", x * 3)
    changed = calibrate(path, tmp_path / "d.npy", methods=["minmax"], show_progress=False)
    assert not changed.from_cache and changed.tables["minmax"].amax("x") == pytest.approx(3.0)


# ----------------------------------------------------------------------------- non-finite


def test_nonfinite_samples_are_reported_by_index(tmp_path):
    """Issue 10 item 4 / Build 6: a NaN pixel in one sample went by without a word."""
    g = open_graph(_scale_relu(["N", 3, 4, 4]))
    x = np.zeros((10, 3, 4, 4), np.float32)
    x[3, 1, 2, 2] = np.nan
    x[7, 0, 0, 0] = np.inf
    np.savez(tmp_path / "d.npz", x=x)
    seen: list[str] = []
    source = open_data(tmp_path / "d.npz", g.inputs, batch_size=4)
    source.on_nonfinite = seen.append
    _feeds(source)
    assert source.nonfinite.count == {f"{tmp_path / 'd.npz'}[x]": 2}
    assert len(seen) == 1 and f"{tmp_path / 'd.npz'}[x]: 2 sample(s)" in seen[0]
    assert "index 3, 7" in seen[0]
    _feeds(source)
    assert len(seen) == 1  # reported once per source


def test_nonfinite_samples_of_a_batchless_model_and_a_script(tmp_path):
    g = open_graph(_scale_relu([3, 4]))
    script = tmp_path / "nan_loader.py"
    script.write_text(
        "import numpy as np\n"
        "def load_data():\n"
        "    for i in range(3):\n"
        "        x = np.zeros((4, 3, 4), np.float32)\n"
        "        x[1] = np.nan if i == 2 else 0\n"
        "        yield {'x': x}\n"
    )
    seen: list[str] = []
    source = open_data(script, g.inputs)
    source.on_nonfinite = seen.append
    assert len(_feeds(source)) == 12
    assert seen == [
        f"{script}:load_data[x]: 1 sample(s) hold NaN/Inf (index 9); they are fed as they are: "
        "fix or drop them"
    ]


def test_nonfinite_samples_warned_by_calibrate(run_cli, tmp_path):
    path = _save(_scale_relu(["N", 3]), tmp_path / "m.onnx")
    x = np.ones((8, 3), np.float32)
    x[5, 1] = np.nan
    np.save(tmp_path / "d.npy", x)
    code, _, err = run_cli("calibrate", path, "--data", tmp_path / "d.npy", "-m", "minmax")
    assert code == 0, err
    assert "d.npy[x]: 1 sample(s) hold NaN/Inf (index 5)" in " ".join(err.split())


# ----------------------------------------------------------------------------- presets


def _png_folder(tmp_path: Path, n: int = 2, size: tuple[int, int] = (300, 400)) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(n):
        Image.fromarray(np.full((*size, 3), 60 * i, np.uint8)).save(folder / f"{i}.png")
    return folder


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('resize = "abc"', "resize"),
        ("resize = [0, 4]", "resize"),
        ("resize = [1, 2, 3]", "resize"),
        ("center_crop = 2.5", "center_crop"),
        ("resize_shorter = -3", "resize_shorter"),
        ('layout = "CHW"', "layout"),
        ('colour = "RGBA"', "colour"),
        ("std = [0.2, 0, 0.2]", "std"),
        ("mean = [0.5, 0.5]", "mean"),
        ('mean = "x"', "mean"),
        ("scale = 0", "scale"),
        ('dtype = "int8"', "dtype"),
        ("name = 3", "name"),
        ("resize_shortr = 256", "resize_shortr"),
    ],
)
def test_bad_preset_value_is_one_line_naming_file_and_key(run_cli, tmp_path, body, key):
    """Issue 16 item 6: ``resize = "abc"`` was a traceback."""
    preset = tmp_path / "bad.toml"
    preset.write_text(f"[input]\n{body}\n")
    path = _save(_scale_relu(["N", 3, 4, 4]), tmp_path / "m.onnx")
    code, out, err = run_cli(
        "calibrate", path, "--data", _png_folder(tmp_path), "--preset", preset, "-o", tmp_path / "t"
    )
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(preset) in " ".join(err.split()) and key in err
    assert not (tmp_path / "t").exists()


def test_preset_without_input_table_and_unknown_name(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("[other]\nx = 1\n")
    with pytest.raises(QuantbenchError, match=r"empty.toml: no \[input\] table"):
        Preset.load(empty)
    with pytest.raises(QuantbenchError, match="preset nosuch: not found .* imagenet, tinycnn"):
        Preset.load("nosuch")
    with pytest.raises(QuantbenchError, match="missing.toml: preset file not found"):
        Preset.load(tmp_path / "missing.toml")


def test_imagenet_preset_applies_to_any_single_input_name(tmp_path):
    """imagenet.toml hard-coded name="input": a model whose input is 'data' was refused."""
    path = _save(_scale_relu(["N", 3, 224, 224], name="data"), tmp_path / "m.onnx")
    folder = _png_folder(tmp_path)
    feeds = _feeds(open_data(folder, open_graph(path).inputs, preset="imagenet", batch_size=2))
    assert [f["data"].shape for f in feeds] == [(2, 3, 224, 224)]
    # pixel 60 (image 1), red by hand: (60/255 - 0.485) / 0.229 = (0.235294 - 0.485) / 0.229
    assert float(feeds[0]["data"][1, 0, 100, 100]) == pytest.approx(-1.090419, abs=1e-5)


def test_image_folder_for_a_multi_input_model_names_the_inputs(tmp_path):
    g = open_graph(_three_input_model())
    with pytest.raises(
        QuantbenchError, match=r"feeds one input, but the model has 3 \(x, ids, mask"
    ):
        open_data(_png_folder(tmp_path), g.inputs, preset="imagenet")


def test_presets_are_packaged_resources():
    assert {"imagenet", "tinycnn"} <= set(preset_names())
    assert Preset.load("imagenet").center_crop == (224, 224)


def _probe_presets(site: Path) -> tuple[str, str]:
    """Load the imagenet preset in a fresh interpreter that imports quantbench from ``site``."""
    probe = (
        "from quantbench.data.presets import Preset, preset_names; p = Preset.load('imagenet'); "
        "print(p.source); print(','.join(preset_names()))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=site, capture_output=True, text=True, check=True
    )  # cwd: `python -c` imports from the working directory first, which must not be the repo
    source, names = done.stdout.split()
    return source, names


def test_presets_are_declared_as_package_data_and_found_where_installed(tmp_path):
    """configs/ was not packaged (a wheel found no preset): it is ``quantbench.configs`` now,
    and the presets are looked up as package resources there."""
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"]["quantbench.configs"] == "configs"
    assert "quantbench.configs" in setup["packages"]
    assert setup["package-data"]["quantbench.configs"] == ["*.toml"]
    site = tmp_path / "site"  # the installed layout that mapping gives
    shutil.copytree(
        REPO / "quantbench", site / "quantbench", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(REPO / "configs", site / "quantbench" / "configs")
    source, names = _probe_presets(site)
    assert Path(source) == site / "quantbench" / "configs" / "imagenet.toml"
    assert names == "imagenet,tinycnn"


def _setuptools_builds_offline() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("setuptools").split(".")[0]) >= 77  # pyproject's build requirement
    except PackageNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(
    not _setuptools_builds_offline(), reason="building the wheel offline needs setuptools>=77"
)
def test_presets_load_from_a_built_wheel(tmp_path):
    """The same from a real wheel (pip wheel, no network: the build backend must be here)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "build", "*.so", "*.o")
    for folder in ("quantbench", "calibrators", "reports", "plugins", "configs"):
        shutil.copytree(REPO / folder, src / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    wheel = next(wheels.glob("quantbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "quantbench/configs/imagenet.toml" in names
    assert "quantbench/configs/tinycnn.toml" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    source, listed = _probe_presets(site)
    assert Path(source) == site / "quantbench" / "configs" / "imagenet.toml"
    assert listed == "imagenet,tinycnn"
