"""The attention arguments of today's FlashInfer that change the arithmetic (sinks, NVFP4
KV, fp8 calibration scales, several queries per request, block tables, v/o indptrs,
multi-item scoring, lse base and layout) against a few lines of torch, and the ones this
build cannot honour refused with NotImplementedError."""

import math
import warnings

import pytest
import torch
from attention_reference import TOLERANCE, attention
from test_batch_attention import WORKSPACE, check, paged_batch, request_kv

from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4_tensor(shape, seed):
    """Random NVFP4 data: (packed uint8 [..., d/2], E4M3 scales [..., d/16], values [..., d])."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
    scales = (torch.rand(*shape[:-1], shape[-1] // 16, generator=g) * 2 + 0.1).to(
        torch.float8_e4m3fn
    )
    values = E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    values = values * scales.float().repeat_interleave(16, dim=-1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scales, values


# [1500]: one request whose keys the CPU kernel splits into chunks and merges; the sink
# joins the merged softmax state once.
@pytest.mark.parametrize("kv_lens", [[5, 40, 1], [1500]], ids=["batch", "split"])
def test_decode_sinks_join_the_softmax_denominator(kv_lens):
    page_size, hq, hkv, d = 16, 8, 2, 64
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, hkv, d, "NHD")
    q = torch.randn(len(kv_lens), hq, d).to(torch.float16)
    sinks = torch.randn(hq) * 3
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, hq, hkv, d, page_size)
    out, lse = w.run(q, cache, sinks=sinks, return_lse=True)
    for b in range(len(kv_lens)):
        ref, ref_lse = attention(
            q[b : b + 1], *request_kv(cache, indptr, indices, kv_lens, b, "NHD"), sinks=sinks
        )
        check(out[b], ref[0])
        torch.testing.assert_close(lse[b], ref_lse[0], atol=1e-4, rtol=1e-5)


def test_prefill_sinks_with_causal_rows_that_see_few_keys():
    kv_lens, page_size = [6, 9], 4
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "HND")
    qo_indptr = torch.tensor([0, 6, 8], dtype=torch.int32)
    q = torch.randn(8, 4, 64).to(torch.float16)
    sinks = torch.tensor([0.0, 5.0, -2.0, float("-inf")])
    w = BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "HND")
    w.plan(qo_indptr, indptr, indices, last, 4, 2, 64, page_size, causal=True, window_left=2)
    out = w.run(q, cache, sinks=sinks)
    for b in range(2):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        k, v = request_kv(cache, indptr, indices, kv_lens, b, "HND")
        ref, _ = attention(q[rows], k, v, causal=True, window_left=2, sinks=sinks)
        check(out[rows], ref)


def _nvfp4_paged(kv_lens, page_size, hkv, d, seed):
    """A paged NVFP4 cache [P, 2, page, H, d/2] with its scales and dequantized values."""
    pages = sum((n + page_size - 1) // page_size for n in kv_lens)
    packed, scales, values = nvfp4_tensor((pages, 2, page_size, hkv, d), seed)
    indptr = torch.tensor([0] + [(n + page_size - 1) // page_size for n in kv_lens]).cumsum(0)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    indices = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    return packed, scales, values, indptr.to(torch.int32), indices, last


@pytest.mark.parametrize(
    "sf_as_pair, kv_lens", [(False, [7, 33]), (True, [7, 33]), (False, [1100])]
)  # [1100]: keys the CPU kernel splits
def test_decode_nvfp4_kv_cache_matches_dequantized_reference(sf_as_pair, kv_lens):
    page_size, hq, hkv, d = 8, 4, 2, 64
    packed, scales, values, indptr, indices, last = _nvfp4_paged(kv_lens, page_size, hkv, d, 1)
    q = torch.randn(len(kv_lens), hq, d).to(torch.bfloat16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(
        indptr,
        indices,
        last,
        hq,
        hkv,
        d,
        page_size,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.uint8,
    )
    sf = (scales[:, 0], scales[:, 1]) if sf_as_pair else scales
    out = w.run(q, packed, kv_cache_sf=sf, k_scale=0.5, v_scale=2.0)
    for b in range(len(kv_lens)):
        k, v = request_kv(values, indptr, indices, kv_lens, b, "NHD")
        ref, _ = attention(q[b : b + 1], k, v, sm_scale=0.5 / math.sqrt(d), v_scale=2.0)
        check(out[b], ref[0], torch.bfloat16)


def test_ragged_prefill_nvfp4_kv_as_one_scale_tensor():
    qo_indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 10, 16], dtype=torch.int32)
    packed, scales, values = nvfp4_tensor((16, 2, 2, 128), 2)
    q = torch.randn(5, 4, 128).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, 4, 2, 128, causal=True, kv_data_type="uint8")
    out = w.run(q, packed[:, 0], packed[:, 1], kv_cache_sf=scales)
    for b in range(2):
        rows, keys = (
            slice(int(qo_indptr[b]), int(qo_indptr[b + 1])),
            slice(int(kv_indptr[b]), int(kv_indptr[b + 1])),
        )
        ref, _ = attention(q[rows], values[keys, 0], values[keys, 1], causal=True)
        check(out[rows], ref)


def test_single_prefill_nvfp4_kv_and_calibration_scales():
    packed, scales, values = nvfp4_tensor((2, 12, 2, 64), 3)
    q = torch.randn(4, 2, 64).to(torch.float16)
    out = single_prefill_with_kv_cache(
        q,
        packed[0],
        packed[1],
        kv_cache_sf=(scales[0], scales[1]),
        k_scale=0.25,
        v_scale=3.0,
        causal=True,
    )
    ref, _ = attention(q, values[0], values[1], causal=True, sm_scale=0.25 / 8, v_scale=3.0)
    check(out, ref)


def test_single_prefill_k_scale_and_v_scale_on_fp8_kv():
    q = torch.randn(3, 4, 64).to(torch.float16)
    k = torch.randn(9, 4, 64).to(torch.float8_e4m3fn)
    v = torch.randn(9, 4, 64).to(torch.float8_e4m3fn)
    out = single_prefill_with_kv_cache(q, k, v, k_scale=0.5, v_scale=torch.tensor(1.5))
    ref, _ = attention(q, k.float(), v.float(), sm_scale=0.5 / 8, v_scale=1.5)
    check(out, ref)


def test_nvfp4_kv_needs_kv_cache_sf_and_sf_needs_nvfp4_kv():
    packed, scales, _ = nvfp4_tensor((2, 8, 2, 64), 4)
    q = torch.randn(2, 2, 64).to(torch.float16)
    with pytest.raises(ValueError, match="kv_cache_sf must be provided for NVFP4 KV cache"):
        single_prefill_with_kv_cache(q, packed[0], packed[1])
    kv = torch.randn(8, 2, 64).to(torch.float16)
    with pytest.raises(
        ValueError, match=r"kv_cache_sf: given for a KV cache of dtype torch.float16"
    ):
        single_prefill_with_kv_cache(q, kv, kv, kv_cache_sf=(scales[0], scales[1]))


def test_ragged_o_scale_divides_the_output():
    qo_indptr = torch.tensor([0, 4], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 9], dtype=torch.int32)
    q = torch.randn(4, 2, 64).to(torch.float16)
    k = torch.randn(9, 2, 64).to(torch.float16)
    v = torch.randn(9, 2, 64).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, 2, 2, 64)
    out = w.run(q, k, v, v_scale=3.0, o_scale=4.0)
    ref, _ = attention(q, k, v, v_scale=0.75)
    check(out, ref)


def test_decode_several_queries_per_request_are_causal_within_the_request():
    kv_lens, page_size, hq, hkv, d, n = [10, 3], 4, 4, 2, 64, 3
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, hkv, d, "NHD")
    q = torch.randn(2 * n, hq, d).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, q_len_per_req=n)
    out = w.run(q, cache)
    for b in range(2):
        k, v = request_kv(cache, indptr, indices, kv_lens, b, "NHD")
        ref, _ = attention(q[b * n : (b + 1) * n], k, v, causal=True)
        check(out[b * n : (b + 1) * n], ref)


def test_decode_run_q_len_per_req_is_deprecated_and_checked():
    cache, indptr, indices, last = paged_batch([9], 4, 2, 64, "NHD")
    q = torch.randn(2, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 2, 2, 64, 4, q_len_per_req=2)
    with pytest.warns(DeprecationWarning, match="pass it to plan"):
        w.run(q, cache, q_len_per_req=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"q.shape\[0\] \(2\)"):
        w.run(q, cache, q_len_per_req=3)


def test_decode_block_tables_and_seq_lens_decide_the_pages():
    kv_lens, page_size = [6, 13], 4
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD", spare=4)
    q = torch.randn(2, 4, 64).to(torch.float16)
    table = torch.full((2, 5), 99, dtype=torch.int32)  # unused slots: never read
    for b in range(2):
        pages = indices[indptr[b] : indptr[b + 1]]
        table[b, : len(pages)] = pages
    seq_lens = torch.tensor([5, 13], dtype=torch.int32)  # request 0 uses 5 of its 6 keys
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    junk = torch.zeros_like(indices)
    w.plan(indptr, junk, last, 4, 2, 64, page_size, block_tables=table, seq_lens=seq_lens)
    out = w.run(q, cache)
    for b, n in enumerate([5, 13]):
        k, v = request_kv(cache, indptr, indices, kv_lens, b, "NHD")
        ref, _ = attention(q[b : b + 1], k[:n], v[:n])
        check(out[b], ref[0])


def test_seq_lens_longer_than_the_pages_is_refused():
    cache, indptr, indices, last = paged_batch([6], 4, 2, 64, "NHD")
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 9 needs 3 pages of 4"):
        w.plan(indptr, indices, last, 2, 2, 64, 4, seq_lens=torch.tensor([9], dtype=torch.int32))


def test_prefill_paged_block_tables():
    kv_lens, page_size = [7, 12], 4
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD")
    qo_indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    table = torch.zeros(2, 3, dtype=torch.int32)
    for b in range(2):
        pages = indices[indptr[b] : indptr[b + 1]]
        table[b, : len(pages)] = pages
    q = torch.randn(5, 2, 64).to(torch.float16)
    w = BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(
        qo_indptr,
        indptr,
        torch.zeros_like(indices),
        last,
        2,
        2,
        64,
        page_size,
        causal=True,
        block_tables=table,
        seq_lens=torch.tensor(kv_lens),
    )
    out = w.run(q, cache)
    for b in range(2):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        ref, _ = attention(
            q[rows], *request_kv(cache, indptr, indices, kv_lens, b, "NHD"), causal=True
        )
        check(out[rows], ref)


def test_ragged_v_indptr_and_o_indptr_place_values_and_outputs():
    qo_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 4, 10], dtype=torch.int32)
    v_indptr = torch.tensor([6, 0, 12], dtype=torch.int32)  # request 1's values first in v
    o_indptr = torch.tensor([3, 0, 5], dtype=torch.int32)  # outputs swapped likewise
    q = torch.randn(5, 2, 64).to(torch.float16)
    k = torch.randn(10, 2, 64).to(torch.float16)
    v = torch.randn(12, 2, 64).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, 2, 2, 64, v_indptr=v_indptr, o_indptr=o_indptr)
    out, lse = w.run(q, k, v, return_lse=True)
    for b in range(2):
        qo = int(qo_indptr[b + 1] - qo_indptr[b])
        kv = int(kv_indptr[b + 1] - kv_indptr[b])
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b]) + qo)
        ref, ref_lse = attention(
            q[rows],
            k[int(kv_indptr[b]) : int(kv_indptr[b]) + kv],
            v[int(v_indptr[b]) : int(v_indptr[b]) + kv],
        )
        check(out[int(o_indptr[b]) : int(o_indptr[b]) + qo], ref)
        torch.testing.assert_close(lse[rows], ref_lse, atol=1e-4, rtol=1e-5)


def test_o_indptr_past_the_output_rows_is_refused():
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(
        torch.tensor([0, 2], dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
        2,
        2,
        64,
        o_indptr=torch.tensor([1, 3], dtype=torch.int32),
    )
    x = torch.randn(3, 2, 64).to(torch.float16)
    with pytest.raises(ValueError, match=r"o_indptr\[0\] is 1: request 0's 2 output rows"):
        w.run(x[:2], x, x)


@pytest.mark.parametrize("layout", ["NH", "HN"])
def test_lse_base_and_layout(layout):
    qo_indptr = torch.tensor([0, 3], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 7], dtype=torch.int32)
    q, k, v = (torch.randn(n, 2, 64).to(torch.float16) for n in (3, 7, 7))
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo_indptr, kv_indptr, 2, 2, 64)
    _, lse2 = w.run(q, k, v, return_lse=True)
    _, lse = w.run(q, k, v, return_lse=True, lse_base="ln", lse_layout=layout)
    want = lse2 * math.log(2.0)
    if layout == "HN":
        assert lse.shape == (2, 3) and lse.is_contiguous()
        want = want.t()
    torch.testing.assert_close(lse, want)


def multi_item_reference(qo_len, kv_len, prefix, token_pos):
    """The multi-item scoring mask by its definition, one element at a time."""
    mask = torch.zeros(qo_len, kv_len, dtype=torch.bool)
    for i in range(qo_len):
        pos = i + kv_len - qo_len
        for j in range(pos + 1):
            own_item = pos >= prefix and pos < j + token_pos[pos - prefix]
            mask[i, j] = pos < prefix or j < prefix or own_item
    return mask


def test_multi_item_scoring_mask():
    # prefix of 4 tokens, then items of 2 and 3 tokens, each after a delimiter (position 0)
    token_pos = [0, 1, 2, 0, 1, 2, 3, 0]
    prefix, kv_len, qo_len = 4, 12, 9
    q = torch.randn(qo_len, 2, 64).to(torch.float16)
    k = torch.randn(kv_len, 2, 64).to(torch.float16)
    v = torch.randn(kv_len, 2, 64).to(torch.float16)
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(
        torch.tensor([0, qo_len], dtype=torch.int32),
        torch.tensor([0, kv_len], dtype=torch.int32),
        2,
        2,
        64,
        prefix_len_ptr=torch.tensor([prefix], dtype=torch.int32),
        token_pos_in_items_ptr=torch.tensor(token_pos, dtype=torch.int32),
        token_pos_in_items_len=len(token_pos),
        max_item_len_ptr=torch.tensor([3], dtype=torch.int32),
    )
    out = w.run(q, k, v)
    ref, _ = attention(q, k, v, mask=multi_item_reference(qo_len, kv_len, prefix, token_pos))
    check(out, ref)


def test_deprecated_positional_decode_plan_arguments_warn_and_apply():
    kv_lens, page_size = [20], 8
    cache, indptr, indices, last = paged_batch(kv_lens, page_size, 2, 64, "NHD")
    q = torch.randn(1, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        w.plan(indptr, indices, last, 2, 2, 64, page_size, "NONE", 5, 30.0)
    ref, _ = attention(
        q, *request_kv(cache, indptr, indices, kv_lens, 0, "NHD"), window_left=5, soft_cap=30.0
    )
    check(w.run(q, cache)[0], ref[0])
    with pytest.raises(TypeError, match="multiple values for argument 'window_left'"):
        w.plan(indptr, indices, last, 2, 2, 64, page_size, "NONE", 5, window_left=5)


def test_split_kv_hints_are_accepted_and_checked():
    cache, indptr, indices, last = paged_batch([40], 8, 2, 64, "NHD")
    q = torch.randn(1, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 2, 2, 64, 8)
    base = w.run(q, cache)
    for hints in (dict(fixed_split_size=2), dict(disable_split_kv=True)):
        w.plan(indptr, indices, last, 2, 2, 64, 8, **hints)
        assert torch.equal(w.run(q, cache), base)
    with pytest.raises(ValueError, match="fixed_split_size: 0 is not accepted"):
        w.plan(indptr, indices, last, 2, 2, 64, 8, fixed_split_size=0)


def test_length_hints_must_bound_the_batch():
    w = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    qo, kv = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32)
    w.plan(
        qo,
        kv,
        2,
        2,
        64,
        max_token_per_sequence=5,
        max_sequence_kv=16,
        seq_lens=torch.tensor([9]),
        seq_lens_q=torch.tensor([5]),
    )
    with pytest.raises(ValueError, match="max_token_per_sequence: 4 is below the batch's longest"):
        w.plan(qo, kv, 2, 2, 64, max_token_per_sequence=4)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda w, a: w.run(*a, skip_softmax_threshold_scale_factor=0.5),
            "skip_softmax_threshold_scale_factor: 0.5 is not implemented",
        ),
        (lambda w, a: w.run(*a, use_fp16_softmax=True), "use_fp16_softmax: True"),
        (lambda w, a: w.run(*a, uses_spcompress=True), "uses_spcompress: True"),
    ],
)
def test_trtllm_gen_run_options_are_refused(make, match):
    cache, indptr, indices, last = paged_batch([9], 4, 2, 64, "NHD")
    w = BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(torch.tensor([0, 2], dtype=torch.int32), indptr, indices, last, 2, 2, 64, 4)
    with pytest.raises(NotImplementedError, match=match):
        make(w, (torch.randn(2, 2, 64).to(torch.float16), cache))


def test_unsupported_plan_values_are_refused():
    cache, indptr, indices, last = paged_batch([9], 4, 2, 64, "NHD")
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.raises(NotImplementedError, match="window_right: 3 is not implemented"):
        w.plan(indptr, indices, last, 2, 2, 64, 4, window_right=3)
    with pytest.raises(NotImplementedError, match="is_causal: True is not implemented"):
        w.plan(indptr, indices, last, 2, 2, 64, 4, is_causal=True)
    with pytest.raises(NotImplementedError, match="variant_owns_mask: True is not implemented"):
        BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, variant_owns_mask=True)
    r = BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    qo, kv = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"seq_lens_q: \[3\] is not implemented"):
        r.plan(qo, kv, 2, 2, 64, seq_lens_q=torch.tensor([3]))
    with pytest.raises(NotImplementedError, match=r"seq_lens: \[7\] is not implemented"):
        r.plan(qo, kv, 2, 2, 64, seq_lens=torch.tensor([7]))


def test_decode_o_data_type_sets_the_output_dtype():
    cache, indptr, indices, last = paged_batch([9], 4, 2, 64, "NHD")
    q = torch.randn(1, 2, 64).to(torch.float16)
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 2, 2, 64, 4, o_data_type=torch.float32)
    out = w.run(q, cache)
    assert out.dtype == torch.float32
    ref, _ = attention(q, *request_kv(cache, indptr, indices, [9], 0, "NHD"))
    torch.testing.assert_close(out[0], ref[0], **TOLERANCE[torch.float16])


def test_no_warning_for_keyword_plan_arguments():
    cache, indptr, indices, last = paged_batch([9], 4, 2, 64, "NHD")
    w = BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.plan(indptr, indices, last, 2, 2, 64, 4, window_left=3)
