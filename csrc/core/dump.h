/* dump.h: the level-10 flight recorder (SPEC 4): dump directories, tensor files,
 * metadata.jsonl / session.jsonl records, caps and filters. */
#ifndef FI_DUMP_H
#define FI_DUMP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "logger.h"

typedef struct fi_dump_call fi_dump_call;

/* What the recorder needs to know about the called API. */
typedef struct {
    const char *api_name;     /* "Cls.method" or "func" */
    PyObject *func;           /* the wrapped callable (module, qualname) */
    PyObject *signature_text; /* str(inspect.signature(func)) or None */
    PyObject *self;           /* the bound object for methods, else NULL */
} fi_dump_api;

/* Steps 1-3 of SPEC 4.2: caps, inputs file, metadata line 1. Returns NULL when the
 * call is not dumped (capped, suspended, or an error that was logged). Never raises:
 * any exception is turned into a "[DUMP ERROR (inputs) in NAME]" log line. */
fi_dump_call *fi_dump_begin(fi_logger *lg, const fi_dump_api *api, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames);

/* Step 5: outputs file and line 2. result is NULL when the call raised; the pending
 * exception is read for the record and left in place. Frees call. */
void fi_dump_end(fi_dump_call *call, PyObject *result);

/* Writes the calls recorded during the capture of CUDA graph `graph` (an int id, as
 * graph_hooks passes it in Logger.capture_graph; NULL or None: every call) with the
 * current values of their held tensors, as FlashInfer does: per part (inputs, outputs)
 * the root tensor file refreshed, graph_flushes/flush_NNNN/<part> written, a record with
 * graph_capture_flushed / _flush_index / _snapshot_dir appended to the call's
 * metadata.jsonl and one with graph_capture_base_dump_dir to the snapshot's. Returns the
 * number of parts written (new ref). */
PyObject *fi_dump_flush_graph(fi_logger *lg, PyObject *graph);

/* The number of parts (inputs, outputs) a flush of `graph` would write now. */
Py_ssize_t fi_dump_pending_graph(fi_logger *lg, PyObject *graph);

#endif
