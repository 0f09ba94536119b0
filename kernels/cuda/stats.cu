/* stats.cu: one-pass tensor statistics on CUDA (min, max, sum, NaN and Inf counts) over
 * strided float tensors; a graph-capture-safe variant prints them with device printf. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "common.cuh"
#include "flashinfer_kernels.h"

#define THREADS 256
#define MAX_BLOCKS 1024
#define PRINT_THREADS 1024

/* Shape and strides with size-1 dimensions dropped, passed by value to the kernels. */
struct layout {
    int ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];
};

struct partial {
    double min, max, sum; /* over non-NaN values */
    unsigned long long nan, inf;
};

__device__ __forceinline__ double load_value(const void *data, int64_t off, fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F64:
        return ((const double *)data)[off];
    case FI_DTYPE_F32:
        return ((const float *)data)[off];
    case FI_DTYPE_F16:
        return __half2float(((const __half *)data)[off]);
    case FI_DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)data)[off]);
    case FI_DTYPE_E4M3FN:
        return __half2float(
            __half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)data)[off], __NV_E4M3)));
    case FI_DTYPE_E5M2:
        return __half2float(
            __half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)data)[off], __NV_E5M2)));
    default:
        return 0.0;
    }
}

/* Element offset (in elements) of the i-th element in row-major order. */
__device__ __forceinline__ int64_t offset_of(const layout &L, int64_t i)
{
    int64_t off = 0;
    for (int d = L.ndim - 1; d >= 0; d--) {
        off += (i % L.shape[d]) * L.stride[d];
        i /= L.shape[d];
    }
    return off;
}

__device__ __forceinline__ void partial_init(partial *p)
{
    p->min = INFINITY;
    p->max = -INFINITY;
    p->sum = 0.0;
    p->nan = 0;
    p->inf = 0;
}

__device__ __forceinline__ void partial_add(partial *p, const partial &q)
{
    p->min = fmin(p->min, q.min);
    p->max = fmax(p->max, q.max);
    p->sum += q.sum;
    p->nan += q.nan;
    p->inf += q.inf;
}

/* This thread's share of elements first .. numel - 1 stepping by step. With finite_sum
 * the infinities count in min and max but not in the sum (the printed mean is over the
 * finite values, as FlashInfer's capture-time kernel prints it). */
__device__ void accumulate(partial *p, const void *data, fi_dtype dtype, const layout &L,
                           int64_t first, int64_t step, int64_t numel, bool finite_sum)
{
    for (int64_t i = first; i < numel; i += step) {
        double x = load_value(data, offset_of(L, i), dtype);
        if (isnan(x)) {
            p->nan++;
            continue;
        }
        bool inf = isinf(x);
        p->inf += inf;
        p->min = fmin(p->min, x);
        p->max = fmax(p->max, x);
        if (!(inf && finite_sum))
            p->sum += x;
    }
}

/* Tree reduction of one partial per thread in shared memory; thread 0 gets the total. */
__device__ void block_reduce(partial *mine, partial *shared)
{
    shared[threadIdx.x] = *mine;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s)
            partial_add(&shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    *mine = shared[0];
}

__global__ void __launch_bounds__(THREADS)
    stats_partial_kernel(const void *data, fi_dtype dtype, const layout L, int64_t numel,
                         partial *out)
{
    __shared__ partial shared[THREADS];
    partial mine;
    partial_init(&mine);
    accumulate(&mine, data, dtype, L, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
               (int64_t)gridDim.x * blockDim.x, numel, false);
    block_reduce(&mine, shared);
    if (threadIdx.x == 0)
        out[blockIdx.x] = mine;
}

__global__ void __launch_bounds__(THREADS)
    stats_final_kernel(const partial *parts, int nparts, partial *out)
{
    __shared__ partial shared[THREADS];
    partial mine;
    partial_init(&mine);
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        partial_add(&mine, parts[i]);
    block_reduce(&mine, shared);
    if (threadIdx.x == 0)
        *out = mine;
}

/* The dense form: a tensor whose elements are one contiguous run. Each thread reads
 * 16-byte vectors (8 halves, 4 floats, 16 fp8 codes), converts each element once and keeps
 * min/max in the element's own precision (exact: every value converts without rounding)
 * and the sum in double; the generic kernel's per-element index arithmetic (64-bit
 * divisions) and dtype switch held it to a tenth of the memory bandwidth. */
template <typename T> struct dense_elem;
template <> struct dense_elem<float> {
    typedef float V;
    static __device__ __forceinline__ V get(float x) { return x; }
};
template <> struct dense_elem<double> {
    typedef double V;
    static __device__ __forceinline__ V get(double x) { return x; }
};
template <> struct dense_elem<__half> {
    typedef float V;
    static __device__ __forceinline__ V get(__half x) { return __half2float(x); }
};
template <> struct dense_elem<__nv_bfloat16> {
    typedef float V;
    static __device__ __forceinline__ V get(__nv_bfloat16 x) { return __bfloat162float(x); }
};
struct e4m3_code {
    uint8_t bits;
};
struct e5m2_code {
    uint8_t bits;
};
template <> struct dense_elem<e4m3_code> {
    typedef float V;
    static __device__ __forceinline__ V get(e4m3_code x)
    {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E4M3)));
    }
};
template <> struct dense_elem<e5m2_code> {
    typedef float V;
    static __device__ __forceinline__ V get(e5m2_code x)
    {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E5M2)));
    }
};

template <typename V> struct dense_partial {
    V min, max;
    double sum;
    unsigned long long nan, inf;

    __device__ __forceinline__ void add(V x)
    {
        if (isnan(x)) {
            nan++;
            return;
        }
        inf += isinf(x);
        min = x < min ? x : min;
        max = x > max ? x : max;
        sum += (double)x;
    }
};

template <typename T>
__global__ void __launch_bounds__(THREADS)
    stats_dense_kernel(const T *data, int64_t numel, partial *out)
{
    typedef typename dense_elem<T>::V V;
    constexpr int PER = 16 / sizeof(T);
    __shared__ partial shared[THREADS];
    dense_partial<V> acc = {(V)INFINITY, (V)-INFINITY, 0.0, 0, 0};
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    /* elements before the first 16-byte boundary, whole vectors, then the tail */
    int64_t head = (int64_t)((16 - ((uintptr_t)data & 15)) & 15) / (int64_t)sizeof(T);
    if (head > numel)
        head = numel;
    for (int64_t i = first; i < head; i += step)
        acc.add(dense_elem<T>::get(data[i]));
    const uint4 *vec = (const uint4 *)(data + head);
    const int64_t nvec = (numel - head) / PER;
    for (int64_t i = first; i < nvec; i += step) {
        uint4 w = __ldg(vec + i);
        const T *e = (const T *)&w;
#pragma unroll
        for (int k = 0; k < PER; k++)
            acc.add(dense_elem<T>::get(e[k]));
    }
    for (int64_t i = head + nvec * PER + first; i < numel; i += step)
        acc.add(dense_elem<T>::get(data[i]));
    partial mine = {(double)acc.min, (double)acc.max, acc.sum, acc.nan, acc.inf};
    block_reduce(&mine, shared);
    if (threadIdx.x == 0)
        out[blockIdx.x] = mine;
}

/* True when the layout's elements are one run in row-major order (size-1 dims dropped). */
static bool layout_is_dense(const layout &L)
{
    int64_t expect = 1;
    for (int d = L.ndim - 1; d >= 0; d--) {
        if (L.stride[d] != expect)
            return false;
        expect *= L.shape[d];
    }
    return true;
}

static cudaError_t launch_partials(const fi_tensor *t, const layout &L, int64_t numel, int blocks,
                                   partial *parts, cudaStream_t st)
{
    if (layout_is_dense(L)) {
        switch (t->dtype) {
        case FI_DTYPE_F32:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const float *)t->data, numel, parts);
            return cudaGetLastError();
        case FI_DTYPE_F64:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const double *)t->data, numel, parts);
            return cudaGetLastError();
        case FI_DTYPE_F16:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const __half *)t->data, numel, parts);
            return cudaGetLastError();
        case FI_DTYPE_BF16:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const __nv_bfloat16 *)t->data, numel,
                                                           parts);
            return cudaGetLastError();
        case FI_DTYPE_E4M3FN:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const e4m3_code *)t->data, numel,
                                                           parts);
            return cudaGetLastError();
        case FI_DTYPE_E5M2:
            stats_dense_kernel<<<blocks, THREADS, 0, st>>>((const e5m2_code *)t->data, numel,
                                                           parts);
            return cudaGetLastError();
        default:
            break;
        }
    }
    stats_partial_kernel<<<blocks, THREADS, 0, st>>>(t->data, t->dtype, L, numel, parts);
    return cudaGetLastError();
}

/* The capture-safe form: one block, nothing allocated, the result printed. */
__global__ void __launch_bounds__(PRINT_THREADS)
    stats_print_kernel(const void *data, fi_dtype dtype, const layout L, int64_t numel,
                       long long id)
{
    __shared__ partial shared[PRINT_THREADS];
    partial mine;
    partial_init(&mine);
    accumulate(&mine, data, dtype, L, threadIdx.x, blockDim.x, numel, true);
    block_reduce(&mine, shared);
    if (threadIdx.x != 0)
        return;
    /* FlashInfer's lines: min/max over non-NaN values, the mean over finite ones */
    long long finite = numel - (long long)mine.nan - (long long)mine.inf;
    if (numel == 0) {
        printf("[flashinfer stats] id=%lld numel=0 (empty tensor)\n", id);
        return;
    }
    if (finite <= 0) {
        printf("[flashinfer stats] id=%lld numel=%lld (all non-finite) nan=%llu inf=%llu\n", id,
               (long long)numel, mine.nan, mine.inf);
        return;
    }
    printf("[flashinfer stats] id=%lld numel=%lld min=%.6f max=%.6f mean=%.6f nan=%llu "
           "inf=%llu\n",
           id, (long long)numel, mine.min, mine.max, mine.sum / (double)finite, mine.nan, mine.inf);
}

extern "C" int fi_stats_cuda_supports(fi_dtype dtype)
{
    return dtype == FI_DTYPE_F32 || dtype == FI_DTYPE_F16 || dtype == FI_DTYPE_BF16 ||
           dtype == FI_DTYPE_F64 || dtype == FI_DTYPE_E4M3FN || dtype == FI_DTYPE_E5M2;
}

/* Drops size-1 dimensions; 0 with numel set, or nonzero for a bad tensor. */
static int make_layout(const fi_tensor *t, layout *L, int64_t *numel)
{
    if (!fi_stats_cuda_supports(t->dtype))
        return fi_cuda_fail("tensor statistics (cuda): unsupported dtype", cudaSuccess);
    if (t->ndim < 0 || t->ndim > FI_MAX_DIMS)
        return fi_cuda_fail("tensor statistics (cuda): bad number of dimensions", cudaSuccess);
    L->ndim = 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return fi_cuda_fail("tensor statistics (cuda): negative size", cudaSuccess);
        if (t->shape[d] == 0) {
            *numel = 0;
            return 0;
        }
        if (n > INT64_MAX / t->shape[d])
            return fi_cuda_fail("tensor statistics (cuda): size overflows int64", cudaSuccess);
        n *= t->shape[d];
        if (t->shape[d] == 1)
            continue;
        L->shape[L->ndim] = t->shape[d];
        L->stride[L->ndim] = t->stride[d];
        L->ndim++;
    }
    *numel = n;
    return 0;
}

extern "C" int fi_stats_cuda(const fi_tensor *t, void *stream, double out[5])
{
    layout L;
    int64_t numel = 0;
    int rc = make_layout(t, &L, &numel);
    if (rc != 0)
        return rc;
    out[0] = INFINITY;
    out[1] = -INFINITY;
    out[2] = out[3] = out[4] = 0.0;
    if (numel == 0)
        return 0;
    fi_device_guard guard(t->device_index);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("tensor statistics (cuda): cudaSetDevice", guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    int64_t want = (numel + THREADS - 1) / THREADS;
    int blocks = want < MAX_BLOCKS ? (int)want : MAX_BLOCKS;
    partial *scratch = nullptr;
    cudaError_t err =
        cudaMallocAsync((void **)&scratch, (size_t)(blocks + 1) * sizeof(partial), st);
    if (err != cudaSuccess)
        return fi_cuda_fail("tensor statistics (cuda): cudaMallocAsync", err);
    err = launch_partials(t, L, numel, blocks, scratch, st);
    if (err == cudaSuccess) {
        stats_final_kernel<<<1, THREADS, 0, st>>>(scratch, blocks, scratch + blocks);
        err = cudaGetLastError();
    }
    partial result;
    if (err == cudaSuccess)
        err =
            cudaMemcpyAsync(&result, scratch + blocks, sizeof(result), cudaMemcpyDeviceToHost, st);
    cudaError_t free_err = cudaFreeAsync(scratch, st);
    if (err == cudaSuccess)
        err = free_err;
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(st);
    if (err != cudaSuccess)
        return fi_cuda_fail("tensor statistics (cuda)", err);
    out[0] = result.min;
    out[1] = result.max;
    out[2] = result.sum;
    out[3] = (double)result.nan;
    out[4] = (double)result.inf;
    return 0;
}

extern "C" int fi_stats_cuda_deferred(const fi_tensor *t, void *stream, long long id)
{
    layout L;
    int64_t numel = 0;
    int rc = make_layout(t, &L, &numel);
    if (rc != 0)
        return rc;
    fi_device_guard guard(t->device_index);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("tensor statistics (cuda): cudaSetDevice", guard.err);
    stats_print_kernel<<<1, PRINT_THREADS, 0, (cudaStream_t)stream>>>(t->data, t->dtype, L, numel,
                                                                      id);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : fi_cuda_fail("tensor statistics (cuda): kernel launch", err);
}
