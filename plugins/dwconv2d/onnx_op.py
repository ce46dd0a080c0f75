"""The DWConv2D ONNX op: a grouped 2-D convolution whose kernel may be a runtime tensor, one per
sample if need be, run in TensorRT by quantbench's DWConv2D plugin.

Contract with the TensorRT plugin (same folder, C++):

* ``op_type = "DWConv2D"``; the TensorRT ONNX parser has no builtin importer for it and hands it
  to the fallback plugin importer, which looks the creator up by op_type, the ``plugin_version``
  attribute ("1") and the ``plugin_namespace`` attribute ("quantbench") (reference section 5.4).
* inputs: X ``[N, C, H, W]``; W ``[K, C/group, kH, kW]`` (shared) or ``[N, K, C/group, kH, kW]``
  (per sample); optional bias ``[K]`` or ``[N, K]``. Output ``[N, K, Ho, Wo]``.
* attributes: ``strides`` (2 ints), ``pads`` (4 ints, ONNX order h_begin, w_begin, h_end,
  w_end), ``dilations`` (2 ints), ``group`` (int), and for the INT8 plugin ``input_scale``,
  ``weight_scale``, ``output_scale`` (floats; <= 0 means that side is not INT8).

The node is written in the default domain by default, as agreed with the plugin side. The ONNX
checker rejects unknown ops of the default domain, so :func:`checkable_copy` moves them into the
``quantbench`` domain on a copy before checking; pass ``domain="quantbench"`` to the builders to
write that form for real (the TensorRT parser ignores the domain).

onnxruntime cannot run the op; :func:`dwconv2d_to_conv` lowers it to standard ONNX for the FP32
reference, folding per-sample kernels into a grouped convolution over ``[1, N*C, H, W]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, shape_inference

from quantbench.errors import QuantbenchError
from quantbench.model.graph import Graph, open_graph
from quantbench.model.names import UniqueNames

OP_TYPE = "DWConv2D"
DEFAULT_DOMAIN = ""
CUSTOM_DOMAIN = "quantbench"
PLUGIN_NAMESPACE = "quantbench"
PLUGIN_VERSION = "1"
SCALE_ATTRIBUTES = ("input_scale", "weight_scale", "output_scale")
_INT_LIST_ATTRIBUTES = {"strides": 2, "pads": 4, "dilations": 2}
ATTRIBUTES = (
    *_INT_LIST_ATTRIBUTES,
    "group",
    *SCALE_ATTRIBUTES,
    "plugin_namespace",
    "plugin_version",
)
NOT_INT8 = -1.0

Dim = int | str | None


@dataclass(frozen=True)
class DWConv2DSpec:
    """A validated DWConv2D node: attributes plus what its shapes say (None = unknown)."""

    name: str
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    group: int
    input_scale: float
    weight_scale: float
    output_scale: float
    weight_shape: tuple[Dim, ...] | None
    bias_shape: tuple[Dim, ...] | None

    @property
    def per_batch(self) -> bool:
        return self.weight_shape is not None and len(self.weight_shape) == 5

    @property
    def int8_input(self) -> bool:
        return self.input_scale > 0

    @property
    def int8_output(self) -> bool:
        return self.output_scale > 0


def is_dwconv2d(node: onnx.NodeProto | gs.Node) -> bool:
    """Recognised by op_type in any domain, as the TensorRT parser does."""
    return (node.op_type if isinstance(node, onnx.NodeProto) else node.op) == OP_TYPE


def make_dwconv2d_node(
    x: str,
    weight: str,
    output: str,
    bias: str | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    group: int = 1,
    input_scale: float = NOT_INT8,
    weight_scale: float = NOT_INT8,
    output_scale: float = NOT_INT8,
    name: str = "",
    domain: str = DEFAULT_DOMAIN,
) -> onnx.NodeProto:
    """A DWConv2D node carrying every attribute the plugin creator reads."""
    return helper.make_node(
        OP_TYPE,
        [x, weight] + ([bias] if bias else []),
        [output],
        name=name or None,
        domain=domain,
        strides=[int(s) for s in strides],
        pads=[int(p) for p in pads],
        dilations=[int(d) for d in dilations],
        group=int(group),
        input_scale=float(input_scale),
        weight_scale=float(weight_scale),
        output_scale=float(output_scale),
        plugin_namespace=PLUGIN_NAMESPACE,
        plugin_version=PLUGIN_VERSION,
    )


# --------------------------------------------------------------------------- validation


def validate_dwconv2d(graph: Graph | onnx.ModelProto, node: onnx.NodeProto) -> DWConv2DSpec:
    """Check attributes and the shapes ONNX can infer; any inconsistency names the node."""
    model = graph.model if isinstance(graph, Graph) else graph
    label = f"DWConv2D {node.name or node.output[0]!r}"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    _check_arity(node, label)
    _check_attribute_names(attrs, label)
    ints = {
        name: _int_list(attrs, name, length, label) for name, length in _INT_LIST_ATTRIBUTES.items()
    }
    group = attrs.get("group", 1)
    if not isinstance(group, int) or group < 1:
        raise QuantbenchError(f"{label}: group must be a positive integer, got {group!r}")
    scales = {name: _float_attr(attrs, name, label) for name in SCALE_ATTRIBUTES}
    if (scales["input_scale"] > 0) != (scales["weight_scale"] > 0):
        raise QuantbenchError(
            f"{label}: INT8 input needs both input_scale and weight_scale > 0 (got "
            f"{scales['input_scale']} and {scales['weight_scale']})"
        )
    if scales["output_scale"] > 0 and scales["input_scale"] <= 0:
        raise QuantbenchError(
            f"{label}: output_scale > 0 (INT8 output) needs INT8 input too (input_scale and "
            "weight_scale > 0); the plugin has no FP-in/INT8-out mode"
        )
    for name in ("plugin_namespace", "plugin_version"):
        if name in attrs and not isinstance(attrs[name], bytes | str):
            raise QuantbenchError(f"{label}: {name} must be a string")
    shapes = tensor_shapes(model)
    x_shape = shapes.get(node.input[0])
    w_shape = shapes.get(node.input[1])
    b_shape = shapes.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    _check_shapes(label, x_shape, w_shape, b_shape, group)
    return DWConv2DSpec(
        name=node.name,
        strides=tuple(ints["strides"]),  # type: ignore[arg-type]
        pads=tuple(ints["pads"]),  # type: ignore[arg-type]
        dilations=tuple(ints["dilations"]),  # type: ignore[arg-type]
        group=group,
        weight_shape=w_shape,
        bias_shape=b_shape,
        **scales,
    )


def _check_arity(node: onnx.NodeProto, label: str) -> None:
    if len(node.input) not in (2, 3) or not node.input[0] or not node.input[1]:
        raise QuantbenchError(
            f"{label}: needs inputs (X, W) or (X, W, bias), got {list(node.input)}"
        )
    if len(node.output) != 1:
        raise QuantbenchError(f"{label}: has one output, got {len(node.output)}")


def _check_attribute_names(attrs: dict[str, object], label: str) -> None:
    unknown = sorted(set(attrs) - set(ATTRIBUTES))
    if unknown:
        raise QuantbenchError(
            f"{label}: unknown attributes {', '.join(unknown)}; the plugin reads only "
            f"{', '.join(ATTRIBUTES)}"
        )


def _int_list(attrs: dict[str, object], name: str, length: int, label: str) -> list[int]:
    default = [0] * length if name == "pads" else [1] * length
    value = attrs.get(name, default)
    if (
        not isinstance(value, list)
        or len(value) != length
        or not all(isinstance(v, int) for v in value)
    ):
        raise QuantbenchError(f"{label}: {name} must be {length} ints, got {value!r}")
    if name == "pads" and min(value) < 0:
        raise QuantbenchError(f"{label}: pads must be >= 0, got {value}")
    if name != "pads" and min(value) < 1:
        raise QuantbenchError(f"{label}: {name} must be >= 1, got {value}")
    return value


def _float_attr(attrs: dict[str, object], name: str, label: str) -> float:
    value = attrs.get(name, NOT_INT8)
    if not isinstance(value, float | int) or not np.isfinite(value):
        raise QuantbenchError(f"{label}: {name} must be a finite float, got {value!r}")
    return float(value)


def _check_shapes(
    label: str,
    x: tuple[Dim, ...] | None,
    w: tuple[Dim, ...] | None,
    b: tuple[Dim, ...] | None,
    group: int,
) -> None:
    if x is not None and len(x) != 4:
        raise QuantbenchError(f"{label}: input X must be [N, C, H, W], got rank {len(x)}")
    if w is not None and len(w) not in (4, 5):
        raise QuantbenchError(
            f"{label}: kernel must be [K, C/group, kH, kW] or [N, K, C/group, kH, kW], got rank "
            f"{len(w)}"
        )
    if w is None:
        return
    k, c_per_group = w[-4], w[-3]
    channels = x[1] if x is not None else None
    if isinstance(channels, int) and channels % group:
        raise QuantbenchError(
            f"{label}: group {group} does not divide the input channels C={channels}"
        )
    if isinstance(k, int) and k % group:
        raise QuantbenchError(f"{label}: group {group} does not divide the output channels K={k}")
    if (
        isinstance(channels, int)
        and isinstance(c_per_group, int)
        and c_per_group * group != channels
    ):
        raise QuantbenchError(
            f"{label}: kernel channel dim is {c_per_group} but C/group = {channels}/{group} = "
            f"{channels // group}"
        )
    batch = x[0] if x is not None else None
    if len(w) == 5 and isinstance(batch, int) and isinstance(w[0], int) and batch != w[0]:
        raise QuantbenchError(f"{label}: per-sample kernel has N={w[0]} but X has N={batch}")
    if b is not None:
        _check_bias(label, b, k, batch if batch is not None else (w[0] if len(w) == 5 else None))


def _check_bias(label: str, b: tuple[Dim, ...], k: Dim, batch: Dim) -> None:
    if len(b) not in (1, 2):
        raise QuantbenchError(f"{label}: bias must be [K] or [N, K], got rank {len(b)}")
    if isinstance(k, int) and isinstance(b[-1], int) and b[-1] != k:
        raise QuantbenchError(f"{label}: bias has {b[-1]} values per sample but K={k}")
    if len(b) == 2 and isinstance(batch, int) and isinstance(b[0], int) and b[0] != batch:
        raise QuantbenchError(f"{label}: bias is [N, K] with N={b[0]} but the batch is {batch}")


def tensor_shapes(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Every shape ONNX knows or can infer (unknown custom ops stop inference downstream)."""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - best effort
        inferred = model
    shapes: dict[str, tuple[Dim, ...]] = {}
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[v.name] = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in t.shape.dim
            )
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
    for node in g.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    shapes[node.output[0]] = tuple(a.t.dims)
    return shapes


def checkable_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy onnx.checker accepts: default-domain DWConv2D nodes moved to a custom domain."""
    if not any(is_dwconv2d(n) and n.domain == DEFAULT_DOMAIN for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if is_dwconv2d(node) and node.domain == DEFAULT_DOMAIN:
            node.domain = CUSTOM_DOMAIN
    _ensure_domain_import(copy, CUSTOM_DOMAIN)
    return copy


def _ensure_domain_import(model: onnx.ModelProto, domain: str) -> None:
    if domain and not any(imp.domain == domain for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))


# --------------------------------------------------------------------------- Conv -> DWConv2D


def conv_to_dwconv2d(
    model: onnx.ModelProto,
    nodes: Iterable[str] | None = None,
    *,
    domain: str = DEFAULT_DOMAIN,
    constant_grouped: bool = False,
) -> onnx.ModelProto:
    """Rewrite 2-D Convs whose kernel is a runtime tensor (all, or ``nodes``) as DWConv2D.

    ``constant_grouped``: also the 2-D Convs with a constant kernel and ``group > 1`` (depthwise
    and grouped convs of an ordinary model); their initializer simply becomes DWConv2D's W
    input. Off by default because a constant-kernel Conv is something TensorRT builds natively:
    moving it to the plugin is only wanted to run a real model's depthwise layers through it.
    """
    g = open_graph(model, require_fixed_rank=False)
    shapes = tensor_shapes(model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    eligible = [
        n
        for n in convs
        if n.input[1] not in g.constants or (constant_grouped and _grouped_2d(n, shapes))
    ]
    targets = _select(eligible, nodes, model, constant_grouped)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {n.name: i for i, n in enumerate(out.graph.node)}
    for conv in targets:
        index = by_name[conv.name] if conv.name else list(model.graph.node).index(conv)
        rewritten = _dwconv_from_conv(conv, shapes, domain)
        out.graph.node[index].CopyFrom(rewritten)
    _ensure_domain_import(out, domain)
    for node in out.graph.node:
        if is_dwconv2d(node):
            validate_dwconv2d(out, node)
    return out


def _grouped_2d(conv: onnx.NodeProto, shapes: dict[str, tuple[Dim, ...]]) -> bool:
    """A Conv with ``group > 1`` over a 2-D kernel (rank-4 weight)."""
    group = next((helper.get_attribute_value(a) for a in conv.attribute if a.name == "group"), 1)
    w_shape = shapes.get(conv.input[1])
    return group > 1 and w_shape is not None and len(w_shape) == 4


def _select(
    eligible: list[onnx.NodeProto],
    nodes: Iterable[str] | None,
    model: onnx.ModelProto,
    constant_grouped: bool = False,
) -> list[onnx.NodeProto]:
    if nodes is None:
        return eligible
    wanted = list(nodes)
    by_name = {n.name: n for n in eligible}
    all_names = {n.name: n.op_type for n in model.graph.node}
    what = (
        "a Conv with a runtime kernel or a 2-D grouped Conv"
        if constant_grouped
        else "a Conv with a runtime kernel (constant-kernel grouped convs: constant_grouped=True)"
    )
    for name in wanted:
        if name not in all_names:
            raise QuantbenchError(f"conv_to_dwconv2d: no node named {name!r} in the model")
        if name not in by_name:
            raise QuantbenchError(f"conv_to_dwconv2d: {all_names[name]} {name!r} is not {what}")
    return [by_name[name] for name in wanted]


def _dwconv_from_conv(
    conv: onnx.NodeProto, shapes: dict[str, tuple[Dim, ...]], domain: str
) -> onnx.NodeProto:
    label = f"Conv {conv.name or conv.output[0]!r}"
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    x_shape, w_shape = shapes.get(conv.input[0]), shapes.get(conv.input[1])
    kernel = attrs.get("kernel_shape")
    if (x_shape is not None and len(x_shape) != 4) or (kernel is not None and len(kernel) != 2):
        raise QuantbenchError(f"{label}: DWConv2D is 2-D only; this Conv is not")
    static_kernel = w_shape is not None and all(isinstance(d, int) for d in w_shape[2:])
    if kernel is not None and static_kernel and list(w_shape[2:]) != list(kernel):  # type: ignore[index]
        raise QuantbenchError(
            f"{label}: kernel_shape {list(kernel)} disagrees with the kernel tensor's "
            f"{list(w_shape[2:])}"
        )
    pads = _explicit_pads(label, attrs, x_shape, w_shape)
    return make_dwconv2d_node(
        conv.input[0],
        conv.input[1],
        conv.output[0],
        conv.input[2] if len(conv.input) > 2 and conv.input[2] else None,
        strides=attrs.get("strides", [1, 1]),
        pads=pads,
        dilations=attrs.get("dilations", [1, 1]),
        group=attrs.get("group", 1),
        name=conv.name,
        domain=domain,
    )


def _explicit_pads(
    label: str,
    attrs: dict[str, object],
    x_shape: tuple[Dim, ...] | None,
    w_shape: tuple[Dim, ...] | None,
) -> list[int]:
    """ONNX pads; ``auto_pad`` SAME_* is resolved from static shapes (the plugin has none)."""
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad in ("NOTSET", ""):
        return list(attrs.get("pads", [0, 0, 0, 0]))  # type: ignore[arg-type]
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    strides = list(attrs.get("strides", [1, 1]))  # type: ignore[arg-type]
    dilations = list(attrs.get("dilations", [1, 1]))  # type: ignore[arg-type]
    spatial = x_shape[2:] if x_shape is not None else (None, None)
    kernel = attrs.get("kernel_shape") or (w_shape[2:] if w_shape is not None else (None, None))
    if not all(isinstance(d, int) for d in (*spatial, *kernel)):  # type: ignore[misc]
        raise QuantbenchError(
            f"{label}: auto_pad={auto_pad} needs static spatial and kernel sizes to become "
            "explicit pads; export the Conv with explicit pads"
        )
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):  # type: ignore[arg-type]
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


# --------------------------------------------------------------------------- DWConv2D -> Conv


def dwconv2d_to_conv(model: onnx.ModelProto) -> onnx.ModelProto:
    """Standard ONNX for every DWConv2D, so onnxruntime can run the model (FP32 reference).

    Shared kernels become a Conv. Per-sample kernels need a static N: the batch is folded into
    channels (X -> [1, N*C, H, W], W -> [N*K, C/group, kH, kW], group*N) and the result
    reshaped back to [N, K, Ho, Wo]. INT8 scale attributes become DequantizeLinear on the inputs
    and QuantizeLinear on the output, i.e. the Q/DQ model the INT8 plugin stands for.
    """
    specs = [validate_dwconv2d(model, n) for n in model.graph.node if is_dwconv2d(n)]
    graph = gs.import_onnx(model)
    lowering = _Lowering(graph)
    for node, spec in zip([n for n in graph.nodes if is_dwconv2d(n)], specs, strict=True):
        lowering.lower(node, spec)
    graph.cleanup().toposort()
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    _fill_output_shapes(out)
    return out


def _fill_output_shapes(model: onnx.ModelProto) -> None:
    """Graph outputs behind a DWConv2D had no inferable shape; now standard ONNX gives one."""
    missing = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if not missing:
        return
    try:
        inferred = {o.name: o for o in shape_inference.infer_shapes(model).graph.output}
    except Exception:  # noqa: BLE001 - best effort, the model is valid without it
        return
    for output in missing:
        if output.name in inferred and inferred[output.name].type.tensor_type.HasField("shape"):
            output.type.CopyFrom(inferred[output.name].type)


class _Lowering(UniqueNames):
    """Builds the standard-ONNX replacement of one DWConv2D node at a time."""

    def __init__(self, graph: gs.Graph) -> None:
        super().__init__(graph)
        self.graph = graph

    def const(self, base: str, values: object) -> gs.Constant:
        return gs.Constant(self.fresh(base), np.asarray(values))

    def shape(self, base: str, dims: list[int]) -> gs.Constant:
        return self.const(base, np.array(dims, dtype=np.int64))

    def op(
        self,
        op: str,
        name: str,
        inputs: list[gs.Tensor],
        output: gs.Tensor | None = None,
        **attrs: object,
    ) -> gs.Tensor:
        """Append ``op`` and return its output (a fresh float tensor unless one is given)."""
        if output is None:
            output = gs.Variable(self.fresh(f"{name}_output"), dtype=np.float32)
        node_name = name if name not in self.taken else self.fresh(name)
        self.taken.add(node_name)
        self.graph.nodes.append(
            gs.Node(op, name=node_name, attrs=attrs, inputs=inputs, outputs=[output])
        )
        return output

    def lower(self, node: gs.Node, spec: DWConv2DSpec) -> None:
        name = node.name or node.outputs[0].name
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 and not node.inputs[2].is_empty() else None
        output = node.outputs[0]
        node.inputs.clear()
        node.outputs.clear()  # the plugin node is now dead; cleanup() drops it
        self.taken.discard(name)  # its replacement Conv inherits the name
        node.name = self.fresh(f"{name}_lowered")
        if spec.int8_input:
            x = self._dequantize(x, spec.input_scale, f"{name}/input")
            w = self._dequantize(w, spec.weight_scale, f"{name}/weight")
        conv_output = None if spec.int8_output else output
        if spec.per_batch:
            result = self._per_batch_conv(name, spec, x, w, bias, conv_output)
        else:
            result = self._shared_conv(name, spec, x, w, bias, conv_output)
        if spec.int8_output:
            scale = self.const(f"{name}/output_scale", np.float32(spec.output_scale))
            zero = self.const(f"{name}/output_zero_point", np.int8(0))
            self.op(
                "QuantizeLinear", f"{name}/output_QuantizeLinear", [result, scale, zero], output
            )

    def _dequantize(self, tensor: gs.Tensor, scale: float, base: str) -> gs.Tensor:
        scale_t = self.const(f"{base}_scale", np.float32(scale))
        zero_t = self.const(f"{base}_zero_point", np.int8(0))
        return self.op("DequantizeLinear", f"{base}_DequantizeLinear", [tensor, scale_t, zero_t])

    def _conv_attrs(self, spec: DWConv2DSpec, group: int) -> dict[str, object]:
        return {
            "strides": list(spec.strides),
            "pads": list(spec.pads),
            "dilations": list(spec.dilations),
            "group": group,
        }

    def _shared_conv(
        self,
        name: str,
        spec: DWConv2DSpec,
        x: gs.Tensor,
        w: gs.Tensor,
        bias: gs.Tensor | None,
        output: gs.Tensor | None,
    ) -> gs.Tensor:
        """One Conv; a per-sample bias [N, K] is added afterwards as [N, K, 1, 1]."""
        per_sample_bias = bias is not None and len(spec.bias_shape or ()) == 2
        if not per_sample_bias:
            inputs = [x, w] + ([bias] if bias is not None else [])
            return self.op("Conv", name, inputs, output, **self._conv_attrs(spec, spec.group))
        conv = self.op("Conv", name, [x, w], **self._conv_attrs(spec, spec.group))
        bias_4d = self.op(
            "Reshape",
            f"{name}/bias_reshape",
            [bias, self.shape(f"{name}/bias_shape", [0, -1, 1, 1])],
        )
        return self.op("Add", f"{name}/add_bias", [conv, bias_4d], output)

    def _per_batch_conv(
        self,
        name: str,
        spec: DWConv2DSpec,
        x: gs.Tensor,
        w: gs.Tensor,
        bias: gs.Tensor | None,
        output: gs.Tensor | None,
    ) -> gs.Tensor:
        """Fold the batch into channels: sample n's kernels act on channel block n only."""
        n, k, c_per_group, kh, kw = spec.weight_shape  # type: ignore[misc]
        if not all(isinstance(d, int) for d in (n, k, c_per_group, kh, kw)):
            raise QuantbenchError(
                f"DWConv2D {name!r}: per-sample kernels are lowered by folding the batch into "
                f"channels (group*N), which needs a static kernel shape [N, K, C/group, kH, kW], "
                f"got {list(spec.weight_shape or ())}; export with a fixed batch size, run the op "
                "itself in onnxruntime (--dwconv2d-op plugin, with onnxruntime-extensions), or "
                "run this model in TensorRT with the DWConv2D plugin"
            )
        channels = c_per_group * spec.group
        x_shape = self.shape(f"{name}/x_folded_shape", [1, n * channels, 0, 0])
        w_shape = self.shape(f"{name}/w_folded_shape", [n * k, c_per_group, kh, kw])
        inputs = [
            self.op("Reshape", f"{name}/fold_batch_x", [x, x_shape]),
            self.op("Reshape", f"{name}/fold_batch_w", [w, w_shape]),
        ]
        if bias is not None and len(spec.bias_shape or ()) == 2:
            b_shape = self.shape(f"{name}/bias_folded_shape", [n * k])
            inputs.append(self.op("Reshape", f"{name}/fold_batch_bias", [bias, b_shape]))
        elif bias is not None:
            repeats = self.shape(f"{name}/bias_repeats", [n])
            inputs.append(self.op("Tile", f"{name}/tile_bias", [bias, repeats]))
        conv = self.op("Conv", name, inputs, **self._conv_attrs(spec, spec.group * n))
        y_shape = self.shape(f"{name}/y_shape", [n, k, 0, 0])
        return self.op("Reshape", f"{name}/unfold_batch", [conv, y_shape], output)


# --------------------------------------------------------------------------- INT8 plugin pattern


def dwconv2d_int8_pattern(
    model: onnx.ModelProto, nodes: Iterable[str] | None = None, *, int8_output: bool = True
) -> onnx.ModelProto:
    """The INT8 explicit-quantization form of DWConv2D (reference section 5.5).

    TensorRT does not fuse Q/DQ into a plugin: ``Q -> DQ -> DWConv2D`` becomes
    ``Q -> DWConv2D(INT8 in)`` with the DQ scales moved into ``input_scale``/``weight_scale``.
    With ``int8_output``, a DWConv2D whose only reader is a QuantizeLinear also absorbs it:
    ``DWConv2D -> (INT8) -> DQ``, with ``output_scale`` set.
    """
    graph = gs.import_onnx(model)
    wanted = None if nodes is None else set(nodes)
    targets = [n for n in graph.nodes if is_dwconv2d(n) and (wanted is None or n.name in wanted)]
    if wanted is not None and (missing := wanted - {n.name for n in targets}):
        raise QuantbenchError(
            f"dwconv2d_int8_pattern: no DWConv2D named {', '.join(sorted(missing))}"
        )
    if not targets:
        raise QuantbenchError("dwconv2d_int8_pattern: the model has no DWConv2D node")
    for node in targets:
        _absorb_input_dq(node, 0, "input_scale")
        _absorb_input_dq(node, 1, "weight_scale")
        if int8_output:
            _absorb_output_q(graph, node)
    graph.cleanup().toposort()
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    for node in out.graph.node:
        if is_dwconv2d(node):
            validate_dwconv2d(out, node)
    return out


def _per_tensor_int8(q_or_dq: gs.Node) -> float | None:
    """The scale of a per-tensor, int8, zero-point-0 Q or DQ node, else None."""
    if len(q_or_dq.inputs) < 3 or not isinstance(q_or_dq.inputs[1], gs.Constant):
        return None
    zero = q_or_dq.inputs[2]
    if not isinstance(zero, gs.Constant):
        return None
    scale, zp = np.asarray(q_or_dq.inputs[1].values), np.asarray(zero.values)
    if scale.size != 1 or zp.dtype != np.int8 or zp.reshape(-1)[0] != 0:
        return None
    return float(scale.reshape(()))


def _absorb_input_dq(node: gs.Node, index: int, attribute: str) -> None:
    tensor = node.inputs[index]
    dq = tensor.inputs[0] if tensor.inputs else None
    what = "data" if index == 0 else "weight"
    if dq is None or dq.op != "DequantizeLinear":
        raise QuantbenchError(
            f"DWConv2D {node.name!r}: its {what} input has no DequantizeLinear in front; quantize "
            "it first (quantize_model with 'DWConv2D' in op_types) or leave it out via nodes="
        )
    scale = _per_tensor_int8(dq)
    if scale is None:
        raise QuantbenchError(
            f"DWConv2D {node.name!r}: the DequantizeLinear on its {what} input is not per-tensor "
            "int8 with zero-point 0; the plugin takes one symmetric scale"
        )
    node.inputs[index] = dq.inputs[0]
    node.attrs[attribute] = scale


def _absorb_output_q(graph: gs.Graph, node: gs.Node) -> None:
    output = node.outputs[0]
    readers = list(output.outputs)
    if output in graph.outputs or len(readers) != 1 or readers[0].op != "QuantizeLinear":
        return
    q = readers[0]
    scale = _per_tensor_int8(q)
    if scale is None:
        return
    int8_tensor = q.outputs[0]
    q.outputs.clear()
    node.outputs[0] = int8_tensor
    node.attrs["output_scale"] = scale
