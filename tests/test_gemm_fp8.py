"""bmm_fp8 and mm_fp8 on CPU against dequantize-then-matmul in float32.

Tolerance: the kernels accumulate in float32 (order differs from torch's), then round to
bf16/fp16, so outputs match the float32 reference within 1e-2 relative to its max.
"""

import pytest
import torch

from flashinfer.gemm import bmm_fp8, mm_fp8, prepare_low_latency_gemm_weights

FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _fp8(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _close(out, ref):
    err = (out.float() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item(), err


@pytest.mark.parametrize("a_dtype", FP8_KINDS)
@pytest.mark.parametrize("b_dtype", FP8_KINDS)
def test_bmm_fp8_matches_dequantized_matmul(a_dtype, b_dtype):
    A = _fp8((3, 37, 200), a_dtype, 1)
    B = _fp8((3, 45, 200), b_dtype, 2).transpose(1, 2)  # column-major [b, k, n]
    a_scale, b_scale = torch.tensor(0.5), torch.tensor(3.0)
    out = bmm_fp8(A, B, a_scale, b_scale, torch.bfloat16)
    assert out.shape == (3, 37, 45) and out.dtype == torch.bfloat16
    _close(out, (A.float() @ B.float()) * 0.5 * 3.0)


def test_bmm_fp8_row_major_b():
    A = _fp8((2, 20, 64), torch.float8_e4m3fn, 3)
    B = _fp8((2, 64, 300), torch.float8_e4m3fn, 4)
    out = bmm_fp8(A, B, torch.tensor(1.0), torch.tensor(1.0), torch.float16)
    assert out.dtype == torch.float16
    _close(out, A.float() @ B.float())


def test_bmm_fp8_writes_into_out_and_returns_it():
    A = _fp8((1, 130, 260), torch.float8_e4m3fn, 5)
    B = _fp8((1, 270, 260), torch.float8_e4m3fn, 6).transpose(1, 2)
    out = torch.full((1, 130, 270), 7.0, dtype=torch.bfloat16)
    got = bmm_fp8(A, B, torch.tensor(2.0), torch.tensor(0.25), torch.bfloat16, out=out)
    assert got is out
    _close(out, (A.float() @ B.float()) * 0.5)


def test_bmm_fp8_empty_out_view_is_contiguous_as_torch_says():
    A = torch.zeros(2, 0, 32, dtype=torch.float8_e4m3fn)
    B = torch.zeros(2, 8, 32, dtype=torch.float8_e4m3fn).transpose(1, 2)
    out = torch.empty(2, 8, 0, dtype=torch.bfloat16).transpose(1, 2)  # strides (8, 1, 1)
    assert out.is_contiguous()
    assert bmm_fp8(A, B, torch.tensor(1.0), torch.tensor(1.0), torch.bfloat16, out=out) is out


def test_bmm_fp8_same_result_for_every_backend_name():
    A = _fp8((1, 8, 32), torch.float8_e4m3fn, 7)
    B = _fp8((1, 16, 32), torch.float8_e4m3fn, 8).transpose(1, 2)
    one = torch.tensor(1.0)
    outs = [
        bmm_fp8(A, B, one, one, torch.bfloat16, backend=b)
        for b in ("cublas", "cublaslt", "cutlass", "cudnn", "auto")
    ]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_bmm_fp8_small_integers_are_exact():
    A = torch.randint(-4, 5, (2, 9, 48)).float().to(torch.float8_e4m3fn)
    B = torch.randint(-4, 5, (2, 48, 11)).float().to(torch.float8_e4m3fn)
    out = bmm_fp8(A, B, torch.tensor(1.0), torch.tensor(1.0), torch.bfloat16)
    assert torch.equal(out.float(), A.float() @ B.float())


def test_prepare_low_latency_gemm_weights_block_layout():
    w = _fp8((5, 256), torch.float8_e4m3fn, 9)
    p = prepare_low_latency_gemm_weights(w)
    assert p.shape == (2, 5, 128)
    assert torch.equal(p[1, 3].view(torch.uint8), w[3, 128:].view(torch.uint8))


def test_mm_fp8_with_prepared_weights():
    a = _fp8((17, 384), torch.float8_e4m3fn, 10)
    w = _fp8((40, 384), torch.float8_e4m3fn, 11)
    alpha = torch.tensor([0.125])
    out = mm_fp8(a, prepare_low_latency_gemm_weights(w), alpha)
    assert out.shape == (17, 40) and out.dtype == torch.bfloat16
    _close(out, (a.float() @ w.float().T) * 0.125)


def test_mm_fp8_alpha_none_is_one_and_out_filled():
    a = _fp8((4, 128), torch.float8_e4m3fn, 12)
    w = _fp8((8, 128), torch.float8_e4m3fn, 13)
    out = torch.empty(4, 8, dtype=torch.float16)
    got = mm_fp8(a, prepare_low_latency_gemm_weights(w), None, torch.float16, out=out)
    assert got is out
    _close(out, a.float() @ w.float().T)
