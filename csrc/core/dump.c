/* dump.c: the level-10 flight recorder (docs/dump-format.md): one directory per call with the
 * inputs/outputs tensor files and metadata.jsonl, plus the root's session.jsonl. */
#include "dump.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "dump_encode.h"
#include "json.h"
#include "ring.h"
#include "sink.h"
#include "stats.h"
#include "strbuf.h"
#include "tensor.h"
#include "tensorio.h"

/* A call recorded while a CUDA graph was captured: no device-to-host copy may run then, so
 * its tensors are held and written after each replay (flush_graph_dumps). It lives in a
 * capsule in the logger's graph_pending list until clear_graph_dumps(). */
typedef struct {
    char *dir;         /* the call's directory */
    PyObject *record;  /* the line-1 record, completed when the call returns */
    PyObject *inputs;  /* key -> tensor */
    PyObject *outputs; /* key -> tensor; NULL until the call returned */
    PyObject *graph;   /* id of the CUDAGraph captured (graph_hooks), or None */
    long flushes;      /* snapshots taken so far */
} graph_entry;

#define GRAPH_ENTRY_CAPSULE "flashinfer_native.graph_entry"

struct fi_dump_call {
    fi_logger *lg;
    PyObject *name;   /* API name (str) */
    PyObject *record; /* the line-1 record, extended into line 2 */
    char *dir;        /* the call's directory */
    long long input_bytes;
    long long output_bytes;
    PyObject *graph_capsule; /* while captured: the capsule holding graph, in graph_pending */
    graph_entry *graph;
    int meta_fd; /* metadata.jsonl, open from line 1 to line 2 */
    /* in-memory ring: the call's slot, and its files while the call writes them (files
     * points at own then, else NULL: the slot holds them, or it is gone) */
    fi_ring_ticket ticket;
    fi_ring_files own, *files;
    int in_ring;
    const char *trigger; /* a trigger the inputs fired (nan_input), fired at the end */
    int tensors_skipped; /* larger than the ring's budget: records only */
};

/* --------------------------------------------------------------- log lines */

static void log_line(fi_logger *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void log_line(fi_logger *lg, const char *fmt, ...)
{
    fi_buf b;
    fi_buf_init(&b);
    va_list ap;
    va_start(ap, fmt);
    fi_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    fi_buf_putc(&b, '\n');
    fi_logger_emit(lg, b.data, b.len);
    fi_buf_free(&b);
}

/* "[DUMP ERROR (where) in NAME]: message" for the pending exception, cleared. */
static void log_dump_error(fi_logger *lg, const char *name, const char *where)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    const char *m = msg ? PyUnicode_AsUTF8(msg) : NULL;
    if (!m) {
        PyErr_Clear();
        m = "unknown error";
    }
    log_line(lg, "[DUMP ERROR (%s) in %s]: %s", where, name, m);
    Py_XDECREF(msg);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
}

/* ------------------------------------------------------------------ ring */

enum { RING_NONE, RING_DISK, RING_MEMORY };

/* FLASHINFER_DUMP_RING without FLASHINFER_DUMP_ON keeps the last N call directories on
 * disk; with it the last N calls stay in memory until a trigger fires. */
static int ring_mode(const fi_logger *lg)
{
    if (lg->cfg.ring <= 0)
        return RING_NONE;
    return lg->cfg.dump_on ? RING_MEMORY : RING_DISK;
}

/* The logger's ring, made at its first dumped call (with the signal handlers and the
 * exit hook its triggers ask for). NULL with an exception set on failure. */
static fi_ring *get_ring(fi_logger *lg)
{
    if (lg->ring)
        return lg->ring;
    fi_ring *r = fi_ring_new(lg->cfg.ring, lg->cfg.dump_dir, lg->cfg.ring_max_gb,
                             lg->cfg.max_triggers, lg->cfg.safetensors ? "safetensors" : "pt");
    if (!r) {
        PyErr_NoMemory();
        return NULL;
    }
    lg->ring = r;
    unsigned on = ring_mode(lg) == RING_MEMORY ? lg->cfg.dump_on : 0;
    if ((on & FI_TRIGGER_SIGNAL) && fi_ring_install_signals(r) < 0)
        log_line(lg, "[flashinfer] WARNING: flight recorder signal handlers not installed: %s",
                 strerror(errno));
    if (on & FI_TRIGGER_EXIT) {
        PyObject *atexit = PyImport_ImportModule("atexit");
        PyObject *method = PyObject_GetAttrString((PyObject *)lg, "dump_ring");
        PyObject *ok =
            atexit && method ? PyObject_CallMethod(atexit, "register", "Os", method, "exit") : NULL;
        Py_XDECREF(atexit);
        Py_XDECREF(method);
        if (!ok)
            return NULL;
        Py_DECREF(ok);
    }
    return r;
}

/* Writes the in-memory ring for trigger and says so in the log. */
static void fire_ring(fi_logger *lg, const char *trigger, const char *api_name)
{
    if (!fi_ring_recording(lg->ring))
        return; /* FLASHINFER_DUMP_MAX_TRIGGERS reached */
    int written = fi_ring_fire(lg->ring, trigger);
    if (written < 0)
        log_line(lg, "[flashinfer] flight recorder: trigger %s in %s: cannot write %s: %s", trigger,
                 api_name, lg->cfg.dump_dir, strerror(errno));
    else
        log_line(lg, "[flashinfer] flight recorder: trigger %s in %s: %d calls written to %s",
                 trigger, api_name, written, lg->cfg.dump_dir);
}

/* "nan" or "inf" when a tensor of tensors (a dict) holds one and its trigger is on. The
 * level-5 statistics pass counts both. */
static const char *nonfinite_trigger(fi_logger *lg, PyObject *tensors)
{
    unsigned on = lg->cfg.dump_on & (FI_TRIGGER_NAN | FI_TRIGGER_INF);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (on && PyDict_Next(tensors, &pos, &key, &value)) {
        fi_stats st;
        if (fi_stats_of_tensor(value, &st) < 0) {
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

/* ------------------------------------------------------------ file system */

/* Every character outside [A-Za-z0-9._-] becomes '_' (one per character: UTF-8
 * continuation bytes are dropped). */
static void sanitize_name(char *s)
{
    char *out = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c & 0xc0) == 0x80)
            continue;
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        *out++ = ok ? (char)c : '_';
    }
    *out = '\0';
}

/* Creates the dump root (mode 0700 when we create it, parents too). */
static int ensure_root(fi_logger *lg)
{
    if (lg->dump_root_ready) {
        struct stat st;
        if (stat(lg->cfg.dump_dir, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
    }
    char *path = malloc(strlen(lg->cfg.dump_dir) + 2);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    sprintf(path, "%s/", lg->cfg.dump_dir);
    int r = fi_make_parents(path, 0700);
    free(path);
    if (r < 0) {
        PyErr_Format(PyExc_OSError, "cannot create dump directory %s: %s", lg->cfg.dump_dir,
                     strerror(errno));
        return -1;
    }
    lg->dump_root_ready = 1;
    return 0;
}

static long long next_counter(PyObject *counters, PyObject *name)
{
    PyObject *cur = PyDict_GetItemWithError(counters, name);
    long long n = cur ? PyLong_AsLongLong(cur) + 1 : 1;
    if (PyErr_Occurred())
        return -1;
    PyObject *v = PyLong_FromLongLong(n);
    if (!v || PyDict_SetItem(counters, name, v) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    return n;
}

/* Makes the call directory; a name taken already (a re-import reset the counters
 * within the same millisecond) moves on to the next counter value. Without create only
 * the name is chosen (the in-memory ring makes it when a trigger fires). */
static char *make_call_dir(fi_logger *lg, PyObject *name, const char *stamp, long long *call_seq,
                           int create)
{
    const char *cname = PyUnicode_AsUTF8(name);
    if (!cname)
        return NULL;
    char *safe = strdup(cname);
    if (!safe) {
        PyErr_NoMemory();
        return NULL;
    }
    sanitize_name(safe);
    size_t cap = strlen(lg->cfg.dump_dir) + strlen(safe) + 96;
    char *dir = malloc(cap);
    for (int attempt = 0; dir && attempt < 1000; attempt++) {
        long long n = next_counter(lg->call_counters, name);
        if (n < 0)
            break;
        snprintf(dir, cap, "%s/%s_pid%ld_%s_call%04lld", lg->cfg.dump_dir, stamp, (long)getpid(),
                 safe, n);
        if (!create || mkdir(dir, 0700) == 0) {
            *call_seq = n;
            free(safe);
            return dir;
        }
        if (errno != EEXIST) {
            PyErr_Format(PyExc_OSError, "cannot create %s: %s", dir, strerror(errno));
            break;
        }
    }
    if (!dir)
        PyErr_NoMemory();
    else if (!PyErr_Occurred())
        PyErr_Format(PyExc_OSError, "no free call directory name under %s", lg->cfg.dump_dir);
    free(safe);
    free(dir);
    return NULL;
}

/* Opens path for appending records: O_APPEND, so each record is one whole write. */
static int open_append(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, strerror(errno));
    return fd;
}

static int write_line(int fd, const char *what, const char *where, const fi_buf *line)
{
    if (fi_write_all(fd, line->data, line->len) == 0)
        return 0;
    PyErr_Format(PyExc_OSError, "cannot write %s/%s: %s", where, what, strerror(errno));
    return -1;
}

/* session.jsonl's descriptor: it stays open on the logger between records and is opened
 * again when the file was deleted (the dump root removed and made anew). */
static int open_session_jsonl(fi_logger *lg)
{
    struct stat st;
    if (lg->session_fd >= 0 && fstat(lg->session_fd, &st) == 0 && st.st_nlink > 0)
        return lg->session_fd;
    if (lg->session_fd >= 0)
        close(lg->session_fd);
    size_t n = strlen(lg->cfg.dump_dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/session.jsonl", lg->cfg.dump_dir);
    lg->session_fd = open_append(path);
    free(path);
    return lg->session_fd;
}

/* Appends line to dir/metadata.jsonl and returns its descriptor in *fd. A new file is
 * written as metadata.jsonl.tmp and renamed into place once it holds the line, so that
 * no reader (and no SIGKILL) ever sees a call directory with an empty metadata.jsonl. */
static int open_metadata_with_line(const char *dir, const fi_buf *line, int *fd)
{
    size_t n = strlen(dir) + 32;
    char *meta = malloc(n), *tmp = malloc(n);
    int r = -1;
    if (!meta || !tmp) {
        PyErr_NoMemory();
        goto done;
    }
    snprintf(meta, n, "%s/metadata.jsonl", dir);
    snprintf(tmp, n, "%s/metadata.jsonl.tmp", dir);
    *fd = open(meta, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (*fd >= 0) { /* a graph flush appends to the call's existing file */
        r = write_line(*fd, "metadata.jsonl", dir, line);
        goto done;
    }
    if (errno != ENOENT) {
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", meta, strerror(errno));
        goto done;
    }
    *fd = open_append(tmp);
    if (*fd < 0 || write_line(*fd, "metadata.jsonl", dir, line) < 0)
        goto done;
    if (rename(tmp, meta) < 0) {
        PyErr_Format(PyExc_OSError, "cannot rename %s: %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    r = 0;
done:
    free(meta);
    free(tmp);
    return r;
}

/* The record as one line, appended to the call's metadata.jsonl (through *meta_fd when
 * it is open; opened and kept there when meta_fd is given) and to session.jsonl. */
static int write_record_at(fi_logger *lg, const char *dir, int *meta_fd, PyObject *record)
{
    fi_buf line;
    fi_buf_init(&line);
    int r = fi_json_from_py(&line, record);
    if (r == 0 && fi_buf_putc(&line, '\n') < 0) {
        PyErr_NoMemory();
        r = -1;
    }
    int fd = meta_fd ? *meta_fd : -1;
    if (r == 0 && fd >= 0)
        r = write_line(fd, "metadata.jsonl", dir, &line);
    else if (r == 0)
        r = open_metadata_with_line(dir, &line, &fd);
    if (meta_fd)
        *meta_fd = fd;
    else if (fd >= 0)
        close(fd);
    /* a disk ring's session.jsonl would grow without end: its directories are the record */
    int sfd = r == 0 && ring_mode(lg) == RING_NONE ? open_session_jsonl(lg) : -1;
    if (r == 0 && ring_mode(lg) == RING_NONE)
        r = sfd < 0 ? -1 : write_line(sfd, "session.jsonl", lg->cfg.dump_dir, &line);
    fi_buf_free(&line);
    return r;
}

/* The record as a line of the call's metadata.jsonl: in the ring slot's image, or on disk. */
static int write_record(fi_dump_call *call)
{
    if (!call->in_ring)
        return write_record_at(call->lg, call->dir, &call->meta_fd, call->record);
    if (!call->files)
        return 0;
    fi_buf *meta = &call->files->meta;
    if (fi_json_from_py(meta, call->record) < 0 || fi_buf_putc(meta, '\n') < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    return set_trigger_keys(&call->files->trigger_keys, call->record);
}

static Py_ssize_t save_tensors_at(fi_logger *lg, const char *dir, const char *stem,
                                  PyObject *tensors, fi_stats_sink sink)
{
    int st = lg->cfg.safetensors;
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s.%s", dir, stem, st ? "safetensors" : "pt");
    Py_ssize_t written = fi_save_tensor_dict_stats(
        path, tensors, st ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH, sink);
    free(path);
    return written;
}

/* tensors with their CUDA tensors copied to pinned host memory on a side stream ordered
 * after the producing stream (flashinfer_native/staging.py): the ring must not
 * synchronize the device. A new reference, or NULL with an exception set. */
static PyObject *ring_host_tensors(PyObject *tensors)
{
    PyObject *staging = PyImport_ImportModule("flashinfer_native.staging");
    if (!staging)
        return NULL;
    PyObject *host = PyObject_CallMethod(staging, "to_host", "O", tensors);
    Py_DECREF(staging);
    return host;
}

/* The call's tensor file stem: a file image in its ring slot (the copy taken at call
 * time: callers reuse their buffers), or a file on disk. */
static Py_ssize_t save_tensors(fi_dump_call *call, const char *stem, const fi_dump_tensors *ts)
{
    if (!call->in_ring) /* the inputs' level-5 statistics come in the same pass (stats.c) */
        return save_tensors_at(call->lg, call->dir, stem, ts->tensors,
                               stem[0] == 'i' ? fi_stats_remember : NULL);
    if (!call->files || call->tensors_skipped)
        return 0;
    PyObject *host = ts->any_cuda ? ring_host_tensors(ts->tensors) : Py_NewRef(ts->tensors);
    if (!host)
        return -1;
    fi_image *img = stem[0] == 'i' ? &call->files->inputs : &call->files->outputs;
    Py_ssize_t r = fi_image_tensor_dict(
        host, call->lg->cfg.safetensors ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH, img);
    Py_DECREF(host);
    return r;
}

/* ---------------------------------------------------------------- records */

static void timestamp_now(char *out, size_t n)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    size_t k = strftime(out, n, "%Y%m%d_%H%M%S", &tm);
    snprintf(out + k, n - k, "_%03d", (int)(tv.tv_usec / 1000));
}

#define MB (1024.0 * 1024.0)

static PyObject *size_mb(long long bytes) { return PyFloat_FromDouble((double)bytes / MB); }

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
 * the extra keys. */
static void add_record_extras(fi_logger *lg, PyObject *rec)
{
    PyObject *fn = PyDict_GetItemString(lg->static_meta, "record_extras");
    if (!fn || fn == Py_None)
        return;
    PyObject *extra = PyObject_CallObject(fn, NULL);
    if (extra && PyDict_Check(extra))
        PyDict_Update(rec, extra);
    Py_XDECREF(extra);
    PyErr_Clear();
}

static PyObject *build_record(fi_logger *lg, const fi_dump_api *api, PyObject *name,
                              const char *stamp, long long call_seq, const char *dir,
                              fi_dump_tensors *ts, PyObject *input_meta, int capturing)
{
    PyObject *module = PyObject_GetAttr(api->func, fi_names.module);
    if (!module) {
        PyErr_Clear();
        module = Py_None;
        Py_INCREF(module);
    }
    PyObject *versions = PyDict_GetItemString(lg->static_meta, "versions");
    PyObject *rec = Py_BuildValue(
        "{s:O,s:N,s:L,s:s,s:l,s:O,s:N,s:{s:O,s:N,s:L,s:N},s:O,s:s,s:O,s:O,s:s,s:O,s:s,s:L}",
        "function_name", name, "module", module, "call_sequence", call_seq, "timestamp", stamp,
        "process_id", (long)getpid(), "input_metadata", input_meta, "output_metadata", PyDict_New(),
        "tensor_info", "input_tensor_keys", ts->keys, "output_tensor_keys", PyList_New(0),
        "input_size_bytes", ts->bytes, "input_size_mb", size_mb(ts->bytes), "tensor_details",
        ts->details, "tensor_format", lg->cfg.safetensors ? "safetensors" : "torch",
        "function_signature", api->signature_text ? api->signature_text : Py_None, "versions",
        versions ? versions : Py_None, "execution_status",
        capturing ? "graph_capture_pending_flush" : "inputs_saved", "graph_capture",
        capturing ? Py_True : Py_False, "dump_dir", dir, "sequence", lg->sequence);
    if (rec && api->self) {
        PyObject *id = PyLong_FromVoidPtr(api->self);
        if (fi_dump_dict_set(rec, "self_id", id) < 0)
            Py_CLEAR(rec);
    }
    if (rec)
        add_record_extras(lg, rec);
    return rec;
}

/* FLASHINFER_DUMP_MAX_SIZE_GB as Python prints a float ("20.0", "1e-08"), for the
 * cap messages FlashInfer writes. */
static void put_size_cap(fi_buf *b, double gb)
{
    char *text = PyOS_double_to_string(gb, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    fi_buf_puts(b, text ? text : "?");
    PyMem_Free(text);
}

/* "Dump size limit reached (X GB). <what>. Increase FLASHINFER_DUMP_MAX_SIZE_GB ..." */
static void log_size_cap(fi_logger *lg, const char *what, const char *name)
{
    fi_buf b;
    fi_buf_init(&b);
    fi_buf_puts(&b, "Dump size limit reached (");
    put_size_cap(&b, lg->cfg.max_size_gb);
    fi_buf_printf(&b, " GB). %s %s. Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.\n", what, name);
    fi_logger_emit(lg, b.data, b.len);
    fi_buf_free(&b);
}

/* The count cap, checked before anything is numbered (FlashInfer's order). */
static int under_count_cap(fi_logger *lg, const char *name)
{
    if (lg->dump_count < lg->cfg.max_count)
        return 1;
    log_line(lg,
             "Dump limit reached (%lld dumps). Skipping dump for %s. Increase "
             "FLASHINFER_DUMP_MAX_COUNT if needed.",
             lg->cfg.max_count, name);
    return 0;
}

static int under_size_cap(fi_logger *lg, long long bytes)
{
    return (double)(lg->dump_bytes + bytes) <= lg->cfg.max_size_gb * 1024.0 * 1024.0 * 1024.0;
}

/* ----------------------------------------- calls held during graph capture */

static void graph_entry_free(graph_entry *e)
{
    Py_XDECREF(e->record);
    Py_XDECREF(e->inputs);
    Py_XDECREF(e->outputs);
    Py_XDECREF(e->graph);
    free(e->dir);
    free(e);
}

static void graph_capsule_free(PyObject *capsule)
{
    graph_entry_free(PyCapsule_GetPointer(capsule, GRAPH_ENTRY_CAPSULE));
}

/* Holds a captured call's record and input tensors in graph_pending for the flushes,
 * with the graph being captured. */
static int hold_for_graph(fi_dump_call *call, PyObject *inputs)
{
    graph_entry *e = calloc(1, sizeof(*e));
    if (!e || !(e->dir = strdup(call->dir))) {
        free(e);
        PyErr_NoMemory();
        return -1;
    }
    e->record = Py_NewRef(call->record);
    e->inputs = Py_NewRef(inputs);
    e->graph = Py_NewRef(call->lg->capture_graph ? call->lg->capture_graph : Py_None);
    call->graph_capsule = PyCapsule_New(e, GRAPH_ENTRY_CAPSULE, graph_capsule_free);
    if (!call->graph_capsule) {
        graph_entry_free(e);
        return -1;
    }
    call->graph = e;
    return PyList_Append(call->lg->graph_pending, call->graph_capsule);
}

static void call_free(fi_dump_call *call)
{
    Py_XDECREF(call->lg);
    Py_XDECREF(call->name);
    Py_XDECREF(call->record);
    Py_XDECREF(call->graph_capsule);
    if (call->meta_fd >= 0)
        close(call->meta_fd);
    fi_ring_files_free(&call->own);
    free(call->dir);
    free(call);
}

/* Claims the call's slot in the in-memory ring. A call larger than the whole budget keeps
 * only its records, with one warning. */
static int claim_slot(fi_dump_call *call, long long bytes)
{
    fi_logger *lg = call->lg;
    int r = fi_ring_claim(lg->ring, call->dir, bytes > 0 ? (size_t)bytes : 0, &call->ticket,
                          &call->own);
    if (r < 0) {
        PyErr_NoMemory();
        return -1;
    }
    call->files = &call->own;
    if (r == 1) {
        if (!lg->ring_warned)
            log_line(lg,
                     "[flashinfer] WARNING: a %s call (%lld tensor bytes) is larger than the "
                     "flight recorder's budget (%g GB): its tensors are not kept. Raise "
                     "FLASHINFER_DUMP_RING_MAX_GB to keep them.",
                     PyUnicode_AsUTF8(call->name), bytes, lg->cfg.ring_max_gb);
        lg->ring_warned = 1;
        call->tensors_skipped = 1;
    }
    return 0;
}

fi_dump_call *fi_dump_begin(fi_logger *lg, const fi_dump_api *api, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames)
{
    if (fi_logger_dumps_suspended(lg))
        return NULL;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    fi_dump_call *call = calloc(1, sizeof(*call));
    if (call) {
        call->meta_fd = -1;
        fi_ring_files_init(&call->own);
    }
    fi_dump_tensors ts = {0};
    PyObject *input_meta = PyDict_New();
    if (!call || !input_meta || fi_dump_tensors_init(&ts) < 0)
        goto error;
    call->lg = lg;
    Py_INCREF(lg);
    call->name = PyUnicode_FromString(api->api_name);
    int mode = ring_mode(lg);
    if (mode != RING_NONE && !get_ring(lg))
        goto error;
    call->in_ring = mode == RING_MEMORY;
    if (call->in_ring && !fi_ring_recording(lg->ring))
        goto skip;
    if (!call->name || fi_dump_encode_inputs(&ts, input_meta, args, nargs, kwnames) < 0)
        goto error;
    /* a ring bounds itself: the caps are for recording everything */
    if (mode == RING_NONE && !under_count_cap(lg, api->api_name))
        goto skip;
    if (mode == RING_NONE && !under_size_cap(lg, ts.bytes)) {
        /* the call still takes its number, as in FlashInfer: later directories of this
         * API keep the numbers they would have had */
        if (next_counter(lg->call_counters, call->name) < 0)
            goto error;
        log_size_cap(lg, "Skipping dump for", api->api_name);
        goto skip;
    }
    if (!call->in_ring && ensure_root(lg) < 0)
        goto error;
    char stamp[32];
    timestamp_now(stamp, sizeof stamp);
    long long call_seq = 0;
    /* while a CUDA graph is captured no device-to-host copy may run: hold the
     * tensors and write them after each replay (flush_graph_dumps) */
    int capturing = lg->force_graph_capture || graph_capturing(&ts);
    if (capturing && call->in_ring)
        goto skip; /* the in-memory ring records no captured calls (no copy may run) */
    call->dir = make_call_dir(lg, call->name, stamp, &call_seq, !call->in_ring);
    if (!call->dir || (mode == RING_DISK && fi_ring_disk_push(lg->ring, call->dir) < 0))
        goto error;
    if (call->in_ring && claim_slot(call, ts.bytes) < 0)
        goto error;
    if ((lg->cfg.dump_on & FI_TRIGGER_NAN_INPUT) && call->in_ring)
        call->trigger = nonfinite_trigger(lg, ts.tensors);
    Py_ssize_t written = capturing ? 0 : save_tensors(call, "inputs", &ts);
    if (written < 0) {
        if (!call->in_ring)
            rmdir(call->dir);
        goto error;
    }
    lg->sequence++;
    lg->dump_count++;
    lg->dump_bytes += written;
    call->input_bytes = ts.bytes;
    call->record =
        build_record(lg, api, call->name, stamp, call_seq, call->dir, &ts, input_meta, capturing);
    if (call->record && call->tensors_skipped &&
        fi_dump_dict_set(call->record, "tensors_skipped", PyUnicode_FromString("ring budget")) < 0)
        goto error;
    if (!call->record || write_record(call) < 0 ||
        (capturing && hold_for_graph(call, ts.tensors) < 0))
        goto error;
    if (call->in_ring) {
        fi_ring_done(lg->ring, &call->ticket, &call->own);
        call->files = NULL;
    } else {
        log_line(lg, "Dumped inputs to: %s (size: %.2f MB, total: %lld/%lld dumps%s)", call->dir,
                 (double)ts.bytes / MB, lg->dump_count, lg->cfg.max_count,
                 capturing ? ", graph-deferred" : "");
        log_line(lg, "Inputs dumped to: %s", call->dir);
    }
    fi_dump_tensors_free(&ts);
    Py_DECREF(input_meta);
    PyErr_Restore(et, ev, tb);
    return call;
error:
    log_dump_error(lg, api->api_name, "inputs");
skip:
    fi_stats_forget();
    fi_dump_tensors_free(&ts);
    Py_XDECREF(input_meta);
    if (call)
        call_free(call);
    PyErr_Restore(et, ev, tb);
    return NULL;
}

static int finish_completed(fi_dump_call *call, PyObject *result)
{
    fi_logger *lg = call->lg;
    PyObject *rec = call->record;
    fi_dump_tensors ts;
    int r = -1;
    if (fi_dump_tensors_init(&ts) < 0)
        goto done;
    PyObject *out_meta = PyDict_GetItemString(rec, "output_metadata");
    PyObject *info = PyDict_GetItemString(rec, "tensor_info");
    PyObject *details = PyDict_GetItemString(rec, "tensor_details");
    if (!out_meta || !info || !details || fi_dump_encode_outputs(&ts, out_meta, result) < 0)
        goto done;
    long long out_bytes = 0;
    const char *status = "completed";
    if (call->in_ring && !call->trigger)
        call->trigger = nonfinite_trigger(lg, ts.tensors);
    if (call->graph) { /* captured: the flushes write the output tensors */
        call->graph->outputs = Py_NewRef(ts.tensors);
        if (PyDict_Update(details, ts.details) < 0 ||
            fi_dump_dict_set(info, "output_tensor_keys", Py_NewRef(ts.keys)) < 0)
            goto done;
        out_bytes = ts.bytes;
        status = "graph_capture_pending_flush";
    } else if (PyList_GET_SIZE(ts.keys) > 0) {
        /* a ring bounds itself: the size cap is for recording everything */
        if (ring_mode(lg) == RING_NONE && !under_size_cap(lg, ts.bytes)) {
            if (fi_dump_dict_set(rec, "outputs_skipped", PyUnicode_FromString("size cap")) < 0)
                goto done;
            log_size_cap(lg, "Skipping the outputs of", PyUnicode_AsUTF8(call->name));
        } else {
            Py_ssize_t written = save_tensors(call, "outputs", &ts);
            if (written < 0) {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                PyObject *msg = ev ? PyObject_Str(ev) : NULL;
                PyErr_Restore(et, ev, tb);
                log_dump_error(lg, PyUnicode_AsUTF8(call->name), "outputs");
                PyObject *why = msg ? PyUnicode_FromFormat("write error: %U", msg)
                                    : PyUnicode_FromString("write error");
                Py_XDECREF(msg);
                if (fi_dump_dict_set(rec, "outputs_skipped", why) < 0)
                    goto done;
            } else {
                lg->dump_bytes += written;
                out_bytes = ts.bytes;
                if (PyDict_Update(details, ts.details) < 0 ||
                    fi_dump_dict_set(info, "output_tensor_keys", Py_NewRef(ts.keys)) < 0)
                    goto done;
            }
        }
    }
    call->output_bytes = out_bytes;
    long long total = call->input_bytes + out_bytes;
    if (fi_dump_dict_set(info, "output_size_bytes", PyLong_FromLongLong(out_bytes)) < 0 ||
        fi_dump_dict_set(info, "output_size_mb", size_mb(out_bytes)) < 0 ||
        fi_dump_dict_set(info, "total_size_bytes", PyLong_FromLongLong(total)) < 0 ||
        fi_dump_dict_set(info, "total_size_mb", size_mb(total)) < 0 ||
        fi_dump_dict_set(rec, "execution_status", PyUnicode_FromString(status)) < 0)
        goto done;
    r = 0;
done:
    fi_dump_tensors_free(&ts);
    return r;
}

static int finish_exception(fi_dump_call *call, PyObject *ev)
{
    PyObject *type_name = PyObject_GetAttr((PyObject *)Py_TYPE(ev), fi_names.name);
    PyObject *msg = PyObject_Str(ev);
    if (!type_name || !msg) {
        Py_XDECREF(type_name);
        Py_XDECREF(msg);
        return -1;
    }
    PyObject *exc = Py_BuildValue("{s:N,s:N}", "type", type_name, "message", msg);
    if (fi_dump_dict_set(call->record, "exception", exc) < 0)
        return -1;
    return fi_dump_dict_set(call->record, "execution_status", PyUnicode_FromString("exception"));
}

/* Removes a captured call from the pending list (it raised: nothing to flush). */
static void drop_graph_entry(fi_dump_call *call)
{
    PyObject *pending = call->lg->graph_pending;
    for (Py_ssize_t i = PyList_GET_SIZE(pending) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(pending, i) == call->graph_capsule)
            PyList_SetSlice(pending, i, i + 1, NULL);
}

/* FlashInfer's two lines after a call's outputs are recorded. */
static void log_outputs_dumped(fi_dump_call *call)
{
    log_line(call->lg, "Dumped outputs to: %s (output size: %.2f MB, total dump size: %.2f MB%s)",
             call->dir, (double)call->output_bytes / MB,
             (double)(call->input_bytes + call->output_bytes) / MB,
             call->graph ? ", graph-deferred" : "");
    log_line(call->lg, "Outputs dumped to: %s", call->dir);
}

/* The in-memory ring after a call: its records are complete, so a trigger the call
 * fired (exception, nan, inf) writes the ring now, the call included. */
static void ring_call_done(fi_dump_call *call, int raised)
{
    fi_logger *lg = call->lg;
    fi_ring_done(lg->ring, &call->ticket, &call->own);
    call->files = NULL;
    const char *trigger = call->trigger;
    if (raised && (lg->cfg.dump_on & FI_TRIGGER_EXCEPTION))
        trigger = "exception";
    if (trigger)
        fire_ring(lg, trigger, PyUnicode_AsUTF8(call->name));
}

int fi_dump_checks_outputs(const fi_dump_call *call)
{
    return call->in_ring && (call->lg->cfg.dump_on & (FI_TRIGGER_NAN | FI_TRIGGER_INF));
}

void fi_dump_end(fi_dump_call *call, PyObject *result)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (call->in_ring) /* NULL when the call's slot is gone (evicted, or the ring fired) */
        call->files =
            fi_ring_open(call->lg->ring, &call->ticket, &call->own) == 0 ? &call->own : NULL;
    int r;
    if (result) {
        r = finish_completed(call, result);
    } else {
        PyErr_NormalizeException(&et, &ev, &tb);
        r = ev ? finish_exception(call, ev) : 0;
        if (call->graph)
            drop_graph_entry(call);
    }
    if (r == 0)
        r = write_record(call);
    if (r < 0)
        log_dump_error(call->lg, PyUnicode_AsUTF8(call->name), "outputs");
    else if (result && !call->in_ring) /* the in-memory ring writes nothing now */
        log_outputs_dumped(call);
    if (call->in_ring)
        ring_call_done(call, result == NULL);
    fi_stats_forget(); /* what the inputs' dump and the outputs' text took */
    call_free(call);
    if (tb && ev)
        PyException_SetTraceback(ev, tb);
    PyErr_Restore(et, ev, tb);
}

/* The two records FlashInfer appends per flushed part of a call: base (the call's latest
 * record) with the flush keys, to the call's metadata.jsonl and session.jsonl, and the
 * same naming the snapshot, to the snapshot's metadata.jsonl and session.jsonl. */
static int write_flush_records(fi_logger *lg, PyObject *base, const char *status, long n,
                               const char *dir, const char *snap)
{
    PyObject *rec = PyDict_Copy(base);
    PyObject *snap_rec = NULL;
    int r = -1;
    if (!rec || fi_dump_dict_set(rec, "execution_status", PyUnicode_FromString(status)) < 0 ||
        fi_dump_dict_set(rec, "graph_capture_flushed", Py_NewRef(Py_True)) < 0 ||
        fi_dump_dict_set(rec, "graph_capture_flush_index", PyLong_FromLong(n)) < 0 ||
        fi_dump_dict_set(rec, "graph_capture_snapshot_dir", PyUnicode_FromString(snap)) < 0 ||
        write_record_at(lg, dir, NULL, rec) < 0)
        goto done;
    snap_rec = PyDict_Copy(rec);
    if (!snap_rec || fi_dump_dict_set(snap_rec, "dump_dir", PyUnicode_FromString(snap)) < 0 ||
        fi_dump_dict_set(snap_rec, "graph_capture_base_dump_dir", PyUnicode_FromString(dir)) < 0)
        goto done;
    r = write_record_at(lg, snap, NULL, snap_rec);
done:
    Py_XDECREF(rec);
    Py_XDECREF(snap_rec);
    return r;
}

/* Whether a held part (inputs or outputs: key -> tensor, or NULL) has tensors to write. */
static int held_part(PyObject *tensors) { return tensors && PyDict_GET_SIZE(tensors) > 0; }

/* One snapshot of a captured call, as FlashInfer writes it: per part (inputs, then
 * outputs) the root file refreshed and graph_flushes/flush_NNNN/<part> written, then
 * the part's records. Adds the parts written to *parts. */
static int flush_entry(fi_logger *lg, graph_entry *e, Py_ssize_t *parts)
{
    long n = ++e->flushes;
    size_t cap = strlen(e->dir) + 64;
    char *snap = malloc(cap);
    if (!snap) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(snap, cap, "%s/graph_flushes/flush_%04ld/", e->dir, n);
    int r = fi_make_parents(snap, 0700); /* also remakes a call directory wiped meanwhile */
    if (r < 0)
        PyErr_Format(PyExc_OSError, "cannot create %s: %s", snap, strerror(errno));
    snap[strlen(snap) - 1] = '\0';
    const struct {
        PyObject *tensors;
        const char *stem, *status;
    } part[2] = {{e->inputs, "inputs", "inputs_saved"}, {e->outputs, "outputs", "completed"}};
    for (int i = 0; r == 0 && i < 2; i++) {
        if (!held_part(part[i].tensors))
            continue;
        Py_ssize_t w = save_tensors_at(lg, e->dir, part[i].stem, part[i].tensors, NULL);
        Py_ssize_t w2 = w < 0 ? -1 : save_tensors_at(lg, snap, part[i].stem, part[i].tensors, NULL);
        r = w2 < 0 ? -1 : write_flush_records(lg, e->record, part[i].status, n, e->dir, snap);
        if (r == 0) {
            lg->dump_bytes += w + w2;
            (*parts)++;
        }
    }
    free(snap);
    return r;
}

/* The held call in a graph_pending capsule; NULL (no exception) for anything else. */
static graph_entry *entry_at(PyObject *pending, Py_ssize_t i)
{
    graph_entry *e = PyCapsule_GetPointer(PyList_GET_ITEM(pending, i), GRAPH_ENTRY_CAPSULE);
    if (!e)
        PyErr_Clear();
    return e;
}

/* Whether a held call belongs to graph (NULL or None: every call). */
static int entry_of_graph(const graph_entry *e, PyObject *graph)
{
    if (!graph || graph == Py_None)
        return 1;
    int eq = PyObject_RichCompareBool(e->graph, graph, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

/* The number of parts (inputs, outputs) a flush of graph would write now. */
static Py_ssize_t pending_parts(fi_logger *lg, PyObject *graph)
{
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lg->graph_pending); i++) {
        graph_entry *e = entry_at(lg->graph_pending, i);
        if (e && entry_of_graph(e, graph))
            parts += held_part(e->inputs) + held_part(e->outputs);
    }
    return parts;
}

/* ---------------------------------------------- the Logger's graph methods */

/* The optional `graph` argument of the graph methods (borrowed; NULL when absent). */
static int graph_arg(PyObject *const *args, Py_ssize_t nargs, const char *method, PyObject **graph)
{
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "%s takes at most 1 argument (graph), got %zd", method,
                     nargs);
        return -1;
    }
    *graph = nargs ? args[0] : NULL;
    return 0;
}

PyDoc_STRVAR(flush_graph_dumps_doc,
             "flush_graph_dumps(graph=None)\n--\n\nWrite the held tensors (their current "
             "values) of the calls recorded while CUDA graph `graph` (its id; None: any) was "
             "captured, as a new snapshot: per part (inputs, outputs) the root tensor file "
             "refreshed, graph_flushes/flush_NNNN/<part> written, a record with "
             "graph_capture_flushed / _flush_index / _snapshot_dir appended to the call's "
             "metadata.jsonl and one with graph_capture_base_dump_dir to the snapshot's. "
             "Returns how many parts were written.");

static PyObject *flush_graph_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    fi_logger *lg = (fi_logger *)self;
    PyObject *graph;
    if (graph_arg(args, nargs, "flush_graph_dumps", &graph) < 0)
        return NULL;
    PyObject *pending = PySequence_List(lg->graph_pending); /* flushing may run Python code */
    if (!pending)
        return NULL;
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        graph_entry *e = entry_at(pending, i);
        if (e && (!entry_of_graph(e, graph) || flush_entry(lg, e, &parts) == 0))
            continue;
        PyObject *name = e ? PyDict_GetItemString(e->record, "function_name") : NULL;
        log_dump_error(lg, name ? PyUnicode_AsUTF8(name) : "?", "graph flush");
    }
    Py_DECREF(pending);
    return PyLong_FromSsize_t(parts);
}

PyDoc_STRVAR(pending_graph_dumps_doc,
             "pending_graph_dumps(graph=None)\n--\n\nHow many parts (inputs, outputs) a "
             "flush_graph_dumps(graph) would write now.");

static PyObject *pending_graph_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *graph;
    if (graph_arg(args, nargs, "pending_graph_dumps", &graph) < 0)
        return NULL;
    return PyLong_FromSsize_t(pending_parts((fi_logger *)self, graph));
}

PyDoc_STRVAR(clear_graph_dumps_doc, "clear_graph_dumps()\n--\n\nForget the calls recorded during "
                                    "CUDA graph capture; returns how many parts were held.");

static PyObject *clear_graph_dumps(PyObject *self, PyObject *unused)
{
    (void)unused;
    fi_logger *lg = (fi_logger *)self;
    Py_ssize_t parts = pending_parts(lg, NULL);
    if (PyList_SetSlice(lg->graph_pending, 0, PyList_GET_SIZE(lg->graph_pending), NULL) < 0)
        return NULL;
    return PyLong_FromSsize_t(parts);
}

/* ------------------------------------------------- the Logger's ring methods */

PyDoc_STRVAR(dump_ring_doc,
             "dump_ring(trigger='manual')\n--\n\nWrite the in-memory flight recorder's calls now "
             "(as the named trigger would); returns how many calls were written.");

static PyObject *dump_ring(PyObject *self, PyObject *args)
{
    fi_logger *lg = (fi_logger *)self;
    const char *trigger = "manual";
    if (!PyArg_ParseTuple(args, "|s:dump_ring", &trigger))
        return NULL;
    if (!lg->ring || ring_mode(lg) != RING_MEMORY)
        return PyLong_FromLong(0);
    int written = fi_ring_fire(lg->ring, trigger);
    if (written < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, lg->cfg.dump_dir);
    return PyLong_FromLong(written);
}

PyDoc_STRVAR(ring_bytes_doc, "ring_bytes()\n--\n\nBytes the in-memory flight recorder holds.");

static PyObject *ring_bytes(PyObject *self, PyObject *unused)
{
    (void)unused;
    fi_logger *lg = (fi_logger *)self;
    return PyLong_FromSize_t(lg->ring ? fi_ring_bytes(lg->ring) : 0);
}

PyDoc_STRVAR(ring_banner_doc,
             "ring_banner()\n--\n\nThe level-10 banner's two lines about the ring (what is "
             "written, and the ring's limits), or None without FLASHINFER_DUMP_RING.");

static PyObject *ring_banner(PyObject *self, PyObject *unused)
{
    (void)unused;
    const fi_config *c = &((fi_logger *)self)->cfg;
    if (ring_mode((fi_logger *)self) == RING_DISK)
        return Py_BuildValue(
            "(NN)",
            PyUnicode_FromFormat("Only the last %lld calls are kept on disk "
                                 "(FLASHINFER_DUMP_RING): each new call replaces the oldest.",
                                 c->ring),
            PyUnicode_FromFormat("  ring: %lld call directories", c->ring));
    if (ring_mode((fi_logger *)self) == RING_NONE)
        Py_RETURN_NONE;
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

static PyMethodDef ring_methods[] = {
    {"ring_banner", ring_banner, METH_NOARGS, ring_banner_doc},
    {"dump_ring", dump_ring, METH_VARARGS, dump_ring_doc},
    {"ring_bytes", ring_bytes, METH_NOARGS, ring_bytes_doc},
    {NULL},
};

static PyMethodDef graph_methods[] = {
    {"flush_graph_dumps", (PyCFunction)(void (*)(void))flush_graph_dumps, METH_FASTCALL,
     flush_graph_dumps_doc},
    {"pending_graph_dumps", (PyCFunction)(void (*)(void))pending_graph_dumps, METH_FASTCALL,
     pending_graph_dumps_doc},
    {"clear_graph_dumps", clear_graph_dumps, METH_NOARGS, clear_graph_dumps_doc},
    {NULL},
};

int fi_dump_exec(PyObject *module)
{
    if (fi_logger_add_methods(module, ring_methods) < 0)
        return -1;
    return fi_logger_add_methods(module, graph_methods);
}
