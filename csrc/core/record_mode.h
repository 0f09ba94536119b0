/* record_mode.h: inside the recorder. A recorded call, the table of operations through which
 * the common path (dump.c) keeps it (one table per mode: a directory per call, the disk ring,
 * the in-memory ring), and the file helpers the modes share (dump_files.c). */
#ifndef FI_RECORD_MODE_H
#define FI_RECORD_MODE_H

#include "dump_encode.h"
#include "dump_record.h"
#include "recorder.h"
#include "ring_memory.h"
#include "tensorio.h"

struct fi_graph_entry;

struct fi_dump_call {
    fi_recorder *rec;
    PyObject *owner;  /* a reference to rec's owner, which keeps rec alive */
    fi_call *ctx;     /* the call's context (statistics memo) */
    PyObject *name;   /* API name (str) */
    fi_record record; /* the line-1 record, extended into line 2 */
    char *dir;        /* the call's directory */
    long long input_bytes;
    long long output_bytes;
    PyObject *graph_capsule; /* while captured: the capsule holding graph, in graph_pending */
    struct fi_graph_entry *graph;
    int meta_fd; /* metadata.jsonl, open from line 1 to line 2 */
    /* the in-memory ring's: the call's slot, and its files while the call writes them (files
     * points at own then, else NULL: the slot holds them, or it is gone) */
    fi_ring_ticket ticket;
    fi_ring_files own, *files;
    const char *trigger;         /* a trigger the call fired, fired when it ends */
    const char *tensors_skipped; /* why the ring keeps the call's records only, or NULL */
    void *place;                 /* the disk ring's entry of the call's directory */
    unsigned long fork_epoch;    /* fi_fork_epoch() when the call began */
};

/* How a mode keeps calls. Every operation gets the call; a failing one returns -1 with an
 * exception set, which the common path logs as a "[DUMP ERROR]" line. */
struct fi_record_mode {
    int keeps_session;  /* records go to DUMP_DIR/session.jsonl too */
    int keeps_captured; /* records calls made while a CUDA graph is captured (held tensors) */
    /* Whether calls are recorded now, asked before anything is read; the first call makes the
     * mode's ring. 1 yes, 0 no, -1 error. */
    int (*recording)(fi_recorder *rec);
    /* Called once when a level-10 recorder is made (the in-memory ring installs its signal
     * handlers then, so that a SIGUSR1 before the first call does not end the process);
     * NULL: nothing to do. 0, or -1 with an exception set. */
    int (*start)(fi_recorder *rec);
    /* The caps on a call whose inputs hold bytes tensor bytes: 1 go, 0 skip (the log says
     * why), -1 error. */
    int (*admits)(fi_dump_call *call, long long bytes);
    /* Looks at the call's inputs or outputs before they are written (the in-memory ring's
     * nan/inf triggers); NULL: nothing to look at. */
    void (*inspect)(fi_dump_call *call, const fi_dump_tensors *ts, int inputs);
    /* Names the call's directory (call->dir, with its per-API number in *call_seq) and makes
     * its place there: the directory, a ring slot. 0, 1 when the call is not recorded after
     * all (a write-out runs), -1 error. */
    int (*place)(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq);
    /* Writes the tensor file stem ("inputs" or "outputs"); the tensor bytes written. */
    Py_ssize_t (*save)(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts);
    /* Appends call->record as a line of the call's metadata.jsonl. */
    int (*write_record)(fi_dump_call *call);
    /* Line 1 is written (capturing: tensors held for graph flushes). */
    void (*inputs_done)(fi_dump_call *call, long long bytes, int capturing);
    /* Why outputs of bytes tensor bytes are not written ("size cap"), or NULL. */
    const char *(*outputs_refused)(fi_dump_call *call, long long bytes);
    /* Before line 2: the call takes its place back (NULL: nothing to do). */
    void (*reopen)(fi_dump_call *call);
    /* Line 2 is written (ok: without error); result is NULL when the call raised. */
    void (*done)(fi_dump_call *call, PyObject *result, int ok);
    /* Gives back the place of a call whose line 1 could not be written. */
    void (*abandon)(fi_dump_call *call);
    /* fi_dump_checks_outputs for this mode. */
    int (*checks_outputs)(const fi_dump_call *call);
    /* The process forked since the ring was made: the child's ring starts empty, without
     * touching the parent's directories or calls. */
    void (*forked)(fi_recorder *rec);
    /* The recorder goes: frees the mode's ring. */
    void (*free_ring)(fi_recorder *rec);
    /* fi_recorder_fire, fi_recorder_ring_bytes and fi_recorder_banner for this mode. */
    int (*fire)(fi_recorder *rec, const char *trigger);
    size_t (*ring_bytes)(const fi_recorder *rec);
    PyObject *(*banner)(const fi_recorder *rec);
    /* fi_recorder_hold_writeouts (the in-memory ring only; NULL elsewhere). */
    int (*hold_writeouts)(fi_recorder *rec, int hold_fd, int note_fd);
};

extern const fi_record_mode fi_record_call_dirs;   /* level 10 alone: every call (record_dirs.c) */
extern const fi_record_mode fi_record_disk_ring;   /* FLASHINFER_DUMP_RING (record_dirs.c) */
extern const fi_record_mode fi_record_memory_ring; /* ... with FLASHINFER_DUMP_ON */

/* ---- dump_files.c: log lines, directories, records and tensor files on disk */

void fi_dump_log(fi_recorder *rec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "[DUMP ERROR (where) in NAME]: message" for the pending exception, cleared. */
void fi_dump_log_error(fi_recorder *rec, const char *name, const char *where);

/* Creates the dump root (mode 0700 when we create it, parents too). -1 with OSError. */
int fi_dump_ensure_root(fi_recorder *rec);

/* The next per-API number of name (its directories' callNNNN). -1 with an exception. */
long long fi_dump_next_counter(fi_recorder *rec, PyObject *name);

/* The call directory DUMP_DIR/{stamp}_pid{pid}_{name}_call{NNNN}, made unless create is 0;
 * *call_seq gets NNNN. A malloc'd path, or NULL with an exception set. */
char *fi_dump_make_call_dir(fi_recorder *rec, PyObject *name, const char *stamp,
                            long long *call_seq, int create);

/* The record as one line, appended to dir/metadata.jsonl (through *meta_fd when it is open;
 * opened and kept there when meta_fd is given) and, when the mode keeps one, to
 * session.jsonl. */
int fi_dump_write_record_at(fi_recorder *rec, const char *dir, int *meta_fd,
                            const fi_record *record);

/* Appends record as one line of DUMP_DIR/session.jsonl (a record that is no call's). */
int fi_dump_write_session_record(fi_recorder *rec, PyObject *record);

/* Writes tensors to dir/stem.pt (or .safetensors) as opts says (tensorio.h: the statistics
 * taken on the way, the parts of each tensor kept; NULL: neither); the bytes written, -1
 * with an exception set. */
Py_ssize_t fi_dump_save_tensors_at(fi_recorder *rec, const char *dir, const char *stem,
                                   PyObject *tensors, const fi_save_opts *opts);

/* How a call's inputs (inputs 1) or outputs are saved: the inputs' statistics kept in the
 * call's memo, a paged cache's read pages only, torch's threads for a large call, and dev
 * (the compact layout's device path, or NULL), which then reads the pages on the device. */
fi_save_opts fi_dump_save_opts(fi_dump_call *call, int inputs, const fi_dump_tensors *ts,
                               fi_chunk_device *dev);

#endif
