/* recorder.h: the level-10 flight recorder (docs/flight-recorder.md, docs/ring.md): its
 * state, kept on the Logger, and the life of a recorded call, from wrapper_invoke. */
#ifndef FI_RECORDER_H
#define FI_RECORDER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "config.h"

typedef struct fi_dump_call fi_dump_call;
typedef struct fi_record_mode fi_record_mode;

/* Writes one log record to the owner's destination, in its format (fi_logger_emit). */
typedef void (*fi_recorder_emit_fn)(PyObject *owner, const char *data, size_t len);

/* The recorder's state. The mode (record_mode.h) is one of three: a directory per call,
 * the disk ring or the in-memory ring, fixed by the configuration. */
typedef struct {
    const fi_config *cfg;       /* the owner's configuration */
    PyObject *owner;            /* borrowed: the Logger that holds this recorder */
    fi_recorder_emit_fn emit;   /* its log */
    const fi_record_mode *mode; /* how calls are kept */
    void *ring;                 /* the mode's ring, made at the first recorded call */
    long long dump_count;       /* calls dumped (count cap) */
    long long dump_bytes;       /* tensor bytes written (size cap) */
    long long sequence;         /* per-process order of dumped calls */
    PyObject *call_counters;    /* dict: API name -> int, for the directory names */
    PyObject *static_meta;      /* dict: "versions" etc., set from Python */
    PyObject *graph_pending;    /* list: calls recorded during CUDA graph capture */
    PyObject *capture_graph;    /* id of the CUDAGraph being captured (graph_hooks), or NULL */
    int force_graph_capture;    /* tests: treat every call as captured */
    int root_ready;             /* the dump root was made */
    int session_fd;             /* DUMP_DIR/session.jsonl, opened on first use */
    int ring_warned;            /* the "call larger than the ring's budget" warning was given */
    int compact;                /* tensors in the compact layout (docs/dump-format.md) */
    int exit_hooked;            /* the ring's exit trigger is registered with atexit */
    struct fi_compact_writer *compact_writer; /* its writer (a directory per call), made lazily */
    long long skipped[2];       /* calls a cap kept out: [0] the count cap, [1] the size cap */
    long long skipped_noted[2]; /* the counts session.jsonl has last been told */
    int cap_logged[2];          /* the cap's one log line was written */
    int skipped_at_exit;        /* atexit writes the final counts (write_skipped) */
    int memory_warned;          /* the "out of memory recording a call" warning was given */
    unsigned long fork_epoch;   /* fi_fork_epoch() when its ring was last the process's own */
} fi_recorder;

/* A recorder for cfg (which must outlive it), logging through emit(owner, ...). -1 with an
 * exception set when memory runs out; fi_recorder_free releases it either way. */
int fi_recorder_init(fi_recorder *rec, const fi_config *cfg, PyObject *owner,
                     fi_recorder_emit_fn emit);
int fi_recorder_traverse(fi_recorder *rec, visitproc visit, void *arg);
/* Drops the Python objects (tp_clear); fi_recorder_free releases the rest. */
void fi_recorder_clear(fi_recorder *rec);
void fi_recorder_free(fi_recorder *rec);

/* What the recorder needs to know about the called API. */
typedef struct {
    const char *api_name;     /* "Cls.method" or "func" */
    PyObject *func;           /* the wrapped callable (module, qualname) */
    PyObject *signature_text; /* str(inspect.signature(func)) or None */
    PyObject *self;           /* the bound object for methods, else NULL */
    /* its scratch parameters (scratch.h), recorded as shape and dtype only; NULL when it
     * has none or FLASHINFER_DUMP_SCRATCH=1 */
    const struct fi_scratch_api *scratch;
    const fi_call_args *args; /* the call's arguments by name, for scratch */
} fi_dump_api;

/* Before the call: the caps, the inputs file, metadata line 1. Returns NULL when the call
 * is not dumped (capped, or an error that was logged). Never raises: any exception is
 * turned into a "[DUMP ERROR (inputs) in NAME]" log line. ctx is the call's context, which
 * must outlive fi_dump_end. */
fi_dump_call *fi_dump_begin(fi_recorder *rec, fi_call *ctx, const fi_dump_api *api,
                            PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* After the call: outputs file and line 2. result is NULL when the call raised; the pending
 * exception is read for the record and left in place. Frees call. */
void fi_dump_end(fi_dump_call *call, PyObject *result);

/* Whether the call's outputs get a nan/inf check (the in-memory ring's triggers), which can
 * reuse the statistics their level-5 text takes (fi_stats_memo.keep_taken). */
int fi_dump_checks_outputs(const fi_dump_call *call);

/* Writes the in-memory ring now, as trigger would; the number of calls written (0 without
 * an in-memory ring), -1 with OSError set when the dump root cannot be written, or
 * ValueError for a trigger name of 0 or more than FI_TRIGGER_NAME_MAX bytes. */
int fi_recorder_fire(fi_recorder *rec, const char *trigger);

/* Appends a "skipped" record to session.jsonl for each cap whose count of calls kept out
 * grew since the last one (docs/dump-format.md#skip-records); 0, or -1 with an exception. */
int fi_recorder_write_skipped(fi_recorder *rec);
/* Test hook: every write-out of the in-memory ring, after its first call, writes a byte to
 * note_fd and waits for one on hold_fd (-1: off). -1 with RuntimeError without that ring. */
int fi_recorder_hold_writeouts(fi_recorder *rec, int hold_fd, int note_fd);

/* Bytes the in-memory ring holds. */
size_t fi_recorder_ring_bytes(const fi_recorder *rec);
/* Test hook: chunks the in-memory ring's compact store hashed, and chunks it gave a hash
 * without hashing (their bytes equal to those it stored from the same address). -1 without
 * such a store yet. */
int fi_recorder_chunk_hashes(const fi_recorder *rec, uint64_t *hashed, uint64_t *memo_hits);

/* The level-10 banner's two lines about the ring (what is written, and its limits), or
 * None without one. New reference, NULL with an exception set. */
PyObject *fi_recorder_banner(const fi_recorder *rec);

#endif
