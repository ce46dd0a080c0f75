"""Engine-inspector parsing and layer -> ONNX mapping, on the real TensorRT outputs saved in
../shared/fixtures/trt_engine_inspector (NVIDIA/TensorRT trex test inputs: a QAT MobileNetV2 INT8
engine and its trtexec profile); every expected number below was read off those files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from onnx import helper

from quantbench.backends.trt.inspector import (
    comparable_tensors,
    engine_bindings,
    engine_layers,
    join_profile,
    map_layers_to_onnx,
    metadata_onnx_nodes,
    parse_layer_name,
    parse_precision,
    parse_profile,
    precision_counts,
)
from quantbench.errors import QuantbenchError

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "trt_engine_inspector"
STEM = "mobilenet_v2_residuals.qat.onnx.engine"
needs_fixtures = pytest.mark.skipif(
    not (FIXTURES / f"{STEM}.graph.json").is_file(),
    reason=f"engine-inspector fixtures not found in {FIXTURES}",
)


@pytest.fixture(scope="module")
def graph():
    return json.loads((FIXTURES / f"{STEM}.graph.json").read_text())


@pytest.fixture(scope="module")
def layers(graph):
    return engine_layers(graph)


@pytest.fixture(scope="module")
def profile():
    return parse_profile((FIXTURES / f"{STEM}.profile.json").read_text())


def _fake_mobilenet_onnx():
    """Names only (never run): nodes/initializers/tensors as TensorRT quotes them in the fixture,
    plus DequantizeLinear nodes that the fused names do not mention."""
    init = helper.make_tensor
    nodes = [
        helper.make_node(
            "QuantizeLinear", ["inputs.1", "s", "z"], ["433"], name="QuantizeLinear_2"
        ),
        helper.make_node("DequantizeLinear", ["433", "s", "z"], ["434"], name="DequantizeLinear_4"),
        helper.make_node(
            "QuantizeLinear", ["features.0.0.weight", "s", "z"], ["440"], name="QuantizeLinear_7"
        ),
        helper.make_node("DequantizeLinear", ["440", "s", "z"], ["441"], name="DequantizeLinear_8"),
        helper.make_node("Conv", ["434", "441"], ["442"], name="Conv_9"),
        helper.make_node("Clip", ["442"], ["449"], name="Clip_13"),
        helper.make_node("GlobalAveragePool", ["1281"], ["1282"], name="GlobalAveragePool_747"),
        helper.make_node("QuantizeLinear", ["1282", "s", "z"], ["1292"], name="QuantizeLinear_757"),
        helper.make_node(
            "QuantizeLinear", ["classifier.1.weight", "s", "z"], ["1298"], name="QuantizeLinear_762"
        ),
        helper.make_node("Gemm", ["1292", "1298", "classifier.1.bias"], ["1304"], name="Gemm_764"),
    ]
    initializers = [
        init(n, 1, [1], [0.0])
        for n in ("features.0.0.weight", "classifier.1.weight", "classifier.1.bias", "s")
    ]
    graph = helper.make_graph(
        nodes,
        "names_only",
        [helper.make_tensor_value_info("inputs.1", 1, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("1304", 1, [1, 1000])],
        initializer=initializers,
    )
    return helper.make_model(graph)


# -- the real inspector output -------------------------------------------------------------------


@needs_fixtures
def test_every_layer_parses(graph, layers):
    assert len(layers) == 58
    assert [layer.index for layer in layers] == list(range(58))
    assert all(layer.name and layer.outputs for layer in layers)
    assert sum(len(layer.inputs) == 2 for layer in layers) == 10  # the residual Adds
    assert Counter(layer.layer_type for layer in layers) == {
        "CaskConvolution": 34,
        "CudaDepthwiseConvolution": 17,
        "Reformat": 3,
        "FusedConvActConvolution": 2,
        "TiledPooling": 1,
        "NoOp": 1,
    }
    assert engine_bindings(graph) == ["inputs.1", "1304"]
    first = layers[1]
    assert first.outputs[0].name == "449" and first.outputs[0].dimensions == (1, 32, 112, 112)
    assert first.tactic == "volta_int8x4_icudnn_int8x4_128x32_relu_xregs_small_c32_nn_v1"
    assert layers[0].origin == "QDQ"


@needs_fixtures
def test_precision_counts(layers):
    assert precision_counts(layers, "input") == {"int8": 53, "fp16": 3, "fp32": 2}
    assert precision_counts(layers, "output") == {"int8": 53, "fp16": 3, "fp32": 2}
    changes = [
        (layer.index, layer.input_precision, layer.output_precision)
        for layer in layers
        if layer.input_precision != layer.output_precision
    ]
    assert changes == [
        (0, "fp32", "int8"),
        (52, "int8", "fp16"),
        (55, "fp16", "int8"),
        (56, "int8", "fp32"),
    ]


@needs_fixtures
def test_profile_matches_layers_one_to_one(layers, profile):
    assert profile.count == 8657
    assert [t.name for t in profile.layers] == [layer.name for layer in layers]
    joined = join_profile(layers, profile)
    assert len(joined.matched) == 58
    assert joined.layers_without_timing == () and joined.timings_without_layer == ()
    assert joined.matched[0][1].average_ms == pytest.approx(0.00455183)
    assert joined.matched[0][1].median_ms == pytest.approx(0.004384)
    slowest_layer, slowest = max(joined.matched, key=lambda pair: pair[1].average_ms)
    assert slowest_layer.name == "features.17.conv.2.weight + QuantizeLinear_729 + Conv_731"
    assert slowest.average_ms == pytest.approx(0.0101366)
    assert profile.layers[-1].average_ms == 0  # the NoOp squeeze
    assert profile.total_average_ms == pytest.approx(0.355921, abs=1e-6)


@needs_fixtures
def test_fused_names_split_into_onnx_candidates(layers):
    tokens = [t for layer in layers for t in parse_layer_name(layer.name).candidates]
    kinds = Counter(
        "initializer" if t.endswith((".weight", ".bias")) else t.rsplit("_", 1)[0] for t in tokens
    )
    assert kinds == {
        "QuantizeLinear": 55,
        "initializer": 54,
        "Conv": 52,
        "Clip": 35,
        "Add": 10,
        "GlobalAveragePool": 1,
        "Gemm": 1,
    }
    assert len(tokens) == len(set(tokens)) == 208  # no ONNX name claimed by two layers
    parts = parse_layer_name(layers[1].name)
    assert parts.candidates == ("features.0.0.weight", "QuantizeLinear_7", "Conv_9", "Clip_13")
    assert parts.trt_parts == ()


@needs_fixtures
def test_mapping_against_an_onnx_model(layers):
    mappings = {m.name: m for m in map_layers_to_onnx(layers, _fake_mobilenet_onnx())}
    conv = mappings["features.0.0.weight + QuantizeLinear_7 + Conv_9 + PWN(Clip_13)"]
    assert conv.onnx_nodes == ("QuantizeLinear_7", "Conv_9", "Clip_13")
    assert conv.initializers == ("features.0.0.weight",)
    assert conv.unmatched == () and conv.source == "name"
    (out,) = conv.outputs
    assert (out.name, out.precision, out.onnx_tensor, out.onnx_producer) == (
        "449",
        "int8",
        True,
        "Clip_13",
    )

    reformat = mappings["Reformatting CopyNode for Input Tensor 0 to GlobalAveragePool_747"]
    assert reformat.kind == "reformat" and reformat.onnx_nodes == ()
    assert reformat.related_nodes == ("GlobalAveragePool_747",)
    assert reformat.outputs[0].onnx_tensor is False and reformat.outputs[0].precision == "fp16"

    gemm = mappings[next(n for n in mappings if n.startswith("classifier.1.weight"))]
    assert gemm.onnx_nodes == ("QuantizeLinear_762", "Gemm_764")
    assert gemm.initializers == ("classifier.1.weight", "classifier.1.bias")
    assert gemm.trt_parts == (
        "(Unnamed Layer* 802) [Shuffle]",
        "unsqueeze_node_after_classifier.1.bias",
        "(Unnamed Layer* 802) [Shuffle]_(Unnamed Layer* 802) [Shuffle]_output",
        "(Unnamed Layer* 803) [ElementWise]",
    )
    assert gemm.outputs[0].onnx_tensor is False  # "(Unnamed Layer* 803) [ElementWise]_out_tensor"

    squeeze = mappings["copied_squeeze_after_(Unnamed Layer* 803) [ElementWise]"]
    assert squeeze.onnx_nodes == () and squeeze.outputs[0].onnx_producer == "Gemm_764"

    # Layers whose ONNX nodes are not in the names-only model are reported, never guessed.
    later = mappings["features.1.conv.1.weight + QuantizeLinear_35 + Conv_37"]
    assert later.onnx_nodes == () and later.unmatched == (
        "features.1.conv.1.weight",
        "QuantizeLinear_35",
        "Conv_37",
    )


@needs_fixtures
def test_comparable_tensors_are_only_what_the_engine_writes(layers):
    mappings = map_layers_to_onnx(layers, _fake_mobilenet_onnx())
    tensors = comparable_tensors(mappings)
    assert [(t.name, t.precision) for t in tensors] == [
        ("433", "int8"),
        ("449", "int8"),
        ("1282", "fp16"),
        ("1292", "int8"),
        ("1304", "fp32"),
    ]
    # "434", "441", "442" exist in ONNX but no engine layer writes them (fused away).
    assert not {"434", "441", "442"} & {t.name for t in tensors}
    assert comparable_tensors(map_layers_to_onnx(layers)) == []  # unknown without a model


@needs_fixtures
def test_without_a_model_candidates_are_returned(layers):
    mapping = map_layers_to_onnx(layers[:2])[1]
    assert mapping.onnx_nodes == ("features.0.0.weight", "QuantizeLinear_7", "Conv_9", "Clip_13")
    assert mapping.outputs[0].onnx_tensor is None


# -- other shapes of inspector output ------------------------------------------------------------


def test_layer_names_only_form():
    layers = engine_layers(json.dumps({"Layers": ["Conv_0 + Relu_1", "Gemm_2"], "Bindings": []}))
    assert [layer.name for layer in layers] == ["Conv_0 + Relu_1", "Gemm_2"]
    assert layers[0].inputs == () and layers[0].input_precision is None
    assert [m.onnx_nodes for m in map_layers_to_onnx(layers)] == [("Conv_0", "Relu_1"), ("Gemm_2",)]


def test_metadata_wins_over_the_name():
    raw = {
        "Layers": [
            {
                "Name": "/backbone/conv1/Conv + /backbone/act/Relu",
                "LayerType": "CaskConvolution",
                "Metadata": "[ONNX Layer: /backbone/conv1/Conv]\x1f"
                "[ONNX Layer: /backbone/act/Relu]",
                "Inputs": [{"Name": "x", "Format/Datatype": "Half"}],
                "Outputs": [{"Name": "/backbone/act/Relu_output_0", "Format/Datatype": "Float"}],
            }
        ]
    }
    (layer,) = engine_layers(raw)
    assert layer.metadata_nodes == ("/backbone/conv1/Conv", "/backbone/act/Relu")
    assert (layer.input_precision, layer.output_precision) == ("fp16", "fp32")
    (mapping,) = map_layers_to_onnx([layer])
    assert mapping.source == "metadata"
    assert mapping.onnx_nodes == ("/backbone/conv1/Conv", "/backbone/act/Relu")
    assert metadata_onnx_nodes("[ONNX Layer: a]\x1e[ONNX Layer: b]junk") == ("a",)


def test_foreign_node_region_and_nested_pointwise():
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"n{i}") for i in range(5)]
    nodes.append(helper.make_node("Relu", ["t5"], ["t6"]))  # unnamed: TensorRT says node_of_t6
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("t0", 1, [1])],
            [helper.make_tensor_value_info("t6", 1, [1])],
        )
    )
    layers = engine_layers(
        {
            "Layers": [
                {"Name": "{ForeignNode[n1...n3]}", "Outputs": [{"Name": "t4"}]},
                {"Name": "PWN(PWN(n4, node_of_t6), n0)", "Outputs": [{"Name": "t6"}]},
            ]
        }
    )
    foreign, pointwise = map_layers_to_onnx(layers, model)
    assert foreign.kind == "foreign" and foreign.onnx_nodes == ("n1", "n2", "n3")
    assert pointwise.onnx_nodes == ("n4", "node_of_t6", "n0")
    assert pointwise.outputs[0].onnx_producer == "node_of_t6"


def test_reformat_of_an_output_tensor():
    parts = parse_layer_name(
        "Reformatting CopyNode for Output Tensor 0 to Conv_27 + Add_28 + Relu_29"
    )
    assert parts.kind == "reformat" and parts.direction == "Output"
    assert parts.related == ("Conv_27", "Add_28", "Relu_29") and parts.candidates == ()
    helper_layer = parse_layer_name("reshape_after_Gemm_48")
    assert helper_layer.candidates == () and helper_layer.related == ("Gemm_48",)


@pytest.mark.parametrize(
    ("text", "precision"),
    [
        ("Thirty-two wide channel vectorized row major Int8 format", "int8"),
        ("Two wide channel vectorized row major FP16 format", "fp16"),
        ("Row major linear FP32", "fp32"),
        ("Channel major INT8 format where channel % 16 == 0", "int8"),
        ("Row major linear BFloat16 format", "bf16"),
        ("Row major linear UInt8 format", "uint8"),
        ("Row major linear Int32", "int32"),
        ("Row major linear BOOL", "bool"),
        ("Row major linear FP8 format", "fp8"),
        ("Half", "fp16"),
        ("Float", "fp32"),
        ("Unknown format", None),
        (None, None),
    ],
)
def test_parse_precision(text, precision):
    assert parse_precision(text) == precision


def test_malformed_inputs_are_named():
    with pytest.raises(QuantbenchError, match="no 'Layers'"):
        engine_layers({"layers": []})
    with pytest.raises(QuantbenchError, match="not JSON"):
        engine_layers("Name: Conv_0")
    with pytest.raises(QuantbenchError, match="layer #0 has no 'Name'"):
        engine_layers({"Layers": [{"LayerType": "Conv"}]})
    with pytest.raises(QuantbenchError, match="neither 'name' nor 'count'"):
        parse_profile([{"count": 1}, {"timeMs": 1.0}])
    with pytest.raises(QuantbenchError, match="no 'averageMs'"):
        parse_profile([{"name": "a"}])


def test_join_profile_reports_both_sides():
    layers = engine_layers({"Layers": ["a", "b", "a"]})
    profile = parse_profile(
        [
            {"count": 3},
            {"name": "a", "averageMs": 1.0},
            {"name": "a", "averageMs": 2.0},
            {"name": "c", "averageMs": 3.0},
        ]
    )
    joined = join_profile(layers, profile)
    assert [(layer.index, t.average_ms) for layer, t in joined.matched] == [(0, 1.0), (2, 2.0)]
    assert joined.layers_without_timing == ("b",) and joined.timings_without_layer == ("c",)
