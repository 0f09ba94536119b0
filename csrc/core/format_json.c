/* format_json.c: values and record heads of the JSON log (FLASHINFER_LOGFORMAT=json),
 * written straight into the record buffer: no Python objects are built on the way. */
#include "format_json.h"

#include <string.h>
#include <sys/time.h>

#include "fork_watch.h"
#include "format.h"
#include "json.h"
#include "stats.h"
#include "tensor.h"

/* Every record carries the process id: fi_fork_pid reads it once per process (again in a
 * forked child) once the fork count runs, which this module starts. */
int fi_format_json_exec(PyObject *module)
{
    (void)module;
    if (fi_fork_watch() < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

int fi_format_json_head(fi_buf *b, const char *event, const char *api, long long call_id)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    fi_buf_puts(b, "{\"event\": \"");
    fi_buf_puts(b, event);
    fi_buf_putc(b, '"');
    if (api) {
        fi_buf_puts(b, ", \"api\": ");
        fi_json_str(b, api, strlen(api));
    }
    if (call_id >= 0) {
        fi_buf_puts(b, ", \"call_id\": ");
        fi_buf_put_i64(b, call_id);
    }
    fi_buf_puts(b, ", \"timestamp\": ");
    fi_buf_put_i64(b, (long long)tv.tv_sec);
    char usec[8] = {'.'};
    for (int i = 6, u = (int)tv.tv_usec; i >= 1; i--, u /= 10)
        usec[i] = (char)('0' + u % 10);
    fi_buf_append(b, usec, 7);
    fi_buf_puts(b, ", \"pid\": ");
    return fi_buf_put_i64(b, fi_fork_pid());
}

int fi_format_json_close(fi_buf *b)
{
    if (fi_buf_puts(b, "}\n") < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int fi_format_json_key(fi_buf *b, const char *key)
{
    fi_buf_puts(b, ", \"");
    fi_buf_puts(b, key);
    return fi_buf_puts(b, "\": ");
}

/* Appends a Python str as a JSON string; lone surrogates come out as U+FFFD. */
static int put_str(fi_buf *b, PyObject *s)
{
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u)
        return fi_json_str(b, u, (size_t)n);
    PyErr_Clear();
    PyObject *bytes = PyUnicode_AsEncodedString(s, "utf-8", "replace");
    if (!bytes)
        return -1;
    int r = fi_json_str(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
    Py_DECREF(bytes);
    return r;
}

/* str(obj) or repr(obj) as a JSON string; a raising one becomes "<TypeName object>". */
static int put_text_of(fi_buf *b, PyObject *obj, int use_repr)
{
    PyObject *s = fi_format_text_of(obj, use_repr);
    int r = s ? put_str(b, s) : -1;
    Py_XDECREF(s);
    return r;
}

/* {"type": type_name, field: str(v) or repr(v)}; type names may hold any character. */
static int put_typed_text(fi_buf *b, const char *type_name, const char *field, PyObject *v,
                          int use_repr)
{
    fi_buf_puts(b, "{\"type\": ");
    fi_json_str(b, type_name, strlen(type_name));
    fi_format_json_key(b, field);
    if (put_text_of(b, v, use_repr) < 0)
        return -1;
    return fi_buf_putc(b, '}');
}

static int put_int_array(fi_buf *b, const int64_t *v, int n)
{
    fi_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i)
            fi_buf_puts(b, ", ");
        fi_buf_put_i64(b, v[i]);
    }
    return fi_buf_putc(b, ']');
}

static int put_stats(fi_buf *b, const fi_stats *st)
{
    switch (st->kind) {
    case FI_STATS_FLOAT:
        fi_buf_puts(b, ", \"stats\": {\"min\": ");
        fi_json_double(b, st->min);
        fi_buf_puts(b, ", \"max\": ");
        fi_json_double(b, st->max);
        fi_buf_puts(b, ", \"mean\": ");
        fi_json_double(b, st->mean);
        fi_buf_puts(b, ", \"nan_count\": ");
        fi_buf_put_i64(b, (long long)st->nan_count);
        fi_buf_puts(b, ", \"inf_count\": ");
        fi_buf_put_i64(b, (long long)st->inf_count);
        return fi_buf_putc(b, '}');
    case FI_STATS_INT:
        if (st->is_unsigned64)
            fi_buf_printf(b, ", \"stats\": {\"min\": %llu, \"max\": %llu, \"mean\": ",
                          (unsigned long long)st->umin, (unsigned long long)st->umax);
        else
            fi_buf_printf(b, ", \"stats\": {\"min\": %lld, \"max\": %lld, \"mean\": ",
                          (long long)st->imin, (long long)st->imax);
        fi_json_double(b, st->mean);
        return fi_buf_putc(b, '}');
    case FI_STATS_SKIPPED_CAPTURE:
        return fi_buf_puts(b, ", \"stats_skipped\": \"CUDA graph capture in progress\"");
    case FI_STATS_DEFERRED:
        return fi_buf_printf(b,
                             ", \"stats_deferred\": {\"id\": %lld, \"numel\": %lld, "
                             "\"dtype\": \"%s\"}",
                             st->deferred_id, (long long)st->numel, fi_dtype_name(st->dtype));
    case FI_STATS_NONE:
        break;
    }
    return 0;
}

/* Level-5 statistics of a tensor whose metadata t was read: "stats", or "stats_error"
 * with the message of the failure. -1 only for out-of-memory or a non-Exception. */
static int put_tensor_stats(fi_buf *b, PyObject *tensor, const fi_tensor *t, fi_stats_memo *memo)
{
    fi_stats st;
    PyObject *error;
    if (fi_stats_or_error(tensor, t, memo, &st, &error) < 0)
        return -1;
    if (!error)
        return put_stats(b, &st);
    fi_buf_puts(b, ", \"stats_error\": ");
    int r = put_str(b, error);
    Py_DECREF(error);
    return r;
}

static int put_tensor(fi_buf *b, PyObject *tensor, fi_call *call)
{
    fi_tensor t;
    int requires_grad;
    if (fi_format_tensor_meta(tensor, &t, &requires_grad, call->level >= 5, &call->seen) < 0)
        return -1;
    fi_buf_puts(b, "{\"type\": \"torch.Tensor\", \"shape\": ");
    put_int_array(b, t.shape, t.ndim);
    fi_buf_puts(b, ", \"stride\": ");
    put_int_array(b, t.stride, t.ndim);
    fi_buf_puts(b, ", \"dtype\": \"");
    if (fi_tensor_put_dtype(b, tensor, &t) < 0)
        return -1;
    fi_buf_puts(b, "\", \"device\": \"");
    if (fi_tensor_put_device(b, tensor, &t) < 0)
        return -1;
    fi_buf_puts(b, "\", \"requires_grad\": ");
    fi_json_bool(b, requires_grad);
    fi_buf_puts(b, ", \"is_contiguous\": ");
    fi_json_bool(b, fi_tensor_is_contiguous(&t));
    if (call->level >= 5 && put_tensor_stats(b, tensor, &t, &call->stats) < 0)
        return -1;
    const fi_page_set *ps = call->level >= 5 ? fi_paged_find(&call->paged, tensor) : NULL;
    if (ps) {
        fi_buf_puts(b, ", \"pages\": {\"kept\": ");
        fi_buf_put_i64(b, ps->n);
        fi_buf_puts(b, ", \"total\": ");
        fi_buf_put_i64(b, ps->total);
        fi_buf_puts(b, ", \"out_of_range\": ");
        fi_buf_put_i64(b, ps->out_of_range);
        fi_buf_putc(b, '}');
    }
    return fi_buf_putc(b, '}');
}

/* {"type": "enum", "name": "Cls.NAME", "value": ..., "class": "module.Qualname"}; an enum
 * whose name or value cannot be read is written as its repr. */
static int put_enum(fi_buf *b, PyObject *v, fi_call *call)
{
    PyObject *cls = (PyObject *)Py_TYPE(v);
    PyObject *name = PyObject_GetAttrString(v, "name");
    PyObject *value = name ? PyObject_GetAttr(v, fi_names.value) : NULL;
    PyObject *mod = value ? PyObject_GetAttr(cls, fi_names.module) : NULL;
    PyObject *qn = mod ? PyObject_GetAttr(cls, fi_names.qualname) : NULL;
    PyObject *full = qn ? PyUnicode_FromFormat("%s.%S", _PyType_Name(Py_TYPE(v)), name) : NULL;
    PyObject *path = full ? PyUnicode_FromFormat("%S.%S", mod, qn) : NULL;
    int r;
    if (!path) {
        PyErr_Clear();
        r = put_typed_text(b, _PyType_Name(Py_TYPE(v)), "repr", v, 1);
    } else {
        fi_buf_puts(b, "{\"type\": \"enum\", \"name\": ");
        put_str(b, full);
        fi_buf_puts(b, ", \"value\": ");
        r = fi_format_json_value(b, value, call);
        if (r == 0) {
            fi_buf_puts(b, ", \"class\": ");
            put_str(b, path);
            r = fi_buf_putc(b, '}');
        }
    }
    Py_XDECREF(name);
    Py_XDECREF(value);
    Py_XDECREF(mod);
    Py_XDECREF(qn);
    Py_XDECREF(full);
    Py_XDECREF(path);
    return r;
}

static int put_sequence(fi_buf *b, PyObject *seq, fi_call *call)
{
    int is_list = PyList_Check(seq);
    Py_ssize_t n = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
    fi_buf_printf(b, "{\"type\": \"%s\", \"length\": %zd, \"items\": [", is_list ? "list" : "tuple",
                  n);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* a list may shrink under a repr that mutates it: re-check the size */
        if (is_list && i >= PyList_GET_SIZE(seq))
            break;
        PyObject *item = is_list ? PyList_GET_ITEM(seq, i) : PyTuple_GET_ITEM(seq, i);
        Py_INCREF(item);
        if (i)
            fi_buf_puts(b, ", ");
        int r = fi_format_json_value(b, item, call);
        Py_DECREF(item);
        if (r < 0)
            return -1;
    }
    return fi_buf_puts(b, "]}");
}

static int put_dict(fi_buf *b, PyObject *dict, fi_call *call)
{
    PyObject *items = PyDict_Items(dict);
    if (!items)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(items);
    fi_buf_printf(b, "{\"type\": \"dict\", \"length\": %zd, \"items\": [", n);
    int r = 0;
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        fi_buf_puts(b, i ? ", {\"key\": " : "{\"key\": ");
        r = fi_format_json_value(b, PyTuple_GET_ITEM(kv, 0), call);
        if (r == 0) {
            fi_buf_puts(b, ", \"value\": ");
            r = fi_format_json_value(b, PyTuple_GET_ITEM(kv, 1), call);
        }
        if (r == 0)
            fi_buf_putc(b, '}');
    }
    Py_DECREF(items);
    return r < 0 ? -1 : fi_buf_puts(b, "]}");
}

static int put_value(fi_buf *b, PyObject *v, fi_call *call)
{
    if (fi_is_tensor(v))
        return put_tensor(b, v, call);
    if (v == Py_None)
        return fi_buf_puts(b, "null");
    if (PyObject_TypeCheck(v, (PyTypeObject *)fi_enum_type()))
        return put_enum(b, v, call);
    if (PyBool_Check(v))
        return fi_buf_puts(b, v == Py_True ? "true" : "false");
    if (PyLong_Check(v))
        return fi_json_pyint(b, v);
    if (PyFloat_Check(v))
        return fi_json_double(b, PyFloat_AS_DOUBLE(v));
    if (PyUnicode_Check(v))
        return put_str(b, v);
    if (PyList_Check(v) || PyTuple_Check(v))
        return put_sequence(b, v, call);
    if (PyDict_Check(v))
        return put_dict(b, v, call);
    const char *type_name = Py_TYPE(v)->tp_name;
    if (strcmp(type_name, "torch.dtype") == 0)
        return put_typed_text(b, "torch.dtype", "value", v, 0);
    if (strcmp(type_name, "torch.device") == 0)
        return put_typed_text(b, "torch.device", "value", v, 0);
    return put_typed_text(b, _PyType_Name(Py_TYPE(v)), "repr", v, 1);
}

int fi_format_json_value(fi_buf *b, PyObject *v, fi_call *call)
{
    if (Py_EnterRecursiveCall(" while formatting a value for the JSON log"))
        return -1;
    int r = put_value(b, v, call);
    Py_LeaveRecursiveCall();
    if (r == 0 && b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return r < 0 && !PyErr_Occurred() ? (PyErr_NoMemory(), -1) : r;
}
