/* elements.c: element-wise access to CPU tensor memory for histograms and differences.
 * Not the statistics fast path (stats.c): one indirect load per element, any strides. */
#include "elements.h"

#include <string.h>

#include "fi_numeric.h"
#include "tensor.h"

#define LOADER(name, type, expr)                                                                   \
    static double name(const char *p)                                                              \
    {                                                                                              \
        type v;                                                                                    \
        memcpy(&v, p, sizeof v);                                                                   \
        return (double)(expr);                                                                     \
    }

LOADER(load_f64, double, v)
LOADER(load_f32, float, v)
LOADER(load_f16, uint16_t, fi_f16_to_f32(v))
LOADER(load_bf16, uint16_t, fi_bf16_to_f32(v))
LOADER(load_e4m3fn, uint8_t, fi_e4m3fn_to_f32(v))
LOADER(load_e4m3fnuz, uint8_t, fi_e4m3fnuz_to_f32(v))
LOADER(load_e5m2, uint8_t, fi_e5m2_to_f32(v))
LOADER(load_e5m2fnuz, uint8_t, fi_e5m2fnuz_to_f32(v))
LOADER(load_e8m0fnu, uint8_t, fi_e8m0fnu_to_f32(v))
LOADER(load_i8, int8_t, v)
LOADER(load_i16, int16_t, v)
LOADER(load_i32, int32_t, v)
LOADER(load_i64, int64_t, v)
LOADER(load_u8, uint8_t, v)
LOADER(load_u16, uint16_t, v)
LOADER(load_u32, uint32_t, v)
LOADER(load_u64, uint64_t, v)
LOADER(load_bool, uint8_t, v != 0)

fi_element_load_fn fi_element_loader(fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F64:
        return load_f64;
    case FI_DTYPE_F32:
        return load_f32;
    case FI_DTYPE_F16:
        return load_f16;
    case FI_DTYPE_BF16:
        return load_bf16;
    case FI_DTYPE_E4M3FN:
        return load_e4m3fn;
    case FI_DTYPE_E4M3FNUZ:
        return load_e4m3fnuz;
    case FI_DTYPE_E5M2:
        return load_e5m2;
    case FI_DTYPE_E5M2FNUZ:
        return load_e5m2fnuz;
    case FI_DTYPE_E8M0FNU:
        return load_e8m0fnu;
    case FI_DTYPE_I8:
        return load_i8;
    case FI_DTYPE_I16:
        return load_i16;
    case FI_DTYPE_I32:
        return load_i32;
    case FI_DTYPE_I64:
        return load_i64;
    case FI_DTYPE_U8:
        return load_u8;
    case FI_DTYPE_U16:
        return load_u16;
    case FI_DTYPE_U32:
        return load_u32;
    case FI_DTYPE_U64:
        return load_u64;
    case FI_DTYPE_BOOL:
        return load_bool;
    default:
        return NULL;
    }
}

int fi_element_is_float(fi_dtype dtype)
{
    return dtype >= FI_DTYPE_F64 && dtype <= FI_DTYPE_E8M0FNU;
}

void fi_elements_walk(const fi_tensor *a, const fi_tensor *b, fi_row_fn row, void *ctx)
{
    int64_t esize_a = (int64_t)fi_dtype_size(a->dtype);
    int64_t esize_b = b ? (int64_t)fi_dtype_size(b->dtype) : 0;
    if (a->ndim == 0) {
        row(ctx, a->data, b ? b->data : NULL, 1, esize_a, esize_b);
        return;
    }
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] == 0)
            return;
    int inner = a->ndim - 1;
    int64_t idx[FI_MAX_DIMS] = {0};
    const char *pa = a->data, *pb = b ? b->data : NULL;
    for (;;) {
        row(ctx, pa, pb, a->shape[inner], a->stride[inner] * esize_a,
            b ? b->stride[inner] * esize_b : 0);
        int d = inner - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < a->shape[d]) {
                pa += a->stride[d] * esize_a;
                pb = pb ? pb + b->stride[d] * esize_b : NULL;
                break;
            }
            pa -= (a->shape[d] - 1) * a->stride[d] * esize_a;
            pb = pb ? pb - (b->shape[d] - 1) * b->stride[d] * esize_b : NULL;
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* Sizes, element count and byte strides of t fit in int64 (the walk's pointer steps). */
static int layout_fits(const fi_tensor *t, int64_t *numel)
{
    int64_t n = 1, esize = (int64_t)fi_dtype_size(t->dtype), step;
    if (t->ndim < 0 || t->ndim > FI_MAX_DIMS || esize == 0)
        return 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n) ||
            __builtin_mul_overflow(t->stride[i], esize, &step) ||
            __builtin_mul_overflow(t->shape[i], step, &step))
            return 0;
    }
    *numel = n;
    return n == 0 || t->data != NULL;
}

static int check_layout(const fi_tensor *t, const char *what, int64_t *numel)
{
    if (t->device_type != FI_DEVICE_CPU) {
        PyErr_Format(PyExc_ValueError, "%s: expected a CPU tensor (move it with .cpu())", what);
        return -1;
    }
    if (!layout_fits(t, numel)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: unreadable %s tensor with %d dimensions (a negative size, sizes or "
                     "strides past int64, or no data pointer)",
                     what, fi_dtype_name(t->dtype), t->ndim);
        return -1;
    }
    return 0;
}

/* Calls a no-argument method returning a bool: 1, 0, or -1 with an exception. */
static int method_truth(PyObject *obj, const char *name)
{
    PyObject *r = PyObject_CallMethod(obj, name, NULL);
    if (!r)
        return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

int fi_elements_from_py(PyObject *tensor, const char *what, fi_tensor *t, int64_t *numel)
{
    if (!fi_is_tensor(tensor)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor, got %.200s", what,
                     Py_TYPE(tensor)->tp_name);
        return -1;
    }
    if (fi_tensor_from_py(tensor, t) < 0 || check_layout(t, what, numel) < 0)
        return -1;
    /* a view with the negative bit stores the negation of the values it stands for */
    int neg = method_truth(tensor, "is_neg");
    int conj = neg == 0 ? method_truth(tensor, "is_conj") : neg;
    if (neg < 0 || conj < 0)
        return -1;
    if (neg || conj) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the tensor is a negative or conjugate view; pass "
                     "tensor.resolve_neg().resolve_conj()",
                     what);
        return -1;
    }
    return 0;
}

int64_t fi_elements_collapse(fi_tensor *a, fi_tensor *b, int64_t *numel)
{
    int64_t repeat = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] > 1 && a->stride[i] == 0 && (!b || b->stride[i] == 0)) {
            repeat *= a->shape[i]; /* a factor of numel, which fits in int64 */
            a->shape[i] = 1;
            if (b)
                b->shape[i] = 1;
        }
    }
    *numel /= repeat;
    return repeat;
}

/* storage.nbytes() - storage_offset * itemsize of a tensor: the bytes a view may read. */
static int stored_bytes(PyObject *tensor, const fi_tensor *t, int64_t *out)
{
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, fi_names.untyped_storage);
    PyObject *nbytes = storage ? PyObject_CallMethodNoArgs(storage, fi_names.nbytes) : NULL;
    PyObject *offset = nbytes ? PyObject_CallMethodNoArgs(tensor, fi_names.storage_offset) : NULL;
    Py_XDECREF(storage);
    long long n = nbytes ? PyLong_AsLongLong(nbytes) : -1;
    long long off = offset ? PyLong_AsLongLong(offset) : -1;
    Py_XDECREF(nbytes);
    Py_XDECREF(offset);
    if (PyErr_Occurred())
        return -1;
    long long esize = (long long)fi_dtype_size(t->dtype);
    *out = off >= 0 && off <= n / (esize ? esize : 1) ? n - off * esize : 0;
    return 0;
}

int fi_elements_within_storage(PyObject *tensor, const fi_tensor *t, int64_t numel,
                               const char *what)
{
    int64_t bytes, esize = (int64_t)fi_dtype_size(t->dtype);
    if (numel == 0 || esize == 0)
        return 0;
    if (stored_bytes(tensor, t, &bytes) < 0)
        return -1;
    if (numel <= bytes / esize)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: a view of %lld elements over %lld stored elements (overlapping strides) "
                 "is not walked: triage reads each stored element once",
                 what, (long long)numel, (long long)(bytes / esize));
    return -1;
}

/* tensor.as_strided(shape, stride) of t's (collapsed) sizes: a new reference or NULL. */
static PyObject *as_strided(PyObject *tensor, const fi_tensor *t)
{
    PyObject *shape = PyTuple_New(t->ndim), *stride = PyTuple_New(t->ndim);
    for (int i = 0; shape && stride && i < t->ndim; i++) {
        PyObject *n = PyLong_FromLongLong(t->shape[i]), *s = PyLong_FromLongLong(t->stride[i]);
        if (!n || !s) {
            Py_XDECREF(n);
            Py_XDECREF(s);
            Py_CLEAR(shape);
            break;
        }
        PyTuple_SET_ITEM(shape, i, n);
        PyTuple_SET_ITEM(stride, i, s);
    }
    PyObject *view =
        shape && stride ? PyObject_CallMethod(tensor, "as_strided", "OO", shape, stride) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    return view;
}

int fi_elements_distinct_view(PyObject *tensor, const char *what, PyObject **view, int64_t *repeat)
{
    fi_tensor t;
    int64_t numel;
    *view = NULL;
    *repeat = 1;
    if (!fi_is_tensor(tensor))
        return 0; /* the caller reports what is not a tensor */
    if (fi_tensor_meta_from_py(tensor, &t) < 0)
        return -1;
    if (t.device_type != FI_DEVICE_CPU || fi_dtype_size(t.dtype) == 0)
        return 0;       /* statistics read neither other devices' memory nor unknown dtypes */
    t.data = (void *)1; /* layout_fits asks for data only of a non-empty tensor */
    if (!layout_fits(&t, &numel)) {
        PyErr_Format(PyExc_ValueError, "%s: unreadable %s tensor with %d dimensions", what,
                     fi_dtype_name(t.dtype), t.ndim);
        return -1;
    }
    *repeat = fi_elements_collapse(&t, NULL, &numel);
    if (fi_elements_within_storage(tensor, &t, numel, what) < 0)
        return -1;
    if (*repeat > 1 && !(*view = as_strided(tensor, &t)))
        return -1;
    return 0;
}
