"""Candidate models that differ only in small constants, run through one onnxruntime session.

``--method auto``'s candidates are one Q/DQ graph with other scales. Each used to get a session
of its own, and a session's graph optimisation and load cost 0.1-0.6 s on the corpus (more
than scoring the slice on small models). Here the candidates are grouped by everything but
their small initializers; in a group the initializers whose values differ become inputs of one
session, fed with each run. The values computed are the same: a QuantizeLinear reads its scale
alike from an initializer or an input, and the constants all candidates share (the weights,
their scales) stay constants, folded as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: initializers of at most this many elements may differ inside a group (scales and zero
#: points, per tensor or per channel); a larger one that differs (a weight) splits the group
SMALL_ELEMENTS = 1 << 14


class Runner(Protocol):
    def infer(self, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None) -> Any: ...

    def close(self) -> None: ...


@dataclass
class _Print:
    """What decides whether two models share a session: their graph without initializer
    values and their large initializers (one digest), and their small initializers' values."""

    key: bytes
    small: dict[str, np.ndarray]


#: model fields that do not change what a session computes (the embedded calibration table)
_INERT = frozenset({"metadata_props", "doc_string"})


def _fingerprint(model: onnx.ModelProto, source: Mapping[str, onnx.TensorProto]) -> _Print:
    """``model``'s print; a large initializer equal to ``source``'s of its name (a weight the
    candidate took unchanged: compared in place, 3 ms for dddd-ocr's 54 MB) is not hashed
    (0.2 s a candidate there)."""
    digest = hashlib.blake2b(digest_size=32)
    _digest_fields(digest, model, skip=_INERT | {"graph"})
    _digest_fields(digest, model.graph, skip={"initializer", "doc_string"})
    small: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        digest.update(f"{t.name}|{t.data_type}|{list(t.dims)}".encode())
        if int(np.prod(t.dims, dtype=np.int64)) <= SMALL_ELEMENTS:
            small[t.name] = numpy_helper.to_array(t)
        elif (known := source.get(t.name)) is not None and (known is t or known == t):
            digest.update(b"=source")
        else:
            digest.update(t.SerializeToString(deterministic=True))
    return _Print(digest.digest(), small)


def _digest_fields(digest: Any, message: Any, skip: frozenset[str] | set[str]) -> None:
    """Add each field of ``message`` but ``skip`` to ``digest`` (messages serialised)."""
    for field_, value in message.ListFields():
        if field_.name in skip:
            continue
        digest.update(field_.name.encode())
        if field_.message_type is None:
            digest.update(repr(value).encode())
            continue
        for item in [value] if hasattr(value, "SerializeToString") else value:  # one or many
            digest.update(item.SerializeToString(deterministic=True))


@dataclass
class _Group:
    """Candidates sharing one session: the names fed, each member's feeds, the members not
    yet closed and the session while one is open."""

    first: Hashable
    fed: list[str] = field(default_factory=list)
    feeds: dict[Hashable, dict[str, np.ndarray]] = field(default_factory=dict)
    open_members: set[Hashable] = field(default_factory=set)
    runner: Runner | None = None


class _Fed:
    """One member's view of its group's session: its own constants added to every feed."""

    def __init__(self, group: _Group, member: Hashable, release: Callable[[Hashable], None]):
        self._group, self._member, self._release = group, member, release

    def infer(self, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None) -> Any:
        assert self._group.runner is not None
        return self._group.runner.infer({**feeds, **self._group.feeds[self._member]}, outputs)

    def close(self) -> None:
        self._release(self._member)


class VariantSessions:
    """A runner per candidate, candidates that differ only in small constants sharing one
    session (module doc). ``build(key)`` gives a candidate's model (called once for each to
    compare them, and again for the first of each group); ``open(model)`` makes a runner of
    a model. A group's session is made when its first member's runner is asked for and closed
    when the last member's is: with members scored one after another, one session is alive.
    ``source``: the model the candidates were built from, whose weights they mostly share."""

    def __init__(
        self,
        keys: list[Hashable],
        build: Callable[[Hashable], onnx.ModelProto],
        open_runner: Callable[[onnx.ModelProto], Runner],
        source: onnx.ModelProto | None = None,
    ):
        self._build, self._open = build, open_runner
        self._group_of: dict[Hashable, _Group] = {}
        if len(keys) < 2:  # nothing to share: no model is built twice
            self._group_of = {k: _Group(k, open_members={k}) for k in keys}
            return
        weights = {t.name: t for t in source.graph.initializer} if source is not None else {}
        groups: dict[bytes, tuple[_Group, dict[str, np.ndarray]]] = {}
        prints = {}
        for key in keys:
            found = _fingerprint(build(key), weights)
            prints[key] = found
            group, small = groups.setdefault(found.key, (_Group(key), found.small))
            varying = [n for n, v in found.small.items() if not np.array_equal(v, small[n])]
            group.fed = sorted(set(group.fed) | set(varying))
            group.open_members.add(key)
            self._group_of[key] = group
        for key, group in self._group_of.items():
            group.feeds[key] = {n: prints[key].small[n] for n in group.fed}

    def runner(self, key: Hashable) -> Runner:
        """``key``'s runner (close it when done with it)."""
        group = self._group_of[key]
        if not group.fed:  # alone, or identical to the rest of its group: its own session
            return self._open(self._build(key))
        if group.runner is None:
            group.runner = self._open(fed_model(self._build(group.first), group.fed))
        return _Fed(group, key, self._release)

    def _release(self, key: Hashable) -> None:
        group = self._group_of[key]
        group.open_members.discard(key)
        if not group.open_members and group.runner is not None:
            group.runner.close()
            group.runner = None


def fed_model(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """``model`` (edited in place) with the initializers ``names`` turned into graph inputs."""
    wanted = set(names)
    kept = [t for t in model.graph.initializer if t.name not in wanted]
    moved = [t for t in model.graph.initializer if t.name in wanted]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    present = {i.name for i in model.graph.input}
    model.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in moved
        if t.name not in present
    )
    return model
