"""Custom ONNX ops that plugins add (DWConv2D): the hook through which the core handles them.

The core checks models (onnx.checker) and runs them (onnxruntime) without knowing any plugin:
a plugin depends on the core and registers a :class:`CustomOp` here, saying how to make a model
holding its op checkable, how to lower it to standard ONNX, and (optionally, :class:`OpRuntime`)
how onnxruntime runs the op itself through a custom-op library. Bundled plugins are found by the
op type they provide (:data:`BUNDLED`, the in-tree equivalent of an entry point) and imported
only when a model contains that op, so the dependency goes plugin -> core, never the reverse.

How onnxruntime runs plugin ops (:func:`for_onnxruntime`) is one setting for the process,
``$QUANTBENCH_PLUGIN_OPS`` (the CLI's ``--dwconv2d-op``, :func:`executing`), so that worker
processes (``--executor processes``) run them as the command does: ``plugin`` (the op itself,
on the CPU; the default), ``plugin:cuda`` (its CUDA kernels) or ``lower`` (standard ONNX).
Where the op's runtime is missing (an extra not installed), the op is lowered and that is said
once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import onnx

from quantbench.errors import QuantbenchError
from quantbench.progress import warn

ModelRewrite = Callable[[onnx.ModelProto], onnx.ModelProto]
F = TypeVar("F", bound=Callable[..., Any])

#: op type -> module of the bundled plugin that registers it on import.
BUNDLED = {"DWConv2D": "quantbench.plugins.dwconv2d"}

#: the process's choice of how onnxruntime runs plugin ops (see the module docstring)
EXECUTION_ENV = "QUANTBENCH_PLUGIN_OPS"
EXECUTIONS = ("plugin", "plugin:cpu", "plugin:cuda", "lower")
DEFAULT_EXECUTION = "plugin"


@dataclass(frozen=True)
class OpRuntime:
    """How onnxruntime runs a plugin op as itself rather than lowered."""

    #: why it cannot here (e.g. an extra not installed), None when it can
    missing: Callable[[], str | None]
    #: (model, device) -> the copy a session with the library runs; raises QuantbenchError
    #: (one line) for a device that cannot run it
    rewrite: Callable[[onnx.ModelProto, str], onnx.ModelProto]
    #: registers the custom-op library on an onnxruntime ``SessionOptions``
    register: Callable[[Any], None]
    #: errors the op met while running (an op inside onnxruntime cannot raise), taken once
    take_errors: Callable[[], list[BaseException]]


@dataclass(frozen=True)
class CustomOp:
    """What the core needs to know about a plugin op; the rewrites return a new model."""

    op_type: str
    checkable: ModelRewrite  # a copy onnx.checker accepts
    lowered: ModelRewrite  # standard ONNX that onnxruntime runs
    runtime: OpRuntime | None = None  # onnxruntime runs the op itself


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


# --------------------------------------------------------------------------- execution


def check_execution(mode: str) -> str:
    """``mode`` checked (one-line error), ``plugin:cpu`` spelled ``plugin``."""
    mode = mode.strip().lower()
    if mode not in EXECUTIONS:
        raise QuantbenchError(
            f"--dwconv2d-op must be one of {', '.join(EXECUTIONS)}, not {mode!r}"
        )
    return "plugin" if mode == "plugin:cpu" else mode


def execution() -> str:
    """How plugin ops run in onnxruntime now (``$QUANTBENCH_PLUGIN_OPS``, default plugin)."""
    return check_execution(os.environ.get(EXECUTION_ENV) or DEFAULT_EXECUTION)


@contextlib.contextmanager
def executing(mode: str | None) -> Iterator[None]:
    """Run plugin ops as ``mode`` for the block (None: leave the setting as it is)."""
    if mode is None:
        yield
        return
    before = os.environ.get(EXECUTION_ENV)
    os.environ[EXECUTION_ENV] = check_execution(mode)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(EXECUTION_ENV, None)
        else:
            os.environ[EXECUTION_ENV] = before


def executes_as(parameter: str) -> Callable[[F], F]:
    """Decorator: the function runs plugin ops as its argument ``parameter`` says
    (:func:`executing`; None: the process's setting), checked before its body starts."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            mode = signature.bind(*args, **kwargs).arguments.get(parameter)
            with executing(mode):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


@dataclass
class Runnable:
    """A model as onnxruntime runs it, with what its session options need."""

    model: onnx.ModelProto
    #: called with the ``SessionOptions`` of every session over ``model``
    registrations: list[Callable[[Any], None]] = field(default_factory=list)
    #: op type -> how it runs: "plugin op, cpu", "plugin op, cuda" or "lowered"
    how: dict[str, str] = field(default_factory=dict)

    def register(self, options: Any) -> None:
        for registration in self.registrations:
            registration(options)


_SAID: set[str] = set()


def for_onnxruntime(model: onnx.ModelProto) -> Runnable:
    """``model`` with each plugin op either kept as itself for its custom-op library (the
    op's runtime is present and :func:`execution` is not ``lower``) or lowered to standard
    ONNX; a missing runtime is said once, then the op is lowered."""
    mode = execution()
    out = Runnable(model)
    for op in ops_in(model):
        if mode != "lower" and op.runtime is not None:
            reason = op.runtime.missing()
            if reason is None:
                device = mode.partition(":")[2] or "cpu"
                out.model = op.runtime.rewrite(out.model, device)
                out.registrations.append(op.runtime.register)
                out.how[op.op_type] = f"plugin op, {device}"
                continue
            if op.op_type not in _SAID:
                _SAID.add(op.op_type)
                warn(
                    f"{op.op_type}: {reason}; onnxruntime runs it lowered to standard ONNX "
                    "instead of as the plugin op"
                )
        out.model = op.lowered(out.model)
        out.how[op.op_type] = "lowered"
    return out


_COLLECTING = [0]
_COLLECTING_LOCK = threading.Lock()


@contextlib.contextmanager
def collecting() -> Iterator[None]:
    """Runs in this block have their plugin ops' errors raised afterwards
    (:func:`raise_run_errors`), so an op need not print them itself."""
    with _COLLECTING_LOCK:
        _COLLECTING[0] += 1
    try:
        yield
    finally:
        with _COLLECTING_LOCK:
            _COLLECTING[0] -= 1


def errors_collected() -> bool:
    """Whether a run now in progress has its plugin ops' errors raised afterwards."""
    return _COLLECTING[0] > 0


def raise_run_errors() -> None:
    """Raise the first error a plugin op met inside onnxruntime since the last call (a
    KeyboardInterrupt as itself, else one QuantbenchError line)."""
    errors = [e for op in _REGISTRY.values() if op.runtime for e in op.runtime.take_errors()]
    for error in errors:
        if isinstance(error, KeyboardInterrupt):
            raise error
    if errors:
        raise QuantbenchError(str(errors[0]).strip().splitlines()[0]) from None
