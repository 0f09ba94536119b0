/* float_repr.h: repr() of a double as Python writes it ("0.1", "1e-05", "inf"), in C:
 * the JSON writer and the log text format floats on every call. */
#ifndef FI_FLOAT_REPR_H
#define FI_FLOAT_REPR_H

#include <stddef.h>

/* Longest result: "-2.2250738585072014e-308" and its NUL. */
#define FI_FLOAT_REPR_MAX 32

/* Writes repr(v) and a NUL to buf (FI_FLOAT_REPR_MAX bytes); returns its length. */
size_t fi_float_repr(double v, char *buf);

#endif
