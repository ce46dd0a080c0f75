// DWConv2D kernels, Path implicit_gemm: K/group >= 32 on the CUDA cores.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "common.cuh"

namespace
{

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

} // namespace
