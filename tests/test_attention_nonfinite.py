"""NaN and infinity in attention, as torch's softmax and FlashInfer's kernels have them: a
NaN in q or k makes every score of that query NaN, so its whole output row (and its lse)
is NaN; a NaN in v reaches the output columns it is in; a +inf score is NaN too (inf - inf
in the softmax), a -inf score weighs nothing. Every CPU path runs (FLASHINFER_CPU_ISA),
decode and prefill, single and batch, split and not."""

import pytest
import torch
from attention_reference import attention
from test_cpu_kernel_paths import SIMD_PATHS

import flashinfer

NAN, INF = float("nan"), float("inf")
WORKSPACE = torch.empty(0, dtype=torch.uint8)
ISAS = [pytest.param("portable")] + SIMD_PATHS


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param != "avx512":  # avx512: the widest the CPU has, no cap
        monkeypatch.setenv("FLASHINFER_CPU_ISA", request.param)
    return request.param


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def same(got, want, tol=2e-3):
    """Equal where finite (within tol), and NaN or infinite exactly where want is."""
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


def test_reference_keeps_nan_and_zeroes_only_what_sees_nothing():
    q, k, v = rand(2, 1, 4, seed=0), rand(3, 1, 4, seed=1), rand(3, 1, 4, seed=2)
    q[0, 0, 0] = NAN
    o, lse = attention(q, k, v, mask=torch.tensor([[1, 1, 1], [0, 0, 0]]).bool())
    assert o[0].isnan().all() and lse[0].isnan().all()
    assert torch.equal(o[1], torch.zeros(1, 4)) and lse[1].item() == -INF


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_single_decode_nan_in_q_k_and_v(isa, dtype):
    q, k, v = rand(8, 128, seed=3), rand(300, 2, 128, seed=4), rand(300, 2, 128, seed=5)
    q[1, 7] = NAN  # qo head 1 (kv head 0)
    k[123, 1, 0] = NAN  # every qo head of kv head 1
    v[45, 0, 9] = NAN  # column 9 of kv head 0's heads
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    ro, rlse = attention(q[None], k, v)
    assert o[1].isnan().all() and o[4:].isnan().all() and o[0, 9].isnan()
    assert not o[0, :9].isnan().any() and not o[2:4, 10:].isnan().any()
    same(o, ro[0])
    same(lse, rlse[0])


def test_split_decode_nan_in_one_chunk_of_the_keys(isa):
    """5000 keys are split in chunks merged afterwards; the NaN is in one chunk only."""
    q, k, v = rand(4, 128, seed=6), rand(5000, 2, 128, seed=7), rand(5000, 2, 128, seed=8)
    k[4321, 0, 5] = NAN
    q[3, 0] = NAN
    o, lse = flashinfer.single_decode_with_kv_cache(q.half(), k.half(), v.half(), return_lse=True)
    ro, rlse = attention(q[None].half(), k.half(), v.half())
    assert o[:2].isnan().all() and o[3].isnan().all() and not o[2].isnan().any()
    same(o, ro[0])
    same(lse, rlse[0])


def test_fixed_split_batch_decode_keeps_nan_to_its_request(isa):
    page, lens = 16, [700, 40, 333]
    pages = [(n + page - 1) // page for n in lens]
    indptr = torch.tensor([0] + pages).cumsum(0).int()
    indices = torch.arange(int(indptr[-1])).int()
    last = torch.tensor([(n - 1) % page + 1 for n in lens]).int()
    cache = rand(int(indptr[-1]), 2, page, 2, 64, seed=9)
    q = rand(3, 4, 64, seed=10)
    cache[int(indptr[2]) + 3, 0, 5, 1, 2] = NAN  # request 2, key 53, kv head 1
    for kwargs in ({}, {"fixed_split_size": 64}):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
        w.plan(indptr, indices, last, 4, 2, 64, page, q_data_type=torch.float32, **kwargs)
        o, lse = w.run(q, cache, return_lse=True)
        for b in range(3):
            keys = cache[indptr[b] : indptr[b + 1], 0].reshape(-1, 2, 64)[: lens[b]]
            vals = cache[indptr[b] : indptr[b + 1], 1].reshape(-1, 2, 64)[: lens[b]]
            ro, rlse = attention(q[b : b + 1], keys, vals)
            same(o[b : b + 1], ro, 1e-4)
            same(lse[b : b + 1], rlse, 1e-4)
        assert o[2, 2:].isnan().all() and not o[:2].isnan().any() and not o[2, :2].isnan().any()


def test_causal_prefill_nan_reaches_the_rows_that_see_it(isa):
    q, k, v = rand(70, 4, 64, seed=11), rand(70, 2, 64, seed=12), rand(70, 2, 64, seed=13)
    q[10, 3, 1] = NAN  # row 10, head 3
    k[40, 0, 0] = NAN  # rows 40.. of heads 0, 1
    v[0, 1, 7] = NAN  # key 0 (every row sees it): column 7 of heads 2, 3
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    ro, rlse = attention(q, k, v, causal=True)
    assert not o[:40, :2].isnan().any() and o[40:, :2].isnan().all()
    assert o[10, 3].isnan().all() and o[:, 2:, 7].isnan().all()
    same(o, ro, 1e-4)
    same(lse, rlse, 1e-4)


def test_batch_prefill_paged_and_ragged_nan(isa):
    qo = torch.tensor([0, 9, 30])
    kv = torch.tensor([0, 20, 61])
    q, k, v = rand(30, 4, 64, seed=14), rand(61, 4, 64, seed=15), rand(61, 4, 64, seed=16)
    q[25, 2, 3] = NAN
    k[5, 1, 0] = NAN  # request 0's key 5: its rows that see it
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    ragged.plan(qo, kv, 4, 4, 64, causal=True, q_data_type=torch.float32)
    o, lse = ragged.run(q, k, v, return_lse=True)
    # the same keys one per page
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    paged.plan(
        qo,
        kv.int(),
        torch.arange(61).int(),
        torch.ones(2).int(),
        4,
        4,
        64,
        1,
        causal=True,
        q_data_type=torch.float32,
    )
    po, plse = paged.run(q, torch.stack([k, v], 1)[:, :, None], return_lse=True)
    for b in range(2):
        rows, keys = slice(qo[b], qo[b + 1]), slice(kv[b], kv[b + 1])
        ro, rlse = attention(q[rows], k[keys], v[keys], causal=True)
        same(o[rows], ro, 1e-4)
        same(lse[rows], rlse, 1e-4)
        same(po[rows], ro, 1e-4)
        same(plse[rows], rlse, 1e-4)
    assert o[25, 2].isnan().all() and o[:9, 1].isnan().all()  # all of request 0 sees key 5
    assert o.isnan().any(-1).sum() == 10 and not o[9:25].isnan().any()


def test_infinite_scores(isa):
    """k rows of +-inf times the sign of q give that query a +inf or -inf score."""
    q, k, v = rand(3, 64, seed=17), rand(50, 3, 64, seed=18), rand(50, 3, 64, seed=19)
    k[7, 0] = INF * q[0].sign()  # head 0: a +inf score, NaN as in the softmax
    k[20, 1] = -INF * q[1].sign()  # head 1: a -inf score, weighs nothing
    k[:, 2] = -INF * q[2].sign()  # head 2: every score -inf: sees nothing, 0 and lse -inf
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    ro, rlse = attention(q[None], k, v)
    assert o[0].isnan().all() and lse[0].isnan()
    assert not o[1].isnan().any() and lse[1].isfinite()
    assert torch.equal(o[2], torch.zeros(64)) and lse[2].item() == -INF
    same(o, ro[0], 1e-4)
    same(lse, rlse[0], 1e-4)


def test_infinite_value_stays_infinite(isa):
    q, k, v = rand(70, 2, 64, seed=20), rand(70, 2, 64, seed=21), rand(70, 2, 64, seed=22)
    v[0, 1, 4] = INF
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert (o[:, 1, 4] == INF).all()
    same(o, attention(q, k, v, causal=True)[0], 1e-4)
