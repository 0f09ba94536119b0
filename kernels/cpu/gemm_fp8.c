/* gemm_fp8.c: fp8 (e4m3fn / e5m2) batched GEMM on the CPU: operands dequantized to
 * float32 through a 256-entry table while they are packed, then the tiled f32 GEMM. */
#include "flashinfer_kernels.h"

#include "fi_numeric.h"
#include "gemm_tiled.h"

typedef struct {
    const fi_gemm_fp8_params *p;
    float lut_a[256], lut_b[256];
} fp8_ctx;

static void fill_lut(fi_dtype dtype, float *lut)
{
    for (int v = 0; v < 256; v++)
        lut[v] = dtype == FI_DTYPE_E5M2 ? fi_e5m2_to_f32((uint8_t)v) : fi_e4m3fn_to_f32((uint8_t)v);
}

static void row_a(const void *ctx, int64_t bi, int64_t i, int64_t k0, int64_t kc, float *dst)
{
    const fp8_ctx *c = ctx;
    const fi_tensor *a = &c->p->a;
    const uint8_t *src = (const uint8_t *)a->data + bi * a->stride[0] + i * a->stride[1] +
                         k0 * a->stride[2];
    int64_t sk = a->stride[2];
    if (sk == 1) {
        for (int64_t kk = 0; kk < kc; kk++)
            dst[kk] = c->lut_a[src[kk]];
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
    const uint8_t *src = (const uint8_t *)b->data + bi * b->stride[0] + k0 * b->stride[1] +
                         j * b->stride[2];
    int64_t sk = b->stride[1];
    if (sk == 1) { /* column-major B: a contiguous run */
        for (int64_t kk = 0; kk < kc; kk++)
            dst[kk] = c->lut_b[src[kk]];
        return;
    }
    for (int64_t kk = 0; kk < kc; kk++)
        dst[kk] = c->lut_b[src[kk * sk]];
}

/* b is [k/128, n, 128]: column j of the logical [k, n] matrix runs through every block. */
static void col_b_block(const void *ctx, int64_t bi, int64_t j, int64_t k0, int64_t kc,
                        float *dst)
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
        if (s2 == 1)
            for (int64_t e = 0; e < run; e++)
                dst[kk + e] = c->lut_b[src[e]];
        else
            for (int64_t e = 0; e < run; e++)
                dst[kk + e] = c->lut_b[src[e * s2]];
        kk += run;
    }
}

int fi_gemm_fp8_cpu(const fi_gemm_fp8_params *p)
{
    fp8_ctx ctx = {.p = p};
    fill_lut(p->a.dtype, ctx.lut_a);
    fill_lut(p->b.dtype, ctx.lut_b);
    float scale = (p->a_scale ? *p->a_scale : 1.0f) * (p->b_scale ? *p->b_scale : 1.0f);
    fi_tiled_gemm g = {
        .batch = p->a.shape[0],
        .m = p->a.shape[1],
        .k = p->a.shape[2],
        .n = p->b_layout == FI_GEMM_B_BLOCK_K128 ? p->b.shape[1] : p->b.shape[2],
        .row_a = row_a,
        .col_b = p->b_layout == FI_GEMM_B_BLOCK_K128 ? col_b_block : col_b_strided,
        .ctx = &ctx,
        .scale = scale,
        .out = p->out,
        .num_threads = p->num_threads,
    };
    return fi_tiled_gemm_run(&g);
}
