"""Record, under the real FlashInfer, calls of APIs the flashinfer-c mirror implements.

No GPU here, so FlashInfer's kernels cannot produce the outputs. Each call goes through
FlashInfer's own ``api_logging.flashinfer_api`` (the native core) applied to a stand-in
that carries the real API's identity (module, name, signature: ``functools.wraps`` of
FlashInfer's undecorated function) and computes the result with a few lines of torch.
The dumps are what a GPU run records, except that the outputs come from the torch
reference, not FlashInfer's kernel. ``rmsnorm`` (which the mirror lacks) is called for
real and records its CUDA-less failure.
"""

import functools

import torch

import flashinfer
import flashinfer.decode
from flashinfer.api_logging import flashinfer_api
from flashinfer.gemm import gemm_base


def stand_in(api, compute):
    """``compute`` under ``api``'s identity, decorated by FlashInfer's flashinfer_api."""
    original = api
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    return flashinfer_api(functools.wraps(original)(compute))


def single_decode_reference(q, k, v, *args, **kwargs):
    heads, head_dim = q.shape
    group = heads // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,lhd->hl", q.float(), keys) / head_dim**0.5
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), values).to(q.dtype)


def bmm_fp8_reference(A, B, A_scale, B_scale, dtype, out=None, backend="cublas"):
    return (torch.bmm(A.float(), B.float()) * A_scale * B_scale).to(dtype)


torch.manual_seed(0)
decode = stand_in(flashinfer.decode.single_decode_with_kv_cache, single_decode_reference)
q = torch.randn(8, 64, dtype=torch.float16)
k = torch.randn(32, 2, 64, dtype=torch.float16)
v = torch.randn(32, 2, 64, dtype=torch.float16)
decode(q, k, v)

bmm = stand_in(gemm_base.bmm_fp8, bmm_fp8_reference)
a = torch.randint(-4, 5, (2, 8, 32)).to(torch.float8_e4m3fn)
b = torch.randint(-4, 5, (2, 16, 32)).to(torch.float8_e4m3fn).transpose(1, 2)
bmm(a, b, torch.tensor(0.5), torch.tensor(1.0), torch.bfloat16)

try:
    flashinfer.norm.rmsnorm(torch.randn(4, 64), torch.ones(64))
except AssertionError:
    pass
print("{}")
