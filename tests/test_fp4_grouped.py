"""The grouped (per-expert) NVFP4 quantizers FlashInfer's MoE path and tests import:
scaled_fp4_grouped_quantize, silu_and_mul_scaled_nvfp4_experts_quantize (rows past each
expert's mask are zero) and silu_and_mul_nvfp4_quantize, each checked against the
reference quantizer of test_fp4 on the rows it quantizes."""

import pytest
import torch
from test_fp4 import _data, ref_quantize, swizzle_128x4

import flashinfer
from flashinfer import SfLayout


def batch(b, m, k, dtype=torch.float32):
    return torch.stack([_data(m, k, seed, dtype) for seed in range(b)])


def physical(x_q, sf):
    """The views FlashInfer returns, back to [b, m, k/2] and [b, bytes]."""
    b = x_q.shape[2]
    return x_q.permute(2, 0, 1), sf.permute(5, 2, 4, 0, 1, 3).reshape(b, -1).view(torch.uint8)


def check_grouped(x_q, sf, rows, mask, gs):
    """Expert i's first mask[i] rows are rows[i] quantized with gs[i]; the rest is zero."""
    q, s = physical(x_q, sf)
    for i, n in enumerate(mask.tolist()):
        rq, rsf = ref_quantize(rows[i][:n], gs[i]) if n else (q[i, :0], None)
        want_sf = swizzle_128x4(rsf) if n else torch.zeros(0, dtype=torch.uint8)
        assert torch.equal(q[i, :n], rq) and not q[i, n:].any()
        assert torch.equal(s[i, : want_sf.numel()], want_sf) and not s[i, want_sf.numel() :].any()


def test_scaled_fp4_grouped_quantize_each_expert_its_rows_and_scale():
    x = batch(3, 130, 48)  # two 128-row tiles; 3 blocks of 16 padded to 4
    mask = torch.tensor([130, 5, 0], dtype=torch.int32)
    gs = torch.tensor([2.0, 50.0, 7.0])
    x_q, sf = flashinfer.scaled_fp4_grouped_quantize(x, mask, gs)
    assert x_q.shape == (130, 24, 3) and x_q.dtype == torch.uint8
    assert sf.shape == (32, 4, 2, 4, 1, 3) and sf.dtype == torch.float8_e4m3fn
    check_grouped(x_q, sf, x, mask, gs)
    # a full expert is what fp4_quantize gives for its matrix
    q, s = physical(x_q, sf)
    fq, fsf = flashinfer.fp4_quantize(x[0], gs[:1])
    assert torch.equal(q[0], fq) and torch.equal(s[0], fsf.reshape(-1))


def test_silu_and_mul_scaled_nvfp4_experts_quantize_is_silu_then_grouped():
    x = batch(2, 20, 64, torch.bfloat16)
    mask = torch.tensor([7, 20], dtype=torch.int32)
    gs = torch.tensor([30.0, 3.0])
    x_q, sf = flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(x, mask, gs)
    assert x_q.shape == (20, 16, 2) and sf.shape == (32, 4, 1, 4, 1, 2)
    check_grouped(x_q, sf, [flashinfer.silu_and_mul(x[i]) for i in range(2)], mask, gs)


@pytest.mark.parametrize(
    "swizzled, eight", [(False, False), (True, False), (True, True)], ids=["linear", "128x4", "8x4"]
)
def test_silu_and_mul_nvfp4_quantize_flattens_and_quantizes(swizzled, eight):
    x = batch(2, 5, 64, torch.float16)
    gs = torch.tensor([40.0])
    x_q, sf = flashinfer.silu_and_mul_nvfp4_quantize(
        x, gs, is_sf_swizzled_layout=swizzled, is_sf_8x4_layout=eight
    )
    layout = (
        (SfLayout.layout_8x4 if eight else SfLayout.layout_128x4)
        if swizzled
        else SfLayout.layout_linear
    )
    want = flashinfer.nvfp4_quantize(flashinfer.silu_and_mul(x).reshape(10, 32), gs, layout)
    assert x_q.shape == (10, 16) and torch.equal(x_q, want[0])
    assert sf.shape == ((10 if not swizzled else 8 * 2 if eight else 128), 4 if swizzled else 2)
    assert torch.equal(sf.reshape(-1), want[1].reshape(-1))


def test_grouped_quantizers_name_what_is_wrong():
    x, gs = batch(2, 4, 32), torch.ones(2)
    with pytest.raises(
        ValueError, match=r"mask: expected a 1-D int32 tensor \[b\], got torch.int64"
    ):
        flashinfer.scaled_fp4_grouped_quantize(x, torch.tensor([1, 2]), gs)
    with pytest.raises(ValueError, match="mask: 3 entries for a batch of 2"):
        flashinfer.scaled_fp4_grouped_quantize(x, torch.ones(3, dtype=torch.int32), gs)
    with pytest.raises(ValueError, match=r"a_global_sf: expected a float32 tensor of 1 or 2"):
        flashinfer.scaled_fp4_grouped_quantize(x, torch.ones(2, dtype=torch.int32), torch.ones(3))
    with pytest.raises(ValueError, match=r"a: expected a 3-D tensor \[b, m, k\]"):
        flashinfer.scaled_fp4_grouped_quantize(x[0], torch.ones(2, dtype=torch.int32), gs)
    with pytest.raises(ValueError, match="a: the last dimension must be even"):
        flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(
            batch(2, 4, 33), torch.ones(2, dtype=torch.int32), gs
        )
    with pytest.raises(NotImplementedError, match="sf_vec_size can only be 16"):
        flashinfer.silu_and_mul_nvfp4_quantize(x, gs, sf_vec_size=32)
