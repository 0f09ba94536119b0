/* stats.h: level-5 tensor statistics (min, max, mean, NaN and Inf counts) computed in
 * one pass over CPU tensor memory, any dtype torch has and any strides. */
#ifndef FI_STATS_H
#define FI_STATS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"
#include "strbuf.h"

typedef enum {
    FI_STATS_NONE = 0,        /* empty tensor or a dtype without statistics */
    FI_STATS_FLOAT,           /* every floating dtype, float8 kinds included */
    FI_STATS_INT,             /* integers and bool (bool as 0/1) */
    FI_STATS_SKIPPED_CAPTURE, /* CUDA tensor while its stream captures a graph */
    FI_STATS_DEFERRED,        /* captured: a kernel prints them on each replay (id) */
} fi_stats_kind;

typedef struct {
    fi_stats_kind kind;
    double min, max, mean;        /* float kinds (ints too, rounded); NaN when all are NaN */
    int64_t nan_count, inf_count; /* float kinds */
    /* integer/bool kinds: exact extremes; uint64 tensors use umin/umax (is_unsigned64 set) */
    int64_t imin, imax;
    uint64_t umin, umax;
    int is_unsigned64;
    int64_t numel;
    long long deferred_id; /* FI_STATS_DEFERRED: the id the device printf line carries */
    fi_dtype dtype;        /* the tensor's dtype (fi_stats_of_tensor; FI_STATS_DEFERRED) */
} fi_stats;

/* One pass over CPU memory described by t (any strides, 0 and negative included);
 * needs neither the GIL nor Python. Dtypes without statistics and empty tensors give
 * kind FI_STATS_NONE. Returns -1 (out->kind NONE) when t's shape or strides are invalid. */
int fi_stats_compute(const fi_tensor *t, fi_stats *out);

/* Statistics of a torch.Tensor. CPU: fi_stats_compute, the GIL released for large
 * tensors. CUDA, built with the CUDA kernels and a float dtype they handle (f32, f16,
 * bf16, f64, e4m3fn, e5m2): the statistics kernel on the current stream (one
 * device-to-host copy); while the stream captures a graph, a capture-safe kernel that
 * prints "[flashinfer stats] id=N ..." on every replay is enqueued instead and the kind
 * is FI_STATS_DEFERRED with that id. Other CUDA dtypes: FI_STATS_SKIPPED_CAPTURE while
 * capturing (no synchronisation), otherwise torch ops on the device. Returns -1 with a
 * Python exception set on failure. */
int fi_stats_of_tensor(PyObject *tensor, fi_stats *out);

/* Appends the statistics lines of SPEC 3.3, each prefixed by indent levels (two spaces
 * each) and ended by '\n'; nothing for FI_STATS_NONE. As in FlashInfer's log, a tensor
 * with a NaN prints min, max and mean as nan. Returns -1 on allocation failure. */
int fi_stats_format(fi_buf *buf, const fi_stats *st, int indent);

/* fi_stats_of_tensor then fi_stats_format (known: the tensor's metadata when the caller
 * read it already, else NULL), for the dtypes FlashInfer's log shows statistics of
 * (float64/32/16, bfloat16, float8 e4m3fn/e5m2, int8-64, uint8; not bool, the other
 * unsigned and float8 kinds); a failure (an Exception subclass) becomes the
 * line "[statistics error: message]" and is cleared. Returns -1 with an exception set
 * only for out-of-memory or a non-Exception error such as KeyboardInterrupt. */
int fi_stats_format_tensor(fi_buf *buf, PyObject *tensor, const fi_tensor *known, int indent);

/* Adds tensor_stats, format_tensor_stats and the test hooks to the module. */
int fi_stats_exec(PyObject *module);

#endif
