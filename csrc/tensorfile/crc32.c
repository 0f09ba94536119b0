/* crc32.c: CRC-32 with the reflected polynomial 0xEDB88320, three ways: carry-less
 * multiplication folding (PCLMULQDQ, x86-64), the system zlib, slicing-by-8 tables. */
#include "crc32.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FI_HAVE_PCLMUL_CODE 1
#include <immintrin.h>
#endif

/* Computed once at module init and never changed afterwards. */
static uint32_t table[8][256];

/* zlib's crc32(crc, buf, len): the same convention as fi_crc32; set once at init. */
typedef unsigned long (*zlib_crc32_fn)(unsigned long, const unsigned char *, unsigned int);
static zlib_crc32_fn zlib_crc32;

static int have_pclmul;
static fi_crc32_impl active = FI_CRC32_TABLE;

static const char *const impl_names[] = {"table", "zlib", "pclmul"};

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

/* x^(2^k) modulo the polynomial, reflected (bit 31 is x^0), for zero runs. */
static uint32_t x2n_table[32];

/* a * b modulo the polynomial, both reflected. */
static uint32_t mult_mod_p(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return p;
}

/* x^(n * 2^k) modulo the polynomial. */
static uint32_t x2n_mod_p(uint64_t n, unsigned k)
{
    uint32_t p = 1u << 31; /* x^0 */
    for (; n; n >>= 1, k++)
        if (n & 1)
            p = mult_mod_p(x2n_table[k & 31], p);
    return p;
}

static void fill_tables(void)
{
    uint32_t x = 1u << 30; /* x^1 */
    for (int k = 0; k < 32; k++) {
        x2n_table[k] = x;
        x = mult_mod_p(x, x);
    }
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

/* The fastest path this process has, unless FLASHINFER_CRC32 names one it has (a
 * test and benchmark switch: table, zlib or pclmul). */
static fi_crc32_impl choose_impl(void)
{
    const char *want = getenv("FLASHINFER_CRC32");
    for (int i = 0; want && i < 3; i++)
        if (strcmp(want, impl_names[i]) == 0 && fi_crc32_has((fi_crc32_impl)i))
            return (fi_crc32_impl)i;
    return have_pclmul ? FI_CRC32_PCLMUL : zlib_crc32 ? FI_CRC32_ZLIB : FI_CRC32_TABLE;
}

void fi_crc32_init(void)
{
    if (table[0][1])
        return;
#ifdef FI_HAVE_PCLMUL_CODE
    __builtin_cpu_init();
    have_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    load_zlib();
    active = choose_impl();
    fill_tables(); /* last: table[0][1] != 0 marks the whole init done */
}

int fi_crc32_has(fi_crc32_impl impl)
{
    switch (impl) {
    case FI_CRC32_TABLE:
        return 1;
    case FI_CRC32_ZLIB:
        return zlib_crc32 != NULL;
    case FI_CRC32_PCLMUL:
        return have_pclmul;
    }
    return 0;
}

fi_crc32_impl fi_crc32_active(void) { return active; }

const char *fi_crc32_impl_name(fi_crc32_impl impl) { return impl_names[impl]; }

/* Plain CRC arithmetic on the inverted register (no pre/post inversion). */
static uint32_t tables_raw(uint32_t crc, const unsigned char *b, size_t n)
{
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
    return crc;
}

static uint32_t crc32_zlib(uint32_t crc, const unsigned char *b, size_t n)
{
    while (n > 0) {
        unsigned int chunk = n > (1u << 30) ? (1u << 30) : (unsigned int)n;
        crc = (uint32_t)zlib_crc32(crc, b, chunk);
        b += chunk;
        n -= chunk;
    }
    return crc;
}

#ifdef FI_HAVE_PCLMUL_CODE
#define FI_PCLMUL __attribute__((target("pclmul,sse4.1")))

/* One folding step: acc times the two halves of k, plus the next 16 bytes. */
FI_PCLMUL static inline __m128i fold16(__m128i acc, __m128i k, __m128i next)
{
    __m128i lo = _mm_clmulepi64_si128(acc, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(acc, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(hi, lo), next);
}

/* Folding constants of Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction" (Intel, 2009), bit-reflected domain, for 0x04C11DB7:
 * x^(4*128+32) and x^(4*128-32) mod P (fold by 64 bytes), x^(128+32) and x^(128-32) mod P
 * (fold by 16 bytes), x^64 mod P, and P' (Barrett quotient) with P itself.
 * n >= 64 and a multiple of 16; crc is the inverted register, and so is the result. */
FI_PCLMUL static uint32_t pclmul_raw(uint32_t crc, const unsigned char *b, size_t n)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);

    /* four independent 128-bit lanes hide the multiplier's latency */
    __m128i x0 = _mm_loadu_si128((const __m128i *)b);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(b + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(b + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(b + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)crc));
    b += 64;
    n -= 64;
    for (; n >= 64; b += 64, n -= 64) {
        x0 = fold16(x0, k1k2, _mm_loadu_si128((const __m128i *)b));
        x1 = fold16(x1, k1k2, _mm_loadu_si128((const __m128i *)(b + 16)));
        x2 = fold16(x2, k1k2, _mm_loadu_si128((const __m128i *)(b + 32)));
        x3 = fold16(x3, k1k2, _mm_loadu_si128((const __m128i *)(b + 48)));
    }
    x0 = fold16(x0, k3k4, x1);
    x0 = fold16(x0, k3k4, x2);
    x0 = fold16(x0, k3k4, x3);
    for (; n >= 16; b += 16, n -= 16)
        x0 = fold16(x0, k3k4, _mm_loadu_si128((const __m128i *)b));

    /* 128 -> 64 bits, then 64 -> 32 with a Barrett reduction */
    __m128i t = _mm_clmulepi64_si128(x0, k3k4, 0x10);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    t = _mm_srli_si128(x0, 4);
    x0 = _mm_clmulepi64_si128(_mm_and_si128(x0, low32), k5, 0x00);
    x0 = _mm_xor_si128(x0, t);
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x0, t), 1);
}
#endif

/* Tables up to a 16-byte boundary and for the tail, folding in between. */
static uint32_t crc32_pclmul(uint32_t crc, const unsigned char *b, size_t n)
{
    crc = ~crc;
#ifdef FI_HAVE_PCLMUL_CODE
    size_t head = (16 - ((uintptr_t)b & 15)) & 15;
    if (n >= head + 64) {
        crc = tables_raw(crc, b, head);
        b += head;
        n -= head;
        size_t body = n & ~(size_t)15;
        crc = pclmul_raw(crc, b, body);
        b += body;
        n -= body;
    }
#endif
    return ~tables_raw(crc, b, n);
}

uint32_t fi_crc32_with(fi_crc32_impl impl, uint32_t crc, const void *p, size_t n)
{
    if (!fi_crc32_has(impl))
        impl = FI_CRC32_TABLE;
    switch (impl) {
    case FI_CRC32_ZLIB:
        return crc32_zlib(crc, p, n);
    case FI_CRC32_PCLMUL:
        return crc32_pclmul(crc, p, n);
    default:
        return ~tables_raw(~crc, p, n);
    }
}

uint32_t fi_crc32(uint32_t crc, const void *p, size_t n)
{
    return fi_crc32_with(active, crc, p, n);
}

/* n zero bytes shift the register (the CRC before its final inversion) by x^(8n), so the
 * result needs O(log n) products, not n bytes read. */
uint32_t fi_crc32_zeros(uint32_t crc, uint64_t n)
{
    return n ? ~mult_mod_p(x2n_mod_p(n, 3), ~crc) : crc;
}

uint32_t fi_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    return mult_mod_p(x2n_mod_p(len2, 3), crc1) ^ crc2;
}
