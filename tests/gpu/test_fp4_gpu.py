"""FP4 quantization on CUDA bit-exact against the CPU kernel (every input dtype, scale
layout and scale kind, special values included), and mm_fp4 on CUDA against the CPU kernel
and dequantize-then-matmul (float32 sums in another order, one rounding to bf16/fp16:
within 1e-2 relative to the reference's max)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from flashinfer.fp4_quantization import SfLayout, fp4_quantize, nvfp4_quantize  # noqa: E402
from flashinfer.gemm import mm_fp4  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
LAYOUTS = [SfLayout.layout_128x4, SfLayout.layout_8x4, SfLayout.layout_linear]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _data(m, k, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[1, :16] = 0.0  # a zero block
    return x.to(dtype)


def _special(dtype):
    """Rows of values that exercise every rounding branch: ties, saturation, subnormals,
    signed zeros, infinities and NaN."""
    rows = [
        [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, -2.5, 0.1, -6.0, 1.0, 0, -0.0],
        [float("inf")] + [1.0] * 15,
        [float("nan")] + [2.0] * 15,
        [-float("inf"), float("nan")] + [-3.0] * 14,
        [1e-40, -1e-39, 3e-41] + [0.0] * 13,
        [1e30, -1e30] + [1.0] * 14,
        [-0.0] * 16,
        [448.0 * 6] * 8 + [-448.0 * 6 * 1.0001] * 8,
    ]
    return torch.tensor(rows, dtype=torch.float32).repeat(3, 4).to(dtype)


def _both(x, *args, **kwargs):
    """fp4_quantize on CPU and on CUDA (global scale on the input's device)."""
    cpu = fp4_quantize(x, *args, **kwargs)
    gs = args[0].cuda() if args and isinstance(args[0], torch.Tensor) else None
    gpu_args = (gs,) + args[1:] if args else args
    gpu = fp4_quantize(x.cuda(), *gpu_args, **kwargs)
    return cpu, gpu


def _assert_same(cpu, gpu):
    (q_cpu, sf_cpu), (q_gpu, sf_gpu) = cpu, gpu
    assert q_gpu.is_cuda and sf_gpu.is_cuda
    assert q_gpu.shape == q_cpu.shape and sf_gpu.shape == sf_cpu.shape
    assert torch.equal(q_gpu.cpu(), q_cpu)
    assert torch.equal(sf_gpu.cpu(), sf_cpu)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_nvfp4_quantize_bit_exact_with_cpu(dtype, layout):
    x = _data(200, 256, 1, dtype)  # 200 rows: padded in both swizzled layouts
    gsf = torch.tensor(448.0 * 6 / x.float().abs().max().item())
    _assert_same(*_both_nvfp4(x, gsf, layout))


def _both_nvfp4(x, gsf, layout):
    cpu = nvfp4_quantize(x, gsf, sfLayout=layout)
    gpu = nvfp4_quantize(x.cuda(), gsf.cuda(), sfLayout=layout)
    return cpu, gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mxfp4_quantize_bit_exact_with_cpu(dtype, layout):
    x = _data(70, 192, 2, dtype)
    swizzled = layout != SfLayout.layout_linear
    eight = layout == SfLayout.layout_8x4
    _assert_same(*_both(x, torch.tensor(1.0), 32, True, swizzled, eight))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_special_values_quantize_bit_exact_with_cpu(dtype, ue8m0):
    x = _special(dtype)
    sv = 32 if ue8m0 else 16
    _assert_same(*_both(x, torch.tensor(1.0), sv, ue8m0, False))


@pytest.mark.parametrize("gsf", [1e-30, 0.5, 3.0, 1e30])
def test_extreme_global_scales_bit_exact_with_cpu(gsf):
    _assert_same(*_both(_data(16, 64, 3), torch.tensor(gsf), 16, False, False))


def test_global_scale_inversed_bit_exact_with_cpu():
    x = _data(33, 64, 4, torch.bfloat16)
    _assert_same(*_both(x, torch.tensor(0.3), 16, False, True, False, True))


def test_no_global_scale_bit_exact_with_cpu():
    x = _data(9, 48, 5)
    cpu = fp4_quantize(x, None, is_sf_swizzled_layout=False)
    gpu = fp4_quantize(x.cuda(), None, is_sf_swizzled_layout=False)
    _assert_same(cpu, gpu)


def test_strided_and_column_major_inputs_bit_exact_with_cpu():
    base = _data(64, 256, 6)
    x = base[::2, ::2]  # strides (512, 2)
    _assert_same(*_both(x, torch.tensor(2.0), 16, False, False))
    col = _data(96, 64, 7).T  # column-major [64, 96]: quantized along its contiguous dim
    _assert_same(*_both(col, torch.tensor(2.0), 16, False, False))


def test_quantize_on_a_side_stream():
    x = _data(128, 128, 8)
    gsf = torch.tensor(5.0)
    cpu = nvfp4_quantize(x, gsf)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gpu = nvfp4_quantize(x.cuda(), gsf.cuda())
    side.synchronize()
    _assert_same(cpu, gpu)


def test_quantize_global_scale_on_cpu_is_read_on_the_host():
    # a one-element CPU global scale is read by value (docs/kernels.md): the same bits as
    # the scale on the input's device
    x = _data(4, 32, 9).cuda()
    host_scale = [t.cpu() for t in nvfp4_quantize(x, torch.tensor(3.0))]
    _assert_same(host_scale, nvfp4_quantize(x, torch.tensor(3.0).cuda()))


def test_quantize_global_scale_of_another_dtype_on_cuda_is_rejected():
    with pytest.raises(ValueError, match=r"global_scale"):
        nvfp4_quantize(_data(4, 32, 9).cuda(), torch.tensor(1.0, dtype=torch.float16).cuda())


def _dequantize(q, sf_lin, sv, ue8m0):
    codes = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).long()
    vals = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    if ue8m0:
        sf = torch.ldexp(torch.ones(sf_lin.shape), sf_lin.int() - 127)
    else:
        sf = sf_lin.view(torch.float8_e4m3fn).float()
    return vals * sf.repeat_interleave(sv, dim=1)


def _close(out, ref):
    ref = ref.float().cpu()
    err = (out.float().cpu() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item(), err


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_mm_fp4_nvfp4_matches_cpu_kernel_and_reference(layout, out_dtype):
    a, w = _data(130, 256, 10), _data(200, 256, 11)
    a_gsf = torch.tensor(448.0 * 6 / a.abs().max().item())
    w_gsf = torch.tensor(448.0 * 6 / w.abs().max().item())
    alpha = 1.0 / (a_gsf * w_gsf)
    eight = layout == SfLayout.layout_8x4
    w_layout = SfLayout.layout_128x4 if eight else layout  # 8x4 is a's layout only
    a_q, a_sf = nvfp4_quantize(a, a_gsf, sfLayout=layout)
    w_q, w_sf = nvfp4_quantize(w, w_gsf, sfLayout=w_layout)
    cpu = mm_fp4(a_q, w_q.T, a_sf, w_sf.T, alpha, out_dtype, use_8x4_sf_layout=eight)
    ga_q, ga_sf = nvfp4_quantize(a.cuda(), a_gsf.cuda(), sfLayout=layout)
    gw_q, gw_sf = nvfp4_quantize(w.cuda(), w_gsf.cuda(), sfLayout=w_layout)
    gpu = mm_fp4(ga_q, gw_q.T, ga_sf, gw_sf.T, alpha.cuda(), out_dtype, use_8x4_sf_layout=eight)
    assert gpu.is_cuda and gpu.shape == (130, 200) and gpu.dtype == out_dtype
    _, a_lin = nvfp4_quantize(a, a_gsf, sfLayout=SfLayout.layout_linear)
    _, w_lin = nvfp4_quantize(w, w_gsf, sfLayout=SfLayout.layout_linear)
    ref = (_dequantize(a_q, a_lin, 16, False) @ _dequantize(w_q, w_lin, 16, False).T) * alpha
    _close(gpu, cpu.float())
    _close(gpu, ref)


def test_mm_fp4_mxfp4_matches_reference():
    a, w = _data(40, 128, 12), _data(72, 128, 13)
    one = torch.tensor(1.0)
    a_q, a_sf = fp4_quantize(a.cuda(), one.cuda(), 32, True)
    w_q, w_sf = fp4_quantize(w.cuda(), one.cuda(), 32, True)
    out = mm_fp4(a_q, w_q.T, a_sf, w_sf.T, None, torch.bfloat16, block_size=32, use_nvfp4=False)
    qa, a_lin = fp4_quantize(a, one, 32, True, False)
    qw, w_lin = fp4_quantize(w, one, 32, True, False)
    ref = _dequantize(qa, a_lin, 32, True) @ _dequantize(qw, w_lin, 32, True).T
    _close(out, ref)


def test_mm_fp4_k_not_a_multiple_of_32_and_strided_a():
    # k = 48: the last k step holds one 16-block; a is a column slice (no 8-byte loads)
    a, w = _data(20, 96, 14), _data(24, 48, 15)
    one = torch.tensor(1.0)
    a_q, a_sf = nvfp4_quantize(a[:, :48].contiguous(), one, sfLayout=SfLayout.layout_linear)
    w_q, w_sf = nvfp4_quantize(w, one, sfLayout=SfLayout.layout_linear)
    wide = torch.zeros((20, 48), dtype=torch.uint8)
    wide[:, ::2] = a_q
    ga = wide.cuda()[:, ::2]  # stride (48, 2)
    out = mm_fp4(ga, w_q.T.cuda(), a_sf.cuda(), w_sf.T.cuda(), None, torch.bfloat16)
    cpu = mm_fp4(a_q, w_q.T, a_sf, w_sf.T, None, torch.bfloat16)
    _close(out, cpu.float())


def test_mm_fp4_into_out_on_a_side_stream():
    a, w = _data(64, 128, 16), _data(64, 128, 17)
    one = torch.tensor(1.0)
    a_q, a_sf = nvfp4_quantize(a, one)
    w_q, w_sf = nvfp4_quantize(w, one)
    cpu = mm_fp4(a_q, w_q.T, a_sf, w_sf.T)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = torch.full((64, 64), 3.0, dtype=torch.bfloat16, device="cuda")
        got = mm_fp4(a_q.cuda(), w_q.T.cuda(), a_sf.cuda(), w_sf.T.cuda(), out=out)
    side.synchronize()
    assert got is out
    _close(out, cpu.float())


def test_mm_fp4_scales_on_cpu_are_rejected():
    a_q = torch.zeros((4, 16), dtype=torch.uint8, device="cuda")
    b = torch.zeros((16, 8), dtype=torch.uint8, device="cuda")
    sf = torch.zeros((128, 4), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"a_descale is on cpu:0 but a is on cuda:0"):
        mm_fp4(a_q, b, sf, sf.cuda())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nvfp4_per_token_with_row_map_bit_exact_with_cpu(layout):
    x = _data(300, 256, 30, torch.bfloat16)
    rows = torch.randperm(300).to(torch.int32)
    rows[::7] = -1
    args = dict(
        sfLayout=layout,
        per_token_activation=True,
        expanded_idx_to_permuted_idx=rows,
        out_scale=torch.tensor(2.0),
    )
    want = nvfp4_quantize(x, torch.tensor(1.0 / 2688), **args)
    args.update(expanded_idx_to_permuted_idx=rows.cuda(), out_scale=torch.tensor(2.0).cuda())
    got = nvfp4_quantize(x.cuda(), torch.tensor(1.0 / 2688).cuda(), **args)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
