/* stats.h: level-5 tensor statistics (min, max, mean, NaN and Inf counts) of a
 * torch.Tensor on any device, and their log text. The kernels: flashinfer_kernels.h. */
#ifndef FI_STATS_H
#define FI_STATS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"
#include "pages.h"
#include "strbuf.h"
#include "tensor.h"

/* Statistics already taken of one call's tensors, so that a second reader of the same
 * tensor does not read its memory again: the level-10 dump takes the inputs' statistics
 * in its pass over them (the inputs' level-5 text reuses them), and the outputs' level-5
 * text the outputs' (the flight recorder's nan/inf check reuses those). Each call has its
 * own (fi_call); an entry holds while the tensor's data pointer and version counter are
 * unchanged. Guarded by the GIL. */
#define FI_STATS_MEMO_MAX 32
typedef struct {
    struct {
        PyObject *tensor; /* owned, so that the address cannot be reused meanwhile */
        void *data;
        long long version;
        fi_stats stats;
    } entry[FI_STATS_MEMO_MAX];
    int count;
    int keep_taken; /* while set, what fi_stats_of_tensor takes of CPU tensors is kept too */
    /* the call's paged tensors (NULL: none): statistics of one are of the pages the call
     * reads (docs/flight-recorder.md#page-aware-capture), and its text says so */
    const fi_paged *paged;
    fi_tensor_seen *seen; /* the call's tensor metadata, read once (tensor.h), or NULL */
} fi_stats_memo;

void fi_stats_memo_init(fi_stats_memo *memo);
/* Drops every entry (their tensor references). */
void fi_stats_memo_clear(fi_stats_memo *memo);
/* Keeps stats for tensor: an fi_stats_sink, ctx the fi_stats_memo. */
void fi_stats_memo_put(void *memo, PyObject *tensor, const fi_stats *stats);

/* Statistics of a torch.Tensor. CPU: fi_stats_cpu, the GIL released for large
 * tensors. CUDA, built with the CUDA kernels and a float dtype they handle (f32, f16,
 * bf16, f64, e4m3fn, e5m2): the statistics kernel on the current stream (one
 * device-to-host copy); while the stream captures a graph, a capture-safe kernel that
 * prints "[flashinfer stats] id=N ..." on every replay is enqueued instead and the kind
 * is FI_STATS_DEFERRED with that id. Other CUDA dtypes (every one when the CUDA kernels
 * are not built): FI_STATS_SKIPPED_CAPTURE while capturing (no synchronisation), otherwise
 * torch ops on the device. Other devices: torch ops (meta tensors: FI_STATS_NONE).
 * memo (NULL: none) answers for a CPU tensor it holds, and keeps what is taken when its
 * keep_taken is set. Returns -1 with a Python exception set on failure. */
int fi_stats_of_tensor(PyObject *tensor, fi_stats_memo *memo, fi_stats *out);

/* Appends the statistics lines of docs/logging.md#what-the-text-log-looks-like, each prefixed by
 * indent levels (two spaces each) and ended by '\n'; nothing for FI_STATS_NONE. As in FlashInfer's
 * log, a tensor with a NaN prints min, max and mean as nan. Returns -1 on allocation failure. */
int fi_stats_format(fi_buf *buf, const fi_stats *st, int indent);

/* fi_stats_of_tensor (known: the tensor's metadata when the caller read it already, else
 * NULL; memo as there); a failure that is an Exception becomes *error (a new str, the exception
 * cleared) and returns 0 with kind FI_STATS_NONE. -1 with an exception set only for out-of-memory
 * or a non-Exception error such as KeyboardInterrupt. */
int fi_stats_or_error(PyObject *tensor, const fi_tensor *known, fi_stats_memo *memo, fi_stats *out,
                      PyObject **error);

/* fi_stats_of_tensor then fi_stats_format (known: the tensor's metadata when the caller
 * read it already, else NULL; memo as there), for the dtypes FlashInfer's log shows statistics of
 * (float64/32/16, bfloat16, float8 e4m3fn/e5m2, int8-64, uint8; not bool, the other
 * unsigned and float8 kinds); a failure (an Exception subclass) becomes the
 * line "[statistics error: message]" and is cleared. Returns -1 with an exception set
 * only for out-of-memory or a non-Exception error such as KeyboardInterrupt. */
int fi_stats_format_tensor(fi_buf *buf, PyObject *tensor, const fi_tensor *known,
                           fi_stats_memo *memo, int indent);

/* The line "pages=KEPT/TOTAL" (and "page_ids_out_of_range=N" when the page tables named
 * ids outside the tensor) that tells a paged tensor's statistics are of the pages its call
 * reads. -1 (MemoryError) when out of memory. */
int fi_stats_put_pages_line(fi_buf *buf, const fi_page_set *ps, int indent);

/* torch.get_num_threads(), the threads torch's own CPU ops use (1 when unknown): the
 * recorder's passes over large tensors (statistics, chunk hashes) use as many. */
int fi_torch_threads(void);
/* The tensor bytes of a save from which asking fi_torch_threads is worth its cost. */
#define FI_THREADED_BYTES ((long long)8 << 20)

/* Adds tensor_stats, format_tensor_stats and the test hooks to the module. */
int fi_stats_exec(PyObject *module);

#endif
