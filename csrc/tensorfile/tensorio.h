/* tensorio.h: saving a dict of tensors to a .pt or .safetensors file atomically
 * (tmp + rename, I/O without the GIL) and loading one back, memory-mapped. */
#ifndef FI_TENSORIO_H
#define FI_TENSORIO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flashinfer_kernels.h"

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
