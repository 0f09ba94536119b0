/* difference.h: how two same-shape CPU tensors differ, element by element (max abs and
 * max rel difference, elements outside a tolerance): the one comparison rule of replay,
 * `flashinfer diff` and the reproducer (docs/replay.md#the-comparison-rule). */
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

/* The rule for one element x against its reference y, both read exactly as doubles:
 * NaN matches NaN only; equal values match (an infinity matches itself); otherwise x
 * matches when |x - y| is finite and at most atol + rtol * |y|, computed in double.
 * rtol and atol are finite and non-negative. */
int fi_values_close(double x, double y, double rtol, double atol);

/* One pass over a and its reference b (same shape and dtype, checked by the caller), in
 * double precision. Floats by fi_values_close (torch.isclose(equal_nan=True) in
 * float64); integers, bool and dtypes without a numeric loader (packed fp4) match bit
 * for bit. */
void fi_tensor_difference(const fi_tensor *a, const fi_tensor *b, double rtol, double atol,
                          fi_difference *out);

/* Adds tensor_difference to the module. */
int fi_difference_exec(PyObject *module);

#endif
