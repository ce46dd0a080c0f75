"""Accuracy recovery: layer sensitivity, per-tensor calibrator choice, high-precision fallback.

* :func:`sensitivity`: each quantized op's output drift alone in INT8 and alone left FP32.
* :func:`auto_table`: ``--method auto``, the best calibrator per activation tensor.
* :func:`recover`: greedy smallest set of ops kept in FP32/FP16 that reaches a target, and
  :func:`write_artefacts` for the Q/DQ model, the TensorRT cache and the trtexec line.
"""

from quantbench.choose.autocalib import AUTO, AutoTable, auto_table, default_auto_methods
from quantbench.recovery.artefacts import (
    check_artefact_target,
    recovery_document,
    write_artefacts,
)
from quantbench.recovery.evaluation import METRICS, Target, parse_target
from quantbench.recovery.search import RecoveryResult, recover
from quantbench.recovery.sensitivity import sensitivity

__all__ = [
    "AUTO",
    "METRICS",
    "AutoTable",
    "RecoveryResult",
    "Target",
    "auto_table",
    "check_artefact_target",
    "default_auto_methods",
    "parse_target",
    "recover",
    "recovery_document",
    "sensitivity",
    "write_artefacts",
]
