"""CPU-side checks of the DWConv2D CUDA kernels (CI has nvcc but no GPU).

The kernels must compile with nvcc, export exactly the C entry points the TensorRT plugin and the
ctypes binding call, and their host-side logic (output shape, validation, kernel choice) must agree
with ONNX Conv. Only host functions are called: none of them touches the CUDA driver.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from quantbench.errors import QuantbenchError
from quantbench.plugins.dwconv2d import kernel_lib
from quantbench.plugins.dwconv2d.kernel_lib import (
    BIAS_NONE,
    BIAS_PER_BATCH,
    BIAS_SHARED,
    CUDA_ERROR_INVALID_VALUE,
    ConvSpec,
    KernelLibrary,
)

pytestmark = pytest.mark.skipif(
    kernel_lib.find_nvcc() is None, reason="nvcc not found (install the CUDA toolkit or set NVCC)"
)

FAKE_DEVICE_POINTER = 0x1000  # never dereferenced: every call below is rejected on the host


@pytest.fixture(scope="module")
def built_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kernel_lib.build_kernels(tmp_path_factory.mktemp("dwconv2d"))


@pytest.fixture(scope="module")
def lib(built_library: Path) -> KernelLibrary:
    return KernelLibrary(built_library)


def test_library_exports_exactly_the_c_entry_points(built_library: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    listing = subprocess.run(
        [nm, "-D", "--defined-only", str(built_library)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in listing.splitlines() if " T " in line}
    assert exported == set(kernel_lib.EXPORTED_SYMBOLS)


def test_abi_version_and_params_layout_match_the_binding(lib: KernelLibrary) -> None:
    raw = lib._lib
    assert raw.dwconv2d_abi_version() == kernel_lib.ABI_VERSION
    assert raw.dwconv2d_params_size() == ctypes.sizeof(kernel_lib.DWConv2DParams) == 23 * 4


def test_header_struct_fields_match_the_binding() -> None:
    """The ctypes field order is the C struct's: a swapped pair would keep the size but break."""
    header = kernel_lib.KERNEL_HEADER.read_text()
    body = re.search(r"typedef struct DWConv2DParams\s*\{(.*?)\}\s*DWConv2DParams;", header, re.S)
    assert body is not None
    declared = re.findall(r"^\s*(?:int32_t|float)\s+(\w+);", body.group(1), re.M)
    assert declared == [name for name, _ in kernel_lib.DWConv2DParams._fields_]


def test_makefile_uses_the_binding_flags() -> None:
    makefile = (kernel_lib.KERNEL_DIR.parent / "Makefile").read_text()
    gencode = re.search(r"^GENCODE \?= (.*)$", makefile, re.M)
    flags = re.search(r"^NVCC_FLAGS \?= (.*)$", makefile, re.M)
    assert gencode is not None and flags is not None
    command = kernel_lib.nvcc_command(Path("out.so"))
    assert " ".join(kernel_lib.DEFAULT_GENCODE) == gencode.group(1).strip()
    assert " ".join(command[1 : 1 + len(flags.group(1).split())]) == flags.group(1).strip()


def test_every_included_kernel_part_is_package_data() -> None:
    """dwconv2d.cu includes its parts (*.cuh): an installed quantbench builds the kernels from
    its package data, so every file an include names must match a package-data pattern."""
    import fnmatch

    import tomllib

    pyproject = tomllib.loads((kernel_lib.KERNEL_DIR.parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["quantbench.plugins.dwconv2d"]
    included = set()
    for source in kernel_lib.KERNEL_DIR.glob("*.cu*"):
        included |= set(re.findall(r'^#include "([^"]+)"', source.read_text(), re.M))
    assert {"common.cuh", "dwconv2d.h"} <= included
    for name in sorted(included):
        assert (kernel_lib.KERNEL_DIR / name).is_file(), name
        assert any(fnmatch.fnmatch(f"kernels/{name}", pat) for pat in patterns), name


def _onnx_conv_output_hw(spec: ConvSpec) -> tuple[int, int]:
    """Output H, W from ONNX shape inference on a Conv node with the same attributes."""
    node = helper.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        strides=list(spec.strides),
        pads=list(spec.pads),
        dilations=list(spec.dilations),
        group=spec.group,
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(spec.input_shape)),
            helper.make_tensor_value_info(
                "w",
                TensorProto.FLOAT,
                [spec.out_channels, spec.in_channels // spec.group, *spec.kernel],
            ),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    dims = inferred.graph.output[0].type.tensor_type.shape.dim
    return dims[2].dim_value, dims[3].dim_value


SHAPE_CASES = [
    ConvSpec(1, 8, 7, 7, 8, (3, 3), pads=(1, 1, 1, 1), group=8),
    ConvSpec(2, 16, 15, 17, 16, (3, 3), strides=(2, 2), pads=(0, 1, 1, 0), group=16),
    ConvSpec(1, 32, 28, 28, 32, (5, 5), pads=(4, 4, 4, 4), dilations=(2, 2), group=32),
    ConvSpec(3, 12, 9, 11, 18, (3, 3), pads=(2, 0, 1, 2), dilations=(2, 1), group=3),
    ConvSpec(2, 8, 64, 64, 32, (7, 7), strides=(2, 2), pads=(3, 3, 3, 3)),
    ConvSpec(1, 4, 10, 13, 4, (1, 7), strides=(1, 3), pads=(0, 3, 0, 2), group=4),
    ConvSpec(1, 6, 8, 8, 6, (8, 8), group=2),  # kernel covers the whole input: 1 x 1 output
]


@pytest.mark.parametrize("spec", SHAPE_CASES, ids=lambda s: f"{s.in_h}x{s.in_w}k{s.kernel}")
def test_output_shape_matches_onnx_shape_inference(lib: KernelLibrary, spec: ConvSpec) -> None:
    expected = _onnx_conv_output_hw(spec)
    assert lib.infer_output_shape(spec.to_params()) == expected == spec.out_hw
    assert lib.validate(spec.to_params()) == 0


def test_validate_rejects_a_wrong_output_shape(lib: KernelLibrary) -> None:
    params = SHAPE_CASES[0].to_params()
    params.out_w += 1
    assert lib.validate(params) == CUDA_ERROR_INVALID_VALUE


INVALID_CASES = {
    "group does not divide C": ConvSpec(1, 30, 8, 8, 32, (3, 3), group=4),
    "group does not divide K": ConvSpec(1, 32, 8, 8, 30, (3, 3), group=4),
    "kernel larger than padded input": ConvSpec(1, 8, 4, 4, 8, (5, 5), group=8),
    "dilated kernel larger than input": ConvSpec(1, 8, 8, 8, 8, (3, 3), dilations=(5, 1)),
    "zero stride": ConvSpec(1, 8, 8, 8, 8, (3, 3), strides=(0, 1)),
    "negative pad": ConvSpec(1, 8, 8, 8, 8, (3, 3), pads=(-1, 0, 0, 0)),
    "zero kernel": ConvSpec(1, 8, 8, 8, 8, (0, 3)),
    "bad bias mode": ConvSpec(1, 8, 8, 8, 8, (3, 3), bias_mode=7),
}


@pytest.mark.parametrize("reason", sorted(INVALID_CASES))
@pytest.mark.parametrize("dtype", ["f32", "f16", "int8"])
def test_invalid_parameters_are_rejected_on_the_host(
    lib: KernelLibrary, reason: str, dtype: str
) -> None:
    spec = INVALID_CASES[reason]
    params = spec.to_params(input_scale=0.1, weight_scale=0.1, output_scale=0.1)
    with pytest.raises(QuantbenchError, match="invalid parameters"):
        lib.infer_output_shape(params)
    assert lib.kernel_path(params) == "invalid"
    p = FAKE_DEVICE_POINTER
    assert lib.forward(dtype, p, p, p, p, params) == CUDA_ERROR_INVALID_VALUE


def test_null_pointers_are_rejected(lib: KernelLibrary) -> None:
    p = FAKE_DEVICE_POINTER
    params = ConvSpec(1, 8, 8, 8, 8, (3, 3), bias_mode=BIAS_SHARED).to_params()
    assert lib.forward("f32", None, p, p, p, params) == CUDA_ERROR_INVALID_VALUE
    assert lib.forward("f32", p, None, p, p, params) == CUDA_ERROR_INVALID_VALUE
    assert lib.forward("f32", p, p, p, None, params) == CUDA_ERROR_INVALID_VALUE
    assert lib.forward("f16", p, p, None, p, params) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize(
    ("input_scale", "weight_scale", "output_scale"),
    [
        (0.0, 0.1, 0.1),
        (-0.5, 0.1, 0.1),
        (0.1, math.nan, 0.1),
        (0.1, 0.1, math.inf),
        (1e-30, 1e-30, 0.1),
    ],  # the product underflows to 0: no usable accumulator scale
)
def test_int8_rejects_unusable_scales(
    lib: KernelLibrary, input_scale: float, weight_scale: float, output_scale: float
) -> None:
    params = ConvSpec(1, 8, 8, 8, 8, (3, 3)).to_params(input_scale, weight_scale, output_scale)
    p = FAKE_DEVICE_POINTER
    assert lib.forward("int8", p, p, None, p, params) == CUDA_ERROR_INVALID_VALUE


def test_int8_rejects_reductions_that_could_overflow_int32(lib: KernelLibrary) -> None:
    # 2731 * 7 * 7 = 133819 products of up to 2^14 each can exceed int32.
    params = ConvSpec(1, 2731, 7, 7, 1, (7, 7)).to_params(0.1, 0.1, 0.1)
    p = FAKE_DEVICE_POINTER
    assert lib.validate(params) == 0
    assert lib.forward("int8", p, p, None, p, params) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1, 1, 1, 1), group=32), "depthwise_rows"),
        (ConvSpec(2, 16, 16, 16, 32, (3, 3), pads=(1,) * 4, group=16), "depthwise_rows"),  # x2
        (ConvSpec(32, 240, 56, 56, 240, (5, 5), (2, 2), (2,) * 4, group=240), "depthwise_rows"),
        (ConvSpec(1, 8, 28, 28, 8, (7, 7), pads=(3, 3, 0, 5), group=8), "depthwise_rows"),
        # rows of a 1000-wide fp32 plane: several bands, each block under 48 KiB
        (ConvSpec(1, 2, 1000, 1000, 2, (3, 3), pads=(1,) * 4, group=2), "depthwise_rows"),
        # rows of 12 int8 / 8 fp16 bytes, narrower than a 16-byte load (planned with 4/8 bytes)
        (ConvSpec(3, 1, 12, 12, 1, (7, 7), pads=(3,) * 4, weight_per_batch=True), "depthwise_rows"),
        (ConvSpec(1, 4, 6, 4, 4, (3, 3), pads=(1,) * 4, group=4), "depthwise_rows"),
        (ConvSpec(2, 16, 16, 16, 32, (3, 3), group=16), "depthwise_tiled"),  # left pad 0, not 1
        (ConvSpec(1, 8, 15, 15, 8, (3, 3), pads=(1,) * 4, group=8), "depthwise_tiled"),  # W % 4
        (ConvSpec(1, 8, 16, 16, 8, (3, 3), (2, 2), (0, 0, 1, 1), group=8), "depthwise_tiled"),
        (ConvSpec(1, 8, 16, 16, 8, (3, 3), (1, 1), (2,) * 4, (2, 2), 8), "depthwise_tiled"),
        (ConvSpec(1, 8, 16, 16, 8, (9, 9), pads=(4,) * 4, group=8), "depthwise_tiled"),
        (ConvSpec(1, 8, 24, 24, 8, (3, 3), (3, 3), (1,) * 4, group=8), "depthwise_tiled"),
        (ConvSpec(1, 8, 12, 12, 8, (1, 7), group=8, bias_mode=BIAS_PER_BATCH), "depthwise_tiled"),
        # a 41x41 kernel with dilation 3 spans 121 rows: no patch fits in 48 KiB of shared memory
        (ConvSpec(1, 8, 64, 64, 8, (41, 41), pads=(60,) * 4, dilations=(3, 3), group=8), "direct"),
        (ConvSpec(2, 64, 16, 16, 64, (3, 3), group=8), "direct"),  # 8 channels per group
        (ConvSpec(2, 64, 14, 14, 64, (3, 3), weight_per_batch=True), "implicit_gemm"),
        (ConvSpec(1, 8, 32, 32, 32, (1, 1), bias_mode=BIAS_NONE), "direct"),  # reduction of 8
    ],
    ids=lambda v: v if isinstance(v, str) else f"C{v.in_channels}K{v.out_channels}g{v.group}",
)
def test_kernel_path_selection(lib: KernelLibrary, spec: ConvSpec, path: str) -> None:
    assert lib.kernel_path(spec.to_params()) == path


def test_build_reports_compiler_errors(tmp_path: Path) -> None:
    with pytest.raises(QuantbenchError, match="nvcc failed"):
        kernel_lib.build_kernels(tmp_path, gencode=("-gencode", "arch=compute_1,code=sm_1"))


DISPATCH_CASES = [
    # (spec, dtype, path when cuDNN is loaded)
    (ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8), "f32", "cudnn"),
    (ConvSpec(2, 64, 14, 14, 64, (3, 3), pads=(1,) * 4, weight_per_batch=True), "f16", "cudnn"),
    # INT8 grouped/dense: gemm_mma (integer tensor cores) whether or not cuDNN loads
    (ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8), "int8", "gemm_mma"),
    (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1,) * 4, group=32), "f32", "depthwise_global"),
    (ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1, 0, 1, 2), group=8), "f16", "direct"),
    # f16 with a bias: cuDNN's fused / float-scratch plans (one FP16 rounding)
    (
        ConvSpec(
            2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8, bias_mode=kernel_lib.BIAS_SHARED
        ),
        "f16",
        "cudnn",
    ),
    (
        ConvSpec(
            2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8, bias_mode=kernel_lib.BIAS_SHARED
        ),
        "f32",
        "cudnn",
    ),
]


@pytest.mark.parametrize(("spec", "dtype", "with_cudnn"), DISPATCH_CASES)
def test_forward_path_follows_the_dispatch_table(
    lib: KernelLibrary, spec: ConvSpec, dtype: str, with_cudnn: str
) -> None:
    """cuDNN only where the table picks it and it loads; our kernels otherwise (no cuDNN here)."""
    params = spec.to_params()
    ours = with_cudnn if with_cudnn in ("gemm_mma", "depthwise_global") else lib.kernel_path(params)
    expected = with_cudnn if lib.cudnn_version() > 0 else ours
    assert lib.forward_path(params, dtype) == expected
    previous = lib.set_cudnn_mode(kernel_lib.CUDNN_OFF)
    try:
        assert lib.forward_path(params, dtype) == ours
    finally:
        assert lib.set_cudnn_mode(previous) == kernel_lib.CUDNN_OFF


GEMM_MMA_CASES = [
    # (spec, dtype, path under MMA_AUTO and MMA_ON): INT8 with C/group > 1 on gemm_mma, whatever
    # the CUDA-core kernel would be (implicit_gemm, direct), per-batch weights, asymmetric pads,
    # dilation, strides and 3 channels per group included; FP32/FP16 and depthwise never.
    (ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8), "int8", "gemm_mma"),
    (ConvSpec(2, 64, 14, 14, 64, (3, 3), weight_per_batch=True), "int8", "gemm_mma"),
    (ConvSpec(3, 32, 20, 20, 48, (5, 5), (2, 2), (2, 1, 1, 2), group=4), "int8", "gemm_mma"),
    (ConvSpec(2, 9, 9, 11, 18, (3, 3), (1, 1), (2,) * 4, (2, 2), 3), "int8", "gemm_mma"),
    (ConvSpec(1, 8, 32, 32, 32, (1, 1), bias_mode=BIAS_NONE), "int8", "gemm_mma"),
    (ConvSpec(2, 64, 16, 16, 64, (3, 3), pads=(1,) * 4, group=8), "f16", None),
    (ConvSpec(2, 64, 14, 14, 64, (3, 3), weight_per_batch=True), "f32", None),
    (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1,) * 4, group=32), "int8", None),
    (ConvSpec(2, 16, 16, 16, 32, (3, 3), group=16), "int8", None),  # channel multiplier
]


@pytest.mark.parametrize(("spec", "dtype", "path"), GEMM_MMA_CASES)
def test_gemm_mma_dispatch(
    lib: KernelLibrary, spec: ConvSpec, dtype: str, path: str | None
) -> None:
    """gemm_mma serves INT8 grouped and dense shapes unless the tensor-core kernels are switched
    off (MMA_OFF: our CUDA-core kernels, as dwconv2d_kernel_path says); None: never taken."""
    params = spec.to_params()
    previous = lib.set_mma_mode(kernel_lib.MMA_AUTO)
    try:
        for mode in (kernel_lib.MMA_AUTO, kernel_lib.MMA_ON):
            lib.set_mma_mode(mode)
            taken = lib.forward_path(params, dtype)
            assert taken == path if path is not None else taken != "gemm_mma", (mode, taken)
        lib.set_mma_mode(kernel_lib.MMA_OFF)
        assert lib.forward_path(params, dtype) != "gemm_mma"
    finally:
        lib.set_mma_mode(previous)


def test_gemm_mma_refuses_a_workspace_over_its_cap(lib: KernelLibrary) -> None:
    """The packed input of N=64, 64x1024x1024 int8 (4 GiB) exceeds the 256 MiB workspace cap:
    the CUDA-core kernels serve it instead of a failed allocation."""
    params = ConvSpec(64, 64, 1024, 1024, 64, (3, 3), pads=(1,) * 4).to_params()
    assert lib.forward_path(params, "int8") == lib.kernel_path(params) == "implicit_gemm"


def test_cudnn_mode_query_and_bad_values(lib: KernelLibrary) -> None:
    mode = lib.set_cudnn_mode(-5)  # not a mode: only queries
    assert mode in (kernel_lib.CUDNN_OFF, kernel_lib.CUDNN_AUTO)
    assert lib.set_cudnn_mode(99) == mode


MMA_CASES = [
    # (spec, dtype, path with depthwise_mma on): FP16/INT8 depthwise_rows shapes whose plane fits
    (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1,) * 4, group=32), "f16", "depthwise_mma"),
    (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1,) * 4, group=32), "int8", "depthwise_mma"),
    (ConvSpec(32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256), "int8", "depthwise_mma"),
    (ConvSpec(32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256), "f16", "depthwise_mma"),
    (ConvSpec(32, 240, 56, 56, 240, (5, 5), (2, 2), (2,) * 4, group=240), "f16", "depthwise_mma"),
    (ConvSpec(1, 8, 28, 28, 8, (7, 7), pads=(3, 3, 0, 5), group=8), "int8", "depthwise_mma"),
    (
        ConvSpec(3, 1, 12, 12, 1, (7, 7), pads=(3,) * 4, weight_per_batch=True),
        "int8",
        "depthwise_mma",
    ),
    # FP32 never, and a 1000-wide plane does not fit one warp's shared memory: depthwise_global
    (ConvSpec(2, 32, 16, 16, 32, (3, 3), pads=(1,) * 4, group=32), "f32", "depthwise_global"),
    (ConvSpec(1, 2, 1000, 1000, 2, (3, 3), pads=(1,) * 4, group=2), "f16", "depthwise_global"),
    (ConvSpec(1, 8, 15, 15, 8, (3, 3), pads=(1,) * 4, group=8), "int8", "depthwise_tiled"),
]


@pytest.mark.parametrize(("spec", "dtype", "path"), MMA_CASES)
def test_depthwise_mma_dispatch(lib: KernelLibrary, spec: ConvSpec, dtype: str, path: str) -> None:
    """Switched on: tensor cores for FP16/INT8 depthwise where the plane fits. Off (the default:
    correct on the H200 but slower than depthwise_rows except at 7x7): our CUDA-core kernels, as
    dwconv2d_kernel_path says."""
    params = spec.to_params()
    previous = lib.set_mma_mode(kernel_lib.MMA_ON)
    try:
        assert lib.forward_path(params, dtype) == path
        lib.set_mma_mode(kernel_lib.MMA_OFF)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QUANTBENCH_DWCONV_GLOBAL", "0")  # and depthwise_global off
            assert lib.forward_path(params, dtype) == lib.kernel_path(params)
    finally:
        lib.set_mma_mode(previous)


def test_mma_mode_default_query_and_bad_values(lib: KernelLibrary) -> None:
    mode = lib.set_mma_mode(-5)  # not a mode: only queries
    env = os.environ.get("QUANTBENCH_DWCONV_MMA")
    expected = (
        kernel_lib.MMA_ON
        if env in ("1", "on")
        else kernel_lib.MMA_OFF
        if env in ("0", "off")
        else kernel_lib.MMA_AUTO
    )
    assert mode == expected  # the per-shape table unless $QUANTBENCH_DWCONV_MMA forces it
    assert lib.set_mma_mode(7) == mode


# The per-shape table (MMA_AUTO, the default): depthwise_mma only where it was measured faster
# than depthwise_rows on the H200 (README.md: FP16 7x7 stride 1, 34.9 vs 38.1 us); INT8 7x7
# (31.5 us on depthwise_rows vs 34.0), 3x3 and 5x5 stride 2 (measured slower), the unmeasured
# kernels/strides and FP32 keep the CUDA-core kernels, and so does a plane that does not fit a
# warp. Of those, depthwise_global takes every shape whose output rows split into whole
# segments of V outputs (V = 8 for FP16/INT8 3x3, else 4; Wo % V == 0 and Wo * stride <= W);
# depthwise_rows the others.
_DW7 = ConvSpec(32, 384, 28, 28, 384, (7, 7), pads=(3,) * 4, group=384)
_DW3 = ConvSpec(32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256)
_DW5S2 = ConvSpec(32, 240, 56, 56, 240, (5, 5), (2, 2), (2,) * 4, group=240)
AUTO_CASES = [
    (_DW7, "f16", "depthwise_mma"),
    (_DW7, "int8", "depthwise_global"),
    (_DW7, "f32", "depthwise_global"),
    (
        ConvSpec(3, 1, 12, 12, 1, (7, 7), pads=(3,) * 4, weight_per_batch=True),
        "f16",
        "depthwise_mma",
    ),
    (
        ConvSpec(3, 1, 12, 12, 1, (7, 7), pads=(3,) * 4, weight_per_batch=True),
        "int8",
        "depthwise_global",
    ),
    (ConvSpec(1, 8, 28, 28, 8, (7, 7), pads=(3, 3, 0, 5), group=8), "f16", "depthwise_mma"),
    (ConvSpec(1, 2, 200, 200, 2, (7, 7), pads=(3,) * 4, group=2), "f16", "depthwise_global"),
    # Wo = 18 is not a multiple of 4: depthwise_rows
    (ConvSpec(2, 8, 40, 36, 8, (7, 7), (2, 2), (3,) * 4, group=8), "int8", "depthwise_rows"),
    (_DW3, "f16", "depthwise_global"),
    (_DW3, "int8", "depthwise_global"),
    (_DW3, "f32", "depthwise_global"),
    (
        ConvSpec(32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256, weight_per_batch=True),
        "int8",
        "depthwise_global",
    ),
    (_DW5S2, "f16", "depthwise_global"),
    (_DW5S2, "int8", "depthwise_global"),
    (ConvSpec(2, 16, 28, 28, 16, (5, 5), pads=(2,) * 4, group=16), "int8", "depthwise_global"),
    # 3x3 INT8/FP16 take 8 outputs per thread: Wo = 28 is not a multiple of 8 (FP32 takes 4)
    (ConvSpec(2, 16, 28, 28, 16, (3, 3), pads=(1,) * 4, group=16), "int8", "depthwise_rows"),
    (ConvSpec(2, 16, 28, 28, 16, (3, 3), pads=(1,) * 4, group=16), "f16", "depthwise_rows"),
    (ConvSpec(2, 16, 28, 28, 16, (3, 3), pads=(1,) * 4, group=16), "f32", "depthwise_global"),
    # a right pad of 5 makes Wo = 20 > W = 16: depthwise_rows
    (ConvSpec(1, 8, 16, 16, 8, (3, 3), pads=(1, 1, 1, 5), group=8), "f32", "depthwise_rows"),
]


@pytest.mark.parametrize(("spec", "dtype", "path"), AUTO_CASES)
def test_depthwise_mma_per_shape_table(
    lib: KernelLibrary, spec: ConvSpec, dtype: str, path: str
) -> None:
    params = spec.to_params()
    previous = lib.set_mma_mode(kernel_lib.MMA_AUTO)
    try:
        assert lib.forward_path(params, dtype) == path
    finally:
        lib.set_mma_mode(previous)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("0", "depthwise_rows"),
        ("off", "depthwise_rows"),
        ("1", "depthwise_global"),
        ("", "depthwise_global"),
    ],
)
def test_global_mode_from_the_environment(
    lib: KernelLibrary, monkeypatch: pytest.MonkeyPatch, value: str, path: str
) -> None:
    """$QUANTBENCH_DWCONV_GLOBAL=0/off (read per forward) keeps depthwise_rows; else the
    depthwise_global kernel wherever it applies."""
    monkeypatch.setenv("QUANTBENCH_DWCONV_GLOBAL", value)
    previous = lib.set_mma_mode(kernel_lib.MMA_AUTO)
    try:
        assert lib.forward_path(_DW3.to_params(), "int8") == path
    finally:
        lib.set_mma_mode(previous)


def test_mma_mode_from_the_environment(built_library: Path) -> None:
    """$QUANTBENCH_DWCONV_MMA overrides the table at start: 1/on everywhere the plane fits, 0/off
    never; unset or anything else: the table (each in a fresh process, the mode is read once)."""
    probe = (
        "from quantbench.plugins.dwconv2d import kernel_lib as k; "
        f"lib = k.KernelLibrary({str(built_library)!r}); "
        "p = k.ConvSpec(32, 256, 56, 56, 256, (3, 3), pads=(1,) * 4, group=256).to_params(); "
        "q = k.ConvSpec(32, 384, 28, 28, 384, (7, 7), pads=(3,) * 4, group=384).to_params(); "
        "print(lib.set_mma_mode(-1), lib.forward_path(p, 'int8'), lib.forward_path(q, 'f16'))"
    )
    expected = {
        "1": "1 depthwise_mma depthwise_mma",
        "on": "1 depthwise_mma depthwise_mma",
        "0": "0 depthwise_global depthwise_global",
        "off": "0 depthwise_global depthwise_global",
        "": "2 depthwise_global depthwise_mma",
        None: "2 depthwise_global depthwise_mma",
    }
    for value, want in expected.items():
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("QUANTBENCH_DWCONV_MMA", "QUANTBENCH_DWCONV_GLOBAL")
        }
        if value is not None:
            env["QUANTBENCH_DWCONV_MMA"] = value
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == want, (value, out.stdout)
