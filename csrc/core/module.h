/* module.h: the extension module flashinfer_native._C (the logging core and the tensor
 * files): its per-module state, shared by the components that define heap types. */
#ifndef FI_MODULE_H
#define FI_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Per-module state: the heap types the components create. */
typedef struct {
    PyTypeObject *logger_type;
    PyTypeObject *wrapper_type;
    PyTypeObject *bound_type;
    long dumps_suspended; /* > 0 while a replay runs: no logger dumps (suspend_dumps()) */
} fi_module_state;

extern PyModuleDef fi_module_def;

static inline fi_module_state *fi_state_of(PyObject *module)
{
    return (fi_module_state *)PyModule_GetState(module);
}

#endif
