"""MinMax calibration: amax = max|x|, what TensorRT's ``IInt8MinMaxCalibrator`` writes.

Real MinMax caches store exactly ``max|x| / 127`` (reference §1.5), so nothing is rounded or
clipped here; ``max_abs`` comes from the exact running min/max, not from the histogram.
"""

from __future__ import annotations

from quantbench.calibrators import register
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats


@register(
    "minmax",
    "full observed range: amax = max|x| (TensorRT MinMaxCalibrator)",
    trt_algorithm="MinMaxCalibration",
    ranges_only=True,
)
def minmax(stats: TensorStats, option: str | None) -> float:
    """amax = max|x| over every value seen; takes no option."""
    if option is not None:
        raise QuantbenchError(f"method 'minmax:{option}': minmax takes no option; use 'minmax'")
    return stats.max_abs
