"""Decode attention: one query token per request against a KV cache.

The computation runs in C (``flashinfer._C.attention``); this module checks the
FlashInfer-shaped arguments, allocates outputs and keeps the wrapper plans.
"""

import math

import torch

from . import _C
from .api_logging import flashinfer_api

_KV_LAYOUTS = ("NHD", "HND")
_POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA")
_HEAD_DIMS = (64, 128, 256)
_DTYPES_BY_NAME = {
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


def _check_choice(name, value, accepted):
    if value not in accepted:
        raise ValueError(f"{name}: {value!r} is not supported; accepted: {', '.join(accepted)}")
    return value


def _check_head_dim(name, head_dim):
    if head_dim not in _HEAD_DIMS:
        raise ValueError(f"{name}: head_dim {head_dim} is not supported; accepted: 64, 128, 256")


def _check_heads(num_qo_heads, num_kv_heads):
    if num_kv_heads < 1 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads: {num_kv_heads} does not divide num_qo_heads {num_qo_heads}; "
            "accepted: a divisor of num_qo_heads"
        )


def _as_dtype(name, value):
    """A torch.dtype from a dtype or its name (FlashInfer accepts both); None stays None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES_BY_NAME:
        return _DTYPES_BY_NAME[value.removeprefix("torch.")]
    raise ValueError(
        f"{name}: {value!r} is not a dtype; accepted: a torch.dtype or one of "
        f"{', '.join(_DTYPES_BY_NAME)}"
    )


def _scale_value(name, scale):
    """A Python float from a scale given as None (1.0), a number or a one-element tensor."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(
                f"{name}: a tensor of shape {tuple(scale.shape)} is not supported; "
                "accepted: a number or a one-element tensor"
            )
        return float(scale.item())
    if isinstance(scale, (int, float)):
        return float(scale)
    raise ValueError(f"{name}: {type(scale).__name__} is not supported; accepted: a number")


def _index_tensor(name, value):
    """A CPU int32 contiguous copy of an index array, as plan() keeps it."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: dtype {value.dtype} is not supported; accepted: int32, int64")
    if value.dim() != 1:
        raise ValueError(f"{name}: expected 1 dimension, got {value.dim()}")
    return value.to(device="cpu", dtype=torch.int32, copy=True).contiguous()


def _packbits_little(bits):
    """Packs a bool tensor's elements (flattened) into uint8, little-endian bit order."""
    flat = bits.reshape(-1).to(torch.int32)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    shifts = torch.arange(8, dtype=torch.int32)
    return (flat.view(-1, 8) << shifts).sum(dim=1).to(torch.uint8)


def _split_paged_kv_cache(paged_kv_cache, kv_layout):
    """(k_cache, v_cache) views from one [num_pages, 2, ...] tensor or a tuple."""
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                f"paged_kv_cache: shape {tuple(paged_kv_cache.shape)} is not supported; "
                f"accepted: [num_pages, 2, ...] with 5 dimensions ({kv_layout}) or a "
                "(k_cache, v_cache) tuple"
            )
        return paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    if isinstance(paged_kv_cache, (tuple, list)) and len(paged_kv_cache) == 2:
        k_cache, v_cache = paged_kv_cache
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"paged_kv_cache: {name} is {shape}; accepted: a 4-dimensional tensor"
                )
        return k_cache, v_cache
    raise ValueError(
        f"paged_kv_cache: {type(paged_kv_cache).__name__} is not supported; accepted: a "
        "tensor [num_pages, 2, ...] or a (k_cache, v_cache) tuple"
    )


def _check_paged_cache(k_cache, kv_layout, num_kv_heads, page_size, head_dim):
    if kv_layout == "NHD":
        got = (k_cache.shape[1], k_cache.shape[2])
    else:
        got = (k_cache.shape[2], k_cache.shape[1])
    if got != (page_size, num_kv_heads) or k_cache.shape[3] != head_dim:
        raise ValueError(
            f"paged_kv_cache: page shape (page_size, num_kv_heads, head_dim) is "
            f"{got + (k_cache.shape[3],)} in layout {kv_layout}; planned "
            f"{(page_size, num_kv_heads, head_dim)}"
        )


def _check_planned_dtype(name, tensor, planned, planned_name):
    if planned is not None and tensor.dtype != planned:
        raise ValueError(
            f"{name}: dtype {tensor.dtype} differs from the planned {planned_name} {planned}"
        )


def _output(name, given, shape, dtype, device=None):
    """The preallocated output when given (checked), else a new tensor on device."""
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(given, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(given).__name__}")
    if tuple(given.shape) != tuple(shape) or given.dtype != dtype:
        raise ValueError(
            f"{name}: shape {tuple(given.shape)} and dtype {given.dtype} do not match the "
            f"expected {tuple(shape)} and {dtype}"
        )
    return given


def _no_extra_args(args):
    if args:
        raise ValueError(
            f"args: {len(args)} extra positional arguments given; accepted: none (they feed "
            "JIT custom modules, which this build does not have)"
        )


def _on_device(name, t, device, cache):
    """t on device; copies are kept in cache (a plan's dict) so run() copies once."""
    if t is None or t.device == device:
        return t
    if cache is None:
        return t.to(device)
    key = (name, str(device))
    copy = cache.get(key)
    if copy is None:
        copy = cache[key] = t.to(device)
    return copy


def _attention(q, k, v, out, lse, qo_indptr, kv_indptr, cache=None, **kwargs):
    """Runs the C kernel; everything is re-checked in C before any memory is read.

    CUDA q: the index tensors (planned on the CPU) move to q's device, cached in cache,
    and the kernel runs on the current stream of q's device.
    """
    if q.device.type == "cuda":
        qo_indptr = _on_device("qo_indptr", qo_indptr, q.device, cache)
        kv_indptr = _on_device("kv_indptr", kv_indptr, q.device, cache)
        for name in ("kv_indices", "kv_last_page_len", "mask", "mask_indptr"):
            if kwargs.get(name) is not None:
                kwargs[name] = _on_device(name, kwargs[name], q.device, cache)
        kwargs["stream"] = torch.cuda.current_stream(q.device).cuda_stream
    _C.attention(
        q, k, v, out, lse, qo_indptr, kv_indptr, num_threads=torch.get_num_threads(), **kwargs
    )


def _common_kwargs(
    kv_layout, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta
):
    return dict(
        kv_layout=_check_choice("kv_layout", kv_layout, _KV_LAYOUTS),
        pos_encoding_mode=_check_choice(
            "pos_encoding_mode", pos_encoding_mode, _POS_ENCODING_MODES
        ),
        window_left=-1 if window_left is None else int(window_left),
        logits_soft_cap=0.0 if logits_soft_cap is None else float(logits_soft_cap),
        sm_scale=sm_scale,
        rope_scale=1.0 if rope_scale is None else float(rope_scale),
        rope_theta=1e4 if rope_theta is None else float(rope_theta),
    )


def _check_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


@flashinfer_api
def single_decode_with_kv_cache(
    q,
    k,
    v,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_tensor_cores=False,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    return_lse=False,
):
    """Decode attention of one query token against a single request's KV cache.

    Parameters
    ----------
    q : torch.Tensor
        ``[num_qo_heads, head_dim]``, float16/bfloat16/float32.
    k, v : torch.Tensor
        ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
        (HND); q's dtype or float8 (e4m3fn, e5m2).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    pos_encoding_mode : str
        ``"NONE"`` or ``"ROPE_LLAMA"`` (RoPE applied to q and k on the fly).
    use_tensor_cores : bool
        Accepted for compatibility; no effect on CPU.
    q_scale, k_scale, v_scale : float or torch.Tensor, optional
        Scales for quantized inputs: q and k scales multiply ``sm_scale``, v's the output.
    window_left : int
        Keep only keys at most this many positions before the query (-1: all).
    logits_soft_cap : float, optional
        ``c`` applies ``c * tanh(s / c)`` to the scaled logits.
    sm_scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    rope_scale, rope_theta : float, optional
        RoPE interpolation scale (default 1) and base (default 1e4).
    return_lse : bool
        Also return the base-2 log-sum-exp of the scaled logits, float32.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        ``[num_qo_heads, head_dim]`` in q's dtype, and ``[num_qo_heads]`` lse when asked.
    """
    _check_tensor("q", q, 2)
    _check_tensor("k", k, 3)
    _check_tensor("v", v, 3)
    kw = _common_kwargs(
        kv_layout,
        pos_encoding_mode,
        window_left,
        logits_soft_cap,
        sm_scale,
        rope_scale,
        rope_theta,
    )
    head_dim = q.shape[-1]
    scale = kw.pop("sm_scale")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    scale *= _scale_value("q_scale", q_scale) * _scale_value("k_scale", k_scale)
    kv_len = k.shape[0] if kw["kv_layout"] == "NHD" else k.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((1, q.shape[0]), dtype=torch.float32, device=q.device) if return_lse else None
    _attention(
        q.unsqueeze(0),
        k,
        v,
        out.unsqueeze(0),
        lse,
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([0, kv_len], dtype=torch.int32),
        sm_scale=scale,
        v_scale=_scale_value("v_scale", v_scale),
        **kw,
    )
    return (out, lse[0]) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper:
    """Batched decode attention over a paged KV cache: ``plan`` once, ``run`` per step.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Accepted for compatibility (the CPU kernels need no workspace).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_cuda_graph, use_tensor_cores : bool
        Accepted for compatibility.
    paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer
        Accepted for compatibility (CUDA-graph buffers).
    backend : str
        Accepted for compatibility.
    """

    @flashinfer_api
    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
    ):
        if jit_args is not None or jit_kwargs is not None:
            raise NotImplementedError("jit_args/jit_kwargs: JIT custom modules are not supported")
        self._kv_layout = _check_choice("kv_layout", kv_layout, _KV_LAYOUTS)
        self._float_workspace_buffer = float_workspace_buffer
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = use_tensor_cores
        self._backend = backend
        self._plan = None

    @flashinfer_api
    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
    ):
        """Records the batch's page table and attention settings for later ``run`` calls.

        Parameters
        ----------
        indptr : torch.Tensor
            ``[batch_size + 1]`` int32 offsets into ``indices``.
        indices : torch.Tensor
            Page ids of every request, concatenated.
        last_page_len : torch.Tensor
            ``[batch_size]`` tokens in each request's last page, in ``[1, page_size]``.
        num_qo_heads, num_kv_heads, head_dim, page_size : int
            Problem sizes (num_qo_heads a multiple of num_kv_heads; head_dim 64/128/256).
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta
            As in :func:`single_decode_with_kv_cache`.
        q_data_type, kv_data_type, data_type : torch.dtype or str
            Expected dtypes of q and the KV cache (``data_type`` is the older name).
        non_blocking : bool
            Accepted for compatibility.
        """
        indptr = _index_tensor("indptr", indptr)
        indices = _index_tensor("indices", indices)
        last_page_len = _index_tensor("last_page_len", last_page_len)
        batch_size = indptr.numel() - 1
        if batch_size < 0 or last_page_len.numel() != batch_size:
            raise ValueError(
                f"last_page_len: {last_page_len.numel()} entries but indptr has "
                f"{indptr.numel()}; accepted: len(indptr) - 1 entries"
            )
        _check_heads(num_qo_heads, num_kv_heads)
        _check_head_dim("head_dim", head_dim)
        if page_size < 1:
            raise ValueError(f"page_size: {page_size} is not accepted; accepted: >= 1")
        kw = _common_kwargs(
            self._kv_layout,
            pos_encoding_mode,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        if kw["sm_scale"] is None:
            kw["sm_scale"] = 1.0 / math.sqrt(head_dim)
        q_dtype = _as_dtype("q_data_type", q_data_type)
        kv_dtype = _as_dtype("kv_data_type", kv_data_type)
        if kv_dtype is None:
            kv_dtype = _as_dtype("data_type", data_type)
        if kv_dtype is None:
            kv_dtype = q_dtype
        self._plan = dict(
            kv_indptr=indptr,
            kv_indices=indices,
            kv_last_page_len=last_page_len,
            qo_indptr=torch.arange(batch_size + 1, dtype=torch.int32),
            batch_size=batch_size,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            kwargs=kw,
        )

    @flashinfer_api
    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
    ):
        """Decode attention for the planned batch.

        Parameters
        ----------
        q : torch.Tensor
            ``[batch_size, num_qo_heads, head_dim]``.
        paged_kv_cache : torch.Tensor or tuple of torch.Tensor
            ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD; HND swaps
            page_size and num_kv_heads) or a ``(k_cache, v_cache)`` tuple.
        q_scale, k_scale, v_scale : float or torch.Tensor, optional
            Scales for quantized inputs.
        out, lse : torch.Tensor, optional
            Preallocated outputs (``[batch_size, num_qo_heads]`` float32 for lse).
        return_lse : bool
            Also return lse.
        enable_pdl : bool, optional
            Accepted for compatibility.
        window_left : int, optional
            Overrides the planned ``window_left``.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            ``out`` ``[batch_size, num_qo_heads, head_dim]``, and lse when asked.
        """
        _no_extra_args(args)
        plan = self._plan
        if plan is None:
            raise RuntimeError("run: plan() must be called before run()")
        _check_tensor("q", q, 3)
        want = (plan["batch_size"], plan["num_qo_heads"], plan["head_dim"])
        if tuple(q.shape) != want:
            raise ValueError(
                f"q: shape {tuple(q.shape)} does not match the plan (batch_size, "
                f"num_qo_heads, head_dim) = {want}"
            )
        _check_planned_dtype("q", q, plan["q_dtype"], "q_data_type")
        k_cache, v_cache = _split_paged_kv_cache(paged_kv_cache, self._kv_layout)
        _check_paged_cache(
            k_cache, self._kv_layout, plan["num_kv_heads"], plan["page_size"], plan["head_dim"]
        )
        _check_planned_dtype("paged_kv_cache", k_cache, plan["kv_dtype"], "kv_data_type")
        kw = dict(plan["kwargs"])
        if window_left is not None:
            kw["window_left"] = int(window_left)
        kw["sm_scale"] *= _scale_value("q_scale", q_scale) * _scale_value("k_scale", k_scale)
        out = _output("out", out, q.shape, q.dtype, q.device)
        if return_lse or lse is not None:
            lse = _output("lse", lse, q.shape[:2], torch.float32, q.device)
        _attention(
            q,
            k_cache,
            v_cache,
            out,
            lse,
            plan["qo_indptr"],
            plan["kv_indptr"],
            kv_indices=plan["kv_indices"],
            kv_last_page_len=plan["kv_last_page_len"],
            cache=plan.setdefault("device_copies", {}),
            v_scale=_scale_value("v_scale", v_scale),
            **kw,
        )
        return (out, lse) if return_lse else out
