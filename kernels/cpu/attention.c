/* attention.c: CPU attention for decode and prefill over ragged or paged KV: GQA,
 * causal/window/custom masks, soft cap, RoPE, ALiBi, fp8 and NVFP4 KV, per-head fp8 scales,
 * attention sinks, V rows narrower than K's; fp32 online softmax. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention_block.h"
#include "fi_numeric.h"
#include "flashinfer_kernels.h"

#define KV_BLOCK 32     /* keys per online-softmax step */
#define TILE_VECTORS 64 /* query vectors (rows x heads in a group) per task, at least */
#define SPLIT_TASKS 64  /* decode: keys are split until a call has about this many tasks */
#define SPLIT_MIN_KEYS (8 * KV_BLOCK) /* shortest chunk a split leaves */
#define NARROW_MAX_VECTORS 8 /* query vectors per head up to which KV is not widened first */
#define LOG2E 1.4426950408889634f

/* Key rows in the scratch: a block rounded up to whole score tiles. */
#define KV_ROWS ((KV_BLOCK + FI_SCORE_KEYS - 1) / FI_SCORE_KEYS * FI_SCORE_KEYS)

/* Query rows [row0, row1) of one request against its keys [key0, key1), for kv heads
 * [head0, head0 + heads). A task that sees only part of the keys (split decode) leaves
 * its running max, sum and output in partial slots; the last of its split group to
 * finish merges them, in key order, so the result never depends on the thread count. */
typedef struct {
    int64_t request, head0, heads, row0, row1, key0, key1;
    int64_t split; /* index into the job's splits, or -1 */
} task;

typedef struct {
    int64_t first_task, num_tasks, slot0; /* slots: task i's vectors from slot0 + i * vectors */
    atomic_int unfinished;
} split_group;

/* Per-thread scratch: converted queries, accumulators, one KV block. */
typedef struct {
    float *qf;           /* [vectors][D] rotated, pre-scaled queries */
    float *acc;          /* [vectors][DV] (DV: head_dim_vo) */
    float *m, *l, *corr; /* [vectors] running max, sum, this block's rescale */
    float *s;            /* [vectors][KV_ROWS] scores, then probabilities */
    float *kf, *vf;      /* [KV_BLOCK][D] keys (rotated), [KV_BLOCK][DV] values, as f32 */
    float *freq;         /* [D / 2] RoPE frequencies */
    float *zero_row;     /* [D] zeros: the key rows that pad a block */
    int widen;           /* this task's KV goes through kf and vf */
} scratch;

typedef struct {
    const fi_attention_params *p;
    const fi_attention_block_ops *ops;
    const task *tasks;
    split_group *splits;
    float *part_m, *part_l, *part_acc; /* partial slots of split tasks */
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

static void store_value(void *dst, fi_dtype dtype, int64_t i, float x)
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
static void apply_rope(float *x, int64_t d, const float *freq, int64_t pos)
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

/* Per-block dequantization of one NVFP4 row: 16 E2M1 codes share one E4M3 scale. */
static void load_fp4_row(const uint8_t *src, const uint8_t *sf, int64_t n, float *dst)
{
    for (int64_t i = 0; i < n; i += 16) {
        float scale = fi_e4m3fn_to_f32(sf[i / 16]);
        for (int64_t e = i; e < i + 16 && e < n; e += 2) {
            dst[e] = fi_e2m1_to_f32(src[e / 2] & 15) * scale;
            dst[e + 1] = fi_e2m1_to_f32(src[e / 2] >> 4) * scale;
        }
    }
}

/* NVFP4 KV: the E4M3 block scales of key j's K (or V) row, head `head`, of request b. */
static const uint8_t *fp4_scales(const fi_attention_params *p, int is_v, int64_t b, int64_t j,
                                 int64_t head)
{
    const int32_t *indptr = is_v && p->v_indptr ? p->v_indptr : p->kv_indptr;
    int64_t page = 0, slot = (int64_t)indptr[b] + j;
    if (p->paged) {
        page = p->kv_indices[p->kv_indptr[b] + j / p->page_size];
        slot = j % p->page_size;
    }
    if (is_v)
        return p->v_sf + page * p->v_sf_stride_page + slot * p->v_sf_stride_n +
               head * p->v_sf_stride_h;
    return p->k_sf + page * p->k_sf_stride_page + slot * p->k_sf_stride_n + head * p->k_sf_stride_h;
}

/* The visible key range [lo, hi] of query row `row` from causality and the window. */
static void visible_range(const fi_attention_params *p, int64_t row, int64_t qo_len, int64_t kv_len,
                          int64_t *lo, int64_t *hi)
{
    int64_t pos = row + kv_len - qo_len;
    *hi = p->causal ? (pos < kv_len - 1 ? pos : kv_len - 1) : kv_len - 1;
    *lo = p->window_left >= 0 && pos - p->window_left > 0 ? pos - p->window_left : 0;
}

/* Addresses of the K and V rows of keys [j0, j0 + nb) of (request b, kv_head). Paged
 * rows are found by walking the pages, one division per block; ragged V rows start at
 * v_indptr[b] when given. */
static void block_rows(const fi_attention_params *p, int64_t b, int64_t kv_head, int64_t j0,
                       int64_t nb, const char **krow, const char **vrow)
{
    int64_t esize = (int64_t)fi_dtype_size(p->kv_dtype);
    int64_t page = 0, slot = (int64_t)p->kv_indptr[b] + j0, page_i = 0;
    int64_t v_shift = !p->paged && p->v_indptr ? (int64_t)p->v_indptr[b] - p->kv_indptr[b] : 0;
    if (nb == 0) /* past the last key: not even its page is looked up */
        return;
    if (p->paged) {
        page_i = p->kv_indptr[b] + j0 / p->page_size;
        slot = j0 % p->page_size;
        page = p->kv_indices[page_i];
    }
    for (int64_t j = 0; j < nb; j++) {
        int64_t ko = page * p->k_stride_page + slot * p->k_stride_n + kv_head * p->k_stride_h;
        int64_t vo =
            page * p->v_stride_page + (slot + v_shift) * p->v_stride_n + kv_head * p->v_stride_h;
        krow[j] = (const char *)p->k + ko * esize;
        vrow[j] = (const char *)p->v + vo * esize;
        if (++slot == p->page_size && p->paged && j + 1 < nb) {
            slot = 0;
            page = p->kv_indices[++page_i];
        }
    }
}

/* The rows the block kernels read for keys [j0, j0 + nb) of one kv head: the cache's own
 * rows when the kernels widen as they go, else rows widened (and rotated) into kf and vf.
 * krow is padded to KV_ROWS with the zero row. */
static fi_dtype block_kv_rows(const job *jb, scratch *sc, int64_t b, int64_t kv_head, int64_t j0,
                              int64_t nb, const void **krow, const void **vrow)
{
    const fi_attention_params *p = jb->p;
    int64_t d = p->head_dim, dv = p->head_dim_vo;
    const char *k[KV_BLOCK], *v[KV_BLOCK];
    block_rows(p, b, kv_head, j0, nb, k, v);
    for (int64_t j = nb; j < KV_ROWS; j++)
        krow[j] = sc->zero_row;
    if (!sc->widen) {
        for (int64_t j = 0; j < nb; j++) {
            krow[j] = k[j];
            vrow[j] = v[j];
        }
        return p->kv_dtype;
    }
    int fp4 = p->kv_dtype == FI_DTYPE_FP4X2;
    for (int64_t j = 0; j < nb; j++) {
        float *kr = sc->kf + j * d, *vr = sc->vf + j * dv;
        if (fp4)
            load_fp4_row((const uint8_t *)k[j], fp4_scales(p, 0, b, j0 + j, kv_head), d, kr);
        else
            jb->ops->widen(k[j], p->kv_dtype, d, kr);
        if (p->pos_encoding == FI_POS_ENCODING_ROPE_LLAMA)
            apply_rope(kr, d, sc->freq, j0 + j);
        if (fp4)
            load_fp4_row((const uint8_t *)v[j], fp4_scales(p, 1, b, j0 + j, kv_head), dv, vr);
        else
            jb->ops->widen(v[j], p->kv_dtype, dv, vr);
        krow[j] = kr;
        vrow[j] = vr;
    }
    return FI_DTYPE_F32;
}

/* The K and V rows of the same head's next block, for the kernels to prefetch as they go:
 * one head's rows are short runs far apart, which the hardware prefetchers miss. */
typedef struct {
    const char *k[KV_BLOCK], *v[KV_BLOCK];
    fi_row_prefetch kpf, vpf;
} next_rows;

static void next_block_rows(const fi_attention_params *p, int64_t b, int64_t kv_head, int64_t j0,
                            int64_t nb, next_rows *nr)
{
    int64_t esize = (int64_t)fi_dtype_size(p->kv_dtype);
    block_rows(p, b, kv_head, j0, nb, nr->k, nr->v);
    nr->kpf = (fi_row_prefetch){nr->k, nb, p->head_dim * esize};
    nr->vpf = (fi_row_prefetch){nr->v, nb, p->head_dim_vo * esize};
}

/* Scores of one query vector (query position pos, ALiBi slope alibi, 0 for none) against
 * the block, in place: hidden keys -inf, the ALiBi bias, then the soft cap. */
static void mask_scores(const fi_attention_params *p, float *s, int64_t b, int64_t row,
                        int64_t kv_len, int64_t j0, int64_t nb, int64_t lo, int64_t hi, float alibi,
                        int64_t pos)
{
    const uint8_t *mask = p->mask ? p->mask + p->mask_indptr[b] : NULL;
    float cap = p->logits_soft_cap;
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
        s[j] += alibi * (float)(key - pos);
        if (cap > 0.0f)
            s[j] = cap * tanhf(s[j] / cap);
    }
}

/* The per-row finalisation step of attention sinks: the sink joins the softmax state
 * (running max m, sum l) as one more logit; *corr rescales what was accumulated. */
static void add_sink(float sink, float *m, float *l, float *corr)
{
    float m_new = sink > *m ? sink : *m;
    if (m_new == -INFINITY)
        return; /* no key seen and a -inf sink: nothing to add */
    *corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
    *l = *l * *corr + expf(sink - m_new);
    *m = m_new;
}

/* Online softmax over one block for one query vector: s becomes the probabilities
 * relative to the new running max, corr what the earlier sum and output are scaled by.
 * NaN propagates as in torch's softmax (docs/kernels.md): the max skips NaN scores, so a
 * NaN beside a finite score makes its exp, and so the sum and the output, NaN; a block of
 * nothing but NaN and -inf is told apart from one that sees nothing here, off the hot
 * path, and makes them NaN itself. */
static void softmax_block(const fi_attention_block_ops *ops, scratch *sc, int64_t vec, float *s,
                          int64_t nb)
{
    float mx = ops->max(s, nb), m_old = sc->m[vec];
    sc->corr[vec] = 1.0f;
    if (mx == -INFINITY) {
        int nan = 0;
        for (int64_t j = 0; j < nb; j++)
            nan |= isnan(s[j]);
        for (int64_t j = 0; j < nb; j++) /* sees nothing here: adds nothing */
            s[j] = nan ? NAN : 0.0f;
        if (nan)
            sc->l[vec] = NAN;
        return;
    }
    if (mx > m_old) {
        if (m_old != -INFINITY)
            sc->corr[vec] = expf(m_old - mx);
        sc->m[vec] = mx;
    }
    sc->l[vec] = sc->l[vec] * sc->corr[vec] + ops->exp_sum(s, nb, sc->m[vec]);
}

/* One KV block of one head against the task's rows that see any of it; v0 is the head's
 * first vector. */
static void attend_block(const job *jb, scratch *sc, const task *t, int64_t v0, int64_t qo_len,
                         int64_t kv_len, int64_t j0, int64_t nb, const void *const *krow,
                         const void *const *vrow, fi_dtype row_dtype, const next_rows *next)
{
    const fi_attention_params *p = jb->p;
    int64_t d = p->head_dim, g = jb->group, ra = -1, rb = -1;
    int alibi = p->pos_encoding == FI_POS_ENCODING_ALIBI;
    for (int64_t r = 0; r < t->row1 - t->row0; r++) {
        int64_t lo, hi;
        visible_range(p, t->row0 + r, qo_len, kv_len, &lo, &hi);
        if (hi < j0 || lo > j0 + nb - 1 || lo > hi)
            continue;
        ra = ra < 0 ? r : ra;
        rb = r + 1;
    }
    if (ra < 0)
        return;
    int64_t va = v0 + ra * g, nv = (rb - ra) * g;
    jb->ops->scores(sc->qf + va * d, nv, krow, row_dtype, nb, d, sc->s, KV_ROWS, &next->kpf);
    for (int64_t r = ra; r < rb; r++) {
        int64_t row = t->row0 + r, lo, hi;
        visible_range(p, row, qo_len, kv_len, &lo, &hi);
        int whole =
            lo <= j0 && hi >= j0 + nb - 1 && !p->mask && !(p->logits_soft_cap > 0.0f) && !alibi;
        for (int64_t gi = 0; gi < g; gi++) {
            int64_t vec = v0 + r * g + gi;
            float *s = sc->s + (vec - va) * KV_ROWS;
            /* v0 starts the vectors of kv head t->head0 + v0 / per_head (vector_place) */
            int64_t per_head = (t->row1 - t->row0) * g;
            float slope =
                alibi ? fi_alibi_slope((t->head0 + v0 / per_head) * g + gi, p->num_qo_heads) : 0.0f;
            if (!whole)
                mask_scores(p, s, t->request, row, kv_len, j0, nb, lo, hi, slope,
                            row + kv_len - qo_len);
            softmax_block(jb->ops, sc, vec, s, nb);
        }
    }
    int64_t dv = p->head_dim_vo;
    jb->ops->accumulate(sc->s, KV_ROWS, nv, sc->corr + va, vrow, row_dtype, nb, dv,
                        sc->acc + va * dv, &next->vpf);
}

/* The softmax's last step for query row `row` of request b, qo head `head`: the sink
 * (if any) joins the running max m and sum l, then o = acc / l (times the V scale) into
 * o's row and the base-2 log-sum-exp into q's. */
static void finish_vector(const fi_attention_params *p, const float *acc, float m, float l,
                          int64_t b, int64_t row, int64_t head)
{
    int64_t d = p->head_dim_vo, n = p->qo_indptr[b] + row;
    int64_t no = p->o_indptr ? p->o_indptr[b] + row : n;
    float corr = 1.0f;
    if (p->sinks)
        add_sink(p->sinks[head], &m, &l, &corr);
    float v_scale = p->v_scale;
    if (p->v_head_scale)
        v_scale *=
            p->v_head_scale[p->v_head_scale_step * (head / (p->num_qo_heads / p->num_kv_heads))];
    float inv = l != 0.0f ? v_scale * corr / l : 0.0f; /* l is 0 (saw nothing), > 0 or NaN */
    char *oa = (char *)p->o +
               (no * p->o_stride_n + head * p->o_stride_h) * (int64_t)fi_dtype_size(p->o_dtype);
    for (int64_t i = 0; i < d; i++)
        store_value(oa, p->o_dtype, i, acc[i] * inv);
    if (p->lse)
        p->lse[n * p->lse_stride_n + head * p->lse_stride_h] =
            l != 0.0f ? m * LOG2E + log2f(l) : -INFINITY;
}

/* Vectors of a task: head-major, then row, then the head's place in its group. */
static int64_t task_vectors(const job *jb, const task *t)
{
    return t->heads * (t->row1 - t->row0) * jb->group;
}

/* Query row and qo head of a task's vector. */
static void vector_place(const job *jb, const task *t, int64_t vec, int64_t *row, int64_t *head)
{
    int64_t g = jb->group, per_head = (t->row1 - t->row0) * g;
    *row = t->row0 + vec % per_head / g;
    *head = (t->head0 + vec / per_head) * g + vec % g;
}

static void load_queries(const job *jb, scratch *sc, const task *t, int64_t qo_start,
                         int64_t qo_len, int64_t kv_len)
{
    const fi_attention_params *p = jb->p;
    int64_t d = p->head_dim, dv = p->head_dim_vo, qsize = (int64_t)fi_dtype_size(p->q_dtype);
    for (int64_t vec = 0; vec < task_vectors(jb, t); vec++) {
        int64_t row, head;
        vector_place(jb, t, vec, &row, &head);
        const char *qa =
            (const char *)p->q + ((qo_start + row) * p->q_stride_n + head * p->q_stride_h) * qsize;
        float *qf = sc->qf + vec * d;
        jb->ops->widen(qa, p->q_dtype, d, qf);
        if (p->pos_encoding == FI_POS_ENCODING_ROPE_LLAMA)
            apply_rope(qf, d, sc->freq, row + kv_len - qo_len);
        float scale = p->sm_scale;
        if (p->q_head_scale)
            scale *= p->q_head_scale[p->q_head_scale_step * head];
        if (p->k_head_scale)
            scale *= p->k_head_scale[p->k_head_scale_step * (head / jb->group)];
        for (int64_t i = 0; i < d; i++)
            qf[i] *= scale;
        memset(sc->acc + vec * dv, 0, (size_t)dv * sizeof(float));
        sc->m[vec] = -INFINITY;
        sc->l[vec] = 0.0f;
    }
}

/* Combines the partial results of a split group in key order (into the first task's
 * slots) and writes o and lse. */
static void merge_split(const job *jb, const split_group *sg)
{
    const fi_attention_params *p = jb->p;
    const task *t = &jb->tasks[sg->first_task];
    int64_t d = p->head_dim_vo, nv = task_vectors(jb, t);
    for (int64_t vec = 0; vec < nv; vec++) {
        float m = -INFINITY, l = 0.0f;
        for (int64_t c = 0; c < sg->num_tasks; c++) {
            float mc = jb->part_m[sg->slot0 + c * nv + vec];
            m = mc > m ? mc : m;
        }
        float *acc = jb->part_acc + (sg->slot0 + vec) * d;
        for (int64_t c = 0; c < sg->num_tasks; c++) {
            int64_t slot = sg->slot0 + c * nv + vec;
            float mc = jb->part_m[slot];
            float w = mc == -INFINITY ? 0.0f : expf(mc - m);
            const float *pa = jb->part_acc + slot * d;
            l += jb->part_l[slot] * w;
            for (int64_t i = 0; i < d; i++)
                acc[i] = c == 0 ? pa[i] * w : acc[i] + pa[i] * w;
        }
        int64_t row, head;
        vector_place(jb, t, vec, &row, &head);
        finish_vector(p, acc, m, l, t->request, row, head);
    }
}

/* Whether a task widens its KV into scratch first: the portable kernels need it, RoPE
 * rotates keys, NVFP4 is dequantized per block, and past NARROW_MAX_VECTORS query vectors
 * per head (prefill) a row widened once beats one widened in registers again for every
 * tile of vectors. */
static int task_widens(const job *jb, int64_t per_head)
{
    const fi_attention_params *p = jb->p;
    return !jb->ops->narrow_rows || p->pos_encoding == FI_POS_ENCODING_ROPE_LLAMA ||
           p->kv_dtype == FI_DTYPE_FP4X2 || per_head > NARROW_MAX_VECTORS;
}

static void run_task(job *jb, scratch *sc, const task *t)
{
    const fi_attention_params *p = jb->p;
    int64_t d = p->head_dim_vo, b = t->request;
    int64_t qo_start = p->qo_indptr[b];
    int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - qo_start;
    int64_t kv_len = kv_len_of(p, b);
    int64_t per_head = (t->row1 - t->row0) * jb->group, nv = task_vectors(jb, t);
    load_queries(jb, sc, t, qo_start, qo_len, kv_len);
    sc->widen = task_widens(jb, per_head);

    int64_t first_lo, first_hi, last_lo, last_hi;
    visible_range(p, t->row0, qo_len, kv_len, &first_lo, &first_hi);
    visible_range(p, t->row1 - 1, qo_len, kv_len, &last_lo, &last_hi);
    int64_t start = first_lo > t->key0 ? first_lo : t->key0;
    int64_t end = last_hi + 1 < t->key1 ? last_hi + 1 : t->key1;
    for (int64_t j0 = start; j0 < end; j0 += KV_BLOCK) {
        int64_t nb = end - j0 < KV_BLOCK ? end - j0 : KV_BLOCK;
        int64_t after = end - (j0 + nb);
        for (int64_t h = 0; h < t->heads; h++) {
            const void *krow[KV_ROWS], *vrow[KV_BLOCK];
            next_rows next; /* the next head of this block, or the first of the next block */
            if (h + 1 < t->heads)
                next_block_rows(p, b, t->head0 + h + 1, j0, nb, &next);
            else
                next_block_rows(p, b, t->head0, j0 + nb, after < KV_BLOCK ? after : KV_BLOCK,
                                &next);
            fi_dtype dt = block_kv_rows(jb, sc, b, t->head0 + h, j0, nb, krow, vrow);
            attend_block(jb, sc, t, h * per_head, qo_len, kv_len, j0, nb, krow, vrow, dt, &next);
        }
    }

    if (t->split < 0) {
        for (int64_t vec = 0; vec < nv; vec++) {
            int64_t row, head;
            vector_place(jb, t, vec, &row, &head);
            finish_vector(p, sc->acc + vec * d, sc->m[vec], sc->l[vec], b, row, head);
        }
        return;
    }
    split_group *sg = &jb->splits[t->split];
    int64_t slot = sg->slot0 + (t - jb->tasks - sg->first_task) * nv;
    memcpy(jb->part_m + slot, sc->m, (size_t)nv * sizeof(float));
    memcpy(jb->part_l + slot, sc->l, (size_t)nv * sizeof(float));
    memcpy(jb->part_acc + slot * d, sc->acc, (size_t)(nv * d) * sizeof(float));
    if (atomic_fetch_sub(&sg->unfinished, 1) == 1) /* the last one sees every other's stores */
        merge_split(jb, sg);
}

static void scratch_free(scratch *sc)
{
    free(sc->qf);
    free(sc->acc);
    free(sc->m);
    free(sc->l);
    free(sc->corr);
    free(sc->s);
    free(sc->kf);
    free(sc->vf);
    free(sc->freq);
    free(sc->zero_row);
}

/* Cache-line aligned, so no vector load of a row straddles two lines. */
static float *alloc_floats(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

static int scratch_init(scratch *sc, const job *jb)
{
    const fi_attention_params *p = jb->p;
    size_t d = (size_t)p->head_dim, dv = (size_t)p->head_dim_vo, nv = (size_t)jb->max_vectors;
    memset(sc, 0, sizeof(*sc));
    sc->qf = alloc_floats(nv * d);
    sc->acc = alloc_floats(nv * dv);
    sc->m = alloc_floats(nv);
    sc->l = alloc_floats(nv);
    sc->corr = alloc_floats(nv);
    sc->s = alloc_floats(nv * KV_ROWS);
    sc->kf = alloc_floats(KV_BLOCK * d);
    sc->vf = alloc_floats(KV_BLOCK * dv);
    sc->freq = alloc_floats(d / 2 + 1);
    sc->zero_row = alloc_floats(d);
    if (!sc->qf || !sc->acc || !sc->m || !sc->l || !sc->corr || !sc->s || !sc->kf || !sc->vf ||
        !sc->freq || !sc->zero_row) {
        scratch_free(sc);
        return -1;
    }
    memset(sc->zero_row, 0, d * sizeof(float));
    /* FlashInfer: freq_i = (1 / rope_scale) * (1 / rope_theta)^(2i / D). */
    for (size_t i = 0; i < d / 2; i++)
        sc->freq[i] =
            (1.0f / p->rope_scale) * powf(1.0f / p->rope_theta, (float)(2 * i) / (float)d);
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

/* The work of a call as tasks. Few query vectors per kv head (decode): one task takes
 * the kv heads of up to TILE_VECTORS vectors, so a token's heads, adjacent in memory, are
 * read together, and long KV is cut into chunks until the call has about SPLIT_TASKS
 * tasks, or into the caller's fixed kv_chunk (then a request's tasks, and so its bits, do
 * not depend on the rest of the batch). Otherwise (prefill): one kv head and up to
 * TILE_VECTORS vectors per task, all keys. Nothing here depends on the thread count. */
typedef struct {
    task *tasks;
    split_group *splits;
    int64_t num_tasks, num_splits, num_slots, max_vectors;
} plan;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Adds request b's tasks (or only counts them when pl->tasks is NULL). */
static void plan_request(const fi_attention_params *p, int64_t b, int64_t chunks_wanted, plan *pl)
{
    int64_t g = p->num_qo_heads / p->num_kv_heads, hk = p->num_kv_heads;
    int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b], kv_len = kv_len_of(p, b);
    if (qo_len == 0)
        return;
    if (qo_len * g > TILE_VECTORS) {
        int64_t rows = TILE_VECTORS / g > 0 ? TILE_VECTORS / g : 1;
        for (int64_t r0 = 0; r0 < qo_len; r0 += rows)
            for (int64_t h = 0; h < hk; h++) {
                if (pl->tasks)
                    pl->tasks[pl->num_tasks] =
                        (task){b, h, 1, r0, min64(r0 + rows, qo_len), 0, kv_len, -1};
                pl->num_tasks++;
            }
        return;
    }
    int64_t heads = TILE_VECTORS / (qo_len * g), vectors;
    int64_t chunk = (kv_len + chunks_wanted - 1) / chunks_wanted;
    chunk = chunk < SPLIT_MIN_KEYS ? SPLIT_MIN_KEYS : (chunk + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    if (p->kv_chunk != 0) /* fixed by the caller: the same split whatever the batch */
        chunk = p->kv_chunk > 0 ? p->kv_chunk : (kv_len > 0 ? kv_len : 1);
    int64_t chunks = kv_len > chunk ? (kv_len + chunk - 1) / chunk : 1;
    for (int64_t h0 = 0; h0 < hk; h0 += heads) {
        int64_t nh = min64(heads, hk - h0), split = chunks > 1 ? pl->num_splits++ : -1;
        vectors = nh * qo_len * g;
        if (pl->tasks && split >= 0) {
            pl->splits[split].first_task = pl->num_tasks;
            pl->splits[split].num_tasks = chunks;
            pl->splits[split].slot0 = pl->num_slots;
            atomic_init(&pl->splits[split].unfinished, (int)chunks);
        }
        for (int64_t c = 0; c < chunks; c++) {
            if (pl->tasks)
                pl->tasks[pl->num_tasks] =
                    (task){b,
                           h0,
                           nh,
                           0,
                           qo_len,
                           c * chunk,
                           chunks > 1 ? min64((c + 1) * chunk, kv_len) : kv_len,
                           split};
            pl->num_tasks++;
        }
        pl->num_slots += split >= 0 ? chunks * vectors : 0;
        pl->max_vectors = vectors > pl->max_vectors ? vectors : pl->max_vectors;
    }
}

static void plan_free(plan *pl)
{
    free(pl->tasks);
    free(pl->splits);
}

static int plan_build(const fi_attention_params *p, plan *pl, float **part)
{
    int64_t g = p->num_qo_heads / p->num_kv_heads, decode_groups = 0;
    for (int64_t b = 0; b < p->num_requests; b++) {
        int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
        if (qo_len > 0 && qo_len * g <= TILE_VECTORS)
            decode_groups +=
                (p->num_kv_heads + TILE_VECTORS / (qo_len * g) - 1) / (TILE_VECTORS / (qo_len * g));
    }
    int64_t chunks_wanted =
        decode_groups > 0 ? (SPLIT_TASKS + decode_groups - 1) / decode_groups : 1;
    memset(pl, 0, sizeof(*pl));
    pl->max_vectors = TILE_VECTORS / g > 0 ? TILE_VECTORS : g;
    for (int64_t b = 0; b < p->num_requests; b++)
        plan_request(p, b, chunks_wanted, pl);
    int64_t tasks = pl->num_tasks, splits = pl->num_splits, slots = pl->num_slots;
    pl->tasks = malloc((size_t)(tasks > 0 ? tasks : 1) * sizeof(task));
    pl->splits = malloc((size_t)(splits > 0 ? splits : 1) * sizeof(split_group));
    *part = slots > 0 ? malloc((size_t)slots * (size_t)(p->head_dim_vo + 2) * sizeof(float)) : NULL;
    if (!pl->tasks || !pl->splits || (slots > 0 && !*part)) {
        plan_free(pl);
        free(*part);
        return -1;
    }
    pl->num_tasks = pl->num_splits = pl->num_slots = 0;
    for (int64_t b = 0; b < p->num_requests; b++)
        plan_request(p, b, chunks_wanted, pl);
    return 0;
}

int fi_attention_cpu(const fi_attention_params *p, int num_threads)
{
    plan pl;
    float *part = NULL;
    if (plan_build(p, &pl, &part) < 0)
        return -1;
    job jb = {.p = p,
              .ops =
                  fi_attention_block_ops_for(p->head_dim % 32 == 0 ? p->head_dim_vo : p->head_dim),
              .tasks = pl.tasks,
              .splits = pl.splits,
              .part_m = part,
              .part_l = part ? part + pl.num_slots : NULL,
              .part_acc = part ? part + 2 * pl.num_slots : NULL,
              .num_tasks = pl.num_tasks,
              .group = p->num_qo_heads / p->num_kv_heads,
              .max_vectors = pl.max_vectors};
    atomic_init(&jb.next, 0);
    atomic_init(&jb.failed, 0);

    int64_t extra = num_threads - 1;
    if (extra > pl.num_tasks - 1)
        extra = pl.num_tasks - 1;
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
    plan_free(&pl);
    free(part);
    /* A thread that could not get scratch left its tasks to the others; only when
     * every thread failed is work undone. */
    return atomic_load(&jb.failed) && atomic_load(&jb.next) < jb.num_tasks ? -1 : 0;
}
