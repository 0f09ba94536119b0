/* histogram.h: bin counts of a CPU tensor's values over its memory (strided views
 * included), for the histograms of `flashinfer report`. */
#ifndef FI_HISTOGRAM_H
#define FI_HISTOGRAM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"

#define FI_HISTOGRAM_MAX_BINS 4096

typedef struct {
    double lo, hi;    /* the range binned: [lo, hi], hi in the last bin */
    int64_t nan, inf; /* elements left out: NaN, +-Inf */
    int64_t outside;  /* finite elements outside [lo, hi] (an explicit range) */
    int64_t counts[FI_HISTOGRAM_MAX_BINS];
} fi_histogram;

/* Counts t's real values (floats, float8 kinds, integers, bool) into nbins equal bins
 * over [lo, hi]; with lo > hi the range is the finite minimum and maximum (one extra
 * pass). A range of zero width becomes [lo - 0.5, hi + 0.5], as numpy does. */
void fi_histogram_compute(const fi_tensor *t, int nbins, double lo, double hi, fi_histogram *out);

/* Adds tensor_histogram to the module. */
int fi_histogram_exec(PyObject *module);

#endif
