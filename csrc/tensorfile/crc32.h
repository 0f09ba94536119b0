/* crc32.h: CRC-32 (zip/IEEE polynomial) for the zip records we write and check: zlib's
 * crc32 when libz.so.1 loads, else our slicing-by-8 tables. */
#ifndef FI_CRC32_H
#define FI_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Fills the lookup tables; called once from module exec before any writer runs. */
void fi_crc32_init(void);

/* Continues crc over p[0..n); start with crc = 0. */
uint32_t fi_crc32(uint32_t crc, const void *p, size_t n);

#endif
