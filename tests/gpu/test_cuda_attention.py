"""CUDA attention against the CPU kernel (same semantics) and the torch reference."""

import pytest
import torch
from attention_reference import attention as reference
from test_attention_parity import nvfp4_tensor

import flashinfer
from flashinfer import _kernels

TOL = dict(atol=2e-3, rtol=2e-3)


def cuda(*ts):
    return [t.cuda() if isinstance(t, torch.Tensor) else t for t in ts]


def assert_close(got, want, **tol):
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            assert_close(g, w, **tol)
        return
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu().float(), want.float(), **(tol or TOL))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_single_decode_matches_cpu(layout, dtype, head_dim):
    torch.manual_seed(0)
    kv_len = 300
    q = torch.randn(8, head_dim).to(dtype)
    shape = (kv_len, 2, head_dim) if layout == "NHD" else (2, kv_len, head_dim)
    k, v = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    want = flashinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True)
    got = flashinfer.single_decode_with_kv_cache(*cuda(q, k, v), kv_layout=layout, return_lse=True)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else TOL
    assert_close(got, want, **tol)


@pytest.mark.parametrize("kv_len", [4096, 33000])
def test_single_decode_split_kv_long_context(kv_len):
    torch.manual_seed(1)
    q = torch.randn(32, 128, dtype=torch.float16)
    k = torch.randn(kv_len, 8, 128, dtype=torch.float16)
    v = torch.randn(kv_len, 8, 128, dtype=torch.float16)
    o, lse = flashinfer.single_decode_with_kv_cache(*cuda(q, k, v), return_lse=True)
    ro, rlse = reference(q.unsqueeze(0), k, v)
    assert_close(o, ro[0].to(torch.float16))
    torch.testing.assert_close(lse.cpu(), rlse[0], atol=1e-3, rtol=1e-4)


def test_batch_decode_batch_one_long_context_with_fp8_kv():
    torch.manual_seed(2)
    page_size, pages = 16, 1000
    kc = torch.randn(pages, page_size, 4, 128).to(torch.float8_e4m3fn)
    vc = torch.randn(pages, page_size, 4, 128).to(torch.float8_e4m3fn)
    indptr = torch.tensor([0, pages], dtype=torch.int32)
    indices = torch.randperm(pages).to(torch.int32)
    last = torch.tensor([7], dtype=torch.int32)
    q = torch.randn(1, 16, 128, dtype=torch.float16)
    outs = []
    for dev in ("cpu", "cuda"):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device=dev))
        w.plan(
            indptr,
            indices,
            last,
            16,
            4,
            128,
            page_size,
            q_data_type=torch.float16,
            kv_data_type=torch.float8_e4m3fn,
        )
        outs.append(
            w.run(q.to(dev), (kc.to(dev), vc.to(dev)), k_scale=0.5, v_scale=2.0, return_lse=True)
        )
    assert_close(outs[1], outs[0])


def test_batch_decode_run_twice_reuses_plan():
    torch.manual_seed(3)
    kc = torch.randn(20, 8, 2, 64, dtype=torch.float16, device="cuda")
    vc = torch.randn(20, 8, 2, 64, dtype=torch.float16, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device="cuda"))
    w.plan(
        torch.tensor([0, 5, 5, 20], dtype=torch.int32),
        torch.arange(20, dtype=torch.int32),
        torch.tensor([3, 0, 8], dtype=torch.int32),
        4,
        2,
        64,
        8,
    )
    q = torch.randn(3, 4, 64, dtype=torch.float16, device="cuda")
    a, lse = w.run(q, (kc, vc), return_lse=True)
    b = w.run(q, (kc, vc))
    assert torch.equal(a, b)
    assert torch.equal(a[1].cpu(), torch.zeros(4, 64, dtype=torch.float16))
    assert torch.isneginf(lse[1].cpu()).all()


@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=True),
        dict(causal=True, window_left=20),
        dict(logits_soft_cap=30.0),
        dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5),
        dict(causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0),
    ],
)
def test_single_prefill_matches_cpu(kw):
    torch.manual_seed(4)
    q = torch.randn(77, 8, 128, dtype=torch.float16)
    k = torch.randn(200, 2, 128, dtype=torch.float16)
    v = torch.randn(200, 2, 128, dtype=torch.float16)
    want = flashinfer.single_prefill_with_kv_cache(q, k, v, return_lse=True, **kw)
    got = flashinfer.single_prefill_with_kv_cache(*cuda(q, k, v), return_lse=True, **kw)
    assert_close(got, want)


def test_single_prefill_custom_mask_matches_reference():
    torch.manual_seed(5)
    q = torch.randn(33, 4, 64, dtype=torch.float16)
    k = torch.randn(90, 4, 64, dtype=torch.float16)
    v = torch.randn(90, 4, 64, dtype=torch.float16)
    mask = torch.rand(33, 90) > 0.3
    got = flashinfer.single_prefill_with_kv_cache(*cuda(q, k, v), custom_mask=mask.cuda())
    ro, _ = reference(q, k, v, mask=mask)
    assert_close(got, ro.to(torch.float16))


def test_prefill_rows_that_see_no_key_are_zero_with_minus_inf_lse():
    q = torch.randn(10, 2, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(4, 2, 64, dtype=torch.float16, device="cuda")
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, k, causal=True, return_lse=True)
    assert torch.equal(o[:6].cpu(), torch.zeros(6, 2, 64, dtype=torch.float16))
    assert torch.isneginf(lse[:6].cpu()).all()
    assert torch.isfinite(lse[6:].cpu()).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_prefill_paged_matches_cpu(layout):
    torch.manual_seed(6)
    qo_indptr = torch.tensor([0, 5, 5, 40, 41], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 3, 4, 10, 30], dtype=torch.int32)
    indices = torch.randperm(40)[:30].to(torch.int32)
    last = torch.tensor([2, 16, 9, 1], dtype=torch.int32)
    shape = (40, 16, 2, 64) if layout == "NHD" else (40, 2, 16, 64)
    kc, vc = torch.randn(shape).half(), torch.randn(shape).half()
    q = torch.randn(41, 6, 64).half()
    outs = []
    for dev in ("cpu", "cuda"):
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(1, device=dev), kv_layout=layout
        )
        w.plan(qo_indptr, kv_indptr, indices, last, 6, 2, 64, 16, causal=True)
        outs.append(w.run(q.to(dev), (kc.to(dev), vc.to(dev)), return_lse=True))
    assert_close(outs[1], outs[0])


def test_batch_prefill_ragged_matches_cpu():
    torch.manual_seed(7)
    qo_indptr = torch.tensor([0, 100, 101, 164], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 100, 700, 800], dtype=torch.int32)
    q = torch.randn(164, 4, 128).bfloat16()
    k, v = torch.randn(800, 4, 128).bfloat16(), torch.randn(800, 4, 128).bfloat16()
    outs = []
    for dev in ("cpu", "cuda"):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1, device=dev))
        w.plan(qo_indptr, kv_indptr, 4, 4, 128, causal=True, q_data_type=torch.bfloat16)
        outs.append(w.run(q.to(dev), k.to(dev), v.to(dev), return_lse=True))
    assert_close(outs[1], outs[0], atol=1e-2, rtol=1e-2)


def test_runs_on_the_current_stream():
    q = torch.randn(4, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(5000, 4, 64, dtype=torch.float16, device="cuda")
    want = flashinfer.single_decode_with_kv_cache(q, k, k)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = flashinfer.single_decode_with_kv_cache(q, k, k)
    s.synchronize()
    assert torch.equal(got, want)


def test_mixed_devices_name_the_argument():
    q = torch.randn(1, 2, 64, device="cuda")
    k = torch.randn(4, 2, 64, device="cuda")
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="qo_indptr is on cpu:0 but q is on cuda:0"):
        _kernels.attention(
            q,
            k,
            k,
            out,
            None,
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([0, 4], dtype=torch.int32).cuda(),
        )


def test_bad_page_index_on_cuda_is_a_value_error():
    kc = torch.randn(2, 4, 1, 64, device="cuda")
    q = torch.randn(1, 1, 64, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"kv_indices\[0\] is 7"):
        _kernels.attention(
            q,
            kc,
            kc,
            torch.empty_like(q),
            None,
            torch.tensor([0, 1], **i32),
            torch.tensor([0, 1], **i32),
            kv_indices=torch.tensor([7], **i32),
            kv_last_page_len=torch.tensor([1], **i32),
        )


def test_single_decode_is_captured_and_replayed_in_a_cuda_graph():
    q = torch.randn(4, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(50, 4, 64, dtype=torch.float16, device="cuda")
    expected = flashinfer.single_decode_with_kv_cache(q, k, k)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flashinfer.single_decode_with_kv_cache(q, k, k)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_batch_decode_run_is_captured_after_plan():
    torch.manual_seed(0)
    page_size, num_pages, batch = 16, 12, 3
    kv = torch.randn(num_pages, 2, page_size, 4, 64, dtype=torch.float16, device="cuda")
    q = torch.randn(batch, 8, 64, dtype=torch.float16, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    )
    wrapper.plan(
        torch.tensor([0, 4, 8, 12], dtype=torch.int32),
        torch.arange(12, dtype=torch.int32),
        torch.tensor([16, 3, 9], dtype=torch.int32),
        8,
        4,
        64,
        page_size,
    )
    expected = wrapper.run(q, kv)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = wrapper.run(q, kv)
    q.mul_(0.5)
    expected = wrapper.run(q, kv)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_capture_without_host_index_copies_is_refused_with_a_message():
    q = torch.randn(1, 4, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(50, 4, 64, dtype=torch.float16, device="cuda")
    indptr_q = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    indptr_kv = torch.tensor([0, 50], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturing a CUDA graph and qo_indptr has no host"):
        with torch.cuda.graph(g):
            # torch captures on a stream of its own: the kernel is asked on that one (the
            # legacy default stream may not even be queried during a global capture)
            stream = torch.cuda.current_stream().cuda_stream
            _kernels.attention(q, k, k, out, None, indptr_q, indptr_kv, stream=stream)


@pytest.mark.parametrize("fixed_split_size", [None, 1, -1])
def test_decode_sinks_nvfp4_kv_and_split_hints_match_cpu(fixed_split_size):
    torch.manual_seed(3)
    page_size, pages, hq, hkv, d = 16, 300, 8, 2, 128
    kv, sf, _ = nvfp4_tensor((pages, 2, page_size, hkv, d), 4)
    indptr = torch.tensor([0, 250, 300], dtype=torch.int32)
    indices = torch.randperm(pages).to(torch.int32)
    last = torch.tensor([5, 16], dtype=torch.int32)
    q = torch.randn(2, hq, d, dtype=torch.bfloat16)
    sinks = torch.randn(hq)
    outs = []
    for dev in ("cpu", "cuda"):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device=dev))
        hint = {} if fixed_split_size is None else dict(fixed_split_size=fixed_split_size)
        if fixed_split_size == -1:
            hint = dict(disable_split_kv=True)
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
            **hint,
        )
        outs.append(
            w.run(
                q.to(dev), kv.to(dev), kv_cache_sf=sf.to(dev), sinks=sinks.to(dev), return_lse=True
            )
        )
    assert_close(outs[1], outs[0], atol=1e-2, rtol=1e-2)


def test_fixed_split_size_is_batch_invariant():
    torch.manual_seed(5)
    k = torch.randn(20 * 16, 2, 64, dtype=torch.float16, device="cuda")
    cache = torch.stack([k, k], 1).reshape(20, 16, 2, 2, 64).transpose(1, 2).contiguous()
    q = torch.randn(3, 4, 64, dtype=torch.float16, device="cuda")
    outs = []
    for batch in (1, 3):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device="cuda"))
        indptr = torch.arange(batch + 1, dtype=torch.int32) * 20
        w.plan(
            indptr,
            torch.arange(20, dtype=torch.int32).repeat(batch),
            torch.full((batch,), 16, dtype=torch.int32),
            4,
            2,
            64,
            16,
            fixed_split_size=4,
        )
        outs.append(w.run(q[:batch], cache)[0])
    assert torch.equal(outs[0], outs[1])


def test_ragged_v_indptr_o_indptr_and_sinks_match_cpu():
    torch.manual_seed(6)
    qo_indptr = torch.tensor([0, 3, 700], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 900, 1000], dtype=torch.int32)
    v_indptr = torch.tensor([100, 0, 1000], dtype=torch.int32)
    o_indptr = torch.tensor([697, 0, 700], dtype=torch.int32)
    q = torch.randn(700, 4, 64, dtype=torch.float16)
    k = torch.randn(1000, 2, 64, dtype=torch.float16)
    v = torch.randn(1000, 2, 64, dtype=torch.float16)
    outs = []
    for dev in ("cpu", "cuda"):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1, device=dev))
        w.plan(qo_indptr, kv_indptr, 4, 2, 64, causal=True, v_indptr=v_indptr, o_indptr=o_indptr)
        outs.append(
            w.run(*(t.to(dev) for t in (q, k, v)), return_lse=True, lse_layout="HN", lse_base="ln")
        )
    assert_close(outs[1], outs[0])
    cache = torch.randn(8, 2, 16, 2, 64, dtype=torch.float16)
    sinks = torch.randn(4)
    res = []
    for dev in ("cpu", "cuda"):
        p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1, device=dev))
        p.plan(
            torch.tensor([0, 5], dtype=torch.int32),
            torch.tensor([0, 8], dtype=torch.int32),
            torch.arange(8, dtype=torch.int32),
            torch.tensor([9], dtype=torch.int32),
            4,
            2,
            64,
            16,
            causal=True,
        )
        res.append(p.run(q[:5].to(dev), cache.to(dev), sinks=sinks.to(dev), return_lse=True))
    assert_close(res[1], res[0])


@pytest.mark.parametrize("kv_len", [300, 33000])  # one split, and split with a merge
def test_nan_and_inf_propagate_as_in_the_reference(kv_len):
    """A NaN in q or k makes that query's row NaN, one in v its column; a +inf score is
    NaN, a -inf one weighs nothing, a head whose every score is -inf sees nothing."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(8, 128, generator=g)
    k = torch.randn(kv_len, 4, 128, generator=g)
    v = torch.randn(kv_len, 4, 128, generator=g)
    q[1, 7] = float("nan")  # qo head 1 (kv head 0)
    k[kv_len - 5, 1, 0] = float("nan")  # qo heads 2, 3: the last split only
    v[45, 0, 9] = float("nan")  # column 9 of qo heads 0, 1
    k[17, 2] = float("inf") * q[4].sign()  # qo head 4: a +inf score
    k[:, 3] = float("-inf") * q[6].sign()  # qo head 6: every score -inf
    o, lse = flashinfer.single_decode_with_kv_cache(*cuda(q, k, v), return_lse=True)
    ro, rlse = reference(q[None], k, v)
    assert o[1].isnan().all() and o[2:5].isnan().all() and o[0, 9].isnan()
    assert (o[6] == 0).all() and lse[6].item() == float("-inf")
    kw = dict(atol=1e-3, rtol=1e-3, equal_nan=True)
    torch.testing.assert_close(o.cpu(), ro[0], **kw)
    torch.testing.assert_close(lse.cpu(), rlse[0], **kw)


def test_nan_reaches_the_prefill_rows_that_see_it():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(70, n, 64, generator=g) for n in (4, 2, 2))
    q[10, 3, 1] = float("nan")
    k[40, 0, 0] = float("nan")
    v[0, 1, 7] = float("nan")
    o, lse = flashinfer.single_prefill_with_kv_cache(*cuda(q, k, v), causal=True, return_lse=True)
    ro, rlse = reference(q, k, v, causal=True)
    assert not o[:40, :2].isnan().any() and o[40:, :2].isnan().all()
    kw = dict(atol=1e-3, rtol=1e-3, equal_nan=True)
    torch.testing.assert_close(o.cpu(), ro, **kw)
    torch.testing.assert_close(lse.cpu(), rlse, **kw)
