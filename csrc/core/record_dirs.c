/* record_dirs.c: the recorder modes that write each call's directory as the call runs:
 * every call (level 10 alone, within the count and size caps), or the disk ring, which keeps
 * the newest FLASHINFER_DUMP_RING directories (ring_disk.c). */
#include "record_mode.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "compact.h"
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

/* The count cap first, then the size cap (FlashInfer's order). */
static int dirs_admit(fi_dump_call *call, long long bytes)
{
    fi_recorder *rec = call->rec;
    const char *name = PyUnicode_AsUTF8(call->name);
    if (rec->dump_count >= rec->cfg->max_count) {
        fi_dump_log(rec,
                    "Dump limit reached (%lld dumps). Skipping dump for %s. Increase "
                    "FLASHINFER_DUMP_MAX_COUNT if needed.",
                    rec->cfg->max_count, name);
        return 0;
    }
    if (under_size_cap(rec, bytes))
        return 1;
    /* the call still takes its number, as in FlashInfer: later directories of this API
     * keep the numbers they would have had */
    if (fi_dump_next_counter(rec, call->name) < 0)
        return -1;
    log_size_cap(rec, "Skipping dump for", name);
    return 0;
}

static const char *dirs_outputs_refused(fi_dump_call *call, long long bytes)
{
    if (under_size_cap(call->rec, bytes))
        return NULL;
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
static Py_ssize_t dirs_save(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts)
{
    int inputs = stem[0] == 'i';
    fi_save_opts opts = {inputs ? fi_stats_memo_put : NULL, &call->ctx->stats, fi_paged_keep,
                         &call->ctx->paged};
    fi_recorder *rec = call->rec;
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
    snprintf(path, n, "%s/%s.chunks.json", call->dir, stem);
    Py_ssize_t written = fi_compact_save(rec->compact_writer, path, ts->tensors, &opts);
    free(path);
    return written;
}

static int dirs_write_record(fi_dump_call *call)
{
    return fi_dump_write_record_at(call->rec, call->dir, &call->meta_fd, call->record);
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

static int disk_place(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq)
{
    if (dirs_place(call, stamp, bytes, call_seq) < 0)
        return -1;
    if (fi_disk_ring_push(call->rec->ring, call->dir) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
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
    .done = dirs_done,
    .abandon = dirs_abandon,
    .checks_outputs = no_output_checks,
    .free_ring = disk_free_ring,
    .fire = no_fire,
    .ring_bytes = no_bytes,
    .banner = disk_banner,
};
