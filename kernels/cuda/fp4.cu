/* fp4.cu: NVFP4 / MXFP4 quantization on CUDA (bit-exact with kernels/cpu/fp4.c) and the
 * fp4 GEMM: E2M1 codes times block scales dequantized to bf16 tiles for WMMA, fp32 sums. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "fi_numeric.h"
#include "flashinfer_kernels.h"
#include "gemm_wmma.cuh"

/* Bit-exactness needs IEEE division and no flushing of subnormals. */
#ifdef __USE_FAST_MATH__
#error "fp4.cu must not be built with --use_fast_math"
#endif

namespace
{

__device__ __forceinline__ float load_f32(const void *data, int dtype, int64_t at)
{
    if (dtype == FI_DTYPE_F16)
        return fi_f16_to_f32(static_cast<const uint16_t *>(data)[at]);
    if (dtype == FI_DTYPE_BF16)
        return fi_bf16_to_f32(static_cast<const uint16_t *>(data)[at]);
    if (dtype == FI_DTYPE_E4M3FN)
        return fi_e4m3fn_to_f32(static_cast<const uint8_t *>(data)[at]);
    return static_cast<const float *>(data)[at];
}

/* fi_e2m1_to_f32 without its table (a table would live in local memory). */
__device__ __forceinline__ float e2m1_value(uint32_t code)
{
    uint32_t c = code & 7;
    float v = c < 4 ? 0.5f * (float)c : (c == 7 ? 6.0f : (float)(c - 2));
    return (code & 8) ? -v : v;
}

struct QuantArgs {
    const void *x;
    int dtype;
    int64_t m, k, s_row, s_col; /* strides in elements */
    uint8_t *x_q, *sf;
    const float *global_scale;
    float global_scale_value; /* when global_scale is NULL */
    int inversed, sv, ue8m0;
    fi_sf_layout layout;
    float *per_token_scale; /* per-token mode, or NULL */
    const float *out_scale; /* or NULL */
    const int32_t *row_map; /* or NULL: every row */
};

/* Block c of row r with global scale gsf, as quantize_row in kernels/cpu/fp4.c does it,
 * in the same float32 operation order. */
__device__ void quantize_block(const QuantArgs &q, float gsf, int64_t r, int64_t c)
{
    int64_t blocks = q.k / q.sv, sv = q.sv;
    float vals[32];
    float amax = 0.0f;
    for (int64_t e = 0; e < sv; e++) {
        vals[e] = load_f32(q.x, q.dtype, r * q.s_row + (c * sv + e) * q.s_col);
        amax = fmaxf(amax, fabsf(vals[e]));
    }
    float sf_value = gsf * amax;
    sf_value = sf_value / 6.0f;
    uint8_t code;
    float sf;
    if (q.ue8m0) {
        code = fi_f32_to_ue8m0_ceil(sf_value);
        sf = code == 0 && !(sf_value > 0.0f) ? 0.0f : fi_e8m0fnu_to_f32(code);
    } else {
        code = fi_f32_to_e4m3fn(sf_value);
        sf = fi_e4m3fn_to_f32(code);
    }
    q.sf[fi_sf_offset(r, c, blocks, q.layout)] = code;
    float scale = sf == 0.0f ? 0.0f : gsf / sf;
    uint8_t *dst = q.x_q + r * (q.k / 2) + c * sv / 2;
    for (int64_t e = 0; e < sv; e += 2) {
        uint8_t lo = scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e] * scale);
        uint8_t hi = scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e + 1] * scale);
        dst[e / 2] = (uint8_t)(lo | (hi << 4));
    }
}

/* One thread per (row, block) with the one global scale. */
__global__ void fp4_quantize_kernel(QuantArgs q)
{
    float gsf = q.global_scale ? *q.global_scale : q.global_scale_value;
    if (q.inversed)
        gsf = 1.0f / gsf;
    int64_t blocks = q.k / q.sv, total = q.m * blocks;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        quantize_block(q, gsf, idx / blocks, idx % blocks);
}

#define ROW_THREADS 256

/* Per-token mode or a row map: one block per entry i < m (of the map, or row i). The
 * row's amax by a block reduction gives its scale (per_token_global_scale in
 * kernels/cpu/fp4.c), then the threads quantize the row's blocks. */
__global__ void __launch_bounds__(ROW_THREADS) fp4_quantize_rows_kernel(QuantArgs q)
{
    __shared__ float amax_of[ROW_THREADS];
    for (int64_t i = blockIdx.x; i < q.m; i += gridDim.x) {
        int64_t r = q.row_map ? q.row_map[i] : i;
        if (r < 0)
            continue; /* the same r for the whole block: no barrier is skipped by some */
        float gsf = q.global_scale ? *q.global_scale : q.global_scale_value;
        if (q.inversed)
            gsf = 1.0f / gsf;
        if (q.per_token_scale) {
            float amax = 0.0f;
            for (int64_t c = threadIdx.x; c < q.k; c += blockDim.x)
                amax = fmaxf(amax, fabsf(load_f32(q.x, q.dtype, r * q.s_row + c * q.s_col)));
            amax_of[threadIdx.x] = amax;
            __syncthreads();
            for (int w = ROW_THREADS / 2; w > 0; w /= 2) {
                if (threadIdx.x < w)
                    amax_of[threadIdx.x] = fmaxf(amax_of[threadIdx.x], amax_of[threadIdx.x + w]);
                __syncthreads();
            }
            float decode, encode = fi_per_token_encode_scale(amax_of[0], gsf, &decode);
            if (threadIdx.x == 0)
                q.per_token_scale[r] = q.out_scale ? decode * *q.out_scale : decode;
            gsf = encode;
            __syncthreads(); /* amax_of[0] is read before the next row overwrites it */
        }
        for (int64_t c = threadIdx.x; c < q.k / q.sv; c += blockDim.x)
            quantize_block(q, gsf, r, c);
    }
}

/* One packed fp4 operand seen as rows x k: a's rows are its m rows, b's rows are the n
 * weight rows (its columns). Byte p (elements 2p, 2p+1) of row r is at r * s_row + p * s_k;
 * the scale of (r, block c) at sf[fi_sf_offset(r, c, kblocks, layout)]. vec: s_k == 1 and
 * every 8-byte group is 8-byte aligned. */
struct Fp4Operand {
    const uint8_t *data, *sf;
    int64_t rows, s_row, s_k;
    int vec;
    fi_sf_layout layout; /* of this operand's scales */
};

struct Fp4Loader {
    Fp4Operand a, b;
    int64_t k, kblocks;
    int block_size, ue8m0;
    uint32_t wa[2], wb[2];
    float sa, sb;

    /* 16 elements (kg .. kg+15, one scale block or half of one) of row `row`: codes and the
     * block's scale, zeros past the edges (k is a multiple of 16, so a group is all in). */
    __device__ __forceinline__ void fetch1(const Fp4Operand &op, int64_t row, int64_t kg,
                                           uint32_t (&w)[2], float &s) const
    {
        w[0] = w[1] = 0;
        s = 0.0f;
        if (row >= op.rows || kg >= k)
            return;
        const uint8_t *base = op.data + row * op.s_row;
        if (op.vec) {
            uint2 v = *reinterpret_cast<const uint2 *>(base + kg / 2);
            w[0] = v.x, w[1] = v.y;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                w[e >> 2] |= (uint32_t)base[(kg / 2 + e) * op.s_k] << ((e & 3) * 8);
        }
        uint8_t code = op.sf[fi_sf_offset(row, kg / block_size, kblocks, op.layout)];
        s = ue8m0 ? fi_e8m0fnu_to_f32(code) : fi_e4m3fn_to_f32(code);
    }

    __device__ __forceinline__ static void stage1(const uint32_t (&w)[2], float s, void *dst)
    {
        uint16_t h[16];
#pragma unroll
        for (int e = 0; e < 16; e++) {
            uint32_t code = (w[e >> 3] >> ((e & 7) * 4)) & 15;
            /* exact in bf16: at most 6 significant bits, and the range of float32 */
            __nv_bfloat16 v = __float2bfloat16_rn(e2m1_value(code) * s);
            h[e] = __bfloat16_as_ushort(v);
        }
        fi_wmma::store16(dst, h);
    }

    __device__ __forceinline__ void fetch(int64_t, int64_t arow, int64_t brow, int64_t kg)
    {
        fetch1(a, arow, kg, wa, sa);
        fetch1(b, brow, kg, wb, sb);
    }
    __device__ __forceinline__ void stage(__nv_bfloat16 *as, __nv_bfloat16 *bs)
    {
        stage1(wa, sa, as);
        stage1(wb, sb, bs);
    }
};

__global__ void __launch_bounds__(fi_wmma::THREADS)
    fp4_gemm_kernel(Fp4Loader loader, int64_t m, int64_t n, const float *alpha, void *out,
                    int out_dtype)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); /* bf16 tensor cores need sm_80 */
#else
    Fp4Loader ld = loader; /* a local copy: its registers change as it fetches */
    float scale = alpha ? *alpha : 1.0f;
    int64_t tiles_m = (m + fi_wmma::BM - 1) / fi_wmma::BM;
    int64_t n0 = (int64_t)blockIdx.x * fi_wmma::BN;
    for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
        fi_wmma::gemm_tile<__nv_bfloat16>(ld, 0, tm * fi_wmma::BM, n0, m, n, ld.k, scale, out,
                                          out_dtype);
#endif
}

} // namespace

extern "C" int fi_fp4_quantize_cuda(const fi_fp4_quantize_params *p)
{
    int64_t m = p->x.shape[0], k = p->x.shape[1];
    fi_device_guard guard(p->x.device_index);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    cudaStream_t stream = (cudaStream_t)p->stream;
    size_t sf_bytes = (size_t)fi_sf_bytes(m, k / p->sf_vec_size, p->sf_layout);
    if (sf_bytes > 0) { /* padding entries stay 0, as on the CPU */
        cudaError_t err = cudaMemsetAsync(p->sf, 0, sf_bytes, stream);
        if (err != cudaSuccess)
            return fi_cuda_fail("cudaMemsetAsync (fp4 scales)", err);
    }
    int64_t total = m * (k / p->sf_vec_size);
    if (total <= 0)
        return 0;
    QuantArgs q = {p->x.data,
                   (int)p->x.dtype,
                   m,
                   k,
                   p->x.stride[0],
                   p->x.stride[1],
                   p->x_q,
                   p->sf,
                   p->global_scale,
                   p->global_scale_value,
                   p->global_scale_inversed,
                   p->sf_vec_size,
                   p->sf_ue8m0,
                   p->sf_layout,
                   p->per_token_scale,
                   p->out_scale,
                   p->row_map};
    if (p->per_token_scale || p->row_map) {
        fp4_quantize_rows_kernel<<<(unsigned)(m < 65536 ? m : 65536), ROW_THREADS, 0, stream>>>(q);
    } else {
        int64_t blocks = (total + 255) / 256;
        fp4_quantize_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(q);
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : fi_cuda_fail("fp4 quantize kernel launch", err);
}

extern "C" int fi_gemm_fp4_cuda(const fi_gemm_fp4_params *p)
{
    int64_t m = p->a.shape[0], n = p->b.shape[1], k = p->a.shape[1] * 2;
    if (m <= 0 || n <= 0)
        return 0;
    if ((n + fi_wmma::BN - 1) / fi_wmma::BN > 0x7fffffff)
        return fi_cuda_fail("fp4 GEMM: n too large for the grid", cudaSuccess);
    Fp4Loader ld;
    ld.a = {
        (const uint8_t *)p->a.data, p->a_sf, m, p->a.stride[0], p->a.stride[1], 0, p->sf_layout};
    ld.b = {
        (const uint8_t *)p->b.data, p->b_sf, n, p->b.stride[1], p->b.stride[0], 0, p->b_sf_layout};
    ld.a.vec = ld.a.s_k == 1 && ((uintptr_t)ld.a.data & 7) == 0 && ld.a.s_row % 8 == 0;
    ld.b.vec = ld.b.s_k == 1 && ((uintptr_t)ld.b.data & 7) == 0 && ld.b.s_row % 8 == 0;
    ld.k = k;
    ld.kblocks = k / p->block_size;
    ld.block_size = p->block_size;
    ld.ue8m0 = p->sf_ue8m0;
    ld.wa[0] = ld.wa[1] = ld.wb[0] = ld.wb[1] = 0;
    ld.sa = ld.sb = 0.0f;

    fi_device_guard guard(p->a.device_index);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    fp4_gemm_kernel<<<fi_wmma::tile_grid(1, m, n), fi_wmma::THREADS, 0, (cudaStream_t)p->stream>>>(
        ld, m, n, p->alpha, p->out.data, (int)p->out.dtype);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : fi_cuda_fail("fp4 GEMM kernel launch", err);
}
