/* pickle.h: the protocol-2 pickle of a dict of tensors as torch.save writes it, and a
 * restricted reader for it that never executes pickle code or imports anything. */
#ifndef FI_PICKLE_H
#define FI_PICKLE_H

#include "strbuf.h"
#include "tensorbytes.h"

/* Appends data.pkl for tensors ts[i] stored in records data/<i>, storage offset 0. */
int fi_pickle_write_tensors(fi_buf *b, const fi_saved_tensor *ts, size_t n);

/* Interprets data.pkl p[0..n) of file path: a dict {str: tensor} built from
 * _rebuild_tensor_v2/_v3 and storage persistent ids. On success *out holds *count
 * descriptions (keys owned, storage_key pointing into p; free with
 * fi_loaded_tensors_free). Anything else raises ValueError naming path and the
 * opcode or global. Needs no torch. */
int fi_pickle_read_tensors(const uint8_t *p, size_t n, const char *path, fi_loaded_tensor **out,
                           size_t *count);

#endif
