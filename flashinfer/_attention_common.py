"""Plumbing shared by the decode and prefill attention functions and wrappers.

Argument checks, index-tensor copies, scale folding, output allocation, the plan a
wrapper keeps and the call of ``flashinfer._kernels.attention`` (with stream and thread
count) live here once. A wrong type raises TypeError, a wrong value ValueError.
"""

import math
from dataclasses import dataclass, field

import torch

from . import _kernels

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


def _expect_tensor(name, value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")


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
    _expect_tensor(name, value)
    if value.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: dtype {value.dtype} is not supported; accepted: int32, int64")
    if value.dim() != 1:
        raise ValueError(f"{name}: expected 1 dimension, got {value.dim()}")
    return value.to(device="cpu", dtype=torch.int32, copy=True).contiguous()


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
    if not isinstance(paged_kv_cache, (tuple, list)):
        raise TypeError(
            f"paged_kv_cache: {type(paged_kv_cache).__name__} is not supported; accepted: a "
            "tensor [num_pages, 2, ...] or a (k_cache, v_cache) tuple"
        )
    if len(paged_kv_cache) != 2:
        raise ValueError(
            f"paged_kv_cache: {len(paged_kv_cache)} items; accepted: a (k_cache, v_cache) pair"
        )
    k_cache, v_cache = paged_kv_cache
    accepted = "accepted: a 4-dimensional tensor"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"paged_kv_cache: {name} is {type(t).__name__}; {accepted}")
        if t.dim() != 4:
            raise ValueError(f"paged_kv_cache: {name} is {tuple(t.shape)}; {accepted}")
    return k_cache, v_cache


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
        host = (qo_indptr, kv_indptr) + tuple(
            kwargs.get(name) for name in ("kv_indices", "kv_last_page_len", "mask_indptr")
        )
        kwargs["host_index"] = tuple(
            t if isinstance(t, torch.Tensor) and t.device.type == "cpu" else None for t in host
        )
        qo_indptr = _on_device("qo_indptr", qo_indptr, q.device, cache)
        kv_indptr = _on_device("kv_indptr", kv_indptr, q.device, cache)
        for name in ("kv_indices", "kv_last_page_len", "mask", "mask_indptr"):
            if kwargs.get(name) is not None:
                kwargs[name] = _on_device(name, kwargs[name], q.device, cache)
        kwargs["stream"] = torch.cuda.current_stream(q.device).cuda_stream
    _kernels.attention(
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
    _expect_tensor(name, t)
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def _final_scale(sm_scale, head_dim, q_scale, k_scale):
    """sm_scale (default ``1 / sqrt(head_dim)``) with the q and k scales folded in."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    return scale * _scale_value("q_scale", q_scale) * _scale_value("k_scale", k_scale)


def _single_kwargs(q, k, v, q_ndim, q_scale, k_scale, *settings):
    """Checks a single-request call's q, k, v; its kernel settings with the folded scale.

    ``settings`` are ``_common_kwargs``'s arguments, in its order.
    """
    _check_tensor("q", q, q_ndim)
    _check_tensor("k", k, 3)
    _check_tensor("v", v, 3)
    kw = _common_kwargs(*settings)
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
    """(q, kv, output) dtypes of a plan; kv falls back to data_type, then q; output to q."""
    q_dtype = _as_dtype("q_data_type", q_data_type)
    kv_dtype = _as_dtype("kv_data_type", kv_data_type)
    if kv_dtype is None:
        kv_dtype = _as_dtype("data_type", data_type)
    if kv_dtype is None:
        kv_dtype = q_dtype
    o_dtype = _as_dtype("o_data_type", o_data_type)
    return q_dtype, kv_dtype, q_dtype if o_dtype is None else o_dtype


@dataclass(eq=False)
class _Plan:
    """What a wrapper's ``plan()`` keeps for its ``run()`` calls.

    Index arrays are CPU int32 copies (``_index_tensor``); ``settings`` are
    ``_common_kwargs``'s keyword arguments of the kernel, ``sm_scale`` not yet folded.
    ``plan()`` sets ``kv_indptr`` after the common checks; a paged plan also sets
    ``page_size``, ``kv_indices`` and ``kv_last_page_len``, a prefill plan its packed
    mask and ``causal``. ``device_copies`` caches the index arrays moved to a CUDA device
    (``_on_device``), so they are copied once, not per run.
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
    device_copies: dict = field(default_factory=dict)

    @property
    def batch_size(self):
        return self.qo_indptr.numel() - 1


def _init_wrapper(wrapper, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit):
    """The settings every wrapper's ``__init__`` keeps; jit is (jit_args, jit_kwargs)."""
    if jit[0] is not None or jit[1] is not None:
        raise NotImplementedError("jit_args/jit_kwargs: JIT custom modules are not supported")
    wrapper._kv_layout = _check_choice("kv_layout", kv_layout, _KV_LAYOUTS)
    wrapper._float_workspace_buffer = float_workspace_buffer
    wrapper._use_cuda_graph = use_cuda_graph
    wrapper._backend = backend
    wrapper._plan = None


def _planned(wrapper, args):
    """The wrapper's plan for run(), which takes no extra positional arguments."""
    _no_extra_args(args)
    if wrapper._plan is None:
        raise RuntimeError("run: plan() must be called before run()")
    return wrapper._plan


def _check_planned_q(plan, q, want, sizes):
    """q is 3-D with shape want (named by sizes in the message) and the planned dtype."""
    _check_tensor("q", q, 3)
    if tuple(q.shape) != want:
        raise ValueError(f"q: shape {tuple(q.shape)} does not match the plan {sizes} = {want}")
    _check_planned_dtype("q", q, plan.q_dtype, "q_data_type")


def _run_outputs(q, out, lse, return_lse, dtype):
    """(out, lse) for run(): the given ones checked, else new; lse only when wanted."""
    out = _output("out", out, q.shape, dtype, q.device)
    if return_lse or lse is not None:
        lse = _output("lse", lse, q.shape[:2], torch.float32, q.device)
    return out, lse


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


def _run_planned(plan, q, k, v, out, lse, return_lse, v_scale, kw):
    """Runs the kernel on a plan (its index arrays and mask); out, and lse when asked."""
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
        v_scale=_scale_value("v_scale", v_scale),
        **kw,
    )
    return (out, lse) if return_lse else out
