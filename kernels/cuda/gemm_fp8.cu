/* gemm_fp8.cu: the fp8 (e4m3fn / e5m2) batched GEMM on CUDA: tiles of A and B converted
 * to fp16 (exact for both fp8 kinds) in shared memory, WMMA tensor cores, fp32 sums. */
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "flashinfer_kernels.h"
#include "gemm_wmma.cuh"

namespace
{

using fi_wmma::BK;

/* One operand seen as rows x k: A's rows are its m rows, B's rows are its n columns.
 * Element (row, kk) of batch entry bi sits at bi * s_batch + row * s_row + koff(kk), with
 * koff(kk) = kk * s_k, or for the [k/128, n, 128] weight (k128) (kk / 128) * s_kblock +
 * (kk % 128) * s_k. vec: s_k == 1 and every 16-element group is 16-byte aligned. */
struct Fp8Operand {
    const uint8_t *data;
    int64_t rows, s_batch, s_row, s_k, s_kblock;
    int k128, vec, e5m2;
};

__device__ __forceinline__ int64_t koff(const Fp8Operand &op, int64_t kk)
{
    return op.k128 ? (kk >> 7) * op.s_kblock + (kk & 127) * op.s_k : kk * op.s_k;
}

/* Bytes (row, kg .. kg+15) of op, zero past the edges, packed little-endian in w. */
__device__ __forceinline__ void fetch16(const Fp8Operand &op, int64_t bi, int64_t row, int64_t kg,
                                        int64_t k, uint32_t (&w)[4])
{
    w[0] = w[1] = w[2] = w[3] = 0;
    if (row >= op.rows || kg >= k)
        return;
    const uint8_t *base = op.data + bi * op.s_batch + row * op.s_row;
    if (op.vec && kg + 16 <= k) {
        uint4 v = *reinterpret_cast<const uint4 *>(base + koff(op, kg));
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
        return;
    }
#pragma unroll
    for (int e = 0; e < 16; e++)
        if (kg + e < k)
            w[e >> 2] |= (uint32_t)base[koff(op, kg + e)] << ((e & 3) * 8);
}

__device__ __forceinline__ void stage16(const Fp8Operand &op, const uint32_t (&w)[4], void *dst)
{
    const __nv_fp8_interpretation_t kind = op.e5m2 ? __NV_E5M2 : __NV_E4M3;
    uint16_t h[16];
#pragma unroll
    for (int e = 0; e < 16; e++) {
        __nv_fp8_storage_t byte = (__nv_fp8_storage_t)((w[e >> 2] >> ((e & 3) * 8)) & 0xff);
        __half_raw r = __nv_cvt_fp8_to_halfraw(byte, kind);
        h[e] = r.x;
    }
    fi_wmma::store16(dst, h);
}

struct Fp8Loader {
    Fp8Operand a, b;
    int64_t k;
    uint32_t wa[4], wb[4];

    __device__ __forceinline__ void fetch(int64_t bi, int64_t arow, int64_t brow, int64_t kg)
    {
        fetch16(a, bi, arow, kg, k, wa);
        fetch16(b, bi, brow, kg, k, wb);
    }
    __device__ __forceinline__ void stage(__half *as, __half *bs)
    {
        stage16(a, wa, as);
        stage16(b, wb, bs);
    }
};

__global__ void __launch_bounds__(fi_wmma::THREADS)
    fp8_gemm_kernel(Fp8Operand a, Fp8Operand b, int64_t batch, int64_t m, int64_t n, int64_t k,
                    const float *a_scale, const float *b_scale, void *out, int out_dtype)
{
    /* the same float product as the CPU kernel */
    float scale = (a_scale ? *a_scale : 1.0f) * (b_scale ? *b_scale : 1.0f);
    Fp8Loader ld;
    ld.a = a, ld.b = b, ld.k = k;
    int64_t tiles_m = (m + fi_wmma::BM - 1) / fi_wmma::BM;
    int64_t n0 = (int64_t)blockIdx.x * fi_wmma::BN;
    for (int64_t bi = blockIdx.z; bi < batch; bi += gridDim.z)
        for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
            fi_wmma::gemm_tile<__half>(ld, bi, tm * fi_wmma::BM, n0, m, n, k, scale, out,
                                       out_dtype);
}

int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace

extern "C" int fi_gemm_fp8_cuda(const fi_gemm_fp8_params *p)
{
    const fi_tensor *A = &p->a, *B = &p->b;
    int64_t batch = A->shape[0], m = A->shape[1], k = A->shape[2];
    int k128 = p->b_layout == FI_GEMM_B_BLOCK_K128;
    int64_t n = k128 ? B->shape[1] : B->shape[2];
    if (batch <= 0 || m <= 0 || n <= 0)
        return 0;
    if ((n + fi_wmma::BN - 1) / fi_wmma::BN > 0x7fffffff)
        return fi_cuda_fail("fp8 GEMM: n too large for the grid", cudaSuccess);

    Fp8Operand a = {(const uint8_t *)A->data, m, A->stride[0], A->stride[1], A->stride[2], 0, 0, 0,
                    A->dtype == FI_DTYPE_E5M2};
    Fp8Operand b;
    b.data = (const uint8_t *)B->data;
    b.rows = n;
    b.e5m2 = B->dtype == FI_DTYPE_E5M2;
    b.k128 = k128;
    if (k128) { /* [k/128, n, 128], batch 1 */
        b.s_batch = 0, b.s_kblock = B->stride[0], b.s_row = B->stride[1], b.s_k = B->stride[2];
    } else { /* [batch, k, n]: column j is row j of the operand */
        b.s_batch = B->stride[0], b.s_kblock = 0, b.s_row = B->stride[2], b.s_k = B->stride[1];
    }
    if (batch == 1)
        a.s_batch = b.s_batch = 0;
    a.vec =
        a.s_k == 1 && k % 16 == 0 && aligned16(a.data) && a.s_row % 16 == 0 && a.s_batch % 16 == 0;
    b.vec = b.s_k == 1 && k % 16 == 0 && aligned16(b.data) && b.s_row % 16 == 0 &&
            b.s_batch % 16 == 0 && b.s_kblock % 16 == 0;

    fi_device_guard guard(A->device_index);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    cudaStream_t stream = (cudaStream_t)p->stream;
    fp8_gemm_kernel<<<fi_wmma::tile_grid(batch, m, n), fi_wmma::THREADS, 0, stream>>>(
        a, b, batch, m, n, k, p->a_scale, p->b_scale, p->out.data, (int)p->out.dtype);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : fi_cuda_fail("fp8 GEMM kernel launch", err);
}
