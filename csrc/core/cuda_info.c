/* cuda_info.c: how an extension module was built: cuda_built and cuda_archs (whether
 * it holds the CUDA kernels, for which architectures), cpu_isa_paths (the SIMD paths of
 * its CPU kernels) and cpu_isa() (the one this process takes), for
 * `flashinfer-native info` (docs/install.md). */
#include "cuda_info.h"

#include "flashinfer_kernels.h"

#ifndef FI_CUDA_ARCHS
#define FI_CUDA_ARCHS ""
#endif

static PyObject *cpu_isa(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(fi_cpu_isa_name());
}

static PyMethodDef build_methods[] = {
    {"cpu_isa", cpu_isa, METH_NOARGS,
     "cpu_isa() -> str: the SIMD path the CPU kernels take in this process ('portable', "
     "'avx2' or 'avx512'; FLASHINFER_CPU_ISA lowers it)."},
    {NULL, NULL, 0, NULL},
};

int fi_cuda_info_exec(PyObject *module)
{
#ifdef FI_WITH_CUDA
    PyObject *built = Py_True;
#else
    PyObject *built = Py_False;
#endif
    if (PyModule_AddObjectRef(module, "cuda_built", built) < 0 ||
        PyModule_AddStringConstant(module, "cpu_isa_paths", fi_cpu_isa_paths()) < 0 ||
        PyModule_AddFunctions(module, build_methods) < 0)
        return -1;
    return PyModule_AddStringConstant(module, "cuda_archs", FI_CUDA_ARCHS);
}
