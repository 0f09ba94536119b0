"""single_decode_with_kv_cache against a float32 torch reference."""

import math

import pytest
import torch
from attention_reference import TOLERANCE, attention

from flashinfer.decode import single_decode_with_kv_cache


def make(kv_len, num_qo_heads, num_kv_heads, head_dim, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_qo_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(kv_len, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(kv_len, num_kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v


def check(out, ref, dtype=torch.float16):
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[dtype])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_decode_matches_reference(head_dim, group, kv_layout):
    kv_len = {64: 1, 128: 77, 256: 300}[head_dim]
    q, k, v = make(kv_len, 2 * group, 2, head_dim, seed=head_dim + group)
    if kv_layout == "HND":
        out = single_decode_with_kv_cache(
            q, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(), kv_layout="HND"
        )
    else:
        out = single_decode_with_kv_cache(q, k, v)
    ref, _ = attention(q[None], k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    check(out, ref[0])


def test_decode_long_kv_4096_gqa_8():
    q, k, v = make(4096, 32, 4, 128, seed=1)
    ref, _ = attention(q[None], k, v)
    check(single_decode_with_kv_cache(q, k, v), ref[0])


def test_decode_bfloat16():
    q, k, v = make(129, 8, 2, 128, torch.bfloat16)
    ref, _ = attention(q[None], k, v)
    out = single_decode_with_kv_cache(q, k, v)
    assert out.dtype == torch.bfloat16
    check(out, ref[0], torch.bfloat16)


def test_decode_float32_is_close_to_exact():
    q, k, v = make(50, 4, 4, 64, torch.float32)
    ref, _ = attention(q[None], k, v)
    check(single_decode_with_kv_cache(q, k, v), ref[0], torch.float32)


def test_decode_return_lse_is_base_2_log_sum_exp():
    q, k, v = make(200, 8, 2, 64)
    out, lse = single_decode_with_kv_cache(q, k, v, return_lse=True)
    ref, ref_lse = attention(q[None], k, v)
    assert lse.shape == (8,) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, ref_lse[0], atol=1e-4, rtol=1e-5)
    check(out, ref[0])


def test_decode_lse_of_one_key_is_its_scaled_logit_in_bits():
    q, k, v = make(1, 4, 4, 64, torch.float32)
    _, lse = single_decode_with_kv_cache(q, k, v, return_lse=True)
    logit = (q * k[0]).sum(-1) / 8.0
    torch.testing.assert_close(lse, logit / math.log(2), atol=1e-5, rtol=1e-5)


def test_decode_sm_scale_overrides_default():
    q, k, v = make(64, 4, 1, 64)
    ref, _ = attention(q[None], k, v, sm_scale=0.3)
    check(single_decode_with_kv_cache(q, k, v, sm_scale=0.3), ref[0])


def test_decode_logits_soft_cap():
    q, k, v = make(100, 8, 2, 128)
    q = q * 4
    ref, ref_lse = attention(q[None], k, v, soft_cap=5.0)
    out, lse = single_decode_with_kv_cache(q, k, v, logits_soft_cap=5.0, return_lse=True)
    check(out, ref[0])
    torch.testing.assert_close(lse, ref_lse[0], atol=1e-4, rtol=1e-5)


def test_decode_window_left_keeps_last_keys_only():
    q, k, v = make(100, 4, 2, 64)
    ref, _ = attention(q[None], k, v, window_left=9)
    check(single_decode_with_kv_cache(q, k, v, window_left=9), ref[0])
    ref_tail, _ = attention(q[None], k[-10:], v[-10:])
    check(single_decode_with_kv_cache(q, k, v, window_left=9), ref_tail[0])


def test_decode_rope_llama():
    q, k, v = make(300, 8, 2, 128)
    ref, _ = attention(q[None], k, v, rope=True, rope_scale=2.0, rope_theta=5e4)
    out = single_decode_with_kv_cache(
        q, k, v, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e4
    )
    check(out, ref[0])


def test_decode_rope_changes_the_result():
    q, k, v = make(30, 4, 4, 64)
    plain = single_decode_with_kv_cache(q, k, v)
    roped = single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    assert (plain.float() - roped.float()).abs().max() > 1e-2


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_decode_fp8_kv_with_scales(fp8):
    q, k, v = make(150, 8, 2, 128)
    k8, v8 = (k.float() * 4).to(fp8), (v.float() * 2).to(fp8)
    out = single_decode_with_kv_cache(q, k8, v8, k_scale=0.25, v_scale=0.5)
    ref, _ = attention(q[None], k8.float() * 0.25, v8.float() * 0.5)
    check(out, ref[0])


def test_decode_q_scale_and_tensor_k_scale_multiply_sm_scale():
    q, k, v = make(40, 4, 4, 64)
    out = single_decode_with_kv_cache(q, k, v, q_scale=2.0, k_scale=torch.tensor(0.5))
    ref, _ = attention(q[None], k, v)
    check(out, ref[0])
    out2 = single_decode_with_kv_cache(q, k, v, q_scale=2.0)
    ref2, _ = attention(q[None], k, v, sm_scale=2.0 / 8.0)
    check(out2, ref2[0])


def test_decode_empty_kv_gives_zeros_and_minus_inf_lse():
    q, k, v = make(0, 4, 2, 64)
    out, lse = single_decode_with_kv_cache(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros_like(q))
    assert torch.equal(lse, torch.full((4,), float("-inf")))


def test_decode_non_contiguous_q_and_kv_views():
    q, k, v = make(64, 8, 2, 64)
    big = torch.randn(64, 2, 2, 64).to(torch.float16)
    big[:, 0], big[:, 1] = k, v
    qq = torch.stack([q, q], dim=1)[:, 1]
    out = single_decode_with_kv_cache(qq, big[:, 0], big[:, 1])
    ref, _ = attention(q[None], k, v)
    check(out, ref[0])
