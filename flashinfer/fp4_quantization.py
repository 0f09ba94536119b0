"""FP4 quantization: NVFP4 (E2M1 values, one E4M3 scale per 16) and MXFP4 (one UE8M0
scale per 32), computed by the C kernels in ``flashinfer._kernels``.

Rule, all in float32: ``sf = e4m3((global_sf * amax(block)) / 6)`` (round to nearest
even, saturating at 448), then each element's code is ``e2m1(x * (global_sf / float(sf)))``
with ties to the even code, saturating at 6; a block whose scale is 0 gets all-zero codes.
MXFP4 (``sf_use_ue8m0=True``): ``sf`` is the smallest power of two >= ``global_sf * amax
/ 6`` (UE8M0 code, round toward +inf, at most 2^127; 0 for an all-zero block).
"""

import enum

import torch

from . import _kernels
from .api_logging import flashinfer_api

_BACKENDS = ("cuda", "cute-dsl")


class SfLayout(enum.IntEnum):
    """Layout of the block scale factors (values are FlashInfer's)."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


def _sf_bytes(rows, cols, layout):
    cols_padded = (cols + 3) // 4 * 4
    if layout == SfLayout.layout_128x4:
        return (rows + 127) // 128 * 128 * cols_padded
    if layout == SfLayout.layout_8x4:
        return (rows + 7) // 8 * 8 * cols_padded
    return rows * cols


def _quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, layout, inversed):
    """Quantize along the last dimension of ``input``; returns (x_q, sf) with sf shaped
    ``(-1, k // sf_vec_size)`` as FlashInfer reshapes it (2-D padded rows x padded
    blocks when that reshape is impossible)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() < 2:
        raise ValueError(f"input: expected at least 2 dimensions [m, k], got {input.dim()}")
    if sf_vec_size not in (16, 32):
        raise NotImplementedError(
            f"sf_vec_size: {sf_vec_size!r} is not supported; expected 16 (NVFP4) or 32 (MXFP4)"
        )
    k = input.shape[-1]
    x2 = input.reshape(-1, k)
    m = x2.shape[0]
    x_q = torch.empty((m, k // 2), dtype=torch.uint8, device=input.device)
    kblocks = k // sf_vec_size if k % sf_vec_size == 0 else 0
    sf = torch.empty(_sf_bytes(m, kblocks, layout), dtype=torch.uint8, device=input.device)
    _kernels.fp4_quantize(
        x2,
        global_scale,
        x_q,
        sf,
        sf_vec_size,
        bool(sf_use_ue8m0),
        int(layout),
        bool(inversed),
        max(1, torch.get_num_threads()),
        torch.cuda.current_stream(input.device).cuda_stream if input.is_cuda else 0,
    )
    x_q = x_q.reshape(*input.shape[:-1], k // 2)
    if kblocks and sf.numel() % kblocks == 0:
        sf = sf.reshape(-1, kblocks)
    elif layout != SfLayout.layout_linear:
        sf = sf.reshape(-1, (kblocks + 3) // 4 * 4)
    return x_q, sf


@flashinfer_api
def fp4_quantize(
    input,
    global_scale=None,
    sf_vec_size=16,
    sf_use_ue8m0=False,
    is_sf_swizzled_layout=True,
    is_sf_8x4_layout=False,
    is_global_scale_inversed=False,
    enable_pdl=None,
    backend="cuda",
):
    """Quantize ``input`` to packed FP4 with block scale factors.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., m, k]`` float16, bfloat16 or float32; ``k`` a multiple of ``sf_vec_size``.
        A column-major 2-D input is quantized along its contiguous dimension (FlashInfer's
        rule) and the results are returned transposed.
    global_scale : torch.Tensor, optional
        One float32 value multiplying the data before quantization; 1 if None.
    sf_vec_size : int, optional
        Elements per scale: 16 (NVFP4) or 32 (MXFP4).
    sf_use_ue8m0 : bool, optional
        UE8M0 (power of two) scales instead of E4M3.
    is_sf_swizzled_layout : bool, optional
        Swizzled scales (128x4, or 8x4 with ``is_sf_8x4_layout``) instead of linear.
    is_sf_8x4_layout : bool, optional
        With ``is_sf_swizzled_layout``: the 8x4 swizzle.
    is_global_scale_inversed : bool, optional
        ``global_scale`` holds ``1 / global_sf``.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).
    backend : str, optional
        ``"cuda"`` (FlashInfer's name): the kernel of the input's device runs (CPU, or
        CUDA on the device's current stream, bit-identical results).

    Returns
    -------
    tuple of torch.Tensor
        ``(x_q, sf)``: uint8 ``[..., m, k // 2]`` (element ``2j`` in the low nibble of byte
        ``j``) and the uint8 scale bytes shaped ``(-1, k // sf_vec_size)``.
    """
    return _fp4_quantize(
        input,
        global_scale,
        sf_vec_size,
        sf_use_ue8m0,
        is_sf_swizzled_layout,
        is_sf_8x4_layout,
        is_global_scale_inversed,
        backend,
    )


def _fp4_quantize(
    input,
    global_scale,
    sf_vec_size,
    sf_use_ue8m0,
    is_sf_swizzled_layout,
    is_sf_8x4_layout,
    is_global_scale_inversed,
    backend,
):
    """fp4_quantize without the API decorator (nvfp4_quantize calls it too)."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend: {backend!r} is not accepted; expected one of {list(_BACKENDS)}")
    if not is_sf_swizzled_layout:
        layout = SfLayout.layout_linear
    elif is_sf_8x4_layout:
        layout = SfLayout.layout_8x4
    else:
        layout = SfLayout.layout_128x4
    column_major = isinstance(input, torch.Tensor) and input.dim() >= 2 and input.stride(-2) == 1
    if column_major:
        input = input.transpose(-2, -1)
    x_q, sf = _quantize(
        input, global_scale, sf_vec_size, sf_use_ue8m0, layout, is_global_scale_inversed
    )
    if column_major:
        x_q = x_q.transpose(-2, -1)
        sf = sf.transpose(-2, -1)
    return x_q, sf


@flashinfer_api
def nvfp4_quantize(
    a,
    a_global_sf,
    sfLayout=SfLayout.layout_128x4,
    do_shuffle=False,
    sf_vec_size=16,
    enable_pdl=None,
    backend="cuda",
):
    """Quantize ``a`` to NVFP4: E2M1 values with one E4M3 scale per ``sf_vec_size``.

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k]`` float16, bfloat16 or float32, ``k`` a multiple of 16.
    a_global_sf : torch.Tensor
        One float32 value, typically ``448 * 6 / amax(a)``.
    sfLayout : SfLayout, optional
        Scale layout: ``layout_128x4`` (default), ``layout_8x4`` or ``layout_linear``.
    do_shuffle : bool, optional
        TRT-LLM weight shuffling; not supported (raises NotImplementedError).
    sf_vec_size : int, optional
        16.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).
    backend : str, optional
        ``"cuda"``.

    Returns
    -------
    tuple of torch.Tensor
        ``(a_fp4, a_sf)``: uint8 ``[m, k // 2]`` and uint8 scales ``(-1, k // 16)``.
    """
    if do_shuffle:
        raise NotImplementedError(
            "do_shuffle=True (TRT-LLM weight shuffling) is not supported; use do_shuffle=False"
        )
    try:
        layout = SfLayout(sfLayout)
    except ValueError:
        raise ValueError(
            f"sfLayout: {sfLayout!r} is not a layout; expected one of {[x.name for x in SfLayout]}"
        ) from None
    return _fp4_quantize(
        a,
        a_global_sf,
        sf_vec_size,
        False,
        layout != SfLayout.layout_linear,
        layout == SfLayout.layout_8x4,
        False,
        backend,
    )
