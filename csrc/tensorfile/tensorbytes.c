/* tensorbytes.c: the plumbing the tensor-file formats share: the staged output file they
 * write through without the GIL, view sizes, and torch.Tensors over mapped file bytes. */
#include "tensorbytes.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "crc32.h"
#include "tensor.h"

/* ---- output file ---- */

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int fi_out_flush(fi_out *o)
{
    if (o->err)
        return -1;
    if (o->stage_len > 0) {
        int e = write_all(o->fd, o->stage, o->stage_len);
        o->stage_len = 0;
        if (e) {
            o->err = e;
            return -1;
        }
    }
    return 0;
}

/* The memory target of fi_out_write / fi_out_pwrite. */
static int mem_write(fi_out *o, const void *p, size_t n, uint64_t at)
{
    if (o->err)
        return -1;
    if (at > o->mem_cap || n > o->mem_cap - at) {
        o->err = ENOSPC;
        return -1;
    }
    memcpy(o->mem + at, p, n);
    return 0;
}

int fi_out_write(fi_out *o, const void *p, size_t n)
{
    if (o->mem) {
        if (mem_write(o, p, n, o->pos) < 0)
            return -1;
        o->pos += n;
        return 0;
    }
    if (o->err)
        return -1;
    if (n > o->stage_cap - o->stage_len && fi_out_flush(o) < 0)
        return -1;
    if (n <= o->stage_cap - o->stage_len) {
        memcpy(o->stage + o->stage_len, p, n);
        o->stage_len += n;
    } else {
        int e = write_all(o->fd, p, n);
        if (e) {
            o->err = e;
            return -1;
        }
    }
    o->pos += n;
    return 0;
}

int fi_out_skip(fi_out *o, uint64_t n)
{
    if (n == 0)
        return o->err ? -1 : 0;
    if (o->mem) {
        if (o->err || o->pos > o->mem_cap || n > o->mem_cap - o->pos) {
            o->err = o->err ? o->err : ENOSPC;
            return -1;
        }
        memset(o->mem + o->pos, 0, (size_t)n);
        o->pos += n;
        return 0;
    }
    if (fi_out_flush(o) < 0)
        return -1;
    o->pos += n;
    o->holes = 1;
    if (lseek(o->fd, (off_t)o->pos, SEEK_SET) < 0)
        o->err = errno;
    return o->err ? -1 : 0;
}

/* A quarter of this machine's L2: the block is still there for the CRC and the write. */
#define DENSE_BLOCK ((size_t)256 << 10)

/* n bytes from p, block by block. */
static int write_block_run(fi_out *o, const char *p, uint64_t n, uint32_t *crc, fi_stats_stream *st)
{
    int r = 0;
    for (uint64_t left = n; left > 0 && r == 0;) {
        size_t k = left < DENSE_BLOCK ? (size_t)left : DENSE_BLOCK;
        if (st)
            fi_stats_stream_feed(st, p, k);
        if (crc)
            *crc = fi_crc32(*crc, p, k);
        r = fi_out_write(o, p, k);
        p += k;
        left -= k;
    }
    return r;
}

int64_t fi_kept_elements(const fi_saved_tensor *s, uint64_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < s->keep->n; i++) {
        const fi_byte_range *r = &s->keep->range[i];
        uint64_t len = r->end - r->start;
        if (r->end > n || r->start % s->itemsize || len % s->itemsize ||
            (i + 1 < s->keep->n && len % (8 * s->itemsize)))
            return -1;
        total += len;
    }
    return (int64_t)(total / s->itemsize);
}

int fi_out_write_dense(fi_out *o, const fi_saved_tensor *s, uint64_t n, uint32_t *crc)
{
    fi_stats_stream *st = NULL;
    if (s->stats) {
        memset(s->stats, 0, sizeof(*s->stats));
        int64_t numel = !s->keep && n == s->nbytes && s->itemsize > 0  ? (int64_t)(n / s->itemsize)
                        : s->keep && n == s->nbytes && s->itemsize > 0 ? fi_kept_elements(s, n)
                                                                       : -1;
        if (numel >= 0)
            st = fi_stats_stream_new(s->t.dtype, numel);
    }
    int r = 0;
    if (!s->keep) {
        r = write_block_run(o, s->t.data, n, crc, st);
    } else {
        uint64_t at = 0;
        const char *packed = s->keep->packed;
        for (size_t i = 0; r == 0 && i < s->keep->n && at < n; i++) {
            uint64_t a = s->keep->range[i].start, b = s->keep->range[i].end;
            const char *src = packed ? packed : (const char *)s->t.data + a;
            if (packed)
                packed += b - a;
            if (a < at || b > n || b <= a)
                continue; /* not sorted and disjoint, or past the span: not written */
            if (crc)
                *crc = fi_crc32_zeros(*crc, a - at);
            r = fi_out_skip(o, a - at);
            if (r == 0)
                r = write_block_run(o, src, b - a, crc, st);
            at = b;
        }
        if (r == 0 && at < n) {
            if (crc)
                *crc = fi_crc32_zeros(*crc, n - at);
            r = fi_out_skip(o, n - at);
        }
    }
    if (st)
        fi_stats_stream_end(st, s->stats);
    if (r < 0 && s->stats)
        s->stats->kind = FI_STATS_NONE;
    return r;
}

int fi_out_pwrite(fi_out *o, const void *p, size_t n, uint64_t at)
{
    if (o->mem)
        return mem_write(o, p, n, at);
    const char *c = p;
    while (!o->err && n > 0) {
        ssize_t k = pwrite(o->fd, c, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            o->err = k < 0 ? errno : EIO;
            break;
        }
        c += k;
        at += (uint64_t)k;
        n -= (size_t)k;
    }
    return o->err ? -1 : 0;
}

/* ---- sizes ---- */

int fi_view_bytes(const char *path, PyObject *key, fi_dtype dtype, int ndim, const int64_t *shape,
                  const int64_t *stride, uint64_t *nbytes, uint64_t *span_elems)
{
    uint64_t isz = fi_dtype_size(dtype), numel = 1, span = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (stride && stride[i] < 0)) {
            PyErr_Format(PyExc_ValueError, "%s: tensor %R has a negative size or stride", path,
                         key);
            return -1;
        }
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            goto overflow;
    }
    if (__builtin_mul_overflow(numel, isz, nbytes) || *nbytes > (uint64_t)INT64_MAX)
        goto overflow;
    if (numel == 0)
        span = 0;
    for (int i = 0; numel > 0 && stride && i < ndim; i++) {
        uint64_t step;
        if (__builtin_mul_overflow((uint64_t)(shape[i] - 1), (uint64_t)stride[i], &step) ||
            __builtin_add_overflow(span, step, &span))
            goto overflow;
    }
    if (!stride)
        span = numel;
    if (span > (uint64_t)INT64_MAX / (isz ? isz : 1))
        goto overflow;
    *span_elems = span;
    return 0;
overflow:
    PyErr_Format(PyExc_ValueError, "%s: tensor %R: size in bytes overflows 64 bits", path, key);
    return -1;
}

/* ---- tensors over mapped bytes ---- */

static PyObject *torch_attr(const char *name)
{
    PyObject *torch = PyImport_ImportModule("torch");
    if (!torch)
        return NULL;
    PyObject *a = PyObject_GetAttrString(torch, name);
    Py_DECREF(torch);
    return a;
}

/* A uint8 tensor over file bytes [off, off + n) of the mapping (no copy). */
static PyObject *bytes_tensor(PyObject *mm, uint64_t off, uint64_t n)
{
    PyObject *u8 = fi_dtype_to_py(FI_DTYPE_U8);
    PyObject *fn = torch_attr(n ? "frombuffer" : "empty");
    if (!fn)
        return NULL;
    PyObject *kw = n ? Py_BuildValue("{sOsKsK}", "dtype", u8, "count", (unsigned long long)n,
                                     "offset", (unsigned long long)off)
                     : Py_BuildValue("{sO}", "dtype", u8);
    PyObject *args = n ? PyTuple_Pack(1, mm) : Py_BuildValue("(i)", 0);
    PyObject *t = kw && args ? PyObject_Call(fn, args, kw) : NULL;
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(fn);
    return t;
}

static PyObject *int_tuple(const int64_t *v, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* bytes (uint8, 1-d) -> .view(dtype).as_strided(shape, stride, offset). Steals bytes. */
static PyObject *shape_view(PyObject *bytes, const fi_loaded_tensor *lt, const int64_t *stride,
                            int64_t offset)
{
    if (!bytes)
        return NULL;
    PyObject *typed = PyObject_CallMethod(bytes, "view", "O", fi_dtype_to_py(lt->dtype));
    Py_DECREF(bytes);
    if (!typed)
        return NULL;
    PyObject *shape = int_tuple(lt->shape, lt->ndim), *st = int_tuple(stride, lt->ndim);
    PyObject *t =
        shape && st ? PyObject_CallMethod(typed, "as_strided", "OOL", shape, st, (long long)offset)
                    : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(st);
    Py_DECREF(typed);
    return t;
}

void fi_scatter_to_strides(char *dst, const char *src, const fi_loaded_tensor *lt)
{
    int nd = lt->ndim;
    size_t isz = fi_dtype_size(lt->dtype);
    int64_t idx[FI_MAX_DIMS] = {0};
    if (nd == 0) {
        memcpy(dst, src, isz);
        return;
    }
    int64_t inner = lt->shape[nd - 1], istride = lt->stride[nd - 1] * (int64_t)isz;
    for (;;) {
        char *row = dst;
        for (int d = 0; d < nd - 1; d++)
            row += idx[d] * lt->stride[d] * (int64_t)isz;
        for (int64_t j = 0; j < inner; j++, src += isz)
            memcpy(row + j * istride, src, isz);
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == lt->shape[d])
            idx[d--] = 0;
        if (d < 0)
            return;
    }
}

static PyObject *extent_error(const char *path, const fi_loaded_tensor *lt, uint64_t span)
{
    return PyErr_Format(PyExc_ValueError,
                        "%s: tensor %R: view of %llu elements at offset %lld does not fit its "
                        "storage of %llu bytes",
                        path, lt->key, (unsigned long long)span, (long long)lt->storage_offset,
                        (unsigned long long)lt->data_nbytes);
}

/* Strides of contiguous data are restored by copying into a fresh storage of the view's
 * span, unless they already are contiguous or the span lies far beyond the data
 * (hostile strides): then the contiguous strides are kept. */
static int needs_restore(const fi_loaded_tensor *lt, uint64_t span_bytes)
{
    int64_t expect = 1;
    int same = 1;
    for (int i = lt->ndim - 1; i >= 0; i--) {
        same &= lt->shape[i] == 1 || lt->stride[i] == expect;
        expect *= lt->shape[i];
    }
    return !same && lt->data_nbytes > 0 && span_bytes <= 16 * lt->data_nbytes + 4096;
}

/* Whether every stride of the view is 0: one element broadcast to its shape (the zero a
 * scratch tensor is recorded as, docs/dump-format.md#scratch-tensors). */
static int broadcast_scalar(const fi_loaded_tensor *lt)
{
    for (int i = 0; i < lt->ndim; i++)
        if (lt->stride[i] != 0 && lt->shape[i] > 1)
            return 0;
    return 1;
}

/* The FI_VIEW_* bound: elements of the view against the elements its storage holds. One
 * element broadcast to the whole view may reach FI_VIEW_MAX_ELEMENTS: every reader reads it
 * once. */
static int view_justified(const char *path, const fi_loaded_tensor *lt, uint64_t numel)
{
    size_t isz = fi_dtype_size(lt->dtype);
    uint64_t stored = lt->data_nbytes / (isz ? isz : 1);
    if (numel <= stored)
        return 0;
    uint64_t allowed = stored > (FI_VIEW_MAX_ELEMENTS - FI_VIEW_FREE_ELEMENTS) / FI_VIEW_REPEAT ||
                               (stored > 0 && broadcast_scalar(lt))
                           ? FI_VIEW_MAX_ELEMENTS
                           : stored * FI_VIEW_REPEAT + FI_VIEW_FREE_ELEMENTS;
    if (numel <= allowed)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: tensor %R: a view of %llu elements over a storage of %llu elements is "
                 "refused (a view may repeat stored elements up to %llu times plus %llu, and "
                 "hold at most %llu elements)",
                 path, lt->key, (unsigned long long)numel, (unsigned long long)stored,
                 FI_VIEW_REPEAT, FI_VIEW_FREE_ELEMENTS, FI_VIEW_MAX_ELEMENTS);
    return -1;
}

int fi_tensor_extent(const char *path, const fi_loaded_tensor *lt, fi_extent *e)
{
    size_t isz = fi_dtype_size(lt->dtype);
    uint64_t nbytes, span;
    if (fi_view_bytes(path, lt->key, lt->dtype, lt->ndim, lt->shape, lt->stride, &nbytes, &span) <
        0)
        return -1;
    if (view_justified(path, lt, nbytes / (isz ? isz : 1)) < 0)
        return -1;
    memset(e, 0, sizeof(*e));
    if (lt->contiguous_in_file) {
        if (nbytes > lt->data_nbytes) {
            extent_error(path, lt, nbytes / (isz ? isz : 1));
            return -1;
        }
        e->offset = lt->data_offset;
        e->nbytes = nbytes;
        e->restore_bytes = needs_restore(lt, span * isz) ? span * isz : 0;
        return 0;
    }
    uint64_t storage = lt->data_nbytes / isz;
    if (lt->data_nbytes % isz != 0 || lt->storage_offset < 0 ||
        (span > 0 && ((uint64_t)lt->storage_offset > storage ||
                      span > storage - (uint64_t)lt->storage_offset))) {
        extent_error(path, lt, span);
        return -1;
    }
    e->offset = lt->data_offset + (uint64_t)lt->storage_offset * isz;
    e->nbytes = span * isz;
    return 0;
}

PyObject *fi_zeros_bytes(uint64_t n, char **data)
{
    PyObject *zeros = torch_attr("zeros");
    if (!zeros)
        return NULL;
    PyObject *kw = Py_BuildValue("{sO}", "dtype", fi_dtype_to_py(FI_DTYPE_U8));
    PyObject *args = Py_BuildValue("(K)", (unsigned long long)n);
    PyObject *buf = kw && args ? PyObject_Call(zeros, args, kw) : NULL;
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(zeros);
    if (!buf)
        return NULL;
    PyObject *ptr = PyObject_CallMethodNoArgs(buf, fi_names.data_ptr);
    *data = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    if (!*data && n > 0) {
        Py_DECREF(buf);
        return NULL;
    }
    return buf;
}

PyObject *fi_tensor_over_bytes(PyObject *bytes, const fi_loaded_tensor *lt)
{
    PyObject *t = shape_view(bytes, lt, lt->stride, lt->storage_offset);
    if (t && lt->requires_grad) {
        PyObject *r = PyObject_CallMethod(t, "requires_grad_", "O", Py_True);
        if (!r)
            Py_CLEAR(t);
        Py_XDECREF(r);
    }
    return t;
}

/* Contiguous file data restored to the recorded strides in a new storage. */
static PyObject *restored_tensor(const uint8_t *base, const fi_loaded_tensor *lt,
                                 const fi_extent *e)
{
    char *dst;
    PyObject *buf = fi_zeros_bytes(e->restore_bytes, &dst);
    if (!buf)
        return NULL;
    fi_scatter_to_strides(dst, (const char *)base + e->offset, lt);
    return shape_view(buf, lt, lt->stride, 0);
}

PyObject *fi_tensor_from_mapping(PyObject *mm, const uint8_t *base, const char *path,
                                 const fi_loaded_tensor *lt)
{
    if (!fi_dtype_to_py(lt->dtype)) {
        PyErr_Format(PyExc_ValueError, "%s: tensor %R: dtype %s is not in this torch", path,
                     lt->key, fi_dtype_name(lt->dtype));
        return NULL;
    }
    fi_extent e;
    if (fi_tensor_extent(path, lt, &e) < 0)
        return NULL;
    PyObject *t;
    if (e.restore_bytes) {
        t = restored_tensor(base, lt, &e);
    } else if (lt->contiguous_in_file) {
        int64_t contig[FI_MAX_DIMS], expect = 1;
        for (int i = lt->ndim - 1; i >= 0; i--) {
            contig[i] = expect;
            expect *= lt->shape[i];
        }
        t = shape_view(bytes_tensor(mm, lt->data_offset, lt->data_nbytes), lt, contig, 0);
    } else {
        t = shape_view(bytes_tensor(mm, lt->data_offset, lt->data_nbytes), lt, lt->stride,
                       lt->storage_offset);
    }
    if (t && lt->requires_grad) {
        PyObject *r = PyObject_CallMethod(t, "requires_grad_", "O", Py_True);
        if (!r) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: tensor %R: dtype %s cannot require grad", path,
                         lt->key, fi_dtype_name(lt->dtype));
            Py_CLEAR(t);
        }
        Py_XDECREF(r);
    }
    return t;
}

void fi_loaded_tensors_free(fi_loaded_tensor *ts, size_t count)
{
    if (!ts)
        return;
    for (size_t k = 0; k < count; k++)
        Py_XDECREF(ts[k].key);
    PyMem_Free(ts);
}
