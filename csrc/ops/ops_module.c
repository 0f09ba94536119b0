/* ops_module.c: flashinfer._kernels, the kernel entry points of the flashinfer mirror
 * package. The only place that knows every ops component; it holds no state. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cuda_info.h"
#include "ops_attention.h"
#include "ops_gemm.h"
#include "ops_quant.h"
#include "tensor.h"

PyDoc_STRVAR(module_doc, "flashinfer._kernels: checked entry points to the CPU and CUDA "
                         "kernels (attention, fp8/fp4 GEMMs, fp4 quantization and layouts, gated "
                         "activations).");

static int tensor_exec(PyObject *module)
{
    (void)module;
    return fi_tensor_init();
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, tensor_exec},   {Py_mod_exec, fi_attention_exec}, {Py_mod_exec, fi_gemm_exec},
    {Py_mod_exec, fi_quant_exec}, {Py_mod_exec, fi_cuda_info_exec}, {0, NULL},
};

static PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "flashinfer._kernels", .m_doc = module_doc,
    .m_size = 0,           .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModuleDef_Init(&module_def); }
