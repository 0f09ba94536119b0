"""Gives decorated APIs their trace templates: ``fi_trace``, ``fi_init`` and the
``FLASHINFER_TRACE_DUMP`` auto-dump.

``flashinfer.api_logging`` passes :func:`attach_trace` to the native core's
``install``; the core's ``flashinfer_api`` calls it once per decorated object with what
it made of the function (the function itself at level 0, its native logging wrapper
above), as FlashInfer's decorator calls its ``_attach_fi_trace``. Templates come from
``@flashinfer_api(trace=...)`` or, for this package's own APIs, from
:data:`API_TEMPLATES` by qualified name (so the API modules carry no trace imports).

Level 0 stays free: unless ``FLASHINFER_TRACE_DUMP`` is on when the API is decorated,
the function is returned as it is, with ``fi_trace``/``fi_init`` set on it. When it is
on, a wrapper writes the call's definition (``<name>.json`` in
``FLASHINFER_TRACE_DUMP_DIR``, once per name and process) before the call goes on.
"""

import functools
import inspect
import warnings

from .template import TraceTemplate, _is_trace_dump_enabled
from .templates.attention import (
    gqa_paged_decode_plan_trace,
    gqa_paged_decode_trace,
    gqa_paged_prefill_trace,
    gqa_ragged_prefill_trace,
    single_decode_with_kv_cache_trace,
    single_prefill_with_kv_cache_trace,
)
from .templates.gemm import (
    bmm_fp8_trace,
    mm_fp4_trace,
    mm_fp8_trace,
    prepare_low_latency_gemm_weights_trace,
)
from .templates.quantize import fp4_quantize_trace, nvfp4_quantize_trace

__all__ = ["API_TEMPLATES", "TRACE_REGISTRY", "attach_trace"]

# Our API (its __qualname__) -> its template and the qualified name FlashInfer's own
# definitions tag it with (``fi_api:``), which is where FlashInfer defines it.
API_TEMPLATES = {
    "single_decode_with_kv_cache": (
        single_decode_with_kv_cache_trace,
        "flashinfer.decode.single_decode_with_kv_cache",
    ),
    "BatchDecodeWithPagedKVCacheWrapper.plan": (
        gqa_paged_decode_plan_trace,
        "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan",
    ),
    "BatchDecodeWithPagedKVCacheWrapper.run": (
        gqa_paged_decode_trace,
        "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
    ),
    "single_prefill_with_kv_cache": (
        single_prefill_with_kv_cache_trace,
        "flashinfer.prefill.single_prefill_with_kv_cache",
    ),
    "BatchPrefillWithPagedKVCacheWrapper.run": (
        gqa_paged_prefill_trace,
        "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run",
    ),
    "BatchPrefillWithRaggedKVCacheWrapper.run": (
        gqa_ragged_prefill_trace,
        "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run",
    ),
    "bmm_fp8": (bmm_fp8_trace, "flashinfer.gemm.gemm_base.bmm_fp8"),
    "mm_fp8": (mm_fp8_trace, "flashinfer.gemm.gemm_base.mm_fp8"),
    "mm_fp4": (mm_fp4_trace, "flashinfer.gemm.gemm_base.mm_fp4"),
    "prepare_low_latency_gemm_weights": (
        prepare_low_latency_gemm_weights_trace,
        "flashinfer.trtllm_low_latency_gemm.prepare_low_latency_gemm_weights",
    ),
    "fp4_quantize": (
        fp4_quantize_trace,
        "flashinfer.quantization.fp4_quantization.fp4_quantize",
    ),
    "nvfp4_quantize": (
        nvfp4_quantize_trace,
        "flashinfer.quantization.fp4_quantization.nvfp4_quantize",
    ),
}

# (original function, template, label) for every template attached this process, as
# FlashInfer's ``api_logging._TRACE_REGISTRY``; label is name_prefix or op_type.
TRACE_REGISTRY = []


def _qualified_name(original):
    module = getattr(original, "__module__", "") or ""
    qualname = getattr(original, "__qualname__", "") or ""
    return f"{module}.{qualname}" if module else qualname


def _own_template(original):
    """(template, fi_api) of one of this package's APIs or of a function registered with
    ``flashinfer.fi_trace.register_fi_trace``, else None."""
    from ..fi_trace import _REGISTRY

    qualname = getattr(original, "__qualname__", None)
    module = getattr(original, "__module__", "") or ""
    if (module == "flashinfer" or module.startswith("flashinfer.")) and qualname in API_TEMPLATES:
        return API_TEMPLATES[qualname]
    if qualname in _REGISTRY:
        return _REGISTRY[qualname], _qualified_name(original)
    return None


def _register(original, template):
    TRACE_REGISTRY.append((original, template, template.name_prefix or template.op_type))


def _dispatching_functions(select, fi_api, original):
    """fi_trace / fi_init for a template chosen per call by ``select(**kwargs)``."""
    known = [t for t in getattr(select, "templates", ()) if isinstance(t, TraceTemplate)]
    for template in known:
        _register(original, template)
    built = {}

    def fi_trace(save_dir=None, name=None, **kwargs):
        template = select(save_dir=None, name=None, **kwargs)
        if template is None:
            return {}
        if id(template) not in built:
            built[id(template)] = template.build_fi_trace_fn(fi_api)
        return built[id(template)](save_dir=save_dir, name=name, **kwargs)

    def fi_init(**kwargs):
        template = select(save_dir=None, name=None, **kwargs)
        if template is None or template.init is None:
            raise RuntimeError(f"No init function available for the resolved template ({fi_api})")
        return template.init(**kwargs)

    with_init = not known or any(t.init is not None for t in known)
    return fi_trace, (fi_init if with_init else None)


def _trace_functions(trace, fi_api, original):
    """(fi_trace, fi_init or None) for a TraceTemplate or a template selector."""
    if isinstance(trace, TraceTemplate):
        _register(original, trace)
        return trace.build_fi_trace_fn(fi_api), trace.init
    return _dispatching_functions(trace, fi_api, original)


def _auto_dumping(inner, original, fi_trace, fi_api):
    """``inner`` preceded by writing the call's definition while FLASHINFER_TRACE_DUMP is
    on. A failure warns once per exception type and never stops the call."""
    signature = inspect.signature(original)
    warned = set()

    @functools.wraps(inner)
    def traced(*args, **kwargs):
        if _is_trace_dump_enabled():
            try:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                fi_trace(**bound.arguments)
            except Exception as exc:
                if type(exc).__name__ not in warned:
                    warned.add(type(exc).__name__)
                    warnings.warn(
                        f"[flashinfer] fi_trace auto-dump failed for '{fi_api}': "
                        f"{type(exc).__name__}: {exc}. Further occurrences of this error "
                        "for this API will be suppressed.",
                        stacklevel=2,
                    )
        return inner(*args, **kwargs)

    return traced


def attach_trace(wrapped, original, trace_template=None):
    """Give ``wrapped`` the trace support of ``original``'s template.

    Parameters
    ----------
    wrapped : callable
        What the decorator made of ``original``: the function itself at level 0, its
        native logging wrapper above.
    original : callable
        The decorated function (its name and signature describe the API).
    trace_template : TraceTemplate or callable, optional
        From ``@flashinfer_api(trace=...)``: a template, or a selector
        ``(save_dir=None, name=None, **kwargs) -> TraceTemplate`` with an optional
        ``templates`` list. None: this package's own template for ``original``, or one
        registered with ``register_fi_trace``, if any.

    Returns
    -------
    callable
        ``wrapped`` with ``fi_trace`` (and ``fi_init`` when the template has an init),
        or, while ``FLASHINFER_TRACE_DUMP`` is on, a wrapper of it that writes each
        call's definition first. ``wrapped`` itself when there is no template; a broken
        template warns and leaves ``wrapped`` as it was.
    """
    fi_api = _qualified_name(original)
    if trace_template is None:
        own = _own_template(original)
        if own is None:
            return wrapped
        trace_template, fi_api = own
    try:
        fi_trace, fi_init = _trace_functions(trace_template, fi_api, original)
        target = wrapped
        if _is_trace_dump_enabled():
            target = _auto_dumping(wrapped, original, fi_trace, fi_api)
        target.fi_trace = fi_trace
        if fi_init is not None:
            target.fi_init = fi_init
        return target
    except Exception as exc:
        warnings.warn(
            f"[flashinfer] Failed to attach fi_trace to "
            f"'{getattr(original, '__qualname__', repr(original))}': "
            f"{type(exc).__name__}: {exc}\nThe function will work normally but fi_trace "
            "will be unavailable. Fix the TraceTemplate passed to @flashinfer_api(trace=...).",
            stacklevel=3,
        )
        return wrapped
