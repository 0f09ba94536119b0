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

/* ---- GEMM and FP4 ----------------------------------------------------------------
 * fp8 GEMM (bmm_fp8, mm_fp8), NVFP4/MXFP4 quantization and the fp4 GEMM (mm_fp4).
 * Pointers to scales are device memory on CUDA; the CPU kernels read them directly.
 * Every function returns 0, or -1 when it could not allocate its scratch memory. */

/* Layout of the B operand of an fp8 GEMM. */
typedef enum {
    FI_GEMM_B_STRIDED = 0,   /* b is [batch, k, n], any strides (column-major is fastest) */
    FI_GEMM_B_BLOCK_K128 = 1 /* b is [k/128, n, 128]: prepare_low_latency_gemm_weights */
} fi_gemm_b_layout;

/* out[i] = (a[i] @ b[i]) * a_scale * b_scale, accumulated in float32. */
typedef struct {
    fi_tensor a;   /* [batch, m, k] float8_e4m3fn or float8_e5m2, any strides */
    fi_tensor b;   /* [batch, k, n] or [k/128, n, 128] (batch 1), see b_layout */
    fi_tensor out; /* [batch, m, n] bfloat16, float16 or float32, contiguous */
    fi_gemm_b_layout b_layout;
    const float *a_scale; /* one float32 each; NULL means 1 */
    const float *b_scale;
    int num_threads; /* CPU worker threads, >= 1 */
    void *stream;    /* cudaStream_t on CUDA; unused on CPU */
} fi_gemm_fp8_params;

int fi_gemm_fp8_cpu(const fi_gemm_fp8_params *p);

/* Block-scale layouts of quantized fp4 tensors (values are FlashInfer's SfLayout). */
typedef enum {
    FI_SF_LAYOUT_128X4 = 0, /* [roundup(rows,128), roundup(cols,4)] in 512-byte tiles */
    FI_SF_LAYOUT_8X4 = 1,   /* [roundup(rows,8), roundup(cols,4)] in 32-byte tiles */
    FI_SF_LAYOUT_LINEAR = 2 /* [rows, cols] row-major */
} fi_sf_layout;

/* Bytes a scale matrix of rows x cols blocks takes in the given layout (padding included);
 * fi_sf_offset (fi_numeric.h, host and device) places each scale in it. */
static inline int64_t fi_sf_bytes(int64_t rows, int64_t cols, fi_sf_layout layout)
{
    int64_t cp = (cols + 3) / 4 * 4;
    if (layout == FI_SF_LAYOUT_128X4)
        return (rows + 127) / 128 * 128 * cp;
    if (layout == FI_SF_LAYOUT_8X4)
        return (rows + 7) / 8 * 8 * cp;
    return rows * cols;
}

/* NVFP4 (sf_vec_size 16, E4M3 scales) or MXFP4 (sf_vec_size 32, UE8M0 scales) quantization
 * of x [m, k] along k. x_q gets two E2M1 codes per byte, element 2j in the low nibble; sf is
 * zeroed first (padding included).
 *
 * Per-token mode (per_token_scale not NULL; NVFP4, global scale not inversed, holding the
 * inverse base multiplier): row r is quantized with the encode scale of
 * fi_per_token_encode_scale(amax(|x[r, :]|), global scale) and per_token_scale[r] is its
 * decode scale times out_scale[0] (out_scale NULL: 1). row_map (NULL: every row) names the rows
 * quantized: row_map[i] for i < m, negative entries skipped, each row at most once; x_q and
 * per_token_scale of the others are not written. */
typedef struct {
    fi_tensor x;               /* [m, k] float32, float16, bfloat16 or e4m3fn, any strides */
    uint8_t *x_q;              /* [m, k/2] contiguous */
    uint8_t *sf;               /* fi_sf_bytes(m, k/sf_vec_size, sf_layout) bytes */
    const float *global_scale; /* one float32; NULL: global_scale_value */
    float global_scale_value;  /* the global scale when it came as a number (1: none) */
    int global_scale_inversed; /* nonzero: the scale used is 1/global_scale */
    int sf_vec_size;           /* 16 or 32 */
    int sf_ue8m0;              /* nonzero: UE8M0 scales, else E4M3 */
    fi_sf_layout sf_layout;
    float *per_token_scale; /* [m], or NULL */
    const float *out_scale; /* one float32, or NULL */
    /* NVFP4 4over6 (FlashInfer's recipe, exact-math form; NVFP4 only): each block is
     * quantized with two E4M3 scales, amax / 6 and 1.5 times it (its largest values then
     * map to 4), and keeps the one whose dequantized values differ less from the input
     * (sum of |d|, or of d^2 with 4over6_mse); 0: off. */
    int nvfp4_4over6;
    int nvfp4_4over6_mse;
    int nvfp4_4over6_err_fast_math; /* the error against x * global scale, not dequantized */
    float nvfp4_4over6_e4m3_max;    /* 448 or 256: the per-token error denominator's */
    const int32_t *row_map;         /* [m] row indices in [0, m) or negative, or NULL */
    int num_threads;
    void *stream;
} fi_fp4_quantize_params;

int fi_fp4_quantize_cpu(const fi_fp4_quantize_params *p);

/* Dequantization of m rows of k packed E2M1 values (x_q, [m, k/2] contiguous) with their
 * block scales (sf, m x k/sf_vec_size blocks in sf_layout; E4M3, or UE8M0 when sf_ue8m0):
 * out[r, e] = (e2m1 * scale) * global_scale[0] (NULL: 1), float32 [m, k] contiguous. */
typedef struct {
    const uint8_t *x_q;
    const uint8_t *sf;
    int64_t m, k;
    int sf_vec_size, sf_ue8m0;
    fi_sf_layout sf_layout;
    const float *global_scale;
    float *out;
} fi_fp4_dequantize_params;

int fi_fp4_dequantize_cpu(const fi_fp4_dequantize_params *p);

/* Scales of batches x rows x cols elements of esize bytes, row-major, into the 128x4 layout
 * (fi_sf_bytes(rows, cols, FI_SF_LAYOUT_128X4) elements per batch, padding zeroed). */
void fi_sf_interleave_cpu(const void *src, int64_t batches, int64_t rows, int64_t cols,
                          size_t esize, void *dst);

/* TRT-LLM's shuffleMatrixA: rows of row_bytes bytes permuted within blocks of `block` (16
 * or 32) rows; rows is a multiple of block; dst does not overlap src. */
void fi_shuffle_rows_cpu(const uint8_t *src, int64_t rows, int64_t row_bytes, int block,
                         uint8_t *dst);

/* out = alpha * dequant(a) @ dequant(b): a holds m rows of k E2M1 values, b holds the n
 * rows of a quantized [n, k] weight viewed as [k/2, n]; scales as fi_fp4_quantize made. */
typedef struct {
    fi_tensor a;              /* [m, k/2] packed E2M1 (uint8 or float4_e2m1fn_x2) */
    fi_tensor b;              /* [k/2, n] packed E2M1 */
    const uint8_t *a_sf;      /* m rows x k/block_size blocks, in sf_layout */
    const uint8_t *b_sf;      /* n rows x k/block_size blocks, in b_sf_layout */
    fi_sf_layout sf_layout;   /* a's scales */
    fi_sf_layout b_sf_layout; /* b's scales (128x4 when a's are 8x4, as in FlashInfer) */
    int block_size;           /* 16 (E4M3 scales) or 32 (UE8M0 scales) */
    int sf_ue8m0;
    const float *alpha; /* one float32; NULL means 1 */
    fi_tensor out;      /* [m, n] bfloat16, float16 or float32, contiguous */
    int num_threads;
    void *stream;
} fi_gemm_fp4_params;

int fi_gemm_fp4_cpu(const fi_gemm_fp4_params *p);

/* CUDA twins (kernels/cuda, built with FI_WITH_CUDA): the same params, with every tensor
 * and scale pointer in the memory of the device a.device_index (x for quantization); they
 * launch on p->stream (a cudaStream_t, NULL for the legacy default stream) with that device
 * current, restoring the caller's afterwards, and do not wait for the kernels. Each returns
 * 0, or nonzero with the reason in fi_cuda_last_error(). Quantization
 * is bit-exact with the CPU kernel; the GEMMs sum in float32 in another order. */
int fi_gemm_fp8_cuda(const fi_gemm_fp8_params *p);
int fi_fp4_quantize_cuda(const fi_fp4_quantize_params *p);
int fi_gemm_fp4_cuda(const fi_gemm_fp4_params *p);

/* bmm_fp8 (FI_GEMM_B_STRIDED) through cuBLASLt, dlopen'ed at first use (lib_dir, may be
 * NULL, is searched after the libraries already loaded in the process and before the
 * loader's path). workspace: workspace_bytes of device memory for the call (may be NULL).
 * Returns 0 when cuBLASLt ran the GEMM; -1 with *why set (a static string) when it could
 * not (no library, a layout or dtype it does not take, no algorithm, an error), in which
 * case nothing was written and the caller falls back to fi_gemm_fp8_cuda. */
int fi_gemm_fp8_cublaslt(const fi_gemm_fp8_params *p, const char *lib_dir, void *workspace,
                         size_t workspace_bytes, const char **why);

/* Loads cuBLASLt if not yet tried; returns the name it was loaded by, or NULL. */
const char *fi_cublaslt_library(const char *lib_dir);

/* ---- Gated activations ------------------------------------------------------------
 * out[r, i] = act(x[r, i]) * x[r, d + i] in float32, for x [rows, 2d] and out [rows, d] of
 * one dtype (f16, bf16, f32), last dimensions contiguous. */
typedef enum { FI_ACT_SILU = 0, FI_ACT_GELU = 1, FI_ACT_GELU_TANH = 2 } fi_activation;

typedef struct {
    fi_activation act;
    const void *x;
    void *out;
    fi_dtype dtype;
    int64_t rows, d, x_row_stride, out_row_stride; /* strides in elements */
} fi_act_and_mul_params;

int fi_act_and_mul_cpu(const fi_act_and_mul_params *p);

/* ---- Attention ------------------------------------------------------------------
 * One interface for decode and prefill, ragged or paged KV, CPU or CUDA. A batch of
 * num_requests requests; request b owns query rows qo_indptr[b] .. qo_indptr[b+1] of q
 * and o, and kv_len(b) keys: ragged, key j is token kv_indptr[b] + j of k/v; paged,
 * key j lives in page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size, and
 * kv_len(b) = (pages - 1) * page_size + kv_last_page_len[b] (0 with no pages).
 * Query row i of a request sits at position i + kv_len - qo_len, key j at position j. */

/* Values are FlashInfer's PosEncodingMode. ALiBi adds slope(head) * (key position - query
 * position) to each scaled logit, before the soft cap (fi_alibi_slope, fi_numeric.h). */
typedef enum {
    FI_POS_ENCODING_NONE = 0,
    FI_POS_ENCODING_ROPE_LLAMA = 1,
    FI_POS_ENCODING_ALIBI = 2
} fi_pos_encoding;

typedef struct {
    int64_t num_requests;
    int64_t num_qo_heads, num_kv_heads, head_dim; /* num_qo_heads % num_kv_heads == 0 */
    int64_t head_dim_vo; /* V and output rows; head_dim is q's and k's (the glue's pairs) */

    /* q [total_qo, num_qo_heads, head_dim] and o [.., head_dim_vo], last dim contiguous;
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
     * q_dtype, float8 (E4M3FN, E5M2) or NVFP4 (FP4X2, below); k and v share it. */
    const void *k, *v;
    fi_dtype kv_dtype;
    int64_t k_stride_page, k_stride_n, k_stride_h;
    int64_t v_stride_page, v_stride_n, v_stride_h;
    int paged;                       /* 0: ragged, 1: paged */
    const int32_t *kv_indptr;        /* [num_requests + 1]: tokens (ragged) or pages */
    const int32_t *kv_indices;       /* paged only: page ids */
    const int32_t *kv_last_page_len; /* paged only: [num_requests] */
    int64_t page_size;               /* paged only */
    const int32_t *v_indptr;         /* ragged only: V rows of request b from v_indptr[b]
                                        instead of kv_indptr[b]; NULL: kv_indptr */

    /* NVFP4 KV (kv_dtype FI_DTYPE_FP4X2): a K/V row holds head_dim / 2 bytes, element 2i
     * in the low nibble of byte i (strides above count bytes); element d of a row is its
     * E2M1 value times the E4M3 scale d / 16 of that row, at k_sf + page * k_sf_stride_page
     * + slot * k_sf_stride_n + head * k_sf_stride_h + d / 16 (v_sf likewise). */
    const uint8_t *k_sf, *v_sf;
    int64_t k_sf_stride_page, k_sf_stride_n, k_sf_stride_h;
    int64_t v_sf_stride_page, v_sf_stride_n, v_sf_stride_h;

    /* Optional custom mask: request b's [qo_len, kv_len] booleans, row-major, bit-packed
     * little-endian from byte mask_indptr[b] of mask (1 = visible). NULL: no mask. */
    const uint8_t *mask;
    const int32_t *mask_indptr;

    int causal;            /* key j visible to row i only if j <= i + kv_len - qo_len */
    int64_t window_left;   /* >= 0: also j >= i + kv_len - qo_len - window_left */
    float logits_soft_cap; /* > 0: s = cap * tanh(s / cap) */
    float sm_scale;        /* logit scale, already multiplied by q and k scales */
    float v_scale;         /* output multiplier (V scale over output scale), 1 for none */
    fi_pos_encoding pos_encoding;
    float rope_scale, rope_theta;
    /* Attention sinks: sinks[h] joins the softmax of every row of head h as one more logit
     * (in the units of the scaled logits, not soft-capped) with no value: it counts in the
     * denominator and lse, not the output. NULL: none. */
    const float *sinks;
    /* FP8 per-head scales (FlashInfer's fa3 scale_q/k/v tensors), float32, NULL: none.
     * Row logits of qo head h with kv head kh are multiplied by q_head_scale[h] *
     * k_head_scale[kh] (on top of sm_scale), the output by v_head_scale[kh]; a step of 0
     * reads element 0 for every head (one scale given). */
    const float *q_head_scale, *k_head_scale, *v_head_scale;
    int64_t q_head_scale_step, k_head_scale_step, v_head_scale_step;
    /* Output row of query row i of request b: o_indptr[b] + i (NULL: qo_indptr[b] + i);
     * lse rows follow q. */
    const int32_t *o_indptr;
    /* Split-KV: 0 the kernel chooses, -1 never split, > 0 keys per split. A fixed split
     * (> 0 or -1) makes a request's result independent of the batch it is in (FlashInfer's
     * fixed_split_size); the CPU kernel's own choice depends on the batch's size. */
    int64_t kv_chunk;

    /* CUDA only (the CPU kernel ignores them); index arrays and mask are then device
     * pointers, and these bounds come from their host copies, checked by the glue. */
    int device;            /* CUDA device holding every tensor */
    int64_t total_qo_rows; /* rows of q (and of lse) */
    int64_t max_qo_len;    /* longest request's query rows */
    int64_t max_kv_len;    /* longest request's keys */
} fi_attention_params;

/* Computes o (and lse) for every query row with fp32 accumulation and an online
 * softmax; a row that sees no key gets zeros and lse = -inf. Work is split over
 * (request, kv head, query tile) on num_threads threads. Arguments must already be
 * checked (the glue does it). Returns 0, or -1 when scratch memory ran out. */
int fi_attention_cpu(const fi_attention_params *p, int num_threads);

/* The same computation on CUDA, launched on stream (a cudaStream_t; NULL is the legacy
 * default stream) on p->device. Long KV with few query rows is split over several blocks
 * whose partial (o, lse) pairs a second kernel merges (scratch from cudaMallocAsync on
 * the stream). Returns 0, or nonzero with fi_cuda_last_error() saying why. */
int fi_attention_cuda(const fi_attention_params *p, void *stream);

/* ---- Tensor statistics ------------------------------------------------------------
 * Level-5 statistics: min, max, mean, NaN and Inf counts. The CPU kernel handles every
 * dtype with statistics and any strides; the CUDA kernels (FI_WITH_CUDA) the float ones. */

typedef enum {
    FI_STATS_NONE = 0,        /* empty tensor or a dtype without statistics */
    FI_STATS_FLOAT,           /* every floating dtype, float8 kinds included */
    FI_STATS_INT,             /* integers and bool (bool as 0/1) */
    FI_STATS_SKIPPED_CAPTURE, /* CUDA tensor while its stream captures a graph */
    FI_STATS_DEFERRED,        /* captured: a kernel prints them on each replay (id) */
} fi_stats_kind;

typedef struct {
    fi_stats_kind kind;
    double min, max, mean;        /* float kinds (ints too, rounded); NaN when all are NaN */
    int64_t nan_count, inf_count; /* float kinds */
    /* integer/bool kinds: exact extremes; uint64 tensors use umin/umax (is_unsigned64 set) */
    int64_t imin, imax;
    uint64_t umin, umax;
    int is_unsigned64;
    int64_t numel;
    long long deferred_id; /* FI_STATS_DEFERRED: the id the device printf line carries */
    fi_dtype dtype;        /* the tensor's dtype (fi_stats_of_tensor; FI_STATS_DEFERRED) */
} fi_stats;

/* Whether dtype has statistics: all but complex, packed fp4 and unknown dtypes. */
static inline int fi_dtype_has_stats(fi_dtype d)
{
    return d != FI_DTYPE_UNKNOWN && d != FI_DTYPE_FP4X2 && d != FI_DTYPE_C32 && d != FI_DTYPE_C64 &&
           d != FI_DTYPE_C128 && d != FI_DTYPE_COUNT;
}

/* One pass over CPU memory described by t (any strides, 0 and negative included), float
 * sums in float64; needs neither the GIL nor Python. Dtypes without statistics and empty
 * tensors give kind FI_STATS_NONE. Returns -1 (out->kind NONE) when t's shape or strides
 * are invalid. */
int fi_stats_cpu(const fi_tensor *t, fi_stats *out);

/* fi_stats_cpu of dense memory fed in blocks, so a writer can take the statistics, the
 * CRC and the write of each cache-sized block while it is hot; the result is
 * bit-identical to fi_stats_cpu of the whole. Streams exist for float32, float16 and
 * bfloat16 tensors of 16 elements or more (fi_stats_stream_new gives NULL otherwise, or
 * when out of memory). Every block but the last holds a multiple of 8 elements, and the
 * last one's memory stays valid until fi_stats_stream_end, which frees the stream. */
typedef struct fi_stats_stream fi_stats_stream;
fi_stats_stream *fi_stats_stream_new(fi_dtype dtype, int64_t numel);
void fi_stats_stream_feed(fi_stats_stream *s, const void *p, size_t nbytes);
void fi_stats_stream_end(fi_stats_stream *s, fi_stats *out);

/* Streams fed in parallel (docs/benchmarks.md#serving-loop-page-aware-capture): a fork is
 * a new empty stream of s's dtype and size, fed a later part of the elements; join adds
 * b's elements after a's, with the bits of one stream fed both in order, and frees b:
 * 0, or -1 when that cannot be shown (a unchanged: feed it b's elements in order). Only
 * streams whose every addition is known exact can join: 16-bit floats on the AVX2
 * exact-sum path, or built of partials (fi_stats_part_new) on any path. */
fi_stats_stream *fi_stats_stream_fork(const fi_stats_stream *s);
int fi_stats_stream_join(fi_stats_stream *a, fi_stats_stream *b);
/* Whether every addition into s's lanes so far is known exact (16-bit floats, no tail):
 * what joining a stream or adding a partial to s needs. */
int fi_stats_stream_exact(const fi_stats_stream *s);

/* A chunk's statistics partial (docs/dump-format.md#chunk-statistics): a fresh stream of
 * dtype fed p[0..nbytes), kept with the chunk after p's memory is gone, so that a later
 * capture meeting the same bytes at a lane boundary adds the partial instead of reading
 * them again. Its additions are shown exact by the AVX2 exact path or, on any path, from
 * the elements' exponents; a partial not shown exact is kept too, so that the chunk is
 * not tried again, but is never added. NULL for other dtypes, nbytes not a multiple of 8
 * elements, or out of memory. Free with fi_stats_stream_free. */
fi_stats_stream *fi_stats_part_new(fi_dtype dtype, const void *p, size_t nbytes);
/* Adds part's elements after a's, with the bits of a fed them in order (as
 * fi_stats_stream_join, part kept): 0, or -1 with a unchanged (another dtype, part not
 * exact, or the sum not shown exact: feed the bytes to a instead). */
int fi_stats_stream_add(fi_stats_stream *a, const fi_stats_stream *part);
void fi_stats_stream_free(fi_stats_stream *s);

/* The statistics of n pieces of nbytes each (a multiple of the element size; float32,
 * float16 or bfloat16), as one stream fed them in order would give, bit for bit: pieces
 * of a few MB and more are split over up to num_threads threads, and their sums joined
 * where every addition is provably exact (else fed again in order). -1 when out of memory
 * or the arguments are not streamable. */
int fi_stats_pieces(fi_dtype dtype, const char *const *piece, int64_t n, size_t nbytes,
                    int num_threads, fi_stats *out);

/* out (kind FI_STATS_FLOAT) from the reductions of a float tensor of numel elements: min,
 * max and sum over its non-NaN values and its NaN and Inf counts; min, max and mean are
 * NaN when every value is NaN. */
void fi_stats_from_sums(fi_stats *out, int64_t numel, double min, double max, double sum,
                        int64_t nan_count, int64_t inf_count);

/* Statistics of a strided CUDA tensor (dtypes F32, F16, BF16, F64, E4M3FN, E5M2):
 * out = {min, max, sum, nan_count, inf_count}, min/max over non-NaN values (+inf/-inf
 * when every value is NaN), sum over non-NaN values in float64. One device-to-host copy
 * and a wait on stream. */
int fi_stats_cuda(const fi_tensor *t, void *stream, double out[5]);

/* Whether fi_stats_cuda handles dtype. */
int fi_stats_cuda_supports(fi_dtype dtype);

/* Capture-safe variant: enqueues a kernel that prints, with device printf each time it
 * runs (each graph replay), FlashInfer's line "[flashinfer stats] id=N numel=... min=...
 * max=... mean=... nan=... inf=..." (mean over the finite values), or "... (empty
 * tensor)" / "... (all non-finite) nan=... inf=..."; no allocation, no host wait. */
int fi_stats_cuda_deferred(const fi_tensor *t, void *stream, long long id);

/* ---- Chunk hashes ------------------------------------------------------------------
 * The flight recorder stores large tensors once by content, in chunks of at most
 * FI_CHUNK_MAX bytes (docs/dump-format.md, "Chunk store"). A chunk's hash is a keyed
 * NH hash iterated four times with Toeplitz-shifted keys: 256 bits, and for two distinct
 * chunks of the same length a collision probability of at most 2^-128 over the random
 * key. key holds FI_CHUNK_KEY_WORDS random words (one key per process, never written
 * anywhere). Every path gives the same bits. */

#define FI_CHUNK_MAX ((size_t)64 << 10)
#define FI_CHUNK_KEY_WORDS (FI_CHUNK_MAX / 4 + 12)

typedef struct {
    uint64_t h[4];
} fi_chunk_hash;

/* The hash of data[0..len) (len <= FI_CHUNK_MAX), on the widest SIMD path fi_cpu_isa
 * allows; needs neither the GIL nor Python. */
void fi_chunk_hash_cpu(const void *data, size_t len, const uint32_t *key, fi_chunk_hash *out);

/* The compact capture's device path (FI_WITH_CUDA; docs/flight-recorder.md, "Chunk dedup
 * on the device"). Chunk i of the device memory at base is base[offsets[i] .. offsets[i] +
 * lengths[i]) (lengths at most FI_CHUNK_MAX); offsets, lengths, key and out are host
 * memory. fi_chunk_hash_device computes the n hashes into out on the stream side, after
 * the work enqueued on producer so far, and waits for side only. fi_chunk_copy_device
 * copies the n chunks one after another into dst on side, through pinned memory, and
 * waits for side. Return 0, or nonzero with fi_cuda_last_error() saying why. */
int fi_chunk_hash_device(const void *base, const int64_t *offsets, const int64_t *lengths,
                         int64_t n, const uint32_t *key, fi_chunk_hash *out, int device,
                         void *producer, void *side);
int fi_chunk_copy_device(void *dst, const void *base, const int64_t *offsets,
                         const int64_t *lengths, int64_t n, int device, void *side);

/* ---- build ----------------------------------------------------------------------- */

/* The SIMD paths the CPU kernels were compiled with ("portable avx2 avx512" on x86-64)
 * and the one this process takes: the CPU's, capped by FLASHINFER_CPU_ISA. */
const char *fi_cpu_isa_paths(void);
const char *fi_cpu_isa_name(void);

/* ---- CUDA helpers ----------------------------------------------------------------
 * Built only with the CUDA kernels (FI_WITH_CUDA). Functions return 0, or nonzero with
 * the reason in fi_cuda_last_error() (per host thread). */

const char *fi_cuda_last_error(void);

/* *capturing = whether stream (on device) is capturing a CUDA graph. */
int fi_cuda_stream_capturing(int device, void *stream, int *capturing);

/* Copies bytes from device memory to host memory in stream order and waits for it. */
int fi_cuda_copy_to_host(void *dst, const void *src, size_t bytes, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif
