/* sink.h: where log records go. stdout/stderr are written through Python's
 * sys.stdout/sys.stderr (capture and redirection see them); a file is O_APPEND. */
#ifndef FI_SINK_H
#define FI_SINK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef enum { FI_SINK_STDOUT, FI_SINK_STDERR, FI_SINK_FILE } fi_sink_kind;

typedef struct {
    fi_sink_kind kind;
    int fd; /* FI_SINK_FILE only */
} fi_sink;

/* Opens dest ("stdout", "stderr" or a path; parent directories created). On failure
 * warns once on stderr and falls back to stderr. Never fails. */
void fi_sink_open(fi_sink *sink, const char *dest);
void fi_sink_close(fi_sink *sink);

/* Writes one whole record: one write(2) for files, write()+flush() on the Python
 * stream otherwise. Needs the GIL. Returns -1 with an exception set on failure. */
int fi_sink_write(fi_sink *sink, const char *data, size_t len);

/* One line on sys.stderr (warnings, banners); never raises. */
void fi_warn_stderr(const char *line);

/* mkdir -p of every parent of path (mode for created directories). */
int fi_make_parents(const char *path, mode_t mode);

/* Writes all of data to fd, retrying on EINTR and short writes. 0 or -1 (errno). */
int fi_write_all(int fd, const char *data, size_t len);

#endif
