"""Re-export of :mod:`quantbench.isolated` (the isolated-view builder lives below ``compare`` so
that ``autocalib`` can use it without importing the compare package)."""

from quantbench.isolated import (
    QDQ_OPS,
    SUFFIX,
    IsolatedModel,
    build_isolated,
    build_isolated_fp16,
    quantized_ops,
)

__all__ = [
    "QDQ_OPS",
    "SUFFIX",
    "IsolatedModel",
    "build_isolated",
    "build_isolated_fp16",
    "quantized_ops",
]
