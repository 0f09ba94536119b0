/* stats.c: level-5 tensor statistics on the CPU (min, max, mean, NaN and Inf counts) in one
 * pass over tensor memory, any dtype and any strides; kernels/cuda/stats.cu is the GPU twin. */
#include "flashinfer_kernels.h"

#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_simd.h"
#include "fi_numeric.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* ---- memory layout ---------------------------------------------------------------- */

/* A tensor's memory as dimensions sorted by byte step, outermost first, with size-1
 * dimensions dropped, negative steps flipped, stride-0 dimensions folded into repeat and
 * dimensions that tile each other merged. Statistics do not depend on element order. */
typedef struct {
    const char *data;
    int ndim; /* >= 1 */
    int64_t shape[FI_MAX_DIMS];
    int64_t step[FI_MAX_DIMS]; /* bytes */
    int64_t repeat;            /* how many logical elements each visited element stands for */
} stats_layout;

/* Fills L from t; returns -1 for a negative size, a size or stride product that overflows,
 * or a NULL data pointer with elements to read. *numel gets the element count. */
static int layout_from_tensor(const fi_tensor *t, int64_t esize, stats_layout *L, int64_t *numel)
{
    if (t->ndim < 0 || t->ndim > FI_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n))
            return -1;
    }
    *numel = n;
    memset(L, 0, sizeof(*L));
    L->repeat = 1;
    if (n == 0)
        return 0;
    if (!t->data)
        return -1;
    const char *base = (const char *)t->data;
    int64_t span = 0;
    int nd = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t size = t->shape[i], step;
        if (size == 1)
            continue;
        if (__builtin_mul_overflow(t->stride[i], esize, &step))
            return -1;
        if (step == 0) {
            L->repeat *= size;
            continue;
        }
        int64_t extent; /* (size - 1) * |step| */
        if (step == INT64_MIN ||
            __builtin_mul_overflow(size - 1, step < 0 ? -step : step, &extent) ||
            __builtin_add_overflow(span, extent, &span))
            return -1;
        if (step < 0) {
            base -= extent;
            step = -step;
        }
        /* insertion sort, largest step first */
        int j = nd++;
        for (; j > 0 && L->step[j - 1] < step; j--) {
            L->step[j] = L->step[j - 1];
            L->shape[j] = L->shape[j - 1];
        }
        L->step[j] = step;
        L->shape[j] = size;
    }
    L->data = base;
    if (nd == 0) {
        L->ndim = 1;
        L->shape[0] = 1;
        L->step[0] = esize;
        return 0;
    }
    /* merge an outer dimension into the inner one when it steps exactly over it */
    int out = nd - 1;
    for (int i = nd - 2; i >= 0; i--) {
        if (L->step[i] == L->step[out] * L->shape[out]) {
            L->shape[out] *= L->shape[i];
        } else {
            out--;
            L->shape[out] = L->shape[i];
            L->step[out] = L->step[i];
        }
    }
    L->ndim = nd - out;
    memmove(L->shape, L->shape + out, sizeof(int64_t) * (size_t)L->ndim);
    memmove(L->step, L->step + out, sizeof(int64_t) * (size_t)L->ndim);
    return 0;
}

typedef void (*row_fn)(void *acc, const char *p, int64_t n, int64_t step);

/* Calls row once per innermost row of L, walking the outer dimensions as an odometer. */
static void layout_walk(const stats_layout *L, row_fn row, void *acc)
{
    int inner = L->ndim - 1;
    int64_t idx[FI_MAX_DIMS] = {0};
    const char *p = L->data;
    for (;;) {
        row(acc, p, L->shape[inner], L->step[inner]);
        int d = inner - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < L->shape[d]) {
                p += L->step[d];
                break;
            }
            p -= (L->shape[d] - 1) * L->step[d];
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* ---- row kernels -------------------------------------------------------------------- */

#define LANES 8     /* independent integer accumulators */
#define CHUNK 65536 /* elements per flush of the 32-bit lane counters */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    double min, max, sum; /* over non-NaN elements */
    int64_t nan, inf;
} float_acc;

typedef struct {
    __int128 sum;
    int64_t min, max;
} int_acc;

typedef struct {
    unsigned __int128 sum;
    uint64_t min, max;
} uint64_acc;

typedef struct {
    uint64_t count[256];
} byte_hist;

/* Four lanes of float32 (two of float64) in GCC/Clang vector extensions: plain C
 * arithmetic that compiles to SSE2 on x86-64 and NEON on arm64 without -ffast-math. */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef double f64x2 __attribute__((vector_size(16)));
typedef int64_t i64x2 __attribute__((vector_size(16)));

ALWAYS_INLINE f32x4 select_f32x4(i32x4 mask, f32x4 a, f32x4 b)
{
    return (f32x4)((mask & (i32x4)a) | (~mask & (i32x4)b));
}

ALWAYS_INLINE f64x2 select_f64x2(i64x2 mask, f64x2 a, f64x2 b)
{
    return (f64x2)((mask & (i64x2)a) | (~mask & (i64x2)b));
}

/* binary16 codes (in the low half of each lane) -> float32, without branches (the
 * float-bits trick of the FP16 library): exact for subnormals, infinities and NaNs. */
ALWAYS_INLINE f32x4 f16x4_to_f32x4(u32x4 h)
{
    u32x4 w = h << 16;
    u32x4 sign = w & 0x80000000u;
    u32x4 two_w = w + w;
    f32x4 normal = (f32x4)((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    f32x4 denormal = (f32x4)((two_w >> 17) | (126u << 23)) - 0.5f;
    i32x4 is_denormal = two_w < (1u << 27);
    return (f32x4)(sign | (u32x4)select_f32x4(is_denormal, denormal, normal));
}

enum { LOAD_F32, LOAD_F16, LOAD_BF16 };

ALWAYS_INLINE f32x4 half_to_f32x4(u32x4 h, int kind)
{
    return kind == LOAD_BF16 ? (f32x4)(h << 16) : f16x4_to_f32x4(h);
}

/* Loads eight elements step bytes apart as two float32 vectors, in no particular order:
 * sixteen contiguous bytes of a 2-byte kind are split into the low and high halves of
 * each 32-bit lane. */
ALWAYS_INLINE void load_f32x8(const char *p, int64_t step, int kind, f32x4 *v0, f32x4 *v1)
{
    if (kind == LOAD_F32) {
        if (step == 4) {
            memcpy(v0, p, 16);
            memcpy(v1, p + 16, 16);
            return;
        }
        for (int j = 0; j < 4; j++) {
            memcpy((char *)v0 + 4 * j, p + j * step, 4);
            memcpy((char *)v1 + 4 * j, p + (j + 4) * step, 4);
        }
        return;
    }
    if (step == 2) {
        u32x4 w;
        memcpy(&w, p, 16);
        *v0 = half_to_f32x4(w & 0xffff, kind);
        *v1 = half_to_f32x4(w >> 16, kind);
        return;
    }
    u32x4 h0, h1;
    for (int j = 0; j < 4; j++) {
        uint16_t b0, b1;
        memcpy(&b0, p + j * step, 2);
        memcpy(&b1, p + (j + 4) * step, 2);
        h0[j] = b0;
        h1[j] = b1;
    }
    *v0 = half_to_f32x4(h0, kind);
    *v1 = half_to_f32x4(h1, kind);
}

/* A single element as float32 (tails of rows). */
ALWAYS_INLINE float load_f32(const char *p, int kind)
{
    float f;
    uint16_t h;
    if (kind == LOAD_F32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return kind == LOAD_BF16 ? fi_bf16_to_f32(h) : fi_f16_to_f32(h);
}

typedef struct {
    f32x4 lo, hi;
    f64x2 sum_low, sum_high; /* lanes 0-1 and 2-3, widened to double */
    i32x4 nan, inf;          /* minus the counts (compares give -1) */
} f32_lanes;

/* NaN fails v < lo and v > hi, so min and max skip it; its lane is zeroed for the sum. */
ALWAYS_INLINE void f32_lanes_add(f32_lanes *l, f32x4 v)
{
    i32x4 is_nan = v != v;
    i32x4 is_inf = (f32x4)((i32x4)v & 0x7fffffff) == INFINITY;
    l->lo = select_f32x4(v < l->lo, v, l->lo);
    l->hi = select_f32x4(v > l->hi, v, l->hi);
    f32x4 clean = (f32x4)((i32x4)v & ~is_nan);
    f64x2 low = {clean[0], clean[1]}, high = {clean[2], clean[3]};
    l->sum_low += low;
    l->sum_high += high;
    l->nan += is_nan;
    l->inf += is_inf;
}

ALWAYS_INLINE void float_acc_add(float_acc *a, float v)
{
    if (v != v) {
        a->nan++;
        return;
    }
    a->inf += fabsf(v) == INFINITY;
    a->min = v < a->min ? v : a->min;
    a->max = v > a->max ? v : a->max;
    a->sum += v;
}

/* The eight accumulator lanes of a float row between blocks (lane j of an f32_lanes pair
 * is lane 4k + j here); float_row and the AVX2 row keep the same lanes. */
typedef struct {
    float lo[8], hi[8];
    double sum[8];
    /* For the exact-sum path of 16-bit floats (half_lanes_run_avx2): while exact is set,
     * every addition into sum[] so far was exact, so each lane is a multiple of
     * 2^grain (INT_MAX: every lane is still zero), and no lane's running sum (after any
     * element, in order) exceeded peak in magnitude. */
    int exact, grain;
    double peak;
} float_lanes;

static void float_lanes_init(float_lanes *s)
{
    for (int j = 0; j < 8; j++) {
        s->lo[j] = INFINITY;
        s->hi[j] = -INFINITY;
        s->sum[j] = 0.0;
    }
    s->exact = 1;
    s->grain = INT_MAX;
    s->peak = 0.0;
}

/* 2^e as a double, for -1022 <= e <= 1023. */
static inline double two_to(int e)
{
    uint64_t bits = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* Lanes into a: min and max, and the sum as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + ...). */
static void float_lanes_reduce(const float_lanes *s, float_acc *a)
{
    for (int k = 0; k < 2; k++) {
        for (int j = 4 * k; j < 4 * k + 4; j++) {
            a->min = s->lo[j] < a->min ? s->lo[j] : a->min;
            a->max = s->hi[j] > a->max ? s->hi[j] : a->max;
        }
        a->sum += (s->sum[4 * k] + s->sum[4 * k + 1]) + (s->sum[4 * k + 2] + s->sum[4 * k + 3]);
    }
}

/* Eight elements per step in two independent lane sets, over the first n & ~7 elements;
 * the 32-bit counters are flushed into a every CHUNK elements. Returns the count done. */
ALWAYS_INLINE int64_t float_lanes_run(float_lanes *s, float_acc *a, const char *p, int64_t n,
                                      int64_t step, int kind)
{
    f32_lanes l[2];
    for (int k = 0; k < 2; k++) {
        memcpy(&l[k].lo, s->lo + 4 * k, 16);
        memcpy(&l[k].hi, s->hi + 4 * k, 16);
        memcpy(&l[k].sum_low, s->sum + 4 * k, 16);
        memcpy(&l[k].sum_high, s->sum + 4 * k + 2, 16);
    }
    int64_t i = 0;
    while (n - i >= 8) {
        int64_t stop = i + ((n - i < CHUNK ? n - i : CHUNK) & ~(int64_t)7);
        for (int k = 0; k < 2; k++)
            l[k].nan = l[k].inf = (i32x4){0, 0, 0, 0};
        for (; i < stop; i += 8) {
            f32x4 v0, v1;
            load_f32x8(p + i * step, step, kind, &v0, &v1);
            f32_lanes_add(&l[0], v0);
            f32_lanes_add(&l[1], v1);
        }
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 4; j++) {
                a->nan -= l[k].nan[j];
                a->inf -= l[k].inf[j];
            }
    }
    for (int k = 0; k < 2; k++) {
        memcpy(s->lo + 4 * k, &l[k].lo, 16);
        memcpy(s->hi + 4 * k, &l[k].hi, 16);
        memcpy(s->sum + 4 * k, &l[k].sum_low, 16);
        memcpy(s->sum + 4 * k + 2, &l[k].sum_high, 16);
    }
    return i;
}

ALWAYS_INLINE void float_row(float_acc *a, const char *p, int64_t n, int64_t step, int kind)
{
    if (n < 16) { /* short rows of a narrow slice: setting up the lanes costs more */
        for (int64_t i = 0; i < n; i++)
            float_acc_add(a, load_f32(p + i * step, kind));
        return;
    }
    float_lanes s;
    float_lanes_init(&s);
    int64_t i = float_lanes_run(&s, a, p, n, step, kind);
    float_lanes_reduce(&s, a);
    for (; i < n; i++)
        float_acc_add(a, load_f32(p + i * step, kind));
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FI_HAVE_AVX2_ROW 1

/* float_lanes_run for contiguous float32 in 256-bit registers, about twice the 128-bit
 * code's speed: the same eight lanes (lane j takes elements j, j + 8, ...), added in
 * the same order, so the statistics are bit-identical. MINPS(v, lo) is exactly
 * v < lo ? v : lo (NaN and signed zeros included), MAXPS likewise. */
__attribute__((target("avx2"))) static int64_t f32_lanes_run_avx2(float_lanes *s, float_acc *a,
                                                                  const char *p, int64_t n)
{
    __m256 lo = _mm256_loadu_ps(s->lo), hi = _mm256_loadu_ps(s->hi);
    __m256d sum0 = _mm256_loadu_pd(s->sum), sum1 = _mm256_loadu_pd(s->sum + 4);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    int64_t i = 0;
    while (n - i >= 8) {
        int64_t stop = i + ((n - i < CHUNK ? n - i : CHUNK) & ~(int64_t)7);
        __m256i nan_count = _mm256_setzero_si256(), inf_count = _mm256_setzero_si256();
        for (; i < stop; i += 8) {
            __m256 v = _mm256_loadu_ps((const float *)(const void *)(p + 4 * i));
            __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
            __m256 is_inf = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_EQ_OQ);
            lo = _mm256_min_ps(v, lo);
            hi = _mm256_max_ps(v, hi);
            __m256 clean = _mm256_andnot_ps(is_nan, v);
            sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(clean)));
            sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(clean, 1)));
            nan_count = _mm256_sub_epi32(nan_count, _mm256_castps_si256(is_nan));
            inf_count = _mm256_sub_epi32(inf_count, _mm256_castps_si256(is_inf));
        }
        int32_t nans[8], infs[8];
        _mm256_storeu_si256((__m256i *)(void *)nans, nan_count);
        _mm256_storeu_si256((__m256i *)(void *)infs, inf_count);
        for (int j = 0; j < 8; j++) {
            a->nan += nans[j];
            a->inf += infs[j];
        }
    }
    _mm256_storeu_ps(s->lo, lo);
    _mm256_storeu_ps(s->hi, hi);
    _mm256_storeu_pd(s->sum, sum0);
    _mm256_storeu_pd(s->sum + 4, sum1);
    return i;
}

/* Sixteen 16-bit floats (w) as the 128-bit code's two groups of eight: elements 0, 2, 4, 6
 * then 1, 3, 5, 7 of each. */
__attribute__((target("avx2,f16c"), always_inline)) static inline void
half_groups_avx2(__m256i w, int kind, __m256 g[2])
{
    if (kind == LOAD_BF16) {
        __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
        g[0] = _mm256_permute2f128_ps(even, odd, 0x20);
        g[1] = _mm256_permute2f128_ps(even, odd, 0x31);
    } else {
        const __m128i evens_odds =
            _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
        g[0] = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm256_castsi256_si128(w), evens_odds));
        g[1] = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm256_extracti128_si256(w, 1), evens_odds));
    }
}

/* The largest of sixteen unsigned 16-bit values. */
__attribute__((target("avx2"), always_inline)) static inline unsigned hmax_u16(__m256i v)
{
    __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    __m128i least = _mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi32(-1)));
    return 0xffffu ^ ((unsigned)_mm_cvtsi128_si32(least) & 0xffffu);
}

__attribute__((target("avx2"), always_inline)) static inline unsigned hmin_u16(__m256i v)
{
    __m128i m = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (unsigned)_mm_cvtsi128_si32(_mm_minpos_epu16(m)) & 0xffffu;
}

/* float_lanes_run for contiguous float16 or bfloat16 in 256-bit registers: each group of
 * eight elements feeds the same lanes as the 128-bit code (elements 0, 2, 4, 6 to lanes
 * 0-3 and 1, 3, 5, 7 to lanes 4-7), groups in order, so the statistics are bit-identical;
 * float16 widens with F16C (exact, as the portable conversion). Returns the count done. */
__attribute__((target("avx2,f16c"))) static int64_t
half_lanes_run_avx2_in_order(float_lanes *s, float_acc *a, const char *p, int64_t n, int kind)
{
    __m256 lo = _mm256_loadu_ps(s->lo), hi = _mm256_loadu_ps(s->hi);
    __m256d sum0 = _mm256_loadu_pd(s->sum), sum1 = _mm256_loadu_pd(s->sum + 4);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    int64_t i = 0;
    while (n - i >= 16) {
        int64_t stop = i + ((n - i < CHUNK ? n - i : CHUNK) & ~(int64_t)15);
        __m256i nan_count = _mm256_setzero_si256(), inf_count = _mm256_setzero_si256();
        for (; i < stop; i += 16) {
            __m256 g[2];
            half_groups_avx2(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i)), kind,
                             g);
            for (int k = 0; k < 2; k++) {
                __m256 v = g[k];
                __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
                __m256 is_inf = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_EQ_OQ);
                lo = _mm256_min_ps(v, lo);
                hi = _mm256_max_ps(v, hi);
                __m256 clean = _mm256_andnot_ps(is_nan, v);
                sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(clean)));
                sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(clean, 1)));
                nan_count = _mm256_sub_epi32(nan_count, _mm256_castps_si256(is_nan));
                inf_count = _mm256_sub_epi32(inf_count, _mm256_castps_si256(is_inf));
            }
        }
        int32_t nans[8], infs[8];
        _mm256_storeu_si256((__m256i *)(void *)nans, nan_count);
        _mm256_storeu_si256((__m256i *)(void *)infs, inf_count);
        for (int j = 0; j < 8; j++) {
            a->nan += nans[j];
            a->inf += infs[j];
        }
    }
    _mm256_storeu_ps(s->lo, lo);
    _mm256_storeu_ps(s->hi, hi);
    _mm256_storeu_pd(s->sum, sum0);
    _mm256_storeu_pd(s->sum + 4, sum1);
    return i;
}
/* Elements per block of the exact-sum path: 16 per lane (the 4 in EXACT_LOG2_PER_LANE). */
#define EXACT_BLOCK 128
#define EXACT_LOG2_PER_LANE 4

/* half_lanes_run_avx2_in_order's statistics, bit for bit, at about twice its speed for
 * the usual data. The in-order code widens every element to double and adds it to its
 * lane. Here a block of EXACT_BLOCK elements is summed per lane in float32 instead, and
 * the block's lane sums are added to the double lanes, when both are provably exact:
 * - 16-bit floats of the block are multiples of u = the ulp of the smallest nonzero one,
 *   and each lane's partial sums are below 16 * 2^(Emax+1); float32 holds every multiple
 *   of u up to 2^24 u, so the float32 sums are exact when the block's exponents span at
 *   most 23 - mantissa bits - 4 binades;
 * - the double lanes are multiples of 2^grain (every earlier addition was exact), so with
 *   a = min(grain, log2 u), every sum of a lane and the block's elements in any order is a
 *   multiple of 2^a below 2^(53+a) when |lane| and the block's bound are each at most
 *   2^(52+a): every addition the in-order code makes is then exact, and so is this one.
 * Exact additions give the same double whatever their order, so the lanes get the same
 * bits. Min and max take the same lanes in the same order as the in-order code. A block
 * that fails a test (or holds a NaN or an infinity) goes through the in-order code; one
 * whose in-order sums cannot be shown exact ends the exact path for the run (exact = 0). */
__attribute__((target("avx2,f16c"))) static int64_t
half_lanes_run_avx2(float_lanes *s, float_acc *a, const char *p, int64_t n, int kind)
{
    const int mant = kind == LOAD_BF16 ? 7 : 10, bias = kind == LOAD_BF16 ? 127 : 15;
    const unsigned special = kind == LOAD_BF16 ? 0x7f80u : 0x7c00u; /* exponent all ones */
    const int emax_limit = kind == LOAD_BF16 ? 240 : 31; /* float32 partial sums stay finite */
    const __m256i abs_mask = _mm256_set1_epi16(0x7fff), one = _mm256_set1_epi16(1);
    const __m256d abs_pd = _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MAX));
    __m256 lo = _mm256_loadu_ps(s->lo), hi = _mm256_loadu_ps(s->hi);
    __m256d sum0 = _mm256_loadu_pd(s->sum), sum1 = _mm256_loadu_pd(s->sum + 4);
    int64_t i = 0;
    while (s->exact && n - i >= 16) {
        int64_t m = (n - i < EXACT_BLOCK ? n - i : EXACT_BLOCK) & ~(int64_t)15;
        __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
        __m256i top = _mm256_setzero_si256(), least = _mm256_set1_epi32(-1);
        for (int64_t j = i; j < i + m; j += 16) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * j));
            __m256i mag = _mm256_and_si256(w, abs_mask);
            top = _mm256_max_epu16(top, mag);
            least = _mm256_min_epu16(least, _mm256_sub_epi16(mag, one)); /* 0 -> 0xffff */
            __m256 g[2];
            half_groups_avx2(w, kind, g);
            lo = _mm256_min_ps(g[0], lo);
            hi = _mm256_max_ps(g[0], hi);
            lo = _mm256_min_ps(g[1], lo);
            hi = _mm256_max_ps(g[1], hi);
            f0 = _mm256_add_ps(f0, g[0]);
            f1 = _mm256_add_ps(f1, g[1]);
        }
        unsigned big = hmax_u16(top), small = (hmin_u16(least) + 1u) & 0xffffu;
        int fast = 0, exact = 0, grain = s->grain;
        if (big < special) {
            int emax = (int)(big >> mant), emin = (int)(small >> mant);
            emax = emax < 1 ? 1 : emax;
            emin = emin < 1 ? 1 : emin;
            int ulp = emin - bias - mant;                      /* log2 u */
            int bound = emax - bias + 1 + EXACT_LOG2_PER_LANE; /* |lane's block sum| < 2^bound */
            if (small == 0) { /* only zeros: adding them changes no lane */
                exact = fast = 1;
            } else {
                int g = grain < ulp ? grain : ulp;
                __m256d l = _mm256_max_pd(_mm256_and_pd(sum0, abs_pd), _mm256_and_pd(sum1, abs_pd));
                __m128d h = _mm_max_pd(_mm256_castpd256_pd128(l), _mm256_extractf128_pd(l, 1));
                double lane_max = _mm_cvtsd_f64(_mm_max_sd(h, _mm_unpackhi_pd(h, h)));
                exact = bound <= 52 + g && lane_max <= two_to(52 + g);
                /* the block's running sums stay within lane_max + 2^bound (both exact) */
                double top_sum = lane_max + two_to(bound);
                s->peak = top_sum > s->peak ? top_sum : s->peak;
                fast =
                    exact && emax - emin <= 23 - mant - EXACT_LOG2_PER_LANE && emax <= emax_limit;
                grain = g;
            }
        }
        if (fast) {
            __m256 f = _mm256_add_ps(f0, f1);
            sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
            sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
        } else {
            /* min and max already hold the block: the in-order code takes the same values
             * again without a change */
            _mm256_storeu_ps(s->lo, lo);
            _mm256_storeu_ps(s->hi, hi);
            _mm256_storeu_pd(s->sum, sum0);
            _mm256_storeu_pd(s->sum + 4, sum1);
            half_lanes_run_avx2_in_order(s, a, p + 2 * i, m, kind);
            lo = _mm256_loadu_ps(s->lo);
            hi = _mm256_loadu_ps(s->hi);
            sum0 = _mm256_loadu_pd(s->sum);
            sum1 = _mm256_loadu_pd(s->sum + 4);
        }
        s->exact = exact;
        s->grain = grain;
        i += m;
    }
    _mm256_storeu_ps(s->lo, lo);
    _mm256_storeu_ps(s->hi, hi);
    _mm256_storeu_pd(s->sum, sum0);
    _mm256_storeu_pd(s->sum + 4, sum1);
    return i + half_lanes_run_avx2_in_order(s, a, p + 2 * i, n - i, kind);
}
#endif

/* float_lanes_run over contiguous float16/bfloat16: pairs of groups in 256-bit registers
 * where the CPU has AVX2 and F16C, the last group (if any) in the 128-bit code. */
static int64_t half_lanes_run(float_lanes *s, float_acc *a, const char *p, int64_t n, int kind)
{
    int64_t done = 0;
#ifdef FI_HAVE_AVX2_ROW
    if (fi_cpu_isa() >= FI_ISA_AVX2) /* FLASHINFER_CPU_ISA=portable: the 128-bit code */
        done = half_lanes_run_avx2(s, a, p, n, kind);
#endif
    if (n - done >= 8)
        s->exact = 0; /* the 128-bit code's additions are not followed by the exact path */
    return done + float_lanes_run(s, a, p + 2 * done, n - done, 2, kind);
}

/* float_lanes_run over contiguous float32, in 256-bit registers where the CPU has them. */
static int64_t f32_lanes_run(float_lanes *s, float_acc *a, const char *p, int64_t n)
{
#ifdef FI_HAVE_AVX2_ROW
    if (__builtin_cpu_supports("avx2"))
        return f32_lanes_run_avx2(s, a, p, n);
#endif
    return float_lanes_run(s, a, p, n, 4, LOAD_F32);
}

/* Each row function takes a contiguous fast path where the step is the element size,
 * so the compiler sees a constant stride and uses whole-vector loads (float32: the
 * AVX2 lanes; its short rows take float_row's scalar path either way). */
static void row_f32(void *a, const char *p, int64_t n, int64_t step)
{
    if (step == 4 && n >= 16) {
        float_lanes s;
        float_lanes_init(&s);
        int64_t i = f32_lanes_run(&s, a, p, n);
        float_lanes_reduce(&s, a);
        for (; i < n; i++)
            float_acc_add(a, load_f32(p + i * 4, LOAD_F32));
    } else {
        float_row(a, p, n, step, LOAD_F32);
    }
}

/* A contiguous float16/bfloat16 row: half_lanes_run, then the tail one by one. */
static void half_row(void *a, const char *p, int64_t n, int kind)
{
    if (n < 16) {
        float_row(a, p, n, 2, kind);
        return;
    }
    float_lanes s;
    float_lanes_init(&s);
    int64_t i = half_lanes_run(&s, a, p, n, kind);
    float_lanes_reduce(&s, a);
    for (; i < n; i++)
        float_acc_add(a, load_f32(p + i * 2, kind));
}

static void row_f16(void *a, const char *p, int64_t n, int64_t step)
{
    if (step == 2)
        half_row(a, p, n, LOAD_F16);
    else
        float_row(a, p, n, step, LOAD_F16);
}

static void row_bf16(void *a, const char *p, int64_t n, int64_t step)
{
    if (step == 2)
        half_row(a, p, n, LOAD_BF16);
    else
        float_row(a, p, n, step, LOAD_BF16);
}

typedef struct {
    f64x2 lo, hi, sum;
    i64x2 nan, inf; /* minus the counts */
} f64_lanes;

ALWAYS_INLINE void f64_lanes_add(f64_lanes *l, f64x2 v)
{
    i64x2 is_nan = v != v;
    l->lo = select_f64x2(v < l->lo, v, l->lo);
    l->hi = select_f64x2(v > l->hi, v, l->hi);
    l->sum += (f64x2)((i64x2)v & ~is_nan);
    l->nan += is_nan;
    l->inf += (f64x2)((i64x2)v & INT64_MAX) == INFINITY;
}

ALWAYS_INLINE void double_row(float_acc *a, const char *p, int64_t n, int64_t step)
{
    f64_lanes l[2];
    for (int k = 0; k < 2; k++) {
        l[k].lo = (f64x2){INFINITY, INFINITY};
        l[k].hi = -l[k].lo;
        l[k].sum = (f64x2){0.0, 0.0};
        l[k].nan = l[k].inf = (i64x2){0, 0};
    }
    int64_t i = 0;
    for (; n - i >= 4; i += 4) {
        f64x2 v[2];
        for (int k = 0; k < 2; k++) {
            if (step == 8) {
                memcpy(&v[k], p + (i + 2 * k) * 8, 16);
            } else {
                memcpy((char *)&v[k], p + (i + 2 * k) * step, 8);
                memcpy((char *)&v[k] + 8, p + (i + 2 * k + 1) * step, 8);
            }
            f64_lanes_add(&l[k], v[k]);
        }
    }
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++) {
            a->min = l[k].lo[j] < a->min ? l[k].lo[j] : a->min;
            a->max = l[k].hi[j] > a->max ? l[k].hi[j] : a->max;
            a->sum += l[k].sum[j];
            a->nan -= l[k].nan[j];
            a->inf -= l[k].inf[j];
        }
    for (; i < n; i++) {
        double v;
        memcpy(&v, p + i * step, 8);
        if (v != v) {
            a->nan++;
            continue;
        }
        a->inf += fabs(v) == INFINITY;
        a->min = v < a->min ? v : a->min;
        a->max = v > a->max ? v : a->max;
        a->sum += v;
    }
}

static void row_f64(void *a, const char *p, int64_t n, int64_t step)
{
    if (step == 8)
        double_row(a, p, n, 8);
    else
        double_row(a, p, n, step);
}

enum { LOAD_I16, LOAD_U16, LOAD_I32, LOAD_U32 };

ALWAYS_INLINE int64_t load_narrow_int(const char *p, int kind)
{
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    switch (kind) {
    case LOAD_I16:
        memcpy(&i16, p, 2);
        return i16;
    case LOAD_U16:
        memcpy(&u16, p, 2);
        return u16;
    case LOAD_I32:
        memcpy(&i32, p, 4);
        return i32;
    default:
        memcpy(&u32, p, 4);
        return u32;
    }
}

/* 16- and 32-bit integers: 64-bit lane sums cannot overflow within a chunk. */
ALWAYS_INLINE void narrow_int_row(int_acc *a, const char *p, int64_t n, int64_t step, int kind)
{
    int64_t lo[LANES], hi[LANES], sum[LANES];
    for (int j = 0; j < LANES; j++) {
        lo[j] = INT64_MAX;
        hi[j] = INT64_MIN;
    }
    int64_t i = 0;
    while (n - i >= LANES) {
        int64_t stop = i + ((n - i < CHUNK ? n - i : CHUNK) & ~(int64_t)(LANES - 1));
        for (int j = 0; j < LANES; j++)
            sum[j] = 0;
        for (; i < stop; i += LANES) {
            for (int j = 0; j < LANES; j++) {
                int64_t v = load_narrow_int(p + (i + j) * step, kind);
                lo[j] = v < lo[j] ? v : lo[j];
                hi[j] = v > hi[j] ? v : hi[j];
                sum[j] += v;
            }
        }
        for (int j = 0; j < LANES; j++)
            a->sum += sum[j];
    }
    for (; i < n; i++) {
        int64_t v = load_narrow_int(p + i * step, kind);
        lo[0] = v < lo[0] ? v : lo[0];
        hi[0] = v > hi[0] ? v : hi[0];
        a->sum += v;
    }
    for (int j = 0; j < LANES; j++) {
        if (lo[j] < a->min)
            a->min = lo[j];
        if (hi[j] > a->max)
            a->max = hi[j];
    }
}

#define NARROW_INT_ROW(NAME, SIZE, KIND)                                                           \
    static void NAME(void *a, const char *p, int64_t n, int64_t step)                              \
    {                                                                                              \
        if (step == SIZE)                                                                          \
            narrow_int_row(a, p, n, SIZE, KIND);                                                   \
        else                                                                                       \
            narrow_int_row(a, p, n, step, KIND);                                                   \
    }

NARROW_INT_ROW(row_i16, 2, LOAD_I16)
NARROW_INT_ROW(row_u16, 2, LOAD_U16)
NARROW_INT_ROW(row_i32, 4, LOAD_I32)
NARROW_INT_ROW(row_u32, 4, LOAD_U32)

/* 64-bit integers: the sum in 128 bits of the element's signedness. */
#define WIDE_INT_ROW(NAME, ACC, T, SUM_T)                                                          \
    static void NAME(void *acc, const char *p, int64_t n, int64_t step)                            \
    {                                                                                              \
        ACC *a = acc;                                                                              \
        T lo = a->min, hi = a->max;                                                                \
        SUM_T sum = 0;                                                                             \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T v;                                                                                   \
            memcpy(&v, p + i * step, 8);                                                           \
            lo = v < lo ? v : lo;                                                                  \
            hi = v > hi ? v : hi;                                                                  \
            sum += v;                                                                              \
        }                                                                                          \
        a->min = lo;                                                                               \
        a->max = hi;                                                                               \
        a->sum += sum;                                                                             \
    }

WIDE_INT_ROW(row_i64, int_acc, int64_t, __int128)
WIDE_INT_ROW(row_u64, uint64_acc, uint64_t, unsigned __int128)

/* One-byte dtypes (float8 kinds, int8, uint8, bool) are counted into a histogram of the
 * 256 codes; the statistics come from decoding each code present once. Long contiguous
 * rows use four 32-bit sub-histograms so repeated codes do not serialise on one counter. */
static void row_bytes(void *acc, const char *p, int64_t n, int64_t step)
{
    byte_hist *h = acc;
    const unsigned char *b = (const unsigned char *)p;
    if (step != 1 || n < 4096) {
        for (int64_t i = 0; i < n; i++)
            h->count[b[i * step]]++;
        return;
    }
    uint32_t sub[4][256];
    int64_t i = 0;
    while (n - i >= 4) {
        int64_t stop = i + ((n - i < (1 << 24) ? n - i : (1 << 24)) & ~(int64_t)3);
        memset(sub, 0, sizeof(sub));
        for (; i < stop; i += 4) {
            sub[0][b[i]]++;
            sub[1][b[i + 1]]++;
            sub[2][b[i + 2]]++;
            sub[3][b[i + 3]]++;
        }
        for (int c = 0; c < 256; c++)
            h->count[c] += (uint64_t)sub[0][c] + sub[1][c] + sub[2][c] + sub[3][c];
    }
    for (; i < n; i++)
        h->count[b[i]]++;
}

/* ---- results ------------------------------------------------------------------------ */

void fi_stats_from_sums(fi_stats *out, int64_t numel, double min, double max, double sum,
                        int64_t nan_count, int64_t inf_count)
{
    out->kind = FI_STATS_FLOAT;
    out->numel = numel;
    out->nan_count = nan_count;
    out->inf_count = inf_count;
    int64_t valid = numel - nan_count;
    if (valid == 0) {
        out->min = out->max = out->mean = NAN;
        return;
    }
    out->min = min;
    out->max = max;
    out->mean = sum / (double)valid;
}

/* Each visited element stands for repeat logical ones (stride-0 dimensions). */
static void finish_float(const float_acc *a, int64_t numel, int64_t repeat, fi_stats *out)
{
    fi_stats_from_sums(out, numel, a->min, a->max, a->sum * (double)repeat, a->nan * repeat,
                       a->inf * repeat);
}

static void finish_int(int64_t lo, int64_t hi, __int128 sum, int64_t numel, fi_stats *out)
{
    out->kind = FI_STATS_INT;
    out->imin = lo;
    out->imax = hi;
    out->min = (double)lo;
    out->max = (double)hi;
    out->mean = (double)sum / (double)numel;
}

static float decode_float8(fi_dtype dtype, uint8_t code)
{
    switch (dtype) {
    case FI_DTYPE_E4M3FN:
        return fi_e4m3fn_to_f32(code);
    case FI_DTYPE_E4M3FNUZ:
        return fi_e4m3fnuz_to_f32(code);
    case FI_DTYPE_E5M2:
        return fi_e5m2_to_f32(code);
    case FI_DTYPE_E5M2FNUZ:
        return fi_e5m2fnuz_to_f32(code);
    default:
        return fi_e8m0fnu_to_f32(code);
    }
}

static void finish_hist(const byte_hist *h, fi_dtype dtype, int64_t numel, int64_t repeat,
                        fi_stats *out)
{
    if (dtype == FI_DTYPE_I8 || dtype == FI_DTYPE_U8 || dtype == FI_DTYPE_BOOL) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        __int128 sum = 0;
        for (int c = 0; c < 256; c++) {
            if (!h->count[c])
                continue;
            int64_t v = dtype == FI_DTYPE_I8 ? (int8_t)c : dtype == FI_DTYPE_BOOL ? c != 0 : c;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += (__int128)v * (__int128)h->count[c];
        }
        finish_int(lo, hi, sum * repeat, numel, out);
        return;
    }
    float_acc a = {INFINITY, -INFINITY, 0.0, 0, 0};
    for (int c = 0; c < 256; c++) {
        if (!h->count[c])
            continue;
        float v = decode_float8(dtype, (uint8_t)c);
        int64_t k = (int64_t)h->count[c];
        if (isnan(v)) {
            a.nan += k;
            continue;
        }
        a.inf += isinf(v) ? k : 0;
        a.min = v < a.min ? v : a.min;
        a.max = v > a.max ? v : a.max;
        a.sum += (double)v * (double)k;
    }
    finish_float(&a, numel, repeat, out);
}

int fi_stats_cpu(const fi_tensor *t, fi_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = FI_STATS_NONE;
    int64_t esize = (int64_t)fi_dtype_size(t->dtype);
    stats_layout L;
    int64_t numel;
    if (layout_from_tensor(t, esize ? esize : 1, &L, &numel) < 0)
        return -1;
    out->numel = numel;
    if (numel == 0 || !fi_dtype_has_stats(t->dtype))
        return 0;
    float_acc fa = {INFINITY, -INFINITY, 0.0, 0, 0};
    int_acc ia = {0, INT64_MAX, INT64_MIN};
    switch (t->dtype) {
    case FI_DTYPE_F64:
    case FI_DTYPE_F32:
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16:
        layout_walk(&L,
                    t->dtype == FI_DTYPE_F64   ? row_f64
                    : t->dtype == FI_DTYPE_F32 ? row_f32
                    : t->dtype == FI_DTYPE_F16 ? row_f16
                                               : row_bf16,
                    &fa);
        finish_float(&fa, numel, L.repeat, out);
        return 0;
    case FI_DTYPE_I16:
    case FI_DTYPE_U16:
    case FI_DTYPE_I32:
    case FI_DTYPE_U32:
    case FI_DTYPE_I64:
        layout_walk(&L,
                    t->dtype == FI_DTYPE_I16   ? row_i16
                    : t->dtype == FI_DTYPE_U16 ? row_u16
                    : t->dtype == FI_DTYPE_I32 ? row_i32
                    : t->dtype == FI_DTYPE_U32 ? row_u32
                                               : row_i64,
                    &ia);
        finish_int(ia.min, ia.max, ia.sum * L.repeat, numel, out);
        return 0;
    case FI_DTYPE_U64: {
        uint64_acc ua = {0, UINT64_MAX, 0};
        layout_walk(&L, row_u64, &ua);
        out->kind = FI_STATS_INT;
        out->is_unsigned64 = 1;
        out->umin = ua.min;
        out->umax = ua.max;
        out->min = (double)ua.min;
        out->max = (double)ua.max;
        out->mean = (double)(ua.sum * (unsigned __int128)L.repeat) / (double)numel;
        return 0;
    }
    default: {
        byte_hist h;
        memset(&h, 0, sizeof(h));
        layout_walk(&L, row_bytes, &h);
        finish_hist(&h, t->dtype, numel, L.repeat, out);
        return 0;
    }
    }
}

/* ---- streams ------------------------------------------------------------------------ */

struct fi_stats_stream {
    fi_dtype dtype;
    int kind;
    int64_t numel;
    float_lanes lanes;
    float_acc acc;
    const char *tail; /* the last block's elements after its multiple of 8 */
    int64_t tail_n;
};

fi_stats_stream *fi_stats_stream_new(fi_dtype dtype, int64_t numel)
{
    int kind = dtype == FI_DTYPE_F32 ? LOAD_F32 : dtype == FI_DTYPE_F16 ? LOAD_F16 : LOAD_BF16;
    if ((dtype != FI_DTYPE_F32 && dtype != FI_DTYPE_F16 && dtype != FI_DTYPE_BF16) || numel < 16)
        return NULL;
    fi_stats_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->dtype = dtype;
    s->kind = kind;
    s->numel = numel;
    float_lanes_init(&s->lanes);
    s->lanes.exact = kind != LOAD_F32; /* float32 lanes are never shown exact */
    s->acc = (float_acc){INFINITY, -INFINITY, 0.0, 0, 0};
    return s;
}

/* The same kernels fi_stats_cpu's one contiguous row would use, lanes carried over. */
void fi_stats_stream_feed(fi_stats_stream *s, const void *p, size_t nbytes)
{
    int64_t esize = s->kind == LOAD_F32 ? 4 : 2;
    int64_t n = (int64_t)nbytes / esize, done;
    if (s->kind == LOAD_F32)
        done = f32_lanes_run(&s->lanes, &s->acc, p, n);
    else
        done = half_lanes_run(&s->lanes, &s->acc, p, n, s->kind);
    s->tail = (const char *)p + done * esize;
    s->tail_n = n - done;
}

void fi_stats_stream_end(fi_stats_stream *s, fi_stats *out)
{
    int64_t esize = s->kind == LOAD_F32 ? 4 : 2;
    float_lanes_reduce(&s->lanes, &s->acc);
    for (int64_t i = 0; i < s->tail_n; i++)
        float_acc_add(&s->acc, load_f32(s->tail + i * esize, s->kind));
    memset(out, 0, sizeof(*out));
    finish_float(&s->acc, s->numel, 1, out);
    free(s);
}

/* Whether b's lanes can be added to a's, as if b's elements had been fed to a after a's
 * own, with the bits of that in-order run: a and b each exact (no tails), and every
 * in-order running sum a_j + (b's running sum) provably exact: both are multiples of
 * 2^g, g the smaller grain, and |a_j| and b's peak are each at most 2^(52+g). Then a
 * takes b's lanes, counts and min/max (a's value on a tie of zeros: a's came first). */
static int stream_merge(fi_stats_stream *a, const fi_stats_stream *b)
{
    float_lanes *x = &a->lanes;
    const float_lanes *y = &b->lanes;
    if (!x->exact || !y->exact || a->tail_n)
        return -1;
    int g = x->grain < y->grain ? x->grain : y->grain;
    double lane_max = 0.0;
    for (int j = 0; j < 8; j++)
        lane_max = fabs(x->sum[j]) > lane_max ? fabs(x->sum[j]) : lane_max;
    if (g != INT_MAX && (g > 970 || lane_max > two_to(52 + g) || y->peak > two_to(52 + g)))
        return -1;
    for (int j = 0; j < 8; j++) {
        x->sum[j] += y->sum[j];
        x->lo[j] = y->lo[j] < x->lo[j] ? y->lo[j] : x->lo[j];
        x->hi[j] = y->hi[j] > x->hi[j] ? y->hi[j] : x->hi[j];
    }
    x->peak = x->peak > lane_max + y->peak ? x->peak : lane_max + y->peak;
    x->grain = g;
    a->acc.nan += b->acc.nan;
    a->acc.inf += b->acc.inf;
    a->tail = b->tail; /* b's last block is the stream's last */
    a->tail_n = b->tail_n;
    return 0;
}

int fi_stats_stream_join(fi_stats_stream *a, fi_stats_stream *b)
{
    int r = stream_merge(a, b);
    free(b);
    return r;
}

int fi_stats_stream_exact(const fi_stats_stream *s)
{
    return s->kind != LOAD_F32 && s->lanes.exact && s->tail_n == 0;
}

/* ---- chunk partials (docs/dump-format.md#chunk-statistics) ---- */

/* Shows, from the 16-bit codes of p[0..n) alone, that a fresh stream's in-order additions
 * of them were all exact, whichever kernel made them, and sets the lanes' exact state: with
 * no NaN or infinity, every element is a multiple of u = the ulp of the smallest nonzero
 * one and below 2^(Emax+1) in magnitude, so a lane's running sums (n / 8 elements each)
 * are multiples of u below 2^(Emax+1) * n / 8 = 2^bound; a double holds every such value
 * when bound <= 52 + log2 u. Then grain = log2 u and peak = 2^bound. -1 when not shown. */
static int prove_exact(fi_stats_stream *s, const char *p, int64_t n)
{
    const int mant = s->kind == LOAD_BF16 ? 7 : 10, bias = s->kind == LOAD_BF16 ? 127 : 15;
    const unsigned special = s->kind == LOAD_BF16 ? 0x7f80u : 0x7c00u;
    unsigned big = 0, small = 0xffffu;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        unsigned mag = h & 0x7fffu;
        big = mag > big ? mag : big;
        small = mag - 1u < small ? mag - 1u : small; /* 0 -> 0xffffffff, never taken */
    }
    if (big >= special)
        return -1;
    if (big == 0) { /* only zeros: the lanes are +0, as a fresh stream's */
        s->lanes.grain = INT_MAX;
        s->lanes.peak = 0.0;
        s->lanes.exact = 1;
        return 0;
    }
    int emax = (int)(big >> mant), emin = (int)((small + 1u) >> mant);
    emax = emax < 1 ? 1 : emax;
    emin = emin < 1 ? 1 : emin;
    int ulp = emin - bias - mant, per_lane = 0;
    while (((int64_t)1 << per_lane) < n / 8)
        per_lane++;
    int bound = emax - bias + 1 + per_lane;
    if (ulp > 970 || bound > 52 + ulp)
        return -1;
    s->lanes.grain = ulp;
    s->lanes.peak = two_to(bound);
    s->lanes.exact = 1;
    return 0;
}

fi_stats_stream *fi_stats_part_new(fi_dtype dtype, const void *p, size_t nbytes)
{
    int64_t n = (int64_t)(nbytes / 2);
    if ((dtype != FI_DTYPE_F16 && dtype != FI_DTYPE_BF16) || nbytes % 16 || n < 16)
        return NULL;
    fi_stats_stream *s = fi_stats_stream_new(dtype, n);
    if (!s)
        return NULL;
    fi_stats_stream_feed(s, p, nbytes);
    s->tail = NULL; /* no tail: n is a multiple of 8; p is not kept */
    if (!s->lanes.exact && prove_exact(s, p, n) < 0)
        s->lanes.exact = 0;
    return s;
}

int fi_stats_stream_add(fi_stats_stream *a, const fi_stats_stream *part)
{
    if (part->dtype != a->dtype || part->tail_n) /* stream_merge: both exact, a no tail */
        return -1;
    return stream_merge(a, part);
}

void fi_stats_stream_free(fi_stats_stream *s) { free(s); }

fi_stats_stream *fi_stats_stream_fork(const fi_stats_stream *s)
{
    return fi_stats_stream_new(s->dtype, s->numel);
}

typedef struct {
    fi_stats_stream *s;
    const char *const *piece;
    int64_t n;
    size_t nbytes;
} pieces_job;

static void *feed_pieces(void *arg)
{
    pieces_job *j = arg;
    for (int64_t i = 0; i < j->n; i++)
        fi_stats_stream_feed(j->s, j->piece[i], j->nbytes);
    return NULL;
}

#define PIECES_MAX_THREADS 64
#define PIECES_MIN_BYTES ((size_t)4 << 20) /* per thread: below this one thread does it all */

int fi_stats_pieces(fi_dtype dtype, const char *const *piece, int64_t n, size_t nbytes,
                    int num_threads, fi_stats *out)
{
    int64_t esize = dtype == FI_DTYPE_F32 ? 4 : 2;
    if (n <= 0 || nbytes % (size_t)esize)
        return -1;
    int64_t numel = n * (int64_t)(nbytes / (size_t)esize);
    int64_t want = (int64_t)((uint64_t)n * nbytes / PIECES_MIN_BYTES);
    int nt = num_threads < 1                    ? 1
             : num_threads > PIECES_MAX_THREADS ? PIECES_MAX_THREADS
                                                : num_threads;
    nt = want < nt ? (want < 1 ? 1 : (int)want) : nt;
    int exact_path = 0; /* only the AVX2 16-bit kernels keep lanes exact (joinable) */
#ifdef FI_HAVE_AVX2_ROW
    exact_path = dtype != FI_DTYPE_F32 && fi_cpu_isa() >= FI_ISA_AVX2;
#endif
    nt = !exact_path || n < nt ? 1 : nt;
    pieces_job job[PIECES_MAX_THREADS];
    pthread_t thread[PIECES_MAX_THREADS];
    int started[PIECES_MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++) {
        int64_t first = n * t / nt, last = n * (t + 1) / nt;
        job[t] =
            (pieces_job){fi_stats_stream_new(dtype, numel), piece + first, last - first, nbytes};
        if (!job[t].s) {
            for (int k = 0; k < t; k++)
                free(job[k].s);
            return -1;
        }
    }
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&thread[t], NULL, feed_pieces, &job[t]) == 0;
    feed_pieces(&job[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(thread[t], NULL);
        else
            feed_pieces(&job[t]);
    }
    int merged = 1;
    for (int t = 1; t < nt && merged; t++)
        merged = stream_merge(job[0].s, job[t].s) == 0;
    for (int t = 1; t < nt; t++)
        free(job[t].s);
    if (!merged) { /* not provably the in-order bits: feed them in order */
        free(job[0].s);
        job[0] = (pieces_job){fi_stats_stream_new(dtype, numel), piece, n, nbytes};
        if (!job[0].s)
            return -1;
        feed_pieces(&job[0]);
    }
    fi_stats_stream_end(job[0].s, out);
    return 0;
}
