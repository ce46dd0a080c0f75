"""The committed tinycnn example (model, data, PNGs, presets) and the ResNet-18 model builder."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from PIL import Image

from quantbench.data.presets import Preset
from quantbench.errors import QuantbenchError

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "tinycnn"
MODEL_PATH = EXAMPLE / "tinycnn.onnx"
NUM_CLASSES = 6
PRESET_KEYS = {"name", "layout", "colour", "scale", "mean", "std", "dtype"}


def _load_benchmark_models() -> ModuleType:
    """benchmarks/ is not an installed package: import benchmarks/models.py by path."""
    spec = importlib.util.spec_from_file_location(
        "quantbench_benchmark_models", REPO_ROOT / "benchmarks" / "models.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


models = _load_benchmark_models()


@pytest.fixture(scope="module")
def tinycnn() -> onnx.ModelProto:
    return onnx.load(MODEL_PATH)


@pytest.fixture(scope="module")
def eval_inputs() -> np.ndarray:
    with np.load(EXAMPLE / "eval.npz") as archive:
        return archive["image"]


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def _constant_names(model: onnx.ModelProto) -> set[str]:
    names = {init.name for init in model.graph.initializer}
    names.update(n.output[0] for n in model.graph.node if n.op_type == "Constant")
    return names


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value or d.dim_param for d in value_info.type.tensor_type.shape.dim]


def _attribute(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


# ----------------------------------------------------------------------------- tinycnn model


def test_tinycnn_is_valid_small_opset17_with_static_batch_1(tinycnn: onnx.ModelProto) -> None:
    onnx.checker.check_model(tinycnn, full_check=True)
    assert MODEL_PATH.stat().st_size < 300_000
    assert [o.version for o in tinycnn.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [i.name for i in tinycnn.graph.input] == ["image"]
    assert _dims(tinycnn.graph.input[0]) == [1, 3, 32, 32]
    assert [o.name for o in tinycnn.graph.output] == ["logits"]
    assert _dims(tinycnn.graph.output[0]) == [1, NUM_CLASSES]


def test_tinycnn_has_exactly_one_runtime_kernel_conv_and_it_is_depthwise(
    tinycnn: onnx.ModelProto,
) -> None:
    constants = _constant_names(tinycnn)
    dynamic = [n for n in tinycnn.graph.node if n.op_type == "Conv" and n.input[1] not in constants]
    assert len(dynamic) == 1
    conv = dynamic[0]
    metadata = {p.key: p.value for p in tinycnn.metadata_props}
    assert conv.name == metadata["dynamic_conv_node"]
    producers = {out: node for node in tinycnn.graph.node for out in node.output}
    # The kernel is computed from the sample: GlobalAveragePool -> Flatten -> Gemm -> Reshape.
    chain, tensor = [], conv.input[1]
    while tensor in producers:
        chain.append(producers[tensor].op_type)
        tensor = producers[tensor].input[0]
        if chain[-1] == "GlobalAveragePool":
            break
    assert chain == ["Reshape", "Gemm", "Flatten", "GlobalAveragePool"]
    shapes = {
        vi.name: _dims(vi) for vi in onnx.shape_inference.infer_shapes(tinycnn).graph.value_info
    }
    channels = shapes[conv.input[0]][1]
    assert shapes[conv.input[1]] == [channels, 1, 3, 3]
    assert _attribute(conv, "group") == channels


def test_tinycnn_has_the_layers_the_qdq_rules_need(tinycnn: onnx.ModelProto) -> None:
    ops = Counter(n.op_type for n in tinycnn.graph.node)
    assert ops["Conv"] >= 4 and ops["Relu"] >= 4
    assert ops["MaxPool"] + ops["AveragePool"] >= 1
    assert ops["BatchNormalization"] == 0, "BatchNorm must be folded into the convs"
    producers = {out: node for node in tinycnn.graph.node for out in node.output}
    residual_adds = [
        n
        for n in tinycnn.graph.node
        if n.op_type == "Add" and any(producers.get(i, n).op_type == "Conv" for i in n.input)
    ]
    assert residual_adds
    final = producers["logits"]
    assert final.op_type == "Gemm" and _attribute(final, "transB") == 1
    assert final.input[1] in _constant_names(tinycnn)


def test_tinycnn_fp32_accuracy_on_first_200_eval_samples(
    tinycnn: onnx.ModelProto, eval_inputs: np.ndarray
) -> None:
    labels = np.load(EXAMPLE / "eval_labels.npy")[:200]
    session = _session(tinycnn)
    predictions = [
        int(session.run(["logits"], {"image": sample[None]})[0].argmax())
        for sample in eval_inputs[:200]
    ]
    accuracy = float(np.mean(np.asarray(predictions) == labels))
    assert 0.8 < accuracy < 1.0, accuracy  # good, and not trivially perfect


# ----------------------------------------------------------------------------- tinycnn data


def test_calib_and_eval_arrays_have_the_documented_shapes(eval_inputs: np.ndarray) -> None:
    with np.load(EXAMPLE / "calib.npz") as archive:
        assert list(archive.keys()) == ["image"]
        calib = archive["image"]
    labels = np.load(EXAMPLE / "eval_labels.npy")
    assert calib.dtype == np.float32 and calib.shape[1:] == (3, 32, 32)
    assert 256 <= calib.shape[0] <= 512
    assert eval_inputs.dtype == np.float32 and eval_inputs.shape == (500, 3, 32, 32)
    assert labels.dtype == np.int64 and labels.shape == (500,)
    assert set(np.unique(labels)) == set(range(NUM_CLASSES))
    assert np.isfinite(calib).all() and np.isfinite(eval_inputs).all()
    # Normalised with training statistics: roughly zero mean, unit spread per channel.
    assert np.abs(calib.mean(axis=(0, 2, 3))).max() < 0.3
    assert np.all(np.abs(calib.std(axis=(0, 2, 3)) - 1.0) < 0.3)
    # Calibration data is held out from evaluation: no sample appears in both.
    calib_keys = {sample.tobytes() for sample in calib}
    assert not any(sample.tobytes() in calib_keys for sample in eval_inputs)


def test_pngs_through_the_preset_give_exactly_the_eval_inputs(eval_inputs: np.ndarray) -> None:
    """The real preset code (``Preset``, as ``--preset tinycnn`` runs it) against eval.npz, which
    examples/make_example.py wrote from the same photos without quantbench."""
    preset = Preset.load("tinycnn")
    assert (preset.layout, preset.colour, preset.resize) == ("NCHW", "RGB", (32, 32))
    labels = np.load(EXAMPLE / "eval_labels.npy")
    metadata = {p.key: p.value for p in onnx.load(MODEL_PATH).metadata_props}
    classes = json.loads(metadata["classes"])
    pngs = sorted((EXAMPLE / "images").glob("*.png"))
    assert len(pngs) >= 8
    for png in pngs:
        match = re.fullmatch(r"(\d{3})_([a-z]+)\.png", png.name)
        assert match, png.name
        index = int(match.group(1))
        assert classes[labels[index]] == match.group(2)
        model_input = preset.apply(png)
        assert model_input.dtype == np.float32 and model_input.shape == (3, 32, 32)
        np.testing.assert_allclose(model_input, eval_inputs[index], rtol=0, atol=1e-5)


def test_preset_pipeline_on_a_hand_made_image(tmp_path: Path) -> None:
    """Crop position, colour order, scale/mean/std and layout, numbers derived by hand.

    A 4x6 (h x w) image whose pixel (r, c) is R = 10c + r, G = 100, B = 200. center_crop
    [2, 2] keeps rows (4-2)//2 = 1..2 and columns (6-2)//2 = 2..3, so R is [[21, 31], [22, 32]].
    BGR puts B first; scale 0.5, mean [10, 20, 30], std [2, 4, 5] (per output channel):
    B: (200 * 0.5 - 10) / 2 = 45; G: (100 * 0.5 - 20) / 4 = 7.5; R: (21 * 0.5 - 30) / 5 = -3.9.
    """
    r = np.add.outer(np.arange(4), 10 * np.arange(6))
    pixels = np.stack([r, np.full_like(r, 100), np.full_like(r, 200)], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "hand.png")
    (tmp_path / "hand.toml").write_text(
        '[input]\ncolour = "BGR"\nlayout = "NHWC"\ncenter_crop = [2, 2]\nscale = 0.5\n'
        "mean = [10, 20, 30]\nstd = [2, 4, 5]\n"
    )
    x = Preset.load(tmp_path / "hand.toml").apply(tmp_path / "hand.png")
    assert x.shape == (2, 2, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[..., 0], [[45.0, 45.0], [45.0, 45.0]], rtol=1e-6)
    np.testing.assert_allclose(x[..., 1], [[7.5, 7.5], [7.5, 7.5]], rtol=1e-6)
    np.testing.assert_allclose(x[..., 2], [[-3.9, -2.9], [-3.8, -2.8]], rtol=1e-6)


def test_imagenet_preset_on_a_flat_photo_by_hand(tmp_path: Path) -> None:
    """resize_shorter 256 then center crop 224 of a flat 300x400 (h x w) colour (255, 128, 0):
    resizing keeps a flat colour, so every pixel is (v / 255 - mean) / std by hand:
    R (1 - 0.485) / 0.229 = 2.248908, G (0.501961 - 0.456) / 0.224 = 0.205182,
    B (0 - 0.406) / 0.225 = -1.804444."""
    Image.fromarray(np.full((300, 400, 3), (255, 128, 0), np.uint8)).save(tmp_path / "flat.png")
    x = Preset.load("imagenet").apply(tmp_path / "flat.png")
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    for channel, value in enumerate([2.248908, 0.205182, -1.804444]):
        np.testing.assert_allclose(x[channel], value, atol=2e-6)


def test_presets_share_the_loader_keys() -> None:
    """Both packaged presets go through the real loader; neither names a model input (a
    preset applies to a single-input model whatever its input is called)."""
    tiny = tomllib.loads((REPO_ROOT / "configs" / "tinycnn.toml").read_text())["input"]
    imagenet = tomllib.loads((REPO_ROOT / "configs" / "imagenet.toml").read_text())["input"]
    assert set(tiny) == PRESET_KEYS | {"resize"}
    assert set(imagenet) == PRESET_KEYS - {"name"} | {"resize_shorter", "center_crop"}
    loaded = Preset.load("imagenet")
    assert loaded.resize_shorter == 256 and loaded.center_crop == (224, 224)
    assert loaded.mean == (0.485, 0.456, 0.406) and loaded.std == (0.229, 0.224, 0.225)
    assert loaded.name is None and Preset.load("tinycnn").name == "image"


# ----------------------------------------------------------------------------- resnet18 builder


@pytest.fixture(scope="module")
def resnet18_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_resnet18(tmp_path_factory.mktemp("r18") / "resnet18.onnx", seed=0)


def test_resnet18_has_resnet18_structure(resnet18_path: Path) -> None:
    model = onnx.load(resnet18_path)
    onnx.checker.check_model(model)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert _dims(model.graph.input[0]) == [1, 3, 224, 224]
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 20 and ops["Add"] == 8 and ops["MaxPool"] == 1 and ops["Gemm"] == 1
    kernels = Counter(
        tuple(_attribute(n, "kernel_shape")) for n in model.graph.node if n.op_type == "Conv"
    )
    assert kernels == {(7, 7): 1, (3, 3): 16, (1, 1): 3}
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    assert weights["fc.weight"].shape == (1000, 512)
    assert 11_500_000 < sum(w.size for w in weights.values()) < 12_000_000


def test_resnet18_runs_with_realistic_activations(resnet18_path: Path) -> None:
    model = onnx.load(resnet18_path)
    watched = [n.output[0] for n in model.graph.node if n.op_type == "Relu"]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in watched)
    logits, *activations = _session(model).run(None, {"input": models.make_resnet18_data(1, 5)})
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()
    assert 1.0 < logits.std() < 8.0
    for name, activation in zip(watched, activations, strict=True):
        zero_fraction = float(np.mean(activation == 0))
        assert 0.2 < zero_fraction < 0.8, (name, zero_fraction)  # ReLU sparsity, not dead/linear
        assert 1.0 < activation.max() < 50.0, (name, activation.max())  # neither vanish nor explode


def test_resnet18_dynamic_batch_is_deterministic_and_matches_per_sample_results(
    resnet18_path: Path, tmp_path: Path
) -> None:
    path = models.build_resnet18(tmp_path / "dynamic.onnx", seed=0, dynamic_batch=True)
    dynamic, static_model = onnx.load(path), onnx.load(resnet18_path)
    assert _dims(dynamic.graph.input[0])[0] == "N"
    assert _dims(dynamic.graph.output[0])[0] == "N"
    # Same seed, same weights, bit for bit: only the batch dimension differs.
    assert [i.SerializeToString() for i in dynamic.graph.initializer] == [
        i.SerializeToString() for i in static_model.graph.initializer
    ]
    batch = models.make_resnet18_data(2, 3)
    batched = _session(path).run(None, {"input": batch})[0]
    static = _session(resnet18_path)
    singles = np.concatenate([static.run(None, {"input": batch[i : i + 1]})[0] for i in range(2)])
    np.testing.assert_allclose(batched, singles, rtol=1e-4, atol=1e-4)


def test_resnet18_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(QuantbenchError, match="batch"):
        models.build_resnet18(tmp_path / "x.onnx", batch=0)
    with pytest.raises(QuantbenchError, match="does not exist"):
        models.build_resnet18(tmp_path / "missing" / "x.onnx")
    with pytest.raises(QuantbenchError, match="n=0"):
        models.make_resnet18_data(0, 0)


def test_resnet18_data_is_image_like_and_deterministic() -> None:
    data = models.make_resnet18_data(3, 7)
    assert data.shape == (3, 3, 224, 224) and data.dtype == np.float32
    np.testing.assert_array_equal(models.make_resnet18_data(2, 7), data[:2])  # stable prefix
    assert not np.array_equal(models.make_resnet18_data(1, 8)[0], data[0])
    # ImageNet-normalised pixels of [0,1] images stay within [(0-mean)/std, (1-mean)/std].
    assert data.min() >= -2.2 and data.max() <= 2.7
    # Smooth like a photograph, unlike white noise (whose neighbour correlation is ~0).
    neighbours = np.corrcoef(data[..., :-1].ravel(), data[..., 1:].ravel())[0, 1]
    assert neighbours > 0.8
    # Channels are correlated, as RGB of natural images are.
    red, green = data[:, 0].ravel(), data[:, 1].ravel()
    assert np.corrcoef(red, green)[0, 1] > 0.3


# ----------------------------------------------------------------------------- BERT-like builder


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_bert(tmp_path_factory.mktemp("bert") / "bert.onnx", seed=0)


def test_bert_has_encoder_structure_and_98_quantized_tensors(bert_path: Path) -> None:
    from quantbench.model.graph import calibration_tensors, open_graph

    model = onnx.load(bert_path)
    onnx.checker.check_model(model)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    inputs = {i.name: (i.type.tensor_type.elem_type, _dims(i)) for i in model.graph.input}
    assert inputs == {
        "input_ids": (onnx.TensorProto.INT64, ["batch", "sequence"]),
        "attention_mask": (onnx.TensorProto.INT64, ["batch", "sequence"]),
    }
    ops = Counter(n.op_type for n in model.graph.node)
    # 12 layers: q, k, v, scores, context, output, intermediate, output MatMul; 2 LN each + 1.
    assert ops["MatMul"] == 96 and ops["Gemm"] == 2 and ops["LayerNormalization"] == 25
    assert ops["Softmax"] == 12 and ops["Erf"] == 12 and ops["Gather"] >= 2
    # Quantized inputs by hand: per layer the LN output feeding q/k/v, Q, K, the softmax, V, the
    # merged context, the attention LN output, the GELU output (8); the pooler's and
    # classifier's inputs (2).
    assert len(calibration_tensors(open_graph(bert_path), "quantizable")) == 12 * 8 + 2


def test_bert_padding_is_masked_out(bert_path: Path) -> None:
    """A padded sample gives the logits of the same tokens fed alone, unpadded."""
    data = models.make_bert_data(4, 7)
    session = _session(bert_path)
    logits = session.run(["logits"], data)[0]
    assert logits.shape == (4, 2) and np.isfinite(logits).all()
    for i, length in enumerate(data["attention_mask"].sum(axis=1)):
        alone = {k: v[i : i + 1, :length] for k, v in data.items()}
        np.testing.assert_allclose(
            session.run(["logits"], alone)[0][0], logits[i], rtol=1e-4, atol=1e-4
        )


def test_bert_data_is_token_like_and_prefix_stable() -> None:
    data = models.make_bert_data(50, 3)
    assert set(data) == {"input_ids", "attention_mask"}
    ids, mask = data["input_ids"], data["attention_mask"]
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == (50, models.BERT_SEQUENCE)
    lengths = mask.sum(axis=1)
    for row, length in zip(mask, lengths, strict=True):
        assert row[:length].all() and not row[length:].any()  # padding at the end
    assert ((ids == models.PAD_ID) == (mask == 0)).all() and (ids[:, 0] == models.CLS_ID).all()
    assert len(set(lengths.tolist())) > 10  # varied lengths, some short
    words = ids[(mask == 1) & (ids >= models.FIRST_WORD_ID)]
    assert words.max() < models.BERT_VOCAB and np.mean(words < 1100) > 0.3  # Zipf: frequent head
    prefix = models.make_bert_data(5, 3)
    assert all((prefix[k] == data[k][:5]).all() for k in data)
