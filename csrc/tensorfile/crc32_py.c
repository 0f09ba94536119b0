/* crc32_py.c: the CRC-32 test and benchmark hooks of flashinfer_native._C (_crc32,
 * _crc32_impls): every path, callable from Python, to compare against zlib.crc32. */
#include "crc32_py.h"

#include <string.h>

#include "crc32.h"

static const char *const impl_keywords[] = {"table", "zlib", "pclmul"};

PyDoc_STRVAR(crc32_doc, "_crc32(data, value=0, impl=None) -> int\n\n"
                        "CRC-32 of a bytes-like object continuing value, like zlib.crc32;\n"
                        "impl ('table', 'zlib', 'pclmul') forces one path, else the active one.");

static PyObject *crc32_py(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *keywords[] = {"data", "value", "impl", NULL};
    Py_buffer view;
    unsigned int value = 0;
    const char *impl_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|Iz:_crc32", keywords, &view, &value,
                                     &impl_name))
        return NULL;
    fi_crc32_impl impl = fi_crc32_active();
    if (impl_name) {
        int i = 0;
        while (i < 3 && strcmp(impl_name, impl_keywords[i]) != 0)
            i++;
        if (i == 3 || !fi_crc32_has((fi_crc32_impl)i)) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "_crc32: impl '%s' is not available here",
                                impl_name);
        }
        impl = (fi_crc32_impl)i;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = fi_crc32_with(impl, value, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32_impls_doc, "_crc32_impls() -> tuple[str, ...]\n\n"
                              "The CRC-32 paths this process has, the one in use first.");

static PyObject *crc32_impls(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    fi_crc32_impl active = fi_crc32_active();
    PyObject *names = PyList_New(0);
    if (!names)
        return NULL;
    for (int i = -1; i < 3; i++) {
        fi_crc32_impl impl = i < 0 ? active : (fi_crc32_impl)i;
        if ((i >= 0 && impl == active) || !fi_crc32_has(impl))
            continue;
        PyObject *s = PyUnicode_FromString(fi_crc32_impl_name(impl));
        if (!s || PyList_Append(names, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(names);
            return NULL;
        }
        Py_DECREF(s);
    }
    PyObject *t = PyList_AsTuple(names);
    Py_DECREF(names);
    return t;
}

PyDoc_STRVAR(crc32_zeros_doc, "_crc32_zeros(value, n) -> int\n\n"
                              "zlib.crc32(bytes(n), value), computed without the zeros.");

static PyObject *crc32_zeros_py(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int value;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "IK:_crc32_zeros", &value, &n))
        return NULL;
    return PyLong_FromUnsignedLong(fi_crc32_zeros(value, n));
}

PyDoc_STRVAR(crc32_combine_doc,
             "_crc32_combine(crc1, crc2, len2) -> int\n\n"
             "The CRC-32 of A + B from crc1 = crc32(A), crc2 = crc32(B), len(B).");

static PyObject *crc32_combine_py(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int crc1, crc2;
    unsigned long long len2;
    if (!PyArg_ParseTuple(args, "IIK:_crc32_combine", &crc1, &crc2, &len2))
        return NULL;
    return PyLong_FromUnsignedLong(fi_crc32_combine(crc1, crc2, len2));
}

static PyMethodDef crc32_methods[] = {
    {"_crc32_zeros", crc32_zeros_py, METH_VARARGS, crc32_zeros_doc},
    {"_crc32_combine", crc32_combine_py, METH_VARARGS, crc32_combine_doc},
    {"_crc32", (PyCFunction)(void (*)(void))crc32_py, METH_VARARGS | METH_KEYWORDS, crc32_doc},
    {"_crc32_impls", crc32_impls, METH_NOARGS, crc32_impls_doc},
    {NULL, NULL, 0, NULL},
};

int fi_crc32_exec(PyObject *module)
{
    fi_crc32_init();
    return PyModule_AddFunctions(module, crc32_methods);
}
