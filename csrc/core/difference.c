/* difference.c: element-wise difference of two CPU tensors in one pass over their memory
 * (memory-mapped dump files included): the comparison rule of replay, `flashinfer diff`
 * and the reproducer (docs/replay.md#the-comparison-rule). */
#include "difference.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "elements.h"
#include "tensor.h"

/* Tensors this large are compared with the GIL released. */
#define DIFFERENCE_NOGIL_ELEMENTS (1 << 16)

typedef struct {
    fi_element_load_fn load;
    size_t esize;
    int is_float;
    double rtol, atol;
    fi_difference acc;
} difference_ctx;

int fi_values_close(double x, double y, double rtol, double atol)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y);
    if (x == y)
        return 1;
    double d = fabs(x - y);
    /* Without the finiteness test a finite x would match an infinite y (Inf <= Inf). */
    return isfinite(d) && d <= atol + rtol * fabs(y);
}

/* Adds one differing pair to the maxima. */
static void account(difference_ctx *c, double x, double y)
{
    double d = fabs(x - y);
    if (isnan(d))
        return;
    c->acc.max_abs = d > c->acc.max_abs ? d : c->acc.max_abs;
    if (y != 0) {
        double r = d / fabs(y);
        if (r > c->acc.max_rel) /* NaN (Inf / Inf) fails and is skipped */
            c->acc.max_rel = r;
    }
}

static void difference_row(void *ctx, const char *a, const char *b, int64_t n, int64_t step_a,
                           int64_t step_b)
{
    difference_ctx *c = ctx;
    for (int64_t i = 0; i < n; i++, a += step_a, b += step_b) {
        if (!c->is_float) {
            if (memcmp(a, b, c->esize) != 0) {
                c->acc.mismatched++;
                if (c->load)
                    account(c, c->load(a), c->load(b));
            }
            continue;
        }
        double x = c->load(a), y = c->load(b);
        if (!fi_values_close(x, y, c->rtol, c->atol))
            c->acc.mismatched++;
        if (x != y)
            account(c, x, y);
    }
}

void fi_tensor_difference(const fi_tensor *a, const fi_tensor *b, double rtol, double atol,
                          fi_difference *out)
{
    difference_ctx c = {fi_element_loader(a->dtype),
                        fi_dtype_size(a->dtype),
                        fi_element_is_float(a->dtype) && fi_element_loader(a->dtype),
                        rtol,
                        atol,
                        {0.0, 0.0, 0}};
    fi_elements_walk(a, b, difference_row, &c);
    *out = c.acc;
}

/* ---- Python ----------------------------------------------------------------------- */

static int same_layout(const fi_tensor *a, const fi_tensor *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

PyDoc_STRVAR(tensor_difference_doc,
             "tensor_difference(a, b, rtol=1e-3, atol=1e-3)\n--\n\n"
             "How CPU tensor a differs from the reference b (same shape and dtype), in one\n"
             "pass over their memory: (max_abs, max_rel, mismatched). The comparison rule of\n"
             "replay, diff and the reproducer (docs/replay.md#the-comparison-rule): floats\n"
             "read exactly as doubles match when both are NaN, equal, or |a - b| is finite\n"
             "and at most atol + rtol * |b|; integers, bool and packed fp4 bit for bit.\n"
             "max_rel is taken where b is not 0. rtol and atol must be finite and >= 0.\n"
             "Complex tensors are compared as their real and imaginary parts\n"
             "(torch.view_as_real).\n"
             "A dimension broadcast (stride 0) in both is read once; a and b both holding\n"
             "more elements than their storage (overlapping views) are refused (ValueError).");

static PyObject *py_tensor_difference(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"a", "b", "rtol", "atol", NULL};
    PyObject *pa, *pb;
    double rtol = 1e-3, atol = 1e-3;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|dd:tensor_difference", kwlist, &pa, &pb,
                                     &rtol, &atol))
        return NULL;
    fi_tensor a, b;
    int64_t numel, numel_b;
    if (fi_elements_from_py(pa, "tensor_difference", &a, &numel) < 0 ||
        fi_elements_from_py(pb, "tensor_difference", &b, &numel_b) < 0)
        return NULL;
    if (!same_layout(&a, &b)) {
        PyErr_Format(PyExc_ValueError,
                     "tensor_difference: a and b differ in shape or dtype (%s, %d dims vs %s, "
                     "%d dims)",
                     fi_dtype_name(a.dtype), a.ndim, fi_dtype_name(b.dtype), b.ndim);
        return NULL;
    }
    if (!(isfinite(rtol) && rtol >= 0 && isfinite(atol) && atol >= 0)) {
        char text[160];
        snprintf(text, sizeof text,
                 "tensor_difference: rtol and atol must be finite and non-negative (rtol=%g, "
                 "atol=%g)",
                 rtol, atol);
        PyErr_SetString(PyExc_ValueError, text);
        return NULL;
    }
    if (!fi_element_loader(a.dtype) && a.dtype != FI_DTYPE_FP4X2) {
        PyErr_Format(PyExc_ValueError, "tensor_difference: dtype %s has no real values to compare",
                     fi_dtype_name(a.dtype));
        return NULL;
    }
    /* The walk is bounded by the bytes that exist: numel may exceed one side's storage (a
     * broadcast against its copy) but not both. */
    int64_t repeat = fi_elements_collapse(&a, &b, &numel);
    if (fi_elements_within_storage(pa, &a, numel, "tensor_difference: a") < 0) {
        PyErr_Clear();
        if (fi_elements_within_storage(pb, &b, numel, "tensor_difference: a and b") < 0)
            return NULL;
    }
    fi_difference d;
    if (numel >= DIFFERENCE_NOGIL_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        fi_tensor_difference(&a, &b, rtol, atol, &d);
        Py_END_ALLOW_THREADS
    } else {
        fi_tensor_difference(&a, &b, rtol, atol, &d);
    }
    return Py_BuildValue("(ddL)", d.max_abs, d.max_rel, (long long)(d.mismatched * repeat));
}

static PyMethodDef difference_methods[] = {
    {"tensor_difference", (PyCFunction)(void (*)(void))py_tensor_difference,
     METH_VARARGS | METH_KEYWORDS, tensor_difference_doc},
    {NULL, NULL, 0, NULL},
};

int fi_difference_exec(PyObject *module)
{
    return PyModule_AddFunctions(module, difference_methods);
}
