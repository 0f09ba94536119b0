/* ops_attention.c: argument checking for the attention kernels, then the call with the
 * GIL released. Everything the kernel will index is proven in bounds here first. */
#include "ops_attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "tensor.h"

static const fi_dtype float_kinds[] = {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F32};
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
    fi_arg v_indptr, o_indptr, sinks, k_sf, v_sf;
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
            fi_arg_check_dim(sf[i], nd - 1, "scales per row", p->head_dim / 16) < 0)
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
    for (int i = 0; i < nd; i++) {
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
                         fp4 ? p->head_dim / 2 : p->head_dim) < 0)
        return -1;
    if (fp4 && check_fp4_scales(a, p, paged ? 0 : -1, tok, head) < 0)
        return -1;
    int64_t hkv = a->k.t.shape[head];
    if (hkv < 1 || p->num_qo_heads % hkv != 0) {
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
        fi_arg_check_dtype(&a->q, float_kinds, 3) < 0)
        return -1;
    int64_t d = a->q.t.shape[2];
    if (d != 64 && d != 128 && d != 256) {
        PyErr_Format(PyExc_ValueError, "q: head_dim %lld is not supported; accepted: 64, 128, 256",
                     (long long)d);
        return -1;
    }
    p->head_dim = d;
    p->num_qo_heads = a->q.t.shape[1];
    p->q = a->q.t.data;
    p->q_dtype = a->q.t.dtype;
    p->q_stride_n = a->q.t.stride[0];
    p->q_stride_h = a->q.t.stride[1];
    static const char *const dim_names[3] = {"rows", "heads", "head_dim"};
    if (fi_arg_check_ndim(&a->out, 3, NULL) < 0 || check_last_dim_contiguous(&a->out) < 0)
        return -1;
    for (int i = a->o_indptr.obj ? 1 : 0; i < 3; i++) /* o_indptr: out has its own rows */
        if (fi_arg_check_dim(&a->out, i, dim_names[i], a->q.t.shape[i]) < 0)
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
    const char *layout = s->kv_layout, *pos_mode = s->pos_encoding_mode;
    if (strcmp(layout, "NHD") == 0 || strcmp(layout, "HND") == 0) {
        *hnd = layout[0] == 'H';
    } else {
        PyErr_Format(PyExc_ValueError,
                     "kv_layout: '%.50s' is not supported; accepted: "
                     "'NHD', 'HND'",
                     layout);
        return -1;
    }
    if (strcmp(pos_mode, "NONE") == 0) {
        p->pos_encoding = FI_POS_ENCODING_NONE;
    } else if (strcmp(pos_mode, "ROPE_LLAMA") == 0) {
        p->pos_encoding = FI_POS_ENCODING_ROPE_LLAMA;
    } else {
        PyErr_Format(PyExc_ValueError,
                     "pos_encoding_mode: '%.50s' is not supported; accepted: 'NONE', "
                     "'ROPE_LLAMA'",
                     pos_mode);
        return -1;
    }
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
        (a->sinks.obj && check_sinks(a, p) < 0))
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
             "          kv_chunk=0)\n--\n\n"
             "Batched attention, written into out (and lse when given). CPU tensors, or\n"
             "(built with CUDA kernels) CUDA tensors all on one device, launched on stream\n"
             "(the integer torch.cuda.current_stream().cuda_stream; None: default stream).\n"
             "q/out [total_qo, Hq, D]; k/v ragged [total_kv, Hkv, D] (NHD) or paged\n"
             "[num_pages, page_size, Hkv, D] when kv_indices is given; int32 indptrs;\n"
             "mask: uint8 bits (little-endian) per request from byte mask_indptr[b].\n"
             "sm_scale nan means 1/sqrt(D); it must already include q and k scales.\n"
             "v_indptr (ragged) / o_indptr: first row of request b in v / out.\n"
             "sinks: float32 [Hq] extra logits. k_sf/v_sf: E4M3 scales per 16 elements of\n"
             "uint8 NVFP4 k/v (last dim D/2). kv_chunk: CUDA keys per split (0 auto, -1 none).\n"
             "host_index: CPU int32 twins of (qo_indptr, kv_indptr, kv_indices,\n"
             "kv_last_page_len, mask_indptr, v_indptr, o_indptr) for CUDA tensors: checked\n"
             "instead of reading the device arrays back, which keeps run() capturable.");

static PyObject *attention(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"q",          "k",           "v",
                             "out",        "lse",         "qo_indptr",
                             "kv_indptr",  "kv_indices",  "kv_last_page_len",
                             "mask",       "mask_indptr", "kv_layout",
                             "causal",     "window_left", "logits_soft_cap",
                             "sm_scale",   "v_scale",     "pos_encoding_mode",
                             "rope_scale", "rope_theta",  "num_threads",
                             "stream",     "host_index",  "v_indptr",
                             "o_indptr",   "sinks",       "k_sf",
                             "v_sf",       "kv_chunk",    NULL};
    attention_args a;
    memset(&a, 0, sizeof(a));
    attention_settings s = {.kv_layout = "NHD",
                            .pos_encoding_mode = "NONE",
                            .window_left = -1,
                            .sm_scale = NAN,
                            .v_scale = 1.0,
                            .rope_scale = 1.0,
                            .rope_theta = 1e4,
                            .num_threads = 1};
    PyObject *kv_indices = Py_None, *last_page_len = Py_None, *mask = Py_None,
             *mask_indptr = Py_None, *lse = Py_None, *stream_obj = Py_None, *host_index = Py_None;
    PyObject *v_indptr = Py_None, *o_indptr = Py_None, *sinks = Py_None, *k_sf = Py_None,
             *v_sf = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOOOOOO|OOOOspLdddsddiOOOOOOOL", kwlist, &a.q.obj, &a.k.obj, &a.v.obj,
            &a.out.obj, &lse, &a.qo_indptr.obj, &a.kv_indptr.obj, &kv_indices, &last_page_len,
            &mask, &mask_indptr, &s.kv_layout, &s.causal, &s.window_left, &s.logits_soft_cap,
            &s.sm_scale, &s.v_scale, &s.pos_encoding_mode, &s.rope_scale, &s.rope_theta,
            &s.num_threads, &stream_obj, &host_index, &v_indptr, &o_indptr, &sinks, &k_sf, &v_sf,
            &s.kv_chunk))
        return NULL;
    if ((k_sf != Py_None) != (v_sf != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "k_sf and v_sf: give both (NVFP4 KV) or neither");
        return NULL;
    }
    int paged = kv_indices != Py_None;
    if (paged != (last_page_len != Py_None)) {
        PyErr_SetString(PyExc_ValueError,
                        "kv_indices and kv_last_page_len: give both (paged KV) or neither "
                        "(ragged KV)");
        return NULL;
    }
    if ((mask != Py_None) != (mask_indptr != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "mask and mask_indptr: give both or neither");
        return NULL;
    }
    a.q.name = "q";
    a.k.name = paged ? "k_cache" : "k";
    a.v.name = paged ? "v_cache" : "v";
    a.out.name = "out";
    a.lse.name = "lse";
    a.qo_indptr.name = "qo_indptr";
    a.kv_indptr.name = "kv_indptr";
    a.kv_indices.name = "kv_indices";
    a.kv_last_page_len.name = "kv_last_page_len";
    a.mask.name = "custom_mask";
    a.mask_indptr.name = "mask_indptr";
    a.v_indptr.name = "v_indptr";
    a.o_indptr.name = "o_indptr";
    a.sinks.name = "sinks";
    a.k_sf.name = "k_sf";
    a.v_sf.name = "v_sf";
    a.lse.obj = lse == Py_None ? NULL : lse;
    a.kv_indices.obj = paged ? kv_indices : NULL;
    a.kv_last_page_len.obj = paged ? last_page_len : NULL;
    a.mask.obj = mask == Py_None ? NULL : mask;
    a.mask_indptr.obj = mask == Py_None ? NULL : mask_indptr;
    a.v_indptr.obj = v_indptr == Py_None ? NULL : v_indptr;
    a.o_indptr.obj = o_indptr == Py_None ? NULL : o_indptr;
    a.sinks.obj = sinks == Py_None ? NULL : sinks;
    a.k_sf.obj = k_sf == Py_None ? NULL : k_sf;
    a.v_sf.obj = v_sf == Py_None ? NULL : v_sf;

    fi_arg *all[] = {&a.q,         &a.k,           &a.v,
                     &a.out,       &a.lse,         &a.qo_indptr,
                     &a.kv_indptr, &a.kv_indices,  &a.kv_last_page_len,
                     &a.mask,      &a.mask_indptr, &a.v_indptr,
                     &a.o_indptr,  &a.sinks,       &a.k_sf,
                     &a.v_sf};
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
    if (a.q.t.device_type == FI_DEVICE_CUDA)
        return attention_cuda(&a, &s, stream_obj, host_index);
#endif
    fi_attention_params p;
    if (check_all(&a, &s, &p) < 0)
        return NULL;
    int num_threads = s.num_threads < 1 ? 1 : s.num_threads;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_attention_cpu(&p, num_threads);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef attention_methods[] = {
    {"attention", (PyCFunction)(void (*)(void))attention, METH_VARARGS | METH_KEYWORDS,
     attention_doc},
    {NULL, NULL, 0, NULL},
};

int fi_attention_exec(PyObject *module) { return PyModule_AddFunctions(module, attention_methods); }
