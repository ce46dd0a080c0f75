// DWConv2D kernels, Path depthwise_rows: whole rows by cp.async (the bandwidth path).
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "common.cuh"

namespace
{

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

} // namespace
