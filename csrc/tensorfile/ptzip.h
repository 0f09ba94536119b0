/* ptzip.h: PyTorch's zip serialization format (what torch.save writes for a dict of
 * tensors): stored records, 64-byte aligned data, CRC-32, zip64 end records. */
#ifndef FI_PTZIP_H
#define FI_PTZIP_H

#include "tensorbytes.h"

/* Writes the whole archive: data.pkl (pickle[0..pickle_len)), the version records and
 * one record per tensor with the bytes its view spans. Runs without the GIL; returns
 * -1 with o->err set on failure. */
int fi_ptzip_write(fi_out *o, const fi_saved_tensor *ts, size_t n, const char *pickle,
                   size_t pickle_len);

/* Fills in the CRCs an archive written with o->defer_crc left at 0 (the archive
 * d[0..size) in memory). Async-signal-safe. -1 when d is not such an archive. */
int fi_ptzip_fill_crcs(uint8_t *d, size_t size);

/* Nonzero when data looks like a zip archive (local header or empty-archive magic). */
int fi_ptzip_sniff(const uint8_t *data, size_t size);

/* Parses the archive data[0..size) of path into tensor descriptions, each pointing at
 * its storage's bytes in data (free with fi_loaded_tensors_free). Needs no torch;
 * -1 with ValueError naming path and the problem. */
int fi_ptzip_describe(const char *path, const uint8_t *data, size_t size, fi_loaded_tensor **out,
                      size_t *count);

#endif
