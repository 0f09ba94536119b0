"""Prefill attention: many query tokens per request, causal or custom-masked.

The computation runs in C (``flashinfer._kernels.attention``); this module checks the
FlashInfer-shaped arguments, packs masks, allocates outputs and keeps the wrapper plans.
"""

import functools

import torch

from ._attention_common import (
    _as_dtype,
    _check_at_least,
    _check_planned_dtype,
    _check_planned_q,
    _check_same_lengths,
    _check_tensor,
    _expect_tensor,
    _finish_lse,
    _head_scales,
    _index_tensor,
    _is_float8,
    _kv_len,
    _kv_scales,
    _lengths,
    _new_plan,
    _out_dtype,
    _paged_kv,
    _paged_kv_lens,
    _planned,
    _refuse_run_extras,
    _refuse_unless,
    _run_kwargs,
    _run_outputs,
    _run_planned,
    _run_single,
    _scale_value,
    _single_kwargs,
    _split_hint,
    _with_page_table,
    _WrapperBase,
)
from .api_logging import flashinfer_api


def _packbits_little(bits):
    """Packs a bool tensor's elements (flattened) into uint8, little-endian bit order."""
    flat = bits.reshape(-1).to(torch.int32)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    shifts = torch.arange(8, dtype=torch.int32)
    return (flat.view(-1, 8) << shifts).sum(dim=1).to(torch.uint8)


def _packed_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens, single):
    """(packed uint8 bits, int32 byte offsets per request) or (None, None).

    A bool ``custom_mask`` holds each request's ``[qo_len, kv_len]`` block, flattened and
    concatenated (``[qo_len, kv_len]`` itself for single prefill); each request's block is
    packed little-endian from a byte boundary, as FlashInfer's ``segment_packbits`` does.
    """
    sizes = [q * k for q, k in zip(qo_lens, kv_lens)]
    nbytes = [(s + 7) // 8 for s in sizes]
    mask_indptr = torch.zeros(len(sizes) + 1, dtype=torch.int32)
    if sizes:
        mask_indptr[1:] = torch.tensor(nbytes, dtype=torch.int64).cumsum(0)
    if custom_mask is not None:
        _expect_tensor("custom_mask", custom_mask)
        if custom_mask.dtype != torch.bool:
            raise ValueError(
                f"custom_mask: {custom_mask.dtype} is not supported; accepted: a bool tensor"
            )
        if single:
            want = (qo_lens[0], kv_lens[0])
            flat = custom_mask.dim() == 1 and custom_mask.numel() == sizes[0]
            if tuple(custom_mask.shape) != want and not flat:
                raise ValueError(
                    f"custom_mask: shape {tuple(custom_mask.shape)} is not [qo_len, kv_len] "
                    f"= {list(want)} or its {sizes[0]} elements flattened"
                )
        elif custom_mask.dim() != 1 or custom_mask.numel() != sum(sizes):
            raise ValueError(
                f"custom_mask: shape {tuple(custom_mask.shape)}; accepted: 1-D with "
                f"sum(qo_len * kv_len) = {sum(sizes)} elements"
            )
        flat = custom_mask.detach().to("cpu").reshape(-1)
        parts, start = [], 0
        for size in sizes:
            parts.append(_packbits_little(flat[start : start + size]))
            start += size
        packed = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        return packed, mask_indptr
    if packed_custom_mask is not None:
        _expect_tensor("packed_custom_mask", packed_custom_mask)
        if packed_custom_mask.dtype != torch.uint8 or packed_custom_mask.dim() != 1:
            raise ValueError(
                f"packed_custom_mask: {packed_custom_mask.dtype} "
                f"{tuple(packed_custom_mask.shape)} is not supported; accepted: a 1-D uint8 "
                "tensor"
            )
        if packed_custom_mask.numel() < sum(nbytes):
            raise ValueError(
                f"packed_custom_mask: {packed_custom_mask.numel()} bytes; accepted: at least "
                f"{sum(nbytes)} (ceil(qo_len * kv_len / 8) per request)"
            )
        return packed_custom_mask.detach().to("cpu").contiguous(), mask_indptr
    return None, None


def _host_ints(name, t):
    """A 1-D integer tensor of any int dtype (FlashInfer passes uint16/uint32) as a list."""
    _expect_tensor(name, t)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported; accepted: an integer dtype")
    return t.detach().to("cpu").reshape(-1).to(torch.int64).tolist()


def _multi_item_mask(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, qo, kv):
    """FlashInfer's multi-item scoring mask (MaskMode.MULTIITEMSCORING) as one flat bool mask.

    Request b's query at position pos (``i + kv_len - qo_len``) sees key j <= pos when pos
    is in the shared prefix (``pos < prefix_len[b]``), or j is in the prefix, or j lies in
    pos's own item: ``pos < j + token_pos[pos - prefix_len[b]]``, token_pos being request
    b's ``token_pos_in_items_len`` entries (item positions, 0 at each delimiter).
    """
    if token_pos_in_items_ptr is None:
        raise ValueError("token_pos_in_items_ptr: required with prefix_len_ptr")
    prefix = _host_ints("prefix_len_ptr", prefix_len_ptr)
    tokens = _host_ints("token_pos_in_items_ptr", token_pos_in_items_ptr)
    width = int(token_pos_in_items_len)
    if len(prefix) != len(qo):
        raise ValueError(f"prefix_len_ptr: {len(prefix)} entries for {len(qo)} requests")
    if width == 0 and len(qo) > 1:
        raise ValueError(
            "token_pos_in_items_len: 0 with more than one request; accepted: the padded "
            "length of each request's token_pos_in_items_ptr entries"
        )
    masks = []
    for b, (qo_len, kv_len) in enumerate(zip(qo, kv)):
        own = tokens[b * width : (b + 1) * width] if width else tokens
        pos = torch.arange(qo_len) + kv_len - qo_len
        in_items = (pos - prefix[b]).clamp(min=0)
        if qo_len and int(in_items.max()) >= len(own) and int(pos.max()) >= prefix[b]:
            raise ValueError(
                f"token_pos_in_items_ptr: request {b} has {len(own)} item positions but its "
                f"queries reach position {int(in_items.max())} past its prefix"
            )
        step = torch.tensor(own + [0], dtype=torch.int64)[in_items.clamp(max=len(own))]
        j = torch.arange(kv_len)[None, :]
        seen = (pos < prefix[b])[:, None] | (j < prefix[b]) | (pos[:, None] < j + step[:, None])
        masks.append((seen & (j <= pos[:, None])).reshape(-1))
    return torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)


@flashinfer_api
def single_prefill_with_kv_cache(
    q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
    packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
    use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
    rope_scale=None, rope_theta=None, backend="auto", return_lse=False, kv_cache_sf=None,
    k_scale=None, v_scale=None,
):  # fmt: skip
    """Prefill attention of ``qo_len`` query tokens against one request's KV.

    Parameters
    ----------
    q : torch.Tensor
        ``[qo_len, num_qo_heads, head_dim]``, float16/bfloat16/float32.
    k, v : torch.Tensor
        ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
        (HND); q's dtype, float8 (e4m3fn, e5m2), or uint8 NVFP4 with ``head_dim // 2``
        bytes per row (with ``kv_cache_sf``).
    scale_q, scale_k, scale_v : float or torch.Tensor, optional
        Scales for quantized inputs (q and k multiply ``sm_scale``, v the output).
    o_dtype : torch.dtype, optional
        Output dtype, default q's.
    custom_mask : torch.Tensor, optional
        Bool ``[qo_len, kv_len]``, True where a key is visible; overrides ``causal``.
    packed_custom_mask : torch.Tensor, optional
        The same bits packed little-endian into uint8 (``packbits(mask.flatten())``).
    causal : bool
        Bottom-right aligned causal mask: query i sees keys ``j <= i + kv_len - qo_len``.
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    pos_encoding_mode : str
        ``"NONE"`` or ``"ROPE_LLAMA"``.
    use_fp16_qk_reduction : bool
        Accepted for compatibility (reductions are fp32).
    sm_scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    window_left : int
        Keep only keys at most this many positions before the query (-1: all).
    logits_soft_cap : float, optional
        ``c`` applies ``c * tanh(s / c)`` to the scaled logits.
    rope_scale, rope_theta : float, optional
        RoPE interpolation scale (default 1) and base (default 1e4).
    backend : str
        Accepted for compatibility.
    return_lse : bool
        Also return the base-2 log-sum-exp of the scaled logits, float32.
    kv_cache_sf : tuple of torch.Tensor, optional
        NVFP4 KV: ``(k_scales, v_scales)``, float8_e4m3fn ``[kv_len, num_kv_heads,
        head_dim // 16]`` (NHD), one scale per 16 elements of a row.
    k_scale, v_scale : float or torch.Tensor, optional
        Calibration scales of fp8/NVFP4 k (multiplies ``sm_scale``) and v (multiplies the
        output), on top of ``scale_k`` / ``scale_v``.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        ``[qo_len, num_qo_heads, head_dim]``, and ``[qo_len, num_qo_heads]`` lse when asked.
    """
    per_head = _is_float8(q)  # fa3 FP8: scale_q/k/v are per-head tensors, not folded here
    kw = _single_kwargs(locals(), 3, None if per_head else scale_q, None if per_head else scale_k)
    kw["sm_scale"] *= _scale_value("k_scale", k_scale)
    k_sf, v_sf = _kv_scales(kv_cache_sf, kw["kv_layout"], k)
    kv_len = _kv_len(k, kw["kv_layout"])
    mask, mask_indptr = _packed_mask(custom_mask, packed_custom_mask, [q.shape[0]], [kv_len], True)
    o_dtype = _out_dtype(None, q) if o_dtype is None else _as_dtype("o_dtype", o_dtype)
    head_dim_vo = v.shape[-1] * (2 if k_sf is not None else 1)  # NVFP4: two per byte
    out = torch.empty(q.shape[:-1] + (head_dim_vo,), dtype=o_dtype, device=q.device)
    head_scales = _head_scales(scale_q, scale_k, scale_v) if per_head else {}
    lse = _run_single(
        q,
        k,
        v,
        out,
        return_lse,
        mask=mask,
        mask_indptr=mask_indptr,
        causal=bool(causal) and mask is None,
        v_scale=_scale_value("v_scale", v_scale)
        * (1.0 if head_scales else _scale_value("scale_v", scale_v)),
        k_sf=k_sf,
        v_sf=v_sf,
        **head_scales,
        **kw,
    )
    return (out, lse) if return_lse else out


single_prefill_with_kv_cache_return_lse = functools.partial(
    single_prefill_with_kv_cache, return_lse=True
)
single_prefill_with_kv_cache_return_lse.__doc__ = (
    "single_prefill_with_kv_cache with ``return_lse=True``: returns (out, lse)."
)


def _with_mask(plan, custom_mask, packed_custom_mask, causal, kv_lens, items):
    """The plan with its packed mask, mask offsets and causal flag (off under a mask).

    items: plan()'s (prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len); a
    prefix_len_ptr makes the mask FlashInfer's multi-item scoring mask.
    """
    qo_lens = _lengths(plan.qo_indptr)
    if items[0] is not None:
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(
                "prefix_len_ptr: multi-item scoring sets the mask; give no custom_mask or "
                "packed_custom_mask with it"
            )
        custom_mask = _multi_item_mask(*items, qo_lens, kv_lens)
    plan.mask, plan.mask_indptr = _packed_mask(
        custom_mask, packed_custom_mask, qo_lens, kv_lens, False
    )
    plan.causal = bool(causal) and plan.mask is None
    return plan


def _check_hints(plan, kv_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv):
    """plan()'s length hints: they may only repeat or bound what the indptrs say."""
    qo_lens = _lengths(plan.qo_indptr)
    _check_same_lengths("seq_lens_q", seq_lens_q, qo_lens)
    _check_at_least(
        "max_token_per_sequence", max_token_per_sequence, max(qo_lens, default=0), "query length"
    )
    _check_at_least("max_sequence_kv", max_sequence_kv, max(kv_lens, default=0), "KV length")


def _prefill_run(plan, q, out, lse, return_lse, lse_layout):
    """(out, lse view the kernel writes, lse to return) of a planned prefill run."""
    _check_planned_q(
        plan,
        q,
        (plan.qo_rows, plan.num_qo_heads, plan.head_dim),
        "(qo_indptr[-1], num_qo_heads, head_dim_qk)",
    )
    return _run_outputs(
        q, out, lse, return_lse, _out_dtype(plan.o_dtype, q), lse_layout, plan.head_dim_vo
    )


def _refuse_owned_mask(variant_owns_mask):
    _refuse_unless(
        "variant_owns_mask", variant_owns_mask, (False,), "False (it needs a JIT attention variant)"
    )


class BatchPrefillWithPagedKVCacheWrapper(_WrapperBase):
    """Batched prefill attention over a paged KV cache: ``plan`` once, ``run`` per step.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Accepted for compatibility (the CPU kernels need no workspace).
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_cuda_graph : bool
        Accepted for compatibility.
    qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
    custom_mask_buf, mask_indptr_buf : torch.Tensor, optional
        Accepted for compatibility (CUDA-graph buffers).
    backend : str
        Accepted for compatibility.
    jit_args, jit_kwargs : optional
        JIT custom modules are not supported: only None.
    variant_owns_mask : bool
        Only False (a JIT variant's own mask).
    """

    @flashinfer_api
    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
        paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
        custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
        variant_owns_mask=False,
    ):  # fmt: skip
        super().__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs
        )
        _refuse_owned_mask(variant_owns_mask)

    @flashinfer_api
    def plan(
        self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
        num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
        packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
        rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
        o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
        token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None,
        block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
        fixed_split_size=None, disable_split_kv=False, uniform_q_len=None,
    ):  # fmt: skip
        """Records the batch layout, page table, mask and settings for ``run``.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            ``[batch_size + 1]`` offsets of each request's query rows.
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len : torch.Tensor
            The page table (offsets into indices, page ids, tokens in the last page).
        num_qo_heads, num_kv_heads, head_dim_qk, page_size : int
            Problem sizes; ``head_dim_vo`` must equal ``head_dim_qk`` when given.
        custom_mask, packed_custom_mask : torch.Tensor, optional
            Per-request ``[qo_len, kv_len]`` masks, flattened and concatenated (bool), or
            packed per request (``segment_packbits``, little-endian).
        causal : bool
            Bottom-right aligned causal mask (ignored with a custom mask).
        pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap,
        rope_scale, rope_theta
            As in :func:`single_prefill_with_kv_cache`.
        q_data_type, kv_data_type, o_data_type : torch.dtype or str
            Expected dtypes of q and the cache (``"uint8"``: NVFP4), and the output dtype.
        non_blocking : bool
            Accepted for compatibility.
        prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr
            Multi-item scoring: each request's shared prefix length, its items' token
            positions (0 at delimiters, ``token_pos_in_items_len`` per request) and max item
            length (a hint); the mask lets a token see the prefix and its own item, causally.
        seq_lens, block_tables : torch.Tensor, optional
            KV lengths and ``[batch_size, max_pages]`` page ids; when given they decide the
            pages and lengths (FlashInfer's trtllm-gen inputs).
        seq_lens_q : torch.Tensor, optional
            Query lengths: only the ones qo_indptr gives.
        max_token_per_sequence, max_sequence_kv : int, optional
            Bounds on the longest query / KV length (checked).
        fixed_split_size, disable_split_kv
            Split-KV hints of the CUDA kernel (pages per split; no split).
        uniform_q_len : int, optional
            Accepted (a CUDA-graph tiling hint of FlashInfer's fa2 backend).
        """
        qo_indptr = _index_tensor("qo_indptr", qo_indptr)
        plan = _new_plan(self._kv_layout, locals(), qo_indptr, head_dim_qk, head_dim_vo)
        kv_indptr = _index_tensor("paged_kv_indptr", paged_kv_indptr)
        kv_indices = _index_tensor("paged_kv_indices", paged_kv_indices)
        last_page_len = _index_tensor("paged_kv_last_page_len", paged_kv_last_page_len)
        batch_size = qo_indptr.numel() - 1
        if kv_indptr.numel() != qo_indptr.numel() or last_page_len.numel() != batch_size:
            raise ValueError(
                f"paged_kv_indptr/paged_kv_last_page_len: {kv_indptr.numel()} and "
                f"{last_page_len.numel()} entries for {batch_size} requests (qo_indptr); "
                "accepted: batch_size + 1 and batch_size"
            )
        page_table = (kv_indptr, kv_indices, last_page_len)
        lookup, split = (block_tables, seq_lens), (fixed_split_size, disable_split_kv)
        plan = _with_page_table(plan, page_table, page_size, lookup, split)
        kv_lens = _paged_kv_lens(plan.kv_indptr, plan.kv_last_page_len, page_size)
        _check_hints(plan, kv_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv)
        items = (prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len)
        self._plan = _with_mask(plan, custom_mask, packed_custom_mask, causal, kv_lens, items)

    @flashinfer_api
    def run(
        self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
        lse=None, return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None,
        window_left=None, sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
        use_fp16_softmax=None, uses_spcompress=None,
    ):  # fmt: skip
        """Prefill attention for the planned batch.

        Parameters
        ----------
        q : torch.Tensor
            ``[qo_indptr[-1], num_qo_heads, head_dim_qk]``.
        paged_kv_cache : torch.Tensor or tuple of torch.Tensor
            ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD; HND swaps
            page_size and num_kv_heads) or a ``(k_cache, v_cache)`` tuple; uint8 with
            ``head_dim // 2`` for NVFP4 (with ``kv_cache_sf``).
        q_scale, k_scale, v_scale : float or torch.Tensor, optional
            Scales for quantized inputs.
        out, lse : torch.Tensor, optional
            Preallocated outputs (lse in the requested layout).
        return_lse : bool
            Also return lse.
        lse_base : str
            ``"log2"`` (default) or ``"ln"`` (natural log).
        lse_layout : str
            ``"NH"`` (``[qo_indptr[-1], num_qo_heads]``) or ``"HN"`` (its contiguous
            transpose).
        enable_pdl : bool, optional
            Accepted for compatibility.
        window_left : int, optional
            Overrides the planned ``window_left``.
        sinks : torch.Tensor, optional
            float32 ``[num_qo_heads]`` attention-sink logits.
        kv_cache_sf : torch.Tensor or tuple of torch.Tensor, optional
            NVFP4 KV scales, as ``BatchDecodeWithPagedKVCacheWrapper.run`` takes them.
        skip_softmax_threshold_scale_factor, use_fp16_softmax, uses_spcompress
            trtllm-gen options: only None (or False) is implemented.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            The output, and lse when asked.
        """
        plan, head_scales = _planned(self, args, q)
        _refuse_run_extras(skip_softmax_threshold_scale_factor, use_fp16_softmax, uses_spcompress)
        out, lse_view, lse = _prefill_run(plan, q, out, lse, return_lse, lse_layout)
        k_cache, v_cache = _paged_kv(plan, self._kv_layout, paged_kv_cache)
        k_sf, v_sf = _kv_scales(kv_cache_sf, self._kv_layout, k_cache)
        kw = _run_kwargs(plan, window_left, q_scale, k_scale)
        _run_planned(
            plan,
            q,
            k_cache,
            v_cache,
            out,
            lse_view,
            _scale_value("v_scale", v_scale),
            kw,
            sinks=sinks,
            k_sf=k_sf,
            v_sf=v_sf,
            **head_scales,
        )
        return (out, _finish_lse(lse, lse_base)) if return_lse else out

    def _forward_call(
        self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
        logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False,
    ):  # fmt: skip
        """FlashInfer's deprecated forward / forward_return_lse: run() with these settings
        replacing the plan's (return_lse: also return lse)."""
        return self._forward(locals(), ("q", "paged_kv_cache"))

    forward = functools.partialmethod(_forward_call, return_lse=False)
    forward_return_lse = functools.partialmethod(_forward_call, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_WrapperBase):
    """Batched prefill attention over ragged (concatenated) K and V: ``plan``, then ``run``.

    The parameters are those of :class:`BatchPrefillWithPagedKVCacheWrapper`, with the
    CUDA-graph buffers ``qo_indptr_buf``, ``kv_indptr_buf``, ``custom_mask_buf`` and
    ``mask_indptr_buf`` (accepted for compatibility).
    """

    @flashinfer_api
    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
        kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto",
        jit_args=None, jit_kwargs=None, variant_owns_mask=False,
    ):  # fmt: skip
        super().__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs
        )
        _refuse_owned_mask(variant_owns_mask)

    @flashinfer_api
    def plan(
        self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
        custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
        rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
        o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
        token_pos_in_items_len=0, max_item_len_ptr=None, fixed_split_size=None,
        disable_split_kv=False, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None,
        max_sequence_kv=None, v_indptr=None, o_indptr=None, uniform_q_len=None,
    ):  # fmt: skip
        """Records the batch layout, mask and settings for ``run``; the parameters not
        named here are those of ``BatchPrefillWithPagedKVCacheWrapper.plan``.

        Parameters
        ----------
        qo_indptr, kv_indptr : torch.Tensor
            ``[batch_size + 1]`` offsets of each request's query rows and KV tokens.
        q_data_type, kv_data_type, o_data_type : torch.dtype or str
            Expected dtypes of q and k/v (``"uint8"``: NVFP4), and the output dtype.
        fixed_split_size, disable_split_kv
            Split-KV hints of the CUDA kernel (tokens per split; no split).
        seq_lens : torch.Tensor, optional
            KV lengths: only the ones kv_indptr gives.
        v_indptr, o_indptr : torch.Tensor, optional
            ``[batch_size + 1]`` first rows of each request in v and in the output
            (default ``kv_indptr`` and ``qo_indptr``).
        """
        qo_indptr = _index_tensor("qo_indptr", qo_indptr)
        plan = _new_plan(self._kv_layout, locals(), qo_indptr, head_dim_qk, head_dim_vo)
        kv_indptr = _index_tensor("kv_indptr", kv_indptr)
        if kv_indptr.numel() != qo_indptr.numel():
            raise ValueError(
                f"kv_indptr: {kv_indptr.numel()} entries but qo_indptr has "
                f"{qo_indptr.numel()}; accepted: the same batch_size + 1"
            )
        plan.kv_indptr = kv_indptr
        plan.v_indptr = None if v_indptr is None else _index_tensor("v_indptr", v_indptr)
        plan.o_indptr = None if o_indptr is None else _index_tensor("o_indptr", o_indptr)
        plan.kv_chunk = _split_hint(fixed_split_size, disable_split_kv, 1)
        kv_lens = _lengths(kv_indptr)
        _check_same_lengths("seq_lens", seq_lens, kv_lens)
        _check_hints(plan, kv_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv)
        items = (prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len)
        self._plan = _with_mask(plan, custom_mask, packed_custom_mask, causal, kv_lens, items)

    @flashinfer_api
    def run(
        self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None,
        lse=None, return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None,
        kv_cache_sf=None,
    ):  # fmt: skip
        """Prefill attention for the planned batch; the parameters not named here are
        those of ``BatchPrefillWithPagedKVCacheWrapper.run``, and so is what it returns.

        Parameters
        ----------
        k, v : torch.Tensor
            ``[kv_indptr[-1], num_kv_heads, head_dim_qk]`` (NHD) or heads first (HND);
            uint8 with ``head_dim // 2`` for NVFP4 (with ``kv_cache_sf``); v's rows follow
            the planned ``v_indptr`` when given.
        o_scale : float or torch.Tensor, optional
            The output's calibration scale: the output is divided by it.
        kv_cache_sf : torch.Tensor or tuple of torch.Tensor, optional
            NVFP4 scales ``(k_scales, v_scales)``, float8_e4m3fn ``[rows, num_kv_heads,
            head_dim // 16]`` each, or one ``[rows, 2, num_kv_heads, head_dim // 16]`` tensor.
        """
        plan, head_scales = _planned(self, args, q)
        out, lse_view, lse = _prefill_run(plan, q, out, lse, return_lse, lse_layout)
        _check_tensor("k", k, 3)
        _check_tensor("v", v, 3)
        _check_planned_dtype("k", k, plan.kv_dtype, "kv_data_type")
        heads = k.shape[1] if self._kv_layout == "NHD" else k.shape[0]
        if heads != plan.num_kv_heads:
            raise ValueError(
                f"k: {heads} kv heads in layout {self._kv_layout}; planned num_kv_heads "
                f"{plan.num_kv_heads}"
            )
        k_sf, v_sf = _kv_scales(kv_cache_sf, self._kv_layout, k)
        kw = _run_kwargs(plan, None, q_scale, k_scale)
        o = _scale_value("o_scale", o_scale)
        if o == 0.0:
            raise ValueError("o_scale: 0 is not accepted; accepted: a nonzero scale")
        v_scale = _scale_value("v_scale", v_scale) / o
        _run_planned(plan, q, k, v, out, lse_view, v_scale, kw, k_sf=k_sf, v_sf=v_sf, **head_scales)
        return (out, _finish_lse(lse, lse_base)) if return_lse else out

    def _forward_call(
        self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
        window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
        return_lse=False,
    ):  # fmt: skip
        """FlashInfer's deprecated forward / forward_return_lse: run() with these settings
        replacing the plan's (return_lse: also return lse)."""
        return self._forward(locals(), ("q", "k", "v"))

    forward = functools.partialmethod(_forward_call, return_lse=False)
    forward_return_lse = functools.partialmethod(_forward_call, return_lse=True)
