/* chunk_hash.c: the flight recorder's chunk hash (docs/dump-format.md, "Chunk store"), a
 * keyed NH hash iterated four times with Toeplitz-shifted keys, 256 bits. Portable C and an
 * AVX2 path picked by cpuid; kernels/cuda/chunk_hash.cu computes the same on the device.
 *
 * For chunk words m[0..w) (little-endian uint32, the chunk zero-padded to a multiple of 32
 * bytes) and iteration t in 0..3:
 *     h[t] = sum over i of ((m[2i] + k[2i + 4t]) mod 2^32) * ((m[2i+1] + k[2i+1 + 4t]) mod 2^32)
 * modulo 2^64. Sums modulo 2^64 do not depend on the order of the terms, so every path
 * (and any split of the work) gives the same bits. */
#include <string.h>

#include "cpu_simd.h"
#include "flashinfer_kernels.h"

/* The padded length in 32-byte blocks; the tail block is copied into a zeroed buffer. */
static void hash_portable(const uint8_t *p, size_t blocks, const uint32_t *key, uint64_t h[4])
{
    for (size_t b = 0; b < blocks; b++) {
        uint32_t m[8];
        memcpy(m, p + 32 * b, 32);
        const uint32_t *k = key + 8 * b;
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 8; j += 2)
                h[t] += (uint64_t)(uint32_t)(m[j] + k[j + 4 * t]) *
                        (uint32_t)(m[j + 1] + k[j + 1 + 4 * t]);
    }
}

#ifdef FI_HAVE_X86_SIMD
/* Four 64-bit lanes per iteration t: lane l adds the product of words 2l and 2l + 1. */
FI_AVX2_INLINE __m256i nh_step(__m256i acc, __m256i m, const uint32_t *k)
{
    __m256i a = _mm256_add_epi32(m, _mm256_loadu_si256((const __m256i *)(const void *)k));
    return _mm256_add_epi64(acc, _mm256_mul_epu32(a, _mm256_srli_epi64(a, 32)));
}

FI_AVX2 static void hash_avx2(const uint8_t *p, size_t blocks, const uint32_t *key, uint64_t h[4])
{
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (size_t b = 0; b < blocks; b++) {
        __m256i m = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * b));
        const uint32_t *k = key + 8 * b;
        acc[0] = nh_step(acc[0], m, k);
        acc[1] = nh_step(acc[1], m, k + 4);
        acc[2] = nh_step(acc[2], m, k + 8);
        acc[3] = nh_step(acc[3], m, k + 12);
    }
    for (int t = 0; t < 4; t++) {
        uint64_t lanes[4];
        _mm256_storeu_si256((__m256i *)(void *)lanes, acc[t]);
        h[t] += lanes[0] + lanes[1] + lanes[2] + lanes[3];
    }
}
#endif

void fi_chunk_hash_cpu(const void *data, size_t len, const uint32_t *key, fi_chunk_hash *out)
{
    uint64_t h[4] = {0, 0, 0, 0};
    if (len > FI_CHUNK_MAX)
        len = FI_CHUNK_MAX; /* callers cut chunks at FI_CHUNK_MAX; never read past the key */
    size_t whole = len / 32;
    uint8_t tail[32];
    size_t rest = len - 32 * whole;
    memset(tail, 0, sizeof tail);
    if (rest)
        memcpy(tail, (const uint8_t *)data + 32 * whole, rest);
#ifdef FI_HAVE_X86_SIMD
    if (fi_cpu_isa() >= FI_ISA_AVX2) {
        hash_avx2(data, whole, key, h);
        if (rest)
            hash_avx2(tail, 1, key + 8 * whole, h);
        memcpy(out->h, h, sizeof h);
        return;
    }
#endif
    hash_portable(data, whole, key, h);
    if (rest)
        hash_portable(tail, 1, key + 8 * whole, h);
    memcpy(out->h, h, sizeof h);
}
