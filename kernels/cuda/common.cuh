/* common.cuh: helpers shared by the CUDA kernels: the per-thread error text behind
 * fi_cuda_last_error and a guard that switches the current device for one call. */
#ifndef FI_CUDA_COMMON_CUH
#define FI_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "flashinfer_kernels.h"

/* Records "what: CUDA error name (text)" for fi_cuda_last_error; returns nonzero (the
 * CUDA error code, or 1 when err is cudaSuccess, as for a failed precondition). */
int fi_cuda_fail(const char *what, cudaError_t err);

/* Sets the current device for a scope and restores the previous one. */
struct fi_device_guard {
    int prev;
    bool switched;
    cudaError_t err;
    explicit fi_device_guard(int device) : prev(0), switched(false), err(cudaSuccess)
    {
        err = cudaGetDevice(&prev);
        if (err == cudaSuccess && prev != device) {
            err = cudaSetDevice(device);
            switched = err == cudaSuccess;
        }
    }
    ~fi_device_guard()
    {
        if (switched)
            cudaSetDevice(prev);
    }
    fi_device_guard(const fi_device_guard &) = delete;
    fi_device_guard &operator=(const fi_device_guard &) = delete;
};

#endif
