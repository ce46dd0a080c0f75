// DWConv2D kernels, Path depthwise_mma: FP16 / INT8 depthwise on the tensor cores.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "depthwise_rows.cuh"

namespace
{

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

} // namespace
