"""Batch decode/prefill wrappers (paged and ragged) against a per-request torch reference."""

import pytest
import torch
from attention_reference import TOLERANCE, attention, gather_pages

from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

WORKSPACE = torch.empty(1024, dtype=torch.int8)


def check(out, ref, dtype=torch.float16):
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[dtype])


def paged_batch(kv_lens, page_size, num_kv_heads, head_dim, kv_layout, seed=0, spare=3):
    """A paged cache [P, 2, ...] holding the requests' pages in shuffled order."""
    g = torch.Generator().manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(pages) + spare
    shape = (total, 2, page_size, num_kv_heads, head_dim)
    if kv_layout == "HND":
        shape = (total, 2, num_kv_heads, page_size, head_dim)
    cache = torch.randn(shape, generator=g).to(torch.float16)
    order = torch.randperm(total, generator=g)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0).to(torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    return cache, indptr, order, last


def request_kv(cache, indptr, indices, kv_lens, b, kv_layout):
    idx = indices[indptr[b] : indptr[b + 1]]
    k = gather_pages(cache[:, 0], idx, kv_lens[b], kv_layout)
    v = gather_pages(cache[:, 1], idx, kv_lens[b], kv_layout)
    return k, v


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_batch_decode_ragged_lengths_shuffled_pages(kv_layout):
    kv_lens, page_size, hq, hkv, d = [1, 16, 17, 100, 5], 16, 8, 2, 128
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, hkv, d, kv_layout)
    q = torch.randn(len(kv_lens), hq, d).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, kv_layout)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, data_type=torch.float16)
    out, lse = w.run(q, cache, return_lse=True)
    assert out.shape == q.shape and lse.shape == (len(kv_lens), hq)
    for b in range(len(kv_lens)):
        k, v = request_kv(cache, indptr, indices, kv_lens, b, kv_layout)
        ref, ref_lse = attention(q[b : b + 1], k, v)
        check(out[b], ref[0])
        torch.testing.assert_close(lse[b], ref_lse[0], atol=1e-4, rtol=1e-5)


def test_batch_decode_kv_tuple_equals_single_tensor():
    kv_lens, page_size = [30, 7], 8
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 4, 64, "NHD")
    q = torch.randn(2, 4, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 4, 4, 64, page_size)
    a = w.run(q, cache)
    b = w.run(q, (cache[:, 0].contiguous(), cache[:, 1].contiguous()))
    assert torch.equal(a, b)


def test_batch_decode_preallocated_out_and_lse_are_filled():
    kv_lens, page_size = [9, 40], 4
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD")
    q = torch.randn(2, 8, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 8, 2, 64, page_size)
    out = torch.empty_like(q)
    lse = torch.empty(2, 8)
    res, res_lse = w.run(q, cache, out=out, lse=lse, return_lse=True)
    assert res is out and res_lse is lse
    ref, ref_lse = attention(q[1:], *request_kv(cache, indptr, indices, kv_lens, 1, "NHD"))
    check(out[1], ref[0])
    torch.testing.assert_close(lse[1], ref_lse[0], atol=1e-4, rtol=1e-5)


def test_batch_decode_planned_twice_uses_the_latest_plan():
    page_size = 4
    cache, indptr, indices, last = paged_batch([12, 3], page_size, 2, 64, "NHD", spare=6)
    q = torch.randn(2, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 2, 2, 64, page_size)
    first = w.run(q, cache)
    indptr2 = torch.tensor([0, 1, 2], dtype=torch.int32)
    indices2 = indices[[3, 0]].contiguous()
    last2 = torch.tensor([2, 4], dtype=torch.int32)
    w.plan(indptr2, indices2, last2, 2, 2, 64, page_size)
    second = w.run(q, cache)
    for b in range(2):
        k, v = request_kv(cache, indptr2, indices2, [2, 4], b, "NHD")
        ref, _ = attention(q[b : b + 1], k, v)
        check(second[b], ref[0])
    assert not torch.equal(first, second)


def test_batch_decode_plan_copies_the_page_table():
    cache, indptr, indices, last = paged_batch([20], 8, 2, 64, "NHD")
    q = torch.randn(1, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 2, 2, 64, 8)
    before = w.run(q, cache)
    indices.zero_()
    assert torch.equal(w.run(q, cache), before)


def test_batch_decode_window_left_at_run_overrides_plan():
    kv_lens, page_size = [50], 16
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD")
    q = torch.randn(1, 4, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 4, 2, 64, page_size, logits_soft_cap=20.0)
    out = w.run(q, cache, window_left=7)
    k, v = request_kv(cache, indptr, indices, kv_lens, 0, "NHD")
    ref, _ = attention(q, k, v, window_left=7, soft_cap=20.0)
    check(out[0], ref[0])


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_batch_prefill_paged_causal(kv_layout):
    qo_lens, kv_lens, page_size, hq, hkv, d = [3, 1, 20], [10, 1, 20], 8, 8, 2, 64
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, hkv, d, kv_layout)
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).to(torch.int32)
    q = torch.randn(sum(qo_lens), hq, d).to(torch.float16)
    w = BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, kv_layout)
    w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page_size, causal=True)
    out, lse = w.run(q, cache, return_lse=True)
    for b in range(3):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        k, v = request_kv(cache, indptr, indices, kv_lens, b, kv_layout)
        ref, ref_lse = attention(q[rows], k, v, causal=True)
        check(out[rows], ref)
        torch.testing.assert_close(lse[rows], ref_lse, atol=1e-4, rtol=1e-5)


def test_batch_prefill_paged_custom_mask_and_packed_mask_agree():
    qo_lens, kv_lens, page_size = [4, 6], [9, 6], 4
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD")
    qo_indptr = torch.tensor([0, 4, 10], dtype=torch.int32)
    q = torch.randn(10, 4, 64).to(torch.float16)
    gen = torch.Generator().manual_seed(5)
    masks = [torch.rand(a, b, generator=gen) > 0.3 for a, b in zip(qo_lens, kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    w = BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, indptr, indices, last, 4, 2, 64, page_size, custom_mask=flat)
    out = w.run(q, cache)
    packed = []
    for m in masks:
        bits = m.reshape(-1).to(torch.int32)
        bits = torch.cat([bits, bits.new_zeros((-bits.numel()) % 8)])
        packed.append((bits.view(-1, 8) << torch.arange(8)).sum(1).to(torch.uint8))
    w.plan(
        qo_indptr, indptr, indices, last, 4, 2, 64, page_size, packed_custom_mask=torch.cat(packed)
    )
    assert torch.equal(w.run(q, cache), out)
    for b in range(2):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        k, v = request_kv(cache, indptr, indices, kv_lens, b, "NHD")
        ref, _ = attention(q[rows], k, v, mask=masks[b])
        check(out[rows], ref)


def test_batch_prefill_ragged_matches_reference_per_request():
    qo_lens, kv_lens, hq, hkv, d = [5, 1, 16], [5, 30, 40], 16, 2, 128
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).to(torch.int32)
    kv_indptr = torch.tensor([0] + kv_lens).cumsum(0).to(torch.int32)
    q = torch.randn(sum(qo_lens), hq, d).to(torch.bfloat16)
    k = torch.randn(sum(kv_lens), hkv, d).to(torch.bfloat16)
    v = torch.randn(sum(kv_lens), hkv, d).to(torch.bfloat16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, q_data_type=torch.bfloat16)
    out = w.run(q, k, v)
    for b in range(3):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        keys = slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ref, _ = attention(q[rows], k[keys], v[keys], causal=True)
        check(out[rows], ref, torch.bfloat16)


def test_batch_prefill_ragged_rope_and_o_data_type():
    qo_indptr = torch.tensor([0, 3, 7], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 8, 12], dtype=torch.int32)
    q = torch.randn(7, 4, 64).to(torch.float16)
    k = torch.randn(12, 4, 64).to(torch.float16)
    v = torch.randn(12, 4, 64).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(
        qo_indptr,
        kv_indptr,
        4,
        4,
        64,
        causal=True,
        pos_encoding_mode="ROPE_LLAMA",
        o_data_type=torch.float32,
    )
    out = w.run(q, k, v)
    assert out.dtype == torch.float32
    for b in range(2):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        keys = slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ref, _ = attention(q[rows], k[keys], v[keys], causal=True, rope=True)
        check(out[rows], ref)


def test_result_is_bit_identical_for_any_thread_count():
    qo_indptr = torch.tensor([0, 40, 41], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 60, 160], dtype=torch.int32)
    q = torch.randn(41, 8, 64).to(torch.float16)
    k = torch.randn(160, 2, 64).to(torch.float16)
    v = torch.randn(160, 2, 64).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, 8, 2, 64, causal=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = w.run(q, k, v)
        torch.set_num_threads(3)
        three = w.run(q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one.view(torch.uint8), three.view(torch.uint8))
