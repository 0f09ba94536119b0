/* pages.c: the one table of what each API's page tables are (ours and those of
 * flashinfer-python 0.7.2.post1), and the page sets computed from them
 * (docs/flight-recorder.md, "Page-aware capture"). */
#include "pages.h"

#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* PLAN: the call's page tables are remembered for the calls on its object that follow;
 * RUN: the paged tensors are read through the last plan's tables; CALL: through the
 * call's own tables. */
enum { ROLE_PLAN, ROLE_RUN, ROLE_CALL };

/* How a CALL's page size comes from its first paged tensor, to trim block_tables rows to
 * the pages seq_lens covers: KV caches by their layout parameter; MLA caches [P, PS, D]
 * or [P, 1, PS, D]. PS_NONE: rows are kept whole. */
enum { PS_NONE, PS_KV, PS_MLA };

/* One page table of a call: CSR (indptr, indices; a list of each per cascade level) or
 * dense (block_tables rows, trimmed to seq_lens); either or both may be given. */
typedef struct {
    const char *indptr, *indices, *block_tables, *seq_lens;
} table_params;

typedef struct {
    const char *param; /* a tensor, or a tuple/list of them (k and v), dim 0 the page */
    int slot;          /* which table: 0, or 1 for the second of a POD plan */
} paged_param;

struct fi_pages_api {
    const char *qualname; /* first: fi_api_table_find reads it */
    int role;
    table_params table[2];
    paged_param paged[4];
    const char *layout_param, *layout_default; /* CALL with PS_KV */
    int ps_kind;
    /* a parameter that, when passed and not None/0/False, means other page semantics
     * (a run-time page table, token-level sparse indices): the tensors are recorded whole */
    const char *unless;
};

/* Designated initializers: the fields an entry leaves out are NULL/0. */
#define PLAN(qn, ...)                                                                              \
    {                                                                                              \
        .qualname = qn, .role = ROLE_PLAN, .table = {__VA_ARGS__}                                  \
    }
#define RUN(qn, ...)                                                                               \
    {                                                                                              \
        .qualname = qn, .role = ROLE_RUN, .paged = {__VA_ARGS__}                                   \
    }
#define CSR(ip, ix) {.indptr = ip, .indices = ix}
#define CSR_OR_DENSE(ip, ix, bt, sl)                                                               \
    {.indptr = ip, .indices = ix, .block_tables = bt, .seq_lens = sl}
#define DENSE(bt, sl) {.block_tables = bt, .seq_lens = sl}
#define PAGED(p) {.param = p}
#define KV_SF PAGED("kv_cache_sf")

static const fi_pages_api TABLE[] = {
    /* batch wrappers: plan, then run on the same object */
    PLAN("BatchDecodeWithPagedKVCacheWrapper.plan",
         CSR_OR_DENSE("indptr", "indices", "block_tables", "seq_lens")),
    RUN("BatchDecodeWithPagedKVCacheWrapper.run", PAGED("paged_kv_cache"), KV_SF),
    PLAN("BatchPrefillWithPagedKVCacheWrapper.plan",
         CSR_OR_DENSE("paged_kv_indptr", "paged_kv_indices", "block_tables", "seq_lens")),
    RUN("BatchPrefillWithPagedKVCacheWrapper.run", PAGED("paged_kv_cache"), KV_SF),
    PLAN("BatchMLAPagedAttentionWrapper.plan",
         CSR_OR_DENSE("kv_indptr", "kv_indices", "block_tables", "seq_lens")),
    {.qualname = "BatchMLAPagedAttentionWrapper.run",
     .role = ROLE_RUN,
     .paged = {PAGED("ckv_cache"), PAGED("kpe_cache"), PAGED("kv_cache")},
     .unless = "page_table"},
    PLAN("BatchAttention.plan", CSR("kv_indptr", "kv_indices")),
    RUN("BatchAttention.run", PAGED("kv_cache"), KV_SF),
    PLAN("PODWithPagedKVCacheWrapper.plan", CSR("indptr", "indices")),
    RUN("PODWithPagedKVCacheWrapper.run", PAGED("paged_kv_cache_d")),
    PLAN("BatchPODWithPagedKVCacheWrapper.plan", CSR("kv_indptr_p", "kv_indices_p"),
         CSR("kv_indptr_d", "kv_indices_d")),
    RUN("BatchPODWithPagedKVCacheWrapper.run", PAGED("paged_kv_cache_p"),
        {.param = "paged_kv_cache_d", .slot = 1}),
    /* cascade: one CSR table per level, the union of their pages */
    PLAN("MultiLevelCascadeAttentionWrapper.plan",
         CSR("paged_kv_indptr_arr", "paged_kv_indices_arr")),
    RUN("MultiLevelCascadeAttentionWrapper.run", PAGED("paged_kv_cache")),
    PLAN("BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward",
         CSR("unique_kv_indptr", "unique_kv_indices")),
    RUN("BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward", PAGED("unique_kv_cache")),
    PLAN("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward",
         CSR("paged_kv_indptr", "paged_kv_indices")),
    RUN("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward", PAGED("unique_kv_cache")),
    /* functions with their own block tables */
    {.qualname = "trtllm_batch_decode_with_kv_cache",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache"), KV_SF},
     .layout_param = "kv_layout",
     .layout_default = "HND",
     .ps_kind = PS_KV},
    {.qualname = "trtllm_batch_context_with_kv_cache",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache"), KV_SF},
     .layout_param = "kv_layout",
     .layout_default = "HND",
     .ps_kind = PS_KV},
    {.qualname = "xqa_batch_decode_with_kv_cache",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache"), KV_SF},
     .layout_param = "kv_layout",
     .layout_default = "NHD",
     .ps_kind = PS_KV},
    {.qualname = "cudnn_batch_decode_with_kv_cache",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "actual_seq_lens_kv")},
     .paged = {PAGED("k_cache"), PAGED("v_cache")},
     .layout_default = "HND",
     .ps_kind = PS_KV},
    {.qualname = "trtllm_batch_decode_with_kv_cache_mla",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache")},
     .ps_kind = PS_MLA,
     .unless = "sparse_mla_top_k"},
    {.qualname = "trtllm_prefill_with_kv_cache_mla",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache")},
     .ps_kind = PS_MLA,
     .unless = "sparse_mla_top_k"},
    {.qualname = "xqa_batch_decode_with_kv_cache_mla",
     .role = ROLE_CALL,
     .table = {DENSE("block_tables", "seq_lens")},
     .paged = {PAGED("kv_cache")},
     .ps_kind = PS_MLA},
    /* appends write the pages of their CSR table */
    {.qualname = "append_paged_kv_cache",
     .role = ROLE_CALL,
     .table = {CSR("kv_indptr", "kv_indices")},
     .paged = {PAGED("paged_kv_cache")}},
    {.qualname = "append_paged_mla_kv_cache",
     .role = ROLE_CALL,
     .table = {CSR("kv_indptr", "kv_indices")},
     .paged = {PAGED("ckv_cache"), PAGED("kpe_cache")}},
};

#define TABLE_LEN (sizeof TABLE / sizeof TABLE[0])

const void *fi_api_table_find(PyObject *func, const void *table, size_t n, size_t size)
{
    PyObject *qn = PyObject_GetAttr(func, fi_names.qualname);
    const char *s = qn && PyUnicode_Check(qn) ? PyUnicode_AsUTF8(qn) : NULL;
    const void *found = NULL;
    for (size_t i = 0; s && i < n && !found; i++) {
        const char *entry = (const char *)table + i * size;
        if (strcmp(s, *(const char *const *)entry) == 0)
            found = entry;
    }
    Py_XDECREF(qn);
    PyErr_Clear();
    return found;
}

const fi_pages_api *fi_pages_api_of(PyObject *func)
{
    return fi_api_table_find(func, TABLE, TABLE_LEN, sizeof TABLE[0]);
}

int fi_pages_is_plan(const fi_pages_api *api) { return api->role == ROLE_PLAN; }

/* ------------------------------------------------------------ page sets */

void fi_page_set_free(fi_page_set *s)
{
    free(s->page);
    s->page = NULL;
    s->n = 0;
}

void fi_paged_free(fi_paged *p)
{
    for (int i = 0; i < p->n; i++) {
        fi_page_set_free(&p->item[i].pages);
        free(p->item[i].range);
        Py_CLEAR(p->item[i].packed);
    }
    free(p->item);
    p->item = NULL;
    p->n = 0;
}

const fi_page_set *fi_paged_find(const fi_paged *p, PyObject *tensor)
{
    for (int i = 0; p && i < p->n; i++)
        if (p->item[i].tensor == tensor)
            return &p->item[i].pages;
    return NULL;
}

PyObject *fi_pages_gather(PyObject *tensor, const fi_page_set *ps)
{
    PyObject *ids = PyList_New(ps->n);
    for (int64_t i = 0; ids && i < ps->n; i++) {
        PyObject *v = PyLong_FromLongLong(ps->page[i]);
        if (!v)
            Py_CLEAR(ids);
        else
            PyList_SET_ITEM(ids, i, v);
    }
    PyObject *torch = ids ? PyImport_ImportModule("torch") : NULL;
    PyObject *device = torch ? PyObject_GetAttr(tensor, fi_names.device) : NULL;
    PyObject *fn = device ? PyObject_GetAttrString(torch, "tensor") : NULL;
    PyObject *args = fn ? PyTuple_Pack(1, ids) : NULL;
    PyObject *kw =
        args ? Py_BuildValue("{sOsO}", "device", device, "dtype", fi_dtype_to_py(FI_DTYPE_I64))
             : NULL;
    PyObject *idx = kw ? PyObject_Call(fn, args, kw) : NULL;
    PyObject *g = idx ? PyObject_CallMethod(tensor, "index_select", "iO", 0, idx) : NULL;
    Py_XDECREF(ids);
    Py_XDECREF(torch);
    Py_XDECREF(device);
    Py_XDECREF(fn);
    Py_XDECREF(args);
    Py_XDECREF(kw);
    Py_XDECREF(idx);
    return g;
}

/* fi_pages_gather copied to the host: the pages' bytes one after another. A new
 * reference, NULL with an exception set. */
static PyObject *gather_to_host(PyObject *tensor, const fi_page_set *ps)
{
    PyObject *g = fi_pages_gather(tensor, ps);
    PyObject *host = g ? PyObject_CallMethodNoArgs(g, fi_names.cpu) : NULL;
    Py_XDECREF(g);
    return host;
}

/* The byte ranges of item's pages, and for a CUDA tensor its packed host bytes unless the
 * ranges are read on the device. */
static int make_keep(fi_paged_tensor *it, int device_ranges)
{
    fi_tensor t;
    int64_t pe;
    if (fi_tensor_from_py(it->tensor, &t) < 0 || !fi_pages_contiguous(&t, &pe) ||
        (t.device_type != FI_DEVICE_CPU && t.device_type != FI_DEVICE_CUDA))
        return -1;
    uint64_t isz = fi_dtype_size(t.dtype), step = (uint64_t)t.stride[0] * isz;
    it->range = malloc((size_t)(it->pages.n ? it->pages.n : 1) * sizeof(fi_byte_range));
    if (!it->range)
        return -1;
    for (int64_t i = 0; i < it->pages.n; i++)
        it->range[i] = (fi_byte_range){(uint64_t)it->pages.page[i] * step,
                                       (uint64_t)it->pages.page[i] * step + (uint64_t)pe * isz};
    it->keep = (fi_span_keep){it->range, (size_t)it->pages.n, NULL, it->pages.total,
                              it->pages.out_of_range};
    if (t.device_type == FI_DEVICE_CUDA && !device_ranges) {
        fi_tensor h;
        if (!(it->packed = gather_to_host(it->tensor, &it->pages)) ||
            fi_tensor_from_py(it->packed, &h) < 0)
            return -1;
        it->keep.packed = h.data;
    }
    return 0;
}

const fi_span_keep *fi_paged_keep(void *ctx, PyObject *tensor)
{
    fi_paged *p = ctx;
    for (int i = 0; p && i < p->n; i++) {
        fi_paged_tensor *it = &p->item[i];
        if (it->tensor != tensor)
            continue;
        if (it->keep_state == 0) {
            it->keep_state = make_keep(it, p->device_ranges) == 0 ? 1 : -1;
            if (it->keep_state < 0)
                PyErr_Clear();
        }
        return it->keep_state > 0 ? &it->keep : NULL;
    }
    return NULL;
}

int fi_pages_contiguous(const fi_tensor *t, int64_t *page_elems)
{
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 1; d--) {
        if (t->shape[d] != 1 && t->stride[d] != expect)
            return 0;
        expect *= t->shape[d];
    }
    *page_elems = expect;
    return t->ndim >= 1 && (t->shape[0] <= 1 || t->stride[0] >= expect);
}

/* Page ids gathered from tables: grown as needed, then sorted and made unique. */
typedef struct {
    int64_t *v;
    int64_t n, cap;
} ids;

static int ids_add(ids *s, int64_t v)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 256;
        int64_t *nv = realloc(s->v, (size_t)cap * sizeof(int64_t));
        if (!nv) {
            PyErr_NoMemory();
            return -1;
        }
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void ids_unique(ids *s)
{
    if (s->n < 2)
        return;
    qsort(s->v, (size_t)s->n, sizeof(int64_t), cmp_i64);
    int64_t k = 1;
    for (int64_t i = 1; i < s->n; i++)
        if (s->v[i] != s->v[k - 1])
            s->v[k++] = s->v[i];
    s->n = k;
}

/* ------------------------------------------------------- index tensors */

/* An integer tensor readable on the host: t describes it, *hold owns a host copy of a
 * CUDA tensor. 0 when obj is not such a tensor (its pages are then unknown), -1 on error. */
static int host_index(PyObject *obj, fi_tensor *t, PyObject **hold)
{
    *hold = NULL;
    if (!obj || !fi_is_tensor(obj))
        return 0;
    if (fi_tensor_meta_from_py(obj, t) < 0)
        return -1;
    if (t->device_type == FI_DEVICE_CUDA) {
        *hold = PyObject_CallMethodNoArgs(obj, fi_names.cpu);
        if (!*hold)
            return -1;
        obj = *hold;
    } else if (t->device_type != FI_DEVICE_CPU) {
        return 0;
    }
    if (fi_tensor_from_py(obj, t) < 0)
        return -1;
    switch (t->dtype) {
    case FI_DTYPE_I8:
    case FI_DTYPE_I16:
    case FI_DTYPE_I32:
    case FI_DTYPE_I64:
    case FI_DTYPE_U8:
    case FI_DTYPE_U16:
    case FI_DTYPE_U32:
        return 1;
    default:
        return 0;
    }
}

/* Element at the offset (in elements) off of an integer tensor. */
static int64_t int_at(const fi_tensor *t, int64_t off)
{
    const char *p = (const char *)t->data + off * (int64_t)fi_dtype_size(t->dtype);
    switch (t->dtype) {
    case FI_DTYPE_I8:
        return *(const int8_t *)p;
    case FI_DTYPE_I16:
        return *(const int16_t *)(const void *)p;
    case FI_DTYPE_I32:
        return *(const int32_t *)(const void *)p;
    case FI_DTYPE_I64:
        return *(const int64_t *)(const void *)p;
    case FI_DTYPE_U8:
        return *(const uint8_t *)p;
    case FI_DTYPE_U16:
        return *(const uint16_t *)(const void *)p;
    default:
        return *(const uint32_t *)(const void *)p;
    }
}

/* i-th element of a 1-D tensor. */
static int64_t at1(const fi_tensor *t, int64_t i) { return int_at(t, i * t->stride[0]); }

/* Pages of one CSR table: indices[indptr[b] .. indptr[b + 1]) for every request b, each
 * range clipped to the indices there are. 1 when added, 0 when unreadable, -1 on error. */
static int add_csr(ids *out, PyObject *indptr_obj, PyObject *indices_obj)
{
    fi_tensor ip, ix;
    PyObject *h1 = NULL, *h2 = NULL;
    int r = host_index(indptr_obj, &ip, &h1);
    if (r > 0)
        r = host_index(indices_obj, &ix, &h2);
    if (r > 0 && (ip.ndim != 1 || ix.ndim != 1))
        r = 0;
    int64_t n = r > 0 ? ix.shape[0] : 0;
    for (int64_t b = 0; r > 0 && b + 1 < ip.shape[0]; b++) {
        int64_t lo = at1(&ip, b), hi = at1(&ip, b + 1);
        for (int64_t i = lo < 0 ? 0 : lo; r > 0 && i < (hi > n ? n : hi); i++)
            if (ids_add(out, at1(&ix, i)) < 0)
                r = -1;
    }
    Py_XDECREF(h1);
    Py_XDECREF(h2);
    return r;
}

/* CSR tables given as one tensor each, or as lists of them (one per cascade level). */
static int add_csr_param(ids *out, PyObject *indptr, PyObject *indices)
{
    if (!(PyList_Check(indptr) || PyTuple_Check(indptr)))
        return add_csr(out, indptr, indices);
    if (!(PyList_Check(indices) || PyTuple_Check(indices)) ||
        PySequence_Size(indptr) != PySequence_Size(indices))
        return 0;
    int rc = 1;
    for (Py_ssize_t i = 0; rc > 0 && i < PySequence_Size(indptr); i++) {
        PyObject *a = PySequence_GetItem(indptr, i), *b = PySequence_GetItem(indices, i);
        rc = a && b ? add_csr(out, a, b) : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    return rc;
}

/* Element k, in row-major order, of an integer tensor of any shape. */
static int64_t nth(const fi_tensor *t, int64_t k)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (k % t->shape[d]) * t->stride[d];
        k /= t->shape[d];
    }
    return int_at(t, off);
}

/* Pages of a dense table: block_tables [B, M] or [B, 2, M] (K and V rows), each row cut
 * to the ceil(seq_lens[b] / page_size) pages it covers when seq_lens has one length per
 * row and page_size > 0; every entry otherwise. */
static int add_dense(ids *out, PyObject *bt_obj, PyObject *sl_obj, int64_t page_size)
{
    fi_tensor bt, sl;
    PyObject *h1 = NULL, *h2 = NULL;
    int r = host_index(bt_obj, &bt, &h1);
    int have_lens = r > 0 && sl_obj && sl_obj != Py_None ? host_index(sl_obj, &sl, &h2) : 0;
    if (have_lens < 0)
        r = -1;
    if (r > 0 && bt.ndim < 1)
        r = 0;
    int64_t numel = r > 0 ? fi_tensor_numel(&bt) : 0;
    int64_t width = numel > 0 ? bt.shape[bt.ndim - 1] : 1;
    int trim = have_lens > 0 && page_size > 0 && fi_tensor_numel(&sl) == bt.shape[0] &&
               (bt.ndim == 2 || (bt.ndim == 3 && bt.shape[1] == 2));
    int64_t per_row = numel > 0 ? numel / bt.shape[0] : 0;
    for (int64_t e = 0; r > 0 && e < numel; e++) {
        if (trim) {
            int64_t len = nth(&sl, e / per_row);
            int64_t need = len <= 0 ? 0 : (len + page_size - 1) / page_size;
            if (e % width >= need)
                continue;
        }
        if (ids_add(out, nth(&bt, e)) < 0)
            r = -1;
    }
    Py_XDECREF(h1);
    Py_XDECREF(h2);
    return r;
}

/* ----------------------------------------------------------- arguments */

PyObject *fi_call_arg(const fi_call_args *a, const char *name)
{
    Py_ssize_t nkw = a->kwnames ? PyTuple_GET_SIZE(a->kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        const char *k = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a->kwnames, i));
        if (k && strcmp(k, name) == 0)
            return a->args[a->nargs + i];
    }
    PyErr_Clear();
    for (Py_ssize_t i = 0; i < a->nargs && i < a->nparams; i++) {
        const char *p = PyUnicode_AsUTF8(a->param_names[i]);
        if (p && strcmp(p, name) == 0)
            return a->args[i];
    }
    PyErr_Clear();
    return NULL;
}

/* Whether the `unless` parameter was passed with a value that changes the page semantics. */
static int semantics_changed(const fi_pages_api *api, const fi_call_args *a)
{
    PyObject *v = api->unless ? fi_call_arg(a, api->unless) : NULL;
    if (!v || v == Py_None)
        return 0;
    int truth = PyObject_IsTrue(v);
    PyErr_Clear();
    return truth != 0;
}

/* The page size of a CALL from its first paged tensor's shape; 0 when it cannot be told. */
static int64_t call_page_size(const fi_pages_api *api, const fi_call_args *a)
{
    PyObject *v = api->paged[0].param ? fi_call_arg(a, api->paged[0].param) : NULL;
    if (v && (PyTuple_Check(v) || PyList_Check(v)) && PySequence_Size(v) > 0) {
        PyObject *first = PySequence_GetItem(v, 0);
        Py_XDECREF(first); /* the container keeps it alive */
        v = first;
    }
    fi_tensor t;
    if (!v || !fi_is_tensor(v) || fi_tensor_meta_from_py(v, &t) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (api->ps_kind == PS_MLA)
        return t.ndim == 3 ? t.shape[1] : t.ndim == 4 ? t.shape[2] : 0;
    if (api->ps_kind != PS_KV)
        return 0;
    PyObject *lay = api->layout_param ? fi_call_arg(a, api->layout_param) : NULL;
    const char *layout = lay && PyUnicode_Check(lay) ? PyUnicode_AsUTF8(lay) : api->layout_default;
    PyErr_Clear();
    int hnd = layout && strcmp(layout, "HND") == 0;
    if (t.ndim == 5)
        return hnd ? t.shape[3] : t.shape[2];
    if (t.ndim == 4)
        return hnd ? t.shape[2] : t.shape[1];
    return 0;
}

/* The raw page ids (unique, unclipped) of table slot of a call. 1 when its tables gave
 * them, 0 when they could not be read (or none was passed), -1 on error. */
static int table_ids(const fi_pages_api *api, int slot, const fi_call_args *a, int64_t page_size,
                     ids *out)
{
    const table_params *tp = &api->table[slot];
    int got = 0;
    PyObject *ip = tp->indptr ? fi_call_arg(a, tp->indptr) : NULL;
    PyObject *ix = tp->indices ? fi_call_arg(a, tp->indices) : NULL;
    if (ip && ix && ip != Py_None && ix != Py_None) {
        int r = add_csr_param(out, ip, ix);
        if (r < 0)
            return -1;
        got |= r;
    }
    PyObject *bt = tp->block_tables ? fi_call_arg(a, tp->block_tables) : NULL;
    if (bt && bt != Py_None) {
        PyObject *sl = tp->seq_lens ? fi_call_arg(a, tp->seq_lens) : NULL;
        int r = add_dense(out, bt, sl, page_size);
        if (r < 0)
            return -1;
        got |= r;
    }
    ids_unique(out);
    return got;
}

/* ----------------------------------------------------------------- memo */

#define PLAN_CAPSULE "flashinfer_native.plan_pages"

/* What a plan left for the calls on its object: a weak reference to the object (an id
 * may be reused) and the raw page ids of each table slot. */
typedef struct {
    PyObject *self_ref;
    ids slot[2];
    int known[2];
} plan_pages;

static void plan_pages_free(PyObject *capsule)
{
    plan_pages *p = PyCapsule_GetPointer(capsule, PLAN_CAPSULE);
    if (!p)
        return;
    Py_XDECREF(p->self_ref);
    free(p->slot[0].v);
    free(p->slot[1].v);
    free(p);
}

/* Drops the memo's entries whose object is gone, when it has grown since the last sweep. */
static void sweep(PyObject *memo)
{
    Py_ssize_t n = PyDict_GET_SIZE(memo);
    if (n < 64 || (n & (n - 1)) != 0) /* at 64, 128, 256, ... entries */
        return;
    PyObject *keys = PyDict_Keys(memo);
    for (Py_ssize_t i = 0; keys && i < PyList_GET_SIZE(keys); i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        plan_pages *p = PyCapsule_GetPointer(PyDict_GetItem(memo, k), PLAN_CAPSULE);
        if (p && PyWeakref_GetObject(p->self_ref) == Py_None)
            PyDict_DelItem(memo, k);
    }
    Py_XDECREF(keys);
    PyErr_Clear();
}

int fi_pages_note_plan(PyObject *memo, const fi_pages_api *api, PyObject *self,
                       const fi_call_args *a)
{
    if (!self)
        return 0;
    PyObject *key = PyLong_FromVoidPtr(self);
    if (!key)
        return -1;
    plan_pages *p = calloc(1, sizeof(*p));
    if (!p) {
        Py_DECREF(key);
        PyErr_NoMemory();
        return -1;
    }
    int any = 0, rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        if (!api->table[s].indptr && !api->table[s].block_tables)
            continue;
        int r = table_ids(api, s, a, 0, &p->slot[s]);
        if (r < 0)
            rc = -1;
        p->known[s] = r > 0;
        any |= r > 0;
    }
    if (rc == 0 && any) {
        p->self_ref = PyWeakref_NewRef(self, NULL);
        if (!p->self_ref)
            PyErr_Clear(); /* no weak references: its pages cannot be told safely */
    }
    PyObject *cap = NULL;
    if (rc == 0 && any && p->self_ref) {
        cap = PyCapsule_New(p, PLAN_CAPSULE, plan_pages_free);
        if (!cap)
            rc = -1;
    }
    if (cap) {
        rc = PyDict_SetItem(memo, key, cap);
        Py_DECREF(cap);
        sweep(memo);
    } else {
        Py_XDECREF(p->self_ref);
        free(p->slot[0].v);
        free(p->slot[1].v);
        free(p);
        if (rc == 0 && PyDict_DelItem(memo, key) < 0)
            PyErr_Clear(); /* nothing was remembered for self */
    }
    Py_DECREF(key);
    return rc;
}

/* The plan on self, or NULL when there is none (or its object is gone). */
static const plan_pages *plan_of(PyObject *memo, PyObject *self)
{
    if (!self)
        return NULL;
    PyObject *key = PyLong_FromVoidPtr(self);
    PyObject *cap = key ? PyDict_GetItemWithError(memo, key) : NULL;
    Py_XDECREF(key);
    plan_pages *p = cap ? PyCapsule_GetPointer(cap, PLAN_CAPSULE) : NULL;
    PyErr_Clear();
    if (!p || PyWeakref_GetObject(p->self_ref) != self)
        return NULL;
    return p;
}

/* Adds tensor with the ids clipped to [0, shape[0]). */
static int add_paged(fi_paged *out, PyObject *tensor, const ids *raw)
{
    fi_tensor t;
    if (!fi_is_tensor(tensor))
        return 0;
    if (fi_tensor_meta_from_py(tensor, &t) < 0)
        return -1;
    if (t.ndim < 1 || fi_paged_find(out, tensor))
        return 0;
    fi_paged_tensor *items = realloc(out->item, (size_t)(out->n + 1) * sizeof(*items));
    if (!items) {
        PyErr_NoMemory();
        return -1;
    }
    out->item = items;
    fi_paged_tensor *it = &items[out->n];
    memset(it, 0, sizeof(*it));
    it->tensor = tensor;
    it->pages.total = t.shape[0];
    it->pages.page = malloc((size_t)(raw->n ? raw->n : 1) * sizeof(int64_t));
    if (!it->pages.page) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t i = 0; i < raw->n; i++) {
        if (raw->v[i] >= 0 && raw->v[i] < t.shape[0])
            it->pages.page[it->pages.n++] = raw->v[i];
        else
            it->pages.out_of_range++;
    }
    out->n++;
    return 0;
}

/* The tensors of a paged parameter: itself, or each of a tuple/list (k and v caches). */
static int add_param(fi_paged *out, PyObject *value, const ids *raw)
{
    if (!value || value == Py_None)
        return 0;
    if (!(PyTuple_Check(value) || PyList_Check(value)))
        return add_paged(out, value, raw);
    for (Py_ssize_t i = 0; i < PySequence_Size(value); i++) {
        PyObject *item = PySequence_GetItem(value, i);
        int r = item ? add_paged(out, item, raw) : -1;
        Py_XDECREF(item); /* the container keeps it alive */
        if (r < 0)
            return -1;
    }
    return 0;
}

int fi_pages_of_call(PyObject *memo, const fi_pages_api *api, PyObject *self, const fi_call_args *a,
                     fi_paged *out)
{
    out->item = NULL;
    out->n = 0;
    if (api->role == ROLE_PLAN || semantics_changed(api, a))
        return 0;
    ids own[2] = {{0}};
    const ids *raw[2] = {NULL, NULL};
    int rc = 0;
    if (api->role == ROLE_RUN) {
        const plan_pages *p = plan_of(memo, self);
        for (int s = 0; p && s < 2; s++)
            raw[s] = p->known[s] ? &p->slot[s] : NULL;
    } else {
        int64_t ps = call_page_size(api, a);
        for (int s = 0; s < 2 && rc == 0; s++) {
            int r = table_ids(api, s, a, ps, &own[s]);
            rc = r < 0 ? -1 : 0;
            raw[s] = r > 0 ? &own[s] : NULL;
        }
    }
    for (int i = 0; rc == 0 && i < 4 && api->paged[i].param; i++) {
        const ids *r = raw[api->paged[i].slot];
        if (r)
            rc = add_param(out, fi_call_arg(a, api->paged[i].param), r);
    }
    free(own[0].v);
    free(own[1].v);
    if (rc < 0)
        fi_paged_free(out);
    return rc;
}

/* ------------------------------------------------------------ test hook */

PyDoc_STRVAR(page_sets_doc,
             "_page_sets(qualname, self, params, memo) -> list | None\n\n"
             "What the recorder computes for a call of the API named qualname with the\n"
             "arguments params (a dict by parameter name) on object self: None for an API\n"
             "outside the page table and for plans (which note their tables in memo, a dict);\n"
             "else [(tensor, pages, total, out_of_range), ...] for its paged tensors.");

static PyObject *page_sets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[2]) ||
        !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "_page_sets(qualname, self, params: dict, memo: dict)");
        return NULL;
    }
    const char *qn = PyUnicode_AsUTF8(args[0]);
    const fi_pages_api *api = NULL;
    for (size_t i = 0; qn && i < TABLE_LEN && !api; i++)
        if (strcmp(qn, TABLE[i].qualname) == 0)
            api = &TABLE[i];
    if (!api)
        Py_RETURN_NONE;
    PyObject *names = PyDict_Keys(args[2]);
    PyObject *kwnames = names ? PyList_AsTuple(names) : NULL;
    PyObject *values = PyDict_Values(args[2]);
    Py_XDECREF(names);
    if (!kwnames || !values) {
        Py_XDECREF(kwnames);
        Py_XDECREF(values);
        return NULL;
    }
    fi_call_args a = {PySequence_Fast_ITEMS(values), 0, kwnames, NULL, 0};
    PyObject *self = args[1] == Py_None ? NULL : args[1];
    PyObject *result = NULL;
    if (api->role == ROLE_PLAN) {
        if (fi_pages_note_plan(args[3], api, self, &a) == 0)
            result = Py_NewRef(Py_None);
    } else {
        fi_paged p;
        if (fi_pages_of_call(args[3], api, self, &a, &p) == 0) {
            result = PyList_New(p.n);
            for (int i = 0; result && i < p.n; i++) {
                const fi_page_set *s = &p.item[i].pages;
                PyObject *pages = PyList_New(s->n);
                for (int64_t k = 0; pages && k < s->n; k++)
                    PyList_SET_ITEM(pages, k, PyLong_FromLongLong(s->page[k]));
                PyObject *t = pages ? Py_BuildValue("(ONLL)", p.item[i].tensor, pages,
                                                    (long long)s->total, (long long)s->out_of_range)
                                    : NULL;
                if (!t)
                    Py_CLEAR(result);
                else
                    PyList_SET_ITEM(result, i, t);
            }
            fi_paged_free(&p);
        }
    }
    Py_DECREF(kwnames);
    Py_DECREF(values);
    return result;
}

/* A list of the names of ps that are set. */
static PyObject *names_list(const char *const *ps, int n)
{
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < n; i++) {
        PyObject *s = ps[i] ? PyUnicode_FromString(ps[i]) : NULL;
        if (ps[i] && (!s || PyList_Append(l, s) < 0))
            Py_CLEAR(l);
        Py_XDECREF(s);
    }
    return l;
}

PyDoc_STRVAR(page_table_doc,
             "_page_table() -> list[tuple[str, str, list[str], list[str]]]\n\n"
             "The page-table knowledge, one entry per API: (qualname, role: 'plan', 'run' or\n"
             "'call', the parameters holding page tables, the parameters holding paged tensors).");

static PyObject *page_table(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    static const char *const roles[] = {"plan", "run", "call"};
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < TABLE_LEN; i++) {
        const fi_pages_api *e = &TABLE[i];
        const char *tables[8], *paged[5];
        for (int s = 0; s < 2; s++) {
            tables[4 * s] = e->table[s].indptr;
            tables[4 * s + 1] = e->table[s].indices;
            tables[4 * s + 2] = e->table[s].block_tables;
            tables[4 * s + 3] = e->table[s].seq_lens;
        }
        for (int k = 0; k < 4; k++)
            paged[k] = e->paged[k].param;
        paged[4] = e->unless;
        PyObject *t = Py_BuildValue("(ssNN)", e->qualname, roles[e->role], names_list(tables, 8),
                                    names_list(paged, 5));
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
    return out;
}

static PyMethodDef pages_methods[] = {
    {"_page_table", page_table, METH_NOARGS, page_table_doc},
    {"_page_sets", (PyCFunction)(void (*)(void))page_sets, METH_FASTCALL, page_sets_doc},
    {NULL, NULL, 0, NULL},
};

int fi_pages_exec(PyObject *module) { return PyModule_AddFunctions(module, pages_methods); }
