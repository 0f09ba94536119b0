"""CUDA timing shared by the GPU benchmarks: CUDA events around a loop, and the measured
device-to-device copy that bandwidth figures are held against."""

import torch


def time_cuda(fn, iters, warmup=3):
    """Seconds per call of fn, by CUDA events around iters calls after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def copy_rate(nbytes=1 << 28, iters=20):
    """Bytes read plus written per second by a device-to-device copy of nbytes."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * nbytes / time_cuda(lambda: b.copy_(a), iters)
