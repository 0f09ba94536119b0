/* dump.c: the life of a recorded call, the same in every mode: its arguments encoded, its
 * directory named, inputs and outputs written and the two records of metadata.jsonl, each
 * step done by the mode's operations (record_mode.h). Also the recorder's own state. */
#include "recorder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "compact.h"
#include "dump_encode.h"
#include "dump_format.h"
#include "dump_record.h"
#include "fork_watch.h"
#include "graph_capture.h"
#include "record_mode.h"
#include "sink.h"
#include "tensor.h"

/* ---------------------------------------------------------------- the recorder */

/* FLASHINFER_DUMP_RING without FLASHINFER_DUMP_ON keeps the last N call directories on
 * disk; with it the last N calls stay in memory until a trigger fires. */
static const fi_record_mode *mode_of(const fi_config *cfg)
{
    if (cfg->ring <= 0)
        return &fi_record_call_dirs;
    return cfg->dump_on ? &fi_record_memory_ring : &fi_record_disk_ring;
}

int fi_recorder_init(fi_recorder *rec, const fi_config *cfg, PyObject *owner,
                     fi_recorder_emit_fn emit)
{
    memset(rec, 0, sizeof(*rec));
    rec->cfg = cfg;
    rec->owner = owner;
    rec->emit = emit;
    rec->mode = mode_of(cfg);
    /* FlashInfer's layout for plain level 10 unless FLASHINFER_DUMP_LAYOUT says compact,
     * the compact one for the in-memory ring unless it says flashinfer; the disk ring
     * always FlashInfer's: it deletes old calls one by one, and a shared pack would only
     * grow (docs/flight-recorder.md#page-aware-capture) */
    rec->compact = rec->mode == &fi_record_memory_ring ? cfg->layout != FI_LAYOUT_FLASHINFER
                   : rec->mode == &fi_record_call_dirs ? cfg->layout == FI_LAYOUT_COMPACT
                                                       : 0;
    rec->session_fd = -1;
    rec->call_counters = PyDict_New();
    rec->static_meta = PyDict_New();
    rec->graph_pending = PyList_New(0);
    if (!rec->call_counters || !rec->static_meta || !rec->graph_pending)
        return -1;
    if (fi_fork_watch() < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    rec->fork_epoch = fi_fork_epoch();
    /* a failure here is retried at the first recorded call; the import goes on */
    if (cfg->level >= 10 && rec->mode->start && rec->mode->start(rec) < 0)
        PyErr_Clear();
    return 0;
}

/* In a child forked since the last recorded call, the ring is the parent's: the mode makes
 * it the child's own, empty. */
static void check_fork(fi_recorder *rec)
{
    unsigned long now = fi_fork_epoch();
    if (rec->fork_epoch == now)
        return;
    rec->fork_epoch = now;
    rec->mode->forked(rec);
}

int fi_recorder_traverse(fi_recorder *rec, visitproc visit, void *arg)
{
    Py_VISIT(rec->call_counters);
    Py_VISIT(rec->static_meta);
    Py_VISIT(rec->graph_pending);
    Py_VISIT(rec->capture_graph);
    return 0;
}

void fi_recorder_clear(fi_recorder *rec)
{
    Py_CLEAR(rec->call_counters);
    Py_CLEAR(rec->static_meta);
    Py_CLEAR(rec->graph_pending);
    Py_CLEAR(rec->capture_graph);
}

void fi_recorder_free(fi_recorder *rec)
{
    if (!rec->mode) /* never initialized */
        return;
    fi_recorder_clear(rec);
    if (rec->session_fd >= 0)
        close(rec->session_fd);
    rec->session_fd = -1;
    if (rec->ring)
        rec->mode->free_ring(rec);
    rec->ring = NULL;
    fi_compact_writer_free(rec->compact_writer);
    rec->compact_writer = NULL;
}

int fi_recorder_fire(fi_recorder *rec, const char *trigger)
{
    size_t n = strlen(trigger);
    if (n == 0 || n > FI_TRIGGER_NAME_MAX) {
        PyErr_Format(PyExc_ValueError, "dump_ring: the trigger name must be 1 to %d bytes, not %zu",
                     FI_TRIGGER_NAME_MAX, n);
        return -1;
    }
    check_fork(rec);
    return rec->mode->fire(rec, trigger);
}

int fi_recorder_hold_writeouts(fi_recorder *rec, int hold_fd, int note_fd)
{
    if (!rec->mode->hold_writeouts) {
        PyErr_SetString(PyExc_RuntimeError, "write-outs are held in the in-memory ring only "
                                            "(FLASHINFER_DUMP_RING with FLASHINFER_DUMP_ON)");
        return -1;
    }
    check_fork(rec);
    return rec->mode->hold_writeouts(rec, hold_fd, note_fd);
}

size_t fi_recorder_ring_bytes(const fi_recorder *rec) { return rec->mode->ring_bytes(rec); }

int fi_recorder_chunk_hashes(const fi_recorder *rec, uint64_t *hashed, uint64_t *memo_hits)
{
    const fi_ring *ring = rec->mode == &fi_record_memory_ring ? rec->ring : NULL;
    if (!ring || !ring->store)
        return -1;
    *hashed = fi_chunk_store_hashed(ring->store, memo_hits);
    return 0;
}

PyObject *fi_recorder_banner(const fi_recorder *rec) { return rec->mode->banner(rec); }

int fi_dump_checks_outputs(const fi_dump_call *call)
{
    return call->rec->mode->checks_outputs(call);
}

/* ---------------------------------------------------------------- records */

/* FI_DUMP_STAMP_FORMAT of the local time now, then "_" and the milliseconds. The seconds'
 * text is made once a second (calls run under the GIL, one at a time). */
static void timestamp_now(char *out, size_t n)
{
    static time_t last_sec = -1;
    static char last[32];
    static size_t last_len;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if (tv.tv_sec != last_sec) {
        struct tm tm;
        localtime_r(&tv.tv_sec, &tm);
        last_len = strftime(last, sizeof last, FI_DUMP_STAMP_FORMAT, &tm);
        last_sec = tv.tv_sec;
    }
    int ms = (int)(tv.tv_usec / 1000);
    if (last_len + 5 > n) { /* callers give 32 bytes: not reached */
        if (n)
            out[0] = '\0';
        return;
    }
    memcpy(out, last, last_len);
    out[last_len] = '_';
    out[last_len + 1] = (char)('0' + ms / 100);
    out[last_len + 2] = (char)('0' + ms / 10 % 10);
    out[last_len + 3] = (char)('0' + ms % 10);
    out[last_len + 4] = '\0';
}

#define MB (1024.0 * 1024.0)

/* torch.cuda.is_current_stream_capturing(), only asked when a CUDA tensor is involved. */
static int graph_capturing(const fi_dump_tensors *ts)
{
    if (!ts->any_cuda)
        return 0;
    PyObject *cuda = PyImport_ImportModule("torch.cuda");
    PyObject *r = cuda ? PyObject_CallMethod(cuda, "is_current_stream_capturing", NULL) : NULL;
    int yes = r == Py_True;
    Py_XDECREF(cuda);
    Py_XDECREF(r);
    PyErr_Clear();
    return yes;
}

/* Keys that static_meta["record_extras"] (a Python callable returning a dict or None)
 * adds to a call's records, e.g. the torch.distributed rank. Asked at every dumped call,
 * so a process group created after the first call still shows; a failure only loses
 * the extra keys (a key that is not a str is left out). */
static void add_record_extras(fi_recorder *recorder, fi_record *rec)
{
    PyObject *fn = PyDict_GetItem(recorder->static_meta, fi_names.record_extras);
    if (!fn || fn == Py_None)
        return;
    PyObject *extra = PyObject_CallObject(fn, NULL);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (extra && PyDict_Check(extra) && PyDict_Next(extra, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (k && fi_record_set_py(rec, k, value) < 0)
            break;
    }
    Py_XDECREF(extra);
    PyErr_Clear();
}

/* The member name (len bytes) of info: ts's tensor keys as a JSON list. */
static int put_key_list(fi_record *info, const char *name, size_t len, const fi_dump_tensors *ts)
{
    fi_buf *b = fi_record_begin(info, name, len);
    if (!b)
        return -1;
    fi_buf_putc(b, '[');
    fi_buf_append(b, ts->keys.data, ts->keys.len);
    fi_buf_putc(b, ']');
    return fi_record_end(info);
}

/* tensor_info's members as line 1 has them. */
static int put_tensor_info(fi_record *info, const fi_dump_tensors *ts)
{
    if (put_key_list(info, "input_tensor_keys", 17, ts) < 0 ||
        fi_record_set_raw(info, "output_tensor_keys", "[]") < 0)
        return -1;
    return fi_record_set_int(info, "input_size_bytes", ts->bytes) < 0 ||
                   fi_record_set_double(info, "input_size_mb", (double)ts->bytes / MB) < 0
               ? -1
               : 0;
}

/* The call's line-1 record (docs/dump-format.md#record-fields), built in rec from the encoded
 * inputs (their input_metadata members in input_meta, moved into it). */
static int build_record(fi_recorder *recorder, fi_record *rec, const fi_dump_api *api,
                        const char *stamp, long long call_seq, const char *dir, fi_dump_tensors *ts,
                        fi_record *input_meta, int capturing)
{
    PyObject *module = PyObject_GetAttr(api->func, fi_names.module);
    if (!module)
        PyErr_Clear();
    PyObject *versions = PyDict_GetItem(recorder->static_meta, fi_names.versions);
    int r = fi_record_set_str(rec, "function_name", api->api_name);
    if (r == 0)
        r = fi_record_set_py(rec, "module", module ? module : Py_None);
    Py_XDECREF(module);
    fi_record *info;
    if (r < 0 || fi_record_set_int(rec, "call_sequence", call_seq) < 0 ||
        fi_record_set_str(rec, "timestamp", stamp) < 0 ||
        fi_record_set_int(rec, "process_id", (long long)fi_fork_pid()) < 0 ||
        fi_record_take(rec, "input_metadata", input_meta) < 0 ||
        !fi_record_child(rec, "output_metadata") || !(info = fi_record_child(rec, "tensor_info")) ||
        put_tensor_info(info, ts) < 0 || fi_record_take(rec, "tensor_details", &ts->details) < 0 ||
        fi_record_set_str(rec, "tensor_format",
                          recorder->compact && !capturing ? FI_DUMP_FORMAT_CHUNKS
                          : recorder->cfg->safetensors    ? FI_DUMP_FORMAT_SAFETENSORS
                                                          : FI_DUMP_FORMAT_TORCH) < 0 ||
        fi_record_set_py(rec, "function_signature",
                         api->signature_text ? api->signature_text : Py_None) < 0 ||
        fi_record_set_py(rec, "versions", versions ? versions : Py_None) < 0 ||
        fi_record_set_str(rec, "execution_status",
                          capturing ? "graph_capture_pending_flush" : "inputs_saved") < 0 ||
        fi_record_set_bool(rec, "graph_capture", capturing) < 0 ||
        fi_record_set_str(rec, "dump_dir", dir) < 0 ||
        fi_record_set_int(rec, "sequence", recorder->sequence) < 0)
        return -1;
    if (api->self) {
        fi_buf *b = fi_record_begin(rec, "self_id", 7);
        if (!b)
            return -1;
        fi_buf_put_u64(b, (unsigned long long)(uintptr_t)api->self);
        if (fi_record_end(rec) < 0)
            return -1;
    }
    add_record_extras(recorder, rec);
    return 0;
}

/* ------------------------------------------------------------ the call's life */

static void call_free(fi_dump_call *call)
{
    Py_XDECREF(call->owner);
    Py_XDECREF(call->name);
    fi_record_free(&call->record);
    Py_XDECREF(call->graph_capsule);
    if (call->meta_fd >= 0)
        close(call->meta_fd);
    fi_ring_files_free(&call->own);
    free(call->dir);
    free(call);
}

/* The inputs: encoded, checked against the caps, placed, written; then line 1. 0: the call
 * is recorded; 1: it is not (capped, a write-out runs, or the mode keeps no captured calls);
 * -1: error. */
static int record_inputs(fi_dump_call *call, const fi_dump_api *api, fi_dump_tensors *ts,
                         PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    fi_recorder *rec = call->rec;
    const fi_record_mode *mode = rec->mode;
    fi_record input_meta;
    fi_record_init(&input_meta);
    int r = -1, placed = 0;
    if (fi_dump_encode_inputs(ts, &input_meta, args, nargs, kwnames, api->scratch, api->args,
                              !rec->cfg->safetensors) < 0)
        goto done;
    if ((r = mode->admits(call, ts->bytes)) <= 0) {
        r = r < 0 ? -1 : 1;
        goto done;
    }
    char stamp[32];
    timestamp_now(stamp, sizeof stamp);
    /* while a CUDA graph is captured no device-to-host copy may run: hold the
     * tensors and write them after each replay (fi_graph_flush) */
    int capturing = rec->force_graph_capture || graph_capturing(ts);
    if (capturing && !mode->keeps_captured) {
        r = 1;
        goto done;
    }
    long long call_seq = 0;
    if ((r = mode->place(call, stamp, ts->bytes, &call_seq)) != 0)
        goto done;
    placed = 1;
    r = -1;
    if (mode->inspect)
        mode->inspect(call, ts, 1);
    Py_ssize_t written = capturing ? 0 : mode->save(call, FI_DUMP_INPUTS, ts);
    if (written < 0)
        goto done;
    rec->sequence++;
    rec->dump_count++;
    rec->dump_bytes += written;
    call->input_bytes = ts->bytes;
    if (build_record(rec, &call->record, api, stamp, call_seq, call->dir, ts, &input_meta,
                     capturing) < 0 ||
        mode->write_record(call) < 0 || (capturing && fi_graph_hold(call, ts->tensors) < 0))
        goto done;
    mode->inputs_done(call, ts->bytes, capturing);
    r = 0;
done:
    if (r < 0 && placed)
        mode->abandon(call);
    fi_record_free(&input_meta);
    return r;
}

fi_dump_call *fi_dump_begin(fi_recorder *rec, fi_call *ctx, const fi_dump_api *api,
                            PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    fi_dump_call *call = calloc(1, sizeof(*call));
    if (call) {
        call->meta_fd = -1;
        fi_record_init(&call->record);
        fi_ring_files_init(&call->own);
    }
    fi_dump_tensors ts = {0};
    int r = -1;
    if (!call || fi_dump_tensors_init(&ts, &ctx->seen) < 0)
        goto done;
    check_fork(rec);
    call->rec = rec;
    call->fork_epoch = rec->fork_epoch;
    call->owner = Py_NewRef(rec->owner);
    call->ctx = ctx;
    call->name = PyUnicode_FromString(api->api_name);
    if (!call->name)
        goto done;
    r = rec->mode->recording(rec);
    if (r <= 0) {
        r = r < 0 ? -1 : 1;
        goto done;
    }
    r = record_inputs(call, api, &ts, args, nargs, kwnames);
done:
    if (r < 0)
        fi_dump_log_error(rec, api->api_name, FI_DUMP_INPUTS);
    fi_dump_tensors_free(&ts);
    if (r != 0 && call) {
        call_free(call);
        call = NULL;
    }
    PyErr_Restore(et, ev, tb);
    return call;
}

/* The outputs' tensor_details entries and key list, added to the record's. */
static int put_output_tensors(fi_record *info, fi_record *details, const fi_dump_tensors *ts)
{
    if (fi_record_update(details, &ts->details) < 0)
        return -1;
    return put_key_list(info, "output_tensor_keys", 18, ts);
}

/* Line 2 of a call that returned: its outputs encoded and written (or held, for a call
 * captured into a CUDA graph). */
static int finish_completed(fi_dump_call *call, PyObject *result)
{
    fi_recorder *rec = call->rec;
    fi_record *record = &call->record;
    fi_dump_tensors ts;
    int r = -1;
    if (fi_dump_tensors_init(&ts, &call->ctx->seen) < 0)
        goto done;
    fi_record *out_meta = fi_record_child(record, "output_metadata");
    fi_record *info = out_meta ? fi_record_child(record, "tensor_info") : NULL;
    fi_record *details = info ? fi_record_child(record, "tensor_details") : NULL;
    if (!details || fi_dump_encode_outputs(&ts, out_meta, result) < 0)
        goto done;
    long long out_bytes = 0;
    const char *status = "completed";
    const char *refused;
    if (call->graph) { /* captured: the flushes write the output tensors */
        fi_graph_hold_outputs(call, ts.tensors);
        if (put_output_tensors(info, details, &ts) < 0)
            goto done;
        out_bytes = ts.bytes;
        status = "graph_capture_pending_flush";
    } else if (ts.nkeys > 0) {
        if (rec->mode->inspect)
            rec->mode->inspect(call, &ts, 0);
        if ((refused = rec->mode->outputs_refused(call, ts.bytes))) {
            if (fi_record_set_str(record, "outputs_skipped", refused) < 0)
                goto done;
        } else {
            Py_ssize_t written = rec->mode->save(call, FI_DUMP_OUTPUTS, &ts);
            if (written < 0) {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                PyObject *msg = ev ? PyObject_Str(ev) : NULL;
                PyErr_Restore(et, ev, tb);
                fi_dump_log_error(rec, PyUnicode_AsUTF8(call->name), FI_DUMP_OUTPUTS);
                PyObject *why = msg ? PyUnicode_FromFormat("write error: %U", msg)
                                    : PyUnicode_FromString("write error");
                Py_XDECREF(msg);
                int bad = !why || fi_record_set_py(record, "outputs_skipped", why) < 0;
                Py_XDECREF(why);
                if (bad)
                    goto done;
            } else {
                rec->dump_bytes += written;
                out_bytes = ts.bytes;
                if (put_output_tensors(info, details, &ts) < 0)
                    goto done;
            }
        }
    }
    call->output_bytes = out_bytes;
    long long total = call->input_bytes + out_bytes;
    if (fi_record_set_int(info, "output_size_bytes", out_bytes) < 0 ||
        fi_record_set_double(info, "output_size_mb", (double)out_bytes / MB) < 0 ||
        fi_record_set_int(info, "total_size_bytes", total) < 0 ||
        fi_record_set_double(info, "total_size_mb", (double)total / MB) < 0 ||
        fi_record_set_str(record, "execution_status", status) < 0)
        goto done;
    r = 0;
done:
    fi_dump_tensors_free(&ts);
    return r;
}

/* Line 2 of a call that raised: the exception's type and message. */
static int finish_exception(fi_dump_call *call, PyObject *ev)
{
    PyObject *type_name = PyObject_GetAttr((PyObject *)Py_TYPE(ev), fi_names.name);
    PyObject *msg = type_name ? PyObject_Str(ev) : NULL;
    PyObject *exc = msg ? Py_BuildValue("{s:O,s:O}", "type", type_name, "message", msg) : NULL;
    Py_XDECREF(type_name);
    Py_XDECREF(msg);
    int r = exc ? fi_record_set_py(&call->record, "exception", exc) : -1;
    Py_XDECREF(exc);
    return r < 0 ? -1 : fi_record_set_str(&call->record, "execution_status", "exception");
}

void fi_dump_end(fi_dump_call *call, PyObject *result)
{
    const fi_record_mode *mode = call->rec->mode;
    if (call->fork_epoch != fi_fork_epoch()) {
        call_free(call); /* began in the parent: its directory and slot are the parent's */
        return;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (mode->reopen)
        mode->reopen(call);
    int r;
    if (result) {
        r = finish_completed(call, result);
    } else {
        PyErr_NormalizeException(&et, &ev, &tb);
        r = ev ? finish_exception(call, ev) : 0;
        if (call->graph)
            fi_graph_drop(call);
    }
    /* the function's host time, measured around it by wrapper_invoke (docs/dump-format.md) */
    if (r == 0)
        r = fi_record_set_double(&call->record, "duration_us",
                                 round(call->ctx->took_us * 1000.0) / 1000.0);
    if (r == 0)
        r = mode->write_record(call);
    if (call->graph && fi_graph_hold_record(call) < 0)
        PyErr_Clear(); /* the flushes repeat line 1 */
    if (r < 0)
        fi_dump_log_error(call->rec, PyUnicode_AsUTF8(call->name), FI_DUMP_OUTPUTS);
    mode->done(call, result, r == 0);
    call_free(call);
    if (tb && ev)
        PyException_SetTraceback(ev, tb);
    PyErr_Restore(et, ev, tb);
}
