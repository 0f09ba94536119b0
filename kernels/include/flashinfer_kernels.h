/* flashinfer_kernels.h: the plain C interface between the extension glue and the
 * compute kernels. CPU kernels (kernels/cpu) and CUDA kernels (kernels/cuda) implement it. */
#ifndef FLASHINFER_KERNELS_H
#define FLASHINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FI_MAX_DIMS 16

/* Every dtype torch has that we can name. Values are ours, not torch's. */
typedef enum {
    FI_DTYPE_UNKNOWN = 0,
    FI_DTYPE_F64,
    FI_DTYPE_F32,
    FI_DTYPE_F16,
    FI_DTYPE_BF16,
    FI_DTYPE_E4M3FN,
    FI_DTYPE_E4M3FNUZ,
    FI_DTYPE_E5M2,
    FI_DTYPE_E5M2FNUZ,
    FI_DTYPE_E8M0FNU,
    FI_DTYPE_FP4X2, /* float4_e2m1fn_x2: two packed E2M1 codes per byte */
    FI_DTYPE_I8,
    FI_DTYPE_I16,
    FI_DTYPE_I32,
    FI_DTYPE_I64,
    FI_DTYPE_U8,
    FI_DTYPE_U16,
    FI_DTYPE_U32,
    FI_DTYPE_U64,
    FI_DTYPE_BOOL,
    FI_DTYPE_C32, /* complex32 (chalf) */
    FI_DTYPE_C64,
    FI_DTYPE_C128,
    FI_DTYPE_COUNT
} fi_dtype;

typedef enum { FI_DEVICE_CPU = 0, FI_DEVICE_CUDA = 1, FI_DEVICE_OTHER = 2 } fi_device_type;

/* A strided view of tensor memory. Strides are in elements, as torch reports them. */
typedef struct {
    void *data; /* address of element [0, 0, ...] (storage offset applied) */
    int ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];
    fi_dtype dtype;
    fi_device_type device_type;
    int device_index;
} fi_tensor;

/* Bytes per element; 0 for FI_DTYPE_UNKNOWN. */
static inline size_t fi_dtype_size(fi_dtype d)
{
    switch (d) {
    case FI_DTYPE_F64:
    case FI_DTYPE_I64:
    case FI_DTYPE_U64:
    case FI_DTYPE_C64:
        return 8;
    case FI_DTYPE_F32:
    case FI_DTYPE_I32:
    case FI_DTYPE_U32:
    case FI_DTYPE_C32:
        return 4;
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16:
    case FI_DTYPE_I16:
    case FI_DTYPE_U16:
        return 2;
    case FI_DTYPE_C128:
        return 16;
    case FI_DTYPE_UNKNOWN:
    case FI_DTYPE_COUNT:
        return 0;
    default:
        return 1;
    }
}

static inline int64_t fi_tensor_numel(const fi_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---- Attention ------------------------------------------------------------------
 * One interface for decode and prefill, ragged or paged KV, CPU or CUDA. A batch of
 * num_requests requests; request b owns query rows qo_indptr[b] .. qo_indptr[b+1] of q
 * and o, and kv_len(b) keys: ragged, key j is token kv_indptr[b] + j of k/v; paged,
 * key j lives in page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size, and
 * kv_len(b) = (pages - 1) * page_size + kv_last_page_len[b] (0 with no pages).
 * Query row i of a request sits at position i + kv_len - qo_len, key j at position j. */

typedef enum { FI_POS_ENCODING_NONE = 0, FI_POS_ENCODING_ROPE_LLAMA = 1 } fi_pos_encoding;

typedef struct {
    int64_t num_requests;
    int64_t num_qo_heads, num_kv_heads, head_dim; /* num_qo_heads % num_kv_heads == 0 */

    /* q [total_qo, num_qo_heads, head_dim] and o (same shape), last dim contiguous;
     * strides in elements. q: f16/bf16/f32; o: f16/bf16/f32. */
    const void *q;
    fi_dtype q_dtype;
    int64_t q_stride_n, q_stride_h;
    void *o;
    fi_dtype o_dtype;
    int64_t o_stride_n, o_stride_h;
    /* lse [total_qo, num_qo_heads] float32, base-2 log-sum-exp of the scaled logits;
     * NULL when not wanted. */
    float *lse;
    int64_t lse_stride_n, lse_stride_h;
    const int32_t *qo_indptr; /* [num_requests + 1] */

    /* K and V: element (page, slot, head, d) at base + page * stride_page +
     * slot * stride_n + head * stride_h + d (ragged: page is always 0). kv_dtype is
     * q_dtype or float8 (E4M3FN, E5M2); k and v share it. */
    const void *k, *v;
    fi_dtype kv_dtype;
    int64_t k_stride_page, k_stride_n, k_stride_h;
    int64_t v_stride_page, v_stride_n, v_stride_h;
    int paged;                      /* 0: ragged, 1: paged */
    const int32_t *kv_indptr;       /* [num_requests + 1]: tokens (ragged) or pages */
    const int32_t *kv_indices;      /* paged only: page ids */
    const int32_t *kv_last_page_len; /* paged only: [num_requests] */
    int64_t page_size;              /* paged only */

    /* Optional custom mask: request b's [qo_len, kv_len] booleans, row-major, bit-packed
     * little-endian from byte mask_indptr[b] of mask (1 = visible). NULL: no mask. */
    const uint8_t *mask;
    const int32_t *mask_indptr;

    int causal;               /* key j visible to row i only if j <= i + kv_len - qo_len */
    int64_t window_left;      /* >= 0: also j >= i + kv_len - qo_len - window_left */
    float logits_soft_cap;    /* > 0: s = cap * tanh(s / cap) */
    float sm_scale;           /* logit scale, already multiplied by q and k scales */
    float v_scale;            /* output multiplier (fp8 V scale), 1 for none */
    fi_pos_encoding pos_encoding;
    float rope_scale, rope_theta;
} fi_attention_params;

/* Computes o (and lse) for every query row with fp32 accumulation and an online
 * softmax; a row that sees no key gets zeros and lse = -inf. Work is split over
 * (request, kv head, query tile) on num_threads threads. Arguments must already be
 * checked (the glue does it). Returns 0, or -1 when scratch memory ran out. */
int fi_attention_cpu(const fi_attention_params *p, int num_threads);

#ifdef __cplusplus
}
#endif

#endif
