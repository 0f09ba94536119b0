/* args.h: the arguments of the flashinfer._kernels entry points: one table per entry point
 * parsed by fi_args_parse, and the checks the tensors share. A wrong type raises TypeError,
 * a wrong value ValueError, as CPython does. */
#ifndef FI_ARGS_H
#define FI_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"

/* One tensor argument: its public name (every message starts with it), the object it came
 * from (borrowed; NULL when the optional argument is absent) and what fi_arg_read read. */
typedef struct {
    const char *name;
    PyObject *obj;
    fi_tensor t;
} fi_arg;

/* How fi_args_parse stores one argument at its offset in the caller's struct. */
typedef enum {
    FI_ARG_TENSOR, /* fi_arg: .obj borrowed, NULL for None; .name the table's name */
    FI_ARG_OBJECT, /* PyObject *, borrowed (None stays None) */
    FI_ARG_BOOL,   /* int, by truth value (as "p") */
    FI_ARG_INT,    /* int; an integer (not bool) */
    FI_ARG_INT64,  /* long long; an integer (not bool) */
    FI_ARG_DOUBLE, /* double; a float or an integer */
    FI_ARG_STR,    /* const char *, UTF-8 kept alive by the str object */
    FI_ARG_PATH,   /* const char *, a str (UTF-8, as STR) or None (NULL), as "z" */
} fi_arg_kind;

/* One row of an entry point's argument table, in positional order: the keyword name, where
 * the value goes (offsetof in the caller's struct), how it is read, and whether it may be
 * omitted (the struct then keeps the default the caller put there). */
typedef struct {
    const char *name;
    size_t offset;
    fi_arg_kind kind;
    int required;
} fi_argspec;

#define FI_ARGS_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* Parses a METH_FASTCALL | METH_KEYWORDS call of function fname against specs[0..n) into
 * dest (prefilled with the defaults). Errors are CPython's: TypeError for a missing,
 * repeated or unknown argument, too many positional ones, or a value of the wrong type;
 * OverflowError for an integer out of range. */
int fi_args_parse(const char *fname, const fi_argspec *specs, int n, void *dest,
                  PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* Each function returns 0, or -1 with an exception set whose message names the argument,
 * the value seen and what is accepted. */

/* Fills a->t from a->obj; TypeError when it is not a torch.Tensor (NULL: None). */
int fi_arg_read(fi_arg *a);

/* All n tensors are on one device, and that device is one this build runs op on: the
 * CPU, or a CUDA device in a build with the CUDA kernels. */
int fi_args_check_devices(const char *op, fi_arg *const *args, int n);

/* layout ("[m, k]") is added to the message when not NULL. */
int fi_arg_check_ndim(const fi_arg *a, int ndim, const char *layout);

/* The dtype is one of the n in accepted. */
int fi_arg_check_dtype(const fi_arg *a, const fi_dtype *accepted, int n);

/* The whole shape is want[0..ndim). */
int fi_arg_check_shape(const fi_arg *a, const int64_t *want, int ndim);

/* Dimension dim (which the message calls what, e.g. "heads") has size want. */
int fi_arg_check_dim(const fi_arg *a, int dim, const char *what, int64_t want);

/* tensor.is_contiguous(), as fi_tensor_is_contiguous decides it. */
int fi_arg_check_contiguous(const fi_arg *a);

/* The elements of a (an int32 [n] the caller checked: 1-D, contiguous) readable on the
 * host: a's own memory on the CPU; for a CUDA tensor a copy made in stream order (the
 * call waits for it), returned in *copy for the caller to PyMem_Free. NULL with an
 * exception set on failure. */
const int32_t *fi_arg_int32_on_host(const fi_arg *a, void *stream, int32_t **copy);

#endif
