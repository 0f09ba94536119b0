"""FP8 and FP4 GEMMs: ``bmm_fp8``, ``mm_fp8`` (with ``prepare_low_latency_gemm_weights``)
and ``mm_fp4``.

Arguments are checked and the products computed in the C extension (``flashinfer._kernels``);
this module picks defaults, allocates outputs and carries FlashInfer's backend surface
(``flashinfer.utils.backend_requirement``: ``is_backend_supported``, ``skip_check=``, ...).
Every FlashInfer backend name runs our kernel for the tensors' device: the CPU kernel for CPU
tensors; for CUDA tensors the native CUDA kernel, or cuBLASLt (``bmm_fp8``/``mm_fp8`` with
``"cublas"``, ``"cublaslt"``, ``"auto"``), falling back to the native kernel when cuBLASLt
cannot take the operands. ``"cpu"`` names the CPU kernel (CPU tensors only).
"""

import torch

from . import _kernels
from .api_logging import flashinfer_api
from .fp4_quantization import SfLayout
from .utils import (
    CPU_REQUIREMENT,
    CUBLASLT_REQUIREMENT,
    CUDA_KERNEL_REQUIREMENT,
    BackendSupportedError,
    _cublas_lib_dir,
    backend_requirement,
    preferring,
)

BMM_FP8_BACKENDS = ("cudnn", "cublas", "cutlass", "cute-dsl", "cublaslt", "cpu", "auto")
MM_FP8_BACKENDS = (
    "trtllm_low_latency",
    "cutedsl_low_latency",
    "cublas",
    "cudnn",
    "cutlass",
    "cpu",
    "auto",
)
MM_FP4_BACKENDS = (
    "cudnn",
    "trtllm",
    "cutlass",
    "cute-dsl",
    "cutedsl_low_latency",
    "b12x",
    "cake",
    "cpu",
    "auto",
)
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


def _check_cpu_backend(backend, x):
    """backend "cpu" runs CPU tensors only (reached with skip_check=True)."""
    if backend == "cpu" and isinstance(x, torch.Tensor) and x.device.type != "cpu":
        raise BackendSupportedError(f"backend 'cpu' runs CPU tensors; got tensors on {x.device}")


def _bmm_fp8_cuda(A, B, A_scale, B_scale, out, backend):
    """The CUDA call of _kernels.bmm_fp8: cuBLASLt (falling back to native) or native."""
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


@backend_requirement(
    {
        "cudnn": CUDA_KERNEL_REQUIREMENT,
        "cublas": CUBLASLT_REQUIREMENT,
        "cutlass": CUDA_KERNEL_REQUIREMENT,
        "cute-dsl": CUDA_KERNEL_REQUIREMENT,
        "cublaslt": CUBLASLT_REQUIREMENT,
        "cpu": CPU_REQUIREMENT,
    },
    heuristic_func=preferring(("cpu", "cublas", "cutlass", "cudnn", "cute-dsl", "cublaslt")),
)
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
        FlashInfer's backends (``"cudnn"``, ``"cublas"``, ``"cutlass"``, ``"cute-dsl"``,
        ``"auto"``), ``"cublaslt"`` and ``"cpu"``. CPU tensors: all run the CPU kernel
        (``"auto"`` picks ``"cpu"``). CUDA tensors: ``"cublas"``, ``"cublaslt"`` and
        ``"auto"`` use cuBLASLt's fp8 matmul (compute capability 8.9+, loaded at first use;
        A row-major and B column-major, 16-byte aligned, ``k % 16 == 0`` and ``n % 8 == 0``)
        and fall back to the native tensor-core kernel when it cannot take the operands;
        the others run the native kernel. ``bmm_fp8.is_backend_supported(backend, cc)``
        says which run on a GPU of capability ``cc`` in this build.

    Returns
    -------
    torch.Tensor
        ``out``, ``[b, m, n]`` of ``dtype``; accumulation is float32.
    """
    _check_choice("backend", backend, BMM_FP8_BACKENDS)
    _check_choice("dtype", dtype, _HALF_DTYPES)
    _check_cpu_backend(backend, A)
    if out is None and _is_tensor_with_ndim(A, 3) and _is_tensor_with_ndim(B, 3):
        out = torch.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=dtype, device=A.device)
    elif out is not None and isinstance(out, torch.Tensor) and out.dtype != dtype:
        raise ValueError(f"out: dtype {out.dtype} does not match dtype={dtype}")
    if isinstance(A, torch.Tensor) and A.is_cuda:
        _bmm_fp8_cuda(A, B, A_scale, B_scale, out, backend)
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


def _mm_fp8_heuristic(suitable, b=None, **kwargs):
    """The prepared weight runs trtllm_low_latency, the [n, k] weight the per-tensor GEMMs
    (cuBLASLt first); CPU tensors run "cpu"."""
    if _is_tensor_with_ndim(b, 3):
        order = ("cpu", "trtllm_low_latency")
    else:
        order = ("cpu", "cublas", "cutlass", "cudnn", "cutedsl_low_latency")
    return [x for x in order if x in suitable]


def _check_weight_layout(backend, b):
    """trtllm_low_latency takes the prepared weight, the other named backends [n, k]."""
    if backend in ("auto", "cpu") or not isinstance(b, torch.Tensor):
        return
    if backend == "trtllm_low_latency" and b.dim() != 3:
        raise ValueError(
            f"b: backend 'trtllm_low_latency' takes prepare_low_latency_gemm_weights(w) "
            f"[k // 128, n, 128]; got shape {list(b.shape)}"
        )
    if backend != "trtllm_low_latency" and b.dim() != 2:
        raise ValueError(
            f"b: backend '{backend}' takes the unprocessed weight [n, k]; got shape "
            f"{list(b.shape)} (prepared weights run 'trtllm_low_latency')"
        )


def _check_fp8_matrix(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(
            f"{name}: {x.dtype} of shape {list(x.shape)} is not supported; accepted: a 2-D "
            "float8_e4m3fn or float8_e5m2 tensor"
        )


def _mm_fp8_unprocessed(a, b, alpha, out_dtype, out, backend):
    """mm_fp8 on the unprocessed weight b [n, k]: bmm_fp8's kernel on [1, m, k] x [1, k, n]."""
    _check_fp8_matrix("a", a)
    _check_fp8_matrix("b", b)
    if b.shape[1] != a.shape[1]:
        raise ValueError(
            f"b: k = {b.shape[1]} (b.shape[1]) does not match a's k = {a.shape[1]} (a.shape[1])"
        )
    one = torch.ones(1, dtype=torch.float32, device=a.device)
    if alpha is None:
        alpha = one
    elif not isinstance(alpha, torch.Tensor) or alpha.numel() != 1 or alpha.dtype != torch.float32:
        raise ValueError(f"alpha: expected one float32 value, got {alpha!r}")
    want = (a.shape[0], b.shape[0])
    if out is None:
        out = torch.empty(want, dtype=out_dtype, device=a.device)
    elif tuple(out.shape) != want:
        raise ValueError(f"out: shape {list(out.shape)} does not match the expected {list(want)}")
    A, B, out3 = a.unsqueeze(0), b.t().unsqueeze(0), out.unsqueeze(0)
    if a.is_cuda:
        _bmm_fp8_cuda(A, B, alpha, one, out3, backend)
    else:
        _kernels.bmm_fp8(A, B, alpha, one, out3, _num_threads())
    return out


@backend_requirement(
    {
        "trtllm_low_latency": CUDA_KERNEL_REQUIREMENT,
        "cutedsl_low_latency": CUDA_KERNEL_REQUIREMENT,
        "cublas": CUBLASLT_REQUIREMENT,
        "cudnn": CUDA_KERNEL_REQUIREMENT,
        "cutlass": CUDA_KERNEL_REQUIREMENT,
        "cpu": CPU_REQUIREMENT,
    },
    heuristic_func=_mm_fp8_heuristic,
)
@flashinfer_api
def mm_fp8(a, b, alpha=None, out_dtype=torch.bfloat16, out=None, backend="trtllm_low_latency"):
    """FP8 matrix multiplication: ``out = alpha * (a @ w.T)``.

    Parameters
    ----------
    a : torch.Tensor
        Input ``[m, k]``, ``torch.float8_e4m3fn`` (or e5m2 with an unprocessed weight).
    b : torch.Tensor
        ``"trtllm_low_latency"``: ``prepare_low_latency_gemm_weights(w)`` for a ``[n, k]``
        e4m3 weight ``w``, ``[k // 128, n, 128]``. ``"cutedsl_low_latency"``, ``"cublas"``,
        ``"cudnn"``, ``"cutlass"``: the unprocessed ``[n, k]`` weight. ``"auto"`` and
        ``"cpu"``: either (the layout picks the path).
    alpha : torch.Tensor, optional
        One float32 value scaling the product (e.g. ``a_scale * w_scale``); 1 if None.
    out_dtype : torch.dtype, optional
        ``torch.bfloat16`` (default) or ``torch.float16``.
    out : torch.Tensor, optional
        Preallocated contiguous ``[m, n]`` output of ``out_dtype``.
    backend : str, optional
        ``"trtllm_low_latency"`` (default), ``"cutedsl_low_latency"``, ``"cublas"``,
        ``"cudnn"``, ``"cutlass"``, ``"auto"`` or ``"cpu"``. The unprocessed weight runs
        ``bmm_fp8``'s kernels (cuBLASLt for ``"cublas"`` and ``"auto"`` on CUDA).

    Returns
    -------
    torch.Tensor
        ``[m, n]`` of ``out_dtype``.
    """
    _check_choice("backend", backend, MM_FP8_BACKENDS)
    _check_choice("out_dtype", out_dtype, _HALF_DTYPES)
    _check_cpu_backend(backend, a)
    _check_weight_layout(backend, b)
    if out is not None and isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise ValueError(f"out: dtype {out.dtype} does not match out_dtype={out_dtype}")
    if _is_tensor_with_ndim(b, 2):
        return _mm_fp8_unprocessed(a, b, alpha, out_dtype, out, backend)
    if out is None and _is_tensor_with_ndim(a, 2) and _is_tensor_with_ndim(b, 3):
        out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
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


@backend_requirement(
    {
        "cudnn": CUDA_KERNEL_REQUIREMENT,
        "trtllm": CUDA_KERNEL_REQUIREMENT,
        "cutlass": CUDA_KERNEL_REQUIREMENT,
        "cute-dsl": CUDA_KERNEL_REQUIREMENT,
        "cutedsl_low_latency": CUDA_KERNEL_REQUIREMENT,
        "b12x": CUDA_KERNEL_REQUIREMENT,
        "cake": CUDA_KERNEL_REQUIREMENT,
        "cpu": CPU_REQUIREMENT,
    },
    heuristic_func=preferring(("cpu", "cudnn", "cutlass")),
)
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
        FlashInfer's backends (``"cudnn"``, ``"trtllm"``, ``"cutlass"``, ``"cute-dsl"``,
        ``"cutedsl_low_latency"``, ``"b12x"``, ``"cake"``, ``"auto"``) and ``"cpu"``; all
        run the one kernel of the tensors' device (on CUDA: dequantized bf16 tiles on the
        tensor cores). Weights shuffled for ``"trtllm"`` (``do_shuffle=True``) are not
        supported.
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
    _check_cpu_backend(backend, a)
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
