"""The CPU kernels' internal paths agree with each other and with torch: split decode
merged in key order, fp8 KV read without widening, small-m GEMMs that read B once, and
the vectorized fp4 quantizer against its strided (scalar) twin."""

import pytest
import torch
from attention_reference import TOLERANCE, attention
from test_fp4 import dequantize

import flashinfer
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.fp4_quantization import SfLayout, fp4_quantize


def with_threads(n, fn):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(before)


def test_split_decode_is_bit_identical_for_any_thread_count():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(16, 128, generator=g).half()
    k = torch.randn(5000, 2, 128, generator=g).half()  # long enough to be split
    v = torch.randn(5000, 2, 128, generator=g).half()
    one = with_threads(1, lambda: single_decode_with_kv_cache(q, k, v))
    three = with_threads(3, lambda: single_decode_with_kv_cache(q, k, v))
    assert torch.equal(one.view(torch.uint8), three.view(torch.uint8))
    ref, _ = attention(q[None], k, v)
    torch.testing.assert_close(one.float(), ref[0], **TOLERANCE[torch.float16])


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_fp8_kv_decode_matches_reference_for_each_group_size(fp8, group):
    g = torch.Generator().manual_seed(group)
    q = torch.randn(2 * group, 128, generator=g).half()
    k = (torch.randn(301, 2, 128, generator=g) * 4).to(fp8)
    v = (torch.randn(301, 2, 128, generator=g) * 4).to(fp8)
    out = single_decode_with_kv_cache(q, k, v)
    ref, _ = attention(q[None], k.float(), v.float())
    torch.testing.assert_close(out.float(), ref[0], **TOLERANCE[torch.float16])


def test_e4m3_nan_code_in_v_makes_the_output_nan():
    q = torch.randn(4, 64).half()
    k = torch.randn(40, 4, 64).to(torch.float8_e4m3fn)
    v = torch.randn(40, 4, 64).to(torch.float8_e4m3fn)
    v.view(torch.uint8)[7, 1, 3] = 0x7F  # e4m3fn NaN
    out = single_decode_with_kv_cache(q, k, v).float()
    assert out[1, 3].isnan() and not out[0].isnan().any() and not out[1, :3].isnan().any()


@pytest.mark.parametrize("m", [1, 4, 16, 17])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_bmm_fp8_small_and_tiled_m_match_reference(m, fp8):
    g = torch.Generator().manual_seed(m)
    a = torch.randn(2, m, 200, generator=g).to(fp8)
    b = torch.randn(2, 70, 200, generator=g).to(fp8).transpose(1, 2)
    one = torch.tensor(1.0)
    out = flashinfer.bmm_fp8(a, b, one, one, torch.float16)
    ref = a.float() @ b.float()
    assert (out.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


@pytest.mark.parametrize("m", [1, 5, 16])
def test_mm_fp8_prepared_weight_small_m_matches_reference(m):
    g = torch.Generator().manual_seed(m)
    a = torch.randn(m, 384, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(40, 384, generator=g).to(torch.float8_e4m3fn)
    wp = flashinfer.prepare_low_latency_gemm_weights(w, None)
    out = flashinfer.mm_fp8(a, wp, torch.tensor(1.0), torch.float16)
    ref = a.float() @ w.float().T
    assert (out.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_mm_fp4_small_and_tiled_m_match_dequantized_reference(m):
    g = torch.Generator().manual_seed(m)
    a, w = torch.randn(m, 256, generator=g) * 4, torch.randn(48, 256, generator=g) * 4
    one = torch.tensor(1.0)
    a_q, a_sf = flashinfer.nvfp4_quantize(a, one)
    w_q, w_sf = flashinfer.nvfp4_quantize(w, one)
    out = flashinfer.mm_fp4(a_q, w_q.T, a_sf, w_sf.T, one, torch.float16)
    _, a_lin = flashinfer.nvfp4_quantize(a, one, sfLayout=SfLayout.layout_linear)
    _, w_lin = flashinfer.nvfp4_quantize(w, one, sfLayout=SfLayout.layout_linear)
    ref = dequantize(a_q, a_lin) @ dequantize(w_q, w_lin).T
    assert (out.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sv, ue8m0", [(16, False), (32, True)])
def test_fp4_quantize_contiguous_and_strided_rows_give_the_same_bits(dtype, sv, ue8m0):
    g = torch.Generator().manual_seed(sv)
    x = torch.randn(33, 512, generator=g) * torch.rand(33, 1, generator=g) * 30
    x[3, 5], x[4, :32], x[5, 7], x[6, 9] = float("nan"), 0.0, -0.0, float("inf")
    x = x.to(dtype)
    strided = torch.empty(33, 1024, dtype=dtype)[:, ::2]
    strided.copy_(x)
    gsf = torch.tensor(3.7)
    q1, sf1 = fp4_quantize(x, gsf, sv, ue8m0, False)
    q2, sf2 = fp4_quantize(strided, gsf, sv, ue8m0, False)
    assert torch.equal(q1, q2) and torch.equal(sf1, sf2)
