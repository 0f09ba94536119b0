/* json.h: JSON text written byte-identical to Python's json.dumps(obj) with default
 * settings (", " and ": " separators, ensure_ascii, NaN/Infinity, float repr). */
#ifndef FI_JSON_H
#define FI_JSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "strbuf.h"

/* Appends a quoted, escaped JSON string for UTF-8 bytes s[0..n); invalid UTF-8
 * bytes come out as \ufffd. Returns 0, or -1 when the buffer ran out of memory. */
int fi_json_str(fi_buf *b, const char *s, size_t n);
/* The length of s's longest prefix that json.dumps writes as it is (printable ASCII but '"'
 * and '\\'), read eight bytes at a time while they all are. */
size_t fi_json_plain_prefix(const char *s, size_t n);

/* Appends a double as float.__repr__ does (NaN, Infinity, -Infinity for non-finite). */
int fi_json_double(fi_buf *b, double v);

int fi_json_int64(fi_buf *b, int64_t v);
/* A Python int as int.__repr__ writes it (for int subclasses too, as json does): the
 * digits directly when it fits 64 bits. -1 with an exception set on failure. */
int fi_json_pyint(fi_buf *b, PyObject *obj);
int fi_json_bool(fi_buf *b, int v);
int fi_json_null(fi_buf *b);

/* Appends obj (dict, list, tuple, str, int, float, bool, None, nested) exactly as
 * json.dumps(obj) would. Returns -1 with TypeError/ValueError/MemoryError set. */
int fi_json_from_py(fi_buf *b, PyObject *obj);

/* Parses JSON text into Python objects (dict, list, str, int, float, bool, None).
 * Strict: no trailing garbage, nesting at most 64 deep. Returns a new reference, or
 * NULL with ValueError naming `what` and the byte offset of the problem. */
PyObject *fi_json_parse(const char *s, size_t n, const char *what);

int fi_json_exec(PyObject *module);

#endif
