/* cuda_info.c: cuda_built and cuda_archs of an extension module, saying whether
 * this build holds the CUDA kernels and for which architectures. */
#include "cuda_info.h"

#ifndef FI_CUDA_ARCHS
#define FI_CUDA_ARCHS ""
#endif

int fi_cuda_info_exec(PyObject *module)
{
#ifdef FI_WITH_CUDA
    PyObject *built = Py_True;
#else
    PyObject *built = Py_False;
#endif
    if (PyModule_AddObjectRef(module, "cuda_built", built) < 0)
        return -1;
    return PyModule_AddStringConstant(module, "cuda_archs", FI_CUDA_ARCHS);
}
