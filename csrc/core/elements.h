/* elements.h: element-wise access to CPU tensor memory for the triage functions
 * (histogram, difference): every real dtype read as a double, and a walk in index order. */
#ifndef FI_ELEMENTS_H
#define FI_ELEMENTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"

/* The value of the element at p as a double. */
typedef double (*fi_element_load_fn)(const char *p);

/* The loader of a dtype: floats (float8 kinds included), integers and bool; NULL for
 * complex, packed fp4 and unknown dtypes. */
fi_element_load_fn fi_element_loader(fi_dtype dtype);

/* Nonzero for floating dtypes (NaN and Inf possible). */
int fi_element_is_float(fi_dtype dtype);

/* One innermost row: n elements from a (and b, when walking two tensors) whose
 * consecutive elements are step_a (step_b) bytes apart. */
typedef void (*fi_row_fn)(void *ctx, const char *a, const char *b, int64_t n, int64_t step_a,
                          int64_t step_b);

/* Calls row for every innermost row of a in index order; b (NULL, or a tensor of the
 * same shape) is walked in step. Both must come from fi_elements_from_py. */
void fi_elements_walk(const fi_tensor *a, const fi_tensor *b, fi_row_fn row, void *ctx);

/* Reads tensor's metadata for fi_elements_walk: a CPU tensor without the negative or
 * conjugate bit whose sizes and byte strides fit in int64; sets *numel. -1 with an
 * exception (TypeError/ValueError naming what, the caller's function) otherwise. */
int fi_elements_from_py(PyObject *tensor, const char *what, fi_tensor *t, int64_t *numel);

/* Bounded work per tensor (docs/security.md): the triage readers walk each stored element
 * once. Dimensions of stride 0 (a broadcast) in a, and in b too when b is not NULL, become
 * size 1; returns the product of their sizes (how often each element walked stands for
 * itself, by which counts are multiplied) and updates *numel. */
int64_t fi_elements_collapse(fi_tensor *a, fi_tensor *b, int64_t *numel);

/* 0 when the numel elements of t fit in the bytes of tensor's storage after its offset;
 * else -1 with ValueError naming what (overlapping strides would be walked more than once
 * per stored element). */
int fi_elements_within_storage(PyObject *tensor, const fi_tensor *t, int64_t numel,
                               const char *what);

/* For a CPU tensor: *view, a new reference to tensor with its stride-0 dimensions
 * collapsed (NULL when none is), *repeat as fi_elements_collapse, the result checked by
 * fi_elements_within_storage. Other devices: *view NULL, *repeat 1. -1 with an exception. */
int fi_elements_distinct_view(PyObject *tensor, const char *what, PyObject **view, int64_t *repeat);

#endif
