"""Input builders shared by the templates' ``init`` functions.

An ``init`` snippet embedded in a definition carries this whole module in front of the
function, so everything here may import only ``math`` and ``torch``.
"""

import torch


def default_device(device=None):
    """``device``, or ``"cuda"`` when a GPU is present and ``"cpu"`` otherwise."""
    if device is not None:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def page_table(batch_size, pages_per_request, page_size, device):
    """A full paged-KV table: request b owns pages [b*P, (b+1)*P), every page full.

    Returns
    -------
    tuple of torch.Tensor
        ``(indptr [batch_size + 1], indices [batch_size * P], last_page_len [batch_size])``,
        all int32.
    """
    indptr = torch.arange(batch_size + 1, dtype=torch.int32, device=device) * pages_per_request
    indices = torch.arange(batch_size * pages_per_request, dtype=torch.int32, device=device)
    last = torch.full((batch_size,), page_size, dtype=torch.int32, device=device)
    return indptr, indices, last


def split_evenly(total, parts, device):
    """int32 offsets ``[parts + 1]`` cutting ``total`` rows into near-equal parts, ending
    exactly at ``total``."""
    sizes = [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def to_fp8_per_tensor(x, dtype=torch.float8_e4m3fn):
    """``x`` scaled to fill the fp8 range, and the float32 factor that undoes the scaling.

    Returns
    -------
    tuple of torch.Tensor
        ``(x_fp8, dequant_scale)`` with ``x ≈ x_fp8.float() * dequant_scale`` and
        ``dequant_scale`` a 0-d float32 tensor.
    """
    limit = torch.finfo(dtype).max
    amax = x.float().abs().max().clamp(min=1e-12)
    scale = limit / amax
    x_fp8 = (x.float() * scale).clamp(-limit, limit).to(dtype)
    return x_fp8, (1.0 / scale).float()


def nvfp4_global_scale(x):
    """The per-tensor scale NVFP4 quantization expects: ``448 * 6 / amax(x)``, shape [1]."""
    amax = x.float().abs().nan_to_num().max().clamp(min=1e-12)
    return (448.0 * 6.0 / amax).reshape(1).float()
