/* logger.c: the Logger type. One per import of flashinfer.api_logging, so a
 * re-import starts fresh (new destination, counters at zero), as
 * docs/logging.md#environment-variables says. */
#include "logger.h"

#include <structmember.h>
#include <unistd.h>

#include "format_json.h"
#include "graph_capture.h"
#include "json.h"
#include "module.h"

static void warn_bad_value(void *ctx, const char *var, const char *value, const char *def)
{
    (void)ctx;
    char line[1024];
    if (!def)
        snprintf(line, sizeof line, "[flashinfer] WARNING: %.64s: %.900s\n", var, value);
    else
        snprintf(line, sizeof line,
                 "[flashinfer] WARNING: invalid value %.64s=%.512s; using the default %.64s\n", var,
                 value, def);
    fi_warn_stderr(line);
}

/* The recorder's log lines go where the Logger's do. */
static void emit_for_recorder(PyObject *owner, const char *data, size_t len)
{
    fi_logger_emit((fi_logger *)owner, data, len);
}

static PyObject *logger_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "Logger() takes no arguments");
        return NULL;
    }
    fi_logger *lg = (fi_logger *)type->tp_alloc(type, 0);
    if (!lg)
        return NULL;
    lg->sink.kind = FI_SINK_STDERR;
    lg->sink.fd = -1;
    if (fi_config_from_env(&lg->cfg, warn_bad_value, NULL) < 0 ||
        fi_recorder_init(&lg->rec, &lg->cfg, (PyObject *)lg, emit_for_recorder) < 0 ||
        !(lg->page_memo = PyDict_New())) {
        Py_DECREF(lg);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    if (lg->cfg.level > 0)
        fi_sink_open(&lg->sink, lg->cfg.logdest);
    return (PyObject *)lg;
}

static int logger_traverse(fi_logger *lg, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(lg));
    Py_VISIT(lg->page_memo);
    return fi_recorder_traverse(&lg->rec, visit, arg);
}

static int logger_clear(fi_logger *lg)
{
    fi_recorder_clear(&lg->rec);
    Py_CLEAR(lg->page_memo);
    return 0;
}

static void logger_dealloc(fi_logger *lg)
{
    PyTypeObject *tp = Py_TYPE(lg);
    PyObject_GC_UnTrack(lg);
    logger_clear(lg);
    fi_recorder_free(&lg->rec);
    fi_sink_close(&lg->sink);
    fi_config_free(&lg->cfg);
    tp->tp_free(lg);
    Py_DECREF(tp);
}

int fi_logger_dumps_suspended(fi_logger *lg)
{
    fi_module_state *st = PyType_GetModuleState(Py_TYPE(lg));
    return st && st->dumps_suspended > 0;
}

const char *fi_logger_timestamp(fi_logger *lg)
{
    time_t now = time(NULL);
    if (now != lg->ts_second || !lg->ts_text[0]) {
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(lg->ts_text, sizeof lg->ts_text, "[%Y-%m-%d %H:%M:%S]", &tm);
        lg->ts_second = now;
    }
    return lg->ts_text;
}

/* Text as a JSON "message" record: one line per text record, its final newline dropped. */
static int write_as_json_message(fi_logger *lg, const char *data, size_t len)
{
    if (len && data[len - 1] == '\n')
        len--;
    fi_buf b;
    fi_buf_init(&b);
    fi_format_json_head(&b, "message", NULL, -1);
    fi_format_json_key(&b, "text");
    fi_json_str(&b, data, len);
    int r = fi_format_json_close(&b) < 0 ? -1 : fi_sink_write(&lg->sink, b.data, b.len);
    fi_buf_free(&b);
    return r;
}

static int write_record(fi_logger *lg, const char *data, size_t len)
{
    if (lg->cfg.log_format == FI_LOG_JSON && (len == 0 || data[0] != '{'))
        return write_as_json_message(lg, data, len);
    return fi_sink_write(&lg->sink, data, len);
}

void fi_logger_emit(fi_logger *lg, const char *data, size_t len)
{
    if (write_record(lg, data, len) == 0)
        return;
    PyErr_Clear();
    if (lg->sink.kind != FI_SINK_STDERR)
        fi_warn_stderr("[flashinfer] WARNING: could not write a log record\n");
}

PyDoc_STRVAR(logger_write_doc,
             "write(text)\n--\n\nWrite one whole record to the log destination (in the JSON "
             "format,\ntext that is not a JSON object becomes a \"message\" record).");

static PyObject *logger_write(fi_logger *lg, PyObject *text)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (!s)
        return NULL;
    if (write_record(lg, s, (size_t)n) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(logger_name_passes_doc,
             "name_passes(api_name)\n--\n\nTrue when api_name passes the include/exclude filters.");

static PyObject *logger_name_passes(fi_logger *lg, PyObject *name)
{
    const char *s = PyUnicode_AsUTF8(name);
    if (!s)
        return NULL;
    return PyBool_FromLong(fi_config_name_passes(&lg->cfg, s));
}

PyDoc_STRVAR(logger_timestamp_doc, "timestamp()\n--\n\nThe current '[YYYY-MM-DD HH:MM:SS]'.");

static PyObject *logger_timestamp_py(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    return PyUnicode_FromString(fi_logger_timestamp(lg));
}

static PyObject *patterns_tuple(char *const *items, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(items[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *get_log_format(fi_logger *lg, void *c)
{
    (void)c;
    return PyUnicode_FromString(lg->cfg.log_format == FI_LOG_JSON ? "json" : "text");
}
static PyObject *get_level(fi_logger *lg, void *c)
{
    (void)c;
    return PyLong_FromLong(lg->cfg.level);
}
static PyObject *get_logdest(fi_logger *lg, void *c)
{
    (void)c;
    return PyUnicode_FromString(lg->cfg.logdest);
}
static PyObject *get_dump_dir(fi_logger *lg, void *c)
{
    (void)c;
    return PyUnicode_FromString(lg->cfg.dump_dir);
}
static PyObject *get_max_size_gb(fi_logger *lg, void *c)
{
    (void)c;
    return PyFloat_FromDouble(lg->cfg.max_size_gb);
}
static PyObject *get_max_count(fi_logger *lg, void *c)
{
    (void)c;
    return PyLong_FromLongLong(lg->cfg.max_count);
}
static PyObject *get_safetensors(fi_logger *lg, void *c)
{
    (void)c;
    return PyBool_FromLong(lg->cfg.safetensors);
}
static PyObject *get_include(fi_logger *lg, void *c)
{
    (void)c;
    return patterns_tuple(lg->cfg.include, lg->cfg.n_include);
}
static PyObject *get_exclude(fi_logger *lg, void *c)
{
    (void)c;
    return patterns_tuple(lg->cfg.exclude, lg->cfg.n_exclude);
}
static PyObject *get_sink(fi_logger *lg, void *c)
{
    (void)c;
    return PyUnicode_FromString(lg->sink.kind == FI_SINK_FILE     ? "file"
                                : lg->sink.kind == FI_SINK_STDOUT ? "stdout"
                                                                  : "stderr");
}

static PyGetSetDef logger_getset[] = {
    {"level", (getter)get_level, NULL, "Log level after rounding (0, 1, 3, 5, 10).", NULL},
    {"log_format", (getter)get_log_format, NULL, "FLASHINFER_LOGFORMAT: 'text' or 'json'.", NULL},
    {"logdest", (getter)get_logdest, NULL, "FLASHINFER_LOGDEST with %i substituted.", NULL},
    {"dump_dir", (getter)get_dump_dir, NULL, "FLASHINFER_DUMP_DIR with %i substituted.", NULL},
    {"max_size_gb", (getter)get_max_size_gb, NULL, "FLASHINFER_DUMP_MAX_SIZE_GB.", NULL},
    {"max_count", (getter)get_max_count, NULL, "FLASHINFER_DUMP_MAX_COUNT.", NULL},
    {"safetensors", (getter)get_safetensors, NULL, "FLASHINFER_DUMP_SAFETENSORS.", NULL},
    {"include", (getter)get_include, NULL, "FLASHINFER_DUMP_INCLUDE patterns.", NULL},
    {"exclude", (getter)get_exclude, NULL, "FLASHINFER_DUMP_EXCLUDE patterns.", NULL},
    {"sink", (getter)get_sink, NULL, "'stdout', 'stderr' or 'file' (after any fallback).", NULL},
    {NULL},
};

static PyMemberDef logger_members[] = {
    {"_force_graph_capture", T_INT, offsetof(fi_logger, rec.force_graph_capture), 0,
     "Tests: record every call as if a CUDA graph were being captured."},
    {"capture_graph", T_OBJECT, offsetof(fi_logger, rec.capture_graph), 0,
     "id() of the CUDAGraph being captured, set by the capture hooks; None outside."},
    {"dump_count", T_LONGLONG, offsetof(fi_logger, rec.dump_count), READONLY, "Calls dumped."},
    {"dump_bytes", T_LONGLONG, offsetof(fi_logger, rec.dump_bytes), READONLY,
     "Tensor bytes dumped."},
    {"static_meta", T_OBJECT, offsetof(fi_logger, rec.static_meta), READONLY,
     "Dict merged into every metadata record (versions)."},
    {NULL},
};

/* ------------------------------------------------ the recorder's methods */

PyDoc_STRVAR(dump_ring_doc,
             "dump_ring(trigger='manual')\n--\n\nWrite the in-memory flight recorder's calls now "
             "(as the named trigger would; a name of 1 to 128 bytes); returns how many calls were "
             "written.");

static PyObject *logger_dump_ring(fi_logger *lg, PyObject *args)
{
    const char *trigger = "manual";
    if (!PyArg_ParseTuple(args, "|s:dump_ring", &trigger))
        return NULL;
    int written = fi_recorder_fire(&lg->rec, trigger);
    return written < 0 ? NULL : PyLong_FromLong(written);
}

PyDoc_STRVAR(write_skipped_doc,
             "write_skipped()\n--\n\nAppend to session.jsonl the counts of calls the dump caps "
             "kept out, when they grew since the last record (atexit calls it).");

static PyObject *logger_write_skipped(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    if (fi_recorder_write_skipped(&lg->rec) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ring_bytes_doc, "ring_bytes()\n--\n\nBytes the in-memory flight recorder holds.");

static PyObject *logger_ring_bytes(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(fi_recorder_ring_bytes(&lg->rec));
}

PyDoc_STRVAR(ring_chunk_hashes_doc,
             "_ring_chunk_hashes()\n--\n\nTests: (chunks hashed, chunks given their hash by "
             "the stored bytes they equal) in the in-memory ring's compact store, or None "
             "before it has one.");

static PyObject *logger_ring_chunk_hashes(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    uint64_t hashed, hits;
    if (fi_recorder_chunk_hashes(&lg->rec, &hashed, &hits) < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)hashed, (unsigned long long)hits);
}

PyDoc_STRVAR(ring_banner_doc,
             "ring_banner()\n--\n\nThe level-10 banner's two lines about the ring (what is "
             "written, and the ring's limits), or None without FLASHINFER_DUMP_RING.");

static PyObject *logger_ring_banner(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    return fi_recorder_banner(&lg->rec);
}

PyDoc_STRVAR(hold_ring_writeouts_doc,
             "_hold_ring_writeouts(hold_fd, note_fd)\n--\n\nTests: every write-out of the "
             "in-memory ring, after its first call, writes b'h' to note_fd and waits for a byte "
             "on hold_fd, and again (b'f') before it frees the calls it wrote; a trigger that "
             "waits for a write-out writes b'w'. -1, -1: off.");

static PyObject *logger_hold_ring_writeouts(fi_logger *lg, PyObject *args)
{
    int hold_fd, note_fd;
    if (!PyArg_ParseTuple(args, "ii:_hold_ring_writeouts", &hold_fd, &note_fd))
        return NULL;
    if (fi_recorder_hold_writeouts(&lg->rec, hold_fd, note_fd) < 0)
        return NULL;
    Py_RETURN_NONE;
}

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

static PyObject *logger_flush_graph_dumps(fi_logger *lg, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *graph;
    if (graph_arg(args, nargs, "flush_graph_dumps", &graph) < 0)
        return NULL;
    Py_ssize_t parts = fi_graph_flush(&lg->rec, graph);
    return parts < 0 ? NULL : PyLong_FromSsize_t(parts);
}

PyDoc_STRVAR(pending_graph_dumps_doc,
             "pending_graph_dumps(graph=None)\n--\n\nHow many parts (inputs, outputs) a "
             "flush_graph_dumps(graph) would write now.");

static PyObject *logger_pending_graph_dumps(fi_logger *lg, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *graph;
    if (graph_arg(args, nargs, "pending_graph_dumps", &graph) < 0)
        return NULL;
    return PyLong_FromSsize_t(fi_graph_pending(&lg->rec, graph));
}

PyDoc_STRVAR(clear_graph_dumps_doc, "clear_graph_dumps()\n--\n\nForget the calls recorded during "
                                    "CUDA graph capture; returns how many parts were held.");

static PyObject *logger_clear_graph_dumps(fi_logger *lg, PyObject *unused)
{
    (void)unused;
    Py_ssize_t parts = fi_graph_clear(&lg->rec);
    return parts < 0 ? NULL : PyLong_FromSsize_t(parts);
}

static PyMethodDef logger_methods[] = {
    {"write", (PyCFunction)logger_write, METH_O, logger_write_doc},
    {"name_passes", (PyCFunction)logger_name_passes, METH_O, logger_name_passes_doc},
    {"timestamp", (PyCFunction)logger_timestamp_py, METH_NOARGS, logger_timestamp_doc},
    {"ring_banner", (PyCFunction)logger_ring_banner, METH_NOARGS, ring_banner_doc},
    {"dump_ring", (PyCFunction)logger_dump_ring, METH_VARARGS, dump_ring_doc},
    {"write_skipped", (PyCFunction)logger_write_skipped, METH_NOARGS, write_skipped_doc},
    {"ring_bytes", (PyCFunction)logger_ring_bytes, METH_NOARGS, ring_bytes_doc},
    {"_ring_chunk_hashes", (PyCFunction)logger_ring_chunk_hashes, METH_NOARGS,
     ring_chunk_hashes_doc},
    {"_hold_ring_writeouts", (PyCFunction)logger_hold_ring_writeouts, METH_VARARGS,
     hold_ring_writeouts_doc},
    {"flush_graph_dumps", (PyCFunction)(void (*)(void))logger_flush_graph_dumps, METH_FASTCALL,
     flush_graph_dumps_doc},
    {"pending_graph_dumps", (PyCFunction)(void (*)(void))logger_pending_graph_dumps, METH_FASTCALL,
     pending_graph_dumps_doc},
    {"clear_graph_dumps", (PyCFunction)logger_clear_graph_dumps, METH_NOARGS,
     clear_graph_dumps_doc},
    {NULL},
};

PyDoc_STRVAR(logger_doc, "Logger()\n--\n\nLogging configuration and sink, read from the "
                         "FLASHINFER_* environment variables when created.");

static PyType_Slot logger_slots[] = {
    {Py_tp_new, logger_new},
    {Py_tp_dealloc, logger_dealloc},
    {Py_tp_traverse, logger_traverse},
    {Py_tp_clear, logger_clear},
    {Py_tp_getset, logger_getset},
    {Py_tp_members, logger_members},
    {Py_tp_methods, logger_methods},
    {Py_tp_doc, (void *)logger_doc},
    {0, NULL},
};

static PyType_Spec logger_spec = {
    .name = "flashinfer_native._C.Logger",
    .basicsize = sizeof(fi_logger),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = logger_slots,
};

static PyTypeObject *logger_type_cache; /* the type object; immutable once made */

int fi_logger_check(PyObject *obj)
{
    return logger_type_cache && PyObject_TypeCheck(obj, logger_type_cache);
}

PyDoc_STRVAR(suspend_doc, "suspend_dumps()\n--\n\nStop level-10 dumping in every logger of "
                          "the process until the matching resume_dumps() (calls nest).");
PyDoc_STRVAR(resume_doc, "resume_dumps()\n--\n\nUndo one suspend_dumps().");

static PyObject *suspend_dumps(PyObject *module, PyObject *unused)
{
    (void)unused;
    fi_state_of(module)->dumps_suspended++;
    Py_RETURN_NONE;
}

static PyObject *resume_dumps(PyObject *module, PyObject *unused)
{
    (void)unused;
    fi_module_state *st = fi_state_of(module);
    if (st->dumps_suspended <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "resume_dumps() without a matching suspend_dumps()");
        return NULL;
    }
    st->dumps_suspended--;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(suspended_doc, "dumps_suspended()\n--\n\nTrue while a suspend_dumps() is in force.");

static PyObject *dumps_suspended(PyObject *module, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(fi_state_of(module)->dumps_suspended > 0);
}

static PyMethodDef suspension_methods[] = {
    {"suspend_dumps", suspend_dumps, METH_NOARGS, suspend_doc},
    {"resume_dumps", resume_dumps, METH_NOARGS, resume_doc},
    {"dumps_suspended", dumps_suspended, METH_NOARGS, suspended_doc},
    {NULL},
};

int fi_logger_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, suspension_methods) < 0)
        return -1;
    fi_module_state *st = fi_state_of(module);
    st->logger_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &logger_spec, NULL);
    if (!st->logger_type)
        return -1;
    logger_type_cache = st->logger_type;
    return PyModule_AddType(module, st->logger_type);
}
