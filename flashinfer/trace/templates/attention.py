"""Trace templates of the attention APIs: single-request decode/prefill and the
paged/ragged batch wrappers (their ``run``, and batch decode's ``plan``).

Definition names, axes, inputs and outputs follow FlashInfer's templates of the same
names, so the definitions our APIs produce are interchangeable with FlashInfer's. The
references are plain torch, grouped-query attention with the base-2 log-sum-exp that
the kernels return.
"""

import math

import torch

from ..template import Const, Scalar, Tensor, TraceTemplate, Var
from ._init_helpers import default_device, page_table, split_evenly


def _attention_check(
    reference_outputs,
    actual_outputs,
    *,
    rtol=None,
    atol=None,
    max_mismatch_pct=0.0,
    min_cos_sim=None,
):
    """Single-request attention passes within 1e-3 (relative and absolute), elementwise."""
    from flashinfer.trace import default_check

    return default_check(
        reference_outputs,
        actual_outputs,
        rtol=1e-3 if rtol is None else rtol,
        atol=1e-3 if atol is None else atol,
        max_mismatch_pct=max_mismatch_pct,
        min_cos_sim=min_cos_sim,
    )


# ------------------------------------------------------------------------ references


@torch.no_grad()
def _softmax_attention(q, k, v, sm_scale, causal):
    """Grouped-query attention of one request.

    q is [Sq, Hq, D], k and v are [Skv, Hkv, D] with Hq a multiple of Hkv. With
    ``causal`` query i sees keys j <= i + Skv - Sq. Returns the float32 output
    [Sq, Hq, D] and the base-2 log-sum-exp of the scaled logits [Sq, Hq]."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), keys) * float(sm_scale)
    if causal:
        rows = torch.arange(q.shape[0], device=q.device)[:, None]
        cols = torch.arange(k.shape[0], device=q.device)[None, :]
        logits = logits.masked_fill(cols > rows + (k.shape[0] - q.shape[0]), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", weights, values), lse.transpose(0, 1)


def _plain_attention_only(pos_encoding_mode="NONE", logits_soft_cap=None, window_left=-1):
    """The references compute plain softmax attention: other variants raise."""
    mode = getattr(pos_encoding_mode, "name", pos_encoding_mode)
    windowed = window_left is not None and window_left >= 0
    if mode not in ("NONE", 0, None) or logits_soft_cap or windowed:
        raise NotImplementedError(
            f"pos_encoding_mode={mode!r}, logits_soft_cap={logits_soft_cap!r}, "
            f"window_left={window_left!r}: the reference computes plain attention only"
        )


@torch.no_grad()
def _gather_pages(cache, kv_indptr, kv_indices, b, kv_last_page_len=None):
    """Request b's tokens from a [num_pages, page_size, H, D] cache, pages in order; its
    last page holds kv_last_page_len[b] tokens (every page full without it)."""
    pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
    tokens = cache[pages].reshape(-1, cache.shape[2], cache.shape[3])
    if kv_last_page_len is None or pages.numel() == 0:
        return tokens
    return tokens[: (pages.numel() - 1) * cache.shape[1] + int(kv_last_page_len[b])]


@torch.no_grad()
def _single_decode_reference(
    q,
    k,
    v,
    sm_scale=None,
    pos_encoding_mode="NONE",
    logits_soft_cap=None,
    window_left=-1,
    **_unused,
):
    """Decode of one request: q [Hq, D] against k, v [kv_len, Hkv, D] (NHD)."""
    _plain_attention_only(pos_encoding_mode, logits_soft_cap, window_left)
    out, _ = _softmax_attention(q.unsqueeze(0), k, v, sm_scale, causal=False)
    return out[0].to(q.dtype)


@torch.no_grad()
def _single_prefill_reference(
    q,
    k,
    v,
    sm_scale=None,
    causal=False,
    pos_encoding_mode="NONE",
    logits_soft_cap=None,
    window_left=-1,
    **_unused,
):
    """Prefill of one request: q [qo_len, Hq, D] against k, v [kv_len, Hkv, D] (NHD)."""
    _plain_attention_only(pos_encoding_mode, logits_soft_cap, window_left)
    out, _ = _softmax_attention(q, k, v, sm_scale, causal=bool(causal))
    return out.to(q.dtype)


@torch.no_grad()
def _gqa_paged_decode_reference(
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    sm_scale=None,
    kv_last_page_len=None,
    pos_encoding_mode="NONE",
    logits_soft_cap=None,
    window_left=-1,
    **_unused,
):
    """Batched paged decode: row b of q attends to the pages kv_indices[kv_indptr[b]:
    kv_indptr[b+1]], the last one holding kv_last_page_len[b] tokens. Returns
    (output, lse)."""
    _plain_attention_only(pos_encoding_mode, logits_soft_cap, window_left)
    outs, lses = [], []
    for b in range(q.shape[0]):
        k = _gather_pages(k_cache, kv_indptr, kv_indices, b, kv_last_page_len)
        v = _gather_pages(v_cache, kv_indptr, kv_indices, b, kv_last_page_len)
        out, lse = _softmax_attention(q[b : b + 1], k, v, sm_scale, causal=False)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses)


@torch.no_grad()
def _gqa_paged_prefill_reference(
    q,
    k_cache,
    v_cache,
    qo_indptr,
    kv_indptr,
    kv_indices,
    sm_scale=None,
    kv_last_page_len=None,
    causal=True,
    pos_encoding_mode="NONE",
    logits_soft_cap=None,
    window_left=-1,
    **_unused,
):
    """Batched prefill (causal unless causal=False) over a paged cache; request b owns q
    rows qo_indptr[b]:qo_indptr[b+1]. Returns (output, lse)."""
    _plain_attention_only(pos_encoding_mode, logits_soft_cap, window_left)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        k = _gather_pages(k_cache, kv_indptr, kv_indices, b, kv_last_page_len)
        v = _gather_pages(v_cache, kv_indptr, kv_indices, b, kv_last_page_len)
        out[rows], lse[rows] = _softmax_attention(q[rows], k, v, sm_scale, bool(causal))
    return out.to(q.dtype), lse


@torch.no_grad()
def _gqa_ragged_prefill_reference(
    q,
    k,
    v,
    qo_indptr,
    kv_indptr,
    sm_scale=None,
    causal=True,
    pos_encoding_mode="NONE",
    logits_soft_cap=None,
    window_left=-1,
    **_unused,
):
    """Batched prefill (causal unless causal=False) over contiguous K/V; request b owns
    q rows qo_indptr[b]:qo_indptr[b+1] and K/V rows kv_indptr[b]:kv_indptr[b+1]."""
    _plain_attention_only(pos_encoding_mode, logits_soft_cap, window_left)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        kv = slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        out[rows], lse[rows] = _softmax_attention(q[rows], k[kv], v[kv], sm_scale, bool(causal))
    return out.to(q.dtype), lse


for _ref in (_single_decode_reference, _single_prefill_reference, _gqa_ragged_prefill_reference):
    _ref._trace_reference_dependencies = (_softmax_attention, _plain_attention_only)
for _ref in (_gqa_paged_decode_reference, _gqa_paged_prefill_reference):
    _ref._trace_reference_dependencies = (_softmax_attention, _plain_attention_only, _gather_pages)


# ----------------------------------------------------------------------------- inits


def _single_decode_init(
    *, kv_len, num_qo_heads=32, num_kv_heads=8, head_dim=128, device=None, seed=0
):
    """Arguments of ``single_decode_with_kv_cache``: random bf16 q, k, v."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(num_qo_heads, head_dim, generator=gen, device=device).bfloat16()
    k = torch.randn(kv_len, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    v = torch.randn(kv_len, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    return {"q": q, "k": k, "v": v}


def _single_prefill_init(
    *, qo_len, kv_len=256, num_qo_heads=32, num_kv_heads=8, head_dim=128, device=None, seed=0
):
    """Arguments of ``single_prefill_with_kv_cache``: random bf16 q, k, v, causal."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(qo_len, num_qo_heads, head_dim, generator=gen, device=device).bfloat16()
    k = torch.randn(kv_len, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    v = torch.randn(kv_len, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    return {"q": q, "k": k, "v": v, "causal": True}


def _random_paged_batch(q_rows, batch_size, pages_per_request, heads, page_size, device, seed):
    """(page table, q, (k_cache, v_cache)): ``pages_per_request`` full pages per request,
    bfloat16 q ``[q_rows, ...]`` and cache; heads is (num_qo_heads, num_kv_heads,
    head_dim)."""
    num_qo_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator(device=device).manual_seed(seed)
    table = page_table(batch_size, pages_per_request, page_size, device)
    shape = (batch_size * pages_per_request, page_size, num_kv_heads, head_dim)
    k = torch.randn(*shape, generator=gen, device=device).bfloat16()
    v = torch.randn(*shape, generator=gen, device=device).bfloat16()
    q = torch.randn(q_rows, num_qo_heads, head_dim, generator=gen, device=device).bfloat16()
    return table, q, (k, v)


def _gqa_paged_decode_init(
    *,
    batch_size,
    num_pages=None,
    len_indptr=None,
    num_kv_indices=None,
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    page_size=16,
    pages_per_request=4,
    device=None,
    seed=0,
):
    """``{"plan": ..., "run": ...}`` arguments of BatchDecodeWithPagedKVCacheWrapper:
    ``pages_per_request`` full pages per request (num_pages, len_indptr and
    num_kv_indices follow from it and are ignored)."""
    device = default_device(device)
    heads = (num_qo_heads, num_kv_heads, head_dim)
    (indptr, indices, last), q, cache = _random_paged_batch(
        batch_size, batch_size, pages_per_request, heads, page_size, device, seed
    )
    plan = {
        "indptr": indptr,
        "indices": indices,
        "last_page_len": last,
        "num_qo_heads": num_qo_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "page_size": page_size,
        "q_data_type": torch.bfloat16,
        "kv_data_type": torch.bfloat16,
    }
    return {"plan": plan, "run": {"q": q, "paged_kv_cache": cache}}


def _gqa_paged_prefill_init(
    *,
    total_q,
    num_pages=None,
    len_indptr=None,
    num_kv_indices=None,
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    page_size=16,
    batch_size=4,
    pages_per_request=8,
    device=None,
    seed=0,
):
    """``{"plan": ..., "run": ...}`` arguments of BatchPrefillWithPagedKVCacheWrapper:
    ``total_q`` query rows split evenly over ``batch_size`` causal requests."""
    device = default_device(device)
    heads = (num_qo_heads, num_kv_heads, head_dim)
    (indptr, indices, last), q, cache = _random_paged_batch(
        total_q, batch_size, pages_per_request, heads, page_size, device, seed
    )
    plan = {
        "qo_indptr": split_evenly(total_q, batch_size, device),
        "paged_kv_indptr": indptr,
        "paged_kv_indices": indices,
        "paged_kv_last_page_len": last,
        "num_qo_heads": num_qo_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim_qk": head_dim,
        "page_size": page_size,
        "head_dim_vo": head_dim,
        "causal": True,
        "q_data_type": torch.bfloat16,
        "kv_data_type": torch.bfloat16,
    }
    return {"plan": plan, "run": {"q": q, "paged_kv_cache": cache}}


def _gqa_ragged_init(
    *,
    total_q,
    total_kv=512,
    len_indptr=None,
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    batch_size=4,
    device=None,
    seed=0,
):
    """``{"plan": ..., "run": ...}`` arguments of BatchPrefillWithRaggedKVCacheWrapper:
    ``total_q`` query and ``total_kv`` key rows split evenly over ``batch_size``
    causal requests."""
    device = default_device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(total_q, num_qo_heads, head_dim, generator=gen, device=device).bfloat16()
    k = torch.randn(total_kv, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    v = torch.randn(total_kv, num_kv_heads, head_dim, generator=gen, device=device).bfloat16()
    plan = {
        "qo_indptr": split_evenly(total_q, batch_size, device),
        "kv_indptr": split_evenly(total_kv, batch_size, device),
        "num_qo_heads": num_qo_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim_qk": head_dim,
        "head_dim_vo": head_dim,
        "causal": True,
        "q_data_type": torch.bfloat16,
        "kv_data_type": torch.bfloat16,
    }
    return {"plan": plan, "run": {"q": q, "k": k, "v": v}}


_gqa_paged_decode_init._trace_init_dependencies = (_random_paged_batch,)
_gqa_paged_prefill_init._trace_init_dependencies = (_random_paged_batch,)


# ------------------------------------------------------------------------- templates

_HEAD_AXES = {
    "num_qo_heads": Const(abbrev="h"),
    "num_kv_heads": Const(abbrev="kv"),
    "head_dim": Const(abbrev="d"),
}


def _paged_cache_inputs():
    shape = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    return {
        "k_cache": Tensor(shape, param="paged_kv_cache", tuple_idx=0),
        "v_cache": Tensor(shape, param="paged_kv_cache", tuple_idx=1),
    }


def _planned(dims, what):
    return Tensor(dims, optional=True, description=f"{what}; given to plan(), not run().")


def _run_scalars():
    return {
        "sm_scale": Scalar(
            "float32",
            optional=True,
            description="Logit scale, 1/sqrt(head_dim) unless set; given to plan(), not run().",
        ),
        "return_lse": Scalar("int32", optional=True, description="Bool: return the LSE too."),
    }


def _batch_outputs(rows, description=""):
    """A batch run()'s output ``[rows, heads, head_dim]`` in q's dtype and its optional
    base-2 lse ``[rows, heads]``."""
    lse = Tensor(
        [rows, "num_qo_heads"],
        optional=True,
        dtype="float32",
        description="Base-2 log-sum-exp of the scaled attention logits.",
    )
    output = Tensor([rows, "num_qo_heads", "head_dim"], dtype_from="q", description=description)
    return {"output": output, "lse": lse}


def _qkv_inputs(q_rows, kv_rows):
    """q ``[q_rows, heads, head_dim]`` and k, v ``[kv_rows, kv heads, head_dim]`` (NHD)."""
    return {
        "q": Tensor([q_rows, "num_qo_heads", "head_dim"]),
        "k": Tensor([kv_rows, "num_kv_heads", "head_dim"]),
        "v": Tensor([kv_rows, "num_kv_heads", "head_dim"]),
    }


single_decode_with_kv_cache_trace = TraceTemplate(
    op_type="single_decode",
    name_prefix="single_decode",
    description=(
        "Decode attention of one request without paging or plan(): q is "
        "[num_qo_heads, head_dim], k and v are [kv_len, num_kv_heads, head_dim]."
    ),
    axes={**_HEAD_AXES, "kv_len": Var(description="Number of K/V tokens.")},
    inputs={
        "q": Tensor(["num_qo_heads", "head_dim"]),
        "k": Tensor(
            ["kv_len", "num_kv_heads", "head_dim"],
            description="Keys; this shape is the NHD layout (the default kv_layout).",
        ),
        "v": Tensor(
            ["kv_len", "num_kv_heads", "head_dim"],
            description="Values; this shape is the NHD layout (the default kv_layout).",
        ),
    },
    outputs={"output": Tensor(["num_qo_heads", "head_dim"], dtype_from="q")},
    tags=["status:verified", "stage:decode"],
    reference=_single_decode_reference,
    check=_attention_check,
    init=_single_decode_init,
)

single_prefill_with_kv_cache_trace = TraceTemplate(
    op_type="single_prefill",
    name_prefix="single_prefill",
    description=(
        "Prefill attention of one request without paging or plan(): q is "
        "[qo_len, num_qo_heads, head_dim], k and v [kv_len, num_kv_heads, head_dim]; "
        "causal or custom masks optional."
    ),
    axes={
        **_HEAD_AXES,
        "qo_len": Var(description="Number of query tokens."),
        "kv_len": Var(description="Number of K/V tokens."),
    },
    inputs=_qkv_inputs("qo_len", "kv_len"),
    outputs={"output": Tensor(["qo_len", "num_qo_heads", "head_dim"], dtype_from="q")},
    tags=["status:verified", "stage:prefill"],
    reference=_single_prefill_reference,
    check=_attention_check,
    init=_single_prefill_init,
)

gqa_paged_decode_trace = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="gqa_paged_decode",
    description=(
        "Batched grouped-query decode, one query token per request, over a paged KV "
        "cache passed as a (k_cache, v_cache) tuple; the page table comes from plan(). "
        "BatchDecodeWithPagedKVCacheWrapper.run()."
    ),
    axes={
        "batch_size": Var(description="Number of query tokens (one per request)."),
        **_HEAD_AXES,
        "num_pages": Var(),
        "page_size": Const(abbrev="ps"),
        "len_indptr": Var(description="Length of kv_indptr."),
        "num_kv_indices": Var(description="Number of page ids in kv_indices."),
    },
    inputs={
        "q": Tensor(["batch_size", "num_qo_heads", "head_dim"]),
        **_paged_cache_inputs(),
        "kv_indptr": _planned(["len_indptr"], "Offsets of each request's pages in kv_indices"),
        "kv_indices": _planned(["num_kv_indices"], "Page ids of the KV cache"),
        **_run_scalars(),
    },
    outputs=_batch_outputs("batch_size"),
    constraints=["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
    tags=["stage:decode", "status:verified"],
    reference=_gqa_paged_decode_reference,
    init=_gqa_paged_decode_init,
)


class _BatchDecodePlanTraceTemplate(TraceTemplate):
    """The plan() template: keyword arguments collected by a ``**kwargs`` parameter
    count as arguments of their own."""

    def build_fi_trace_fn(self, fi_api):
        trace = super().build_fi_trace_fn(fi_api)

        def fi_trace(save_dir=None, name=None, **kwargs):
            nested = kwargs.pop("kwargs", None)
            if isinstance(nested, dict):
                kwargs.update(nested)
            return trace(save_dir=save_dir, name=name, **kwargs)

        fi_trace.__doc__ = trace.__doc__
        return fi_trace


def _optional_scalars(dtype, *names):
    return {n: Scalar(dtype, optional=True) for n in names}


gqa_paged_decode_plan_trace = _BatchDecodePlanTraceTemplate(
    op_type="gqa_paged_plan",
    name_prefix="gqa_paged_decode_plan",
    description=(
        "plan() of batched paged decode: the page table, head geometry, query length "
        "and the settings the following run() calls use."
    ),
    axes={
        "batch_size": Var(description="Number of requests."),
        **_HEAD_AXES,
        "page_size": Const(abbrev="ps"),
        "len_indptr": Var(description="Length of indptr."),
        "num_kv_indices": Var(description="Number of page ids in indices."),
        "max_num_blocks_per_seq": Var(description="Columns of block_tables."),
    },
    inputs={
        "indptr": Tensor(["len_indptr"], dtype="int32"),
        "indices": Tensor(["num_kv_indices"], dtype="int32"),
        "last_page_len": Tensor(["batch_size"], dtype="int32"),
        "num_qo_heads": Scalar("int32"),
        "num_kv_heads": Scalar("int32"),
        "head_dim": Scalar("int32"),
        "page_size": Scalar("int32"),
        "q_len_per_req": Scalar(
            "int32", optional=True, description="Query tokens of every request."
        ),
        "is_causal": Scalar(
            "bool", optional=True, description="Whether run() applies a causal mask."
        ),
        "pos_encoding_mode": Scalar("string", optional=True),
        **_optional_scalars("int32", "window_left", "window_right"),
        "logits_soft_cap": Scalar("float32", optional=True),
        **_optional_scalars("dtype", "q_data_type", "kv_data_type", "o_data_type", "data_type"),
        **_optional_scalars("float32", "sm_scale", "rope_scale", "rope_theta"),
        "non_blocking": Scalar("bool", optional=True),
        "fixed_split_size": Scalar("int32", optional=True),
        "disable_split_kv": Scalar("bool", optional=True),
        "seq_lens": Tensor(["batch_size"], dtype="int32", optional=True),
        "block_tables": Tensor(
            ["batch_size", "max_num_blocks_per_seq"], dtype="int32", optional=True
        ),
    },
    outputs={},
    constraints=["len_indptr == batch_size + 1", "num_qo_heads % num_kv_heads == 0"],
    tags=["stage:decode", "phase:plan", "status:experimental"],
)

gqa_paged_prefill_trace = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="gqa_paged_prefill",
    description=(
        "Batched grouped-query causal prefill, several query tokens per request, over a "
        "paged KV cache; qo_indptr and the page table come from plan(). "
        "BatchPrefillWithPagedKVCacheWrapper.run()."
    ),
    axes={
        **_HEAD_AXES,
        "page_size": Const(abbrev="ps"),
        "len_indptr": Var(description="Length of the indptr arrays (requests + 1)."),
        "total_q": Var(description="Number of query tokens of all requests."),
        "num_kv_indices": Var(description="Number of page ids in kv_indices."),
        "num_pages": Var(),
    },
    inputs={
        "q": Tensor(["total_q", "num_qo_heads", "head_dim"]),
        **_paged_cache_inputs(),
        "qo_indptr": _planned(["len_indptr"], "Offsets of each request's query rows"),
        "kv_indptr": _planned(["len_indptr"], "Offsets of each request's pages in kv_indices"),
        "kv_indices": _planned(["num_kv_indices"], "Page ids of the KV cache"),
        **_run_scalars(),
    },
    outputs=_batch_outputs("total_q"),
    constraints=["total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"],
    tags=["stage:prefill", "status:verified"],
    reference=_gqa_paged_prefill_reference,
    init=_gqa_paged_prefill_init,
)

gqa_ragged_prefill_trace = TraceTemplate(
    op_type="gqa_ragged",
    name_prefix="gqa_ragged",
    description=(
        "Batched grouped-query causal prefill over contiguous (not paged) K and V; "
        "qo_indptr and kv_indptr come from plan(). "
        "BatchPrefillWithRaggedKVCacheWrapper.run()."
    ),
    axes={
        **_HEAD_AXES,
        "len_indptr": Var(description="Length of the indptr arrays (requests + 1)."),
        "total_q": Var(description="Number of query tokens of all requests."),
        "total_kv": Var(description="Number of K/V tokens of all requests."),
    },
    inputs={
        **_qkv_inputs("total_q", "total_kv"),
        "qo_indptr": _planned(["len_indptr"], "Offsets of each request's query rows"),
        "kv_indptr": _planned(["len_indptr"], "Offsets of each request's K/V rows"),
        **_run_scalars(),
    },
    outputs=_batch_outputs("total_q", "Attention output."),
    constraints=["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
    tags=["stage:prefill", "status:verified"],
    reference=_gqa_ragged_prefill_reference,
    init=_gqa_ragged_init,
)
