/* ops_gemm.h: flashinfer._kernels entry points for the fp8 GEMMs, fp4 quantization and the
 * fp4 GEMM: argument checking, then the CPU kernels with the GIL released. */
#ifndef FI_OPS_GEMM_H
#define FI_OPS_GEMM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds bmm_fp8, mm_fp8, fp4_quantize and mm_fp4 to the module. */
int fi_gemm_exec(PyObject *module);

#endif
