/* tensor.h: reading a torch.Tensor's metadata from C through the Python C API,
 * with attribute names and dtype objects cached once (no torch headers). */
#ifndef FI_TENSOR_H
#define FI_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"
#include "strbuf.h"

/* Imports torch and caches torch.Tensor, the dtype objects and attribute names.
 * Called once from module exec; returns -1 with an exception set on failure. */
int fi_tensor_init(void);

/* Borrowed reference to torch.Tensor (valid after fi_tensor_init). */
PyTypeObject *fi_tensor_type(void);

/* Nonzero when obj is a torch.Tensor (or subclass). */
int fi_is_tensor(PyObject *obj);

/* Maps a torch.dtype object to ours; FI_DTYPE_UNKNOWN when it has no mapping. */
fi_dtype fi_dtype_from_py(PyObject *dtype);

/* Borrowed torch.dtype object for ours, or NULL when this torch lacks it. */
PyObject *fi_dtype_to_py(fi_dtype dtype);

/* "float32", "bfloat16", ... (torch's name without the "torch." prefix). */
const char *fi_dtype_name(fi_dtype dtype);

/* Fills out from a tensor: data pointer, shape, stride, dtype, device.
 * Returns -1 with an exception set when obj is not a usable tensor. */
int fi_tensor_from_py(PyObject *obj, fi_tensor *out);

/* The same without the data pointer (out->data is NULL): all that a description of the
 * tensor needs, one method call fewer. */
int fi_tensor_meta_from_py(PyObject *obj, fi_tensor *out);

/* The metadata of the tensors one call reads, each read from Python once: the recorder's
 * encoding, its copy, the statistics memo and the log text all ask for it
 * (docs/benchmarks.md#the-ring).
 * An entry holds a reference to its tensor, so the address cannot be reused meanwhile; it
 * stands for the tensor as it was when first read, so the caller empties it whenever code
 * that may change a tensor ran (the wrapped function). Guarded by the GIL. */
#define FI_TENSOR_SEEN_MAX 32
typedef struct {
    struct {
        PyObject *obj; /* owned */
        fi_tensor t;   /* t.data is read when first asked for (has_data) */
        signed char has_data;
        signed char requires_grad; /* -1: not read yet */
        signed char plain;         /* -1: not read yet; 1: neither the conj nor the neg bit */
    } entry[FI_TENSOR_SEEN_MAX];
    int count;
} fi_tensor_seen;

static inline void fi_tensor_seen_init(fi_tensor_seen *seen) { seen->count = 0; }
/* Drops every entry (their tensor references). */
void fi_tensor_seen_clear(fi_tensor_seen *seen);

/* fi_tensor_from_py (with_data) or fi_tensor_meta_from_py of obj, answered from seen when it
 * read obj already (seen NULL, or full: read every time). -1 with an exception set. */
int fi_tensor_seen_get(fi_tensor_seen *seen, PyObject *obj, fi_tensor *out, int with_data);
/* tensor.requires_grad: 1, 0, or -1 with an exception set (seen as above). */
int fi_tensor_seen_requires_grad(fi_tensor_seen *seen, PyObject *obj);
/* 1 when tensor has neither the conj nor the neg bit set (tensor.is_conj(), is_neg()), 0
 * when it has one, -1 with an exception set (seen as above). */
int fi_tensor_seen_plain(fi_tensor_seen *seen, PyObject *obj);

/* Appends str(tensor.dtype) ("torch.float32") / str(tensor.device) ("cpu", "cuda:0")
 * from t, asking Python only for kinds we cannot name. -1 with an exception set. */
int fi_tensor_put_dtype(fi_buf *b, PyObject *tensor, const fi_tensor *t);
int fi_tensor_put_device(fi_buf *b, PyObject *tensor, const fi_tensor *t);

/* tensor.is_contiguous() from shape and strides: sizes of 1 are ignored and an empty
 * tensor is contiguous, as torch defines it. */
int fi_tensor_is_contiguous(const fi_tensor *t);

/* Interned attribute names used across csrc/ (borrowed, immortal for our purposes). */
typedef struct {
    PyObject *shape, *stride, *dtype, *device, *data_ptr, *storage_offset, *requires_grad,
        *is_contiguous, *is_cuda, *is_cpu, *get_device, *name, *qualname, *module, *value, *cpu,
        *contiguous, *numel, *element_size, *untyped_storage, *nbytes, *is_conj, *is_neg,
        *resolve_conj, *resolve_neg;
    PyObject *versions, *record_extras; /* the recorder's static_meta keys */
} fi_names_t;

extern fi_names_t fi_names;

#endif
