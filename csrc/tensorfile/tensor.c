/* tensor.c: torch.Tensor metadata read from C. Caches torch.Tensor, the dtype
 * objects and interned attribute names; all of them are immutable once made. */
#include "tensor.h"

fi_names_t fi_names;

static PyTypeObject *tensor_type;
static PyObject *dtype_objects[FI_DTYPE_COUNT];

static const char *const dtype_names[FI_DTYPE_COUNT] = {
    [FI_DTYPE_UNKNOWN] = "unknown",
    [FI_DTYPE_F64] = "float64",
    [FI_DTYPE_F32] = "float32",
    [FI_DTYPE_F16] = "float16",
    [FI_DTYPE_BF16] = "bfloat16",
    [FI_DTYPE_E4M3FN] = "float8_e4m3fn",
    [FI_DTYPE_E4M3FNUZ] = "float8_e4m3fnuz",
    [FI_DTYPE_E5M2] = "float8_e5m2",
    [FI_DTYPE_E5M2FNUZ] = "float8_e5m2fnuz",
    [FI_DTYPE_E8M0FNU] = "float8_e8m0fnu",
    [FI_DTYPE_FP4X2] = "float4_e2m1fn_x2",
    [FI_DTYPE_I8] = "int8",
    [FI_DTYPE_I16] = "int16",
    [FI_DTYPE_I32] = "int32",
    [FI_DTYPE_I64] = "int64",
    [FI_DTYPE_U8] = "uint8",
    [FI_DTYPE_U16] = "uint16",
    [FI_DTYPE_U32] = "uint32",
    [FI_DTYPE_U64] = "uint64",
    [FI_DTYPE_BOOL] = "bool",
    [FI_DTYPE_C32] = "complex32",
    [FI_DTYPE_C64] = "complex64",
    [FI_DTYPE_C128] = "complex128",
};

static int intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot ? 0 : -1;
}

static int intern_all(void)
{
    struct {
        PyObject **slot;
        const char *s;
    } table[] = {
        {&fi_names.shape, "shape"},
        {&fi_names.stride, "stride"},
        {&fi_names.dtype, "dtype"},
        {&fi_names.device, "device"},
        {&fi_names.data_ptr, "data_ptr"},
        {&fi_names.storage_offset, "storage_offset"},
        {&fi_names.requires_grad, "requires_grad"},
        {&fi_names.is_contiguous, "is_contiguous"},
        {&fi_names.is_cuda, "is_cuda"},
        {&fi_names.is_cpu, "is_cpu"},
        {&fi_names.get_device, "get_device"},
        {&fi_names.name, "__name__"},
        {&fi_names.qualname, "__qualname__"},
        {&fi_names.module, "__module__"},
        {&fi_names.value, "value"},
        {&fi_names.cpu, "cpu"},
        {&fi_names.contiguous, "contiguous"},
        {&fi_names.numel, "numel"},
        {&fi_names.element_size, "element_size"},
        {&fi_names.untyped_storage, "untyped_storage"},
        {&fi_names.nbytes, "nbytes"},
        {&fi_names.is_conj, "is_conj"},
        {&fi_names.is_neg, "is_neg"},
        {&fi_names.resolve_conj, "resolve_conj"},
        {&fi_names.resolve_neg, "resolve_neg"},
        {&fi_names.versions, "versions"},
        {&fi_names.record_extras, "record_extras"},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (intern(table[i].slot, table[i].s) < 0)
            return -1;
    return 0;
}

int fi_tensor_init(void)
{
    if (tensor_type)
        return 0;
    if (intern_all() < 0)
        return -1;
    PyObject *torch = PyImport_ImportModule("torch");
    if (!torch)
        return -1;
    PyObject *tt = PyObject_GetAttrString(torch, "Tensor");
    if (!tt || !PyType_Check(tt)) {
        Py_XDECREF(tt);
        Py_DECREF(torch);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ImportError, "torch.Tensor is not a type");
        return -1;
    }
    for (int d = FI_DTYPE_F64; d < FI_DTYPE_COUNT; d++) {
        PyObject *obj = PyObject_GetAttrString(torch, dtype_names[d]);
        if (!obj) {
            PyErr_Clear(); /* an older torch lacks this dtype */
            continue;
        }
        dtype_objects[d] = obj;
    }
    Py_DECREF(torch);
    tensor_type = (PyTypeObject *)tt;
    return 0;
}

PyTypeObject *fi_tensor_type(void) { return tensor_type; }

int fi_is_tensor(PyObject *obj) { return PyObject_TypeCheck(obj, tensor_type); }

fi_dtype fi_dtype_from_py(PyObject *dtype)
{
    for (int d = FI_DTYPE_F64; d < FI_DTYPE_COUNT; d++)
        if (dtype_objects[d] == dtype)
            return (fi_dtype)d;
    return FI_DTYPE_UNKNOWN;
}

PyObject *fi_dtype_to_py(fi_dtype dtype)
{
    if (dtype <= FI_DTYPE_UNKNOWN || dtype >= FI_DTYPE_COUNT)
        return NULL;
    return dtype_objects[dtype];
}

const char *fi_dtype_name(fi_dtype dtype)
{
    if (dtype < 0 || dtype >= FI_DTYPE_COUNT)
        return "unknown";
    return dtype_names[dtype];
}

/* Reads a tuple of ints (torch.Size or stride tuple) into dst; returns its length. */
static int read_int_tuple(PyObject *tuple, int64_t *dst, const char *what)
{
    if (!PyTuple_Check(tuple)) {
        PyErr_Format(PyExc_TypeError, "tensor %s is not a tuple", what);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > FI_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "tensor has %zd dimensions; at most %d are supported", n,
                     FI_MAX_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        dst[i] = v;
    }
    return (int)n;
}

/* Whether getattr(obj, name) is true: 1, 0, or -1 with an exception set. */
static int attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* The device from is_cuda / get_device() / is_cpu: tensor.device.type would build a
 * torch.device and a C++ string stream per read, the largest cost of a tensor's
 * metadata at level 3. Devices other than CPU and CUDA are FI_DEVICE_OTHER, printed
 * from str(tensor.device) where needed. */
static int read_device(PyObject *obj, fi_tensor *out)
{
    int cuda = attr_true(obj, fi_names.is_cuda);
    if (cuda < 0)
        return -1;
    if (cuda) {
        PyObject *index = PyObject_CallMethodNoArgs(obj, fi_names.get_device);
        if (!index)
            return -1;
        out->device_type = FI_DEVICE_CUDA;
        out->device_index = (int)PyLong_AsLong(index);
        Py_DECREF(index);
        return PyErr_Occurred() ? -1 : 0;
    }
    int cpu = attr_true(obj, fi_names.is_cpu);
    if (cpu < 0)
        return -1;
    out->device_type = cpu ? FI_DEVICE_CPU : FI_DEVICE_OTHER;
    out->device_index = 0;
    return 0;
}

int fi_tensor_meta_from_py(PyObject *obj, fi_tensor *out)
{
    if (!fi_is_tensor(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a torch.Tensor, got %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    PyObject *shape = PyObject_GetAttr(obj, fi_names.shape);
    if (!shape)
        return -1;
    int nd = read_int_tuple(shape, out->shape, "shape");
    Py_DECREF(shape);
    if (nd < 0)
        return -1;
    out->ndim = nd;
    PyObject *stride = PyObject_CallMethodNoArgs(obj, fi_names.stride);
    if (!stride)
        return -1;
    int ns = read_int_tuple(stride, out->stride, "stride");
    Py_DECREF(stride);
    if (ns < 0)
        return -1;
    PyObject *dtype = PyObject_GetAttr(obj, fi_names.dtype);
    if (!dtype)
        return -1;
    out->dtype = fi_dtype_from_py(dtype);
    Py_DECREF(dtype);
    return read_device(obj, out);
}

int fi_tensor_from_py(PyObject *obj, fi_tensor *out)
{
    if (fi_tensor_meta_from_py(obj, out) < 0)
        return -1;
    PyObject *ptr = PyObject_CallMethodNoArgs(obj, fi_names.data_ptr);
    if (!ptr)
        return -1;
    out->data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* ---- the tensors one call read (fi_tensor_seen) ---- */

void fi_tensor_seen_clear(fi_tensor_seen *seen)
{
    while (seen->count > 0) {
        seen->count--; /* first: a finalizer that runs on the decref finds the entry gone */
        Py_CLEAR(seen->entry[seen->count].obj);
    }
}

/* The index of obj's entry in seen, made (its metadata read) when obj has none and there is
 * room; -1 (no exception) when there is none, -2 with an exception when reading failed. */
static int seen_index(fi_tensor_seen *seen, PyObject *obj, int with_data)
{
    if (!seen)
        return -1;
    for (int i = 0; i < seen->count; i++)
        if (seen->entry[i].obj == obj)
            return i;
    if (seen->count == FI_TENSOR_SEEN_MAX)
        return -1;
    int i = seen->count;
    fi_tensor *t = &seen->entry[i].t;
    if ((with_data ? fi_tensor_from_py(obj, t) : fi_tensor_meta_from_py(obj, t)) < 0)
        return -2;
    seen->entry[i].obj = Py_NewRef(obj);
    seen->entry[i].has_data = (signed char)with_data;
    seen->entry[i].requires_grad = -1;
    seen->entry[i].plain = -1;
    seen->count++;
    return i;
}

/* *dst = *src for the dims in use: a struct assignment copies all FI_MAX_DIMS of them with
 * rep movsq, slow to start, and a recorded call looks its tensors up dozens of times. */
static void copy_tensor(fi_tensor *dst, const fi_tensor *src)
{
    dst->data = src->data;
    dst->ndim = src->ndim;
    for (int k = 0; k < src->ndim && k < FI_MAX_DIMS; k++) {
        dst->shape[k] = src->shape[k];
        dst->stride[k] = src->stride[k];
    }
    dst->dtype = src->dtype;
    dst->device_type = src->device_type;
    dst->device_index = src->device_index;
}

int fi_tensor_seen_get(fi_tensor_seen *seen, PyObject *obj, fi_tensor *out, int with_data)
{
    int i = seen_index(seen, obj, with_data);
    if (i == -2)
        return -1;
    if (i < 0)
        return with_data ? fi_tensor_from_py(obj, out) : fi_tensor_meta_from_py(obj, out);
    if (with_data && !seen->entry[i].has_data) {
        PyObject *ptr = PyObject_CallMethodNoArgs(obj, fi_names.data_ptr);
        if (!ptr)
            return -1;
        seen->entry[i].t.data = PyLong_AsVoidPtr(ptr);
        Py_DECREF(ptr);
        if (PyErr_Occurred())
            return -1;
        seen->entry[i].has_data = 1;
    }
    copy_tensor(out, &seen->entry[i].t);
    if (!with_data)
        out->data = NULL;
    return 0;
}

/* Whether getattr(obj, name) (call: obj.name()) is true: 1, 0, or -1 with an exception. */
static int truth_of(PyObject *obj, PyObject *name, int call)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

int fi_tensor_seen_requires_grad(fi_tensor_seen *seen, PyObject *obj)
{
    int i = seen_index(seen, obj, 0);
    if (i == -2)
        return -1;
    if (i >= 0 && seen->entry[i].requires_grad >= 0)
        return seen->entry[i].requires_grad;
    int r = truth_of(obj, fi_names.requires_grad, 0);
    if (i >= 0 && r >= 0)
        seen->entry[i].requires_grad = (signed char)r;
    return r;
}

int fi_tensor_seen_plain(fi_tensor_seen *seen, PyObject *obj)
{
    int i = seen_index(seen, obj, 0);
    if (i == -2)
        return -1;
    if (i >= 0 && seen->entry[i].plain >= 0)
        return seen->entry[i].plain;
    /* torch sets the conj bit on complex tensors only */
    fi_dtype dt = i >= 0 ? seen->entry[i].t.dtype : FI_DTYPE_UNKNOWN;
    int maybe_conj =
        dt == FI_DTYPE_UNKNOWN || dt == FI_DTYPE_C32 || dt == FI_DTYPE_C64 || dt == FI_DTYPE_C128;
    int conj = maybe_conj ? truth_of(obj, fi_names.is_conj, 1) : 0;
    int neg = conj == 0 ? truth_of(obj, fi_names.is_neg, 1) : conj;
    int r = conj < 0 || neg < 0 ? -1 : !conj && !neg;
    if (i >= 0 && r >= 0)
        seen->entry[i].plain = (signed char)r;
    return r;
}

/* Appends str(getattr(tensor, name)). */
static int put_attr_str(fi_buf *b, PyObject *tensor, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(tensor, name);
    PyObject *s = v ? PyObject_Str(v) : NULL;
    Py_XDECREF(v);
    Py_ssize_t n;
    const char *u = s ? PyUnicode_AsUTF8AndSize(s, &n) : NULL;
    int r = u ? fi_buf_append(b, u, (size_t)n) : -1;
    Py_XDECREF(s);
    if (r < 0 && !PyErr_Occurred())
        PyErr_NoMemory();
    return r;
}

int fi_tensor_put_dtype(fi_buf *b, PyObject *tensor, const fi_tensor *t)
{
    if (t->dtype != FI_DTYPE_UNKNOWN)
        return fi_buf_puts(b, "torch.") < 0 ? -1 : fi_buf_puts(b, fi_dtype_name(t->dtype));
    return put_attr_str(b, tensor, fi_names.dtype);
}

int fi_tensor_put_device(fi_buf *b, PyObject *tensor, const fi_tensor *t)
{
    if (t->device_type == FI_DEVICE_CPU)
        return fi_buf_puts(b, "cpu");
    if (t->device_type == FI_DEVICE_CUDA)
        return fi_buf_puts(b, "cuda:") < 0 ? -1 : fi_buf_put_i64(b, t->device_index);
    return put_attr_str(b, tensor, fi_names.device);
}

int fi_tensor_is_contiguous(const fi_tensor *t)
{
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0)
            return 1;
        if (t->shape[i] == 1)
            continue;
        if (t->stride[i] != expected)
            return 0;
        expected *= t->shape[i];
    }
    return 1;
}
