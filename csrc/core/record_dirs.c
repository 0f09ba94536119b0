/* record_dirs.c: the recorder modes that write each call's directory as the call runs:
 * every call (level 10 alone, within the count and size caps), or the disk ring, which keeps
 * the newest FLASHINFER_DUMP_RING directories (ring_disk.c). */
#include "record_mode.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#include "compact.h"
#include "device_chunks.h"
#include "dump_format.h"
#include "ring_disk.h"

#define MB (1024.0 * 1024.0)

/* ------------------------------------------------------------------ caps */

/* FLASHINFER_DUMP_MAX_SIZE_GB as Python prints a float ("20.0", "1e-08"), for the
 * cap messages FlashInfer writes. */
static void put_size_cap(fi_buf *b, double gb)
{
    char *text = PyOS_double_to_string(gb, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    fi_buf_puts(b, text ? text : "?");
    PyMem_Free(text);
}

/* "Dump size limit reached (X GB). <what>. Increase FLASHINFER_DUMP_MAX_SIZE_GB ..." */
static void log_size_cap(fi_recorder *rec, const char *what, const char *name)
{
    fi_buf b;
    fi_buf_init(&b);
    fi_buf_puts(&b, "Dump size limit reached (");
    put_size_cap(&b, rec->cfg->max_size_gb);
    fi_buf_printf(&b, " GB). %s %s. Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.\n", what, name);
    rec->emit(rec->owner, b.data, b.len);
    fi_buf_free(&b);
}

static int under_size_cap(fi_recorder *rec, long long bytes)
{
    return (double)(rec->dump_bytes + bytes) <= rec->cfg->max_size_gb * 1024.0 * 1024.0 * 1024.0;
}

enum { CAP_COUNT, CAP_SIZE };

/* 1 the first time it is asked about *flag, 0 after. */
static int first_time(int *flag)
{
    if (*flag)
        return 0;
    *flag = 1;
    return 1;
}

/* Why a cap keeps calls out, as a skip record says it ("FLASHINFER_DUMP_MAX_COUNT=1000
 * reached"). New reference, NULL with an exception set. */
static PyObject *cap_reason(const fi_recorder *rec, int cap)
{
    if (cap == CAP_COUNT)
        return PyUnicode_FromFormat("FLASHINFER_DUMP_MAX_COUNT=%lld reached", rec->cfg->max_count);
    fi_buf b;
    fi_buf_init(&b);
    fi_buf_puts(&b, "FLASHINFER_DUMP_MAX_SIZE_GB=");
    put_size_cap(&b, rec->cfg->max_size_gb);
    fi_buf_puts(&b, " reached");
    PyObject *text = b.data ? PyUnicode_FromStringAndSize(b.data, (Py_ssize_t)b.len) : NULL;
    fi_buf_free(&b);
    return text ? text : PyErr_NoMemory();
}

int fi_recorder_write_skipped(fi_recorder *rec)
{
    for (int cap = CAP_COUNT; cap <= CAP_SIZE; cap++) {
        if (rec->skipped[cap] == rec->skipped_noted[cap])
            continue;
        struct timeval tv;
        gettimeofday(&tv, NULL);
        PyObject *record =
            Py_BuildValue("{s:s,s:N,s:L,s:l,s:d}", "record_type", "skipped", "reason",
                          cap_reason(rec, cap), "calls_skipped", rec->skipped[cap], "process_id",
                          (long)getpid(), "time", tv.tv_sec + tv.tv_usec * 1e-6);
        int r = record ? fi_dump_write_session_record(rec, record) : -1;
        Py_XDECREF(record);
        if (r < 0)
            return -1;
        rec->skipped_noted[cap] = rec->skipped[cap];
    }
    return 0;
}

/* A call a cap keeps out: the cap's first logs one line (FlashInfer's words; FlashInfer
 * repeats it for every call), every one is counted, and session.jsonl gets the count at 1,
 * 2, 4, 8, ... calls and at exit (docs/flight-recorder.md). 0, or -1 with an exception. */
static int skip(fi_recorder *rec, int cap)
{
    if (rec->skipped[cap]++ == 0 && !rec->skipped_at_exit) {
        PyObject *atexit = PyImport_ImportModule("atexit");
        PyObject *method = PyObject_GetAttrString(rec->owner, "write_skipped");
        PyObject *ok =
            atexit && method ? PyObject_CallMethod(atexit, "register", "O", method) : NULL;
        Py_XDECREF(atexit);
        Py_XDECREF(method);
        if (!ok)
            return -1;
        Py_DECREF(ok);
        rec->skipped_at_exit = 1;
    }
    long long n = rec->skipped[cap];
    return (n & (n - 1)) == 0 ? fi_recorder_write_skipped(rec) : 0;
}

/* The count cap first, then the size cap (FlashInfer's order). */
static int dirs_admit(fi_dump_call *call, long long bytes)
{
    fi_recorder *rec = call->rec;
    const char *name = PyUnicode_AsUTF8(call->name);
    if (rec->dump_count >= rec->cfg->max_count) {
        if (first_time(&rec->cap_logged[CAP_COUNT]))
            fi_dump_log(rec,
                        "Dump limit reached (%lld dumps). Skipping dump for %s. Increase "
                        "FLASHINFER_DUMP_MAX_COUNT if needed.",
                        rec->cfg->max_count, name);
        return skip(rec, CAP_COUNT);
    }
    if (under_size_cap(rec, bytes))
        return 1;
    /* the call still takes its number, as in FlashInfer: later directories of this API
     * keep the numbers they would have had */
    if (fi_dump_next_counter(rec, call->name) < 0)
        return -1;
    if (first_time(&rec->cap_logged[CAP_SIZE]))
        log_size_cap(rec, "Skipping dump for", name);
    return skip(rec, CAP_SIZE);
}

static const char *dirs_outputs_refused(fi_dump_call *call, long long bytes)
{
    if (under_size_cap(call->rec, bytes))
        return NULL;
    if (first_time(&call->rec->cap_logged[CAP_SIZE]))
        log_size_cap(call->rec, "Skipping the outputs of", PyUnicode_AsUTF8(call->name));
    return "size cap";
}

/* ------------------------------------------------------- a directory per call */

static int dirs_recording(fi_recorder *rec)
{
    (void)rec;
    return 1;
}

static int dirs_place(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq)
{
    (void)bytes;
    if (fi_dump_ensure_root(call->rec) < 0)
        return -1;
    call->dir = fi_dump_make_call_dir(call->rec, call->name, stamp, call_seq, 1);
    return call->dir ? 0 : -1;
}

/* The inputs' level-5 statistics come in the same pass (stats.c), kept in the call's memo;
 * a paged KV cache keeps the pages the call reads (docs/flight-recorder.md#page-aware-capture). */
static Py_ssize_t dirs_save_with(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts,
                                 fi_chunk_device *dev)
{
    fi_recorder *rec = call->rec;
    fi_save_opts opts = fi_dump_save_opts(call, stem[0] == 'i', ts, dev);
    if (!rec->compact)
        return fi_dump_save_tensors_at(rec, call->dir, stem, ts->tensors, &opts);
    if (!rec->compact_writer &&
        !(rec->compact_writer = fi_compact_writer_new(rec->cfg->dump_dir))) {
        PyErr_NoMemory();
        return -1;
    }
    size_t n = strlen(call->dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s." FI_DUMP_EXT_CHUNKS, call->dir, stem);
    Py_ssize_t written = fi_compact_save(rec->compact_writer, path, ts->tensors, &opts);
    free(path);
    return written;
}

/* The compact layout hashes CUDA tensors on their device (device_chunks.c), and takes the
 * capture again on the host when a device call fails. */
static Py_ssize_t dirs_save(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts)
{
    fi_chunk_device *dev = call->rec->compact ? fi_device_chunks() : NULL;
    unsigned failures = dev ? dev->failures : 0;
    Py_ssize_t r = dirs_save_with(call, stem, ts, dev);
    if (r < 0 && fi_device_chunks_gave_up(call->rec, dev, failures))
        r = dirs_save_with(call, stem, ts, NULL);
    return r;
}

static int dirs_write_record(fi_dump_call *call)
{
    return fi_dump_write_record_at(call->rec, call->dir, &call->meta_fd, &call->record);
}

static void dirs_inputs_done(fi_dump_call *call, long long bytes, int capturing)
{
    fi_recorder *rec = call->rec;
    fi_dump_log(rec, "Dumped inputs to: %s (size: %.2f MB, total: %lld/%lld dumps%s)", call->dir,
                (double)bytes / MB, rec->dump_count, rec->cfg->max_count,
                capturing ? ", graph-deferred" : "");
    fi_dump_log(rec, "Inputs dumped to: %s", call->dir);
}

/* FlashInfer's two lines after a call's outputs are recorded. */
static void dirs_done(fi_dump_call *call, PyObject *result, int ok)
{
    if (!result || !ok)
        return;
    fi_dump_log(call->rec,
                "Dumped outputs to: %s (output size: %.2f MB, total dump size: %.2f MB%s)",
                call->dir, (double)call->output_bytes / MB,
                (double)(call->input_bytes + call->output_bytes) / MB,
                call->graph ? ", graph-deferred" : "");
    fi_dump_log(call->rec, "Outputs dumped to: %s", call->dir);
}

static void dirs_abandon(fi_dump_call *call) { rmdir(call->dir); }

static int no_output_checks(const fi_dump_call *call)
{
    (void)call;
    return 0;
}

static void no_ring(fi_recorder *rec) { (void)rec; }

static int no_fire(fi_recorder *rec, const char *trigger)
{
    (void)rec;
    (void)trigger;
    return 0;
}

static size_t no_bytes(const fi_recorder *rec)
{
    (void)rec;
    return 0;
}

static PyObject *no_banner(const fi_recorder *rec)
{
    (void)rec;
    Py_RETURN_NONE;
}

const fi_record_mode fi_record_call_dirs = {
    .keeps_session = 1,
    .keeps_captured = 1,
    .recording = dirs_recording,
    .admits = dirs_admit,
    .place = dirs_place,
    .save = dirs_save,
    .write_record = dirs_write_record,
    .inputs_done = dirs_inputs_done,
    .outputs_refused = dirs_outputs_refused,
    .reopen = NULL,
    .done = dirs_done,
    .abandon = dirs_abandon,
    .checks_outputs = no_output_checks,
    .forked = no_ring,
    .free_ring = no_ring,
    .fire = no_fire,
    .ring_bytes = no_bytes,
    .banner = no_banner,
};

/* -------------------------------------------------------------- the disk ring */

/* The ring is made at the first recorded call. */
static int disk_recording(fi_recorder *rec)
{
    if (!rec->ring && !(rec->ring = fi_disk_ring_new(rec->cfg->ring))) {
        PyErr_NoMemory();
        return -1;
    }
    return 1;
}

/* A ring bounds itself: the caps are for recording everything. */
static int disk_admit(fi_dump_call *call, long long bytes)
{
    (void)call;
    (void)bytes;
    return 1;
}

static const char *disk_outputs_refused(fi_dump_call *call, long long bytes)
{
    (void)call;
    (void)bytes;
    return NULL;
}

/* The call's directory is pinned in the ring while the call writes it: other threads' calls
 * evict only directories whose calls are done. */
static int disk_place(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq)
{
    if (dirs_place(call, stamp, bytes, call_seq) < 0)
        return -1;
    if (!(call->place = fi_disk_ring_push(call->rec->ring, call->dir))) {
        rmdir(call->dir);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void disk_done(fi_dump_call *call, PyObject *result, int ok)
{
    dirs_done(call, result, ok);
    fi_disk_ring_unpin(call->rec->ring, call->place);
}

static void disk_abandon(fi_dump_call *call) { fi_disk_ring_drop(call->rec->ring, call->place); }

/* A forked child keeps its own directories (their names carry its pid): the parent's are
 * forgotten, never deleted. */
static void disk_forked(fi_recorder *rec)
{
    if (rec->ring)
        fi_disk_ring_forget(rec->ring);
}

static void disk_free_ring(fi_recorder *rec) { fi_disk_ring_free(rec->ring); }

static PyObject *disk_banner(const fi_recorder *rec)
{
    long long n = rec->cfg->ring;
    return Py_BuildValue(
        "(NN)",
        PyUnicode_FromFormat("Only the last %lld calls are kept on disk "
                             "(FLASHINFER_DUMP_RING): each new call replaces the oldest.",
                             n),
        PyUnicode_FromFormat("  ring: %lld call directories", n));
}

const fi_record_mode fi_record_disk_ring = {
    /* session.jsonl would grow without end: the directories are the record */
    .keeps_session = 0,
    .keeps_captured = 1,
    .recording = disk_recording,
    .admits = disk_admit,
    .place = disk_place,
    .save = dirs_save,
    .write_record = dirs_write_record,
    .inputs_done = dirs_inputs_done,
    .outputs_refused = disk_outputs_refused,
    .reopen = NULL,
    .done = disk_done,
    .abandon = disk_abandon,
    .checks_outputs = no_output_checks,
    .forked = disk_forked,
    .free_ring = disk_free_ring,
    .fire = no_fire,
    .ring_bytes = no_bytes,
    .banner = disk_banner,
};
