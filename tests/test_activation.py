"""silu_and_mul and its gelu siblings: act(x[..., :d]) * x[..., d:] in float32, rounded once,
against torch."""

import pytest
import torch
import torch.nn.functional as F

import flashinfer

ACTS = {
    flashinfer.silu_and_mul: F.silu,
    flashinfer.gelu_and_mul: F.gelu,
    flashinfer.gelu_tanh_and_mul: lambda x: F.gelu(x, approximate="tanh"),
}


@pytest.mark.parametrize("fn", list(ACTS), ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_act_and_mul_matches_torch(fn, dtype):
    x = (torch.randn(3, 5, 2 * 96, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    got = fn(x)
    d = x.shape[-1] // 2
    want = (ACTS[fn](x[..., :d].float()) * x[..., d:].float()).to(dtype)
    assert got.shape == (3, 5, 96) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=2e-6 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_silu_and_mul_writes_the_given_out():
    x = torch.randn(4, 32)
    out = torch.empty(4, 16)
    assert flashinfer.silu_and_mul(x, out=out) is out
    torch.testing.assert_close(out, F.silu(x[:, :16]) * x[:, 16:])


def test_odd_last_dimension_is_refused():
    with pytest.raises(ValueError, match="input: the last dimension must be even"):
        flashinfer.silu_and_mul(torch.randn(2, 7))
