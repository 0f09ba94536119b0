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

/* Parses data[0..size) of path into tensor descriptions (strides from __metadata__),
 * each pointing at its bytes in data (free with fi_loaded_tensors_free). Needs no
 * torch; -1 with ValueError naming path and the problem. */
int fi_safetensors_describe(const char *path, const uint8_t *data, size_t size,
                            fi_loaded_tensor **out, size_t *count);

#endif
