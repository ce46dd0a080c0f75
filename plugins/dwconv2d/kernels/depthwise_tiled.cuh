// DWConv2D kernels, Path depthwise_tiled: depthwise in shared-memory tiles.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "common.cuh"

namespace
{

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
    TIn const* const wp = filter_at(w, s, n, k, khw);

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

} // namespace
