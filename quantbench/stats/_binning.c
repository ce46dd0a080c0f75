/* The binning kernels of quantbench.stats.binning in C: the numba kernels' exact arithmetic,
 * with nothing to load at run time (numba's import and cached code cost most of a second of
 * one core and 110-150 MiB of resident memory in every calibration that used them).
 *
 * Built by setuptools as the optional extension quantbench.stats._binning_c (an empty Python
 * module: binning.py calls these functions through ctypes, which releases the GIL, so several
 * threads bin at once). Compile without -ffast-math: every value's bin is IEEE double
 * arithmetic, the same as numba's and the numpy fallback's.
 *
 * Bin of a finite value v at scale s = 2**-e: HALF_BINS + floor(v * s), except that a value
 * below 0 whose product underflowed to -0.0 goes to bin -1 (HALF_BINS - 1); clamped to the
 * counts (a value off the grid is a caller's bug and must never write outside them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#define HALF_BINS 16384
#define NUM_BINS (2 * HALF_BINS)

static inline int32_t bin_index(double v, double scale) {
    double q = v * scale;
    /* q clamped to the grid first (NaN too: it fails both tests), so the conversion is
     * defined and every index lands in the counts (a value off the grid is a caller's bug,
     * counted in an end bin); floor(q) without a libm call or a branch (a branch on random
     * zeros mispredicts): truncate, then step down where that rounded up (q < 0 and not
     * whole) or where q is -0.0 from a value below 0 */
    q = q >= -HALF_BINS ? q : -HALF_BINS;
    q = q <= HALF_BINS - 1 ? q : HALF_BINS - 1;
    int32_t k = (int32_t)q;
    k -= (q < (double)k) | ((q == 0.0) & (v < 0.0));
    return k + HALF_BINS;
}

/* values whose bins are computed together (vectorised) before they are counted */
#define BIN_BLOCK 256

#if defined(__SSE2__)
#include <emmintrin.h>

/* bin_index of two values (SSE2, in every x86-64): the same steps lane by lane; the caller
 * checked that every value is finite */
static inline __m128i bin_index2(__m128d v, __m128d scale) {
    const __m128d lo = _mm_set1_pd(-HALF_BINS), hi = _mm_set1_pd(HALF_BINS - 1);
    const __m128d zero = _mm_setzero_pd();
    __m128d q = _mm_min_pd(_mm_max_pd(_mm_mul_pd(v, scale), lo), hi);
    __m128i k = _mm_cvttpd_epi32(q);
    __m128d down = _mm_or_pd(_mm_cmplt_pd(q, _mm_cvtepi32_pd(k)),
                             _mm_and_pd(_mm_cmpeq_pd(q, zero), _mm_cmplt_pd(v, zero)));
    /* the two 64-bit masks (0 or -1) as the low two 32-bit lanes, added: k - 1 where set */
    __m128i step = _mm_shuffle_epi32(_mm_castpd_si128(down), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm_add_epi32(_mm_add_epi32(k, step), _mm_set1_epi32(HALF_BINS));
}

static inline void block_index_f32(const float *x, int64_t m, double scale, int32_t *idx) {
    const __m128d s = _mm_set1_pd(scale);
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) {
        __m128 f = _mm_loadu_ps(x + j);
        __m128i a = bin_index2(_mm_cvtps_pd(f), s);
        __m128i b = bin_index2(_mm_cvtps_pd(_mm_movehl_ps(f, f)), s);
        _mm_storeu_si128((__m128i *)(idx + j), _mm_unpacklo_epi64(a, b));
    }
    for (; j < m; j++) idx[j] = bin_index((double)x[j], scale);
}

static inline void block_index_f64(const double *x, int64_t m, double scale, int32_t *idx) {
    const __m128d s = _mm_set1_pd(scale);
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) {
        __m128i a = bin_index2(_mm_loadu_pd(x + j), s);
        __m128i b = bin_index2(_mm_loadu_pd(x + j + 2), s);
        _mm_storeu_si128((__m128i *)(idx + j), _mm_unpacklo_epi64(a, b));
    }
    for (; j < m; j++) idx[j] = bin_index(x[j], scale);
}
#else
static inline void block_index_f32(const float *x, int64_t m, double scale, int32_t *idx) {
    for (int64_t j = 0; j < m; j++) idx[j] = bin_index((double)x[j], scale);
}

static inline void block_index_f64(const double *x, int64_t m, double scale, int32_t *idx) {
    for (int64_t j = 0; j < m; j++) idx[j] = bin_index(x[j], scale);
}
#endif

/* Count the bins idx[0..m) into the four sub-histograms, value j into sub-histogram j % 4: a
 * run of equal bins (a ReLU's zeros) waits on four counters in turn, not on one. */
static inline void add_block(const int32_t *idx, int64_t m, int32_t *sub) {
    int32_t *s0 = sub, *s1 = sub + NUM_BINS, *s2 = sub + 2 * NUM_BINS, *s3 = sub + 3 * NUM_BINS;
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) {
        s0[idx[j]] += 1;
        s1[idx[j + 1]] += 1;
        s2[idx[j + 2]] += 1;
        s3[idx[j + 3]] += 1;
    }
    for (; j < m; j++) sub[(j & 3) * NUM_BINS + idx[j]] += 1;
}

/* Whether every value of a block is finite (no branch inside the loop). */
#define BLOCK_FINITE(T, SUFFIX)                                                              \
    static inline int block_finite_##SUFFIX(const T *x, int64_t m) {                         \
        int bad = 0;                                                                         \
        for (int64_t j = 0; j < m; j++) bad |= ((double)x[j] - (double)x[j] != 0.0);         \
        return !bad;                                                                         \
    }
BLOCK_FINITE(float, f32)
BLOCK_FINITE(double, f64)

/* One value into a range: a NaN or an Inf counted, a finite value widening [lo, hi]; whether
 * it was finite. */
static inline int range_add(double v, double *lo, double *hi, int64_t *nan, int64_t *inf) {
    if (v != v) {
        *nan += 1;
        return 0;
    }
    if (v - v != 0.0) {
        *inf += 1;
        return 0;
    }
    *lo = v < *lo ? v : *lo;
    *hi = v > *hi ? v : *hi;
    return 1;
}

static void store_range(double *result, int64_t *counts, double lo, double hi, int64_t nan,
                        int64_t inf) {
    result[0] = lo;
    result[1] = hi;
    counts[0] = nan;
    counts[1] = inf;
}

/* bin_kernel / count_kernel / bin_direct_kernel / count_direct_kernel for one input type:
 * "sub" is four interleaved int32 sub-histograms (4 x NUM_BINS), "out" the int64 counts. */
#define KERNELS(T, SUFFIX)                                                                   \
    void qb_bin_##SUFFIX(const T *x, int64_t n, double scale, int32_t *sub) {               \
        int32_t idx[BIN_BLOCK];                                                              \
        for (int64_t start = 0; start < n; start += BIN_BLOCK) {                             \
            int64_t m = n - start < BIN_BLOCK ? n - start : BIN_BLOCK;                       \
            block_index_##SUFFIX(x + start, m, scale, idx);                                  \
            add_block(idx, m, sub);                                                          \
        }                                                                                    \
    }                                                                                        \
    /* the finite values only: a block holding NaN/Inf is counted value by value */          \
    void qb_count_##SUFFIX(const T *x, int64_t n, double scale, int32_t *sub) {             \
        int32_t idx[BIN_BLOCK];                                                              \
        for (int64_t start = 0; start < n; start += BIN_BLOCK) {                             \
            int64_t m = n - start < BIN_BLOCK ? n - start : BIN_BLOCK;                       \
            const T *xs = x + start;                                                         \
            if (block_finite_##SUFFIX(xs, m)) {                                              \
                block_index_##SUFFIX(xs, m, scale, idx);                                     \
                add_block(idx, m, sub);                                                      \
                continue;                                                                    \
            }                                                                                \
            for (int64_t j = 0; j < m; j++) {                                                \
                double v = (double)xs[j];                                                    \
                if (v - v == 0.0) sub[(j & 3) * NUM_BINS + bin_index(v, scale)] += 1;        \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    void qb_bin_direct_##SUFFIX(const T *x, int64_t n, double scale, int64_t *out) {        \
        for (int64_t i = 0; i < n; i++) {                                                    \
            out[bin_index((double)x[i], scale)] += 1;                                        \
        }                                                                                    \
    }                                                                                        \
    void qb_count_direct_##SUFFIX(const T *x, int64_t n, double scale, int64_t *out) {      \
        for (int64_t i = 0; i < n; i++) {                                                    \
            double v = (double)x[i];                                                         \
            if (v - v == 0.0) {                                                              \
                out[bin_index(v, scale)] += 1;                                               \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    /* min/max/NaN/Inf of x and, while every finite value fits, its bins; result[] =        \
     * {lo, hi}, counts[] = {nan, inf, fits} */                                              \
    void qb_scan_##SUFFIX(const T *x, int64_t n, double scale, int32_t *sub, double *result, \
                          int64_t *counts) {                                                 \
        double lo = INFINITY, hi = -INFINITY;                                                \
        int64_t nan = 0, inf = 0, fits = 1;                                                  \
        for (int64_t i = 0; i < n; i++) {                                                    \
            double v = (double)x[i];                                                         \
            if (range_add(v, &lo, &hi, &nan, &inf) && fits) {                                \
                if (fabs(v) * scale < HALF_BINS) {                                           \
                    sub[(i & 3) * NUM_BINS + bin_index(v, scale)] += 1;                      \
                } else {                                                                     \
                    fits = 0;                                                                \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        store_range(result, counts, lo, hi, nan, inf);                                       \
        counts[2] = fits;                                                                    \
    }

KERNELS(float, f32)
KERNELS(double, f64)

/* Add the sub-histograms into out (store: overwrite it) and zero them, in one read of each. */
void qb_drain(int32_t *sub, int64_t *out, int store) {
    for (int64_t b = 0; b < NUM_BINS; b++) {
        int64_t total = (int64_t)sub[b] + sub[NUM_BINS + b] + sub[2 * NUM_BINS + b] +
                        sub[3 * NUM_BINS + b];
        out[b] = store ? total : out[b] + total;
        sub[b] = sub[NUM_BINS + b] = sub[2 * NUM_BINS + b] = sub[3 * NUM_BINS + b] = 0;
    }
}

/* Range of the finite values and NaN/Inf counts of x, in one read (numpy's min and max are two
 * reads, each from memory for a tensor larger than the cache): result[] = {lo, hi} (inf, -inf
 * when no value is finite), counts[] = {nan, inf}. A zero extreme may come out as either signed
 * zero, as numpy's may: both weigh the same everywhere a range is used. */
#define RANGE_SCALAR(T, SUFFIX)                                                              \
    static void range_scalar_##SUFFIX(const T *x, int64_t n, double *lo, double *hi,         \
                                      int64_t *nan, int64_t *inf) {                          \
        for (int64_t i = 0; i < n; i++) range_add((double)x[i], lo, hi, nan, inf);           \
    }
RANGE_SCALAR(float, f32)
RANGE_SCALAR(double, f64)

void qb_range_f32(const float *x, int64_t n, double *result, int64_t *counts) {
    double lo = INFINITY, hi = -INFINITY;
    int64_t nan = 0, inf = 0, i = 0;
#if defined(__SSE2__)
    /* 64 values a step, four accumulators each way; sum(v - v) over the step stays 0 while
     * every value is finite (NaN otherwise): a step that held NaN/Inf is read again by the
     * scalar loop, which counts them */
    __m128 lo4[4], hi4[4];
    for (int k = 0; k < 4; k++) {
        lo4[k] = _mm_set1_ps(INFINITY);
        hi4[k] = _mm_set1_ps(-INFINITY);
    }
    for (; i + 64 <= n; i += 64) {
        __m128 l[4] = {lo4[0], lo4[1], lo4[2], lo4[3]}, h[4] = {hi4[0], hi4[1], hi4[2], hi4[3]};
        __m128 check = _mm_setzero_ps();
        for (int j = 0; j < 64; j += 16) {
            for (int k = 0; k < 4; k++) {
                __m128 v = _mm_loadu_ps(x + i + j + 4 * k);
                check = _mm_add_ps(check, _mm_sub_ps(v, v));
                l[k] = _mm_min_ps(l[k], v);
                h[k] = _mm_max_ps(h[k], v);
            }
        }
        if (_mm_movemask_ps(_mm_cmpeq_ps(check, _mm_setzero_ps())) != 0xF) {
            range_scalar_f32(x + i, 64, &lo, &hi, &nan, &inf);
            continue;
        }
        for (int k = 0; k < 4; k++) {
            lo4[k] = l[k];
            hi4[k] = h[k];
        }
    }
    for (int k = 0; k < 4; k++) {
        float l[4], h[4];
        _mm_storeu_ps(l, lo4[k]);
        _mm_storeu_ps(h, hi4[k]);
        for (int m = 0; m < 4; m++) {
            lo = (double)l[m] < lo ? (double)l[m] : lo;
            hi = (double)h[m] > hi ? (double)h[m] : hi;
        }
    }
#endif
    range_scalar_f32(x + i, n - i, &lo, &hi, &nan, &inf);
    store_range(result, counts, lo, hi, nan, inf);
}

/* float64 data is rare (a model computing in double): the scalar loop */
void qb_range_f64(const double *x, int64_t n, double *result, int64_t *counts) {
    double lo = INFINITY, hi = -INFINITY;
    int64_t nan = 0, inf = 0;
    range_scalar_f64(x, n, &lo, &hi, &nan, &inf);
    store_range(result, counts, lo, hi, nan, inf);
}

/* The grid the kernels were compiled for: binning.py refuses the library when it differs. */
int64_t qb_half_bins(void) { return HALF_BINS; }

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_binning_c",
    "quantbench's binning kernels (called through ctypes by quantbench.stats.binning)", -1, NULL,
};

PyMODINIT_FUNC PyInit__binning_c(void) { return PyModule_Create(&module); }
