/* fp4.c: NVFP4 / MXFP4 quantization (E2M1 values with per-block E4M3 or UE8M0 scales)
 * and the fp4 GEMM on the CPU, dequantizing into the tiled float32 GEMM. */
#include "flashinfer_kernels.h"

#include <pthread.h>

#include "fi_numeric.h"
#include "gemm_tiled.h"

static float ue8m0_to_f32(uint8_t code) { return fi_e8m0fnu_to_f32(code); }

static float load_f32(const fi_tensor *x, const char *row, int64_t col)
{
    const char *at = row + col * x->stride[1] * (int64_t)fi_dtype_size(x->dtype);
    uint16_t h;
    switch (x->dtype) {
    case FI_DTYPE_F16:
        memcpy(&h, at, 2);
        return fi_f16_to_f32(h);
    case FI_DTYPE_BF16:
        memcpy(&h, at, 2);
        return fi_bf16_to_f32(h);
    default: {
        float f;
        memcpy(&f, at, 4);
        return f;
    }
    }
}

/* Quantizes row r: one scale per sf_vec_size elements, then the element codes. */
static void quantize_row(const fi_fp4_quantize_params *p, float gsf, int64_t r)
{
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], sv = p->sf_vec_size, blocks = k / sv;
    const char *row = (const char *)x->data + r * x->stride[0] * (int64_t)fi_dtype_size(x->dtype);
    uint8_t *q = p->x_q + r * (k / 2);
    float vals[32];
    for (int64_t c = 0; c < blocks; c++) {
        float amax = 0.0f;
        for (int64_t e = 0; e < sv; e++) {
            vals[e] = load_f32(x, row, c * sv + e);
            amax = fmaxf(amax, fabsf(vals[e]));
        }
        float sf_value = gsf * amax;
        sf_value = sf_value / 6.0f;
        uint8_t code;
        float sf;
        if (p->sf_ue8m0) {
            code = fi_f32_to_ue8m0_ceil(sf_value);
            sf = code == 0 && !(sf_value > 0.0f) ? 0.0f : ue8m0_to_f32(code);
        } else {
            code = fi_f32_to_e4m3fn(sf_value);
            sf = fi_e4m3fn_to_f32(code);
        }
        p->sf[fi_sf_offset(r, c, blocks, p->sf_layout)] = code;
        float scale = sf == 0.0f ? 0.0f : gsf / sf;
        for (int64_t e = 0; e < sv; e += 2) {
            uint8_t lo = scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e] * scale);
            uint8_t hi = scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e + 1] * scale);
            q[(c * sv + e) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

typedef struct {
    const fi_fp4_quantize_params *p;
    float gsf;
    int64_t r0, r1;
} quantize_range;

static void *quantize_rows(void *arg)
{
    const quantize_range *qr = arg;
    for (int64_t r = qr->r0; r < qr->r1; r++)
        quantize_row(qr->p, qr->gsf, r);
    return NULL;
}

int fi_fp4_quantize_cpu(const fi_fp4_quantize_params *p)
{
    int64_t m = p->x.shape[0], k = p->x.shape[1];
    memset(p->sf, 0, (size_t)fi_sf_bytes(m, k / p->sf_vec_size, p->sf_layout));
    float gsf = p->global_scale ? *p->global_scale : 1.0f;
    if (p->global_scale_inversed)
        gsf = 1.0f / gsf;
    enum { MAX_THREADS = 64, MIN_ROWS = 64 };
    int nt = p->num_threads < 1 ? 1 : (p->num_threads > MAX_THREADS ? MAX_THREADS : p->num_threads);
    if (nt > m / MIN_ROWS)
        nt = m / MIN_ROWS > 0 ? (int)(m / MIN_ROWS) : 1;
    quantize_range ranges[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++)
        ranges[t] = (quantize_range){p, gsf, m * t / nt, m * (t + 1) / nt};
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&threads[t], NULL, quantize_rows, &ranges[t]) == 0;
    quantize_rows(&ranges[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            quantize_rows(&ranges[t]); /* could not start a thread: do its rows here */
    }
    return 0;
}

/* Tables built once per call: both E2M1 values of a packed byte, and every scale code. */
typedef struct {
    const fi_gemm_fp4_params *p;
    int64_t kblocks;
    int simd; /* AVX-512 decoding of contiguous lines */
    float pair[256][2];
    float scale[256];
    float value[16];
} fp4_ctx;

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define FI_HAVE_SIMD_DECODE 1

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

/* dst[0..kc) = the E2M1 codes of one row (a) or column (b) times their block scales:
 * bytes src[0], src[sk], ...; scales sf[offset(line, block)]. */
static void dequant_line(const fp4_ctx *c, const uint8_t *src, int64_t sk, const uint8_t *sf,
                         fi_sf_layout layout, int64_t line, int64_t k0, int64_t kc, float *dst)
{
    const fi_gemm_fp4_params *p = c->p;
    int64_t bs = p->block_size;
#ifdef FI_HAVE_SIMD_DECODE
    if (sk == 1 && c->simd) {
        dequant_contig_avx512(c->value, c->scale, src, sf, layout, p, c->kblocks, line, k0, kc,
                              dst);
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
#ifdef FI_HAVE_SIMD_DECODE
    ctx.simd = __builtin_cpu_supports("avx512f") && p->block_size % 16 == 0;
#endif
    fi_tiled_gemm g = {
        .batch = 1,
        .m = p->a.shape[0],
        .n = p->b.shape[1],
        .k = k,
        .row_a = row_a,
        .col_b = col_b,
        .ctx = &ctx,
        .scale = p->alpha ? *p->alpha : 1.0f,
        .out = p->out,
        .num_threads = p->num_threads,
    };
    return fi_tiled_gemm_run(&g);
}
