/*
 * DWConv2D: 2-D convolution whose weights are a runtime tensor ("dynamic weights").
 *
 * Plain C ABI so that the same shared library serves the TensorRT plugin (DWConv2DPlugin.cpp),
 * Python through ctypes (plugins/dwconv2d/kernel_lib.py) and the GPU tests.
 *
 * Semantics are exactly ONNX Conv (NCHW, OIHW weights, group), extended by
 *   - per-batch weights: W is [N, K, C/group, kH, kW] instead of [K, C/group, kH, kW];
 *   - per-batch bias:    B is [N, K] instead of [K].
 *
 * Output size: Ho = floor((H + pad_top + pad_bottom - dilation_h * (kH - 1) - 1) / stride_h) + 1
 * (and likewise for Wo).
 *
 * Element types (all tensors dense, row-major, NCHW):
 *   dwconv2d_forward_f32   x, w, b, y float32; float32 accumulation.
 *   dwconv2d_forward_f16   x, w, b, y IEEE binary16; float32 accumulation; one rounding to
 *                          binary16 at the end (round to nearest even).
 *   dwconv2d_forward_int8  x, w int8 (symmetric, zero point 0), b float32 (real units);
 *                          int32 accumulation, then
 *                            v = fl(fl(float(acc) * fl(input_scale * weight_scale)) + b)
 *                          with each fl() one IEEE float32 rounding (no fused multiply-add), and
 *                            output_scale >  0: y int8 = clamp(round_half_even(fl(v / output_scale)),
 *                                                              -128, 127)
 *                            output_scale <= 0: y float32 = v
 *                          The rounding steps are spelled out so that a float32 host reference
 *                          reproduces the result bit for bit.
 *
 * Every entry point returns a cudaError_t value as int: 0 (cudaSuccess) on success,
 * 1 (cudaErrorInvalidValue) for invalid parameters or pointers (nothing is launched), otherwise the
 * error of the launch. Launches are asynchronous on `stream`; nothing synchronises.
 * Where their code was compiled for compute capability 9.0 or later, the depthwise_global kernels
 * are launched as programmatic dependents of the work before them in `stream` (they wait for it
 * to finish before reading or writing any tensor, so the results are unchanged;
 * $QUANTBENCH_DWCONV_PDL=0 launches them plainly).
 */
#ifndef QUANTBENCH_DWCONV2D_H
#define QUANTBENCH_DWCONV2D_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DWCONV2D_API __declspec(dllexport)
#else
#define DWCONV2D_API __attribute__((visibility("default")))
#endif

/* Bumped whenever DWConv2DParams or an entry point's signature changes. */
#define DWCONV2D_ABI_VERSION 1

/* Layout of the weight tensor. */
#define DWCONV2D_WEIGHT_SHARED 0    /* [K, C/group, kH, kW], one filter set for the whole batch */
#define DWCONV2D_WEIGHT_PER_BATCH 1 /* [N, K, C/group, kH, kW], one filter set per batch item */

/* Layout of the bias tensor. */
#define DWCONV2D_BIAS_NONE 0
#define DWCONV2D_BIAS_SHARED 1    /* [K] */
#define DWCONV2D_BIAS_PER_BATCH 2 /* [N, K] */

/* Kernel paths, as reported by dwconv2d_kernel_path(). */
#define DWCONV2D_PATH_INVALID (-1)
#define DWCONV2D_PATH_DEPTHWISE_TILED 0 /* C/group == 1: shared-memory tiles, one plane per z */
#define DWCONV2D_PATH_DIRECT 1          /* any shape: one thread per pixel and 4 output channels */
#define DWCONV2D_PATH_IMPLICIT_GEMM 2   /* K/group >= 32: 64x64 tiles of (channel x pixel) */
#define DWCONV2D_PATH_DEPTHWISE_ROWS 3  /* C/group == 1, 3x3/5x5/7x7, stride 1 or 2, pad_left == k/2,
                                           W % 4 == 0: whole rows staged with vector loads (the
                                           tiled path runs instead if x is not 4-byte aligned) */
#define DWCONV2D_PATH_CUDNN 4           /* grouped/dense FP32 and FP16 through cuDNN,
                                           loaded at run time (dlopen); see dwconv2d_forward_path() */
#define DWCONV2D_PATH_DEPTHWISE_MMA 5   /* FP16 and INT8 on depthwise_rows shapes whose planes fit a
                                           warp's shared memory: tensor cores (Toeplitz filter rows);
                                           where the per-shape table picks it (or when forced on,
                                           dwconv2d_set_mma_mode); reported by
                                           dwconv2d_forward_path()/_last_path() only */
#define DWCONV2D_PATH_GEMM_MMA 6        /* INT8 grouped and dense (C/group > 1): implicit GEMM on the
                                           integer tensor cores (sm_80+), after packing x and w
                                           into a workspace; unless dwconv2d_set_mma_mode(OFF);
                                           reported by dwconv2d_forward_path()/_last_path() only */
#define DWCONV2D_PATH_DEPTHWISE_GLOBAL 7 /* depthwise_rows shapes whose output rows split into whole
                                           8- or 4-wide segments (Wo % V == 0, Wo * stride <= W):
                                           rows read straight from global memory, no shared memory;
                                           unless QUANTBENCH_DWCONV_GLOBAL=0; reported by
                                           dwconv2d_forward_path()/_last_path() only */

/* Element types, for dwconv2d_forward_path(). */
#define DWCONV2D_DTYPE_F32 0
#define DWCONV2D_DTYPE_F16 1
#define DWCONV2D_DTYPE_INT8 2

/* cuDNN use, for dwconv2d_set_cudnn_mode(). */
#define DWCONV2D_CUDNN_OFF 0  /* our kernels only */
#define DWCONV2D_CUDNN_AUTO 1 /* the dispatch table: cuDNN for grouped/dense FP32 and FP16
                                 shapes (symmetric pads; FP16 with a bias through plans that round
                                 once), when a libcudnn.so.9 (or
                                 $QUANTBENCH_DWCONV_CUDNN) loads; the default unless
                                 $QUANTBENCH_DWCONV_CUDNN is 0 */

typedef struct DWConv2DParams
{
    int32_t batch;        /* N (0 is allowed: nothing is launched) */
    int32_t in_channels;  /* C */
    int32_t in_h;         /* H */
    int32_t in_w;         /* W */
    int32_t out_channels; /* K */
    int32_t kernel_h;     /* kH */
    int32_t kernel_w;     /* kW */
    int32_t stride_h;
    int32_t stride_w;
    int32_t pad_top; /* ONNX pads order: x1_begin, x2_begin, x1_end, x2_end */
    int32_t pad_left;
    int32_t pad_bottom;
    int32_t pad_right;
    int32_t dilation_h;
    int32_t dilation_w;
    int32_t group;       /* divides C and K */
    int32_t weight_mode; /* DWCONV2D_WEIGHT_* */
    int32_t bias_mode;   /* DWCONV2D_BIAS_* */
    int32_t out_h;       /* filled by dwconv2d_infer_output_shape(); checked by the forwards */
    int32_t out_w;
    float input_scale;  /* INT8 only: real = q * scale */
    float weight_scale; /* INT8 only, per tensor */
    float output_scale; /* INT8 only: > 0 requantizes to int8, <= 0 writes float32 */
} DWConv2DParams;

/* DWCONV2D_ABI_VERSION of the compiled library. */
DWCONV2D_API int dwconv2d_abi_version(void);

/* sizeof(DWConv2DParams) in the compiled library, for binding checks (ctypes). */
DWCONV2D_API size_t dwconv2d_params_size(void);

/* Validate everything but out_h/out_w, then set them from the formula above. Host only. */
DWCONV2D_API int dwconv2d_infer_output_shape(DWConv2DParams* params);

/* Validate all fields, out_h/out_w included. Host only. */
DWCONV2D_API int dwconv2d_validate(DWConv2DParams const* params);

/* Which of our kernels (DWCONV2D_PATH_* other than CUDNN) serves these parameters when cuDNN is
 * not used (INVALID if they are invalid). */
DWCONV2D_API int dwconv2d_kernel_path(DWConv2DParams const* params);

/* The path a forward of element type `dtype` (DWCONV2D_DTYPE_*) takes for these parameters now:
 * DWCONV2D_PATH_CUDNN where the dispatch table picks cuDNN and it loads, else
 * dwconv2d_kernel_path(). (A forward can still fall back to our kernels, e.g. when cuDNN has no
 * plan for the shape, or none is made yet while the stream is being captured; see
 * dwconv2d_last_path().) Host only. */
DWCONV2D_API int dwconv2d_forward_path(DWConv2DParams const* params, int dtype);

/* The path the calling thread's last successful-validation forward took (DWCONV2D_PATH_*), or
 * DWCONV2D_PATH_INVALID if none ran yet. */
DWCONV2D_API int dwconv2d_last_path(void);

/* Sets DWCONV2D_CUDNN_OFF / _AUTO for the process (other values only query); returns the mode
 * before the call. */
DWCONV2D_API int dwconv2d_set_cudnn_mode(int mode);

/* Our tensor-core kernels for the process. depthwise_mma (FP16/INT8 depthwise): DWCONV2D_MMA_AUTO
 * (the default: a small per-shape table, from H200 timings, picks it where it was measured faster
 * than depthwise_rows, i.e. FP16 7x7 stride 1), DWCONV2D_MMA_ON (wherever the plane fits) or
 * DWCONV2D_MMA_OFF (never: depthwise_rows). gemm_mma (INT8 grouped/dense): taken under AUTO and ON,
 * never under OFF (our CUDA-core kernels). Other values only query. $QUANTBENCH_DWCONV_MMA=1/on
 * or 0/off sets the mode at start. Returns the mode before the call. */
#define DWCONV2D_MMA_OFF 0
#define DWCONV2D_MMA_ON 1
#define DWCONV2D_MMA_AUTO 2
DWCONV2D_API int dwconv2d_set_mma_mode(int mode);

/* cudnnGetVersion() of the cuDNN that the library loaded (e.g. 91900), 0 if none loads. */
DWCONV2D_API int dwconv2d_cudnn_version(void);

/* b may be NULL only when bias_mode is DWCONV2D_BIAS_NONE. */
DWCONV2D_API int dwconv2d_forward_f32(float const* x, float const* w, float const* b, float* y,
    DWConv2DParams const* params, cudaStream_t stream);

/* x, w, b, y point to IEEE binary16 data (__half). */
DWCONV2D_API int dwconv2d_forward_f16(void const* x, void const* w, void const* b, void* y,
    DWConv2DParams const* params, cudaStream_t stream);

/* y is int8_t* when params->output_scale > 0, else float*. */
DWCONV2D_API int dwconv2d_forward_int8(int8_t const* x, int8_t const* w, float const* b, void* y,
    DWConv2DParams const* params, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QUANTBENCH_DWCONV2D_H */
