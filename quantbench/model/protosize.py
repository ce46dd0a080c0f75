"""Models over protobuf's 2 GiB limit: protobuf cannot serialise them, so onnxruntime gets a
file with the large tensors beside it (ONNX external data) and hashes are taken piecewise.

A 2.35 GB model made calibrate fail with an EncodeError; everything that hands a model proto
to onnxruntime or hashes one goes through here.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import EncodeError

from quantbench.errors import QuantbenchError
from quantbench.fileio import atomic_path, write_bytes_atomic

#: tensors of at least this many bytes go beside a model too large to serialise
_EXTERNAL_MIN_BYTES = 1024
#: what protobuf raises for a message of 2 GiB or more (EncodeError; older versions ValueError)
_TOO_LARGE = (EncodeError, ValueError)


@contextlib.contextmanager
def loadable(model: bytes | str | onnx.ModelProto) -> Iterator[bytes | str]:
    """What ``ort.InferenceSession`` takes for ``model``: bytes and paths as they are, a proto
    serialised, or, where it is too large to serialise (a model over 2 GiB: calibrating one
    failed with protobuf's EncodeError), the path of a temporary copy whose large tensors lie
    in a file beside it, removed when the block ends. ``model`` itself is never modified."""
    if not isinstance(model, onnx.ModelProto):
        yield model
        return
    data = serialized(model)
    if data is not None:
        yield data
        return
    # ignore_cleanup_errors: where a session still maps the file (Windows) it stays behind
    with tempfile.TemporaryDirectory(
        prefix="quantbench-ort-", ignore_cleanup_errors=True
    ) as folder:
        yield str(_save_apart(model, Path(folder)))


@dataclass
class WeightsApart:
    """A model as onnxruntime can take it without a copy of its weights: the bytes of the
    model whose large initializers are ONNX external-data placeholders, and their values by
    name (given to the session with ``SessionOptions.add_external_initializers``, which uses
    the buffers in place). Serialising a 54 MB model and onnxruntime parsing the bytes made two
    more copies of its weights at every session start (``--method auto`` starts one a
    candidate); here the only one is the arrays', and the session reads them while it lives."""

    light: bytes
    weights: dict[str, np.ndarray]

    def whole(self) -> onnx.ModelProto:
        """The model with its weights back in it (where onnxruntime refuses them apart)."""
        model = onnx.ModelProto.FromString(self.light)
        for t in model.graph.initializer:
            if t.name in self.weights and t.data_location == onnx.TensorProto.EXTERNAL:
                t.ClearField("external_data")
                t.ClearField("data_location")
                t.raw_data = self.weights[t.name].tobytes()
        return model


#: ONNX element types whose raw data is a numpy array of this dtype (little-endian, as ONNX
#: stores raw data)
_RAW_DTYPES = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64,
}


class SharedWeights:
    """The arrays of one model's large initializers, each made once and given to every session
    over a model built from it (``auto``'s FP32 reference, isolated twins and Q/DQ
    candidates) whose initializer of that name holds the same tensor (compared whole, so a
    refined or rescaled weight of the same name gets its own array)."""

    def __init__(self, model: onnx.ModelProto):
        self._source = {t.name: t for t in model.graph.initializer if _apart_dtype(t)}
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, tensor: onnx.TensorProto) -> np.ndarray | None:
        """The array of the source's initializer equal to ``tensor``, or None."""
        source = self._source.get(tensor.name)
        if source is None or not (source is tensor or source == tensor):
            return None
        if tensor.name not in self._arrays:
            self._arrays[tensor.name] = _raw_array(source)
        return self._arrays[tensor.name]


def _apart_dtype(t: onnx.TensorProto) -> type | None:
    """The numpy dtype of a large raw-data initializer :func:`weights_apart` puts apart."""
    dtype = _RAW_DTYPES.get(t.data_type)
    if dtype is None or not t.HasField("raw_data") or t.ByteSize() < _EXTERNAL_MIN_BYTES:
        return None
    return dtype


def _raw_array(t: onnx.TensorProto) -> np.ndarray:
    return np.frombuffer(t.raw_data, _RAW_DTYPES[t.data_type]).reshape(tuple(t.dims))


def weights_apart(
    model: onnx.ModelProto, shared: SharedWeights | None = None
) -> WeightsApart | None:
    """``model`` as :class:`WeightsApart` (its large raw-data initializers apart: ``shared``'s
    array where it has the same tensor, else one copy of its bytes), or None where none is
    large or the light part cannot be serialised. Built field by field; ``model`` is only
    read."""
    if sys.byteorder != "little":
        return None
    light = _without_initializers(model)
    weights: dict[str, np.ndarray] = {}
    # onnxruntime drops an initializer no node reads before it takes the external ones, and
    # then refuses the name; one that is also a graph input is an overridable default
    read = {name for node in model.graph.node for name in node.input}
    read.difference_update(i.name for i in model.graph.input)
    for t in model.graph.initializer:
        if _apart_dtype(t) is None or t.name not in read:
            light.graph.initializer.add().CopyFrom(t)
            continue
        known = shared.array(t) if shared is not None else None
        weights[t.name] = known if known is not None else _raw_array(t)
        _add_placeholder(light, t, {"location": "quantbench-in-memory"})
    data = serialized(light) if weights else None
    return None if data is None else WeightsApart(data, weights)


def _save_apart(model: onnx.ModelProto, folder: Path) -> Path:
    """``model`` saved into ``folder`` as model.onnx, its large initializers in tensors.bin."""
    path = folder / "model.onnx"
    path.write_bytes(_light_bytes(_apart(model, folder / "tensors.bin", "tensors.bin")))
    return path


def _apart(model: onnx.ModelProto, data_path: Path, location: str) -> onnx.ModelProto:
    """A light copy of ``model`` whose large initializers are written to ``data_path`` and
    referenced as ONNX external data at ``location`` (relative to the model file). Built field
    by field: no copy of the whole model is made, and ``model`` is only read (other threads
    may be reading it too)."""
    light = _without_initializers(model)
    with open(data_path, "wb") as data:
        for t in model.graph.initializer:
            if t.ByteSize() < _EXTERNAL_MIN_BYTES or not t.HasField("raw_data"):
                light.graph.initializer.add().CopyFrom(t)
                continue
            offset = data.tell()
            data.write(t.raw_data)
            where = {"location": location, "offset": offset, "length": len(t.raw_data)}
            _add_placeholder(light, t, where)
    return light


def _add_placeholder(light: onnx.ModelProto, t: onnx.TensorProto, where: dict) -> None:
    """Add to ``light``'s initializers ``t`` without its data: every other field of it, marked
    ONNX external data at ``where`` (key -> value of its ``external_data`` entries)."""
    apart = light.graph.initializer.add()
    _copy_fields(t, apart, skip="raw_data")
    apart.data_location = onnx.TensorProto.EXTERNAL
    for key, value in where.items():
        entry = apart.external_data.add()
        entry.key, entry.value = key, str(value)


def _light_bytes(light: onnx.ModelProto) -> bytes:
    data = serialized(light)
    if data is None:
        raise QuantbenchError(
            "the model is over 2 GiB even with its initializers apart (large Constant nodes or "
            "non-raw tensors): it cannot be written or loaded"
        )
    return data


def save_model(model: onnx.ModelProto, path: str | Path) -> Path:
    """``model`` written atomically to ``path``; one too large to serialise gets its large
    tensors in ``<name>.data`` beside it (ONNX external data, what onnx.load, onnxruntime and
    TensorRT's parser read), written before the model file that points to it."""
    data = serialized(model)
    if data is not None:
        return write_bytes_atomic(path, data)
    target = Path(path)
    location = f"{target.name}.data"
    with atomic_path(target.parent / location) as tmp:
        light = _apart(model, tmp, location)
    return write_bytes_atomic(target, _light_bytes(light))


def check_model(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model``; a model too large to serialise is checked from a saved
    copy, the checker's own way for models over 2 GiB."""
    try:
        onnx.checker.check_model(model)
    except _TOO_LARGE as exc:
        if not _size_error(exc):
            raise
        with tempfile.TemporaryDirectory(prefix="quantbench-check-") as folder:
            onnx.checker.check_model(str(_save_apart(model, Path(folder))))


def _size_error(exc: Exception) -> bool:
    """Whether protobuf refused a message for its size (not a ValueError about its content)."""
    text = str(exc)
    return isinstance(exc, EncodeError) or "2GB" in text or "protobuf size" in text


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Everything of ``model`` but its graph's initializers, built field by field (no copy of
    the whole model is made)."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    return light


def _copy_fields(source: object, target: object, skip: str) -> None:
    """Every set field of protobuf message ``source`` but ``skip`` into ``target``."""
    for field, value in source.ListFields():  # type: ignore[attr-defined]
        if field.name == skip:
            continue
        into = getattr(target, field.name)
        if hasattr(into, "extend"):
            into.extend(value)
        elif hasattr(into, "CopyFrom"):
            into.CopyFrom(value)
        else:
            setattr(target, field.name, value)


def serialized(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, or None where protobuf cannot serialise it (2 GiB or more)."""
    try:
        return model.SerializeToString()
    except _TOO_LARGE as exc:
        if not _size_error(exc):
            raise
        return None


def digest(model: onnx.ModelProto) -> str:
    """sha256 of the serialised model; for one too large to serialise, of its initializers
    one by one and then of everything else (a different value, as stable)."""
    data = serialized(model)
    if data is not None:
        return hashlib.sha256(data).hexdigest()
    h = hashlib.sha256(b"piecewise")
    for t in model.graph.initializer:
        h.update(_tensor_bytes(t))
    h.update(_light_bytes(_without_initializers(model)))
    return h.hexdigest()


def _tensor_bytes(tensor: onnx.TensorProto) -> bytes:
    """The tensor's bytes for hashing; one tensor of 2 GiB or more (only raw data can be that
    large) as its other fields and then its raw data, which protobuf cannot serialise."""
    try:
        return tensor.SerializeToString()
    except _TOO_LARGE as exc:
        if not _size_error(exc):
            raise
    head = onnx.TensorProto()
    _copy_fields(tensor, head, skip="raw_data")
    return head.SerializeToString() + tensor.raw_data
