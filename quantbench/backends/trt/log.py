"""A TensorRT logger that remembers what TensorRT said, so errors can quote it.

TensorRT reports why a parse, build or deserialization failed only through its ILogger; the API
call just returns None/False. Keeping the messages lets quantbench raise a one-line error that
carries TensorRT's own reason. Messages are also forwarded to the ``quantbench.tensorrt`` logger.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

log = logging.getLogger("quantbench.tensorrt")


def make_logger(trt: ModuleType) -> Any:
    """An instance of a ``trt.ILogger`` subclass collecting ``errors`` and ``warnings``."""
    severity = trt.ILogger.Severity

    class QuantbenchTrtLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)  # pybind trampoline: the base must be initialised
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, level: Any, msg: str) -> None:
            if int(level) <= int(severity.ERROR):
                self.errors.append(str(msg))
                log.error("TensorRT: %s", msg)
            elif int(level) <= int(severity.WARNING):
                self.warnings.append(str(msg))
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

    return QuantbenchTrtLogger()


def last_error(logger: Any, default: str = "see the TensorRT log above") -> str:
    errors = getattr(logger, "errors", [])
    return errors[-1] if errors else default
