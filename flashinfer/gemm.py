"""FP8 and FP4 GEMMs: ``bmm_fp8``, ``mm_fp8`` (with ``prepare_low_latency_gemm_weights``)
and ``mm_fp4``.

Arguments are checked and the products computed in the C extension (``flashinfer._kernels``);
this module picks defaults, allocates outputs and validates backend names. CUDA tensors
run the CUDA kernels on the current stream of their device (``bmm_fp8`` through cuBLASLt
for ``backend="cublas"``, ``"cublaslt"`` and ``"auto"``, falling back to the native kernel).
"""

import functools
import os

import torch

from . import _kernels
from .api_logging import flashinfer_api
from .fp4_quantization import SfLayout

BMM_FP8_BACKENDS = ("cudnn", "cublas", "cublaslt", "cutlass", "auto")
MM_FP8_BACKENDS = ("trtllm_low_latency",)
MM_FP4_BACKENDS = ("cudnn", "trtllm", "cutlass", "auto")
_HALF_DTYPES = (torch.bfloat16, torch.float16)
_CUBLASLT_BACKENDS = ("cublas", "cublaslt", "auto")
# _kernels.bmm_fp8's backend argument: native kernel, or cuBLASLt falling back to it
_NATIVE, _CUBLASLT = 0, 1
_CUBLASLT_WORKSPACE_BYTES = 32 * 1024 * 1024


def _check_choice(name, value, accepted):
    if value not in accepted:
        raise ValueError(f"{name}: {value!r} is not accepted; expected one of {list(accepted)}")


def _num_threads():
    return max(1, torch.get_num_threads())


def _is_tensor_with_ndim(x, ndim):
    return isinstance(x, torch.Tensor) and x.dim() == ndim


def _stream(x):
    """The current CUDA stream of x's device as an int (0 for anything not on CUDA)."""
    if isinstance(x, torch.Tensor) and x.is_cuda:
        return torch.cuda.current_stream(x.device).cuda_stream
    return 0


@functools.lru_cache(maxsize=1)
def _cublas_lib_dir():
    """The directory of the pip wheel's libcublasLt that torch ships with (``nvidia/cublas/lib``
    for CUDA 12, ``nvidia/cu13/lib`` for CUDA 13), or None. Only a hint: the C side first
    uses a cuBLASLt the process has already loaded."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cublas", "cu13"):
            lib = os.path.join(base, sub, "lib")
            if os.path.isdir(lib) and any(f.startswith("libcublasLt.so") for f in os.listdir(lib)):
                return lib
    return None


@flashinfer_api
def bmm_fp8(A, B, A_scale, B_scale, dtype, out=None, backend="cublas"):
    """Batched FP8 matrix multiplication: ``out = (A @ B) * A_scale * B_scale``.

    Parameters
    ----------
    A : torch.Tensor
        Input ``[b, m, k]``, ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
    B : torch.Tensor
        Weight ``[b, k, n]``, fp8; column-major (the transpose of a ``[b, n, k]`` tensor)
        is the fast layout, any strides are accepted.
    A_scale, B_scale : torch.Tensor
        One float32 value each (dequantization scales).
    dtype : torch.dtype
        Output dtype, ``torch.bfloat16`` or ``torch.float16``.
    out : torch.Tensor, optional
        Preallocated contiguous output ``[b, m, n]`` of ``dtype``.
    backend : str, optional
        One of FlashInfer's backends (``"cudnn"``, ``"cublas"``, ``"cublaslt"``,
        ``"cutlass"``, ``"auto"``). CPU tensors: all run the same CPU kernel. CUDA tensors:
        ``"cublas"``, ``"cublaslt"`` and ``"auto"`` use cuBLASLt's fp8 matmul (loaded at
        first use; A row-major and B column-major, 16-byte aligned, ``k % 16 == 0`` and
        ``n % 8 == 0``) and fall back to the native tensor-core kernel when cuBLASLt is
        missing or cannot take the operands; ``"cudnn"`` and ``"cutlass"`` run the
        native kernel.

    Returns
    -------
    torch.Tensor
        ``out``, ``[b, m, n]`` of ``dtype``; accumulation is float32.
    """
    _check_choice("backend", backend, BMM_FP8_BACKENDS)
    _check_choice("dtype", dtype, _HALF_DTYPES)
    if out is None and _is_tensor_with_ndim(A, 3) and _is_tensor_with_ndim(B, 3):
        out = torch.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=dtype, device=A.device)
    elif out is not None and isinstance(out, torch.Tensor) and out.dtype != dtype:
        raise ValueError(f"out: dtype {out.dtype} does not match dtype={dtype}")
    if isinstance(A, torch.Tensor) and A.is_cuda:
        native = backend not in _CUBLASLT_BACKENDS
        workspace = None
        if not native:
            workspace = torch.empty(_CUBLASLT_WORKSPACE_BYTES, dtype=torch.uint8, device=A.device)
        _kernels.bmm_fp8(
            A,
            B,
            A_scale,
            B_scale,
            out,
            _num_threads(),
            _stream(A),
            _NATIVE if native else _CUBLASLT,
            workspace,
            _cublas_lib_dir(),
        )
    else:
        _kernels.bmm_fp8(A, B, A_scale, B_scale, out, _num_threads())
    return out


@flashinfer_api
def prepare_low_latency_gemm_weights(w, permutation_indices_cache=None):
    """Lay out an FP8 weight for ``mm_fp8``: ``[n, k]`` -> ``[k // 128, n, 128]``.

    Block ``i`` holds columns ``128 * i .. 128 * i + 127`` of every row. FlashInfer's
    CUDA kernel also permutes rows for its epilogue; the CPU kernel reads rows in order,
    so no permutation is applied and ``permutation_indices_cache`` is accepted unused.

    Parameters
    ----------
    w : torch.Tensor
        Weight ``[n, k]``, ``torch.float8_e4m3fn``, ``k`` a multiple of 128.
    permutation_indices_cache : dict, optional
        Accepted for compatibility.

    Returns
    -------
    torch.Tensor
        Contiguous ``[k // 128, n, 128]`` tensor of ``w``'s dtype.
    """
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"w: expected a 2-D tensor [n, k], got shape {list(w.shape)}")
    n, k = w.shape
    if k % 128 != 0:
        raise ValueError(f"w: k = {k} (w.shape[1]) must be a multiple of 128")
    return w.reshape(n, k // 128, 128).transpose(0, 1).contiguous()


@flashinfer_api
def mm_fp8(a, b, alpha=None, out_dtype=torch.bfloat16, out=None, backend="trtllm_low_latency"):
    """FP8 matrix multiplication with a prepared weight: ``out = alpha * (a @ w.T)``.

    Parameters
    ----------
    a : torch.Tensor
        Input ``[m, k]``, ``torch.float8_e4m3fn``.
    b : torch.Tensor
        ``prepare_low_latency_gemm_weights(w)`` for a ``[n, k]`` e4m3 weight ``w``:
        ``[k // 128, n, 128]``.
    alpha : torch.Tensor, optional
        One float32 value scaling the product (e.g. ``a_scale * w_scale``); 1 if None.
    out_dtype : torch.dtype, optional
        ``torch.bfloat16`` (default) or ``torch.float16``.
    out : torch.Tensor, optional
        Preallocated contiguous ``[m, n]`` output of ``out_dtype``.
    backend : str, optional
        ``"trtllm_low_latency"``.

    Returns
    -------
    torch.Tensor
        ``[m, n]`` of ``out_dtype``.
    """
    _check_choice("backend", backend, MM_FP8_BACKENDS)
    _check_choice("out_dtype", out_dtype, _HALF_DTYPES)
    if out is None and _is_tensor_with_ndim(a, 2) and _is_tensor_with_ndim(b, 3):
        out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    elif out is not None and isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise ValueError(f"out: dtype {out.dtype} does not match out_dtype={out_dtype}")
    _kernels.mm_fp8(a, b, alpha, out, _num_threads(), _stream(a))
    return out


def _sf_layout_for(a_descale, b_descale, m, n, kblocks, use_8x4_sf_layout):
    """Scale layout of mm_fp4's operands: 8x4 when asked, linear when the scale tensors hold
    exactly rows x blocks bytes and that differs from the padded 128x4 size, else 128x4."""
    if use_8x4_sf_layout:
        return SfLayout.layout_8x4

    def padded(rows):
        return (rows + 127) // 128 * 128 * ((kblocks + 3) // 4 * 4)

    if (
        isinstance(a_descale, torch.Tensor)
        and isinstance(b_descale, torch.Tensor)
        and a_descale.numel() == m * kblocks
        and b_descale.numel() == n * kblocks
        and (padded(m) != m * kblocks or padded(n) != n * kblocks)
    ):
        return SfLayout.layout_linear
    return SfLayout.layout_128x4


@flashinfer_api
def mm_fp4(
    a,
    b,
    a_descale,
    b_descale,
    alpha=None,
    out_dtype=torch.bfloat16,
    out=None,
    block_size=16,
    use_8x4_sf_layout=False,
    backend="auto",
    use_nvfp4=True,
    enable_pdl=True,
):
    """FP4 matrix multiplication: ``out = alpha * dequant(a) @ dequant(b)``.

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k // 2]`` packed E2M1 values (uint8), as ``nvfp4_quantize`` returns them.
    b : torch.Tensor
        ``[k // 2, n]``: the ``.T`` of a quantized ``[n, k]`` weight.
    a_descale, b_descale : torch.Tensor
        Block scales of ``a`` and of the weight (``b_descale`` is passed as ``sf.T``),
        E4M3 bytes (NVFP4) or UE8M0 bytes (MXFP4), in the 128x4 layout (8x4 with
        ``use_8x4_sf_layout``; linear when their sizes can only mean linear).
    alpha : torch.Tensor, optional
        One float32 value, typically ``1 / (a_global_sf * b_global_sf)``; 1 if None.
    out_dtype : torch.dtype, optional
        ``torch.bfloat16`` (default) or ``torch.float16``.
    out : torch.Tensor, optional
        Preallocated contiguous ``[m, n]`` output.
    block_size : int, optional
        Elements per scale: 16 for NVFP4, 32 for MXFP4.
    use_8x4_sf_layout : bool, optional
        Scales are in the 8x4 layout.
    backend : str, optional
        ``"cudnn"``, ``"trtllm"``, ``"cutlass"`` or ``"auto"``; all run the one kernel of
        the tensors' device (on CUDA: dequantized bf16 tiles on the tensor cores).
        Weights shuffled for ``"trtllm"`` (``do_shuffle=True``) are not supported.
    use_nvfp4 : bool, optional
        True: NVFP4 (E4M3 scales, block_size 16); False: MXFP4 (UE8M0, block_size 32).
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch option).

    Returns
    -------
    torch.Tensor
        ``[m, n]`` of ``out_dtype``; accumulation is float32.
    """
    _check_choice("backend", backend, MM_FP4_BACKENDS)
    _check_choice("out_dtype", out_dtype, _HALF_DTYPES)
    want_block = 16 if use_nvfp4 else 32
    if block_size != want_block:
        raise ValueError(
            f"block_size: {block_size!r} does not fit use_nvfp4={use_nvfp4}; "
            f"expected {want_block} (16 for NVFP4, 32 for MXFP4)"
        )
    layout = SfLayout.layout_128x4
    if _is_tensor_with_ndim(a, 2) and _is_tensor_with_ndim(b, 2):
        m, n, kblocks = a.shape[0], b.shape[1], a.shape[1] * 2 // block_size
        layout = _sf_layout_for(a_descale, b_descale, m, n, kblocks, use_8x4_sf_layout)
        if out is None:
            out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if out is not None and isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise ValueError(f"out: dtype {out.dtype} does not match out_dtype={out_dtype}")
    _kernels.mm_fp4(
        a,
        b,
        a_descale,
        b_descale,
        alpha,
        out,
        block_size,
        int(layout),
        not use_nvfp4,
        _num_threads(),
        _stream(a),
    )
    return out
