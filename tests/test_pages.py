"""The page-table knowledge (csrc/core/pages.c): which pages of a paged KV cache a call reads,
from its plan's CSR table or its own block tables, out-of-range entries counted, not kept."""

import torch

from flashinfer_native import _C


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


class Wrapper:  # stands for any wrapper object: the memo keys plans by their object
    pass


def pages_of(result):
    return [(pages, total, oor) for _, pages, total, oor in result]


def test_a_decode_run_reads_the_pages_its_plan_listed():
    memo, w = {}, Wrapper()
    plan = dict(indptr=i32([0, 2, 5]), indices=i32([7, 3, 9, 3, 1]), last_page_len=i32([4, 16]))
    assert _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.plan", w, plan, memo) is None
    cache = torch.zeros(16, 2, 4, 1, 8)
    got = _C._page_sets(
        "BatchDecodeWithPagedKVCacheWrapper.run", w, {"paged_kv_cache": cache}, memo
    )
    assert got[0][0] is cache
    assert pages_of(got) == [([1, 3, 7, 9], 16, 0)]


def test_entries_past_the_last_indptr_are_not_read():
    memo, w = {}, Wrapper()
    plan = dict(indptr=i32([1, 3]), indices=i32([5, 6, 7, 8]))
    _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.plan", w, plan, memo)
    got = _C._page_sets(
        "BatchDecodeWithPagedKVCacheWrapper.run", w, {"paged_kv_cache": torch.zeros(10, 1)}, memo
    )
    assert pages_of(got) == [([6, 7], 10, 0)]


def test_out_of_range_page_ids_are_counted_and_left_out():
    memo, w = {}, Wrapper()
    plan = dict(indptr=i32([0, 4]), indices=i32([2, 4096, -1, 2]))
    _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.plan", w, plan, memo)
    got = _C._page_sets(
        "BatchDecodeWithPagedKVCacheWrapper.run", w, {"paged_kv_cache": torch.zeros(4096, 2)}, memo
    )
    assert pages_of(got) == [([2], 4096, 2)]


def test_a_k_v_pair_and_its_scales_each_get_the_pages():
    memo, w = {}, Wrapper()
    _C._page_sets(
        "BatchPrefillWithPagedKVCacheWrapper.plan",
        w,
        dict(paged_kv_indptr=i32([0, 2]), paged_kv_indices=i32([0, 5])),
        memo,
    )
    k, v, sf = torch.zeros(8, 4), torch.zeros(8, 4), torch.zeros(6, 1)
    got = _C._page_sets(
        "BatchPrefillWithPagedKVCacheWrapper.run",
        w,
        {"paged_kv_cache": (k, v), "kv_cache_sf": sf},
        memo,
    )
    assert all(g[0] is t for g, t in zip(got, (k, v, sf), strict=True))
    assert pages_of(got) == [([0, 5], 8, 0), ([0, 5], 8, 0), ([0, 5], 6, 0)]


def test_without_a_plan_on_that_object_nothing_is_known():
    memo, w = {}, Wrapper()
    _C._page_sets(
        "BatchDecodeWithPagedKVCacheWrapper.plan",
        w,
        dict(indptr=i32([0, 1]), indices=i32([3])),
        memo,
    )
    other = Wrapper()
    run = {"paged_kv_cache": torch.zeros(4, 1)}
    assert _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.run", other, run, memo) == []
    assert _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.run", w, run, memo) != []


def test_a_plan_on_an_object_that_is_gone_is_not_used():
    """The memo holds the object weakly: a new object at the same address is not its plan."""
    memo, w = {}, Wrapper()
    _C._page_sets(
        "BatchDecodeWithPagedKVCacheWrapper.plan",
        w,
        dict(indptr=i32([0, 1]), indices=i32([3])),
        memo,
    )
    key = next(iter(memo))
    del w
    impostor = Wrapper()
    memo[id(impostor)] = memo.pop(key)
    run = {"paged_kv_cache": torch.zeros(4, 1)}
    assert _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.run", impostor, run, memo) == []


def test_an_unreadable_plan_forgets_the_previous_one():
    memo, w = {}, Wrapper()
    plan = "BatchDecodeWithPagedKVCacheWrapper.plan"
    _C._page_sets(plan, w, dict(indptr=i32([0, 1]), indices=i32([3])), memo)
    _C._page_sets(plan, w, dict(indptr=[0, 1], indices=[3]), memo)  # not tensors
    run = {"paged_kv_cache": torch.zeros(4, 1)}
    assert _C._page_sets("BatchDecodeWithPagedKVCacheWrapper.run", w, run, memo) == []


def test_trtllm_block_table_rows_are_cut_to_the_sequence_lengths():
    """HND cache [pages, 2, heads, page_size=16, d]: 17 tokens need 2 pages, 16 need 1."""
    cache = torch.zeros(64, 2, 1, 16, 8)
    bt = i32([[10, 11, 12, 13], [20, 21, 22, 99]])
    args = dict(kv_cache=cache, block_tables=bt, seq_lens=torch.tensor([17, 16], dtype=torch.int32))
    got = _C._page_sets("trtllm_batch_decode_with_kv_cache", None, args, {})
    assert pages_of(got) == [([10, 11, 20], 64, 0)]


def test_nhd_layout_reads_page_size_from_its_own_dimension():
    cache = torch.zeros(64, 2, 4, 1, 8)  # NHD: page_size 4 is dim 2
    args = dict(
        kv_cache=cache,
        block_tables=i32([[1, 2, 3, 4]]),
        seq_lens=torch.tensor([5], dtype=torch.int32),
        kv_layout="NHD",
    )
    got = _C._page_sets("trtllm_batch_decode_with_kv_cache", None, args, {})
    assert pages_of(got) == [([1, 2], 64, 0)]


def test_separate_k_and_v_rows_are_both_read():
    """uses_shared_paged_kv_idx=False: block_tables [batch, 2, pages]."""
    k, v = torch.zeros(32, 1, 16, 8), torch.zeros(32, 1, 16, 8)
    args = dict(
        kv_cache=(k, v),
        block_tables=i32([[[1, 2, 3], [4, 5, 6]]]),
        seq_lens=torch.tensor([20], dtype=torch.int32),
    )
    got = _C._page_sets("trtllm_batch_decode_with_kv_cache", None, args, {})
    assert pages_of(got) == [([1, 2, 4, 5], 32, 0)] * 2


def test_without_lengths_per_row_every_entry_counts():
    cache = torch.zeros(8, 2, 1, 16, 8)
    args = dict(kv_cache=cache, block_tables=i32([[1, 2], [3, 7]]), seq_lens=i32([1]))
    got = _C._page_sets("trtllm_batch_context_with_kv_cache", None, args, {})
    assert pages_of(got) == [([1, 2, 3, 7], 8, 0)]


def test_mla_cache_page_size_and_sparse_mode():
    cache = torch.zeros(16, 32, 576)  # [pages, page_size, kv_lora_rank + rope]
    args = dict(kv_cache=cache, block_tables=i32([[3, 4, 5]]), seq_lens=i32([33]))
    got = _C._page_sets("trtllm_batch_decode_with_kv_cache_mla", None, args, {})
    assert pages_of(got) == [([3, 4], 16, 0)]
    sparse = dict(args, sparse_mla_top_k=2048)  # token-level indices: not pages
    assert _C._page_sets("trtllm_batch_decode_with_kv_cache_mla", None, sparse, {}) == []


def test_cascade_levels_are_united():
    memo, w = {}, Wrapper()
    plan = dict(
        paged_kv_indptr_arr=[i32([0, 2]), i32([0, 1, 2])],
        paged_kv_indices_arr=[i32([0, 1]), i32([6, 4])],
    )
    _C._page_sets("MultiLevelCascadeAttentionWrapper.plan", w, plan, memo)
    run = {"paged_kv_cache": torch.zeros(8, 1)}
    got = _C._page_sets("MultiLevelCascadeAttentionWrapper.run", w, run, memo)
    assert pages_of(got) == [([0, 1, 4, 6], 8, 0)]


def test_pod_prefill_and_decode_caches_have_their_own_tables():
    memo, w = {}, Wrapper()
    plan = dict(
        kv_indptr_p=i32([0, 1]),
        kv_indices_p=i32([2]),
        kv_indptr_d=i32([0, 2]),
        kv_indices_d=i32([5, 6]),
    )
    _C._page_sets("BatchPODWithPagedKVCacheWrapper.plan", w, plan, memo)
    p, d = torch.zeros(8, 1), torch.zeros(8, 1)
    run = {"paged_kv_cache_p": p, "paged_kv_cache_d": d}
    got = _C._page_sets("BatchPODWithPagedKVCacheWrapper.run", w, run, memo)
    assert pages_of(got) == [([2], 8, 0), ([5, 6], 8, 0)]


def test_unsigned_and_64_bit_tables_and_strided_views():
    cache = torch.zeros(100, 2, 1, 4, 2)
    bt = torch.arange(40, dtype=torch.int64).reshape(4, 10)[:, ::2]  # strided rows
    lens = torch.tensor([4, 8, 0, 20], dtype=torch.uint32)
    got = _C._page_sets(
        "trtllm_batch_decode_with_kv_cache",
        None,
        dict(kv_cache=cache, block_tables=bt, seq_lens=lens),
        {},
    )
    assert pages_of(got) == [([0, 10, 12, 30, 32, 34, 36, 38], 100, 0)]


def test_apis_outside_the_table_get_none():
    assert _C._page_sets("rmsnorm", None, {}, {}) is None


def test_the_table_names_existing_roles_and_parameters():
    table = _C._page_table()
    names = [qn for qn, *_ in table]
    assert len(names) == len(set(names))
    for _, role, tables, paged in table:
        assert role in ("plan", "run", "call")
        assert (role == "run") == (not tables)
        assert (role == "plan") == (not paged)
