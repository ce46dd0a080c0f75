"""DWConv2D as an onnxruntime custom op: the op itself runs inside a session, not its lowering.

onnxruntime runs it through onnxruntime-extensions' Python custom ops (PyOp): a native custom op
would need onnxruntime's C/C++ API headers, which are not available here. The op computes on
``cpu`` (the numpy reference, :mod:`.reference`) or on ``cuda`` (the plugin's own CUDA kernels
through CuPy, :mod:`.cuda`). Importing :mod:`quantbench.plugins.dwconv2d` declares the PyOps
(when onnxruntime-extensions is installed: ``pip install 'quantbench[plugin]'``); a session gets
them from ``so.register_custom_ops_library(onnxruntime_extensions.get_library_path())``.

A session runs the model's *run form* (:func:`onnxruntime_form`, a rewritten copy; the user's
model and file are never changed), because a PyOp cannot take the node as the plugin contract
writes it (:mod:`.onnx_op`), as read from onnxruntime-extensions 0.15's source and checked:

* Domain: a PyOp lives in ``ai.onnx.contrib`` (``default_opset_domain()``) unless its op type is
  spelled ``domain::op``; the run form uses the ``quantbench`` domain (the project's own, as
  :func:`.onnx_op.checkable_copy` does) under op types of its own (:data:`RUN_OP_TYPES`), so a
  model that writes ``DWConv2D`` in the ``quantbench`` domain is never mistaken for the run form.
* Attributes: a PyOp declares scalar attributes only (int64, float, string), each one required;
  the contract's INTS (``strides``, ``pads``, ``dilations``) and its optional attributes become
  required scalars. A float attribute reaches Python as a 6-digit decimal string (0.0039215686
  arrives as 0.00392157), so the scales travel as exact strings.
* Inputs: every declared input is required: an absent bias becomes an empty one
  (``has_bias = 0``). One op type per type signature: float32 in and out; int8 X and W with
  float32 out; int8 X and W with int8 out (the INT8 plugin form).
* FP16: a float16 input or output aborts the process (onnxruntime-extensions rejects it with an
  exception nothing catches), so an FP16 DWConv2D runs as float32 between exact Casts: the op
  widens nothing it has not been given exactly and rounds its result once to float16 itself.
* Errors: an exception raised inside a PyOp aborts the process too. The op therefore never
  raises: it records the error, prints it in one line, and returns an empty output; the session
  helpers here (:class:`PluginSession`), and quantbench's own runners, raise it after the run
  (:func:`take_errors`). Shapes and attributes are checked when the run form is made, so only
  what the data alone decides (a dynamic batch, a CUDA failure) can fail inside.
* Outputs: the PyOp bridge copies a returned array element by element through a Python list
  (0.6 s for 4M values, measured); the op returns an object whose ``flatten().tolist()`` is the
  array itself, which the bridge then copies in one block.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import QuantbenchError, first_line
from quantbench.model import customops
from quantbench.model.graph import inferred_types
from quantbench.model.names import tensor_names, unique
from quantbench.plugins.dwconv2d import reference
from quantbench.plugins.dwconv2d.onnx_op import (
    CUSTOM_DOMAIN,
    DWConv2DSpec,
    _ensure_domain_import,
    checkable_copy,
    is_dwconv2d,
    validate_dwconv2d,
)

RUN_DOMAIN = CUSTOM_DOMAIN
#: run-form op types: float32 in and out (FP32, and FP16 between Casts); INT8 in, float32 out;
#: INT8 in and out
RUN_OP_TYPES = {"float": "DWConv2DOrt", "int8": "DWConv2DOrtInt8", "int8_out": "DWConv2DOrtInt8Out"}
DEVICES = ("cpu", "cuda")
EXTRA_HINT = "pip install 'quantbench[plugin]'"
_INT_ATTRS = (
    "stride_h", "stride_w", "pad_top", "pad_left", "pad_bottom", "pad_right",
    "dilation_h", "dilation_w", "group", "has_bias",
)  # fmt: skip
_STRING_ATTRS = ("precision", "device", "input_scale", "weight_scale", "output_scale", "node")


def extension_missing() -> str | None:
    """Why the op cannot run inside onnxruntime here (None: it can)."""
    try:
        import onnxruntime_extensions  # noqa: F401
    except ImportError:
        return f"onnxruntime-extensions is not installed ({EXTRA_HINT})"
    if _DECLARE_ERROR is not None:
        return f"onnxruntime-extensions did not take the op ({_DECLARE_ERROR})"
    return None


def library_path() -> str:
    """The custom-op library a session registers to run the op (onnxruntime-extensions')."""
    from onnxruntime_extensions import get_library_path

    return str(get_library_path())


def register_library(options: Any) -> None:
    """Let an onnxruntime ``SessionOptions`` run the op."""
    options.register_custom_ops_library(library_path())


# --------------------------------------------------------------------------- errors


_ERRORS: list[BaseException] = []
_ERRORS_LOCK = threading.Lock()


def _record(error: BaseException) -> None:
    with _ERRORS_LOCK:
        _ERRORS.append(error)


def take_errors() -> list[BaseException]:
    """The errors the op met since the last call (it cannot raise inside onnxruntime)."""
    with _ERRORS_LOCK:
        taken = list(_ERRORS)
        _ERRORS.clear()
    return taken


def raise_errors() -> None:
    """Raise the first error the op met in the runs since the last call (Ctrl-C as itself)."""
    errors = take_errors()
    for error in errors:
        if isinstance(error, KeyboardInterrupt):
            raise error
    if errors:
        raise QuantbenchError(first_line(errors[0])) from None


# --------------------------------------------------------------------------- the op


class _Output:
    """An output the PyOp bridge copies in one block (see the module docstring)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array)
        self.shape = self.array.shape

    def flatten(self) -> _Output:
        return self

    def tolist(self) -> np.ndarray:
        return self.array


def _attrs_of(values: dict[str, Any]) -> tuple[reference.ConvAttrs, str, str, bool]:
    ints = {name: int(values[name]) for name in _INT_ATTRS}
    conv = reference.ConvAttrs(
        strides=(ints["stride_h"], ints["stride_w"]),
        pads=(ints["pad_top"], ints["pad_left"], ints["pad_bottom"], ints["pad_right"]),
        dilations=(ints["dilation_h"], ints["dilation_w"]),
        group=ints["group"],
        input_scale=float(values["input_scale"]),
        weight_scale=float(values["weight_scale"]),
        output_scale=float(values["output_scale"]),
    )
    return conv, str(values["precision"]), str(values["device"]), bool(ints["has_bias"])


def compute(x: np.ndarray, w: np.ndarray, b: np.ndarray, **values: Any) -> np.ndarray:
    """One DWConv2D of the run form: ``values`` are its attributes; returns the output as the
    run form types it (float32, or int8 for the INT8-out op)."""
    conv, precision, device, has_bias = _attrs_of(values)
    bias = b if has_bias else None
    if precision == "f16":  # float32 holding float16 values (the run form's Casts)
        x, w = x.astype(np.float16), w.astype(np.float16)
        bias = None if bias is None else bias.astype(np.float16)
    if device == "cuda":
        from quantbench.plugins.dwconv2d import cuda

        y = cuda.forward(x, w, bias, conv, precision)
    else:
        y = reference.forward(x, w, bias, conv, precision)
    return y.astype(np.float32) if precision == "f16" else y


def _pyop(x: np.ndarray, w: np.ndarray, b: np.ndarray, **values: Any) -> _Output:
    """The PyOp body: :func:`compute`, never raising (an exception here aborts the process)."""
    try:
        return _Output(compute(x, w, b, **values))
    except BaseException as exc:  # noqa: BLE001 - recorded, raised after the run
        label = f"DWConv2D {values.get('node', '?')!r} ({values.get('device', '?')})"
        error = exc if isinstance(exc, KeyboardInterrupt) else QuantbenchError(
            f"{label}: {first_line(exc)}"
        )
        _record(error)
        if not customops.errors_collected():  # a plain session: never silent
            with contextlib.suppress(Exception):
                print(f"quantbench: {error}", file=sys.stderr)
        int8_out = float(values.get("output_scale", -1)) > 0 and values.get("precision") == "int8"
        return _Output(np.zeros((0, 0, 0, 0), np.int8 if int8_out else np.float32))


_DECLARED = False
_DECLARE_ERROR: str | None = None


def declare() -> bool:
    """Declare the run-form PyOps with onnxruntime-extensions (once; False without it, or when
    it refuses them: the reason then stands in :func:`extension_missing`, and the op is
    lowered; importing the plugin never fails on it)."""
    global _DECLARED, _DECLARE_ERROR
    if _DECLARED:
        return True
    if extension_missing():
        return False
    try:
        _declare()
    except Exception as exc:  # noqa: BLE001 - another version's API: lower, saying why
        _DECLARE_ERROR = first_line(exc)
        return False
    _DECLARED = True
    return True


def _declare() -> None:
    from onnxruntime_extensions import PyOp, onnx_op

    attrs = {name: PyOp.dt_int64 for name in _INT_ATTRS}
    attrs.update({name: PyOp.dt_string for name in _STRING_ATTRS})
    f32, i8 = PyOp.dt_float, PyOp.dt_int8
    signatures = {
        "float": ([f32, f32, f32], [f32]),
        "int8": ([i8, i8, f32], [f32]),
        "int8_out": ([i8, i8, f32], [i8]),
    }
    for key, (inputs, outputs) in signatures.items():
        op_type = f"{RUN_DOMAIN}::{RUN_OP_TYPES[key]}"
        onnx_op(op_type=op_type, inputs=inputs, outputs=outputs, attrs=attrs)(_pyop)


# --------------------------------------------------------------------------- the run form


def check_device(device: str) -> None:
    """A one-line error for a device that cannot run the op here (before any session)."""
    if device not in DEVICES:
        raise QuantbenchError(f"DWConv2D device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        from quantbench.plugins.dwconv2d import cuda

        cuda.check_available()


def _exact(value: float) -> str:
    """A float32 scale as a string that parses back to exactly it."""
    return repr(float(np.float32(value)))


_FLOAT_TYPES = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16"}


def _output_type(spec: DWConv2DSpec, x_type: int | None) -> int | None:
    if spec.int8_output:
        return TensorProto.INT8
    if spec.int8_input:
        return TensorProto.FLOAT
    return x_type if x_type in _FLOAT_TYPES else None


def _known_types(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], specs: dict[str, DWConv2DSpec]
) -> dict[str, int]:
    """Element types ONNX infers, DWConv2D outputs included: a DWConv2D stops ONNX inference,
    so its output type (from the contract) is declared and inference runs again, until the
    types behind every DWConv2D are known or nothing more can be learnt."""
    work = onnx.ModelProto()
    work.CopyFrom(checkable_copy(model))
    types: dict[str, int] = {}
    for _ in range(len(nodes) + 1):
        types = inferred_types(work)  # best effort: unknown types count as float32
        learnt = False
        for node in nodes:
            out = node.output[0]
            elem = _output_type(specs[out], types.get(node.input[0]))
            if out not in types and elem is not None:
                work.graph.value_info.append(helper.make_tensor_value_info(out, elem, None))
                learnt = True
        if not learnt:
            break
    return types


def _precision(spec: DWConv2DSpec, x_type: int | None, label: str) -> str:
    if spec.int8_input:
        if x_type not in (None, TensorProto.INT8):
            raise QuantbenchError(
                f"{label}: INT8 (input_scale > 0) takes int8 X, got "
                f"{TensorProto.DataType.Name(x_type)}"
            )
        return "int8"
    if x_type is not None and x_type not in _FLOAT_TYPES:
        raise QuantbenchError(
            f"{label}: X is {TensorProto.DataType.Name(x_type)}; DWConv2D takes float32, float16 "
            "or (with input_scale) int8"
        )
    return _FLOAT_TYPES.get(x_type or TensorProto.FLOAT, "f32")


def _run_nodes(
    node: onnx.NodeProto,
    spec: DWConv2DSpec,
    x_type: int | None,
    device: str,
    names: Callable[[str], str],
    no_bias: str,
) -> list[onnx.NodeProto]:
    """The run-form nodes standing for ``node`` (same output tensor)."""
    label = f"DWConv2D {node.name or node.output[0]!r}"
    precision = _precision(spec, x_type, label)
    base = node.name or node.output[0]
    x, w = node.input[0], node.input[1]
    has_bias = len(node.input) > 2 and bool(node.input[2])
    b = node.input[2] if has_bias else no_bias
    before: list[onnx.NodeProto] = []
    after: list[onnx.NodeProto] = []
    output = node.output[0]
    if precision == "f16":
        widened = []
        for tensor in (x, w, b) if has_bias else (x, w):
            wide = names(f"{tensor}/float32")
            before.append(
                helper.make_node(
                    "Cast", [tensor], [wide], name=names(f"{base}/widen"), to=TensorProto.FLOAT
                )
            )
            widened.append(wide)
        x, w = widened[0], widened[1]
        b = widened[2] if has_bias else no_bias
        output = names(f"{node.output[0]}/float32")
        after.append(
            helper.make_node(
                "Cast", [output], [node.output[0]], name=names(f"{base}/to_float16"),
                to=TensorProto.FLOAT16,
            )  # fmt: skip
        )
    key = "int8_out" if spec.int8_output else ("int8" if precision == "int8" else "float")
    (sh, sw), (dh, dw) = spec.strides, spec.dilations
    top, left, bottom, right = spec.pads
    op = helper.make_node(
        RUN_OP_TYPES[key],
        [x, w, b],
        [output],
        name=node.name or None,
        domain=RUN_DOMAIN,
        stride_h=sh, stride_w=sw, pad_top=top, pad_left=left, pad_bottom=bottom, pad_right=right,
        dilation_h=dh, dilation_w=dw, group=spec.group, has_bias=int(has_bias),
        precision=precision, device=device, node=node.name or node.output[0],
        input_scale=_exact(spec.input_scale), weight_scale=_exact(spec.weight_scale),
        output_scale=_exact(spec.output_scale),
    )  # fmt: skip
    return [*before, op, *after]


def onnxruntime_form(model: onnx.ModelProto, device: str = "cpu") -> onnx.ModelProto:
    """A copy of ``model`` whose DWConv2D nodes are the run-form op on ``device`` (``cpu``:
    the numpy reference; ``cuda``: the plugin's kernels), what a session with the library
    registered runs. Every node is validated first (one-line errors), the device too."""
    check_device(device)
    dw_nodes = [n for n in model.graph.node if is_dwconv2d(n)]
    if not dw_nodes:
        return model
    by_output = {n.output[0]: validate_dwconv2d(model, n) for n in dw_nodes}
    types = _known_types(model, dw_nodes, by_output)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = functools.partial(unique, tensor_names(out))  # fresh names, reserved
    no_bias = names("qb_dwconv2d_no_bias")
    nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        if is_dwconv2d(node):
            spec = by_output[node.output[0]]
            nodes.extend(_run_nodes(node, spec, types.get(node.input[0]), device, names, no_bias))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if any(no_bias in n.input for n in nodes):
        out.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), no_bias))
    _ensure_domain_import(out, RUN_DOMAIN)
    return out


# --------------------------------------------------------------------------- sessions


def session_options(options: Any = None) -> Any:
    """onnxruntime ``SessionOptions`` (``options`` or new) with the op's library registered;
    a one-line error when onnxruntime-extensions is missing."""
    if (reason := extension_missing()) or not declare():
        raise QuantbenchError(f"DWConv2D inside onnxruntime: {reason or extension_missing()}")
    options = options if options is not None else ort.SessionOptions()
    register_library(options)
    return options


class PluginSession(ort.InferenceSession):
    """An ``onnxruntime.InferenceSession`` over a model holding DWConv2D, run through the op:
    the run form is made from the model (the file is not changed), the library registered, and
    ``run`` raises what the op met (:func:`raise_errors`) instead of returning empty outputs."""

    def __init__(
        self,
        model: str | Path | onnx.ModelProto,
        device: str = "cpu",
        sess_options: Any = None,
        providers: Iterable[str] | None = None,
    ) -> None:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        form = onnxruntime_form(proto, device)
        super().__init__(
            form.SerializeToString(),
            sess_options=session_options(sess_options),
            providers=list(providers or ["CPUExecutionProvider"]),
        )

    def run(self, *args: Any, **kwargs: Any) -> Any:
        take_errors()  # a previous run's, already reported
        try:
            with customops.collecting():
                result = super().run(*args, **kwargs)
        except Exception:
            raise_errors()  # the op's own error explains onnxruntime's
            raise
        raise_errors()
        return result


def make_session(
    model: str | Path | onnx.ModelProto, device: str = "cpu", **kwargs: Any
) -> PluginSession:
    """:class:`PluginSession` over ``model`` with DWConv2D on ``device`` (``cpu`` or ``cuda``)."""
    return PluginSession(model, device, **kwargs)
