/* attention_block.c: per-key-block arithmetic of CPU attention. The AVX2 version widens
 * with F16C, dots straight from registers and takes exp as a polynomial; the AVX-512 one
 * does the same for fp8 rows sixteen lanes wide. Picked by cpuid (fi_cpu_isa). */
#include "attention_block.h"

#include <math.h>
#include <string.h>

#include "cpu_simd.h"
#include "fi_numeric.h"

#ifdef FI_HAVE_X86_SIMD
/* Loops over arrays of vector registers are unrolled before gcc scalarizes the arrays;
 * otherwise the accumulators can go through the stack on every step. */
#define UNROLLED _Pragma("GCC unroll 16")
#endif

/* ---- portable ------------------------------------------------------------------ */

/* Branch-free binary16 -> float32 so the loop vectorizes: the exponent/mantissa bits
 * shifted into float32 position and scaled by 2^112 are exact for normal and subnormal
 * halves; all-ones exponents become inf/NaN. */
static inline float half_to_float(uint16_t h)
{
    uint32_t em = (uint32_t)(h & 0x7fff) << 13;
    uint32_t r = fi_f32_bits(fi_bits_f32(em) * 0x1p112f);
    r |= em >= 0x0f800000u ? 0x7f800000u : 0;
    return fi_bits_f32(r | ((uint32_t)(h & 0x8000) << 16));
}

/* e4m3fn: normal codes are float32 bits (mag << 20) times 2^120, subnormal ones
 * mantissa * 2^-9; S.1111.111 is NaN. */
static inline float e4m3_to_float(uint8_t b)
{
    uint32_t mag = b & 0x7fu;
    float v = (mag & 0x78u) ? fi_bits_f32(mag << 20) * 0x1p120f : (float)(mag & 7u) * 0x1p-9f;
    v = mag == 0x7fu ? NAN : v;
    return (b & 0x80u) ? -v : v;
}

static void widen_portable(const void *src, fi_dtype dtype, int64_t n, float *dst)
{
    const uint16_t *h = src;
    const uint8_t *b = src;
    switch (dtype) {
    case FI_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = half_to_float(h[i]);
        break;
    case FI_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = fi_bits_f32((uint32_t)h[i] << 16);
        break;
    case FI_DTYPE_E4M3FN:
        for (int64_t i = 0; i < n; i++)
            dst[i] = e4m3_to_float(b[i]);
        break;
    case FI_DTYPE_E5M2: /* the top byte of a binary16 */
        for (int64_t i = 0; i < n; i++)
            dst[i] = half_to_float((uint16_t)(b[i] << 8));
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    }
}

/* Rows [r0, r1) of a prefetch list. */
static inline void prefetch_rows(const fi_row_prefetch *pf, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1 && r < pf->n; r++)
        for (int64_t at = 0; at < pf->bytes; at += 64)
            __builtin_prefetch(pf->rows[r] + at);
}

/* The portable kernels read float32 rows only (narrow_rows is 0). */
static void scores_portable(const float *q, int64_t nv, const void *const *k, fi_dtype dtype,
                            int64_t nb, int64_t d, float *s, int64_t lds, const fi_row_prefetch *pf)
{
    (void)dtype;
    prefetch_rows(pf, 0, pf->n);
    for (int64_t v = 0; v < nv; v++)
        for (int64_t j = 0; j < nb; j++) {
            const float *kj = k[j];
            float sum = 0.0f;
            for (int64_t i = 0; i < d; i++)
                sum += q[v * d + i] * kj[i];
            s[v * lds + j] = sum;
        }
}

static void accumulate_portable(const float *p, int64_t ldp, int64_t nv, const float *corr,
                                const void *const *vals, fi_dtype dtype, int64_t nb, int64_t d,
                                float *o, const fi_row_prefetch *pf)
{
    (void)dtype;
    prefetch_rows(pf, 0, pf->n);
    for (int64_t v = 0; v < nv; v++) {
        float *ov = o + v * d;
        for (int64_t i = 0; i < d; i++)
            ov[i] *= corr[v];
        for (int64_t j = 0; j < nb; j++) {
            float pj = p[v * ldp + j];
            const float *vj = vals[j];
            for (int64_t i = 0; i < d; i++)
                ov[i] += pj * vj[i];
        }
    }
}

static float exp_sum_portable(float *x, int64_t n, float m)
{
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - m);
        sum += x[j];
    }
    return sum;
}

static float max_portable(const float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static const fi_attention_block_ops portable_ops = {
    widen_portable, scores_portable, accumulate_portable, exp_sum_portable, max_portable, 0,
};

/* ---- AVX2 + FMA + F16C ---------------------------------------------------------- */
#ifdef FI_HAVE_X86_SIMD

/* 16 e4m3fn codes as binary16 (exact up to the factor 2^-8 the caller multiplies back):
 * sign kept, the 7 magnitude bits moved under the binary16 exponent; NaN codes stay NaN. */
FI_AVX2_INLINE __m256i e4m3_to_half_scaled(__m128i bytes)
{
    /* code << 8 is s.eeee.mmm then zeros; an arithmetic shift by one copies the sign into
     * bit 14, which is cleared: s.0eeee.mmm0000000 */
    __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16((short)0xbfff));
    __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f00));
    __m256i is_nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f00));
    return _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7e00), is_nan);
}

/* The same for the 8 codes in the low half of bytes. */
FI_AVX2_INLINE __m128i e4m3_to_half8_scaled(__m128i bytes)
{
    __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(), bytes); /* code << 8 */
    __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16((short)0xbfff));
    __m128i mag = _mm_and_si128(w, _mm_set1_epi16(0x7f00));
    __m128i is_nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), is_nan);
}

/* e4m3fn rows that a scan found free of NaN codes, as the SIMD kernels name them: they are
 * widened without the NaN fix. Not an fi_dtype value; it never leaves this file. */
#define DTYPE_E4M3FN_FINITE ((fi_dtype)0xe4f)

/* Whether e4m3fn rows[0..n) (d codes each, d a multiple of 32) hold no NaN code
 * (S.1111.111: all ones once the sign bit is set). */
FI_AVX2_INLINE int e4m3_rows_finite(const void *const *rows, int64_t n, int64_t d)
{
    const __m256i sign = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8((char)0xff);
    __m256i nan = _mm256_setzero_si256();
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < d; i += 32) {
            __m256i b = _mm256_loadu_si256((const __m256i *)((const uint8_t *)rows[r] + i));
            nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_or_si256(b, sign), ones));
        }
    return _mm256_testz_si256(nan, nan);
}

/* 32 elements a step where the row allows it (head dims are multiples of 32). */
FI_AVX2 static void widen_avx2(const void *src, fi_dtype dtype, int64_t n, float *dst)
{
    const uint16_t *h = src;
    const uint8_t *b = src;
    int64_t i = 0;
    switch (dtype) {
    case FI_DTYPE_F16:
        for (; i + 32 <= n; i += 32)
            for (int u = 0; u < 32; u += 8)
                _mm256_storeu_ps(dst + i + u,
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + u))));
        break;
    case FI_DTYPE_BF16:
        for (; i + 32 <= n; i += 32)
            for (int u = 0; u < 32; u += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i + u)));
                _mm256_storeu_ps(dst + i + u, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
        break;
    case FI_DTYPE_E4M3FN: {
        const __m256 two8 = _mm256_set1_ps(256.0f);
        for (; i + 32 <= n; i += 32)
            for (int u = 0; u < 32; u += 16) {
                __m256i x = e4m3_to_half_scaled(_mm_loadu_si128((const __m128i *)(b + i + u)));
                __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(x));
                __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(x, 1));
                _mm256_storeu_ps(dst + i + u, _mm256_mul_ps(lo, two8));
                _mm256_storeu_ps(dst + i + u + 8, _mm256_mul_ps(hi, two8));
            }
        break;
    }
    case FI_DTYPE_E5M2: /* the top byte of a binary16 */
        for (; i + 32 <= n; i += 32)
            for (int u = 0; u < 32; u += 16) {
                __m128i x = _mm_loadu_si128((const __m128i *)(b + i + u));
                __m128i lo = _mm_unpacklo_epi8(_mm_setzero_si128(), x);
                __m128i hi = _mm_unpackhi_epi8(_mm_setzero_si128(), x);
                _mm256_storeu_ps(dst + i + u, _mm256_cvtph_ps(lo));
                _mm256_storeu_ps(dst + i + u + 8, _mm256_cvtph_ps(hi));
            }
        break;
    default:
        break;
    }
    widen_portable(b + i * (int64_t)fi_dtype_size(dtype), dtype, n - i, dst + i);
}

/* Eight elements of a row from element i on, as float32; e4m3fn ones are 2^-8 of their
 * value (the kernels multiply their sums back by ROW_SCALE_E4M3: exact, a power of two),
 * which saves a multiply per octet. dtype is a constant where this is inlined. */
FI_AVX2_INLINE __m256 load8(const void *row, fi_dtype dtype, int64_t i)
{
    if (dtype == DTYPE_E4M3FN_FINITE) { /* e4m3_to_half8_scaled less the NaN fix */
        __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + i));
        __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(), b);
        return _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16((short)0xbfff)));
    }
    switch (dtype) {
    case FI_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    case FI_DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case FI_DTYPE_E4M3FN: {
        __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + i));
        return _mm256_cvtph_ps(e4m3_to_half8_scaled(b));
    }
    case FI_DTYPE_E5M2: {
        __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + i));
        return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), b));
    }
    default:
        return _mm256_loadu_ps((const float *)row + i);
    }
}

/* What the sums over rows read by load8 are multiplied by. */
#define ROW_SCALE_E4M3 256.0f
#define ROW_SCALE(dtype)                                                                           \
    ((dtype) == FI_DTYPE_E4M3FN || (dtype) == DTYPE_E4M3FN_FINITE ? ROW_SCALE_E4M3 : 1.0f)

/* The four sums of a, b, c, e side by side. */
FI_AVX2_INLINE __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 e)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Score tiles: vt query rows x kt key rows, vt * kt <= 12 accumulators (or vt <= 8 with
 * one key). Every key octet is widened once per tile and feeds vt FMAs, so tiles are as
 * tall as the rows allow: on this class of CPU widening f16 costs FMA-port time. A 1 x 4
 * tile keeps a second accumulator per key over alternate octets: eight FMA chains, not
 * four waiting on the FMA latency. */
FI_AVX2_INLINE void scores_tile(int vt, int kt, fi_dtype dtype, const float *q,
                                const void *const *k, int64_t d, float *s, int64_t lds)
{
    __m256 acc[8][4], alt[4];
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            acc[v][j] = _mm256_setzero_ps();
    }
    UNROLLED
    for (int j = 0; j < 4; j++)
        alt[j] = _mm256_setzero_ps();
    int pair = vt == 1; /* two octets a step */
    for (int64_t i = 0; i < d; i += pair ? 16 : 8) {
        UNROLLED
        for (int j = 0; j < kt; j++) {
            __m256 kj = load8(k[j], dtype, i);
            UNROLLED
            for (int v = 0; v < vt; v++)
                acc[v][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * d + i), kj, acc[v][j]);
        }
        if (pair) {
            __m256 q1 = _mm256_loadu_ps(q + i + 8);
            UNROLLED
            for (int j = 0; j < kt; j++)
                alt[j] = _mm256_fmadd_ps(q1, load8(k[j], dtype, i + 8), alt[j]);
        }
    }
    if (pair) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            acc[0][j] = _mm256_add_ps(acc[0][j], alt[j]);
    }
    /* horizontal sums, four accumulators at a time, in (v, j) order */
    float sums[32];
    int n = vt * kt;
    UNROLLED
    for (int a = 0; a < n; a += 4) {
        __m256 x[4];
        UNROLLED
        for (int b = 0; b < 4; b++)
            x[b] = a + b < n ? acc[(a + b) / kt][(a + b) % kt] : _mm256_setzero_ps();
        _mm_storeu_ps(sums + a, sum4(x[0], x[1], x[2], x[3]));
    }
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            s[v * lds + j] = sums[v * kt + j] * ROW_SCALE(dtype);
    }
}

/* The tile shape for nv query rows (narrow: the rows are widened in registers). Widened
 * float32 rows cost nothing to reload, so they keep 3 x 4 tiles, the best for loads. */
typedef struct {
    int vt, kt;
} tile_shape;

FI_AVX2_INLINE tile_shape score_shape(int64_t nv, int narrow)
{
    if (!narrow || nv == 3 || nv > 8)
        return (tile_shape){nv == 1 ? 1 : nv == 2 ? 2 : 3, 4};
    if (nv >= 5)
        return (tile_shape){(int)nv, 1};
    return (tile_shape){(int)nv, nv == 4 ? 2 : 4};
}

/* One call per tile shape, so each is compiled with its loops unrolled. */
FI_AVX2_INLINE void scores_any(tile_shape t, fi_dtype dtype, const float *q, const void *const *k,
                               int64_t d, float *s, int64_t lds)
{
#define SCORES_SHAPE(V, K)                                                                         \
    if (t.vt == V && t.kt == K) {                                                                  \
        scores_tile(V, K, dtype, q, k, d, s, lds);                                                 \
        return;                                                                                    \
    }
    SCORES_SHAPE(3, 4)
    SCORES_SHAPE(2, 4)
    SCORES_SHAPE(1, 4)
    SCORES_SHAPE(4, 2)
    SCORES_SHAPE(5, 1)
    SCORES_SHAPE(6, 1)
    SCORES_SHAPE(7, 1)
    SCORES_SHAPE(8, 1)
#undef SCORES_SHAPE
}

FI_AVX2_INLINE void scores_rows(fi_dtype dtype, const float *q, int64_t nv, const void *const *k,
                                int64_t nb, int64_t d, float *s, int64_t lds,
                                const fi_row_prefetch *pf)
{
    int narrow = dtype != FI_DTYPE_F32;
    tile_shape whole = score_shape(nv, narrow);
    for (int64_t j = 0; j < nb; j += whole.kt) {
        prefetch_rows(pf, j * pf->n / nb, (j + whole.kt) * pf->n / nb);
        for (int64_t v = 0; v < nv;) {
            tile_shape t = score_shape(nv - v, narrow);
            t.kt = whole.kt; /* the remainder keeps the key step */
            if (t.vt * t.kt > 12)
                t.vt = 12 / t.kt;
            scores_any(t, dtype, q + v * d, k + j, d, s + v * lds + j, lds);
            v += t.vt;
        }
    }
}
FI_AVX2 static void scores_avx2(const float *q, int64_t nv, const void *const *k, fi_dtype dtype,
                                int64_t nb, int64_t d, float *s, int64_t lds,
                                const fi_row_prefetch *pf)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        scores_rows(FI_DTYPE_F16, q, nv, k, nb, d, s, lds, pf);
        break;
    case FI_DTYPE_BF16:
        scores_rows(FI_DTYPE_BF16, q, nv, k, nb, d, s, lds, pf);
        break;
    case FI_DTYPE_E4M3FN:
        if (e4m3_rows_finite(k, nb, d))
            scores_rows(DTYPE_E4M3FN_FINITE, q, nv, k, nb, d, s, lds, pf);
        else
            scores_rows(FI_DTYPE_E4M3FN, q, nv, k, nb, d, s, lds, pf);
        break;
    case FI_DTYPE_E5M2:
        scores_rows(FI_DTYPE_E5M2, q, nv, k, nb, d, s, lds, pf);
        break;
    default:
        scores_rows(FI_DTYPE_F32, q, nv, k, nb, d, s, lds, pf);
        break;
    }
}

/* vt output rows x ot octets of columns kept in registers over all nb value rows, every
 * value octet widened once per tile and feeding vt FMAs (shapes as for the scores); a
 * single row alternates between two accumulator sets over the keys. */
FI_AVX2_INLINE void accumulate_tile(int vt, int ot, fi_dtype dtype, const float *p, int64_t ldp,
                                    const float *corr, const void *const *vals, int64_t c,
                                    int64_t nb, int64_t d, float *o)
{
    __m256 acc[8][4], alt[4];
    UNROLLED
    for (int e = 0; e < 4; e++)
        alt[e] = _mm256_setzero_ps();
    UNROLLED
    for (int v = 0; v < vt; v++) { /* acc holds o / ROW_SCALE until the store */
        __m256 cv = _mm256_set1_ps(corr[v] / ROW_SCALE(dtype));
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[v][e] = _mm256_mul_ps(_mm256_loadu_ps(o + v * d + 8 * e), cv);
    }
    int pair = vt == 1;
    int64_t j = 0;
    for (; j + pair < nb; j += 1 + pair) {
        UNROLLED
        for (int e = 0; e < ot; e++) {
            __m256 x = load8(vals[j], dtype, c + 8 * e);
            UNROLLED
            for (int v = 0; v < vt; v++)
                acc[v][e] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + v * ldp + j), x, acc[v][e]);
        }
        if (pair) {
            __m256 p1 = _mm256_broadcast_ss(p + j + 1);
            UNROLLED
            for (int e = 0; e < ot; e++)
                alt[e] = _mm256_fmadd_ps(p1, load8(vals[j + 1], dtype, c + 8 * e), alt[e]);
        }
    }
    if (j < nb) { /* a single row's odd last key */
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[0][e] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j),
                                        load8(vals[j], dtype, c + 8 * e), acc[0][e]);
    }
    if (pair) {
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[0][e] = _mm256_add_ps(acc[0][e], alt[e]);
    }
    __m256 scale = _mm256_set1_ps(ROW_SCALE(dtype));
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int e = 0; e < ot; e++)
            _mm256_storeu_ps(o + v * d + 8 * e, _mm256_mul_ps(acc[v][e], scale));
    }
}

FI_AVX2_INLINE void accumulate_any(tile_shape t, fi_dtype dtype, const float *p, int64_t ldp,
                                   const float *corr, const void *const *vals, int64_t c,
                                   int64_t nb, int64_t d, float *o)
{
#define ACCUMULATE_SHAPE(V, E)                                                                     \
    if (t.vt == V && t.kt == E) {                                                                  \
        accumulate_tile(V, E, dtype, p, ldp, corr, vals, c, nb, d, o);                             \
        return;                                                                                    \
    }
    ACCUMULATE_SHAPE(3, 4)
    ACCUMULATE_SHAPE(2, 4)
    ACCUMULATE_SHAPE(1, 4)
    ACCUMULATE_SHAPE(4, 2)
    ACCUMULATE_SHAPE(5, 1)
    ACCUMULATE_SHAPE(6, 1)
    ACCUMULATE_SHAPE(7, 1)
    ACCUMULATE_SHAPE(8, 1)
#undef ACCUMULATE_SHAPE
}

/* Shapes as score_shape gives them, with kt read as octets of columns. */
FI_AVX2_INLINE void accumulate_rows(fi_dtype dtype, const float *p, int64_t ldp, int64_t nv,
                                    const float *corr, const void *const *vals, int64_t nb,
                                    int64_t d, float *o, const fi_row_prefetch *pf)
{
    int narrow = dtype != FI_DTYPE_F32;
    tile_shape whole = score_shape(nv, narrow);
    for (int64_t c = 0; c < d; c += 8 * whole.kt) {
        prefetch_rows(pf, c * pf->n / d, (c + 8 * whole.kt) * pf->n / d);
        for (int64_t v = 0; v < nv;) {
            tile_shape t = score_shape(nv - v, narrow);
            t.kt = whole.kt;
            if (t.vt * t.kt > 12)
                t.vt = 12 / t.kt;
            accumulate_any(t, dtype, p + v * ldp, ldp, corr + v, vals, c, nb, d, o + v * d + c);
            v += t.vt;
        }
    }
}

FI_AVX2 static void accumulate_avx2(const float *p, int64_t ldp, int64_t nv, const float *corr,
                                    const void *const *vals, fi_dtype dtype, int64_t nb, int64_t d,
                                    float *o, const fi_row_prefetch *pf)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        accumulate_rows(FI_DTYPE_F16, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    case FI_DTYPE_BF16:
        accumulate_rows(FI_DTYPE_BF16, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    case FI_DTYPE_E4M3FN:
        if (e4m3_rows_finite(vals, nb, d))
            accumulate_rows(DTYPE_E4M3FN_FINITE, p, ldp, nv, corr, vals, nb, d, o, pf);
        else
            accumulate_rows(FI_DTYPE_E4M3FN, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    case FI_DTYPE_E5M2:
        accumulate_rows(FI_DTYPE_E5M2, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    default:
        accumulate_rows(FI_DTYPE_F32, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    }
}

/* exp(x) for x <= 0 as Cephes' expf: x = n ln2 + r (ln2 split in two so r is exact),
 * a degree-7 polynomial in r, times 2^n; exp(0) is exactly 1, below -87.3 (and -inf)
 * it is 0, NaN stays NaN. */
FI_AVX2_INLINE __m256 exp_nonpositive(__m256 x)
{
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n built in the exponent field; n is clamped so the bits stay a normal float */
    __m256i e = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    __m256 scale =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(y, scale);
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    return _mm256_andnot_ps(tiny, y);
}

FI_AVX2 static float exp_sum_avx2(float *x, int64_t n, float m)
{
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) { /* the tail through a padded copy, so every lane runs the same code */
        float t[8] = {0};
        for (int64_t i = j; i < n; i++)
            t[i - j] = x[i] - m;
        for (int64_t i = n - j; i < 8; i++)
            t[i] = -INFINITY;
        __m256 e = exp_nonpositive(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        acc = _mm256_add_ps(acc, e);
        memcpy(x + j, t, (size_t)(n - j) * sizeof(float));
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

FI_AVX2 static float max_avx2(const float *x, int64_t n)
{
    __m256 acc = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) /* max_ps returns its second operand when one is NaN */
        acc = _mm256_max_ps(_mm256_loadu_ps(x + j), acc);
    float lanes[8], mx = max_portable(x + j, n - j);
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; i++)
        mx = lanes[i] > mx ? lanes[i] : mx;
    return mx;
}

static const fi_attention_block_ops avx2_ops = {
    widen_avx2, scores_avx2, accumulate_avx2, exp_sum_avx2, max_avx2, 1,
};

/* ---- AVX-512 (F, BW, VL, DQ): fp8 rows sixteen columns a step ---------------------- */

/* 16 e4m3fn codes as binary16, 2^-8 of their value, NaN codes not fixed: each byte
 * sign-extended to a word and shifted under the binary16 exponent (s.s.eeee.mmm then
 * zeros), the sign's copy in bit 14 cleared. */
FI_AVX512_INLINE __m256i e4m3_to_half16_scaled(__m128i bytes)
{
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
    return _mm256_and_si256(h, _mm256_set1_epi16((short)0xbfff));
}

/* Sixteen elements of an fp8 row from element i on, as float32 (e4m3fn ones 2^-8 of
 * their value, as load8 gives them). */
FI_AVX512_INLINE __m512 load16(const void *row, fi_dtype dtype, int64_t i)
{
    __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)row + i));
    if (dtype == DTYPE_E4M3FN_FINITE)
        return _mm512_cvtph_ps(e4m3_to_half16_scaled(b));
    if (dtype == FI_DTYPE_E4M3FN) { /* NaN codes (S.1111.111) made a binary16 NaN */
        __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(b, _mm_set1_epi8((char)0x80)),
                                            _mm_set1_epi8((char)0xff));
        return _mm512_cvtph_ps(
            _mm256_mask_mov_epi16(e4m3_to_half16_scaled(b), nan, _mm256_set1_epi16(0x7e00)));
    }
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8)); /* e5m2 */
}

/* The sums of a, b, c, e side by side: halves added, then sum4. */
FI_AVX512_INLINE __m128 sum4_512(__m512 a, __m512 b, __m512 c, __m512 e)
{
#define HALVES(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1))
    return sum4(HALVES(a), HALVES(b), HALVES(c), HALVES(e));
#undef HALVES
}

/* scores_tile sixteen columns a step: vt query rows x kt key rows, vt * kt <= 16. */
FI_AVX512_INLINE void scores_tile16(int vt, int kt, fi_dtype dtype, const float *q,
                                    const void *const *k, int64_t d, float *s, int64_t lds)
{
    __m512 acc[8][4], alt[4];
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            acc[v][j] = _mm512_setzero_ps();
    }
    UNROLLED
    for (int j = 0; j < 4; j++)
        alt[j] = _mm512_setzero_ps();
    int pair = vt == 1; /* two steps of sixteen at once */
    for (int64_t i = 0; i < d; i += pair ? 32 : 16) {
        __m512 kj[4]; /* all keys widened first: each query vector is loaded once a step */
        UNROLLED
        for (int j = 0; j < kt; j++)
            kj[j] = load16(k[j], dtype, i);
        UNROLLED
        for (int v = 0; v < vt; v++) {
            __m512 qv = _mm512_loadu_ps(q + v * d + i);
            UNROLLED
            for (int j = 0; j < kt; j++)
                acc[v][j] = _mm512_fmadd_ps(qv, kj[j], acc[v][j]);
        }
        if (pair) {
            __m512 q1 = _mm512_loadu_ps(q + i + 16);
            UNROLLED
            for (int j = 0; j < kt; j++)
                alt[j] = _mm512_fmadd_ps(q1, load16(k[j], dtype, i + 16), alt[j]);
        }
    }
    if (pair) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            acc[0][j] = _mm512_add_ps(acc[0][j], alt[j]);
    }
    float sums[32];
    int n = vt * kt;
    UNROLLED
    for (int a = 0; a < n; a += 4) {
        __m512 x[4];
        UNROLLED
        for (int b = 0; b < 4; b++)
            x[b] = a + b < n ? acc[(a + b) / kt][(a + b) % kt] : _mm512_setzero_ps();
        _mm_storeu_ps(sums + a, sum4_512(x[0], x[1], x[2], x[3]));
    }
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int j = 0; j < kt; j++)
            s[v * lds + j] = sums[v * kt + j] * ROW_SCALE(dtype);
    }
}

/* Tile shapes with 32 registers: up to 16 accumulators, four keys (or column chunks) a
 * tile for up to four query rows, two for five to eight. */
FI_AVX512_INLINE tile_shape score_shape16(int64_t nv)
{
    if (nv >= 5)
        return (tile_shape){nv > 8 ? 8 : (int)nv, 2};
    return (tile_shape){(int)nv, 4};
}

FI_AVX512_INLINE void scores_any16(tile_shape t, fi_dtype dtype, const float *q,
                                   const void *const *k, int64_t d, float *s, int64_t lds)
{
#define SCORES_SHAPE(V, K)                                                                         \
    if (t.vt == V && t.kt == K) {                                                                  \
        scores_tile16(V, K, dtype, q, k, d, s, lds);                                               \
        return;                                                                                    \
    }
    SCORES_SHAPE(1, 4)
    SCORES_SHAPE(2, 4)
    SCORES_SHAPE(3, 4)
    SCORES_SHAPE(4, 4)
    SCORES_SHAPE(5, 2)
    SCORES_SHAPE(6, 2)
    SCORES_SHAPE(7, 2)
    SCORES_SHAPE(8, 2)
#undef SCORES_SHAPE
}

FI_AVX512_INLINE void scores_rows16(fi_dtype dtype, const float *q, int64_t nv,
                                    const void *const *k, int64_t nb, int64_t d, float *s,
                                    int64_t lds, const fi_row_prefetch *pf)
{
    int64_t kt = score_shape16(nv).kt;
    for (int64_t j = 0; j < nb; j += kt) {
        prefetch_rows(pf, j * pf->n / nb, (j + kt) * pf->n / nb);
        for (int64_t v = 0; v < nv;) {
            tile_shape t = score_shape16(nv - v);
            t.kt = (int)kt; /* the remainder keeps the key step */
            if (t.vt * t.kt > 16)
                t.vt = 16 / t.kt;
            scores_any16(t, dtype, q + v * d, k + j, d, s + v * lds + j, lds);
            v += t.vt;
        }
    }
}

/* fp8 rows, whose widening is most of the work, on sixteen lanes (10-36 % faster than the
 * AVX2 tiles on Zen 4). f16 and bf16 rows keep the AVX2 tiles: on sixteen lanes they were
 * 10-23 % slower once the KV cache came from DRAM (32k tokens, paged batches); so do
 * float32 rows (widened first), which the AVX2 3 x 4 tiles suit. */
FI_AVX512 static void scores_avx512(const float *q, int64_t nv, const void *const *k,
                                    fi_dtype dtype, int64_t nb, int64_t d, float *s, int64_t lds,
                                    const fi_row_prefetch *pf)
{
    switch (dtype) {
    case FI_DTYPE_E4M3FN:
        if (e4m3_rows_finite(k, nb, d))
            scores_rows16(DTYPE_E4M3FN_FINITE, q, nv, k, nb, d, s, lds, pf);
        else
            scores_rows16(FI_DTYPE_E4M3FN, q, nv, k, nb, d, s, lds, pf);
        break;
    case FI_DTYPE_E5M2:
        scores_rows16(FI_DTYPE_E5M2, q, nv, k, nb, d, s, lds, pf);
        break;
    default:
        scores_avx2(q, nv, k, dtype, nb, d, s, lds, pf);
        break;
    }
}

/* accumulate_tile sixteen columns a chunk: vt output rows x ot chunks. */
FI_AVX512_INLINE void accumulate_tile16(int vt, int ot, fi_dtype dtype, const float *p, int64_t ldp,
                                        const float *corr, const void *const *vals, int64_t c,
                                        int64_t nb, int64_t d, float *o)
{
    __m512 acc[8][4], alt[4];
    UNROLLED
    for (int e = 0; e < 4; e++)
        alt[e] = _mm512_setzero_ps();
    UNROLLED
    for (int v = 0; v < vt; v++) { /* acc holds o / ROW_SCALE until the store */
        __m512 cv = _mm512_set1_ps(corr[v] / ROW_SCALE(dtype));
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[v][e] = _mm512_mul_ps(_mm512_loadu_ps(o + v * d + 16 * e), cv);
    }
    int pair = vt == 1;
    int64_t j = 0;
    for (; j + pair < nb; j += 1 + pair) {
        __m512 pv[8]; /* every probability broadcast once a key */
        UNROLLED
        for (int v = 0; v < vt; v++)
            pv[v] = _mm512_set1_ps(p[v * ldp + j]);
        UNROLLED
        for (int e = 0; e < ot; e++) {
            __m512 x = load16(vals[j], dtype, c + 16 * e);
            UNROLLED
            for (int v = 0; v < vt; v++)
                acc[v][e] = _mm512_fmadd_ps(pv[v], x, acc[v][e]);
        }
        if (pair) {
            __m512 p1 = _mm512_set1_ps(p[j + 1]);
            UNROLLED
            for (int e = 0; e < ot; e++)
                alt[e] = _mm512_fmadd_ps(p1, load16(vals[j + 1], dtype, c + 16 * e), alt[e]);
        }
    }
    if (j < nb) { /* a single row's odd last key */
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[0][e] = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), load16(vals[j], dtype, c + 16 * e),
                                        acc[0][e]);
    }
    if (pair) {
        UNROLLED
        for (int e = 0; e < ot; e++)
            acc[0][e] = _mm512_add_ps(acc[0][e], alt[e]);
    }
    __m512 scale = _mm512_set1_ps(ROW_SCALE(dtype));
    UNROLLED
    for (int v = 0; v < vt; v++) {
        UNROLLED
        for (int e = 0; e < ot; e++)
            _mm512_storeu_ps(o + v * d + 16 * e, _mm512_mul_ps(acc[v][e], scale));
    }
}

FI_AVX512_INLINE void accumulate_any16(tile_shape t, fi_dtype dtype, const float *p, int64_t ldp,
                                       const float *corr, const void *const *vals, int64_t c,
                                       int64_t nb, int64_t d, float *o)
{
#define ACCUMULATE_SHAPE(V, E)                                                                     \
    if (t.vt == V && t.kt == E) {                                                                  \
        accumulate_tile16(V, E, dtype, p, ldp, corr, vals, c, nb, d, o);                           \
        return;                                                                                    \
    }
    ACCUMULATE_SHAPE(1, 4)
    ACCUMULATE_SHAPE(2, 4)
    ACCUMULATE_SHAPE(3, 4)
    ACCUMULATE_SHAPE(4, 4)
    ACCUMULATE_SHAPE(5, 2)
    ACCUMULATE_SHAPE(6, 2)
    ACCUMULATE_SHAPE(7, 2)
    ACCUMULATE_SHAPE(8, 2)
    ACCUMULATE_SHAPE(1, 2)
    ACCUMULATE_SHAPE(2, 2)
    ACCUMULATE_SHAPE(3, 2)
    ACCUMULATE_SHAPE(4, 2)
#undef ACCUMULATE_SHAPE
}

/* Shapes as score_shape16 gives them, kt read as chunks of columns (two where fewer than
 * four chunks are left: d is a multiple of 32). */
FI_AVX512_INLINE void accumulate_rows16(fi_dtype dtype, const float *p, int64_t ldp, int64_t nv,
                                        const float *corr, const void *const *vals, int64_t nb,
                                        int64_t d, float *o, const fi_row_prefetch *pf)
{
    for (int64_t c = 0; c < d;) {
        tile_shape whole = score_shape16(nv);
        if (d - c < 16 * whole.kt)
            whole.kt = 2;
        prefetch_rows(pf, c * pf->n / d, (c + 16 * whole.kt) * pf->n / d);
        for (int64_t v = 0; v < nv;) {
            tile_shape t = score_shape16(nv - v);
            t.kt = whole.kt;
            if (t.vt * t.kt > 16)
                t.vt = 16 / t.kt;
            accumulate_any16(t, dtype, p + v * ldp, ldp, corr + v, vals, c, nb, d, o + v * d + c);
            v += t.vt;
        }
        c += 16 * whole.kt;
    }
}

/* fp8 rows as in scores_avx512. */
FI_AVX512 static void accumulate_avx512(const float *p, int64_t ldp, int64_t nv, const float *corr,
                                        const void *const *vals, fi_dtype dtype, int64_t nb,
                                        int64_t d, float *o, const fi_row_prefetch *pf)
{
    switch (dtype) {
    case FI_DTYPE_E4M3FN:
        if (e4m3_rows_finite(vals, nb, d))
            accumulate_rows16(DTYPE_E4M3FN_FINITE, p, ldp, nv, corr, vals, nb, d, o, pf);
        else
            accumulate_rows16(FI_DTYPE_E4M3FN, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    case FI_DTYPE_E5M2:
        accumulate_rows16(FI_DTYPE_E5M2, p, ldp, nv, corr, vals, nb, d, o, pf);
        break;
    default:
        accumulate_avx2(p, ldp, nv, corr, vals, dtype, nb, d, o, pf);
        break;
    }
}

static const fi_attention_block_ops avx512_ops = {
    widen_avx2, scores_avx512, accumulate_avx512, exp_sum_avx2, max_avx2, 1,
};
#endif

const fi_attention_block_ops *fi_attention_block_ops_for(int64_t d)
{
#ifdef FI_HAVE_X86_SIMD
    fi_isa isa = d % 32 == 0 ? fi_cpu_isa() : FI_ISA_PORTABLE;
    if (isa == FI_ISA_AVX512)
        return &avx512_ops;
    if (isa == FI_ISA_AVX2)
        return &avx2_ops;
#endif
    (void)d;
    return &portable_ops;
}
