/* ops_quant.h: flashinfer._kernels entry points of the fp4 layout helpers (fp4_dequantize,
 * sf_interleave, shuffle_rows) and the gated activations (act_and_mul). */
#ifndef FI_OPS_QUANT_H
#define FI_OPS_QUANT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds the functions to the module; -1 with an exception set on failure. */
int fi_quant_exec(PyObject *module);

#endif
