"""The CPU kernels' internal paths agree with each other and with torch: split decode
merged in key order, fp8 KV read without widening, small-m GEMMs that read B once, and
the vectorized fp4 quantizer against its strided (scalar) twin. FLASHINFER_CPU_ISA
(portable, avx2) lowers the SIMD level the kernels take, so every path runs here."""

import pytest
import torch
from attention_reference import TOLERANCE, attention
from test_fp4 import dequantize

import flashinfer
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.fp4_quantization import SfLayout, fp4_quantize


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return []


def simd_path(isa, *flags):
    missing = [f for f in flags if f not in cpu_flags()]
    return pytest.param(isa, marks=pytest.mark.skipif(bool(missing), reason=f"no {missing}"))


SIMD_PATHS = [
    simd_path("avx2", "avx2", "fma", "f16c"),
    simd_path("avx512", "avx512f", "avx512bw", "avx512vl", "avx512dq"),
]


def on_isa(monkeypatch, isa, fn):
    """fn() with the kernels held to isa ('avx512' is the widest: no cap)."""
    with monkeypatch.context() as mp:
        mp.setenv("FLASHINFER_CPU_ISA", isa)
        return fn()


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


def awkward_rows(m, k, dtype, seed):
    """m x k values whose 16-element blocks span 2^-30 to 2^30, with NaN, +-inf, +-0, float32
    denormals, a zero block, and a block (gsf 1: scale 1) of every E2M1 tie: 0.25, 0.75,
    1.25, 1.75, 2.5, 3.5, 5 and their negatives."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.randint(-30, 31, (m, k // 16, 1), generator=g).float().exp2()
    x = (torch.randn(m, k // 16, 16, generator=g) * mag).reshape(m, k)
    flat = x.view(-1)
    at = torch.randperm(flat.numel(), generator=g)[:60]
    specials = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, -3e-39, 6e-8]
    for i, v in zip(at.tolist(), specials * 8):
        flat[i] = v
    x[1, 32:48] = 0.0
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    x[2, 16:32] = torch.tensor(ties + [-t for t in ties])
    return x.to(dtype)


LAYOUTS = {"128x4": (True, False), "8x4": (True, True), "linear": (False, False)}


@pytest.mark.parametrize("isa", SIMD_PATHS)
@pytest.mark.parametrize("gsf", [1.0, 3.7, 1e30, -2.0])
@pytest.mark.parametrize("sv, ue8m0", [(16, False), (32, True), (16, True), (32, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp4_quantize_simd_paths_give_the_portable_bits(monkeypatch, isa, gsf, sv, ue8m0, dtype):
    # 299 blocks of 16 (149 of 32): two whole segments of 128 blocks, and a last one whose
    # blocks and elements leave tails of every SIMD step
    x = awkward_rows(9, 4784 if sv == 16 else 4768, dtype, seed=sv)
    for layout, (swizzled, eight_by_four) in LAYOUTS.items():

        def run(x=x, swizzled=swizzled, eight_by_four=eight_by_four):
            return fp4_quantize(x, torch.tensor(gsf), sv, ue8m0, swizzled, eight_by_four)

        q, sf = on_isa(monkeypatch, isa, run)
        ref_q, ref_sf = on_isa(monkeypatch, "portable", run)
        assert torch.equal(q, ref_q) and torch.equal(sf, ref_sf), layout


@pytest.mark.parametrize("isa", SIMD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nvfp4_per_token_simd_paths_give_the_portable_bits(monkeypatch, isa, dtype):
    x = awkward_rows(9, 4768, dtype, seed=5)
    x[4] = 0.0

    def run():
        return flashinfer.nvfp4_quantize(x, torch.tensor(1 / 2688), per_token_activation=True)

    got, ref = on_isa(monkeypatch, isa, run), on_isa(monkeypatch, "portable", run)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


ATTENTION_PATHS = [pytest.param("portable")] + SIMD_PATHS


@pytest.mark.parametrize("isa", ATTENTION_PATHS)
@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize(
    "kv_dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
)
def test_decode_every_path_matches_reference(monkeypatch, isa, group, kv_dtype):
    # 301 keys: a last block of 13, not a whole score tile
    g = torch.Generator().manual_seed(group)
    for d in (64, 128, 256):
        q_dtype = torch.bfloat16 if kv_dtype == torch.bfloat16 else torch.float16
        q = torch.randn(2 * group, d, generator=g).to(q_dtype)
        k = (torch.randn(301, 2, d, generator=g) * 4).to(kv_dtype)
        v = (torch.randn(301, 2, d, generator=g) * 4).to(kv_dtype)
        out = on_isa(monkeypatch, isa, lambda q=q, k=k, v=v: single_decode_with_kv_cache(q, k, v))
        ref, _ = attention(q[None], k.float(), v.float())
        tol = TOLERANCE[torch.bfloat16 if kv_dtype == torch.bfloat16 else torch.float16]
        torch.testing.assert_close(out.float(), ref[0], **tol)


@pytest.mark.parametrize("isa", ATTENTION_PATHS)
@pytest.mark.parametrize("group", [1, 4, 8])
def test_e4m3_nan_code_in_k_or_v_reaches_only_the_outputs_it_feeds(monkeypatch, isa, group):
    g = torch.Generator().manual_seed(group)
    q = torch.randn(2 * group, 128, generator=g).half()
    k = torch.randn(70, 2, 128, generator=g).to(torch.float8_e4m3fn)
    v = torch.randn(70, 2, 128, generator=g).to(torch.float8_e4m3fn)
    k_nan, v_nan = k.clone(), v.clone()
    k_nan.view(torch.uint8)[40, 1, 5] = 0xFF  # -NaN: kv head 1's scores, so all its outputs
    v_nan.view(torch.uint8)[7, 0, 3] = 0x7F  # NaN: column 3 of kv head 0's outputs
    out_k = on_isa(monkeypatch, isa, lambda: single_decode_with_kv_cache(q, k_nan, v)).float()
    out_v = on_isa(monkeypatch, isa, lambda: single_decode_with_kv_cache(q, k, v_nan)).float()
    assert out_k[group:].isnan().all() and not out_k[:group].isnan().any()
    assert out_v[:group, 3].isnan().all()
    assert out_v.isnan().sum() == group
