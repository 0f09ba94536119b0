/* logger.h: the Logger object api_logging creates on every import: configuration,
 * sink, timestamp cache and the level-10 counters. Wrappers hold a reference to it. */
#ifndef FI_LOGGER_H
#define FI_LOGGER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include "config.h"
#include "sink.h"

typedef struct {
    PyObject_HEAD
    fi_config cfg;
    fi_sink sink;
    time_t ts_second; /* the second ts_text describes */
    char ts_text[32]; /* "[YYYY-MM-DD HH:MM:SS]" */
    /* level-10 state, owned by dump.c */
    long long dump_count;    /* calls dumped (count cap) */
    long long dump_bytes;    /* tensor bytes written (size cap) */
    long long sequence;      /* per-process order of dumped calls */
    PyObject *call_counters; /* dict: API name -> int, for the directory names */
    PyObject *static_meta;   /* dict: "versions" etc., set from Python */
    PyObject *graph_pending; /* list: calls recorded during CUDA graph capture */
    PyObject *capture_graph; /* id of the CUDAGraph being captured (graph_hooks), or NULL */
    int force_graph_capture; /* tests: treat every call as captured */
    int dump_root_ready;
    int session_fd;         /* DUMP_DIR/session.jsonl, opened on first use */
    long long json_call_id; /* JSON log: the last call's id (pairs its call/return lines) */
    struct fi_ring *ring;   /* FLASHINFER_DUMP_RING: made at the first dumped call */
    int ring_warned;        /* the "call larger than the ring's budget" warning was given */
} fi_logger;

/* Borrowed; valid while the module lives. */
int fi_logger_check(PyObject *obj);

/* "[YYYY-MM-DD HH:MM:SS]" for now, local time; cached per second. */
const char *fi_logger_timestamp(fi_logger *lg);

/* Nonzero while dumping is suspended process-wide (a replay is running). */
int fi_logger_dumps_suspended(fi_logger *lg);

/* Writes a record; on failure the exception is swallowed and one error line is
 * attempted on stderr (logging never breaks the call). With FLASHINFER_LOGFORMAT=json a
 * record that is not a JSON object (a warning, a dump error) is written as
 * {"event": "message", "timestamp", "pid", "text"}. */
void fi_logger_emit(fi_logger *lg, const char *data, size_t len);

/* Adds the Logger type to the module. */
int fi_logger_exec(PyObject *module);

/* Adds methods (a NULL-terminated table that outlives the type) to the Logger type after
 * fi_logger_exec: components with state on the Logger give it their methods this way,
 * so the Logger needs to know none of them. */
int fi_logger_add_methods(PyObject *module, PyMethodDef *methods);

#endif
