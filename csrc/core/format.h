/* format.h: Python values -> the log text of docs/logging.md#what-the-text-log-looks-like
 * (tensor blocks, containers, enums, reprs), appended to an fi_buf. */
#ifndef FI_FORMAT_H
#define FI_FORMAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "flashinfer_kernels.h"
#include "strbuf.h"

/* Appends value as lines at indent (two spaces per level), each ending in '\n'; the
 * items of lists, tuples and dicts follow their "[i]: " / "key: " prefix with their
 * own indentation, as FlashInfer prints them. At the call's level 5 and above tensors get
 * statistics (the call's memo answers for those it took already). Returns -1 with an
 * exception set only for failures outside a value's own repr (e.g. out of memory). */
int fi_format_value(fi_buf *b, PyObject *value, int indent, fi_call *call);

/* str(obj) or repr(obj) as a new str; when that raises, "<TypeName object>" (the
 * exception cleared). NULL only when memory runs out. */
PyObject *fi_format_text_of(PyObject *obj, int use_repr);

/* A tensor's metadata and requires_grad, as a log record describes it, and its data
 * pointer when with_data is set (for statistics), from what the call read of it already
 * (seen, tensor.h; NULL: read now). -1 with an exception set when obj is not a usable
 * tensor. */
int fi_format_tensor_meta(PyObject *tensor, fi_tensor *t, int *requires_grad, int with_data,
                          fi_tensor_seen *seen);

/* Borrowed enum.Enum type (cached by fi_format_exec). */
PyObject *fi_enum_type(void);

/* Caches enum.Enum for the formatter. */
int fi_format_exec(PyObject *module);

#endif
