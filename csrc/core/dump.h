/* dump.h: the level-10 flight recorder (docs/dump-format.md): dump directories, tensor files,
 * metadata.jsonl / session.jsonl records, caps, and calls held during CUDA graph capture. */
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

/* Before the call: caps, inputs file, metadata line 1
 * (docs/dump-format.md#records-metadatajsonl-and-sessionjsonl). Returns NULL when the call is not
 * dumped (capped, suspended, or an error that was logged). Never raises: any exception is turned
 * into a "[DUMP ERROR (inputs) in NAME]" log line. */
fi_dump_call *fi_dump_begin(fi_logger *lg, const fi_dump_api *api, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames);

/* Step 5: outputs file and line 2. result is NULL when the call raised; the pending
 * exception is read for the record and left in place. Frees call. */
void fi_dump_end(fi_dump_call *call, PyObject *result);

/* Whether the call's outputs get a nan/inf check (the in-memory ring's triggers), which
 * can reuse the statistics their level-5 text takes (fi_stats_remember_taken). */
int fi_dump_checks_outputs(const fi_dump_call *call);

/* Adds the Logger's methods for calls recorded during CUDA graph capture (after
 * fi_logger_exec), each held with the graph being captured (Logger.capture_graph, set by
 * graph_hooks): flush_graph_dumps(graph=None) writes those of one graph (or all) with the
 * current values of their held tensors, as FlashInfer does; pending_graph_dumps(graph=None)
 * counts the parts (inputs, outputs) a flush would write; clear_graph_dumps() forgets them
 * and returns that count. */
int fi_dump_exec(PyObject *module);

#endif
