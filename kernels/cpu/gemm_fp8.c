/* gemm_fp8.c: fp8 (e4m3fn / e5m2) batched GEMM on the CPU: operands dequantized to
 * float32 (256-entry table, or e4m3 bit arithmetic in SIMD) while they are packed. */
#include "flashinfer_kernels.h"

#include <string.h>

#include "cpu_simd.h"
#include "fi_numeric.h"
#include "gemm_tiled.h"

/* dst[0..n) = decoded src[0..n) (contiguous bytes); lut is the operand's table. */
typedef void (*decode_fn)(const float *lut, const uint8_t *src, int64_t n, float *dst);

typedef struct {
    const fi_gemm_fp8_params *p;
    float lut_a[256], lut_b[256];
    decode_fn dec_a, dec_b;
} fp8_ctx;

static void fill_lut(fi_dtype dtype, float *lut)
{
    for (int v = 0; v < 256; v++)
        lut[v] = dtype == FI_DTYPE_E5M2 ? fi_e5m2_to_f32((uint8_t)v) : fi_e4m3fn_to_f32((uint8_t)v);
}

static void decode_lut(const float *lut, const uint8_t *src, int64_t n, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = lut[src[i]];
}

#ifdef FI_HAVE_X86_SIMD
/* e4m3fn, 16 at a time: normal codes are float32 bits (mag << 20) times 2^120,
 * subnormal ones mantissa * 2^-9, then the sign; 0x7f / 0xff take the table's NaN. */
__attribute__((target("avx512f"))) static void
decode_e4m3_avx512(const float *lut, const uint8_t *src, int64_t n, float *dst)
{
    const __m512i m7f = _mm512_set1_epi32(0x7f), m78 = _mm512_set1_epi32(0x78);
    const __m512i m07 = _mm512_set1_epi32(0x07), m80 = _mm512_set1_epi32(0x80);
    const __m512 p120 = _mm512_set1_ps(0x1p120f), pm9 = _mm512_set1_ps(0x1p-9f);
    const __m512 nan = _mm512_set1_ps(lut[0x7f]);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        __m512i mag = _mm512_and_si512(b, m7f);
        __m512 nrm = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), p120);
        __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, m07)), pm9);
        __mmask16 is_sub = _mm512_testn_epi32_mask(b, m78);
        __m512 f = _mm512_mask_mov_ps(nrm, is_sub, sub);
        __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, m80), 24);
        f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
        f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, m7f), nan);
        _mm512_storeu_ps(dst + i, f);
    }
    decode_lut(lut, src + i, n - i, dst + i);
}

/* The same, 8 at a time. */
__attribute__((target("avx2"))) static void decode_e4m3_avx2(const float *lut, const uint8_t *src,
                                                             int64_t n, float *dst)
{
    const __m256i m7f = _mm256_set1_epi32(0x7f), m78 = _mm256_set1_epi32(0x78);
    const __m256i m07 = _mm256_set1_epi32(0x07), m80 = _mm256_set1_epi32(0x80);
    const __m256 p120 = _mm256_set1_ps(0x1p120f), pm9 = _mm256_set1_ps(0x1p-9f);
    const __m256 nan = _mm256_set1_ps(lut[0x7f]);
    const __m256i zero = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
        __m256i mag = _mm256_and_si256(b, m7f);
        __m256 nrm = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), p120);
        __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, m07)), pm9);
        __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, m78), zero));
        __m256 f = _mm256_blendv_ps(nrm, sub, is_sub);
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, m80), 24);
        f = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(f), sign));
        f = _mm256_blendv_ps(f, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, m7f)));
        _mm256_storeu_ps(dst + i, f);
    }
    decode_lut(lut, src + i, n - i, dst + i);
}
#endif

/* The fastest decoder for this dtype and CPU; a SIMD one only after it reproduced the
 * table bit for bit on all 256 codes (which also rules out denormals-are-zero modes). */
static decode_fn pick_decode(fi_dtype dtype, const float *lut)
{
#ifdef FI_HAVE_X86_SIMD
    if (dtype != FI_DTYPE_E4M3FN)
        return decode_lut;
    decode_fn f = NULL;
    if (__builtin_cpu_supports("avx512f"))
        f = decode_e4m3_avx512;
    else if (__builtin_cpu_supports("avx2"))
        f = decode_e4m3_avx2;
    if (!f)
        return decode_lut;
    uint8_t codes[256];
    float got[256];
    for (int v = 0; v < 256; v++)
        codes[v] = (uint8_t)v;
    f(lut, codes, 256, got);
    return memcmp(got, lut, sizeof(got)) == 0 ? f : decode_lut;
#else
    (void)dtype;
    (void)lut;
    return decode_lut;
#endif
}

/* Asks for the run of bytes the caller will want next (the same k range of the next row
 * or column): runs are short and far apart, which the hardware prefetchers miss. */
static void prefetch_run(const uint8_t *next, int64_t bytes)
{
    for (int64_t at = 0; at < bytes; at += 64)
        __builtin_prefetch(next + at);
}

static void row_a(const void *ctx, int64_t bi, int64_t i, int64_t k0, int64_t kc, float *dst)
{
    const fp8_ctx *c = ctx;
    const fi_tensor *a = &c->p->a;
    const uint8_t *src =
        (const uint8_t *)a->data + bi * a->stride[0] + i * a->stride[1] + k0 * a->stride[2];
    int64_t sk = a->stride[2];
    if (sk == 1) {
        if (i + 1 < a->shape[1])
            prefetch_run(src + a->stride[1], kc);
        c->dec_a(c->lut_a, src, kc, dst);
        return;
    }
    for (int64_t kk = 0; kk < kc; kk++)
        dst[kk] = c->lut_a[src[kk * sk]];
}

static void col_b_strided(const void *ctx, int64_t bi, int64_t j, int64_t k0, int64_t kc,
                          float *dst)
{
    const fp8_ctx *c = ctx;
    const fi_tensor *b = &c->p->b;
    const uint8_t *src =
        (const uint8_t *)b->data + bi * b->stride[0] + k0 * b->stride[1] + j * b->stride[2];
    int64_t sk = b->stride[1];
    if (sk == 1) { /* column-major B: a contiguous run */
        if (j + 1 < b->shape[2])
            prefetch_run(src + b->stride[2], kc);
        c->dec_b(c->lut_b, src, kc, dst);
        return;
    }
    for (int64_t kk = 0; kk < kc; kk++)
        dst[kk] = c->lut_b[src[kk * sk]];
}

/* b is [k/128, n, 128]: column j of the logical [k, n] matrix runs through every block. */
static void col_b_block(const void *ctx, int64_t bi, int64_t j, int64_t k0, int64_t kc, float *dst)
{
    (void)bi;
    const fp8_ctx *c = ctx;
    const fi_tensor *b = &c->p->b;
    int64_t s2 = b->stride[2];
    for (int64_t kk = 0; kk < kc;) { /* one run within a 128-block at a time */
        int64_t kg = k0 + kk, run = 128 - kg % 128;
        if (run > kc - kk)
            run = kc - kk;
        const uint8_t *src = (const uint8_t *)b->data + (kg / 128) * b->stride[0] +
                             j * b->stride[1] + (kg % 128) * s2;
        if (s2 == 1 && j + 1 < b->shape[1])
            prefetch_run(src + b->stride[1], run);
        if (s2 == 1)
            c->dec_b(c->lut_b, src, run, dst + kk);
        else
            for (int64_t e = 0; e < run; e++)
                dst[kk + e] = c->lut_b[src[e * s2]];
        kk += run;
    }
}

#ifdef FI_HAVE_X86_SIMD
#define UNROLLED _Pragma("GCC unroll 8")

/* e4m3fn codes in the high bytes of w as binary16: the seven magnitude bits moved under
 * the binary16 exponent (2^-8 of the value, made up by the caller), NaN codes NaN. */
FI_AVX2_INLINE __m128i e4m3_as_half_scaled(__m128i w)
{
    __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16((short)0xbfff));
    __m128i is_nan =
        _mm_cmpeq_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f00)), _mm_set1_epi16(0x7f00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), is_nan);
}

/* rows of a (up to eight) dotted with n bytes of B (a multiple of 16), every 16 bytes
 * widened once for all rows. Up to four rows keep two accumulators a row, over alternate
 * octets, so at least eight FMA chains are in flight. A line of next (the same run of the
 * next column, or NULL) is prefetched per line read, so the requests overlap the work. */
FI_AVX2_INLINE void dot_run(int rows, int e4m3, const uint8_t *src, const uint8_t *next, int64_t n,
                            const float *a, int64_t lda, __m256 acc[8][2])
{
    const __m128i zero = _mm_setzero_si128();
    for (int64_t i = 0; i < n; i += 16) {
        if (next && i % 64 == 0)
            __builtin_prefetch(next + i);
        __m128i bytes = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i wl = _mm_unpacklo_epi8(zero, bytes), wh = _mm_unpackhi_epi8(zero, bytes);
        if (e4m3) {
            wl = e4m3_as_half_scaled(wl);
            wh = e4m3_as_half_scaled(wh);
        }
        __m256 lo = _mm256_cvtph_ps(wl), hi = _mm256_cvtph_ps(wh); /* e5m2: a binary16's top */
        UNROLLED
        for (int r = 0; r < rows; r++) {
            acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + i), lo, acc[r][0]);
            int alt = rows <= 4;
            acc[r][alt] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + i + 8), hi, acc[r][alt]);
        }
    }
}

/* One column of B against `rows` rows of A: the column's runs of contiguous k (one for a
 * column-major B, one per 128-block for the prepared layout), the same runs of the next
 * column prefetched as they go; a short last run goes through a zero-padded copy (A is
 * zero there). */
FI_AVX2_INLINE void dot_column(int rows, int e4m3, const fp8_ctx *c, int64_t bi, int64_t j,
                               const float *a, int64_t lda, float *out)
{
    const fi_tensor *b = &c->p->b;
    int block = c->p->b_layout == FI_GEMM_B_BLOCK_K128;
    int64_t k = block ? b->shape[0] * 128 : b->shape[1], run = block ? 128 : k;
    int64_t next =
        j + 1 < (block ? b->shape[1] : b->shape[2]) ? (block ? b->stride[1] : b->stride[2]) : 0;
    __m256 acc[8][2];
    UNROLLED
    for (int r = 0; r < 8; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < k; k0 += run) {
        const uint8_t *src =
            (const uint8_t *)b->data + (block ? (k0 / 128) * b->stride[0] + j * b->stride[1]
                                              : bi * b->stride[0] + j * b->stride[2]);
        int64_t n = k - k0 < run ? k - k0 : run, whole = n / 16 * 16;
        dot_run(rows, e4m3, src, next ? src + next : NULL, whole, a + k0, lda, acc);
        if (whole < n) {
            uint8_t tail[16] = {0};
            memcpy(tail, src + whole, (size_t)(n - whole));
            dot_run(rows, e4m3, tail, NULL, 16, a + k0 + whole, lda, acc);
        }
    }
    UNROLLED
    for (int r = 0; r < rows; r++) {
        __m256 v = _mm256_add_ps(acc[r][0], acc[r][1]);
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        x = _mm_add_ss(x, _mm_movehdup_ps(x));
        out[r] = _mm_cvtss_f32(x) * (e4m3 ? 256.0f : 1.0f); /* a power of two: exact */
    }
}

/* fi_tiled_gemm's dot_b: up to eight rows of A per pass down the column. */
__attribute__((target("avx2,fma,f16c"))) static void dot_b_avx2(const void *ctx, int64_t bi,
                                                                int64_t j, const float *a,
                                                                int64_t lda, int64_t m, float *out)
{
    const fp8_ctx *c = ctx;
    int e4m3 = c->p->b.dtype == FI_DTYPE_E4M3FN;
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
        int64_t rows = m - r0 < 8 ? m - r0 : 8;
        const float *ar = a + r0 * lda;
#define DOT_ROWS(R)                                                                                \
    if (rows == R) {                                                                               \
        if (e4m3)                                                                                  \
            dot_column(R, 1, c, bi, j, ar, lda, out + r0);                                         \
        else                                                                                       \
            dot_column(R, 0, c, bi, j, ar, lda, out + r0);                                         \
    }
        DOT_ROWS(1)
        DOT_ROWS(2)
        DOT_ROWS(3)
        DOT_ROWS(4)
        DOT_ROWS(5)
        DOT_ROWS(6)
        DOT_ROWS(7)
        DOT_ROWS(8)
#undef DOT_ROWS
    }
}
#endif

/* dot_b when B's k runs are contiguous and the CPU has AVX2, FMA and F16C; else NULL. */
static void (*pick_dot_b(const fi_gemm_fp8_params *p))(const void *, int64_t, int64_t,
                                                       const float *, int64_t, int64_t, float *)
{
#ifdef FI_HAVE_X86_SIMD
    int contiguous =
        p->b_layout == FI_GEMM_B_BLOCK_K128 ? p->b.stride[2] == 1 : p->b.stride[1] == 1;
    if (contiguous && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        fi_cpu_has_f16c())
        return dot_b_avx2;
#endif
    (void)p;
    return NULL;
}

int fi_gemm_fp8_cpu(const fi_gemm_fp8_params *p)
{
    fp8_ctx ctx = {.p = p};
    fill_lut(p->a.dtype, ctx.lut_a);
    fill_lut(p->b.dtype, ctx.lut_b);
    ctx.dec_a = pick_decode(p->a.dtype, ctx.lut_a);
    ctx.dec_b = pick_decode(p->b.dtype, ctx.lut_b);
    float scale = (p->a_scale ? *p->a_scale : 1.0f) * (p->b_scale ? *p->b_scale : 1.0f);
    fi_tiled_gemm g = {
        .batch = p->a.shape[0],
        .m = p->a.shape[1],
        .k = p->a.shape[2],
        .n = p->b_layout == FI_GEMM_B_BLOCK_K128 ? p->b.shape[1] : p->b.shape[2],
        .row_a = row_a,
        .col_b = p->b_layout == FI_GEMM_B_BLOCK_K128 ? col_b_block : col_b_strided,
        .dot_b = pick_dot_b(p),
        .ctx = &ctx,
        .scale = scale,
        .out = p->out,
        .num_threads = p->num_threads,
    };
    return fi_tiled_gemm_run(&g);
}
