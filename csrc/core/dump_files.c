/* dump_files.c: what every recorder mode writes to disk the same way: the log lines, the
 * dump root and call directories, records in metadata.jsonl / session.jsonl, tensor files. */
#include "record_mode.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dump_format.h"
#include "fork_watch.h"
#include "json.h"
#include "sink.h"
#include "stats.h"
#include "strbuf.h"

/* ---------------------------------------------------------------- log lines */

void fi_dump_log(fi_recorder *rec, const char *fmt, ...)
{
    fi_buf b;
    fi_buf_init(&b);
    va_list ap;
    va_start(ap, fmt);
    fi_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    fi_buf_putc(&b, '\n');
    rec->emit(rec->owner, b.data, b.len);
    fi_buf_free(&b);
}

void fi_dump_log_error(fi_recorder *rec, const char *name, const char *where)
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
    fi_dump_log(rec, "[DUMP ERROR (%s) in %s]: %s", where, name, m);
    Py_XDECREF(msg);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
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
int fi_dump_ensure_root(fi_recorder *rec)
{
    if (rec->root_ready) {
        struct stat st;
        if (stat(rec->cfg->dump_dir, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
    }
    char *path = malloc(strlen(rec->cfg->dump_dir) + 2);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    sprintf(path, "%s/", rec->cfg->dump_dir);
    int r = fi_make_parents(path, 0700);
    free(path);
    if (r < 0) {
        PyErr_Format(PyExc_OSError, "cannot create dump directory %s: %s", rec->cfg->dump_dir,
                     strerror(errno));
        return -1;
    }
    rec->root_ready = 1;
    return 0;
}

long long fi_dump_next_counter(fi_recorder *rec, PyObject *name)
{
    PyObject *counters = rec->call_counters;
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
char *fi_dump_make_call_dir(fi_recorder *rec, PyObject *name, const char *stamp,
                            long long *call_seq, int create)
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
    size_t cap = strlen(rec->cfg->dump_dir) + strlen(safe) + 96;
    char *dir = malloc(cap);
    for (int attempt = 0; dir && attempt < 1000; attempt++) {
        long long n = fi_dump_next_counter(rec, name);
        if (n < 0)
            break;
        snprintf(dir, cap, FI_DUMP_DIR_FORMAT, rec->cfg->dump_dir, stamp, fi_fork_pid(), safe, n);
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
        PyErr_Format(PyExc_OSError, "no free call directory name under %s", rec->cfg->dump_dir);
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
static int open_session_jsonl(fi_recorder *rec)
{
    struct stat st;
    if (rec->session_fd >= 0 && fstat(rec->session_fd, &st) == 0 && st.st_nlink > 0)
        return rec->session_fd;
    if (rec->session_fd >= 0)
        close(rec->session_fd);
    size_t n = strlen(rec->cfg->dump_dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/" FI_DUMP_SESSION_FILE, rec->cfg->dump_dir);
    rec->session_fd = open_append(path);
    free(path);
    return rec->session_fd;
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
    snprintf(meta, n, "%s/" FI_DUMP_METADATA_FILE, dir);
    snprintf(tmp, n, "%s/" FI_DUMP_METADATA_FILE ".tmp", dir);
    *fd = open(meta, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (*fd >= 0) { /* a graph flush appends to the call's existing file */
        r = write_line(*fd, FI_DUMP_METADATA_FILE, dir, line);
        goto done;
    }
    if (errno != ENOENT) {
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", meta, strerror(errno));
        goto done;
    }
    *fd = open_append(tmp);
    if (*fd < 0 || write_line(*fd, FI_DUMP_METADATA_FILE, dir, line) < 0)
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

/* record as one JSON line in line (initialised here; the caller frees it); 0, or -1 with
 * an exception set. */
static int record_line(fi_buf *line, PyObject *record)
{
    fi_buf_init(line);
    int r = fi_json_from_py(line, record);
    if (r == 0 && fi_buf_putc(line, '\n') < 0) {
        PyErr_NoMemory();
        r = -1;
    }
    return r;
}

int fi_dump_write_record_at(fi_recorder *rec, const char *dir, int *meta_fd,
                            const fi_record *record)
{
    fi_buf line;
    fi_buf_init(&line);
    int r = fi_record_render(record, &line) < 0 || fi_buf_putc(&line, '\n') < 0 ? -1 : 0;
    if (r < 0 && !PyErr_Occurred())
        PyErr_NoMemory();
    int fd = meta_fd ? *meta_fd : -1;
    if (r == 0 && fd >= 0)
        r = write_line(fd, FI_DUMP_METADATA_FILE, dir, &line);
    else if (r == 0)
        r = open_metadata_with_line(dir, &line, &fd);
    if (meta_fd)
        *meta_fd = fd;
    else if (fd >= 0)
        close(fd);
    if (r == 0 && rec->mode->keeps_session) {
        int sfd = open_session_jsonl(rec);
        r = sfd < 0 ? -1 : write_line(sfd, FI_DUMP_SESSION_FILE, rec->cfg->dump_dir, &line);
    }
    fi_buf_free(&line);
    return r;
}

int fi_dump_write_session_record(fi_recorder *rec, PyObject *record)
{
    if (fi_dump_ensure_root(rec) < 0)
        return -1;
    fi_buf line;
    int r = record_line(&line, record);
    int sfd = r == 0 ? open_session_jsonl(rec) : -1;
    if (r == 0)
        r = sfd < 0 ? -1 : write_line(sfd, FI_DUMP_SESSION_FILE, rec->cfg->dump_dir, &line);
    fi_buf_free(&line);
    return r;
}

Py_ssize_t fi_dump_save_tensors_at(fi_recorder *rec, const char *dir, const char *stem,
                                   PyObject *tensors, const fi_save_opts *opts)
{
    static const fi_save_opts none = {NULL, NULL, NULL, NULL, 0, NULL, NULL};
    int st = rec->cfg->safetensors;
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s.%s", dir, stem, st ? FI_DUMP_EXT_SAFETENSORS : FI_DUMP_EXT_TORCH);
    Py_ssize_t written = fi_save_tensor_dict_opts(
        path, tensors, st ? FI_FORMAT_SAFETENSORS : FI_FORMAT_TORCH, opts ? opts : &none);
    free(path);
    return written;
}

fi_save_opts fi_dump_save_opts(fi_dump_call *call, int inputs, const fi_dump_tensors *ts,
                               fi_chunk_device *dev)
{
    call->ctx->paged.device_ranges = dev && dev->takes(dev, FI_DEVICE_CUDA);
    return (fi_save_opts){inputs ? fi_stats_memo_put : NULL,
                          &call->ctx->stats,
                          fi_paged_keep,
                          &call->ctx->paged,
                          ts->bytes >= FI_THREADED_BYTES ? fi_torch_threads() : 1,
                          dev,
                          &call->ctx->seen};
}
