/* wrapper.h: the APIWrapper type every @flashinfer_api function becomes above level 0,
 * and the bound-method type its __get__ returns. */
#ifndef FI_WRAPPER_H
#define FI_WRAPPER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds APIWrapper and APIBoundMethod to the module (types kept in its state). */
int fi_wrapper_exec(PyObject *module);

#endif
