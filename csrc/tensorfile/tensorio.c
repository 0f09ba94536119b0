/* tensorio.c: save_tensors / load_tensors: collecting tensors with the GIL, writing a
 * temporary file without it and renaming it into place, and mapping files back. */
#include "tensorio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32.h"
#include "pickle.h"
#include "ptzip.h"
#include "safetensors.h"
#include "tensor.h"

#define STAGE_SIZE ((size_t)64 << 10)

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

int fi_out_write(fi_out *o, const void *p, size_t n)
{
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

int fi_out_pwrite(fi_out *o, const void *p, size_t n, uint64_t at)
{
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

/* ---- saving ---- */

static void free_saved(fi_saved_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Py_XDECREF(ts[i].key_obj);
        Py_XDECREF(ts[i].obj);
    }
    PyMem_Free(ts);
}

/* Host tensor with conjugate/negative bits resolved (raw memory must hold the values). */
static PyObject *host_tensor(PyObject *value, PyObject *key)
{
    if (!fi_is_tensor(value)) {
        PyErr_Format(PyExc_TypeError, "tensors[%R] is not a torch.Tensor (got %.200s)", key,
                     Py_TYPE(value)->tp_name);
        return NULL;
    }
    PyObject *is_cuda = PyObject_GetAttr(value, fi_names.is_cuda);
    if (!is_cuda)
        return NULL;
    int cuda = PyObject_IsTrue(is_cuda);
    Py_DECREF(is_cuda);
    PyObject *t = cuda ? PyObject_CallMethodNoArgs(value, fi_names.cpu) : Py_NewRef(value);
    if (!t)
        return NULL;
    static const char *const resolve[] = {"resolve_conj", "resolve_neg"};
    for (int k = 0; k < 2; k++) {
        PyObject *r = PyObject_CallMethod(t, resolve[k], NULL);
        Py_DECREF(t);
        if (!r)
            return NULL;
        t = r;
    }
    return t;
}

static int collect_one(PyObject *key, PyObject *value, fi_saved_tensor *s)
{
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "tensor dict keys must be str, got %.200s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    Py_ssize_t klen;
    s->key = PyUnicode_AsUTF8AndSize(key, &klen);
    if (!s->key)
        return -1;
    s->key_len = (size_t)klen;
    s->key_obj = Py_NewRef(key);
    if (!(s->obj = host_tensor(value, key)) || fi_tensor_from_py(s->obj, &s->t) < 0)
        return -1;
    if (s->t.device_type != FI_DEVICE_CPU) {
        PyErr_Format(PyExc_ValueError, "tensors[%R] is not on the CPU or a CUDA device", key);
        return -1;
    }
    if (s->t.dtype == FI_DTYPE_UNKNOWN) {
        PyObject *dt = PyObject_GetAttr(s->obj, fi_names.dtype);
        if (dt)
            PyErr_Format(PyExc_ValueError, "tensors[%R] has dtype %R, which cannot be saved", key,
                         dt);
        Py_XDECREF(dt);
        return -1;
    }
    PyObject *rg = PyObject_GetAttr(s->obj, fi_names.requires_grad);
    if (!rg)
        return -1;
    s->requires_grad = PyObject_IsTrue(rg);
    Py_DECREF(rg);
    s->itemsize = fi_dtype_size(s->t.dtype);
    uint64_t span;
    if (fi_view_bytes("tensors", key, s->t.dtype, s->t.ndim, s->t.shape, s->t.stride, &s->nbytes,
                      &span) < 0)
        return -1;
    s->span_bytes = span * s->itemsize;
    return 0;
}

static int collect(PyObject *dict, fi_saved_tensor **out, size_t *count)
{
    Py_ssize_t n = PyDict_GET_SIZE(dict);
    fi_saved_tensor *ts = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*ts));
    if (!ts) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0, i = 0;
    while (i < n && PyDict_Next(dict, &pos, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        int r = collect_one(key, value, &ts[i++]);
        Py_DECREF(key);
        Py_DECREF(value);
        if (r < 0) {
            free_saved(ts, (size_t)i);
            return -1;
        }
    }
    *out = ts;
    *count = (size_t)i;
    return 0;
}

/* Writes the whole file under a temporary name beside path and renames it into place,
 * all without the GIL. Returns 0 or an errno value. */
static int write_file(const char *path, int format, const fi_saved_tensor *ts, size_t n,
                      const fi_buf *header, uint64_t *written)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    char *stage = malloc(STAGE_SIZE);
    if (!tmp || !stage) {
        free(tmp);
        free(stage);
        return ENOMEM;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmpXXXXXX", 11);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        free(stage);
        return e;
    }
    fi_out o = {.fd = fd, .stage = stage, .stage_cap = STAGE_SIZE};
    if (format == FI_FORMAT_SAFETENSORS)
        fi_safetensors_write(&o, ts, n, header->data, header->len);
    else
        fi_ptzip_write(&o, ts, n, header->data, header->len);
    fi_out_flush(&o);
    if (close(fd) < 0 && !o.err)
        o.err = errno;
    if (!o.err && rename(tmp, path) < 0)
        o.err = errno;
    if (o.err)
        unlink(tmp);
    free(tmp);
    free(stage);
    *written = o.pos;
    return o.err;
}

Py_ssize_t fi_save_tensor_dict(const char *path, PyObject *dict, int format)
{
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "tensors must be a dict {str: Tensor}, got %.200s",
                     Py_TYPE(dict)->tp_name);
        return -1;
    }
    if (format != FI_FORMAT_TORCH && format != FI_FORMAT_SAFETENSORS) {
        PyErr_Format(PyExc_ValueError, "format %d is not FI_FORMAT_TORCH or _SAFETENSORS", format);
        return -1;
    }
    fi_saved_tensor *ts;
    size_t n;
    if (collect(dict, &ts, &n) < 0)
        return -1;
    fi_buf header;
    fi_buf_init(&header);
    int r = format == FI_FORMAT_SAFETENSORS ? fi_safetensors_header(&header, ts, n)
                                            : fi_pickle_write_tensors(&header, ts, n);
    if (r < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        fi_buf_free(&header);
        free_saved(ts, n);
        return -1;
    }
    uint64_t written = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS err = write_file(path, format, ts, n, &header, &written);
    Py_END_ALLOW_THREADS fi_buf_free(&header);
    free_saved(ts, n);
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        return -1;
    }
    return (Py_ssize_t)written;
}

/* ---- loading ---- */

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

int fi_tensor_extent(const char *path, const fi_loaded_tensor *lt, fi_extent *e)
{
    size_t isz = fi_dtype_size(lt->dtype);
    uint64_t nbytes, span;
    if (fi_view_bytes(path, lt->key, lt->dtype, lt->ndim, lt->shape, lt->stride, &nbytes, &span) <
        0)
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

/* Contiguous file data restored to the recorded strides in a new storage. */
static PyObject *restored_tensor(const uint8_t *base, const fi_loaded_tensor *lt,
                                 const fi_extent *e)
{
    PyObject *zeros = torch_attr("zeros");
    if (!zeros)
        return NULL;
    PyObject *kw = Py_BuildValue("{sO}", "dtype", fi_dtype_to_py(FI_DTYPE_U8));
    PyObject *args = Py_BuildValue("(K)", (unsigned long long)e->restore_bytes);
    PyObject *buf = kw && args ? PyObject_Call(zeros, args, kw) : NULL;
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(zeros);
    if (!buf)
        return NULL;
    PyObject *ptr = PyObject_CallMethodNoArgs(buf, fi_names.data_ptr);
    char *dst = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    if (!dst) {
        Py_DECREF(buf);
        return NULL;
    }
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

/* {key: Tensor} built over the mapping from descriptions ts, which it frees. */
static PyObject *tensor_dict(PyObject *mm, const uint8_t *data, const char *path,
                             fi_loaded_tensor *ts, size_t n)
{
    PyObject *result = PyDict_New();
    for (size_t k = 0; result && k < n; k++) {
        PyObject *t = fi_tensor_from_mapping(mm, data, path, &ts[k]);
        if (!t || PyDict_SetItem(result, ts[k].key, t) < 0)
            Py_CLEAR(result);
        Py_XDECREF(t);
    }
    fi_loaded_tensors_free(ts, n);
    return result;
}

PyObject *fi_load_tensor_dict(const char *path)
{
    /* Non-blocking: opening a FIFO for reading would otherwise wait for a writer
     * forever; fstat below refuses anything but a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 8) {
        close(fd);
        PyErr_Format(PyExc_ValueError, "%s: not a tensor file (%s)", path,
                     S_ISREG(st.st_mode) ? "shorter than 8 bytes" : "not a regular file");
        return NULL;
    }
    PyObject *mmap_mod = PyImport_ImportModule("mmap");
    PyObject *mm = NULL;
    if (mmap_mod) {
        PyObject *mmap_type = PyObject_GetAttrString(mmap_mod, "mmap");
        PyObject *access = PyObject_GetAttrString(mmap_mod, "ACCESS_COPY");
        PyObject *args = Py_BuildValue("(ii)", fd, 0);
        PyObject *kw = access ? Py_BuildValue("{sO}", "access", access) : NULL;
        if (mmap_type && args && kw)
            mm = PyObject_Call(mmap_type, args, kw);
        Py_XDECREF(mmap_type);
        Py_XDECREF(access);
        Py_XDECREF(args);
        Py_XDECREF(kw);
        Py_DECREF(mmap_mod);
    }
    close(fd);
    if (!mm)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(mm);
        return NULL;
    }
    const uint8_t *data = view.buf;
    size_t size = (size_t)view.len;
    fi_loaded_tensor *ts;
    size_t n;
    int parsed = fi_ptzip_sniff(data, size) ? fi_ptzip_describe(path, data, size, &ts, &n)
                                            : fi_safetensors_describe(path, data, size, &ts, &n);
    PyObject *result = parsed < 0 ? NULL : tensor_dict(mm, data, path, ts, n);
    PyBuffer_Release(&view);
    Py_DECREF(mm);
    return result;
}

/* ---- Python-facing ---- */

PyDoc_STRVAR(save_tensors_doc,
             "save_tensors(path, tensors, format='torch') -> int\n\n"
             "Write dict {str: Tensor} to path as a PyTorch zip (.pt, format='torch') or a\n"
             "safetensors file; atomically (temporary file + rename). Returns bytes written.");

static PyObject *save_tensors(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"path", "tensors", "format", NULL};
    PyObject *path = NULL, *dict;
    const char *format = "torch";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|s:save_tensors", kwlist,
                                     PyUnicode_FSConverter, &path, &dict, &format))
        return NULL;
    int f = strcmp(format, "torch") == 0         ? FI_FORMAT_TORCH
            : strcmp(format, "safetensors") == 0 ? FI_FORMAT_SAFETENSORS
                                                 : -1;
    if (f < 0) {
        Py_DECREF(path);
        return PyErr_Format(PyExc_ValueError, "format must be 'torch' or 'safetensors', got '%s'",
                            format);
    }
    Py_ssize_t n = fi_save_tensor_dict(PyBytes_AS_STRING(path), dict, f);
    Py_DECREF(path);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

PyDoc_STRVAR(load_tensors_doc,
             "load_tensors(path) -> dict[str, Tensor]\n\n"
             "Read a .pt (PyTorch zip) or .safetensors file, memory-mapped, never running\n"
             "pickle code. Tensors keep their recorded shape, stride, dtype, requires_grad.");

static PyObject *load_tensors(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    PyObject *r = fi_load_tensor_dict(PyBytes_AS_STRING(path));
    Py_DECREF(path);
    return r;
}

static PyMethodDef tensorio_methods[] = {
    {"save_tensors", (PyCFunction)(void (*)(void))save_tensors, METH_VARARGS | METH_KEYWORDS,
     save_tensors_doc},
    {"load_tensors", load_tensors, METH_O, load_tensors_doc},
    {NULL, NULL, 0, NULL},
};

int fi_tensorio_exec(PyObject *module)
{
    fi_crc32_init();
    return PyModule_AddFunctions(module, tensorio_methods);
}
