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


def _seed(name: str, mode: str) -> int:
    """The inputs' seed of one grid case and mode (the same in every test that runs it)."""
    return CASE_NAMES.index(name) * 10 + harness.MODES.index(mode)


def _check_on_rows(library, runner, name: str, mode: str) -> tuple[dict, str]:
    """One grid case with depthwise_mma and depthwise_global switched off: its check and path."""
    with harness.mma_mode(library, harness.kl.MMA_OFF), harness.global_off():
        row = harness.check_case(runner, name, mode, seed=_seed(name, mode))
        return row, library.last_path()


@pytest.fixture(scope="module")
def library():
    return harness.get_library()


@pytest.fixture(scope="module")
def runner(library):
    return harness.gpu_runner(library)


@pytest.mark.parametrize("mode", harness.MODES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_kernel_matches_reference(runner, name: str, mode: str) -> None:
    seed = _seed(name, mode)
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
    seed = _seed(name, mode)
    with harness.cudnn_mode(library, harness.kl.CUDNN_OFF):
        row = harness.check_case(runner, name, mode, seed=seed)
        assert library.last_path() != "cudnn"
    assert row["passed"], row


def test_dispatch_takes_cudnn_for_grouped_float_shapes(library, runner) -> None:
    """Where cuDNN loads, grouped/dense f32 and f16 run on it (f16 with a bias through plans that
    round once); INT8, depthwise and asymmetric pads never do (INT8 grouped/dense: gemm_mma).
    depthwise_mma only where the per-shape table takes it (FP16 7x7 stride 1)."""
    if library.cudnn_version() == 0:
        pytest.skip("the library found no cuDNN (libcudnn.so.9) in this process")
    for name, mode, expected in [
        ("g2_gemm_k3", "f32", "cudnn"),
        ("g2_gemm_kg48_s2", "f16", "cudnn"),
        ("dense_k3_p1", "f16", "cudnn"),  # f16 with a bias: fused / scratch plans, one rounding
        ("g2_gemm_k3", "int8_i8", "gemm_mma"),  # INT8 grouped/dense: integer tensor cores
        ("g8_pb_direct", "int8_f32", "gemm_mma"),
        # whole 4- (FP32, 5x5, 7x7) or 8-output (FP16/INT8 3x3) row segments: depthwise_global
        ("dw_k3_s1_p1", "f32", "depthwise_global"),
        ("dw_k3_s1_p1", "f16", "depthwise_global"),  # 3x3: depthwise_mma only when forced on
        ("dw_pb_k3", "int8_i8", "depthwise_global"),
        ("dw_k7_s1_p3_c256", "f16", "depthwise_mma"),  # FP16 7x7 stride 1: the table's choice
        ("dw_k7_s1_p3_c256", "int8_i8", "depthwise_global"),  # INT8 7x7: CUDA cores faster
        ("dw_k7_s1_p3_c256", "f32", "depthwise_global"),
        ("dws_k3_pb_w52_h13", "int8_i8", "depthwise_rows"),  # Wo = 52: not whole 8-wide segments
        ("g4_k5_s2_asym", "f32", "direct"),  # asymmetric pads: legacy cuDNN cannot express them
    ]:
        row = harness.check_case(runner, name, mode, seed=5)
        assert row["passed"], row
        assert library.last_path() == expected, (name, mode)
        params = harness.mode_params(harness.CASES[name], mode, 0.05)
        assert library.forward_path(params, harness.kernel_dtype(mode)) == expected


def _mma_names(mma: int) -> list[str]:
    """The grid's cases that depthwise_mma serves (FP16) in MMA mode ``mma`` (GPU runs only)."""
    if REASON is not None:
        return []
    lib = harness.get_library()
    with harness.mma_mode(lib, mma):
        return [
            n
            for n in CASE_NAMES
            if lib.forward_path(harness.CASES[n].to_params(), "f16") == "depthwise_mma"
        ]


#: when switched on, and by the per-shape table (the default)
MMA_NAMES = _mma_names(harness.kl.MMA_ON)
AUTO_MMA_NAMES = _mma_names(harness.kl.MMA_AUTO)


@pytest.mark.parametrize("mode", ["f16", "int8_i8", "int8_f32", "int8_tie"])
@pytest.mark.parametrize("name", AUTO_MMA_NAMES)
def test_rows_kernel_matches_reference_where_the_table_takes_mma(
    library, runner, name: str, mode: str
) -> None:
    """The cases the table sends to depthwise_mma, on depthwise_rows (MMA off) as well."""
    row, path = _check_on_rows(library, runner, name, mode)
    assert path == "depthwise_rows"
    assert row["passed"], row


@pytest.mark.parametrize("mode", ["f16", "int8_i8", "int8_f32", "int8_tie"])
@pytest.mark.parametrize("name", MMA_NAMES)
def test_mma_kernel_matches_reference(library, runner, name: str, mode: str) -> None:
    """Depthwise FP16/INT8 on the tensor-core kernel (depthwise_mma, switched on here)."""
    seed = _seed(name, mode)
    with harness.mma_mode(library, harness.kl.MMA_ON):
        row = harness.check_case(runner, name, mode, seed=seed)
        assert library.last_path() == "depthwise_mma"
    assert row["passed"], row


def test_mma_kernel_on_the_timed_shapes(library) -> None:
    """The timing shapes (N=32) in INT8 -> INT8 and FP16: depthwise_mma equals depthwise_rows
    (both exact in INT8; FP16 within float32 accumulation order, far below one FP16 rounding)."""
    import torch

    for name in ("dw3x3_s1_mobilenet", "dw5x5_s2", "dw7x7_convnext", "dw3x3_per_batch_w"):
        spec = harness.BENCH_CASES[name]
        for mode in ("int8_i8", "f16"):
            gen = torch.Generator(device="cuda").manual_seed(11)
            x, w, b = harness.device_inputs(spec, mode, gen)
            params = harness.mode_params(spec, mode, 0.05)
            outs = []
            for on in (harness.kl.MMA_OFF, harness.kl.MMA_ON):
                with harness.mma_mode(library, on), harness.global_off():
                    y = harness.device_forward(library, spec, mode, (x, w, b), params)
                    assert library.last_path() == (
                        "depthwise_mma" if on == harness.kl.MMA_ON else "depthwise_rows"
                    )
                outs.append(y)
            torch.cuda.synchronize()
            if mode == "int8_i8":
                assert torch.equal(outs[0], outs[1]), name
            else:
                diff = (outs[0].float() - outs[1].float()).abs()
                bound = 2.0**-10 * outs[0].float().abs() + 1e-3
                assert bool((diff <= bound).all()), (name, diff.max().item())


def _global_names() -> list[str]:
    """The grid's cases that depthwise_global serves by default in some type (GPU runs only)."""
    if REASON is not None:
        return []
    lib = harness.get_library()
    return [
        n
        for n in CASE_NAMES
        if any(
            lib.forward_path(harness.CASES[n].to_params(), t) == "depthwise_global"
            for t in ("f32", "f16", "int8")
        )
    ]


GLOBAL_NAMES = _global_names()


@pytest.mark.parametrize("mode", harness.MODES)
@pytest.mark.parametrize("name", GLOBAL_NAMES)
def test_rows_kernel_matches_reference_with_global_off(
    library, runner, name: str, mode: str
) -> None:
    """The cases depthwise_global takes by default, on depthwise_rows (global switched off)."""
    row, path = _check_on_rows(library, runner, name, mode)
    assert path != "depthwise_global"
    assert row["passed"], row


@pytest.mark.parametrize("mode", ["f32", "f16", "int8_i8", "int8_f32"])
def test_global_equals_rows_on_the_timed_shapes(library, monkeypatch, mode: str) -> None:
    """The timing shapes (N=32): depthwise_global and depthwise_rows give the same bits in every
    type (INT8: both exact; float: the same products summed in the same order), and so does a
    replay of depthwise_global from a CUDA graph."""
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    for name in ("dw3x3_s1_mobilenet", "dw5x5_s2", "dw7x7_convnext", "dw3x3_per_batch_w"):
        spec = harness.BENCH_CASES[name]
        gen = torch.Generator(device="cuda").manual_seed(13)
        tensors = harness.device_inputs(spec, mode, gen)
        params = harness.mode_params(spec, mode, 0.05)
        dtype = torch.float32 if mode == "int8_f32" else tensors[0].dtype
        outs = []
        with harness.mma_mode(library, harness.kl.MMA_OFF):
            for value in ("1", "0"):
                monkeypatch.setenv(harness.GLOBAL_ENV, value)
                outs.append(torch.empty(spec.output_shape, dtype=dtype, device="cuda"))
                assert harness.launch(library, mode, tensors, outs[-1], params, stream) == 0
                want = "depthwise_global" if value == "1" else "depthwise_rows"
                assert library.last_path() == want, (name, mode)
            monkeypatch.setenv(harness.GLOBAL_ENV, "1")
            y = _graph_replayed(library, mode, tensors, outs[0], params, "depthwise_global", 1)
        assert torch.equal(outs[0], outs[1]), (name, mode)
        assert torch.equal(y, outs[0]), (name, mode)


@pytest.mark.parametrize("mode", ["f32", "int8_i8"])
def test_global_dependent_launch_waits_for_the_one_before(library, monkeypatch, mode: str) -> None:
    """depthwise_global launched as a programmatic dependent (PDL, the default on sm_90) reads
    what the launch before it wrote: a forward over the timing shape (N=32), then a forward of one
    image that reads that output's last image (written by the first forward's last blocks, while
    the second's blocks may already be resident), three times over (each large forward reading
    the output of the one before), on a stream and replayed from a CUDA graph, equals the same
    chain launched plainly with a synchronize after every forward."""
    import torch

    big = harness.BENCH_CASES["dw3x3_s1_mobilenet"]
    one = harness.ConvSpec(
        1, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256, bias_mode=big.bias_mode
    )
    gen = torch.Generator(device="cuda").manual_seed(21)
    x, w, b = harness.device_inputs(big, mode, gen)
    params_big = harness.mode_params(big, mode, 0.05)
    params_one = harness.mode_params(one, mode, 0.05)
    sentinel = float("nan") if mode == "f32" else 77
    ys = [torch.empty_like(x) for _ in range(3)]
    zs = [torch.empty_like(x[:1]) for _ in range(3)]

    def chain(stream: int, synchronize: bool) -> None:
        for i in range(3):
            source = x if i == 0 else ys[i - 1]
            assert harness.launch(library, mode, (source, w, b), ys[i], params_big, stream) == 0
            assert library.last_path() == "depthwise_global"
            if synchronize:
                torch.cuda.synchronize()
            last = (ys[i][-1:], w, b)
            assert harness.launch(library, mode, last, zs[i], params_one, stream) == 0
            if synchronize:
                torch.cuda.synchronize()

    def outputs() -> list:
        torch.cuda.synchronize()
        return [t.clone() for t in ys + zs]

    def reset() -> None:
        for t in ys + zs:
            t.fill_(sentinel)

    monkeypatch.setenv(harness.PDL_ENV, "0")
    reset()
    chain(torch.cuda.current_stream().cuda_stream, synchronize=True)
    want = outputs()
    for t in want:  # every output written: no sentinel left
        assert not (t.isnan().any().item() if mode == "f32" else bool((t == sentinel).all().item()))

    monkeypatch.setenv(harness.PDL_ENV, "1")
    reset()
    chain(torch.cuda.current_stream().cuda_stream, synchronize=False)
    got = outputs()
    reset()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        chain(side.cuda_stream, synchronize=False)
    reset()
    graph.replay()
    replayed = outputs()
    for i, (a, c, r) in enumerate(zip(want, got, replayed, strict=True)):
        assert torch.equal(a, c), ("stream", mode, i)
        assert torch.equal(a, r), ("graph", mode, i)


INT8_MODES = ("int8_i8", "int8_f32", "int8_tie")


@pytest.mark.parametrize("mode", INT8_MODES)
@pytest.mark.parametrize("name", FALLBACK_NAMES)
def test_int8_grouped_on_cuda_cores_with_mma_off(library, runner, name: str, mode: str) -> None:
    """INT8 grouped and dense shapes on our CUDA-core kernels (gemm_mma switched off)."""
    seed = _seed(name, mode)
    with harness.mma_mode(library, harness.kl.MMA_OFF):
        row = harness.check_case(runner, name, mode, seed=seed)
        assert library.last_path() in ("implicit_gemm", "direct")
    assert row["passed"], row


@pytest.mark.parametrize("mode", INT8_MODES)
@pytest.mark.parametrize("name", FALLBACK_NAMES)
def test_gemm_mma_flat_kernel_matches_reference(
    library, runner, monkeypatch, name: str, mode: str
) -> None:
    """gemm_mma's flat kernel (im2col copies per tap), which serves the shapes the patch kernel
    cannot hold; QUANTBENCH_DWCONV_GEMM_PATCH=0 (read per call) forces it."""
    seed = _seed(name, mode)
    monkeypatch.setenv("QUANTBENCH_DWCONV_GEMM_PATCH", "0")
    row = harness.check_case(runner, name, mode, seed=seed)
    assert library.last_path() == "gemm_mma"
    assert row["passed"], row


def _gemm_mma_outputs(library, monkeypatch, spec, mode: str, tensors: tuple, params) -> list:
    """The forward with gemm_mma off (CUDA cores), on (flat kernel, patch kernel), and on inside
    a captured CUDA graph (stream-ordered workspace) replayed twice."""
    import torch

    dtype = torch.float32 if mode == "int8_f32" else torch.int8
    stream = torch.cuda.current_stream().cuda_stream
    outs = []
    for on, patch in (
        (harness.kl.MMA_OFF, "1"),
        (harness.kl.MMA_AUTO, "0"),
        (harness.kl.MMA_AUTO, "1"),
    ):
        monkeypatch.setenv("QUANTBENCH_DWCONV_GEMM_PATCH", patch)
        with harness.mma_mode(library, on):
            outs.append(torch.empty(spec.output_shape, dtype=dtype, device="cuda"))
            assert harness.launch(library, mode, tensors, outs[-1], params, stream) == 0
            assert (library.last_path() == "gemm_mma") == (on == harness.kl.MMA_AUTO)
    y = _graph_replayed(library, mode, tensors, outs[0], params, "gemm_mma", replays=2)
    return [*outs, y]


def _graph_replayed(library, mode: str, tensors: tuple, like, params, path: str, replays: int):
    """The forward captured in a CUDA graph on a side stream (where it must take ``path``) and
    replayed ``replays`` times; its output (synchronized)."""
    import torch

    y = torch.zeros_like(like)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        code = harness.launch(library, mode, tensors, y, params, side.cuda_stream)
    assert code == 0 and library.last_path() == path
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return y


@pytest.mark.parametrize("mode", INT8_MODES)
def test_gemm_mma_on_the_timed_shapes(library, monkeypatch, mode: str) -> None:
    """The grouped and dense timing shapes (N=32): gemm_mma (flat and patch kernels) is
    bit-identical to the CUDA-core kernels, also replayed from a CUDA graph."""
    import torch

    for name in ("grouped3x3_g32_resnext", "dense3x3_c128"):
        spec = harness.BENCH_CASES[name]
        gen = torch.Generator(device="cuda").manual_seed(13)
        tensors = harness.device_inputs(spec, mode, gen)
        params = harness.mode_params(spec, mode, 0.05 if mode == "int8_i8" else 2.0**-5)
        if mode == "int8_tie":
            tensors = (tensors[0] >> 4, tensors[1] >> 4, tensors[2])
        cores, flat, patch, graphed = _gemm_mma_outputs(
            library, monkeypatch, spec, mode, tensors, params
        )
        assert torch.equal(cores, flat), name
        assert torch.equal(cores, patch), name
        assert torch.equal(cores, graphed), name
