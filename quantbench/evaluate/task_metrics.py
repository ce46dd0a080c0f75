"""User task metrics: ``--metric-script FILE.py[:NAME]`` (default NAME ``metric``).

NAME is either

* a function ``(fp32, candidate, labels) -> dict[str, float]`` called once with every output
  over the whole evaluation set (``fp32``/``candidate``: output name -> array, samples
  concatenated on axis 0; ``labels``: the ``--labels`` array or None), or
* a class (torchmetrics' convention, bounded memory): a fresh instance per evaluation,
  ``update(fp32, candidate, labels)`` per batch, then ``compute() -> dict[str, float]``.

Higher is better, except names ending in ``_drop``. A NaN result is an undefined metric
(``None``). Every failure of the script is one line naming it (exit 2). This module imports only
numpy and :mod:`quantbench.errors`, so any layer may use it.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantbench.data.userscript import load_user_object
from quantbench.errors import QuantbenchError, first_line

DEFAULT_NAME = "metric"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class MetricScript:
    """A loaded metric script: where it is and the function or class it names."""

    where: str
    target: Any
    is_class: bool
    reserved: frozenset[str] = frozenset()

    def session(self) -> MetricSession:
        """A fresh accumulation (one per evaluated model)."""
        if self.is_class:
            instance = self._call("__init__", self.target)
            return MetricSession(self, instance)
        return MetricSession(self, None)

    def _call(self, what: str, func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except QuantbenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's script failed
            raise QuantbenchError(
                f"{self.where}: metric script failed in {what}: "
                f"{type(exc).__name__}: {first_line(exc)}"
            ) from None


class MetricSession:
    """Feeds one candidate's batches to the script; :meth:`compute` gives its numbers."""

    def __init__(self, script: MetricScript, instance: Any) -> None:
        self.script = script
        self.instance = instance
        self.batches: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
        self.labels: list[np.ndarray] = []

    def update(self, fp32: Outputs, candidate: Outputs, labels: np.ndarray | None) -> None:
        if self.instance is not None:
            self.script._call("update", self.instance.update, dict(fp32), dict(candidate), labels)
            return
        self.batches.append((dict(fp32), dict(candidate)))
        if labels is not None:
            self.labels.append(np.asarray(labels))

    def compute(self) -> dict[str, float | None]:
        if self.instance is not None:
            result = self.script._call("compute", self.instance.compute)
        else:
            fp32 = _concat([b[0] for b in self.batches])
            cand = _concat([b[1] for b in self.batches])
            labels = np.concatenate(self.labels) if self.labels else None
            self.batches = []
            result = self.script._call("the call", self.script.target, fp32, cand, labels)
        return self._checked(result)

    def _checked(self, result: Any) -> dict[str, float | None]:
        where = self.script.where
        if not isinstance(result, Mapping) or not result:
            raise QuantbenchError(
                f"{where}: must return a non-empty dict of metric name -> number, "
                f"got {type(result).__name__}"
            )
        out: dict[str, float | None] = {}
        for key, value in result.items():
            if not isinstance(key, str) or not _NAME.match(key):
                raise QuantbenchError(f"{where}: metric name {key!r} is not an identifier")
            if key in self.script.reserved:
                raise QuantbenchError(
                    f"{where}: metric name {key!r} is a built-in metric; rename it"
                )
            number = np.asarray(value) if isinstance(value, np.ndarray) else value
            if isinstance(number, np.ndarray) and number.size == 1:
                number = number.reshape(()).item()
            if isinstance(number, bool) or not isinstance(number, numbers.Real):
                raise QuantbenchError(
                    f"{where}: metric {key!r} is {type(value).__name__}, not a number"
                )
            number = float(number)
            out[key] = None if math.isnan(number) else number
        return out


def _concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not batches:
        return {}
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def split_spec(spec: str | Path) -> tuple[Path, str]:
    """``"m.py:NAME"`` -> (Path("m.py"), "NAME"); without ``:NAME`` the default name."""
    text = str(spec)
    head, sep, name = text.rpartition(":")
    if sep and head.endswith(".py") and name:
        return Path(head), name
    return Path(text), DEFAULT_NAME


def load_metric_script(spec: str | Path, reserved: Collection[str] = ()) -> MetricScript:
    """Import ``FILE.py[:NAME]`` and check that NAME is a metric function or class."""
    path, name = split_spec(spec)
    where = f"{path}:{name}"
    target = load_user_object(path, name, "metric script")
    if inspect.isclass(target):
        missing = [m for m in ("update", "compute") if not callable(getattr(target, m, None))]
        if missing:
            raise QuantbenchError(f"{where}: a metric class needs {' and '.join(missing)}()")
        return MetricScript(where, target, True, frozenset(reserved))
    if not callable(target):
        raise QuantbenchError(f"{where}: is neither a function nor a class")
    return MetricScript(where, target, False, frozenset(reserved))
