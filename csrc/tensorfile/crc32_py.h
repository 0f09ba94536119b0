/* crc32_py.h: flashinfer_native._C's CRC-32 hooks (_crc32, _crc32_impls) for tests and
 * benchmarks. */
#ifndef FI_CRC32_PY_H
#define FI_CRC32_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Initialises the CRC-32 paths (fi_crc32_init) and adds the hooks to module. */
int fi_crc32_exec(PyObject *module);

#endif
