/* tensorbytes.h: what the tensor-file formats share: a tensor collected for writing, the
 * staged output file, view sizes, and torch.Tensors built over memory-mapped file bytes. */
#ifndef FI_TENSORBYTES_H
#define FI_TENSORBYTES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "flashinfer_kernels.h"

/* A byte range [start, end) of a tensor's span. */
typedef struct {
    uint64_t start, end;
} fi_byte_range;

/* The parts of a tensor's span a writer stores, sorted and disjoint; the bytes between
 * them are written as holes of a sparse file (zeros that take no disk space, their CRC
 * computed without reading them). docs/dump-format.md, "Sparse tensor files". */
typedef struct {
    const fi_byte_range *range;
    size_t n;
    /* not NULL: the parts' bytes one after another in host memory (a device tensor's parts
     * copied to the host), read instead of the tensor's own memory */
    const char *packed;
    /* the parts are pages (one each) of pages_total, the page tables also naming
     * pages_out_of_range ids outside them; pages_total -1: not pages */
    int64_t pages_total, pages_out_of_range;
} fi_span_keep;

/* One tensor collected for writing: everything the writers need without the GIL. */
typedef struct {
    PyObject *key_obj; /* owned: the dict key (a str) */
    const char *key;   /* its UTF-8, valid while key_obj lives */
    size_t key_len;
    PyObject *obj; /* owned: the tensor (its host copy for CUDA tensors) */
    fi_tensor t;
    int requires_grad;
    size_t itemsize;
    uint64_t span_bytes;      /* bytes from t.data to one past the last element */
    uint64_t nbytes;          /* numel * itemsize */
    fi_stats *stats;          /* not NULL: fi_out_write_dense takes the level-5 statistics too */
    const fi_span_keep *keep; /* not NULL: only these parts are written, the rest are holes */
} fi_saved_tensor;

/* Output file: errors latch into err (an errno value) so writers run without the GIL.
 * With mem set the "file" is mem[0..mem_cap) instead of fd (the flight recorder's file
 * images); writing past mem_cap fails with ENOSPC. */
typedef struct {
    int fd;
    uint64_t pos;
    int err;
    char *stage; /* small-write staging buffer */
    size_t stage_len, stage_cap;
    char *mem;
    size_t mem_cap;
    int defer_crc; /* .pt tensor records get CRC 0, filled in later (fi_ptzip_fill_crcs) */
    int holes;     /* fi_out_skip left a hole: the file's size is set when it is closed */
} fi_out;

int fi_out_write(fi_out *o, const void *p, size_t n);
/* Moves on n bytes without writing them: a hole in a file (zeros in memory). */
int fi_out_skip(fi_out *o, uint64_t n);
int fi_out_flush(fi_out *o);
int fi_out_pwrite(fi_out *o, const void *p, size_t n, uint64_t at);

/* Writes n bytes from s->t.data in cache-sized blocks, taking each block's CRC-32 (into
 * *crc, when crc is not NULL) and, where s->stats asks and the bytes are all of the
 * tensor's elements, its statistics (fi_stats_stream) while the block is hot: one pass
 * over the tensor's memory. s->stats gets kind FI_STATS_NONE when they were not taken.
 * With s->keep only its parts are read and written (their statistics are those of the
 * elements in them), the rest skipped as holes whose zeros the CRC covers. */
int fi_out_write_dense(fi_out *o, const fi_saved_tensor *s, uint64_t n, uint32_t *crc);

/* The elements of s's kept parts (within its first n span bytes) when statistics can be
 * streamed over them: every part but the last a multiple of 8 elements; else -1. */
int64_t fi_kept_elements(const fi_saved_tensor *s, uint64_t n);

/* A tensor description read from a file, before it becomes a torch.Tensor. */
typedef struct {
    PyObject *key; /* owned str */
    fi_dtype dtype;
    int ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];
    int64_t storage_offset; /* elements */
    uint64_t data_offset;   /* byte offset of the storage in the file */
    uint64_t data_nbytes;   /* bytes of the storage */
    int requires_grad;
    int contiguous_in_file;  /* data stored contiguous; the recorded strides are restored */
    const char *storage_key; /* .pt: the storage's record name inside data/ (borrowed) */
    size_t storage_key_len;
} fi_loaded_tensor;

/* Frees count descriptions and their keys. */
void fi_loaded_tensors_free(fi_loaded_tensor *ts, size_t count);

/* The file bytes a described tensor reads: [offset, offset + nbytes). When
 * restore_bytes is nonzero, they hold contiguous elements that are scattered into a new
 * buffer of restore_bytes to restore the recorded strides. Checks the view fits its
 * storage (-1 with ValueError naming path and key otherwise). Needs no torch. */
typedef struct {
    uint64_t offset, nbytes, restore_bytes;
} fi_extent;

/* Bounded work per tensor (docs/security.md): a view may show a stored element more than
 * once (a broadcast has stride 0), but its elements may exceed its storage's by at most
 * FI_VIEW_REPEAT times plus FI_VIEW_FREE_ELEMENTS, and never FI_VIEW_MAX_ELEMENTS. A
 * stride-0 view of 2^40 elements over 32 bytes would keep every reader of it busy for
 * hours. A view of one element broadcast to every position (all strides 0) may hold up to
 * FI_VIEW_MAX_ELEMENTS: readers read its element once. */
#define FI_VIEW_REPEAT 64ULL
#define FI_VIEW_FREE_ELEMENTS (1ULL << 24)
#define FI_VIEW_MAX_ELEMENTS (1ULL << 34)
int fi_tensor_extent(const char *path, const fi_loaded_tensor *lt, fi_extent *e);

/* A new zeroed uint8 CPU tensor of n bytes; *data is its memory, for a reader to fill. */
PyObject *fi_zeros_bytes(uint64_t n, char **data);

/* lt (shape, stride, storage_offset, requires_grad) as a view over the uint8 tensor bytes,
 * which it steals. New reference or NULL. */
PyObject *fi_tensor_over_bytes(PyObject *bytes, const fi_loaded_tensor *lt);

/* Copies the contiguous row-major elements src of lt into their strided places in dst. */
void fi_scatter_to_strides(char *dst, const char *src, const fi_loaded_tensor *lt);

/* Builds a torch.Tensor over the memory map mm (a Python mmap object) of file path,
 * checking that the view fits inside the storage bytes. New reference or NULL. */
PyObject *fi_tensor_from_mapping(PyObject *mm, const uint8_t *base, const char *path,
                                 const fi_loaded_tensor *lt);

/* numel * itemsize and the span of a strided view in bytes, checking overflow and
 * negative sizes; -1 with ValueError naming path/key on a bad description. */
int fi_view_bytes(const char *path, PyObject *key, fi_dtype dtype, int ndim, const int64_t *shape,
                  const int64_t *stride, uint64_t *nbytes, uint64_t *span_elems);

#endif
