"""Trace templates of the FP4 quantization APIs (``fp4_quantize``, ``nvfp4_quantize``),
and the E2M1 helpers their references (and ``mm_fp4``'s) are built from.

Input [M, K] becomes packed codes [M, K/2] (two E2M1 values per byte, element 2j in the
low nibble) and one scale byte per ``sf_vec_size`` elements. The references return the
scales in the layout the call asks for (128x4 swizzled by default, 8x4 or linear), as
the APIs do.
"""

import torch

from ..template import Const, Scalar, Tensor, TraceTemplate, Var
from ._init_helpers import default_device, nvfp4_global_scale


@torch.no_grad()
def _e2m1_encode(x):
    """E2M1 codes of float32 x: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 rounded to nearest
    with ties to the even code, saturating at 6; the sign in bit 3."""
    a = x.abs()
    rounded_up = [a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5.0]
    code = torch.stack(rounded_up).sum(0)
    return (code + 8 * torch.signbit(x)).to(torch.uint8)


@torch.no_grad()
def _e2m1_decode(packed):
    """float32 values of packed codes [..., n] -> [..., 2n], low nibble first."""
    magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=packed.device)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).long()
    return magnitudes[codes & 7] * (1.0 - 2.0 * (codes >= 8).float())


@torch.no_grad()
def _block_scale_bytes(value, ue8m0):
    """Scale bytes of per-block scales ``value`` and the float scale each byte means:
    E4M3 rounded to nearest even, or UE8M0 (the power of two at or above value)."""
    if not ue8m0:
        code = value.to(torch.float8_e4m3fn).view(torch.uint8)
        return code, code.view(torch.float8_e4m3fn).float()
    mantissa, exponent = torch.frexp(value)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    code = torch.where(value > 0, (exponent + 127).clamp(0, 254), 0).to(torch.uint8)
    scale = torch.where(value > 0, torch.ldexp(torch.ones_like(value), code.int() - 127), 0.0)
    return code, scale


@torch.no_grad()
def _scale_layout(code, layout):
    """Scale bytes [rows, blocks] arranged as the quantizers return them: linear
    (layout 2) as is; 128x4 (0) and 8x4 (1) swizzled over rows padded to 128 (8) and
    blocks padded to 4, byte (r, c) at ((r//R) * Bp/4 + c//4) * 4R + inner(r, c) with
    inner = (r%32)*16 + ((r%128)//32)*4 + c%4 for 128x4, (r%8)*4 + c%4 for 8x4; shaped
    (-1, blocks) when that divides, else (-1, padded blocks)."""
    rows, blocks = code.shape
    if layout == 2:
        return code
    tile = 128 if layout == 0 else 8
    padded_rows, padded_blocks = -(-rows // tile) * tile, -(-blocks // 4) * 4
    r = torch.arange(rows, device=code.device)[:, None]
    c = torch.arange(blocks, device=code.device)[None, :]
    tile_start = ((r // tile) * (padded_blocks // 4) + c // 4) * (4 * tile)
    if tile == 128:
        inner = (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    else:
        inner = (r % 8) * 4 + c % 4
    out = torch.zeros(padded_rows * padded_blocks, dtype=torch.uint8, device=code.device)
    out[(tile_start + inner).reshape(-1)] = code.reshape(-1)
    width = blocks if out.numel() % blocks == 0 else padded_blocks
    return out.reshape(-1, width)


@torch.no_grad()
def _fp4_quantize_reference(
    input,
    global_scale=None,
    sf_vec_size=16,
    sf_use_ue8m0=False,
    is_sf_swizzled_layout=True,
    is_sf_8x4_layout=False,
    is_global_scale_inversed=False,
    **_unused,
):
    """Block-scaled FP4 quantization of input [..., K].

    Per block of ``sf_vec_size`` elements: scale = global_scale * amax(block) / 6 stored
    as one byte s, element code = e2m1(x * global_scale / s); a zero scale gives zero
    codes. Returns (packed uint8 [..., K/2], scale bytes uint8 in the requested layout:
    128x4 swizzled by default, 8x4, or linear [rows, K/sf_vec_size])."""
    if is_global_scale_inversed:
        raise NotImplementedError("is_global_scale_inversed=True")
    rows = input.reshape(-1, input.shape[-1]).float()
    gsf = 1.0 if global_scale is None else global_scale.float().reshape(())
    blocks = rows.reshape(rows.shape[0], -1, int(sf_vec_size))
    code, scale = _block_scale_bytes(gsf * blocks.abs().amax(-1) / 6.0, bool(sf_use_ue8m0))
    factor = torch.where(scale == 0, 0.0, gsf / scale)
    codes = _e2m1_encode(blocks * factor[..., None]).reshape(rows.shape)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    layout = 2 if not is_sf_swizzled_layout else (1 if is_sf_8x4_layout else 0)
    return packed.reshape(*input.shape[:-1], -1), _scale_layout(code, layout)


@torch.no_grad()
def _nvfp4_quantize_reference(
    a,
    a_global_sf,
    sf_vec_size=16,
    sfLayout=0,
    do_shuffle=False,
    per_token_activation=False,
    **_unused,
):
    """NVFP4: E4M3 scales, blocks of 16, scales in ``sfLayout`` (see
    _fp4_quantize_reference)."""
    if do_shuffle or per_token_activation:
        raise NotImplementedError("do_shuffle=True or per_token_activation=True")
    layout = int(sfLayout)
    return _fp4_quantize_reference(
        a,
        a_global_sf,
        sf_vec_size,
        sf_use_ue8m0=False,
        is_sf_swizzled_layout=layout != 2,
        is_sf_8x4_layout=layout == 1,
    )


_fp4_quantize_reference._trace_reference_dependencies = (
    _e2m1_encode,
    _block_scale_bytes,
    _scale_layout,
)
_nvfp4_quantize_reference._trace_reference_dependencies = (
    _e2m1_encode,
    _block_scale_bytes,
    _scale_layout,
    _fp4_quantize_reference,
)


def _fp4_quantize_init(
    *, M, K=4096, K_packed=None, num_scale_elems=None, one=None, device=None, seed=0
):
    """Arguments of ``fp4_quantize``: random bf16 input [M, K] with its NVFP4 global scale
    (the axes K_packed, num_scale_elems and one follow from M and K)."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=device).bfloat16()
    return {"input": x, "global_scale": nvfp4_global_scale(x), "sf_vec_size": 16}


def _nvfp4_quantize_init(
    *, M, K=4096, K_packed=None, num_scale_elems=None, one=None, device=None, seed=0
):
    """Arguments of ``nvfp4_quantize``: random bf16 a [M, K] with its global scale."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(M, K, generator=gen, device=device).bfloat16()
    return {"a": a, "a_global_sf": nvfp4_global_scale(a)}


def _fp4_axes():
    return {
        "M": Var(description="Rows of the input."),
        "K": Const(abbrev="k", description="Columns of the input."),
        "K_packed": Var(description="Columns of the packed output: K/2, two codes per byte."),
        "num_scale_elems": Var(description="Number of scale bytes (depends on the layout)."),
        "one": Var(description="The single dimension of one-value tensors."),
    }


def _fp4_outputs(packed_description):
    return {
        "quantized": Tensor(["M", "K_packed"], dtype="uint8", description=packed_description),
        "scales": Tensor(
            ["num_scale_elems"],
            dtype="uint8",
            description="Block scale bytes; their arrangement depends on the layout.",
        ),
    }


fp4_quantize_trace = TraceTemplate(
    op_type="quantization",
    name_prefix="fp4_quantize",
    description=(
        "FP4 quantization of an fp16/bf16 input: packed E2M1 codes plus one scale byte per block."
    ),
    axes=_fp4_axes(),
    inputs={
        "input": Tensor(["M", "K"], param="input", description="Data to quantize."),
        "global_scale": Tensor(
            ["one"],
            dtype="float32",
            optional=True,
            description="Per-tensor scale applied before quantization, shape [1].",
        ),
        "sf_vec_size": Scalar(
            "int32", optional=True, description="Elements per scale: 16 NVFP4, 32 MXFP4."
        ),
    },
    outputs=_fp4_outputs("Packed E2M1 codes, two per byte."),
    constraints=["K_packed == K // 2"],
    tags=["status:verified", "quantization:fp4"],
    reference=_fp4_quantize_reference,
    init=_fp4_quantize_init,
)

nvfp4_quantize_trace = TraceTemplate(
    op_type="quantization",
    name_prefix="nvfp4_quantize",
    description=(
        "NVFP4 quantization: E2M1 codes with one E4M3 scale per 16 elements under a "
        "per-tensor global scale."
    ),
    axes=_fp4_axes(),
    inputs={
        "a": Tensor(["M", "K"], description="Data to quantize."),
        "a_global_sf": Tensor(["one"], dtype="float32", description="Global scale, shape [1]."),
        "sf_vec_size": Scalar(
            "int32", optional=True, description="Elements per scale (16 for NVFP4)."
        ),
    },
    outputs=_fp4_outputs("Packed E2M1 codes."),
    constraints=["K_packed == K // 2"],
    tags=["status:verified", "quantization:nvfp4"],
    reference=_nvfp4_quantize_reference,
    init=_nvfp4_quantize_init,
)
