/* cuda_info.h: the cuda_built / cuda_archs constants an extension module reports:
 * whether this build holds the CUDA kernels, and for which architectures. */
#ifndef FI_CUDA_INFO_H
#define FI_CUDA_INFO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds cuda_built (bool), cuda_archs (str), cpu_isa_paths (str) and cpu_isa() for the
 * build this module comes from. */
int fi_cuda_info_exec(PyObject *module);

#endif
