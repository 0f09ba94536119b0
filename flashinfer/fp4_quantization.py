"""FP4 quantization: NVFP4 (E2M1 values, one E4M3 scale per 16) and MXFP4 (one UE8M0
scale per 32), computed by the C kernels in ``flashinfer._kernels``.

Rule, all in float32: ``sf = e4m3((global_sf * amax(block)) / 6)`` (round to nearest
even, saturating at 448), then each element's code is ``e2m1(x * (global_sf / float(sf)))``
with ties to the even code, saturating at 6; a block whose scale is 0 gets all-zero codes.
MXFP4 (``sf_use_ue8m0=True``): ``sf`` is the smallest power of two >= ``global_sf * amax
/ 6`` (UE8M0 code, round toward +inf, at most 2^127; 0 for an all-zero block).
"""

import enum

import torch

from . import _kernels
from ._nvfp4_recipe import _UNSET, _kernel_recipe, resolve_nvfp4_4over6
from .api_logging import flashinfer_api
from .utils import CPU_REQUIREMENT, CUDA_KERNEL_REQUIREMENT, backend_requirement

__all__ = [
    "NVFP4_QUANT_ENV_VARS",
    "SfLayout",
    "block_scale_interleave",
    "e2m1_and_ufp8sf_scale_to_float",
    "fp4_quantize",
    "mxfp4_dequantize",
    "mxfp4_dequantize_host",
    "mxfp4_quantize",
    "nvfp4_batched_quantize",
    "nvfp4_block_scale_interleave",
    "nvfp4_kv_dequantize",
    "nvfp4_kv_quantize",
    "nvfp4_quantize",
    "scaled_fp4_grouped_quantize",
    "silu_and_mul_nvfp4_quantize",
]

# The environment variables FlashInfer's NVFP4 quantizers read (FlashInfer's tests save and
# restore them by this name). The 4over6 ones choose the recipe (docs/logging.md); the CPU
# kernels have no fast-math form, so FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH changes nothing
# here (docs/kernels.md).
NVFP4_QUANT_ENV_VARS = (
    "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH",
    "FLASHINFER_NVFP4_4OVER6",
    "FLASHINFER_NVFP4_4OVER6_ERR_MODE",
    "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH",
    "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256",
)

_BACKENDS = ("cuda", "cute-dsl", "cpu")
_NVFP4_BACKENDS = ("cuda", "cute-dsl", "cake", "cpu")


def _recipe(nvfp4_4over6, mxfp4):
    """The 4over6 recipe as the kernel takes it (None: off): an explicit config, or for an
    omitted argument the FLASHINFER_NVFP4_4OVER6* variables (which apply to NVFP4 only)."""
    explicit = nvfp4_4over6 is not _UNSET
    config = resolve_nvfp4_4over6(nvfp4_4over6)
    if config is None or (mxfp4 and not explicit):
        return None
    if mxfp4:
        raise ValueError("nvfp4_4over6 applies to NVFP4 only (sf_vec_size=16, sf_use_ue8m0=False)")
    return _kernel_recipe(config)


def _stream(x):
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0


_QUANTIZE_BACKENDS = {"cuda": CUDA_KERNEL_REQUIREMENT, "cute-dsl": CUDA_KERNEL_REQUIREMENT}


class SfLayout(enum.IntEnum):
    """Layout of the block scale factors (values are FlashInfer's)."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


def _sf_bytes(rows, cols, layout):
    cols_padded = (cols + 3) // 4 * 4
    if layout == SfLayout.layout_128x4:
        return (rows + 127) // 128 * 128 * cols_padded
    if layout == SfLayout.layout_8x4:
        return (rows + 7) // 8 * 8 * cols_padded
    return rows * cols


def _quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, layout, inversed, recipe=None):
    """Quantize along the last dimension of ``input``; returns (x_q, sf) with sf shaped
    ``(-1, k // sf_vec_size)`` as FlashInfer reshapes it (2-D padded rows x padded
    blocks when that reshape is impossible)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() < 2:
        raise ValueError(f"input: expected at least 2 dimensions [m, k], got {input.dim()}")
    if sf_vec_size not in (16, 32):
        raise NotImplementedError(
            f"sf_vec_size: {sf_vec_size!r} is not supported; expected 16 (NVFP4) or 32 (MXFP4)"
        )
    k = input.shape[-1]
    x2 = input.reshape(-1, k)
    m = x2.shape[0]
    x_q = torch.empty((m, k // 2), dtype=torch.uint8, device=input.device)
    kblocks = k // sf_vec_size if k % sf_vec_size == 0 else 0
    sf = torch.empty(_sf_bytes(m, kblocks, layout), dtype=torch.uint8, device=input.device)
    _kernels.fp4_quantize(
        x2,
        global_scale,
        x_q,
        sf,
        sf_vec_size,
        bool(sf_use_ue8m0),
        int(layout),
        bool(inversed),
        max(1, torch.get_num_threads()),
        _stream(input),
        nvfp4_4over6=recipe,
    )
    x_q = x_q.reshape(*input.shape[:-1], k // 2)
    if kblocks and sf.numel() % kblocks == 0:
        sf = sf.reshape(-1, kblocks)
    elif layout != SfLayout.layout_linear:
        sf = sf.reshape(-1, (kblocks + 3) // 4 * 4)
    return x_q, sf


def _quantize_per_token(a, scale_inv, layout, row_map, out_scale, recipe=None):
    """NVFP4 with one scale per row: (x_q, sf [padded rows, padded blocks], per-token scales).

    Row r's scale is ``amax(|a[r]|) * scale_inv`` (times ``out_scale`` as returned); the
    row is quantized with the global scale ``1 / that`` (before ``out_scale``). With
    ``row_map``, only rows ``row_map[i] >= 0`` (i < m) are quantized; the others are zero.
    """
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a must be a torch.Tensor, got {type(a).__name__}")
    if a.dim() != 2:
        raise ValueError(f"a: per-token quantization takes a 2-D [m, k] tensor, got {a.dim()}-D")
    if out_scale is not None:
        out_scale = out_scale.to(device=a.device, dtype=torch.float32)
    if row_map is not None:
        if not isinstance(row_map, torch.Tensor):
            raise TypeError(
                f"expanded_idx_to_permuted_idx must be a torch.Tensor, got {type(row_map).__name__}"
            )
        row_map = row_map.to(a.device)
    m, k = a.shape
    cols = k // 16 if k % 16 == 0 else 0
    padded_cols = cols if layout == SfLayout.layout_linear else (cols + 3) // 4 * 4
    x_q = torch.zeros((m, k // 2), dtype=torch.uint8, device=a.device)
    sf = torch.zeros(_sf_bytes(m, cols, layout), dtype=torch.uint8, device=a.device)
    per_token = torch.zeros(m, dtype=torch.float32, device=a.device)
    _kernels.fp4_quantize(
        a,
        scale_inv,
        x_q,
        sf,
        16,
        False,
        int(layout),
        False,
        max(1, torch.get_num_threads()),
        _stream(a),
        per_token,
        out_scale,
        row_map,
        nvfp4_4over6=recipe,
    )
    return x_q, sf.reshape(-1, padded_cols) if padded_cols else sf, per_token


# The logged call checks its backend, as FlashInfer's quantizers do (an unknown backend is
# recorded and replays as the same error).
@flashinfer_api
@backend_requirement({**_QUANTIZE_BACKENDS, "cpu": CPU_REQUIREMENT})
def fp4_quantize(
    input,
    global_scale=None,
    sf_vec_size=16,
    sf_use_ue8m0=False,
    is_sf_swizzled_layout=True,
    is_sf_8x4_layout=False,
    is_global_scale_inversed=False,
    enable_pdl=None,
    backend="cuda",
    nvfp4_4over6=_UNSET,
):
    """Quantize ``input`` to packed FP4 with block scale factors.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., m, k]`` float16, bfloat16 or float32; ``k`` a multiple of ``sf_vec_size``.
        A column-major 2-D input is quantized along its contiguous dimension (FlashInfer's
        rule) and the results are returned transposed.
    global_scale : torch.Tensor, optional
        One float32 value multiplying the data before quantization; 1 if None.
    sf_vec_size : int, optional
        Elements per scale: 16 (NVFP4) or 32 (MXFP4).
    sf_use_ue8m0 : bool, optional
        UE8M0 (power of two) scales instead of E4M3.
    is_sf_swizzled_layout : bool, optional
        Swizzled scales (128x4, or 8x4 with ``is_sf_8x4_layout``) instead of linear.
    is_sf_8x4_layout : bool, optional
        With ``is_sf_swizzled_layout``: the 8x4 swizzle.
    is_global_scale_inversed : bool, optional
        ``global_scale`` holds ``1 / global_sf``.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).
    backend : str, optional
        ``"cuda"`` or ``"cute-dsl"`` (FlashInfer's names) or ``"cpu"``: the kernel of the
        input's device runs (CPU, or CUDA on the device's current stream, bit-identical
        results). ``fp4_quantize.is_backend_supported(backend, cc)`` answers for this build.
    nvfp4_4over6 : NVFP44Over6Config or None, optional
        FlashInfer's 4over6 recipe (NVFP4 only, CPU tensors): each block keeps the better of
        the scales amax / 6 and 1.5 times it. None: off; omitted: the
        ``FLASHINFER_NVFP4_4OVER6*`` environment variables decide.

    Returns
    -------
    tuple of torch.Tensor
        ``(x_q, sf)``: uint8 ``[..., m, k // 2]`` (element ``2j`` in the low nibble of byte
        ``j``) and the uint8 scale bytes shaped ``(-1, k // sf_vec_size)``.
    """
    _check_backend(backend, _BACKENDS, input)
    return _fp4_quantize(
        input,
        global_scale,
        sf_vec_size,
        sf_use_ue8m0,
        is_sf_swizzled_layout,
        is_sf_8x4_layout,
        is_global_scale_inversed,
        backend,
        _recipe(nvfp4_4over6, sf_vec_size != 16 or sf_use_ue8m0),
    )


def _check_backend(backend, accepted, x):
    if backend not in accepted:
        raise ValueError(f"backend: {backend!r} is not accepted; expected one of {list(accepted)}")
    if backend == "cpu" and isinstance(x, torch.Tensor) and x.device.type != "cpu":
        raise ValueError(f"backend 'cpu' runs CPU tensors; got tensors on {x.device}")


def _fp4_quantize(
    input,
    global_scale,
    sf_vec_size,
    sf_use_ue8m0,
    is_sf_swizzled_layout,
    is_sf_8x4_layout,
    is_global_scale_inversed,
    backend,
    recipe=None,
):
    """fp4_quantize without the API decorator and backend check (nvfp4_quantize calls it
    too); recipe: the kernel's 4over6 tuple or None."""
    if not is_sf_swizzled_layout:
        layout = SfLayout.layout_linear
    elif is_sf_8x4_layout:
        layout = SfLayout.layout_8x4
    else:
        layout = SfLayout.layout_128x4
    column_major = isinstance(input, torch.Tensor) and input.dim() >= 2 and input.stride(-2) == 1
    if column_major:
        input = input.transpose(-2, -1)
    x_q, sf = _quantize(
        input, global_scale, sf_vec_size, sf_use_ue8m0, layout, is_global_scale_inversed, recipe
    )
    if column_major:
        x_q = x_q.transpose(-2, -1)
        sf = sf.transpose(-2, -1)
    return x_q, sf


def _check_per_token_options(per_token_activation, sf_vec_size, row_map, out_scale):
    """The per-token options mean nothing without per-token scales (FlashInfer's rule)."""
    if per_token_activation:
        if sf_vec_size != 16:
            raise ValueError("Per-token NVFP4 quantization only supports sf_vec_size=16")
        return
    if out_scale is not None:
        raise ValueError("out_scale is only supported with per_token_activation=True")
    if row_map is not None:
        raise ValueError(
            "expanded_idx_to_permuted_idx is only supported with per_token_activation=True"
        )


@flashinfer_api  # the check inside the logged call, as fp4_quantize
@backend_requirement(
    {**_QUANTIZE_BACKENDS, "cake": CUDA_KERNEL_REQUIREMENT, "cpu": CPU_REQUIREMENT}
)
def nvfp4_quantize(
    a,
    a_global_sf,
    sfLayout=SfLayout.layout_128x4,
    do_shuffle=False,
    sf_vec_size=16,
    enable_pdl=None,
    backend="cuda",
    per_token_activation=False,
    expanded_idx_to_permuted_idx=None,
    out_scale=None,
    nvfp4_4over6=_UNSET,
):
    """Quantize ``a`` to NVFP4: E2M1 values with one E4M3 scale per ``sf_vec_size``.

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k]`` float16, bfloat16 or float32, ``k`` a multiple of 16.
    a_global_sf : torch.Tensor or float
        One float32 value, typically ``448 * 6 / amax(a)``. With ``per_token_activation``:
        the inverse base multiplier, typically ``1 / (448 * 6)``.
    sfLayout : SfLayout, optional
        Scale layout: ``layout_128x4`` (default), ``layout_8x4`` or ``layout_linear``.
    do_shuffle : bool, optional
        TRT-LLM weight shuffling (epilogue tile 128): rows permuted in blocks of 32, the
        scales too and then interleaved into 128x4 (needs ``layout_128x4``).
    sf_vec_size : int, optional
        16.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).
    backend : str, optional
        ``"cuda"``, ``"cute-dsl"``, ``"cake"`` or ``"cpu"``: the kernel of the input's
        device runs.
    per_token_activation : bool, optional
        One scale per row: ``s[r] = amax(|a[r]|) * a_global_sf``; row ``r`` is quantized
        with the global scale ``1 / s[r]`` and ``s`` is returned as a third tensor
        (float32 ``[m]``).
    expanded_idx_to_permuted_idx : torch.Tensor, optional
        Per-token only: int32 ``[>= m]``; only rows
        ``expanded_idx_to_permuted_idx[i] >= 0`` (``i < m``, each at most once) are
        quantized, the others are left zero.
    out_scale : torch.Tensor, optional
        Per-token only: one float32 value multiplying the returned per-token scales (not
        the quantized values).
    nvfp4_4over6 : NVFP44Over6Config or None, optional
        The 4over6 recipe, as in :func:`fp4_quantize`.

    Returns
    -------
    tuple of torch.Tensor
        ``(a_fp4, a_sf)``: uint8 ``[m, k // 2]`` and uint8 scales ``(-1, k // 16)``;
        per-token: ``(a_fp4, a_sf, per_token_scale)`` with ``a_sf`` shaped
        ``[padded rows, padded blocks]``.
    """
    try:
        layout = SfLayout(sfLayout)
    except ValueError:
        raise ValueError(
            f"sfLayout: {sfLayout!r} is not a layout; expected one of {[x.name for x in SfLayout]}"
        ) from None
    _check_backend(backend, _NVFP4_BACKENDS, a)
    recipe = _recipe(nvfp4_4over6, sf_vec_size != 16)
    _check_per_token_options(
        per_token_activation, sf_vec_size, expanded_idx_to_permuted_idx, out_scale
    )
    if do_shuffle and layout != SfLayout.layout_128x4:
        raise ValueError(f"do_shuffle=True needs sfLayout layout_128x4, got {layout.name}")
    quant_layout = SfLayout.layout_linear if do_shuffle else layout
    if per_token_activation:
        out = _quantize_per_token(
            a, a_global_sf, quant_layout, expanded_idx_to_permuted_idx, out_scale, recipe
        )
    else:
        out = _fp4_quantize(
            a,
            a_global_sf,
            sf_vec_size,
            False,
            quant_layout != SfLayout.layout_linear,
            quant_layout == SfLayout.layout_8x4,
            False,
            backend,
            recipe,
        )
    return _shuffled(out) if do_shuffle else out


def _shuffled(quantized, epilogue_tile_m=128):
    """FlashInfer's do_shuffle: TRT-LLM's row shuffle of the codes (and per-token scales),
    the scales shuffled alike and interleaved into the 128x4 layout, reshaped as they were."""
    x_q, sf = quantized[0], quantized[1]
    x_q = _shuffle_rows(x_q, epilogue_tile_m)
    sf = block_scale_interleave(_shuffle_rows(sf, epilogue_tile_m)).reshape(sf.shape)
    if len(quantized) == 3:
        scales = _shuffle_rows(quantized[2].reshape(-1, 1), epilogue_tile_m).reshape(-1)
        return x_q, sf, scales
    return x_q, sf


def _shuffle_rows(t, epilogue_tile_m):
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    _kernels.shuffle_rows(t, out, epilogue_tile_m)
    return out


@flashinfer_api
def block_scale_interleave(unswizzled_sf):
    """Interleave row-major block scales into the 128x4 layout FP4 GEMMs read.

    Parameters
    ----------
    unswizzled_sf : torch.Tensor
        uint8 or bfloat16 ``[rows, cols]`` or ``[batches, rows, cols]`` (CPU).

    Returns
    -------
    torch.Tensor
        1-D, ``batches * roundup(rows, 128) * roundup(cols, 4)`` elements, padding zeroed.
    """
    t = unswizzled_sf
    batches = t.shape[0] if t.dim() == 3 else 1
    size = _sf_bytes(t.shape[-2], t.shape[-1], SfLayout.layout_128x4) if t.dim() >= 2 else 0
    out = torch.empty(batches * size, dtype=t.dtype, device=t.device)
    _kernels.sf_interleave(t, out)
    return out


nvfp4_block_scale_interleave = block_scale_interleave


@flashinfer_api
def e2m1_and_ufp8sf_scale_to_float(
    e2m1_tensor,
    ufp8_scale_tensor,
    global_scale_tensor=None,
    sf_vec_size=16,
    ufp8_type=1,
    is_sf_swizzled_layout=True,
    is_sf_8x4_layout=False,
):
    """Dequantize packed E2M1 values with their block scales to float32 (on the CPU).

    Parameters
    ----------
    e2m1_tensor : torch.Tensor
        uint8 ``[m, k // 2]``, element ``2j`` in the low nibble of byte ``j``.
    ufp8_scale_tensor : torch.Tensor
        uint8 block scales: E4M3 (``ufp8_type=1``) or UE8M0 (``0``).
    global_scale_tensor : torch.Tensor, optional
        One float32 value multiplying the result (the inverse of the quantizer's).
    sf_vec_size : int
        16 or 32 elements per scale.
    is_sf_swizzled_layout, is_sf_8x4_layout : bool
        The scales' layout: 128x4 (default), 8x4, or linear.

    Returns
    -------
    torch.Tensor
        float32 ``[m, k]``.
    """
    if is_sf_8x4_layout and not is_sf_swizzled_layout:
        raise ValueError("is_sf_8x4_layout=True needs is_sf_swizzled_layout=True")
    if not is_sf_swizzled_layout:
        layout = SfLayout.layout_linear
    else:
        layout = SfLayout.layout_8x4 if is_sf_8x4_layout else SfLayout.layout_128x4
    x_q = e2m1_tensor.cpu()
    out = torch.empty((x_q.shape[0], x_q.shape[-1] * 2), dtype=torch.float32)
    gs = None if global_scale_tensor is None else global_scale_tensor.cpu()
    _kernels.fp4_dequantize(
        x_q, ufp8_scale_tensor.cpu(), gs, out, sf_vec_size, ufp8_type == 0, int(layout)
    )
    return out


@flashinfer_api
def mxfp4_quantize(a, backend="cuda", enable_pdl=None, sfLayout=SfLayout.layout_128x4):
    """Quantize ``a`` to MXFP4: E2M1 values with one UE8M0 scale per 32 elements.

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k]`` float16, bfloat16 or float32, ``k`` a multiple of 32.
    backend : str
        ``"cuda"``, ``"cute-dsl"`` or ``"cpu"``: the kernel of the input's device runs.
    enable_pdl : bool, optional
        Accepted for compatibility.
    sfLayout : SfLayout
        The scales' layout.

    Returns
    -------
    tuple of torch.Tensor
        ``(a_fp4, a_sf)`` as :func:`fp4_quantize` returns them.
    """
    _check_backend(backend, _BACKENDS, a)
    layout = SfLayout(sfLayout)
    return _fp4_quantize(
        a,
        None,
        32,
        True,
        layout != SfLayout.layout_linear,
        layout == SfLayout.layout_8x4,
        False,
        backend,
    )


@flashinfer_api
def mxfp4_dequantize(a_fp4, a_sf, sfLayout=SfLayout.layout_128x4):
    """Dequantize MXFP4 codes with their UE8M0 scales to float32 ``[m, k]`` (on the CPU).

    Parameters
    ----------
    a_fp4 : torch.Tensor
        uint8 ``[m, k // 2]``.
    a_sf : torch.Tensor
        uint8 UE8M0 scales in ``sfLayout``.
    sfLayout : SfLayout
        The scales' layout.
    """
    layout = SfLayout(sfLayout)
    return e2m1_and_ufp8sf_scale_to_float(
        a_fp4.view(torch.uint8),
        a_sf.reshape(-1),
        None,
        sf_vec_size=32,
        ufp8_type=0,
        is_sf_swizzled_layout=layout != SfLayout.layout_linear,
        is_sf_8x4_layout=layout == SfLayout.layout_8x4,
    )


@flashinfer_api
def mxfp4_dequantize_host(weight, scale, group_size=32):
    """:func:`mxfp4_dequantize` of 128x4 scales, FlashInfer's host-side name
    (``group_size``: elements per scale, 32)."""
    return e2m1_and_ufp8sf_scale_to_float(
        weight.view(torch.uint8), scale.reshape(-1), None, group_size, 0, True
    )


@flashinfer_api
def nvfp4_batched_quantize(a, a_global_sf, sf_vec_size=16):
    """Quantize each of a batch of matrices to NVFP4 with 128x4 scales.

    Parameters
    ----------
    a : torch.Tensor
        ``[b, m, k]`` float16, bfloat16 or float32.
    a_global_sf : torch.Tensor or float
        One global scale for the whole batch (as :func:`nvfp4_quantize` takes it).
    sf_vec_size : int
        16.

    Returns
    -------
    tuple of torch.Tensor
        ``(x_q [b, m, k // 2], sf [b, roundup(m, 128) * roundup(k // 16, 4)])``.
    """
    if not isinstance(a, torch.Tensor) or a.dim() != 3:
        raise ValueError("a: expected a 3-D tensor [b, m, k]")
    parts = [
        _quantize(a[i], a_global_sf, sf_vec_size, False, SfLayout.layout_128x4, False)
        for i in range(a.shape[0])
    ]
    x_q = torch.stack([q for q, _ in parts]) if parts else a.new_empty(0, dtype=torch.uint8)
    sf = torch.stack([s.reshape(-1) for _, s in parts]) if parts else x_q
    return x_q, sf


@flashinfer_api
def nvfp4_kv_quantize(input, global_scale):
    """Quantize a KV tensor to NVFP4 with linear block scales (FlashInfer's KV format).

    Parameters
    ----------
    input : torch.Tensor
        ``[m, k]`` float16 or bfloat16, ``k`` a multiple of 16.
    global_scale : torch.Tensor
        One float32 value: the dequantization multiplier (``x ~= e2m1 * sf * global_scale``).

    Returns
    -------
    tuple of torch.Tensor
        ``(fp4_output uint8 [m, k // 2], block_scales uint8 [m, k // 16])``.
    """
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        raise ValueError("input: expected a 2-D tensor [m, k]")
    if input.shape[1] % 16 != 0:
        raise ValueError(f"K dimension ({input.shape[1]}) must be divisible by 16")
    x_q, sf = _quantize(input, global_scale, 16, False, SfLayout.layout_linear, True)
    return x_q, sf.reshape(input.shape[0], input.shape[1] // 16)


@flashinfer_api
def nvfp4_kv_dequantize(fp4_data, block_scales, global_scale, output_dtype=torch.bfloat16):
    """The inverse of :func:`nvfp4_kv_quantize`: ``e2m1 * sf * global_scale``.

    Parameters
    ----------
    fp4_data, block_scales : torch.Tensor
        uint8 ``[m, k // 2]`` and ``[m, k // 16]``.
    global_scale : torch.Tensor
        One float32 value.
    output_dtype : torch.dtype, optional
        Default bfloat16.

    Returns
    -------
    torch.Tensor
        ``[m, k]`` in ``output_dtype`` on ``fp4_data``'s device.
    """
    out = e2m1_and_ufp8sf_scale_to_float(fp4_data, block_scales, global_scale, 16, 1, False)
    return out.to(device=fp4_data.device, dtype=output_dtype)


def _silu_and_mul(x):
    """flashinfer.silu_and_mul without its API logging (the caller's call is logged)."""
    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    _kernels.act_and_mul(x, out, "silu")
    return out


def _grouped_quantize(a, mask, a_global_sf, recipe, silu=False):
    """NVFP4 of each of a batch of [m, k] matrices, the first ``mask[i]`` rows of matrix
    ``i`` with the global scale ``a_global_sf[i]`` (128x4 scales); the other rows' codes
    and scales are zero. ``silu``: silu_and_mul applied to each matrix's rows first (then
    ``a`` is [b, m, 2k]). Returns FlashInfer's grouped-GEMM views: codes
    ``[m, k // 2, b]`` and E4M3 scales ``[32, 4, mp // 128, 4, kp // 4, b]``."""
    if not isinstance(a, torch.Tensor) or a.dim() != 3:
        raise ValueError(f"a: expected a 3-D tensor [b, m, k], got {_described(a)}")
    b, m, width = a.shape
    k = width // 2 if silu else width
    if silu and width % 2:
        raise ValueError(f"a: the last dimension must be even (gate and up), got {width}")
    if k % 16:
        raise ValueError(f"a: k = {k} must be a multiple of 16")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int32 or mask.dim() != 1:
        raise ValueError(f"mask: expected a 1-D int32 tensor [b], got {_described(mask)}")
    if mask.shape[0] != b:
        raise ValueError(f"mask: {mask.shape[0]} entries for a batch of {b}")
    if not isinstance(a_global_sf, torch.Tensor) or a_global_sf.numel() not in (1, b):
        raise ValueError(
            f"a_global_sf: expected a float32 tensor of 1 or {b} values, got "
            f"{_described(a_global_sf)}"
        )
    scales = a_global_sf.to(torch.float32).reshape(-1).expand(b).contiguous()
    rows = mask.cpu().clamp(0, m).tolist()
    kp = (k // 16 + 3) // 4 * 4
    mp = (m + 127) // 128 * 128
    x_q = torch.zeros((b, m, k // 2), dtype=torch.uint8, device=a.device)
    sf = torch.zeros((b, mp * kp), dtype=torch.uint8, device=a.device)
    for i, n in enumerate(rows):
        if n == 0:
            continue
        x = _silu_and_mul(a[i, :n]) if silu else a[i, :n]
        _kernels.fp4_quantize(
            x,
            scales[i : i + 1],
            x_q[i, :n],
            sf[i, : _sf_bytes(n, k // 16, SfLayout.layout_128x4)],
            16,
            False,
            int(SfLayout.layout_128x4),
            False,
            max(1, torch.get_num_threads()),
            _stream(a),
            nvfp4_4over6=recipe,
        )
    sf = sf.view(torch.float8_e4m3fn).view(b, mp // 128, kp // 4, 32, 4, 4)
    return x_q.permute(1, 2, 0), sf.permute(3, 4, 1, 5, 2, 0)


def _described(x):
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__


@flashinfer_api
def scaled_fp4_grouped_quantize(a, mask, a_global_sf, nvfp4_4over6=_UNSET):
    """Quantize a batch of matrices to NVFP4 for FlashInfer's masked grouped GEMM.

    Parameters
    ----------
    a : torch.Tensor
        ``[b, m, k]`` float16, bfloat16 or float32, ``k`` a multiple of 16.
    mask : torch.Tensor
        int32 ``[b]``: matrix ``i``'s first ``mask[i]`` rows are quantized; the codes and
        scales of its other rows are zero (FlashInfer leaves them unwritten).
    a_global_sf : torch.Tensor
        float32, one global scale per matrix ``[b]`` (or one for all, ``[1]``).
    nvfp4_4over6 : NVFP44Over6Config or None, optional
        The 4over6 recipe, as in :func:`fp4_quantize`.

    Returns
    -------
    tuple of torch.Tensor
        ``(x_q, sf)``: uint8 codes viewed as ``[m, k // 2, b]`` (stored ``[b, m, k // 2]``)
        and the 128x4 scales, float8_e4m3fn viewed as
        ``[32, 4, mp // 128, 4, kp // 4, b]`` (``mp``: ``m`` rounded up to 128, ``kp``:
        ``k // 16`` rounded up to 4; stored ``[b, mp // 128, kp // 4, 32, 4, 4]``, each
        matrix's bytes as :func:`fp4_quantize` lays them out).
    """
    return _grouped_quantize(a, mask, a_global_sf, _recipe(nvfp4_4over6, False))


@flashinfer_api
def silu_and_mul_nvfp4_quantize(
    input,
    global_scale,
    sf_vec_size=16,
    is_sf_swizzled_layout=True,
    is_sf_8x4_layout=False,
    enable_pdl=None,
    nvfp4_4over6=_UNSET,
):
    """:func:`flashinfer.silu_and_mul` (rounded to ``input``'s dtype), then NVFP4.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., 2 * k]`` float16, bfloat16 or float32, contiguous; ``k`` a multiple of 16.
        The leading dimensions are flattened into ``m``.
    global_scale : torch.Tensor or float
        One float32 value, as :func:`nvfp4_quantize` takes it.
    sf_vec_size : int, optional
        16 (NotImplementedError otherwise, as in FlashInfer).
    is_sf_swizzled_layout, is_sf_8x4_layout : bool, optional
        The scales' layout, as in :func:`fp4_quantize`.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).
    nvfp4_4over6 : NVFP44Over6Config or None, optional
        The 4over6 recipe, as in :func:`fp4_quantize`.

    Returns
    -------
    tuple of torch.Tensor
        ``(x_q, sf)``: uint8 ``[m, k // 2]`` and the scale bytes ``[rows, cols]`` (linear:
        ``[m, k // 16]``; swizzled: rows padded to 128 or 8, columns to 4).
    """
    if sf_vec_size != 16:
        raise NotImplementedError("sf_vec_size can only be 16 for silu_and_mul_nvfp4_quantize")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if not input.is_contiguous():
        raise ValueError("input: must be row-major contiguous")
    recipe = _recipe(nvfp4_4over6, False)
    y = _silu_and_mul(input.reshape(-1, input.shape[-1]))
    x_q, sf = _fp4_quantize(
        y, global_scale, 16, False, is_sf_swizzled_layout, is_sf_8x4_layout, False, "cuda", recipe
    )
    cols = (y.shape[-1] // 16 + 3) // 4 * 4 if is_sf_swizzled_layout else y.shape[-1] // 16
    return x_q, sf.reshape(-1, cols)
