// DWConv2D kernels, Host: the cuDNN path for grouped and dense FP32 / FP16, opened at run time.
// A part of kernels/dwconv2d.cu (one translation unit: it includes the parts in order).

#pragma once

#include "host_plan.cuh"

namespace
{

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
// fallback; FP32 also mode B) give engine configurations; those whose numerical notes say
// anything but a plain float sum of products, or for FP32 an FFT (fft_allowed), are dropped
// (Winograd, down-converted inputs, reduced-precision reduction, and tensor cores for FP32, i.e.
// TF32; FP16 keeps tensor cores with FP32 accumulation), as are legacy algorithms other than the
// GEMM-like, direct and (FP32) FFT ones (legacy FP32 with CUDNN_FMA_MATH). Every candidate (the
// backend's plans and legacy Find's best) is timed on the caller's own buffers and the fastest is
// kept: the measured half of the dispatch table. The
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

// FP32 with a bias, the "post" plans (kKindScratch for FP32): the convolution alone (beta = 0)
// written into y, then our bias pass adds the bias in place (as torch runs a conv and then adds
// its bias); the "blend" plans: the bias filled into y first, then the convolution with beta = 1.
// The same two float roundings either way (the convolution rounded to float, then the sum).
// 0: blends only; 1: both timed, with the fill or the pass each needs, the faster kept (the
// default since session 29: on the H100 the dense 3x3 C=128 shape took a post plan, 133.4 us
// against 137.0 us with blends only, torch 136.8 / 137.4 us; see the README's "Session 29");
// 2: post plans only (for measuring). Compile-time default -D DWCONV2D_CUDNN_F32_POST, overridden
// at the first plan by $QUANTBENCH_DWCONV_CUDNN_F32_POST (0 / 1 / 2). For the dense 3x3 C=128
// FP32 shortfall against torch (issue 39; tests/gpu/dense_bias_probe.py).
#ifndef DWCONV2D_CUDNN_F32_POST
#define DWCONV2D_CUDNN_F32_POST 1
#endif

int cudnn_f32_post_mode()
{
    static int const mode = [] {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN_F32_POST");
        if (env != nullptr && (env[0] == '0' || env[0] == '1' || env[0] == '2') && env[1] == '\0')
        {
            return env[0] - '0';
        }
        return DWCONV2D_CUDNN_F32_POST;
    }();
    return mode;
}

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
// FP32: 0-5, a plain sum of products or an FFT; FP16: 0-3. With Winograd (6, 7) allowed, the dense
// 3x3 C=128 case came out 1.0e-5 of max|y| away from the reference (H200), at our FP32 bound;
// torch's FFT engine on the same shape 3.2e-7 (fft_allowed).
// $QUANTBENCH_DWCONV_CUDNN_ALGOS (tuning only: a bit per algo) replaces both masks.
bool fft_allowed();
bool algo_allowed(int algo, bool half)
{
    static int const mask = [] {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN_ALGOS");
        return env != nullptr ? static_cast<int>(std::strtol(env, nullptr, 0)) : -1;
    }();
    int const use = mask >= 0 ? mask : (!half && fft_allowed() ? 0x3F : 0x0F);
    return algo >= 0 && algo < kAlgoCount && ((use >> algo) & 1) != 0;
}

// FP32 convolutions by FFT (legacy algorithms 4 and 5, backend engines whose only numerical note
// is FFT): its error is bounded by the norm of a tile rather than by each output's own sum, but
// it is a float computation with float accumulation, no TF32, no down-converted inputs: torch's
// cuDNN keeps it for the dense 3x3 C=128 shape (3.2e-7 of max|y| against float64 there, our
// FP32 bound is 1e-5), twice as fast as any plain-sum engine. $QUANTBENCH_DWCONV_CUDNN_FFT=0
// keeps FP32 on plain sums only. FP16 never takes it.
bool fft_allowed()
{
    static bool const on = [] {
        char const* env = std::getenv("QUANTBENCH_DWCONV_CUDNN_FFT");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    return on;
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
    kHeurB = 1,
    kHeurFallback = 2,
    // cudnnBackendNumericalNote_t: TENSOR_CORE 0, DOWN_CONVERT_INPUTS 1,
    // REDUCED_PRECISION_REDUCTION 2, FFT 3, NONDETERMINISTIC 4, WINOGRAD 5, WINOGRAD_TILE_4x4 6,
    // _6x6 7, _13x13 8, STRICT_NAN_PROP 9 (cuDNN 9). cudnnBackendBehaviorNote_t:
    // RUNTIME_COMPILATION 0.
    kNoteTensorCore = 0,
    kNoteFft = 3,
    kNoteNondeterministic = 4,
    kBehaviorRuntimeCompilation = 0,
};

// An engine's arithmetic is acceptable when it is a plain sum of products in float, or for FP32 an
// FFT (fft_allowed): no Winograd, no down-converted inputs or reduced-precision reduction, and for
// FP32 no tensor cores (which would mean TF32). Nondeterministic (split reductions) is fine;
// tensor cores for FP16 (FP16 products, FP32 accumulation) are fine. Note 9 (STRICT_NAN_PROP in
// cuDNN 9, as far as we know) is refused too, as in the H200 run that measured this code.
bool notes_ok(int const* notes, int64_t n, bool half)
{
    for (int64_t i = 0; i < n; ++i)
    {
        int const note = notes[i];
        bool const ok = note == kNoteNondeterministic || (half && note == kNoteTensorCore)
            || (!half && note == kNoteFft && fft_allowed());
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
        if (chosen < 0 && r.status == kSuccess && math_ok && algo_allowed(r.algo, half) && r.memory <= kCudnnMaxWorkspace)
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

// The bias pass: y = round(in + bias) per element, one rounding to T (in: the convolution in
// float; in == y, in place, for T == float: the FP32 "post" plans), or y = bias where in ==
// nullptr (the fill before a beta = 1 blend). Bandwidth-bound, so it is written as an in-place
// add should be: V elements per vector (16-byte stores where the plane's length and the pointers
// allow, else V = 1), U vectors per thread all requested before the first is used (U * V * 4
// bytes of input in flight per thread), one pass of a grid that covers the tensor once. The
// planes are contiguous, so vector i lies in plane i / vpp (vpp = hw / V vectors per plane; V
// divides hw): each thread divides once for its first vector and steps the plane and the
// bias index (plane % K, or the plane itself for per-batch biases) forward by the block's
// width for the next, with no division per element. 32-bit indices: the cuDNN path only takes
// tensors of at most INT32_MAX elements (cudnn_preferred), and launch_bias_pass refuses more.
template <class T, int V>
struct alignas(sizeof(T) * V) BiasPack
{
    T v[V];
};

__device__ inline float bias_round(float v, float const*)
{
    return v;
}

__device__ inline __half bias_round(float v, __half const*)
{
    return __float2half_rn(v);
}

constexpr int kBiasThreads = 256;

template <int V>
__host__ __device__ constexpr int bias_unroll()
{
    return V == 1 ? 8 : 4;
}

template <class T, int V, bool kAdd>
__global__ void __launch_bounds__(kBiasThreads) bias_pass_kernel(T* y, T const* __restrict__ b, float const* in,
    uint32_t nvec, uint32_t vpp, uint32_t bias_mod, uint32_t step_rem, uint32_t step_bias)
{
    constexpr int U = bias_unroll<V>();
    uint32_t i = blockIdx.x * static_cast<uint32_t>(kBiasThreads * U) + threadIdx.x;
    uint32_t const plane = i / vpp;
    uint32_t rem = i - plane * vpp;
    uint32_t bi = plane % bias_mod; // bias_mod: K, or 0xffffffff for per-batch biases (bi = plane)
    uint32_t idx[U];
    T bias[U];
    float acc[U][V];
#pragma unroll
    for (int j = 0; j < U; ++j)
    {
        idx[j] = i;
        bool const live = i < nvec;
        bias[j] = live ? b[bi] : T{};
        if (kAdd && live)
        {
            if constexpr (V == 1)
            {
                acc[j][0] = in[i];
            }
            else
            {
#pragma unroll
                for (int q = 0; q < V / 4; ++q)
                {
                    float4 const f = reinterpret_cast<float4 const*>(in + static_cast<size_t>(i) * V)[q];
                    acc[j][4 * q] = f.x;
                    acc[j][4 * q + 1] = f.y;
                    acc[j][4 * q + 2] = f.z;
                    acc[j][4 * q + 3] = f.w;
                }
            }
        }
        // the next vector of this thread, kBiasThreads further: kBiasThreads / vpp planes and
        // step_rem = kBiasThreads % vpp vectors on, the bias index step_bias (+ 1 on a carry) on
        i += kBiasThreads;
        rem += step_rem;
        uint32_t const carry = rem >= vpp ? 1U : 0U;
        rem -= carry * vpp;
        bi += step_bias + carry; // step_bias < bias_mod and bi < bias_mod: at most one wrap
        bi -= bi >= bias_mod ? bias_mod : 0U;
    }
#pragma unroll
    for (int j = 0; j < U; ++j)
    {
        if (idx[j] >= nvec)
        {
            continue;
        }
        float const bf = bias_to_float(bias[j]);
        BiasPack<T, V> pk;
#pragma unroll
        for (int e = 0; e < V; ++e)
        {
            pk.v[e] = kAdd ? bias_round(__fadd_rn(acc[j][e], bf), y) : bias[j];
        }
        reinterpret_cast<BiasPack<T, V>*>(y)[idx[j]] = pk;
    }
}

template <class T, int V>
cudaError_t launch_bias_pass_v(T* y, T const* b, float const* in, uint32_t planes, uint32_t hw, uint32_t K, bool per_batch,
    cudaStream_t stream)
{
    constexpr uint32_t U = bias_unroll<V>();
    uint32_t const vpp = hw / V;
    uint32_t const nvec = planes * vpp;
    uint32_t const mod = per_batch ? 0xffffffffU : K;
    uint32_t const step_planes = kBiasThreads / vpp;
    uint32_t const blocks = (nvec + kBiasThreads * U - 1) / (kBiasThreads * U);
    auto const kernel = in != nullptr ? bias_pass_kernel<T, V, true> : bias_pass_kernel<T, V, false>;
    kernel<<<blocks, kBiasThreads, 0, stream>>>(
        y, b, in, nvec, vpp, mod, kBiasThreads % vpp, per_batch ? step_planes : step_planes % K);
    return cudaGetLastError();
}

// scratch == nullptr: y[n, k, :, :] = bias (the convolution then adds its sum with beta = 1);
// else y = round(scratch + bias), one rounding to T (scratch == y: in place, T == float only).
template <class T>
cudaError_t launch_bias_pass(T* y, T const* b, float const* scratch, DWConv2DParams const& p, cudaStream_t stream)
{
    int64_t const hw = static_cast<int64_t>(p.out_h) * p.out_w;
    int64_t const planes = static_cast<int64_t>(p.batch) * p.out_channels;
    if (planes * hw > INT32_MAX || planes * hw <= 0)
    {
        return planes * hw <= 0 ? cudaSuccess : cudaErrorInvalidValue; // cudnn_preferred keeps such tensors off
    }
    bool const per_batch = p.bias_mode == DWCONV2D_BIAS_PER_BATCH;
    constexpr int kWide = 16 / static_cast<int>(sizeof(T)); // elements per 16-byte store: 4 floats, 8 halves
    auto const aligned = [](void const* ptr) { return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    auto const P = static_cast<uint32_t>(planes);
    auto const H = static_cast<uint32_t>(hw);
    auto const K = static_cast<uint32_t>(p.out_channels);
    if (hw % kWide == 0 && aligned(y) && aligned(scratch))
    {
        return launch_bias_pass_v<T, kWide>(y, b, scratch, P, H, K, per_batch, stream);
    }
    if (kWide > 4 && hw % 4 == 0 && reinterpret_cast<uintptr_t>(y) % (4 * sizeof(T)) == 0 && aligned(scratch))
    {
        return launch_bias_pass_v<T, 4>(y, b, scratch, P, H, K, per_batch, stream);
    }
    return launch_bias_pass_v<T, 1>(y, b, scratch, P, H, K, per_batch, stream);
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
    // scratch kind: FP16 writes a float buffer of ours (16-byte aligned), FP32 y itself (post plans)
    bool const own_buffer = kind == kKindScratch && half;
    Desc const yt = B.tensor(3, kind == kKindScratch ? kFloat : dt, f.n, f.k, f.ho, f.wo, own_buffer ? 16 : align, false);
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
    // FP32 asks mode B too (slower to ask, once per plan): it lists the FFT engines torch's
    // benchmark finds, which instant and fallback do not (fft_allowed)
    bool const with_b = !half && fft_allowed();
    for (int heur_mode : {static_cast<int>(kHeurInstant), with_b ? static_cast<int>(kHeurB) : -1,
             static_cast<int>(kHeurFallback)})
    {
        if (heur_mode < 0)
        {
            continue;
        }
        Desc const heur = ok ? B.make(kDescEngineHeur) : nullptr;
        int64_t count = 0;
        bool const hok = ok && B.set(heur, kAttrHeurOpGraph, kTypeBackendDescriptor, 1, &graph)
            && B.set(heur, kAttrHeurMode, kTypeHeurMode, 1, &heur_mode) && B.finalize(heur)
            && a.BackendGetAttribute(heur, kAttrHeurResults, kTypeBackendDescriptor, 0, &count, nullptr) == kSuccess;
        // FP32 looks further down the lists: its first configurations are mostly TF32 (refused,
        // never timed), and an FFT engine may come after them
        int64_t const max_configs = with_b ? 48 : 10;
        std::vector<Desc> cfgs(static_cast<size_t>(hok ? std::min(count, max_configs) : 0));
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
        int const post = bias ? cudnn_f32_post_mode() : 0; // FP32 here (FP16 with a bias is `split`)
        if (post == 2)
        {
            cands.clear();
        }
        if (post != 0)
        {
            std::vector<Plan> more = backend_plans(handle, prm, half, kKindScratch, align);
            cands.insert(cands.end(), more.begin(), more.end());
        }
    }
    size_t ws_bytes = 0;
    bool const any_scratch = split; // FP32 post plans write y itself
    for (Plan const& c : cands)
    {
        ws_bytes = std::max(ws_bytes, c.workspace);
    }
    size_t const total = round256(ws_bytes) + (any_scratch ? scratch_bytes(prm) : 0);
    auto* const base = static_cast<unsigned char*>(total > 0 ? thread_workspace(device, stream, total, true) : nullptr);
    void* const ws = ws_bytes > 0 ? base : nullptr;
    float* const scratch = any_scratch && base != nullptr ? reinterpret_cast<float*>(base + round256(ws_bytes))
        : half                                            ? nullptr
                                                          : reinterpret_cast<float*>(y);
    cudaEvent_t start = nullptr, stop = nullptr;
    bool const events
        = (total == 0 || base != nullptr) && cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
    int best = -1;
    for (size_t i = 0; events && i < cands.size(); ++i)
    {
        Plan& c = cands[i];
        // a blend with a bias is timed with the bias fill it needs, a scratch or post plan with
        // its bias pass after it
        bool const prefill = bias && (c.kind == kKindLegacy || c.kind == kKindBlend);
        auto const once = [&]() {
            if (prefill && launch_bias_pass<T>(y, b, nullptr, prm, stream) != cudaSuccess)
            {
                return false;
            }
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
    size_t const total = ws_round + (plan.kind == cudnn::kKindScratch && kHalf ? cudnn::scratch_bytes(p) : 0);
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
    // FP16: the float buffer after the workspace; FP32 post plans: y itself, the bias added in place
    float* const scratch = plan.kind != cudnn::kKindScratch ? nullptr
        : kHalf                                            ? reinterpret_cast<float*>(base + ws_round)
                                                           : reinterpret_cast<float*>(y);
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

} // namespace
