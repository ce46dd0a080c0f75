// DWConv2D kernels, Types, epilogues and device helpers every path shares.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

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

// Threads per block of depthwise_tiled, direct and implicit_gemm (their __launch_bounds__).
constexpr int kMaxThreads = 256;

} // namespace
