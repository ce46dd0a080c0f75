"""Custom ONNX ops that plugins add (DWConv2D): the hook through which the core handles them.

The core checks models (onnx.checker) and runs them (onnxruntime) without knowing any plugin:
a plugin depends on the core and registers a :class:`CustomOp` here, saying how to make a model
holding its op checkable and how to lower it to standard ONNX. Bundled plugins are found by the
op type they provide (:data:`BUNDLED`, the in-tree equivalent of an entry point) and imported
only when a model contains that op, so the dependency goes plugin -> core, never the reverse.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import onnx

ModelRewrite = Callable[[onnx.ModelProto], onnx.ModelProto]

#: op type -> module of the bundled plugin that registers it on import.
BUNDLED = {"DWConv2D": "quantbench.plugins.dwconv2d"}


@dataclass(frozen=True)
class CustomOp:
    """What the core needs to know about a plugin op; both functions return a new model."""

    op_type: str
    checkable: ModelRewrite  # a copy onnx.checker accepts
    lowered: ModelRewrite  # standard ONNX that onnxruntime runs


_REGISTRY: dict[str, CustomOp] = {}


def register(op: CustomOp) -> None:
    """Called by a plugin when imported."""
    _REGISTRY[op.op_type] = op


def ops_in(model: onnx.ModelProto) -> list[CustomOp]:
    """The registered custom ops ``model`` uses (importing bundled plugins on first need)."""
    found = []
    for op_type in dict.fromkeys(n.op_type for n in model.graph.node):
        if op_type not in _REGISTRY and op_type in BUNDLED:
            importlib.import_module(BUNDLED[op_type])
        if op_type in _REGISTRY:
            found.append(_REGISTRY[op_type])
    return found


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy onnx.checker accepts when it holds plugin ops."""
    for op in ops_in(model):
        model = op.checkable(model)
    return model


def lowered(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy in standard ONNX when it holds plugin ops (what onnxruntime runs)."""
    for op in ops_in(model):
        model = op.lowered(model)
    return model
