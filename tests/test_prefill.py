"""single_prefill_with_kv_cache against a float32 torch reference."""

import pytest
import torch
from attention_reference import TOLERANCE, attention

from flashinfer.prefill import single_prefill_with_kv_cache


def make(qo_len, kv_len, num_qo_heads, num_kv_heads, head_dim, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(qo_len, num_qo_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(kv_len, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(kv_len, num_kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v


def check(out, ref, dtype=torch.float16):
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[dtype])


def packbits_little(mask):
    bits = mask.reshape(-1).to(torch.int32)
    bits = torch.cat([bits, bits.new_zeros((-bits.numel()) % 8)])
    return (bits.view(-1, 8) << torch.arange(8)).sum(1).to(torch.uint8)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_matches_reference(head_dim, group, causal):
    qo_len, kv_len = {64: (1, 1), 128: (33, 90), 256: (20, 20)}[head_dim]
    q, k, v = make(qo_len, kv_len, 2 * group, 2, head_dim, seed=head_dim * group)
    ref, _ = attention(q, k, v, causal=causal)
    out = single_prefill_with_kv_cache(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    check(out, ref)


def test_prefill_hnd_layout():
    q, k, v = make(17, 40, 8, 2, 128)
    out = single_prefill_with_kv_cache(
        q,
        k.transpose(0, 1).contiguous(),
        v.transpose(0, 1).contiguous(),
        causal=True,
        kv_layout="HND",
    )
    ref, _ = attention(q, k, v, causal=True)
    check(out, ref)


def test_prefill_causal_is_bottom_right_aligned():
    q, k, v = make(4, 10, 4, 4, 64, torch.float32)
    out = single_prefill_with_kv_cache(q, k, v, causal=True)
    for i in range(4):
        row, _ = attention(q[i : i + 1], k[: i + 7], v[: i + 7])
        check(out[i : i + 1], row, torch.float32)


def test_prefill_rows_that_see_no_key_get_zeros_and_minus_inf_lse():
    q, k, v = make(6, 4, 4, 2, 64)
    out, lse = single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.equal(lse[:2], torch.full((2, 4), float("-inf")))
    ref, ref_lse = attention(q, k, v, causal=True)
    check(out, ref)
    torch.testing.assert_close(lse[2:], ref_lse[2:], atol=1e-4, rtol=1e-5)


def test_prefill_long_causal_1024():
    q, k, v = make(64, 1024, 8, 1, 128, seed=3)
    ref, _ = attention(q, k, v, causal=True)
    check(single_prefill_with_kv_cache(q, k, v, causal=True), ref)


def test_prefill_custom_mask():
    q, k, v = make(12, 30, 4, 2, 64)
    mask = torch.rand(12, 30, generator=torch.Generator().manual_seed(1)) > 0.4
    ref, ref_lse = attention(q, k, v, mask=mask)
    out, lse = single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True)
    check(out, ref)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)


def test_prefill_custom_mask_overrides_causal():
    q, k, v = make(8, 8, 4, 4, 64)
    mask = torch.ones(8, 8, dtype=torch.bool)
    out = single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True)
    ref, _ = attention(q, k, v)
    check(out, ref)


def test_prefill_packed_custom_mask_equals_bool_mask():
    q, k, v = make(13, 21, 8, 2, 128)
    mask = torch.rand(13, 21, generator=torch.Generator().manual_seed(2)) > 0.5
    a = single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    b = single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packbits_little(mask))
    assert torch.equal(a, b)
    ref, _ = attention(q, k, v, mask=mask)
    check(b, ref)


def test_prefill_logits_soft_cap():
    q, k, v = make(9, 50, 4, 2, 64)
    ref, _ = attention(q * 3, k, v, soft_cap=10.0, causal=True)
    check(single_prefill_with_kv_cache(q * 3, k, v, logits_soft_cap=10.0, causal=True), ref)


def test_prefill_window_left_with_causal():
    q, k, v = make(16, 64, 4, 4, 64)
    ref, _ = attention(q, k, v, causal=True, window_left=5)
    check(single_prefill_with_kv_cache(q, k, v, causal=True, window_left=5), ref)


def test_prefill_rope_llama_positions_follow_kv_len():
    q, k, v = make(10, 50, 8, 2, 128)
    ref, _ = attention(q, k, v, causal=True, rope=True)
    out = single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA")
    check(out, ref)


def test_prefill_return_lse_is_base_2():
    q, k, v = make(7, 33, 4, 1, 256, torch.bfloat16)
    out, lse = single_prefill_with_kv_cache(q, k, v, return_lse=True)
    ref, ref_lse = attention(q, k, v)
    assert lse.shape == (7, 4) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    check(out, ref, torch.bfloat16)


def test_prefill_fp8_kv_with_scales_and_o_dtype():
    q, k, v = make(5, 40, 4, 2, 64)
    k8, v8 = (k.float() * 8).to(torch.float8_e4m3fn), (v.float() * 8).to(torch.float8_e4m3fn)
    out = single_prefill_with_kv_cache(
        q, k8, v8, scale_k=0.125, scale_v=0.125, o_dtype=torch.float32
    )
    ref, _ = attention(q, k8.float() * 0.125, v8.float() * 0.125)
    assert out.dtype == torch.float32
    check(out, ref)
