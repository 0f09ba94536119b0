/* args.c: parsing the flashinfer._kernels entry points' arguments from their tables, and
 * checking the tensors. One wording for every kernel: the argument, the value seen, what is
 * accepted. */
#include "args.h"

#include <limits.h>
#include <string.h>

#include "strbuf.h"
#include "tensor.h"

#ifdef FI_WITH_CUDA
#define DEVICES_ACCEPTED "cpu and cuda tensors only"
#else
#define DEVICES_ACCEPTED "cpu tensors only (built without CUDA kernels: no nvcc at build time)"
#endif

int fi_arg_read(fi_arg *a)
{
    if (!a->obj || !fi_is_tensor(a->obj)) { /* NULL: None, as the tables store it */
        PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor, got %.200s", a->name,
                     a->obj ? Py_TYPE(a->obj)->tp_name : "NoneType");
        return -1;
    }
    return fi_tensor_from_py(a->obj, &a->t);
}

static int runs_here(const fi_tensor *t)
{
#ifdef FI_WITH_CUDA
    if (t->device_type == FI_DEVICE_CUDA)
        return 1;
#endif
    return t->device_type == FI_DEVICE_CPU;
}

/* Only cpu and cuda get this far in a message; any other device is named by torch. */
static const char *device_kind(const fi_tensor *t)
{
    return t->device_type == FI_DEVICE_CUDA ? "cuda" : "cpu";
}

static int device_refused(const char *op, const fi_arg *a)
{
    fi_buf device;
    fi_buf_init(&device);
    if (fi_tensor_put_device(&device, a->obj, &a->t) == 0)
        PyErr_Format(PyExc_ValueError, "%s: %s is on %s; this build runs %s on " DEVICES_ACCEPTED,
                     op, a->name, device.data, op);
    else if (!PyErr_Occurred())
        PyErr_NoMemory();
    fi_buf_free(&device);
    return -1;
}

int fi_args_check_devices(const char *op, fi_arg *const *args, int n)
{
    for (int i = 0; i < n; i++)
        if (!runs_here(&args[i]->t))
            return device_refused(op, args[i]);
    for (int i = 1; i < n; i++) {
        const fi_tensor *t = &args[i]->t, *first = &args[0]->t;
        if (t->device_type != first->device_type || t->device_index != first->device_index) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s is on %s:%d but %s is on %s:%d; all tensors must be on one "
                         "device",
                         op, args[i]->name, device_kind(t), t->device_index, args[0]->name,
                         device_kind(first), first->device_index);
            return -1;
        }
    }
    return 0;
}

int fi_arg_check_ndim(const fi_arg *a, int ndim, const char *layout)
{
    if (a->t.ndim == ndim)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: expected a %d-D tensor%s%s, got %d dimensions", a->name,
                 ndim, layout ? " " : "", layout ? layout : "", a->t.ndim);
    return -1;
}

/* ValueError from fmt, whose three %s are name, middle and b's text (built by the caller,
 * so a failed allocation becomes MemoryError); frees b. */
static int value_error_with(fi_buf *b, const char *fmt, const char *name, const char *middle)
{
    if (b->oom)
        PyErr_NoMemory();
    else
        PyErr_Format(PyExc_ValueError, fmt, name, middle, b->data);
    fi_buf_free(b);
    return -1;
}

int fi_arg_check_dtype(const fi_arg *a, const fi_dtype *accepted, int n)
{
    for (int i = 0; i < n; i++)
        if (a->t.dtype == accepted[i])
            return 0;
    fi_buf list;
    fi_buf_init(&list);
    for (int i = 0; i < n; i++)
        fi_buf_printf(&list, "%s%s", i ? ", " : "", fi_dtype_name(accepted[i]));
    return value_error_with(&list, "%s: dtype %s is not supported; accepted: %s", a->name,
                            fi_dtype_name(a->t.dtype));
}

/* "[2, 3, 4]" */
static void put_dims(fi_buf *b, const int64_t *dims, int n)
{
    fi_buf_putc(b, '[');
    for (int i = 0; i < n; i++)
        fi_buf_printf(b, "%s%lld", i ? ", " : "", (long long)dims[i]);
    fi_buf_putc(b, ']');
}

int fi_arg_check_shape(const fi_arg *a, const int64_t *want, int ndim)
{
    int same = a->t.ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = a->t.shape[i] == want[i];
    if (same)
        return 0;
    fi_buf seen, expected;
    fi_buf_init(&seen);
    fi_buf_init(&expected);
    put_dims(&seen, a->t.shape, a->t.ndim);
    put_dims(&expected, want, ndim);
    int rc = value_error_with(&expected, "%s: shape %s does not match the expected %s", a->name,
                              seen.data);
    fi_buf_free(&seen);
    return rc;
}

int fi_arg_check_dim(const fi_arg *a, int dim, const char *what, int64_t want)
{
    if (a->t.shape[dim] == want)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s (dimension %d) is %lld; expected %lld", a->name, what,
                 dim, (long long)a->t.shape[dim], (long long)want);
    return -1;
}

int fi_arg_check_contiguous(const fi_arg *a)
{
    if (fi_tensor_is_contiguous(&a->t))
        return 0;
    fi_buf shape, strides;
    fi_buf_init(&shape);
    fi_buf_init(&strides);
    put_dims(&shape, a->t.shape, a->t.ndim);
    put_dims(&strides, a->t.stride, a->t.ndim);
    int rc = value_error_with(&strides,
                              "%s: shape %s with strides %s is not contiguous; accepted: a "
                              "contiguous tensor",
                              a->name, shape.data);
    fi_buf_free(&shape);
    return rc;
}

const int32_t *fi_arg_int32_on_host(const fi_arg *a, void *stream, int32_t **copy)
{
    *copy = NULL;
    if (a->t.device_type != FI_DEVICE_CUDA)
        return a->t.data;
#ifdef FI_WITH_CUDA
    size_t count = (size_t)a->t.shape[0];
    int32_t *host = PyMem_Malloc((count ? count : 1) * sizeof(int32_t));
    if (!host)
        return (const int32_t *)PyErr_NoMemory();
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_cuda_copy_to_host(host, a->t.data, count * sizeof(int32_t), a->t.device_index, stream);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyMem_Free(host);
        PyErr_Format(PyExc_RuntimeError, "reading %s: %s", a->name, fi_cuda_last_error());
        return NULL;
    }
    *copy = host;
    return host;
#else
    (void)stream;
    PyErr_Format(PyExc_ValueError, "%s: this build has no CUDA support", a->name);
    return NULL;
#endif
}

/* Reads value into dest + spec->offset as spec->kind says. */
static int store_arg(const char *fname, const fi_argspec *spec, PyObject *value, char *dest)
{
    void *at = dest + spec->offset;
    switch (spec->kind) {
    case FI_ARG_TENSOR: {
        fi_arg *a = at;
        a->name = spec->name;
        a->obj = value == Py_None ? NULL : value;
        return 0;
    }
    case FI_ARG_OBJECT:
        *(PyObject **)at = value;
        return 0;
    case FI_ARG_BOOL: {
        int truth = PyObject_IsTrue(value);
        if (truth < 0)
            return -1;
        *(int *)at = truth;
        return 0;
    }
    case FI_ARG_INT:
    case FI_ARG_INT64: {
        if (PyBool_Check(value) || !PyIndex_Check(value))
            break;
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (spec->kind == FI_ARG_INT64) {
            *(long long *)at = v;
            return 0;
        }
        if (v < INT_MIN || v > INT_MAX) {
            PyErr_Format(PyExc_OverflowError, "%s(): argument '%s' is %lld; out of int range",
                         fname, spec->name, v);
            return -1;
        }
        *(int *)at = (int)v;
        return 0;
    }
    case FI_ARG_DOUBLE: {
        if (!PyFloat_Check(value) && !PyLong_Check(value))
            break;
        double v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        *(double *)at = v;
        return 0;
    }
    case FI_ARG_PATH:
    case FI_ARG_STR: {
        if (spec->kind == FI_ARG_PATH && value == Py_None) {
            *(const char **)at = NULL;
            return 0;
        }
        if (!PyUnicode_Check(value))
            break;
        const char *s = PyUnicode_AsUTF8(value);
        if (!s)
            return -1;
        *(const char **)at = s;
        return 0;
    }
    }
    static const char *const wanted[] = {"a tensor", "an object", "a bool", "an int",
                                         "an int",   "a float",   "a str",  "a str or None"};
    PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be %s, not %.200s", fname, spec->name,
                 wanted[spec->kind], Py_TYPE(value)->tp_name);
    return -1;
}

int fi_args_parse(const char *fname, const fi_argspec *specs, int n, void *dest,
                  PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[64] = {NULL};
    if (n > 64) {
        PyErr_Format(PyExc_SystemError, "%s(): argument table over 64 entries", fname);
        return -1;
    }
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        const char *name = PyUnicode_AsUTF8(key);
        if (!name)
            return -1;
        int i = 0;
        while (i < n && strcmp(specs[i].name, name) != 0)
            i++;
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fname,
                         name);
            return -1;
        }
        if (given[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                         name);
            return -1;
        }
        given[i] = args[nargs + k];
    }
    for (int i = 0; i < n; i++) {
        if (!given[i]) {
            if (specs[i].required) {
                PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname,
                             specs[i].name, i + 1);
                return -1;
            }
            if (specs[i].kind == FI_ARG_TENSOR) {
                fi_arg *a = (fi_arg *)((char *)dest + specs[i].offset);
                a->name = specs[i].name;
                a->obj = NULL;
            }
            continue;
        }
        if (store_arg(fname, &specs[i], given[i], dest) < 0)
            return -1;
    }
    return 0;
}
