/* format.c: value formatting for the level-3/5 log blocks. Tensors are described
 * from their metadata only; statistics (level 5) come from stats.c. */
#include "format.h"

#include "flashinfer_kernels.h"
#include "float_repr.h"
#include "json.h"
#include "stats.h"
#include "tensor.h"

static PyObject *enum_type; /* enum.Enum, immutable once cached */

PyObject *fi_enum_type(void) { return enum_type; }

int fi_format_exec(PyObject *module)
{
    (void)module;
    PyObject *mod = PyImport_ImportModule("enum");
    if (!mod)
        return -1;
    enum_type = PyObject_GetAttrString(mod, "Enum");
    Py_DECREF(mod);
    return enum_type ? 0 : -1;
}

PyObject *fi_format_text_of(PyObject *obj, int use_repr)
{
    PyObject *s = use_repr ? PyObject_Repr(obj) : PyObject_Str(obj);
    if (s)
        return s;
    PyErr_Clear();
    return PyUnicode_FromFormat("<%s object>", _PyType_Name(Py_TYPE(obj)));
}

/* Appends str(obj) or repr(obj); a raising repr becomes "<TypeName object>". */
static int put_text(fi_buf *b, PyObject *obj, int use_repr)
{
    PyObject *s = fi_format_text_of(obj, use_repr);
    if (!s)
        return -1;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    int r;
    if (!u) {
        PyErr_Clear();
        r = fi_buf_printf(b, "<%s object>", _PyType_Name(Py_TYPE(obj)));
    } else {
        r = fi_buf_append(b, u, (size_t)n);
    }
    Py_DECREF(s);
    return r;
}

/* str() of an exact int or float, without building the str object (an exact int's str
 * is its JSON digits). */
static int put_number(fi_buf *b, PyObject *v)
{
    if (PyLong_CheckExact(v))
        return fi_json_pyint(b, v);
    char s[FI_FLOAT_REPR_MAX];
    return fi_buf_append(b, s, fi_float_repr(PyFloat_AS_DOUBLE(v), s));
}

static int put_int_tuple(fi_buf *b, const int64_t *v, int n)
{
    fi_buf_putc(b, '(');
    for (int i = 0; i < n; i++) {
        if (i)
            fi_buf_puts(b, ", ");
        fi_buf_put_i64(b, (long long)v[i]);
    }
    return fi_buf_puts(b, n == 1 ? ",)" : ")");
}

int fi_format_tensor_meta(PyObject *tensor, fi_tensor *t, int *requires_grad, int with_data,
                          fi_tensor_seen *seen)
{
    if (fi_tensor_seen_get(seen, tensor, t, with_data) < 0)
        return -1;
    *requires_grad = fi_tensor_seen_requires_grad(seen, tensor);
    return *requires_grad < 0 ? -1 : 0;
}

static int format_tensor(fi_buf *b, PyObject *tensor, int indent, fi_call *call)
{
    fi_tensor t;
    int requires_grad;
    if (fi_format_tensor_meta(tensor, &t, &requires_grad, call->level >= 5, &call->seen) < 0)
        return -1;
    fi_buf_indent(b, indent);
    fi_buf_puts(b, "Tensor(\n");
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, "shape=");
    put_int_tuple(b, t.shape, t.ndim);
    fi_buf_putc(b, '\n');
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, "stride=");
    put_int_tuple(b, t.stride, t.ndim);
    fi_buf_putc(b, '\n');
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, "dtype=");
    if (fi_tensor_put_dtype(b, tensor, &t) < 0)
        return -1;
    fi_buf_putc(b, '\n');
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, "device=");
    if (fi_tensor_put_device(b, tensor, &t) < 0)
        return -1;
    fi_buf_putc(b, '\n');
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, requires_grad ? "requires_grad=True\n" : "requires_grad=False\n");
    fi_buf_indent(b, indent + 1);
    fi_buf_puts(b, fi_tensor_is_contiguous(&t) ? "is_contiguous=True\n" : "is_contiguous=False\n");
    if (call->level >= 5 && fi_stats_format_tensor(b, tensor, &t, &call->stats, indent + 1) < 0)
        return -1;
    fi_buf_indent(b, indent);
    return fi_buf_puts(b, ")\n");
}

static int format_enum(fi_buf *b, PyObject *value)
{
    PyObject *name = PyObject_GetAttrString(value, "name");
    PyObject *inner = name ? PyObject_GetAttr(value, fi_names.value) : NULL;
    if (!inner) {
        Py_XDECREF(name);
        PyErr_Clear();
        return put_text(b, value, 1);
    }
    fi_buf_printf(b, "%s.", _PyType_Name(Py_TYPE(value)));
    put_text(b, name, 0);
    fi_buf_puts(b, " (value=");
    put_text(b, inner, 0);
    Py_DECREF(name);
    Py_DECREF(inner);
    return fi_buf_puts(b, ")");
}

static int format_sequence(fi_buf *b, PyObject *seq, int indent, fi_call *call, int is_list)
{
    Py_ssize_t n = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
    if (n == 0)
        return fi_buf_puts(b, is_list ? "[]\n" : "()\n");
    fi_buf_puts(b, is_list ? "[\n" : "(\n");
    for (Py_ssize_t i = 0; i < n; i++) {
        /* a list may shrink under a repr that mutates it: re-check the size */
        if (is_list && i >= PyList_GET_SIZE(seq))
            break;
        PyObject *item = is_list ? PyList_GET_ITEM(seq, i) : PyTuple_GET_ITEM(seq, i);
        Py_INCREF(item);
        fi_buf_indent(b, indent + 1);
        fi_buf_putc(b, '[');
        fi_buf_put_i64(b, (long long)i);
        fi_buf_puts(b, "]: ");
        /* the item's own indentation follows the "[i]: " (FlashInfer's layout) */
        int r = fi_format_value(b, item, indent + 1, call);
        Py_DECREF(item);
        if (r < 0)
            return -1;
    }
    fi_buf_indent(b, indent);
    return fi_buf_puts(b, is_list ? "]\n" : ")\n");
}

static int format_dict(fi_buf *b, PyObject *dict, int indent, fi_call *call)
{
    if (PyDict_GET_SIZE(dict) == 0)
        return fi_buf_puts(b, "{}\n");
    PyObject *items = PyDict_Items(dict);
    if (!items)
        return -1;
    fi_buf_puts(b, "{\n");
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        fi_buf_indent(b, indent + 1);
        put_text(b, PyTuple_GET_ITEM(kv, 0), 1);
        fi_buf_puts(b, ": ");
        if (fi_format_value(b, PyTuple_GET_ITEM(kv, 1), indent + 1, call) < 0) {
            Py_DECREF(items);
            return -1;
        }
    }
    Py_DECREF(items);
    fi_buf_indent(b, indent);
    return fi_buf_puts(b, "}\n");
}

int fi_format_value(fi_buf *b, PyObject *v, int indent, fi_call *call)
{
    if (Py_EnterRecursiveCall(" while formatting a value for the log"))
        return -1;
    int r;
    if (fi_is_tensor(v)) {
        r = format_tensor(b, v, indent, call);
        Py_LeaveRecursiveCall();
        return r;
    }
    fi_buf_indent(b, indent);
    if (v == Py_None)
        r = fi_buf_puts(b, "None\n");
    else if (PyObject_TypeCheck(v, (PyTypeObject *)enum_type))
        r = format_enum(b, v) < 0 ? -1 : fi_buf_putc(b, '\n');
    else if (PyLong_CheckExact(v) || PyFloat_CheckExact(v))
        r = put_number(b, v) < 0 ? -1 : fi_buf_putc(b, '\n');
    else if (PyBool_Check(v) || PyLong_Check(v) || PyFloat_Check(v))
        r = put_text(b, v, 0) < 0 ? -1 : fi_buf_putc(b, '\n');
    else if (PyUnicode_Check(v))
        r = put_text(b, v, 1) < 0 ? -1 : fi_buf_putc(b, '\n');
    else if (PyList_Check(v) || PyTuple_Check(v))
        r = format_sequence(b, v, indent, call, PyList_Check(v));
    else if (PyDict_Check(v))
        r = format_dict(b, v, indent, call);
    else
        r = put_text(b, v, 1) < 0 ? -1 : fi_buf_putc(b, '\n');
    Py_LeaveRecursiveCall();
    if (r == 0 && b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return r;
}
