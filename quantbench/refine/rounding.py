"""Adaptive weight rounding: each weighted layer's weights put on the INT8 grid of their own
per-channel scale, at the integers that disturb the layer's output least on the calibration data
rather than at the nearest ones (GPTQ, Frantar et al. 2022, itself OBQ made fast).

Why it works: quantizing a layer's weight ``W`` (``Cout x K`` once each output channel's filter
is flattened; ``K = Cin/group * kh * kw`` for a conv) to ``W + dW`` moves its outputs on input
rows ``X`` (a conv's im2col rows) by ``X dW^T``, whose energy over the data is
``tr(dW H dW^T)`` with ``H = X^T X``. Round-to-nearest makes each ``|dW|`` small on its own;
GPTQ rounds one input column at a time and spreads that column's rounding error over the
columns not yet rounded through the Cholesky factor of ``H^-1``, so that correlated inputs
cancel each other's errors.

What comes out is exact for both TensorRT paths: every weight is ``float32(q * s_o)`` with an
integer ``|q| <= 127`` and ``s_o`` its channel's scale, and the element that sets ``max|W_o|``
keeps its level ``±127``, so TensorRT's implicit weight scale ``max|w| / 127`` and the Q/DQ path
(:func:`quantbench.qdq.weights.weight_scale`) both find ``s_o`` and the same integers. ``s_o``
is ``weight_scale`` of the original weights: for every scale it can give,
``float32(127 * s_o) / 127`` is ``s_o`` again in float32 (checked on 15 million random maxima
from 2^-126 to 2^5; an arbitrary float32 fails about 0.8 % of the time, and
:func:`grid_scale` would then move to the neighbouring float32 that passes).

How ``H`` is gathered: one streamed FP32 pass (:func:`~quantbench.refine.activations.
stream_activations`) reads each layer's input; its rows are accumulated in float64. Rows are
sampled per item of the input's first axis (a sample, for a model with a batch axis): at most
``max_rows`` of them (a conv's output positions, a MatMul's ``[..., T, K]`` tokens), chosen
without replacement by a generator seeded by (node position, item index), so the choice does
not depend on batching or on which other layers share the pass. Rows holding NaN/Inf are left
out. The ``H`` of all layers of a pass stay under :data:`HESSIAN_BUDGET`; more layers than that
take several passes over the data, which a source read only once (a generator) cannot give.

Handled: Conv (1-D to 3-D, grouped and depthwise: one ``H`` per group; pads, strides,
dilations, every ``auto_pad``), Gemm (``transA``, ``transB``) and MatMul with a constant 2-D
weight ``[K, N]`` as its second input. Skipped, each with its reason (:func:`find_layers`):
ConvTranspose (its rows are a transposed scatter; not implemented), weights that are not a
float32 initializer of their own (a Constant node or chain, a runtime weight, one initializer
shared by several nodes), layers whose ``H`` alone would exceed the budget, and nodes inside
subgraphs. A layer keeps its new weights only if they lower its own output error below
round-to-nearest's; biases are never touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper, numpy_helper

from quantbench.data.sources import DataSource
from quantbench.errors import QuantbenchError
from quantbench.model.graph import constant_tensors, node_labels
from quantbench.progress import progress_bar
from quantbench.qdq.weights import weight_axis, weight_scale
from quantbench.refine import ROUNDING, LayerChange, Refined
from quantbench.refine.activations import stream_activations
from quantbench.table import INT8_MAX

#: GPTQ's dampening: ``damp * mean(diag(H))`` added to ``H``'s diagonal before it is inverted
DAMP = 0.01
#: the dampening tried, in turn, when ``H^-1`` has no Cholesky factor at the one before
DAMP_RETRIES = (DAMP, 0.1, 1.0)
#: the float64 ``H`` of the layers read in one pass over the data stay under this many bytes
HESSIAN_BUDGET = 512 << 20
#: input rows are gathered in chunks of at most this many bytes once in float64
ROW_CHUNK_BYTES = 32 << 20
#: rows waiting to be summed into the ``H`` of one pass's layers, all together (each layer
#: gets an equal share, from 1 to 16 MiB)
ROW_BUFFER_BYTES = 128 << 20
#: a layer keeps its rounding only if its output error is lower than round-to-nearest's by
#: more than this fraction (float32 noise, and a one-ulp move of the scale, are not a gain)
KEEP_MARGIN = 1e-6
#: every this-many-th item (sample) of a layer's input is held out of GPTQ's fit: its rows
#: decide, per output channel and for the layer, whether GPTQ's integers beat the nearest
#: ones on data they were not fit to (a layer with few rows for its inputs, such as a
#: recognizer's 1024 x 8210 classifier on 1280 rows, is otherwise fit to the noise)
HELD_EVERY = 4
#: GPTQ's lazy-batch width: columns rounded before the rest of ``W`` is updated at once
BLOCK = 128
#: the seed of the row choice (with the node position and the item index)
SEED = 20240917
_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


# --------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class ConvGeometry:
    """How a Conv's input becomes im2col rows."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    auto_pad: str
    pads: tuple[int, ...]  # begins then ends, ONNX's order; unused for SAME_*

    def padding(self, spatial: tuple[int, ...]) -> list[tuple[int, int]]:
        """(begin, end) per spatial axis for an input of this size (ONNX's SAME rule: the
        odd pixel at the end for SAME_UPPER, at the beginning for SAME_LOWER)."""
        nd = len(self.kernel)
        if self.auto_pad == "VALID":
            return [(0, 0)] * nd
        if self.auto_pad == "NOTSET":
            return list(zip(self.pads[:nd], self.pads[nd:]))
        out = []
        for size, k, s, d in zip(spatial, self.kernel, self.strides, self.dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            out.append((small, large) if self.auto_pad == "SAME_UPPER" else (large, small))
        return out


@dataclass
class Layer:
    """One layer to round: its weight initializer and how its input becomes rows of ``X``."""

    label: str
    index: int  # the node's position: seeds its row choice
    node: onnx.NodeProto
    weight: str
    values: np.ndarray  # the initializer as stored
    axis: int  # output-channel axis of ``values`` (weight_axis)
    groups: int = 1
    conv: ConvGeometry | None = None
    trans_a: bool = False

    @property
    def input(self) -> str:
        return self.node.input[0]

    @property
    def cout(self) -> int:
        return self.values.shape[self.axis]

    @property
    def k(self) -> int:
        """Inputs per output channel (per group)."""
        return self.values.size // self.cout

    @property
    def hessian_bytes(self) -> int:
        return self.groups * self.k * self.k * 8

    def matrix(self) -> np.ndarray:
        """``W`` as ``Cout x K`` rows, each an output channel's flattened filter."""
        if self.conv is not None:
            return self.values.reshape(self.cout, -1)
        return self.values if self.axis == 0 else self.values.T

    def stored(self, w: np.ndarray) -> np.ndarray:
        """``Cout x K`` rows back in the initializer's layout."""
        if self.conv is not None:
            return w.reshape(self.values.shape)
        return w if self.axis == 0 else np.ascontiguousarray(w.T)


def find_layers(
    model: onnx.ModelProto, names: Iterable[str] | None = None
) -> tuple[list[Layer], dict[str, str]]:
    """The layers :func:`round_weights` rounds, and why each other weighted node is skipped.

    ``names``: node names (or :func:`~quantbench.model.graph.node_labels` of unnamed nodes) to
    consider; a name that is no node is an error."""
    labels = node_labels(model.graph.node)
    wanted = _wanted(labels, names)
    inits = {i.name: i for i in model.graph.initializer}
    uses = _uses(model)
    constants = constant_tensors(model)
    graph_inputs = {v.name for v in model.graph.input}
    found: list[Layer] = []
    skipped: dict[str, str] = {}
    for index, (node, label) in enumerate(zip(model.graph.node, labels)):
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or label not in wanted:
            continue
        layer = _layer(node, label, index, inits, uses, constants, graph_inputs)
        if isinstance(layer, str):
            skipped[label] = layer
        elif layer.hessian_bytes > HESSIAN_BUDGET:
            mib = layer.hessian_bytes / 2**20
            skipped[label] = (
                f"its H ({mib:.0f} MiB) alone exceeds the {HESSIAN_BUDGET >> 20} MiB budget"
            )
        else:
            found.append(layer)
    return found, skipped


def _wanted(labels: list[str], names: Iterable[str] | None) -> set[str]:
    if names is None:
        return set(labels)
    wanted = set(names)
    unknown = sorted(wanted - set(labels))
    if unknown:
        raise QuantbenchError(f"weight rounding: no node named {', '.join(map(repr, unknown))}")
    return wanted


def _uses(model: onnx.ModelProto) -> dict[str, int]:
    """How often each tensor is read (subgraphs and graph outputs count)."""
    counts: dict[str, int] = {}

    def visit(graph: onnx.GraphProto) -> None:
        for name in [o.name for o in graph.output]:
            counts[name] = counts.get(name, 0) + 1
        for node in graph.node:
            for name in node.input:
                counts[name] = counts.get(name, 0) + 1
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    visit(sub)

    visit(model.graph)
    return counts


def _layer(
    node: onnx.NodeProto,
    label: str,
    index: int,
    inits: dict[str, onnx.TensorProto],
    uses: dict[str, int],
    constants: set[str],
    graph_inputs: set[str],
) -> Layer | str:
    """The node as a :class:`Layer`, or why it cannot be rounded."""
    if node.op_type == "ConvTranspose":
        return "ConvTranspose is not rounded (its rows are a transposed scatter; not implemented)"
    if len(node.input) < 2 or not node.input[0]:
        return "it has no data input and weight"
    weight = node.input[1]
    if weight not in inits or weight in graph_inputs:
        if weight in constants and weight not in graph_inputs:
            return f"its weight {weight!r} is a Constant node or constant chain, not an initializer"
        return f"its weight {weight!r} is computed at run time"
    if uses.get(weight, 0) > 1:
        return f"its weight initializer {weight!r} is shared with other nodes or outputs"
    if node.input[0] in constants:
        return "its data input is a constant"
    if inits[weight].data_type != onnx.TensorProto.FLOAT:
        return f"its weight {weight!r} is not float32"
    try:
        values = numpy_helper.to_array(inits[weight])
    except Exception as exc:  # noqa: BLE001 - e.g. external data that was not loaded
        return f"its weight {weight!r} could not be read ({type(exc).__name__})"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis = weight_axis(node, 1, values.shape)
    if axis is None or values.ndim < 2 or 0 in values.shape:
        return f"its weight {weight!r} {list(values.shape)} has no output-channel axis"
    layer = Layer(label, index, node, weight, values, axis)
    if node.op_type == "Conv":
        return _conv_layer(layer, attrs)
    if values.ndim != 2:
        return f"its weight {weight!r} is not a 2-D matrix"
    layer.trans_a = bool(attrs.get("transA", 0)) and node.op_type == "Gemm"
    return layer


def _conv_layer(layer: Layer, attrs: dict[str, object]) -> Layer | str:
    shape = layer.values.shape
    nd = len(shape) - 2
    if nd < 1:
        return f"its weight {list(shape)} is not a conv kernel"
    groups = int(attrs.get("group", 1))  # type: ignore[arg-type]
    if groups < 1 or shape[0] % groups:
        return f"group {groups} does not divide its {shape[0]} output channels"
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in _AUTO_PADS:
        return f"auto_pad {auto_pad!r} is not supported"
    kernel = tuple(attrs.get("kernel_shape", shape[2:]))  # type: ignore[arg-type]
    strides = tuple(attrs.get("strides", [1] * nd))  # type: ignore[arg-type]
    dilations = tuple(attrs.get("dilations", [1] * nd))  # type: ignore[arg-type]
    pads = tuple(attrs.get("pads", [0] * 2 * nd))  # type: ignore[arg-type]
    if kernel != tuple(shape[2:]) or len(strides) != nd or len(dilations) != nd:
        return "its kernel_shape, strides or dilations do not match its weight"
    if len(pads) != 2 * nd or min(pads) < 0 or min(strides) < 1 or min(dilations) < 1:
        return f"pads {list(pads)}, strides or dilations are not supported"
    layer.groups = groups
    layer.conv = ConvGeometry(kernel, strides, dilations, auto_pad, pads)
    return layer


# --------------------------------------------------------------------------- H = X^T X


class Hessian:
    """``H = X^T X`` of one layer's sampled input rows (per group), summed in float64, in two
    parts: the rows of every :data:`HELD_EVERY`-th item (sample) are held out of GPTQ's fit
    and judge it (:func:`round_layer`), the others fit it.

    Rows wait in a buffer of ``flush_bytes`` and are summed in one product: a few large
    products instead of one per batch, which matters most where BLAS threads share busy
    cores (on 2 loaded cores, one product per tinycnn sample took 6 times as long)."""

    def __init__(self, layer: Layer, max_rows: int, flush_bytes: int = 16 << 20):
        self.layer = layer
        self.max_rows = max_rows
        self.flush_bytes = flush_bytes
        self._fit = np.zeros((layer.groups, layer.k, layer.k))
        self._held = np.zeros((layer.groups, layer.k, layer.k))
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_bytes = 0
        self.items = 0  # items of the input's first axis seen so far: seeds the row choice
        self.rows = 0
        self.held_rows = 0
        self.nonfinite = 0

    @property
    def h(self) -> np.ndarray:
        """``H`` over every row added so far, ``[groups, K, K]``."""
        self._flush()
        return self._fit + self._held

    @property
    def fit(self) -> np.ndarray:
        """``H`` of the rows GPTQ fits (every row while no item was held out)."""
        self._flush()
        return self._fit if self.held_rows else self._fit + self._held

    @property
    def held(self) -> np.ndarray | None:
        """``H`` of the held-out items' rows; None when there were too few items to hold
        any out."""
        self._flush()
        return self._held if self.held_rows and self.held_rows < self.rows else None

    def add(self, x: np.ndarray) -> None:
        """Add one batch of the layer's input."""
        x = np.asarray(x)
        rows = _conv_rows(x, self) if self.layer.conv is not None else _dense_rows(x, self)
        for chunk, held in rows:
            finite = np.isfinite(chunk).all(axis=1)
            if not finite.all():
                self.nonfinite += int((~finite).sum())
                chunk, held = chunk[finite], held[finite]
            self.rows += len(chunk)
            self.held_rows += int(held.sum())
            self._pending.append((chunk, held))
            self._pending_bytes += chunk.nbytes
            if self._pending_bytes >= self.flush_bytes:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = np.concatenate([p[0] for p in self._pending]).astype(np.float64)
        held = np.concatenate([p[1] for p in self._pending])
        self._pending, self._pending_bytes = [], 0
        self._fit += _gram(rows[~held], self.layer.groups)
        self._held += _gram(rows[held], self.layer.groups)


def _gram(rows: np.ndarray, groups: int) -> np.ndarray:
    """``X_g^T X_g`` per group of rows ``[R, groups * K]``: ``[groups, K, K]``."""
    if groups == 1:
        return (rows.T @ rows)[None]
    xg = rows.reshape(len(rows), groups, rows.shape[1] // groups).transpose(1, 0, 2)
    return np.matmul(xg.transpose(0, 2, 1), xg)


def _choose(hess: Hessian, n: int, per_item: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, row) indices of the rows kept from ``n`` items of ``per_item`` rows each, and
    whether each row's item is held out: all of them, or ``max_rows`` per item drawn by a
    generator seeded by (node, item index)."""
    first = hess.items
    hess.items += n
    held = (first + np.arange(n)) % HELD_EVERY == HELD_EVERY - 1
    if per_item <= hess.max_rows:
        items = np.repeat(np.arange(n), per_item)
        return items, np.tile(np.arange(per_item), n), held[items]
    picks = [
        np.sort(
            np.random.default_rng((SEED, hess.layer.index, first + i)).choice(
                per_item, hess.max_rows, replace=False
            )
        )
        for i in range(n)
    ]
    items = np.repeat(np.arange(n), hess.max_rows)
    return items, np.concatenate(picks), held[items]


def _chunks(count: int, width: int) -> Iterator[slice]:
    step = max(1, ROW_CHUNK_BYTES // (8 * max(width, 1)))
    for start in range(0, count, step):
        yield slice(start, min(count, start + step))


def _conv_rows(x: np.ndarray, hess: Hessian) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """im2col rows ``[R, Cin * prod(kernel)]`` (channel-major, the flattened filter's order)
    of a conv input ``[N, Cin, *spatial]``, built only for the sampled output positions, with
    whether each is held out."""
    geom = hess.layer.conv
    assert geom is not None
    nd = len(geom.kernel)
    channels = hess.layer.groups * hess.layer.values.shape[1]
    if x.ndim != nd + 2 or x.shape[1] != channels:
        raise QuantbenchError(
            f"{hess.layer.label}: conv input of shape {list(x.shape)}, not [N, {channels}, ...] "
            f"of rank {nd + 2}"
        )
    padded = np.pad(x, [(0, 0), (0, 0), *geom.padding(x.shape[2:])])
    extent = [(k - 1) * d + 1 for k, d in zip(geom.kernel, geom.dilations)]
    windows = sliding_window_view(padded, extent, axis=tuple(range(2, nd + 2)))
    windows = windows[
        (slice(None), slice(None))
        + tuple(slice(None, None, s) for s in geom.strides)
        + tuple(slice(None, None, d) for d in geom.dilations)
    ]  # [N, C, *out, *kernel], a view
    out = windows.shape[2 : nd + 2]
    items, positions, held = _choose(hess, x.shape[0], int(np.prod(out)))
    width = x.shape[1] * int(np.prod(geom.kernel))
    for part in _chunks(len(items), width):
        coords = np.unravel_index(positions[part], out)
        rows = windows[(items[part], slice(None), *coords)]  # [r, C, *kernel]
        yield rows.reshape(len(rows), width), held[part]


def _dense_rows(x: np.ndarray, hess: Hessian) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Rows of a Gemm's A (transposed for transA) or a MatMul's ``[..., K]`` input, with
    whether each is held out."""
    k = hess.layer.k
    if hess.layer.trans_a:
        x = x.T
    if x.shape[-1] != k:
        raise QuantbenchError(f"{hess.layer.label}: input's last axis is {x.shape[-1]}, not {k}")
    items = x.reshape(-1, int(np.prod(x.shape[1:-1])), k) if x.ndim >= 3 else x.reshape(-1, 1, k)
    item, row, held = _choose(hess, items.shape[0], items.shape[1])
    for part in _chunks(len(item), k):
        yield items[item[part], row[part]], held[part]


def plan_passes(layers: list[Layer], budget: int | None = None) -> list[list[Layer]]:
    """Layers grouped, in order, so that each group's ``H`` fit in ``budget`` together
    (default :data:`HESSIAN_BUDGET`)."""
    budget = HESSIAN_BUDGET if budget is None else budget
    passes: list[list[Layer]] = []
    used = budget + 1
    for layer in layers:
        if used + layer.hessian_bytes > budget:
            passes.append([])
            used = 0
        passes[-1].append(layer)
        used += layer.hessian_bytes
    return passes


def hessian_passes(
    model: onnx.ModelProto,
    data: DataSource,
    layers: list[Layer],
    *,
    provider: str | None = None,
    max_rows: int = 4096,
    advance: Callable[[int], None] = lambda n: None,
) -> Iterator[dict[str, Hessian]]:
    """Each pass's layers' :class:`Hessian` over ``data`` (one streamed pass per group of
    :func:`plan_passes`; ``advance(1)`` after each batch), yielded as each pass ends so that
    the caller can use and drop them before the next."""
    if max_rows < 1:
        raise QuantbenchError("weight rounding: max_rows must be positive")
    passes = plan_passes(layers)
    first_count: int | None = None
    for number, group in enumerate(passes):
        share = min(16 << 20, max(1 << 20, ROW_BUFFER_BYTES // len(group)))
        hessians = {layer.label: Hessian(layer, max_rows, share) for layer in group}
        count = 0
        try:
            tensors = [layer.input for layer in group]
            for values in stream_activations(model, data, tensors, provider=provider):
                for layer in group:
                    hessians[layer.label].add(values[layer.input])
                count += 1
                advance(1)
        except QuantbenchError:
            if number and not count:
                raise _read_once(data, len(passes)) from None
            raise
        if first_count is not None and count != first_count:
            raise _read_once(data, len(passes))
        first_count = count
        yield hessians


def accumulate_hessians(
    model: onnx.ModelProto,
    data: DataSource,
    layers: list[Layer],
    *,
    provider: str | None = None,
    max_rows: int = 4096,
) -> dict[str, Hessian]:
    """Every layer's :class:`Hessian`, all passes together (for inspection and tests)."""
    out: dict[str, Hessian] = {}
    for hessians in hessian_passes(model, data, layers, provider=provider, max_rows=max_rows):
        out.update(hessians)
    return out


def _read_once(data: DataSource, passes: int) -> QuantbenchError:
    return QuantbenchError(
        f"{data.description}: weight rounding reads the data {passes} times (the layers' H "
        f"matrices exceed {HESSIAN_BUDGET >> 20} MiB together), but this source gave a "
        "different second pass: it can be read only once; give a file, a folder or a "
        "re-readable reader (with rewind())"
    )


# --------------------------------------------------------------------------- GPTQ


def grid_scale(values: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel float32 scale ``s`` that ``weight_scale`` finds again on weights whose
    largest magnitude is ``float32(127 * s)``: ``weight_scale``'s own (always so for the
    scales it gives), else the float32 next to it."""
    scale = weight_scale(values, axis)
    live = np.abs(values).max(axis=tuple(a for a in range(values.ndim) if a != axis)) > 0
    for _ in range(4):
        top = (scale.astype(np.float64) * INT8_MAX).astype(np.float32)
        again = (top / np.float32(INT8_MAX)).astype(np.float32)
        again = np.where(live, again, scale)
        if np.array_equal(again, scale):
            break
        scale = again
    return scale


def _upper_inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """``U`` upper with ``H^-1 = U^T U`` per group, without forming ``H^-1``: with ``J`` the
    index reversal and ``J H J = L L^T``, ``U = J L^-1 J`` (a Cholesky and a triangular
    inverse, about a third of the work of inverting ``H`` then factoring the inverse; raises
    LinAlgError when ``H`` is not positive definite)."""
    lower = np.linalg.cholesky(np.ascontiguousarray(h[:, ::-1, ::-1]))
    return np.ascontiguousarray(_lower_inverse(lower)[:, ::-1, ::-1])


def _lower_inverse(lower: np.ndarray) -> np.ndarray:
    """Inverse of lower-triangular matrices by halves, so that the work is matrix products."""
    n = lower.shape[-1]
    if n <= 64:
        return np.tril(np.linalg.inv(lower))
    m = n // 2
    top = _lower_inverse(lower[:, :m, :m])
    bottom = _lower_inverse(lower[:, m:, m:])
    out = np.zeros_like(lower)
    out[:, :m, :m] = top
    out[:, m:, m:] = bottom
    out[:, m:, :m] = -(bottom @ lower[:, m:, :m]) @ top
    return out


def _damped(h: np.ndarray, damp: float) -> np.ndarray:
    """``H`` with dead inputs (``diag == 0``, never nonzero in the data) given a unit
    diagonal, which decouples them (their weights are rounded to nearest), and ``damp *
    mean(diag)`` added to the diagonal."""
    h = (h + h.transpose(0, 2, 1)) / 2
    idx = np.arange(h.shape[1])
    diag = h[:, idx, idx]
    h[:, idx, idx] = np.where(diag > 0, diag, 1.0)
    h[:, idx, idx] += damp * h[:, idx, idx].mean(axis=1, keepdims=True)
    return h


def gptq(
    w: np.ndarray,
    h: np.ndarray,
    scale: np.ndarray,
    *,
    damp: float = DAMP,
    act_order: bool = True,
    block: int = BLOCK,
) -> np.ndarray:
    """Integers ``q`` (``|q| <= 127``) for weights ``w`` ``[G, R, K]`` (G groups of R output
    channels), ``H`` ``[G, K, K]`` and per-channel scales ``[G, R]``; each channel's largest
    ``|w|`` gets ``±127``. ``act_order``: columns in decreasing ``diag(H)`` (GPTQ's choice;
    the inputs that matter most are rounded while the most columns are left to absorb their
    error)."""
    groups, rows, k = w.shape
    keep_col = np.abs(w).argmax(axis=2)
    keep_q = np.sign(np.take_along_axis(w, keep_col[..., None], 2)[..., 0]) * INT8_MAX
    h = _damped(h, damp)
    if act_order:
        perm = np.argsort(-np.diagonal(h, axis1=1, axis2=2), axis=1, kind="stable")
    else:
        perm = np.tile(np.arange(k), (groups, 1))
    inverse = np.argsort(perm, axis=1)
    h = h[np.arange(groups)[:, None, None], perm[:, :, None], perm[:, None, :]]
    u = _upper_inverse_cholesky(h)
    del h  # a large layer's H is hundreds of MiB: hold as few copies as possible
    w = np.take_along_axis(w.astype(np.float64), perm[:, None, :], 2)
    keep_pos = np.take_along_axis(inverse, keep_col, 1)
    q = np.zeros_like(w)
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        wb = w[:, :, b0:b1].copy()
        errs = np.empty_like(wb)
        for j in range(b1 - b0):
            i = b0 + j
            col = wb[:, :, j]
            qi = np.clip(np.rint(col / scale), -INT8_MAX, INT8_MAX)
            qi = np.where(keep_pos == i, keep_q, qi)
            q[:, :, i] = qi
            err = (col - qi * scale) / u[:, i, i][:, None]
            wb[:, :, j + 1 :] -= err[:, :, None] * u[:, None, i, i + 1 : b1]
            errs[:, :, j] = err
        w[:, :, b1:] -= errs @ u[:, b0:b1, b1:]
    return np.take_along_axis(q, inverse[:, None, :], 2).astype(np.int32)


def nearest(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Round-to-nearest integers, as quantizing with ``scale`` gives them."""
    return np.clip(np.rint(w / scale[..., None]), -INT8_MAX, INT8_MAX).astype(np.int32)


def output_error(dw: np.ndarray, h: np.ndarray) -> float:
    """``sum_g tr(dW_g H_g dW_g^T)``: the energy of the layer's output change on the rows."""
    return float(channel_errors(dw, h).sum())


def channel_errors(dw: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each output channel's share ``dW_o H dW_o^T`` of :func:`output_error` (``[G, R]``)."""
    return ((dw @ h) * dw).sum(axis=-1)


def sqnr_db(signal: float, error: float) -> float:
    if error <= 0:
        return float("inf")
    return 10 * float(np.log10(signal / error)) if signal > 0 else float("-inf")


# --------------------------------------------------------------------------- one layer


@dataclass
class Rounded:
    """A layer's rounding: its new stored weight and the record, or why it is left alone."""

    values: np.ndarray | None
    change: LayerChange | None
    reason: str = ""


def round_layer(layer: Layer, hess: Hessian) -> Rounded:
    """GPTQ on one layer, fit on the rows of most items and judged on those of the items held
    out (:data:`HELD_EVERY`; in-sample when there were too few items). The output error is a
    sum over output channels, so each channel takes GPTQ's integers only where they lower its
    own held-out error, else its nearest ones; the layer keeps the result only if its held-out
    output error drops below round-to-nearest's (both exact on those rows)."""
    g, k = layer.groups, layer.k
    w = layer.matrix().astype(np.float64).reshape(g, -1, k)
    fit, held = hess.fit, hess.held
    judge = fit if held is None else held
    if not (np.isfinite(fit).all() and np.isfinite(judge).all()):
        return Rounded(None, None, "its H is not finite")
    own = weight_scale(layer.values, layer.axis).astype(np.float64).reshape(g, -1)
    scale = grid_scale(layer.values, layer.axis).astype(np.float64).reshape(g, -1)
    adaptive = None
    for damp in DAMP_RETRIES:
        try:
            adaptive = gptq(w, fit, scale, damp=damp)
            break
        except np.linalg.LinAlgError:
            continue
    if adaptive is None:
        return Rounded(
            None, None, f"H^-1 has no Cholesky factor (damping up to {DAMP_RETRIES[-1]})"
        )
    near = nearest(w, scale)
    adaptive_errors = channel_errors(_on_grid(adaptive, scale) - w, judge)
    near_errors = channel_errors(_on_grid(near, scale) - w, judge)
    q = np.where((adaptive_errors < near_errors)[..., None], adaptive, near)
    new = _on_grid(q, scale)
    signal = output_error(w, judge)
    before = output_error(_on_grid(nearest(w, own), own) - w, judge)  # the original's INT8 form
    after = output_error(new - w, judge)
    on = "on held-out samples" if held is not None else "in-sample: too few samples to hold out"
    if not after < before * (1 - KEEP_MARGIN):
        return Rounded(
            None,
            None,
            f"adaptive rounding did not lower its output error {on} ({after:.4g} vs {before:.4g})",
        )
    moved = int((q != near).sum())
    worse = int((adaptive_errors > near_errors).sum())
    detail = (
        f"{layer.weight}: {moved} of {q.size} weights rounded away from nearest"
        f"{_nearest_text(worse, layer.cout)} "
        f"(H from {hess.rows} rows{_groups_text(g)}; judged {on})"
    )
    change = LayerChange(
        layer.label,
        detail,
        sqnr_db(signal, before),
        sqnr_db(signal, after),
        "layer output SQNR (dB)",
    )
    return Rounded(layer.stored(new.reshape(layer.cout, k).astype(np.float32)), change)


def _on_grid(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float32 weights ``q * s`` (what DequantizeLinear gives), as float64."""
    return (q * scale[..., None]).astype(np.float32).astype(np.float64)


def _nearest_text(kept: int, channels: int) -> str:
    """Channels where GPTQ's integers were worse than the nearest ones, which they keep."""
    return f", {kept} of {channels} channels kept at nearest" if kept else ""


def _groups_text(groups: int) -> str:
    return f", {groups} groups" if groups > 1 else ""


# --------------------------------------------------------------------------- the pass


def round_weights(
    model: onnx.ModelProto,
    data: DataSource,
    *,
    provider: str | None = None,
    max_rows: int = 4096,
    layers: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Refined:
    """A copy of ``model`` whose Conv/Gemm/MatMul weight initializers are rounded adaptively
    on their INT8 grid (see the module's doc), with each rounded layer's output SQNR before
    (round-to-nearest) and after.

    ``layers``: node names to consider (default: all). ``max_rows``: input rows sampled per
    item of a layer's input. ``progress``: called with ``1`` after each batch read (the
    ``advance`` of :func:`quantbench.progress.progress_bar`); by default quantbench's own bar
    is drawn (on a terminal; elsewhere a line at most every 30 s)."""
    start = time.perf_counter()
    refined = onnx.ModelProto()
    refined.CopyFrom(model)
    found, skipped = find_layers(model, layers)
    if not found:
        return Refined(
            ROUNDING,
            refined,
            seconds=time.perf_counter() - start,
            skipped=_why(skipped, "no layer to round"),
        )
    total = len(data.batch_starts) * len(plan_passes(found)) if data.batch_starts else None
    changes: list[LayerChange] = []
    inits = {init.name: init for init in refined.graph.initializer}
    with _advance(progress, total) as advance:
        passes = hessian_passes(
            model, data, found, provider=provider, max_rows=max_rows, advance=advance
        )
        for hessians in passes:
            for label, hess in hessians.items():
                result = round_layer(hess.layer, hess)
                if result.change is None or result.values is None:
                    skipped[label] = result.reason
                    continue
                weight = hess.layer.weight
                inits[weight].CopyFrom(numpy_helper.from_array(result.values, weight))
                changes.append(result.change)
    seconds = time.perf_counter() - start
    why = "" if changes else _why(skipped, "no layer's output error was lowered")
    return Refined(ROUNDING, refined, changes, seconds, why)


def _why(skipped: dict[str, str], headline: str) -> str:
    if not skipped:
        return f"{headline}: the model has no Conv, Gemm or MatMul with a constant weight"
    return f"{headline}: " + "; ".join(f"{name}: {reason}" for name, reason in skipped.items())


@contextmanager
def _advance(
    progress: Callable[[int], None] | None, total: int | None
) -> Iterator[Callable[[int], None]]:
    if progress is not None:
        yield progress
        return
    with progress_bar("Rounding weights", total, unit="batches") as advance:
        yield advance


# --------------------------------------------------------------------------- the guard


def verify_on_grid(
    refined: onnx.ModelProto,
    qdq: onnx.ModelProto,
    unrounded: onnx.ModelProto,
    nodes: Iterable[str],
) -> int:
    """A bug guard on what rounding promises both TensorRT paths, for each rounded node's
    weight that the Q/DQ model quantizes: (a) the refined weight is exactly ``q * s`` with
    integers ``|q| <= 127`` for the Q/DQ model's per-channel scale ``s`` (so its
    Quantize/Dequantize pair gives it back bit for bit); (b) TensorRT's implicit weight scale,
    ``max|w| / 127`` per channel of the refined FP32 model, is that ``s`` and the unrounded
    weight's. The number of weights checked; QuantbenchError naming the first that fails."""
    labels = dict(zip(node_labels(refined.graph.node), refined.graph.node))
    weights = {i.name: i for i in refined.graph.initializer}
    before = {i.name: i for i in unrounded.graph.initializer}
    qdq_inits = {i.name: i for i in qdq.graph.initializer}
    quantizers = {n.input[0]: n for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    checked = 0
    for label in nodes:
        node = labels.get(label)
        if node is None or len(node.input) < 2 or node.input[1] not in quantizers:
            continue
        name = node.input[1]
        q_node = quantizers[name]
        w = numpy_helper.to_array(weights[name])
        s = numpy_helper.to_array(qdq_inits[q_node.input[1]]).astype(np.float32)
        axis = next((a.i for a in q_node.attribute if a.name == "axis"), 1) % w.ndim
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.rint(w / s.reshape(shape)), -INT8_MAX, INT8_MAX)
        problem = ""
        if not np.array_equal((q * s.reshape(shape)).astype(np.float32), w):
            problem = "is not exactly q * s on the Q/DQ model's grid"
        elif not np.array_equal(weight_scale(w, axis), s):
            problem = "has a max|w| / 127 per channel (TensorRT's implicit scale) other than s"
        elif not np.array_equal(weight_scale(numpy_helper.to_array(before[name]), axis), s):
            problem = "has another per-channel scale than before rounding"
        if problem:
            raise QuantbenchError(
                f"internal error: rounded weight {name!r} of {label} {problem}; please report"
            )
        checked += 1
    return checked
