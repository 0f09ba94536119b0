/* attention_block.h: the arithmetic of CPU attention on one block of keys (widen K/V rows
 * to float32, scores, exp, P @ V), in AVX-512 (fp8 rows), AVX2+FMA+F16C and portable versions. */
#ifndef FI_ATTENTION_BLOCK_H
#define FI_ATTENTION_BLOCK_H

#include "flashinfer_kernels.h"

/* Keys per score micro-tile: the key scratch is padded to a multiple of it. */
#define FI_SCORE_KEYS 4

/* Rows a kernel asks the cache for while it works (the next block's), a few per step, so
 * the requests overlap the arithmetic instead of queueing up at once. */
typedef struct {
    const char *const *rows;
    int64_t n, bytes; /* rows, and bytes from each row's start */
} fi_row_prefetch;

typedef struct {
    /* dst[0..n) = src[0..n) as float32; dtype f16, bf16, f32, e4m3fn or e5m2 (exact). */
    void (*widen)(const void *src, fi_dtype dtype, int64_t n, float *dst);
    /* s[v * lds + j] = q[v] . k[j] over d for v < nv, j < nb; q rows are d apart, k[j]
     * points at key row j (dtype as widen takes; float32 only when narrow_rows is 0), and
     * k holds nb rounded up to FI_SCORE_KEYS rows (the extra scores are written too). */
    void (*scores)(const float *q, int64_t nv, const void *const *k, fi_dtype dtype, int64_t nb,
                   int64_t d, float *s, int64_t lds, const fi_row_prefetch *pf);
    /* o[v] = o[v] * corr[v] + sum over j < nb of p[v * ldp + j] * vals[j], rows d long;
     * vals[j] points at value row j as k[j] does. */
    void (*accumulate)(const float *p, int64_t ldp, int64_t nv, const float *corr,
                       const void *const *vals, fi_dtype dtype, int64_t nb, int64_t d, float *o,
                       const fi_row_prefetch *pf);
    /* x[j] = exp(x[j] - m) for j < n (-inf gives 0, NaN stays NaN); returns their sum. m is
     * finite or +inf. */
    float (*exp_sum)(float *x, int64_t n, float m);
    /* max of x[0..n), -inf for n == 0 (NaNs are skipped). */
    float (*max)(const float *x, int64_t n);
    /* scores and accumulate read f16/bf16/fp8 rows themselves (no widening first) */
    int narrow_rows;
} fi_attention_block_ops;

/* The fastest version this CPU runs for head dimension d (FLASHINFER_CPU_ISA can lower it). */
const fi_attention_block_ops *fi_attention_block_ops_for(int64_t d);

#endif
