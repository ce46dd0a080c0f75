// DWConv2D CUDA kernels: convolution with runtime ("dynamic") weights, ONNX Conv semantics plus
// per-batch weights and bias. See dwconv2d.h for the contract; this file holds three kernel paths:
//
//   depthwise_tiled  C/group == 1 (depthwise, with or without a channel multiplier). Each block
//                    stages the input patch of an output tile of one or more (n, k) planes in
//                    shared memory; each thread computes 8 vertically adjacent outputs. Square
//                    kernels of size 1, 3, 5, 7 are compile-time unrolled with the filter in
//                    registers, and with unit vertical stride and dilation the input rows slide
//                    through registers so each row is read from shared memory once per thread.
//   implicit_gemm    K/group >= 32: per (n, group) out[k, p] = sum_r W[k, r] * im2col(x)[r, p],
//                    64 x 64 output tiles, reduction in steps of 16 through shared memory.
//   direct           everything else (small grouped convs, shapes whose patch does not fit in
//                    shared memory): one thread per output pixel and 4 output channels, so each
//                    input value loaded is used 4 times.
//
// All paths accumulate in float32 (f32, f16 inputs) or int32 (int8 inputs) and share the same
// epilogues, so the numerics do not depend on the path.

#include "dwconv2d.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace
{

// ---------------------------------------------------------------------------------------------
// Types and epilogues
// ---------------------------------------------------------------------------------------------

template <class T>
struct Traits;

template <>
struct Traits<float>
{
    using Acc = float;
    using Vec4 = float4;
    __device__ static Acc load(float v)
    {
        return v;
    }
};

template <>
struct Traits<__half>
{
    using Acc = float;
    using Vec4 = float4;
    __device__ static Acc load(__half v)
    {
        return __half2float(v);
    }
};

template <>
struct Traits<int8_t>
{
    using Acc = int32_t;
    using Vec4 = int4;
    __device__ static Acc load(int8_t v)
    {
        return static_cast<int32_t>(v);
    }
};

__device__ inline float bias_to_float(float v)
{
    return v;
}

__device__ inline float bias_to_float(__half v)
{
    return __half2float(v);
}

struct StoreF32
{
    float* y;
    __device__ void operator()(int64_t i, float acc, float bias) const
    {
        y[i] = acc + bias;
    }
};

struct StoreF16
{
    __half* y;
    __device__ void operator()(int64_t i, float acc, float bias) const
    {
        y[i] = __float2half_rn(acc + bias);
    }
};

// INT8 epilogues: every step is one explicit IEEE float32 rounding (no FMA contraction), so that a
// float32 host reference can reproduce the output bit for bit (see dwconv2d.h).
struct StoreI8ToF32
{
    float* y;
    float acc_scale; // fl(input_scale * weight_scale)
    __device__ void operator()(int64_t i, int32_t acc, float bias) const
    {
        y[i] = __fadd_rn(__fmul_rn(__int2float_rn(acc), acc_scale), bias);
    }
};

struct StoreI8ToI8
{
    int8_t* y;
    float acc_scale;
    float output_scale;
    __device__ void operator()(int64_t i, int32_t acc, float bias) const
    {
        float const v = __fadd_rn(__fmul_rn(__int2float_rn(acc), acc_scale), bias);
        float q = rintf(__fdiv_rn(v, output_scale)); // rintf: round half to even
        q = fminf(fmaxf(q, -128.0F), 127.0F);
        y[i] = static_cast<int8_t>(static_cast<int32_t>(q));
    }
};

// Shape constants every kernel needs; passed by value.
struct ConvShape
{
    int32_t N, C, H, W, K, Ho, Wo;
    int32_t kH, kW, sh, sw, pt, pl, dh, dw;
    int32_t group, Cg, Kg;
    int32_t weight_per_batch;
    int32_t bias_mode;
};

template <class TB>
__device__ inline float load_bias(TB const* b, ConvShape const& s, int32_t n, int32_t k)
{
    if (s.bias_mode == DWCONV2D_BIAS_SHARED)
    {
        return bias_to_float(b[k]);
    }
    if (s.bias_mode == DWCONV2D_BIAS_PER_BATCH)
    {
        return bias_to_float(b[static_cast<int64_t>(n) * s.K + k]);
    }
    return 0.0F;
}

// ---------------------------------------------------------------------------------------------
// Path 1: depthwise, shared-memory tiles
// ---------------------------------------------------------------------------------------------

// Tuning knobs (compile-time; -D to override when measuring): output rows per thread, and global
// loads each thread issues before storing them to shared memory.
#ifndef DWCONV2D_DW_ROWS_PER_THREAD
#define DWCONV2D_DW_ROWS_PER_THREAD 8
#endif
#ifndef DWCONV2D_PATCH_LOAD_BATCH
#define DWCONV2D_PATCH_LOAD_BATCH 2
#endif
constexpr int kDwRowsPerThread = DWCONV2D_DW_ROWS_PER_THREAD;
constexpr int kPatchLoadBatch = DWCONV2D_PATCH_LOAD_BATCH;
constexpr int kMaxThreads = 256;
constexpr int kSmemBudget = 48 * 1024; // the default dynamic limit; no opt-in attribute needed

struct DwTile
{
    int32_t TH, TW;        // output tile
    int32_t PH, PW;        // input patch of that tile
    int32_t tilesH, tilesW;
    int32_t slice_elems;   // shared-memory elements per plane (patch + runtime filter)
};

template <int KS, class TIn, class TB, class Store>
__global__ void __launch_bounds__(kMaxThreads) depthwise_tiled_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, DwTile t)
{
    using Acc = typename Traits<TIn>::Acc;
    constexpr int R = kDwRowsPerThread;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* const patch = reinterpret_cast<Acc*>(smem_raw) + threadIdx.z * t.slice_elems;
    Acc* const wsm = patch + t.PH * t.PW; // the filter, only when KS == 0 (runtime size)

    // blockIdx.x = group of blockDim.z planes (n, k) * tiles + output tile, tile fastest (measured
    // faster than a 2-D grid of planes x tiles on an H200). All index math is 32-bit
    // (plan_depthwise guarantees it fits): the kernel is bound by instruction issue, and a 64-bit
    // division costs about as much as the convolution of a 3x3 tile row.
    uint32_t const tiles = static_cast<uint32_t>(t.tilesH * t.tilesW);
    uint32_t const group_of_planes = blockIdx.x / tiles;
    int32_t const tile = static_cast<int32_t>(blockIdx.x - group_of_planes * tiles);
    int32_t const plane = static_cast<int32_t>(group_of_planes * blockDim.z + threadIdx.z);
    bool const plane_ok = plane < s.N * s.K;
    int32_t const n = plane_ok ? plane / s.K : 0;
    int32_t const k = plane_ok ? plane - n * s.K : 0;
    int32_t const c = s.Kg == 1 ? k : k / s.Kg; // C/group == 1: the group index is the channel
    int32_t const khw = s.kH * s.kW;
    TIn const* const wp
        = w + (s.weight_per_batch ? static_cast<int64_t>(n) * s.K * khw : 0) + static_cast<int64_t>(k) * khw;

    int32_t const tile_h = tile / t.tilesW;
    int32_t const oh0 = tile_h * t.TH;
    int32_t const ow0 = (tile - tile_h * t.tilesW) * t.TW;
    int32_t const ih0 = oh0 * s.sh - s.pt;
    int32_t const iw0 = ow0 * s.sw - s.pl;
    int32_t const lt = threadIdx.y * blockDim.x + threadIdx.x;
    int32_t const nt = blockDim.x * blockDim.y;

    // The filter first (its loads overlap the patch loads), then the patch: each thread issues
    // kPatchLoadBatch independent global loads before it stores any of them to shared memory, so
    // a block waits about one memory latency per batch rather than one per element.
    [[maybe_unused]] Acc wr[KS > 0 ? KS * KS : 1];
    if (plane_ok)
    {
        if constexpr (KS > 0)
        {
#pragma unroll
            for (int i = 0; i < KS * KS; ++i)
            {
                wr[i] = Traits<TIn>::load(wp[i]);
            }
        }
        TIn const* const xp = x + (static_cast<int64_t>(n) * s.C + c) * s.H * s.W;
        int32_t const patch_elems = t.PH * t.PW;
        int32_t const step_r = nt / t.PW; // element i + nt is step_r rows and step_c columns on
        int32_t const step_c = nt - step_r * t.PW;
        int32_t r = lt / t.PW;
        int32_t col = lt - r * t.PW;
        for (int32_t first = lt; first < patch_elems; first += kPatchLoadBatch * nt)
        {
            Acc v[kPatchLoadBatch];
#pragma unroll
            for (int u = 0; u < kPatchLoadBatch; ++u)
            {
                int32_t const ih = ih0 + r;
                int32_t const iw = iw0 + col;
                v[u] = Acc(0);
                if (first + u * nt < patch_elems && static_cast<uint32_t>(ih) < static_cast<uint32_t>(s.H)
                    && static_cast<uint32_t>(iw) < static_cast<uint32_t>(s.W))
                {
                    v[u] = Traits<TIn>::load(xp[static_cast<int64_t>(ih) * s.W + iw]);
                }
                r += step_r;
                col += step_c;
                if (col >= t.PW)
                {
                    col -= t.PW;
                    ++r;
                }
            }
#pragma unroll
            for (int u = 0; u < kPatchLoadBatch; ++u)
            {
                if (first + u * nt < patch_elems)
                {
                    patch[first + u * nt] = v[u];
                }
            }
        }
        if constexpr (KS == 0)
        {
            for (int32_t i = lt; i < khw; i += nt)
            {
                wsm[i] = Traits<TIn>::load(wp[i]);
            }
        }
    }
    __syncthreads();

    int32_t const ow = ow0 + static_cast<int32_t>(threadIdx.x);
    int32_t const lr0 = static_cast<int32_t>(threadIdx.y) * R; // local output row of acc[0]
    int32_t const oh_first = oh0 + lr0;
    if (!plane_ok || ow >= s.Wo || oh_first >= s.Ho)
    {
        return;
    }

    Acc acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
        acc[i] = Acc(0);
    }
    Acc const* const col = patch + threadIdx.x * s.sw;

    if constexpr (KS > 0)
    {
        if (s.sh == 1 && s.dh == 1)
        {
            // Input row lr0 + j feeds output row i through filter row kh = j - i.
#pragma unroll
            for (int j = 0; j < R + KS - 1; ++j)
            {
                Acc const* const row = col + (lr0 + j) * t.PW;
                Acc v[KS];
#pragma unroll
                for (int q = 0; q < KS; ++q)
                {
                    v[q] = row[q * s.dw];
                }
#pragma unroll
                for (int i = 0; i < R; ++i)
                {
                    int const kh = j - i;
                    if (kh >= 0 && kh < KS)
                    {
#pragma unroll
                        for (int q = 0; q < KS; ++q)
                        {
                            acc[i] += v[q] * wr[kh * KS + q];
                        }
                    }
                }
            }
        }
        else
        {
#pragma unroll
            for (int i = 0; i < R; ++i)
            {
#pragma unroll
                for (int kh = 0; kh < KS; ++kh)
                {
                    Acc const* const row = col + ((lr0 + i) * s.sh + kh * s.dh) * t.PW;
#pragma unroll
                    for (int q = 0; q < KS; ++q)
                    {
                        acc[i] += row[q * s.dw] * wr[kh * KS + q];
                    }
                }
            }
        }
    }
    else
    {
#pragma unroll
        for (int i = 0; i < R; ++i)
        {
            for (int32_t kh = 0; kh < s.kH; ++kh)
            {
                Acc const* const row = col + ((lr0 + i) * s.sh + kh * s.dh) * t.PW;
                Acc const* const wrow = wsm + kh * s.kW;
                for (int32_t q = 0; q < s.kW; ++q)
                {
                    acc[i] += row[q * s.dw] * wrow[q];
                }
            }
        }
    }

    float const bias = load_bias(b, s, n, k);
    int64_t const y0 = (static_cast<int64_t>(plane) * s.Ho + oh_first) * s.Wo + ow;
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
        if (oh_first + i < s.Ho)
        {
            store(y0 + static_cast<int64_t>(i) * s.Wo, acc[i], bias);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Path 2: direct (any shape)
// ---------------------------------------------------------------------------------------------

constexpr int kDirectChannelsPerThread = 4;

// Index is uint32_t when the output count allows (the common case: 32-bit divisions are several
// times cheaper than 64-bit ones), else int64_t.
template <class Index, class TIn, class TB, class Store>
__global__ void __launch_bounds__(kMaxThreads) direct_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, int32_t kblocks_per_group,
    Index total)
{
    using Acc = typename Traits<TIn>::Acc;
    constexpr int KPT = kDirectChannelsPerThread;
    int32_t const khw = s.kH * s.kW;
    int64_t const w_stride_k = static_cast<int64_t>(s.Cg) * khw;
    int64_t const plane_hw = static_cast<int64_t>(s.H) * s.W;
    int32_t const kblocks = s.group * kblocks_per_group;

    Index const wo_ = static_cast<Index>(s.Wo);
    Index const ho_ = static_cast<Index>(s.Ho);
    Index const kb_ = static_cast<Index>(kblocks);
    for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<Index>(gridDim.x) * blockDim.x)
    {
        Index rest = idx / wo_;
        int32_t const ow = static_cast<int32_t>(idx - rest * wo_);
        Index const rest2 = rest / ho_;
        int32_t const oh = static_cast<int32_t>(rest - rest2 * ho_);
        Index const nidx = rest2 / kb_;
        int32_t const kb = static_cast<int32_t>(rest2 - nidx * kb_);
        int32_t const n = static_cast<int32_t>(nidx);
        int32_t const g = kb / kblocks_per_group;
        int32_t const kl0 = (kb % kblocks_per_group) * KPT;
        int32_t const nk = min(KPT, s.Kg - kl0);
        int32_t const k0 = g * s.Kg + kl0;

        TIn const* const xg = x + (static_cast<int64_t>(n) * s.C + static_cast<int64_t>(g) * s.Cg) * plane_hw;
        TIn const* const wk = w + (s.weight_per_batch ? static_cast<int64_t>(n) * s.K * w_stride_k : 0)
            + static_cast<int64_t>(k0) * w_stride_k;
        int32_t const ih0 = oh * s.sh - s.pt;
        int32_t const iw0 = ow * s.sw - s.pl;

        Acc acc[KPT];
#pragma unroll
        for (int j = 0; j < KPT; ++j)
        {
            acc[j] = Acc(0);
        }
        for (int32_t ci = 0; ci < s.Cg; ++ci)
        {
            TIn const* const xc = xg + ci * plane_hw;
            TIn const* const wc = wk + ci * khw;
            for (int32_t kh = 0; kh < s.kH; ++kh)
            {
                int32_t const ih = ih0 + kh * s.dh;
                if (static_cast<uint32_t>(ih) >= static_cast<uint32_t>(s.H))
                {
                    continue;
                }
                for (int32_t q = 0; q < s.kW; ++q)
                {
                    int32_t const iw = iw0 + q * s.dw;
                    if (static_cast<uint32_t>(iw) >= static_cast<uint32_t>(s.W))
                    {
                        continue;
                    }
                    Acc const v = Traits<TIn>::load(xc[static_cast<int64_t>(ih) * s.W + iw]);
                    int32_t const wo = kh * s.kW + q;
#pragma unroll
                    for (int j = 0; j < KPT; ++j)
                    {
                        if (j < nk)
                        {
                            acc[j] += v * Traits<TIn>::load(wc[j * w_stride_k + wo]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < KPT; ++j)
        {
            if (j < nk)
            {
                int32_t const k = k0 + j;
                int64_t const yi = ((static_cast<int64_t>(n) * s.K + k) * s.Ho + oh) * s.Wo + ow;
                store(yi, acc[j], load_bias(b, s, n, k));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Path 3: implicit GEMM (K/group >= 32)
// ---------------------------------------------------------------------------------------------

constexpr int kGemmBM = 64; // output channels per block
constexpr int kGemmBN = 64; // output pixels per block
constexpr int kGemmBK = 16; // reduction step
constexpr int kGemmPad = 4; // keeps 16-byte alignment of rows, spreads the transposed stores

template <class TIn, class TB, class Store>
__global__ void __launch_bounds__(kMaxThreads) implicit_gemm_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, int32_t ptiles,
    int32_t ktiles)
{
    using Acc = typename Traits<TIn>::Acc;
    using Vec4 = typename Traits<TIn>::Vec4;
    __shared__ __align__(16) Acc As[kGemmBK][kGemmBM + kGemmPad]; // weights, [r][k]
    __shared__ __align__(16) Acc Bs[kGemmBK][kGemmBN + kGemmPad]; // im2col(x), [r][p]

    int64_t blk = blockIdx.x;
    int32_t const ptile = static_cast<int32_t>(blk % ptiles);
    blk /= ptiles;
    int32_t const ktile = static_cast<int32_t>(blk % ktiles);
    int64_t const ng = blk / ktiles;
    int32_t const n = static_cast<int32_t>(ng / s.group);
    int32_t const g = static_cast<int32_t>(ng % s.group);

    int32_t const khw = s.kH * s.kW;
    int32_t const red = s.Cg * khw;
    int32_t const pixels = s.Ho * s.Wo;
    int32_t const k_base = ktile * kGemmBM;
    int32_t const p_base = ptile * kGemmBN;
    TIn const* const wg = w + (s.weight_per_batch ? static_cast<int64_t>(n) * s.K * red : 0)
        + static_cast<int64_t>(g) * s.Kg * red;
    TIn const* const xg = x + (static_cast<int64_t>(n) * s.C + static_cast<int64_t>(g) * s.Cg) * s.H * s.W;

    int32_t const tid = threadIdx.x;
    int32_t const tx = tid % 16; // 4 pixels each
    int32_t const ty = tid / 16; // 4 channels each

    Acc acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            acc[i][j] = Acc(0);
        }
    }

    for (int32_t r0 = 0; r0 < red; r0 += kGemmBK)
    {
#pragma unroll
        for (int e4 = 0; e4 < (kGemmBM * kGemmBK) / kMaxThreads; ++e4)
        {
            int32_t const e = tid + e4 * kMaxThreads;
            int32_t const kk = e / kGemmBK;
            int32_t const rr = e % kGemmBK;
            int32_t const kl = k_base + kk;
            int32_t const r = r0 + rr;
            Acc v = Acc(0);
            if (kl < s.Kg && r < red)
            {
                v = Traits<TIn>::load(wg[static_cast<int64_t>(kl) * red + r]);
            }
            As[rr][kk] = v;
        }
#pragma unroll
        for (int e4 = 0; e4 < (kGemmBN * kGemmBK) / kMaxThreads; ++e4)
        {
            int32_t const e = tid + e4 * kMaxThreads;
            int32_t const rr = e / kGemmBN;
            int32_t const pp = e % kGemmBN;
            int32_t const p = p_base + pp;
            int32_t const r = r0 + rr;
            Acc v = Acc(0);
            if (p < pixels && r < red)
            {
                int32_t const ci = r / khw;
                int32_t const rem = r - ci * khw;
                int32_t const kh = rem / s.kW;
                int32_t const q = rem - kh * s.kW;
                int32_t const oh = p / s.Wo;
                int32_t const ow = p - oh * s.Wo;
                int32_t const ih = oh * s.sh - s.pt + kh * s.dh;
                int32_t const iw = ow * s.sw - s.pl + q * s.dw;
                if (static_cast<uint32_t>(ih) < static_cast<uint32_t>(s.H)
                    && static_cast<uint32_t>(iw) < static_cast<uint32_t>(s.W))
                {
                    v = Traits<TIn>::load(xg[(static_cast<int64_t>(ci) * s.H + ih) * s.W + iw]);
                }
            }
            Bs[rr][pp] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kGemmBK; ++kk)
        {
            Vec4 const a4 = *reinterpret_cast<Vec4 const*>(&As[kk][ty * 4]);
            Vec4 const b4 = *reinterpret_cast<Vec4 const*>(&Bs[kk][tx * 4]);
            Acc const a[4] = {a4.x, a4.y, a4.z, a4.w};
            Acc const bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
            {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                {
                    acc[i][j] += a[i] * bv[j];
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        int32_t const kl = k_base + ty * 4 + i;
        if (kl >= s.Kg)
        {
            continue;
        }
        int32_t const k = g * s.Kg + kl;
        float const bias = load_bias(b, s, n, k);
        int64_t const ybase = (static_cast<int64_t>(n) * s.K + k) * pixels;
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            int32_t const p = p_base + tx * 4 + j;
            if (p < pixels)
            {
                store(ybase + p, acc[i][j], bias);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host side: validation, planning, dispatch
// ---------------------------------------------------------------------------------------------

constexpr int kInvalid = static_cast<int>(cudaErrorInvalidValue);

int64_t out_extent(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t kernel, int64_t stride, int64_t dil)
{
    int64_t const span = in + pad_begin + pad_end - dil * (kernel - 1) - 1;
    if (span < 0)
    {
        return 0;
    }
    return span / stride + 1;
}

// Everything but out_h/out_w. Limits keep every per-plane index inside int32 and every element
// count of a tensor inside int64 arithmetic with room to spare.
bool valid_without_output(DWConv2DParams const& p)
{
    if (p.batch < 0 || p.in_channels < 1 || p.in_h < 1 || p.in_w < 1 || p.out_channels < 1)
    {
        return false;
    }
    if (p.kernel_h < 1 || p.kernel_w < 1 || p.stride_h < 1 || p.stride_w < 1 || p.dilation_h < 1
        || p.dilation_w < 1)
    {
        return false;
    }
    if (p.pad_top < 0 || p.pad_left < 0 || p.pad_bottom < 0 || p.pad_right < 0)
    {
        return false;
    }
    if (p.group < 1 || p.in_channels % p.group != 0 || p.out_channels % p.group != 0)
    {
        return false;
    }
    if (p.weight_mode != DWCONV2D_WEIGHT_SHARED && p.weight_mode != DWCONV2D_WEIGHT_PER_BATCH)
    {
        return false;
    }
    if (p.bias_mode != DWCONV2D_BIAS_NONE && p.bias_mode != DWCONV2D_BIAS_SHARED
        && p.bias_mode != DWCONV2D_BIAS_PER_BATCH)
    {
        return false;
    }
    // Padded extents and plane sizes stay far from int32 overflow inside the kernels.
    int64_t const padded_h = static_cast<int64_t>(p.in_h) + p.pad_top + p.pad_bottom;
    int64_t const padded_w = static_cast<int64_t>(p.in_w) + p.pad_left + p.pad_right;
    int64_t const span_h = static_cast<int64_t>(p.dilation_h) * (p.kernel_h - 1);
    int64_t const span_w = static_cast<int64_t>(p.dilation_w) * (p.kernel_w - 1);
    if (padded_h > INT32_MAX / 4 || padded_w > INT32_MAX / 4 || span_h > INT32_MAX / 4 || span_w > INT32_MAX / 4)
    {
        return false;
    }
    if (static_cast<int64_t>(p.in_h) * p.in_w > INT32_MAX)
    {
        return false;
    }
    int64_t const red = static_cast<int64_t>(p.in_channels / p.group) * p.kernel_h * p.kernel_w;
    if (red > INT32_MAX)
    {
        return false;
    }
    int64_t const oh = out_extent(p.in_h, p.pad_top, p.pad_bottom, p.kernel_h, p.stride_h, p.dilation_h);
    int64_t const ow = out_extent(p.in_w, p.pad_left, p.pad_right, p.kernel_w, p.stride_w, p.dilation_w);
    return oh >= 1 && ow >= 1 && oh * ow <= INT32_MAX;
}

bool valid(DWConv2DParams const& p)
{
    if (!valid_without_output(p))
    {
        return false;
    }
    return p.out_h == out_extent(p.in_h, p.pad_top, p.pad_bottom, p.kernel_h, p.stride_h, p.dilation_h)
        && p.out_w == out_extent(p.in_w, p.pad_left, p.pad_right, p.kernel_w, p.stride_w, p.dilation_w);
}

ConvShape make_shape(DWConv2DParams const& p)
{
    ConvShape s{};
    s.N = p.batch;
    s.C = p.in_channels;
    s.H = p.in_h;
    s.W = p.in_w;
    s.K = p.out_channels;
    s.Ho = p.out_h;
    s.Wo = p.out_w;
    s.kH = p.kernel_h;
    s.kW = p.kernel_w;
    s.sh = p.stride_h;
    s.sw = p.stride_w;
    s.pt = p.pad_top;
    s.pl = p.pad_left;
    s.dh = p.dilation_h;
    s.dw = p.dilation_w;
    s.group = p.group;
    s.Cg = p.in_channels / p.group;
    s.Kg = p.out_channels / p.group;
    s.weight_per_batch = p.weight_mode == DWCONV2D_WEIGHT_PER_BATCH ? 1 : 0;
    s.bias_mode = p.bias_mode;
    return s;
}

int32_t ceil_div(int64_t a, int64_t b)
{
    return static_cast<int32_t>((a + b - 1) / b);
}

int32_t pow2_at_least(int32_t v, int32_t cap)
{
    int32_t r = 1;
    while (r < v && r < cap)
    {
        r *= 2;
    }
    return r;
}

bool is_unrolled_size(ConvShape const& s)
{
    return s.kH == s.kW && (s.kH == 1 || s.kH == 3 || s.kH == 5 || s.kH == 7);
}

struct DwPlan
{
    DwTile tile;
    dim3 block;
    dim3 grid;
    size_t smem_bytes;
};

// Picks the block shape for the depthwise path: 32 (or fewer, for narrow outputs) columns per
// block, kDwRowsPerThread rows per thread, and several planes per block when one plane is too small to keep 256
// threads busy. Returns false when not even the smallest tile fits in shared memory.
bool plan_depthwise(ConvShape const& s, DwPlan* plan)
{
    constexpr int R = kDwRowsPerThread;
    int32_t const filter_elems = is_unrolled_size(s) ? 0 : s.kH * s.kW;
    int32_t bx = pow2_at_least(s.Wo, 32);
    int32_t by = static_cast<int32_t>(
        std::min<int64_t>(kMaxThreads / bx, static_cast<int64_t>(ceil_div(s.Ho, R))));
    auto slice = [&](int32_t bxx, int32_t byy) -> int64_t {
        int64_t const ph = static_cast<int64_t>(byy * R - 1) * s.sh + static_cast<int64_t>(s.kH - 1) * s.dh + 1;
        int64_t const pw = static_cast<int64_t>(bxx - 1) * s.sw + static_cast<int64_t>(s.kW - 1) * s.dw + 1;
        return ph * pw + filter_elems;
    };
    int64_t const elem = 4; // float or int32 in shared memory
    while (slice(bx, by) * elem > kSmemBudget)
    {
        if (by > 1)
        {
            by = (by + 1) / 2;
        }
        else if (bx > 1)
        {
            bx /= 2;
        }
        else
        {
            return false;
        }
    }
    int64_t const planes = std::max<int64_t>(1, static_cast<int64_t>(s.N) * s.K);
    if (planes > INT32_MAX - 64) // plane indices stay 32-bit in the kernel
    {
        return false;
    }
    int64_t bz = std::max<int64_t>(1, kMaxThreads / (bx * by));
    bz = std::min<int64_t>(bz, std::min<int64_t>(planes, 64)); // blockDim.z <= 64
    while (bz > 1 && bz * slice(bx, by) * elem > kSmemBudget)
    {
        --bz;
    }
    DwTile t{};
    t.TW = bx;
    t.TH = by * R;
    t.PH = (t.TH - 1) * s.sh + (s.kH - 1) * s.dh + 1;
    t.PW = (t.TW - 1) * s.sw + (s.kW - 1) * s.dw + 1;
    t.tilesH = ceil_div(s.Ho, t.TH);
    t.tilesW = ceil_div(s.Wo, t.TW);
    t.slice_elems = static_cast<int32_t>(slice(bx, by));
    plan->tile = t;
    plan->block = dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by), static_cast<unsigned>(bz));
    int64_t const blocks = (planes + bz - 1) / bz * (static_cast<int64_t>(t.tilesH) * t.tilesW);
    if (blocks > INT32_MAX) // such problems take the direct path
    {
        return false;
    }
    plan->grid = dim3(static_cast<unsigned>(blocks), 1, 1);
    plan->smem_bytes = static_cast<size_t>(bz * t.slice_elems * elem);
    return true;
}

int select_path(DWConv2DParams const& p)
{
    if (!valid(p))
    {
        return DWCONV2D_PATH_INVALID;
    }
    ConvShape const s = make_shape(p);
    if (s.Cg == 1)
    {
        DwPlan plan{};
        if (plan_depthwise(s, &plan))
        {
            return DWCONV2D_PATH_DEPTHWISE_TILED;
        }
        return DWCONV2D_PATH_DIRECT;
    }
    if (s.Kg >= 32 && s.Cg * s.kH * s.kW >= kGemmBK)
    {
        int64_t const blocks = static_cast<int64_t>(ceil_div(static_cast<int64_t>(s.Ho) * s.Wo, kGemmBN))
            * ceil_div(s.Kg, kGemmBM) * s.N * s.group;
        if (blocks <= INT32_MAX)
        {
            return DWCONV2D_PATH_IMPLICIT_GEMM;
        }
    }
    return DWCONV2D_PATH_DIRECT;
}

template <int KS, class TIn, class TB, class Store>
int launch_depthwise_ks(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s,
    DwPlan const& plan, cudaStream_t stream)
{
    depthwise_tiled_kernel<KS, TIn, TB, Store>
        <<<plan.grid, plan.block, plan.smem_bytes, stream>>>(x, w, b, store, s, plan.tile);
    return static_cast<int>(cudaGetLastError());
}

template <class TIn, class TB, class Store>
int launch_depthwise(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s, cudaStream_t stream)
{
    DwPlan plan{};
    if (!plan_depthwise(s, &plan))
    {
        return kInvalid; // select_path() never sends such shapes here
    }
    if (is_unrolled_size(s))
    {
        switch (s.kH)
        {
        case 1: return launch_depthwise_ks<1>(x, w, b, store, s, plan, stream);
        case 3: return launch_depthwise_ks<3>(x, w, b, store, s, plan, stream);
        case 5: return launch_depthwise_ks<5>(x, w, b, store, s, plan, stream);
        case 7: return launch_depthwise_ks<7>(x, w, b, store, s, plan, stream);
        default: break;
        }
    }
    return launch_depthwise_ks<0>(x, w, b, store, s, plan, stream);
}

template <class TIn, class TB, class Store>
int launch_direct(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s, cudaStream_t stream)
{
    int32_t const kblocks_per_group = ceil_div(s.Kg, kDirectChannelsPerThread);
    int64_t const total
        = static_cast<int64_t>(s.N) * s.group * kblocks_per_group * static_cast<int64_t>(s.Ho) * s.Wo;
    // Grid-stride loop: a bounded grid covers any size.
    int64_t const blocks = std::min<int64_t>((total + kMaxThreads - 1) / kMaxThreads, int64_t{1} << 20);
    if (total <= INT32_MAX)
    {
        direct_kernel<uint32_t, TIn, TB, Store><<<static_cast<unsigned>(blocks), kMaxThreads, 0, stream>>>(
            x, w, b, store, s, kblocks_per_group, static_cast<uint32_t>(total));
    }
    else
    {
        direct_kernel<int64_t, TIn, TB, Store><<<static_cast<unsigned>(blocks), kMaxThreads, 0, stream>>>(
            x, w, b, store, s, kblocks_per_group, total);
    }
    return static_cast<int>(cudaGetLastError());
}

template <class TIn, class TB, class Store>
int launch_gemm(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s, cudaStream_t stream)
{
    int32_t const ptiles = ceil_div(static_cast<int64_t>(s.Ho) * s.Wo, kGemmBN);
    int32_t const ktiles = ceil_div(s.Kg, kGemmBM);
    int64_t const blocks = static_cast<int64_t>(ptiles) * ktiles * s.N * s.group;
    implicit_gemm_kernel<TIn, TB, Store>
        <<<static_cast<unsigned>(blocks), kMaxThreads, 0, stream>>>(x, w, b, store, s, ptiles, ktiles);
    return static_cast<int>(cudaGetLastError());
}

bool pointers_ok(void const* x, void const* w, void const* b, void const* y, DWConv2DParams const* p)
{
    if (x == nullptr || w == nullptr || y == nullptr)
    {
        return false;
    }
    return p->bias_mode == DWCONV2D_BIAS_NONE || b != nullptr;
}

template <class TIn, class TB, class Store>
int run(TIn const* x, TIn const* w, TB const* b, Store store, DWConv2DParams const& p, cudaStream_t stream)
{
    int const path = select_path(p);
    if (path == DWCONV2D_PATH_INVALID)
    {
        return kInvalid;
    }
    if (p.batch == 0)
    {
        return static_cast<int>(cudaSuccess);
    }
    ConvShape const s = make_shape(p);
    switch (path)
    {
    case DWCONV2D_PATH_DEPTHWISE_TILED: return launch_depthwise(x, w, b, store, s, stream);
    case DWCONV2D_PATH_IMPLICIT_GEMM: return launch_gemm(x, w, b, store, s, stream);
    default: return launch_direct(x, w, b, store, s, stream);
    }
}

bool finite_positive(float v)
{
    return std::isfinite(v) && v > 0.0F;
}

} // namespace

extern "C" {

int dwconv2d_abi_version(void)
{
    return DWCONV2D_ABI_VERSION;
}

size_t dwconv2d_params_size(void)
{
    return sizeof(DWConv2DParams);
}

int dwconv2d_infer_output_shape(DWConv2DParams* params)
{
    if (params == nullptr || !valid_without_output(*params))
    {
        return kInvalid;
    }
    DWConv2DParams& p = *params;
    p.out_h = static_cast<int32_t>(out_extent(p.in_h, p.pad_top, p.pad_bottom, p.kernel_h, p.stride_h, p.dilation_h));
    p.out_w = static_cast<int32_t>(out_extent(p.in_w, p.pad_left, p.pad_right, p.kernel_w, p.stride_w, p.dilation_w));
    return static_cast<int>(cudaSuccess);
}

int dwconv2d_validate(DWConv2DParams const* params)
{
    return params != nullptr && valid(*params) ? static_cast<int>(cudaSuccess) : kInvalid;
}

int dwconv2d_kernel_path(DWConv2DParams const* params)
{
    return params == nullptr ? DWCONV2D_PATH_INVALID : select_path(*params);
}

int dwconv2d_forward_f32(
    float const* x, float const* w, float const* b, float* y, DWConv2DParams const* params, cudaStream_t stream)
{
    if (params == nullptr || !pointers_ok(x, w, b, y, params))
    {
        return kInvalid;
    }
    return run(x, w, b, StoreF32{y}, *params, stream);
}

int dwconv2d_forward_f16(
    void const* x, void const* w, void const* b, void* y, DWConv2DParams const* params, cudaStream_t stream)
{
    if (params == nullptr || !pointers_ok(x, w, b, y, params))
    {
        return kInvalid;
    }
    return run(static_cast<__half const*>(x), static_cast<__half const*>(w), static_cast<__half const*>(b),
        StoreF16{static_cast<__half*>(y)}, *params, stream);
}

int dwconv2d_forward_int8(
    int8_t const* x, int8_t const* w, float const* b, void* y, DWConv2DParams const* params, cudaStream_t stream)
{
    if (params == nullptr || !pointers_ok(x, w, b, y, params))
    {
        return kInvalid;
    }
    DWConv2DParams const& p = *params;
    if (!finite_positive(p.input_scale) || !finite_positive(p.weight_scale) || !std::isfinite(p.output_scale))
    {
        return kInvalid;
    }
    // |int8 * int8| <= 2^14, so up to 2^17 - 1 products fit in int32 without overflow.
    int64_t const red = static_cast<int64_t>(p.in_channels / std::max(p.group, 1)) * p.kernel_h * p.kernel_w;
    if (red >= (int64_t{1} << 17))
    {
        return kInvalid;
    }
    float const acc_scale = p.input_scale * p.weight_scale;
    if (!finite_positive(acc_scale))
    {
        return kInvalid;
    }
    if (p.output_scale > 0.0F)
    {
        return run(x, w, b, StoreI8ToI8{static_cast<int8_t*>(y), acc_scale, p.output_scale}, p, stream);
    }
    return run(x, w, b, StoreI8ToF32{static_cast<float*>(y), acc_scale}, p, stream);
}

} // extern "C"
