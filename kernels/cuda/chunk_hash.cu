/* chunk_hash.cu: the flight recorder's chunk hashes on the device, the same bits as
 * kernels/cpu/chunk_hash.c (see there for the definition): one block per chunk, each thread
 * summing the NH terms of every 256th 32-byte block, then a reduction in shared memory.
 * Sums modulo 2^64 do not depend on their order, so the split changes nothing. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

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

/* ---- the compact capture's device path (docs/flight-recorder.md, "Chunk dedup on the
 * device"): host arrays in and out, device memory and pinned staging kept per device. */

#define MAX_DEVICES 64
#define STAGE_MAX ((size_t)32 << 20) /* pinned bytes a copy round goes through */

namespace
{
struct workspace {
    std::mutex lock;
    uint32_t *d_key = nullptr; /* the key last uploaded, and its host copy */
    uint32_t *key_copy = nullptr;
    int64_t *d_meta = nullptr; /* offsets, lengths, then 4 hash words per chunk */
    size_t meta_cap = 0;       /* chunks d_meta and h_meta hold */
    int64_t *h_meta = nullptr; /* pinned */
    char *h_stage = nullptr;   /* pinned, for chunk copies */
    size_t stage_cap = 0;
    cudaEvent_t produced = nullptr;
};
workspace spaces[MAX_DEVICES];

const size_t KEY_BYTES = FI_CHUNK_KEY_WORDS * sizeof(uint32_t);

/* The key on the device: uploaded when it differs from the one there. */
int ensure_key(workspace &w, const uint32_t *key)
{
    if (w.key_copy && memcmp(w.key_copy, key, KEY_BYTES) == 0)
        return 0;
    cudaError_t err = cudaSuccess;
    if (!w.d_key && (err = cudaMalloc(&w.d_key, KEY_BYTES)) != cudaSuccess) {
        w.d_key = nullptr;
        return fi_cuda_fail("cudaMalloc (chunk hash key)", err);
    }
    if (!w.key_copy && !(w.key_copy = (uint32_t *)malloc(KEY_BYTES)))
        return fi_cuda_fail("out of host memory for the chunk hash key", cudaSuccess);
    if ((err = cudaMemcpy(w.d_key, key, KEY_BYTES, cudaMemcpyHostToDevice)) != cudaSuccess) {
        free(w.key_copy);
        w.key_copy = nullptr;
        return fi_cuda_fail("cudaMemcpy (chunk hash key)", err);
    }
    memcpy(w.key_copy, key, KEY_BYTES);
    return 0;
}

/* Room for n chunks' offsets, lengths and hashes on the device and pinned on the host. */
int ensure_meta(workspace &w, int64_t n)
{
    if ((size_t)n <= w.meta_cap)
        return 0;
    size_t cap = w.meta_cap ? w.meta_cap : 1024;
    while (cap < (size_t)n)
        cap *= 2;
    cudaFree(w.d_meta);
    cudaFreeHost(w.h_meta);
    w.d_meta = w.h_meta = nullptr;
    w.meta_cap = 0;
    cudaError_t err = cudaMalloc(&w.d_meta, cap * 6 * sizeof(int64_t));
    if (err != cudaSuccess) {
        w.d_meta = nullptr;
        return fi_cuda_fail("cudaMalloc (chunk table)", err);
    }
    if ((err = cudaMallocHost(&w.h_meta, cap * 6 * sizeof(int64_t))) != cudaSuccess) {
        w.h_meta = nullptr;
        return fi_cuda_fail("cudaMallocHost (chunk table)", err);
    }
    w.meta_cap = cap;
    return 0;
}

int ensure_stage(workspace &w, size_t bytes)
{
    if (bytes <= w.stage_cap)
        return 0;
    cudaFreeHost(w.h_stage);
    w.h_stage = nullptr;
    w.stage_cap = 0;
    cudaError_t err = cudaMallocHost(&w.h_stage, bytes);
    if (err != cudaSuccess) {
        w.h_stage = nullptr;
        return fi_cuda_fail("cudaMallocHost (chunk staging)", err);
    }
    w.stage_cap = bytes;
    return 0;
}
} // namespace

extern "C" int fi_chunk_hash_device(const void *base, const int64_t *offsets,
                                    const int64_t *lengths, int64_t n, const uint32_t *key,
                                    fi_chunk_hash *out, int device, void *producer, void *side)
{
    if (n <= 0)
        return 0;
    if (device < 0 || device >= MAX_DEVICES)
        return fi_cuda_fail("chunk hash: device index out of range", cudaSuccess);
    fi_device_guard guard(device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    workspace &w = spaces[device];
    std::lock_guard<std::mutex> hold(w.lock);
    int rc = ensure_key(w, key);
    if (rc == 0)
        rc = ensure_meta(w, n);
    if (rc != 0)
        return rc;
    cudaError_t err = cudaSuccess;
    if (!w.produced &&
        (err = cudaEventCreateWithFlags(&w.produced, cudaEventDisableTiming)) != cudaSuccess) {
        w.produced = nullptr;
        return fi_cuda_fail("cudaEventCreate", err);
    }
    cudaStream_t st = (cudaStream_t)side;
    memcpy(w.h_meta, offsets, n * sizeof(int64_t));
    memcpy(w.h_meta + n, lengths, n * sizeof(int64_t));
    /* the side stream runs after what the producing stream has enqueued so far */
    if (producer != side &&
        ((err = cudaEventRecord(w.produced, (cudaStream_t)producer)) != cudaSuccess ||
         (err = cudaStreamWaitEvent(st, w.produced, 0)) != cudaSuccess))
        return fi_cuda_fail("ordering the chunk hash after its producer", err);
    if ((err = cudaMemcpyAsync(w.d_meta, w.h_meta, 2 * n * sizeof(int64_t), cudaMemcpyHostToDevice,
                               st)) != cudaSuccess)
        return fi_cuda_fail("cudaMemcpyAsync (chunk table)", err);
    uint64_t *d_out = (uint64_t *)(w.d_meta + 2 * n);
    unsigned blocks = n < MAX_BLOCKS ? (unsigned)n : MAX_BLOCKS;
    chunk_hash_kernel<<<blocks, THREADS, 0, st>>>((const uint8_t *)base, w.d_meta, w.d_meta + n, n,
                                                  w.d_key, d_out);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return fi_cuda_fail("chunk hash kernel launch", err);
    if ((err = cudaMemcpyAsync(w.h_meta + 2 * n, d_out, 4 * n * sizeof(uint64_t),
                               cudaMemcpyDeviceToHost, st)) != cudaSuccess)
        return fi_cuda_fail("cudaMemcpyAsync (chunk hashes)", err);
    if ((err = cudaStreamSynchronize(st)) != cudaSuccess)
        return fi_cuda_fail("cudaStreamSynchronize (chunk hashes)", err);
    memcpy(out, w.h_meta + 2 * n, 4 * n * sizeof(uint64_t));
    return 0;
}

extern "C" int fi_chunk_copy_device(void *dst, const void *base, const int64_t *offsets,
                                    const int64_t *lengths, int64_t n, int device, void *side)
{
    if (n <= 0)
        return 0;
    if (device < 0 || device >= MAX_DEVICES)
        return fi_cuda_fail("chunk copy: device index out of range", cudaSuccess);
    fi_device_guard guard(device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    workspace &w = spaces[device];
    std::lock_guard<std::mutex> hold(w.lock);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++)
        total += (size_t)lengths[i];
    if (total == 0)
        return 0;
    int rc = ensure_stage(w, total < STAGE_MAX ? total : STAGE_MAX);
    if (rc != 0)
        return rc;
    cudaStream_t st = (cudaStream_t)side;
    const char *src = (const char *)base;
    char *out = (char *)dst;
    int64_t i = 0;
    size_t done_in_chunk = 0; /* bytes of chunk i already staged */
    while (i < n) {
        /* one round: adjacent chunks merged into one copy each, up to the staging size */
        size_t filled = 0;
        while (i < n && filled < w.stage_cap) {
            size_t at = (size_t)offsets[i] + done_in_chunk;
            size_t run = (size_t)lengths[i] - done_in_chunk;
            int64_t j = i;
            while (run < w.stage_cap - filled && j + 1 < n &&
                   offsets[j + 1] == offsets[j] + lengths[j]) {
                j++;
                run += (size_t)lengths[j];
            }
            size_t take = run < w.stage_cap - filled ? run : w.stage_cap - filled;
            cudaError_t err =
                cudaMemcpyAsync(w.h_stage + filled, src + at, take, cudaMemcpyDeviceToHost, st);
            if (err != cudaSuccess)
                return fi_cuda_fail("cudaMemcpyAsync (chunks to the host)", err);
            filled += take;
            /* advance over what was taken: whole chunks, then part of one */
            size_t left = take + done_in_chunk;
            while (i < n && left >= (size_t)lengths[i]) {
                left -= (size_t)lengths[i];
                i++;
            }
            done_in_chunk = left;
        }
        cudaError_t err = cudaStreamSynchronize(st);
        if (err != cudaSuccess)
            return fi_cuda_fail("cudaStreamSynchronize (chunks to the host)", err);
        memcpy(out, w.h_stage, filled);
        out += filled;
    }
    return 0;
}
