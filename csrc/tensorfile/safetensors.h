/* safetensors.h: the safetensors format (8-byte header length, JSON header, contiguous
 * data), with the original strides and requires_grad kept in __metadata__. */
#ifndef FI_SAFETENSORS_H
#define FI_SAFETENSORS_H

#include "strbuf.h"
#include "tensorbytes.h"

/* Builds the JSON header (padded with spaces to 8 bytes). With the GIL: raises
 * ValueError naming the tensor when safetensors has no code for its dtype. */
int fi_safetensors_header(fi_buf *b, const fi_saved_tensor *ts, size_t n);

/* Writes length + header + every tensor's elements in row-major order. No GIL;
 * -1 with o->err set on failure. */
int fi_safetensors_write(fi_out *o, const fi_saved_tensor *ts, size_t n, const char *header,
                         size_t header_len);

/* Parses data[0..size) of path (mapped by mm) into {str: Tensor}, strides restored. */
PyObject *fi_safetensors_read(const char *path, PyObject *mm, const uint8_t *data, size_t size);

#endif
