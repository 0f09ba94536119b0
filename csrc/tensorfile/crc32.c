/* crc32.c: CRC-32 with the reflected polynomial 0xEDB88320. The system zlib's crc32
 * (about 5 GB/s here) when libz.so.1 can be loaded, else slicing-by-8 (about 2 GB/s). */
#include "crc32.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* Computed once at module init and never changed afterwards. */
static uint32_t table[8][256];

/* zlib's crc32(crc, buf, len): the same convention as fi_crc32; set once at init. */
typedef unsigned long (*zlib_crc32_fn)(unsigned long, const unsigned char *, unsigned int);
static zlib_crc32_fn zlib_crc32;

static void load_zlib(void)
{
    if (getenv("FLASHINFER_NO_ZLIB_CRC"))
        return;
    void *lib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    zlib_crc32 = (zlib_crc32_fn)dlsym(lib, "crc32");
    /* the known answer for "123456789" guards against a stranger's crc32 */
    if (zlib_crc32 && zlib_crc32(0, (const unsigned char *)"123456789", 9) != 0xCBF43926u)
        zlib_crc32 = NULL;
}

void fi_crc32_init(void)
{
    if (table[0][1])
        return;
    load_zlib();
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++)
            table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
}

static uint32_t crc32_tables(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    crc = ~crc;
    while (n > 0 && ((uintptr_t)b & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *b++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, b, 4);
        memcpy(&hi, b + 4, 4);
        lo ^= crc;
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        b += 8;
        n -= 8;
    }
    while (n-- > 0)
        crc = (crc >> 8) ^ table[0][(crc ^ *b++) & 0xff];
    return ~crc;
}

uint32_t fi_crc32(uint32_t crc, const void *p, size_t n)
{
    if (!zlib_crc32)
        return crc32_tables(crc, p, n);
    const unsigned char *b = p;
    while (n > 0) {
        unsigned int chunk = n > (1u << 30) ? (1u << 30) : (unsigned int)n;
        crc = (uint32_t)zlib_crc32(crc, b, chunk);
        b += chunk;
        n -= chunk;
    }
    return crc;
}
