"""Decode attention: one query token per request against a KV cache.

The computation runs in C (``flashinfer._kernels.attention``); this module checks the
FlashInfer-shaped arguments, allocates outputs and keeps the wrapper plans.
"""

import torch

from ._attention_common import (
    _check_head_dim,
    _check_heads,
    _check_page_size,
    _check_planned_q,
    _common_kwargs,
    _index_tensor,
    _init_wrapper,
    _paged_kv,
    _Plan,
    _plan_dtypes,
    _planned,
    _run_kwargs,
    _run_outputs,
    _run_planned,
    _run_single,
    _scale_value,
    _single_kwargs,
)
from .api_logging import flashinfer_api


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
    kw = _single_kwargs(
        q,
        k,
        v,
        2,
        q_scale,
        k_scale,
        kv_layout,
        pos_encoding_mode,
        window_left,
        logits_soft_cap,
        sm_scale,
        rope_scale,
        rope_theta,
    )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = _run_single(
        q.unsqueeze(0),
        k,
        v,
        out.unsqueeze(0),
        return_lse,
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
        _init_wrapper(
            self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, (jit_args, jit_kwargs)
        )
        self._use_tensor_cores = use_tensor_cores

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
        _check_page_size(page_size)
        kw = _common_kwargs(
            self._kv_layout,
            pos_encoding_mode,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        q_dtype, kv_dtype, _ = _plan_dtypes(q_data_type, kv_data_type, data_type)
        self._plan = _Plan(
            qo_indptr=torch.arange(batch_size + 1, dtype=torch.int32),
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            settings=kw,
            kv_indptr=indptr,
            page_size=page_size,
            kv_indices=indices,
            kv_last_page_len=last_page_len,
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
        plan = _planned(self, args)
        _check_planned_q(
            plan,
            q,
            (plan.batch_size, plan.num_qo_heads, plan.head_dim),
            "(batch_size, num_qo_heads, head_dim)",
        )
        k_cache, v_cache = _paged_kv(plan, self._kv_layout, paged_kv_cache)
        kw = _run_kwargs(plan, window_left, q_scale, k_scale)
        out, lse = _run_outputs(q, out, lse, return_lse, q.dtype)
        return _run_planned(plan, q, k_cache, v_cache, out, lse, return_lse, v_scale, kw)
