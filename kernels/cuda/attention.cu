/* attention.cu: CUDA attention for decode and prefill over ragged or paged KV, the same
 * semantics as kernels/cpu/attention.c (fp8 and NVFP4 KV, sinks); fp32 online softmax,
 * split-KV with a merge pass. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "fi_numeric.h"
#include "flashinfer_kernels.h"

#define NWARPS 4           /* query vectors per block, one per warp */
#define KT 32              /* keys per shared-memory tile: one per lane when scoring */
#define MIN_SPLIT_KEYS 256 /* a split gets at least this many keys */
#define MAX_SPLITS 128
#define MAX_FIXED_SPLITS 65535 /* gridDim.y */
#define LOG2E 1.4426950408889634f
#define FULL_MASK 0xffffffffu

/* How the grid covers the work: blockIdx.x = (request, kv head, vector tile),
 * blockIdx.y = split of the KV range. */
struct split_plan {
    int64_t tiles; /* vector tiles of NWARPS (query row x group head) per request */
    int64_t chunk; /* keys per split, a multiple of KT */
    int splits;
    bool vec_k, vec_v; /* K / V rows load as 16-byte vectors (f16/bf16, aligned, K unroped) */
    float *part_o;     /* splits > 1: [splits][total_qo_rows][num_qo_heads][head_dim] */
    float *part_lse;   /* [splits][total_qo_rows][num_qo_heads] */
};

/* fi_dtype_size for device code (the header's is host-only). */
__device__ __forceinline__ int64_t elem_size(fi_dtype dtype)
{
    return dtype == FI_DTYPE_F32 ? 4 : dtype == FI_DTYPE_F16 || dtype == FI_DTYPE_BF16 ? 2 : 1;
}

__device__ __forceinline__ float load_value(const void *base, int64_t i, fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        return __half2float(((const __half *)base)[i]);
    case FI_DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case FI_DTYPE_F32:
        return ((const float *)base)[i];
    case FI_DTYPE_E4M3FN:
        return __half2float(
            __half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)base)[i], __NV_E4M3)));
    case FI_DTYPE_E5M2:
        return __half2float(
            __half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)base)[i], __NV_E5M2)));
    default:
        return 0.0f;
    }
}

/* fi_e2m1_to_f32 without its table (a table would live in local memory). */
__device__ __forceinline__ float e2m1_value(uint32_t code)
{
    uint32_t c = code & 7;
    float v = c < 4 ? 0.5f * (float)c : (c == 7 ? 6.0f : (float)(c - 2));
    return (code & 8) ? -v : v;
}

/* Element i of one K/V row: as load_value, or for NVFP4 KV its E2M1 code (byte i / 2,
 * element 2j in the low nibble) times the row's E4M3 block scale sf[i / 16]. */
__device__ __forceinline__ float load_kv(const char *row, const uint8_t *sf, int64_t i,
                                         fi_dtype dtype)
{
    if (dtype != FI_DTYPE_FP4X2)
        return load_value(row, i, dtype);
    uint8_t byte = ((const uint8_t *)row)[i / 2];
    float scale = load_value(sf, i / 16, FI_DTYPE_E4M3FN);
    return e2m1_value(i & 1 ? byte >> 4 : byte & 15) * scale;
}

/* Eight f16 or bf16 values of one 16-byte load, widened into dst[0..7]. */
__device__ __forceinline__ void widen8(const uint4 &w, fi_dtype dtype, float *dst)
{
    const unsigned short *h = (const unsigned short *)&w;
#pragma unroll
    for (int k = 0; k < 8; k++)
        dst[k] = dtype == FI_DTYPE_F16 ? __half2float(__ushort_as_half(h[k]))
                                       : __bfloat162float(__ushort_as_bfloat16(h[k]));
}

/* Rows j < nb of a K or V tile into tile[j][0..D): with vec, one 16-byte load per eight
 * elements (the offsets are then multiples of 8 elements from a 16-byte aligned base),
 * else element by element. The loads of a row are spread over the whole block. */
template <int D>
__device__ __forceinline__ void load_rows(float (*tile)[D + 1], const void *base, const uint8_t *sf,
                                          const int64_t *off, const int64_t *sfoff, int nb,
                                          fi_dtype dtype, bool vec)
{
    if (vec) {
        constexpr int VPR = D / 8; /* vectors per row */
        for (int e = threadIdx.x; e < nb * VPR; e += blockDim.x) {
            int j = e / VPR, c = e % VPR;
            uint4 w = __ldg((const uint4 *)((const char *)base + off[j] * 2) + c);
            widen8(w, dtype, &tile[j][c * 8]);
        }
        return;
    }
    const int64_t size = elem_size(dtype);
    for (int e = threadIdx.x; e < nb * D; e += blockDim.x) {
        int j = e / D, i = e % D;
        tile[j][i] = load_kv((const char *)base + off[j] * size, sf + sfoff[j], i, dtype);
    }
}

/* The sink joins the softmax state (running max m, sum l; natural units) as one more logit;
 * *corr rescales what was accumulated, as add_sink in kernels/cpu/attention.c. */
__device__ __forceinline__ void add_sink(float sink, float *m, float *l, float *corr)
{
    float m_new = fmaxf(sink, *m);
    if (m_new == -INFINITY)
        return;
    *corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
    *l = *l * *corr + expf(sink - m_new);
    *m = m_new;
}

/* The request owning query row n (qo_indptr is non-decreasing; n is inside the batch). */
__device__ __forceinline__ int64_t request_of_row(const fi_attention_params &p, int64_t n)
{
    int64_t lo = 0, hi = p.num_requests - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (p.qo_indptr[mid] <= n)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Output row of query row n of request b. */
__device__ __forceinline__ int64_t output_row(const fi_attention_params &p, int64_t b, int64_t n)
{
    return p.o_indptr ? n - p.qo_indptr[b] + p.o_indptr[b] : n;
}

__device__ __forceinline__ void store_value(void *base, int64_t i, fi_dtype dtype, float x)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        ((__half *)base)[i] = __float2half_rn(x);
        break;
    case FI_DTYPE_BF16:
        ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x);
        break;
    default:
        ((float *)base)[i] = x;
        break;
    }
}

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o /= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

__device__ __forceinline__ int64_t kv_len_of(const fi_attention_params &p, int64_t b)
{
    int64_t n = (int64_t)p.kv_indptr[b + 1] - p.kv_indptr[b];
    if (!p.paged)
        return n;
    return n == 0 ? 0 : (n - 1) * p.page_size + p.kv_last_page_len[b];
}

/* The visible key range [lo, hi] of query row `row`, as in the CPU kernel. */
__device__ __forceinline__ void visible_range(const fi_attention_params &p, int64_t row,
                                              int64_t qo_len, int64_t kv_len, int64_t *lo,
                                              int64_t *hi)
{
    int64_t pos = row + kv_len - qo_len;
    *hi = p.causal ? (pos < kv_len - 1 ? pos : kv_len - 1) : kv_len - 1;
    *lo = p.window_left >= 0 && pos - p.window_left > 0 ? pos - p.window_left : 0;
}

/* Rotate-half RoPE of the pair (x0 = x[i], x1 = x[i + D/2]) at position pos. */
__device__ __forceinline__ void rope_pair(float *x0, float *x1, float freq, int64_t pos)
{
    float angle = (float)pos * freq;
    float c = cosf(angle), s = sinf(angle);
    float a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = b * c + a * s;
}

/* One block: NWARPS query vectors (row, head of the group) of one request and kv head,
 * over the keys of one split. Each tile of KT keys is loaded once into shared memory
 * (K, then V into the same buffer) and used by every warp; lane j scores key j. */
template <int D>
__global__ void __launch_bounds__(NWARPS * 32)
    attention_kernel(const fi_attention_params p, const split_plan sp)
{
    __shared__ float tile[KT][D + 1]; /* +1: lane j reading row j hits bank (j + i) % 32 */
    __shared__ float qs[NWARPS][D];
    __shared__ float freq[D / 2];
    __shared__ int64_t koff[KT], voff[KT], ksf[KT], vsf[KT];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t x = blockIdx.x;
    const int64_t t = x % sp.tiles;
    x /= sp.tiles;
    const int64_t kvh = x % p.num_kv_heads;
    const int64_t b = x / p.num_kv_heads;
    const int split = blockIdx.y;
    const int64_t g = p.num_qo_heads / p.num_kv_heads;
    const int64_t qo_start = p.qo_indptr[b];
    const int64_t qo_len = (int64_t)p.qo_indptr[b + 1] - qo_start;
    const int64_t kv_len = kv_len_of(p, b);
    const int64_t nvec = qo_len * g, v0 = t * NWARPS;
    if (v0 >= nvec)
        return; /* the whole block: no barrier is skipped by only some threads */
    const int64_t vec = v0 + warp;
    const bool active = vec < nvec;
    const int64_t row = (active ? vec : nvec - 1) / g;
    const int64_t head = kvh * g + (active ? vec % g : 0);
    const int64_t n = qo_start + row;
    const bool rope = p.pos_encoding == FI_POS_ENCODING_ROPE_LLAMA;
    const int half = D / 2;

    /* FlashInfer: freq_i = (1 / rope_scale) * (1 / rope_theta)^(2i / D). */
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        freq[i] = (1.0f / p.rope_scale) * powf(1.0f / p.rope_theta, (float)(2 * i) / (float)D);
    __syncthreads();

    const char *qa =
        (const char *)p.q + (n * p.q_stride_n + head * p.q_stride_h) * elem_size(p.q_dtype);
    float q_scale = p.sm_scale; /* with the per-head FP8 scales of q and k */
    if (p.q_head_scale)
        q_scale *= p.q_head_scale[p.q_head_scale_step * head];
    if (p.k_head_scale)
        q_scale *= p.k_head_scale[p.k_head_scale_step * kvh];
    for (int i = lane; i < half; i += 32) {
        float x0 = load_value(qa, i, p.q_dtype), x1 = load_value(qa, i + half, p.q_dtype);
        if (rope)
            rope_pair(&x0, &x1, freq[i], row + kv_len - qo_len);
        qs[warp][i] = x0 * q_scale;
        qs[warp][i + half] = x1 * q_scale;
    }
    const float alibi =
        p.pos_encoding == FI_POS_ENCODING_ALIBI ? fi_alibi_slope(head, p.num_qo_heads) : 0.0f;

    /* Keys any vector of the block may see, within this split. */
    const int64_t vlast = (v0 + NWARPS < nvec ? v0 + NWARPS : nvec) - 1;
    int64_t lo_first, hi_first, lo_last, hi_last, lo, hi;
    visible_range(p, v0 / g, qo_len, kv_len, &lo_first, &hi_first);
    visible_range(p, vlast / g, qo_len, kv_len, &lo_last, &hi_last);
    visible_range(p, row, qo_len, kv_len, &lo, &hi);
    int64_t begin = (int64_t)split * sp.chunk, end = begin + sp.chunk;
    if (begin < lo_first)
        begin = lo_first;
    if (end > hi_last + 1)
        end = hi_last + 1;

    const uint8_t *mask = p.mask ? p.mask + p.mask_indptr[b] : nullptr;
    const int64_t kv_size = elem_size(p.kv_dtype);
    const float cap = p.logits_soft_cap;
    float m = -INFINITY, l = 0.0f;
    float acc[D / 32];
#pragma unroll
    for (int c = 0; c < D / 32; c++)
        acc[c] = 0.0f;

    for (int64_t j0 = begin; j0 < end; j0 += KT) {
        const int nb = end - j0 < KT ? (int)(end - j0) : KT;
        if (threadIdx.x < nb) {
            int64_t j = j0 + threadIdx.x, page = 0, slot, vslot;
            if (p.paged) {
                page = p.kv_indices[p.kv_indptr[b] + j / p.page_size];
                slot = vslot = j % p.page_size;
            } else {
                slot = (int64_t)p.kv_indptr[b] + j;
                vslot = (int64_t)(p.v_indptr ? p.v_indptr : p.kv_indptr)[b] + j;
            }
            koff[threadIdx.x] = page * p.k_stride_page + slot * p.k_stride_n + kvh * p.k_stride_h;
            voff[threadIdx.x] = page * p.v_stride_page + vslot * p.v_stride_n + kvh * p.v_stride_h;
            ksf[threadIdx.x] =
                page * p.k_sf_stride_page + slot * p.k_sf_stride_n + kvh * p.k_sf_stride_h;
            vsf[threadIdx.x] =
                page * p.v_sf_stride_page + vslot * p.v_sf_stride_n + kvh * p.v_sf_stride_h;
        }
        __syncthreads();
        if (rope) {
            for (int e = threadIdx.x; e < nb * half; e += blockDim.x) {
                int j = e / half, i = e % half;
                const char *ka = (const char *)p.k + koff[j] * kv_size;
                const uint8_t *ks = p.k_sf + ksf[j];
                float x0 = load_kv(ka, ks, i, p.kv_dtype);
                float x1 = load_kv(ka, ks, i + half, p.kv_dtype);
                rope_pair(&x0, &x1, freq[i], j0 + j);
                tile[j][i] = x0;
                tile[j][i + half] = x1;
            }
        } else {
            load_rows<D>(tile, p.k, p.k_sf, koff, ksf, nb, p.kv_dtype, sp.vec_k);
        }
        __syncthreads();

        float s = -INFINITY;
        if (active && lane < nb) {
            int64_t key = j0 + lane;
            bool visible = key >= lo && key <= hi;
            if (visible && mask) {
                int64_t bit = row * kv_len + key;
                visible = (mask[bit >> 3] >> (bit & 7)) & 1;
            }
            if (visible) {
                float dot = 0.0f;
#pragma unroll 8
                for (int i = 0; i < D; i++)
                    dot += qs[warp][i] * tile[lane][i];
                dot += alibi * (float)(key - (row + kv_len - qo_len));
                s = cap > 0.0f ? cap * tanhf(dot / cap) : dot;
            }
        }
        /* Uniform across the warp: tile_max is the same in every lane. fmaxf skips NaN, so
         * a NaN score is voted on apart: the tile then counts even when nothing else is
         * seen, and its exp (NaN - m, or -inf - -inf) makes l and acc NaN, as torch's
         * softmax does (docs/kernels.md). */
        const float tile_max = warp_max(s);
        const bool seen = tile_max != -INFINITY || __any_sync(FULL_MASK, s != s);
        float pj = 0.0f, corr = 1.0f;
        if (seen) {
            float m_new = fmaxf(m, tile_max);
            corr = expf(m - m_new); /* 0 while m is still -inf: acc and l are 0 then */
            pj = s == -INFINITY ? 0.0f : expf(s - m_new);
            l = l * corr + warp_sum(pj);
            m = m_new;
        }
        __syncthreads(); /* every warp is done with K before V overwrites it */
        load_rows<D>(tile, p.v, p.v_sf, voff, vsf, nb, p.kv_dtype, sp.vec_v);
        __syncthreads();
        if (seen) {
#pragma unroll
            for (int c = 0; c < D / 32; c++)
                acc[c] *= corr;
            for (int j = 0; j < nb; j++) {
                float w = __shfl_sync(FULL_MASK, pj, j);
#pragma unroll
                for (int c = 0; c < D / 32; c++)
                    acc[c] += w * tile[j][lane + 32 * c];
            }
        }
        __syncthreads(); /* V and the offsets are read before the next tile replaces them */
    }

    if (!active)
        return;
    if (sp.splits == 1) {
        float corr = 1.0f;
        if (p.sinks)
            add_sink(p.sinks[head], &m, &l, &corr);
        /* l is 0 (saw nothing), > 0 or NaN */
        float lse = l != 0.0f ? m * LOG2E + log2f(l) : -INFINITY;
        float v_scale = p.v_scale;
        if (p.v_head_scale)
            v_scale *= p.v_head_scale[p.v_head_scale_step * kvh];
        float inv = l != 0.0f ? v_scale * corr / l : 0.0f;
        int64_t no = output_row(p, b, n);
        char *oa = (char *)p.o + (no * p.o_stride_n + head * p.o_stride_h) * elem_size(p.o_dtype);
#pragma unroll
        for (int c = 0; c < D / 32; c++)
            store_value(oa, lane + 32 * c, p.o_dtype, acc[c] * inv);
        if (p.lse && lane == 0)
            p.lse[n * p.lse_stride_n + head * p.lse_stride_h] = lse;
        return;
    }
    float lse = l != 0.0f ? m * LOG2E + log2f(l) : -INFINITY;
    float inv = l != 0.0f ? 1.0f / l : 0.0f;
    int64_t slot = ((int64_t)split * p.total_qo_rows + n) * p.num_qo_heads + head;
    float *po = sp.part_o + slot * D;
#pragma unroll
    for (int c = 0; c < D / 32; c++)
        po[lane + 32 * c] = acc[c] * inv;
    if (lane == 0)
        sp.part_lse[slot] = lse;
}

/* One warp per (row, head): the splits' normalised partial outputs weighted by
 * 2^(lse_s - max lse), a sink counting in the denominator only; rows outside every
 * request are left untouched. */
__global__ void __launch_bounds__(NWARPS * 32)
    merge_kernel(const fi_attention_params p, const split_plan sp)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t idx = (int64_t)blockIdx.x * NWARPS + warp;
    if (idx >= p.total_qo_rows * p.num_qo_heads)
        return;
    int64_t n = idx / p.num_qo_heads, head = idx % p.num_qo_heads;
    if (n < p.qo_indptr[0] || n >= p.qo_indptr[p.num_requests])
        return;
    const int64_t stride = p.total_qo_rows * p.num_qo_heads;
    const float sink = p.sinks ? p.sinks[head] * LOG2E : -INFINITY;
    float mx = sink;
    bool nan = false; /* fmaxf skips it: a NaN split makes the row NaN */
    for (int s = 0; s < sp.splits; s++) {
        float lse = sp.part_lse[s * stride + idx];
        mx = fmaxf(mx, lse);
        nan |= lse != lse;
    }
    if (nan)
        mx = NAN;
    float wsum = 0.0f;
    if (mx != -INFINITY) {
        wsum = exp2f(sink - mx);
        for (int s = 0; s < sp.splits; s++)
            wsum += exp2f(sp.part_lse[s * stride + idx] - mx);
    }
    float v_scale = p.v_scale;
    if (p.v_head_scale)
        v_scale *= p.v_head_scale[p.v_head_scale_step * (head / (p.num_qo_heads / p.num_kv_heads))];
    float scale = wsum != 0.0f ? v_scale / wsum : 0.0f;
    int64_t no = output_row(p, request_of_row(p, n), n);
    char *oa = (char *)p.o + (no * p.o_stride_n + head * p.o_stride_h) * elem_size(p.o_dtype);
    for (int64_t i = lane; i < p.head_dim; i += 32) {
        float a = 0.0f;
        if (mx != -INFINITY)
            for (int s = 0; s < sp.splits; s++) {
                float w = exp2f(sp.part_lse[s * stride + idx] - mx);
                a += w * sp.part_o[(s * stride + idx) * p.head_dim + i];
            }
        store_value(oa, i, p.o_dtype, a * scale);
    }
    if (p.lse && lane == 0)
        p.lse[n * p.lse_stride_n + head * p.lse_stride_h] =
            mx == -INFINITY ? -INFINITY : mx + log2f(wsum);
}

/* Splits for `blocks` blocks when `resident` blocks fit on the device at once: none when
 * the batch fills it, else the count (at most smax) whose blocks fill whole waves best.
 * A block streams its keys one tile at a time, so a multiprocessor needs many blocks in
 * flight; and a last partial wave (1536 blocks where 1452 fit) runs at a fraction of the
 * memory bandwidth. The smallest count filling 90 % of its waves wins. */
static int64_t auto_splits(int64_t blocks, int64_t resident, int64_t smax)
{
    if (blocks >= resident || smax <= 1)
        return 1;
    int64_t best = 1;
    double best_fill = 0.0;
    for (int64_t s = 1; s <= smax; s++) {
        int64_t total = blocks * s, waves = (total + resident - 1) / resident;
        double fill = (double)total / (double)(waves * resident);
        if (fill > best_fill + 1e-9) {
            best = s;
            best_fill = fill;
        }
        if (fill >= 0.9)
            break;
    }
    return best;
}

/* Keys per split of a batch of `blocks` blocks and longest KV kv: p->kv_chunk when the
 * caller fixed it (-1: one split), else auto_splits with each split keeping at least
 * MIN_SPLIT_KEYS keys. A multiple of KT; at most MAX_FIXED_SPLITS splits. */
static int64_t split_chunk(const fi_attention_params *p, int64_t blocks, int64_t resident,
                           int64_t kv)
{
    int64_t chunk;
    if (p->kv_chunk < 0) {
        chunk = kv;
    } else if (p->kv_chunk > 0) {
        chunk = p->kv_chunk;
        if ((kv + chunk - 1) / chunk > MAX_FIXED_SPLITS)
            chunk = (kv + MAX_FIXED_SPLITS - 1) / MAX_FIXED_SPLITS;
    } else {
        int64_t by_len = (p->max_kv_len + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS;
        int64_t splits = auto_splits(blocks, resident, by_len < MAX_SPLITS ? by_len : MAX_SPLITS);
        chunk = (kv + splits - 1) / splits;
    }
    return (chunk + KT - 1) / KT * KT;
}

/* Blocks of attention_kernel<head_dim> resident at once on the device (>= 1). */
static int64_t resident_blocks(int head_dim, int sms)
{
    int per_sm = 0;
    cudaError_t err = cudaErrorInvalidValue;
    if (head_dim == 64)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel<64>,
                                                            NWARPS * 32, 0);
    else if (head_dim == 128)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel<128>,
                                                            NWARPS * 32, 0);
    else if (head_dim == 256)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel<256>,
                                                            NWARPS * 32, 0);
    if (err != cudaSuccess || per_sm < 1)
        per_sm = 2;
    return (int64_t)sms * per_sm;
}

static cudaError_t launch_main(const fi_attention_params *p, const split_plan &sp, unsigned blocks,
                               cudaStream_t st)
{
    dim3 grid(blocks, (unsigned)sp.splits);
    switch (p->head_dim) {
    case 64:
        attention_kernel<64><<<grid, NWARPS * 32, 0, st>>>(*p, sp);
        break;
    case 128:
        attention_kernel<128><<<grid, NWARPS * 32, 0, st>>>(*p, sp);
        break;
    case 256:
        attention_kernel<256><<<grid, NWARPS * 32, 0, st>>>(*p, sp);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* f16/bf16 rows whose every start is 16-byte aligned: the base is, and each stride is a
 * multiple of 8 elements. */
static bool rows_load_as_vectors(const fi_attention_params *p, const void *base, int64_t s_page,
                                 int64_t s_n, int64_t s_h)
{
    if (p->kv_dtype != FI_DTYPE_F16 && p->kv_dtype != FI_DTYPE_BF16)
        return false;
    return ((uintptr_t)base & 15) == 0 && s_page % 8 == 0 && s_n % 8 == 0 && s_h % 8 == 0;
}

extern "C" int fi_attention_cuda(const fi_attention_params *p, void *stream)
{
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return fi_cuda_fail("attention (cuda): head_dim must be 64, 128 or 256", cudaSuccess);
    if (p->num_requests <= 0 || p->max_qo_len <= 0 || p->num_kv_heads <= 0)
        return 0;
    fi_device_guard guard(p->device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("attention (cuda): cudaSetDevice", guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    int sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p->device);
    if (err != cudaSuccess)
        return fi_cuda_fail("attention (cuda): cudaDeviceGetAttribute", err);

    int64_t g = p->num_qo_heads / p->num_kv_heads;
    split_plan sp = {};
    sp.tiles = (p->max_qo_len * g + NWARPS - 1) / NWARPS;
    int64_t blocks = sp.tiles * p->num_kv_heads * p->num_requests;
    if (blocks > INT32_MAX)
        return fi_cuda_fail("attention (cuda): the batch needs more than 2^31 blocks", cudaSuccess);
    int64_t kv = p->max_kv_len > 0 ? p->max_kv_len : 1;
    sp.chunk = split_chunk(p, blocks, resident_blocks((int)p->head_dim, sms), kv);
    sp.splits = (int)((kv + sp.chunk - 1) / sp.chunk);
    if (sp.splits < 1)
        sp.splits = 1;
    sp.vec_k = rows_load_as_vectors(p, p->k, p->k_stride_page, p->k_stride_n, p->k_stride_h) &&
               p->pos_encoding != FI_POS_ENCODING_ROPE_LLAMA;
    sp.vec_v = rows_load_as_vectors(p, p->v, p->v_stride_page, p->v_stride_n, p->v_stride_h);

    if (sp.splits == 1) {
        err = launch_main(p, sp, (unsigned)blocks, st);
        return err == cudaSuccess ? 0 : fi_cuda_fail("attention (cuda): kernel launch", err);
    }
    if ((p->total_qo_rows * p->num_qo_heads + NWARPS - 1) / NWARPS > INT32_MAX)
        return fi_cuda_fail("attention (cuda): too many query rows to merge", cudaSuccess);
    size_t vecs = (size_t)p->total_qo_rows * (size_t)p->num_qo_heads * (size_t)sp.splits;
    size_t bytes = vecs * ((size_t)p->head_dim + 1) * sizeof(float);
    void *scratch = nullptr;
    err = cudaMallocAsync(&scratch, bytes, st);
    if (err != cudaSuccess)
        return fi_cuda_fail("attention (cuda): cudaMallocAsync of the split-KV scratch", err);
    sp.part_o = (float *)scratch;
    sp.part_lse = sp.part_o + vecs * (size_t)p->head_dim;
    err = launch_main(p, sp, (unsigned)blocks, st);
    if (err == cudaSuccess) {
        int64_t pairs = p->total_qo_rows * p->num_qo_heads;
        unsigned merge_blocks = (unsigned)((pairs + NWARPS - 1) / NWARPS);
        merge_kernel<<<merge_blocks, NWARPS * 32, 0, st>>>(*p, sp);
        err = cudaGetLastError();
    }
    cudaError_t free_err = cudaFreeAsync(scratch, st);
    if (err != cudaSuccess)
        return fi_cuda_fail("attention (cuda): kernel launch", err);
    if (free_err != cudaSuccess)
        return fi_cuda_fail("attention (cuda): cudaFreeAsync", free_err);
    return 0;
}
