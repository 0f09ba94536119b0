/* dump.c: the level-10 flight recorder (SPEC 4): one directory per call with the
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

#include "format.h"
#include "json.h"
#include "sink.h"
#include "strbuf.h"
#include "tensor.h"
#include "tensorio.h"

#define MAX_ITEMS 10000 /* list/tuple/dict items kept in a metadata record */
#define REPR_LIMIT 1000

struct fi_dump_call {
    fi_logger *lg;
    PyObject *name;   /* API name (str) */
    PyObject *record; /* the line-1 record, extended into line 2 */
    char *dir;        /* the call's directory */
    long long input_bytes;
    long long output_bytes;
    PyObject *graph_entry; /* while captured: [dir, record, inputs, outputs, flushes, graph] */
    int meta_fd;           /* metadata.jsonl, open from line 1 to line 2 */
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

/* ------------------------------------------------------- metadata encoding */

static int dict_set(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *int_list(const int64_t *v, int n)
{
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

/* The text fi_tensor_put_dtype / fi_tensor_put_device write, as a str. */
static PyObject *tensor_text(int (*put)(fi_buf *, PyObject *, const fi_tensor *), PyObject *tensor,
                             const fi_tensor *t)
{
    fi_buf b;
    fi_buf_init(&b);
    PyObject *s = put(&b, tensor, t) < 0 ? NULL : PyUnicode_FromStringAndSize(b.data, b.len);
    fi_buf_free(&b);
    return s;
}

/* {shape, dtype, stride, device} for tensor_details; with full, also requires_grad,
 * is_contiguous and the "torch.Tensor" type tag used for nested tensors. */
static PyObject *tensor_meta_of(PyObject *tensor, const fi_tensor *tp, int full, PyObject *key)
{
    const fi_tensor t = *tp;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if ((full && dict_set(d, "type", PyUnicode_FromString("torch.Tensor")) < 0) ||
        dict_set(d, "shape", int_list(t.shape, t.ndim)) < 0 ||
        dict_set(d, "dtype", tensor_text(fi_tensor_put_dtype, tensor, &t)) < 0 ||
        dict_set(d, "stride", int_list(t.stride, t.ndim)) < 0 ||
        dict_set(d, "device", tensor_text(fi_tensor_put_device, tensor, &t)) < 0)
        goto fail;
    if (full) {
        PyObject *rg = PyObject_GetAttr(tensor, fi_names.requires_grad);
        PyObject *contig = PyBool_FromLong(fi_tensor_is_contiguous(&t));
        if (dict_set(d, "requires_grad", rg) < 0 || dict_set(d, "is_contiguous", contig) < 0)
            goto fail;
        Py_INCREF(key);
        if (dict_set(d, "tensor_key", key) < 0)
            goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *tensor_meta(PyObject *tensor, int full, PyObject *key)
{
    fi_tensor t;
    if (fi_tensor_from_py(tensor, &t) < 0)
        return NULL;
    return tensor_meta_of(tensor, &t, full, key);
}

typedef struct {
    PyObject *tensors; /* key -> tensor, for the tensor file */
    PyObject *details; /* key -> tensor_details entry */
    PyObject *keys;    /* list of tensor keys in order */
    long long bytes;   /* nbytes of the tensors collected */
    int any_cuda;      /* a CUDA tensor is among them */
} tensor_sink;

static int collect_tensor(tensor_sink *ts, PyObject *key, PyObject *tensor)
{
    fi_tensor t;
    if (fi_tensor_from_py(tensor, &t) < 0)
        return -1;
    PyObject *details = tensor_meta_of(tensor, &t, 0, key);
    if (!details)
        return -1;
    int r = PyDict_SetItem(ts->details, key, details);
    Py_DECREF(details);
    if (r < 0 || PyDict_SetItem(ts->tensors, key, tensor) < 0 || PyList_Append(ts->keys, key) < 0)
        return -1;
    ts->bytes += (long long)(fi_tensor_numel(&t) * (int64_t)fi_dtype_size(t.dtype));
    ts->any_cuda |= t.device_type == FI_DEVICE_CUDA;
    return 0;
}

static PyObject *encode_value(tensor_sink *ts, PyObject *v, PyObject *key);

static PyObject *typed(const char *type, const char *field, PyObject *value)
{
    if (!value)
        return NULL;
    PyObject *d = Py_BuildValue("{s:s,s:O}", "type", type, field, value);
    Py_DECREF(value);
    return d;
}

static PyObject *encode_repr(PyObject *v)
{
    PyObject *r = PyObject_Repr(v);
    if (!r) {
        PyErr_Clear();
        r = PyUnicode_FromFormat("<%s object>", _PyType_Name(Py_TYPE(v)));
    } else if (PyUnicode_GET_LENGTH(r) > REPR_LIMIT) {
        Py_SETREF(r, PyUnicode_Substring(r, 0, REPR_LIMIT));
    }
    return typed(_PyType_Name(Py_TYPE(v)), "repr", r);
}

static PyObject *encode_enum(tensor_sink *ts, PyObject *v, PyObject *key)
{
    PyObject *cls = (PyObject *)Py_TYPE(v);
    PyObject *name = PyObject_GetAttrString(v, "name");
    PyObject *raw = name ? PyObject_GetAttr(v, fi_names.value) : NULL;
    PyObject *value = raw ? encode_value(ts, raw, key) : NULL;
    PyObject *mod = value ? PyObject_GetAttr(cls, fi_names.module) : NULL;
    PyObject *qn = mod ? PyObject_GetAttr(cls, fi_names.qualname) : NULL;
    PyObject *out = NULL;
    if (qn)
        out = Py_BuildValue("{s:s,s:N,s:O,s:N}", "type", "enum", "name",
                            PyUnicode_FromFormat("%s.%S", _PyType_Name(Py_TYPE(v)), name), "value",
                            value, "class", PyUnicode_FromFormat("%S.%S", mod, qn));
    Py_XDECREF(name);
    Py_XDECREF(raw);
    Py_XDECREF(value);
    Py_XDECREF(mod);
    Py_XDECREF(qn);
    return out;
}

static PyObject *encode_container(tensor_sink *ts, PyObject *v, PyObject *key)
{
    int is_dict = PyDict_Check(v);
    const char *type = is_dict ? "dict" : PyList_Check(v) ? "list" : "tuple";
    PyObject *seq = is_dict ? PyDict_Items(v) : PySequence_List(v);
    if (!seq)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(seq), kept = n < MAX_ITEMS ? n : MAX_ITEMS;
    PyObject *items = PyList_New(kept);
    for (Py_ssize_t i = 0; items && i < kept; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i), *enc = NULL;
        if (is_dict) {
            PyObject *kk = PyUnicode_FromFormat("%S__key_%zd", key, i);
            PyObject *vk = PyUnicode_FromFormat("%S__value_%zd", key, i);
            PyObject *ke = kk ? encode_value(ts, PyTuple_GET_ITEM(item, 0), kk) : NULL;
            PyObject *ve = (ke && vk) ? encode_value(ts, PyTuple_GET_ITEM(item, 1), vk) : NULL;
            if (ve)
                enc = Py_BuildValue("{s:O,s:O}", "key", ke, "value", ve);
            Py_XDECREF(kk);
            Py_XDECREF(vk);
            Py_XDECREF(ke);
            Py_XDECREF(ve);
        } else {
            PyObject *ik = PyUnicode_FromFormat("%S__%zd", key, i);
            enc = ik ? encode_value(ts, item, ik) : NULL;
            Py_XDECREF(ik);
        }
        if (!enc) {
            Py_CLEAR(items);
            break;
        }
        PyList_SET_ITEM(items, i, enc);
    }
    Py_DECREF(seq);
    if (!items)
        return NULL;
    return Py_BuildValue("{s:s,s:n,s:N,s:O}", "type", type, "length", n, "items", items,
                         "truncated", kept < n ? Py_True : Py_False);
}

/* The JSON-ready encoding of SPEC 4.3 for a non-top-level-tensor value; nested
 * tensors are collected into ts under key-derived names. New reference. */
static PyObject *encode_value(tensor_sink *ts, PyObject *v, PyObject *key)
{
    if (v == Py_None || PyBool_Check(v) || PyUnicode_CheckExact(v) || PyFloat_CheckExact(v) ||
        PyLong_CheckExact(v)) {
        Py_INCREF(v);
        return v;
    }
    if (fi_is_tensor(v)) {
        if (collect_tensor(ts, key, v) < 0)
            return NULL;
        return tensor_meta(v, 1, key);
    }
    if (Py_EnterRecursiveCall(" while encoding dump metadata"))
        return NULL;
    PyObject *out;
    if (PyObject_TypeCheck(v, (PyTypeObject *)fi_enum_type()))
        out = encode_enum(ts, v, key);
    else if (PyList_Check(v) || PyTuple_Check(v) || PyDict_Check(v))
        out = encode_container(ts, v, key);
    else if (fi_dtype_from_py(v) != FI_DTYPE_UNKNOWN ||
             strcmp(Py_TYPE(v)->tp_name, "torch.dtype") == 0)
        out = typed("torch.dtype", "value", PyObject_Str(v));
    else if (strcmp(Py_TYPE(v)->tp_name, "torch.device") == 0)
        out = typed("torch.device", "value", PyObject_Str(v));
    else if (PyLong_Check(v) || PyFloat_Check(v))
        out = PyLong_Check(v) ? PyNumber_Long(v) : PyNumber_Float(v);
    else
        out = encode_repr(v);
    Py_LeaveRecursiveCall();
    return out;
}

/* Puts value under key: top-level tensors go to the tensor file, the rest into meta. */
static int add_value(tensor_sink *ts, PyObject *meta, PyObject *key, PyObject *value)
{
    if (fi_is_tensor(value))
        return collect_tensor(ts, key, value);
    PyObject *enc = encode_value(ts, value, key);
    if (!enc)
        return -1;
    int r = PyDict_SetItem(meta, key, enc);
    Py_DECREF(enc);
    return r;
}

static int sink_init(tensor_sink *ts)
{
    ts->tensors = PyDict_New();
    ts->details = PyDict_New();
    ts->keys = PyList_New(0);
    ts->bytes = 0;
    ts->any_cuda = 0;
    return (ts->tensors && ts->details && ts->keys) ? 0 : -1;
}

static void sink_free(tensor_sink *ts)
{
    Py_CLEAR(ts->tensors);
    Py_CLEAR(ts->details);
    Py_CLEAR(ts->keys);
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
 * within the same millisecond) moves on to the next counter value. */
static char *make_call_dir(fi_logger *lg, PyObject *name, const char *stamp, long long *call_seq)
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
        if (mkdir(dir, 0700) == 0) {
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

/* session.jsonl stays open on the logger between records; it is opened again when the
 * file was deleted (the dump root removed and made anew). */
static int session_fd(fi_logger *lg)
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
    if (r == 0 && fd < 0) {
        size_t n = strlen(dir) + 32;
        char *meta = malloc(n);
        if (!meta) {
            PyErr_NoMemory();
            r = -1;
        } else {
            snprintf(meta, n, "%s/metadata.jsonl", dir);
            fd = open_append(meta);
            r = fd < 0 ? -1 : 0;
            free(meta);
        }
    }
    if (r == 0)
        r = write_line(fd, "metadata.jsonl", dir, &line);
    if (meta_fd)
        *meta_fd = fd;
    else if (fd >= 0)
        close(fd);
    int sfd = r == 0 ? session_fd(lg) : -1;
    if (r == 0)
        r = sfd < 0 ? -1 : write_line(sfd, "session.jsonl", lg->cfg.dump_dir, &line);
    fi_buf_free(&line);
    return r;
}

static int write_record(fi_dump_call *call)
{
    return write_record_at(call->lg, call->dir, &call->meta_fd, call->record);
}

static Py_ssize_t save_tensors_at(fi_logger *lg, const char *dir, const char *stem,
                                  PyObject *tensors)
{
    int st = lg->cfg.safetensors;
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s.%s", dir, stem, st ? "safetensors" : "pt");
    Py_ssize_t written =
        fi_save_tensor_dict(path, tensors, st ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH);
    free(path);
    return written;
}

static Py_ssize_t save_tensors(fi_dump_call *call, const char *stem, PyObject *tensors)
{
    return save_tensors_at(call->lg, call->dir, stem, tensors);
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
static int graph_capturing(const tensor_sink *ts)
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
                              tensor_sink *ts, PyObject *input_meta, int capturing)
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
        if (dict_set(rec, "self_id", id) < 0)
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

static void call_free(fi_dump_call *call)
{
    Py_XDECREF(call->lg);
    Py_XDECREF(call->name);
    Py_XDECREF(call->record);
    Py_XDECREF(call->graph_entry);
    if (call->meta_fd >= 0)
        close(call->meta_fd);
    free(call->dir);
    free(call);
}

fi_dump_call *fi_dump_begin(fi_logger *lg, const fi_dump_api *api, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames)
{
    if (fi_logger_dumps_suspended(lg))
        return NULL;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    fi_dump_call *call = calloc(1, sizeof(*call));
    if (call)
        call->meta_fd = -1;
    tensor_sink ts = {0};
    PyObject *input_meta = PyDict_New();
    if (!call || !input_meta || sink_init(&ts) < 0)
        goto error;
    call->lg = lg;
    Py_INCREF(lg);
    call->name = PyUnicode_FromString(api->api_name);
    if (!call->name)
        goto error;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        PyObject *key =
            i < nargs ? PyUnicode_FromFormat("arg_%zd", i)
                      : PyUnicode_FromFormat("kwarg_%U", PyTuple_GET_ITEM(kwnames, i - nargs));
        int r = key ? add_value(&ts, input_meta, key, args[i]) : -1;
        Py_XDECREF(key);
        if (r < 0)
            goto error;
    }
    if (!under_count_cap(lg, api->api_name))
        goto skip;
    if (!under_size_cap(lg, ts.bytes)) {
        /* the call still takes its number, as in FlashInfer: later directories of this
         * API keep the numbers they would have had */
        if (next_counter(lg->call_counters, call->name) < 0)
            goto error;
        log_size_cap(lg, "Skipping dump for", api->api_name);
        goto skip;
    }
    if (ensure_root(lg) < 0)
        goto error;
    char stamp[32];
    timestamp_now(stamp, sizeof stamp);
    long long call_seq = 0;
    call->dir = make_call_dir(lg, call->name, stamp, &call_seq);
    if (!call->dir)
        goto error;
    /* while a CUDA graph is captured no device-to-host copy may run: hold the
     * tensors and write them after each replay (fi_dump_flush_graph) */
    int capturing = lg->force_graph_capture || graph_capturing(&ts);
    Py_ssize_t written = capturing ? 0 : save_tensors(call, "inputs", ts.tensors);
    if (written < 0) {
        rmdir(call->dir);
        goto error;
    }
    lg->sequence++;
    lg->dump_count++;
    lg->dump_bytes += written;
    call->input_bytes = ts.bytes;
    call->record =
        build_record(lg, api, call->name, stamp, call_seq, call->dir, &ts, input_meta, capturing);
    if (!call->record || write_record(call) < 0)
        goto error;
    if (capturing) { /* graph: the CUDAGraph being captured (graph_hooks), or None */
        PyObject *graph = lg->capture_graph ? lg->capture_graph : Py_None;
        call->graph_entry =
            Py_BuildValue("[sOOOiO]", call->dir, call->record, ts.tensors, Py_None, 0, graph);
        if (!call->graph_entry || PyList_Append(lg->graph_pending, call->graph_entry) < 0)
            goto error;
    }
    log_line(lg, "Dumped inputs to: %s (size: %.2f MB, total: %lld/%lld dumps%s)", call->dir,
             (double)ts.bytes / MB, lg->dump_count, lg->cfg.max_count,
             capturing ? ", graph-deferred" : "");
    log_line(lg, "Inputs dumped to: %s", call->dir);
    sink_free(&ts);
    Py_DECREF(input_meta);
    PyErr_Restore(et, ev, tb);
    return call;
error:
    log_dump_error(lg, api->api_name, "inputs");
skip:
    sink_free(&ts);
    Py_XDECREF(input_meta);
    if (call)
        call_free(call);
    PyErr_Restore(et, ev, tb);
    return NULL;
}

/* Fills output_metadata / tensor keys for the result (SPEC 4.3 key names). */
static int collect_outputs(tensor_sink *ts, PyObject *out_meta, PyObject *result)
{
    if (PyTuple_Check(result)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(result); i++) {
            PyObject *key = PyUnicode_FromFormat("result_%zd", i);
            int r = key ? add_value(ts, out_meta, key, PyTuple_GET_ITEM(result, i)) : -1;
            Py_XDECREF(key);
            if (r < 0)
                return -1;
        }
        return 0;
    }
    PyObject *key = PyUnicode_FromString("result");
    int r = key ? add_value(ts, out_meta, key, result) : -1;
    Py_XDECREF(key);
    return r;
}

static int finish_completed(fi_dump_call *call, PyObject *result)
{
    fi_logger *lg = call->lg;
    PyObject *rec = call->record;
    tensor_sink ts;
    if (sink_init(&ts) < 0)
        return -1;
    PyObject *out_meta = PyDict_GetItemString(rec, "output_metadata");
    PyObject *info = PyDict_GetItemString(rec, "tensor_info");
    PyObject *details = PyDict_GetItemString(rec, "tensor_details");
    int r = -1;
    if (!out_meta || !info || !details || collect_outputs(&ts, out_meta, result) < 0)
        goto done;
    long long out_bytes = 0;
    const char *status = "completed";
    if (call->graph_entry) { /* captured: the flushes write the output tensors */
        Py_INCREF(ts.tensors);
        if (PyList_SetItem(call->graph_entry, 3, ts.tensors) < 0 ||
            PyDict_Update(details, ts.details) < 0)
            goto done;
        Py_INCREF(ts.keys);
        if (dict_set(info, "output_tensor_keys", ts.keys) < 0)
            goto done;
        out_bytes = ts.bytes;
        status = "graph_capture_pending_flush";
    } else if (PyList_GET_SIZE(ts.keys) > 0) {
        if (!under_size_cap(lg, ts.bytes)) {
            if (dict_set(rec, "outputs_skipped", PyUnicode_FromString("size cap")) < 0)
                goto done;
            log_size_cap(lg, "Skipping the outputs of", PyUnicode_AsUTF8(call->name));
        } else {
            Py_ssize_t written = save_tensors(call, "outputs", ts.tensors);
            if (written < 0) {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                PyObject *msg = ev ? PyObject_Str(ev) : NULL;
                PyErr_Restore(et, ev, tb);
                log_dump_error(lg, PyUnicode_AsUTF8(call->name), "outputs");
                PyObject *why = msg ? PyUnicode_FromFormat("write error: %U", msg)
                                    : PyUnicode_FromString("write error");
                Py_XDECREF(msg);
                if (dict_set(rec, "outputs_skipped", why) < 0)
                    goto done;
            } else {
                lg->dump_bytes += written;
                out_bytes = ts.bytes;
                if (PyDict_Update(details, ts.details) < 0)
                    goto done;
                Py_INCREF(ts.keys);
                if (dict_set(info, "output_tensor_keys", ts.keys) < 0)
                    goto done;
            }
        }
    }
    call->output_bytes = out_bytes;
    long long total = call->input_bytes + out_bytes;
    if (dict_set(info, "output_size_bytes", PyLong_FromLongLong(out_bytes)) < 0 ||
        dict_set(info, "output_size_mb", size_mb(out_bytes)) < 0 ||
        dict_set(info, "total_size_bytes", PyLong_FromLongLong(total)) < 0 ||
        dict_set(info, "total_size_mb", size_mb(total)) < 0 ||
        dict_set(rec, "execution_status", PyUnicode_FromString(status)) < 0)
        goto done;
    r = 0;
done:
    sink_free(&ts);
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
    if (dict_set(call->record, "exception", exc) < 0)
        return -1;
    return dict_set(call->record, "execution_status", PyUnicode_FromString("exception"));
}

/* Removes a captured call from the pending list (it raised: nothing to flush). */
static void drop_graph_entry(fi_dump_call *call)
{
    PyObject *pending = call->lg->graph_pending;
    for (Py_ssize_t i = PyList_GET_SIZE(pending) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(pending, i) == call->graph_entry)
            PyList_SetSlice(pending, i, i + 1, NULL);
}

/* FlashInfer's two lines after a call's outputs are recorded. */
static void log_outputs_dumped(fi_dump_call *call)
{
    log_line(call->lg, "Dumped outputs to: %s (output size: %.2f MB, total dump size: %.2f MB%s)",
             call->dir, (double)call->output_bytes / MB,
             (double)(call->input_bytes + call->output_bytes) / MB,
             call->graph_entry ? ", graph-deferred" : "");
    log_line(call->lg, "Outputs dumped to: %s", call->dir);
}

void fi_dump_end(fi_dump_call *call, PyObject *result)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int r;
    if (result) {
        r = finish_completed(call, result);
    } else {
        PyErr_NormalizeException(&et, &ev, &tb);
        r = ev ? finish_exception(call, ev) : 0;
        if (call->graph_entry)
            drop_graph_entry(call);
    }
    if (r == 0)
        r = write_record(call);
    if (r < 0)
        log_dump_error(call->lg, PyUnicode_AsUTF8(call->name), "outputs");
    else if (result)
        log_outputs_dumped(call);
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
    if (!rec || dict_set(rec, "execution_status", PyUnicode_FromString(status)) < 0 ||
        dict_set(rec, "graph_capture_flushed", Py_NewRef(Py_True)) < 0 ||
        dict_set(rec, "graph_capture_flush_index", PyLong_FromLong(n)) < 0 ||
        dict_set(rec, "graph_capture_snapshot_dir", PyUnicode_FromString(snap)) < 0 ||
        write_record_at(lg, dir, NULL, rec) < 0)
        goto done;
    snap_rec = PyDict_Copy(rec);
    if (!snap_rec || dict_set(snap_rec, "dump_dir", PyUnicode_FromString(snap)) < 0 ||
        dict_set(snap_rec, "graph_capture_base_dump_dir", PyUnicode_FromString(dir)) < 0)
        goto done;
    r = write_record_at(lg, snap, NULL, snap_rec);
done:
    Py_XDECREF(rec);
    Py_XDECREF(snap_rec);
    return r;
}

/* The held tensors of a captured call that a flush writes: 0, 1 or 2 parts. */
static int held_part(PyObject *tensors)
{
    return tensors != Py_None && PyDict_GET_SIZE(tensors) > 0;
}

/* One snapshot of a captured call, as FlashInfer writes it: per part (inputs, then
 * outputs) the root file refreshed and graph_flushes/flush_NNNN/<part> written, then
 * the part's records. Adds the parts written to *parts. */
static int flush_entry(fi_logger *lg, PyObject *entry, Py_ssize_t *parts)
{
    const char *dir = PyUnicode_AsUTF8(PyList_GET_ITEM(entry, 0));
    PyObject *record = PyList_GET_ITEM(entry, 1);
    long n = PyLong_AsLong(PyList_GET_ITEM(entry, 4)) + 1;
    if (!dir || n <= 0)
        return -1;
    PyObject *count = PyLong_FromLong(n);
    if (!count || PyList_SetItem(entry, 4, count) < 0)
        return -1;
    size_t cap = strlen(dir) + 64;
    char *snap = malloc(cap);
    if (!snap) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(snap, cap, "%s/graph_flushes/flush_%04ld/", dir, n);
    int r = fi_make_parents(snap, 0700); /* also remakes a call directory wiped meanwhile */
    if (r < 0)
        PyErr_Format(PyExc_OSError, "cannot create %s: %s", snap, strerror(errno));
    snap[strlen(snap) - 1] = '\0';
    static const struct {
        int index;
        const char *stem, *status;
    } part[2] = {{2, "inputs", "inputs_saved"}, {3, "outputs", "completed"}};
    for (int i = 0; r == 0 && i < 2; i++) {
        PyObject *tensors = PyList_GET_ITEM(entry, part[i].index);
        if (!held_part(tensors))
            continue;
        Py_ssize_t w = save_tensors_at(lg, dir, part[i].stem, tensors);
        Py_ssize_t w2 = w < 0 ? -1 : save_tensors_at(lg, snap, part[i].stem, tensors);
        r = w2 < 0 ? -1 : write_flush_records(lg, record, part[i].status, n, dir, snap);
        if (r == 0) {
            lg->dump_bytes += w + w2;
            (*parts)++;
        }
    }
    free(snap);
    return r;
}

/* Whether a held call belongs to graph (NULL or None: every call). */
static int entry_of_graph(PyObject *entry, PyObject *graph)
{
    if (!graph || graph == Py_None)
        return 1;
    int eq = PyObject_RichCompareBool(PyList_GET_ITEM(entry, 5), graph, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

Py_ssize_t fi_dump_pending_graph(fi_logger *lg, PyObject *graph)
{
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lg->graph_pending); i++) {
        PyObject *entry = PyList_GET_ITEM(lg->graph_pending, i);
        if (entry_of_graph(entry, graph))
            parts += held_part(PyList_GET_ITEM(entry, 2)) + held_part(PyList_GET_ITEM(entry, 3));
    }
    return parts;
}

PyObject *fi_dump_flush_graph(fi_logger *lg, PyObject *graph)
{
    PyObject *pending = PySequence_List(lg->graph_pending);
    if (!pending)
        return NULL;
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *entry = PyList_GET_ITEM(pending, i);
        if (!entry_of_graph(entry, graph) || flush_entry(lg, entry, &parts) == 0)
            continue;
        PyObject *name = PyDict_GetItemString(PyList_GET_ITEM(entry, 1), "function_name");
        log_dump_error(lg, name ? PyUnicode_AsUTF8(name) : "?", "graph flush");
    }
    Py_DECREF(pending);
    return PyLong_FromSsize_t(parts);
}
