/* record_memory_ring.c: the recorder mode of the in-memory ring (FLASHINFER_DUMP_RING with
 * FLASHINFER_DUMP_ON): each call's files are built in its ring slot as the call runs, and
 * nothing is written until a trigger fires (docs/ring.md). */
#include "record_mode.h"

#include <errno.h>
#include <string.h>

#include "dump_format.h"
#include "json.h"
#include "ring_signals.h"
#include "stats.h"

/* ---------------------------------------------------------------- triggers */

/* Writes the ring for trigger and says so in the log. */
static void fire_ring(fi_recorder *rec, const char *trigger, const char *api_name)
{
    fi_ring *ring = rec->ring;
    if (!fi_ring_recording(ring))
        return; /* FLASHINFER_DUMP_MAX_TRIGGERS reached */
    int written = fi_ring_fire(ring, trigger);
    if (written < 0)
        fi_dump_log(rec, "[flashinfer] flight recorder: trigger %s in %s: cannot write %s: %s",
                    trigger, api_name, rec->cfg->dump_dir, strerror(errno));
    else
        fi_dump_log(rec, "[flashinfer] flight recorder: trigger %s in %s: %d calls written to %s",
                    trigger, api_name, written, rec->cfg->dump_dir);
}

/* "nan" or "inf" when a tensor of tensors (a dict) holds one and its trigger is on. The
 * level-5 statistics pass counts both; the call's memo holds those its text took. */
static const char *nonfinite_trigger(fi_dump_call *call, PyObject *tensors)
{
    unsigned on = call->rec->cfg->dump_on & (FI_TRIGGER_NAN | FI_TRIGGER_INF);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (on && PyDict_Next(tensors, &pos, &key, &value)) {
        fi_stats st;
        if (fi_stats_of_tensor(value, &call->ctx->stats, &st) < 0) {
            PyErr_Clear();
            continue;
        }
        if (st.kind != FI_STATS_FLOAT)
            continue;
        if ((on & FI_TRIGGER_NAN) && st.nan_count > 0)
            return "nan";
        if ((on & FI_TRIGGER_INF) && st.inf_count > 0)
            return "inf";
    }
    return NULL;
}

/* The keys a trigger record repeats from the triggering call's record, as JSON members. */
static int set_trigger_keys(fi_buf *out, PyObject *record)
{
    static const char *const keys[] = {"function_name", "dump_dir", "call_sequence", "sequence"};
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < sizeof keys / sizeof keys[0]; i++) {
        PyObject *v = PyDict_GetItemString(record, keys[i]);
        if (v && PyDict_SetItemString(d, keys[i], v) < 0)
            Py_CLEAR(d);
    }
    fi_buf json;
    fi_buf_init(&json);
    int r = d ? fi_json_from_py(&json, d) : -1;
    Py_XDECREF(d);
    fi_buf_reset(out);
    if (r == 0 && json.len >= 2 && fi_buf_append(out, json.data + 1, json.len - 2) < 0)
        r = -1;
    fi_buf_free(&json);
    if (r < 0 && !PyErr_Occurred())
        PyErr_NoMemory();
    return r;
}

/* ------------------------------------------------------------ the mode */

/* The ring is made at the first recorded call, with the signal handlers and the exit hook
 * its triggers ask for; once FLASHINFER_DUMP_MAX_TRIGGERS fired, calls are not recorded. */
static int memory_recording(fi_recorder *rec)
{
    if (rec->ring)
        return fi_ring_recording(rec->ring);
    const fi_config *c = rec->cfg;
    fi_ring *r =
        fi_ring_new(c->ring, c->dump_dir, c->ring_max_gb, c->max_triggers,
                    c->safetensors ? FI_DUMP_EXT_SAFETENSORS : FI_DUMP_EXT_TORCH, rec->compact);
    if (!r) {
        PyErr_NoMemory();
        return -1;
    }
    rec->ring = r;
    if ((c->dump_on & FI_TRIGGER_SIGNAL) && fi_ring_install_signals(r) < 0)
        fi_dump_log(rec, "[flashinfer] WARNING: flight recorder signal handlers not installed: %s",
                    strerror(errno));
    if (c->dump_on & FI_TRIGGER_EXIT) {
        PyObject *atexit = PyImport_ImportModule("atexit");
        PyObject *method = PyObject_GetAttrString(rec->owner, "dump_ring");
        PyObject *ok =
            atexit && method ? PyObject_CallMethod(atexit, "register", "Os", method, "exit") : NULL;
        Py_XDECREF(atexit);
        Py_XDECREF(method);
        if (!ok)
            return -1;
        Py_DECREF(ok);
    }
    return fi_ring_recording(r);
}

/* A ring bounds itself: the caps are for recording everything. */
static int memory_admit(fi_dump_call *call, long long bytes)
{
    (void)call;
    (void)bytes;
    return 1;
}

static const char *memory_outputs_refused(fi_dump_call *call, long long bytes)
{
    (void)call;
    (void)bytes;
    return NULL;
}

/* Names the call's directory (made when a trigger writes it) and claims its slot. A call
 * larger than the whole budget keeps only its records, with one warning. */
static int memory_place(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq)
{
    fi_recorder *rec = call->rec;
    call->dir = fi_dump_make_call_dir(rec, call->name, stamp, call_seq, 0);
    if (!call->dir)
        return -1;
    int r = fi_ring_claim(rec->ring, call->dir, bytes > 0 ? (size_t)bytes : 0, &call->ticket,
                          &call->own);
    if (r < 0) {
        PyErr_NoMemory();
        return -1;
    }
    call->files = &call->own;
    if (r == 1) {
        if (!rec->ring_warned)
            fi_dump_log(rec,
                        "[flashinfer] WARNING: a %s call (%lld tensor bytes) is larger than the "
                        "flight recorder's budget (%g GB): its tensors are not kept. Raise "
                        "FLASHINFER_DUMP_RING_MAX_GB to keep them.",
                        PyUnicode_AsUTF8(call->name), bytes, rec->cfg->ring_max_gb);
        rec->ring_warned = 1;
        call->tensors_skipped = 1;
    }
    return 0;
}

/* tensors with their CUDA tensors copied to pinned host memory on a side stream ordered
 * after the producing stream (flashinfer_native/staging.py): the ring must not
 * synchronize the device. A new reference, or NULL with an exception set. */
static PyObject *host_tensors(PyObject *tensors)
{
    PyObject *staging = PyImport_ImportModule("flashinfer_native.staging");
    if (!staging)
        return NULL;
    PyObject *host = PyObject_CallMethod(staging, "to_host", "O", tensors);
    Py_DECREF(staging);
    return host;
}

/* tensors with the CUDA ones that are not paged tensors of the call staged to the host
 * (host_tensors); a paged one stays as it is: only its pages are copied (fi_paged_keep). */
static PyObject *host_tensors_but_paged(PyObject *tensors, const fi_paged *paged)
{
    PyObject *rest = PyDict_New(), *key, *value;
    Py_ssize_t pos = 0;
    while (rest && PyDict_Next(tensors, &pos, &key, &value))
        if (!fi_paged_find(paged, value) && PyDict_SetItem(rest, key, value) < 0)
            Py_CLEAR(rest);
    PyObject *host = rest ? host_tensors(rest) : NULL;
    Py_XDECREF(rest);
    PyObject *all = host ? PyDict_Copy(tensors) : NULL;
    if (all && PyDict_Update(all, host) < 0)
        Py_CLEAR(all);
    Py_XDECREF(host);
    return all;
}

/* The compact layout: the tensors' chunks into the ring's store (a copy of each chunk the
 * store lacks: callers reuse their buffers), the pages a paged cache's call reads only, the
 * inputs' statistics taken on the way; the manifest's tail built now. */
static Py_ssize_t memory_save_chunks(fi_dump_call *call, int inputs, const fi_dump_tensors *ts)
{
    fi_ring *ring = call->rec->ring;
    fi_ring_manifest *m = inputs ? &call->files->cin : &call->files->cout;
    PyObject *host = ts->any_cuda ? host_tensors_but_paged(ts->tensors, &call->ctx->paged)
                                  : Py_NewRef(ts->tensors);
    if (!host)
        return -1;
    fi_save_opts opts = {inputs ? fi_stats_memo_put : NULL, &call->ctx->stats, fi_paged_keep,
                         &call->ctx->paged};
    size_t before = fi_chunk_store_bytes(ring->store);
    int r = fi_compact_capture_dict(ring->store, host, &opts, NULL, &m->t, &m->n);
    Py_DECREF(host);
    m->store = ring->store;
    if (r < 0)
        return -1;
    fi_buf_reset(&m->tail);
    if (fi_compact_manifest_tail(&m->tail, m->t, m->n) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return (Py_ssize_t)(fi_chunk_store_bytes(ring->store) - before);
}

/* The call's tensors in its slot: a copy taken at call time (callers reuse their buffers),
 * as chunks (compact layout) or a tensor file image. The inputs (with nan_input) and the
 * outputs are checked for the nan/inf triggers, from the statistics the copy took. */
static Py_ssize_t memory_save(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts)
{
    int inputs = stem[0] == 'i';
    int check = !inputs || (call->rec->cfg->dump_on & FI_TRIGGER_NAN_INPUT);
    if (call->rec->compact && call->files && !call->tensors_skipped) {
        Py_ssize_t r = memory_save_chunks(call, inputs, ts);
        if (r >= 0 && check && !call->trigger)
            call->trigger = nonfinite_trigger(call, ts->tensors);
        return r;
    }
    if (!call->trigger && check)
        call->trigger = nonfinite_trigger(call, ts->tensors);
    if (!call->files || call->tensors_skipped)
        return 0;
    PyObject *host = ts->any_cuda ? host_tensors(ts->tensors) : Py_NewRef(ts->tensors);
    if (!host)
        return -1;
    fi_image *img = inputs ? &call->files->inputs : &call->files->outputs;
    Py_ssize_t r = fi_image_tensor_dict(
        host, call->rec->cfg->safetensors ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH, img);
    Py_DECREF(host);
    return r;
}

/* The record as a line of the call's metadata.jsonl image in its slot. */
static int memory_write_record(fi_dump_call *call)
{
    if (!call->files)
        return 0;
    if (call->tensors_skipped &&
        fi_dump_dict_set(call->record, "tensors_skipped", PyUnicode_FromString("ring budget")) < 0)
        return -1;
    fi_buf *meta = &call->files->meta;
    if (fi_json_from_py(meta, call->record) < 0 || fi_buf_putc(meta, '\n') < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    return set_trigger_keys(&call->files->trigger_keys, call->record);
}

/* Line 1 is in the slot: publish it, so that a crash during the call writes it. */
static void memory_inputs_done(fi_dump_call *call, long long bytes, int capturing)
{
    (void)bytes;
    (void)capturing;
    fi_ring_done(call->rec->ring, &call->ticket, &call->own);
    call->files = NULL;
}

/* The call's slot back for line 2: NULL files when it is gone (evicted, or the ring
 * fired since). */
static void memory_reopen(fi_dump_call *call)
{
    call->files = fi_ring_open(call->rec->ring, &call->ticket, &call->own) == 0 ? &call->own : NULL;
}

/* The call's records are complete, so a trigger it fired (exception, nan, inf) writes the
 * ring now, the call included. */
static void memory_done(fi_dump_call *call, PyObject *result, int ok)
{
    (void)ok;
    fi_recorder *rec = call->rec;
    fi_ring_done(rec->ring, &call->ticket, &call->own);
    call->files = NULL;
    const char *trigger = call->trigger;
    if (!result && (rec->cfg->dump_on & FI_TRIGGER_EXCEPTION))
        trigger = "exception";
    if (trigger)
        fire_ring(rec, trigger, PyUnicode_AsUTF8(call->name));
}

/* The slot stays claimed and unpublished (no trigger writes it) until it is evicted. */
static void memory_abandon(fi_dump_call *call) { (void)call; }

static int memory_checks_outputs(const fi_dump_call *call)
{
    return (call->rec->cfg->dump_on & (FI_TRIGGER_NAN | FI_TRIGGER_INF)) != 0;
}

static void memory_free_ring(fi_recorder *rec) { fi_ring_free(rec->ring); }

static int memory_fire(fi_recorder *rec, const char *trigger)
{
    if (!rec->ring)
        return 0;
    int written = fi_ring_fire(rec->ring, trigger);
    if (written < 0)
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, rec->cfg->dump_dir);
    return written;
}

static size_t memory_ring_bytes(const fi_recorder *rec)
{
    return rec->ring ? fi_ring_bytes(rec->ring) : 0;
}

static PyObject *memory_banner(const fi_recorder *rec)
{
    const fi_config *c = rec->cfg;
    char budget[32];
    snprintf(budget, sizeof budget, "%g", c->ring_max_gb);
    return Py_BuildValue(
        "(NN)",
        PyUnicode_FromFormat("The last %lld calls are kept in memory and written to disk when a "
                             "trigger of FLASHINFER_DUMP_ON fires.",
                             c->ring),
        PyUnicode_FromFormat("  ring: %lld calls in memory, budget %s GB, at most %lld trigger(s)",
                             c->ring, budget, c->max_triggers));
}

const fi_record_mode fi_record_memory_ring = {
    .keeps_session = 0,  /* a trigger writes the calls' records there */
    .keeps_captured = 0, /* no copy may run during capture */
    .recording = memory_recording,
    .admits = memory_admit,
    .place = memory_place,
    .save = memory_save,
    .write_record = memory_write_record,
    .inputs_done = memory_inputs_done,
    .outputs_refused = memory_outputs_refused,
    .reopen = memory_reopen,
    .done = memory_done,
    .abandon = memory_abandon,
    .checks_outputs = memory_checks_outputs,
    .free_ring = memory_free_ring,
    .fire = memory_fire,
    .ring_bytes = memory_ring_bytes,
    .banner = memory_banner,
};
