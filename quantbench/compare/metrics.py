"""Moved to :mod:`quantbench.metrics` (a bottom-layer module: importing it does not import the
``compare`` package, so calibration, ``auto`` and the results document can use it). Kept so
existing imports keep working; new code imports :mod:`quantbench.metrics`."""

from quantbench.metrics import (  # noqa: F401
    AgreementAccumulator,
    ClipCounter,
    DriftAccumulator,
    OutputsAccumulator,
    count_clipped,
    is_class_scores,
)
