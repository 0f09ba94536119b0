/* gemm_wmma.cuh: the tensor-core (WMMA) GEMM main loop shared by the CUDA fp8 and fp4
 * GEMMs: 128x128 output tiles from operands dequantized to 16-bit floats in shared memory. */
#ifndef FI_GEMM_WMMA_CUH
#define FI_GEMM_WMMA_CUH

#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"
#include "fi_numeric.h"
#include "flashinfer_kernels.h"

namespace fi_wmma
{

/* Block tile BM x BN, k step BK; 8 warps as 2 (m) x 4 (n), each owning 64 x 32 outputs.
 * Shared rows are padded to LDS elements (80 bytes: 16-byte aligned, fewer conflicts). */
constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8, THREADS = 256;

/* Each thread stages 16 consecutive k values of one A row and one B column per k step:
 * tile row threadIdx.x / 2, k offset (threadIdx.x % 2) * 16. 256 threads cover both tiles. */
static_assert(THREADS == 2 * BM && THREADS == 2 * BN && BK == 32, "staging map");

/* Same rounding as the CPU kernels' store (kernels/cpu/gemm_tiled.c). */
__device__ __forceinline__ void store_out(void *out, int out_dtype, int64_t at, float v)
{
    if (out_dtype == FI_DTYPE_BF16)
        static_cast<uint16_t *>(out)[at] = fi_f32_to_bf16(v);
    else if (out_dtype == FI_DTYPE_F16)
        static_cast<uint16_t *>(out)[at] = fi_f32_to_f16(v);
    else
        static_cast<float *>(out)[at] = v;
}

/* Computes the output tile at (m0, n0) of batch entry bi: out[bi][i][j] = scale *
 * sum_k A[i][k] * B[k][j], out contiguous [batch, m, n]. The loader fetches a thread's
 * 16 k values of an A row and a B column into registers (fetch) and writes them to
 * shared memory as T (stage); rows, columns and k past the edges must come out as 0.
 * Every thread of the block calls this with the same arguments. */
template <typename T, typename Loader>
__device__ __forceinline__ void gemm_tile(Loader &ld, int64_t bi, int64_t m0, int64_t n0, int64_t m,
                                          int64_t n, int64_t k, float scale, void *out,
                                          int out_dtype)
{
    using namespace nvcuda;
    __shared__ __align__(128) T As[BM * LDS];
    __shared__ __align__(128) T Bs[BN * LDS];
    __shared__ __align__(128) float Cs[THREADS / 32][16 * 16];

    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int wm = warp / 4, wn = warp % 4;
    const int srow = t / 2, sk = (t % 2) * 16;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    if (k > 0)
        ld.fetch(bi, m0 + srow, n0 + srow, sk);
    for (int64_t k0 = 0; k0 < k; k0 += BK) {
        ld.stage(As + srow * LDS + sk, Bs + srow * LDS + sk);
        __syncthreads();
        if (k0 + BK < k) /* next tile's loads overlap this tile's math */
            ld.fetch(bi, m0 + srow, n0 + srow, k0 + BK + sk);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 4; i++)
                wmma::load_matrix_sync(a[i], As + (wm * 64 + i * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(b[j], Bs + (wn * 32 + j * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads(); /* everyone is done reading As/Bs before the next stage */
    }

    float *cs = Cs[warp];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(cs, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int64_t gi = m0 + wm * 64 + i * 16 + e / 16;
                int64_t gj = n0 + wn * 32 + j * 16 + e % 16;
                if (gi < m && gj < n)
                    store_out(out, out_dtype, (bi * m + gi) * n + gj, cs[e] * scale);
            }
            __syncwarp(); /* the fragment is read before the next one overwrites cs */
        }
    }
}

/* Writes 16 values as two 16-byte stores (dst is 16-byte aligned: row starts are
 * multiples of 80 bytes, column offsets 0 or 32 bytes). */
__device__ __forceinline__ void store16(void *dst, const uint16_t (&v)[16])
{
    uint4 lo, hi;
    lo.x = v[0] | ((uint32_t)v[1] << 16);
    lo.y = v[2] | ((uint32_t)v[3] << 16);
    lo.z = v[4] | ((uint32_t)v[5] << 16);
    lo.w = v[6] | ((uint32_t)v[7] << 16);
    hi.x = v[8] | ((uint32_t)v[9] << 16);
    hi.y = v[10] | ((uint32_t)v[11] << 16);
    hi.z = v[12] | ((uint32_t)v[13] << 16);
    hi.w = v[14] | ((uint32_t)v[15] << 16);
    static_cast<uint4 *>(dst)[0] = lo;
    static_cast<uint4 *>(dst)[1] = hi;
}

/* Grid for a [batch, m, n] output: x over n tiles, y over m tiles (the kernels loop
 * when there are more than 65535), z over the batch (likewise). */
static inline dim3 tile_grid(int64_t batch, int64_t m, int64_t n)
{
    int64_t tm = (m + BM - 1) / BM, tn = (n + BN - 1) / BN;
    return dim3((unsigned)tn, (unsigned)(tm < 65535 ? tm : 65535),
                (unsigned)(batch < 65535 ? batch : 65535));
}

} // namespace fi_wmma

#endif
