"""The FP4 neighbours of nvfp4_quantize that FlashInfer's tests import: mxfp4_quantize,
block_scale_interleave, e2m1_and_ufp8sf_scale_to_float, nvfp4_batched_quantize, the KV
quantizer pair, do_shuffle, and the global scales and inputs nvfp4_quantize accepts."""

import pytest
import torch
from test_fp4 import _data, ref_quantize, swizzle_128x4

import flashinfer
from flashinfer import SfLayout, fp4_quantize, nvfp4_quantize

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def unpack(x_q):
    """[m, k/2] packed codes -> [m, k] code values (element 2j in the low nibble)."""
    lo, hi = x_q & 15, x_q >> 4
    return E2M1[torch.stack([lo, hi], -1).reshape(x_q.shape[0], -1).long()]


def test_mxfp4_quantize_is_fp4_quantize_with_ue8m0_blocks_of_32():
    x = _data(40, 128, 1, torch.bfloat16)
    got = flashinfer.mxfp4_quantize(x)
    want = fp4_quantize(x, None, sf_vec_size=32, sf_use_ue8m0=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    q, sf = ref_quantize(x, 1.0, sv=32, ue8m0=True)
    assert torch.equal(got[0], q)


def test_mxfp4_dequantize_inverts_mxfp4_quantize():
    x = _data(20, 64, 11)
    q, sf = flashinfer.mxfp4_quantize(x)
    rq, rsf = ref_quantize(x, 1.0, sv=32, ue8m0=True)
    scales = torch.ldexp(torch.ones(rsf.shape), rsf.int() - 127).repeat_interleave(32, 1)
    assert torch.equal(flashinfer.mxfp4_dequantize(q, sf), unpack(rq) * scales)
    assert torch.equal(flashinfer.mxfp4_dequantize_host(q, sf), unpack(rq) * scales)


def test_block_scale_interleave_writes_the_128x4_layout():
    sf = torch.randint(0, 255, (130, 6), dtype=torch.uint8)
    got = flashinfer.block_scale_interleave(sf)
    assert torch.equal(got, swizzle_128x4(sf))
    batched = flashinfer.block_scale_interleave(torch.stack([sf, sf.flip(0)]))
    assert torch.equal(batched, torch.cat([swizzle_128x4(sf), swizzle_128x4(sf.flip(0))]))


@pytest.mark.parametrize("layout", list(SfLayout))
def test_e2m1_and_ufp8sf_scale_to_float_inverts_the_quantizer(layout):
    x = _data(20, 64, 2)
    gs = torch.tensor([448 * 6 / float(x.abs().max())])
    q, sf = nvfp4_quantize(x, gs, sfLayout=layout)
    got = flashinfer.e2m1_and_ufp8sf_scale_to_float(
        q,
        sf,
        1 / gs,
        is_sf_swizzled_layout=layout != SfLayout.layout_linear,
        is_sf_8x4_layout=layout == SfLayout.layout_8x4,
    )
    rq, rsf = ref_quantize(x, gs)
    scales = rsf.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    want = unpack(rq) * scales * (1 / gs)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.allclose(got, x, rtol=0.3, atol=0.3 * float(x.abs().max()) / 6)


def test_nvfp4_batched_quantize_quantizes_each_matrix():
    x = torch.stack([_data(9, 32, 3), _data(9, 32, 4)])
    gs = torch.tensor([100.0])
    q, sf = flashinfer.nvfp4_batched_quantize(x, gs)
    assert q.shape == (2, 9, 16) and sf.shape == (2, 128 * 4)
    for b in range(2):
        rq, rsf = ref_quantize(x[b], gs)
        assert torch.equal(q[b], rq) and torch.equal(sf[b], swizzle_128x4(rsf))


def test_nvfp4_kv_quantize_round_trip():
    x = _data(12, 64, 5, torch.bfloat16)
    gs = torch.tensor([0.25])
    q, sf = flashinfer.nvfp4_kv_quantize(x, gs)
    assert q.shape == (12, 32) and sf.shape == (12, 4)
    rq, rsf = ref_quantize(x, 1 / gs)
    assert torch.equal(q, rq) and torch.equal(sf, rsf)
    back = flashinfer.nvfp4_kv_dequantize(q, sf, gs)
    assert back.dtype == torch.bfloat16
    want = unpack(rq) * rsf.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1) * 0.25
    assert torch.equal(back, want.to(torch.bfloat16))


def shuffled_rows(n):
    """TRT-LLM's srcToDstBlk32RowMap: row i of each block of 32 moves to (i % 4) * 8 + i // 4."""
    order = torch.empty(n, dtype=torch.long)
    for old in range(n):
        i = old % 32
        order[old - i + (i % 4) * 8 + i // 4] = old
    return order


def test_do_shuffle_permutes_rows_and_interleaves_the_scales():
    x = _data(128, 64, 6)
    gs = torch.tensor([10.0])
    q, sf = nvfp4_quantize(x, gs, do_shuffle=True)
    rq, rsf = ref_quantize(x, gs)
    order = shuffled_rows(128)
    assert torch.equal(q, rq[order])
    assert sf.shape == rsf.shape and torch.equal(sf.reshape(-1), swizzle_128x4(rsf[order]))


def test_do_shuffle_needs_the_128x4_layout():
    with pytest.raises(ValueError, match="do_shuffle=True needs sfLayout layout_128x4"):
        nvfp4_quantize(_data(128, 32, 7), 1.0, sfLayout=SfLayout.layout_linear, do_shuffle=True)


@pytest.mark.parametrize(
    "scale",
    [2.0, torch.tensor([2.0], dtype=torch.float16), torch.tensor(2.0, dtype=torch.bfloat16)],
)
def test_nvfp4_quantize_takes_float_and_half_global_scales(scale):
    x = _data(8, 32, 8)
    got = nvfp4_quantize(x, scale)
    want = nvfp4_quantize(x, torch.tensor([2.0]))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_nvfp4_quantize_takes_e4m3_input():
    x = (_data(16, 64, 9) * 20).to(torch.float8_e4m3fn)
    got = nvfp4_quantize(x, torch.tensor([1.0]), sfLayout=SfLayout.layout_linear)
    rq, rsf = ref_quantize(x.float(), torch.tensor([1.0]))
    assert torch.equal(got[0], rq) and torch.equal(got[1], rsf)


def test_global_scale_of_a_wrong_type_is_refused():
    with pytest.raises(TypeError, match="global_scale: expected a number or a one-element tensor"):
        nvfp4_quantize(_data(8, 32, 10), "2.0")
