/* tensorio.c: save_tensors / load_tensors: collecting tensors with the GIL, writing a
 * temporary file without it and renaming it into place, and mapping files back. */
#include "tensorio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32_py.h"
#include "pickle.h"
#include "ptzip.h"
#include "safetensors.h"
#include "tensor.h"
#include "tensorbytes.h"

#define STAGE_SIZE ((size_t)64 << 10)

/* ---- saving ---- */

void fi_tensors_release(fi_saved_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Py_XDECREF(ts[i].key_obj);
        Py_XDECREF(ts[i].obj);
    }
    PyMem_Free(ts);
}

/* Host tensor with conjugate/negative bits resolved (raw memory must hold the values); a
 * CUDA tensor device takes stays where it is, unless a bit is set. Its metadata comes from
 * seen (NULL: read from Python). */
static PyObject *host_tensor(PyObject *value, PyObject *key, const fi_chunk_device *device,
                             fi_tensor_seen *seen)
{
    if (!fi_is_tensor(value)) {
        PyErr_Format(PyExc_TypeError, "tensors[%R] is not a torch.Tensor (got %.200s)", key,
                     Py_TYPE(value)->tp_name);
        return NULL;
    }
    fi_tensor meta;
    if (fi_tensor_seen_get(seen, value, &meta, 0) < 0)
        return NULL;
    int cuda = meta.device_type == FI_DEVICE_CUDA;
    int stays = cuda && device && device->takes(device, FI_DEVICE_CUDA);
    PyObject *t =
        cuda && !stays ? PyObject_CallMethodNoArgs(value, fi_names.cpu) : Py_NewRef(value);
    if (!t)
        return NULL;
    /* is_conj()/is_neg() read a flag; resolve_*() goes through torch's dispatcher, so it
     * runs only for the rare view that has the bit set */
    int plain = fi_tensor_seen_plain(t == value ? seen : NULL, t); /* a copy is no one's */
    if (plain != 0) {
        if (plain < 0)
            Py_CLEAR(t);
        return t;
    }
    PyObject *const bit[2] = {fi_names.is_conj, fi_names.is_neg};
    PyObject *const resolve[2] = {fi_names.resolve_conj, fi_names.resolve_neg};
    for (int k = 0; k < 2; k++) {
        PyObject *set = PyObject_CallMethodNoArgs(t, bit[k]);
        int is_set = set ? PyObject_IsTrue(set) : -1;
        Py_XDECREF(set);
        PyObject *r = is_set > 0 ? PyObject_CallMethodNoArgs(t, resolve[k]) : NULL;
        if (is_set == 0)
            continue;
        Py_DECREF(t);
        if (!r)
            return NULL;
        t = r;
        if (stays) { /* the values are not the raw memory: take them to the host */
            r = PyObject_CallMethodNoArgs(t, fi_names.cpu);
            Py_DECREF(t);
            if (!r)
                return NULL;
            t = r;
        }
    }
    return t;
}

static int collect_one(PyObject *key, PyObject *value, fi_saved_tensor *s, const fi_span_keep *keep,
                       const fi_chunk_device *device, fi_tensor_seen *seen)
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
    s->keep = keep;
    /* a device tensor whose kept parts come packed is not copied: only its metadata is read */
    int packed = keep && keep->packed && fi_is_tensor(value);
    if (!(s->obj = packed ? Py_NewRef(value) : host_tensor(value, key, device, seen)) ||
        fi_tensor_seen_get(s->obj == value ? seen : NULL, s->obj, &s->t, 1) < 0)
        return -1;
    if (s->t.device_type != FI_DEVICE_CPU && !packed &&
        !(device && device->takes(device, s->t.device_type))) {
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
    if ((s->requires_grad = fi_tensor_seen_requires_grad(s->obj == value ? seen : NULL, s->obj)) <
        0)
        return -1;
    s->itemsize = fi_dtype_size(s->t.dtype);
    uint64_t span;
    if (fi_view_bytes("tensors", key, s->t.dtype, s->t.ndim, s->t.shape, s->t.stride, &s->nbytes,
                      &span) < 0)
        return -1;
    s->span_bytes = span * s->itemsize;
    return 0;
}

int fi_tensors_collect(PyObject *dict, fi_saved_tensor **out, size_t *count, fi_keep_fn keep,
                       void *ctx, const fi_chunk_device *device, fi_tensor_seen *seen)
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
        int r = collect_one(key, value, &ts[i++], keep ? keep(ctx, value) : NULL, device, seen);
        Py_DECREF(key);
        Py_DECREF(value);
        if (r < 0) {
            fi_tensors_release(ts, (size_t)i);
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
    if (o.holes && !o.err && ftruncate(fd, (off_t)o.pos) < 0) /* a hole at the end */
        o.err = errno;
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

/* Points each CPU tensor saved as itself (no host copy, no resolved conj/neg bit) at its
 * slot of stats, for the writers to fill. */
static void ask_for_stats(PyObject *dict, fi_saved_tensor *ts, size_t n, fi_stats *stats)
{
    for (size_t i = 0; i < n; i++)
        if (PyDict_GetItem(dict, ts[i].key_obj) == ts[i].obj)
            ts[i].stats = &stats[i];
}

/* Collects dict's tensors and builds the format's header (the pickle for .pt). */
static int prepare(PyObject *dict, int format, fi_saved_tensor **ts, size_t *n, fi_buf *header,
                   fi_keep_fn keep, void *ctx, fi_tensor_seen *seen)
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
    if (fi_tensors_collect(dict, ts, n, keep, ctx, NULL, seen) < 0)
        return -1;
    fi_buf_init(header);
    int r = format == FI_FORMAT_SAFETENSORS ? fi_safetensors_header(header, *ts, *n)
                                            : fi_pickle_write_tensors(header, *ts, *n);
    if (r < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        fi_buf_free(header);
        fi_tensors_release(*ts, *n);
        return -1;
    }
    return 0;
}

Py_ssize_t fi_save_tensor_dict(const char *path, PyObject *dict, int format)
{
    return fi_save_tensor_dict_stats(path, dict, format, NULL, NULL);
}

Py_ssize_t fi_save_tensor_dict_stats(const char *path, PyObject *dict, int format,
                                     fi_stats_sink sink, void *ctx)
{
    fi_save_opts opts = {sink, ctx, NULL, NULL, 0, NULL, NULL};
    return fi_save_tensor_dict_opts(path, dict, format, &opts);
}

Py_ssize_t fi_save_tensor_dict_opts(const char *path, PyObject *dict, int format,
                                    const fi_save_opts *opts)
{
    fi_saved_tensor *ts;
    size_t n;
    fi_buf header;
    fi_stats_sink sink = opts->sink;
    if (prepare(dict, format, &ts, &n, &header, opts->keep, opts->keep_ctx, opts->seen) < 0)
        return -1;
    fi_stats *stats = sink ? PyMem_Calloc(n ? n : 1, sizeof(*stats)) : NULL;
    if (stats)
        ask_for_stats(dict, ts, n, stats);
    uint64_t written = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = write_file(path, format, ts, n, &header, &written);
    Py_END_ALLOW_THREADS
    for (size_t i = 0; stats && !err && i < n; i++)
        if (stats[i].kind != FI_STATS_NONE)
            sink(opts->sink_ctx, ts[i].obj, &stats[i]);
    PyMem_Free(stats);
    fi_buf_free(&header);
    fi_tensors_release(ts, n);
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        return -1;
    }
    return (Py_ssize_t)written;
}

/* At least the file's size: the tensor bytes, the header, and per record a generous
 * bound on the zip headers around it (local + alignment + central, zip64 included). */
static size_t image_bound(const fi_saved_tensor *ts, size_t n, size_t header_len)
{
    size_t bound = header_len + 4096 + (n + 8) * 512;
    for (size_t i = 0; i < n; i++)
        bound += (size_t)(ts[i].span_bytes > ts[i].nbytes ? ts[i].span_bytes : ts[i].nbytes);
    return bound;
}

Py_ssize_t fi_image_tensor_dict(PyObject *dict, int format, fi_image *img)
{
    fi_saved_tensor *ts;
    size_t n;
    fi_buf header;
    if (prepare(dict, format, &ts, &n, &header, NULL, NULL, NULL) < 0)
        return -1;
    size_t bound = image_bound(ts, n, header.len);
    if (img->cap < bound) { /* a fresh buffer: the old contents are not needed */
        free(img->data);
        img->data = malloc(bound);
        img->cap = img->data ? bound : 0;
    }
    img->len = 0;
    int err = ENOMEM;
    if (img->data) {
        /* the GIL stays held: the flight recorder's ring (the caller) relies on it */
        fi_out o = {.fd = -1, .mem = img->data, .mem_cap = img->cap, .defer_crc = 1};
        if (format == FI_FORMAT_SAFETENSORS)
            fi_safetensors_write(&o, ts, n, header.data, header.len);
        else
            fi_ptzip_write(&o, ts, n, header.data, header.len);
        err = o.err;
        img->len = err ? 0 : (size_t)o.pos;
        img->crc_deferred = format == FI_FORMAT_TORCH;
    }
    fi_buf_free(&header);
    fi_tensors_release(ts, n);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return (Py_ssize_t)img->len;
}

void fi_image_free(fi_image *img)
{
    free(img->data);
    img->data = NULL;
    img->len = img->cap = 0;
}

/* ---- loading ---- */

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
             "save_tensors(path, tensors, format='torch', keep=None) -> int\n\n"
             "Write dict {str: Tensor} to path as a PyTorch zip (.pt, format='torch') or a\n"
             "safetensors file; atomically (temporary file + rename). Returns bytes written.\n"
             "keep: {key: [(start, end), ...]} byte ranges of a tensor's span to write, sorted\n"
             "and disjoint, the rest written as holes (a sparse file; zeros when read); a value\n"
             "may be (ranges, packed): packed a uint8 CPU tensor holding the ranges' bytes one\n"
             "after another, written instead of the tensor's own memory.");

const fi_span_keep *fi_keep_map_find(void *ctx, PyObject *tensor)
{
    fi_keep_map *m = ctx;
    for (Py_ssize_t i = 0; i < m->n; i++)
        if (m->e[i].tensor == tensor)
            return &m->e[i].keep;
    return NULL;
}

void fi_keep_map_free(fi_keep_map *m)
{
    for (Py_ssize_t i = 0; m->e && i < m->n; i++)
        PyMem_Free(m->e[i].range);
    PyMem_Free(m->e);
}

/* One keep= value: a list of (start, end) pairs, or (that list, packed uint8 tensor). */
static int parse_keep_value(PyObject *key, PyObject *value, PyObject *tensor, fi_keep_entry *e)
{
    PyObject *ranges = value, *packed = NULL;
    if (PyTuple_Check(value) && PyTuple_GET_SIZE(value) == 2 &&
        fi_is_tensor(PyTuple_GET_ITEM(value, 1))) {
        ranges = PyTuple_GET_ITEM(value, 0);
        packed = PyTuple_GET_ITEM(value, 1);
    }
    PyObject *seq = PySequence_Fast(ranges, "keep values must be lists of (start, end) pairs");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    e->tensor = tensor;
    e->range = PyMem_Calloc(n ? (size_t)n : 1, sizeof(fi_byte_range));
    int r = e->range ? 0 : -1;
    uint64_t total = 0;
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        unsigned long long a, b;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &a, &b) || b < a ||
            (i > 0 && a < e->range[i - 1].end)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "keep[%R]: ranges must be sorted and disjoint", key);
            r = -1;
            break;
        }
        e->range[i] = (fi_byte_range){a, b};
        total += b - a;
    }
    Py_DECREF(seq);
    e->keep = (fi_span_keep){e->range, (size_t)n, NULL, -1, 0};
    if (r == 0 && packed) {
        fi_tensor t;
        if (fi_tensor_from_py(packed, &t) < 0)
            return -1;
        if (t.device_type != FI_DEVICE_CPU || t.dtype != FI_DTYPE_U8 ||
            !fi_tensor_is_contiguous(&t) || (uint64_t)fi_tensor_numel(&t) != total) {
            PyErr_Format(
                PyExc_ValueError,
                "keep[%R]: packed must be a contiguous uint8 CPU tensor of the ranges' %llu bytes",
                key, (unsigned long long)total);
            return -1;
        }
        e->keep.packed = t.data;
    }
    return r;
}

int fi_keep_map_parse(PyObject *keep, PyObject *dict, fi_keep_map *m)
{
    m->e = NULL;
    m->n = 0;
    if (!keep || keep == Py_None)
        return 0;
    if (!PyDict_Check(keep) || !PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "keep must be a dict {key: ranges}");
        return -1;
    }
    m->e = PyMem_Calloc((size_t)PyDict_GET_SIZE(keep) + 1, sizeof(fi_keep_entry));
    if (!m->e) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(keep, &pos, &key, &value)) {
        PyObject *tensor = PyDict_GetItemWithError(dict, key);
        if (!tensor) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "keep[%R]: no such tensor", key);
            return -1;
        }
        if (parse_keep_value(key, value, tensor, &m->e[m->n++]) < 0)
            return -1;
    }
    return 0;
}

static PyObject *save_tensors(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"path", "tensors", "format", "keep", NULL};
    PyObject *path = NULL, *dict, *keep = NULL;
    const char *format = "torch";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|sO:save_tensors", kwlist,
                                     PyUnicode_FSConverter, &path, &dict, &format, &keep))
        return NULL;
    int f = strcmp(format, "torch") == 0         ? FI_FORMAT_TORCH
            : strcmp(format, "safetensors") == 0 ? FI_FORMAT_SAFETENSORS
                                                 : -1;
    if (f < 0) {
        Py_DECREF(path);
        return PyErr_Format(PyExc_ValueError, "format must be 'torch' or 'safetensors', got '%s'",
                            format);
    }
    fi_keep_map m;
    Py_ssize_t n = -1;
    fi_save_opts opts = {NULL, NULL, fi_keep_map_find, &m, 0, NULL, NULL};
    if (fi_keep_map_parse(keep, dict, &m) == 0)
        n = fi_save_tensor_dict_opts(PyBytes_AS_STRING(path), dict, f, &opts);
    fi_keep_map_free(&m);
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
    if (fi_crc32_exec(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, tensorio_methods);
}
