/* ops_attention.h: flashinfer._kernels.attention, the checked entry point from Python to the
 * attention kernels (decode and prefill, ragged or paged KV). */
#ifndef FI_OPS_ATTENTION_H
#define FI_OPS_ATTENTION_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds the attention functions to the module; -1 with an exception set on failure. */
int fi_attention_exec(PyObject *module);

#endif
