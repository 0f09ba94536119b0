/* gemm_tiled.h: the float32 cache-blocked GEMM driver the quantized GEMMs share.
 * Callers supply how to dequantize one row of A and one column of B; it does the rest. */
#ifndef FI_GEMM_TILED_H
#define FI_GEMM_TILED_H

#include "flashinfer_kernels.h"

/* k0 and kc passed to the callbacks are multiples of FI_TILED_KC_ALIGN (except at k). */
#define FI_TILED_KC_ALIGN 128
/* Up to this many rows of A the GEMM is a pass over B per row block (bandwidth-bound). */
#define FI_TILED_SMALL_M 16

typedef struct {
    int64_t batch, m, n, k;
    /* dst[0..kc) = A[batch][i][k0..k0+kc) as float32 */
    void (*row_a)(const void *ctx, int64_t batch, int64_t i, int64_t k0, int64_t kc, float *dst);
    /* dst[0..kc) = B[batch][k0..k0+kc)[j] as float32 */
    void (*col_b)(const void *ctx, int64_t batch, int64_t j, int64_t k0, int64_t kc, float *dst);
    /* Optional (NULL: col_b is used), for m <= FI_TILED_SMALL_M: out[r] = the dot product
     * of row r of a (A as row_a gives it, rows lda apart, zero-padded to lda, a multiple
     * of 16) with column j of B[batch], for r < m; B read once, widened in registers. */
    void (*dot_b)(const void *ctx, int64_t batch, int64_t j, const float *a, int64_t lda, int64_t m,
                  float *out);
    const void *ctx;
    float scale;   /* applied to every accumulated sum before the store */
    fi_tensor out; /* [batch, m, n] (or [m, n] when batch is 1), f32/f16/bf16, contiguous */
    int num_threads;
} fi_tiled_gemm;

/* Runs the GEMM on num_threads pthreads; 0, or -1 when memory ran out. */
int fi_tiled_gemm_run(const fi_tiled_gemm *g);

#endif
