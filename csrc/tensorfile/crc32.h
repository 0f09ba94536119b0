/* crc32.h: CRC-32 (zip/IEEE polynomial) for the zip records we write and check: PCLMULQDQ
 * folding where the CPU has it, else zlib's crc32 when libz.so.1 loads, else our tables. */
#ifndef FI_CRC32_H
#define FI_CRC32_H

#include <stddef.h>
#include <stdint.h>

typedef enum { FI_CRC32_TABLE, FI_CRC32_ZLIB, FI_CRC32_PCLMUL } fi_crc32_impl;

/* Detects the CPU, loads zlib and fills the tables; called once from module exec before
 * any writer runs. FLASHINFER_CRC32=table|zlib|pclmul forces a path the process has;
 * FLASHINFER_NO_ZLIB_CRC keeps zlib unloaded. */
void fi_crc32_init(void);

/* Continues crc over p[0..n); start with crc = 0. */
uint32_t fi_crc32(uint32_t crc, const void *p, size_t n);

/* The CRC of n zero bytes appended to what gave crc, computed without reading zeros
 * (O(log n)): how the sparse tensor files' CRCs cover their holes. Async-signal-safe
 * once fi_crc32_init ran. */
uint32_t fi_crc32_zeros(uint32_t crc, uint64_t n);

/* The CRC of A followed by B from crc1 = CRC(A), crc2 = CRC(B) and len2 = |B| (zlib's
 * crc32_combine). */
uint32_t fi_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* fi_crc32 through one path (the tables where this process lacks it): for tests and
 * benchmarks. */
uint32_t fi_crc32_with(fi_crc32_impl impl, uint32_t crc, const void *p, size_t n);

/* Whether this process has impl, which one fi_crc32 uses, and its name. */
int fi_crc32_has(fi_crc32_impl impl);
fi_crc32_impl fi_crc32_active(void);
const char *fi_crc32_impl_name(fi_crc32_impl impl);

#endif
