/* safetensors.c: safetensors files: written contiguous from (possibly strided) tensor
 * memory with the original strides in __metadata__, and read back memory-mapped. */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tensor.h"

#define ST_CHUNK ((size_t)1 << 20)
#define ST_MAX_HEADER ((uint64_t)100 << 20)
#define META_STRIDES "flashinfer.strides"
#define META_GRAD "flashinfer.requires_grad"

static const char *const st_codes[FI_DTYPE_COUNT] = {
    [FI_DTYPE_F64] = "F64",
    [FI_DTYPE_F32] = "F32",
    [FI_DTYPE_F16] = "F16",
    [FI_DTYPE_BF16] = "BF16",
    [FI_DTYPE_E4M3FN] = "F8_E4M3",
    [FI_DTYPE_E5M2] = "F8_E5M2",
    [FI_DTYPE_E4M3FNUZ] = "F8_E4M3FNUZ",
    [FI_DTYPE_E5M2FNUZ] = "F8_E5M2FNUZ",
    [FI_DTYPE_I64] = "I64",
    [FI_DTYPE_I32] = "I32",
    [FI_DTYPE_I16] = "I16",
    [FI_DTYPE_I8] = "I8",
    [FI_DTYPE_U8] = "U8",
    [FI_DTYPE_U16] = "U16",
    [FI_DTYPE_U32] = "U32",
    [FI_DTYPE_U64] = "U64",
    [FI_DTYPE_BOOL] = "BOOL",
    [FI_DTYPE_C64] = "C64",
};

static void put_int_list(fi_buf *b, const int64_t *v, int n)
{
    fi_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i > 0)
            fi_buf_append(b, ", ", 2);
        fi_json_int64(b, v[i]);
    }
    fi_buf_putc(b, ']');
}

int fi_safetensors_header(fi_buf *b, const fi_saved_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!st_codes[ts[i].t.dtype]) {
            PyErr_Format(PyExc_ValueError,
                         "tensor '%s' has dtype torch.%s, which safetensors cannot store; "
                         "use format='torch'",
                         ts[i].key, fi_dtype_name(ts[i].t.dtype));
            return -1;
        }
    fi_buf strides, grads;
    fi_buf_init(&strides);
    fi_buf_init(&grads);
    fi_buf_putc(&strides, '{');
    fi_buf_putc(&grads, '[');
    int any_grad = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            fi_buf_append(&strides, ", ", 2);
        fi_json_str(&strides, ts[i].key, ts[i].key_len);
        fi_buf_append(&strides, ": ", 2);
        put_int_list(&strides, ts[i].t.stride, ts[i].t.ndim);
        if (ts[i].requires_grad) {
            if (any_grad++)
                fi_buf_append(&grads, ", ", 2);
            fi_json_str(&grads, ts[i].key, ts[i].key_len);
        }
    }
    fi_buf_putc(&strides, '}');
    fi_buf_putc(&grads, ']');
    fi_buf_puts(b, "{\"__metadata__\": {\"" META_STRIDES "\": ");
    fi_json_str(b, strides.data, strides.len);
    fi_buf_puts(b, ", \"" META_GRAD "\": ");
    fi_json_str(b, grads.data, grads.len);
    fi_buf_putc(b, '}');
    fi_buf_free(&strides);
    fi_buf_free(&grads);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        fi_buf_append(b, ", ", 2);
        fi_json_str(b, ts[i].key, ts[i].key_len);
        fi_buf_printf(b, ": {\"dtype\": \"%s\", \"shape\": ", st_codes[ts[i].t.dtype]);
        put_int_list(b, ts[i].t.shape, ts[i].t.ndim);
        fi_buf_printf(b, ", \"data_offsets\": [%llu, %llu]}", (unsigned long long)off,
                      (unsigned long long)(off + ts[i].nbytes));
        off += ts[i].nbytes;
    }
    fi_buf_putc(b, '}');
    while (b->len % 8 != 0)
        fi_buf_putc(b, ' ');
    if (b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Copies a strided view out in row-major order through a bounce buffer. */
static int write_strided(fi_out *o, const fi_saved_tensor *s, char *buf)
{
    const fi_tensor *t = &s->t;
    size_t isz = s->itemsize, used = 0;
    int nd = t->ndim;
    int64_t idx[FI_MAX_DIMS] = {0};
    int64_t inner = t->shape[nd - 1], istride = t->stride[nd - 1] * (int64_t)isz;
    for (;;) {
        const char *row = t->data;
        for (int d = 0; d < nd - 1; d++)
            row += idx[d] * t->stride[d] * (int64_t)isz;
        for (int64_t j = 0; j < inner; j++) {
            if (used + isz > ST_CHUNK) {
                if (fi_out_write(o, buf, used) < 0)
                    return -1;
                used = 0;
            }
            memcpy(buf + used, row + j * istride, isz);
            used += isz;
        }
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == t->shape[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
    return fi_out_write(o, buf, used);
}

int fi_safetensors_write(fi_out *o, const fi_saved_tensor *ts, size_t n, const char *header,
                         size_t header_len)
{
    uint8_t len[8];
    for (int k = 0; k < 8; k++)
        len[k] = (uint8_t)((uint64_t)header_len >> (8 * k));
    if (fi_out_write(o, len, 8) < 0 || fi_out_write(o, header, header_len) < 0)
        return -1;
    char *buf = NULL;
    for (size_t i = 0; i < n; i++) {
        const fi_saved_tensor *s = &ts[i];
        if (s->nbytes == 0)
            continue;
        if (fi_tensor_is_contiguous(&s->t)) {
            if (fi_out_write(o, s->t.data, s->nbytes) < 0)
                break;
            continue;
        }
        if (!buf && !(buf = malloc(ST_CHUNK))) {
            o->err = ENOMEM;
            break;
        }
        if (write_strided(o, s, buf) < 0)
            break;
    }
    free(buf);
    return o->err ? -1 : 0;
}

/* ---- reader ---- */

static int st_error(const char *path, const char *fmt, PyObject *key)
{
    PyObject *msg = PyUnicode_FromFormat(fmt, key);
    if (msg)
        PyErr_Format(PyExc_ValueError, "%s: not a valid safetensors file: %U", path, msg);
    Py_XDECREF(msg);
    return -1;
}

static int int_list(PyObject *list, int64_t *dst, int max)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) > max)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (!PyLong_Check(v))
            return -1;
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || x < 0)
            return -1;
        dst[i] = x;
    }
    return (int)PyList_GET_SIZE(list);
}

static fi_dtype dtype_of_code(PyObject *code)
{
    const char *s = PyUnicode_Check(code) ? PyUnicode_AsUTF8(code) : NULL;
    if (!s) {
        PyErr_Clear();
        return FI_DTYPE_UNKNOWN;
    }
    /* Whether this torch has the dtype is checked when the tensor is built. */
    for (int d = 0; d < FI_DTYPE_COUNT; d++)
        if (st_codes[d] && strcmp(st_codes[d], s) == 0)
            return (fi_dtype)d;
    return FI_DTYPE_UNKNOWN;
}

/* __metadata__ values are strings; ours hold JSON. Missing keys give NULL, no error. */
static PyObject *meta_json(const char *path, PyObject *meta, const char *name)
{
    if (!meta)
        return NULL;
    PyObject *s = PyDict_GetItemString(meta, name);
    if (!s || !PyUnicode_Check(s))
        return NULL;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u)
        return NULL;
    char what[600];
    snprintf(what, sizeof(what), "%s: __metadata__[%s]", path, name);
    return fi_json_parse(u, (size_t)n, what);
}

static int fill_tensor(const char *path, PyObject *key, PyObject *info, uint64_t data_start,
                       uint64_t data_len, PyObject *strides, PyObject *grads, fi_loaded_tensor *lt)
{
    if (!PyDict_Check(info))
        return st_error(path, "entry %R is not an object", key);
    PyObject *code = PyDict_GetItemString(info, "dtype");
    PyObject *shape = PyDict_GetItemString(info, "shape");
    PyObject *offs = PyDict_GetItemString(info, "data_offsets");
    if (!code || !shape || !offs)
        return st_error(path, "entry %R lacks dtype, shape or data_offsets", key);
    memset(lt, 0, sizeof(*lt));
    lt->dtype = dtype_of_code(code);
    if (lt->dtype == FI_DTYPE_UNKNOWN)
        return st_error(path, "entry %R has an unknown dtype", key);
    lt->ndim = int_list(shape, lt->shape, FI_MAX_DIMS);
    if (lt->ndim < 0)
        return st_error(path, "entry %R: shape is not a list of at most 16 sizes", key);
    int64_t be[2];
    if (int_list(offs, be, 2) != 2 || be[0] > be[1] || (uint64_t)be[1] > data_len)
        return st_error(path, "entry %R: data_offsets lie outside the data", key);
    uint64_t nbytes, span;
    if (fi_view_bytes(path, key, lt->dtype, lt->ndim, lt->shape, NULL, &nbytes, &span) < 0)
        return -1;
    if (nbytes != (uint64_t)(be[1] - be[0]))
        return st_error(path, "entry %R: data_offsets do not match shape and dtype", key);
    int64_t expect = 1;
    for (int i = lt->ndim - 1; i >= 0; i--) {
        lt->stride[i] = expect;
        expect *= lt->shape[i];
    }
    PyObject *rec = strides && PyDict_Check(strides) ? PyDict_GetItem(strides, key) : NULL;
    int64_t st[FI_MAX_DIMS];
    if (rec && int_list(rec, st, FI_MAX_DIMS) == lt->ndim)
        memcpy(lt->stride, st, sizeof(st[0]) * (size_t)lt->ndim);
    if (grads && PyList_Check(grads)) { /* ours: the keys that require grad */
        int has = PySequence_Contains(grads, key);
        if (has < 0)
            return -1;
        lt->requires_grad = has;
    } else if (grads && PyDict_Check(grads)) { /* {key: bool} is accepted too */
        PyObject *flag = PyDict_GetItem(grads, key);
        lt->requires_grad = flag == Py_True;
    }
    lt->key = Py_NewRef(key);
    lt->data_offset = data_start + (uint64_t)be[0];
    lt->data_nbytes = nbytes;
    lt->contiguous_in_file = 1;
    return 0;
}

/* The header's JSON object, after checking its length fits the file. New reference. */
static PyObject *parse_header(const char *path, const uint8_t *data, size_t size, uint64_t *hlen)
{
    if (size < 8) {
        PyErr_Format(PyExc_ValueError, "%s: not a valid safetensors file: %zu bytes is too short",
                     path, size);
        return NULL;
    }
    *hlen = 0;
    for (int k = 0; k < 8; k++)
        *hlen |= (uint64_t)data[k] << (8 * k);
    if (*hlen > size - 8 || *hlen > ST_MAX_HEADER || *hlen < 2 || data[8] != '{') {
        PyErr_Format(PyExc_ValueError,
                     "%s: not a valid safetensors file: header length %llu does not fit the "
                     "%zu-byte file (or the header is not a JSON object)",
                     path, (unsigned long long)*hlen, size);
        return NULL;
    }
    char what[600];
    snprintf(what, sizeof(what), "%s: safetensors header", path);
    PyObject *header = fi_json_parse((const char *)data + 8, (size_t)*hlen, what);
    if (header && !PyDict_Check(header)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: not a valid safetensors file: header is not a JSON object", path);
        Py_CLEAR(header);
    }
    return header;
}

int fi_safetensors_describe(const char *path, const uint8_t *data, size_t size,
                            fi_loaded_tensor **out, size_t *count)
{
    uint64_t hlen;
    PyObject *header = parse_header(path, data, size, &hlen);
    if (!header)
        return -1;
    PyObject *meta = PyDict_GetItemString(header, "__metadata__");
    if (meta && !PyDict_Check(meta))
        meta = NULL;
    PyObject *strides = meta_json(path, meta, META_STRIDES);
    PyObject *grads = strides || !PyErr_Occurred() ? meta_json(path, meta, META_GRAD) : NULL;
    Py_ssize_t n = PyDict_GET_SIZE(header);
    fi_loaded_tensor *ts = PyErr_Occurred() ? NULL : PyMem_Calloc(n ? (size_t)n : 1, sizeof(*ts));
    if (!ts && !PyErr_Occurred())
        PyErr_NoMemory();
    size_t nt = 0;
    PyObject *key, *info;
    Py_ssize_t pos = 0;
    while (ts && PyDict_Next(header, &pos, &key, &info)) {
        if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, "__metadata__") == 0)
            continue;
        if (fill_tensor(path, key, info, 8 + hlen, size - 8 - hlen, strides, grads, &ts[nt]) < 0) {
            fi_loaded_tensors_free(ts, nt);
            ts = NULL;
            break;
        }
        nt++;
    }
    Py_XDECREF(strides);
    Py_XDECREF(grads);
    Py_DECREF(header);
    if (!ts)
        return -1;
    *out = ts;
    *count = nt;
    return 0;
}
