"""Image presets for models that are not ImageNet classifiers: grayscale inputs (digit and
captcha recognizers), aspect-keeping resize with padding (a detector's letterbox, a text line
for an OCR recognizer) and image folders organised in subfolders. Expected pixels are derived
by hand from uniform images, whose bilinear resize keeps their value exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from quantbench.data.presets import Preset
from quantbench.data.sources import open_data
from quantbench.errors import QuantbenchError
from quantbench.model.graph import open_graph


def _scale_relu(dims: list) -> onnx.ModelProto:
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["h"], name="mul"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _preset(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text("[input]\n" + body + "\n")
    return path


def _uniform_png(path: Path, hw: tuple[int, int], rgb: tuple[int, int, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*hw, 3), rgb, np.uint8)).save(path)
    return path


def test_gray_preset_gives_one_channel(tmp_path):
    """(v, v, v) pixels are gray v; (v/255 - 0.5) / 0.25 by hand for v = 204: 1.2."""
    png = _uniform_png(tmp_path / "a.png", (6, 10), (204, 204, 204))
    p = Preset.load(_preset(tmp_path, 'colour = "GRAY"\nresize = [4, 8]\nmean = 0.5\nstd = 0.25'))
    x = p.apply(png)
    assert x.shape == (1, 4, 8) and x.dtype == np.float32
    np.testing.assert_allclose(x, 1.2, atol=1e-6)
    nhwc = Preset.load(_preset(tmp_path, 'colour = "GRAY"\nlayout = "NHWC"'))
    assert nhwc.apply(png).shape == (6, 10, 1)


def test_gray_of_colour_pixels_uses_the_luma_weights(tmp_path):
    """ITU-R 601-2 luma, as PIL converts: L = 0.299 R + 0.587 G + 0.114 B; (100, 200, 50):
    29.9 + 117.4 + 5.7 = 153."""
    png = _uniform_png(tmp_path / "a.png", (2, 2), (100, 200, 50))
    x = Preset.load(_preset(tmp_path, 'colour = "GRAY"\nscale = 1.0')).apply(png)
    np.testing.assert_array_equal(x, np.full((1, 2, 2), 153.0, np.float32))


def test_keep_aspect_letterbox_centres_the_image(tmp_path):
    """20x40 into 16x16: scale min(16/20, 16/40) = 0.4 -> 8x16, rows 4..11 hold the image,
    rows 0..3 and 12..15 the padding (pixel 114, YOLO's grey)."""
    png = _uniform_png(tmp_path / "a.png", (20, 40), (200, 200, 200))
    body = "resize = [16, 16]\nkeep_aspect = true\npad_value = 114\nscale = 1.0"
    x = Preset.load(_preset(tmp_path, body)).apply(png)
    assert x.shape == (3, 16, 16)
    expected = np.full((3, 16, 16), 114.0, np.float32)
    expected[:, 4:12, :] = 200.0
    np.testing.assert_array_equal(x, expected)


def test_keep_aspect_top_left_pads_a_text_line_on_the_right(tmp_path):
    """A 32x100 text line into 48x320 (an OCR recognizer): scale min(1.5, 3.2) = 1.5 -> 48x150,
    columns 150..319 padded; pad_value 127.5 is 0 after mean 0.5, std 0.5 (PaddleOCR's pad)."""
    png = _uniform_png(tmp_path / "line.png", (32, 100), (255, 255, 255))
    body = (
        'resize = [48, 320]\nkeep_aspect = true\npad_align = "top-left"\npad_value = 127.5\n'
        "mean = 0.5\nstd = 0.5"
    )
    x = Preset.load(_preset(tmp_path, body)).apply(png)
    assert x.shape == (3, 48, 320)
    np.testing.assert_allclose(x[:, :, :150], 1.0, atol=1e-6)  # (255/255 - 0.5) / 0.5
    np.testing.assert_allclose(x[:, :, 150:], 0.0, atol=1e-6)


def test_keep_aspect_pads_per_channel_before_bgr_and_normalisation(tmp_path):
    """pad_value is in pixel units and RGB order, like the image it pads: with BGR output the
    channels swap together."""
    png = _uniform_png(tmp_path / "a.png", (10, 20), (10, 20, 30))
    body = (
        'resize = [20, 20]\nkeep_aspect = true\npad_value = [1, 2, 3]\ncolour = "BGR"\nscale = 1.0'
    )
    x = Preset.load(_preset(tmp_path, body)).apply(png)
    np.testing.assert_array_equal(x[:, 0, 0], [3.0, 2.0, 1.0])  # a padded row (rows 0..4)
    np.testing.assert_array_equal(x[:, 10, 0], [30.0, 20.0, 10.0])  # an image row (5..14)


def test_image_subfolders_are_searched_in_path_order(tmp_path):
    """An ImageNet-style tree (one folder per class) was 'holds no ... image files'."""
    root = tmp_path / "calib"
    _uniform_png(root / "b_class" / "1.png", (8, 8), (30, 30, 30))
    _uniform_png(root / "a_class" / "2.png", (8, 8), (10, 10, 10))
    _uniform_png(root / "a_class" / "deeper" / "3.png", (8, 8), (20, 20, 20))
    _uniform_png(root / ".thumbnails" / "4.png", (8, 8), (99, 99, 99))
    (root / "notes.txt").write_text("not an image")
    g = open_graph(_scale_relu(["N", 3, 8, 8]))
    preset = _preset(tmp_path, "scale = 1.0")
    feeds = list(open_data(root, g.inputs, preset=preset, batch_size=8).batches())
    assert len(feeds) == 1 and feeds[0]["x"].shape == (3, 3, 8, 8)
    # a_class/2.png, a_class/deeper/3.png, b_class/1.png
    assert feeds[0]["x"][:, 0, 0, 0].tolist() == [10.0, 20.0, 30.0]


def test_folder_without_any_data_says_subfolders_were_searched(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    g = open_graph(_scale_relu(["N", 3, 8, 8]))
    with pytest.raises(QuantbenchError, match="no image files \\(subfolders searched too\\)"):
        open_data(tmp_path / "empty", g.inputs)


def test_gray_folder_calibrates_a_one_channel_model(run_cli, tmp_path):
    """A digit recognizer's [N, 1, 28, 28] input from a folder of colour PNGs."""
    for i, v in enumerate((0, 51, 255)):
        _uniform_png(tmp_path / "digits" / f"{i}.png", (40, 30), (v, v, v))
    model = tmp_path / "m.onnx"
    onnx.save(_scale_relu(["N", 1, 28, 28]), str(model))
    preset = _preset(tmp_path, 'colour = "GRAY"\nresize = [28, 28]')
    code, _, err = run_cli(
        "calibrate", model, "--data", tmp_path / "digits", "--preset", preset, "-m", "minmax",
        "-o", tmp_path / "t.json", "-f", "json",
    )  # fmt: skip
    assert code == 0, err
    tensors = json.loads((tmp_path / "t.json").read_text())["tensors"]
    assert tensors["x"]["amax"] == 1.0  # the white image: 255 / 255
    assert tensors["y"]["amax"] == 2.0  # y = 2 x


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("keep_aspect = true", "keep_aspect"),  # nothing to fit into
        ('resize = [4, 4]\nkeep_aspect = "yes"', "keep_aspect"),
        ("resize = [4, 4]\npad_value = 114", "pad_value"),  # only keep_aspect pads
        ('resize = [4, 4]\nkeep_aspect = true\npad_align = "left"', "pad_align"),
        ("resize = [4, 4]\nkeep_aspect = true\npad_value = [1, 2]", "pad_value"),
        ('colour = "GRAY"\nmean = [0.4, 0.5, 0.6]', "mean"),
        ('colour = "GRAY"\nstd = [0.2, 0.2, 0.2]', "std"),
    ],
)
def test_bad_geometry_values_name_the_key(tmp_path, body, key):
    preset = _preset(tmp_path, body)
    with pytest.raises(QuantbenchError, match=rf"p.toml: \[input\] {key} = .* is not valid"):
        Preset.load(preset)


def test_longer_side_and_multiple_of_a_stride(tmp_path):
    """30x100 (h x w), longer side to 64: 19.2 x 64 -> 19 x 64; sides to multiples of 32:
    19 -> 32 (never below one stride), 64 stays: 32 x 64, as a DBNet text detector takes."""
    png = _uniform_png(tmp_path / "line.png", (30, 100), (90, 90, 90))
    x = Preset.load(_preset(tmp_path, "resize_longer = 64\nsize_multiple = 32")).apply(png)
    assert x.shape == (3, 32, 64)
    np.testing.assert_allclose(x, 90 / 255, rtol=1e-6)


def test_images_of_different_sizes_feed_a_dynamic_detector_one_at_a_time(run_cli, tmp_path):
    """A text detector takes [N, 3, H, W] with any H, W (multiples of its stride): its images
    were refused for not having the first one's size. By hand, longer side to 64 then
    multiples of 32: 40x60 -> 42.7x64 -> 32x64; 50x30 -> 64x38.4 -> 64x32."""
    folder = tmp_path / "pages"
    _uniform_png(folder / "a.png", (40, 60), (255, 255, 255))
    _uniform_png(folder / "b.png", (50, 30), (0, 0, 0))
    preset = _preset(tmp_path, "resize_longer = 64\nsize_multiple = 32\nscale = 1.0")
    dynamic = open_graph(_scale_relu(["N", 3, "H", "W"]))
    feeds = list(open_data(folder, dynamic.inputs, preset=preset).batches())
    assert [f["x"].shape for f in feeds] == [(1, 3, 32, 64), (1, 3, 64, 32)]
    assert [float(f["x"].max()) for f in feeds] == [255.0, 0.0]
    with pytest.raises(QuantbenchError, match=r"b.png: .* in one batch; feed images one at a"):
        list(open_data(folder, dynamic.inputs, preset=preset, batch_size=2).batches())
    fixed = open_graph(_scale_relu(["N", 3, 32, 64]))
    with pytest.raises(
        QuantbenchError, match=r"b.png: .*\[3, 64, 32\], unlike a.png's \[3, 32, 64\]"
    ):
        list(open_data(folder, fixed.inputs, preset=preset).batches())
    model = tmp_path / "m.onnx"
    onnx.save(_scale_relu(["N", 3, "H", "W"]), str(model))
    code, _, err = run_cli(
        "calibrate", model, "--data", folder, "--preset", preset, "-m", "minmax",
        "-o", tmp_path / "t.json", "-f", "json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads((tmp_path / "t.json").read_text())["tensors"]["x"]["amax"] == 255.0


def test_auto_does_not_blame_the_model_for_images_of_several_sizes(run_cli, tmp_path):
    """--method auto tries batches for its slice; images that cannot be stacked made it warn
    that the model 'declares a dynamic batch axis but does not run 2 samples at once'."""
    folder = tmp_path / "pages"
    for i in range(16):  # enough for auto to hold some back and try them batched
        _uniform_png(folder / f"{i:02}.png", [(40, 60), (50, 30)][i % 2], (9 * i,) * 3)
    preset = _preset(tmp_path, "resize_longer = 64\nsize_multiple = 32")
    model = tmp_path / "m.onnx"
    onnx.save(_conv_relu(["N", 3, "H", "W"]), str(model))
    code, _, err = run_cli(
        "calibrate", model, "--data", folder, "--preset", preset, "-o", tmp_path / "t.cache",
        "--no-cache",
    )  # fmt: skip
    assert code == 0, err
    assert "auto: chose" in err and "does not run" not in err


def _conv_relu(dims: list) -> onnx.ModelProto:
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"
    )
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 4, *dims[2:]])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_preset_given_for_arrays_is_said_once_not_dropped(run_cli, tmp_path):
    """--preset with .npz data was ignored in silence: the user could believe the arrays had
    been normalised by it. auto opens the data several times; the line comes once."""
    model = tmp_path / "m.onnx"
    onnx.save(_conv_relu(["N", 3, 8, 8]), str(model))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).random((16, 3, 8, 8), np.float32))
    preset = _preset(tmp_path, "scale = 1.0")
    code, _, err = run_cli(
        "calibrate", model, "--data", tmp_path / "d.npz", "--preset", preset,
        "-o", tmp_path / "t.cache", "--no-cache",
    )  # fmt: skip
    assert code == 0, err
    text = " ".join(err.split())
    assert text.count("--preset") == 1 and "d.npz: --preset" in text and "is not applied" in text


def test_flat_layout_feeds_an_mlp_digit_recognizer(run_cli, tmp_path):
    """An MLP takes [N, 784]: a 28x28 GRAY digit as one axis, row-major. By hand: a 2x3 image
    whose pixel (r, c) is 10r + c flattens to [0, 1, 2, 10, 11, 12]."""
    png = tmp_path / "grid.png"
    Image.fromarray(np.array([[0, 1, 2], [10, 11, 12]], np.uint8)).save(png)
    flat = Preset.load(_preset(tmp_path, 'colour = "GRAY"\nlayout = "FLAT"\nscale = 1.0'))
    assert flat.apply(png).tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    for i in range(3):
        _uniform_png(tmp_path / "digits" / f"{i}.png", (28, 28), (40 * i,) * 3)
    w = numpy_helper.from_array(np.ones((784, 10), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        initializer=[w],
    )
    mlp = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mlp.ir_version = 8
    onnx.save(mlp, str(tmp_path / "mlp.onnx"))
    preset = _preset(tmp_path, 'colour = "GRAY"\nlayout = "FLAT"\nresize = [28, 28]')
    code, _, err = run_cli(
        "calibrate", tmp_path / "mlp.onnx", "--data", tmp_path / "digits", "--preset", preset,
        "-m", "minmax", "-o", tmp_path / "t.json", "-f", "json",
    )  # fmt: skip
    assert code == 0, err
    tensors = json.loads((tmp_path / "t.json").read_text())["tensors"]
    assert tensors["x"]["amax"] == pytest.approx(80 / 255)  # the brightest digit image
    assert tensors["y"]["amax"] == pytest.approx(784 * 80 / 255, rel=1e-5)  # 784 ones
