"""Decode attention: one query token per request against a KV cache.

The computation runs in C (``flashinfer._kernels.attention``); this module checks the
FlashInfer-shaped arguments, allocates outputs and keeps the wrapper plans.
"""

import functools
import warnings

import torch

from ._attention_common import (
    _check_planned_q,
    _deprecated_positional,
    _index_tensor,
    _kv_scales,
    _new_plan,
    _not_implemented,
    _out_dtype,
    _paged_kv,
    _planned,
    _refuse_run_extras,
    _refuse_unless,
    _run_kwargs,
    _run_outputs,
    _run_planned,
    _run_single,
    _scale_value,
    _single_kwargs,
    _with_page_table,
    _WrapperBase,
)
from .api_logging import flashinfer_api


@flashinfer_api
def single_decode_with_kv_cache(
    q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False, q_scale=None,
    k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None,
    rope_scale=None, rope_theta=None, return_lse=False,
):  # fmt: skip
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
    kw = _single_kwargs(locals(), 2, q_scale, k_scale)
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


# plan()'s optional arguments in FlashInfer's order, for its deprecated positional form
_PLAN_POSITIONAL = (
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "q_data_type",
    "kv_data_type",
    "o_data_type",
    "data_type",
    "sm_scale",
    "rope_scale",
    "rope_theta",
    "non_blocking",
    "block_tables",
    "seq_lens",
    "fixed_split_size",
    "disable_split_kv",
    "q_len_per_req",
)


class BatchDecodeWithPagedKVCacheWrapper(_WrapperBase):
    """Batched decode attention over a paged KV cache: ``plan`` once, ``run`` per step.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Accepted for compatibility (the CPU kernels need no workspace).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_cuda_graph, use_tensor_cores : bool
        Accepted for compatibility (several queries per request need no tensor cores here).
    paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer
        Accepted for compatibility (CUDA-graph buffers).
    backend : str
        Accepted for compatibility.
    jit_args : list, optional
        JIT custom modules are not supported: only None.
    """

    @flashinfer_api
    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
        use_tensor_cores=False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None, backend="auto", jit_args=None,
    ):  # fmt: skip
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, None)
        self._use_tensor_cores = use_tensor_cores

    @property
    def use_tensor_cores(self):
        """The ``use_tensor_cores`` given to ``__init__`` (no effect on the kernels here)."""
        return self._use_tensor_cores

    @flashinfer_api
    def plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        *deprecated_positional_args, **kwargs,
    ):  # fmt: skip
        """Records the batch's page table and attention settings for later ``run`` calls.

        The optional arguments are keyword arguments (FlashInfer still takes them
        positionally after ``page_size``, in the order below, with a DeprecationWarning).

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
        window_right : int
            Only 0 (FlashInfer's default; other values are cute-dsl only).
        q_data_type, kv_data_type, data_type : torch.dtype or str
            Expected dtypes of q and the KV cache (``data_type`` is the older name;
            ``"uint8"`` KV is NVFP4 with ``kv_cache_sf`` at run time).
        o_data_type : torch.dtype or str, optional
            Output dtype, default q's.
        non_blocking : bool
            Accepted for compatibility.
        block_tables, seq_lens : torch.Tensor, optional
            ``[batch_size, max_pages]`` page ids and ``[batch_size]`` KV lengths; when
            given they decide the pages and lengths, as in FlashInfer's trtllm-gen backend.
        fixed_split_size : int, optional
            Pages per KV split of the CUDA kernel (deterministic splitting); -1/None: the
            kernel chooses. The CPU kernel ignores it.
        disable_split_kv : bool
            No KV split (CUDA).
        q_len_per_req : int
            Query tokens per request (default 1); above 1 they attend causally within the
            request, q then has ``batch_size * q_len_per_req`` rows.
        is_causal : bool, optional
            Only the value q_len_per_req implies (None: derived).
        """
        kw = _deprecated_positional(
            "BatchDecodeWithPagedKVCacheWrapper",
            deprecated_positional_args,
            _PLAN_POSITIONAL,
            kwargs,
        )
        self._plan_impl(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw
        )

    def _plan_impl(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
        pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
        q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None,
        rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None,
        fixed_split_size=None, disable_split_kv=False, q_len_per_req=1, is_causal=None,
    ):  # fmt: skip
        indptr = _index_tensor("indptr", indptr)
        indices = _index_tensor("indices", indices)
        last_page_len = _index_tensor("last_page_len", last_page_len)
        batch_size = indptr.numel() - 1
        if batch_size < 0 or last_page_len.numel() != batch_size:
            raise ValueError(
                f"last_page_len: {last_page_len.numel()} entries but indptr has "
                f"{indptr.numel()}; accepted: len(indptr) - 1 entries"
            )
        _refuse_unless("window_right", window_right, (0,), "0")
        if not isinstance(q_len_per_req, int) or q_len_per_req < 1:
            raise ValueError(f"q_len_per_req: {q_len_per_req!r}; accepted: an int >= 1")
        if is_causal is not None and bool(is_causal) != (q_len_per_req > 1):
            _not_implemented("is_causal", is_causal, "None or q_len_per_req > 1")
        qo_indptr = torch.arange(batch_size + 1, dtype=torch.int32) * q_len_per_req
        plan = _new_plan(self._kv_layout, locals(), qo_indptr, head_dim)
        plan.causal = q_len_per_req > 1
        page_table = (indptr, indices, last_page_len)
        lookup, split = (block_tables, seq_lens), (fixed_split_size, disable_split_kv)
        self._plan = _with_page_table(plan, page_table, page_size, lookup, split)

    @flashinfer_api
    def run(
        self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
        lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None,
        q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
    ):  # fmt: skip
        """Decode attention for the planned batch.

        Parameters
        ----------
        q : torch.Tensor
            ``[batch_size * q_len_per_req, num_qo_heads, head_dim]``.
        paged_kv_cache : torch.Tensor or tuple of torch.Tensor
            ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD; HND swaps
            page_size and num_kv_heads) or a ``(k_cache, v_cache)`` tuple; uint8 with
            ``head_dim // 2`` for NVFP4 (with ``kv_cache_sf``).
        q_scale, k_scale, v_scale : float or torch.Tensor, optional
            Scales for quantized inputs: q and k scales multiply ``sm_scale``, v's the output.
        out, lse : torch.Tensor, optional
            Preallocated outputs (``[rows, num_qo_heads]`` float32 for lse).
        return_lse : bool
            Also return lse.
        enable_pdl : bool, optional
            Accepted for compatibility.
        window_left : int, optional
            Overrides the planned ``window_left``.
        sinks : torch.Tensor, optional
            float32 ``[num_qo_heads]`` attention-sink logits: each joins its head's softmax
            denominator (in the units of the scaled logits) and adds no value.
        q_len_per_req : int, optional
            Deprecated (give it to ``plan``): checked against q and the plan, with a
            DeprecationWarning.
        skip_softmax_threshold_scale_factor : float, optional
            Only None (skip-softmax sparsity is not implemented).
        kv_cache_sf : torch.Tensor or tuple of torch.Tensor, optional
            NVFP4 KV scales, float8_e4m3fn ``[num_pages, page_size, num_kv_heads,
            head_dim // 16]`` (NHD) each for k and v, as a pair or one ``[num_pages, 2,
            ...]`` tensor.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            ``out`` ``[rows, num_qo_heads, head_dim]`` (dtype o_data_type), and lse when asked.
        """
        plan, head_scales = _planned(self, args, q)
        if q_len_per_req is not None:
            _check_run_q_len(plan, q, q_len_per_req)
        _refuse_run_extras(skip_softmax_threshold_scale_factor)
        _check_planned_q(
            plan,
            q,
            (plan.qo_rows, plan.num_qo_heads, plan.head_dim),
            "(batch_size * q_len_per_req, num_qo_heads, head_dim)",
        )
        k_cache, v_cache = _paged_kv(plan, self._kv_layout, paged_kv_cache)
        k_sf, v_sf = _kv_scales(kv_cache_sf, self._kv_layout, k_cache)
        kw = _run_kwargs(plan, window_left, q_scale, k_scale)
        out, lse, lse_out = _run_outputs(q, out, lse, return_lse, _out_dtype(plan.o_dtype, q))
        _run_planned(
            plan,
            q,
            k_cache,
            v_cache,
            out,
            lse,
            _scale_value("v_scale", v_scale),
            kw,
            sinks=sinks,
            k_sf=k_sf,
            v_sf=v_sf,
            **head_scales,
        )
        return (out, lse_out) if return_lse else out

    def _forward_call(
        self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
        v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
        rope_theta=None, return_lse=False,
    ):  # fmt: skip
        """FlashInfer's deprecated forward / forward_return_lse: run() with these settings
        replacing the plan's (return_lse: also return lse)."""
        return self._forward(locals(), ("q", "paged_kv_cache"))

    forward = functools.partialmethod(_forward_call, return_lse=False)
    forward_return_lse = functools.partialmethod(_forward_call, return_lse=True)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """The decode wrapper with FlashInfer's CUDA-graph buffers fixed at construction.

    Parameters
    ----------
    workspace_buffer : torch.Tensor
        Accepted for compatibility.
    indptr_buffer, indices_buffer, last_page_len_buffer : torch.Tensor
        The page-table buffers FlashInfer fills in place for graph replay; accepted for
        compatibility (plans keep their own copies here).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_tensor_cores : bool
        Accepted for compatibility.
    """

    def __init__(
        self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer,
        kv_layout="NHD", use_tensor_cores=False,
    ):  # fmt: skip
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


def fast_decode_plan(
    self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
    pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None,
    kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
    non_blocking=True, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1,
    global_override_indptr_cpu=None,
):  # fmt: skip
    """FlashInfer's faster ``plan`` for a decode wrapper (SGLang binds it as a method):
    here the same as ``self.plan``. ``global_override_indptr_cpu``, when given, is the
    CPU copy of ``indptr`` and replaces it."""
    kw = dict(locals())
    del kw["self"], kw["global_override_indptr_cpu"]
    if global_override_indptr_cpu is not None:
        kw["indptr"] = global_override_indptr_cpu
    self._plan_impl(**kw)


def _check_run_q_len(plan, q, q_len_per_req):
    """FlashInfer's deprecated run(q_len_per_req=): a warning, and checks against q and plan."""
    warnings.warn(
        "Passing `q_len_per_req` to BatchDecodeWithPagedKVCacheWrapper.run() is deprecated; "
        "pass it to plan() instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    want = plan.batch_size * q_len_per_req
    if isinstance(q, torch.Tensor) and q.dim() >= 1 and q.shape[0] != want:
        raise ValueError(
            f"q.shape[0] ({q.shape[0]}) does not match batch_size * q_len_per_req "
            f"({plan.batch_size} * {q_len_per_req} = {want})"
        )
    if want != plan.qo_rows:
        raise ValueError(
            f"q_len_per_req: {q_len_per_req} but plan() used "
            f"{plan.qo_rows // max(plan.batch_size, 1)}; re-plan with the matching q_len_per_req"
        )
