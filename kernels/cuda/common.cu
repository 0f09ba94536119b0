/* common.cu: error reporting and small host helpers for the CUDA kernels: the last
 * error's text per thread, device-to-host copies and the stream-capture query. */
#include <stdio.h>

#include "common.cuh"

/* errno-like: each host thread sees the text of its own last failure. */
static thread_local char last_error[256] = "no error";

int fi_cuda_fail(const char *what, cudaError_t err)
{
    if (err == cudaSuccess) {
        snprintf(last_error, sizeof(last_error), "%s", what);
        return 1;
    }
    cudaGetLastError(); /* clear a sticky launch error so later calls start clean */
    snprintf(last_error, sizeof(last_error), "%s: %s (%s)", what, cudaGetErrorName(err),
             cudaGetErrorString(err));
    return (int)err;
}

extern "C" const char *fi_cuda_last_error(void) { return last_error; }

extern "C" int fi_cuda_stream_capturing(int device, void *stream, int *capturing)
{
    fi_device_guard guard(device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing((cudaStream_t)stream, &status);
    if (err != cudaSuccess)
        return fi_cuda_fail("cudaStreamIsCapturing", err);
    *capturing = status != cudaStreamCaptureStatusNone;
    return 0;
}

extern "C" int fi_cuda_copy_to_host(void *dst, const void *src, size_t bytes, int device,
                                    void *stream)
{
    if (bytes == 0)
        return 0;
    fi_device_guard guard(device);
    if (guard.err != cudaSuccess)
        return fi_cuda_fail("cudaSetDevice", guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st);
    if (err != cudaSuccess)
        return fi_cuda_fail("cudaMemcpyAsync (device to host)", err);
    err = cudaStreamSynchronize(st);
    if (err != cudaSuccess)
        return fi_cuda_fail("cudaStreamSynchronize", err);
    return 0;
}
