/* module.h: the extension module flashinfer._C: its per-module state and the
 * exec functions each component registers (one Py_mod_exec slot per component). */
#ifndef FI_MODULE_H
#define FI_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Per-module state: the heap types the components create. */
typedef struct {
    PyTypeObject *logger_type;
    PyTypeObject *wrapper_type;
    PyTypeObject *bound_type;
} fi_module_state;

extern PyModuleDef fi_module_def;

static inline fi_module_state *fi_state_of(PyObject *module)
{
    return (fi_module_state *)PyModule_GetState(module);
}

/* Component exec functions, in the order module.c runs them. */
int fi_tensor_exec(PyObject *module);
int fi_logger_exec(PyObject *module);
int fi_wrapper_exec(PyObject *module);
int fi_format_exec(PyObject *module);
int fi_stats_exec(PyObject *module);
int fi_gemm_exec(PyObject *module);
int fi_json_exec(PyObject *module);
int fi_tensorio_exec(PyObject *module);
int fi_attention_exec(PyObject *module);
int fi_cuda_info_exec(PyObject *module);

#endif
