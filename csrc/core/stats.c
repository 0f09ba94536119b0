/* stats.c: level-5 tensor statistics of a torch.Tensor: the kernel for its device (the CPU
 * one, the CUDA one for float dtypes, else torch ops), the log text, the Python functions. */
#include "stats.h"

#include "elements.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"
#include "tensorio.h"

/* ---- torch.Tensor glue -------------------------------------------------------------- */

/* Tensors this large are read with the GIL released. */
#define STATS_NOGIL_BYTES (256 * 1024)

static PyObject *call_with_dtype(PyObject *obj, const char *name, PyObject *dtype)
{
    PyObject *meth = PyObject_GetAttrString(obj, name);
    if (!meth)
        return NULL;
    PyObject *args = PyTuple_New(0);
    PyObject *kwargs = args ? Py_BuildValue("{sO}", "dtype", dtype) : NULL;
    PyObject *r = kwargs ? PyObject_Call(meth, args, kwargs) : NULL;
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    Py_DECREF(meth);
    return r;
}

/* Float statistics with torch ops on the tensor's own device: five reductions stacked
 * into one float64 tensor so that reading them back synchronises once. */
static int float_stats_with_torch_ops(PyObject *tensor, fi_dtype dtype, fi_stats *out)
{
    PyObject *torch = NULL, *x = NULL, *nan = NULL, *vals[5] = {NULL}, *t[4] = {NULL};
    PyObject *stacked = NULL, *list = NULL, *f64 = fi_dtype_to_py(FI_DTYPE_F64);
    int rc = -1;
    torch = PyImport_ImportModule("torch");
    if (!torch || !f64)
        goto done;
    if (dtype == FI_DTYPE_F32 || dtype == FI_DTYPE_F64)
        x = Py_NewRef(tensor);
    else
        x = PyObject_CallMethod(tensor, "float", NULL);
    if (!x || !(nan = PyObject_CallMethod(x, "isnan", NULL)))
        goto done;
    if (!(t[0] = PyObject_CallMethod(x, "masked_fill", "Od", nan, INFINITY)) ||
        !(t[1] = PyObject_CallMethod(x, "masked_fill", "Od", nan, -INFINITY)) ||
        !(t[2] = PyObject_CallMethod(x, "masked_fill", "Od", nan, 0.0)) ||
        !(t[3] = PyObject_CallMethod(x, "isinf", NULL)))
        goto done;
    if (!(vals[0] = PyObject_CallMethod(t[0], "amin", NULL)) ||
        !(vals[1] = PyObject_CallMethod(t[1], "amax", NULL)) ||
        !(vals[2] = call_with_dtype(t[2], "sum", f64)) ||
        !(vals[3] = call_with_dtype(nan, "sum", f64)) ||
        !(vals[4] = call_with_dtype(t[3], "sum", f64)))
        goto done;
    for (int i = 0; i < 2; i++) {
        PyObject *d = PyObject_CallMethod(vals[i], "double", NULL);
        if (!d)
            goto done;
        Py_SETREF(vals[i], d);
    }
    stacked = PyObject_CallMethod(torch, "stack", "((OOOOO))", vals[0], vals[1], vals[2], vals[3],
                                  vals[4]);
    if (!stacked || !(list = PyObject_CallMethod(stacked, "tolist", NULL)))
        goto done;
    double r[5];
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != 5) {
        PyErr_SetString(PyExc_RuntimeError, "tensor statistics: torch.stack gave no 5 values");
        goto done;
    }
    for (int i = 0; i < 5; i++) {
        r[i] = PyFloat_AsDouble(PyList_GET_ITEM(list, i));
        if (r[i] == -1.0 && PyErr_Occurred())
            goto done;
    }
    fi_stats_from_sums(out, out->numel, r[0], r[1], r[2], (int64_t)r[3], (int64_t)r[4]);
    rc = 0;
done:
    Py_XDECREF(list);
    Py_XDECREF(stacked);
    for (int i = 0; i < 5; i++)
        Py_XDECREF(vals[i]);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(t[i]);
    Py_XDECREF(nan);
    Py_XDECREF(x);
    Py_XDECREF(torch);
    return rc;
}

/* Reads a 0-d tensor's reduction (method name) as a Python number via .item(). */
static PyObject *reduce_item(PyObject *tensor, const char *name, PyObject *dtype)
{
    PyObject *r =
        dtype ? call_with_dtype(tensor, name, dtype) : PyObject_CallMethod(tensor, name, NULL);
    if (!r)
        return NULL;
    Py_SETREF(r, PyObject_CallMethod(r, "item", NULL));
    return r;
}

static int int_stats_with_torch_ops(PyObject *tensor, fi_dtype dtype, fi_stats *out)
{
    PyObject *lo = reduce_item(tensor, "min", NULL);
    PyObject *hi = lo ? reduce_item(tensor, "max", NULL) : NULL;
    PyObject *sum = hi ? reduce_item(tensor, "sum", fi_dtype_to_py(FI_DTYPE_F64)) : NULL;
    int rc = -1;
    if (!sum)
        goto done;
    out->kind = FI_STATS_INT;
    if (dtype == FI_DTYPE_U64) {
        out->is_unsigned64 = 1;
        out->umin = PyLong_AsUnsignedLongLong(lo);
        out->umax = PyLong_AsUnsignedLongLong(hi);
        out->min = (double)out->umin;
        out->max = (double)out->umax;
    } else {
        out->imin = PyLong_AsLongLong(lo);
        out->imax = PyLong_AsLongLong(hi);
        out->min = (double)out->imin;
        out->max = (double)out->imax;
    }
    out->mean = PyFloat_AsDouble(sum) / (double)out->numel;
    rc = PyErr_Occurred() ? -1 : 0;
done:
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(sum);
    return rc;
}

static int is_float_dtype(fi_dtype dtype)
{
    return dtype >= FI_DTYPE_F64 && dtype <= FI_DTYPE_E8M0FNU;
}

/* The interim device path: statistics computed by torch on the tensor's device. */
static int stats_with_torch_ops(PyObject *tensor, fi_dtype dtype, int64_t numel, fi_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->numel = numel;
    if (numel == 0 || !fi_dtype_has_stats(dtype))
        return 0;
    int rc = is_float_dtype(dtype) ? float_stats_with_torch_ops(tensor, dtype, out)
                                   : int_stats_with_torch_ops(tensor, dtype, out);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* Calls a no-argument method returning a bool; -1 with an exception on failure. */
static int call_truth(PyObject *obj, const char *method)
{
    PyObject *r = PyObject_CallMethod(obj, method, NULL);
    if (!r)
        return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

static int cuda_stream_capturing(void)
{
    PyObject *cuda = PyImport_ImportModule("torch.cuda");
    if (!cuda)
        return -1;
    int capturing = call_truth(cuda, "is_current_stream_capturing");
    Py_DECREF(cuda);
    return capturing;
}

static int attr_truth(PyObject *obj, const char *name)
{
    PyObject *r = PyObject_GetAttrString(obj, name);
    if (!r)
        return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

/* Float statistics read from memory are those of the stored values; a tensor with the
 * negative bit set (the imaginary part of a conjugate view) stands for their negation. */
static int apply_neg_bit(PyObject *tensor, fi_stats *out)
{
    if (out->kind != FI_STATS_FLOAT)
        return 0;
    int neg = call_truth(tensor, "is_neg");
    if (neg <= 0)
        return neg;
    double lo = out->min;
    out->min = -out->max;
    out->max = -lo;
    out->mean = 0.0 - out->mean; /* a zero mean stays +0, as torch's sum starts from +0 */
    return 0;
}

/* ---- statistics a call took already (fi_stats_memo) --------------------------------- */

/* tensor._version, or -1 (no exception) when it cannot be read. */
static long long version_of(PyObject *tensor)
{
    static PyObject *name; /* interned once, kept for the process */
    if (!name && !(name = PyUnicode_InternFromString("_version"))) {
        PyErr_Clear();
        return -1;
    }
    PyObject *v = PyObject_GetAttr(tensor, name);
    long long r = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    if (r == -1)
        PyErr_Clear();
    return r;
}

void fi_stats_memo_init(fi_stats_memo *memo)
{
    memo->count = 0;
    memo->keep_taken = 0;
    memo->paged = NULL;
    memo->seen = NULL;
}

void fi_stats_memo_put(void *ctx, PyObject *tensor, const fi_stats *stats)
{
    fi_stats_memo *memo = ctx;
    fi_tensor t;
    if (memo->count == FI_STATS_MEMO_MAX || fi_tensor_seen_get(memo->seen, tensor, &t, 1) < 0) {
        PyErr_Clear();
        return;
    }
    long long version = version_of(tensor);
    if (version < 0)
        return;
    memo->entry[memo->count].tensor = Py_NewRef(tensor);
    memo->entry[memo->count].data = t.data;
    memo->entry[memo->count].version = version;
    memo->entry[memo->count].stats = *stats;
    memo->count++;
}

void fi_stats_memo_clear(fi_stats_memo *memo)
{
    while (memo->count > 0) {
        memo->count--; /* first: a finalizer that runs on the decref finds the entry gone */
        Py_CLEAR(memo->entry[memo->count].tensor);
    }
}

/* The statistics memo holds for tensor (t: its metadata now; ps: the pages they cover, or
 * NULL for all of it), if they still hold. */
static const fi_stats *memo_lookup(const fi_stats_memo *memo, PyObject *tensor, const fi_tensor *t,
                                   const fi_page_set *ps)
{
    int64_t pe = 0, numel = ps && fi_pages_contiguous(t, &pe) ? ps->n * pe : fi_tensor_numel(t);
    for (int i = 0; memo && i < memo->count; i++) {
        const fi_stats *st = &memo->entry[i].stats;
        if (memo->entry[i].tensor == tensor && memo->entry[i].data == t->data &&
            st->numel == numel && memo->entry[i].version == version_of(tensor))
            return st;
    }
    return NULL;
}

/* Reads statistics of a CPU tensor in place. */
static int stats_of_cpu_tensor(PyObject *tensor, const fi_tensor *t, fi_stats_memo *memo,
                               fi_stats *out)
{
    const fi_stats *known = memo_lookup(memo, tensor, t, NULL);
    if (known) {
        *out = *known;
        return 0;
    }
    int64_t numel = fi_tensor_numel(t);
    int rc;
    if (numel > 0 && numel >= STATS_NOGIL_BYTES / (int64_t)fi_dtype_size(t->dtype)) {
        Py_BEGIN_ALLOW_THREADS
        rc = fi_stats_cpu(t, out);
        Py_END_ALLOW_THREADS
    } else {
        rc = fi_stats_cpu(t, out);
    }
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError,
                     "tensor statistics: unreadable %s tensor with %d dimensions (a negative "
                     "size, sizes or strides past int64, or no data pointer)",
                     fi_dtype_name(t->dtype), t->ndim);
        return -1;
    }
    if (apply_neg_bit(tensor, out) < 0)
        return -1;
    if (memo && memo->keep_taken)
        fi_stats_memo_put(memo, tensor, out);
    return 0;
}

#ifdef FI_WITH_CUDA
/* Ids of deferred statistics lines, unique in the process. */
static atomic_llong next_deferred_id = 1;

/* torch.cuda.current_stream(device).cuda_stream as a pointer. */
static int current_cuda_stream(int device, void **stream)
{
    PyObject *cuda = PyImport_ImportModule("torch.cuda");
    if (!cuda)
        return -1;
    PyObject *st = PyObject_CallMethod(cuda, "current_stream", "i", device);
    Py_DECREF(cuda);
    if (!st)
        return -1;
    PyObject *handle = PyObject_GetAttrString(st, "cuda_stream");
    Py_DECREF(st);
    if (!handle)
        return -1;
    *stream = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    return *stream == NULL && PyErr_Occurred() ? -1 : 0;
}

/* The statistics kernel: computed and read back (one copy), or while capturing a graph,
 * enqueued to print its line on every replay. */
static int stats_with_cuda_kernel(PyObject *tensor, const fi_tensor *t, int capturing,
                                  fi_stats *out)
{
    void *stream = NULL;
    if (current_cuda_stream(t->device_index, &stream) < 0)
        return -1;
    out->numel = fi_tensor_numel(t);
    if (capturing) {
        long long id = atomic_fetch_add(&next_deferred_id, 1);
        if (fi_stats_cuda_deferred(t, stream, id) != 0) {
            PyErr_Format(PyExc_RuntimeError, "%s", fi_cuda_last_error());
            return -1;
        }
        out->kind = FI_STATS_DEFERRED;
        out->deferred_id = id;
        out->dtype = t->dtype;
        return 0;
    }
    if (out->numel == 0)
        return 0;
    double r[5];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_stats_cuda(t, stream, r);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "%s", fi_cuda_last_error());
        return -1;
    }
    fi_stats_from_sums(out, out->numel, r[0], r[1], r[2], (int64_t)r[3], (int64_t)r[4]);
    return apply_neg_bit(tensor, out);
}
#endif

static int stats_of_known(PyObject *tensor, const fi_tensor *tp, fi_stats_memo *memo,
                          fi_stats *out);

/* The threads _page_stats asks for (0: torch's), for tests. Guarded by the GIL. */
static int test_threads;

int fi_torch_threads(void)
{
    PyObject *torch = PyImport_ImportModule("torch");
    PyObject *n = torch ? PyObject_CallMethod(torch, "get_num_threads", NULL) : NULL;
    long v = n ? PyLong_AsLong(n) : 1;
    Py_XDECREF(torch);
    Py_XDECREF(n);
    PyErr_Clear();
    return v < 1 ? 1 : v > 1024 ? 1024 : (int)v;
}

/* Statistics of the pages ps of tensor: CPU pages that are each one run of float32/16 or
 * bfloat16 elements are streamed page by page, in place, on torch's CPU threads when
 * they are many (fi_stats_pieces: the bits of one in-order stream); any other tensor is
 * gathered first (tensor[pages], on its device). */
static int stats_of_pages(PyObject *tensor, const fi_tensor *t, const fi_page_set *ps,
                          fi_stats_memo *memo, fi_stats *out)
{
    if (t->device_type == FI_DEVICE_CPU) {
        const fi_stats *known = memo_lookup(memo, tensor, t, ps);
        if (known) {
            *out = *known;
            return 0;
        }
    }
    int64_t pe;
    size_t isz = fi_dtype_size(t->dtype);
    const char **piece = NULL;
    if (t->device_type == FI_DEVICE_CPU && ps->n > 0 && fi_pages_contiguous(t, &pe) &&
        (pe % 8 == 0 || ps->n <= 1) && pe * ps->n >= 16 &&
        (t->dtype == FI_DTYPE_F32 || t->dtype == FI_DTYPE_F16 || t->dtype == FI_DTYPE_BF16))
        piece = malloc((size_t)ps->n * sizeof(*piece));
    if (piece) {
        for (int64_t i = 0; i < ps->n; i++)
            piece[i] = (const char *)t->data + ps->page[i] * t->stride[0] * (int64_t)isz;
        int threads = test_threads ? test_threads : fi_torch_threads();
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = fi_stats_pieces(t->dtype, piece, ps->n, (size_t)pe * isz, threads, out);
        Py_END_ALLOW_THREADS
        free(piece);
        if (r < 0) {
            PyErr_NoMemory();
            return -1;
        }
        out->dtype = t->dtype;
        if (apply_neg_bit(tensor, out) < 0)
            return -1;
    } else {
        PyObject *g = fi_pages_gather(tensor, ps);
        fi_tensor gt;
        int r = g && fi_tensor_from_py(g, &gt) == 0 ? stats_of_known(g, &gt, NULL, out) : -1;
        Py_XDECREF(g);
        if (r < 0)
            return -1;
    }
    if (memo && memo->keep_taken && t->device_type == FI_DEVICE_CPU)
        fi_stats_memo_put(memo, tensor, out);
    return 0;
}

/* The statistics of tensor, whose metadata t was read already. */
static int stats_of_known(PyObject *tensor, const fi_tensor *tp, fi_stats_memo *memo, fi_stats *out)
{
    const fi_tensor t = *tp;
    fi_dtype dtype = t.dtype;
    if (!fi_dtype_has_stats(dtype))
        return 0;
    const fi_page_set *ps = memo && memo->paged ? fi_paged_find(memo->paged, tensor) : NULL;
    if (ps)
        return stats_of_pages(tensor, &t, ps, memo, out);
    if (t.device_type == FI_DEVICE_CPU)
        return stats_of_cpu_tensor(tensor, &t, memo, out);
    if (t.device_type == FI_DEVICE_CUDA) {
        int capturing = cuda_stream_capturing();
        if (capturing < 0)
            return -1;
#ifdef FI_WITH_CUDA
        if (fi_stats_cuda_supports(t.dtype))
            return stats_with_cuda_kernel(tensor, &t, capturing, out);
#endif
        if (capturing) {
            out->kind = FI_STATS_SKIPPED_CAPTURE;
            out->numel = fi_tensor_numel(&t);
            return 0;
        }
    } else {
        int meta = attr_truth(tensor, "is_meta");
        if (meta)
            return meta < 0 ? -1 : 0;
    }
    return stats_with_torch_ops(tensor, dtype, fi_tensor_numel(&t), out);
}

int fi_stats_of_tensor(PyObject *tensor, fi_stats_memo *memo, fi_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!fi_is_tensor(tensor)) {
        PyErr_Format(PyExc_TypeError, "tensor statistics: expected a torch.Tensor, got %.200s",
                     Py_TYPE(tensor)->tp_name);
        return -1;
    }
    fi_tensor_seen *seen = memo ? memo->seen : NULL;
    fi_tensor t;
    fi_dtype dtype;
    if (seen && fi_tensor_seen_get(seen, tensor, &t, 0) == 0) {
        dtype = t.dtype;
    } else {
        PyErr_Clear(); /* unreadable metadata: the dtype alone decides, as below */
        PyObject *dt = PyObject_GetAttr(tensor, fi_names.dtype);
        if (!dt)
            return -1;
        dtype = fi_dtype_from_py(dt);
        Py_DECREF(dt);
    }
    /* dtypes without statistics never touch data_ptr (sparse or quantized tensors) */
    if (!fi_dtype_has_stats(dtype))
        return 0;
    if (fi_tensor_seen_get(seen, tensor, &t, 1) < 0)
        return -1;
    int r = stats_of_known(tensor, &t, memo, out);
    out->dtype = dtype;
    return r;
}

/* ---- text ---------------------------------------------------------------------------- */

/* %.6f as Python's format() writes it: NaN of either sign is "nan". */
static void put_float_line(fi_buf *buf, int indent, const char *name, double v)
{
    fi_buf_indent(buf, indent);
    fi_buf_puts(buf, name);
    fi_buf_putc(buf, '=');
    if (isnan(v))
        fi_buf_puts(buf, "nan");
    else
        fi_buf_put_fixed6(buf, v);
    fi_buf_putc(buf, '\n');
}

/* The dtypes FlashInfer's log shows statistics for: float64/32/16, bfloat16, the two
 * float8 kinds with an inf (e4m3fn, e5m2), int8 to int64 and uint8. */
static int dtype_logged(fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F64:
    case FI_DTYPE_F32:
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16:
    case FI_DTYPE_E4M3FN:
    case FI_DTYPE_E5M2:
    case FI_DTYPE_I8:
    case FI_DTYPE_I16:
    case FI_DTYPE_I32:
    case FI_DTYPE_I64:
    case FI_DTYPE_U8:
        return 1;
    default:
        return 0;
    }
}

int fi_stats_format(fi_buf *buf, const fi_stats *st, int indent)
{
    /* a NaN makes min, max and mean NaN, as torch's reductions (FlashInfer's log) do */
    int has_nan = st->nan_count > 0;
    switch (st->kind) {
    case FI_STATS_FLOAT:
        put_float_line(buf, indent, "min", has_nan ? NAN : st->min);
        put_float_line(buf, indent, "max", has_nan ? NAN : st->max);
        put_float_line(buf, indent, "mean", has_nan ? NAN : st->mean);
        fi_buf_indent(buf, indent);
        fi_buf_puts(buf, "nan_count=");
        fi_buf_put_i64(buf, (long long)st->nan_count);
        fi_buf_putc(buf, '\n');
        fi_buf_indent(buf, indent);
        fi_buf_puts(buf, "inf_count=");
        fi_buf_put_i64(buf, (long long)st->inf_count);
        fi_buf_putc(buf, '\n');
        break;
    case FI_STATS_INT:
        fi_buf_indent(buf, indent);
        if (st->is_unsigned64)
            fi_buf_printf(buf, "min=%llu\n", (unsigned long long)st->umin);
        else
            fi_buf_printf(buf, "min=%lld\n", (long long)st->imin);
        fi_buf_indent(buf, indent);
        if (st->is_unsigned64)
            fi_buf_printf(buf, "max=%llu\n", (unsigned long long)st->umax);
        else
            fi_buf_printf(buf, "max=%lld\n", (long long)st->imax);
        put_float_line(buf, indent, "mean", st->mean);
        break;
    case FI_STATS_SKIPPED_CAPTURE:
        fi_buf_indent(buf, indent);
        fi_buf_puts(buf, "[statistics skipped: CUDA graph capture in progress]\n");
        break;
    case FI_STATS_DEFERRED:
        fi_buf_indent(buf, indent);
        fi_buf_printf(buf,
                      "[stats deferred to GPU kernel: id=%lld; look for '[flashinfer stats] "
                      "id=%lld ...' in graph replay output]\n",
                      st->deferred_id, st->deferred_id);
        break;
    case FI_STATS_NONE:
        break;
    }
    return buf->oom ? -1 : 0;
}

/* str() of the current exception, which is cleared; NULL (exception set) on failure. */
static PyObject *take_exception_text(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
    PyTypeObject *type = value ? Py_TYPE(value) : NULL;
#else
    PyObject *ptype, *value, *tb;
    PyErr_Fetch(&ptype, &value, &tb);
    PyErr_NormalizeException(&ptype, &value, &tb);
    Py_XDECREF(ptype);
    Py_XDECREF(tb);
    PyTypeObject *type = value ? Py_TYPE(value) : NULL;
#endif
    PyObject *text = value ? PyObject_Str(value) : NULL;
    if (!text) {
        PyErr_Clear();
        text = PyUnicode_FromFormat("<unprintable %s>", type ? type->tp_name : "exception");
    }
    Py_XDECREF(value);
    return text;
}

int fi_stats_or_error(PyObject *tensor, const fi_tensor *known, fi_stats_memo *memo, fi_stats *out,
                      PyObject **error)
{
    int r;
    *error = NULL;
    if (known) {
        memset(out, 0, sizeof(*out));
        r = stats_of_known(tensor, known, memo, out);
        out->dtype = known->dtype;
    } else {
        r = fi_stats_of_tensor(tensor, memo, out);
    }
    if (r == 0)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    memset(out, 0, sizeof(*out));
    *error = take_exception_text();
    return *error ? 0 : -1;
}

int fi_stats_put_pages_line(fi_buf *buf, const fi_page_set *ps, int indent)
{
    fi_buf_indent(buf, indent);
    fi_buf_puts(buf, "pages=");
    fi_buf_put_i64(buf, ps->n);
    fi_buf_putc(buf, '/');
    fi_buf_put_i64(buf, ps->total);
    fi_buf_putc(buf, '\n');
    if (ps->out_of_range) {
        fi_buf_indent(buf, indent);
        fi_buf_puts(buf, "page_ids_out_of_range=");
        fi_buf_put_i64(buf, ps->out_of_range);
        fi_buf_putc(buf, '\n');
    }
    if (buf->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int fi_stats_format_tensor(fi_buf *buf, PyObject *tensor, const fi_tensor *known,
                           fi_stats_memo *memo, int indent)
{
    fi_stats st;
    PyObject *error;
    if (fi_stats_or_error(tensor, known, memo, &st, &error) < 0)
        return -1;
    int computed = st.kind == FI_STATS_FLOAT || st.kind == FI_STATS_INT;
    if (!error && computed && !dtype_logged(st.dtype))
        return 0;
    const fi_page_set *ps = memo && memo->paged ? fi_paged_find(memo->paged, tensor) : NULL;
    if (ps && fi_stats_put_pages_line(buf, ps, indent) < 0) {
        Py_XDECREF(error);
        return -1;
    }
    if (!error)
        return fi_stats_format(buf, &st, indent) < 0 ? (PyErr_NoMemory(), -1) : 0;
    const char *s = PyUnicode_AsUTF8(error);
    if (!s) {
        Py_DECREF(error);
        return -1;
    }
    fi_buf_indent(buf, indent);
    fi_buf_printf(buf, "[statistics error: %s]\n", s);
    Py_DECREF(error);
    if (buf->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ---- Python functions ---------------------------------------------------------------- */

static int dict_set(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *stats_to_python(const fi_stats *st)
{
    if (st->kind != FI_STATS_FLOAT && st->kind != FI_STATS_INT)
        Py_RETURN_NONE;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int bad;
    if (st->kind == FI_STATS_FLOAT) {
        bad = dict_set(d, "min", PyFloat_FromDouble(st->min)) < 0 ||
              dict_set(d, "max", PyFloat_FromDouble(st->max)) < 0 ||
              dict_set(d, "mean", PyFloat_FromDouble(st->mean)) < 0 ||
              dict_set(d, "nan_count", PyLong_FromLongLong(st->nan_count)) < 0 ||
              dict_set(d, "inf_count", PyLong_FromLongLong(st->inf_count)) < 0;
    } else if (st->is_unsigned64) {
        bad = dict_set(d, "min", PyLong_FromUnsignedLongLong(st->umin)) < 0 ||
              dict_set(d, "max", PyLong_FromUnsignedLongLong(st->umax)) < 0 ||
              dict_set(d, "mean", PyFloat_FromDouble(st->mean)) < 0;
    } else {
        bad = dict_set(d, "min", PyLong_FromLongLong(st->imin)) < 0 ||
              dict_set(d, "max", PyLong_FromLongLong(st->imax)) < 0 ||
              dict_set(d, "mean", PyFloat_FromDouble(st->mean)) < 0;
    }
    if (bad) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyDoc_STRVAR(tensor_stats_doc,
             "tensor_stats(tensor, /)\n--\n\n"
             "Level-5 statistics of a tensor: None for empty tensors and dtypes without\n"
             "statistics (and during CUDA graph capture), else a dict with min, max, mean,\n"
             "nan_count, inf_count (floating dtypes) or min, max (ints), mean (integers, bool).\n"
             "A CPU view is read once per stored element: broadcast dimensions (stride 0)\n"
             "once, counted as often as they repeat; a view overlapping otherwise beyond its\n"
             "storage is refused (ValueError).");

/* The statistics _save_tensors_taking_stats took, until _forget_stats (tests of the one-pass
 * write through the Python functions; a decorated call has its own memo, fi_call). */
static fi_stats_memo test_memo;

static PyObject *py_tensor_stats(PyObject *module, PyObject *tensor)
{
    (void)module;
    fi_stats st;
    PyObject *view;
    int64_t repeat;
    /* a dump's broadcast view is read once per stored element (docs/security.md) */
    if (fi_elements_distinct_view(tensor, "tensor_stats", &view, &repeat) < 0)
        return NULL;
    int r = fi_stats_of_tensor(view ? view : tensor, &test_memo, &st);
    Py_XDECREF(view);
    if (r < 0)
        return NULL;
    st.nan_count *= repeat;
    st.inf_count *= repeat;
    return stats_to_python(&st);
}

PyDoc_STRVAR(page_stats_doc, "_page_stats(tensor, pages, threads, /)\n--\n\n"
                             "Statistics of tensor[pages] (sorted unique page ids along dim 0)\n"
                             "taken in place as level 5 takes a paged cache's, on threads\n"
                             "threads; for tests.");

static PyObject *py_page_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !fi_is_tensor(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_page_stats(tensor, pages: list, threads: int)");
        return NULL;
    }
    long threads = PyLong_AsLong(args[2]);
    if (threads == -1 && PyErr_Occurred())
        return NULL;
    fi_tensor t;
    if (fi_tensor_from_py(args[0], &t) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[1]);
    fi_page_set ps = {malloc((size_t)(n ? n : 1) * sizeof(int64_t)), n, t.ndim ? t.shape[0] : 0, 0};
    if (!ps.page)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        ps.page[i] = PyLong_AsLongLong(PyList_GET_ITEM(args[1], i));
        if ((ps.page[i] == -1 && PyErr_Occurred()) || ps.page[i] < 0 || ps.page[i] >= ps.total ||
            (i && ps.page[i] <= ps.page[i - 1])) {
            free(ps.page);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "_page_stats: pages must be sorted, unique ids");
            return NULL;
        }
    }
    fi_stats st;
    memset(&st, 0, sizeof st);
    test_threads = threads < 1 ? 1 : (int)threads;
    int r = stats_of_pages(args[0], &t, &ps, NULL, &st);
    test_threads = 0;
    free(ps.page);
    return r < 0 ? NULL : stats_to_python(&st);
}

PyDoc_STRVAR(tensor_stats_torch_ops_doc,
             "_tensor_stats_torch_ops(tensor, /)\n--\n\n"
             "tensor_stats computed with torch ops (the CUDA path), on any device; for tests.");

static PyObject *py_tensor_stats_torch_ops(PyObject *module, PyObject *tensor)
{
    (void)module;
    fi_tensor t;
    fi_stats st;
    if (fi_tensor_from_py(tensor, &t) < 0)
        return NULL;
    if (stats_with_torch_ops(tensor, t.dtype, fi_tensor_numel(&t), &st) < 0)
        return NULL;
    return stats_to_python(&st);
}

PyDoc_STRVAR(format_tensor_stats_doc,
             "format_tensor_stats(tensor, indent, /)\n--\n\n"
             "The level-5 statistics lines of a tensor, each indented by indent levels of two\n"
             "spaces and ended by a newline; a failure gives \"[statistics error: message]\".");

#define MAX_INDENT 1024

static PyObject *py_format_tensor_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "format_tensor_stats takes 2 arguments (tensor, indent), got %zd", nargs);
        return NULL;
    }
    if (!fi_is_tensor(args[0])) {
        PyErr_Format(PyExc_TypeError, "format_tensor_stats: expected a torch.Tensor, got %.200s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    long indent = PyLong_AsLong(args[1]);
    if (indent == -1 && PyErr_Occurred())
        return NULL;
    if (indent < 0 || indent > MAX_INDENT) {
        PyErr_Format(PyExc_ValueError, "format_tensor_stats: indent %ld is not in [0, %d]", indent,
                     MAX_INDENT);
        return NULL;
    }
    fi_buf buf;
    fi_buf_init(&buf);
    PyObject *r = NULL;
    if (fi_stats_format_tensor(&buf, args[0], NULL, NULL, (int)indent) == 0)
        r = PyUnicode_DecodeUTF8(buf.data, (Py_ssize_t)buf.len, "replace");
    fi_buf_free(&buf);
    return r;
}

PyDoc_STRVAR(save_taking_stats_doc,
             "_save_tensors_taking_stats(path, tensors, safetensors=False, /)\n--\n\n"
             "save_tensors as a level-10 dump saves a call's inputs: the statistics taken\n"
             "while writing are what tensor_stats answers until _forget_stats(); returns how\n"
             "many tensors had them taken. For tests.");

static PyObject *py_save_taking_stats(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *path = NULL, *tensors;
    int safetensors = 0;
    if (!PyArg_ParseTuple(args, "O&O!|p:_save_tensors_taking_stats", PyUnicode_FSConverter, &path,
                          &PyDict_Type, &tensors, &safetensors))
        return NULL;
    int before = test_memo.count;
    Py_ssize_t n = fi_save_tensor_dict_stats(PyBytes_AS_STRING(path), tensors,
                                             safetensors ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH,
                                             fi_stats_memo_put, &test_memo);
    Py_DECREF(path);
    return n < 0 ? NULL : PyLong_FromLong(test_memo.count - before);
}

static PyObject *py_forget_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    fi_stats_memo_clear(&test_memo);
    Py_RETURN_NONE;
}

static PyMethodDef stats_methods[] = {
    {"_save_tensors_taking_stats", py_save_taking_stats, METH_VARARGS, save_taking_stats_doc},
    {"_forget_stats", py_forget_stats, METH_NOARGS, "_forget_stats()\n--\n\nFor tests."},
    {"tensor_stats", (PyCFunction)py_tensor_stats, METH_O, tensor_stats_doc},
    {"_page_stats", (PyCFunction)(void (*)(void))py_page_stats, METH_FASTCALL, page_stats_doc},
    {"format_tensor_stats", (PyCFunction)(void (*)(void))py_format_tensor_stats, METH_FASTCALL,
     format_tensor_stats_doc},
    {"_tensor_stats_torch_ops", (PyCFunction)py_tensor_stats_torch_ops, METH_O,
     tensor_stats_torch_ops_doc},
    {NULL, NULL, 0, NULL},
};

int fi_stats_exec(PyObject *module) { return PyModule_AddFunctions(module, stats_methods); }
