/* module.c: flashinfer_native._C, the native logging core. The only place that knows
 * which components make up the module; each one adds its functions and types in its exec. */
#include "module.h"

#include "compact.h"
#include "cuda_info.h"
#include "device_chunks.h"
#include "difference.h"
#include "dump_format.h"
#include "format.h"
#include "format_json.h"
#include "histogram.h"
#include "json.h"
#include "logger.h"
#include "pages.h"
#include "scratch.h"
#include "stats.h"
#include "tensor.h"
#include "tensorio.h"
#include "wrapper.h"

PyDoc_STRVAR(module_doc, "flashinfer_native._C: native API-logging core, flight recorder and "
                         "tensor files.");

static int tensor_exec(PyObject *module)
{
    (void)module;
    return fi_tensor_init();
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    fi_module_state *st = fi_state_of(module);
    Py_VISIT(st->logger_type);
    Py_VISIT(st->wrapper_type);
    Py_VISIT(st->bound_type);
    return 0;
}

static int module_clear(PyObject *module)
{
    fi_module_state *st = fi_state_of(module);
    Py_CLEAR(st->logger_type);
    Py_CLEAR(st->wrapper_type);
    Py_CLEAR(st->bound_type);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, tensor_exec},
    {Py_mod_exec, fi_format_exec},
    {Py_mod_exec, fi_format_json_exec},
    {Py_mod_exec, fi_logger_exec},
    {Py_mod_exec, fi_wrapper_exec},
    {Py_mod_exec, fi_json_exec},
    {Py_mod_exec, fi_tensorio_exec},
    {Py_mod_exec, fi_stats_exec},
    {Py_mod_exec, fi_histogram_exec},
    {Py_mod_exec, fi_difference_exec},
    {Py_mod_exec, fi_cuda_info_exec},
    {Py_mod_exec, fi_pages_exec},
    {Py_mod_exec, fi_scratch_exec},
    {Py_mod_exec, fi_compact_exec},
    {Py_mod_exec, fi_dump_format_exec},
    {Py_mod_exec, fi_device_chunks_exec},
    {0, NULL},
};

PyModuleDef fi_module_def = {
    PyModuleDef_HEAD_INIT,   .m_name = "flashinfer_native._C",
    .m_doc = module_doc,     .m_size = sizeof(fi_module_state),
    .m_slots = module_slots, .m_traverse = module_traverse,
    .m_clear = module_clear, .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&fi_module_def); }
