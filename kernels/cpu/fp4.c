/* fp4.c: the fp4 GEMM on the CPU (E2M1 values with per-block E4M3 or UE8M0 scales, as
 * fp4_quantize.c makes them), dequantizing into the tiled float32 GEMM. */
#include "flashinfer_kernels.h"

#include "cpu_simd.h"
#include "fi_numeric.h"
#include "gemm_tiled.h"

#ifdef FI_HAVE_X86_SIMD
#define UNROLLED _Pragma("GCC unroll 8")
#endif

static float ue8m0_to_f32(uint8_t code) { return fi_e8m0fnu_to_f32(code); }

/* Tables built once per call: both E2M1 values of a packed byte, and every scale code. */
typedef struct {
    const fi_gemm_fp4_params *p;
    int64_t kblocks;
    int simd; /* AVX-512 decoding of contiguous lines */
    int avx2; /* AVX2 decoding of contiguous lines (block size a multiple of 16) */
    float pair[256][2];
    float scale[256];
    float value[16];
} fp4_ctx;

#ifdef FI_HAVE_X86_SIMD

/* The contiguous case of dequant_line, 16 values per step: each byte doubled, the odd
 * copies shifted down a nibble, and the 16-entry value table indexed by the low 4 bits
 * (the same products as the tables give). bs is a multiple of 16. */
__attribute__((target("avx512f"))) static void
dequant_contig_avx512(const float *value, const float *scale, const uint8_t *src, const uint8_t *sf,
                      fi_sf_layout layout, const fi_gemm_fp4_params *p, int64_t kblocks,
                      int64_t line, int64_t k0, int64_t kc, float *dst)
{
    const __m512 table = _mm512_loadu_ps(value);
    const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    int64_t bs = p->block_size;
    for (int64_t kk = 0; kk < kc; kk += bs) {
        int64_t kg = k0 + kk;
        __m512 s = _mm512_set1_ps(scale[sf[fi_sf_offset(line, kg / bs, kblocks, layout)]]);
        for (int64_t e = 0; e < bs; e += 16) {
            __m128i x = _mm_loadl_epi64((const __m128i *)(src + (kg + e) / 2));
            __m512i idx = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(x, x)), shift);
            _mm512_storeu_ps(dst + kk + e, _mm512_mul_ps(_mm512_permutexvar_ps(idx, table), s));
        }
    }
}
#endif

#ifdef FI_HAVE_X86_SIMD
/* Sixteen E2M1 values (8 bytes, element 2j in the low nibble) in element order. Every
 * E2M1 value is a float32 whose low 16 bits are zero: two byte lookups (vpshufb) give
 * the high 16 bits, sign included; no lane-crossing shuffles (slow on some AVX2 cores). */
FI_AVX2_INLINE void e2m1x16(const uint8_t *src, __m256 *first, __m256 *second)
{
    const __m128i top =
        _mm_setr_epi8(0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, (char)0x80, (char)0xbf,
                      (char)0xbf, (char)0xbf, (char)0xc0, (char)0xc0, (char)0xc0, (char)0xc0);
    const __m128i next =
        _mm_setr_epi8(0x00, 0x00, (char)0x80, (char)0xc0, 0x00, 0x40, (char)0x80, (char)0xc0, 0x00,
                      0x00, (char)0x80, (char)0xc0, 0x00, 0x40, (char)0x80, (char)0xc0);
    __m128i bytes = _mm_loadl_epi64((const __m128i *)src);
    __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(bytes, _mm_set1_epi8(15)),
                                      _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15)));
    __m128i lo = _mm_shuffle_epi8(next, codes), hi = _mm_shuffle_epi8(top, codes);
    __m128i w0 = _mm_unpacklo_epi8(lo, hi), w1 = _mm_unpackhi_epi8(lo, hi);
    *first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w0), 16));
    *second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w1), 16));
}

/* The contiguous case of dequant_line on AVX2 (the same products as the tables give). */
FI_AVX2 static void dequant_contig_avx2(const fp4_ctx *c, const uint8_t *src, const uint8_t *sf,
                                        fi_sf_layout layout, int64_t line, int64_t k0, int64_t kc,
                                        float *dst)
{
    int64_t bs = c->p->block_size;
    for (int64_t kk = 0; kk < kc; kk += bs) {
        int64_t kg = k0 + kk;
        __m256 s = _mm256_set1_ps(c->scale[sf[fi_sf_offset(line, kg / bs, c->kblocks, layout)]]);
        for (int64_t e = 0; e < bs; e += 16) {
            __m256 v0, v1;
            e2m1x16(src + (kg + e) / 2, &v0, &v1);
            _mm256_storeu_ps(dst + kk + e, _mm256_mul_ps(v0, s));
            _mm256_storeu_ps(dst + kk + e + 8, _mm256_mul_ps(v1, s));
        }
    }
}

/* Column j of B (contiguous codes) against up to eight rows of a, every 16 values widened
 * once for all rows; up to four rows keep two accumulators a row (eight FMA chains). */
FI_AVX2_INLINE void fp4_dot_column(int rows, const fp4_ctx *c, int64_t j, const float *a,
                                   int64_t lda, float *out)
{
    const fi_gemm_fp4_params *p = c->p;
    const uint8_t *src = (const uint8_t *)p->b.data + j * p->b.stride[1];
    int64_t bs = p->block_size, k = c->kblocks * bs;
    int64_t next = j + 1 < p->b.shape[1] ? p->b.stride[1] : 0;
    __m256 acc[8][2];
    UNROLLED
    for (int r = 0; r < 8; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < k; k0 += bs) {
        if (next && k0 % 128 == 0)
            __builtin_prefetch(src + next + k0 / 2);
        __m256 s =
            _mm256_set1_ps(c->scale[p->b_sf[fi_sf_offset(j, k0 / bs, c->kblocks, p->b_sf_layout)]]);
        for (int64_t e = k0; e < k0 + bs; e += 16) {
            __m256 v0, v1;
            e2m1x16(src + e / 2, &v0, &v1);
            v0 = _mm256_mul_ps(v0, s);
            v1 = _mm256_mul_ps(v1, s);
            UNROLLED
            for (int r = 0; r < rows; r++) {
                int alt = rows <= 4;
                acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + e), v0, acc[r][0]);
                acc[r][alt] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + e + 8), v1, acc[r][alt]);
            }
        }
    }
    UNROLLED
    for (int r = 0; r < rows; r++) {
        __m256 v = _mm256_add_ps(acc[r][0], acc[r][1]);
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        out[r] = _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
    }
}

/* fi_tiled_gemm's dot_b for a B whose codes run along k (b.stride[0] == 1). */
FI_AVX2 static void fp4_dot_b_avx2(const void *ctx, int64_t bi, int64_t j, const float *a,
                                   int64_t lda, int64_t m, float *out)
{
    (void)bi;
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
        int64_t rows = m - r0 < 8 ? m - r0 : 8;
        const float *ar = a + r0 * lda;
#define FP4_DOT_ROWS(R)                                                                            \
    if (rows == R)                                                                                 \
        fp4_dot_column(R, (const fp4_ctx *)ctx, j, ar, lda, out + r0);
        FP4_DOT_ROWS(1)
        FP4_DOT_ROWS(2)
        FP4_DOT_ROWS(3)
        FP4_DOT_ROWS(4)
        FP4_DOT_ROWS(5)
        FP4_DOT_ROWS(6)
        FP4_DOT_ROWS(7)
        FP4_DOT_ROWS(8)
#undef FP4_DOT_ROWS
    }
}
#endif

/* dst[0..kc) = the E2M1 codes of one row (a) or column (b) times their block scales:
 * bytes src[0], src[sk], ...; scales sf[offset(line, block)]. */
static void dequant_line(const fp4_ctx *c, const uint8_t *src, int64_t sk, const uint8_t *sf,
                         fi_sf_layout layout, int64_t line, int64_t k0, int64_t kc, float *dst)
{
    const fi_gemm_fp4_params *p = c->p;
    int64_t bs = p->block_size;
#ifdef FI_HAVE_X86_SIMD
    if (sk == 1 && c->simd) {
        dequant_contig_avx512(c->value, c->scale, src, sf, layout, p, c->kblocks, line, k0, kc,
                              dst);
        return;
    }
    if (sk == 1 && c->avx2) {
        dequant_contig_avx2(c, src, sf, layout, line, k0, kc, dst);
        return;
    }
#endif
    for (int64_t kk = 0; kk < kc; kk += bs) {
        int64_t kg = k0 + kk;
        float s = c->scale[sf[fi_sf_offset(line, kg / bs, c->kblocks, layout)]];
        const uint8_t *at = src + (kg / 2) * sk;
        float *d = dst + kk;
        if (sk == 1) {
            for (int64_t e = 0; e < bs / 2; e++) {
                d[2 * e] = c->pair[at[e]][0] * s;
                d[2 * e + 1] = c->pair[at[e]][1] * s;
            }
        } else {
            for (int64_t e = 0; e < bs / 2; e++) {
                d[2 * e] = c->pair[at[e * sk]][0] * s;
                d[2 * e + 1] = c->pair[at[e * sk]][1] * s;
            }
        }
    }
}

static void row_a(const void *ctx, int64_t bi, int64_t i, int64_t k0, int64_t kc, float *dst)
{
    (void)bi;
    const fp4_ctx *c = ctx;
    const fi_gemm_fp4_params *p = c->p;
    dequant_line(c, (const uint8_t *)p->a.data + i * p->a.stride[0], p->a.stride[1], p->a_sf,
                 p->sf_layout, i, k0, kc, dst);
}

static void col_b(const void *ctx, int64_t bi, int64_t j, int64_t k0, int64_t kc, float *dst)
{
    (void)bi;
    const fp4_ctx *c = ctx;
    const fi_gemm_fp4_params *p = c->p;
    dequant_line(c, (const uint8_t *)p->b.data + j * p->b.stride[1], p->b.stride[0], p->b_sf,
                 p->b_sf_layout, j, k0, kc, dst);
}

int fi_gemm_fp4_cpu(const fi_gemm_fp4_params *p)
{
    int64_t k = p->a.shape[1] * 2;
    fp4_ctx ctx = {.p = p, .kblocks = k / p->block_size};
    for (int v = 0; v < 256; v++) {
        ctx.pair[v][0] = fi_e2m1_to_f32((uint8_t)(v & 15));
        ctx.pair[v][1] = fi_e2m1_to_f32((uint8_t)(v >> 4));
        ctx.scale[v] = p->sf_ue8m0 ? ue8m0_to_f32((uint8_t)v) : fi_e4m3fn_to_f32((uint8_t)v);
    }
    for (int v = 0; v < 16; v++)
        ctx.value[v] = fi_e2m1_to_f32((uint8_t)v);
    void (*dot_b)(const void *, int64_t, int64_t, const float *, int64_t, int64_t, float *) = NULL;
#ifdef FI_HAVE_X86_SIMD
    ctx.simd = __builtin_cpu_supports("avx512f") && p->block_size % 16 == 0;
    ctx.avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && p->block_size % 16 == 0;
    if (ctx.avx2 && p->b.stride[0] == 1)
        dot_b = fp4_dot_b_avx2;
#endif
    fi_tiled_gemm g = {
        .batch = 1,
        .m = p->a.shape[0],
        .n = p->b.shape[1],
        .k = k,
        .row_a = row_a,
        .col_b = col_b,
        .dot_b = dot_b,
        .ctx = &ctx,
        .scale = p->alpha ? *p->alpha : 1.0f,
        .out = p->out,
        .num_threads = p->num_threads,
    };
    return fi_tiled_gemm_run(&g);
}
