// DWConv2D CUDA kernels: convolution with runtime ("dynamic") weights, ONNX Conv semantics plus
// per-batch weights and bias. See dwconv2d.h for the contract (the C ABI below) and the plugin's
// README.md for which path each shape takes and the measurements behind it.
//
// One translation unit, in parts (each includes the parts it builds on):
//
//   common.cuh            types, epilogues (the Store functors every path ends in), shared helpers
//   depthwise_tiled.cuh   C/group == 1 shapes no faster path takes: shared-memory output tiles
//   depthwise_rows.cuh    C/group == 1, 3x3/5x5/7x7, stride 1 or 2: whole rows by cp.async into
//                         persistent blocks (the bandwidth path; dp4a for INT8); its cp.async,
//                         filter packing and row arithmetic are reused by the next three
//   depthwise_global.cuh  depthwise_rows shapes whose rows split into whole segments: rows straight
//                         from global memory, no shared memory
//   depthwise_mma.cuh     FP16 / INT8 depthwise_rows shapes on the tensor cores (Toeplitz bands)
//   direct.cuh            everything else: one thread per output pixel and 4 output channels
//   implicit_gemm.cuh     K/group >= 32 on the CUDA cores (FP32/FP16 without cuDNN, INT8 MMA off)
//   gemm_mma.cuh          grouped and dense INT8 on the integer tensor cores
//   host_plan.cuh         host: validation, each path's plan and launch
//   cudnn.cuh             host: grouped and dense FP32 / FP16 through cuDNN, opened at run time
//   dwconv2d.cu           host: the dispatch between them, and the C API
//
// All paths accumulate in float32 (f32, f16 inputs) or int32 (int8 inputs) and share the same
// epilogues (depthwise_rows through exact equivalents, see StoreI8ToI8::rows_store), so the numerics
// do not depend on the path.

#include "common.cuh"
#include "depthwise_tiled.cuh"
#include "depthwise_rows.cuh"
#include "depthwise_global.cuh"
#include "depthwise_mma.cuh"
#include "direct.cuh"
#include "implicit_gemm.cuh"
#include "gemm_mma.cuh"
#include "host_plan.cuh"
#include "cudnn.cuh"

namespace
{

// ---------------------------------------------------------------------------------------------
// Host dispatch: which path a forward takes
// ---------------------------------------------------------------------------------------------

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
