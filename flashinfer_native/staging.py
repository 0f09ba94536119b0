"""Device-to-host copies for the in-memory flight recorder ring.

The ring copies a call's tensors when the call is recorded (callers reuse their buffers).
CUDA tensors are copied into pinned host memory on a side stream of their device that
first waits for the stream producing them, and only those copies are waited for: never a
device-wide synchronize, and the producing stream is not blocked. The C core
(``csrc/core/record_memory_ring.c``) calls :func:`to_host` for a ring call holding a CUDA
tensor.
"""

import torch

__all__ = ["streams", "to_host"]

_side_streams = {}  # torch.device -> torch.cuda.Stream


def _side_stream(device):
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream(device)
    return stream


def to_host(tensors):
    """``tensors`` (key -> tensor) with every CUDA tensor replaced by a host copy.

    Each copy has the tensor's layout where that is dense (``torch.empty_like``), lives in
    pinned memory, and is complete when this returns. CPU tensors are passed through.
    """
    out = dict(tensors)
    by_device = {}
    for key, t in tensors.items():
        if t.is_cuda:
            by_device.setdefault(t.device, []).append(key)
    done = []
    for device, keys in by_device.items():
        side = _side_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for key in keys:
                t = tensors[key]
                host = torch.empty_like(t, device="cpu", pin_memory=True)
                host.copy_(t, non_blocking=True)
                t.record_stream(side)  # the caller may free t before the copy ran
                out[key] = host
        done.append(side.record_event())
    for event in done:
        event.synchronize()
    return out


def streams(index):
    """The current stream of ``cuda:index`` and the side stream :func:`to_host` copies on, as
    the integer handles ``cudaStream_t`` takes: the compact capture hashes a CUDA tensor's
    chunks and copies the new ones on the side stream, ordered after the current one
    (``csrc/core/device_chunks.c``)."""
    device = torch.device("cuda", index)
    return torch.cuda.current_stream(device).cuda_stream, _side_stream(device).cuda_stream
