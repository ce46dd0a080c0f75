"""User-facing errors.

A :class:`QuantbenchError` is a user mistake (bad file, wrong tensor name, ...). The CLI prints its
message as one line and exits with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class QuantbenchError(Exception):
    """An error caused by the user's input, reported as one line (exit code 2)."""

    exit_code = 2


class ThresholdFailed(QuantbenchError):
    """A `--fail-below` gate was missed (exit code 1, so CI can tell it from bad input)."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries like onnx and onnxruntime write
    multi-line errors; a user error is reported as one line)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
