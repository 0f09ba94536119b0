/* dump_encode.c: a call's arguments and result as dump metadata
 * (docs/dump-format.md#value-encoding), their tensors collected for the tensor files; the mirror of
 * _decode in flashinfer_native/replay.py. */
#include "dump_encode.h"

#include <string.h>

#include "dump_format.h"
#include "format.h"
#include "json.h"
#include "strbuf.h"
#include "tensor.h"
#include "tensorbytes.h"

int fi_dump_dict_set(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static int no_memory(void)
{
    PyErr_NoMemory();
    return -1;
}

static PyObject *int_list(const int64_t *v, int n)
{
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

/* The text fi_tensor_put_dtype / fi_tensor_put_device write, as a str. */
static PyObject *tensor_text(int (*put)(fi_buf *, PyObject *, const fi_tensor *), PyObject *tensor,
                             const fi_tensor *t)
{
    fi_buf b;
    fi_buf_init(&b);
    PyObject *s = put(&b, tensor, t) < 0 ? NULL : PyUnicode_FromStringAndSize(b.data, b.len);
    fi_buf_free(&b);
    return s;
}

/* The metadata value standing for a tensor inside a container: the type tag "torch.Tensor",
 * its shape, dtype, stride and device, requires_grad, is_contiguous and the tensor_key it
 * is stored under. */
static PyObject *tensor_meta(PyObject *tensor, const fi_tensor *t, PyObject *key,
                             fi_tensor_seen *seen)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (fi_dump_dict_set(d, "type", PyUnicode_FromString("torch.Tensor")) < 0 ||
        fi_dump_dict_set(d, "shape", int_list(t->shape, t->ndim)) < 0 ||
        fi_dump_dict_set(d, "dtype", tensor_text(fi_tensor_put_dtype, tensor, t)) < 0 ||
        fi_dump_dict_set(d, "stride", int_list(t->stride, t->ndim)) < 0 ||
        fi_dump_dict_set(d, "device", tensor_text(fi_tensor_put_device, tensor, t)) < 0)
        goto fail;
    int requires_grad = fi_tensor_seen_requires_grad(seen, tensor);
    if (requires_grad < 0 ||
        fi_dump_dict_set(d, "requires_grad", PyBool_FromLong(requires_grad)) < 0 ||
        fi_dump_dict_set(d, "is_contiguous", PyBool_FromLong(fi_tensor_is_contiguous(t))) < 0 ||
        fi_dump_dict_set(d, "tensor_key", Py_NewRef(key)) < 0)
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* Appends "[a, b, ...]" of v[0..n). */
static void put_int_array(fi_buf *b, const int64_t *v, int n)
{
    fi_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i)
            fi_buf_append(b, ", ", 2);
        fi_buf_put_i64(b, (long long)v[i]);
    }
    fi_buf_putc(b, ']');
}

/* Appends put's text (the tensor's dtype or device) as a JSON string. */
static int put_text_json(fi_buf *b, int (*put)(fi_buf *, PyObject *, const fi_tensor *),
                         PyObject *tensor, const fi_tensor *t)
{
    /* the texts of a known dtype or a CPU device need no escaping */
    if (put == fi_tensor_put_dtype && t->dtype != FI_DTYPE_UNKNOWN) {
        fi_buf_append(b, "\"", 1);
        fi_tensor_put_dtype(b, tensor, t);
        return fi_buf_append(b, "\"", 1);
    }
    if (put == fi_tensor_put_device && t->device_type == FI_DEVICE_CPU)
        return fi_buf_append(b, "\"cpu\"", 5);
    fi_buf text;
    fi_buf_init(&text);
    int r = put(&text, tensor, t);
    if (r == 0 && fi_json_str(b, text.data, text.len) < 0)
        r = -1;
    fi_buf_free(&text);
    return r;
}

/* key's tensor_details entry {shape, dtype, stride, device} in ts->details, with
 * "scratch": true for a scratch tensor; the key appended to ts->keys. */
static int put_details(fi_dump_tensors *ts, PyObject *key, PyObject *tensor, const fi_tensor *t,
                       int scratch)
{
    Py_ssize_t klen;
    const char *k = PyUnicode_AsUTF8AndSize(key, &klen);
    fi_buf *b = k ? fi_record_begin(&ts->details, k, (size_t)klen) : NULL;
    if (!b)
        return -1;
    fi_buf_puts(b, "{\"shape\": ");
    put_int_array(b, t->shape, t->ndim);
    fi_buf_puts(b, ", \"dtype\": ");
    int r = put_text_json(b, fi_tensor_put_dtype, tensor, t);
    fi_buf_puts(b, ", \"stride\": ");
    put_int_array(b, t->stride, t->ndim);
    fi_buf_puts(b, ", \"device\": ");
    if (r == 0)
        r = put_text_json(b, fi_tensor_put_device, tensor, t);
    fi_buf_puts(b, scratch ? ", \"scratch\": true}" : "}");
    if (fi_record_end(&ts->details) < 0 || r < 0)
        return -1;
    if (ts->nkeys++)
        fi_buf_append(&ts->keys, ", ", 2);
    if (fi_json_str(&ts->keys, k, (size_t)klen) < 0)
        return no_memory();
    return 0;
}

/* Adds tensor to ts under key; *t gets its metadata, read once for every use. */
static int collect_tensor(fi_dump_tensors *ts, PyObject *key, PyObject *tensor, fi_tensor *t)
{
    if (fi_tensor_seen_get(ts->seen, tensor, t, 1) < 0 || put_details(ts, key, tensor, t, 0) < 0 ||
        PyDict_SetItem(ts->tensors, key, tensor) < 0)
        return -1;
    ts->bytes += (long long)(fi_tensor_numel(t) * (int64_t)fi_dtype_size(t->dtype));
    ts->any_cuda |= t->device_type == FI_DEVICE_CUDA;
    return 0;
}

/* torch.zeros((), dtype=tensor.dtype).expand(tensor.shape): a zero of the tensor's dtype
 * broadcast to its shape (every stride 0), one element of storage on the host. */
static PyObject *zero_view(PyObject *tensor)
{
    PyObject *torch = PyImport_ImportModule("torch");
    PyObject *zeros = torch ? PyObject_GetAttrString(torch, "zeros") : NULL;
    PyObject *dtype = zeros ? PyObject_GetAttrString(tensor, "dtype") : NULL;
    PyObject *shape = dtype ? PyObject_GetAttrString(tensor, "shape") : NULL;
    PyObject *args = shape ? Py_BuildValue("((()){s:O})", "dtype", dtype) : NULL;
    PyObject *zero =
        args ? PyObject_Call(zeros, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1)) : NULL;
    PyObject *view = zero ? PyObject_CallMethod(zero, "expand", "O", shape) : NULL;
    Py_XDECREF(torch);
    Py_XDECREF(zeros);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(args);
    Py_XDECREF(zero);
    return view;
}

/* Adds a scratch tensor to ts under key: its tensor_details entry (the tensor's own shape,
 * dtype, stride and device) with "scratch": true, and in the file a zero view of it (views)
 * or nothing. Its bytes count as what the file stores. */
static int collect_scratch(fi_dump_tensors *ts, PyObject *key, PyObject *tensor, int views)
{
    fi_tensor t;
    if (fi_tensor_seen_get(ts->seen, tensor, &t, 0) < 0 || put_details(ts, key, tensor, &t, 1) < 0)
        return -1;
    /* the readers take a broadcast of at most FI_VIEW_MAX_ELEMENTS (tensorbytes.h) */
    if (!views || (uint64_t)fi_tensor_numel(&t) > FI_VIEW_MAX_ELEMENTS)
        return 0;
    PyObject *view = zero_view(tensor);
    int r = view ? PyDict_SetItem(ts->tensors, key, view) : -1;
    Py_XDECREF(view);
    if (r == 0 && fi_tensor_numel(&t) > 0)
        ts->bytes += fi_dtype_size(t.dtype);
    return r;
}

static PyObject *encode_value(fi_dump_tensors *ts, PyObject *v, PyObject *key);

static PyObject *typed(const char *type, const char *field, PyObject *value)
{
    if (!value)
        return NULL;
    PyObject *d = Py_BuildValue("{s:s,s:O}", "type", type, field, value);
    Py_DECREF(value);
    return d;
}

static PyObject *encode_repr(PyObject *v)
{
    PyObject *r = PyObject_Repr(v);
    if (!r) {
        PyErr_Clear();
        r = PyUnicode_FromFormat("<%s object>", _PyType_Name(Py_TYPE(v)));
    } else if (PyUnicode_GET_LENGTH(r) > FI_DUMP_REPR_LIMIT) {
        Py_SETREF(r, PyUnicode_Substring(r, 0, FI_DUMP_REPR_LIMIT));
    }
    return typed(_PyType_Name(Py_TYPE(v)), "repr", r);
}

static PyObject *encode_enum(fi_dump_tensors *ts, PyObject *v, PyObject *key)
{
    PyObject *cls = (PyObject *)Py_TYPE(v);
    PyObject *name = PyObject_GetAttrString(v, "name");
    PyObject *raw = name ? PyObject_GetAttr(v, fi_names.value) : NULL;
    PyObject *value = raw ? encode_value(ts, raw, key) : NULL;
    PyObject *mod = value ? PyObject_GetAttr(cls, fi_names.module) : NULL;
    PyObject *qn = mod ? PyObject_GetAttr(cls, fi_names.qualname) : NULL;
    PyObject *out = NULL;
    if (qn)
        out = Py_BuildValue("{s:s,s:N,s:O,s:N}", "type", "enum", "name",
                            PyUnicode_FromFormat("%s.%S", _PyType_Name(Py_TYPE(v)), name), "value",
                            value, "class", PyUnicode_FromFormat("%S.%S", mod, qn));
    Py_XDECREF(name);
    Py_XDECREF(raw);
    Py_XDECREF(value);
    Py_XDECREF(mod);
    Py_XDECREF(qn);
    return out;
}

static PyObject *encode_container(fi_dump_tensors *ts, PyObject *v, PyObject *key)
{
    int is_dict = PyDict_Check(v);
    const char *type = is_dict ? "dict" : PyList_Check(v) ? "list" : "tuple";
    PyObject *seq = is_dict ? PyDict_Items(v) : PySequence_List(v);
    if (!seq)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(seq), kept = n < FI_DUMP_MAX_ITEMS ? n : FI_DUMP_MAX_ITEMS;
    PyObject *items = PyList_New(kept);
    for (Py_ssize_t i = 0; items && i < kept; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i), *enc = NULL;
        if (is_dict) {
            PyObject *kk = PyUnicode_FromFormat("%S" FI_KEY_NESTED FI_KEY_DICT_KEY "%zd", key, i);
            PyObject *vk = PyUnicode_FromFormat("%S" FI_KEY_NESTED FI_KEY_DICT_VALUE "%zd", key, i);
            PyObject *ke = kk ? encode_value(ts, PyTuple_GET_ITEM(item, 0), kk) : NULL;
            PyObject *ve = (ke && vk) ? encode_value(ts, PyTuple_GET_ITEM(item, 1), vk) : NULL;
            if (ve)
                enc = Py_BuildValue("{s:O,s:O}", "key", ke, "value", ve);
            Py_XDECREF(kk);
            Py_XDECREF(vk);
            Py_XDECREF(ke);
            Py_XDECREF(ve);
        } else {
            PyObject *ik = PyUnicode_FromFormat("%S" FI_KEY_NESTED "%zd", key, i);
            enc = ik ? encode_value(ts, item, ik) : NULL;
            Py_XDECREF(ik);
        }
        if (!enc) {
            Py_CLEAR(items);
            break;
        }
        PyList_SET_ITEM(items, i, enc);
    }
    Py_DECREF(seq);
    if (!items)
        return NULL;
    return Py_BuildValue("{s:s,s:n,s:N,s:O}", "type", type, "length", n, "items", items,
                         "truncated", kept < n ? Py_True : Py_False);
}

/* The JSON-ready encoding of a non-top-level-tensor value (docs/dump-format.md#value-encoding);
 * nested tensors are collected into ts under their keys (docs/dump-format.md#argument-keys). New
 * reference. */
static PyObject *encode_value(fi_dump_tensors *ts, PyObject *v, PyObject *key)
{
    if (v == Py_None || PyBool_Check(v) || PyUnicode_CheckExact(v) || PyFloat_CheckExact(v) ||
        PyLong_CheckExact(v)) {
        Py_INCREF(v);
        return v;
    }
    if (fi_is_tensor(v)) {
        fi_tensor t;
        return collect_tensor(ts, key, v, &t) < 0 ? NULL : tensor_meta(v, &t, key, ts->seen);
    }
    if (Py_EnterRecursiveCall(" while encoding dump metadata"))
        return NULL;
    PyObject *out;
    if (PyObject_TypeCheck(v, (PyTypeObject *)fi_enum_type()))
        out = encode_enum(ts, v, key);
    else if (PyList_Check(v) || PyTuple_Check(v) || PyDict_Check(v))
        out = encode_container(ts, v, key);
    else if (fi_dtype_from_py(v) != FI_DTYPE_UNKNOWN ||
             strcmp(Py_TYPE(v)->tp_name, "torch.dtype") == 0)
        out = typed("torch.dtype", "value", PyObject_Str(v));
    else if (strcmp(Py_TYPE(v)->tp_name, "torch.device") == 0)
        out = typed("torch.device", "value", PyObject_Str(v));
    else if (PyLong_Check(v) || PyFloat_Check(v))
        out = PyLong_Check(v) ? PyNumber_Long(v) : PyNumber_Float(v);
    else
        out = encode_repr(v);
    Py_LeaveRecursiveCall();
    return out;
}

/* Puts value under key, which it steals (NULL: -1 with the exception set by whatever made
 * it): top-level tensors go to the tensor file, the rest into meta. */
static int add_value(fi_dump_tensors *ts, fi_record *meta, PyObject *key, PyObject *value)
{
    if (!key)
        return -1;
    fi_tensor t;
    PyObject *enc = NULL;
    int r = -1;
    const char *k;
    if (fi_is_tensor(value))
        r = collect_tensor(ts, key, value, &t);
    else if ((enc = encode_value(ts, value, key)) && (k = PyUnicode_AsUTF8(key)))
        r = fi_record_set_py(meta, k, enc);
    Py_XDECREF(enc);
    Py_DECREF(key);
    return r;
}

int fi_dump_tensors_init(fi_dump_tensors *ts, fi_tensor_seen *seen)
{
    ts->seen = seen;
    ts->tensors = PyDict_New();
    fi_record_init(&ts->details);
    fi_buf_init(&ts->keys);
    ts->nkeys = 0;
    ts->bytes = 0;
    ts->any_cuda = 0;
    return ts->tensors ? 0 : -1;
}

void fi_dump_tensors_free(fi_dump_tensors *ts)
{
    Py_CLEAR(ts->tensors);
    fi_record_free(&ts->details);
    fi_buf_free(&ts->keys);
}

/* "arg_N" (a new reference), made once for each N below 64: a call's keys cost no
 * formatting. */
static PyObject *arg_key(Py_ssize_t i)
{
    static PyObject *made[64]; /* kept for the process */
    if (i >= 64)
        return PyUnicode_FromFormat(FI_KEY_ARG "%zd", i);
    if (!made[i] && !(made[i] = PyUnicode_FromFormat(FI_KEY_ARG "%zd", i)))
        return NULL;
    return Py_NewRef(made[i]);
}

int fi_dump_encode_inputs(fi_dump_tensors *ts, fi_record *meta, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames, const fi_scratch_api *scratch,
                          const fi_call_args *cargs, int views)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        PyObject *key = i < nargs ? arg_key(i)
                                  : PyUnicode_FromFormat(FI_KEY_KWARG "%U",
                                                         PyTuple_GET_ITEM(kwnames, i - nargs));
        int r;
        if (scratch && cargs && fi_is_tensor(args[i]) && fi_scratch_arg(scratch, cargs, i)) {
            r = key ? collect_scratch(ts, key, args[i], views) : -1;
            Py_XDECREF(key);
        } else {
            r = add_value(ts, meta, key, args[i]);
        }
        if (r < 0)
            return -1;
    }
    return 0;
}

int fi_dump_encode_outputs(fi_dump_tensors *ts, fi_record *meta, PyObject *result)
{
    if (!PyTuple_Check(result))
        return add_value(ts, meta, PyUnicode_FromString(FI_KEY_RESULT), result);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(result); i++)
        if (add_value(ts, meta, PyUnicode_FromFormat(FI_KEY_RESULT "_%zd", i),
                      PyTuple_GET_ITEM(result, i)) < 0)
            return -1;
    return 0;
}
