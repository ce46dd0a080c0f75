"""Errors and the exit codes the CLI gives them.

0 success; 1 a ``--fail-below`` gate or ``recover --target`` missed (:class:`ThresholdFailed`);
2 a user mistake (:class:`QuantbenchError`: bad file, wrong tensor name, ...), one line; 3 an
internal error (:class:`InternalError`, or any other exception): a bug in quantbench, reported as
one line plus where the traceback was saved (``QUANTBENCH_DEBUG=1`` prints it instead).
"""

from __future__ import annotations


class QuantbenchError(Exception):
    """An error caused by the user's input, reported as one line (exit code 2)."""

    exit_code = 2


class ThresholdFailed(QuantbenchError):
    """A `--fail-below` gate was missed (exit code 1, so CI can tell it from bad input)."""

    exit_code = 1


class InternalError(Exception):
    """Something quantbench itself got wrong (e.g. onnxruntime rejects a model quantbench
    generated from a model it accepts): exit code 3, with a request to report it."""

    exit_code = 3


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries like onnx and onnxruntime write
    multi-line errors; a user error is reported as one line)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
