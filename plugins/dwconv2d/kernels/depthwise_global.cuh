// DWConv2D kernels, Path depthwise_global: depthwise rows straight from global memory.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "depthwise_rows.cuh"

namespace
{

// ---------------------------------------------------------------------------------------------
// Path 1d: depthwise_global (depthwise_rows shapes whose output rows split into whole segments)
// ---------------------------------------------------------------------------------------------
//
// No shared memory, no block barriers, no persistent loop: one thread per V adjacent outputs of R
// output rows of one plane, which reads its (R - 1) * S + KS input rows straight from global
// memory (each row: its segment of V * S elements plus one 4-element quad either side, aligned
// vector loads; rows and quads outside the image read as zero, see global_pred) and keeps only
// the accumulators of the rows still being summed, storing each output row as soon as its last
// input row is summed. Few registers, so many warps per multiprocessor hide the loads' latency,
// and neighbouring threads' overlapping rows and quads come from L1/L2, not DRAM. Where the kernel
// is bound by that latency rather than by bandwidth (INT8 3x3, FP32 7x7), warp 0 of each block can
// also have the copy engine prefetch into L2 the input of a block half a wave later (see
// global_prefetch_pct; on by default since Session 31), so that that block's first rows come
// from L2. The arithmetic
// is depthwise_rows' (rows_dp4a for INT8 with the same filter packing, rows_fma for float, the
// same Store functors), so the results are identical to it, bit for bit.
//
// It serves every depthwise_rows shape whose output rows split into whole segments (see
// global_shape_ok; measured faster than depthwise_rows on every timed shape and type, README "What
// has been verified"); QUANTBENCH_DWCONV_GLOBAL=0 (read per forward) keeps depthwise_rows.
// Compile-time knobs (tuning; defaults = the measured best): DWCONV2D_GLOBAL_R3 / _R3_I8 /
// _R5_NARROW / _R7_F32 / _R (output rows per thread at 3x3 / INT8 3x3 / FP16 and INT8 5x5 / FP32
// 7x7 / else), DWCONV2D_GLOBAL_THREADS (per block), DWCONV2D_GLOBAL_AHEAD / _AHEAD_I8_3 (input
// rows read ahead, see global_ahead), DWCONV2D_GLOBAL_MIN_BLOCKS_F16 / _I8 / _F32_7
// (__launch_bounds__ of FP16 3x3 / 5x5, INT8 3x3 and FP32 7x7, see global_min_blocks),
// DWCONV2D_GLOBAL_PRED / _PRED_FLOAT_7X7 / _PRED_F32_7X7 (below), DWCONV2D_GLOBAL_PREFETCH_I8_3 /
// _F32_7 (L2 prefetch distance, see global_prefetch_pct; 0 = off; default 50).
#ifndef DWCONV2D_GLOBAL_R3
#define DWCONV2D_GLOBAL_R3 4
#endif
#ifndef DWCONV2D_GLOBAL_R3_I8
#define DWCONV2D_GLOBAL_R3_I8 DWCONV2D_GLOBAL_R3
#endif
#ifndef DWCONV2D_GLOBAL_R5_NARROW
#define DWCONV2D_GLOBAL_R5_NARROW 4
#endif
#ifndef DWCONV2D_GLOBAL_R
#define DWCONV2D_GLOBAL_R 7
#endif
#ifndef DWCONV2D_GLOBAL_R7_F32
#define DWCONV2D_GLOBAL_R7_F32 DWCONV2D_GLOBAL_R
#endif
#ifndef DWCONV2D_GLOBAL_THREADS
#define DWCONV2D_GLOBAL_THREADS 128
#endif
#ifndef DWCONV2D_GLOBAL_AHEAD
#define DWCONV2D_GLOBAL_AHEAD 1
#endif
#ifndef DWCONV2D_GLOBAL_AHEAD_I8_3
#define DWCONV2D_GLOBAL_AHEAD_I8_3 2
#endif
#ifndef DWCONV2D_GLOBAL_MIN_BLOCKS_F16
#define DWCONV2D_GLOBAL_MIN_BLOCKS_F16 8
#endif
#ifndef DWCONV2D_GLOBAL_MIN_BLOCKS_I8
#define DWCONV2D_GLOBAL_MIN_BLOCKS_I8 7
#endif
#ifndef DWCONV2D_GLOBAL_MIN_BLOCKS_F32_7
#define DWCONV2D_GLOBAL_MIN_BLOCKS_F32_7 4
#endif
// Rows and quads outside the image: skipped by predicated loads (1: measured faster, or equal,
// on every timed shape), or loaded from a row inside and zeroed (0). FP16 7x7 keeps 0 (42.2
// against 38.4 us, H200, session 12: predicated, it needs more registers). FP32 7x7 was the same
// (44.3 against 41.3) until Session 30 capped it at 128 registers (DWCONV2D_GLOBAL_MIN_BLOCKS_F32_7
// = 4): predicated at 128 registers it needs no spill and about 9 % fewer instructions (1817
// against 2001 per thread: no selects of row pointers, no zeroing), and 16 warps per
// multiprocessor run instead of 12 (H100: 38.2-39.0 against 43.1-43.2 us). DWCONV2D_GLOBAL_PRED
// sets all shapes.
#ifdef DWCONV2D_GLOBAL_PRED
#define DWCONV2D_GLOBAL_PRED_FLOAT_7X7 DWCONV2D_GLOBAL_PRED
#define DWCONV2D_GLOBAL_PRED_F32_7X7 DWCONV2D_GLOBAL_PRED
#else
#define DWCONV2D_GLOBAL_PRED 1
#endif
#ifndef DWCONV2D_GLOBAL_PRED_FLOAT_7X7
#define DWCONV2D_GLOBAL_PRED_FLOAT_7X7 0
#endif
#ifndef DWCONV2D_GLOBAL_PRED_F32_7X7
#define DWCONV2D_GLOBAL_PRED_F32_7X7 1
#endif
__host__ __device__ constexpr bool global_pred(int elem, int ks)
{
    return (elem == 4 && ks == 7 ? DWCONV2D_GLOBAL_PRED_F32_7X7
            : elem != 1 && ks == 7 ? DWCONV2D_GLOBAL_PRED_FLOAT_7X7
                                   : DWCONV2D_GLOBAL_PRED) != 0;
}
constexpr int kGlobalThreads = DWCONV2D_GLOBAL_THREADS;

// Launched as a programmatic dependent of the work before it in the stream (sm_90 and later; see
// pdl_wait_and_release and global_pdl in host_plan.cuh): 1 by default, 0 a plain launch;
// QUANTBENCH_DWCONV_PDL (read per forward) sets it for the process.
#ifndef DWCONV2D_GLOBAL_PDL
#define DWCONV2D_GLOBAL_PDL 1
#endif

// Input rows read ahead of the one summed: 2 for INT8 3x3 (24.7 against 27.0 us with per-batch
// weights, 23.7-24.7 against 24.4 shared), 1 elsewhere (2 measured no faster for FP16 and FP32 3x3
// and INT8 5x5 / 7x7, and 49.6 against 41.1 us for FP32 7x7).
__host__ __device__ constexpr int global_ahead(int elem, int ks)
{
    return elem == 1 && ks == 3 ? DWCONV2D_GLOBAL_AHEAD_I8_3 : DWCONV2D_GLOBAL_AHEAD;
}

// __launch_bounds__ minimum blocks per multiprocessor: 8 (64 registers) for FP16 3x3 / 5x5, 7 (72
// registers, 28 warps instead of 24) for INT8 3x3, 4 (128 registers, 16 warps instead of 12) for
// FP32 7x7 with its predicated loads (without them it spills at 4 or 5: 45.8 against 41 us; at 3,
// 168 registers, predicated, 16 bytes of spill: 40.9 against 38.2 us at 4), none elsewhere. FP16
// at 9 / 10 / 12 and INT8 at 8 were no faster or spilled.
__host__ __device__ constexpr int global_min_blocks(int elem, int ks)
{
    return elem == 2 && ks <= 5 ? DWCONV2D_GLOBAL_MIN_BLOCKS_F16
        : elem == 1 && ks == 3  ? DWCONV2D_GLOBAL_MIN_BLOCKS_I8
        : elem == 4 && ks == 7  ? DWCONV2D_GLOBAL_MIN_BLOCKS_F32_7
                                : 1;
}
// Outputs per thread along W (8 for the narrow types' 3x3, else 4) and output rows per thread
// (4 at 3x3 and for FP16 / INT8 5x5, else 7: each measured best of 2, 4, 7/8 and 14 on the timed
// shapes). Session 30 (H100) again for INT8 3x3, where 7 rows would cut the instructions per
// output by about a fifth (set-up shared by 56 outputs instead of 32): 7 / 8 / 14 rows gave 27.4
// / 26.9 / 32.6 us against 25.0 at 4 (27.6-28.7 with the L2 prefetch), because at 4 rows the
// compiler issues 5 of a thread's 6 input rows before its first wait, and at 7 it cannot (the
// rows then wait one after another); and for FP32 7x7 (predicated, 128 registers): 4 / 14 rows
// gave 41.5 / 39.8 us against 38.2 at 7.
__host__ __device__ constexpr int global_v(int elem, int ks)
{
    return ks == 3 && elem != 4 ? 8 : 4;
}
__host__ __device__ constexpr int global_r(int elem, int ks)
{
    return ks == 3                ? (elem == 1 ? DWCONV2D_GLOBAL_R3_I8 : DWCONV2D_GLOBAL_R3)
        : ks == 5 && elem != 4    ? DWCONV2D_GLOBAL_R5_NARROW
        : ks == 7 && elem == 4    ? DWCONV2D_GLOBAL_R7_F32
                                  : DWCONV2D_GLOBAL_R;
}

// L2 prefetch part of a wave ahead (see global_prefetch_l2): block b asks the copy engine to bring
// the input rows of block b + pf_blocks into L2, pf_blocks = P percent of the blocks resident on
// the whole GPU at once (a wave), so that a block's first rows, whose latency each of its threads
// otherwise waits out in full, come from L2. Measured (H100, Session 30, an earlier form of this
// code: the range found by thread 0 alone, every kernel prefetching, P from the environment) on
// the latency-bound kernels: INT8 3x3 stride 1 23.7 us at P = 50 against 25.0-25.4 without (24.1 /
// 24.4 / 25.8 at P = 100 / 200 / 400), FP32 7x7 stride 1 35.0 against 38.4 (36.0 / 44.0 / 40.9).
// The bandwidth-bound kernels were slower with it (FP32 3x3 71 -> 74 / 90 / 97 us at P = 50 / 100 /
// 200, FP16 3x3 38 -> 39-48, FP32 / FP16 5x5 s2 43 / 25 -> 46-61 / 28-30) and so were INT8 5x5 s2
// and 7x7 (17.1 -> 17.9, 19.8 -> 20.2): those compile without it. The form here (range from the
// block index alone, warp-uniform), measured in Session 31 on an H100 against the same code
// compiled without it, same process: INT8 3x3 24.0-24.1 us against 24.7 (2.93-2.95x our FP32
// 3x3), FP32 7x7 34.5-35.1 us against 38.0 (66 % of the 3,350 GB/s peak); P = 30 and 75 gave the
// same times within 0.1 us; the 446-case grid and memcheck passed. So it is on by default at P =
// 50; -D DWCONV2D_GLOBAL_PREFETCH_I8_3=0 -D DWCONV2D_GLOBAL_PREFETCH_F32_7=0 compiles it out, and
// QUANTBENCH_DWCONV_GLOBAL_PREFETCH (read per forward) sets P for those kernels (0: off). Since
// Session 37 the blocks of the first wave also prefetch their own rows before their
// programmatic-dependent wait (see depthwise_global_kernel): H100, same process, against the
// same code without it, INT8 3x3 22.8-23.2 us against 23.8-24.0 (3.04-3.09x our FP32 3x3),
// FP32 7x7 31.8-31.9 against 34.4-34.6.
#ifndef DWCONV2D_GLOBAL_PREFETCH_I8_3
#define DWCONV2D_GLOBAL_PREFETCH_I8_3 50
#endif
#ifndef DWCONV2D_GLOBAL_PREFETCH_F32_7
#define DWCONV2D_GLOBAL_PREFETCH_F32_7 50
#endif
__host__ __device__ constexpr int global_prefetch_pct(int elem, int ks, int stride)
{
    return stride != 1            ? 0
        : elem == 1 && ks == 3    ? DWCONV2D_GLOBAL_PREFETCH_I8_3
        : elem == 4 && ks == 7    ? DWCONV2D_GLOBAL_PREFETCH_F32_7
                                  : 0;
}

struct GlobalPlan
{
    int32_t pf_blocks;       // blocks ahead whose input this block prefetches into L2 (0: none)
    int32_t wave_blocks;     // blocks resident on the GPU at once (with pf_blocks; else 0)
    int32_t total;           // threads
    int32_t per_plane;       // threads per plane: chunks * tx
    int32_t tx;              // threads along W (Wo / V)
    uint32_t plane_m;        // thread / per_plane, see div_magic
    int32_t plane_s;
    uint32_t tx_m;           // (thread % per_plane) / tx
    int32_t tx_s;
    uint32_t k_m;            // plane / K
    int32_t k_s;
};

// NB bytes (4, 8 or 16; p aligned to them) as NB / 4 words, through the read-only cache.
template <int NB>
__device__ __forceinline__ void ldg_words(void const* p, uint32_t* d)
{
    if constexpr (NB == 16)
    {
        uint4 const v = __ldg(reinterpret_cast<uint4 const*>(p));
        d[0] = v.x;
        d[1] = v.y;
        d[2] = v.z;
        d[3] = v.w;
    }
    else if constexpr (NB == 8)
    {
        uint2 const v = __ldg(reinterpret_cast<uint2 const*>(p));
        d[0] = v.x;
        d[1] = v.y;
    }
    else
    {
        d[0] = __ldg(reinterpret_cast<unsigned int const*>(p));
    }
}

// NB bytes at p (4, 8 or 16; aligned to them) as NB / 4 words when `pred`, else zeros: one
// predicated load and no branch, so that p need not be a valid address when !pred.
template <int NB>
__device__ __forceinline__ void ldg_words_if(bool pred, void const* p, uint32_t* d)
{
    int const on = pred ? 1 : 0;
    if constexpr (NB == 16)
    {
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\t"
            "mov.b32 %3, 0;\n\t@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "l"(p), "r"(on));
    }
    else if constexpr (NB == 8)
    {
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
            "@q ld.global.nc.v2.u32 {%0, %1}, [%2];\n\t}"
            : "=r"(d[0]), "=r"(d[1])
            : "l"(p), "r"(on));
    }
    else
    {
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\tmov.b32 %0, 0;\n\t@q ld.global.nc.u32 %0, [%1];\n\t}"
            : "=r"(d[0])
            : "l"(p), "r"(on));
    }
}

// Element e of an input row (float or half) held as words, widened to float.
template <class TIn, int NW>
__device__ __forceinline__ float row_elem(uint32_t const (&wd)[NW], int e)
{
    if constexpr (sizeof(TIn) == 4)
    {
        return __uint_as_float(wd[e]);
    }
    else
    {
        __half2 const h = *reinterpret_cast<__half2 const*>(&wd[e / 2]);
        return e % 2 == 0 ? __low2float(h) : __high2float(h);
    }
}

// Programmatic dependent launch (sm_90): griddepcontrol.wait blocks until the grids this one
// depends on have completed and their memory is visible (at once without such a dependency), and
// griddepcontrol.launch_dependents lets the next grid launched with the attribute be scheduled as
// soon as every block of this one has issued it (or exited), so that its launch and its blocks'
// start overlap this grid's last blocks instead of following them.
__device__ __forceinline__ void pdl_wait_and_release()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Warp 0 of a block: the input rows that block `pb` will read, from its first thread's first row
// to its last thread's last row (whole planes between), as one bulk prefetch into L2
// (cp.async.bulk.prefetch.L2, sm_90: no registers, nothing to wait for). Every value here is
// uniform across the warp (block index and kernel parameters only), so the prefetch (a uniform
// instruction, UBLKPF) takes its operands with a few R2UR moves and no loop; a per-lane address
// needs a loop that makes it uniform, and with it ptxas re-made the global memory descriptor
// before every predicated load of the hot loop (55 R2UR in the INT8 3x3 SASS). The range is
// trimmed to 16-byte boundaries inside the input tensor, so nothing outside it is touched.
template <int KS, int S, int E, int R, int NR>
__device__ __forceinline__ void global_prefetch_l2(void const* x, ConvShape const& s, GlobalPlan const& pl, int32_t pb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // byte offset in x of input row (first row + off) of thread tt, clamped to its plane
    auto row_at = [&](int32_t tt, int off) -> int64_t {
        int32_t const plane = div_magic(tt, pl.plane_m, pl.plane_s);
        int32_t const chunk = div_magic(tt - plane * pl.per_plane, pl.tx_m, pl.tx_s);
        int32_t const in_plane = s.Kg == 1 ? plane : plane / s.Kg; // n * C + k / Kg (K = C * Kg)
        int32_t const ih = min(max(chunk * R * S - s.pt + off, 0), s.H);
        return (static_cast<int64_t>(in_plane) * s.H + ih) * s.W * E;
    };
    int32_t const t0 = pb * kGlobalThreads;
    uintptr_t const base = reinterpret_cast<uintptr_t>(x);
    uintptr_t const end = base + static_cast<uintptr_t>(static_cast<int64_t>(s.N) * s.C * s.H * s.W * E);
    uintptr_t const lo = max((base + 15) & ~uintptr_t{15}, (base + static_cast<uintptr_t>(row_at(t0, 0))) & ~uintptr_t{15});
    uintptr_t const hi = min(end & ~uintptr_t{15},
        (base + static_cast<uintptr_t>(row_at(min(t0 + kGlobalThreads, pl.total) - 1, NR)) + 15) & ~uintptr_t{15});
    if (hi > lo)
    {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(static_cast<uint32_t>(hi - lo)) : "memory");
    }
#endif
}

template <int KS, int S, class TIn, class TB, class Store>
__global__ void __launch_bounds__(kGlobalThreads, global_min_blocks(static_cast<int>(sizeof(TIn)), KS))
    depthwise_global_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, GlobalPlan pl)
{
    using Acc = typename Traits<TIn>::Acc;
    constexpr int E = static_cast<int>(sizeof(TIn));
    constexpr bool kInt8 = E == 1;
    constexpr int V = global_v(E, KS);
    constexpr int R = global_r(E, KS);
    constexpr int G = i8_filter_groups(KS);
    constexpr int NR = (R - 1) * S + KS; // input rows per thread
    constexpr int NQ = V * S / 4;        // 4-element quads of a thread's row segment
    constexpr int QB = 4 * E;            // bytes per quad
    constexpr int NW = (NQ + 2) * E;     // words per input row: a quad left, the segment, a quad right
    constexpr int MB = NQ * QB;          // segment bytes
    constexpr int LB = MB < 16 ? MB : 16;
    constexpr int kOutChunk = rows_wide_chunk(V * static_cast<int>(sizeof(*store.y)));

    // The L2 prefetch is warp 0's (its index through a shuffle from lane 0, so that ptxas knows
    // it is warp-uniform). A block of the first wave, whose rows no block before it prefetches,
    // has its own rows brought into L2 before it waits (below): launched as a dependent during
    // the last blocks of the kernel before it, it waits for that kernel to finish, and its rows
    // arrive meanwhile. The prefetch is only a hint into L2, where every write of that kernel
    // lands too, so it never makes this block read stale data (tested with a chain of dependent
    // forwards, tests/gpu/test_dwconv_kernels.py).
    bool const prefetcher = global_prefetch_pct(E, KS, S) > 0 && pl.pf_blocks > 0
        && __shfl_sync(0xFFFFFFFFU, threadIdx.x / 32, 0) == 0;
    if (prefetcher && static_cast<int32_t>(blockIdx.x) < pl.wave_blocks)
    {
        global_prefetch_l2<KS, S, E, R, NR>(x, s, pl, static_cast<int32_t>(blockIdx.x));
    }
    // Launched as a programmatic dependent (global_pdl): wait here until the kernels before this
    // one in the stream have finished and their writes are visible, before any global memory is
    // read (the hint above aside) or written (x, w or b may be their outputs, y their input), and
    // let the next kernel's blocks be scheduled once every block of this one has started. Both
    // are no-ops on a plain launch.
    pdl_wait_and_release();
    if (prefetcher)
    {
        int32_t const pb = static_cast<int32_t>(blockIdx.x) + pl.pf_blocks;
        if (pb < static_cast<int32_t>(gridDim.x))
        {
            global_prefetch_l2<KS, S, E, R, NR>(x, s, pl, pb);
        }
    }
    int32_t const t = static_cast<int32_t>(blockIdx.x) * kGlobalThreads + static_cast<int32_t>(threadIdx.x);
    if (t >= pl.total)
    {
        return;
    }
    int32_t const plane = div_magic(t, pl.plane_m, pl.plane_s);
    int32_t const in_plane = t - plane * pl.per_plane;
    int32_t const chunk = div_magic(in_plane, pl.tx_m, pl.tx_s);
    int32_t const cx = in_plane - chunk * pl.tx;
    int32_t const n = div_magic(plane, pl.k_m, pl.k_s);
    int32_t const k = plane - n * s.K;
    int32_t const c = s.Kg == 1 ? k : k / s.Kg;
    int32_t const oh0 = chunk * R;
    int32_t const col0 = cx * V;
    int32_t const ih0 = oh0 * S - s.pt;
    bool const left_ok = col0 > 0;                // the quad before the segment is inside the row
    bool const right_ok = (col0 + V) * S < s.W;   // the quad after it
    // Row r's segment starts at xrow + r * pitch (as an address: rows above the image are never
    // read, see load_row).
    int64_t const pitch = static_cast<int64_t>(s.W) * E;
    uintptr_t xrow = reinterpret_cast<uintptr_t>(x)
        + static_cast<uintptr_t>(((static_cast<int64_t>(n) * s.C + c) * s.H + ih0) * pitch
            + static_cast<int64_t>(col0) * S * E);
    TIn const* const wp = filter_at(w, s, n, k, KS * KS);

    // Without predicated loads (global_pred): a row of the plane inside the image (the first of
    // this thread's rows that is, or the last row), which rows outside the image load instead and
    // zero, so that every load is unconditional. Either way no branch stands around a load, and
    // the loads can be issued rows ahead.
    int32_t const ih_safe = min(max(ih0, 0), s.H - 1);
    uintptr_t const xsafe = xrow + static_cast<uintptr_t>(static_cast<int64_t>(ih_safe - ih0) * pitch);
    // Input row r of this thread (image row ih0 + r) as words: quad -1, the segment, quad NQ;
    // zero outside the image. Rows come in order (xrow advances).
    auto load_row = [&](int r, uint32_t(&wd)[NW]) {
        bool const row_ok = static_cast<uint32_t>(ih0 + r) < static_cast<uint32_t>(s.H);
        if constexpr (global_pred(E, KS))
        {
            // predicated loads: rows and quads outside the image are not read at all
            auto const* const p = reinterpret_cast<unsigned char const*>(xrow);
            xrow += static_cast<uintptr_t>(pitch);
            ldg_words_if<QB>(row_ok && left_ok, p - QB, wd);
#pragma unroll
            for (int m = 0; m < MB / LB; ++m)
            {
                ldg_words_if<LB>(row_ok, p + m * LB, wd + E + m * (LB / 4));
            }
            ldg_words_if<QB>(row_ok && right_ok, p + MB, wd + E + NQ * E);
        }
        else
        {
            auto const* const p = reinterpret_cast<unsigned char const*>(row_ok ? xrow : xsafe);
            xrow += static_cast<uintptr_t>(pitch);
            ldg_words<QB>(left_ok ? p - QB : p, wd);
#pragma unroll
            for (int m = 0; m < MB / LB; ++m)
            {
                ldg_words<LB>(p + m * LB, wd + E + m * (LB / 4));
            }
            ldg_words<QB>(right_ok ? p + MB : p, wd + E + NQ * E);
#pragma unroll
            for (int i = 0; i < NW; ++i)
            {
                bool const keep = row_ok && (i >= E || left_ok) && (i < E + NQ * E || right_ok);
                wd[i] = keep ? wd[i] : 0U;
            }
        }
    };
    // Rows are read global_ahead() rows before they are summed (a ring of row buffers), so that
    // their loads' latency hides behind the rows in between.
    constexpr int AH = global_ahead(E, KS) < NR ? global_ahead(E, KS) : NR - 1;
    uint32_t ring[AH + 1][NW];
#pragma unroll
    for (int r = 0; r < AH; ++r)
    {
        load_row(r, ring[r]);
    }
    // Then the filter and the bias, as loaded: nothing waits on a load before they are all issued.
    I8Filter<KS> f8;
    TIn fw[kInt8 ? 1 : KS * KS];
    if constexpr (kInt8)
    {
        i8_filter_fetch<KS>(wp, true, reinterpret_cast<uintptr_t>(w), weights_end(w, s, KS * KS), f8);
    }
    else
    {
#pragma unroll
        for (int i = 0; i < KS * KS; ++i)
        {
            fw[i] = wp[i];
        }
    }
    float const bias = load_bias(b, s, n, k); // no branch (bias_raw)
    auto next_row = [&](int r) -> uint32_t const(&)[NW] {
        if (r + AH < NR)
        {
            load_row(r + AH, ring[(r + AH) % (AH + 1)]);
        }
        return ring[r % (AH + 1)];
    };

    Acc acc[R][V];
    rows_acc_init<Store>(acc);
    int64_t yrow = (static_cast<int64_t>(plane) * s.Ho + oh0) * s.Wo + col0;
    // The epilogue's per-plane constants, from the bias: computed at the first store, so that the
    // rows' loads issued before it do not wait for the bias (rows_plane branches on it for INT8).
    decltype(store.rows_plane(bias)) ctx{};
    // Output row i, once summed (rows in order); rows past the image store nothing (count 0), with
    // no branch. Every row is whole V-output segments stored at once (plan_global).
    auto store_row = [&](int i) {
        if (i == 0)
        {
            ctx = store.rows_plane(bias);
        }
        int const count = oh0 + i < s.Ho ? V : 0;
        store.template rows_store<V>(yrow, acc[i], ctx, kOutChunk, count);
        yrow += s.Wo;
    };

    if constexpr (kInt8)
    {
        uint32_t wk[KS * G];
        i8_filter_pack<KS>(f8, wk);
#pragma unroll
        for (int r = 0; r < NR; ++r)
        {
            rows_dp4a<KS, S, R, V, 1>(acc, r, next_row(r), wk);
            if (rows_row_done<KS, S>(r))
            {
                store_row((r - (KS - 1)) / S);
            }
        }
    }
    else
    {
        float wr[KS * KS];
#pragma unroll
        for (int i = 0; i < KS * KS; ++i)
        {
            wr[i] = Traits<TIn>::load(fw[i]);
        }
#pragma unroll
        for (int r = 0; r < NR; ++r)
        {
            uint32_t const(&wd)[NW] = next_row(r);
            rows_fma<KS, S, R, V>(acc, r, wr, [&](int e) { return row_elem<TIn, NW>(wd, 4 + e); });
            if (rows_row_done<KS, S>(r))
            {
                store_row((r - (KS - 1)) / S);
            }
        }
    }
}

} // namespace
