/* scratch.h: which parameters of which APIs are scratch (workspaces): one table of ours and
 * flashinfer-python 0.7.2.post1's, keyed by the function's __qualname__ and the parameter's
 * name (docs/dump-format.md#scratch-tensors). Level 10 records such a tensor as its shape and
 * dtype only, unless FLASHINFER_DUMP_SCRATCH=1. */
#ifndef FI_SCRATCH_H
#define FI_SCRATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pages.h"

typedef struct fi_scratch_api fi_scratch_api;

/* The table entry for a function (by its __qualname__), or NULL: most APIs take no scratch. */
const fi_scratch_api *fi_scratch_api_of(PyObject *func);

/* Whether argument i of a call (positional when i < a->nargs, else the keyword
 * a->kwnames[i - a->nargs]) is bound to a scratch parameter of api; positions are named
 * through a->param_names, the wrapped function's signature. */
int fi_scratch_arg(const fi_scratch_api *api, const fi_call_args *a, Py_ssize_t i);

/* Adds SCRATCH_PARAMETERS, the table as ((qualname, parameter, rule), ...), to the module. */
int fi_scratch_exec(PyObject *module);

#endif
