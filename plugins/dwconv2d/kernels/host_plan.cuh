// DWConv2D kernels, Host: validation, per-path planning and launches of our kernels.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "depthwise_tiled.cuh"
#include "depthwise_global.cuh"
#include "depthwise_mma.cuh"
#include "direct.cuh"
#include "implicit_gemm.cuh"
#include "gemm_mma.cuh"

namespace
{

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

// How far ahead depthwise_global prefetches into L2, in percent of a wave (the blocks resident on
// the GPU at once), for a kernel whose default is `pct` (global_prefetch_pct): that default, or for
// the kernels that prefetch, $QUANTBENCH_DWCONV_GLOBAL_PREFETCH (read per call; 0 off).
int global_prefetch_setting(int pct)
{
    if (pct <= 0)
    {
        return 0;
    }
    char const* const env = std::getenv("QUANTBENCH_DWCONV_GLOBAL_PREFETCH");
    if (env != nullptr && *env != '\0')
    {
        return std::max(0, std::min(800, std::atoi(env)));
    }
    return pct;
}

// Whether depthwise_global<KS, S, TIn, TB, Store> is launched as a programmatic dependent
// (cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization):
// DWCONV2D_GLOBAL_PDL, or $QUANTBENCH_DWCONV_PDL (read per call: 0/off, 1/on), and only where the
// kernel that runs was compiled for compute capability 9.0 or later (cudaFuncGetAttributes'
// ptxVersion, asked once and cached): only such code holds the griddepcontrol.wait that makes it
// wait for its predecessors before touching memory (a build for an older target, JIT-compiled
// for this device, would not), so the results are those of a plain launch either way.
template <int KS, int S, class TIn, class TB, class Store>
bool global_pdl()
{
    bool on = DWCONV2D_GLOBAL_PDL != 0;
    char const* const env = std::getenv("QUANTBENCH_DWCONV_PDL");
    if (env != nullptr && *env != '\0')
    {
        on = !(std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0);
    }
    if (!on)
    {
        return false;
    }
    static std::atomic<int> cached_ptx{0};
    int ptx = cached_ptx.load(std::memory_order_relaxed);
    if (ptx <= 0)
    {
        cudaFuncAttributes attr{};
        if (cudaFuncGetAttributes(&attr, depthwise_global_kernel<KS, S, TIn, TB, Store>) != cudaSuccess)
        {
            (void) cudaGetLastError(); // a failed query must not be reported as the launch's error
            return false;
        }
        ptx = attr.ptxVersion;
        cached_ptx.store(ptx, std::memory_order_relaxed);
    }
    return ptx >= 90;
}

// Blocks ahead for the prefetch: pct percent of a wave (the kernel's resident blocks per
// multiprocessor, asked once per kernel and cached, times the current device's multiprocessors,
// stored in *wave); 0 (and *wave 0) when pct is 0 or a query fails (the prefetch is a hint: it
// never changes a result).
template <int KS, int S, class TIn, class TB, class Store>
int32_t global_pf_blocks(int pct, int32_t* wave)
{
    *wave = 0;
    if (pct <= 0)
    {
        return 0;
    }
    static std::atomic<int> cached_per_sm{0};
    int per_sm = cached_per_sm.load(std::memory_order_relaxed);
    int device = 0;
    int sms = 0;
    bool ok = cudaGetDevice(&device) == cudaSuccess
        && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0;
    if (ok && per_sm <= 0)
    {
        ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                 &per_sm, depthwise_global_kernel<KS, S, TIn, TB, Store>, kGlobalThreads, 0)
                == cudaSuccess
            && per_sm > 0;
        if (ok)
        {
            cached_per_sm.store(per_sm, std::memory_order_relaxed);
        }
    }
    if (!ok)
    {
        (void) cudaGetLastError(); // a failed query must not be reported as the launch's error
        return 0;
    }
    *wave = static_cast<int32_t>(std::min<int64_t>(int64_t{sms} * per_sm, INT32_MAX / 2));
    return static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(1, int64_t{pct} * sms * per_sm / 100), INT32_MAX / 2));
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
        constexpr int KS = decltype(ks)::value;
        constexpr int S = decltype(st)::value;
        pl.pf_blocks = global_pf_blocks<KS, S, TIn, TB, Store>(
            global_prefetch_setting(global_prefetch_pct(static_cast<int>(sizeof(TIn)), KS, S)), &pl.wave_blocks);
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(static_cast<unsigned>(kGlobalThreads));
        cfg.dynamicSmemBytes = 0;
        cfg.stream = stream;
        cfg.attrs = &attr;
        cfg.numAttrs = global_pdl<KS, S, TIn, TB, Store>() ? 1U : 0U;
        cudaError_t const err = cudaLaunchKernelEx(&cfg, depthwise_global_kernel<KS, S, TIn, TB, Store>, x, w, b, store, s, pl);
        cudaError_t const last = cudaGetLastError();
        *status = static_cast<int>(err != cudaSuccess ? err : last);
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

} // namespace
