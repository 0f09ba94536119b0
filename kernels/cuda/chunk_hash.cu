/* chunk_hash.cu: the flight recorder's chunk hashes on the device, the same bits as
 * kernels/cpu/chunk_hash.c (see there for the definition): one block per chunk, each thread
 * summing the NH terms of every 256th 32-byte block, then a reduction in shared memory.
 * Sums modulo 2^64 do not depend on their order, so the split changes nothing. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "flashinfer_kernels.h"

#define THREADS 256
#define MAX_BLOCKS 65535

/* The 32-byte block b of the chunk at p (len bytes): eight little-endian words, zero past
 * the end. Word loads where the chunk is 4-byte aligned, byte loads otherwise. */
__device__ __forceinline__ void load_block(const uint8_t *p, int64_t len, int64_t b, uint32_t m[8])
{
    int64_t at = 32 * b;
    if (at + 32 <= len && ((uintptr_t)p & 3) == 0) {
        const uint32_t *w = (const uint32_t *)(p + at);
        for (int j = 0; j < 8; j++)
            m[j] = w[j];
        return;
    }
    for (int j = 0; j < 8; j++) {
        uint32_t v = 0;
        for (int k = 3; k >= 0; k--) {
            int64_t i = at + 4 * j + k;
            v = (v << 8) | (i < len ? p[i] : 0u);
        }
        m[j] = v;
    }
}

__global__ void chunk_hash_kernel(const uint8_t *base, const int64_t *offsets,
                                  const int64_t *lengths, int64_t n, const uint32_t *key,
                                  uint64_t *out)
{
    __shared__ unsigned long long part[4][THREADS];
    for (int64_t c = blockIdx.x; c < n; c += gridDim.x) {
        const uint8_t *p = base + offsets[c];
        int64_t len = lengths[c] < (int64_t)FI_CHUNK_MAX ? lengths[c] : (int64_t)FI_CHUNK_MAX;
        int64_t blocks = (len + 31) / 32;
        unsigned long long h[4] = {0, 0, 0, 0};
        for (int64_t b = threadIdx.x; b < blocks; b += THREADS) {
            uint32_t m[8];
            load_block(p, len, b, m);
            const uint32_t *k = key + 8 * b;
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 8; j += 2)
                    h[t] += (unsigned long long)(uint32_t)(m[j] + __ldg(k + j + 4 * t)) *
                            (uint32_t)(m[j + 1] + __ldg(k + j + 1 + 4 * t));
        }
        for (int t = 0; t < 4; t++)
            part[t][threadIdx.x] = h[t];
        __syncthreads();
        for (int s = THREADS / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s)
                for (int t = 0; t < 4; t++)
                    part[t][threadIdx.x] += part[t][threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x < 4)
            out[4 * c + threadIdx.x] = part[threadIdx.x][0];
        __syncthreads(); /* part is reused by the next chunk */
    }
}

extern "C" int fi_chunk_hash_cuda(const void *base, const int64_t *offsets, const int64_t *lengths,
                                  int64_t n, const uint32_t *key, uint64_t *out, int device,
                                  void *stream)
{
    if (n <= 0)
        return 0;
    fi_device_guard guard(device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    unsigned blocks = n < MAX_BLOCKS ? (unsigned)n : MAX_BLOCKS;
    chunk_hash_kernel<<<blocks, THREADS, 0, (cudaStream_t)stream>>>((const uint8_t *)base, offsets,
                                                                    lengths, n, key, out);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : fi_cuda_fail("chunk hash kernel launch", err);
}
