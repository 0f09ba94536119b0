/* record_memory_ring.c: the recorder mode of the in-memory ring (FLASHINFER_DUMP_RING with
 * FLASHINFER_DUMP_ON): each call's files are built in its ring slot as the call runs, and
 * nothing is written until a trigger fires (docs/ring.md). */
#include "record_mode.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "dump_format.h"
#include "crash_writer.h"
#include "device_chunks.h"
#include "json.h"
#include "ring_signals.h"
#include "stats.h"

#define GB (1024.0 * 1024.0 * 1024.0)

/* ---------------------------------------------------------------- triggers */

/* While a write-out on another thread holds the ring (a signal handler's), a trigger waits
 * for it with the GIL let go: that thread may need it to finish what it was doing. */
static void wait_for_writer(void)
{
    Py_BEGIN_ALLOW_THREADS
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    Py_END_ALLOW_THREADS
}

/* Writes the ring for trigger (the call of generation first first, 0: none) and says so in
 * one log line, with the calls lost and why when the disk refused some. The number of calls
 * written, -1 with OSError set when the dump root cannot be made. */
static int fire_ring(fi_recorder *rec, const char *trigger, long long first, const char *api_name)
{
    fi_ring_result res;
    if (fi_ring_fire(rec->ring, trigger, first, wait_for_writer, &res) < 0) {
        int err = errno;
        fi_dump_log(rec, "[flashinfer] flight recorder: trigger %s%s%s: cannot write %s: %s",
                    trigger, api_name ? " in " : "", api_name ? api_name : "", rec->cfg->dump_dir,
                    strerror(err));
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, rec->cfg->dump_dir);
        return -1;
    }
    if (!res.fired)
        return 0; /* FLASHINFER_DUMP_MAX_TRIGGERS reached */
    fi_buf b;
    fi_buf_init(&b);
    fi_buf_printf(&b, "[flashinfer] flight recorder: trigger %s%s%s: %lld calls written to %s",
                  trigger, api_name ? " in " : "", api_name ? api_name : "", res.written,
                  rec->cfg->dump_dir);
    if (res.before)
        fi_buf_printf(&b, " (%lld more written by the write-out before)", res.before);
    if (res.lost)
        fi_buf_printf(&b, "; %lld calls lost: %s", res.lost, fi_crash_errno_text(res.error));
    if (res.record == FI_RECORD_SHORT)
        fi_buf_printf(&b,
                      "; its record in session.jsonl leaves out the triggering call's keys "
                      "(%zu bytes: the record would pass %d bytes)",
                      res.keys_left_out, FI_TRIGGER_RECORD_MAX);
    else if (res.record == FI_RECORD_LOST)
        fi_buf_printf(&b, "; its record could not be written to session.jsonl: %s",
                      strerror(res.record_error));
    fi_buf_putc(&b, '\n');
    rec->emit(rec->owner, b.data, b.len);
    fi_buf_free(&b);
    return (int)res.written;
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
static int set_trigger_keys(fi_buf *out, const fi_record *record)
{
    static const char *const keys[] = {"function_name", "dump_dir", "call_sequence", "sequence"};
    fi_buf_reset(out);
    int first = 1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t n;
        const char *v = fi_record_get(record, keys[i], &n);
        if (!v)
            continue;
        if (!first)
            fi_buf_append(out, ", ", 2);
        first = 0;
        fi_json_str(out, keys[i], strlen(keys[i]));
        fi_buf_append(out, ": ", 2);
        fi_buf_append(out, v, n);
    }
    if (out->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ the ring */

/* The ring's budget: FLASHINFER_DUMP_RING_MAX_GB (by default the smaller of 4 GB and a
 * quarter of the memory the process may use, config.c) in bytes. */
static size_t budget_bytes(const fi_config *c)
{
    double b = c->ring_max_gb * GB;
    return b >= (double)SIZE_MAX ? SIZE_MAX : (size_t)b;
}

/* The recorder's ring, made when the recorder is made at level 10 (memory_start) or at the
 * first recorded call, with the signal handlers its triggers ask for. NULL with an
 * exception set. */
static fi_ring *make_ring(fi_recorder *rec)
{
    if (rec->ring)
        return rec->ring;
    const fi_config *c = rec->cfg;
    fi_ring *r =
        fi_ring_new(c->ring, c->dump_dir, budget_bytes(c), c->max_triggers,
                    c->safetensors ? FI_DUMP_EXT_SAFETENSORS : FI_DUMP_EXT_TORCH, rec->compact);
    if (!r) {
        PyErr_NoMemory();
        return NULL;
    }
    rec->ring = r;
    if ((c->dump_on & FI_TRIGGER_SIGNAL) && fi_ring_install_signals(r) < 0)
        fi_dump_log(rec, "[flashinfer] WARNING: flight recorder signal handlers not installed: %s",
                    strerror(errno));
    return r;
}

/* The ring of a recorded call: the exit trigger is registered at the first one, so that a
 * process that records nothing writes nothing at exit. */
static fi_ring *ring_of(fi_recorder *rec)
{
    fi_ring *r = make_ring(rec);
    if (!r || rec->exit_hooked || !(rec->cfg->dump_on & FI_TRIGGER_EXIT))
        return r;
    PyObject *atexit = PyImport_ImportModule("atexit");
    PyObject *method = PyObject_GetAttrString(rec->owner, "dump_ring");
    PyObject *ok =
        atexit && method ? PyObject_CallMethod(atexit, "register", "Os", method, "exit") : NULL;
    Py_XDECREF(atexit);
    Py_XDECREF(method);
    if (!ok)
        return NULL;
    Py_DECREF(ok);
    rec->exit_hooked = 1;
    return r;
}

static int memory_start(fi_recorder *rec) { return make_ring(rec) ? 0 : -1; }

/* ------------------------------------------------------------ the mode */

/* Calls are recorded until FLASHINFER_DUMP_MAX_TRIGGERS fired, and not while a write-out
 * runs (the ring starts again after it). */
static int memory_recording(fi_recorder *rec)
{
    fi_ring *r = ring_of(rec);
    return r ? fi_ring_recording(r) : -1;
}

/* A ring bounds itself: the caps are for recording everything. */
static int memory_admit(fi_dump_call *call, long long bytes)
{
    (void)call;
    (void)bytes;
    return 1;
}

/* The warning, once per process, that the budget left tensors out. */
static void warn_budget(fi_dump_call *call, const char *what, long long bytes)
{
    fi_recorder *rec = call->rec;
    if (rec->ring_warned)
        return;
    rec->ring_warned = 1;
    fi_dump_log(rec,
                "[flashinfer] WARNING: a %s call (%lld tensor bytes) is larger than the flight "
                "recorder's budget (%g GB): %s not kept. Raise FLASHINFER_DUMP_RING_MAX_GB to "
                "keep them.",
                PyUnicode_AsUTF8(call->name), bytes, rec->cfg->ring_max_gb, what);
}

/* Outputs that would take the call past the whole budget are left out (its inputs stay). A
 * compact call's outputs are measured once their chunks are taken (save_compact). */
static const char *memory_outputs_refused(fi_dump_call *call, long long bytes)
{
    if (!call->files || call->tensors_skipped || call->rec->compact)
        return NULL;
    if (fi_ring_call_fits(call->rec->ring, call->files, bytes > 0 ? (size_t)bytes : 0))
        return NULL;
    warn_budget(call, "its outputs are", call->input_bytes + bytes);
    return "ring budget";
}

/* Names the call's directory (made when a trigger writes it) and claims its slot. A call
 * larger than the whole budget keeps only its records, with one warning. 1 (not recorded)
 * while a write-out runs. */
static int memory_place(fi_dump_call *call, const char *stamp, long long bytes, long long *call_seq)
{
    fi_recorder *rec = call->rec;
    call->dir = fi_dump_make_call_dir(rec, call->name, stamp, call_seq, 0);
    if (!call->dir)
        return -1;
    switch (fi_ring_claim(rec->ring, call->dir, bytes > 0 ? (size_t)bytes : 0, &call->ticket,
                          &call->own)) {
    case FI_CLAIM_NO_MEMORY:
        PyErr_NoMemory();
        return -1;
    case FI_CLAIM_BUSY:
        return 1;
    case FI_CLAIM_TOO_BIG:
        warn_budget(call, "its tensors are", bytes);
        call->tensors_skipped = "ring budget";
        break;
    }
    call->files = &call->own;
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
 * inputs' statistics taken on the way; the manifest's tail built now. CUDA tensors are
 * hashed on their device and only new chunks copied (device_chunks.c): when a device call
 * fails, again on the host. On failure m holds nothing. */
static Py_ssize_t build_chunks_with(fi_dump_call *call, int inputs, const fi_dump_tensors *ts,
                                    fi_ring_manifest *m, fi_chunk_device *dev)
{
    fi_ring *ring = call->rec->ring;
    fi_save_opts opts = fi_dump_save_opts(call, inputs, ts, dev);
    PyObject *host = ts->any_cuda && !call->ctx->paged.device_ranges
                         ? host_tensors_but_paged(ts->tensors, &call->ctx->paged)
                         : Py_NewRef(ts->tensors);
    if (!host)
        return -1;
    size_t before = fi_chunk_store_bytes(ring->store);
    fi_ring_manifest_clear(m);
    m->store = ring->store;
    int r = fi_compact_capture_dict(ring->store, host, &opts, NULL, &m->t, &m->n);
    Py_DECREF(host);
    if (r < 0) {
        m->t = NULL;
        m->n = 0;
        return -1;
    }
    if (fi_compact_manifest_tail(&m->tail, m->t, m->n) < 0) {
        fi_ring_manifest_clear(m);
        PyErr_NoMemory();
        return -1;
    }
    size_t after = fi_chunk_store_bytes(ring->store);
    return after > before ? (Py_ssize_t)(after - before) : 0;
}

static Py_ssize_t build_chunks(fi_dump_call *call, int inputs, const fi_dump_tensors *ts,
                               fi_ring_manifest *m)
{
    fi_chunk_device *dev = fi_device_chunks();
    unsigned failures = dev ? dev->failures : 0;
    Py_ssize_t r = build_chunks_with(call, inputs, ts, m, dev);
    if (r < 0 && fi_device_chunks_gave_up(call->rec, dev, failures))
        r = build_chunks_with(call, inputs, ts, m, NULL);
    return r;
}

/* The tensor file image of ts in img: host copies taken first for CUDA tensors. */
static Py_ssize_t build_image(fi_dump_call *call, const fi_dump_tensors *ts, fi_image *img)
{
    PyObject *host = ts->any_cuda ? host_tensors(ts->tensors) : Py_NewRef(ts->tensors);
    if (!host)
        return -1;
    Py_ssize_t r = fi_image_tensor_dict(
        host, call->rec->cfg->safetensors ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH, img);
    Py_DECREF(host);
    return r;
}

/* Whether the pending exception says memory ran out: MemoryError, OSError ENOMEM (a file
 * image's buffer), torch's OutOfMemoryError (pinned host memory for CUDA tensors). */
static int out_of_memory(void)
{
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
        return 1;
    PyObject *et = PyErr_Occurred();
    if (et && PyType_Check(et) && strstr(((PyTypeObject *)et)->tp_name, "OutOfMemoryError"))
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_OSError))
        return 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *code = value ? PyObject_GetAttrString(value, "errno") : NULL;
    int enomem = code && PyLong_Check(code) && PyLong_AsLong(code) == ENOMEM;
    Py_XDECREF(code);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return enomem;
}

/* Whether memory_save takes ts's chunks: then it checks the nan/inf triggers itself, from
 * the statistics the copy took (memory_inspect leaves them). */
static int saves_chunks(const fi_dump_call *call)
{
    return call->rec->compact && call->files && !call->tensors_skipped;
}

/* The nan/inf triggers: the outputs are checked, and the inputs with nan_input. */
static void check_nonfinite(fi_dump_call *call, const fi_dump_tensors *ts, int inputs)
{
    if (!call->trigger && (!inputs || (call->rec->cfg->dump_on & FI_TRIGGER_NAN_INPUT)))
        call->trigger = nonfinite_trigger(call, ts->tensors);
}

static void memory_inspect(fi_dump_call *call, const fi_dump_tensors *ts, int inputs)
{
    if (!saves_chunks(call))
        check_nonfinite(call, ts, inputs);
}

/* The tensor file as an image in the call's slot: a copy taken at call time (callers reuse
 * their buffers). When memory runs out, the older calls are evicted and the image is built
 * again, once; if that fails too the call keeps its records only, and the user's call goes
 * on (a warning says so, once). */
static Py_ssize_t save_tensors(fi_dump_call *call, int inputs, const fi_dump_tensors *ts)
{
    fi_image *img = inputs ? &call->files->inputs : &call->files->outputs;
    fi_ring_manifest *m = inputs ? &call->files->cin : &call->files->cout;
    return call->rec->compact ? build_chunks(call, inputs, ts, m) : build_image(call, ts, img);
}

/* Leaves the inputs or the outputs of the call out of its slot, saying why in its record. */
static int skip_tensors(fi_dump_call *call, int inputs, const char *why)
{
    fi_image_free(inputs ? &call->files->inputs : &call->files->outputs);
    fi_ring_manifest_clear(inputs ? &call->files->cin : &call->files->cout);
    if (inputs) {
        call->tensors_skipped = why;
        return 0;
    }
    return fi_record_set_str(&call->record, "outputs_skipped", why);
}

/* A compact call's chunks are known once taken: a call that alone passes the budget keeps
 * only its records (its outputs: the outputs are left out), as fi_ring_claim decides for a
 * tensor file image before anything is evicted. */
static int check_compact_budget(fi_dump_call *call, int inputs, const fi_dump_tensors *ts)
{
    if (!call->rec->compact || fi_ring_call_fits(call->rec->ring, call->files, 0))
        return 0;
    warn_budget(call, inputs ? "its tensors are" : "its outputs are",
                inputs ? ts->bytes : call->input_bytes + ts->bytes);
    return skip_tensors(call, inputs, "ring budget");
}

/* The call's tensors in its slot: a copy taken at call time (callers reuse their buffers),
 * as chunks (compact layout) or a tensor file image. When memory runs out, the older calls
 * are evicted and the copy is taken again, once; if that fails too the call keeps its
 * records only, and the user's call goes on (a warning says so, once). A compact call's
 * inputs (with nan_input) and outputs are checked for the nan/inf triggers here, from the
 * statistics the copy took. */
static Py_ssize_t memory_save(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts)
{
    int inputs = stem[0] == 'i';
    int chunks = saves_chunks(call);
    Py_ssize_t r = call->files && !call->tensors_skipped ? save_tensors(call, inputs, ts) : 0;
    if (r < 0 && out_of_memory()) {
        PyErr_Clear();
        fi_ring_evict_others(call->rec->ring, &call->ticket);
        r = save_tensors(call, inputs, ts);
        if (r < 0 && out_of_memory()) {
            PyErr_Clear();
            r = -2;
        }
    }
    if (chunks && r != -1)
        check_nonfinite(call, ts, inputs);
    if (r >= 0 && call->files && check_compact_budget(call, inputs, ts) < 0)
        return -1;
    if (r != -2)
        return r;
    if (skip_tensors(call, inputs, "memory") < 0)
        return -1;
    fi_recorder *rec = call->rec;
    if (!rec->memory_warned)
        fi_dump_log(
            rec,
            "[flashinfer] WARNING: out of memory recording the %s of a %s call (%lld tensor "
            "bytes) in the flight recorder, after evicting the older calls: they are not "
            "kept (its records are); the call itself went on.",
            stem, PyUnicode_AsUTF8(call->name), (long long)ts->bytes);
    rec->memory_warned = 1;
    return 0;
}

/* The record as a line of the call's metadata.jsonl image in its slot. */
static int memory_write_record(fi_dump_call *call)
{
    if (!call->files)
        return 0;
    if (call->tensors_skipped &&
        fi_record_set_str(&call->record, "tensors_skipped", call->tensors_skipped) < 0)
        return -1;
    fi_buf *meta = &call->files->meta;
    if (fi_record_render(&call->record, meta) < 0 || fi_buf_putc(meta, '\n') < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    return set_trigger_keys(&call->files->trigger_keys, &call->record);
}

/* Line 1 is in the slot: publish it, so that a crash during the call writes it. */
static void memory_inputs_done(fi_dump_call *call, long long bytes, int capturing)
{
    (void)bytes;
    (void)capturing;
    fi_ring_done(call->rec->ring, &call->ticket, &call->own);
    call->files = NULL;
}

/* The call's slot back for line 2: NULL files when it is gone (evicted, the ring restarted
 * since) or a write-out runs. */
static void memory_reopen(fi_dump_call *call)
{
    call->files = fi_ring_open(call->rec->ring, &call->ticket, &call->own) == 0 ? &call->own : NULL;
}

/* The call's records are complete, so a trigger it fired (exception, nan, inf) writes the
 * ring now, this call first. */
static void memory_done(fi_dump_call *call, PyObject *result, int ok)
{
    (void)ok;
    fi_recorder *rec = call->rec;
    if (call->files) /* NULL: the slot was not given back (a write-out ran); it keeps line 1 */
        fi_ring_done(rec->ring, &call->ticket, &call->own);
    call->files = NULL;
    const char *trigger = call->trigger;
    if (!result && (rec->cfg->dump_on & FI_TRIGGER_EXCEPTION))
        trigger = "exception";
    if (trigger &&
        fire_ring(rec, trigger, call->ticket.generation, PyUnicode_AsUTF8(call->name)) < 0)
        PyErr_Clear(); /* said in the log */
}

/* The slot stays claimed and unpublished (no trigger writes it) until it is evicted. */
static void memory_abandon(fi_dump_call *call) { (void)call; }

static int memory_checks_outputs(const fi_dump_call *call)
{
    return (call->rec->cfg->dump_on & (FI_TRIGGER_NAN | FI_TRIGGER_INF)) != 0;
}

/* A forked child starts an empty ring of its own: the parent's calls are neither written
 * nor freed by a write-out of the child's. */
static void memory_forked(fi_recorder *rec)
{
    if (rec->ring)
        fi_ring_restart_in_child(rec->ring);
}

static void memory_free_ring(fi_recorder *rec) { fi_ring_free(rec->ring); }

static int memory_fire(fi_recorder *rec, const char *trigger)
{
    return rec->ring ? fire_ring(rec, trigger, 0, NULL) : 0;
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

/* Test hook: hold every write-out open after its first call (fi_ring_hold_writeouts). */
static int memory_hold_writeouts(fi_recorder *rec, int hold_fd, int note_fd)
{
    fi_ring *r = ring_of(rec);
    if (!r)
        return -1;
    fi_ring_hold_writeouts(r, hold_fd, note_fd);
    return 0;
}

const fi_record_mode fi_record_memory_ring = {
    .keeps_session = 0,  /* a trigger writes the calls' records there */
    .keeps_captured = 0, /* no copy may run during capture */
    .recording = memory_recording,
    .start = memory_start,
    .admits = memory_admit,
    .inspect = memory_inspect,
    .place = memory_place,
    .save = memory_save,
    .write_record = memory_write_record,
    .inputs_done = memory_inputs_done,
    .outputs_refused = memory_outputs_refused,
    .reopen = memory_reopen,
    .done = memory_done,
    .abandon = memory_abandon,
    .checks_outputs = memory_checks_outputs,
    .forked = memory_forked,
    .free_ring = memory_free_ring,
    .fire = memory_fire,
    .ring_bytes = memory_ring_bytes,
    .banner = memory_banner,
    .hold_writeouts = memory_hold_writeouts,
};
