/* attention.c: CPU attention for decode and prefill over ragged or paged KV: GQA,
 * causal/window/custom masks, soft cap, RoPE, fp8 and NVFP4 KV, attention sinks; fp32
 * online softmax. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fi_numeric.h"
#include "flashinfer_kernels.h"

#define KV_BLOCK 32     /* keys converted to f32 at a time */
#define TILE_VECTORS 64 /* query vectors (rows x heads in a group) per task, at least */
#define LOG2E 1.4426950408889634f

/* On x86-64 Linux the per-task loop is also built for AVX2+FMA and picked at load time;
 * the helpers it calls are inlined into each clone. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define FI_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define FI_INLINE static inline __attribute__((always_inline))
#else
#define FI_VECTOR_CLONES
#define FI_INLINE static inline
#endif

typedef struct {
    int64_t request, kv_head, row0, row1;
} task;

/* Per-thread scratch: converted queries, accumulators, one KV block. */
typedef struct {
    float *qf;    /* [vectors][D] rotated, pre-scaled queries */
    float *acc;   /* [vectors][D] */
    float *m, *l; /* [vectors] running max and sum */
    float *kt;    /* [D][KV_BLOCK] keys, transposed so the dot loop vectorizes */
    float *vf;    /* [KV_BLOCK][D] */
    float *row;   /* [D] one converted row */
    float *freq;  /* [D / 2] RoPE frequencies */
    float fp8_table[256];
} scratch;

typedef struct {
    const fi_attention_params *p;
    const task *tasks;
    int64_t num_tasks, group, max_vectors;
    atomic_llong next;
    atomic_int failed;
} job;

static int64_t kv_len_of(const fi_attention_params *p, int64_t b)
{
    int64_t n = (int64_t)p->kv_indptr[b + 1] - p->kv_indptr[b];
    if (!p->paged)
        return n;
    return n == 0 ? 0 : (n - 1) * p->page_size + p->kv_last_page_len[b];
}

/* Branch-free binary16 -> float32 so the row loop vectorizes: the exponent/mantissa
 * bits shifted into float32 position and scaled by 2^112 are exact for normal and
 * subnormal halves; all-ones exponents become inf/NaN. */
FI_INLINE float half_to_float(uint16_t h)
{
    uint32_t em = (uint32_t)(h & 0x7fff) << 13;
    uint32_t r = fi_f32_bits(fi_bits_f32(em) * 0x1p112f);
    r |= em >= 0x0f800000u ? 0x7f800000u : 0;
    return fi_bits_f32(r | ((uint32_t)(h & 0x8000) << 16));
}

FI_INLINE void load_row(const void *src, fi_dtype dtype, int64_t n, float *dst,
                        const float *fp8_table)
{
    switch (dtype) {
    case FI_DTYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = half_to_float(s[i]);
        break;
    }
    case FI_DTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = fi_bits_f32((uint32_t)s[i] << 16);
        break;
    }
    case FI_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    default: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp8_table[s[i]];
        break;
    }
    }
}

FI_INLINE void store_value(void *dst, fi_dtype dtype, int64_t i, float x)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        ((uint16_t *)dst)[i] = fi_f32_to_f16(x);
        break;
    case FI_DTYPE_BF16:
        ((uint16_t *)dst)[i] = fi_f32_to_bf16(x);
        break;
    default:
        ((float *)dst)[i] = x;
        break;
    }
}

/* FlashInfer's non-interleaved (rotate-half) RoPE at position pos. */
FI_INLINE void apply_rope(float *x, int64_t d, const float *freq, int64_t pos)
{
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float angle = (float)pos * freq[i];
        float c = cosf(angle), s = sinf(angle);
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

/* Where key j of request b lives: (page, slot), ragged rows counted from indptr[b]. */
FI_INLINE void kv_slot(const fi_attention_params *p, const int32_t *indptr, int64_t b, int64_t j,
                       int64_t *page, int64_t *slot)
{
    if (p->paged) {
        *page = p->kv_indices[p->kv_indptr[b] + j / p->page_size];
        *slot = j % p->page_size;
    } else {
        *page = 0;
        *slot = (int64_t)indptr[b] + j;
    }
}

/* One K or V operand as load_kv_block reads it: data, its strides, its NVFP4 scales. */
typedef struct {
    const char *base;
    const int32_t *indptr; /* ragged rows */
    int64_t stride_page, stride_n, stride_h;
    const uint8_t *sf;
    int64_t sf_stride_page, sf_stride_n, sf_stride_h;
} kv_operand;

FI_INLINE kv_operand k_operand(const fi_attention_params *p)
{
    return (kv_operand){.base = p->k,
                        .indptr = p->kv_indptr,
                        .stride_page = p->k_stride_page,
                        .stride_n = p->k_stride_n,
                        .stride_h = p->k_stride_h,
                        .sf = p->k_sf,
                        .sf_stride_page = p->k_sf_stride_page,
                        .sf_stride_n = p->k_sf_stride_n,
                        .sf_stride_h = p->k_sf_stride_h};
}

FI_INLINE kv_operand v_operand(const fi_attention_params *p)
{
    return (kv_operand){.base = p->v,
                        .indptr = p->v_indptr ? p->v_indptr : p->kv_indptr,
                        .stride_page = p->v_stride_page,
                        .stride_n = p->v_stride_n,
                        .stride_h = p->v_stride_h,
                        .sf = p->v_sf,
                        .sf_stride_page = p->v_sf_stride_page,
                        .sf_stride_n = p->v_sf_stride_n,
                        .sf_stride_h = p->v_sf_stride_h};
}

/* Per-block dequantization of one NVFP4 row: 16 E2M1 codes share one E4M3 scale. */
FI_INLINE void load_fp4_row(const uint8_t *src, const uint8_t *sf, int64_t n, float *dst,
                            const float *e4m3_table)
{
    for (int64_t i = 0; i < n; i += 2) {
        float scale = e4m3_table[sf[i / 16]];
        dst[i] = fi_e2m1_to_f32(src[i / 2] & 15) * scale;
        dst[i + 1] = fi_e2m1_to_f32(src[i / 2] >> 4) * scale;
    }
}

/* Row j (head `head`) of operand o for request b, converted to float32 into dst. */
FI_INLINE void load_kv_row(const fi_attention_params *p, const kv_operand *o, int64_t b, int64_t j,
                           int64_t head, float *dst, const float *fp8_table)
{
    int64_t page, slot;
    kv_slot(p, o->indptr, b, j, &page, &slot);
    int64_t offset = page * o->stride_page + slot * o->stride_n + head * o->stride_h;
    const char *at = o->base + offset * (int64_t)fi_dtype_size(p->kv_dtype);
    if (p->kv_dtype != FI_DTYPE_FP4X2) {
        load_row(at, p->kv_dtype, p->head_dim, dst, fp8_table);
        return;
    }
    const uint8_t *sf =
        o->sf + page * o->sf_stride_page + slot * o->sf_stride_n + head * o->sf_stride_h;
    load_fp4_row((const uint8_t *)at, sf, p->head_dim, dst, fp8_table);
}

/* The visible key range [lo, hi] of query row `row` from causality and the window. */
FI_INLINE void visible_range(const fi_attention_params *p, int64_t row, int64_t qo_len,
                             int64_t kv_len, int64_t *lo, int64_t *hi)
{
    int64_t pos = row + kv_len - qo_len;
    *hi = p->causal ? (pos < kv_len - 1 ? pos : kv_len - 1) : kv_len - 1;
    *lo = p->window_left >= 0 && pos - p->window_left > 0 ? pos - p->window_left : 0;
}

FI_INLINE void load_kv_block(const fi_attention_params *p, scratch *sc, int64_t b, int64_t kv_head,
                             int64_t j0, int64_t nb)
{
    int64_t d = p->head_dim;
    kv_operand k = k_operand(p), v = v_operand(p);
    for (int64_t j = 0; j < nb; j++) {
        load_kv_row(p, &k, b, j0 + j, kv_head, sc->row, sc->fp8_table);
        if (p->pos_encoding == FI_POS_ENCODING_ROPE_LLAMA)
            apply_rope(sc->row, d, sc->freq, j0 + j);
        for (int64_t i = 0; i < d; i++)
            sc->kt[i * KV_BLOCK + j] = sc->row[i];
        load_kv_row(p, &v, b, j0 + j, kv_head, sc->vf + j * d, sc->fp8_table);
    }
    for (int64_t j = nb; j < KV_BLOCK; j++)
        for (int64_t i = 0; i < d; i++)
            sc->kt[i * KV_BLOCK + j] = 0.0f;
}

/* One query vector against one loaded KV block: scores, masks, online-softmax update. */
FI_INLINE void attend_block(const fi_attention_params *p, scratch *sc, int64_t vec, int64_t b,
                            int64_t row, int64_t kv_len, int64_t j0, int64_t nb, int64_t lo,
                            int64_t hi)
{
    int64_t d = p->head_dim;
    const float *q = sc->qf + vec * d;
    float s[KV_BLOCK] = {0};
    for (int64_t i = 0; i < d; i++) {
        float qi = q[i];
        const float *kr = sc->kt + i * KV_BLOCK;
        for (int j = 0; j < KV_BLOCK; j++)
            s[j] += qi * kr[j];
    }
    float cap = p->logits_soft_cap;
    const uint8_t *mask = p->mask ? p->mask + p->mask_indptr[b] : NULL;
    float mx = -INFINITY;
    for (int64_t j = 0; j < nb; j++) {
        int64_t key = j0 + j;
        int visible = key >= lo && key <= hi;
        if (visible && mask) {
            int64_t bit = row * kv_len + key;
            visible = (mask[bit >> 3] >> (bit & 7)) & 1;
        }
        if (!visible) {
            s[j] = -INFINITY;
            continue;
        }
        if (cap > 0.0f)
            s[j] = cap * tanhf(s[j] / cap);
        if (s[j] > mx)
            mx = s[j];
    }
    if (mx == -INFINITY)
        return;
    float *acc = sc->acc + vec * d;
    float m_old = sc->m[vec];
    if (mx > m_old) {
        if (m_old != -INFINITY) {
            float corr = expf(m_old - mx);
            sc->l[vec] *= corr;
            for (int64_t i = 0; i < d; i++)
                acc[i] *= corr;
        }
        sc->m[vec] = mx;
    }
    float m = sc->m[vec], sum = 0.0f;
    for (int64_t j = 0; j < nb; j++) {
        if (s[j] == -INFINITY)
            continue;
        float pj = expf(s[j] - m);
        sum += pj;
        const float *vr = sc->vf + j * d;
        for (int64_t i = 0; i < d; i++)
            acc[i] += pj * vr[i];
    }
    sc->l[vec] += sum;
}

/* The per-row finalisation step of attention sinks: the sink joins the softmax state
 * (running max m, sum l) as one more logit; *corr rescales what was accumulated. */
FI_INLINE void add_sink(float sink, float *m, float *l, float *corr)
{
    float m_new = sink > *m ? sink : *m;
    if (m_new == -INFINITY)
        return; /* no key seen and a -inf sink: nothing to add */
    *corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
    *l = *l * *corr + expf(sink - m_new);
    *m = m_new;
}

FI_VECTOR_CLONES static void run_task(const job *jb, scratch *sc, const task *t)
{
    const fi_attention_params *p = jb->p;
    int64_t d = p->head_dim, g = jb->group, b = t->request;
    int64_t qo_start = p->qo_indptr[b];
    int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - qo_start;
    int64_t kv_len = kv_len_of(p, b);
    int64_t rows = t->row1 - t->row0;
    size_t qsize = fi_dtype_size(p->q_dtype);

    for (int64_t r = 0; r < rows; r++) {
        int64_t row = t->row0 + r;
        for (int64_t gi = 0; gi < g; gi++) {
            int64_t vec = r * g + gi, head = t->kv_head * g + gi;
            const char *qa =
                (const char *)p->q +
                ((qo_start + row) * p->q_stride_n + head * p->q_stride_h) * (int64_t)qsize;
            float *qf = sc->qf + vec * d;
            load_row(qa, p->q_dtype, d, qf, NULL);
            if (p->pos_encoding == FI_POS_ENCODING_ROPE_LLAMA)
                apply_rope(qf, d, sc->freq, row + kv_len - qo_len);
            for (int64_t i = 0; i < d; i++)
                qf[i] *= p->sm_scale;
            memset(sc->acc + vec * d, 0, (size_t)d * sizeof(float));
            sc->m[vec] = -INFINITY;
            sc->l[vec] = 0.0f;
        }
    }

    int64_t first_lo, first_hi, last_lo, last_hi;
    visible_range(p, t->row0, qo_len, kv_len, &first_lo, &first_hi);
    visible_range(p, t->row1 - 1, qo_len, kv_len, &last_lo, &last_hi);
    for (int64_t j0 = first_lo; j0 <= last_hi; j0 += KV_BLOCK) {
        int64_t nb = last_hi + 1 - j0 < KV_BLOCK ? last_hi + 1 - j0 : KV_BLOCK;
        load_kv_block(p, sc, b, t->kv_head, j0, nb);
        for (int64_t r = 0; r < rows; r++) {
            int64_t row = t->row0 + r, lo, hi;
            visible_range(p, row, qo_len, kv_len, &lo, &hi);
            if (hi < j0 || lo > j0 + nb - 1 || lo > hi)
                continue;
            for (int64_t gi = 0; gi < g; gi++)
                attend_block(p, sc, r * g + gi, b, row, kv_len, j0, nb, lo, hi);
        }
    }

    int64_t o_start = p->o_indptr ? p->o_indptr[b] : qo_start;
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = qo_start + t->row0 + r, no = o_start + t->row0 + r;
        for (int64_t gi = 0; gi < g; gi++) {
            int64_t vec = r * g + gi, head = t->kv_head * g + gi;
            float m = sc->m[vec], l = sc->l[vec], corr = 1.0f;
            if (p->sinks)
                add_sink(p->sinks[head], &m, &l, &corr);
            float inv = l > 0.0f ? p->v_scale * corr / l : 0.0f;
            const float *acc = sc->acc + vec * d;
            char *oa = (char *)p->o + (no * p->o_stride_n + head * p->o_stride_h) *
                                          (int64_t)fi_dtype_size(p->o_dtype);
            for (int64_t i = 0; i < d; i++)
                store_value(oa, p->o_dtype, i, acc[i] * inv);
            if (p->lse)
                p->lse[n * p->lse_stride_n + head * p->lse_stride_h] =
                    l > 0.0f ? m * LOG2E + log2f(l) : -INFINITY;
        }
    }
}

static void scratch_free(scratch *sc)
{
    free(sc->qf);
    free(sc->acc);
    free(sc->m);
    free(sc->l);
    free(sc->kt);
    free(sc->vf);
    free(sc->row);
    free(sc->freq);
}

static int scratch_init(scratch *sc, const job *jb)
{
    const fi_attention_params *p = jb->p;
    size_t d = (size_t)p->head_dim, nv = (size_t)jb->max_vectors;
    memset(sc, 0, sizeof(*sc));
    sc->qf = malloc(nv * d * sizeof(float));
    sc->acc = malloc(nv * d * sizeof(float));
    sc->m = malloc(nv * sizeof(float));
    sc->l = malloc(nv * sizeof(float));
    sc->kt = malloc(d * KV_BLOCK * sizeof(float));
    sc->vf = malloc(d * KV_BLOCK * sizeof(float));
    sc->row = malloc(d * sizeof(float));
    sc->freq = malloc((d / 2 + 1) * sizeof(float));
    if (!sc->qf || !sc->acc || !sc->m || !sc->l || !sc->kt || !sc->vf || !sc->row || !sc->freq) {
        scratch_free(sc);
        return -1;
    }
    /* FlashInfer: freq_i = (1 / rope_scale) * (1 / rope_theta)^(2i / D). */
    for (size_t i = 0; i < d / 2; i++)
        sc->freq[i] =
            (1.0f / p->rope_scale) * powf(1.0f / p->rope_theta, (float)(2 * i) / (float)d);
    /* fp8 KV values, or the E4M3 block scales of NVFP4 KV */
    int e4m3 = p->kv_dtype == FI_DTYPE_E4M3FN || p->kv_dtype == FI_DTYPE_FP4X2;
    for (int i = 0; i < 256; i++)
        sc->fp8_table[i] = p->kv_dtype == FI_DTYPE_E5M2 ? fi_e5m2_to_f32((uint8_t)i)
                           : e4m3                       ? fi_e4m3fn_to_f32((uint8_t)i)
                                                        : 0.0f;
    return 0;
}

static void *worker(void *arg)
{
    job *jb = arg;
    scratch sc;
    if (scratch_init(&sc, jb) < 0) {
        atomic_store(&jb->failed, 1);
        return NULL;
    }
    for (;;) {
        long long i = atomic_fetch_add(&jb->next, 1);
        if (i >= jb->num_tasks)
            break;
        run_task(jb, &sc, &jb->tasks[i]);
    }
    scratch_free(&sc);
    return NULL;
}

int fi_attention_cpu(const fi_attention_params *p, int num_threads)
{
    int64_t g = p->num_qo_heads / p->num_kv_heads;
    int64_t rows_per_task = TILE_VECTORS / g > 0 ? TILE_VECTORS / g : 1;
    int64_t num_tasks = 0;
    for (int64_t b = 0; b < p->num_requests; b++) {
        int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
        num_tasks += (qo_len + rows_per_task - 1) / rows_per_task * p->num_kv_heads;
    }
    if (num_tasks == 0)
        return 0;
    task *tasks = malloc((size_t)num_tasks * sizeof(task));
    if (!tasks)
        return -1;
    int64_t n = 0;
    for (int64_t b = 0; b < p->num_requests; b++) {
        int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
        for (int64_t r0 = 0; r0 < qo_len; r0 += rows_per_task)
            for (int64_t h = 0; h < p->num_kv_heads; h++) {
                int64_t r1 = r0 + rows_per_task < qo_len ? r0 + rows_per_task : qo_len;
                tasks[n++] = (task){b, h, r0, r1};
            }
    }
    job jb = {.p = p,
              .tasks = tasks,
              .num_tasks = num_tasks,
              .group = g,
              .max_vectors = rows_per_task * g};
    atomic_init(&jb.next, 0);
    atomic_init(&jb.failed, 0);

    int64_t extra = num_threads - 1;
    if (extra > num_tasks - 1)
        extra = num_tasks - 1;
    if (extra > 255)
        extra = 255;
    pthread_t threads[255];
    int started = 0;
    for (int64_t i = 0; i < extra; i++) {
        if (pthread_create(&threads[started], NULL, worker, &jb) != 0)
            break;
        started++;
    }
    worker(&jb);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    free(tasks);
    /* A thread that could not get scratch left its tasks to the others; only when
     * every thread failed is work undone. */
    return atomic_load(&jb.failed) && atomic_load(&jb.next) < num_tasks ? -1 : 0;
}
