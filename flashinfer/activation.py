"""Gated activations: ``act(x[..., :d]) * x[..., d:]``, computed by the C kernel
(``flashinfer._kernels.act_and_mul``) in float32 and rounded once to the input's dtype."""

import torch

from . import _kernels
from .api_logging import flashinfer_api


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
