"""NVFP4 / MXFP4 quantization bit-exact against a short torch reference of the rule in
docs/kernels.md#fp4-quantization,
scale layouts, round trip, and mm_fp4 against dequantize-then-matmul (float32
accumulation, bf16 output: within 1e-2 relative to the reference's max)."""

import pytest
import torch

from flashinfer.autotuner import autotune
from flashinfer.fp4_quantization import SfLayout, fp4_quantize, nvfp4_quantize
from flashinfer.gemm import mm_fp4

ONE = torch.tensor(1.0)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def ref_e2m1(v):
    """E2M1 codes, ties to the even code, saturating at 6; sign in bit 3."""
    a = v.abs()
    code = (
        (a > 0.25).int()
        + (a >= 0.75).int()
        + (a > 1.25).int()
        + (a >= 1.75).int()
        + (a > 2.5).int()
        + (a >= 3.5).int()
        + (a > 5.0).int()
    )
    return (code + 8 * torch.signbit(v).int()).to(torch.uint8)


def ref_quantize(x, gsf, sv=16, ue8m0=False):
    """Returns (packed codes [m, k/2], scale bytes [m, k/sv]) by docs/kernels.md#fp4-quantization."""
    x = x.float()
    m, k = x.shape
    blocks = x.reshape(m, k // sv, sv)
    amax = blocks.abs().amax(-1)
    v = (gsf * amax) / 6.0
    if ue8m0:
        mant, exp = torch.frexp(v)
        e = torch.where(mant == 0.5, exp - 1, exp)
        code = torch.where(v > 0, (e + 127).clamp(0, 254), 0).to(torch.uint8)
        sf = torch.where(v > 0, torch.ldexp(torch.ones_like(v), code.int() - 127), 0.0)
    else:
        code = v.to(torch.float8_e4m3fn).view(torch.uint8)
        sf = code.view(torch.float8_e4m3fn).float()
    scale = torch.where(sf == 0, 0.0, gsf / sf)
    codes = ref_e2m1(blocks * scale[..., None])
    codes = torch.where(sf[..., None] == 0, 0, codes).reshape(m, k).to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), code


def swizzle_128x4(sf):
    rows, cols = sf.shape
    mp, kp = (rows + 127) // 128 * 128, (cols + 3) // 4 * 4
    out = torch.zeros(mp * kp, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            at = ((r // 128) * (kp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
            out[at + c % 4] = sf[r, c]
    return out


def swizzle_8x4(sf):
    rows, cols = sf.shape
    mp, kp = (rows + 7) // 8 * 8, (cols + 3) // 4 * 4
    out = torch.zeros(mp * kp, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            out[((r // 8) * (kp // 4) + c // 4) * 32 + (r % 8) * 4 + c % 4] = sf[r, c]
    return out


def dequantize(q, sf_bytes, sv=16, ue8m0=False):
    codes = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).long()
    vals = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    if ue8m0:
        sf = torch.ldexp(torch.ones(sf_bytes.shape), sf_bytes.int() - 127)
    else:
        sf = sf_bytes.view(torch.float8_e4m3fn).float()
    return vals * sf.repeat_interleave(sv, dim=1)


def _data(m, k, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[1, :16] = 0.0  # a zero block
    return x.to(dtype)


def test_sf_layout_values():
    assert (SfLayout.layout_128x4, SfLayout.layout_8x4, SfLayout.layout_linear) == (0, 1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nvfp4_linear_layout_bit_exact(dtype):
    x = _data(37, 96, 1, dtype)
    gsf = torch.tensor(448.0 * 6 / x.float().abs().max().item())
    q, sf = nvfp4_quantize(x, gsf, sfLayout=SfLayout.layout_linear)
    rq, rsf = ref_quantize(x, gsf)
    assert q.dtype == torch.uint8 and sf.dtype == torch.uint8
    assert torch.equal(q, rq)
    assert torch.equal(sf, rsf)


def test_nvfp4_128x4_layout_pads_odd_m_with_zeros():
    x = _data(131, 48, 2)  # 3 blocks per row: padded to 4, rows padded to 256
    gsf = torch.tensor(2.0)
    q, sf = nvfp4_quantize(x, gsf)
    rq, rsf = ref_quantize(x, gsf)
    assert torch.equal(q, rq)
    assert torch.equal(sf.reshape(-1), swizzle_128x4(rsf))
    assert sf.numel() == 256 * 4


def test_nvfp4_128x4_sf_shape_is_rows_by_blocks():
    q, sf = nvfp4_quantize(_data(5, 64, 3), torch.tensor(1.0))
    assert q.shape == (5, 32) and sf.shape == (128, 4)


def test_fp4_quantize_8x4_layout():
    x = _data(13, 80, 4)
    gsf = torch.tensor(3.0)
    q, sf = fp4_quantize(x, gsf, is_sf_8x4_layout=True)
    rq, rsf = ref_quantize(x, gsf)
    assert torch.equal(q, rq)
    assert torch.equal(sf.reshape(-1), swizzle_8x4(rsf))


def test_values_past_saturation_clamp_scale_and_codes():
    x = _data(4, 32, 5) * 1000
    gsf = torch.tensor(1000.0)  # gsf * amax / 6 is far past 448
    q, sf = fp4_quantize(x, gsf, is_sf_swizzled_layout=False)
    rq, rsf = ref_quantize(x, gsf)
    assert torch.equal(sf, rsf) and (sf[0] == 0x7E).all()  # row 1 starts with a zero block
    assert torch.equal(q, rq)


def test_ties_round_to_even_code():
    # amax 6 with global scale 1 gives sf = 1: codes come from the values themselves
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, -2.5, 0.1, -6.0, 1.0, 0, 0]
    x = torch.tensor([row])
    q, sf = fp4_quantize(x, torch.tensor(1.0), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x38]]  # 1.0 in e4m3
    codes = torch.stack([q & 15, q >> 4], -1).reshape(-1).tolist()
    assert codes == [7, 0, 2, 2, 4, 4, 6, 6, 8, 14, 12, 0, 15, 2, 0, 0]


def test_zero_block_has_zero_scale_and_codes():
    x = torch.zeros(2, 32)
    x[0, 16:] = 1.0
    q, sf = fp4_quantize(x, torch.tensor(1.0), is_sf_swizzled_layout=False)
    assert sf[0, 0] == 0 and sf[1].tolist() == [0, 0]
    assert (q[:, :8] == 0).all() and (q[1] == 0).all()


def test_round_trip_exact_for_representable_values():
    g = torch.Generator().manual_seed(6)
    vals = E2M1[torch.randint(0, 8, (8, 64), generator=g)] * torch.where(
        torch.rand(8, 64, generator=g) < 0.5, -1.0, 1.0
    )
    vals[:, ::16] = 6.0  # every block's amax is 6 -> sf = 1 with global scale 1
    q, sf = fp4_quantize(vals, torch.tensor(1.0), is_sf_swizzled_layout=False)
    assert torch.equal(dequantize(q, sf), vals)


def test_global_scale_inversed_uses_reciprocal():
    x = _data(3, 32, 7)
    q1, sf1 = fp4_quantize(x, torch.tensor(4.0), is_sf_swizzled_layout=False)
    q2, sf2 = fp4_quantize(
        x, torch.tensor(0.25), is_sf_swizzled_layout=False, is_global_scale_inversed=True
    )
    assert torch.equal(q1, q2) and torch.equal(sf1, sf2)


def test_mxfp4_ue8m0_bit_exact():
    x = _data(9, 64, 8)
    q, sf = fp4_quantize(x, torch.tensor(1.0), 32, True, False)
    rq, rsf = ref_quantize(x, torch.tensor(1.0), sv=32, ue8m0=True)
    assert torch.equal(sf, rsf)
    assert torch.equal(q, rq)


def test_mm_fp4_matches_dequantized_matmul():
    a = _data(45, 128, 9)
    w = _data(70, 128, 10)
    a_gsf = torch.tensor(448.0 * 6 / a.abs().max().item())
    w_gsf = torch.tensor(448.0 * 6 / w.abs().max().item())
    a_q, a_sf = nvfp4_quantize(a, a_gsf)
    w_q, w_sf = nvfp4_quantize(w, w_gsf)
    alpha = 1.0 / (a_gsf * w_gsf)
    out = mm_fp4(a_q, w_q.T, a_sf, w_sf.T, alpha, torch.bfloat16)
    _, a_lin = nvfp4_quantize(a, a_gsf, sfLayout=SfLayout.layout_linear)
    _, w_lin = nvfp4_quantize(w, w_gsf, sfLayout=SfLayout.layout_linear)
    ref = (dequantize(a_q, a_lin) @ dequantize(w_q, w_lin).T) * alpha
    assert out.shape == (45, 70) and out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_mm_fp4_linear_and_8x4_scales_give_same_result():
    """use_8x4_sf_layout: a's scales are 8x4, the weight's stay 128x4 (FlashInfer's rule)."""
    a, w = _data(9, 64, 11), _data(10, 64, 12)
    one = torch.tensor(1.0)
    results = []
    for layout in (SfLayout.layout_128x4, SfLayout.layout_linear, SfLayout.layout_8x4):
        eight = layout == SfLayout.layout_8x4
        a_q, a_sf = nvfp4_quantize(a, one, sfLayout=layout)
        w_q, w_sf = nvfp4_quantize(w, one, sfLayout=SfLayout.layout_128x4 if eight else layout)
        results.append(mm_fp4(a_q, w_q.T, a_sf, w_sf.T, use_8x4_sf_layout=eight))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_mm_fp4_mxfp4():
    a, w = _data(6, 64, 13), _data(7, 64, 14)
    one = torch.tensor(1.0)
    a_q, a_sf = fp4_quantize(a, one, 32, True)
    w_q, w_sf = fp4_quantize(w, one, 32, True)
    out = mm_fp4(a_q, w_q.T, a_sf, w_sf.T, None, torch.float16, block_size=32, use_nvfp4=False)
    _, a_lin = fp4_quantize(a, one, 32, True, False)
    _, w_lin = fp4_quantize(w, one, 32, True, False)
    ref = dequantize(a_q, a_lin, 32, True) @ dequantize(w_q, w_lin, 32, True).T
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_autotune_is_a_context_manager():
    from flashinfer.autotuner import is_tuning_enabled

    with autotune():
        assert is_tuning_enabled()
        with autotune(False):
            assert not is_tuning_enabled()
    assert not is_tuning_enabled()


def test_mm_fp4_8x4_activation_scales_with_128x4_weight_scales():
    a, w = _data(5, 64, 15), _data(12, 64, 16)
    one = torch.tensor(1.0)
    a_q, a_sf8 = nvfp4_quantize(a, one, sfLayout=SfLayout.layout_8x4)
    _, a_sf = nvfp4_quantize(a, one, sfLayout=SfLayout.layout_128x4)
    w_q, w_sf = nvfp4_quantize(w, one, sfLayout=SfLayout.layout_128x4)
    eight = mm_fp4(a_q, w_q.T, a_sf8, w_sf.T, use_8x4_sf_layout=True)
    plain = mm_fp4(a_q, w_q.T, a_sf, w_sf.T)
    assert torch.equal(eight, plain)


def ref_per_token(x, scale_inv):
    """Per-token NVFP4 in FlashInfer's order of operations: the row's encode scale is
    min((1 / scale_inv) / amax(row), FLT_MAX), its returned scale 1 / encode (0 for a zero
    row), and the row is quantized with the encode scale as its global scale."""
    amax = x.float().abs().amax(1)
    encode = torch.clamp((1.0 / scale_inv.float()) / amax, max=torch.finfo(torch.float32).max)
    encode = torch.where(amax == 0, 0.0, encode)
    s = torch.where(amax == 0, 0.0, 1.0 / encode)
    rows = [ref_quantize(x[r : r + 1], encode[r]) for r in range(x.shape[0])]
    return torch.cat([q for q, _ in rows]), torch.cat([sf for _, sf in rows]), s


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nvfp4_per_token_bit_exact(dtype):
    x = _data(11, 64, 20, dtype)
    inv = torch.tensor([1.0 / (448 * 6)])
    q, sf, s = nvfp4_quantize(x, inv, sfLayout=SfLayout.layout_linear, per_token_activation=True)
    rq, rsf, rs = ref_per_token(x, inv)
    assert torch.equal(q, rq) and torch.equal(sf, rsf)
    assert torch.equal(s, rs) and s.dtype == torch.float32


def test_nvfp4_per_token_sf_is_padded_rows_by_padded_blocks():
    x = _data(5, 48, 21)
    q, sf, s = nvfp4_quantize(x, 1.0 / 2688, per_token_activation=True)
    assert sf.shape == (128, 4) and q.shape == (5, 24) and s.shape == (5,)
    _, rsf, _ = ref_per_token(x, torch.tensor([1.0 / 2688]))
    assert torch.equal(sf.reshape(-1), swizzle_128x4(rsf))


def test_nvfp4_per_token_zero_row_has_zero_scale_and_codes():
    x = _data(3, 32, 22)
    x[2] = 0.0
    q, sf, s = nvfp4_quantize(x, 1.0, sfLayout=SfLayout.layout_linear, per_token_activation=True)
    assert s[2] == 0 and (q[2] == 0).all() and (sf[2] == 0).all()


def test_nvfp4_per_token_out_scale_multiplies_only_the_returned_scales():
    x = _data(4, 32, 23)
    q, sf, s = nvfp4_quantize(x, 0.01, per_token_activation=True)
    q2, sf2, s2 = nvfp4_quantize(x, 0.01, per_token_activation=True, out_scale=torch.tensor(3.0))
    assert torch.equal(q, q2) and torch.equal(sf, sf2)
    assert torch.equal(s2, s * torch.tensor(3.0))


def test_nvfp4_per_token_row_map_quantizes_the_named_rows_only():
    x = _data(5, 32, 24)
    rows = torch.tensor([3, -1, 0, -1, 4, 1], dtype=torch.int32)  # entries past m are not read
    q, sf, s = nvfp4_quantize(
        x,
        0.01,
        sfLayout=SfLayout.layout_linear,
        per_token_activation=True,
        expanded_idx_to_permuted_idx=rows,
    )
    rq, rsf, rs = ref_per_token(x, torch.tensor([0.01]))
    named = [0, 3, 4]
    assert torch.equal(q[named], rq[named]) and torch.equal(sf[named], rsf[named])
    assert torch.equal(s[named], rs[named])
    assert (q[[1, 2]] == 0).all() and (s[[1, 2]] == 0).all()


@pytest.mark.parametrize("bad, what", [([0, 5, 1], "is 5"), ([2, 2, -1], "is 2")])
def test_nvfp4_per_token_row_map_out_of_range_or_repeated(bad, what):
    with pytest.raises(ValueError, match=rf"expanded_idx_to_permuted_idx\[\d\] {what}; accepted"):
        nvfp4_quantize(
            _data(3, 32, 25),
            1.0,
            per_token_activation=True,
            expanded_idx_to_permuted_idx=torch.tensor(bad, dtype=torch.int32),
        )


def test_per_token_options_need_per_token_activation():
    x = _data(3, 32, 26)
    with pytest.raises(ValueError, match="out_scale is only supported with per_token_activation"):
        nvfp4_quantize(x, ONE, out_scale=ONE)
    with pytest.raises(ValueError, match="expanded_idx_to_permuted_idx is only supported"):
        nvfp4_quantize(x, ONE, expanded_idx_to_permuted_idx=torch.zeros(3, dtype=torch.int32))


def e4m3(v):
    return v.to(torch.float8_e4m3fn)


def ref_4over6(x, gsf, mse=False, e4m3_max=448, row_amax=None):
    """FlashInfer's 4over6 block rule in float32 torch ops: candidates sf6 = (amax / 6) *
    gsf and sf4 = 1.5 * sf6 as E4M3, codes e2m1(x * min(1 / (sf * (1 / gsf)), f32 max)),
    error summed per half block of 8 (|d| or d^2) and the halves added; the smaller wins,
    ties to sf6. d = dequantized - x, dequantized in the row's units in per-token mode."""
    x = x.float()
    m, k = x.shape
    blocks = x.reshape(m, k // 16, 16)
    amax = blocks.abs().amax(-1, keepdim=True)
    gsf = torch.as_tensor(gsf, dtype=torch.float32).reshape(-1, 1, 1)
    sf6 = (amax / 6.0) * gsf
    picks = []
    decode = 1.0 / gsf
    for sf_hp in (sf6 * 1.5, sf6):
        code = e4m3(sf_hp)
        sf = code.float()
        scale = torch.clamp(1.0 / (sf * decode), max=torch.finfo(torch.float32).max)
        q = e2m1_codes(blocks * scale)
        v = E2M1_VALUES[q.long()]
        if row_amax is not None:
            deq = ((v * sf) * row_amax.reshape(-1, 1, 1)) / (6.0 * e4m3_max)
        else:
            deq = (v * sf) * decode
        d = deq - blocks
        term = d * d if mse else d.abs()
        err = term[..., :8].sum(-1, keepdim=True) + term[..., 8:].sum(-1, keepdim=True)
        picks.append((err, code.view(torch.uint8), q))
    (e4, c4, q4), (e6, c6, q6) = picks
    use4 = e4 < e6
    codes = torch.where(use4, q4, q6)
    sf = torch.where(use4[..., 0], c4[..., 0], c6[..., 0])
    zero = amax[..., 0] == 0
    sf = torch.where(zero, 0, sf)
    codes = torch.where(zero[..., None], 0, codes).reshape(m, k)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8), sf.to(torch.uint8)


E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e2m1_codes(v):
    """E2M1 codes of float32 values, nearest with ties to the even code, saturating at 6."""
    mags = E2M1_VALUES[:8]
    a = v.abs().clamp(max=6.0)
    dist = (a[..., None] - mags).abs()
    best = dist.min(-1, keepdim=True).values
    ties = dist == best
    even = ties & (torch.arange(8) % 2 == 0)
    idx = torch.where(even.any(-1), even.int().argmax(-1), ties.int().argmax(-1))
    return (idx + 8 * (v < 0)).to(torch.uint8)


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_4over6_matches_the_block_rule(mode, dtype):
    from flashinfer.quantization import NVFP44Over6Config

    x = _data(9, 64, 28, dtype)
    gsf = torch.tensor([448 * 6 / float(x.float().abs().max())])
    cfg = NVFP44Over6Config(err_mode=mode)
    q, sf = nvfp4_quantize(x, gsf, sfLayout=SfLayout.layout_linear, nvfp4_4over6=cfg)
    rq, rsf = ref_4over6(x, gsf, mse=mode == "MSE")
    assert torch.equal(sf, rsf) and torch.equal(q, rq)
    plain = nvfp4_quantize(x, gsf, sfLayout=SfLayout.layout_linear, nvfp4_4over6=None)
    assert not torch.equal(plain[1], sf)  # some blocks took the 4/6 scale


def test_nvfp4_4over6_per_token_measures_in_row_units():
    from flashinfer.quantization import NVFP44Over6Config

    x = _data(7, 32, 29, torch.bfloat16)
    inv = torch.tensor([1.0 / (256 * 6)])
    cfg = NVFP44Over6Config(e4m3_max=256)
    q, sf, s = nvfp4_quantize(
        x, inv, sfLayout=SfLayout.layout_linear, per_token_activation=True, nvfp4_4over6=cfg
    )
    amax = x.float().abs().amax(1)
    encode = torch.where(amax == 0, 0.0, (1.0 / inv) / amax)
    rq, rsf = ref_4over6(x, encode, e4m3_max=256, row_amax=amax)
    assert torch.equal(q[amax > 0], rq[amax > 0]) and torch.equal(sf, rsf)


def test_nvfp4_4over6_from_the_environment(monkeypatch):
    x = _data(3, 32, 27)
    base = nvfp4_quantize(x, ONE)
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "MSE")
    rq, rsf = ref_4over6(x, ONE, mse=True)
    q, sf = nvfp4_quantize(x, ONE, sfLayout=SfLayout.layout_linear)
    assert torch.equal(q, rq) and torch.equal(sf, rsf)
    off = nvfp4_quantize(x, ONE, nvfp4_4over6=None)
    assert all(torch.equal(a, b) for a, b in zip(base, off))
    fp4_quantize(x, ONE, sf_vec_size=32, sf_use_ue8m0=True)  # MXFP4 never reads it
    with pytest.raises(TypeError, match="nvfp4_4over6: expected None or an NVFP44Over6Config"):
        nvfp4_quantize(x, ONE, nvfp4_4over6="MAE")
