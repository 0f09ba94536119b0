/* sink.c: log destinations. Every record leaves user space before the wrapped
 * function runs: one write(2) on an O_APPEND file, or write+flush on sys.std*. */
#include "sink.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fi_write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int fi_make_parents(const char *path, mode_t mode)
{
    char *copy = strdup(path);
    if (!copy)
        return -1;
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(copy, mode) < 0 && errno != EEXIST) {
            free(copy);
            return -1;
        }
        *p = '/';
    }
    free(copy);
    return 0;
}

static int python_stream_write(const char *stream_name, const char *data, size_t len)
{
    PyObject *stream = PySys_GetObject(stream_name); /* borrowed */
    if (!stream || stream == Py_None)
        return 0;
    PyObject *text = PyUnicode_DecodeUTF8(data, (Py_ssize_t)len, "replace");
    if (!text)
        return -1;
    PyObject *r = PyObject_CallMethod(stream, "write", "O", text);
    Py_DECREF(text);
    if (!r)
        return -1;
    Py_DECREF(r);
    r = PyObject_CallMethod(stream, "flush", NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

void fi_warn_stderr(const char *line)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    size_t n = strlen(line);
    int failed = python_stream_write("stderr", line, n) < 0 ||
                 (n && line[n - 1] != '\n' && python_stream_write("stderr", "\n", 1) < 0);
    if (failed) {
        PyErr_Clear();
        fi_write_all(2, line, n);
    }
    PyErr_Restore(et, ev, tb);
}

void fi_sink_open(fi_sink *sink, const char *dest)
{
    sink->fd = -1;
    if (strcmp(dest, "stdout") == 0) {
        sink->kind = FI_SINK_STDOUT;
        return;
    }
    sink->kind = FI_SINK_STDERR;
    if (strcmp(dest, "stderr") == 0)
        return;
    int fd = -1;
    if (fi_make_parents(dest, 0755) == 0)
        fd = open(dest, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        char line[1024 + 256];
        snprintf(line, sizeof line,
                 "[flashinfer] WARNING: cannot open FLASHINFER_LOGDEST=%.1024s (%s); logging to "
                 "stderr instead\n",
                 dest, strerror(errno));
        fi_warn_stderr(line);
        return;
    }
    sink->kind = FI_SINK_FILE;
    sink->fd = fd;
}

void fi_sink_close(fi_sink *sink)
{
    if (sink->kind == FI_SINK_FILE && sink->fd >= 0)
        close(sink->fd);
    sink->fd = -1;
}

int fi_sink_write(fi_sink *sink, const char *data, size_t len)
{
    switch (sink->kind) {
    case FI_SINK_FILE:
        if (fi_write_all(sink->fd, data, len) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        return 0;
    case FI_SINK_STDOUT:
        return python_stream_write("stdout", data, len);
    case FI_SINK_STDERR:
        return python_stream_write("stderr", data, len);
    }
    return 0;
}
