// DWConv2D kernels, Path direct: any shape, one thread per pixel and 4 channels.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "common.cuh"

namespace
{

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

} // namespace
