/* dump_encode.h: a call's arguments and result as the metadata of a dump record
 * (docs/dump-format.md#value-encoding), their tensors collected for the tensor files
 * (flashinfer_native/replay.py decodes it). */
#ifndef FI_DUMP_ENCODE_H
#define FI_DUMP_ENCODE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dump_record.h"
#include "scratch.h"
#include "tensor.h"

/* The tensors of one tensor file (inputs or outputs), gathered while encoding. */
typedef struct {
    PyObject *tensors;    /* key -> tensor, for the tensor file */
    fi_record details;    /* key -> tensor_details entry */
    fi_buf keys;          /* the tensor keys in order, as the items of a JSON array */
    Py_ssize_t nkeys;     /* how many */
    long long bytes;      /* nbytes of the tensors collected */
    int any_cuda;         /* a CUDA tensor is among them */
    fi_tensor_seen *seen; /* the call's tensor metadata, read once (tensor.h), or NULL */
} fi_dump_tensors;

/* Empty collections, reading tensor metadata through seen (NULL: from Python each time); -1
 * with an exception set. fi_dump_tensors_free releases them (also after a failed init). */
int fi_dump_tensors_init(fi_dump_tensors *ts, fi_tensor_seen *seen);
void fi_dump_tensors_free(fi_dump_tensors *ts);

/* input_metadata of a vectorcall (keys arg_N, kwarg_NAME) into meta's members; top-level tensors
 * go to ts instead, nested ones to both. A top-level tensor bound to a scratch parameter of
 * scratch (NULL: none; named through cargs) is recorded as its shape and dtype: its
 * tensor_details entry says "scratch": true, and the file holds, when views is set and it
 * has at most FI_VIEW_MAX_ELEMENTS elements, a zero of its dtype broadcast to its shape,
 * else nothing (docs/dump-format.md#scratch-tensors).
 * -1 with an exception set. */
int fi_dump_encode_inputs(fi_dump_tensors *ts, fi_record *meta, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames, const fi_scratch_api *scratch,
                          const fi_call_args *cargs, int views);

/* output_metadata of a result (key result, or result_N for a tuple) the same way. */
int fi_dump_encode_outputs(fi_dump_tensors *ts, fi_record *meta, PyObject *result);

/* d[key] = value, stealing value; -1 (exception set) when value is NULL or on failure,
 * so a constructor's result can be passed straight in. */
int fi_dump_dict_set(PyObject *d, const char *key, PyObject *value);

#endif
