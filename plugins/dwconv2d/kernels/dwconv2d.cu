// DWConv2D CUDA kernels: convolution with runtime ("dynamic") weights, ONNX Conv semantics plus
// per-batch weights and bias. See dwconv2d.h for the contract; this file holds four kernel paths:
//
//   depthwise_rows   C/group == 1, 3x3/5x5/7x7, stride 1 or 2, dilation 1, left pad k/2, W % 4 == 0:
//                    the memory-bandwidth path (whole rows by cp.async into persistent blocks two
//                    to four buffers deep, dp4a for INT8); see its section below.
//   depthwise_tiled  other C/group == 1 shapes (with or without a channel multiplier). Each block
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
// epilogues (depthwise_rows through exact equivalents, see StoreI8ToI8::rows_store), so the numerics
// do not depend on the path.

#include "dwconv2d.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// int32 -> float32 without the quarter-rate I2F instruction: exact for |v| < 2^22, which holds for
// every sum the depthwise_rows path forms (at most 7 * 7 products of magnitude <= 2^14).
__device__ inline float small_int_to_float(int32_t v)
{
    return __fsub_rn(__int_as_float(0x4B400000 + v), 12582912.0F);
}

// Stores the outputs of one row segment (depthwise_rows path), NB bytes given as NB / 4
// little-endian words, of which only the first `count_bytes` exist, in pieces of `chunk` bytes:
// rows_wide_chunk(NB) (one 16-byte store, or 8 for 8-byte segments), 4, or ELEM (the output
// element size). The host picks the widest that divides the row pitch and the pointer's
// alignment (rows_out_chunk()), so count_bytes is a multiple of chunk.
__host__ __device__ constexpr int rows_wide_chunk(int nb)
{
    return nb < 16 ? nb : 16;
}

// The narrow pieces (chunk 4, 2 or 1 bytes: rows whose pitch or output pointer does not allow the
// widest store), out of line so that the hot loop keeps only the wide store (and its code small).
template <int N>
struct Words // passed by value (in registers) to the out-of-line helpers
{
    uint32_t w[N];
};

template <int NB, int ELEM>
__device__ __noinline__ void store_row_bytes_narrow(unsigned char* p, Words<NB / 4> const wds, int chunk, int count_bytes)
{
    uint32_t const(&wd)[NB / 4] = wds.w;
    if constexpr (rows_wide_chunk(NB) > 4)
    {
        if (chunk == 4)
        {
#pragma unroll
            for (int c = 0; c < NB / 4; ++c)
            {
                if (4 * c < count_bytes)
                {
                    reinterpret_cast<uint32_t*>(p)[c] = wd[c];
                }
            }
            return;
        }
    }
    if constexpr (ELEM == 2)
    {
#pragma unroll
        for (int c = 0; c < NB / 2; ++c)
        {
            if (2 * c < count_bytes)
            {
                reinterpret_cast<uint16_t*>(p)[c] = static_cast<uint16_t>(wd[c / 2] >> (16 * (c % 2)));
            }
        }
    }
    else if constexpr (ELEM == 1)
    {
#pragma unroll
        for (int c = 0; c < NB; ++c)
        {
            if (c < count_bytes)
            {
                p[c] = static_cast<unsigned char>(wd[c / 4] >> (8 * (c % 4)));
            }
        }
    }
}

template <int NB, int ELEM>
__device__ inline void store_row_bytes(unsigned char* p, uint32_t const (&wd)[NB / 4], int chunk, int count_bytes)
{
    constexpr int WIDE = rows_wide_chunk(NB);
    if (chunk == WIDE)
    {
#pragma unroll
        for (int c = 0; c < NB / WIDE; ++c)
        {
            if (WIDE * c < count_bytes)
            {
                if constexpr (WIDE == 16)
                {
                    reinterpret_cast<uint4*>(p)[c] = make_uint4(wd[4 * c], wd[4 * c + 1], wd[4 * c + 2], wd[4 * c + 3]);
                }
                else if constexpr (WIDE == 8)
                {
                    reinterpret_cast<uint2*>(p)[c] = make_uint2(wd[2 * c], wd[2 * c + 1]);
                }
                else
                {
                    reinterpret_cast<uint32_t*>(p)[c] = wd[c];
                }
            }
        }
        return;
    }
    Words<NB / 4> wds;
#pragma unroll
    for (int c = 0; c < NB / 4; ++c)
    {
        wds.w[c] = wd[c];
    }
    store_row_bytes_narrow<NB, ELEM>(p, wds, chunk, count_bytes);
}

// Each store functor has operator() (one element, every path), and for the depthwise_rows path
// rows_plane() (per-plane constants from the bias, once per plane) and rows_store<V>() (V adjacent
// outputs of one row, see store_row_bytes for chunk/count).
struct StoreF32
{
    float* y;
    static constexpr int kAccBias = 0; // rows_store's accumulators are biased by this (INT8 -> INT8 only)
    using RowsCtx = float;
    __device__ void operator()(int64_t i, float acc, float bias) const
    {
        y[i] = acc + bias;
    }
    __device__ float rows_plane(float bias) const
    {
        return bias;
    }
    template <int V>
    __device__ void rows_store(int64_t i, float const (&a)[V], float bias, int chunk, int count) const
    {
        uint32_t wd[V];
#pragma unroll
        for (int j = 0; j < V; ++j)
        {
            wd[j] = __float_as_uint(a[j] + bias);
        }
        store_row_bytes<4 * V, 4>(reinterpret_cast<unsigned char*>(y + i), wd, chunk, 4 * count);
    }
};

struct StoreF16
{
    __half* y;
    static constexpr int kAccBias = 0; // rows_store's accumulators are biased by this (INT8 -> INT8 only)
    using RowsCtx = float;
    __device__ void operator()(int64_t i, float acc, float bias) const
    {
        y[i] = __float2half_rn(acc + bias);
    }
    __device__ float rows_plane(float bias) const
    {
        return bias;
    }
    template <int V>
    __device__ void rows_store(int64_t i, float const (&a)[V], float bias, int chunk, int count) const
    {
        // __floats2half2_rn rounds each half to nearest even, exactly as __float2half_rn.
        uint32_t wd[V / 2];
#pragma unroll
        for (int m = 0; m < V / 2; ++m)
        {
            __half2 const h = __floats2half2_rn(a[2 * m] + bias, a[2 * m + 1] + bias);
            wd[m] = *reinterpret_cast<uint32_t const*>(&h);
        }
        store_row_bytes<2 * V, 2>(reinterpret_cast<unsigned char*>(y + i), wd, chunk, 2 * count);
    }
};

// INT8 epilogues: every step is one explicit IEEE float32 rounding (no FMA contraction), so that a
// float32 host reference can reproduce the output bit for bit (see dwconv2d.h).
struct StoreI8ToF32
{
    float* y;
    float acc_scale; // fl(input_scale * weight_scale)
    static constexpr int kAccBias = 0;
    using RowsCtx = float;
    __device__ void operator()(int64_t i, int32_t acc, float bias) const
    {
        y[i] = __fadd_rn(__fmul_rn(__int2float_rn(acc), acc_scale), bias);
    }
    __device__ float rows_plane(float bias) const
    {
        return bias;
    }
    template <int V>
    __device__ void rows_store(int64_t i, int32_t const (&a)[V], float bias, int chunk, int count) const
    {
        uint32_t wd[V];
#pragma unroll
        for (int j = 0; j < V; ++j)
        {
            wd[j] = __float_as_uint(__fadd_rn(__fmul_rn(small_int_to_float(a[j]), acc_scale), bias));
        }
        store_row_bytes<4 * V, 4>(reinterpret_cast<unsigned char*>(y + i), wd, chunk, 4 * count);
    }
};

// a * b as a 64-bit product (PTX mul.wide.u32: ptxas fuses it with a following 64-bit add into one
// IMAD.WIDE.U32, where the C++ 64-bit product leaves zero high-word terms behind).
__device__ inline uint64_t mul_wide_u32(uint32_t a, uint32_t b)
{
    uint64_t d;
    asm("mul.wide.u32 %0, %1, %2;" : "=l"(d) : "r"(a), "r"(b));
    return d;
}

// Two int32 to two saturated int8 bytes above the low 16 bits of c: bytes (lo, hi, c0, c1).
__device__ inline uint32_t pack_sat_s8(int32_t hi, int32_t lo, uint32_t c)
{
    uint32_t d;
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(hi), "r"(lo), "r"(c));
    return d;
}

struct StoreI8ToI8
{
    int8_t* y;
    // depthwise_rows and depthwise_mma hand rows_store() accumulators plus kAccBias (the sums start
    // at it): |acc| <= 7 * 7 * 2^14 < 2^20, so acc + 2^20 is positive and z below is one unsigned
    // 32 x 32 -> 64-bit multiply-add (IMAD.WIDE.U32) with no separate bias add.
    static constexpr int kAccBias = 1 << 20;
    float acc_scale;
    float output_scale;
    float inv_output_scale; // fl(1 / output_scale)
    // depthwise_rows: the fixed-point requantization below may stand in for the exact chain
    // (host: 1/output_scale normal, c1 < 0.5, see make_i8_store()); c1_fixed = round(c1 * 2^32) with
    // c1 = acc_scale / output_scale; eps_const: the part of the error bound independent of the bias.
    int32_t fixed_ok;
    int32_t c1_fixed;
    float eps_const;
    int32_t quick_ok; // fl(1 / output_scale) is normal (host: make_i8_store)
    __device__ int8_t exact(float v) const
    {
        float q = rintf(__fdiv_rn(v, output_scale)); // rintf: round half to even
        q = fminf(fmaxf(q, -128.0F), 127.0F);
        return static_cast<int8_t>(static_cast<int32_t>(q));
    }
    // exact(v) without the division where that is safe (gemm_mma). t = fl(v * fl(1 / os)) and
    // w = fl(v / os) differ by at most 2^-23 |v / os| + 2^-24 |v / os| < 3.5e-5 while |t| < 192,
    // so where t is at least 2^-14 from every half-integer, no rounding boundary lies between them
    // and w is no tie: rint(t) = rint(w). Near a tie, for |t| >= 192 (both clamp alike) aside, for
    // NaN, and when 1 / os is not normal, the exact division decides.
    __device__ int32_t quick(float v) const
    {
        float const t = __fmul_rn(v, inv_output_scale);
        float q = rintf(t);
        bool const safe = quick_ok != 0 && (fabsf(t) >= 192.0F || fabsf(fabsf(t - q) - 0.5F) >= 0x1p-14F);
        if (!safe)
        {
            q = rintf(__fdiv_rn(v, output_scale));
        }
        q = fminf(fmaxf(q, -128.0F), 127.0F);
        return static_cast<int32_t>(q);
    }
    __device__ void operator()(int64_t i, int32_t acc, float bias) const
    {
        y[i] = exact(__fadd_rn(__fmul_rn(__int2float_rn(acc), acc_scale), bias));
    }

    // Per plane: z = acc * c1 + b / output_scale + 1/2 + eps in 32.32 fixed point (c2 holds all
    // but the first term), with eps (as e = ceil(eps * 2^32)) the bound on |z - 1/2 - eps - w|,
    // w = fl(fl(fl(acc * s) + b) / output_scale) the exact chain's quotient (see make_i8_store()).
    struct RowsCtx
    {
        float bias;
        long long c2;
        uint32_t c1;            // c1_fixed, in a register of its own (so that ptxas fuses z)
        unsigned long long c2u; // c2 - 2^20 * c1_fixed (mod 2^64), see rows_store
        uint32_t e2; // 2 * e
        bool exact;  // every output of this plane takes the exact chain
    };
    __device__ RowsCtx rows_plane(float bias) const
    {
        RowsCtx c{};
        c.bias = bias;
        float const c2f = __fmul_rn(bias, inv_output_scale);
        float const eps = eps_const + 0x1.4p-21F * fabsf(c2f); // + 1.25 * 2^-21 * |fl(b / os)|
        c.exact = fixed_ok == 0 || !(eps <= 0x1p-5F);          // also a NaN or infinite bias
        if (!c.exact)
        {
            uint32_t const e = __float2uint_ru(eps * 4294967296.0F);
            c.c2 = __float2ll_rn(c2f * 4294967296.0F) + (1LL << 31) + e;
            c.c1 = static_cast<uint32_t>(c1_fixed);
            c.c2u = static_cast<unsigned long long>(c.c2) - (static_cast<unsigned long long>(c.c1) << 20);
            c.e2 = 2U * e;
        }
        return c;
    }
    // z = acc * c1_fixed + c2 with one 32 x 32 -> 64-bit multiply-add. With z0 = z - e, the value
    // without the eps shift: if the low word of z is >= 2e, the low word of z0 lies in
    // [e, 2^32 - e), i.e. z0 / 2^32 is at least eps from an integer, so floor(w + 1/2) =
    // floor(z0 / 2^32) = the high word of z, and w is no rounding tie: rint(w) is that high word,
    // which cvt.pack.sat clamps to [-128, 127] exactly as the exact chain does. Outputs whose low
    // word is < 2e (w within about 2 eps of a tie), and every output of a plane whose bound is too
    // loose, take the exact chain (rows_fix, out of line: rare, and its division would otherwise
    // be inlined V times per row into the hot loop).
    template <int V>
    struct RowAcc
    {
        int32_t a[V];
    };
    template <int V>
    struct RowWords
    {
        uint32_t w[V / 4];
    };
    template <int V>
    __device__ static __noinline__ RowWords<V> rows_fix(RowWords<V> wd, RowAcc<V> const acc, float bias,
        unsigned long long c2u, uint32_t e2, bool all, uint32_t c1, float acc_scale, float output_scale)
    {
#pragma unroll
        for (int j = 0; j < V; ++j)
        {
            // the low word of z = (acc + kAccBias) * c1 + c2u (mod 2^32), as rows_store forms it
            uint32_t const lo = static_cast<uint32_t>(acc.a[j]) * c1 + static_cast<uint32_t>(c2u);
            if (all || lo < e2)
            {
                float const v
                    = __fadd_rn(__fmul_rn(small_int_to_float(acc.a[j] - kAccBias), acc_scale), bias);
                float q = rintf(__fdiv_rn(v, output_scale)); // as exact()
                q = fminf(fmaxf(q, -128.0F), 127.0F);
                uint32_t const b8 = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int32_t>(q)));
                wd.w[j / 4] = (wd.w[j / 4] & ~(0xFFU << (8 * (j % 4)))) | (b8 << (8 * (j % 4)));
            }
        }
        return wd;
    }
    template <int V>
    __device__ void rows_store(int64_t i, int32_t const (&a)[V], RowsCtx const& c, int chunk, int count) const
    {
        static_assert(V % 4 == 0, "int8 rows store whole words");
        int32_t h[V];
        bool slow = c.exact;
#pragma unroll
        for (int j = 0; j < V; ++j)
        {
            // a[j] = acc + 2^20 (kAccBias): (acc + 2^20) * c1 + (c2 - 2^20 * c1) is the same z mod
            // 2^64 as acc * c1 + c2, an unsigned multiply-add (0 < acc + 2^20 < 2^21, c1 < 2^31)
            uint64_t const z = mul_wide_u32(static_cast<uint32_t>(a[j]), c.c1) + c.c2u;
            h[j] = static_cast<int32_t>(static_cast<uint32_t>(z >> 32));
            slow = slow || static_cast<uint32_t>(z) < c.e2;
        }
        RowWords<V> wd;
#pragma unroll
        for (int m = 0; m < V / 4; ++m)
        {
            wd.w[m] = pack_sat_s8(h[4 * m + 1], h[4 * m], pack_sat_s8(h[4 * m + 3], h[4 * m + 2], 0U));
        }
        if (slow)
        {
            RowAcc<V> acc;
#pragma unroll
            for (int j = 0; j < V; ++j)
            {
                acc.a[j] = a[j];
            }
            wd = rows_fix<V>(wd, acc, c.bias, c.c2u, c.e2, c.exact, c.c1, acc_scale, output_scale);
        }
        store_row_bytes<V, 1>(reinterpret_cast<unsigned char*>(y + i), wd.w, chunk, count);
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

// The bias of output channel k of image n (0 without one), as stored (not widened), with no
// branch: where nothing waits on it at once, its load need not hold back the loads after it.
template <class TB>
__device__ inline TB bias_raw(TB const* b, ConvShape const& s, int32_t n, int32_t k)
{
    int64_t const i = s.bias_mode == DWCONV2D_BIAS_PER_BATCH ? static_cast<int64_t>(n) * s.K + k : k;
    return s.bias_mode != DWCONV2D_BIAS_NONE ? b[i] : static_cast<TB>(0.0F);
}

template <class TB>
__device__ inline float load_bias(TB const* b, ConvShape const& s, int32_t n, int32_t k)
{
    return bias_to_float(bias_raw(b, s, n, k));
}

// Filter k of image n in the weight tensor w (one tensor for the batch, or one per image), `per`
// elements per filter (the depthwise kernels' filters).
template <class T>
__device__ inline T const* filter_at(T const* w, ConvShape const& s, int32_t n, int32_t k, int32_t per)
{
    return w + (s.weight_per_batch ? static_cast<int64_t>(n) * s.K * per : 0) + static_cast<int64_t>(k) * per;
}

// One past the weight tensor's last byte, as an address (INT8 filter reads stay below it).
template <class T>
__device__ inline uintptr_t weights_end(T const* w, ConvShape const& s, int32_t per)
{
    return reinterpret_cast<uintptr_t>(w)
        + static_cast<uintptr_t>((s.weight_per_batch ? static_cast<int64_t>(s.N) : int64_t{1}) * s.K * per)
        * sizeof(T);
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

// ---------------------------------------------------------------------------------------------
// Path 1b: depthwise_rows (memory-bandwidth path)
// ---------------------------------------------------------------------------------------------
//
// For C/group == 1, square 3x3, 5x5 or 7x7 filters, stride 1 or 2 (same both ways), dilation 1,
// left pad kernel/2 and W % 4 == 0 (the usual depthwise layers of MobileNet, EfficientNet,
// ConvNeXt). Full-width rows of an NCHW plane are contiguous, so a block copies the input rows of
// PPB planes into shared memory with 16-byte (or 8/4-byte) asynchronous copies (cp.async, no
// registers held), zero columns on both sides and zero rows above/below the image, so the stencil
// needs no bounds checks. Blocks are persistent with 2-4 buffers per plane slot: the next planes
// are in flight while the current ones are computed. Each thread computes V adjacent outputs of
// 7 rows (V = 8 for INT8 and FP16 3x3, else 4, see rows_v(); filter in registers, each input row
// read once per thread with vector shared loads) and writes them with the widest vector stores
// the row pitch allows. The next plane's filter and bias are fetched while the current one is
// computed (INT8, FP16 3x3). INT8 keeps the bytes packed and forms each output's 4-tap windows
// with byte permutes, so one dp4a does 4 multiply-adds (filter rows padded with zero taps to a
// multiple of 4: the filter's words shifted to byte 0 by funnel shifts, then one byte permute
// per packed word); its epilogue requantizes in fixed point with an exactness check
// (StoreI8ToI8::rows_store). INT8 also stores each output row as soon as it is summed
// (rows_stream: only the rows still being summed keep accumulators), reads each input row's
// words one row ahead (DWCONV2D_ROWS_PREFETCH_I8), and skips the rows past the image without a
// branch (rows_pred_rows, also FP16). FP16 is widened to float32
// as it is read from shared memory.

constexpr int kRowsR = 7;            // output rows per thread (7 * 2^k is a common plane size)
constexpr int kRowsMaxThreads = 512; // per block with V = 4 (DWCONV2D_ROWS_MAX_THREADS_NARROW with V = 8)
constexpr int kRowsMinBlocks = 264;  // keep at least 2 blocks per multiprocessor of an H100/H200
constexpr int kRowsSmemMax = 96 * 1024; // per block, for wide planes (opt-in above 48 KiB)
#ifndef DWCONV2D_ROWS_MAX_TY
#define DWCONV2D_ROWS_MAX_TY 512
#endif
constexpr int kRowsMaxTY = DWCONV2D_ROWS_MAX_TY; // threads along H per plane (more: row bands)
#ifndef DWCONV2D_ROWS_AHEAD_BYTES
#define DWCONV2D_ROWS_AHEAD_BYTES (4 * 1024)
#endif
constexpr int kRowsAheadBytes = DWCONV2D_ROWS_AHEAD_BYTES; // input bytes in flight per plane slot
#ifndef DWCONV2D_ROWS_AHEAD_BYTES_3X3
#define DWCONV2D_ROWS_AHEAD_BYTES_3X3 (8 * 1024)
#endif
constexpr int kRowsAheadBytes3x3 = DWCONV2D_ROWS_AHEAD_BYTES_3X3; // 3x3: more (measured)
// Shared memory a block may use for several planes (above 48 KiB: opt-in, launch_rows_ks), and
// whether plan_rows prefers plane counts that fill whole warps (see plan_rows). INT8 5x5 / 7x7
// (_I8_LARGE) have their own: 96 KiB and whole warps, measured faster there (7x7 stride 1:
// 28.1 against 31.3 us, 5x5 stride 2: 22.2 against 22.6 us on the H200) and slower for FP32, FP16
// and INT8 3x3.
#ifndef DWCONV2D_ROWS_PPB_SMEM
#define DWCONV2D_ROWS_PPB_SMEM (48 * 1024)
#endif
#ifndef DWCONV2D_ROWS_PPB_SMEM_F32
#define DWCONV2D_ROWS_PPB_SMEM_F32 DWCONV2D_ROWS_PPB_SMEM
#endif
#ifndef DWCONV2D_ROWS_PPB_SMEM_I8_LARGE
#define DWCONV2D_ROWS_PPB_SMEM_I8_LARGE (96 * 1024)
#endif
#ifndef DWCONV2D_ROWS_FULL_WARPS
#define DWCONV2D_ROWS_FULL_WARPS 0
#endif
#ifndef DWCONV2D_ROWS_FULL_WARPS_F32
#define DWCONV2D_ROWS_FULL_WARPS_F32 DWCONV2D_ROWS_FULL_WARPS
#endif
#ifndef DWCONV2D_ROWS_FULL_WARPS_I8_LARGE
#define DWCONV2D_ROWS_FULL_WARPS_I8_LARGE 1
#endif
// per element size and kernel size: FP32 (_F32), INT8 5x5 / 7x7 (_I8_LARGE), else the narrow types
constexpr int rows_ppb_smem(int elem, int ks)
{
    return elem == 4 ? DWCONV2D_ROWS_PPB_SMEM_F32
        : elem == 1 && ks != 3 ? DWCONV2D_ROWS_PPB_SMEM_I8_LARGE
                               : DWCONV2D_ROWS_PPB_SMEM;
}
constexpr bool rows_full_warps(int elem, int ks)
{
    return (elem == 4 ? DWCONV2D_ROWS_FULL_WARPS_F32
               : elem == 1 && ks != 3 ? DWCONV2D_ROWS_FULL_WARPS_I8_LARGE
                                      : DWCONV2D_ROWS_FULL_WARPS)
        != 0;
}

__host__ __device__ constexpr int floor_div4(int v)
{
    return v >= 0 ? v / 4 : -((-v + 3) / 4);
}

// Outputs along W per thread, per element size and kernel size: 8 for the narrow types' 3x3
// (half the per-output cost of addressing, stores and, for INT8, the window permutes), else 4:
// the larger filters and strided planes are short of threads per plane, and wider threads would
// leave too few warps per multiprocessor (measured on an H200). Compile-time knobs (tuning):
// DWCONV2D_ROWS_V_I8 / _V_F16 (3x3 INT8 / FP16, 4 or 8), DWCONV2D_ROWS_R_I8 / _R_F16 (their
// output rows per thread), DWCONV2D_ROWS_R5_I8 / _R5_F16 (the same for 5x5),
// DWCONV2D_ROWS_MAX_THREADS_NARROW (threads per block with V = 8).
#ifndef DWCONV2D_ROWS_V_NARROW
#define DWCONV2D_ROWS_V_NARROW 8
#endif
#ifndef DWCONV2D_ROWS_V_I8
#define DWCONV2D_ROWS_V_I8 DWCONV2D_ROWS_V_NARROW
#endif
#ifndef DWCONV2D_ROWS_V_F16
#define DWCONV2D_ROWS_V_F16 DWCONV2D_ROWS_V_NARROW
#endif
#ifndef DWCONV2D_ROWS_R_I8
#define DWCONV2D_ROWS_R_I8 7
#endif
#ifndef DWCONV2D_ROWS_R_F16
#define DWCONV2D_ROWS_R_F16 7
#endif
#ifndef DWCONV2D_ROWS_R5_I8
#define DWCONV2D_ROWS_R5_I8 7
#endif
#ifndef DWCONV2D_ROWS_R5_F16
#define DWCONV2D_ROWS_R5_F16 7
#endif
#ifndef DWCONV2D_ROWS_MAX_THREADS_NARROW
#define DWCONV2D_ROWS_MAX_THREADS_NARROW 256
#endif
__host__ __device__ constexpr int rows_v(int elem, int ks)
{
    return ks != 3 || elem == 4 ? 4 : elem == 1 ? DWCONV2D_ROWS_V_I8 : DWCONV2D_ROWS_V_F16;
}

// Output rows per thread (kRowsR but for the 3x3 and 5x5 INT8 / FP16 knobs above).
__host__ __device__ constexpr int rows_r(int elem, int ks)
{
    return elem == 4 || ks == 7 ? kRowsR
        : ks == 3               ? (elem == 1 ? DWCONV2D_ROWS_R_I8 : DWCONV2D_ROWS_R_F16)
                                : (elem == 1 ? DWCONV2D_ROWS_R5_I8 : DWCONV2D_ROWS_R5_F16);
}

// Whether a thread stores each output row as soon as its last input row has been summed (inside
// the row loop), rather than all R rows after it: the same arithmetic and stores in another order,
// but only the accumulators of the (KS + S - 1) / S rows still being summed are live instead of
// all R * V (INT8 -> INT8 3x3 alone: 96 registers instead of 116, 5 blocks of 112 threads per
// multiprocessor instead of 4; with the row prefetch and predicated rows below, which use the
// registers it frees, 118, and faster still: see README "What has been verified"). Measured on
// the H200: INT8 as fast or faster on every timed shape, FP16 and FP32 no faster, so on for INT8
// only. Compile-time knobs per element size: DWCONV2D_ROWS_STREAM_I8, _F16, _F32 (0: all rows
// after the loop, the previous order).
#ifndef DWCONV2D_ROWS_STREAM_I8
#define DWCONV2D_ROWS_STREAM_I8 1
#endif
#ifndef DWCONV2D_ROWS_STREAM_F16
#define DWCONV2D_ROWS_STREAM_F16 0
#endif
#ifndef DWCONV2D_ROWS_STREAM_F32
#define DWCONV2D_ROWS_STREAM_F32 0
#endif
// INT8: read each input row's words one row ahead (1, measured faster with rows_stream) or where
// they are used (0).
#ifndef DWCONV2D_ROWS_PREFETCH_I8
#define DWCONV2D_ROWS_PREFETCH_I8 1
#endif
// Rows past the image: skipped by a branch per row (0) or stored with nothing to store (1), per
// element size (_I8, _F16, _F32; DWCONV2D_ROWS_PRED_ROWS sets all three): 1 measured faster for
// INT8 and FP16 (fewer branches and reconvergence points per row), slower for FP32 3x3.
#ifdef DWCONV2D_ROWS_PRED_ROWS
#define DWCONV2D_ROWS_PRED_ROWS_I8 DWCONV2D_ROWS_PRED_ROWS
#define DWCONV2D_ROWS_PRED_ROWS_F16 DWCONV2D_ROWS_PRED_ROWS
#define DWCONV2D_ROWS_PRED_ROWS_F32 DWCONV2D_ROWS_PRED_ROWS
#endif
#ifndef DWCONV2D_ROWS_PRED_ROWS_I8
#define DWCONV2D_ROWS_PRED_ROWS_I8 1
#endif
#ifndef DWCONV2D_ROWS_PRED_ROWS_F16
#define DWCONV2D_ROWS_PRED_ROWS_F16 1
#endif
#ifndef DWCONV2D_ROWS_PRED_ROWS_F32
#define DWCONV2D_ROWS_PRED_ROWS_F32 0
#endif
__host__ __device__ constexpr bool rows_pred_rows(int elem)
{
    return (elem == 1 ? DWCONV2D_ROWS_PRED_ROWS_I8
               : elem == 2 ? DWCONV2D_ROWS_PRED_ROWS_F16
                           : DWCONV2D_ROWS_PRED_ROWS_F32)
        != 0;
}
__host__ __device__ constexpr bool rows_stream(int elem)
{
    return (elem == 1 ? DWCONV2D_ROWS_STREAM_I8
               : elem == 2 ? DWCONV2D_ROWS_STREAM_F16
                           : DWCONV2D_ROWS_STREAM_F32)
        != 0;
}

__host__ __device__ constexpr int rows_max_threads(int elem, int ks)
{
    return rows_v(elem, ks) == 4 ? kRowsMaxThreads : DWCONV2D_ROWS_MAX_THREADS_NARROW;
}

// Last 4-element group (float/half) or 4-byte word (int8) of an input row a thread reads,
// relative to the group of its first output column.
__host__ __device__ constexpr int rows_hi_word(int ks, int stride, bool packed_int8, int v)
{
    return packed_int8 ? floor_div4((v - 1) * stride - ks / 2 + 4 * ((ks + 3) / 4 - 1) + 3)
                       : floor_div4((v - 1) * stride + ks - 1 - ks / 2);
}

struct RowsPlan
{
    int32_t TX, TY, TXY; // threads per plane along W (V outputs each) and H (kRowsR rows each)
    int32_t PPB;         // planes per block and buffer
    int32_t groups;      // ceil(planes / PPB)
    int32_t bands;       // blocks along H per plane (TY * kRowsR output rows each), gridDim.y
    int32_t NRS;         // shared-memory rows per plane
    int32_t P;           // their pitch in elements (16-byte multiple)
    int32_t slice_bytes; // per plane and buffer
    int32_t NV;          // copies per input row
    int32_t rstep;       // max(1, TXY / NV): rows apart of one thread's copies
    int32_t cstep;       // min(NV, TXY): copies apart of one thread's copies within a row
    int32_t load_bytes;  // 16, 8 or 4
    int32_t out_chunk;   // bytes per output store, see store_row_bytes
    int32_t planes;      // N * K
    int32_t stages;      // buffers per plane slot (2..4): stages - 1 groups of planes in flight
    uint32_t kdiv_m;     // plane / K as (plane * kdiv_m) >> kdiv_s (plane < 2^31), see rows_div
    int32_t kdiv_s;
};

// floor(v / d) for 0 <= v < 2^31 and 1 <= d < 2^31 as (v * m) >> s, with l = ceil(log2 d),
// s = 31 + l and m = ceil(2^s / d) (< 2^32): m = (2^s + e) / d with 0 <= e < d <= 2^l, so
// v * m / 2^s = v / d + v e / (d 2^s) and the second term is below 2^31 2^l / (d 2^(31 + l)) =
// 1 / d, which cannot carry floor(v / d) over to the next integer (frac(v / d) <= (d - 1) / d).
inline void rows_div_magic(int64_t d, uint32_t* m, int32_t* sh)
{
    int l = 0;
    while ((int64_t{1} << l) < d)
    {
        ++l;
    }
    *sh = 31 + l;
    *m = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
}

// floor(v / d) for 0 <= v < 2^31 from (m, s) = rows_div_magic(d).
__device__ inline int32_t div_magic(int32_t v, uint32_t m, int32_t s)
{
    return static_cast<int32_t>((static_cast<uint64_t>(static_cast<uint32_t>(v)) * m) >> s);
}

__device__ inline int32_t rows_div(int32_t v, RowsPlan const& pl)
{
    return div_magic(v, pl.kdiv_m, pl.kdiv_s);
}

template <int LB>
__device__ inline void cp_async(void* smem, void const* gmem)
{
    auto const saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    if constexpr (LB == 16)
    {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(gmem) : "memory");
    }
    else
    {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(saddr), "l"(gmem), "n"(LB) : "memory");
    }
}

__device__ inline void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ inline void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Waits until this thread's copies of the group being computed have landed: the stages - 1
// groups committed after it may still be in flight.
__device__ inline void rows_wait(int32_t stages)
{
    switch (stages)
    {
    case 2: cp_async_wait<1>(); break;
    case 3: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
    }
}

// cp.async to a shared-memory address given as such (no generic-to-shared conversion per copy).
template <int LB>
__device__ inline void cp_async_s(uint32_t saddr, void const* gmem)
{
    if constexpr (LB == 16)
    {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(gmem) : "memory");
    }
    else
    {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(saddr), "l"(gmem), "n"(LB) : "memory");
    }
}

// This thread's share of the copies of one plane's rows that lie inside the image: `nrows` rows
// rstep apart from row rfirst (the rows outside the image dropped; see RowsCopies), at columns
// vc, vc + cstep, ..., from the plane at xp into the plane slot at shared address `slot`.
struct RowsCopies
{
    int32_t nrows;     // rows this thread copies per column
    int32_t goff;      // elements from the plane's start to its first copy
    uint32_t soff;     // bytes from the slot's start to its first copy
    int32_t gstep;     // elements between its rows (rstep * W)
    uint32_t sstep;    // bytes between its rows (rstep * P * elem)
};

template <int LB, class T>
__device__ inline void rows_issue(T const* xp, uint32_t slot, RowsPlan const& pl, RowsCopies const& rc, int32_t vc)
{
    constexpr int NE = LB / static_cast<int>(sizeof(T));
    for (int32_t v = vc; v < pl.NV; v += pl.cstep)
    {
        T const* src = xp + rc.goff + (v - vc) * NE;
        uint32_t dst = slot + rc.soff + static_cast<uint32_t>((v - vc) * LB);
        for (int32_t i = 0; i < rc.nrows; ++i)
        {
            cp_async_s<LB>(dst, src);
            src += rc.gstep;
            dst += rc.sstep;
        }
    }
}

// 4 consecutive elements of shared memory (8- or 16-byte aligned) as float.
__device__ inline void load4(float const* p, float* f)
{
    float4 const q = *reinterpret_cast<float4 const*>(p);
    f[0] = q.x;
    f[1] = q.y;
    f[2] = q.z;
    f[3] = q.w;
}

__device__ inline void load4(__half const* p, float* f)
{
    uint2 const q = *reinterpret_cast<uint2 const*>(p);
    float2 const a = __half22float2(*reinterpret_cast<__half2 const*>(&q.x));
    float2 const c = __half22float2(*reinterpret_cast<__half2 const*>(&q.y));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = c.x;
    f[3] = c.y;
}

// Minimum blocks per multiprocessor (__launch_bounds__), which caps the registers: 3x3 float and
// FP16 kernels 2 (64 registers at 512 threads, 128 at 256), so that registers do not cap the
// planes in flight below what shared memory allows; INT8 DWCONV2D_ROWS_MIN_BLOCKS_I8; the larger
// float filters need their registers.
#ifndef DWCONV2D_ROWS_MIN_BLOCKS_3X3
#define DWCONV2D_ROWS_MIN_BLOCKS_3X3 2
#endif
#ifndef DWCONV2D_ROWS_MIN_BLOCKS_I8
#define DWCONV2D_ROWS_MIN_BLOCKS_I8 2
#endif
#ifndef DWCONV2D_ROWS_MIN_BLOCKS_I8_LARGE
#define DWCONV2D_ROWS_MIN_BLOCKS_I8_LARGE 1
#endif
#ifndef DWCONV2D_ROWS_MIN_BLOCKS_F16
#define DWCONV2D_ROWS_MIN_BLOCKS_F16 DWCONV2D_ROWS_MIN_BLOCKS_3X3
#endif
#ifndef DWCONV2D_ROWS_MIN_BLOCKS_F16_LARGE
#define DWCONV2D_ROWS_MIN_BLOCKS_F16_LARGE 1
#endif
__host__ __device__ constexpr int rows_min_blocks(int elem, int ks)
{
    return elem == 1 ? (ks == 3 ? DWCONV2D_ROWS_MIN_BLOCKS_I8 : DWCONV2D_ROWS_MIN_BLOCKS_I8_LARGE)
        : elem == 2  ? (ks == 3 ? DWCONV2D_ROWS_MIN_BLOCKS_F16 : DWCONV2D_ROWS_MIN_BLOCKS_F16_LARGE)
                     : (ks == 3 ? DWCONV2D_ROWS_MIN_BLOCKS_3X3 : 1);
}

// The NFW aligned words from w32 that hold an INT8 filter's bytes sh0 .. end - 1, for a filter
// whose words do not all lie inside the weight tensor (see fetch in depthwise_rows_kernel): words
// wholly inside the filter are read as words, the (at most two) that straddle its ends byte by
// byte from the filter's own bytes (zero elsewhere).
template <int NFW>
__device__ __noinline__ Words<NFW> rows_filter_edge(uint32_t const* w32, int32_t sh0, int32_t end)
{
    Words<NFW> out;
#pragma unroll
    for (int i = 0; i < NFW; ++i)
    {
        uint32_t word = 0U;
        if (4 * i < end)
        {
            if (4 * i >= sh0 && 4 * i + 4 <= end)
            {
                word = __ldg(w32 + i);
            }
            else
            {
                auto const* const wb = reinterpret_cast<unsigned char const*>(w32 + i);
#pragma unroll
                for (int q = 0; q < 4; ++q)
                {
                    if (4 * i + q >= sh0 && 4 * i + q < end)
                    {
                        word |= static_cast<uint32_t>(__ldg(wb + q)) << (8 * q);
                    }
                }
            }
        }
        out.w[i] = word;
    }
    return out;
}

// INT8 filters as packed 4-tap words (depthwise_rows, depthwise_global): the NFW aligned words
// that hold a filter's KS * KS bytes are fetched (i8_filter_fetch), then packed once per plane
// into KS * G words, row kh / group g holding taps 4 g .. 4 g + 3 of filter row kh (zero past KS).
__host__ __device__ constexpr int i8_filter_groups(int ks)
{
    return (ks + 3) / 4;
}
// Words fetched: the last group's window starts at byte sh0 + KS (KS - 1) + 4 (G - 1) and reads
// the word after the one holding that byte.
__host__ __device__ constexpr int i8_filter_words(int ks)
{
    return (ks * (ks - 1) + 4 * (i8_filter_groups(ks) - 1)) / 4 + 3;
}

template <int KS>
struct I8Filter
{
    uint32_t raw[i8_filter_words(KS)];
    int32_t sh0; // byte offset of the filter in raw[0]
};

// The aligned words that hold the filter at wp (zero when !ok). They are read whole when they all
// lie inside the weight tensor [w_lo, w_hi) (every filter but, at most, the first and the last;
// their bytes outside the filter are those of its neighbours, which i8_filter_pack masks off).
// Otherwise only words that lie wholly inside the filter are read as words and the (at most two)
// words that straddle its ends are assembled from the filter's own bytes (zero elsewhere), so no
// byte outside the weight tensor (past its end, or before its start when w is not 4-byte
// aligned) is ever read.
template <int KS>
__device__ inline void i8_filter_fetch(int8_t const* wp, bool ok, uintptr_t w_lo, uintptr_t w_hi, I8Filter<KS>& f)
{
    constexpr int NFW = i8_filter_words(KS);
    auto const addr = reinterpret_cast<uintptr_t>(wp);
    uint32_t const* const w32 = reinterpret_cast<uint32_t const*>(addr & ~uintptr_t{3});
    f.sh0 = static_cast<int32_t>(addr & 3U);
    int32_t const end = f.sh0 + KS * KS; // one past the filter's last byte, from w32
    auto const a0 = addr & ~uintptr_t{3};
    bool const inside = a0 >= w_lo && a0 + 4 * static_cast<uintptr_t>((end + 3) / 4) <= w_hi;
    if (!ok || inside)
    {
        // the common case: whole words, predicated loads, no branch per word
#pragma unroll
        for (int i = 0; i < NFW; ++i)
        {
            f.raw[i] = ok && 4 * i < end ? __ldg(w32 + i) : 0U;
        }
    }
    else
    {
        // at most the first and the last filter of the tensor: out of line (rare; its per-byte
        // branches would otherwise sit in every plane's fetch)
        Words<NFW> const e = rows_filter_edge<NFW>(w32, f.sh0, end);
#pragma unroll
        for (int i = 0; i < NFW; ++i)
        {
            f.raw[i] = e.w[i];
        }
    }
}

// The filter rows packed into 4-tap words (zero taps past KS): the bytes of row kh, group g start
// at byte c = kh * KS + 4 g of the filter, i.e. at byte sh0 + c of raw[]. raw[] is first shifted
// down by sh0 bytes (al[i]: filter bytes 4 i .. 4 i + 3, one funnel shift each), so that every
// word is then one byte permute with a constant selector (none where c % 4 == 0) plus the mask of
// its zero taps: about 2 instructions a word instead of 5 (two selects on sh0, a funnel shift, the
// mask), 9 words per plane and thread at 3x3.
template <int KS>
__device__ inline void i8_filter_pack(I8Filter<KS> const& f, uint32_t (&wk)[KS * i8_filter_groups(KS)])
{
    constexpr int G = i8_filter_groups(KS);
    constexpr int NAL = (KS * (KS - 1) + 4 * (G - 1)) / 4 + 2; // < NFW: raw[i + 1] exists
    uint32_t al[NAL];
#pragma unroll
    for (int i = 0; i < NAL; ++i)
    {
        al[i] = __funnelshift_r(f.raw[i], f.raw[i + 1], 8 * f.sh0);
    }
#pragma unroll
    for (int kh = 0; kh < KS; ++kh)
    {
#pragma unroll
        for (int g = 0; g < G; ++g)
        {
            constexpr uint32_t kAll = 0xFFFFFFFFU;
            int const c = kh * KS + 4 * g;
            uint32_t const word = c % 4 == 0
                ? al[c / 4]
                : __byte_perm(al[c / 4], al[c / 4 + 1], 0x3210U + 0x1111U * static_cast<uint32_t>(c % 4));
            int const valid = KS - 4 * g;
            wk[kh * G + g] = valid >= 4 ? word : word & (kAll >> (32 - 8 * valid));
        }
    }
}

// The 4-byte window of packed INT8 input that starts at byte o of a row held as words wd[] (word
// a holding bytes 4 (a - A0) .. of the row, A0 = the word of byte 0): one byte permute, or the
// word itself when o is word aligned. Past the last word, zero bytes (their taps are zero).
template <int NW, int A0>
__device__ __forceinline__ uint32_t i8_window(uint32_t const (&wd)[NW], int o)
{
    int const a = floor_div4(o) + A0;
    int const sh = o - 4 * floor_div4(o);
    uint32_t const next = a + 1 < NW ? wd[a + 1] : 0U;
    return sh == 0 ? wd[a] : __byte_perm(wd[a], next, 0x3210U + 0x1111U * static_cast<uint32_t>(sh));
}

// Every accumulator of a thread's rows at Store::kAccBias (see StoreI8ToI8::kAccBias; 0 for the
// other epilogues), where depthwise_rows and depthwise_global start their sums.
template <class Store, class Acc, int R, int V>
__device__ __forceinline__ void rows_acc_init(Acc (&acc)[R][V])
{
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
#pragma unroll
        for (int j = 0; j < V; ++j)
        {
            acc[i][j] = Acc(Store::kAccBias);
        }
    }
}

// acc[i][j] += the products of one input row r and filter row kh = r - i * S, for each output row
// i of the thread that row reaches (float and half depthwise rows, the accumulators float):
// at(e) is the row's element e columns right of output column j's first tap, e = j * S + q - PAD.
template <int KS, int S, int R, int V, class At>
__device__ __forceinline__ void rows_fma(float (&acc)[R][V], int r, float const (&wr)[KS * KS], At const& at)
{
    constexpr int PAD = KS / 2;
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
        int const kh = r - i * S;
        if (kh >= 0 && kh < KS)
        {
#pragma unroll
            for (int j = 0; j < V; ++j)
            {
#pragma unroll
                for (int q = 0; q < KS; ++q)
                {
                    acc[i][j] = fmaf(at(j * S + q - PAD), wr[kh * KS + q], acc[i][j]);
                }
            }
        }
    }
}

// acc[i][j] += the packed INT8 products of one input row r, held as words wd[] (word A0 holding
// the byte of output column 0's segment start), and filter row kh = r - i * S (wk, packed by
// i8_filter_pack), for each output row i of the thread that row reaches: one byte window per
// output and 4-tap group (i8_window), one dp4a per output row it feeds.
template <int KS, int S, int R, int V, int A0, int NW>
__device__ __forceinline__ void rows_dp4a(
    int32_t (&acc)[R][V], int r, uint32_t const (&wd)[NW], uint32_t const (&wk)[KS * i8_filter_groups(KS)])
{
    constexpr int PAD = KS / 2;
    constexpr int G = i8_filter_groups(KS);
#pragma unroll
    for (int j = 0; j < V; ++j)
    {
#pragma unroll
        for (int g = 0; g < G; ++g)
        {
            uint32_t const win = i8_window<NW, A0>(wd, j * S - PAD + 4 * g);
#pragma unroll
            for (int i = 0; i < R; ++i)
            {
                int const kh = r - i * S;
                if (kh >= 0 && kh < KS)
                {
                    acc[i][j] = __dp4a(static_cast<int>(win), static_cast<int>(wk[kh * G + g]), acc[i][j]);
                }
            }
        }
    }
}

// Whether input row r of a thread completes one of its output rows (row (r - (KS - 1)) / S).
template <int KS, int S>
__host__ __device__ constexpr bool rows_row_done(int r)
{
    return r >= KS - 1 && (r - (KS - 1)) % S == 0;
}

template <int KS, int S, class TIn, class TB, class Store>
__global__ void __launch_bounds__(rows_max_threads(static_cast<int>(sizeof(TIn)), KS),
    rows_min_blocks(static_cast<int>(sizeof(TIn)), KS))
    depthwise_rows_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, RowsPlan pl)
{
    using Acc = typename Traits<TIn>::Acc;
    constexpr bool kInt8 = std::is_same<TIn, int8_t>::value;
    constexpr int V = rows_v(static_cast<int>(sizeof(TIn)), KS);
    constexpr int R = rows_r(static_cast<int>(sizeof(TIn)), KS);
    constexpr int PAD = KS / 2;
    constexpr int LPAD = 16 / static_cast<int>(sizeof(TIn));
    constexpr int G = (KS + 3) / 4;      // 4-tap groups per filter row (INT8)
    constexpr int NR = (R - 1) * S + KS; // input rows per thread
    constexpr bool kStream = rows_stream(static_cast<int>(sizeof(TIn))); // see rows_stream()
    constexpr bool kPrefetch = DWCONV2D_ROWS_PREFETCH_I8 != 0;            // INT8: see load_row below
    constexpr bool kPredRows = rows_pred_rows(static_cast<int>(sizeof(TIn))); // see store_row below
    extern __shared__ __align__(16) unsigned char smem_raw[];

    int32_t const t = static_cast<int32_t>(threadIdx.x);
    int32_t const p = t / pl.TXY;
    int32_t const lt = t - p * pl.TXY;
    int32_t const oh0 = static_cast<int32_t>(blockIdx.y) * pl.TY * R;
    int32_t const ih_start = oh0 * S - s.pt;
    int32_t const buf_bytes = pl.PPB * pl.slice_bytes;
    int32_t const stages = pl.stages;
    int32_t const stride = static_cast<int32_t>(gridDim.x);

    // Zero all buffers once: side columns and rows outside the image are never written again
    // (the band, blockIdx.y, is the same for every plane this block handles).
    for (int32_t i = t; i < stages * buf_bytes / 16; i += static_cast<int32_t>(blockDim.x))
    {
        reinterpret_cast<uint4*>(smem_raw)[i] = make_uint4(0U, 0U, 0U, 0U);
    }
    __syncthreads();

    // This thread's copies: columns vc, vc + cstep, ... of rows r0, r0 + rstep, ... (none when
    // lt >= rstep * NV).
    int32_t const r0 = lt < pl.rstep * pl.NV ? lt / pl.NV : INT32_MAX;
    int32_t const vc = lt - (r0 == INT32_MAX ? 0 : r0) * pl.NV;
    // Its rows r0, r0 + rstep, ... that lie inside the image (rows rlo .. rhi - 1 of the band),
    // as offsets and steps computed once: the same for every plane this block handles.
    RowsCopies rc{};
    {
        int32_t const rlo = max(0, -ih_start);
        int32_t const rhi = min(pl.NRS, s.H - ih_start);
        int32_t rfirst = r0;
        if (r0 != INT32_MAX && r0 < rlo)
        {
            rfirst = r0 + (rlo - r0 + pl.rstep - 1) / pl.rstep * pl.rstep;
        }
        rc.nrows = r0 == INT32_MAX || rfirst >= rhi ? 0 : (rhi - rfirst + pl.rstep - 1) / pl.rstep;
        if (rc.nrows > 0)
        {
            int32_t const ne = pl.load_bytes / static_cast<int32_t>(sizeof(TIn));
            rc.goff = (ih_start + rfirst) * s.W + vc * ne;
            rc.soff = static_cast<uint32_t>((LPAD + vc * ne + rfirst * pl.P) * static_cast<int32_t>(sizeof(TIn)));
            rc.gstep = pl.rstep * s.W;
            rc.sstep = static_cast<uint32_t>(pl.rstep * pl.P * static_cast<int32_t>(sizeof(TIn)));
        }
    }
    auto const smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    auto issue = [&](int32_t group, int32_t buf) {
        int32_t const plane = group * pl.PPB + p;
        if (group < pl.groups && plane < pl.planes && rc.nrows > 0)
        {
            int32_t const n = rows_div(plane, pl); // plane / s.K
            int32_t const k = plane - n * s.K;
            int32_t const c = s.Kg == 1 ? k : k / s.Kg;
            TIn const* const xp = x + (static_cast<int64_t>(n) * s.C + c) * (static_cast<int64_t>(s.H) * s.W);
            uint32_t const slot = smem_base + static_cast<uint32_t>(buf * buf_bytes + p * pl.slice_bytes);
            switch (pl.load_bytes)
            {
            case 16: rows_issue<16>(xp, slot, pl, rc, vc); break;
            case 8: rows_issue<8>(xp, slot, pl, rc, vc); break;
            default: rows_issue<4>(xp, slot, pl, rc, vc); break;
            }
        }
        cp_async_commit(); // one group per call in every thread, empty or not
    };

    int32_t const ty = lt / pl.TX;
    int32_t const tx = lt - ty * pl.TX;
    int32_t const col0 = tx * V;
    int32_t const orow0 = oh0 + ty * R;
    int const count = min(V, s.Wo - col0);

    // The filter and bias of a group's plane, fetched from global memory one group ahead (INT8,
    // FP16 3x3) so that their latency hides behind the current group's work, or at the start of
    // the group's iteration (float, whose 3x3 kernel has no registers to spare; FP16 5x5/7x7,
    // whose filters are too many registers). INT8 keeps the aligned words that hold the filter's
    // bytes (i8_filter_fetch) and packs them when they are used.
    constexpr bool kAhead = kInt8 || (sizeof(TIn) == 2 && KS == 3);
    struct NoI8Filter
    {
    };
    struct Fetched
    {
        std::conditional_t<kInt8, I8Filter<KS>, NoI8Filter> i8;
        TIn wt[kInt8 ? 1 : KS * KS];
        float bias;
    };
    // the weight tensor's bytes (INT8 filter reads stay inside them)
    [[maybe_unused]] auto const w_lo = reinterpret_cast<uintptr_t>(w);
    [[maybe_unused]] auto const w_hi = weights_end(w, s, KS * KS);
    auto fetch = [&](int32_t group, Fetched& f) {
        int32_t const plane = group * pl.PPB + p;
        bool const ok = group < pl.groups && plane < pl.planes && orow0 < s.Ho;
        int32_t const n = ok ? rows_div(plane, pl) : 0; // plane / s.K
        int32_t const k = ok ? plane - n * s.K : 0;
        TIn const* const wp = filter_at(w, s, n, k, KS * KS);
        if constexpr (kInt8)
        {
            i8_filter_fetch<KS>(wp, ok, w_lo, w_hi, f.i8);
        }
        else
        {
#pragma unroll
            for (int i = 0; i < KS * KS; ++i)
            {
                f.wt[i] = ok ? wp[i] : TIn(0);
            }
        }
        f.bias = ok ? load_bias(b, s, n, k) : 0.0F;
    };

    // Groups of planes g0, g0 + stride, ... go through buffers 0, 1, .., stages - 1, 0, ...;
    // stages - 1 of them are in flight while one is computed.
    int32_t buf = 0;
    for (int32_t ahead = 0; ahead < stages - 1; ++ahead)
    {
        issue(static_cast<int32_t>(blockIdx.x) + ahead * stride, ahead);
    }
    Fetched cur;
    if constexpr (kAhead)
    {
        fetch(static_cast<int32_t>(blockIdx.x), cur);
    }
    for (int32_t group = static_cast<int32_t>(blockIdx.x); group < pl.groups; group += stride)
    {
        issue(group + (stages - 1) * stride, buf == 0 ? stages - 1 : buf - 1);
        [[maybe_unused]] Fetched nxt;
        if constexpr (kAhead)
        {
            fetch(group + stride, nxt);
        }
        else
        {
            fetch(group, cur);
        }

        int32_t const plane = group * pl.PPB + p;
        bool const active = plane < pl.planes && orow0 < s.Ho;
        TIn const* const tile = reinterpret_cast<TIn const*>(smem_raw + buf * buf_bytes + p * pl.slice_bytes);

        Acc acc[R][V];
        rows_acc_init<Store>(acc);
        // Output row i of this thread, once summed (rows_stream(): inside the row loop below, as
        // soon as input row i * S + KS - 1 is done; else all rows after it).
        int64_t const y0 = (static_cast<int64_t>(plane) * s.Ho + orow0) * s.Wo + col0;
        // A row past the image (orow0 + i >= Ho) is skipped by a branch, or (rows_pred_rows) stored
        // with count 0, i.e. none of its pieces (see store_row_bytes), with no branch of its own.
        auto store_row = [&](int i, auto const& ctx) {
            if constexpr (kPredRows)
            {
                int const n = orow0 + i < s.Ho ? count : 0;
                store.template rows_store<V>(y0 + static_cast<int64_t>(i) * s.Wo, acc[i], ctx, pl.out_chunk, n);
            }
            else if (orow0 + i < s.Ho)
            {
                store.template rows_store<V>(y0 + static_cast<int64_t>(i) * s.Wo, acc[i], ctx, pl.out_chunk, count);
            }
        };
        if constexpr (kInt8)
        {
            constexpr int WLO = floor_div4(-PAD);
            constexpr int WHI = rows_hi_word(KS, S, true, V);
            constexpr int NW = WHI - WLO + 1;
            rows_wait(stages);
            __syncthreads();
            if (active)
            {
                uint32_t wk[KS * G];
                i8_filter_pack<KS>(cur.i8, wk);
                unsigned char const* const base
                    = reinterpret_cast<unsigned char const*>(tile) + (ty * R * S) * pl.P + LPAD + col0 * S;
                [[maybe_unused]] auto const ctx = store.rows_plane(cur.bias);
                // The words of input row r (kPrefetch, DWCONV2D_ROWS_PREFETCH_I8: read one row
                // ahead, so that the shared-memory latency of row r + 1 hides behind row r's dp4a
                // and stores).
                auto load_row = [&](int r, uint32_t(&wd)[NW]) {
                    uint32_t const* const rw = reinterpret_cast<uint32_t const*>(base + r * pl.P) + WLO;
#pragma unroll
                    for (int i = 0; i < NW; ++i)
                    {
                        wd[i] = rw[i];
                    }
                };
                [[maybe_unused]] uint32_t ahead[NW];
                if constexpr (kPrefetch)
                {
                    load_row(0, ahead);
                }
#pragma unroll
                for (int r = 0; r < NR; ++r)
                {
                    uint32_t wd[NW];
                    if constexpr (kPrefetch)
                    {
#pragma unroll
                        for (int i = 0; i < NW; ++i)
                        {
                            wd[i] = ahead[i];
                        }
                        if (r + 1 < NR)
                        {
                            load_row(r + 1, ahead);
                        }
                    }
                    else
                    {
                        load_row(r, wd);
                    }
                    rows_dp4a<KS, S, R, V, -WLO>(acc, r, wd, wk);
                    if constexpr (kStream)
                    {
                        if (rows_row_done<KS, S>(r))
                        {
                            store_row((r - (KS - 1)) / S, ctx);
                        }
                    }
                }
            }
        }
        else
        {
            constexpr int CLO = floor_div4(-PAD);
            constexpr int CHI = rows_hi_word(KS, S, false, V);
            constexpr int NCH = CHI - CLO + 1;
            rows_wait(stages);
            __syncthreads();
            if (active)
            {
                float wr[KS * KS];
#pragma unroll
                for (int i = 0; i < KS * KS; ++i)
                {
                    wr[i] = Traits<TIn>::load(cur.wt[i]);
                }
                TIn const* const base = tile + (ty * R * S) * pl.P + LPAD + col0 * S;
                [[maybe_unused]] auto const ctx = store.rows_plane(cur.bias);
#pragma unroll
                for (int r = 0; r < NR; ++r)
                {
                    TIn const* const rw = base + r * pl.P + 4 * CLO;
                    float f[NCH * 4];
#pragma unroll
                    for (int i = 0; i < NCH; ++i)
                    {
                        load4(rw + 4 * i, f + 4 * i);
                    }
                    rows_fma<KS, S, R, V>(acc, r, wr, [&](int e) { return f[e - 4 * CLO]; });
                    if constexpr (kStream)
                    {
                        if (rows_row_done<KS, S>(r))
                        {
                            store_row((r - (KS - 1)) / S, ctx);
                        }
                    }
                }
            }
        }

        if constexpr (!kStream)
        {
            if (active)
            {
                auto const ctx = store.rows_plane(cur.bias);
#pragma unroll
                for (int i = 0; i < R; ++i)
                {
                    store_row(i, ctx);
                }
            }
        }
        __syncthreads(); // every read of this buffer is done before it is refilled
        buf = buf + 1 == stages ? 0 : buf + 1;
        if constexpr (kAhead)
        {
            cur = nxt;
        }
    }
    cp_async_wait<0>();
}

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
// and neighbouring threads' overlapping rows and quads come from L1/L2, not DRAM. The arithmetic
// is depthwise_rows' (rows_dp4a for INT8 with the same filter packing, rows_fma for float, the
// same Store functors), so the results are identical to it, bit for bit.
//
// It serves every depthwise_rows shape whose output rows split into whole segments (see
// global_shape_ok; measured faster than depthwise_rows on every timed shape and type, README "What
// has been verified"); QUANTBENCH_DWCONV_GLOBAL=0 (read per forward) keeps depthwise_rows.
// Compile-time knobs (tuning; defaults = the measured best): DWCONV2D_GLOBAL_R3 / _R5_NARROW / _R
// (output rows per thread at 3x3 / FP16 and INT8 5x5 / else), DWCONV2D_GLOBAL_THREADS (per
// block), DWCONV2D_GLOBAL_AHEAD / _AHEAD_I8_3 (input rows read ahead, see global_ahead),
// DWCONV2D_GLOBAL_MIN_BLOCKS_F16 / _I8 (__launch_bounds__ of FP16 3x3 / 5x5 and INT8 3x3, see
// global_min_blocks), DWCONV2D_GLOBAL_PRED (below).
#ifndef DWCONV2D_GLOBAL_R3
#define DWCONV2D_GLOBAL_R3 4
#endif
#ifndef DWCONV2D_GLOBAL_R5_NARROW
#define DWCONV2D_GLOBAL_R5_NARROW 4
#endif
#ifndef DWCONV2D_GLOBAL_R
#define DWCONV2D_GLOBAL_R 7
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
// Rows and quads outside the image: skipped by predicated loads (1: measured faster, or equal,
// on every timed shape but the float 7x7 ones, FP32 44.3 against 41.3 us, FP16 42.2 against
// 38.4, whose registers it changes), or loaded from a row inside and zeroed (0).
// DWCONV2D_GLOBAL_PRED sets all shapes.
#ifdef DWCONV2D_GLOBAL_PRED
#define DWCONV2D_GLOBAL_PRED_FLOAT_7X7 DWCONV2D_GLOBAL_PRED
#else
#define DWCONV2D_GLOBAL_PRED 1
#endif
#ifndef DWCONV2D_GLOBAL_PRED_FLOAT_7X7
#define DWCONV2D_GLOBAL_PRED_FLOAT_7X7 0
#endif
__host__ __device__ constexpr bool global_pred(int elem, int ks)
{
    return (elem != 1 && ks == 7 ? DWCONV2D_GLOBAL_PRED_FLOAT_7X7 : DWCONV2D_GLOBAL_PRED) != 0;
}
constexpr int kGlobalThreads = DWCONV2D_GLOBAL_THREADS;

// Input rows read ahead of the one summed: 2 for INT8 3x3 (24.7 against 27.0 us with per-batch
// weights, 23.7-24.7 against 24.4 shared), 1 elsewhere (2 measured no faster for FP16 and FP32 3x3
// and INT8 5x5 / 7x7, and 49.6 against 41.1 us for FP32 7x7).
__host__ __device__ constexpr int global_ahead(int elem, int ks)
{
    return elem == 1 && ks == 3 ? DWCONV2D_GLOBAL_AHEAD_I8_3 : DWCONV2D_GLOBAL_AHEAD;
}

// __launch_bounds__ minimum blocks per multiprocessor: 8 (64 registers) for FP16 3x3 / 5x5, 7 (72
// registers, 28 warps instead of 24) for INT8 3x3, none elsewhere (FP32 7x7 spills at 4 or 5: 45.8
// against 41 us). FP16 at 9 / 10 / 12 and INT8 at 8 were no faster or spilled.
__host__ __device__ constexpr int global_min_blocks(int elem, int ks)
{
    return elem == 2 && ks <= 5 ? DWCONV2D_GLOBAL_MIN_BLOCKS_F16
        : elem == 1 && ks == 3  ? DWCONV2D_GLOBAL_MIN_BLOCKS_I8
                                : 1;
}
// Outputs per thread along W (8 for the narrow types' 3x3, else 4) and output rows per thread
// (4 at 3x3 and for FP16 / INT8 5x5, else 7: each measured best of 2, 4, 7/8 and 14 on the timed
// shapes).
__host__ __device__ constexpr int global_v(int elem, int ks)
{
    return ks == 3 && elem != 4 ? 8 : 4;
}
__host__ __device__ constexpr int global_r(int elem, int ks)
{
    return ks == 3 ? DWCONV2D_GLOBAL_R3 : ks == 5 && elem != 4 ? DWCONV2D_GLOBAL_R5_NARROW : DWCONV2D_GLOBAL_R;
}

struct GlobalPlan
{
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

// ---------------------------------------------------------------------------------------------
// Path 1c: depthwise_mma (INT8 and FP16 on depthwise_rows shapes): tensor cores
// ---------------------------------------------------------------------------------------------
//
// One warp owns one plane at a time (persistent warps, each a contiguous run of planes in
// channel-major order, so that with shared weights a channel's Toeplitz bands below are built
// once per run, not per plane), copies it whole into its own shared memory with cp.async (stages - 1 planes in flight per warp, zero rows
// and columns around the image so that nothing is bounds-checked) and computes it on the tensor
// cores. Per filter row kh, a 16 x 8 tile of outputs (16 output rows, 8 adjacent output columns)
// is a matrix product
//   C[m][n] += sum_k A[m][k] * B[k][n],  A[m][k] = x[(oh0 + m) * S + kh - pad_top][c0 + k],
//   B[k][n] = w[kh][k - n * S + PAD - OFF] (zero outside 0..KS-1),
// i.e. K consecutive input columns (from c0 = ow0 * S - OFF, 4-byte aligned) times a banded
// Toeplitz matrix built from the filter row. INT8: mma.m16n8k32 s8 x s8 -> s32, exact in int32
// (|sum| <= 49 * 2^14). FP16: mma.m16n8k16 f16 x f16 -> f32 (the products are exact in float32,
// the sums float32, as on the CUDA cores), two K steps of 16 per chunk. One A fragment (16 rows
// x 32 columns) serves NB = 3 blocks of 8 output columns at stride 1 (1 at stride 2), so a 3x3
// INT8 forward costs 3 x 4 shared-memory words and 9 MMAs per 384 outputs. The B fragments (the
// Toeplitz bands) are gathered once per plane from a zero-padded copy of the filter rows in
// shared memory and stay in registers. The epilogue swaps half of each accumulator fragment with
// the neighbouring lane so that every lane holds 4 adjacent outputs of one row, and stores them
// through the same Store functors (rows_store<4>) as depthwise_rows: same rounding, same
// INT8 requantization (bit-exact, ties included). Tiles at the bottom and right edges are moved
// back to end at the last row / column (they overlap the tile before, whose outputs they do not
// store again), so no rows or columns past the image are computed or staged; the blocks of such a
// tile that hold only columns the tile before stored are not computed at all (DWCONV2D_MMA_LIVE).

__host__ __device__ constexpr int mma_nb(int st)
{
    return st == 1 ? 3 : 1; // 8-column output blocks per chunk
}
__host__ __device__ constexpr int mma_cw(int st)
{
    return 8 * mma_nb(st); // output columns per chunk
}
__host__ __device__ constexpr int mma_off(int elem, int ks)
{
    return (ks / 2 + (4 / elem) - 1) / (4 / elem) * (4 / elem); // c0 = ow0 * S - OFF, 4-byte aligned
}
constexpr int kMmaKC = 32;       // input columns per chunk (INT8: one k32 step, FP16: two k16 steps)
#ifndef DWCONV2D_MMA_WARPS
#define DWCONV2D_MMA_WARPS 4
#endif
constexpr int kMmaWarps = DWCONV2D_MMA_WARPS; // warps per block
#ifndef DWCONV2D_MMA_AHEAD_BYTES
#define DWCONV2D_MMA_AHEAD_BYTES (6 * 1024)
#endif
constexpr int kMmaAheadBytes = DWCONV2D_MMA_AHEAD_BYTES; // input bytes in flight per warp (if they fit)
constexpr int kMmaMaxSlot = 24 * 1024; // per plane and stage; larger planes take depthwise_rows
// Chunk blocks holding only columns the chunk before stored are not computed (1), or are (0).
#ifndef DWCONV2D_MMA_LIVE
#define DWCONV2D_MMA_LIVE 1
#endif

__host__ __device__ constexpr int mma_z(int elem, int ks, int st)
{
    return (mma_cw(st) - 1) * st + mma_off(elem, ks); // first tap of a zero-padded filter row
}
__host__ __device__ constexpr int mma_zl(int elem, int ks, int st)
{
    return (mma_z(elem, ks, st) + kMmaKC + ks / 2 + 8 + 7) / 8 * 8; // elements per padded row
}
__host__ __device__ constexpr int mma_zrow_bytes(int elem, int ks, int st)
{
    return (ks * mma_zl(elem, ks, st) * elem + 15) / 16 * 16;
}

#ifndef DWCONV2D_MMA_RUNS
#define DWCONV2D_MMA_RUNS 1
#endif
// A warp's position in its sequence of planes: the sequence index p and the plane's (n, k).
struct MmaCursor
{
    int32_t p;
    int32_t n;
    int32_t k;
};

struct MmaPlan
{
    int32_t planes;      // N * K
    int32_t stages;      // plane buffers per warp (stages - 1 planes in flight)
    int32_t NRS;         // shared-memory rows per plane: (max(Ho, 16) - 1) * S + KS
    int32_t P;           // their pitch in bytes (16-byte multiple, pitch / 4 = 4 mod 8)
    int32_t slot_bytes;  // NRS * P
    int32_t warp_bytes;  // stages * slot_bytes + the padded filter rows
    int32_t load_bytes;  // 16, 8 or 4
    int32_t NV;          // copies per input row
    int32_t out_chunk;   // bytes per output store (rows_out_chunk for 4 outputs)
};

// (mma.sync m16n8k32 s8 and m16n8k16 f16 need sm_80; launch_mma() runs this path only there.)
__device__ inline void mma_tile(int32_t (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ inline void mma_tile(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 4 bytes of shared memory starting at byte `byte` of a 4-byte aligned array (any alignment).
__device__ inline uint32_t smem_word_at(unsigned char const* base, int32_t byte)
{
    uint32_t const* const w = reinterpret_cast<uint32_t const*>(base) + (byte >> 2);
    return __funnelshift_r(w[0], w[1], 8 * (byte & 3));
}

// This lane's share of the copies of one plane's rows: columns v0, v0 + 32, ... (several per row
// when a row has more than 32) of rows r0, r0 + rstep, ... (rstep = 32 / copies per row, else 1).
template <int LB, class T>
__device__ inline void mma_issue(T const* xp, unsigned char* tile, ConvShape const& s, MmaPlan const& pl,
    int32_t r0, int32_t v0, int32_t rstep)
{
    constexpr int NE = LB / static_cast<int>(sizeof(T));
    int32_t const rows = min(s.H, pl.NRS - s.pt); // input rows the plane's outputs read
    // Both addresses advance by a step per copy (the loop was ~21 instructions per copy with them
    // recomputed from r).
    int64_t const src_step = static_cast<int64_t>(rstep) * s.W * static_cast<int64_t>(sizeof(T));
    uint32_t const dst_step = static_cast<uint32_t>(rstep * pl.P);
    for (int32_t v = v0; v < pl.NV; v += 32)
    {
        auto const* src = reinterpret_cast<unsigned char const*>(xp + static_cast<int64_t>(r0) * s.W + v * NE);
        unsigned char* dst = tile + (r0 + s.pt) * pl.P + 16 + v * LB;
        for (int32_t r = r0; r < rows; r += rstep)
        {
            cp_async<LB>(dst, src);
            src += src_step;
            dst += dst_step;
        }
    }
}

template <int KS, int S, class TIn, class TB, class Store>
__global__ void __launch_bounds__(kMmaWarps * 32) depthwise_mma_kernel(TIn const* __restrict__ x,
    TIn const* __restrict__ w, TB const* __restrict__ b, Store store, ConvShape s, MmaPlan pl)
{
    using Acc = typename Traits<TIn>::Acc;
    constexpr bool kInt8 = std::is_same<TIn, int8_t>::value;
    constexpr int E = static_cast<int>(sizeof(TIn));
    constexpr int PAD = KS / 2;
    constexpr int NB = mma_nb(S);
    constexpr int CW = mma_cw(S);
    constexpr int OFF = mma_off(E, KS);
    constexpr int KM = kInt8 ? 32 : 16;     // K of one MMA
    constexpr int KSTEPS = kMmaKC / KM;
    constexpr int Z = mma_z(E, KS, S);
    constexpr int ZL = mma_zl(E, KS, S);
    constexpr int LPAD = 16 / E;
    static_assert((CW - 1) * S + KS - 1 - PAD + OFF <= kMmaKC - 1, "a chunk's taps lie in its columns");
    static_assert(OFF <= LPAD, "the first chunk starts inside the zero columns");
    // Whether output block j (8 columns) has taps in K step q (columns 16q..16q+15 of the chunk).
    auto constexpr touches = [](int j, int q) {
        int const lo = 8 * j * S - PAD + OFF;
        int const hi = (8 * j + 7) * S + KS - 1 - PAD + OFF;
        return KSTEPS == 1 || (lo <= KM * q + KM - 1 && hi >= KM * q);
    };
    extern __shared__ __align__(16) unsigned char smem_raw[];

    int32_t const lane = static_cast<int32_t>(threadIdx.x) & 31;
    int32_t const warp = static_cast<int32_t>(threadIdx.x) >> 5;
    int32_t const g = lane >> 2;
    int32_t const tq = lane & 3;
    unsigned char* const wbase = smem_raw + warp * pl.warp_bytes;
    unsigned char* const zbytes = wbase + pl.stages * pl.slot_bytes;
    TIn* const zrow = reinterpret_cast<TIn*>(zbytes);
    for (int32_t i = lane; i < pl.warp_bytes / 16; i += 32)
    {
        reinterpret_cast<uint4*>(wbase)[i] = make_uint4(0U, 0U, 0U, 0U);
    }
    __syncwarp();

    int32_t const nwarps = static_cast<int32_t>(gridDim.x) * kMmaWarps;
    int32_t const first = static_cast<int32_t>(blockIdx.x) * kMmaWarps + warp;

    // This warp's planes, in order. DWCONV2D_MMA_RUNS: a contiguous run of plane indices p in
    // channel-major order (p = k * N + n, plane n * K + k), so that consecutive planes mostly share
    // a channel and, with shared weights, its filter and Toeplitz bands, built once per run of the
    // channel; else planes first, first + nwarps, ... (each one's bands built).
#if DWCONV2D_MMA_RUNS
    int32_t const per = (pl.planes + nwarps - 1) / nwarps;
    int32_t const p_begin = static_cast<int32_t>(min(int64_t{pl.planes}, int64_t{first} * per));
    int32_t const p_end = static_cast<int32_t>(min(int64_t{pl.planes}, int64_t{p_begin} + per));
    int32_t const k_begin = p_begin / s.N;
    MmaCursor const start{p_begin, p_begin - k_begin * s.N, k_begin};
    auto advance = [&](MmaCursor& c) {
        ++c.p;
        if (++c.n == s.N)
        {
            c.n = 0;
            ++c.k;
        }
    };
#else
    int32_t const p_end = pl.planes;
    MmaCursor const start{first, first / s.K, first - first / s.K * s.K};
    auto advance = [&](MmaCursor& c) {
        c.p += nwarps;
        c.n = c.p / s.K;
        c.k = c.p - c.n * s.K;
    };
#endif

    int32_t const rstep = max(1, 32 / pl.NV);
    int32_t const r0 = lane < rstep * pl.NV ? lane / pl.NV : INT32_MAX;
    int32_t const v0 = pl.NV >= 32 ? lane : lane - (r0 == INT32_MAX ? 0 : r0) * pl.NV;
    auto issue = [&](MmaCursor const& q, int32_t slot) {
        if (q.p < p_end && r0 != INT32_MAX)
        {
            int32_t const c = s.Kg == 1 ? q.k : q.k / s.Kg;
            TIn const* const xp = x + (static_cast<int64_t>(q.n) * s.C + c) * (static_cast<int64_t>(s.H) * s.W);
            unsigned char* const tile = wbase + slot * pl.slot_bytes;
            switch (pl.load_bytes)
            {
            case 16: mma_issue<16>(xp, tile, s, pl, r0, v0, rstep); break;
            case 8: mma_issue<8>(xp, tile, s, pl, r0, v0, rstep); break;
            default: mma_issue<4>(xp, tile, s, pl, r0, v0, rstep); break;
            }
        }
        cp_async_commit(); // one group per call in every lane, empty or not
    };
    // The filter (lane l holds elements l and l + 32; only where `filter`) and the bias of plane q.
    struct Fetched
    {
        TIn w0, w1;
        float bias;
    };
    auto fetch = [&](MmaCursor const& q, bool filter, Fetched& f) {
        bool const ok = q.p < p_end;
        int32_t const n = ok ? q.n : 0;
        int32_t const k = ok ? q.k : 0;
        TIn const* const wp = filter_at(w, s, n, k, KS * KS);
        f.w0 = ok && filter && lane < KS * KS ? wp[lane] : TIn(0);
        f.w1 = ok && filter && lane + 32 < KS * KS ? wp[lane + 32] : TIn(0);
        f.bias = ok ? load_bias(b, s, n, k) : 0.0F;
    };

    int32_t slot = 0;
    MmaCursor ahead = start;
    for (int32_t i = 0; i < pl.stages - 1; ++i)
    {
        issue(ahead, i);
        advance(ahead);
    }
    MmaCursor q = start;
    Fetched cur;
    fetch(q, true, cur);
    int32_t const RT = (s.Ho + 15) / 16;
    int32_t const NCH = (s.Wo + CW - 1) / CW;
    int32_t const last_row0 = max(0, s.Ho - 16);
    int32_t const last_col0 = max(0, (s.Wo - CW + 3) & ~3); // a multiple of 4: c0 stays 4-byte aligned
    // The Toeplitz bands: lane (g, tq) holds B[k][g] for its k (two 4-byte registers per MMA), of
    // the filter of channel built_k (-1: none yet).
    uint32_t bf[KS][NB][KSTEPS][2];
    int32_t built_k = -1;
    for (; q.p < p_end; advance(q))
    {
        issue(ahead, slot == 0 ? pl.stages - 1 : slot - 1);
        advance(ahead);
        MmaCursor nq = q;
        advance(nq);
        bool const build = s.weight_per_batch || q.k != built_k; // warp-uniform
        Fetched nxt;
        // The next plane's filter only where it builds its bands (built_k is q.k from here on).
        fetch(nq, s.weight_per_batch || nq.k != q.k, nxt);
        if (build)
        {
            if (lane < KS * KS)
            {
                zrow[(lane / KS) * ZL + Z + lane % KS] = cur.w0;
            }
            if (lane + 32 < KS * KS)
            {
                zrow[((lane + 32) / KS) * ZL + Z + (lane + 32) % KS] = cur.w1;
            }
        }
        rows_wait(pl.stages);
        __syncwarp();
        if (build)
        {
            built_k = q.k;
#pragma unroll
            for (int kh = 0; kh < KS; ++kh)
            {
#pragma unroll
                for (int j = 0; j < NB; ++j)
                {
#pragma unroll
                    for (int qs = 0; qs < KSTEPS; ++qs)
                    {
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                        {
                            if (touches(j, qs))
                            {
                                int32_t const e = qs * KM + (kInt8 ? 4 * tq + 16 * h : 2 * tq + 8 * h)
                                    - (8 * j + g) * S + PAD - OFF + Z;
                                bf[kh][j][qs][h] = smem_word_at(zbytes + kh * ZL * E, e * E);
                            }
                            else
                            {
                                bf[kh][j][qs][h] = 0U;
                            }
                        }
                    }
                }
            }
        }

        unsigned char const* const tile = wbase + slot * pl.slot_bytes;
        auto const ctx = store.rows_plane(cur.bias);
        int64_t const ybase = (static_cast<int64_t>(q.n) * s.K + q.k) * s.Ho * s.Wo;
        for (int32_t rt = 0; rt < RT; ++rt)
        {
            int32_t const oh0 = min(rt * 16, last_row0);
            int32_t const row = oh0 + g + ((tq & 1) != 0 ? 8 : 0); // this lane's output row
            bool const row_ok = row >= rt * 16 && row < s.Ho;       // not stored by the tile before
            // Byte offsets of this lane's A rows (m = g and g + 8) for kh = 0.
            int32_t const ra = (oh0 + g) * S * pl.P;
            int32_t const rb = ra + 8 * S * pl.P;
            for (int32_t ch = 0; ch < NCH; ++ch)
            {
                int32_t const ow0 = min(ch * CW, last_col0);
                int32_t const cbyte = (LPAD + ow0 * S - OFF) * E + 4 * tq;
                // One chunk whose blocks below JLO hold only columns the chunk before stored (the
                // last chunk, moved back to end at the last column): those are not computed.
                auto chunk = [&](auto jlo_c) {
                    constexpr int JLO = decltype(jlo_c)::value;
                    auto live = [&](int j, int qs) { return j >= JLO && touches(j, qs); };
                    Acc acc[NB][4];
#pragma unroll
                    for (int j = 0; j < NB; ++j)
                    {
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                        {
                            acc[j][i] = Acc(0);
                        }
                    }
#pragma unroll
                    for (int kh = 0; kh < KS; ++kh)
                    {
#pragma unroll
                        for (int qs = 0; qs < KSTEPS; ++qs)
                        {
                            bool any = false; // folded once unrolled
#pragma unroll
                            for (int j = 0; j < NB; ++j)
                            {
                                any = any || live(j, qs);
                            }
                            if (any)
                            {
                                unsigned char const* const p = tile + kh * pl.P + cbyte + qs * KM * E;
                                uint32_t a[4];
                                a[0] = *reinterpret_cast<uint32_t const*>(p + ra);
                                a[1] = *reinterpret_cast<uint32_t const*>(p + rb);
                                a[2] = *reinterpret_cast<uint32_t const*>(p + ra + 16);
                                a[3] = *reinterpret_cast<uint32_t const*>(p + rb + 16);
#pragma unroll
                                for (int j = 0; j < NB; ++j)
                                {
                                    if (live(j, qs))
                                    {
                                        mma_tile(acc[j], a, bf[kh][j][qs][0], bf[kh][j][qs][1]);
                                    }
                                }
                            }
                        }
                    }
                    bool const odd = (tq & 1) != 0;
#pragma unroll
                    for (int j = JLO; j < NB; ++j)
                    {
                        // Lane pairs (tq even, tq + 1) swap halves: the even lane gets row g,
                        // columns 4 (tq / 2) .. + 3 of each block; the odd lane row g + 8, the same.
                        Acc const s0 = odd ? acc[j][0] : acc[j][2];
                        Acc const s1 = odd ? acc[j][1] : acc[j][3];
                        Acc const r0 = __shfl_xor_sync(0xFFFFFFFFU, s0, 1);
                        Acc const r1 = __shfl_xor_sync(0xFFFFFFFFU, s1, 1);
                        Acc v[4];
                        v[0] = odd ? r0 : acc[j][0];
                        v[1] = odd ? r1 : acc[j][1];
                        v[2] = odd ? acc[j][2] : r0;
                        v[3] = odd ? acc[j][3] : r1;
                        if constexpr (Store::kAccBias != 0)
                        {
#pragma unroll
                            for (int i = 0; i < 4; ++i)
                            {
                                v[i] += Store::kAccBias; // rows_store takes biased sums (StoreI8ToI8)
                            }
                        }
                        int32_t const col = ow0 + 8 * j + 4 * (tq >> 1);
                        if (row_ok && col >= ch * CW && col < s.Wo)
                        {
                            store.template rows_store<4>(ybase + static_cast<int64_t>(row) * s.Wo + col, v, ctx,
                                pl.out_chunk, min(4, s.Wo - col));
                        }
                    }
                };
                int32_t const jlo = DWCONV2D_MMA_LIVE != 0 ? (ch * CW - ow0) / 8 : 0;
                if constexpr (NB == 3)
                {
                    if (jlo == 0)
                    {
                        chunk(std::integral_constant<int, 0>{});
                    }
                    else if (jlo == 1)
                    {
                        chunk(std::integral_constant<int, 1>{});
                    }
                    else
                    {
                        chunk(std::integral_constant<int, 2>{});
                    }
                }
                else
                {
                    chunk(std::integral_constant<int, 0>{});
                }
            }
        }
        __syncwarp(); // every lane is done with this buffer and the filter rows before refills
        slot = slot + 1 == pl.stages ? 0 : slot + 1;
        cur = nxt;
    }
    cp_async_wait<0>();
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
// Path 6: grouped and dense INT8 on the integer tensor cores (gemm_mma)
// ---------------------------------------------------------------------------------------------
//
// Per (n, group): y[k, p] = sum_r Wt[k, r] * im2col(x)[r, p] with mma.sync m16n8k32 s8 (int32
// accumulation: exact, as on the CUDA cores). The reduction index is r = tap * Cp + c (Cp: the
// group's channels padded to a multiple of 8), so that 32 consecutive reduction bytes are four
// runs of 8 channels at one tap each, i.e. four 8-byte copies (one 32-byte run when Cp % 32 == 0)
// of one pixel's channels. Small groups are merged: S consecutive groups become one of S * Cg
// channels whose filters are block-diagonal (zeros between the groups), so that a ResNeXt group of
// 8 channels fills whole 32-byte steps (S x more products on the tensor cores, far fewer steps).
// Two packing kernels first write, into a workspace,
//   xt [N][G'][H][W][Cp]   the input with a (merged) group's channels innermost, zeros past them,
//   wt [NW][G'][Kp][Rp]    the filters in r order (zeros past Kg', outside the diagonal blocks and
//                          past kH * kW taps),
// then each block computes BM = 16 * MT output channels x 128 pixels of one image and (merged)
// group: 4 warps of BM x 32 pixels, KC 32-byte reduction chunks per stage, stages copied by
// cp.async three deep (zero-fill for taps outside the image), fragments read with ldmatrix from
// shared rows of 32 * KC + 16 bytes (conflict-free). The epilogue rounds exactly as every path
// (StoreI8ToI8::quick falls back to the exact division near a rounding tie).

constexpr int kGmmaWarps = 4;
constexpr int kGmmaBN = 32 * kGmmaWarps; // output pixels per block (one per thread in the copies)
constexpr int kGmmaStages = 3;

struct GmmaShape
{
    int32_t merge;  // S: original groups per merged group
    int32_t Cp;     // channels per merged group, rounded up to 8
    int32_t runs;   // Cp / 8: 8-byte channel runs per tap
    int32_t taps;   // kH * kW
    int32_t Rp;     // reduction bytes per filter row: taps * Cp rounded up to 32 * KC
    int32_t Kp;     // output channels per merged group, rounded up to BM
    int32_t steps;  // Rp / (32 * KC)
    int32_t mtiles; // Kp / BM
    // The patch kernel (gemm_mma_patch_kernel; halo != 0): Cp a multiple of 32, r ordered
    // (chunk of 32 channels, tap, channel), whole output rows per block.
    int32_t halo;
    int32_t rows;   // output rows per block (rows * Wo <= 128)
    int32_t pr, pc; // input patch rows and columns those rows read
    int32_t chunks; // Cp / 32
};

// cp.async of LB bytes that reads `bytes` (LB or 0) and zero-fills the rest.
template <int LB>
__device__ inline void cp_async_zfill(uint32_t saddr, void const* gmem, uint32_t bytes)
{
    if constexpr (LB == 16)
    {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem), "r"(bytes) : "memory");
    }
    else
    {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(saddr), "l"(gmem), "n"(LB), "r"(bytes)
                     : "memory");
    }
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t saddr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr));
}

// xt[n][g][h][w][c] = x[n][g * Cg + c][h][w] (0 for c >= Cg; m: the merged shape), 8 channels
// (one run) of PX pixels per thread. PX = 4 reads words (H * W % 4 == 0 and x 4-byte aligned) and
// transposes them with byte permutes. Lanes: RL = min(runs, 4) consecutive threads take
// consecutive runs of the same pixels, so that a warp reads whole 32-byte sectors of each channel
// plane and writes whole 32-byte sectors of xt.
template <int PX>
__device__ inline void gmma_pack_x(int8_t const* __restrict__ x, int8_t* __restrict__ xt, ConvShape const& m,
    GmmaShape const& gs, int64_t i)
{
    int64_t const hw = static_cast<int64_t>(m.H) * m.W;
    int64_t const spans = hw / PX;
    int32_t const rl_count = min(gs.runs, 4);
    int32_t const rgroups = (gs.runs + 3) / 4;
    int32_t const rl = static_cast<int32_t>(i % rl_count);
    int64_t rest = i / rl_count;
    int64_t const pix = (rest % spans) * PX;
    rest /= spans;
    int32_t const run = static_cast<int32_t>(rest % rgroups) * 4 + rl;
    int64_t const ng = rest / rgroups; // n * group + g
    if (run >= gs.runs)
    {
        return;
    }
    int32_t const g = static_cast<int32_t>(ng % m.group);
    int64_t const n = ng / m.group;
    int32_t const c0 = run * 8;
    int8_t const* const src = x + (n * m.C + static_cast<int64_t>(g) * m.Cg + c0) * hw + pix;
    int8_t* const dst = xt + (ng * hw + pix) * gs.Cp + c0;
    if constexpr (PX == 1)
    {
        uint32_t word[2] = {0U, 0U};
#pragma unroll
        for (int j = 0; j < 8; ++j)
        {
            if (c0 + j < m.Cg)
            {
                word[j / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(src[j * hw])) << (8 * (j % 4));
            }
        }
        *reinterpret_cast<uint2*>(dst) = make_uint2(word[0], word[1]);
    }
    else
    {
        uint32_t v[8]; // channel c0 + j at pixels pix .. pix + 3
#pragma unroll
        for (int j = 0; j < 8; ++j)
        {
            v[j] = c0 + j < m.Cg ? __ldg(reinterpret_cast<uint32_t const*>(src + j * hw)) : 0U;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
        {
            // bytes q of v[0..3] and of v[4..7]: pixel pix + q's 8 channels
            uint32_t const sel = static_cast<uint32_t>(q) | (static_cast<uint32_t>(q + 4) << 4);
            uint32_t const lo = __byte_perm(__byte_perm(v[0], v[1], sel), __byte_perm(v[2], v[3], sel), 0x5410);
            uint32_t const hi = __byte_perm(__byte_perm(v[4], v[5], sel), __byte_perm(v[6], v[7], sel), 0x5410);
            *reinterpret_cast<uint2*>(dst + q * gs.Cp) = make_uint2(lo, hi);
        }
    }
}

// wt[nw][g][k][r] = w[nw][g * Kg' + k][c % Cg][tap], r = tap * Cp + c (the patch kernel: r = (c / 32)
// * taps * 32 + tap * 32 + c % 32), where output channel k and input
// channel c belong to the same original group (k / Kg == c / Cg), else 0 (and 0 outside Kg',
// Cg', taps): 4 bytes of wt per thread. so: the original shape.
__device__ inline void gmma_pack_w(int8_t const* __restrict__ w, int8_t* __restrict__ wt, ConvShape const& so,
    GmmaShape const& gs, int64_t i)
{
    int32_t const row_words = gs.Rp / 4;
    int32_t const r0 = static_cast<int32_t>(i % row_words) * 4;
    int64_t rest = i / row_words;
    int32_t const k = static_cast<int32_t>(rest % gs.Kp); // in the merged group
    rest /= gs.Kp;
    int32_t const groups = so.group / gs.merge;
    int32_t const g = static_cast<int32_t>(rest % groups);
    int64_t const nw = rest / groups;
    int32_t const kg_merged = so.Kg * gs.merge;
    uint32_t v = 0U;
    if (k < kg_merged)
    {
        int32_t const sub = k / so.Kg; // the original group within the merged one
        int8_t const* const filt = w + ((nw * so.K + static_cast<int64_t>(g) * kg_merged + k) * so.Cg) * gs.taps;
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            int32_t const r = r0 + j;
            int32_t const chunk = gs.halo != 0 ? r / (gs.taps * 32) : 0;
            int32_t const tap = gs.halo != 0 ? (r / 32) % gs.taps : r / gs.Cp;
            int32_t const c = (gs.halo != 0 ? chunk * 32 + r % 32 : r - tap * gs.Cp) - sub * so.Cg;
            if (tap < gs.taps && c >= 0 && c < so.Cg)
            {
                v |= static_cast<uint32_t>(static_cast<uint8_t>(filt[static_cast<int64_t>(c) * gs.taps + tap])) << (8 * j);
            }
        }
    }
    reinterpret_cast<uint32_t*>(wt)[i] = v;
}

// Both packings in one launch: the first xthreads threads pack x, the next wwords pack w.
template <int PX>
__global__ void gmma_pack_kernel(int8_t const* __restrict__ x, int8_t const* __restrict__ w, int8_t* __restrict__ xt,
    int8_t* __restrict__ wt, ConvShape so, ConvShape m, GmmaShape gs, int64_t xthreads, int64_t wwords)
{
    int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < xthreads)
    {
        gmma_pack_x<PX>(x, xt, m, gs, i);
    }
    else if (i - xthreads < wwords)
    {
        gmma_pack_w(w, wt, so, gs, i - xthreads);
    }
}

// Two adjacent outputs i, i + 1 (both: i + 1 is in the row too), one store where aligned.
__device__ inline void gmma_store2(StoreI8ToI8 const& st, int64_t i, int32_t a0, int32_t a1, float bias, bool both)
{
    int32_t const q0 = st.quick(__fadd_rn(__fmul_rn(__int2float_rn(a0), st.acc_scale), bias));
    if (!both)
    {
        st.y[i] = static_cast<int8_t>(q0);
        return;
    }
    int32_t const q1 = st.quick(__fadd_rn(__fmul_rn(__int2float_rn(a1), st.acc_scale), bias));
    if ((reinterpret_cast<uintptr_t>(st.y + i) & 1) == 0)
    {
        *reinterpret_cast<uint16_t*>(st.y + i) = static_cast<uint16_t>((q0 & 0xFF) | ((q1 & 0xFF) << 8));
    }
    else
    {
        st.y[i] = static_cast<int8_t>(q0);
        st.y[i + 1] = static_cast<int8_t>(q1);
    }
}

__device__ inline void gmma_store2(StoreI8ToF32 const& st, int64_t i, int32_t a0, int32_t a1, float bias, bool both)
{
    float const v0 = __fadd_rn(__fmul_rn(__int2float_rn(a0), st.acc_scale), bias);
    if (!both)
    {
        st.y[i] = v0;
        return;
    }
    float const v1 = __fadd_rn(__fmul_rn(__int2float_rn(a1), st.acc_scale), bias);
    if ((reinterpret_cast<uintptr_t>(st.y + i) & 7) == 0)
    {
        *reinterpret_cast<float2*>(st.y + i) = make_float2(v0, v1);
    }
    else
    {
        st.y[i] = v0;
        st.y[i + 1] = v1;
    }
}

// The image, (merged) group and output-channel tile of a gemm_mma block (blockIdx.y, blockIdx.z)
// and its filter rows in wt.
struct GmmaBlock
{
    int32_t n, g, mtile;
    int8_t const* wblk;
};

__device__ inline GmmaBlock gmma_block(ConvShape const& s, GmmaShape const& gs, int32_t bm, int8_t const* wt)
{
    GmmaBlock blk{};
    blk.n = static_cast<int32_t>(blockIdx.y);
    blk.g = static_cast<int32_t>(blockIdx.z) / gs.mtiles;
    blk.mtile = static_cast<int32_t>(blockIdx.z) - blk.g * gs.mtiles;
    blk.wblk = wt
        + ((static_cast<int64_t>(s.weight_per_batch ? blk.n : 0) * s.group + blk.g) * gs.Kp
              + static_cast<int64_t>(blk.mtile) * bm)
            * gs.Rp;
    return blk;
}

// One warp's accumulators in both gemm_mma kernels: MT m16 tiles x 4 n8 tiles (32 pixels).
template <int MT>
struct GmmaAcc
{
    int32_t v[MT][4][4];
};

template <int MT>
__device__ inline void gmma_zero(GmmaAcc<MT>& acc)
{
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
    {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        {
#pragma unroll
            for (int j = 0; j < 4; ++j)
            {
                acc.v[mt][nt][j] = 0;
            }
        }
    }
}

// One 32-byte reduction step: the A fragments of MT m16 tiles (this lane's ldmatrix row at a_addr,
// rows a_pitch bytes apart) times the B fragments of two n8 tile pairs (this lane's rows at b0, b1).
template <int MT>
__device__ inline void gmma_step(GmmaAcc<MT>& acc, uint32_t a_addr, int32_t a_pitch, uint32_t b0, uint32_t b1)
{
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
    {
        ldmatrix_x4(af[mt], a_addr + mt * 16 * a_pitch);
    }
#pragma unroll
    for (int np = 0; np < 2; ++np)
    {
        uint32_t bf[4];
        ldmatrix_x4(bf, np == 0 ? b0 : b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
        {
            mma_tile(acc.v[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_tile(acc.v[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
    }
}

// Stores a warp's accumulators: output channels g * Kg + kfirst + (0 .. 16 MT) (those < Kg), the
// block's pixels first + (0 .. 128) of image n (those below count). Fragment: [0], [1] at row gq,
// columns 2 tq and 2 tq + 1; [2], [3] at row gq + 8.
template <int MT, class Store>
__device__ inline void gmma_epilogue(GmmaAcc<MT> const& acc, Store const& store, float const* __restrict__ b,
    ConvShape const& s, int32_t n, int32_t g, int32_t kfirst, int32_t first, int32_t count)
{
    int32_t const lane = static_cast<int32_t>(threadIdx.x) & 31;
    int32_t const gq = lane >> 2;
    int32_t const p0 = (static_cast<int32_t>(threadIdx.x) >> 5) * 32 + 2 * (lane & 3); // block-local
    int64_t const pixels = static_cast<int64_t>(s.Ho) * s.Wo;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
    {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
        {
            int32_t const kl = kfirst + mt * 16 + hf * 8 + gq;
            if (kl >= s.Kg)
            {
                continue;
            }
            int32_t const k = g * s.Kg + kl;
            float const bias = load_bias(b, s, n, k);
            int64_t const ybase = (static_cast<int64_t>(n) * s.K + k) * pixels + first;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
            {
                int32_t const pp = p0 + nt * 8;
                if (pp < count)
                {
                    gmma_store2(store, ybase + pp, acc.v[mt][nt][2 * hf], acc.v[mt][nt][2 * hf + 1], bias, pp + 1 < count);
                }
            }
        }
    }
}

// MT m16 tiles of output channels per block (BM = 16 * MT), KC 32-byte chunks per stage; WIDE:
// Cp % 32 == 0, so a chunk's four channel runs are one tap's 32 contiguous bytes. s: the merged
// shape (groups of S * Cg channels).
template <int MT, int KC, bool WIDE, class Store>
__global__ void __launch_bounds__(kGmmaWarps * 32) gemm_mma_kernel(int8_t const* __restrict__ xt,
    int8_t const* __restrict__ wt, float const* __restrict__ b, Store store, ConvShape s, GmmaShape gs)
{
    constexpr int BM = 16 * MT;
    constexpr int kThreads = kGmmaWarps * 32;
    constexpr int kPitch = 32 * KC + 16; // 16-byte segments per row odd: conflict-free ldmatrix
    constexpr uint32_t kASlot = BM * kPitch;
    constexpr uint32_t kBSlot = kGmmaBN * kPitch;
    extern __shared__ __align__(16) unsigned char gmma_smem[];

    int32_t const ptile = static_cast<int32_t>(blockIdx.x);
    GmmaBlock const blk = gmma_block(s, gs, BM, wt);
    int32_t const n = blk.n;
    int32_t const g = blk.g;
    int32_t const mtile = blk.mtile;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    int32_t const lane = tid & 31;
    int32_t const warp = tid >> 5;
    int32_t const pixels = s.Ho * s.Wo;

    int8_t const* const wblk = blk.wblk;

    // The pixel whose reduction bytes this thread copies, and its input corner in xt.
    int32_t const p = ptile * kGmmaBN + tid;
    bool const p_ok = p < pixels;
    int32_t const oh = p_ok ? p / s.Wo : 0;
    int32_t const ow = p_ok ? p - oh * s.Wo : 0;
    int32_t const ih0 = oh * s.sh - s.pt;
    int32_t const iw0 = ow * s.sw - s.pl;
    int8_t const* const xcorner = xt
        + ((static_cast<int64_t>(n) * s.group + g) * s.H * s.W + static_cast<int64_t>(ih0) * s.W + iw0) * gs.Cp;
    uint32_t const a_smem = static_cast<uint32_t>(__cvta_generic_to_shared(gmma_smem));
    uint32_t const b_smem = a_smem + kGmmaStages * kASlot;
    uint32_t const b_mine = b_smem + tid * kPitch;

    // The copy cursor: the tap (row, column) and channel run of the next 8-byte run of the
    // reduction; stages are issued in order, so it only moves forward (no division per copy).
    int32_t cur_kh = 0;
    int32_t cur_kw = 0;
    int32_t cur_run = 0;
    auto const issue = [&](int32_t step, int32_t slot) {
        constexpr int kACopies = BM * 2 * KC; // 16-byte copies of the filter rows
        for (int32_t e = tid; e < kACopies; e += kThreads)
        {
            int32_t const row = e / (2 * KC);
            int32_t const seg = e - row * (2 * KC);
            cp_async_s<16>(a_smem + slot * kASlot + row * kPitch + seg * 16,
                wblk + static_cast<int64_t>(row) * gs.Rp + step * (32 * KC) + seg * 16);
        }
        uint32_t const dst = b_mine + slot * kBSlot;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
        {
#pragma unroll
            for (int j = 0; j < (WIDE ? 1 : 4); ++j)
            {
                // a padding tap (past kH rows) fails the row test
                int32_t const dy = cur_kh < s.kH ? cur_kh * s.dh : s.H - ih0;
                int32_t const dx = cur_kw * s.dw;
                bool const ok = p_ok && static_cast<uint32_t>(ih0 + dy) < static_cast<uint32_t>(s.H)
                    && static_cast<uint32_t>(iw0 + dx) < static_cast<uint32_t>(s.W);
                int8_t const* const src = ok ? xcorner + (static_cast<int64_t>(dy) * s.W + dx) * gs.Cp + cur_run * 8 : xt;
                cur_run += WIDE ? 4 : 1;
                if (cur_run == gs.runs)
                {
                    cur_run = 0;
                    cur_kw += 1;
                    if (cur_kw == s.kW)
                    {
                        cur_kw = 0;
                        cur_kh += 1;
                    }
                }
                if constexpr (WIDE)
                {
                    cp_async_zfill<16>(dst + kc * 32, src, ok ? 16U : 0U);
                    cp_async_zfill<16>(dst + kc * 32 + 16, ok ? src + 16 : xt, ok ? 16U : 0U);
                }
                else
                {
                    cp_async_zfill<8>(dst + kc * 32 + 8 * j, src, ok ? 8U : 0U);
                }
            }
        }
    };

    GmmaAcc<MT> acc;
    gmma_zero(acc);

#pragma unroll
    for (int st = 0; st < kGmmaStages - 1; ++st)
    {
        if (st < gs.steps)
        {
            issue(st, st);
        }
        cp_async_commit();
    }
    // ldmatrix row addresses: A (16 rows x 32 bytes per m16 tile): matrices rows 0-7 / 8-15 x
    // bytes 0-15 / 16-31 in fragment order a0..a3; B (two n8 tiles x 32 bytes): tile nt bytes
    // 0-15, 16-31, then tile nt + 1.
    uint32_t const a_lane = static_cast<uint32_t>(((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + (lane >> 4) * 16);
    uint32_t const b_lane
        = static_cast<uint32_t>((warp * 32 + (lane & 7) + (lane >> 4) * 8) * kPitch + ((lane >> 3) & 1) * 16);
    for (int32_t step = 0; step < gs.steps; ++step)
    {
        cp_async_wait<kGmmaStages - 2>();
        __syncthreads(); // this step's copies have landed everywhere; the slot refilled below is free
        int32_t const ahead = step + kGmmaStages - 1;
        if (ahead < gs.steps)
        {
            issue(ahead, ahead % kGmmaStages);
        }
        cp_async_commit();
        int32_t const slot = step % kGmmaStages;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
        {
            gmma_step(acc, a_smem + slot * kASlot + a_lane + kc * 32, kPitch,
                b_smem + slot * kBSlot + b_lane + kc * 32, b_smem + slot * kBSlot + b_lane + 16 * kPitch + kc * 32);
        }
    }
    cp_async_wait<0>();
    int32_t const first = ptile * kGmmaBN;
    gmma_epilogue(acc, store, b, s, n, g, mtile * BM, first, pixels - first);
}

// The patch kernel: a block computes BM output channels of `rows` whole output rows (rows * Wo
// <= 128 pixels, 4 warps of 32) of one image and (merged) group. Per chunk of 32 channels it
// stages, by cp.async two deep, the filters of all taps (BM rows of taps * 32 bytes) and the
// input patch those rows read (pr x pc pixels of 32 bytes, pitch 48, zero-filled outside the
// image), and computes every tap from them: a lane's ldmatrix row address is its pixel's corner in
// the patch plus the tap's offset, so each input byte comes from L2 once per block instead of
// once per tap. Results and epilogue as gemm_mma_kernel.
constexpr int kPatchPitch = 48; // bytes per patch pixel: 32 channels, padded (conflict-free ldmatrix at stride 1)

template <int MT, class Store>
__global__ void __launch_bounds__(kGmmaWarps * 32) gemm_mma_patch_kernel(int8_t const* __restrict__ xt,
    int8_t const* __restrict__ wt, float const* __restrict__ b, Store store, ConvShape s, GmmaShape gs)
{
    constexpr int BM = 16 * MT;
    constexpr int kThreads = kGmmaWarps * 32;
    extern __shared__ __align__(16) unsigned char gmma_smem[];
    int32_t const a_pitch = gs.taps * 32 + 16; // odd number of 16-byte segments: conflict-free
    uint32_t const a_bytes = static_cast<uint32_t>(BM * a_pitch);
    uint32_t const stage = a_bytes + static_cast<uint32_t>(gs.pr * gs.pc * kPatchPitch);

    int32_t const oh0 = static_cast<int32_t>(blockIdx.x) * gs.rows;
    GmmaBlock const blk = gmma_block(s, gs, BM, wt);
    int32_t const n = blk.n;
    int32_t const g = blk.g;
    int32_t const mtile = blk.mtile;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    int32_t const lane = tid & 31;
    int32_t const warp = tid >> 5;

    int8_t const* const wblk = blk.wblk;
    int8_t const* const xg = xt + (static_cast<int64_t>(n) * s.group + g) * s.H * s.W * gs.Cp;
    int32_t const ih_first = oh0 * s.sh - s.pt;
    uint32_t const smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(gmma_smem));

    // This thread's copies, walked without division: filter segments tid, tid + 128, ... of
    // BM rows x 2 * taps segments, and patch pixels tid / 2, tid / 2 + 64, ... (half tid % 2).
    int32_t const asegs = gs.taps * 2;
    int32_t const a_drow = kThreads / asegs;
    int32_t const a_dseg = kThreads - a_drow * asegs;
    int32_t const p_drow = (kThreads / 2) / gs.pc;
    int32_t const p_dcol = (kThreads / 2) - p_drow * gs.pc;
    int32_t const half = tid & 1;
    auto const issue = [&](int32_t chunk, int32_t slot) {
        uint32_t const sa = smem0 + static_cast<uint32_t>(slot) * stage;
        uint32_t const sp = sa + a_bytes;
        int32_t row = tid / asegs;
        int32_t seg = tid - row * asegs;
        int8_t const* const wchunk = wblk + chunk * gs.taps * 32;
        while (row < BM)
        {
            cp_async_s<16>(sa + row * a_pitch + seg * 16, wchunk + static_cast<int64_t>(row) * gs.Rp + seg * 16);
            row += a_drow;
            seg += a_dseg;
            if (seg >= asegs)
            {
                seg -= asegs;
                row += 1;
            }
        }
        int32_t pix = tid >> 1;
        int32_t prow = pix / gs.pc;
        int32_t pcol = pix - prow * gs.pc;
        int8_t const* const xchunk = xg + chunk * 32 + half * 16;
        while (prow < gs.pr)
        {
            int32_t const ih = ih_first + prow;
            int32_t const iw = pcol - s.pl;
            bool const ok = static_cast<uint32_t>(ih) < static_cast<uint32_t>(s.H)
                && static_cast<uint32_t>(iw) < static_cast<uint32_t>(s.W);
            int8_t const* const src = ok ? xchunk + (static_cast<int64_t>(ih) * s.W + iw) * gs.Cp : xt;
            cp_async_zfill<16>(sp + (prow * gs.pc + pcol) * kPatchPitch + half * 16, src, ok ? 16U : 0U);
            prow += p_drow;
            pcol += p_dcol;
            if (pcol >= gs.pc)
            {
                pcol -= gs.pc;
                prow += 1;
            }
        }
    };

    GmmaAcc<MT> acc;
    gmma_zero(acc);
    // ldmatrix rows. A as in gemm_mma_kernel. B: lane's pixel (block-local, rows x Wo flattened)
    // in each n8 tile pair; a pixel past the block's rows reads pixel 0's corner (discarded).
    uint32_t const a_lane = static_cast<uint32_t>(((lane & 7) + ((lane >> 3) & 1) * 8) * a_pitch + (lane >> 4) * 16);
    int32_t const valid = min(gs.rows, s.Ho - oh0) * s.Wo;
    uint32_t b_lane[2];
#pragma unroll
    for (int np = 0; np < 2; ++np)
    {
        int32_t const pl = warp * 32 + np * 16 + (lane & 7) + (lane >> 4) * 8;
        int32_t const r = pl < valid ? pl / s.Wo : 0;
        int32_t const c = pl < valid ? pl - r * s.Wo : 0;
        b_lane[np] = static_cast<uint32_t>((r * s.sh * gs.pc + c * s.sw) * kPatchPitch + ((lane >> 3) & 1) * 16);
    }

    issue(0, 0);
    cp_async_commit();
    for (int32_t chunk = 0; chunk < gs.chunks; ++chunk)
    {
        if (chunk + 1 < gs.chunks)
        {
            issue(chunk + 1, (chunk + 1) & 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); // this chunk's filters and patch have landed everywhere
        uint32_t const sa = smem0 + static_cast<uint32_t>(chunk & 1) * stage;
        uint32_t const sp = sa + a_bytes;
        for (int32_t kh = 0; kh < s.kH; ++kh)
        {
            for (int32_t kw = 0; kw < s.kW; ++kw)
            {
                int32_t const tap = kh * s.kW + kw;
                uint32_t const toff = static_cast<uint32_t>((kh * s.dh * gs.pc + kw * s.dw) * kPatchPitch);
                gmma_step(acc, sa + a_lane + tap * 32, a_pitch, sp + b_lane[0] + toff, sp + b_lane[1] + toff);
            }
        }
        __syncthreads(); // everyone is done with this slot before it is refilled
    }

    gmma_epilogue(acc, store, b, s, n, g, mtile * BM, oh0 * s.Wo, valid);
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

// depthwise_rows: the shapes it takes (see its kernel), independent of the element type.
bool rows_shape_ok(ConvShape const& s)
{
    return s.Cg == 1 && s.kH == s.kW && (s.kH == 3 || s.kH == 5 || s.kH == 7) && s.sh == s.sw
        && (s.sh == 1 || s.sh == 2) && s.dh == 1 && s.dw == 1 && s.pl == s.kH / 2 && s.W % 4 == 0;
}

int64_t round_up(int64_t v, int64_t m)
{
    return (v + m - 1) / m * m;
}

int64_t pl_rows(int64_t ty, int64_t r, int64_t stride, int64_t ks)
{
    return (ty * r - 1) * stride + ks;
}

// The planes (N * K) of a depthwise_rows shape, or 0 when the shape is not one or has too many
// planes for the kernels' int32 plane indices (shared by the rows and the tensor-core plans).
int64_t rows_planes(ConvShape const& s)
{
    int64_t const planes = static_cast<int64_t>(s.N) * s.K;
    return rows_shape_ok(s) && planes >= 1 && planes <= INT32_MAX / 2 ? planes : 0;
}

// Block shape of depthwise_rows: all output rows of a plane in one block when two buffers of its
// input rows fit in 48 KiB of shared memory (else bands of TY * R rows, up to 96 KiB for
// wide planes), then as many planes per block as threads and rows_ppb_smem() allow while leaving
// enough blocks to fill the GPU; with rows_full_warps(), of those plane counts the one whose block
// wastes the fewest lanes in its last warp (e.g. 4 planes of 56 threads: 7 full warps, not 2
// planes in 3.5 warps).
// elem: the element size (shared memory holds the input type); load_bytes: copy width.
bool plan_rows(ConvShape const& s, int elem, int load_bytes, RowsPlan* out)
{
    int64_t const planes = rows_planes(s);
    if (planes == 0)
    {
        return false;
    }
    int const ks = s.kH;
    int const st = s.sh;
    int64_t const R = rows_r(elem, ks);
    int64_t const V = rows_v(elem, ks);
    int64_t const max_threads = rows_max_threads(elem, ks);
    int64_t const TX = ceil_div(s.Wo, V);
    if (TX > max_threads)
    {
        return false;
    }
    int64_t const lpad = 16 / elem;
    int64_t const hi = rows_hi_word(ks, st, elem == 1, static_cast<int>(V));
    int64_t const need = lpad + (TX - 1) * V * st + 4 * (hi + 1);
    int64_t const P = round_up(std::max<int64_t>(need, lpad + s.W), 16 / elem);
    auto slice = [&](int64_t ty) {
        int64_t const nrs = (ty * R - 1) * st + ks;
        return round_up(nrs * P * elem, 16);
    };
    int64_t TY = std::min<int64_t>({ceil_div(s.Ho, R), max_threads / TX, kRowsMaxTY});
    while (TY > 1 && 2 * slice(TY) > kSmemBudget)
    {
        --TY;
    }
    if (TY < 1 || 2 * slice(TY) > kRowsSmemMax)
    {
        return false;
    }
    int64_t const TXY = TX * TY;
    int64_t const NV = static_cast<int64_t>(s.W) * elem / load_bytes; // copies per row (> TXY: several per thread)
    if (NV < 1 || (static_cast<int64_t>(s.W) * elem) % load_bytes != 0)
    {
        return false; // the loads must tile the row exactly
    }
    int64_t const bands = ceil_div(s.Ho, TY * R);
    if (bands > 65535) // gridDim.y
    {
        return false;
    }
    // Enough stages that kRowsAheadBytes per plane slot are in flight (small planes, narrow types).
    int64_t const plane_bytes = std::min<int64_t>(pl_rows(TY, R, st, ks), s.H) * s.W * elem;
    int64_t const ahead = ks == 3 ? kRowsAheadBytes3x3 : kRowsAheadBytes;
    int64_t stages = std::min<int64_t>(4, 1 + ceil_div(ahead, std::max<int64_t>(plane_bytes, 1)));
    while (stages > 2 && stages * slice(TY) > kRowsSmemMax)
    {
        --stages;
    }
    int64_t const ppb_smem = std::max<int64_t>(rows_ppb_smem(elem, ks), kSmemBudget);
    int64_t PPB = std::max<int64_t>(1, std::min<int64_t>({max_threads / TXY, ppb_smem / (stages * slice(TY)), planes}));
    while (PPB > 1 && (planes + PPB - 1) / PPB * bands < kRowsMinBlocks)
    {
        --PPB;
    }
    if (rows_full_warps(elem, ks))
    {
        // lanes used / lanes of the warps started, as a fraction p / q compared exactly
        int64_t best = PPB;
        for (int64_t c = PPB - 1; c >= 1; --c)
        {
            int64_t const tc = c * TXY;
            int64_t const tb = best * TXY;
            if (tc * round_up(tb, 32) > tb * round_up(tc, 32))
            {
                best = c;
            }
        }
        PPB = best;
    }
    RowsPlan pl{};
    pl.TX = static_cast<int32_t>(TX);
    pl.TY = static_cast<int32_t>(TY);
    pl.TXY = static_cast<int32_t>(TXY);
    pl.PPB = static_cast<int32_t>(PPB);
    pl.groups = static_cast<int32_t>((planes + PPB - 1) / PPB);
    pl.bands = static_cast<int32_t>(bands);
    pl.NRS = static_cast<int32_t>((TY * R - 1) * st + ks);
    pl.P = static_cast<int32_t>(P);
    pl.slice_bytes = static_cast<int32_t>(slice(TY));
    pl.NV = static_cast<int32_t>(NV);
    pl.rstep = static_cast<int32_t>(std::max<int64_t>(1, TXY / NV));
    pl.cstep = static_cast<int32_t>(std::min<int64_t>(NV, TXY));
    pl.load_bytes = load_bytes;
    pl.out_chunk = 1; // set by launch_rows() from the output pointer
    pl.planes = static_cast<int32_t>(planes);
    pl.stages = static_cast<int32_t>(stages);
    rows_div_magic(s.K, &pl.kdiv_m, &pl.kdiv_s);
    *out = pl;
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
        // 16-byte aligned tensors assumed, as CUDA allocations are (see run()); the plans differ
        // per element type (outputs per thread, threads per block), so all three must exist.
        // Loads as wide as the row allows (launch_rows also needs x aligned to them).
        auto const load = [&](int elem) {
            int64_t const row = static_cast<int64_t>(s.W) * elem;
            return row % 16 == 0 ? 16 : row % 8 == 0 ? 8 : 4;
        };
        RowsPlan rows{};
        if (plan_rows(s, 4, load(4), &rows) && plan_rows(s, 2, load(2), &rows) && plan_rows(s, 1, load(1), &rows))
        {
            return DWCONV2D_PATH_DEPTHWISE_ROWS;
        }
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

template <int KS, int S, class TIn, class TB, class Store>
int launch_rows_ks(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s,
    RowsPlan const& pl, cudaStream_t stream)
{
    auto kernel = depthwise_rows_kernel<KS, S, TIn, TB, Store>;
    int const threads = pl.PPB * pl.TXY;
    size_t const smem = static_cast<size_t>(pl.stages) * pl.PPB * pl.slice_bytes;
    // Persistent blocks: as many as fit on the GPU at once (per band), each looping over groups of
    // planes. Without the device's numbers, one block per group.
    if (smem > static_cast<size_t>(kSmemBudget))
    {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    int64_t blocks = pl.groups;
    int device = 0;
    int sms = 0;
    int per_sm = 0;
    if (cudaGetDevice(&device) == cudaSuccess
        && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess
        && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) == cudaSuccess
        && sms > 0 && per_sm > 0)
    {
        blocks = std::min<int64_t>(pl.groups, std::max<int64_t>(1, int64_t{sms} * per_sm / pl.bands));
    }
    (void) cudaGetLastError(); // a failed query above must not be reported as the launch's error
    kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(pl.bands)), static_cast<unsigned>(threads),
        smem, stream>>>(x, w, b, store, s, pl);
    return static_cast<int>(cudaGetLastError());
}

// The store width of depthwise_rows (see store_row_bytes): the widest of rows_wide_chunk(seg), 4
// and the element size that divides the row pitch and the output pointer's alignment, so that
// every thread's row segment, the last one included, is whole chunks.
int rows_out_chunk(int seg_bytes, int out_elem, int32_t wo, void const* y)
{
    auto const ya = reinterpret_cast<uintptr_t>(y);
    int64_t const pitch = static_cast<int64_t>(wo) * out_elem;
    for (int ch : {rows_wide_chunk(seg_bytes), 4})
    {
        if (ch > out_elem && pitch % ch == 0 && ya % ch == 0)
        {
            return ch;
        }
    }
    return out_elem;
}

// The widest cp.async load (16, 8 or 4 bytes) that both an input row's pitch and x's address
// allow; 0 when none does (the caller then takes another path).
inline int widest_row_load(ConvShape const& s, int in_elem, void const* x)
{
    auto const xa = reinterpret_cast<uintptr_t>(x);
    for (int lb : {16, 8, 4})
    {
        if ((static_cast<int64_t>(s.W) * in_elem) % lb == 0 && xa % lb == 0)
        {
            return lb;
        }
    }
    return 0;
}

// The (kernel size, stride) pairs that depthwise_rows and depthwise_mma are instantiated for, one
// switch for both launchers: calls launch(ks, st) with std::integral_constant arguments (their
// ::value the template arguments) for a square 3x3/5x5/7x7 kernel of stride 1 or 2, and returns
// false (launch not called) for any other shape.
template <int V>
using IntC = std::integral_constant<int, V>;

template <class Launch>
bool dispatch_ks_stride(ConvShape const& s, Launch&& launch)
{
    switch (s.kH * 10 + s.sh)
    {
    case 31: launch(IntC<3>{}, IntC<1>{}); return true;
    case 32: launch(IntC<3>{}, IntC<2>{}); return true;
    case 51: launch(IntC<5>{}, IntC<1>{}); return true;
    case 52: launch(IntC<5>{}, IntC<2>{}); return true;
    case 71: launch(IntC<7>{}, IntC<1>{}); return true;
    case 72: launch(IntC<7>{}, IntC<2>{}); return true;
    default: return false;
    }
}

// Plans and launches depthwise_rows for these pointers; false (nothing launched) when the shape or
// the pointers' alignment does not allow it, and the caller takes the tiled path.
template <class TIn, class TB, class Store>
bool launch_rows(TIn const* x, TIn const* w, TB const* b, Store store, void const* y, int out_elem,
    ConvShape const& s, cudaStream_t stream, int* status)
{
    if (!rows_shape_ok(s))
    {
        return false;
    }
    constexpr int in_elem = static_cast<int>(sizeof(TIn));
    int const load_bytes = widest_row_load(s, in_elem, x);
    RowsPlan pl{};
    if (load_bytes == 0 || !plan_rows(s, in_elem, load_bytes, &pl))
    {
        return false;
    }
    pl.out_chunk = rows_out_chunk(rows_v(in_elem, s.kH) * out_elem, out_elem, s.Wo, y);
    return dispatch_ks_stride(s, [&](auto ks, auto st) {
        *status = launch_rows_ks<decltype(ks)::value, decltype(st)::value>(x, w, b, store, s, pl, stream);
    });
}

// depthwise_global's output-row chunks per plane, and the bytes of its segment loads.
int64_t global_chunks(ConvShape const& s, int elem)
{
    return ceil_div(static_cast<int64_t>(s.Ho), int64_t{global_r(elem, s.kH)});
}
int global_load_bytes(ConvShape const& s, int elem)
{
    return std::min(global_v(elem, s.kH) * s.sh * elem, 16);
}

// depthwise_global: whether it serves a shape with elements of `elem` bytes: a depthwise_rows shape
// whose output rows split into whole V-wide segments within the input row (Wo % V == 0,
// Wo * S <= W), whose row pitch allows the segment loads, and whose threads fit int32.
// QUANTBENCH_DWCONV_GLOBAL=0 (read per call) turns it off.
bool global_shape_ok(ConvShape const& s, int elem)
{
    char const* const env = std::getenv("QUANTBENCH_DWCONV_GLOBAL");
    if (env != nullptr && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0))
    {
        return false;
    }
    int64_t const planes = rows_planes(s);
    int const v = global_v(elem, s.kH);
    if (planes == 0 || s.Wo % v != 0 || static_cast<int64_t>(s.Wo) * s.sh > s.W
        || (static_cast<int64_t>(s.W) * elem) % global_load_bytes(s, elem) != 0)
    {
        return false;
    }
    return planes * global_chunks(s, elem) * (s.Wo / v) <= INT32_MAX - kGlobalThreads;
}

// The plan for these pointers; false when the shape is not served (global_shape_ok), x is not
// aligned for the segment and quad loads, or y not for one store per segment.
bool plan_global(ConvShape const& s, int elem, void const* x, void const* y, int out_elem, GlobalPlan* out)
{
    int const v = global_v(elem, s.kH);
    auto const xa = reinterpret_cast<uintptr_t>(x);
    if (!global_shape_ok(s, elem) || xa % global_load_bytes(s, elem) != 0 || xa % std::min(4 * elem, 16) != 0)
    {
        return false;
    }
    int64_t const chunks = global_chunks(s, elem);
    int64_t const tx = s.Wo / v;
    GlobalPlan pl{};
    pl.total = static_cast<int32_t>(rows_planes(s) * chunks * tx);
    pl.per_plane = static_cast<int32_t>(chunks * tx);
    pl.tx = static_cast<int32_t>(tx);
    rows_div_magic(pl.per_plane, &pl.plane_m, &pl.plane_s);
    rows_div_magic(pl.tx, &pl.tx_m, &pl.tx_s);
    rows_div_magic(s.K, &pl.k_m, &pl.k_s);
    if (rows_out_chunk(v * out_elem, out_elem, s.Wo, y) != rows_wide_chunk(v * out_elem))
    {
        return false; // the kernel stores whole segments at once (rows_wide_chunk, kOutChunk)
    }
    *out = pl;
    return true;
}

// Plans and launches depthwise_global for these pointers; false (nothing launched) when it does
// not apply, and the caller takes depthwise_rows.
template <class TIn, class TB, class Store>
bool launch_global(TIn const* x, TIn const* w, TB const* b, Store store, void const* y, int out_elem,
    ConvShape const& s, cudaStream_t stream, int* status)
{
    GlobalPlan pl{};
    if (!plan_global(s, static_cast<int>(sizeof(TIn)), x, y, out_elem, &pl))
    {
        return false;
    }
    auto const blocks = static_cast<unsigned>(ceil_div(static_cast<int64_t>(pl.total), int64_t{kGlobalThreads}));
    return dispatch_ks_stride(s, [&](auto ks, auto st) {
        depthwise_global_kernel<decltype(ks)::value, decltype(st)::value, TIn, TB, Store>
            <<<blocks, kGlobalThreads, 0, stream>>>(x, w, b, store, s, pl);
        *status = static_cast<int>(cudaGetLastError());
    });
}

// depthwise_mma: the plan for element size `elem` (2 or 1) with `load_bytes` copies; false when
// the shape is not a depthwise_rows shape or a plane does not fit kMmaMaxSlot.
bool plan_mma(ConvShape const& s, int elem, int load_bytes, MmaPlan* out)
{
    int64_t const planes = rows_planes(s);
    if (planes == 0 || elem == 4)
    {
        return false;
    }
    int const ks = s.kH;
    int const st = s.sh;
    int64_t const lpad = 16 / elem;
    int64_t const cw = mma_cw(st);
    int64_t const last_col0 = std::max<int64_t>(0, (s.Wo - cw + 3) / 4 * 4);
    int64_t const need = std::max<int64_t>(lpad + last_col0 * st - mma_off(elem, ks) + kMmaKC, lpad + s.W) * elem;
    int64_t P = round_up(need, 16);
    while ((P / 4) % 8 != 4) // 8 rows x 4 words of an A fragment in distinct banks (stride 1)
    {
        P += 16;
    }
    int64_t const NRS = (std::max<int64_t>(s.Ho, 16) - 1) * st + ks;
    int64_t const slot = NRS * P;
    if (slot > kMmaMaxSlot || (static_cast<int64_t>(s.W) * elem) % load_bytes != 0)
    {
        return false;
    }
    // Enough planes in flight per warp (kMmaAheadBytes where that fits in 2..4 buffers).
    int64_t const plane_bytes = static_cast<int64_t>(s.H) * s.W * elem;
    int64_t stages
        = std::min<int64_t>(4, 1 + ceil_div(int64_t{kMmaAheadBytes}, std::max<int64_t>(plane_bytes, 1)));
    stages = std::max<int64_t>(stages, 2);
    int64_t const zb = mma_zrow_bytes(elem, ks, st);
    while (stages > 2 && kMmaWarps * (stages * slot + zb) > kRowsSmemMax)
    {
        --stages;
    }
    if (kMmaWarps * (stages * slot + zb) > kRowsSmemMax)
    {
        return false;
    }
    MmaPlan pl{};
    pl.planes = static_cast<int32_t>(planes);
    pl.stages = static_cast<int32_t>(stages);
    pl.NRS = static_cast<int32_t>(NRS);
    pl.P = static_cast<int32_t>(P);
    pl.slot_bytes = static_cast<int32_t>(slot);
    pl.warp_bytes = static_cast<int32_t>(stages * slot + zb);
    pl.load_bytes = load_bytes;
    pl.NV = static_cast<int32_t>(static_cast<int64_t>(s.W) * elem / load_bytes);
    pl.out_chunk = 1;
    *out = pl;
    return true;
}

template <int KS, int S, class TIn, class TB, class Store>
int launch_mma_ks(TIn const* x, TIn const* w, TB const* b, Store store, ConvShape const& s, MmaPlan const& pl,
    cudaStream_t stream)
{
    auto kernel = depthwise_mma_kernel<KS, S, TIn, TB, Store>;
    int const threads = kMmaWarps * 32;
    size_t const smem = static_cast<size_t>(kMmaWarps) * pl.warp_bytes;
    if (smem > static_cast<size_t>(kSmemBudget))
    {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    int64_t const wanted = ceil_div(static_cast<int64_t>(pl.planes), int64_t{kMmaWarps});
    int64_t blocks = wanted;
    int device = 0;
    int sms = 0;
    int per_sm = 0;
    if (cudaGetDevice(&device) == cudaSuccess
        && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess
        && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) == cudaSuccess
        && sms > 0 && per_sm > 0)
    {
        blocks = std::min<int64_t>(wanted, int64_t{sms} * per_sm);
    }
    (void) cudaGetLastError(); // a failed query above must not be reported as the launch's error
    kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), smem, stream>>>(x, w, b, store, s, pl);
    return static_cast<int>(cudaGetLastError());
}

// Plans and launches depthwise_mma (INT8, FP16) for these pointers; false (nothing launched) when
// it does not apply, and the caller takes depthwise_rows.
template <class TIn, class TB, class Store>
bool launch_mma(TIn const* x, TIn const* w, TB const* b, Store store, void const* y, int out_elem,
    ConvShape const& s, cudaStream_t stream, int* status)
{
    constexpr int in_elem = static_cast<int>(sizeof(TIn));
    if constexpr (in_elem == 4)
    {
        return false;
    }
    else
    {
        if (!rows_shape_ok(s))
        {
            return false;
        }
        int const load_bytes = widest_row_load(s, in_elem, x);
        int device = 0;
        int major = 0;
        bool const sm80 = cudaGetDevice(&device) == cudaSuccess
            && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8;
        (void) cudaGetLastError();
        MmaPlan pl{};
        if (!sm80 || load_bytes == 0 || !plan_mma(s, in_elem, load_bytes, &pl))
        {
            return false;
        }
        pl.out_chunk = rows_out_chunk(4 * out_elem, out_elem, s.Wo, y);
        return dispatch_ks_stride(s, [&](auto ks, auto st) {
            *status = launch_mma_ks<decltype(ks)::value, decltype(st)::value>(x, w, b, store, s, pl, stream);
        });
    }
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

// ---------------------------------------------------------------------------------------------
// cuDNN path (grouped and dense shapes), loaded at run time
// ---------------------------------------------------------------------------------------------
//
// The dispatch table below says, per shape class and precision, whether cuDNN or our kernels run;
// it comes from the H200 timings in README.md (N = 32; cuDNN through torch, TF32 off):
//
//   class                          | f32                     | f16                          | int8
//   depthwise (C/group == 1)       | ours (2.3-7.4x cuDNN)   | ours (3.5-8.6x cuDNN)        | ours
//   grouped/dense (C/group > 1),   | cuDNN (ours 0.19-0.61x) | cuDNN (ours 0.06-0.17x)      | ours
//   symmetric pads                 |                         |                              |
//
// (FP16 with a bias: only the fused / scratch plans, which round once; cuDNN's beta blend rounds
// twice, see cudnn_preferred.)
//
// cuDNN is opened with dlopen (a libcudnn.so.9/.8 already in the process, e.g. torch's, else
// libcudnn.so.9 or libcudnn.so from the search path; $QUANTBENCH_DWCONV_CUDNN may name a file, or
// be 0 to disable it), so the library builds and runs without it. Our kernels run when it is
// absent, when the shape has asymmetric pads, when no plan can be made, or when a plan would have
// to be made while the stream is being captured into a CUDA graph (same results within the
// stated tolerances). The few prototypes and constants used (legacy convolution API and backend
// graph API) are declared here (the same in cuDNN 8.x and 9.x). Planning, once per shape, bias,
// alignment and device (cached, process-wide): the backend API's heuristics (instant, then
// fallback) give engine configurations; those whose numerical notes say anything but a plain
// float sum of products are dropped (FFT, Winograd, down-converted inputs, reduced-precision
// reduction, and tensor cores for FP32, i.e. TF32; FP16 keeps tensor cores with FP32
// accumulation), as are legacy algorithms other than the GEMM-like and direct ones (legacy FP32
// with CUDNN_FMA_MATH). Every candidate (the backend's plans and legacy Find's best) is timed on
// the caller's own buffers and the fastest is kept: the measured half of the dispatch table. The
// bias is written into y first and added by the convolution's beta = 1 blend (FP32: two float
// roundings, within our FP32 bound; FP16: cuDNN rounds the convolution to FP16 before the blend,
// two FP16 roundings, hence FP16 with a bias takes the fused / scratch plans instead, see
// make_plan and cudnn_preferred). At most
// kCudnnMaxWorkspace bytes of workspace.
// $QUANTBENCH_DWCONV_DEBUG (set to anything) prints each plan and why cuDNN was not used.
// dwconv2d_last_path() reports which path the calling thread's last forward took.

thread_local int g_last_path = DWCONV2D_PATH_INVALID;
std::atomic<int> g_cudnn_mode{-1}; // -1: not yet read from the environment
std::atomic<int> g_mma_mode{-1};   // DWCONV2D_MMA_OFF / _ON / _AUTO; -1: not yet read ($QUANTBENCH_DWCONV_MMA)

constexpr size_t kCudnnMaxWorkspace = size_t{256} << 20;

namespace cudnn
{
enum : int
{
    kSuccess = 0,
    kFloat = 0,
    kHalf = 2,
    kNCHW = 0,
    kCrossCorrelation = 1,
    kFmaMath = 3,
    kAllowConversion = 2,
    kAlgoCount = 8,
};
// CUDNN_CONVOLUTION_FWD_ALGO_*: IMPLICIT_GEMM 0, IMPLICIT_PRECOMP_GEMM 1, GEMM 2, DIRECT 3, FFT 4,
// FFT_TILING 5, WINOGRAD 6, WINOGRAD_NONFUSED 7.
// Only 0-3 (a plain sum of products): with Winograd (6, 7) allowed, the dense 3x3 C=128 case came
// out 1.0e-5 of max|y| away from the reference (H200), at our FP32 bound.
bool algo_allowed(int algo)
{
    static int const mask = [] {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN_ALGOS"); // tuning only: a bit per algo
        return env != nullptr ? static_cast<int>(std::strtol(env, nullptr, 0)) : 0x0F; // 0-3
    }();
    return algo >= 0 && algo < kAlgoCount && ((mask >> algo) & 1) != 0;
}

bool debug()
{
    static bool const on = std::getenv("QUANTBENCH_DWCONV_DEBUG") != nullptr;
    return on;
}

struct AlgoPerf // cudnnConvolutionFwdAlgoPerf_t (cuDNN 8 and 9)
{
    int algo;
    int status;
    float time;
    size_t memory;
    int determinism;
    int math_type;
    int reserved[3];
};

using Desc = void*;
struct Api
{
    size_t version = 0;
    size_t (*GetVersion)() = nullptr;
    int (*Create)(Desc*) = nullptr;
    int (*SetStream)(Desc, cudaStream_t) = nullptr;
    int (*CreateTensorDescriptor)(Desc*) = nullptr;
    int (*SetTensor4dDescriptor)(Desc, int, int, int, int, int, int) = nullptr;
    int (*DestroyTensorDescriptor)(Desc) = nullptr;
    int (*CreateFilterDescriptor)(Desc*) = nullptr;
    int (*SetFilter4dDescriptor)(Desc, int, int, int, int, int, int) = nullptr;
    int (*DestroyFilterDescriptor)(Desc) = nullptr;
    int (*CreateConvolutionDescriptor)(Desc*) = nullptr;
    int (*SetConvolution2dDescriptor)(Desc, int, int, int, int, int, int, int, int) = nullptr;
    int (*DestroyConvolutionDescriptor)(Desc) = nullptr;
    int (*SetConvolutionGroupCount)(Desc, int) = nullptr;
    int (*SetConvolutionMathType)(Desc, int) = nullptr;
    int (*GetConvolution2dForwardOutputDim)(Desc, Desc, Desc, int*, int*, int*, int*) = nullptr;
    int (*FindConvolutionForwardAlgorithm)(Desc, Desc, Desc, Desc, Desc, int, int*, AlgoPerf*) = nullptr;
    int (*ConvolutionForward)(Desc, void const*, Desc, void const*, Desc, void const*, Desc, int, void*, size_t,
        void const*, Desc, void*)
        = nullptr;
    // Backend (graph) API; optional (all null when a symbol is missing).
    int (*BackendCreateDescriptor)(int, Desc*) = nullptr;
    int (*BackendDestroyDescriptor)(Desc) = nullptr;
    int (*BackendSetAttribute)(Desc, int, int, int64_t, void const*) = nullptr;
    int (*BackendGetAttribute)(Desc, int, int, int64_t, int64_t*, void*) = nullptr;
    int (*BackendFinalize)(Desc) = nullptr;
    int (*BackendExecute)(Desc, Desc, Desc) = nullptr;
};

void* open_library(char const* name)
{
    return dlopen(name, RTLD_NOW | RTLD_LOCAL);
}

template <class F>
bool bind(void* const (&libs)[4], char const* name, F*& fn)
{
    for (void* lib : libs)
    {
        if (lib != nullptr)
        {
            if (void* sym = dlsym(lib, name))
            {
                fn = reinterpret_cast<F*>(sym);
                return true;
            }
        }
    }
    return false;
}

Api const* load()
{
    char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN");
    std::string const choice = env != nullptr ? env : "";
    if (choice == "0" || choice == "off")
    {
        return nullptr;
    }
    void* main_lib = nullptr;
    if (choice.find('/') != std::string::npos)
    {
        main_lib = open_library(choice.c_str());
    }
    else
    {
        // One already in the process first (e.g. torch's), then the search path.
        for (char const* name : {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"})
        {
            main_lib = main_lib != nullptr ? main_lib : dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        }
        for (char const* name : {"libcudnn.so.9", "libcudnn.so"})
        {
            main_lib = main_lib != nullptr ? main_lib : open_library(name);
        }
    }
    if (main_lib == nullptr)
    {
        if (debug())
        {
            std::fprintf(stderr, "dwconv2d: cuDNN not loaded: %s\n", dlerror());
        }
        return nullptr;
    }
    // libcudnn.so.9 (and .8) export every legacy entry point. The sub-libraries are NOT opened by
    // name here: one found on the search path could belong to another cuDNN than the one already
    // loaded (e.g. by torch) and would then be picked up by that one's own lazy loading.
    void* const libs[4] = {main_lib, nullptr, nullptr, nullptr};
    auto* api = new Api();
    bool ok = bind(libs, "cudnnGetVersion", api->GetVersion) && bind(libs, "cudnnCreate", api->Create)
        && bind(libs, "cudnnSetStream", api->SetStream)
        && bind(libs, "cudnnCreateTensorDescriptor", api->CreateTensorDescriptor)
        && bind(libs, "cudnnSetTensor4dDescriptor", api->SetTensor4dDescriptor)
        && bind(libs, "cudnnDestroyTensorDescriptor", api->DestroyTensorDescriptor)
        && bind(libs, "cudnnCreateFilterDescriptor", api->CreateFilterDescriptor)
        && bind(libs, "cudnnSetFilter4dDescriptor", api->SetFilter4dDescriptor)
        && bind(libs, "cudnnDestroyFilterDescriptor", api->DestroyFilterDescriptor)
        && bind(libs, "cudnnCreateConvolutionDescriptor", api->CreateConvolutionDescriptor)
        && bind(libs, "cudnnSetConvolution2dDescriptor", api->SetConvolution2dDescriptor)
        && bind(libs, "cudnnDestroyConvolutionDescriptor", api->DestroyConvolutionDescriptor)
        && bind(libs, "cudnnSetConvolutionGroupCount", api->SetConvolutionGroupCount)
        && bind(libs, "cudnnSetConvolutionMathType", api->SetConvolutionMathType)
        && bind(libs, "cudnnGetConvolution2dForwardOutputDim", api->GetConvolution2dForwardOutputDim)
        && bind(libs, "cudnnFindConvolutionForwardAlgorithm", api->FindConvolutionForwardAlgorithm)
        && bind(libs, "cudnnConvolutionForward", api->ConvolutionForward);
    bool const backend = ok && bind(libs, "cudnnBackendCreateDescriptor", api->BackendCreateDescriptor)
        && bind(libs, "cudnnBackendDestroyDescriptor", api->BackendDestroyDescriptor)
        && bind(libs, "cudnnBackendSetAttribute", api->BackendSetAttribute)
        && bind(libs, "cudnnBackendGetAttribute", api->BackendGetAttribute)
        && bind(libs, "cudnnBackendFinalize", api->BackendFinalize)
        && bind(libs, "cudnnBackendExecute", api->BackendExecute);
    if (!backend)
    {
        api->BackendCreateDescriptor = nullptr; // legacy API only
    }
    if (ok)
    {
        api->version = api->GetVersion();
        ok = api->version >= 8000; // AlgoPerf's layout and these prototypes: cuDNN 8 and later
    }
    if (debug())
    {
        std::fprintf(stderr, "dwconv2d: cuDNN %s, version %zu\n", ok ? "loaded" : "unusable", api->version);
    }
    if (!ok)
    {
        delete api; // the libraries stay open: harmless, and other users may hold them
        return nullptr;
    }
    return api;
}

Api const* api()
{
    static Api const* const loaded = load(); // once, thread-safe
    return loaded;
}

// One handle per thread and device (a handle's stream is set before each call), never destroyed
// (destroying at thread or process exit can race the CUDA context's own teardown).
Desc thread_handle(int device, bool may_create)
{
    constexpr int kMaxDevices = 64;
    thread_local Desc handles[kMaxDevices] = {};
    if (device < 0 || device >= kMaxDevices)
    {
        return nullptr;
    }
    if (handles[device] == nullptr && may_create)
    {
        Desc h = nullptr;
        if (api()->Create(&h) != kSuccess)
        {
            return nullptr;
        }
        handles[device] = h;
    }
    return handles[device];
}

// Workspace per thread, device and stream (calls on different streams may overlap).
void* thread_workspace(int device, cudaStream_t stream, size_t bytes, bool may_allocate)
{
    struct Entry
    {
        int device;
        cudaStream_t stream;
        void* ptr;
        size_t bytes;
    };
    constexpr int kEntries = 8;
    thread_local Entry entries[kEntries] = {};
    thread_local int used = 0;
    Entry* hit = nullptr;
    for (int i = 0; i < used; ++i)
    {
        if (entries[i].device == device && entries[i].stream == stream)
        {
            hit = &entries[i];
        }
    }
    if (hit != nullptr && hit->bytes >= bytes)
    {
        return hit->ptr;
    }
    if (!may_allocate)
    {
        return nullptr;
    }
    if (hit == nullptr)
    {
        if (used == kEntries)
        {
            // Reuse the oldest slot once the device is idle (its stream may be gone).
            if (cudaDeviceSynchronize() != cudaSuccess)
            {
                return nullptr;
            }
            cudaFree(entries[0].ptr);
            for (int i = 1; i < kEntries; ++i)
            {
                entries[i - 1] = entries[i];
            }
            used -= 1;
        }
        hit = &entries[used++];
        *hit = Entry{device, stream, nullptr, 0};
    }
    else if (hit->ptr != nullptr)
    {
        if (cudaStreamSynchronize(stream) != cudaSuccess)
        {
            return nullptr;
        }
        cudaFree(hit->ptr);
        hit->ptr = nullptr;
        hit->bytes = 0;
    }
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess)
    {
        cudaGetLastError(); // clear the sticky-free allocation error
        return nullptr;
    }
    hit->ptr = ptr;
    hit->bytes = bytes;
    return ptr;
}

// Workspace for one forward on `stream`: the per-thread cache above, or, while the stream is
// being captured into a CUDA graph, a stream-ordered allocation (a graph memory node; *async is
// set and the caller frees it with cudaFreeAsync after its launches). nullptr if allocation fails.
void* forward_workspace(int device, cudaStream_t stream, size_t bytes, bool capturing, bool* async)
{
    *async = false;
    if (!capturing)
    {
        return thread_workspace(device, stream, bytes, true);
    }
    void* ptr = nullptr;
    if (cudaMallocAsync(&ptr, bytes, stream) != cudaSuccess)
    {
        (void) cudaGetLastError();
        return nullptr;
    }
    *async = true;
    return ptr;
}

// Backend (graph) API constants (cudnn_graph.h / cudnn_backend.h of cuDNN 8.x and 9.x).
enum : int
{
    kTypeHandle = 0,
    kTypeDataType = 1,
    kTypeBoolean = 2,
    kTypeInt64 = 3,
    kTypeFloat = 4,
    kTypeVoidPtr = 6,
    kTypeConvMode = 7,
    kTypeHeurMode = 8,
    kTypeNumericalNote = 11,
    kTypePointwiseMode = 14,
    kTypeBackendDescriptor = 15,
    kTypeBehaviorNote = 19,
    kDescPointwise = 0,
    kDescConvolution = 1,
    kDescEngine = 2,
    kDescEngineCfg = 3,
    kDescEngineHeur = 4,
    kDescExecutionPlan = 5,
    kDescOpConvForward = 10,
    kDescOpPointwise = 13,
    kDescOpGraph = 15,
    kDescVariantPack = 16,
    kDescTensor = 17,
    kAttrPointwiseMode = 0,
    kAttrPointwiseMathPrec = 1,
    kPointwiseAdd = 0,
    kAttrConvCompType = 100,
    kAttrConvMode = 101,
    kAttrConvDilations = 102,
    kAttrConvFilterStrides = 103,
    kAttrConvPostPaddings = 104,
    kAttrConvPrePaddings = 105,
    kAttrConvSpatialDims = 106,
    kAttrHeurMode = 200,
    kAttrHeurOpGraph = 201,
    kAttrHeurResults = 202,
    kAttrCfgEngine = 300,
    kAttrPlanHandle = 400,
    kAttrPlanEngineCfg = 401,
    kAttrPlanWorkspaceSize = 402,
    kAttrOpConvAlpha = 700,
    kAttrOpConvBeta = 701,
    kAttrOpConvDesc = 702,
    kAttrOpConvW = 703,
    kAttrOpConvX = 704,
    kAttrOpConvY = 705,
    kAttrOpPointwiseDesc = 750,
    kAttrOpPointwiseX = 751,
    kAttrOpPointwiseB = 752,
    kAttrOpPointwiseY = 753,
    kAttrGraphHandle = 800,
    kAttrGraphOps = 801,
    kAttrTensorAlignment = 900,
    kAttrTensorDataType = 901,
    kAttrTensorDims = 902,
    kAttrTensorStrides = 903,
    kAttrTensorUid = 906,
    kAttrTensorIsVirtual = 907,
    kAttrPackUids = 1000,
    kAttrPackPointers = 1001,
    kAttrPackWorkspace = 1003,
    kAttrEngineNumericalNote = 1303,
    kAttrEngineBehaviorNote = 1305,
    kHeurInstant = 0,
    kHeurFallback = 2,
    // cudnnBackendNumericalNote_t: TENSOR_CORE 0, DOWN_CONVERT_INPUTS 1,
    // REDUCED_PRECISION_REDUCTION 2, FFT 3, NONDETERMINISTIC 4, WINOGRAD 5, WINOGRAD_TILE_4x4 6,
    // _6x6 7, _13x13 8, STRICT_NAN_PROP 9 (cuDNN 9). cudnnBackendBehaviorNote_t:
    // RUNTIME_COMPILATION 0.
    kNoteTensorCore = 0,
    kNoteNondeterministic = 4,
    kBehaviorRuntimeCompilation = 0,
};

// An engine's arithmetic is acceptable when it is a plain sum of products in float: no FFT, no
// Winograd, no down-converted inputs or reduced-precision reduction, and for FP32 no tensor cores
// (which would mean TF32). Nondeterministic (split reductions) is fine; tensor cores for FP16
// (FP16 products, FP32 accumulation) are fine. Note 9 (STRICT_NAN_PROP in cuDNN 9, as far as we
// know) is refused too, as in the H200 run that measured this code.
bool notes_ok(int const* notes, int64_t n, bool half)
{
    for (int64_t i = 0; i < n; ++i)
    {
        int const note = notes[i];
        bool const ok = note == kNoteNondeterministic || (half && note == kNoteTensorCore);
        if (!ok)
        {
            return false;
        }
    }
    return true;
}

struct Plan
{
    bool ok = false;
    bool backend = false; // else the legacy API
    int kind = 0;         // kKind* below (0: legacy)
    Desc xd = nullptr, wd = nullptr, yd = nullptr, cd = nullptr; // legacy
    int algo = 0;                                                // legacy
    Desc exec = nullptr;                                         // backend execution plan
    size_t workspace = 0;
    float us = 0.0F; // measured per launch when it was chosen
};

// Key: dtype, device, every shape field, bias mode, pointer alignment.
using PlanKey = std::array<int32_t, 21>;

std::mutex g_plans_mutex;
std::map<PlanKey, Plan>& plans()
{
    static auto* const cache = new std::map<PlanKey, Plan>(); // never destroyed (see thread_handle)
    return *cache;
}

// The folded problem cuDNN sees: per-batch weights become a grouped convolution of one image
// with the batch folded into the channels (N * C channels, N * group groups).
struct Folded
{
    int n, c, h, w, k, ho, wo, groups;
};

Folded fold(ConvShape const& s)
{
    if (s.weight_per_batch)
    {
        return Folded{1, s.N * s.C, s.H, s.W, s.N * s.K, s.Ho, s.Wo, s.N * s.group};
    }
    return Folded{s.N, s.C, s.H, s.W, s.K, s.Ho, s.Wo, s.group};
}

void destroy_legacy(Plan& p)
{
    Api const& a = *api();
    if (p.xd != nullptr) a.DestroyTensorDescriptor(p.xd);
    if (p.yd != nullptr) a.DestroyTensorDescriptor(p.yd);
    if (p.wd != nullptr) a.DestroyFilterDescriptor(p.wd);
    if (p.cd != nullptr) a.DestroyConvolutionDescriptor(p.cd);
    p.xd = p.yd = p.wd = p.cd = nullptr;
}

// Legacy API: descriptors and the fastest acceptable algorithm by cudnnFind (which runs every
// algorithm on buffers of its own and synchronises).
Plan legacy_plan(Desc handle, DWConv2DParams const& prm, bool half, bool bias)
{
    ConvShape const s = make_shape(prm);
    Api const& a = *api();
    Folded const f = fold(s);
    int const dt = half ? kHalf : kFloat;
    Plan p;
    if (prm.pad_top != prm.pad_bottom || prm.pad_left != prm.pad_right) // legacy pads symmetrically
    {
        return p;
    }
    bool ok = a.CreateTensorDescriptor(&p.xd) == kSuccess && a.CreateTensorDescriptor(&p.yd) == kSuccess
        && a.CreateFilterDescriptor(&p.wd) == kSuccess && a.CreateConvolutionDescriptor(&p.cd) == kSuccess;
    ok = ok && a.SetTensor4dDescriptor(p.xd, kNCHW, dt, f.n, f.c, f.h, f.w) == kSuccess
        && a.SetTensor4dDescriptor(p.yd, kNCHW, dt, f.n, f.k, f.ho, f.wo) == kSuccess
        && a.SetFilter4dDescriptor(p.wd, dt, kNCHW, f.k, s.Cg, s.kH, s.kW) == kSuccess
        && a.SetConvolution2dDescriptor(p.cd, s.pt, s.pl, s.sh, s.sw, s.dh, s.dw, kCrossCorrelation, kFloat)
            == kSuccess
        && a.SetConvolutionGroupCount(p.cd, f.groups) == kSuccess
        && a.SetConvolutionMathType(p.cd, half ? 1 /* TENSOR_OP */ : kFmaMath) == kSuccess;
    int on = 0, oc = 0, oh = 0, ow = 0;
    ok = ok && a.GetConvolution2dForwardOutputDim(p.cd, p.xd, p.wd, &on, &oc, &oh, &ow) == kSuccess && on == f.n
        && oc == f.k && oh == f.ho && ow == f.wo;
    AlgoPerf perf[kAlgoCount] = {};
    int returned = 0;
    ok = ok && a.FindConvolutionForwardAlgorithm(handle, p.xd, p.wd, p.cd, p.yd, kAlgoCount, &returned, perf) == kSuccess;
    int chosen = -1;
    for (int i = 0; ok && i < returned; ++i) // sorted fastest first
    {
        AlgoPerf const& r = perf[i];
        bool const math_ok = half ? r.math_type != kAllowConversion : r.math_type == kFmaMath;
        if (debug())
        {
            std::fprintf(stderr, "dwconv2d: cuDNN legacy Find %s: algo %d status %d %.4f ms %zu bytes math %d\n",
                half ? "f16" : "f32", r.algo, r.status, static_cast<double>(r.time), r.memory, r.math_type);
        }
        if (chosen < 0 && r.status == kSuccess && math_ok && algo_allowed(r.algo) && r.memory <= kCudnnMaxWorkspace)
        {
            chosen = i;
        }
    }
    ok = ok && chosen >= 0 && a.SetConvolutionMathType(p.cd, perf[chosen].math_type) == kSuccess;
    cudaGetLastError(); // a failed trial inside Find must not surface at the caller's next check
    if (!ok)
    {
        destroy_legacy(p);
        return p;
    }
    (void)bias;
    p.algo = perf[chosen].algo;
    p.workspace = perf[chosen].memory;
    p.ok = true;
    return p;
}

struct Backend
{
    Api const& a;
    Desc make(int type) const
    {
        Desc d = nullptr;
        return a.BackendCreateDescriptor(type, &d) == kSuccess ? d : nullptr;
    }
    bool set(Desc d, int attr, int type, int64_t n, void const* v) const
    {
        return d != nullptr && a.BackendSetAttribute(d, attr, type, n, v) == kSuccess;
    }
    bool finalize(Desc d) const
    {
        return d != nullptr && a.BackendFinalize(d) == kSuccess;
    }
    void destroy(Desc d) const
    {
        if (d != nullptr)
        {
            a.BackendDestroyDescriptor(d);
        }
    }
    Desc tensor(int64_t uid, int dt, int64_t n, int64_t c, int64_t h, int64_t w, int64_t align, bool is_virtual) const
    {
        int64_t const dims[4] = {n, c, h, w};
        int64_t const strides[4] = {c * h * w, h * w, w, 1};
        Desc t = make(kDescTensor);
        bool const ok = set(t, kAttrTensorDataType, kTypeDataType, 1, &dt) && set(t, kAttrTensorDims, kTypeInt64, 4, dims)
            && set(t, kAttrTensorStrides, kTypeInt64, 4, strides) && set(t, kAttrTensorUid, kTypeInt64, 1, &uid)
            && set(t, kAttrTensorAlignment, kTypeInt64, 1, &align)
            && (!is_virtual || set(t, kAttrTensorIsVirtual, kTypeBoolean, 1, &is_virtual)) && finalize(t);
        if (!ok)
        {
            destroy(t);
            return nullptr;
        }
        return t;
    }
};

// Plan kinds: legacy API (y = conv + beta * y); backend "blend" (the same through the graph API);
// backend "fused" (conv into a virtual float tensor, plus the bias by a pointwise add, one
// rounding to the output type); backend "scratch" (conv into a float buffer, then our bias pass
// rounds once). FP16 with a bias uses only fused or scratch plans (a blend rounds twice); run on
// the H200 over the whole grid (every FP16-with-bias case within one FP16 rounding; the timed
// dense shape chose "fused"). $QUANTBENCH_DWCONV_CUDNN_F16_BIAS=0 keeps such shapes on ours.
enum : int
{
    kKindLegacy = 0,
    kKindBlend = 1,
    kKindFused = 2,
    kKindScratch = 3,
};

__device__ inline void store_out(float* p, float v)
{
    *p = v;
}

__device__ inline void store_out(__half* p, float v)
{
    *p = __float2half_rn(v);
}

// scratch == nullptr: y[n, k, :, :] = bias (the convolution then adds its sum with beta = 1);
// else y = round(scratch + bias), one rounding to T.
template <class T>
__global__ void bias_pass_kernel(T* __restrict__ y, T const* __restrict__ b, float const* __restrict__ scratch,
    int32_t K, int32_t planes, int64_t hw, int32_t per_batch)
{
    for (int32_t plane = static_cast<int32_t>(blockIdx.y); plane < planes; plane += static_cast<int32_t>(gridDim.y))
    {
        T const bt = b[per_batch ? plane : plane % K];
        float const bf = bias_to_float(bt);
        T* const out = y + static_cast<int64_t>(plane) * hw;
        float const* const in = scratch == nullptr ? nullptr : scratch + static_cast<int64_t>(plane) * hw;
        for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < hw;
             i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        {
            if (in == nullptr)
            {
                out[i] = bt;
            }
            else
            {
                store_out(out + i, __fadd_rn(in[i], bf));
            }
        }
    }
}

template <class T>
cudaError_t launch_bias_pass(T* y, T const* b, float const* scratch, DWConv2DParams const& p, cudaStream_t stream)
{
    int64_t const hw = static_cast<int64_t>(p.out_h) * p.out_w;
    int32_t const planes = p.batch * p.out_channels;
    unsigned const bx = static_cast<unsigned>(std::min<int64_t>((hw + 255) / 256, 64));
    unsigned const by = static_cast<unsigned>(std::min<int32_t>(planes, 65535));
    bias_pass_kernel<T><<<dim3(bx, by), 256, 0, stream>>>(
        y, b, scratch, p.out_channels, planes, hw, p.bias_mode == DWCONV2D_BIAS_PER_BATCH ? 1 : 0);
    return cudaGetLastError();
}

size_t scratch_bytes(DWConv2DParams const& p)
{
    return static_cast<size_t>(p.batch) * p.out_channels * p.out_h * p.out_w * sizeof(float);
}

size_t round256(size_t v)
{
    return (v + 255) / 256 * 256;
}

// Backend API: the operation graph of one forward convolution of the given kind, its engine
// configurations from the heuristics (instant, then fallback), each finalised into an execution
// plan when its numerics are acceptable. Returns the plans with their workspace sizes.
std::vector<Plan> backend_plans(Desc handle, DWConv2DParams const& prm, bool half, int kind, int64_t align)
{
    std::vector<Plan> out;
    Api const& a = *api();
    if (a.BackendCreateDescriptor == nullptr)
    {
        return out;
    }
    ConvShape const s = make_shape(prm);
    bool const bias = prm.bias_mode != DWCONV2D_BIAS_NONE;
    Backend const B{a};
    Folded const f = fold(s);
    int const dt = half ? kHalf : kFloat;
    // Fused: the bias as a broadcast tensor; not expressible for per-batch weights with a shared
    // bias (the folded channels would need the bias repeated).
    int64_t bn = 1, bk = f.k;
    if (kind == kKindFused)
    {
        if (s.weight_per_batch && prm.bias_mode == DWCONV2D_BIAS_SHARED)
        {
            return out;
        }
        if (!s.weight_per_batch && prm.bias_mode == DWCONV2D_BIAS_PER_BATCH)
        {
            bn = s.N;
        }
    }
    Desc const xt = B.tensor(1, dt, f.n, f.c, f.h, f.w, align, false);
    Desc const wt = B.tensor(2, dt, f.k, s.Cg, s.kH, s.kW, align, false);
    Desc const yt = B.tensor(3, kind == kKindScratch ? kFloat : dt, f.n, f.k, f.ho, f.wo, kind == kKindScratch ? 16 : align, false);
    Desc const ct = kind == kKindFused ? B.tensor(5, kFloat, f.n, f.k, f.ho, f.wo, 16, true) : nullptr;
    Desc const bt = kind == kKindFused ? B.tensor(4, dt, bn, bk, 1, 1, align, false) : nullptr;
    Desc const conv = B.make(kDescConvolution);
    int const comp = kFloat;
    int const mode = kCrossCorrelation;
    int64_t const dims = 2;
    int64_t const dil[2] = {s.dh, s.dw};
    int64_t const fst[2] = {s.sh, s.sw};
    int64_t const pre[2] = {s.pt, s.pl};
    int64_t const post[2] = {prm.pad_bottom, prm.pad_right};
    bool ok = xt != nullptr && wt != nullptr && yt != nullptr && (kind != kKindFused || (ct != nullptr && bt != nullptr))
        && B.set(conv, kAttrConvCompType, kTypeDataType, 1, &comp) && B.set(conv, kAttrConvMode, kTypeConvMode, 1, &mode)
        && B.set(conv, kAttrConvSpatialDims, kTypeInt64, 1, &dims) && B.set(conv, kAttrConvDilations, kTypeInt64, 2, dil)
        && B.set(conv, kAttrConvFilterStrides, kTypeInt64, 2, fst) && B.set(conv, kAttrConvPrePaddings, kTypeInt64, 2, pre)
        && B.set(conv, kAttrConvPostPaddings, kTypeInt64, 2, post) && B.finalize(conv);
    Desc const op = ok ? B.make(kDescOpConvForward) : nullptr;
    float const alpha = 1.0F;
    float const beta = kind == kKindBlend && bias ? 1.0F : 0.0F;
    Desc const conv_y = kind == kKindFused ? ct : yt;
    ok = ok && B.set(op, kAttrOpConvX, kTypeBackendDescriptor, 1, &xt)
        && B.set(op, kAttrOpConvW, kTypeBackendDescriptor, 1, &wt)
        && B.set(op, kAttrOpConvY, kTypeBackendDescriptor, 1, &conv_y)
        && B.set(op, kAttrOpConvDesc, kTypeBackendDescriptor, 1, &conv) && B.set(op, kAttrOpConvAlpha, kTypeFloat, 1, &alpha)
        && B.set(op, kAttrOpConvBeta, kTypeFloat, 1, &beta) && B.finalize(op);
    Desc ops[2] = {op, nullptr};
    int64_t nops = 1;
    if (ok && kind == kKindFused)
    {
        Desc const pw = B.make(kDescPointwise);
        int const add = kPointwiseAdd;
        Desc const pwop = B.make(kDescOpPointwise);
        ok = B.set(pw, kAttrPointwiseMode, kTypePointwiseMode, 1, &add)
            && B.set(pw, kAttrPointwiseMathPrec, kTypeDataType, 1, &comp) && B.finalize(pw)
            && B.set(pwop, kAttrOpPointwiseDesc, kTypeBackendDescriptor, 1, &pw)
            && B.set(pwop, kAttrOpPointwiseX, kTypeBackendDescriptor, 1, &ct)
            && B.set(pwop, kAttrOpPointwiseB, kTypeBackendDescriptor, 1, &bt)
            && B.set(pwop, kAttrOpPointwiseY, kTypeBackendDescriptor, 1, &yt) && B.finalize(pwop);
        ops[1] = pwop;
        nops = 2;
    }
    Desc const graph = ok ? B.make(kDescOpGraph) : nullptr;
    ok = ok && B.set(graph, kAttrGraphHandle, kTypeHandle, 1, &handle)
        && B.set(graph, kAttrGraphOps, kTypeBackendDescriptor, nops, ops) && B.finalize(graph);
    int compiled = 0;
    for (int heur_mode : {static_cast<int>(kHeurInstant), static_cast<int>(kHeurFallback)})
    {
        Desc const heur = ok ? B.make(kDescEngineHeur) : nullptr;
        int64_t count = 0;
        bool const hok = ok && B.set(heur, kAttrHeurOpGraph, kTypeBackendDescriptor, 1, &graph)
            && B.set(heur, kAttrHeurMode, kTypeHeurMode, 1, &heur_mode) && B.finalize(heur)
            && a.BackendGetAttribute(heur, kAttrHeurResults, kTypeBackendDescriptor, 0, &count, nullptr) == kSuccess;
        constexpr int64_t kMaxConfigs = 10;
        std::vector<Desc> cfgs(static_cast<size_t>(hok ? std::min(count, kMaxConfigs) : 0));
        for (Desc& c : cfgs)
        {
            c = B.make(kDescEngineCfg);
        }
        int64_t got = 0;
        if (!cfgs.empty()
            && a.BackendGetAttribute(heur, kAttrHeurResults, kTypeBackendDescriptor, static_cast<int64_t>(cfgs.size()),
                   &got, cfgs.data())
                != kSuccess)
        {
            got = 0;
        }
        for (int64_t i = 0; i < static_cast<int64_t>(cfgs.size()); ++i)
        {
            Desc const cfg = cfgs[static_cast<size_t>(i)];
            Desc engine = B.make(kDescEngine);
            int notes[16] = {};
            int behavior[16] = {};
            int64_t nn = 0, nb = 0;
            bool const eok = i < got
                && a.BackendGetAttribute(cfg, kAttrCfgEngine, kTypeBackendDescriptor, 1, &nn, &engine) == kSuccess
                && a.BackendGetAttribute(engine, kAttrEngineNumericalNote, kTypeNumericalNote, 16, &nn, notes) == kSuccess
                && a.BackendGetAttribute(engine, kAttrEngineBehaviorNote, kTypeBehaviorNote, 16, &nb, behavior) == kSuccess;
            bool const numerics = eok && notes_ok(notes, std::min<int64_t>(nn, 16), half);
            bool const rtc = eok && std::count(behavior, behavior + std::min<int64_t>(nb, 16), kBehaviorRuntimeCompilation) > 0;
            B.destroy(engine);
            Desc exec = nullptr;
            int64_t ws = 0;
            // At most two runtime-compiled engines per graph (each costs a compilation).
            bool usable = numerics && (!rtc || compiled < 2);
            if (usable)
            {
                compiled += rtc ? 1 : 0;
                exec = B.make(kDescExecutionPlan);
                usable = B.set(exec, kAttrPlanHandle, kTypeHandle, 1, &handle)
                    && B.set(exec, kAttrPlanEngineCfg, kTypeBackendDescriptor, 1, &cfg) && B.finalize(exec)
                    && a.BackendGetAttribute(exec, kAttrPlanWorkspaceSize, kTypeInt64, 1, &nn, &ws) == kSuccess
                    && ws >= 0 && static_cast<size_t>(ws) <= kCudnnMaxWorkspace;
            }
            if (debug() && eok)
            {
                std::fprintf(stderr, "dwconv2d: cuDNN backend %s kind %d heur %d cfg %lld: notes", half ? "f16" : "f32",
                    kind, heur_mode, static_cast<long long>(i));
                for (int64_t k = 0; k < std::min<int64_t>(nn, 16); ++k)
                {
                    std::fprintf(stderr, " %d", notes[k]);
                }
                std::fprintf(stderr, "%s -> %s (workspace %lld)\n", rtc ? " rtc" : "", usable ? "candidate" : "skipped",
                    static_cast<long long>(ws));
            }
            if (usable)
            {
                Plan p;
                p.ok = true;
                p.backend = true;
                p.kind = kind;
                p.exec = exec;
                p.workspace = static_cast<size_t>(ws);
                out.push_back(p);
                // the configuration stays alive with its plan (never destroyed, like the plan)
            }
            else
            {
                B.destroy(exec);
                B.destroy(cfg);
            }
        }
        B.destroy(heur);
    }
    if (debug() && !ok)
    {
        std::fprintf(stderr, "dwconv2d: cuDNN backend %s kind %d: graph not built\n", half ? "f16" : "f32", kind);
    }
    // The graph, operations and tensors stay alive too: execution plans may refer to them.
    return out;
}

// One launch of a plan; false if cuDNN refused it. y gets conv + bias, except for scratch plans
// (scratch gets the float convolution; the caller's bias pass writes y).
bool execute(Desc handle, Plan const& p, void const* x, void const* w, void const* b, void* y, void* scratch, void* ws,
    bool bias)
{
    Api const& a = *api();
    if (!p.backend)
    {
        float const alpha = 1.0F;
        float const beta = bias ? 1.0F : 0.0F;
        return a.ConvolutionForward(handle, &alpha, p.xd, x, p.wd, w, p.cd, p.algo, ws, p.workspace, &beta, p.yd, y)
            == kSuccess;
    }
    Backend const B{a};
    Desc const pack = B.make(kDescVariantPack);
    int64_t const uids[4] = {1, 2, 3, 4};
    void* const ptrs[4] = {const_cast<void*>(x), const_cast<void*>(w), p.kind == kKindScratch ? scratch : y,
        const_cast<void*>(b)};
    int64_t const n = p.kind == kKindFused ? 4 : 3;
    bool const ok = B.set(pack, kAttrPackUids, kTypeInt64, n, uids) && B.set(pack, kAttrPackPointers, kTypeVoidPtr, n, ptrs)
        && B.set(pack, kAttrPackWorkspace, kTypeVoidPtr, 1, &ws) && B.finalize(pack)
        && a.BackendExecute(handle, p.exec, pack) == kSuccess;
    B.destroy(pack);
    return ok;
}

// All candidate plans, each timed on the caller's own buffers (y is overwritten; the caller
// writes it afterwards), the fastest kept. FP16 with a bias: fused and scratch plans (the latter
// timed with our bias pass); otherwise blend plans and legacy Find's best. Runs and synchronises
// on `stream`, so never while it is being captured.
template <class T>
Plan make_plan(Desc handle, int device, DWConv2DParams const& prm, int64_t align, T const* x, T const* w, T const* b,
    T* y, cudaStream_t stream)
{
    constexpr bool half = std::is_same<T, __half>::value;
    bool const bias = prm.bias_mode != DWCONV2D_BIAS_NONE;
    bool const split = half && bias;
    std::vector<Plan> cands;
    if (split)
    {
        cands = backend_plans(handle, prm, half, kKindFused, align);
        std::vector<Plan> more = backend_plans(handle, prm, half, kKindScratch, align);
        cands.insert(cands.end(), more.begin(), more.end());
    }
    else
    {
        cands = backend_plans(handle, prm, half, kKindBlend, align);
        Plan legacy = legacy_plan(handle, prm, half, bias);
        if (legacy.ok)
        {
            cands.push_back(legacy);
        }
    }
    size_t ws_bytes = 0;
    for (Plan const& c : cands)
    {
        ws_bytes = std::max(ws_bytes, c.workspace);
    }
    size_t const total = round256(ws_bytes) + (split ? scratch_bytes(prm) : 0);
    auto* const base = static_cast<unsigned char*>(total > 0 ? thread_workspace(device, stream, total, true) : nullptr);
    void* const ws = ws_bytes > 0 ? base : nullptr;
    float* const scratch = split && base != nullptr ? reinterpret_cast<float*>(base + round256(ws_bytes)) : nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    bool const events
        = (total == 0 || base != nullptr) && cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
    int best = -1;
    for (size_t i = 0; events && i < cands.size(); ++i)
    {
        Plan& c = cands[i];
        auto const once = [&]() {
            bool const ran = execute(handle, c, x, w, b, y, scratch, ws, bias);
            return ran && (c.kind != kKindScratch || launch_bias_pass<T>(y, b, scratch, prm, stream) == cudaSuccess);
        };
        constexpr int kReps = 3;
        bool ok = once() && cudaEventRecord(start, stream) == cudaSuccess;
        for (int r = 0; ok && r < kReps; ++r)
        {
            ok = once();
        }
        float ms = 0.0F;
        ok = ok && cudaEventRecord(stop, stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess
            && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
        cudaGetLastError();
        c.ok = ok;
        c.us = ms * 1000.0F / kReps;
        if (debug())
        {
            std::fprintf(stderr, "dwconv2d: cuDNN candidate %zu (kind %d, algo %d): %s %.2f us\n", i, c.kind,
                c.backend ? -1 : c.algo, ok ? "ok" : "failed", static_cast<double>(c.us));
        }
        if (ok && (best < 0 || c.us < cands[static_cast<size_t>(best)].us))
        {
            best = static_cast<int>(i);
        }
    }
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    cudaGetLastError();
    Plan chosen;
    for (size_t i = 0; i < cands.size(); ++i)
    {
        if (static_cast<int>(i) == best)
        {
            chosen = cands[i];
        }
        else if (!cands[i].backend)
        {
            destroy_legacy(cands[i]);
        }
        else
        {
            Backend{*api()}.destroy(cands[i].exec);
        }
    }
    if (debug())
    {
        Folded const f = fold(make_shape(prm));
        std::fprintf(stderr, "dwconv2d: cuDNN plan %s n%d c%d h%d w%d k%d g%d bias %d: %zu candidates, chosen kind %d %.2f us\n",
            half ? "f16" : "f32", f.n, f.c, f.h, f.w, f.k, f.groups, bias ? 1 : 0, cands.size(),
            best < 0 ? -1 : chosen.kind, static_cast<double>(chosen.us));
    }
    chosen.ok = best >= 0;
    return chosen;
}

} // namespace cudnn

int cudnn_mode()
{
    int m = g_cudnn_mode.load(std::memory_order_relaxed);
    if (m < 0)
    {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN");
        m = env != nullptr && (std::string(env) == "0" || std::string(env) == "off") ? DWCONV2D_CUDNN_OFF
                                                                                    : DWCONV2D_CUDNN_AUTO;
        int expected = -1;
        g_cudnn_mode.compare_exchange_strong(expected, m);
        m = g_cudnn_mode.load(std::memory_order_relaxed);
    }
    return m;
}

// The dispatch table (see above): cuDNN for grouped and dense FP32/FP16 shapes that it can express.
bool cudnn_preferred(DWConv2DParams const& p, int dtype)
{
    if (dtype == DWCONV2D_DTYPE_INT8 || p.in_channels / p.group == 1)
    {
        return false;
    }
    if (p.pad_top != p.pad_bottom || p.pad_left != p.pad_right)
    {
        return false;
    }
    // FP16 with a bias: cuDNN's beta = 1 blend would round the output twice (measured on the H200:
    // 6 of the grid's FP16 cases with a bias off by more than one FP16 rounding), so such shapes
    // use only the fused (conv + bias in one cuDNN graph, float intermediate) and float-scratch
    // plans, which round once (measured on the H200: every grid case within one FP16 rounding).
    // $QUANTBENCH_DWCONV_CUDNN_F16_BIAS=0 keeps FP16 with a bias on our kernels.
    static bool const f16_bias = [] {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN_F16_BIAS");
        return env == nullptr || std::string(env) != "0";
    }();
    if (dtype == DWCONV2D_DTYPE_F16 && p.bias_mode != DWCONV2D_BIAS_NONE && !f16_bias)
    {
        return false;
    }
    auto const fits = [](int64_t a, int64_t b, int64_t c, int64_t d) { return a * b * c * d <= INT32_MAX; };
    int64_t const wn = p.weight_mode == DWCONV2D_WEIGHT_PER_BATCH ? p.batch : 1;
    return fits(p.batch, p.in_channels, p.in_h, p.in_w) && fits(p.batch, p.out_channels, p.out_h, p.out_w)
        && fits(wn * p.out_channels, p.in_channels / p.group, p.kernel_h, p.kernel_w);
}

bool cudnn_chosen(DWConv2DParams const& p, int dtype)
{
    return cudnn_mode() == DWCONV2D_CUDNN_AUTO && cudnn_preferred(p, dtype) && cudnn::api() != nullptr;
}

// Runs the convolution through cuDNN; false (nothing left half done that our kernels would not
// overwrite) when it cannot, in which case the caller runs our kernels.
template <class T>
bool try_cudnn(T const* x, T const* w, T const* b, T* y, DWConv2DParams const& p, cudaStream_t stream, int* status)
{
    constexpr bool kHalf = std::is_same<T, __half>::value;
    int const dtype = kHalf ? DWCONV2D_DTYPE_F16 : DWCONV2D_DTYPE_F32;
    if (p.batch == 0 || !cudnn_chosen(p, dtype))
    {
        return false;
    }
    auto const why_not = [](char const* reason) {
        if (cudnn::debug())
        {
            std::fprintf(stderr, "dwconv2d: cuDNN not used: %s\n", reason);
        }
        return false;
    };
    cudnn::Api const& a = *cudnn::api();
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
    {
        cudaGetLastError();
        return why_not("cudaGetDevice failed");
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess)
    {
        cudaGetLastError();
        return why_not("cudaStreamIsCapturing failed");
    }
    bool const capturing = capture != cudaStreamCaptureStatusNone;
    cudnn::Desc const handle = capturing ? nullptr : cudnn::thread_handle(device, true);
    bool const bias = p.bias_mode != DWCONV2D_BIAS_NONE;
    // The alignment every tensor pointer has (backend tensors declare it; 16 for CUDA allocations).
    auto const addr_bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(y)
        | (bias ? reinterpret_cast<uintptr_t>(b) : 0U);
    int32_t align = 16;
    while (align > static_cast<int32_t>(sizeof(T)) && (addr_bits & static_cast<uintptr_t>(align - 1)) != 0)
    {
        align /= 2;
    }
    cudnn::PlanKey const key = {dtype, device, p.batch, p.in_channels, p.in_h, p.in_w, p.out_channels, p.kernel_h,
        p.kernel_w, p.stride_h, p.stride_w, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right, p.dilation_h,
        p.dilation_w, p.group, p.weight_mode, p.bias_mode, align};
    cudnn::Plan plan;
    {
        std::lock_guard<std::mutex> lock(cudnn::g_plans_mutex);
        auto it = cudnn::plans().find(key);
        if (it == cudnn::plans().end())
        {
            if (capturing)
            {
                return why_not("no plan yet and the stream is capturing");
            }
            if (handle == nullptr || a.SetStream(handle, stream) != cudnn::kSuccess)
            {
                return why_not("cudnnCreate or cudnnSetStream failed");
            }
            cudnn::Plan made = cudnn::make_plan<T>(handle, device, p, align, x, w, b, y, stream);
            it = cudnn::plans().emplace(key, made).first;
        }
        plan = it->second;
    }
    if (!plan.ok)
    {
        return why_not("no usable cuDNN plan for this shape");
    }
    cudnn::Desc const h = capturing ? cudnn::thread_handle(device, false) : handle;
    if (h == nullptr || a.SetStream(h, stream) != cudnn::kSuccess)
    {
        return why_not("no handle for this thread while capturing, or cudnnSetStream failed");
    }
    // Workspace (and the float buffer of a scratch plan): cached per thread, device and stream;
    // while capturing, a stream-ordered allocation freed after use (graph memory nodes).
    size_t const ws_round = cudnn::round256(plan.workspace);
    size_t const total = ws_round + (plan.kind == cudnn::kKindScratch ? cudnn::scratch_bytes(p) : 0);
    unsigned char* base = nullptr;
    bool base_async = false;
    if (total > 0)
    {
        base = static_cast<unsigned char*>(cudnn::forward_workspace(device, stream, total, capturing, &base_async));
        if (base == nullptr)
        {
            return why_not(capturing ? "cudaMallocAsync of the workspace failed" : "workspace allocation failed");
        }
    }
    void* const ws = plan.workspace > 0 ? base : nullptr;
    float* const scratch = plan.kind == cudnn::kKindScratch ? reinterpret_cast<float*>(base + ws_round) : nullptr;
    auto const release = [&]() {
        if (base_async)
        {
            cudaFreeAsync(base, stream);
        }
    };
    bool const prefill = bias && (plan.kind == cudnn::kKindLegacy || plan.kind == cudnn::kKindBlend);
    if (prefill)
    {
        cudaError_t const e = cudnn::launch_bias_pass<T>(y, b, nullptr, p, stream);
        if (e != cudaSuccess)
        {
            release();
            *status = static_cast<int>(e);
            return true;
        }
    }
    if (!cudnn::execute(h, plan, x, w, b, y, scratch, ws, bias))
    {
        release();
        cudaGetLastError();
        return why_not("cuDNN execution failed"); // our kernels overwrite y, bias fill included
    }
    cudaError_t e = cudaSuccess;
    if (plan.kind == cudnn::kKindScratch)
    {
        e = cudnn::launch_bias_pass<T>(y, b, scratch, p, stream);
    }
    release();
    *status = static_cast<int>(e);
    return true;
}

// depthwise_mma for the process: dwconv2d_set_mma_mode(); at start DWCONV2D_MMA_AUTO unless
// $QUANTBENCH_DWCONV_MMA is "1"/"on" (DWCONV2D_MMA_ON) or "0"/"off" (DWCONV2D_MMA_OFF).
int mma_mode()
{
    int m = g_mma_mode.load(std::memory_order_relaxed);
    if (m < 0)
    {
        char const* env = std::getenv("QUANTBENCH_DWCONV_MMA");
        std::string const v = env == nullptr ? std::string() : std::string(env);
        m = v == "1" || v == "on" ? DWCONV2D_MMA_ON : v == "0" || v == "off" ? DWCONV2D_MMA_OFF : DWCONV2D_MMA_AUTO;
        int expected = -1;
        g_mma_mode.compare_exchange_strong(expected, m);
        m = g_mma_mode.load(std::memory_order_relaxed);
    }
    return m;
}

// The per-shape table of DWCONV2D_MMA_AUTO: the depthwise_rows shapes (square kernel, stride) and
// element types on which depthwise_mma was measured faster than depthwise_rows on the H200 (N=32,
// tests/gpu/run_gpu_checks.py, see README.md): 7x7 stride 1 in FP16 (C=384, 28x28: 34.9 against
// 38.1 us). INT8 7x7 stride 1 is not in it: 31.5 us on depthwise_rows against 34.0 on
// depthwise_mma since depthwise_rows' copy loop was tightened (it was 33.4 against 36.5 before),
// 26.7 since its INT8 rows are streamed and its 5x5/7x7 blocks fill whole warps.
// depthwise_mma was slower at 3x3 stride 1 and 5x5 stride 2 (1.4-1.7x), and 3x3 stride 2, 5x5
// stride 1 and 7x7 stride 2 were not measured, so they stay on depthwise_rows. elem: 2 (FP16) or
// 1 (INT8).
struct MmaTableEntry
{
    int ks, stride, elem;
};
constexpr MmaTableEntry kMmaTable[] = {
    {7, 1, 2},
};

bool mma_table_picks(ConvShape const& s, int elem)
{
    for (MmaTableEntry const& e : kMmaTable)
    {
        if (e.ks == s.kH && e.ks == s.kW && e.stride == s.sh && e.stride == s.sw && e.elem == elem)
        {
            return true;
        }
    }
    return false;
}

// Whether a forward of element size `elem` on a depthwise_rows shape should try depthwise_mma
// (it still needs the plane to fit, plan_mma()).
bool mma_wanted(ConvShape const& s, int elem)
{
    if (elem == 4)
    {
        return false;
    }
    int const m = mma_mode();
    return m == DWCONV2D_MMA_ON || (m == DWCONV2D_MMA_AUTO && mma_table_picks(s, elem));
}

// gemm_mma (INT8 grouped and dense on the tensor cores): group merging, output-channel tiles per
// block, packed shapes, whether it serves a shape, and the launch.
constexpr int kGmmaKC = 2; // 32-byte reduction chunks per stage

// Original groups per merged group: the most that keep S * Cg <= 32 channels and S * Kg <= 64
// output channels (one block's tile), so groups of few channels fill the 32-byte MMA steps.
int32_t gmma_merge(ConvShape const& s)
{
    int32_t best = 1;
    for (int32_t m = 2; m * s.Cg <= 32 && m * s.Kg <= 64 && m <= s.group; ++m)
    {
        if (s.group % m == 0)
        {
            best = m;
        }
    }
    return best;
}

// The shape with S groups merged into one (block-diagonal filters, see gmma_pack_w).
ConvShape gmma_merged(ConvShape const& s, int32_t merge)
{
    ConvShape m = s;
    m.group = s.group / merge;
    m.Cg = s.Cg * merge;
    m.Kg = s.Kg * merge;
    return m;
}

int gmma_mt(int32_t kg)
{
    return kg > 32 ? 4 : kg > 16 ? 2 : 1;
}

// The flat kernel's plan (gemm_mma_kernel), or with smem_optin > 0 the patch kernel's
// (gemm_mma_patch_kernel) where its two stages fit in min(smem_optin, kPatchSmemMax) bytes of
// shared memory and a block holds at least one whole output row (Wo <= 128); else halo = 0.
constexpr int64_t kPatchSmemMax = 160 * 1024;

GmmaShape gmma_shape(ConvShape const& s, int64_t smem_optin = 0)
{
    GmmaShape gs{};
    gs.merge = gmma_merge(s);
    ConvShape const m = gmma_merged(s, gs.merge);
    int32_t const bm = 16 * gmma_mt(m.Kg);
    gs.taps = s.kH * s.kW;
    gs.Kp = static_cast<int32_t>(round_up(m.Kg, bm));
    gs.mtiles = gs.Kp / bm;
    int64_t const limit = std::min(smem_optin, kPatchSmemMax);
    if (limit > 0 && m.Wo <= kGmmaBN)
    {
        int64_t const pc = static_cast<int64_t>(m.Wo - 1) * m.sw + static_cast<int64_t>(m.kW - 1) * m.dw + 1;
        for (int32_t rows = std::min(kGmmaBN / m.Wo, m.Ho); rows >= 1; --rows)
        {
            int64_t const pr = static_cast<int64_t>(rows - 1) * m.sh + static_cast<int64_t>(m.kH - 1) * m.dh + 1;
            int64_t const stage = static_cast<int64_t>(bm) * (gs.taps * 32 + 16) + pr * pc * kPatchPitch;
            if (2 * stage <= limit)
            {
                gs.halo = 1;
                gs.rows = rows;
                gs.pr = static_cast<int32_t>(pr);
                gs.pc = static_cast<int32_t>(pc);
                gs.Cp = static_cast<int32_t>(round_up(m.Cg, 32));
                gs.chunks = gs.Cp / 32;
                gs.runs = gs.Cp / 8;
                gs.Rp = gs.chunks * gs.taps * 32;
                return gs;
            }
        }
    }
    gs.Cp = static_cast<int32_t>(round_up(m.Cg, 8));
    gs.runs = gs.Cp / 8;
    gs.Rp = static_cast<int32_t>(round_up(static_cast<int64_t>(gs.taps) * gs.Cp, 32 * kGmmaKC));
    gs.steps = gs.Rp / (32 * kGmmaKC);
    return gs;
}

size_t gmma_patch_smem(GmmaShape const& gs, int mt)
{
    return 2 * (static_cast<size_t>(16 * mt) * (gs.taps * 32 + 16) + static_cast<size_t>(gs.pr) * gs.pc * kPatchPitch);
}

// Workspace bytes: the packed input and the packed filters, each rounded to 256.
struct GmmaBytes
{
    size_t x, w;
};
GmmaBytes gmma_bytes(ConvShape const& s, GmmaShape const& gs)
{
    size_t const x = static_cast<size_t>(s.N) * (s.group / gs.merge) * s.H * s.W * gs.Cp;
    size_t const w = static_cast<size_t>(s.weight_per_batch ? s.N : 1) * (s.group / gs.merge) * gs.Kp * gs.Rp;
    return {cudnn::round256(x), cudnn::round256(w)};
}

// INT8 grouped or dense (C/group > 1), its grid within CUDA's limits (batch and group x channel
// tiles on y and z) and its workspace within kCudnnMaxWorkspace. (The device must also be sm_80
// or newer: launch_gemm_mma checks that.)
bool gmma_serves(ConvShape const& s)
{
    if (s.Cg < 2)
    {
        return false;
    }
    GmmaShape const gs = gmma_shape(s);
    GmmaBytes const nb = gmma_bytes(s, gs);
    return s.N <= 65535 && static_cast<int64_t>(s.group / gs.merge) * gs.mtiles <= 65535
        && nb.x + nb.w <= kCudnnMaxWorkspace;
}

// Whether an INT8 forward of this shape takes gemm_mma (DWCONV2D_MMA_OFF keeps it on our CUDA-core
// kernels, as for depthwise_mma).
bool gmma_wanted(ConvShape const& s)
{
    return mma_mode() != DWCONV2D_MMA_OFF && gmma_serves(s);
}

template <int MT, class Store>
cudaError_t launch_gmma_tiles(int8_t const* xt, int8_t const* wt, float const* b, Store store,
    ConvShape const& m, GmmaShape const& gs, cudaStream_t stream)
{
    if (gs.halo != 0)
    {
        dim3 const grid(static_cast<unsigned>(ceil_div(m.Ho, gs.rows)), static_cast<unsigned>(m.N),
            static_cast<unsigned>(m.group * gs.mtiles));
        size_t const bytes = gmma_patch_smem(gs, MT);
        cudaError_t const e = cudaFuncSetAttribute(
            gemm_mma_patch_kernel<MT, Store>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        if (e != cudaSuccess)
        {
            return e;
        }
        gemm_mma_patch_kernel<MT, Store><<<grid, kGmmaWarps * 32, bytes, stream>>>(xt, wt, b, store, m, gs);
        return cudaGetLastError();
    }
    dim3 const grid(static_cast<unsigned>(ceil_div(static_cast<int64_t>(m.Ho) * m.Wo, kGmmaBN)),
        static_cast<unsigned>(m.N), static_cast<unsigned>(m.group * gs.mtiles));
    size_t const smem = static_cast<size_t>(kGmmaStages) * (16 * MT + kGmmaBN) * (32 * kGmmaKC + 16);
    static_assert(kGmmaStages * (16 * 4 + kGmmaBN) * (32 * kGmmaKC + 16) <= 48 * 1024, "no opt-in needed");
    if (gs.Cp % 32 == 0)
    {
        gemm_mma_kernel<MT, kGmmaKC, true, Store>
            <<<grid, kGmmaWarps * 32, smem, stream>>>(xt, wt, b, store, m, gs);
    }
    else
    {
        gemm_mma_kernel<MT, kGmmaKC, false, Store>
            <<<grid, kGmmaWarps * 32, smem, stream>>>(xt, wt, b, store, m, gs);
    }
    return cudaGetLastError();
}

// Packs x and w into the workspace and runs gemm_mma_kernel; false (nothing launched) where it
// does not apply: not wanted, a device older than sm_80, or no workspace (the caller then takes
// our CUDA-core kernels, same results). Workspace: the per-thread, device and stream cache of the
// cuDNN path; while the stream is being captured, a stream-ordered allocation freed after use.
template <class Store>
bool launch_gemm_mma(int8_t const* x, int8_t const* w, float const* b, Store store, ConvShape const& s,
    cudaStream_t stream, int* status)
{
    if (!gmma_wanted(s))
    {
        return false;
    }
    int device = 0;
    int major = 0;
    int optin = 0;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    bool const ready = cudaGetDevice(&device) == cudaSuccess
        && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8
        && cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess
        && cudaStreamIsCapturing(stream, &capture) == cudaSuccess;
    (void) cudaGetLastError();
    if (!ready)
    {
        return false;
    }
    // The patch kernel where it fits (and its workspace, channels padded to 32, is within the cap);
    // $QUANTBENCH_DWCONV_GEMM_PATCH=0 keeps the flat kernel (read per call: tests and A/B timing).
    char const* const patch_env = std::getenv("QUANTBENCH_DWCONV_GEMM_PATCH");
    bool const patch_off = patch_env != nullptr && std::string(patch_env) == "0";
    GmmaShape gs = gmma_shape(s, patch_off ? 0 : optin);
    GmmaBytes nb = gmma_bytes(s, gs);
    if (gs.halo != 0 && nb.x + nb.w > kCudnnMaxWorkspace)
    {
        gs = gmma_shape(s);
        nb = gmma_bytes(s, gs);
    }
    ConvShape const m = gmma_merged(s, gs.merge);
    size_t const total = nb.x + nb.w;
    bool const capturing = capture != cudaStreamCaptureStatusNone;
    bool async = false;
    void* const base = cudnn::forward_workspace(device, stream, total, capturing, &async);
    if (base == nullptr)
    {
        return false;
    }
    auto* const xt = static_cast<int8_t*>(base);
    int8_t* const wt = xt + nb.x;
    constexpr int kPackThreads = 256;
    int64_t const hw = static_cast<int64_t>(s.H) * s.W;
    bool const quads = hw % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0;
    int64_t const xthreads = static_cast<int64_t>(s.N) * m.group * ((gs.runs + 3) / 4) * std::min(gs.runs, 4)
        * (quads ? hw / 4 : hw);
    int64_t const wwords = static_cast<int64_t>(s.weight_per_batch ? s.N : 1) * m.group * gs.Kp * gs.Rp / 4;
    auto const blocks = static_cast<unsigned>(ceil_div(xthreads + wwords, kPackThreads));
    if (quads)
    {
        gmma_pack_kernel<4><<<blocks, kPackThreads, 0, stream>>>(x, w, xt, wt, s, m, gs, xthreads, wwords);
    }
    else
    {
        gmma_pack_kernel<1><<<blocks, kPackThreads, 0, stream>>>(x, w, xt, wt, s, m, gs, xthreads, wwords);
    }
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
    {
        int const mt = gmma_mt(m.Kg);
        e = mt == 4 ? launch_gmma_tiles<4>(xt, wt, b, store, m, gs, stream)
            : mt == 2 ? launch_gmma_tiles<2>(xt, wt, b, store, m, gs, stream)
                      : launch_gmma_tiles<1>(xt, wt, b, store, m, gs, stream);
    }
    if (async)
    {
        cudaFreeAsync(base, stream);
    }
    *status = static_cast<int>(e);
    return true;
}

template <class TIn, class TB, class Store>
int run(TIn const* x, TIn const* w, TB const* b, Store store, void const* y, int out_elem,
    DWConv2DParams const& p, cudaStream_t stream)
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
    g_last_path = path;
    if (path == DWCONV2D_PATH_DEPTHWISE_ROWS)
    {
        int status = 0;
        if (mma_wanted(s, static_cast<int>(sizeof(TIn))) && launch_mma(x, w, b, store, y, out_elem, s, stream, &status))
        {
            g_last_path = DWCONV2D_PATH_DEPTHWISE_MMA;
            return status;
        }
        if (launch_global(x, w, b, store, y, out_elem, s, stream, &status))
        {
            g_last_path = DWCONV2D_PATH_DEPTHWISE_GLOBAL;
            return status;
        }
        if (launch_rows(x, w, b, store, y, out_elem, s, stream, &status))
        {
            return status;
        }
        // Pointers too poorly aligned for its loads: same results from the tiled path.
        DwPlan plan{};
        bool const tiled = plan_depthwise(s, &plan);
        g_last_path = tiled ? DWCONV2D_PATH_DEPTHWISE_TILED : DWCONV2D_PATH_DIRECT;
        return tiled ? launch_depthwise(x, w, b, store, s, stream) : launch_direct(x, w, b, store, s, stream);
    }
    if constexpr (std::is_same_v<TIn, int8_t>)
    {
        int status = 0;
        if (launch_gemm_mma(x, w, b, store, s, stream, &status))
        {
            g_last_path = DWCONV2D_PATH_GEMM_MMA;
            return status;
        }
    }
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

// The INT8 -> INT8 epilogue, with the constants of depthwise_rows' fixed-point requantization
// (StoreI8ToI8::rows_store). Exactness bound, per output, with A = kH * kW * 2^14 >= |acc| and
// w = fl(fl(fl(acc * s) + b) / os) the exact chain's quotient (each fl() one float32 rounding,
// relative error <= 2^-24 while normal):
//   |w - (acc * c1 + b / os)|  <= 3 * 2^-24 * |acc| * c1 + 2^-23 * |b / os|  (+ 2^-49 subnormal)
//   |acc * c1_fixed / 2^32 - acc * c1| <= A * (2^-33 + c1 * 2^-53)            (c1 in double)
//   |c2 / 2^32 - 1/2 - b / os|         <= 2^-33 + 2^-23 * |b / os|            (fl(b * fl(1/os)))
// so eps = 1.25 * (A * 2^-33 + 2^-32 + 2^-40 + 2^-22 * A * c1) + 1.25 * 2^-21 * |fl(b / os)|
// bounds |z / 2^32 - 1/2 - w| with room to spare (the 1.25 also covers the float rounding of eps
// itself). The fixed-point path needs 1/os normal and within 2^+-100 (so the subnormal terms stay
// below 2^-40), c1 * 2^32 within int32, and eps <= 2^-5 (else every output takes the exact chain).
StoreI8ToI8 make_i8_store(DWConv2DParams const& p, int8_t* y, float acc_scale)
{
    StoreI8ToI8 st{};
    st.y = y;
    st.acc_scale = acc_scale;
    st.output_scale = p.output_scale;
    st.inv_output_scale = 1.0F / p.output_scale;
    double const c1 = static_cast<double>(acc_scale) / static_cast<double>(p.output_scale);
    double const a = static_cast<double>(p.in_channels / p.group) * p.kernel_h * p.kernel_w * 16384.0;
    double const eps = 1.25 * (a * 0x1p-33 + 0x1p-32 + 0x1p-40 + 0x1p-22 * a * c1);
    double const c1_fixed = std::nearbyint(c1 * 0x1p32);
    float const inv = st.inv_output_scale;
    bool const ok = std::isnormal(inv) && inv < 0x1p100F && inv > 0x1p-100F && c1_fixed <= INT32_MAX
        && eps <= 0x1p-5;
    st.fixed_ok = ok ? 1 : 0;
    st.quick_ok = std::isnormal(inv) ? 1 : 0;
    st.c1_fixed = ok ? static_cast<int32_t>(c1_fixed) : 0;
    // Rounded up: the float must not be below the double bound.
    float const eps_f = static_cast<float>(eps);
    st.eps_const = static_cast<double>(eps_f) >= eps ? eps_f : std::nextafter(eps_f, INFINITY);
    return st;
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

int dwconv2d_forward_path(DWConv2DParams const* params, int dtype)
{
    if (params == nullptr || (dtype != DWCONV2D_DTYPE_F32 && dtype != DWCONV2D_DTYPE_F16 && dtype != DWCONV2D_DTYPE_INT8))
    {
        return DWCONV2D_PATH_INVALID;
    }
    int const path = select_path(*params);
    if (path != DWCONV2D_PATH_INVALID && cudnn_chosen(*params, dtype))
    {
        return DWCONV2D_PATH_CUDNN;
    }
    int const elem = dtype == DWCONV2D_DTYPE_F32 ? 4 : dtype == DWCONV2D_DTYPE_F16 ? 2 : 1;
    if (path != DWCONV2D_PATH_INVALID && elem == 1 && gmma_wanted(make_shape(*params)))
    {
        return DWCONV2D_PATH_GEMM_MMA; // as run() decides it on an sm_80 or newer device
    }
    if (path == DWCONV2D_PATH_DEPTHWISE_ROWS && mma_wanted(make_shape(*params), elem))
    {
        // As run() decides it for 16-byte aligned tensors (CUDA allocations are).
        ConvShape const s = make_shape(*params);
        int64_t const row = static_cast<int64_t>(s.W) * elem;
        MmaPlan pl{};
        if (plan_mma(s, elem, row % 16 == 0 ? 16 : row % 8 == 0 ? 8 : 4, &pl))
        {
            return DWCONV2D_PATH_DEPTHWISE_MMA;
        }
    }
    if (path == DWCONV2D_PATH_DEPTHWISE_ROWS && global_shape_ok(make_shape(*params), elem))
    {
        return DWCONV2D_PATH_DEPTHWISE_GLOBAL; // as run() decides it for 16-byte aligned tensors
    }
    return path;
}

int dwconv2d_last_path(void)
{
    return g_last_path;
}

int dwconv2d_set_cudnn_mode(int mode)
{
    int const previous = cudnn_mode();
    if (mode == DWCONV2D_CUDNN_OFF || mode == DWCONV2D_CUDNN_AUTO)
    {
        g_cudnn_mode.store(mode);
    }
    return previous;
}

int dwconv2d_set_mma_mode(int mode)
{
    int const previous = mma_mode();
    if (mode == DWCONV2D_MMA_OFF || mode == DWCONV2D_MMA_ON || mode == DWCONV2D_MMA_AUTO)
    {
        g_mma_mode.store(mode);
    }
    return previous;
}

int dwconv2d_cudnn_version(void)
{
    cudnn::Api const* const a = cudnn::api();
    return a == nullptr ? 0 : static_cast<int>(a->version);
}

int dwconv2d_forward_f32(
    float const* x, float const* w, float const* b, float* y, DWConv2DParams const* params, cudaStream_t stream)
{
    if (params == nullptr || !pointers_ok(x, w, b, y, params))
    {
        return kInvalid;
    }
    int status = 0;
    if (valid(*params) && try_cudnn(x, w, b, y, *params, stream, &status))
    {
        g_last_path = DWCONV2D_PATH_CUDNN;
        return status;
    }
    return run(x, w, b, StoreF32{y}, y, 4, *params, stream);
}

int dwconv2d_forward_f16(
    void const* x, void const* w, void const* b, void* y, DWConv2DParams const* params, cudaStream_t stream)
{
    if (params == nullptr || !pointers_ok(x, w, b, y, params))
    {
        return kInvalid;
    }
    auto const* const xh = static_cast<__half const*>(x);
    auto const* const wh = static_cast<__half const*>(w);
    auto const* const bh = static_cast<__half const*>(b);
    int status = 0;
    if (valid(*params) && try_cudnn(xh, wh, bh, static_cast<__half*>(y), *params, stream, &status))
    {
        g_last_path = DWCONV2D_PATH_CUDNN;
        return status;
    }
    return run(xh, wh, bh, StoreF16{static_cast<__half*>(y)}, y, 2, *params, stream);
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
        return run(x, w, b, make_i8_store(p, static_cast<int8_t*>(y), acc_scale), y, 1, p, stream);
    }
    return run(x, w, b, StoreI8ToF32{static_cast<float*>(y), acc_scale}, y, 4, p, stream);
}

} // extern "C"
