/* ops_attention.c: argument checking for the attention kernels, then the call with the
 * GIL released. Everything the kernel will index is proven in bounds here first. */
#include "ops_attention.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "tensor.h"

/* The rules every attention call and plan() obey, in one place; flashinfer._kernels exports
 * them (KV_LAYOUTS, POS_ENCODING_MODES, HEAD_DIMS, check_attention_plan) so the Python
 * layer does not repeat them. */
static const char *const kv_layouts[] = {"NHD", "HND"};
/* Index = fi_pos_encoding value (FlashInfer's PosEncodingMode). */
static const char *const pos_encoding_modes[] = {"NONE", "ROPE_LLAMA", "ALIBI"};
/* (head_dim_qk, head_dim_vo) pairs the kernels run: equal dims, and DeepSeek's 192 / 128. */
static const int64_t head_dim_pairs[][2] = {
    {64, 64}, {128, 128}, {256, 256}, {512, 512}, {192, 128}};
#define NUM_HEAD_DIM_PAIRS ((int)(sizeof(head_dim_pairs) / sizeof(head_dim_pairs[0])))
#define HEAD_DIMS_ACCEPTED "64, 128, 256, 512 (q, k and v alike), or qk 192 with vo 128"

/* 0 when (qk, vo) is a pair the kernels run, else -1 with ValueError naming `name`. */
static int check_head_dims(const char *name, int64_t qk, int64_t vo)
{
    for (int i = 0; i < NUM_HEAD_DIM_PAIRS; i++)
        if (head_dim_pairs[i][0] == qk && head_dim_pairs[i][1] == vo)
            return 0;
    if (qk == vo)
        PyErr_Format(PyExc_ValueError, "%s: head_dim %lld is not supported; accepted: %s", name,
                     (long long)qk, HEAD_DIMS_ACCEPTED);
    else
        PyErr_Format(PyExc_ValueError,
                     "%s: head_dim_qk %lld with head_dim_vo %lld is not supported; accepted: %s",
                     name, (long long)qk, (long long)vo, HEAD_DIMS_ACCEPTED);
    return -1;
}

/* The index of value in names[0..n), or -1 with ValueError listing them. */
static int check_name(const char *what, const char *value, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(value, names[i]) == 0)
            return i;
    char accepted[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(accepted + strlen(accepted), sizeof(accepted) - strlen(accepted), "%s'%s'",
                 i ? ", " : "", names[i]);
    PyErr_Format(PyExc_ValueError, "%s: '%.50s' is not supported; accepted: %s", what, value,
                 accepted);
    return -1;
}

static int heads_divide(int64_t num_qo_heads, int64_t num_kv_heads)
{
    return num_kv_heads >= 1 && num_qo_heads % num_kv_heads == 0;
}

static const fi_dtype float_kinds[] = {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F32};
/* q: a float, or float8 with per-head scales (FlashInfer's fa3 FP8 attention) */
static const fi_dtype q_kinds[] = {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F32, FI_DTYPE_E4M3FN,
                                   FI_DTYPE_E5M2};
static const fi_dtype float32_kind[] = {FI_DTYPE_F32};
static const fi_dtype int32_kind[] = {FI_DTYPE_I32};

/* The scalar settings of one call as Python passed them; check_settings checks them into
 * fi_attention_params. */
typedef struct {
    const char *kv_layout, *pos_encoding_mode;
    int causal;
    long long window_left, kv_chunk;
    double logits_soft_cap, sm_scale, v_scale, rope_scale, rope_theta;
    int num_threads; /* CPU worker threads; the CUDA kernel ignores it */
} attention_settings;

/* Index arrays are read as int32 [n] with unit stride. */
static int check_index_array(const fi_arg *a, int64_t len)
{
    if (fi_arg_check_ndim(a, 1, NULL) < 0 || fi_arg_check_dtype(a, int32_kind, 1) < 0)
        return -1;
    if (len >= 0 && a->t.shape[0] != len) {
        PyErr_Format(PyExc_ValueError, "%s: expected %lld entries, got %lld", a->name,
                     (long long)len, (long long)a->t.shape[0]);
        return -1;
    }
    return fi_arg_check_contiguous(a);
}

/* indptr[0] >= 0, non-decreasing, indptr[last] <= limit. */
static int check_indptr(const fi_arg *a, int64_t limit, const char *limit_what)
{
    const int32_t *v = a->t.data;
    int64_t n = a->t.shape[0];
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "%s: needs at least one entry (batch_size + 1)", a->name);
        return -1;
    }
    if (v[0] < 0) {
        PyErr_Format(PyExc_ValueError, "%s[0] is %d; accepted: >= 0", a->name, (int)v[0]);
        return -1;
    }
    for (int64_t i = 1; i < n; i++) {
        if (v[i] < v[i - 1]) {
            PyErr_Format(PyExc_ValueError,
                         "%s is not monotone: %s[%lld] = %d < %s[%lld] = %d; accepted: "
                         "non-decreasing offsets",
                         a->name, a->name, (long long)i, (int)v[i], a->name, (long long)(i - 1),
                         (int)v[i - 1]);
            return -1;
        }
    }
    if (v[n - 1] > limit) {
        PyErr_Format(PyExc_ValueError, "%s[-1] is %d but %s is %lld; accepted: <= %lld", a->name,
                     (int)v[n - 1], limit_what, (long long)limit, (long long)limit);
        return -1;
    }
    return 0;
}

static int check_last_dim_contiguous(const fi_arg *a)
{
    if (a->t.ndim > 0 && a->t.shape[a->t.ndim - 1] > 1 && a->t.stride[a->t.ndim - 1] != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the last dimension must be contiguous (stride 1), got stride %lld",
                     a->name, (long long)a->t.stride[a->t.ndim - 1]);
        return -1;
    }
    return 0;
}

typedef struct {
    fi_arg q, k, v, out, lse, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask, mask_indptr;
    fi_arg v_indptr, o_indptr, sinks, k_sf, v_sf, q_head_scale, k_head_scale, v_head_scale;
} attention_args;

static int64_t kv_len_of(const fi_attention_params *p, int64_t b)
{
    int64_t n = (int64_t)p->kv_indptr[b + 1] - p->kv_indptr[b];
    if (!p->paged)
        return n;
    return n == 0 ? 0 : (n - 1) * p->page_size + p->kv_last_page_len[b];
}

/* NVFP4 KV: k_sf / v_sf hold one E4M3 scale per 16 elements, shaped like k / v but for the
 * last dimension (head_dim / 16 instead of head_dim / 2 bytes); dims as check_kv reads
 * them (page, token, head). */
static int check_fp4_scales(attention_args *a, fi_attention_params *p, int page, int tok, int head)
{
    static const fi_dtype sf_kinds[] = {FI_DTYPE_E4M3FN, FI_DTYPE_U8};
    fi_arg *sf[2] = {&a->k_sf, &a->v_sf}, *kv[2] = {&a->k, &a->v};
    int64_t strides[2][3];
    for (int i = 0; i < 2; i++) {
        int nd = kv[i]->t.ndim;
        if (fi_arg_check_ndim(sf[i], nd, NULL) < 0 || fi_arg_check_dtype(sf[i], sf_kinds, 2) < 0 ||
            check_last_dim_contiguous(sf[i]) < 0 ||
            fi_arg_check_dim(sf[i], nd - 1, "scales per row",
                             (i ? p->head_dim_vo : p->head_dim) / 16) < 0)
            return -1;
        for (int d = 0; d < nd - 1; d++)
            if (fi_arg_check_dim(sf[i], d, "size", kv[i]->t.shape[d]) < 0)
                return -1;
        strides[i][0] = page >= 0 ? sf[i]->t.stride[page] : 0;
        strides[i][1] = sf[i]->t.stride[tok];
        strides[i][2] = sf[i]->t.stride[head];
    }
    p->k_sf = a->k_sf.t.data;
    p->v_sf = a->v_sf.t.data;
    p->k_sf_stride_page = strides[0][0], p->k_sf_stride_n = strides[0][1];
    p->k_sf_stride_h = strides[0][2];
    p->v_sf_stride_page = strides[1][0], p->v_sf_stride_n = strides[1][1];
    p->v_sf_stride_h = strides[1][2];
    return 0;
}

/* The KV dtype: q's, float8, or NVFP4 (uint8 / float4_e2m1fn_x2 bytes) when scales came. */
static int check_kv_dtype(attention_args *a, fi_attention_params *p)
{
    fi_dtype kd = a->k.t.dtype;
    int fp4 = a->k_sf.obj != NULL;
    if (fp4 && (kd == FI_DTYPE_U8 || kd == FI_DTYPE_FP4X2)) {
        p->kv_dtype = FI_DTYPE_FP4X2;
        return 0;
    }
    if (!fp4 && (kd == p->q_dtype || kd == FI_DTYPE_E4M3FN || kd == FI_DTYPE_E5M2)) {
        p->kv_dtype = kd;
        return 0;
    }
    if (fp4)
        PyErr_Format(PyExc_ValueError,
                     "%s: dtype %s does not hold NVFP4 values; with kv_cache_sf accepted: "
                     "uint8, float4_e2m1fn_x2",
                     a->k.name, fi_dtype_name(kd));
    else
        PyErr_Format(PyExc_ValueError,
                     "%s: dtype %s is not supported with q of dtype %s; accepted: %s, "
                     "float8_e4m3fn, float8_e5m2 (uint8 NVFP4 with kv_cache_sf)",
                     a->k.name, fi_dtype_name(kd), fi_dtype_name(p->q_dtype),
                     fi_dtype_name(p->q_dtype));
    return -1;
}

/* v_indptr (ragged): request b's values are rows v_indptr[b] .. + kv_len(b) of v. */
static int check_v_indptr(attention_args *a, fi_attention_params *p, int64_t v_rows)
{
    if (check_index_array(&a->v_indptr, p->num_requests + 1) < 0)
        return -1;
    const int32_t *vi = a->v_indptr.t.data;
    for (int64_t b = 0; b < p->num_requests; b++) {
        if (vi[b] < 0 || vi[b] + kv_len_of(p, b) > v_rows) {
            PyErr_Format(PyExc_ValueError,
                         "%s[%lld] is %d: request %lld's %lld values do not fit the %lld rows "
                         "of v",
                         a->v_indptr.name, (long long)b, (int)vi[b], (long long)b,
                         (long long)kv_len_of(p, b), (long long)v_rows);
            return -1;
        }
    }
    p->v_indptr = vi;
    return 0;
}

static int check_kv(attention_args *a, fi_attention_params *p, int hnd)
{
    int paged = p->paged;
    int nd = paged ? 4 : 3;
    /* dims: [page,] token, head, dim for NHD; [page,] head, token, dim for HND */
    int base = paged ? 1 : 0;
    int tok = base + (hnd ? 1 : 0), head = base + (hnd ? 0 : 1);
    if (fi_arg_check_ndim(&a->k, nd, NULL) < 0 || fi_arg_check_ndim(&a->v, nd, NULL) < 0)
        return -1;
    for (int i = 0; i < nd - 1; i++) { /* the last: head_dim and head_dim_vo, below */
        if (a->v_indptr.obj && i == tok)
            continue; /* v has its own rows */
        if (a->k.t.shape[i] != a->v.t.shape[i]) {
            PyErr_Format(PyExc_ValueError,
                         "%s and %s differ in shape at dimension %d: %lld vs %lld", a->k.name,
                         a->v.name, i, (long long)a->k.t.shape[i], (long long)a->v.t.shape[i]);
            return -1;
        }
    }
    if (a->k.t.dtype != a->v.t.dtype) {
        PyErr_Format(PyExc_ValueError, "%s is %s but %s is %s; they must share a dtype", a->k.name,
                     fi_dtype_name(a->k.t.dtype), a->v.name, fi_dtype_name(a->v.t.dtype));
        return -1;
    }
    if (check_kv_dtype(a, p) < 0 || check_last_dim_contiguous(&a->k) < 0 ||
        check_last_dim_contiguous(&a->v) < 0)
        return -1;
    int fp4 = p->kv_dtype == FI_DTYPE_FP4X2;
    if (fi_arg_check_dim(&a->k, nd - 1, fp4 ? "head_dim / 2 (NVFP4 bytes)" : "head_dim",
                         fp4 ? p->head_dim / 2 : p->head_dim) < 0 ||
        fi_arg_check_dim(&a->v, nd - 1, fp4 ? "head_dim_vo / 2 (NVFP4 bytes)" : "head_dim_vo",
                         fp4 ? p->head_dim_vo / 2 : p->head_dim_vo) < 0)
        return -1;
    if (fp4 && check_fp4_scales(a, p, paged ? 0 : -1, tok, head) < 0)
        return -1;
    int64_t hkv = a->k.t.shape[head];
    if (!heads_divide(p->num_qo_heads, hkv)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: num_kv_heads (dimension %d) is %lld but num_qo_heads is %lld; "
                     "accepted: a divisor of num_qo_heads",
                     a->k.name, head, (long long)hkv, (long long)p->num_qo_heads);
        return -1;
    }
    p->num_kv_heads = hkv;
    p->k = a->k.t.data;
    p->v = a->v.t.data;
    p->k_stride_page = paged ? a->k.t.stride[0] : 0;
    p->v_stride_page = paged ? a->v.t.stride[0] : 0;
    p->k_stride_n = a->k.t.stride[tok];
    p->v_stride_n = a->v.t.stride[tok];
    p->k_stride_h = a->k.t.stride[head];
    p->v_stride_h = a->v.t.stride[head];
    int64_t b = p->num_requests;
    if (check_index_array(&a->kv_indptr, b + 1) < 0)
        return -1;
    if (!paged) {
        if (check_indptr(&a->kv_indptr, a->k.t.shape[tok], "the number of kv tokens") < 0)
            return -1;
        p->kv_indptr = a->kv_indptr.t.data;
        return a->v_indptr.obj ? check_v_indptr(a, p, a->v.t.shape[tok]) : 0;
    }
    if (a->v_indptr.obj) {
        PyErr_SetString(PyExc_ValueError, "v_indptr: only for ragged KV (no kv_indices)");
        return -1;
    }
    p->page_size = a->k.t.shape[tok];
    int64_t num_pages = a->k.t.shape[0];
    if (check_index_array(&a->kv_indices, -1) < 0 ||
        check_index_array(&a->kv_last_page_len, b) < 0 ||
        check_indptr(&a->kv_indptr, a->kv_indices.t.shape[0], "the length of kv_indices") < 0)
        return -1;
    const int32_t *indptr = a->kv_indptr.t.data, *indices = a->kv_indices.t.data;
    const int32_t *last = a->kv_last_page_len.t.data;
    for (int64_t i = indptr[0]; i < indptr[b]; i++) {
        if (indices[i] < 0 || indices[i] >= num_pages) {
            PyErr_Format(PyExc_ValueError,
                         "%s[%lld] is %d; accepted: a page index in [0, %lld) (num_pages)",
                         a->kv_indices.name, (long long)i, (int)indices[i], (long long)num_pages);
            return -1;
        }
    }
    for (int64_t i = 0; i < b; i++) {
        int has_pages = indptr[i + 1] > indptr[i];
        if (last[i] < (has_pages ? 1 : 0) || last[i] > p->page_size) {
            PyErr_Format(PyExc_ValueError, "%s[%lld] is %d; accepted: [1, page_size = %lld]",
                         a->kv_last_page_len.name, (long long)i, (int)last[i],
                         (long long)p->page_size);
            return -1;
        }
    }
    p->kv_indices = indices;
    p->kv_last_page_len = last;
    return 0;
}

/* Each request's packed [qo_len, kv_len] bits must fit inside mask. */
static int check_mask(attention_args *a, fi_attention_params *p)
{
    static const fi_dtype u8[] = {FI_DTYPE_U8};
    if (fi_arg_check_ndim(&a->mask, 1, NULL) < 0 || fi_arg_check_dtype(&a->mask, u8, 1) < 0 ||
        fi_arg_check_contiguous(&a->mask) < 0 ||
        check_index_array(&a->mask_indptr, p->num_requests + 1) < 0)
        return -1;
    if (check_indptr(&a->mask_indptr, a->mask.t.shape[0], "the length of the packed mask") < 0)
        return -1;
    const int32_t *mi = a->mask_indptr.t.data;
    for (int64_t b = 0; b < p->num_requests; b++) {
        int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
        int64_t kv_len = kv_len_of(p, b);
        int64_t need = (qo_len * kv_len + 7) / 8;
        if (need > (int64_t)a->mask.t.shape[0] - mi[b]) {
            PyErr_Format(PyExc_ValueError,
                         "%s: request %lld needs %lld packed bytes (qo_len %lld x kv_len "
                         "%lld bits) from offset %d but the mask has %lld bytes",
                         a->mask.name, (long long)b, (long long)need, (long long)qo_len,
                         (long long)kv_len, (int)mi[b], (long long)a->mask.t.shape[0]);
            return -1;
        }
    }
    p->mask = a->mask.t.data;
    p->mask_indptr = mi;
    return 0;
}

static int check_q_out(attention_args *a, fi_attention_params *p)
{
    if (fi_arg_check_ndim(&a->q, 3, NULL) < 0 || check_last_dim_contiguous(&a->q) < 0 ||
        fi_arg_check_dtype(&a->q, q_kinds, 5) < 0)
        return -1;
    int fp4 = a->k_sf.obj != NULL, vd = a->v.t.ndim - 1;
    int64_t d = a->q.t.shape[2], dv = vd >= 0 ? a->v.t.shape[vd] * (fp4 ? 2 : 1) : d;
    int kd = a->k.t.ndim - 1; /* k's rows are q's (v's may be narrower) */
    if (kd >= 0 && fi_arg_check_dim(&a->k, kd, fp4 ? "head_dim / 2 (NVFP4 bytes)" : "head_dim",
                                    fp4 ? d / 2 : d) < 0)
        return -1;
    if (check_head_dims("q", d, dv) < 0)
        return -1;
    p->head_dim = d;
    p->head_dim_vo = dv;
    p->num_qo_heads = a->q.t.shape[1];
    p->q = a->q.t.data;
    p->q_dtype = a->q.t.dtype;
    p->q_stride_n = a->q.t.stride[0];
    p->q_stride_h = a->q.t.stride[1];
    static const char *const dim_names[3] = {"rows", "heads", "head_dim_vo"};
    int64_t out_shape[3] = {a->q.t.shape[0], a->q.t.shape[1], dv};
    if (fi_arg_check_ndim(&a->out, 3, NULL) < 0 || check_last_dim_contiguous(&a->out) < 0)
        return -1;
    for (int i = a->o_indptr.obj ? 1 : 0; i < 3; i++) /* o_indptr: out has its own rows */
        if (fi_arg_check_dim(&a->out, i, dim_names[i], out_shape[i]) < 0)
            return -1;
    if (fi_arg_check_dtype(&a->out, float_kinds, 3) < 0)
        return -1;
    p->o = a->out.t.data;
    p->o_dtype = a->out.t.dtype;
    p->o_stride_n = a->out.t.stride[0];
    p->o_stride_h = a->out.t.stride[1];
    if (a->lse.obj) {
        if (fi_arg_check_ndim(&a->lse, 2, NULL) < 0 ||
            fi_arg_check_dtype(&a->lse, float32_kind, 1) < 0 ||
            fi_arg_check_dim(&a->lse, 0, "rows", a->q.t.shape[0]) < 0 ||
            fi_arg_check_dim(&a->lse, 1, "heads", a->q.t.shape[1]) < 0)
            return -1;
        p->lse = a->lse.t.data;
        p->lse_stride_n = a->lse.t.stride[0];
        p->lse_stride_h = a->lse.t.stride[1];
    }
    if (check_index_array(&a->qo_indptr, -1) < 0 ||
        check_indptr(&a->qo_indptr, a->q.t.shape[0], "the number of query rows") < 0)
        return -1;
    p->num_requests = a->qo_indptr.t.shape[0] - 1;
    p->qo_indptr = a->qo_indptr.t.data;
    return 0;
}

/* o_indptr: request b's output rows are o_indptr[b] .. + qo_len(b) of out. */
static int check_o_indptr(attention_args *a, fi_attention_params *p)
{
    if (check_index_array(&a->o_indptr, p->num_requests + 1) < 0)
        return -1;
    const int32_t *oi = a->o_indptr.t.data;
    for (int64_t b = 0; b < p->num_requests; b++) {
        int64_t qo_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
        if (oi[b] < 0 || oi[b] + qo_len > a->out.t.shape[0]) {
            PyErr_Format(PyExc_ValueError,
                         "%s[%lld] is %d: request %lld's %lld output rows do not fit the %lld "
                         "rows of out",
                         a->o_indptr.name, (long long)b, (int)oi[b], (long long)b,
                         (long long)qo_len, (long long)a->out.t.shape[0]);
            return -1;
        }
    }
    p->o_indptr = oi;
    return 0;
}

/* sinks: float32 [num_qo_heads], one logit per query head. */
static int check_sinks(attention_args *a, fi_attention_params *p)
{
    int64_t want[1] = {p->num_qo_heads};
    if (fi_arg_check_dtype(&a->sinks, float32_kind, 1) < 0 ||
        fi_arg_check_shape(&a->sinks, want, 1) < 0 || fi_arg_check_contiguous(&a->sinks) < 0)
        return -1;
    p->sinks = a->sinks.t.data;
    return 0;
}

/* Per-head FP8 scales: float32 [heads] (or [1], one for all), contiguous. */
static int check_head_scale(fi_arg *a, int64_t heads, const float **out, int64_t *step)
{
    if (!a->obj)
        return 0;
    if (fi_arg_check_dtype(a, float32_kind, 1) < 0 || fi_arg_check_ndim(a, 1, "[heads]") < 0 ||
        fi_arg_check_contiguous(a) < 0)
        return -1;
    if (a->t.shape[0] != heads && a->t.shape[0] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: %lld scales; accepted: one per head (%lld) or one",
                     a->name, (long long)a->t.shape[0], (long long)heads);
        return -1;
    }
    *out = a->t.data;
    *step = a->t.shape[0] == heads ? 1 : 0;
    return 0;
}

/* PyErr_Format has no %g, so the number is printed here. */
static int scalar_error(const char *name, double value, const char *accepted)
{
    char text[40];
    snprintf(text, sizeof(text), "%g", value);
    PyErr_Format(PyExc_ValueError, "%s: %s is not accepted; accepted: %s", name, text, accepted);
    return -1;
}

/* The layout and position encoding by name, the numbers finite and in range; p and *hnd
 * (the layout is HND) get them as the kernel takes them. */
static int check_settings(const attention_settings *s, fi_attention_params *p, int *hnd)
{
    int layout = check_name("kv_layout", s->kv_layout, kv_layouts, 2);
    int mode = check_name("pos_encoding_mode", s->pos_encoding_mode, pos_encoding_modes, 3);
    if (layout < 0 || mode < 0)
        return -1;
    *hnd = layout == 1;
    p->pos_encoding = (fi_pos_encoding)mode;
    if (!(s->logits_soft_cap >= 0.0) || isinf(s->logits_soft_cap))
        return scalar_error("logits_soft_cap", s->logits_soft_cap,
                            "a finite value >= 0 (0 or None: off)");
    if (isinf(s->sm_scale))
        return scalar_error("sm_scale", s->sm_scale, "a finite number");
    if (!isfinite(s->v_scale))
        return scalar_error("v_scale", s->v_scale, "a finite number");
    if (!(s->rope_scale > 0.0) || isinf(s->rope_scale))
        return scalar_error("rope_scale", s->rope_scale, "a finite number > 0");
    if (!(s->rope_theta > 0.0) || isinf(s->rope_theta))
        return scalar_error("rope_theta", s->rope_theta, "a finite number > 0");
    p->causal = s->causal;
    p->kv_chunk = s->kv_chunk < 0 ? -1 : s->kv_chunk;
    p->window_left = s->window_left < 0 ? -1 : s->window_left;
    p->logits_soft_cap = (float)s->logits_soft_cap;
    p->sm_scale = (float)s->sm_scale;
    p->v_scale = (float)s->v_scale;
    p->rope_scale = (float)s->rope_scale;
    p->rope_theta = (float)s->rope_theta;
    return 0;
}

/* Every check, then p filled from the arguments (index arrays read where t.data points). */
static int check_all(attention_args *a, const attention_settings *s, fi_attention_params *p)
{
    memset(p, 0, sizeof(*p));
    p->paged = a->kv_indices.obj != NULL;
    int hnd = 0;
    if (check_settings(s, p, &hnd) < 0 || check_q_out(a, p) < 0 || check_kv(a, p, hnd) < 0)
        return -1;
    p->kv_indptr = a->kv_indptr.t.data;
    if ((a->mask.obj && check_mask(a, p) < 0) || (a->o_indptr.obj && check_o_indptr(a, p) < 0) ||
        (a->sinks.obj && check_sinks(a, p) < 0) ||
        check_head_scale(&a->q_head_scale, p->num_qo_heads, &p->q_head_scale,
                         &p->q_head_scale_step) < 0 ||
        check_head_scale(&a->k_head_scale, p->num_kv_heads, &p->k_head_scale,
                         &p->k_head_scale_step) < 0 ||
        check_head_scale(&a->v_head_scale, p->num_kv_heads, &p->v_head_scale,
                         &p->v_head_scale_step) < 0)
        return -1;
    if (isnan(s->sm_scale))
        p->sm_scale = 1.0f / sqrtf((float)p->head_dim);
    return 0;
}

#ifdef FI_WITH_CUDA
#define NUM_INDEX_ARRAYS 7

/* CUDA tensors: the index arrays are checked on the host exactly as on the CPU (a bad
 * page index must not reach the kernel), then the kernel is launched on the given
 * stream with the device arrays. The host arrays are the CPU tensors a plan() keeps
 * (host_index, same order as NUM_INDEX_ARRAYS) when given, else device-to-host
 * copies; those synchronise the stream, so under CUDA graph capture every index
 * array must come with its host copy. */

/* The CPU int32 twin of a device index array, or NULL (with no error) when t is not one. */
static int32_t *host_twin(PyObject *t, const fi_arg *device_array)
{
    fi_tensor h;
    if (!t || t == Py_None || !fi_is_tensor(t) || fi_tensor_from_py(t, &h) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (h.device_type != FI_DEVICE_CPU || h.dtype != FI_DTYPE_I32 || h.ndim != 1 ||
        !fi_tensor_is_contiguous(&h) || device_array->t.ndim != 1 ||
        h.shape[0] != device_array->t.shape[0])
        return NULL;
    return h.data;
}

static PyObject *attention_cuda(attention_args *a, const attention_settings *s,
                                PyObject *stream_obj, PyObject *host_index)
{
    void *stream = NULL;
    if (stream_obj != Py_None) {
        if (!PyLong_Check(stream_obj)) {
            PyErr_Format(PyExc_TypeError,
                         "stream: expected an int (torch.cuda.Stream.cuda_stream), got %.200s",
                         Py_TYPE(stream_obj)->tp_name);
            return NULL;
        }
        stream = PyLong_AsVoidPtr(stream_obj);
        if (!stream && PyErr_Occurred())
            return NULL;
    }
    int device = a->q.t.device_index, capturing = 0;
    if (fi_cuda_stream_capturing(device, stream, &capturing) != 0) {
        PyErr_Format(PyExc_RuntimeError, "attention: %s", fi_cuda_last_error());
        return NULL;
    }
    fi_arg *idx[NUM_INDEX_ARRAYS] = {&a->qo_indptr,        &a->kv_indptr,   &a->kv_indices,
                                     &a->kv_last_page_len, &a->mask_indptr, &a->v_indptr,
                                     &a->o_indptr};
    void *device_data[NUM_INDEX_ARRAYS] = {NULL};
    int32_t *host[NUM_INDEX_ARRAYS] = {NULL};
    PyObject *result = NULL;
    int with_twins = PyTuple_Check(host_index) && PyTuple_GET_SIZE(host_index) == NUM_INDEX_ARRAYS;
    for (int i = 0; i < NUM_INDEX_ARRAYS; i++) {
        if (!idx[i]->obj)
            continue;
        if (check_index_array(idx[i], -1) < 0)
            goto done;
        device_data[i] = idx[i]->t.data;
        int32_t *twin = with_twins ? host_twin(PyTuple_GET_ITEM(host_index, i), idx[i]) : NULL;
        if (!twin && capturing) {
            PyErr_Format(PyExc_RuntimeError,
                         "attention: the stream is capturing a CUDA graph and %s has no host "
                         "copy to check; call plan() before capturing and run() inside it",
                         idx[i]->name);
            goto done;
        }
        const int32_t *on_host = twin ? twin : fi_arg_int32_on_host(idx[i], stream, &host[i]);
        if (!on_host)
            goto done;
        idx[i]->t.data = (void *)on_host;
    }
    fi_attention_params p;
    if (check_all(a, s, &p) < 0)
        goto done;
    if (p.head_dim_vo != p.head_dim || p.head_dim > 256) {
        PyErr_Format(PyExc_ValueError,
                     "attention: head_dim %lld with head_dim_vo %lld runs on CPU tensors only; "
                     "the CUDA kernel takes 64, 128, 256 (q, k and v alike)",
                     (long long)p.head_dim, (long long)p.head_dim_vo);
        goto done;
    }
    /* Planning bounds from the checked host copies. */
    p.device = device;
    p.total_qo_rows = a->q.t.shape[0];
    for (int64_t b = 0; b < p.num_requests; b++) {
        int64_t qo_len = (int64_t)p.qo_indptr[b + 1] - p.qo_indptr[b];
        int64_t kv_len = kv_len_of(&p, b);
        if (qo_len > p.max_qo_len)
            p.max_qo_len = qo_len;
        if (kv_len > p.max_kv_len)
            p.max_kv_len = kv_len;
    }
    p.qo_indptr = device_data[0];
    p.kv_indptr = device_data[1];
    p.kv_indices = device_data[2];
    p.kv_last_page_len = device_data[3];
    p.mask_indptr = device_data[4];
    p.v_indptr = device_data[5];
    p.o_indptr = device_data[6];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_attention_cuda(&p, stream);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "attention: %s", fi_cuda_last_error());
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < NUM_INDEX_ARRAYS; i++) {
        if (device_data[i])
            idx[i]->t.data = device_data[i];
        PyMem_Free(host[i]);
    }
    return result;
}
#endif

PyDoc_STRVAR(attention_doc,
             "attention(q, k, v, out, lse, qo_indptr, kv_indptr, kv_indices=None,\n"
             "          kv_last_page_len=None, mask=None, mask_indptr=None, kv_layout='NHD',\n"
             "          causal=False, window_left=-1, logits_soft_cap=0.0, sm_scale=nan,\n"
             "          v_scale=1.0, pos_encoding_mode='NONE', rope_scale=1.0,\n"
             "          rope_theta=1e4, num_threads=1, stream=None, host_index=None,\n"
             "          v_indptr=None, o_indptr=None, sinks=None, k_sf=None, v_sf=None,\n"
             "          kv_chunk=0, q_head_scale=None, k_head_scale=None, v_head_scale=None)\n"
             "--\n\n"
             "Batched attention, written into out (and lse when given). CPU tensors, or\n"
             "(built with CUDA kernels) CUDA tensors all on one device, launched on stream\n"
             "(the integer torch.cuda.current_stream().cuda_stream; None: default stream).\n"
             "q [total_qo, Hq, D], out [total_qo, Hq, DV]; k/v ragged [total_kv, Hkv, D / DV]\n"
             "(NHD) or paged [num_pages, page_size, Hkv, D / DV] when kv_indices is given;\n"
             "(D, DV) one of HEAD_DIMS; int32 indptrs; mask: uint8 bits (little-endian) per\n"
             "request from byte mask_indptr[b]. pos_encoding_mode: POS_ENCODING_MODES.\n"
             "sm_scale nan means 1/sqrt(D); it must already include q and k scales.\n"
             "v_indptr (ragged) / o_indptr: first row of request b in v / out.\n"
             "sinks: float32 [Hq] extra logits. k_sf/v_sf: E4M3 scales per 16 elements of\n"
             "uint8 NVFP4 k/v (last dim D/2). q/k/v_head_scale: float32 per-head FP8 scales\n"
             "([Hq] / [Hkv] / [Hkv], or [1]). kv_chunk: keys per KV split (0 the kernel's\n"
             "choice, -1 none; fixed, a request's result does not depend on its batch).\n"
             "host_index: CPU int32 twins of (qo_indptr, kv_indptr, kv_indices,\n"
             "kv_last_page_len, mask_indptr, v_indptr, o_indptr) for CUDA tensors: checked\n"
             "instead of reading the device arrays back, which keeps run() capturable.");

/* One call's arguments as fi_args_parse fills them from attention_table. */
typedef struct {
    attention_args a;
    attention_settings s;
    PyObject *stream, *host_index;
} attention_call;

#define AT(field) offsetof(attention_call, field)
static const fi_argspec attention_table[] = {
    {"q", AT(a.q), FI_ARG_TENSOR, 1},
    {"k", AT(a.k), FI_ARG_TENSOR, 1},
    {"v", AT(a.v), FI_ARG_TENSOR, 1},
    {"out", AT(a.out), FI_ARG_TENSOR, 1},
    {"lse", AT(a.lse), FI_ARG_TENSOR, 1},
    {"qo_indptr", AT(a.qo_indptr), FI_ARG_TENSOR, 1},
    {"kv_indptr", AT(a.kv_indptr), FI_ARG_TENSOR, 1},
    {"kv_indices", AT(a.kv_indices), FI_ARG_TENSOR, 0},
    {"kv_last_page_len", AT(a.kv_last_page_len), FI_ARG_TENSOR, 0},
    {"mask", AT(a.mask), FI_ARG_TENSOR, 0},
    {"mask_indptr", AT(a.mask_indptr), FI_ARG_TENSOR, 0},
    {"kv_layout", AT(s.kv_layout), FI_ARG_STR, 0},
    {"causal", AT(s.causal), FI_ARG_BOOL, 0},
    {"window_left", AT(s.window_left), FI_ARG_INT64, 0},
    {"logits_soft_cap", AT(s.logits_soft_cap), FI_ARG_DOUBLE, 0},
    {"sm_scale", AT(s.sm_scale), FI_ARG_DOUBLE, 0},
    {"v_scale", AT(s.v_scale), FI_ARG_DOUBLE, 0},
    {"pos_encoding_mode", AT(s.pos_encoding_mode), FI_ARG_STR, 0},
    {"rope_scale", AT(s.rope_scale), FI_ARG_DOUBLE, 0},
    {"rope_theta", AT(s.rope_theta), FI_ARG_DOUBLE, 0},
    {"num_threads", AT(s.num_threads), FI_ARG_INT, 0},
    {"stream", AT(stream), FI_ARG_OBJECT, 0},
    {"host_index", AT(host_index), FI_ARG_OBJECT, 0},
    {"v_indptr", AT(a.v_indptr), FI_ARG_TENSOR, 0},
    {"o_indptr", AT(a.o_indptr), FI_ARG_TENSOR, 0},
    {"sinks", AT(a.sinks), FI_ARG_TENSOR, 0},
    {"k_sf", AT(a.k_sf), FI_ARG_TENSOR, 0},
    {"v_sf", AT(a.v_sf), FI_ARG_TENSOR, 0},
    {"kv_chunk", AT(s.kv_chunk), FI_ARG_INT64, 0},
    {"q_head_scale", AT(a.q_head_scale), FI_ARG_TENSOR, 0},
    {"k_head_scale", AT(a.k_head_scale), FI_ARG_TENSOR, 0},
    {"v_head_scale", AT(a.v_head_scale), FI_ARG_TENSOR, 0},
};
#undef AT

/* Arguments given only together: both or neither. */
static int check_pairs(const attention_args *a)
{
    if ((a->k_sf.obj != NULL) != (a->v_sf.obj != NULL)) {
        PyErr_SetString(PyExc_ValueError, "k_sf and v_sf: give both (NVFP4 KV) or neither");
        return -1;
    }
    if ((a->kv_indices.obj != NULL) != (a->kv_last_page_len.obj != NULL)) {
        PyErr_SetString(PyExc_ValueError,
                        "kv_indices and kv_last_page_len: give both (paged KV) or neither "
                        "(ragged KV)");
        return -1;
    }
    if ((a->mask.obj != NULL) != (a->mask_indptr.obj != NULL)) {
        PyErr_SetString(PyExc_ValueError, "mask and mask_indptr: give both or neither");
        return -1;
    }
    return 0;
}

static PyObject *attention(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    (void)module;
    attention_call c;
    memset(&c, 0, sizeof(c));
    c.s = (attention_settings){.kv_layout = "NHD",
                               .pos_encoding_mode = "NONE",
                               .window_left = -1,
                               .sm_scale = NAN,
                               .v_scale = 1.0,
                               .rope_scale = 1.0,
                               .rope_theta = 1e4,
                               .num_threads = 1};
    c.stream = c.host_index = Py_None;
    if (fi_args_parse("attention", attention_table, FI_ARGS_COUNT(attention_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    attention_args *a = &c.a;
    if (check_pairs(a) < 0)
        return NULL;
    int paged = a->kv_indices.obj != NULL;
    a->k.name = paged ? "k_cache" : "k";
    a->v.name = paged ? "v_cache" : "v";
    a->mask.name = "custom_mask";

    fi_arg *all[] = {&a->q,
                     &a->k,
                     &a->v,
                     &a->out,
                     &a->lse,
                     &a->qo_indptr,
                     &a->kv_indptr,
                     &a->kv_indices,
                     &a->kv_last_page_len,
                     &a->mask,
                     &a->mask_indptr,
                     &a->v_indptr,
                     &a->o_indptr,
                     &a->sinks,
                     &a->k_sf,
                     &a->v_sf,
                     &a->q_head_scale,
                     &a->k_head_scale,
                     &a->v_head_scale};
    fi_arg *present[sizeof(all) / sizeof(all[0])];
    int n = 0;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (!all[i]->obj)
            continue;
        if (fi_arg_read(all[i]) < 0)
            return NULL;
        present[n++] = all[i];
    }
    if (fi_args_check_devices("attention", present, n) < 0)
        return NULL;
#ifdef FI_WITH_CUDA
    if (a->q.t.device_type == FI_DEVICE_CUDA)
        return attention_cuda(a, &c.s, c.stream, c.host_index);
#endif
    fi_attention_params p;
    if (check_all(a, &c.s, &p) < 0)
        return NULL;
    int num_threads = c.s.num_threads < 1 ? 1 : c.s.num_threads;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_attention_cpu(&p, num_threads);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(check_attention_plan_doc,
             "check_attention_plan(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,\n"
             "                     kv_layout, pos_encoding_mode)\n--\n\n"
             "Raises the ValueError attention() would for these settings (a plan's checks);\n"
             "None when they are accepted.");

typedef struct {
    long long num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo;
    const char *kv_layout, *pos_encoding_mode;
} plan_settings;

#define PS(field) offsetof(plan_settings, field)
static const fi_argspec plan_table[] = {
    {"num_qo_heads", PS(num_qo_heads), FI_ARG_INT64, 1},
    {"num_kv_heads", PS(num_kv_heads), FI_ARG_INT64, 1},
    {"head_dim_qk", PS(head_dim_qk), FI_ARG_INT64, 1},
    {"head_dim_vo", PS(head_dim_vo), FI_ARG_INT64, 1},
    {"kv_layout", PS(kv_layout), FI_ARG_STR, 1},
    {"pos_encoding_mode", PS(pos_encoding_mode), FI_ARG_STR, 1},
};
#undef PS

static PyObject *check_attention_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    (void)module;
    plan_settings ps;
    if (fi_args_parse("check_attention_plan", plan_table, FI_ARGS_COUNT(plan_table), &ps, args,
                      nargs, kwnames) < 0)
        return NULL;
    if (!heads_divide(ps.num_qo_heads, ps.num_kv_heads))
        return PyErr_Format(PyExc_ValueError,
                            "num_kv_heads: %lld does not divide num_qo_heads %lld; accepted: a "
                            "divisor of num_qo_heads",
                            ps.num_kv_heads, ps.num_qo_heads);
    if (check_head_dims(ps.head_dim_qk == ps.head_dim_vo ? "head_dim" : "head_dim_qk",
                        ps.head_dim_qk, ps.head_dim_vo) < 0 ||
        check_name("kv_layout", ps.kv_layout, kv_layouts, 2) < 0 ||
        check_name("pos_encoding_mode", ps.pos_encoding_mode, pos_encoding_modes, 3) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef attention_methods[] = {
    {"attention", (PyCFunction)(void (*)(void))attention, METH_FASTCALL | METH_KEYWORDS,
     attention_doc},
    {"check_attention_plan", (PyCFunction)(void (*)(void))check_attention_plan,
     METH_FASTCALL | METH_KEYWORDS, check_attention_plan_doc},
    {NULL, NULL, 0, NULL},
};

/* A tuple of the n strings. */
static PyObject *name_tuple(const char *const *names, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(names[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *head_dim_tuple(void)
{
    PyObject *t = PyTuple_New(NUM_HEAD_DIM_PAIRS);
    for (int i = 0; t && i < NUM_HEAD_DIM_PAIRS; i++) {
        PyObject *pair =
            Py_BuildValue("(LL)", (long long)head_dim_pairs[i][0], (long long)head_dim_pairs[i][1]);
        if (!pair) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, pair);
    }
    return t;
}

/* PyModule_AddObjectRef of a new reference (NULL: the error already set), released. */
static int add_owned(PyObject *module, const char *name, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

int fi_attention_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, attention_methods) < 0 ||
        add_owned(module, "KV_LAYOUTS", name_tuple(kv_layouts, 2)) < 0 ||
        add_owned(module, "POS_ENCODING_MODES", name_tuple(pos_encoding_modes, 3)) < 0 ||
        add_owned(module, "HEAD_DIMS", head_dim_tuple()) < 0)
        return -1;
    return 0;
}
