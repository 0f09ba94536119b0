"""Bad attention arguments raise TypeError (not a tensor) or ValueError (a wrong value)
naming the argument, before any kernel runs."""

import pytest
import torch

from flashinfer import _kernels
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from flashinfer.prefill import (
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

WORKSPACE = torch.empty(16, dtype=torch.int8)
F16 = torch.float16


def qkv(qo_heads=4, kv_heads=2, head_dim=64, kv_len=8, kv_dtype=F16):
    return (
        torch.randn(qo_heads, head_dim).to(F16),
        torch.randn(kv_len, kv_heads, head_dim).to(kv_dtype),
        torch.randn(kv_len, kv_heads, head_dim).to(kv_dtype),
    )


def planned_decode(page_size=4, pages=3, batch=2):
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1, 2][: batch + 1], dtype=torch.int32)
    w.plan(indptr, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([4, 2]), 4, 2, 64, 4)
    cache = torch.randn(pages, 2, page_size, 2, 64).to(F16)
    return w, cache


def raw_call(**over):
    """_kernels.attention on a valid ragged problem with some arguments replaced."""
    args = dict(
        q=torch.randn(3, 4, 64).to(F16),
        k=torch.randn(10, 2, 64).to(F16),
        v=torch.randn(10, 2, 64).to(F16),
        out=torch.empty(3, 4, 64, dtype=F16),
        lse=None,
        qo_indptr=torch.tensor([0, 1, 3], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 4, 10], dtype=torch.int32),
    )
    args.update(over)
    _kernels.attention(**args)


def test_valid_raw_call_runs():
    raw_call()


def test_raw_call_with_a_list_for_a_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="kv_indptr: expected a torch.Tensor, got list"):
        raw_call(kv_indptr=[0, 4, 10])


def test_single_decode_with_a_list_for_k_is_a_type_error():
    q, _, v = qkv()
    with pytest.raises(TypeError, match="k: expected a torch.Tensor, got list"):
        single_decode_with_kv_cache(q, [0.0], v)


def test_plan_with_a_list_for_indptr_is_a_type_error():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.raises(TypeError, match="indptr: expected a torch.Tensor, got list"):
        w.plan([0, 1], torch.tensor([0]), torch.tensor([1]), 4, 2, 64, 4)


def test_run_with_a_dict_for_paged_kv_cache_is_a_type_error():
    w, _ = planned_decode()
    with pytest.raises(TypeError, match="paged_kv_cache: dict is not supported"):
        w.run(torch.randn(2, 4, 64).to(F16), {})


def test_run_with_three_caches_is_a_value_error():
    w, cache = planned_decode()
    with pytest.raises(ValueError, match=r"paged_kv_cache: 3 items; accepted: a \(k_cache"):
        w.run(torch.randn(2, 4, 64).to(F16), (cache[:, 0], cache[:, 1], cache[:, 1]))


def test_custom_mask_as_a_list_is_a_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="custom_mask: expected a torch.Tensor, got list"):
        single_prefill_with_kv_cache(q.unsqueeze(0), k, v, custom_mask=[[True] * 8])


def test_mismatched_head_counts():
    q, k, v = qkv(qo_heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads.*4.*num_qo_heads is 6"):
        single_decode_with_kv_cache(q, k, v)


def test_head_dim_96_is_refused_with_accepted_values():
    q, k, v = qkv(head_dim=96)
    with pytest.raises(
        ValueError, match="head_dim 96 is not supported; accepted: 64, 128, 256, 512"
    ):
        single_decode_with_kv_cache(q, k, v)


def test_kv_head_dim_differs_from_q():
    q, _, _ = qkv()
    _, k, v = qkv(head_dim=128)
    with pytest.raises(ValueError, match="k: head_dim"):
        single_decode_with_kv_cache(q, k, v)


def test_float16_q_with_bfloat16_kv_is_refused():
    q, k, v = qkv(kv_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k: dtype bfloat16 is not supported with q of dtype"):
        single_decode_with_kv_cache(q, k, v)


def test_integer_q_is_refused():
    _, k, v = qkv()
    with pytest.raises(ValueError, match="q: dtype int32 is not supported"):
        single_decode_with_kv_cache(torch.zeros(4, 64, dtype=torch.int32), k, v)


def test_k_and_v_dtypes_must_match():
    q, k, _ = qkv()
    _, _, v = qkv(kv_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k is float16 but v is float8_e4m3fn"):
        single_decode_with_kv_cache(q, k, v)


def test_bad_kv_layout():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="kv_layout: 'NDH' is not supported"):
        single_decode_with_kv_cache(q, k, v, kv_layout="NDH")


def test_bad_pos_encoding_mode():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="pos_encoding_mode: 'XPOS' is not supported"):
        single_decode_with_kv_cache(q, k, v, pos_encoding_mode="XPOS")


def test_q_with_wrong_ndim():
    _, k, v = qkv()
    with pytest.raises(ValueError, match="q: expected 2 dimensions"):
        single_decode_with_kv_cache(torch.randn(1, 4, 64).to(F16), k, v)


def test_tensor_on_another_device_is_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k is on meta; this build runs attention on cpu"):
        single_decode_with_kv_cache(q, k.to("meta"), v)


def test_custom_mask_wrong_shape():
    q, k, v = torch.randn(3, 4, 64).to(F16), *qkv()[1:]
    with pytest.raises(ValueError, match=r"custom_mask: shape \(3, 7\) is not \[qo_len, kv_len\]"):
        single_prefill_with_kv_cache(q, k, v, custom_mask=torch.ones(3, 7, dtype=torch.bool))


def test_packed_custom_mask_too_short():
    q, k, v = torch.randn(3, 4, 64).to(F16), *qkv()[1:]
    with pytest.raises(ValueError, match="packed_custom_mask: 2 bytes; accepted: at least 3"):
        single_prefill_with_kv_cache(q, k, v, packed_custom_mask=torch.zeros(2, dtype=torch.uint8))


def test_non_monotone_indptr():
    with pytest.raises(ValueError, match=r"kv_indptr is not monotone: kv_indptr\[2\] = 3"):
        raw_call(kv_indptr=torch.tensor([0, 4, 3], dtype=torch.int32))


def test_indptr_past_the_tensor():
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] is 11 but the number of kv tokens"):
        raw_call(kv_indptr=torch.tensor([0, 4, 11], dtype=torch.int32))


def test_qo_indptr_must_cover_q():
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\] is 5 but the number of query rows"):
        raw_call(qo_indptr=torch.tensor([0, 1, 5], dtype=torch.int32))


def test_indptr_must_be_int32():
    with pytest.raises(
        ValueError, match="kv_indptr: dtype int64 is not supported; accepted: int32"
    ):
        raw_call(kv_indptr=torch.tensor([0, 4, 10]))


def test_out_shape_must_match_q():
    with pytest.raises(ValueError, match="out: heads"):
        raw_call(out=torch.empty(3, 2, 64, dtype=F16))


def test_lse_must_be_float32():
    with pytest.raises(ValueError, match="lse: dtype float16 is not supported; accepted: float32"):
        raw_call(lse=torch.empty(3, 4, dtype=F16))


def test_raw_mask_smaller_than_requests_need():
    with pytest.raises(ValueError, match="custom_mask: request 1 needs 2 packed bytes"):
        raw_call(
            mask=torch.zeros(2, dtype=torch.uint8),
            mask_indptr=torch.tensor([0, 1, 2], dtype=torch.int32),
        )


def test_page_index_out_of_range():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    w.plan(indptr, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([4, 2]), 4, 2, 64, 4)
    cache = torch.randn(3, 2, 4, 2, 64).to(F16)
    with pytest.raises(
        ValueError, match=r"kv_indices\[1\] is 3; accepted: a page index in \[0, 3\)"
    ):
        w.run(torch.randn(2, 4, 64).to(F16), cache)


def test_negative_page_index():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    w.plan(indptr, torch.tensor([-1, 0], dtype=torch.int32), torch.tensor([4, 2]), 4, 2, 64, 4)
    cache = torch.randn(3, 2, 4, 2, 64).to(F16)
    with pytest.raises(ValueError, match=r"kv_indices\[0\] is -1"):
        w.run(torch.randn(2, 4, 64).to(F16), cache)


def test_last_page_len_beyond_page_size():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    w.plan(indptr, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5, 2]), 4, 2, 64, 4)
    cache = torch.randn(3, 2, 4, 2, 64).to(F16)
    with pytest.raises(
        ValueError, match=r"kv_last_page_len\[0\] is 5; accepted: \[1, page_size = 4\]"
    ):
        w.run(torch.randn(2, 4, 64).to(F16), cache)


def test_plan_refuses_head_dim_96():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim: head_dim 96 is not supported"):
        w.plan(indptr, indptr[:1], torch.tensor([1]), 4, 2, 96, 4)


def test_plan_refuses_mismatched_heads():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_kv_heads: 3 does not divide num_qo_heads 4"):
        w.plan(indptr, indptr[:1], torch.tensor([1]), 4, 3, 64, 4)


def test_run_q_dtype_differs_from_plan():
    w, cache = planned_decode()
    with pytest.raises(ValueError, match="q: dtype torch.bfloat16 differs from the planned"):
        w.run(torch.randn(2, 4, 64).to(torch.bfloat16), cache.to(torch.bfloat16))


def test_run_cache_page_shape_differs_from_plan():
    w, _ = planned_decode()
    with pytest.raises(ValueError, match="paged_kv_cache: page shape"):
        w.run(torch.randn(2, 4, 64).to(F16), torch.randn(3, 2, 8, 2, 64).to(F16))


def test_run_paged_kv_cache_wrong_rank():
    w, _ = planned_decode()
    with pytest.raises(ValueError, match="paged_kv_cache: shape"):
        w.run(torch.randn(2, 4, 64).to(F16), torch.randn(3, 4, 2, 64).to(F16))


def test_run_before_plan():
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.raises(RuntimeError, match="plan"):
        w.run(torch.randn(2, 4, 64).to(F16), torch.randn(3, 2, 4, 2, 64).to(F16))


def test_wrapper_refuses_bad_kv_layout():
    with pytest.raises(ValueError, match="kv_layout: 'nhd' is not supported"):
        BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "nhd")


def test_ragged_plan_indptr_lengths_differ():
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    with pytest.raises(ValueError, match="kv_indptr: 2 entries but qo_indptr has 3"):
        w.plan(torch.tensor([0, 1, 2]), torch.tensor([0, 4]), 4, 2, 64)


def test_ragged_run_kv_heads_differ_from_plan():
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(torch.tensor([0, 2]), torch.tensor([0, 4]), 4, 2, 64)
    kv = torch.randn(4, 4, 64).to(F16)
    with pytest.raises(ValueError, match="k: 4 kv heads"):
        w.run(torch.randn(2, 4, 64).to(F16), kv, kv)


def test_head_dim_vo_pair_must_be_one_the_kernels_run():
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    with pytest.raises(ValueError, match="head_dim_qk 64 with head_dim_vo 128 is not supported"):
        w.plan(torch.tensor([0, 2]), torch.tensor([0, 4]), 4, 2, 64, head_dim_vo=128)


def test_non_finite_soft_cap():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="logits_soft_cap: inf is not accepted"):
        single_decode_with_kv_cache(q, k, v, logits_soft_cap=float("inf"))
