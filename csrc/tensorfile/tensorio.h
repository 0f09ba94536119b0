/* tensorio.h: saving a dict of tensors to a .pt or .safetensors file atomically
 * (tmp + rename, I/O without the GIL) and loading one back, memory-mapped. */
#ifndef FI_TENSORIO_H
#define FI_TENSORIO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"
#include "tensor.h"
#include "tensorbytes.h"

enum { FI_FORMAT_TORCH = 0, FI_FORMAT_SAFETENSORS = 1 };

/* Writes dict {str: Tensor} to path in the given format (FI_FORMAT_*). CUDA tensors
 * are copied to the host first. Returns bytes written, or -1 with an exception set
 * (OSError naming the path for I/O errors; no file is left behind on failure). */
Py_ssize_t fi_save_tensor_dict(const char *path, PyObject *dict, int format);

/* Receives the level-5 statistics of a tensor that fi_save_tensor_dict_stats took in the
 * same pass over its memory as the write (tensor: the dict's value; ctx: the caller's). */
typedef void (*fi_stats_sink)(void *ctx, PyObject *tensor, const fi_stats *stats);

/* fi_save_tensor_dict, handing sink(ctx, ...) the statistics of each CPU tensor for which a
 * stream exists (fi_stats_stream_new: dense float32, float16, bfloat16) once the file is
 * whole. */
Py_ssize_t fi_save_tensor_dict_stats(const char *path, PyObject *dict, int format,
                                     fi_stats_sink sink, void *ctx);

/* Which parts of a dict value's span a sparse file keeps (NULL: all of it); ctx is the
 * caller's. The result must stay valid until the save returns. */
typedef const fi_span_keep *(*fi_keep_fn)(void *ctx, PyObject *tensor);

/* What a save does besides writing its format: sink(sink_ctx, ...) gets the statistics
 * taken on the way (NULL: none are asked for), and keep(keep_ctx, tensor) names the parts of
 * each tensor's span to write, the rest as holes (docs/dump-format.md, "Sparse tensor
 * files"; NULL: every tensor whole); the statistics are then those of the kept elements. */
/* The compact capture's device path (docs/flight-recorder.md, "Chunk dedup on the device"):
 * a tensor it takes is hashed where it lives, and only the chunks the store lacks are
 * copied to the host. The core provides the CUDA one (csrc/core/device_chunks.c). Each
 * function returns 0, or -1 with an exception set. */
typedef struct fi_chunk_device fi_chunk_device;
struct fi_chunk_device {
    /* whether it takes a tensor on device_type (FI_DEVICE_*) */
    int (*takes)(const fi_chunk_device *d, int device_type);
    /* the hashes (fi_chunk_hash_cpu's bits) of n chunks of t's memory, offsets from t->data */
    int (*hash)(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                const int64_t *length, int64_t n, const uint32_t *key, fi_chunk_hash *out);
    /* the n chunks' bytes one after another into dst (host memory) */
    int (*copy)(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                const int64_t *length, int64_t n, void *dst);
    uint64_t hashed, copied; /* bytes, for the benchmarks and tests */
    unsigned failures;       /* device calls that failed (each ends the path: takes() is 0) */
};

typedef struct {
    fi_stats_sink sink;
    void *sink_ctx;
    fi_keep_fn keep;
    void *keep_ctx;
    int threads; /* the compact layout's hashing and statistics may use this many (0: 1) */
    fi_chunk_device *device; /* the compact layout's device path, or NULL */
    fi_tensor_seen *seen;    /* the metadata the call read already (tensor.h), or NULL */
} fi_save_opts;

Py_ssize_t fi_save_tensor_dict_opts(const char *path, PyObject *dict, int format,
                                    const fi_save_opts *opts);

/* dict's tensors collected for a writer (CUDA ones copied to the host unless their kept
 * parts come packed or device takes them), each with its keep, their metadata from seen
 * (NULL: read from Python); release them with fi_tensors_release. */
int fi_tensors_collect(PyObject *dict, fi_saved_tensor **out, size_t *count, fi_keep_fn keep,
                       void *ctx, const fi_chunk_device *device, fi_tensor_seen *seen);
void fi_tensors_release(fi_saved_tensor *ts, size_t n);

/* keep= of save_tensors and CompactWriter.save: {key: [(start, end), ...] or (ranges,
 * packed uint8 tensor)} parsed against dict; fi_keep_map_find is its fi_keep_fn. */
typedef struct {
    PyObject *tensor;
    fi_byte_range *range;
    fi_span_keep keep;
} fi_keep_entry;

typedef struct {
    fi_keep_entry *e;
    Py_ssize_t n;
} fi_keep_map;

int fi_keep_map_parse(PyObject *keep, PyObject *dict, fi_keep_map *m);
void fi_keep_map_free(fi_keep_map *m);
const fi_span_keep *fi_keep_map_find(void *ctx, PyObject *tensor);

/* A whole tensor file built in memory: data[0..len), data malloc'd with room for cap. */
typedef struct {
    char *data;
    size_t len, cap;
    int crc_deferred; /* a .pt image whose CRCs fi_ptzip_fill_crcs fills in */
} fi_image;

/* Builds the file fi_save_tensor_dict would write for dict into img, reusing its buffer
 * when it is large enough (the flight recorder's copies taken at call time). A .pt
 * image's tensor CRCs are left for fi_ptzip_fill_crcs (most images are never written).
 * Returns the bytes, or -1 with an exception set. fi_image_free releases the buffer. */
Py_ssize_t fi_image_tensor_dict(PyObject *dict, int format, fi_image *img);
void fi_image_free(fi_image *img);

/* Reads a .pt (PyTorch zip) or .safetensors file into a new dict {str: Tensor}. */
PyObject *fi_load_tensor_dict(const char *path);

/* Adds save_tensors and load_tensors to the module. */
int fi_tensorio_exec(PyObject *module);

#endif
