/* format.h: Python values -> the log text of SPEC 3.4 (tensor blocks, containers,
 * enums, reprs), appended to an fi_buf. */
#ifndef FI_FORMAT_H
#define FI_FORMAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "strbuf.h"

/* Appends value as lines at indent (two spaces per level), each ending in '\n'; the
 * items of lists, tuples and dicts follow their "[i]: " / "key: " prefix with their
 * own indentation, as FlashInfer prints them. level >= 5 adds tensor statistics.
 * Returns -1 with an exception set only for failures outside a value's own repr
 * (e.g. out of memory). */
int fi_format_value(fi_buf *b, PyObject *value, int indent, int level);

/* Borrowed enum.Enum type (cached by fi_format_exec). */
PyObject *fi_enum_type(void);

/* Caches enum.Enum for the formatter. */
int fi_format_exec(PyObject *module);

#endif
