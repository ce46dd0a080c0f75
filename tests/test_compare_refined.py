"""compare against a refined Q/DQ model: equalization rescales the tensors between its conv
pairs per channel (same names, other values), so layer by layer against the *unrefined* FP32
model those tensors, and the ops reading or writing them, compare unlike values (mtcnn-pnet
showed isolated SQNRs of 2.5-11.6 dB and "clips 19.69 %" for a model whose outputs agree at
22.7 dB). They are left out there and shown against the refined FP32 model
(``quantize --refined-model``). Expected sets come from the model's own refinement record and
from the graph, never from compare."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_example

from quantbench.compare import compare
from quantbench.quantize import quantize
from quantbench.refine import RECORD_KEY, REFINED_KEY


@pytest.fixture(scope="module")
def refined(tmp_path_factory) -> tuple[Path, Path, dict]:
    """tinycnn quantized with equalization: (the Q/DQ model, the refined FP32 model, the
    refinement record it carries)."""
    example = require_example()
    folder = tmp_path_factory.mktemp("refined")
    qdq, fp32 = folder / "refined.onnx", folder / "refined.fp32.onnx"
    quantize(
        example / "tinycnn.onnx", qdq, data=example / "calib.npz", refine="equalize",
        refined_model=fp32, show_progress=False,
    )  # fmt: skip
    stored = {p.key: p.value for p in onnx.load(qdq).metadata_props}
    return qdq, fp32, json.loads(stored[RECORD_KEY])


def _compare(candidate: Path, reference: Path) -> dict:
    example = require_example()
    return compare(
        "fp32", str(candidate), model=reference, data=example / "eval.npz", latency=False,
        show_progress=False,
    )  # fmt: skip


def _rows(doc: dict, view: str) -> dict[str, dict]:
    return {r["tensor"]: r for r in doc["layers"] if r["view"] == view and r["candidate"] == "B"}


def _touching(model: onnx.ModelProto, rescaled: set[str]) -> set[str]:
    """Outputs of the ops that read or write a rescaled tensor (by the graph)."""
    return {
        o for n in model.graph.node
        if rescaled & set(n.output) or rescaled & set(n.input) for o in n.output
    }  # fmt: skip


def test_the_record_names_the_rescaled_tensors(refined):
    _, _, record = refined
    assert any(k.startswith("equalize") for k in record["kept"])  # else nothing to check
    assert record["rescaled"]


def test_against_the_unrefined_model_rescaled_layers_are_left_out(refined, capsys):
    qdq, _, record = refined
    example = require_example()
    doc = _compare(qdq, example / "tinycnn.onnx")
    rescaled = set(record["rescaled"])
    assert not rescaled & set(_rows(doc, "accumulated"))
    original = onnx.load(example / "tinycnn.onnx")
    touched = _touching(original, rescaled)
    assert not touched & set(_rows(doc, "isolated"))
    nodes = {n.name for n in original.graph.node if touched & set(n.output)}
    assert not any(f.get("tensor") in touched or f.get("node") in nodes for f in doc["flags"])
    assert "channel-rescaled values" in capsys.readouterr().err


def test_against_the_refined_fp32_model_every_layer_is_compared(refined, tmp_path):
    """With the refined FP32 model as the reference, the rescaled tensors are compared, and
    their isolated SQNRs are those of quantization (well above the unlike values the same
    model's layers give against the unrefined FP32 model when nothing is left out)."""
    qdq, fp32, record = refined
    rescaled = set(record["rescaled"])
    doc = _compare(qdq, fp32)
    accumulated, isolated = _rows(doc, "accumulated"), _rows(doc, "isolated")
    assert rescaled & set(accumulated)
    touched = _touching(onnx.load(fp32), rescaled)
    assert touched & set(isolated)
    # the same Q/DQ model without its record, against the unrefined model: nothing left out
    model = onnx.load(qdq)
    for prop in list(model.metadata_props):
        if prop.key in (RECORD_KEY, REFINED_KEY):
            model.metadata_props.remove(prop)
    bare = tmp_path / "bare.onnx"
    onnx.save(model, bare)
    unlike = _rows(_compare(bare, require_example() / "tinycnn.onnx"), "isolated")
    worse = [t for t in touched & set(isolated) & set(unlike)
             if unlike[t]["sqnr_db"] < isolated[t]["sqnr_db"] - 3]  # fmt: skip
    assert worse, "unlike values should score far below the refined reference's"


def test_a_record_from_before_the_list_is_warned_about(refined, tmp_path, capsys):
    """A model refined by an earlier quantbench (its record lacks ``rescaled``): compare cannot
    tell which layers moved, and says so instead of showing them as if they were alike."""
    qdq, _, record = refined
    model = onnx.load(qdq)
    old = {k: v for k, v in record.items() if k != "rescaled"}
    for prop in model.metadata_props:
        if prop.key == RECORD_KEY:
            prop.value = json.dumps(old)
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    _compare(path, require_example() / "tinycnn.onnx")
    assert "does not list the tensors it rescaled" in capsys.readouterr().err


def test_a_smoothed_model_with_an_inserted_mul_compares(tmp_path):
    """Smoothing a LayerNorm output that also feeds a residual Add inserts ``Mul(x, 1/s)``:
    the projection's quantized input is then a tensor the FP32 model lacks (``x_smooth``).
    compare used to ask the FP32 model for it (an internal error: "Graph output ... does not
    exist"); it now compares the outputs and the layers both models have."""
    from test_refine_smooth import residual_model, source

    from quantbench.refine import mark_refined
    from quantbench.refine.smooth import smooth

    model = residual_model()
    refined = smooth(model, source(model))
    assert refined.changed and refined.rescaled == []  # the Mul variant: x keeps its values
    fp32, refined_path = tmp_path / "fp32.onnx", tmp_path / "smoothed.fp32.onnx"
    onnx.save(model, fp32)
    onnx.save(refined.model, refined_path)
    rng = np.random.default_rng(5)
    h = rng.standard_normal((12, 5, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", h=h)
    qdq = tmp_path / "smoothed.int8.onnx"
    quantize(refined_path, qdq, data=tmp_path / "d.npz", method="minmax", refine="none",
             show_progress=False)  # fmt: skip
    out = onnx.load(qdq)
    mark_refined(out, ["smooth:0.5"], {"kept": ["smooth:0.5"], "rescaled": refined.rescaled})
    onnx.save(out, qdq)
    doc = compare("fp32", str(qdq), model=fp32, data=tmp_path / "d.npz", latency=False,
                  show_progress=False)  # fmt: skip
    assert [o["name"] for o in doc["outputs"] if o["candidate"] == "B"] == ["y"]
    assert "x_smooth" not in {r["tensor"] for r in doc["layers"]}
