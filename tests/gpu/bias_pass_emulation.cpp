// Host emulation of the cuDNN path's bias pass (plugins/dwconv2d/kernels/cudnn.cuh): its source
// text, cut out by tests/gpu/test_bias_pass_emulation.py into bias_body.inc (the launch written as
// emu_launch), compiled with the CUDA shims below; every block and thread runs in turn (the
// kernel's threads do not communicate, and each reads its own elements before it writes them, so
// the in-place add runs the same). Checks every output bit for bit against the add it stands for
// (one float add, one rounding to T), that nothing outside y is written, over shapes whose plane
// lengths take 16-byte, 8-byte and 1-element vectors, misaligned pointers, shared and per-batch
// biases, the fill, the add from a float buffer and the FP32 add in place. A 16-bit stand-in for
// __half (the top half of a float, rounded to nearest even): the FP16 code's indexing and its one
// rounding, not cuda_fp16's conversion.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <vector>
#include <random>
#include <cmath>
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(x)
struct Dim { uint32_t x = 0, y = 0, z = 0; };
static Dim blockIdx, threadIdx, gridDim, blockDim;
struct alignas(16) float4 { float x, y, z, w; };
typedef int cudaError_t; typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
static int cudaGetLastError() { return 0; }
static float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
// a stand-in half: a 16-bit value (float bits >> 16 after round-to-nearest-even on the top 16 bits)
struct __half { uint16_t bits; };
static __half __float2half_rn(float f) { uint32_t u; std::memcpy(&u, &f, 4); uint32_t r = u + 0x7fff + ((u >> 16) & 1); __half h; h.bits = uint16_t(r >> 16); return h; }
static float __half2float(__half h) { uint32_t u = uint32_t(h.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static float bias_to_float(float v) { return v; }
static float bias_to_float(__half v) { return __half2float(v); }
#define DWCONV2D_BIAS_NONE 0
#define DWCONV2D_BIAS_SHARED 1
#define DWCONV2D_BIAS_PER_BATCH 2
struct DWConv2DParams { int32_t batch, out_channels, out_h, out_w, bias_mode; };
static long g_launches = 0, g_threads = 0;
template <class K, class... A>
static void emu_launch(K kernel, uint32_t blocks, uint32_t threads, A... args)
{
    ++g_launches;
    gridDim.x = blocks; blockDim.x = threads;
    for (uint32_t b = 0; b < blocks; ++b)
        for (uint32_t t = 0; t < threads; ++t) { blockIdx.x = b; threadIdx.x = t; ++g_threads; kernel(args...); }
}
#include "bias_body.inc"

static int fails = 0;
template <class T> static float tf(T v) { return bias_to_float(v); }
template <class T> static T fromf(float v);
template <> float fromf<float>(float v) { return v; }
template <> __half fromf<__half>(float v) { return __float2half_rn(v); }
template <class T> static bool same(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

// mode 0: fill; 1: add from a separate float buffer; 2: in place (float only). offset: elements
// the tensors start past a 16-byte boundary (misaligned pointers take narrower vectors)
template <class T>
static void check(int N, int K, int H, int W, int bias_mode, int mode, int yoff, int soff)
{
    DWConv2DParams p{N, K, H, W, bias_mode};
    size_t const n = size_t(N) * K * H * W;
    std::mt19937 rng(N * 131 + K * 7 + H * 3 + W + mode);
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    std::vector<T> ybuf(n + 16 + 8);
    std::vector<float> sbuf(n + 16 + 8);
    std::vector<T> bias(size_t(bias_mode == DWCONV2D_BIAS_PER_BATCH ? N * K : K));
    for (auto& b : bias) b = fromf<T>(u(rng));
    auto align16 = [](void* q) { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(q) + 15) & ~uintptr_t(15)); };
    T* y = static_cast<T*>(align16(ybuf.data())) + yoff;
    float* s = static_cast<float*>(align16(sbuf.data())) + soff;
    T const poison = fromf<T>(12345.f);
    for (size_t i = 0; i < ybuf.size(); ++i) ybuf[i] = poison;
    std::vector<float> conv(n);
    for (auto& c : conv) c = u(rng);
    float* in = nullptr;
    if (mode == 1) { for (size_t i = 0; i < n; ++i) s[i] = conv[i]; in = s; }
    if (mode == 2) { for (size_t i = 0; i < n; ++i) y[i] = fromf<T>(conv[i]); in = reinterpret_cast<float*>(y); }
    int const rc = launch_bias_pass<T>(y, bias.data(), in, p, nullptr);
    int bad = 0;
    for (size_t i = 0; i < n && bad < 3; ++i)
    {
        size_t const plane = i / (size_t(H) * W);
        T const b = bias[bias_mode == DWCONV2D_BIAS_PER_BATCH ? plane : plane % K];
        T const want = mode == 0 ? b : fromf<T>(__fadd_rn(conv[i], tf(b)));
        if (!same(y[i], want)) { ++bad; std::printf("  elem %zu: got %g want %g\n", i, tf(y[i]), tf(want)); }
    }
    // nothing written outside y
    for (T* q = ybuf.data(); q < ybuf.data() + ybuf.size(); ++q)
        if ((q < y || q >= y + n) && !same(*q, poison)) { ++bad; std::printf("  write outside y at %td\n", q - y); break; }
    if (rc != 0 || bad) { ++fails; std::printf("FAIL T=%s N=%d K=%d H=%d W=%d bias=%d mode=%d yoff=%d soff=%d rc=%d\n",
        sizeof(T) == 4 ? "f32" : "f16", N, K, H, W, bias_mode, mode, yoff, soff, rc); }
}

int main()
{
    int count = 0;
    int const shapes[][4] = {{32, 128, 28, 28}, {4, 64, 28, 28}, {2, 32, 16, 16}, {2, 128, 14, 14}, {2, 18, 9, 11},
        {1, 32, 32, 32}, {2, 16, 12, 12}, {3, 5, 7, 7}, {1, 1, 1, 1}, {2, 3, 1, 2}, {5, 7, 2, 4}, {1, 300, 1, 4},
        {2, 40, 23, 15}, {1, 96, 4, 4}, {3, 2, 50, 60}};
    for (auto const& sh : shapes)
        for (int bm : {1, 2})
            for (int yoff : {0, 1, 2})
            {
                check<float>(sh[0], sh[1], sh[2], sh[3], bm, 0, yoff, 0);
                check<float>(sh[0], sh[1], sh[2], sh[3], bm, 2, yoff, 0);
                check<float>(sh[0], sh[1], sh[2], sh[3], bm, 1, yoff, yoff == 2 ? 1 : 0);
                check<__half>(sh[0], sh[1], sh[2], sh[3], bm, 1, yoff, 0);
                check<__half>(sh[0], sh[1], sh[2], sh[3], bm, 1, yoff * 2, 3);
                check<__half>(sh[0], sh[1], sh[2], sh[3], bm, 0, yoff, 0);
                count += 6;
            }
    std::printf("%d checks, %d failed; %ld launches, %ld threads\n", count, fails, g_launches, g_threads);
    return fails != 0;
}
