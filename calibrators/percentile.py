"""Percentile calibration: amax = the P-th percentile of |x| (default 99.99, as NVIDIA suggests
for BERT-like networks, reference §1.1).

The percentile is read from the fine |x| histogram of :mod:`quantbench.stats.tensorstats` (bins of
at most
``max|x| / 8192``), linear inside a fine bin, so it is within one fine bin of the exact sample
percentile and does not depend on how the data was batched. pytorch-quantization and onnxruntime
instead return the left edge of the 2048-bin histogram bin where the CDF crosses P (§1.6), which
can be up to ``max|x| / 2048`` lower.
"""

from __future__ import annotations

import math

from quantbench.calibrators import register
from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats

DEFAULT_PERCENTILE = "99.99"


def parse_percentile(option: str | None) -> float:
    """The option as a percentage in (0, 100]; anything else is a user error."""
    text = DEFAULT_PERCENTILE if option is None else option
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 100):
        raise QuantbenchError(
            f"method 'percentile:{text}': the percentile must be a number in (0, 100], "
            "e.g. percentile:99.99"
        )
    return value


@register(
    "percentile",
    "P-th percentile of |x| (percentile:P, P in (0, 100], default 99.99)",
    default_option=DEFAULT_PERCENTILE,
)
def percentile(stats: TensorStats, option: str | None) -> float:
    """amax below which P percent of all |x| lie."""
    return stats.abs_quantile(parse_percentile(option) / 100.0)
