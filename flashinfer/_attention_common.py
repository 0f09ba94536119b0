"""The skeleton of the attention functions and wrappers (decode, prefill, sparse).

Argument checks, index-tensor copies, scale folding, output allocation, the plan a
wrapper keeps (``_new_plan``, ``_with_page_table``), what ``__init__`` keeps and the
deprecated ``forward`` (``_WrapperBase``), ``return_lse`` outputs and the call of
``flashinfer._kernels.attention`` (with stream and thread count) live here once; each
wrapper keeps only its own signature and what differs. Those signatures are FlashInfer's,
written several parameters a line (``# fmt: skip``) so that each reads as one block. A
wrong type raises TypeError, a wrong value ValueError, a value FlashInfer accepts that
this build cannot honour NotImplementedError.
"""

import math
import warnings
from dataclasses import dataclass, field

import torch

from . import _kernels

# the rules of the C entry point (csrc/ops/ops_attention.c), not repeated here
_KV_LAYOUTS = _kernels.KV_LAYOUTS
_POS_ENCODING_MODES = _kernels.POS_ENCODING_MODES
_DTYPES_BY_NAME = {
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8,
}
_LSE_BASES = ("log2", "ln")
_LSE_LAYOUTS = ("NH", "HN")
# index arrays with a CPU twin the CUDA glue checks (the order of its host_index)
_HOST_INDEX_NAMES = ("kv_indices", "kv_last_page_len", "mask_indptr", "v_indptr", "o_indptr")


def _expect_tensor(name, value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")


def _check_choice(name, value, accepted):
    if value not in accepted:
        raise ValueError(f"{name}: {value!r} is not supported; accepted: {', '.join(accepted)}")
    return value


def _check_plan(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, kv_layout, pos_encoding_mode):
    """The plan's sizes and names against the kernels' rules (raised by the C side)."""
    _kernels.check_attention_plan(
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_qk if head_dim_vo is None else head_dim_vo,
        kv_layout,
        pos_encoding_mode,
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
    _expect_tensor(name, value)
    if value.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: dtype {value.dtype} is not supported; accepted: int32, int64")
    if value.dim() != 1:
        raise ValueError(f"{name}: expected 1 dimension, got {value.dim()}")
    return value.to(device="cpu", dtype=torch.int32, copy=True).contiguous()


def _split_paged_kv_cache(paged_kv_cache, kv_layout):
    """(k_cache, v_cache) views from one [num_pages, 2, ...] tensor or a tuple."""
    if isinstance(paged_kv_cache, torch.Tensor) and paged_kv_cache.dim() != 5:
        raise ValueError(
            f"paged_kv_cache: shape {tuple(paged_kv_cache.shape)} is not supported; "
            f"accepted: [num_pages, 2, ...] with 5 dimensions ({kv_layout}) or a "
            "(k_cache, v_cache) tuple"
        )
    k_cache, v_cache = _split_pair(paged_kv_cache, kv_layout, "paged_kv_cache")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(
                f"paged_kv_cache: {name} is {tuple(t.shape)}; accepted: a 4-dimensional tensor"
            )
    return k_cache, v_cache


def _check_paged_cache(k_cache, kv_layout, num_kv_heads, page_size, head_dim):
    if kv_layout == "NHD":
        got = (k_cache.shape[1], k_cache.shape[2])
    else:
        got = (k_cache.shape[2], k_cache.shape[1])
    width = k_cache.shape[3] * (2 if k_cache.dtype == torch.uint8 else 1)  # NVFP4: 2 per byte
    if got != (page_size, num_kv_heads) or width != head_dim:
        raise ValueError(
            f"paged_kv_cache: page shape (page_size, num_kv_heads, head_dim) is "
            f"{got + (width,)} in layout {kv_layout}; planned "
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
    _expect_tensor(name, given)
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
    """t on device; copies are kept in cache (a plan's device_copies) so run() copies once."""
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
        # the CPU index arrays are the host twins the C side checks without reading the
        # device copies back (no sync: run() stays capturable in a CUDA graph)
        host = (qo_indptr, kv_indptr) + tuple(kwargs.get(name) for name in _HOST_INDEX_NAMES)
        kwargs["host_index"] = tuple(
            t if isinstance(t, torch.Tensor) and t.device.type == "cpu" else None for t in host
        )
        qo_indptr = _on_device("qo_indptr", qo_indptr, q.device, cache)
        kv_indptr = _on_device("kv_indptr", kv_indptr, q.device, cache)
        for name in ("mask",) + _HOST_INDEX_NAMES:
            if kwargs.get(name) is not None:
                kwargs[name] = _on_device(name, kwargs[name], q.device, cache)
        kwargs["stream"] = torch.cuda.current_stream(q.device).cuda_stream
    _kernels.attention(
        q, k, v, out, lse, qo_indptr, kv_indptr, num_threads=torch.get_num_threads(), **kwargs
    )


def _common_kwargs(
    kv_layout,
    pos_encoding_mode="NONE",
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
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
    _expect_tensor(name, t)
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def _final_scale(sm_scale, head_dim, q_scale, k_scale):
    """sm_scale (default ``1 / sqrt(head_dim)``) with the q and k scales folded in."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    return scale * _scale_value("q_scale", q_scale) * _scale_value("k_scale", k_scale)


# the kernel settings a call or plan() names alike (_common_kwargs's, after kv_layout)
_SETTING_NAMES = (
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "sm_scale",
    "rope_scale",
    "rope_theta",
)


def _settings(kv_layout, args):
    """``_common_kwargs`` of a call from its arguments by name (args: its ``locals()``)."""
    return _common_kwargs(kv_layout, **{name: args[name] for name in _SETTING_NAMES})


def _single_kwargs(args, q_ndim, q_scale, k_scale):
    """Checks a single-request call's q, k, v; its kernel settings with the folded scale.

    args are the call's arguments by name (its ``locals()``): q, k, v, kv_layout and the
    ``_SETTING_NAMES``.
    """
    q = args["q"]
    _check_tensor("q", q, q_ndim)
    _check_tensor("k", args["k"], 3)
    _check_tensor("v", args["v"], 3)
    kw = _settings(args["kv_layout"], args)
    kw["sm_scale"] = _final_scale(kw["sm_scale"], q.shape[-1], q_scale, k_scale)
    return kw


def _kv_len(k, kv_layout):
    return k.shape[0] if kv_layout == "NHD" else k.shape[1]


def _run_single(q, k, v, out, return_lse, **kwargs):
    """One request's attention (q ``[qo_len, num_qo_heads, head_dim]``); its lse or None."""
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    qo_len, kv_len = q.shape[0], _kv_len(k, kwargs["kv_layout"])
    cache = None
    if q.device.type == "cuda":
        # [0, n] made on the device by a kernel, not copied from the host: capturable
        steps = torch.arange(2, dtype=torch.int32, device=q.device)
        cache = {
            ("qo_indptr", str(q.device)): steps * qo_len,
            ("kv_indptr", str(q.device)): steps * kv_len,
        }
    _attention(
        q,
        k,
        v,
        out,
        lse,
        torch.tensor([0, qo_len], dtype=torch.int32),
        torch.tensor([0, kv_len], dtype=torch.int32),
        cache=cache,
        **kwargs,
    )
    return lse


def _check_page_size(page_size):
    if page_size < 1:
        raise ValueError(f"page_size: {page_size} is not accepted; accepted: >= 1")


def _plan_dtypes(q_data_type, kv_data_type, data_type=None, o_data_type=None):
    """(q, kv, output) dtypes of a plan; q and kv fall back to data_type, kv then to q;
    output to q."""
    q_dtype = _as_dtype("q_data_type", data_type if q_data_type is None else q_data_type)
    kv_dtype = _as_dtype("kv_data_type", kv_data_type)
    if kv_dtype is None:
        kv_dtype = _as_dtype("data_type", data_type)
    if kv_dtype is None:
        kv_dtype = q_dtype
    o_dtype = _as_dtype("o_data_type", o_data_type)
    return q_dtype, kv_dtype, q_dtype if o_dtype is None else o_dtype


def _new_plan(kv_layout, args, qo_indptr, head_dim, head_dim_vo=None):
    """The ``_Plan`` every wrapper's ``plan()`` starts from, from its arguments by name
    (args: its ``locals()``): the sizes checked, the kernel settings normalised, the dtypes
    resolved (``data_type`` where the wrapper takes it)."""
    num_qo_heads, num_kv_heads = args["num_qo_heads"], args["num_kv_heads"]
    pos_encoding_mode = args["pos_encoding_mode"]
    _check_plan(num_qo_heads, num_kv_heads, head_dim, head_dim_vo, kv_layout, pos_encoding_mode)
    settings = _settings(kv_layout, args)
    q_dtype, kv_dtype, o_dtype = _plan_dtypes(
        args["q_data_type"], args["kv_data_type"], args.get("data_type"), args["o_data_type"]
    )
    return _Plan(
        qo_indptr=qo_indptr,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        settings=settings,
        o_dtype=o_dtype,
        head_dim_vo=head_dim_vo,
    )


def _with_page_table(plan, page_table, page_size, lookup, split):
    """The plan with the page table it runs on (``_page_table``) and its split hint.

    page_table: plan()'s (indptr, indices, last_page_len) as ``_index_tensor`` copies;
    lookup: (block_tables, seq_lens); split: (fixed_split_size, disable_split_kv).
    """
    _check_page_size(page_size)
    table = _page_table(*page_table, page_size, *lookup)
    plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len = table
    plan.page_size = page_size
    plan.kv_chunk = _split_hint(*split, page_size)
    return plan


@dataclass(eq=False)
class _Plan:
    """What a wrapper's ``plan()`` keeps for its ``run()`` calls.

    Index arrays are CPU int32 copies (``_index_tensor``); ``settings`` are
    ``_common_kwargs``'s keyword arguments of the kernel, ``sm_scale`` not yet folded.
    ``plan()`` sets ``kv_indptr`` after the common checks; a paged plan also sets
    ``page_size``, ``kv_indices`` and ``kv_last_page_len``, a prefill plan its packed
    mask and ``causal``, a ragged plan ``v_indptr`` / ``o_indptr`` when given.
    ``kv_chunk`` is the split-KV hint (``_split_hint``). ``device_copies`` caches the
    index arrays moved to a CUDA device (``_on_device``), so they are copied once, not
    per run.
    """

    qo_indptr: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    q_dtype: torch.dtype | None
    kv_dtype: torch.dtype | None
    settings: dict
    o_dtype: torch.dtype | None = None  # None: q's dtype
    kv_indptr: torch.Tensor | None = None
    page_size: int = 0
    kv_indices: torch.Tensor | None = None
    kv_last_page_len: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    mask_indptr: torch.Tensor | None = None
    causal: bool = False
    v_indptr: torch.Tensor | None = None
    o_indptr: torch.Tensor | None = None
    kv_chunk: int = 0
    head_dim_vo: int | None = None  # None: head_dim
    device_copies: dict = field(default_factory=dict)

    @property
    def batch_size(self):
        return self.qo_indptr.numel() - 1

    @property
    def qo_rows(self):
        return int(self.qo_indptr[-1])


def _not_implemented(name, value, accepted):
    """NotImplementedError for a FlashInfer argument value this build cannot honour."""
    raise NotImplementedError(
        f"{name}: {value!r} is not implemented in flashinfer-c; accepted: {accepted}"
    )


def _refuse_unless(name, value, accepted_values, accepted_text):
    if value not in accepted_values:
        _not_implemented(name, value, accepted_text)


def _split_hint(fixed_split_size, disable_split_kv, page_size):
    """The kernel's kv_chunk from FlashInfer's split-KV hints: -1 never split (disable),
    keys per split (fixed_split_size pages of page_size), 0 the kernel's choice."""
    if disable_split_kv:
        return -1
    if fixed_split_size is None or fixed_split_size == -1:
        return 0
    if isinstance(fixed_split_size, bool) or not isinstance(fixed_split_size, int):
        raise TypeError(f"fixed_split_size: expected an int, got {type(fixed_split_size).__name__}")
    if fixed_split_size < 1:
        raise ValueError(
            f"fixed_split_size: {fixed_split_size} is not accepted; accepted: pages >= 1, "
            "or -1/None (the kernel chooses)"
        )
    return fixed_split_size * page_size


def _lengths(indptr):
    return (indptr[1:] - indptr[:-1]).tolist()


def _paged_kv_lens(indptr, last_page_len, page_size):
    pages = _lengths(indptr)
    last = last_page_len.tolist()
    return [0 if n == 0 else (n - 1) * page_size + last[i] for i, n in enumerate(pages)]


def _page_table(indptr, indices, last_page_len, page_size, block_tables, seq_lens):
    """The page table (indptr, indices, last_page_len) a plan runs on.

    ``seq_lens`` (each request's KV length) and ``block_tables`` (``[batch, max_pages]``
    page ids) are the inputs of FlashInfer's trtllm-gen/cuDNN backends; when given they
    decide, as there: request b holds ``seq_lens[b]`` keys in the pages
    ``block_tables[b, :ceil(seq_lens[b] / page_size)]`` (without block_tables, the first
    pages of its indptr range).
    """
    if block_tables is None and seq_lens is None:
        return indptr, indices, last_page_len
    batch = indptr.numel() - 1
    if seq_lens is None:
        lens = _paged_kv_lens(indptr, last_page_len, page_size)
    else:
        lens = _index_tensor("seq_lens", seq_lens).tolist()
        if len(lens) != batch or min(lens, default=0) < 0:
            raise ValueError(
                f"seq_lens: {lens[:8]}... for {batch} requests; accepted: batch_size lengths >= 0"
            )
    need = [(n + page_size - 1) // page_size for n in lens]
    if block_tables is None:
        have = _lengths(indptr)
        starts = indptr[:-1].tolist()
        rows = [indices[a : a + n] for a, n in zip(starts, need)]
        source = "paged_kv_indptr"
    else:
        _expect_tensor("block_tables", block_tables)
        if block_tables.dim() != 2 or block_tables.shape[0] != batch:
            raise ValueError(
                f"block_tables: shape {tuple(block_tables.shape)}; accepted: "
                f"[batch_size = {batch}, max_num_pages]"
            )
        table = block_tables.to(device="cpu", dtype=torch.int32)
        have = [table.shape[1]] * batch
        rows = [table[b, :n] for b, n in enumerate(need)]
        source = "block_tables"
    for b, (n, h) in enumerate(zip(need, have)):
        if n > h:
            raise ValueError(
                f"seq_lens[{b}] = {lens[b]} needs {n} pages of {page_size}; {source} gives "
                f"request {b} only {h}"
            )
    new_indptr = torch.tensor([0] + need, dtype=torch.int64).cumsum(0).to(torch.int32)
    new_indices = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 if n else 0 for n in lens], dtype=torch.int32)
    return new_indptr, new_indices.to(torch.int32).contiguous(), last


def _check_at_least(name, value, actual, what):
    """max_token_per_sequence / max_sequence_kv: bounds the batch must fit."""
    if value is not None and value < actual:
        raise ValueError(f"{name}: {value} is below the batch's longest {what}, {actual}")


def _check_same_lengths(name, value, lengths):
    """seq_lens / seq_lens_q where they may only repeat what the indptrs say."""
    if value is None:
        return
    got = _index_tensor(name, value).tolist()
    if got != list(lengths):
        _not_implemented(
            name, got[:8], f"None or the lengths the indptrs give ({list(lengths)[:8]})"
        )


def _planned(wrapper, args, q=None):
    """(plan, per-head FP8 scales) for run(): extra positional arguments are only
    FlashInfer's fa3 ``run(q, ..., scale_q, scale_k, scale_v)`` of a float8 q."""
    if wrapper._plan is None:
        raise RuntimeError("run: plan() must be called before run()")
    if _is_float8(q) and len(args) >= 3:
        return wrapper._plan, _head_scales(*args[:3])
    _no_extra_args(args)
    return wrapper._plan, {}


def _is_float8(t):
    return isinstance(t, torch.Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _head_scales(scale_q, scale_k, scale_v):
    """The kernel's per-head FP8 scales (float32 [heads] or [1] tensors) of a float8 q."""
    scales = {"q_head_scale": scale_q, "k_head_scale": scale_k, "v_head_scale": scale_v}
    return {k: v for k, v in scales.items() if v is not None}


def _check_planned_q(plan, q, want, sizes):
    """q is 3-D with shape want (named by sizes in the message) and the planned dtype."""
    _check_tensor("q", q, 3)
    if tuple(q.shape) != want:
        raise ValueError(f"q: shape {tuple(q.shape)} does not match the plan {sizes} = {want}")
    _check_planned_dtype("q", q, plan.q_dtype, "q_data_type")


def _run_outputs(q, out, lse, return_lse, dtype, lse_layout="NH", head_dim_vo=None):
    """(out, lse view the kernel writes [rows, heads], lse to return) for run(): the given
    ones checked, else new; lse only when wanted. lse_layout "HN" keeps lse as the
    contiguous [heads, rows] FlashInfer returns; the kernel writes it through a view."""
    shape = q.shape if head_dim_vo is None else (q.shape[0], q.shape[1], head_dim_vo)
    out = _output("out", out, shape, dtype, q.device)
    if not (return_lse or lse is not None):
        return out, None, None
    rows, heads = q.shape[0], q.shape[1]
    if _check_choice("lse_layout", lse_layout, _LSE_LAYOUTS) == "HN":
        lse = _output("lse", lse, (heads, rows), torch.float32, q.device)
        return out, lse.t(), lse
    lse = _output("lse", lse, (rows, heads), torch.float32, q.device)
    return out, lse, lse


def _finish_lse(lse, lse_base):
    """The kernel writes base-2 lse; "ln" is the natural log FlashInfer also returns."""
    if _check_choice("lse_base", lse_base, _LSE_BASES) == "ln" and lse is not None:
        lse.mul_(math.log(2.0))
    return lse


def _split_pair(value, kv_layout, what):
    """(k part, v part) of a paged cache or its scales: one [P, 2, ...] tensor or a pair."""
    if isinstance(value, torch.Tensor):
        if value.dim() < 2 or value.shape[1] != 2:
            raise ValueError(
                f"{what}: shape {tuple(value.shape)} is not supported; accepted: "
                f"[num_pages, 2, ...] ({kv_layout}) or a (k_cache, v_cache) tuple"
            )
        return value[:, 0], value[:, 1]
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{what}: {type(value).__name__} is not supported; accepted: a tensor "
            "[num_pages, 2, ...] or a (k_cache, v_cache) tuple"
        )
    if len(value) != 2:
        raise ValueError(f"{what}: {len(value)} items; accepted: a (k_cache, v_cache) pair")
    for t in value:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: an item is {type(t).__name__}; accepted: tensors")
    return value[0], value[1]


def _kv_scales(kv_cache_sf, kv_layout, k):
    """(k_sf, v_sf) of an NVFP4 KV cache (uint8 k), or (None, None); FlashInfer's rules."""
    if kv_cache_sf is None:
        if k.dtype == torch.uint8:
            raise ValueError("kv_cache_sf must be provided for NVFP4 KV cache.")
        return None, None
    if k.dtype != torch.uint8:
        raise ValueError(
            f"kv_cache_sf: given for a KV cache of dtype {k.dtype}; NVFP4 KV is uint8 "
            "(two E2M1 values per byte)"
        )
    return _split_pair(kv_cache_sf, kv_layout, "kv_cache_sf")


def _paged_kv(plan, kv_layout, paged_kv_cache):
    """(k_cache, v_cache) of a run's paged cache, checked against the plan."""
    k_cache, v_cache = _split_paged_kv_cache(paged_kv_cache, kv_layout)
    _check_paged_cache(k_cache, kv_layout, plan.num_kv_heads, plan.page_size, plan.head_dim)
    _check_planned_dtype("paged_kv_cache", k_cache, plan.kv_dtype, "kv_data_type")
    return k_cache, v_cache


def _run_kwargs(plan, window_left, q_scale, k_scale):
    """The planned kernel settings with run()'s window_left and folded q, k scales."""
    kw = dict(plan.settings)
    if window_left is not None:
        kw["window_left"] = int(window_left)
    kw["sm_scale"] = _final_scale(kw["sm_scale"], plan.head_dim, q_scale, k_scale)
    return kw


def _refuse_run_extras(
    skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None
):
    """run() options of FlashInfer's trtllm-gen kernels, which change the arithmetic in
    ways these kernels do not reproduce: only their off values are accepted."""
    _refuse_unless(
        "skip_softmax_threshold_scale_factor",
        skip_softmax_threshold_scale_factor,
        (None,),
        "None (exact softmax)",
    )
    _refuse_unless("use_fp16_softmax", use_fp16_softmax, (None, False), "None or False")
    _refuse_unless("uses_spcompress", uses_spcompress, (None, False), "None or False")


def _out_dtype(planned, q):
    """The output dtype: the planned one, else q's (float16 for a float8 q, as fa3 does)."""
    if planned is not None:
        return planned
    return torch.float16 if _is_float8(q) else q.dtype


def _run_planned(plan, q, k, v, out, lse, v_scale, kw, **extras):
    """Runs the kernel on a plan (its index arrays, mask and split hint) into out and lse;
    extras are run()'s own kernel arguments (sinks, k_sf, v_sf)."""
    _attention(
        q,
        k,
        v,
        out,
        lse,
        plan.qo_indptr,
        plan.kv_indptr,
        cache=plan.device_copies,
        kv_indices=plan.kv_indices,
        kv_last_page_len=plan.kv_last_page_len,
        mask=plan.mask,
        mask_indptr=plan.mask_indptr,
        causal=plan.causal,
        v_indptr=plan.v_indptr,
        o_indptr=plan.o_indptr,
        kv_chunk=plan.kv_chunk,
        v_scale=v_scale,
        **extras,
        **kw,
    )


class _WrapperBase:
    """What FlashInfer's three batch wrappers share beyond plan() and run(): the settings
    ``__init__`` keeps, the ``*_return_lse`` forms and the deprecated ``forward``."""

    def __init__(
        self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs
    ):
        if jit_args is not None or jit_kwargs is not None:
            raise NotImplementedError("jit_args/jit_kwargs: JIT custom modules are not supported")
        self._kv_layout = _check_choice("kv_layout", kv_layout, _KV_LAYOUTS)
        self._float_workspace_buffer = float_workspace_buffer
        self._use_cuda_graph = use_cuda_graph
        self._backend = backend
        self._plan = None

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Accepted for compatibility (the kernels need no workspace)."""
        self._float_workspace_buffer = float_workspace_buffer

    def end_forward(self):
        """Deprecated in FlashInfer; no effect."""

    def _forward(self, args, run_names):
        """The deprecated forward(): args are its arguments by name (its ``locals()``);
        those in run_names go to run() positionally, with return_lse and the q, k, v
        scales; the rest replace the plan's settings."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("forward: plan() must be called before forward()")
        skip = ("self", "return_lse", "causal", "use_fp16_qk_reduction") + run_names
        settings = {k: v for k, v in args.items() if k not in skip}
        scales = {k: settings.pop(k) for k in ("q_scale", "k_scale", "v_scale") if k in settings}
        plan.settings = _common_kwargs(self._kv_layout, **settings)
        causal = args.get("causal")
        if causal is not None and plan.mask is None:
            plan.causal = bool(causal)
        run_args = tuple(args[name] for name in run_names)
        return self.run(*run_args, return_lse=args["return_lse"], **scales)

    def run_return_lse(self, *args, **kwargs):
        """run() with ``return_lse=True``: (out, lse)."""
        return self.run(*args, return_lse=True, **kwargs)


def _deprecated_positional(api_name, args, names, kwargs):
    """FlashInfer's plan(): optional arguments after page_size may still come positionally,
    with a DeprecationWarning; they join kwargs under their names."""
    if not args:
        return kwargs
    if len(args) > len(names):
        raise TypeError(
            f"{api_name}.plan() accepts at most {len(names)} deprecated optional positional "
            f"arguments after page_size; got {len(args)}"
        )
    merged = dict(kwargs)
    for name, value in zip(names, args):
        if name in merged:
            raise TypeError(f"{api_name}.plan() got multiple values for argument {name!r}")
        merged[name] = value
    warnings.warn(
        f"Passing optional arguments to {api_name}.plan() positionally is deprecated; pass "
        "them as keyword arguments instead.",
        DeprecationWarning,
        stacklevel=4,
    )
    return merged
