"""Trace templates of the quantized GEMMs: ``bmm_fp8``, ``mm_fp8`` and ``mm_fp4``, and of
``prepare_low_latency_gemm_weights`` (the weight layout ``mm_fp8`` takes).

The references dequantize and multiply in float32; the checks compare by cosine
similarity (0.99 for FP8, 0.97 for FP4) since quantized GEMMs legitimately differ
elementwise from a float32 product.
"""

import torch

from ..template import Const, Scalar, Tensor, TraceTemplate, Var
from ._init_helpers import default_device, nvfp4_global_scale, to_fp8_per_tensor
from .quantize import _e2m1_decode


def _gemm_check(
    reference_outputs,
    actual_outputs,
    *,
    rtol=None,
    atol=None,
    max_mismatch_pct=100.0,
    min_cos_sim=0.99,
):
    """FP8 GEMMs pass at cosine similarity >= 0.99."""
    from flashinfer.trace import default_check

    return default_check(
        reference_outputs,
        actual_outputs,
        rtol=rtol,
        atol=atol,
        max_mismatch_pct=max_mismatch_pct,
        min_cos_sim=min_cos_sim,
    )


def _fp4_gemm_check(
    reference_outputs,
    actual_outputs,
    *,
    rtol=None,
    atol=None,
    max_mismatch_pct=100.0,
    min_cos_sim=0.97,
):
    """FP4 GEMMs pass at cosine similarity >= 0.97."""
    from flashinfer.trace import default_check

    return default_check(
        reference_outputs,
        actual_outputs,
        rtol=rtol,
        atol=atol,
        max_mismatch_pct=max_mismatch_pct,
        min_cos_sim=min_cos_sim,
    )


# ------------------------------------------------------------------------ references


@torch.no_grad()
def _bmm_fp8_reference(A, B, A_scale, B_scale, dtype=torch.bfloat16, **_unused):
    """(A * A_scale) @ (B * B_scale) in float32, batched, cast to ``dtype``."""
    out_dtype = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
    a = A.float() * A_scale.float().reshape(-1)[0]
    b = B.float() * B_scale.float().reshape(-1)[0]
    return torch.bmm(a, b).to(out_dtype)


@torch.no_grad()
def _low_latency_weights_reference(w, **_unused):
    """[n, k] -> [k / 128, n, 128]: block i holds columns 128 i .. 128 i + 127 of every
    row, rows in order."""
    n, k = w.shape
    return w.reshape(n, k // 128, 128).transpose(0, 1).contiguous()


@torch.no_grad()
def _mm_fp8_reference(A, B, alpha=None, **_unused):
    """alpha * A @ W.T where B = prepare_low_latency_gemm_weights(W): B[kb, n, j] is
    W[n, kb * block_size + j]. bf16 output."""
    blocks, n, block_size = B.shape
    w_t = B.float().permute(0, 2, 1).reshape(blocks * block_size, n)
    out = A.float() @ w_t
    if alpha is not None:
        out = out * alpha.float().reshape(-1)[0]
    return out.to(torch.bfloat16)


@torch.no_grad()
def _scale_grid(sf, rows, blocks, ue8m0=False, tile=128):
    """[rows, blocks] float scales from scale bytes in the linear or a swizzled layout.

    Linear only when the bytes number exactly rows x blocks and the 128x4 layout would
    need another count (mm_fp4's rule); swizzled: scale (r, c) is byte
    ((r//T) * Kp/4 + c//4) * 4T + inner, Kp = blocks rounded up to 4, with T = 128 and
    inner = (r%32)*16 + ((r%128)//32)*4 + c%4, or T = 8 and inner = (r%8)*4 + c%4."""
    flat = sf.contiguous().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    kp4 = (blocks + 3) // 4
    padded = (rows + 127) // 128 * 128 * kp4 * 4
    if flat.numel() == rows * blocks and padded != rows * blocks:
        grid = flat.reshape(rows, blocks)
    else:
        r = torch.arange(rows, device=sf.device)[:, None]
        c = torch.arange(blocks, device=sf.device)[None, :]
        if tile == 128:
            inner = (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        else:
            inner = (r % 8) * 4 + c % 4
        grid = flat[((r // tile) * kp4 + c // 4) * (4 * tile) + inner]
    if ue8m0:
        return torch.ldexp(torch.ones(grid.shape, device=sf.device), grid.int() - 127)
    return grid.view(torch.float8_e4m3fn).float()


@torch.no_grad()
def _mm_fp4_reference(
    A, B, a_descale, b_descale, block_size=16, alpha=None, use_8x4_sf_layout=False, **_unused
):
    """alpha * dequant(A) @ dequant(W).T for packed A [M, K/2] and B = W.T, W [N, K/2],
    with E4M3 block scales (UE8M0 when block_size is 32) in the 128x4 layout (A's in
    8x4 with use_8x4_sf_layout) or, when their sizes can only mean it, linear;
    b_descale is the .T of W's scales. bf16 output."""
    a = _e2m1_decode(A)
    w = _e2m1_decode(B.T)
    blocks = a.shape[1] // block_size
    ue8m0 = block_size == 32
    sa = _scale_grid(a_descale, a.shape[0], blocks, ue8m0, 8 if use_8x4_sf_layout else 128)
    sw = _scale_grid(b_descale.T, w.shape[0], blocks, ue8m0)
    a = a * sa.repeat_interleave(block_size, dim=1)
    w = w * sw.repeat_interleave(block_size, dim=1)
    out = a @ w.T
    if alpha is not None:
        out = out * alpha.float().reshape(-1)[0]
    return out.to(torch.bfloat16)


_mm_fp4_reference._trace_reference_dependencies = (_e2m1_decode, _scale_grid)


# ----------------------------------------------------------------------------- inits


def _bmm_fp8_init(*, batch_size, M=64, N=64, K=128, scalar=None, device=None, seed=0):
    """Arguments of ``bmm_fp8``: per-tensor-scaled e4m3 A [b, M, K] and column-major
    B [b, K, N], their float32 dequantization scales, bf16 output."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    a, a_scale = to_fp8_per_tensor(torch.randn(batch_size, M, K, generator=gen, device=device))
    b, b_scale = to_fp8_per_tensor(torch.randn(batch_size, N, K, generator=gen, device=device))
    return {
        "A": a,
        "B": b.transpose(-2, -1),
        "A_scale": a_scale.reshape(1),
        "B_scale": b_scale.reshape(1),
        "dtype": torch.bfloat16,
    }


def _mm_fp8_init(*, M, N=1536, K=7168, device=None, seed=0):
    """Arguments of ``mm_fp8``: e4m3 a [M, K], a prepared e4m3 weight of [N, K] and
    alpha = the product of both dequantization scales."""
    from flashinfer import prepare_low_latency_gemm_weights

    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    a, a_scale = to_fp8_per_tensor(torch.randn(M, K, generator=gen, device=device))
    w, w_scale = to_fp8_per_tensor(torch.randn(N, K, generator=gen, device=device))
    b = prepare_low_latency_gemm_weights(w)
    return {"a": a, "b": b, "alpha": (a_scale * w_scale).reshape(())}


def _low_latency_weights_init(*, N, K=7168, device=None, seed=0):
    """Arguments of ``prepare_low_latency_gemm_weights``: a per-tensor-scaled e4m3 weight."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    w, _ = to_fp8_per_tensor(torch.randn(N, K, generator=gen, device=device))
    return {"w": w}


def _mm_fp4_init(*, M, N=2048, K=7168, block_size=16, device=None, seed=0):
    """Arguments of ``mm_fp4``: NVFP4-quantized a [M, K] and weight [N, K] (passed as
    .T with .T scales), alpha undoing both global scales."""
    from flashinfer import SfLayout, nvfp4_quantize

    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=device).bfloat16()
    w = torch.randn(N, K, generator=gen, device=device).bfloat16()
    x_sf, w_sf = nvfp4_global_scale(x), nvfp4_global_scale(w)
    a, a_descale = nvfp4_quantize(x, x_sf, sfLayout=SfLayout.layout_128x4)
    b, b_descale = nvfp4_quantize(w, w_sf, sfLayout=SfLayout.layout_128x4)
    return {
        "a": a,
        "b": b.T,
        "a_descale": a_descale,
        "b_descale": b_descale.T,
        "alpha": 1.0 / (x_sf * w_sf),
        "block_size": int(block_size),
    }


# ------------------------------------------------------------------------- templates

bmm_fp8_trace = TraceTemplate(
    op_type="bmm_fp8",
    description=(
        "Batched FP8 matmul with per-tensor scales: A and B are e4m3, A_scale and "
        "B_scale one-value float32 dequantization scales."
    ),
    axes={"batch_size": Var(), "M": Var(), "N": Const(), "K": Const()},
    inputs={
        "A": Tensor(["batch_size", "M", "K"]),
        "B": Tensor(["batch_size", "K", "N"]),
        "A_scale": Tensor(["scalar"], dtype="float32", description="Dequantization scale of A."),
        "B_scale": Tensor(["scalar"], dtype="float32", description="Dequantization scale of B."),
        "dtype": Scalar("int32", description="Output dtype."),
    },
    outputs={"C": Tensor(["batch_size", "M", "N"], dtype="bfloat16")},
    tags=["status:verified", "quantization:float8_e4m3fn"],
    reference=_bmm_fp8_reference,
    check=_gemm_check,
    init=_bmm_fp8_init,
)
bmm_fp8_trace.axes["scalar"] = Var(description="Length of A_scale and B_scale (1).")

mm_fp8_trace = TraceTemplate(
    op_type="gemm_fp8",
    description=(
        "FP8 GEMM C = A @ B with the weight in the TRT-LLM low-latency layout: A is "
        "[M, K] e4m3, B is [K/block_size, N, block_size] e4m3."
    ),
    axes={"M": Var(), "N": Const(), "K": Const()},
    inputs={
        "A": Tensor(["M", "K"], param="a"),
        "B": Tensor(
            ["K_div_block_size", "N", "block_size"],
            param="b",
            description="prepare_low_latency_gemm_weights() of an [N, K] e4m3 weight.",
        ),
    },
    outputs={"C": Tensor(["M", "N"], dtype="bfloat16")},
    tags=["status:verified", "quantization:float8_e4m3fn"],
    reference=_mm_fp8_reference,
    check=_gemm_check,
    init=_mm_fp8_init,
)

mm_fp4_trace = TraceTemplate(
    op_type="gemm_fp4",
    description=(
        "FP4 GEMM C = A @ B: A and B hold packed E2M1 codes (uint8), scaled per block "
        "of block_size elements."
    ),
    axes={
        "M": Var(),
        "N": Const(),
        "K": Const(),
        "block_size": Const(description="Elements per scale: 16 NVFP4, 32 MXFP4."),
    },
    inputs={
        "A": Tensor(["M", "K"], param="a", description="Packed E2M1 codes of A (uint8)."),
        "B": Tensor(
            ["K", "N"],
            param="b",
            description="Packed E2M1 codes of the weight, passed transposed (uint8).",
        ),
        "a_descale": Tensor(
            ["M", "K_div_block_size"], description="Block scales of A (e4m3 or uint8)."
        ),
        "b_descale": Tensor(
            ["K", "N_div_block_size"], description="Block scales of B (e4m3 or uint8)."
        ),
        "block_size": Scalar("int32", description="Elements per scale: 16 NVFP4, 32 MXFP4."),
    },
    outputs={"C": Tensor(["M", "N"], dtype="bfloat16")},
    tags=["status:verified", "quantization:fp4"],
    reference=_mm_fp4_reference,
    check=_fp4_gemm_check,
    init=_mm_fp4_init,
)

prepare_low_latency_gemm_weights_trace = TraceTemplate(
    op_type="weight_layout",
    name_prefix="prepare_low_latency_gemm_weights",
    description=(
        "The weight layout of mm_fp8's low-latency path: an [N, K] e4m3 weight cut into "
        "K/128 column blocks, [K/128, N, 128]."
    ),
    axes={
        "N": Var(description="Rows of the weight."),
        "K": Const(abbrev="k", description="Columns of the weight, a multiple of 128."),
        "K_div_block_size": Var(description="K / 128."),
        "block_size": Var(description="128."),
    },
    inputs={"w": Tensor(["N", "K"], description="The weight, e4m3.")},
    outputs={
        "prepared": Tensor(
            ["K_div_block_size", "N", "block_size"], dtype_from="w", description="mm_fp8's b."
        )
    },
    constraints=["K_div_block_size * block_size == K", "block_size == 128"],
    tags=["status:verified", "quantization:float8_e4m3fn"],
    reference=_low_latency_weights_reference,
    init=_low_latency_weights_init,
)
