/* logger.h: the Logger object api_logging creates on every import: configuration,
 * sink, timestamp cache and the level-10 recorder. Wrappers hold a reference to it. */
#ifndef FI_LOGGER_H
#define FI_LOGGER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include "config.h"
#include "recorder.h"
#include "sink.h"

typedef struct {
    PyObject_HEAD
    fi_config cfg;
    fi_sink sink;
    time_t ts_second;       /* the second ts_text describes */
    char ts_text[32];       /* "[YYYY-MM-DD HH:MM:SS]" */
    long long json_call_id; /* JSON log: the last call's id (pairs its call/return lines) */
    fi_recorder rec;        /* level 10 (recorder.h); its methods are the Logger's too */
    PyObject *page_memo;    /* dict: the page tables of each object's last plan (pages.h) */
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

#endif
