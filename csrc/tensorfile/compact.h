/* compact.h: the compact dump layout (docs/dump-format.md, "Compact layout"): a call's
 * tensors as a manifest of chunk references (inputs.chunks.json) into pack files of the
 * dump root's chunks/ folder, each chunk stored once by content. */
#ifndef FI_COMPACT_H
#define FI_COMPACT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "chunkstore.h"
#include "compact_names.h"
#include "strbuf.h"
#include "tensorbytes.h"
#include "tensorio.h"

/* One chunk of a tensor's span. */
typedef struct {
    uint64_t offset; /* in the span */
    fi_chunk *chunk;
} fi_chunk_ref;

/* A tensor captured as chunks: its description and its chunk references. */
typedef struct {
    char *key;
    fi_dtype dtype;
    int ndim;
    int64_t shape[FI_MAX_DIMS], stride[FI_MAX_DIMS];
    int requires_grad;
    uint64_t span_bytes;
    fi_chunk_ref *ref;
    size_t nref, cap;
    /* pages kept, of how many, and page ids out of range; total -1: not paged */
    int64_t pages_kept, pages_total, pages_out_of_range;
    uint64_t new_bytes; /* of chunks the store did not hold before the capture */
} fi_compact_tensor;

/* Where new chunks go as they are captured: appended to fd as pack number index (the
 * plain level-10 layout), or nowhere (fd -1: the store keeps their bytes, the ring). */
typedef struct {
    int fd;
    int64_t index;
    uint64_t written; /* bytes appended */
    int err;          /* errno of a failed append */
} fi_pack_sink;

/* Captures s (its kept parts, or its whole span) into t: each chunk (a kept part, or
 * FI_CHUNK_MAX bytes of it) hashed, fed to the statistics stream st (may be NULL) and
 * referenced in store; a chunk new to the store, or not yet in the sink's pack, is
 * appended there. The hashes and statistics of a large tensor are taken on up to threads
 * threads (the same bits as one); the store and the pack are then updated in order. Reads
 * s->keep->packed instead of the tensor's memory when set. 0, or -1 with an exception
 * set. t owns its references until fi_compact_tensor_clear. whole (may be NULL) is for s
 * of one chunk whose statistics st takes whole: when the store kept that chunk's statistics
 * as s's dtype (fi_chunk_keep_stats), they are put there and st is not fed (1 returned). */
int fi_compact_capture(fi_chunk_store *store, const fi_saved_tensor *s, fi_pack_sink *sink,
                       fi_stats_stream *st, int threads, fi_compact_tensor *t, fi_stats *whole);

/* Releases t's references and memory; t is left empty (its pages fields -1). */
void fi_compact_tensor_clear(fi_chunk_store *store, fi_compact_tensor *t);

/* Every tensor of dict captured (fi_compact_capture) into *out[0..*count): the parts opts'
 * keep names, the statistics its sink asks for (of CPU tensors saved as themselves). 0, or
 * -1 with an exception set (nothing held then). Free with fi_compact_tensors_free. */
int fi_compact_capture_dict(fi_chunk_store *store, PyObject *dict, const fi_save_opts *opts,
                            fi_pack_sink *sink, fi_compact_tensor **out, size_t *count);
void fi_compact_tensors_free(fi_chunk_store *store, fi_compact_tensor *ct, size_t n);

/* A manifest is its head, naming the one pack its chunks are in, and its tail, the
 * tensors: {"format": ..., "version": 1, "packs": ["NAME"], "tensors": {...}}. The ring
 * builds the tail at call time and the head when it writes the pack out. 0 or -1 (out of
 * memory). */
int fi_compact_manifest_head(fi_buf *b, const char *pack_name);
int fi_compact_manifest_tail(fi_buf *b, const fi_compact_tensor *ts, size_t n);

/* The plain level-10 writer of the compact layout: chunks new to its store are appended
 * to one pack, ROOT/chunks/PID-NS.pack (a new one when that file is deleted), and every
 * chunk stays in the store for the process's life, so each is written once. */
typedef struct fi_compact_writer fi_compact_writer;

fi_compact_writer *fi_compact_writer_new(const char *root);
void fi_compact_writer_free(fi_compact_writer *w);

/* Writes dict's tensors (their kept parts where keep says) as the manifest at path (tmp +
 * rename) and their new chunks to the pack; opts as for fi_save_tensor_dict_opts (the
 * statistics are those the capture took of CPU tensors saved as themselves). Returns the
 * bytes written (new chunks and manifest), -1 with an exception set. */
Py_ssize_t fi_compact_save(fi_compact_writer *w, const char *path, PyObject *dict,
                           const fi_save_opts *opts);

/* Adds load_chunks and the CompactWriter type to the module. */
int fi_compact_exec(PyObject *module);

#endif
