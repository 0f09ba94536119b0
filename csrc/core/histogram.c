/* histogram.c: bin counts of a tensor's values, read in place from CPU memory (a
 * memory-mapped dump file, a strided view), drawn by the session report. */
#include "histogram.h"

#include <math.h>
#include <string.h>

#include "elements.h"
#include "tensor.h"

/* Tensors this large are binned with the GIL released. */
#define HISTOGRAM_NOGIL_ELEMENTS (1 << 16)

typedef struct {
    fi_element_load_fn load;
    int nbins;
    double lo, scale; /* bin of v: (v - lo) * scale */
    double min, max;  /* finite extremes (the range pass) */
    fi_histogram *out;
} histogram_ctx;

static void range_row(void *ctx, const char *p, const char *unused, int64_t n, int64_t step,
                      int64_t unused_step)
{
    (void)unused;
    (void)unused_step;
    histogram_ctx *c = ctx;
    for (int64_t i = 0; i < n; i++, p += step) {
        double v = c->load(p);
        if (isfinite(v)) {
            c->min = v < c->min ? v : c->min;
            c->max = v > c->max ? v : c->max;
        }
    }
}

static void bin_row(void *ctx, const char *p, const char *unused, int64_t n, int64_t step,
                    int64_t unused_step)
{
    (void)unused;
    (void)unused_step;
    histogram_ctx *c = ctx;
    fi_histogram *h = c->out;
    for (int64_t i = 0; i < n; i++, p += step) {
        double v = c->load(p);
        if (isnan(v)) {
            h->nan++;
        } else if (isinf(v)) {
            h->inf++;
        } else if (v < h->lo || v > h->hi) {
            h->outside++;
        } else {
            int64_t bin = (int64_t)((v - c->lo) * c->scale);
            h->counts[bin < c->nbins ? bin : c->nbins - 1]++;
        }
    }
}

void fi_histogram_compute(const fi_tensor *t, int nbins, double lo, double hi, fi_histogram *out)
{
    memset(out, 0, sizeof(*out));
    histogram_ctx c = {fi_element_loader(t->dtype), nbins, 0.0, 0.0, INFINITY, -INFINITY, out};
    if (lo > hi) {
        fi_elements_walk(t, NULL, range_row, &c);
        lo = c.min <= c.max ? c.min : 0.0;
        hi = c.min <= c.max ? c.max : 0.0;
    }
    if (lo == hi) {
        lo -= 0.5;
        hi += 0.5;
    }
    out->lo = lo;
    out->hi = hi;
    c.lo = lo;
    c.scale = (double)nbins / (hi - lo);
    fi_elements_walk(t, NULL, bin_row, &c);
}

/* ---- Python ----------------------------------------------------------------------- */

static PyObject *histogram_to_python(const fi_histogram *h, int nbins)
{
    PyObject *counts = PyList_New(nbins);
    for (int i = 0; counts && i < nbins; i++) {
        PyObject *n = PyLong_FromLongLong(h->counts[i]);
        if (!n) {
            Py_CLEAR(counts);
            break;
        }
        PyList_SET_ITEM(counts, i, n);
    }
    if (!counts)
        return NULL;
    return Py_BuildValue("{s:N,s:d,s:d,s:L,s:L,s:L}", "counts", counts, "lo", h->lo, "hi", h->hi,
                         "nan", (long long)h->nan, "inf", (long long)h->inf, "outside",
                         (long long)h->outside);
}

PyDoc_STRVAR(tensor_histogram_doc,
             "tensor_histogram(tensor, bins=32, range=None)\n--\n\n"
             "Bin counts of a CPU tensor's values (floats, float8 kinds, integers, bool) read in\n"
             "place, any strides: a dict with counts (bins equal bins), lo and hi (the range\n"
             "binned; default the finite min and max), nan and inf (elements left out) and\n"
             "outside (finite elements outside an explicit range). None for an empty tensor\n"
             "or a dtype without real values (complex, packed fp4). A broadcast dimension\n"
             "(stride 0) is read once and counted as often as it repeats; other views\n"
             "holding more elements than their storage are refused (ValueError).");

static PyObject *py_tensor_histogram(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"tensor", "bins", "range", NULL};
    PyObject *tensor, *range = Py_None;
    int nbins = 32;
    double lo = 1.0, hi = 0.0; /* lo > hi: the data's own range */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|iO:tensor_histogram", kwlist, &tensor, &nbins,
                                     &range))
        return NULL;
    if (nbins < 1 || nbins > FI_HISTOGRAM_MAX_BINS) {
        PyErr_Format(PyExc_ValueError, "tensor_histogram: bins=%d is not in [1, %d]", nbins,
                     FI_HISTOGRAM_MAX_BINS);
        return NULL;
    }
    if (range != Py_None) {
        if (!PyArg_ParseTuple(range, "dd:tensor_histogram range", &lo, &hi))
            return NULL;
        if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi)) {
            PyErr_Format(PyExc_ValueError,
                         "tensor_histogram: range must be finite (lo, hi) with lo <= hi");
            return NULL;
        }
    }
    fi_tensor t;
    int64_t numel;
    if (fi_elements_from_py(tensor, "tensor_histogram", &t, &numel) < 0)
        return NULL;
    if (numel == 0 || !fi_element_loader(t.dtype))
        Py_RETURN_NONE;
    int64_t repeat = fi_elements_collapse(&t, NULL, &numel);
    if (fi_elements_within_storage(tensor, &t, numel, "tensor_histogram") < 0)
        return NULL;
    fi_histogram *h = PyMem_Malloc(sizeof(*h));
    if (!h)
        return PyErr_NoMemory();
    if (numel >= HISTOGRAM_NOGIL_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        fi_histogram_compute(&t, nbins, lo, hi, h);
        Py_END_ALLOW_THREADS
    } else {
        fi_histogram_compute(&t, nbins, lo, hi, h);
    }
    for (int i = 0; i < nbins; i++)
        h->counts[i] *= repeat;
    h->nan *= repeat;
    h->inf *= repeat;
    h->outside *= repeat;
    PyObject *r = histogram_to_python(h, nbins);
    PyMem_Free(h);
    return r;
}

static PyMethodDef histogram_methods[] = {
    {"tensor_histogram", (PyCFunction)(void (*)(void))py_tensor_histogram,
     METH_VARARGS | METH_KEYWORDS, tensor_histogram_doc},
    {NULL, NULL, 0, NULL},
};

int fi_histogram_exec(PyObject *module) { return PyModule_AddFunctions(module, histogram_methods); }
