"""DWConv2D CUDA kernels on a GPU against CPU references (run on the device machine, see README).

Every case of the grid (depthwise, grouped, dense; strides, asymmetric pads, dilation, per-batch
weights and bias) runs in four modes: f32, f16, int8 -> int8 and int8 -> f32. References: float64
numpy convolution (exact integer sums for INT8) and onnxruntime's float32 Conv where installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

REASON = harness.gpu_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

CASE_NAMES = sorted(harness.CASES)


@pytest.fixture(scope="module")
def library():
    return harness.get_library()


@pytest.fixture(scope="module")
def runner(library):
    return harness.gpu_runner(library)


@pytest.mark.parametrize("mode", harness.MODES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_kernel_matches_reference(runner, name: str, mode: str) -> None:
    seed = CASE_NAMES.index(name) * 10 + harness.MODES.index(mode)
    row = harness.check_case(runner, name, mode, seed=seed)
    assert row["passed"], row


@pytest.mark.parametrize("mode", ["f32", "int8_i8"])
def test_kernel_runs_on_the_stream_it_is_given(library, mode: str) -> None:
    import torch

    side = torch.cuda.Stream()
    row = harness.check_case(harness.gpu_runner(library, side), "dw_pb_k3", mode, seed=99)
    assert row["passed"], row


def test_batch_of_zero_launches_nothing(library) -> None:
    import torch

    spec = harness.ConvSpec(0, 8, 8, 8, 8, (3, 3), group=8)
    buffer = torch.zeros(16, device="cuda")
    pointer = buffer.data_ptr()
    assert library.forward("f32", pointer, pointer, None, pointer, spec.to_params()) == 0
    torch.cuda.synchronize()
    assert torch.count_nonzero(buffer).item() == 0


@pytest.mark.parametrize("name", sorted(harness.BENCH_CASES))
def test_timed_shapes_match_cudnn(library, name: str) -> None:
    """The large timing shapes (N=32) agree with cuDNN (float32, TF32 off)."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    spec = harness.BENCH_CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(7)
    x, w, b = harness.device_inputs(spec, "f32", gen)
    y = torch.full(spec.output_shape, float("nan"), device="cuda")
    code = library.forward(
        "f32",
        x.data_ptr(),
        w.data_ptr(),
        None if b is None else b.data_ptr(),
        y.data_ptr(),
        spec.to_params(),
        torch.cuda.current_stream().cuda_stream,
    )
    assert code == 0
    expected = harness.torch_conv(spec, x, w, b)
    torch.cuda.synchronize()
    scale = expected.abs().max().item()
    assert not torch.isnan(y).any().item()
    assert np.isfinite(scale) and (y - expected).abs().max().item() <= 1e-5 * scale


FALLBACK_NAMES = [
    name for name in CASE_NAMES if harness.CASES[name].in_channels != harness.CASES[name].group
]


@pytest.mark.parametrize("mode", ["f32", "f16"])
@pytest.mark.parametrize("name", FALLBACK_NAMES)
def test_own_kernels_match_reference_with_cudnn_off(library, runner, name: str, mode: str) -> None:
    """Grouped and dense shapes on our kernels (what runs when cuDNN is absent)."""
    seed = CASE_NAMES.index(name) * 10 + harness.MODES.index(mode)
    with harness.cudnn_mode(library, harness.kl.CUDNN_OFF):
        row = harness.check_case(runner, name, mode, seed=seed)
        assert library.last_path() != "cudnn"
    assert row["passed"], row


def test_dispatch_takes_cudnn_for_grouped_float_shapes(library, runner) -> None:
    """Where cuDNN loads, grouped/dense f32 and bias-free f16 run on it; f16 with a bias (which
    cuDNN would round twice), INT8, depthwise and asymmetric pads never do."""
    if library.cudnn_version() == 0:
        pytest.skip("the library found no cuDNN (libcudnn.so.9) in this process")
    for name, mode, expected in [
        ("g2_gemm_k3", "f32", "cudnn"),
        ("g2_gemm_kg48_s2", "f16", "cudnn"),
        ("dense_k3_p1", "f16", "implicit_gemm"),  # f16 with a bias
        ("g2_gemm_k3", "int8_i8", "implicit_gemm"),
        ("dw_k3_s1_p1", "f32", "depthwise_rows"),
        ("g4_k5_s2_asym", "f32", "direct"),  # asymmetric pads: legacy cuDNN cannot express them
    ]:
        row = harness.check_case(runner, name, mode, seed=5)
        assert row["passed"], row
        assert library.last_path() == expected, (name, mode)
        params = harness.mode_params(harness.CASES[name], mode, 0.05)
        assert library.forward_path(params, harness.kernel_dtype(mode)) == expected
