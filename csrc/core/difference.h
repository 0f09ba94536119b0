/* difference.h: how two same-shape CPU tensors differ, element by element (max abs and
 * max rel difference, elements outside a tolerance), for `flashinfer diff`. */
#ifndef FI_DIFFERENCE_H
#define FI_DIFFERENCE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"

typedef struct {
    double max_abs;     /* over elements that are not NaN on both sides; Inf possible */
    double max_rel;     /* |a - b| / |b| over elements where b is not 0 */
    int64_t mismatched; /* elements outside atol + rtol * |b| (one-sided NaN included) */
} fi_difference;

/* One pass over a and its reference b (same shape and dtype, real dtypes only, checked
 * by the caller), in double precision. Floats: equal values (Inf == Inf) and NaN on both
 * sides match, as torch.isclose(equal_nan=True); integers and bool match bit for bit. */
void fi_tensor_difference(const fi_tensor *a, const fi_tensor *b, double rtol, double atol,
                          fi_difference *out);

/* Adds tensor_difference to the module. */
int fi_difference_exec(PyObject *module);

#endif
