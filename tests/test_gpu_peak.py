"""The GPU a measurement names and the peak bandwidth its "% of peak" divides by
(quantbench.machine.gpu_peak): the datasheet by the device's own name, else an estimate from its
memory clock and bus width, labelled as such (run_gpu_checks divided by an H200's 4800 GB/s
whatever the machine was)."""

from __future__ import annotations

import math

import pytest

from quantbench.machine import ESTIMATE, gpu_peak


@pytest.mark.parametrize(
    ("name", "gbps"),
    [("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 NVL", 3900.0), ("NVIDIA H200", 4800.0),
     ("NVIDIA H200 NVL", 4800.0)],
)  # fmt: skip
def test_known_devices_take_their_datasheet_peak(name, gbps):
    peak = gpu_peak(name, 1, 1)  # the table wins over the device's clock
    assert (peak.gbps, peak.source) == (gbps, "datasheet")
    assert peak.label == f"{name}, peak {gbps:.0f} GB/s (datasheet)"


def test_other_devices_get_an_estimate_said_to_be_one():
    # A100 80GB: 1593 MHz HBM2e on a 5120-bit bus: 1.593e9 * 640 B * 2 = 2039 GB/s
    peak = gpu_peak("NVIDIA A100-SXM4-80GB", 1_593_000, 5120)
    assert peak.source == ESTIMATE and peak.gbps == pytest.approx(2039.04)
    assert peak.label == f"NVIDIA A100-SXM4-80GB, peak 2039 GB/s ({ESTIMATE})"
    unknown = gpu_peak("Some GPU", None, None)
    assert math.isnan(unknown.gbps) and unknown.label == "Some GPU, peak unknown"
