// DWConv2D kernels, Path gemm_mma: grouped and dense INT8 on the integer tensor cores.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "depthwise_rows.cuh"

namespace
{

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

} // namespace
