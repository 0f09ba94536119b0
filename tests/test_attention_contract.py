"""The attention contract as FlashInfer's own tests see it: ALiBi, head_dim 512 and
qk 192 / vo 128, fa3-style FP8 with per-head scales, batch-invariant decode with a fixed
split, a flattened custom mask, the *_return_lse names, use_tensor_cores, fast_decode_plan
and the CUDA-graph decode wrapper. Each is checked against attention_reference.py."""

import torch
from attention_reference import attention

import flashinfer

WORKSPACE = torch.empty(0, dtype=torch.uint8)


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def close(got, want, tol=2e-3):
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_alibi_single_decode_matches_reference():
    q, k, v = rand(6, 128, seed=1), rand(81, 6, 128, seed=2), rand(81, 6, 128, seed=3)
    o, lse = flashinfer.single_decode_with_kv_cache(
        q, k, v, pos_encoding_mode="ALIBI", return_lse=True
    )
    ro, rlse = attention(q[None], k, v, alibi=True)
    close(o, ro[0], 1e-4)
    close(lse, rlse[0], 1e-4)


def test_alibi_causal_prefill_with_gqa_matches_reference():
    q, k, v = rand(17, 8, 64, seed=4), rand(40, 2, 64, seed=5), rand(40, 2, 64, seed=6)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ALIBI")
    close(o, attention(q, k, v, causal=True, alibi=True)[0], 1e-4)


def test_alibi_batch_decode_wrapper_matches_reference():
    k_cache, v_cache = rand(3, 4, 4, 64, seed=7), rand(3, 4, 4, 64, seed=8)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(
        torch.tensor([0, 3]),
        torch.tensor([0, 1, 2]),
        torch.tensor([2]),
        4,
        4,
        64,
        4,
        pos_encoding_mode="ALIBI",
        q_data_type=torch.float32,
    )
    q = rand(1, 4, 64, seed=9)
    o = w.run(q, (k_cache, v_cache))
    keys = k_cache.reshape(-1, 4, 64)[:10]
    vals = v_cache.reshape(-1, 4, 64)[:10]
    close(o, attention(q, keys, vals, alibi=True)[0], 1e-4)


def test_head_dim_512_prefill_matches_reference():
    q, k, v = rand(9, 4, 512, seed=10), rand(30, 4, 512, seed=11), rand(30, 4, 512, seed=12)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    close(o, attention(q, k, v, causal=True)[0], 1e-4)


def test_qk192_vo128_ragged_prefill_matches_reference():
    qo, kv = torch.tensor([0, 5, 12]), torch.tensor([0, 9, 20])
    q, k, v = rand(12, 4, 192, seed=13), rand(20, 4, 192, seed=14), rand(20, 4, 128, seed=15)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(qo, kv, 4, 4, 192, head_dim_vo=128, causal=True, q_data_type=torch.float32)
    o, lse = w.run(q, k, v, return_lse=True)
    assert o.shape == (12, 4, 128)
    for b in range(2):
        ro, rlse = attention(
            q[qo[b] : qo[b + 1]], k[kv[b] : kv[b + 1]], v[kv[b] : kv[b + 1]], causal=True
        )
        close(o[qo[b] : qo[b + 1]], ro, 1e-4)
        close(lse[qo[b] : qo[b + 1]], rlse, 1e-4)


def per_head_fp8(x):
    """x [n, heads, d] as e4m3 with one float32 scale per head (FlashInfer's fa3 recipe)."""
    scale = (x.abs().amax(dim=(0, 2)) / 448.0).clamp(min=1e-6)
    return (x / scale[None, :, None]).to(torch.float8_e4m3fn), scale


def test_fa3_fp8_single_prefill_uses_per_head_scales():
    q, k, v = rand(16, 4, 128, seed=16), rand(24, 2, 128, seed=17), rand(24, 2, 128, seed=18)
    (q8, sq), (k8, sk), (v8, sv) = per_head_fp8(q), per_head_fp8(k), per_head_fp8(v)
    o = flashinfer.single_prefill_with_kv_cache(
        q8, k8, v8, sq, sk, sv, causal=True, backend="fa3", o_dtype=torch.float16
    )
    assert o.dtype == torch.float16
    dq = q8.float() * sq[None, :, None]
    dk, dv = k8.float() * sk[None, :, None], v8.float() * sv[None, :, None]
    close(o, attention(dq, dk, dv, causal=True)[0], 2e-3)


def test_fa3_fp8_ragged_run_takes_scales_positionally():
    qo, kv = torch.tensor([0, 7]), torch.tensor([0, 19])
    q, k, v = rand(7, 2, 64, seed=19), rand(19, 2, 64, seed=20), rand(19, 2, 64, seed=21)
    (q8, sq), (k8, sk), (v8, sv) = per_head_fp8(q), per_head_fp8(k), per_head_fp8(v)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, backend="fa3")
    w.plan(
        qo,
        kv,
        2,
        2,
        64,
        q_data_type=torch.float8_e4m3fn,
        kv_data_type=torch.float8_e4m3fn,
        o_data_type=torch.float16,
    )
    o = w.run(q8, k8, v8, sq, sk, sv)
    dq = q8.float() * sq[None, :, None]
    dk, dv = k8.float() * sk[None, :, None], v8.float() * sv[None, :, None]
    close(o, attention(dq, dk, dv)[0], 2e-3)


def decode_batch(lens, page_size, seed):
    """A paged decode batch: (indptr, indices, last_page_len, k_cache, v_cache, q)."""
    pages = [(n + page_size - 1) // page_size for n in lens]
    indptr = torch.tensor([0] + pages).cumsum(0).int()
    indices = torch.arange(int(indptr[-1])).int()
    last = torch.tensor([(n - 1) % page_size + 1 for n in lens]).int()
    cache = rand(int(indptr[-1]), 2, page_size, 4, 128, seed=seed)
    q = rand(len(lens), 8, 128, seed=seed + 1)
    return indptr, indices, last, cache, q


def run_decode(indptr, indices, last, cache, q, page_size, **plan_kwargs):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 8, 4, 128, page_size, q_data_type=torch.float32, **plan_kwargs)
    return w.run(q, cache, return_lse=True)


def test_fixed_split_decode_is_batch_invariant():
    lens, page = [3000, 17, 900, 4000, 5, 2048], 16
    indptr, indices, last, cache, q = decode_batch(lens, page, seed=22)
    full, full_lse = run_decode(indptr, indices, last, cache, q, page, fixed_split_size=20)
    for b in range(len(lens)):
        a, z = int(indptr[b]), int(indptr[b + 1])
        alone, lse = run_decode(
            torch.tensor([0, z - a]).int(),
            indices[a:z],
            last[b : b + 1],
            cache,
            q[b : b + 1],
            page,
            fixed_split_size=20,
        )
        assert torch.equal(alone[0], full[b]), f"request {b} differs with its batch"
        assert torch.equal(lse[0], full_lse[b])


def test_disable_split_kv_decode_is_batch_invariant():
    lens, page = [5000] + [3] * 39, 16  # alone, the kernel would split the 5000 keys
    indptr, indices, last, cache, q = decode_batch(lens, page, seed=24)
    full, _ = run_decode(indptr, indices, last, cache, q, page, disable_split_kv=True)
    a, z = int(indptr[0]), int(indptr[1])
    alone, _ = run_decode(
        torch.tensor([0, z - a]).int(),
        indices[a:z],
        last[:1],
        cache,
        q[:1],
        page,
        disable_split_kv=True,
    )
    assert torch.equal(alone[0], full[0])


def test_single_prefill_takes_a_flattened_custom_mask():
    q, k, v = rand(5, 2, 64, seed=26), rand(9, 2, 64, seed=27), rand(9, 2, 64, seed=28)
    mask = rand(5, 9, seed=29) > 0
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask.reshape(-1))
    assert torch.equal(o, flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask))
    close(o, attention(q, k, v, mask=mask)[0], 1e-4)


def test_return_lse_names():
    q, k, v = rand(5, 2, 64, seed=30), rand(9, 2, 64, seed=31), rand(9, 2, 64, seed=32)
    o, lse = flashinfer.single_prefill_with_kv_cache_return_lse(q, k, v)
    ro, rlse = flashinfer.single_prefill_with_kv_cache(q, k, v, return_lse=True)
    assert torch.equal(o, ro) and torch.equal(lse, rlse)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    w.plan(torch.tensor([0, 5]), torch.tensor([0, 9]), 2, 2, 64, q_data_type=torch.float32)
    wo, wlse = w.run_return_lse(q, k, v)
    assert torch.equal(wo, ro) and torch.equal(wlse, rlse)
    fo, flse = w.forward_return_lse(q, k, v, causal=True)
    co, clse = attention(q, k, v, causal=True)
    close(fo, co, 1e-4)
    close(flse, clse, 1e-4)


def test_decode_forward_replaces_the_planned_settings():
    indptr, indices, last, cache, q = decode_batch([40], 16, seed=33)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    w.plan(indptr, indices, last, 8, 4, 128, 16, q_data_type=torch.float32)
    capped, lse = w.forward_return_lse(q, cache, logits_soft_cap=5.0)
    keys = cache[:, 0].reshape(-1, 4, 128)[:40]
    vals = cache[:, 1].reshape(-1, 4, 128)[:40]
    ro, rlse = attention(q, keys, vals, soft_cap=5.0)
    close(capped, ro, 1e-4)
    close(lse, rlse, 1e-3)


def test_use_tensor_cores_is_an_attribute():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, use_tensor_cores=True)
    assert w.use_tensor_cores is True
    assert flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE).use_tensor_cores is False


def test_fast_decode_plan_plans_like_plan():
    indptr, indices, last, cache, q = decode_batch([100, 33], 16, seed=34)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    flashinfer.fast_decode_plan(w, indptr, indices, last, 8, 4, 128, 16, q_data_type="float32")
    assert torch.equal(w.run(q, cache), run_decode(indptr, indices, last, cache, q, 16)[0])


def test_cuda_graph_decode_wrapper_runs_like_the_plain_one():
    indptr, indices, last, cache, q = decode_batch([60, 7], 16, seed=35)
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        WORKSPACE, indptr.clone(), indices.clone(), last.clone()
    )
    assert w.is_cuda_graph_enabled
    w.plan(indptr, indices, last, 8, 4, 128, 16, q_data_type=torch.float32)
    assert torch.equal(w.run(q, cache), run_decode(indptr, indices, last, cache, q, 16)[0])
