"""Gated activations: ``act(x[..., :d]) * x[..., d:]``, computed by the C kernel
(``flashinfer._kernels.act_and_mul``) in float32 and rounded once to the input's dtype."""

import torch

from . import _kernels
from ._nvfp4_recipe import _UNSET
from .api_logging import flashinfer_api
from .fp4_quantization import _grouped_quantize, _recipe


def _act_and_mul(act, input, out):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if out is None:
        out = torch.empty(input.shape[:-1] + (input.shape[-1] // 2,), dtype=input.dtype)
    _kernels.act_and_mul(input, out, act)
    return out


@flashinfer_api
def silu_and_mul(input, out=None, enable_pdl=None):
    """``silu(input[..., :d]) * input[..., d:]``.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., 2 * d]`` float16, bfloat16 or float32 (CPU).
    out : torch.Tensor, optional
        ``[..., d]`` of input's dtype, written in place.
    enable_pdl : bool, optional
        Accepted for compatibility.

    Returns
    -------
    torch.Tensor
        ``[..., d]``.
    """
    return _act_and_mul("silu", input, out)


@flashinfer_api
def gelu_and_mul(input, out=None, enable_pdl=None):
    """``gelu(input[..., :d]) * input[..., d:]`` (erf GELU); as :func:`silu_and_mul`."""
    return _act_and_mul("gelu", input, out)


@flashinfer_api
def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    """``gelu_tanh(input[..., :d]) * input[..., d:]``; as :func:`silu_and_mul`."""
    return _act_and_mul("gelu_tanh", input, out)


@flashinfer_api
def silu_and_mul_scaled_nvfp4_experts_quantize(a, mask, a_global_sf, nvfp4_4over6=_UNSET):
    """:func:`silu_and_mul` of each expert's rows, then NVFP4 for the masked grouped GEMM.

    Parameters
    ----------
    a : torch.Tensor
        ``[b, m, 2 * k]`` float16, bfloat16 or float32 (one matrix per expert); ``k`` a
        multiple of 16. The activation is rounded to ``a``'s dtype before quantization.
    mask, a_global_sf, nvfp4_4over6
        As in :func:`flashinfer.scaled_fp4_grouped_quantize`: expert ``i``'s first
        ``mask[i]`` rows, with the global scale ``a_global_sf[i]``.

    Returns
    -------
    tuple of torch.Tensor
        As :func:`flashinfer.scaled_fp4_grouped_quantize`, for ``[b, m, k]``.
    """
    return _grouped_quantize(a, mask, a_global_sf, _recipe(nvfp4_4over6, False), silu=True)
