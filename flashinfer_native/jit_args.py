"""Arguments that reach a compiler, a file path or an import are not data (docs/security.md).

Replay calls a registered API with a dump's arguments. That is safe for tensors and
numbers, not for an argument FlashInfer turns into a path, C++ source, a module name or
a compiler flag: ``BatchDecodeWithPagedKVCacheWrapper(..., jit_args=[...])`` writes the
generated ``.cu``/``.inc`` files into a directory its first item names, with variant
source taken from its other items, and FlashInfer compiles and loads them.

:data:`AUDIT` is the audit of the ``@flashinfer_api`` signatures of flashinfer-python
0.7.2.post1: every parameter whose name says it could be code or a path (see
:data:`SUSPECT_NAME`), what it reaches, and whether replay refuses it. A test of the
real package (``tests/flashinfer_real/test_jit_args_audit.py``) fails when a FlashInfer
version adds such a parameter that the table does not list.

A second channel: FlashInfer formats number parameters (``head_dim``, ``page_size``,
``window_left``, ...) into the names of the JIT modules it generates and into their C++
source. A dump can hold text where the API takes a number, so replay refuses a value
holding text (a string, or a list or dict with one inside) for a parameter annotated as
a number or boolean.

Both refusals are lifted by ``--allow-jit-args`` (``allow_jit_args=True``) for a dump the
user trusts.
"""

import inspect
import re
import types
import typing

__all__ = ["AUDIT", "REFUSED", "SUSPECT_NAME", "check_arguments"]

# Parameter names that may hold code, a path, a module or flags: the audit lists each
# parameter of an @flashinfer_api signature that matches.
SUSPECT_NAME = re.compile(
    r"jit|path|_dir$|^dir|uri|url|file|module|source|src|flag|include|cubin|librar|script"
    r"|command|cmd|template|code|compile|arch"
)

# parameter -> (refused by replay, APIs of flashinfer-python 0.7.2.post1, what it reaches)
AUDIT = {
    "jit_args": (
        True,
        "BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, "
        "BatchPrefillWithRaggedKVCacheWrapper, PODWithPagedKVCacheWrapper (__init__)",
        "gen_customize_*_module(*jit_args): the URI names the directory the generated "
        ".cu/.inc files are written to; the variant declarations are C++ source that is "
        "compiled and loaded",
    ),
    "jit_kwargs": (
        True,
        "BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper (__init__)",
        "keyword arguments of the same module generators",
    ),
    "jit_module": (
        True,
        "single_decode_with_kv_cache_with_jit_module, single_prefill_with_kv_cache_with_jit_module",
        "a compiled JIT module whose symbols are called",
    ),
    "source_format": (
        False,
        "B12xMoEWrapper.__init__, b12x_fused_moe",
        "a weight format name, compared with a fixed set",
    ),
    "initial_state_source": (False, "recurrent_kda", "a tensor"),
    "src_page_table": (False, "top_k_page_table_transform", "a tensor"),
    "src_slots": (False, "replayssm_materialize", "a tensor"),
    "idx_src_info": (False, "grouped_gemm_nt_masked", "a tensor"),
    "rank_src_info": (False, "grouped_gemm_nt_masked", "a tensor"),
    "barrier_flag_local": (False, "grouped_gemm_nt_masked", "a tensor"),
    "barrier_flag_multicast": (False, "grouped_gemm_nt_masked", "a tensor"),
    "tma_descriptor_workspace": (False, "bsa_attn_sm120_blk64_sage_fwd", "a tensor"),
    "profiler_buffer": (False, "BatchAttention.run, BatchMLAPagedAttentionWrapper.run", "a tensor"),
    "include_shared_expert": (False, "create_allreduce_fusion_workspace", "a boolean"),
    "layout_code": (False, "allreduce_fusion", "an integer selecting a layout"),
    "profile_ids": (False, "cutlass_fused_moe", "a list of integers (tactics)"),
    "use_profiler": (False, "BatchAttention.plan, BatchMLAPagedAttentionWrapper.plan", "a boolean"),
    "partition_resources": (
        False,
        "prims_ts_*_moe_partitioned",
        "a MoePartitionResources object (a dump can only hold its repr)",
    ),
}

# What replay refuses unless --allow-jit-args.
REFUSED = frozenset(name for name, (refused, _, _) in AUDIT.items() if refused)

_NUMBER_TYPES = (int, float, bool)
_NUMBER_NAMES = frozenset({"int", "float", "bool", "None", "NoneType"})


def _numeric_annotation(annotation):
    """True for an annotation admitting only numbers, booleans and None (``int``,
    ``Optional[float]``, ``int | None``, and their string forms)."""
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        parts = re.split(r"[\s|\[\],]+", annotation.replace("typing.", ""))
        parts = [p for p in parts if p and p not in ("Optional", "Union")]
        return bool(parts) and all(p in _NUMBER_NAMES for p in parts)
    if annotation in _NUMBER_TYPES:
        return True
    args = typing.get_args(annotation)
    if not args or typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    return all(a in _NUMBER_TYPES or a is type(None) for a in args)


def _holds_text(value):
    """A string, a dict, or a list/tuple with one inside: what formats into a path or
    source as text of the dump's choosing."""
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, (str, bytes, dict)):
            return True
        if isinstance(value, (list, tuple)):
            stack.extend(value)
    return False


_ALLOW = (
    "replay refuses it unless you pass --allow-jit-args (Python: allow_jit_args=True) "
    "for a dump you trust"
)


def check_arguments(function, args, kwargs, where):
    """Refuse a call whose arguments reach FlashInfer's JIT (see the module docstring).

    Parameters
    ----------
    function : callable
        What is called with ``args``: the API replay resolved, a class (its
        ``__init__``) or a bound method; its signature names the positional arguments.
    args, kwargs : list, dict
        The arguments built from the dump.
    where : str
        The metadata file, for messages.

    Raises
    ------
    registry.ReplayRefused
        Naming the parameter and what it reaches; the message says how to allow it.
    """
    from .registry import ReplayRefused

    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    named = {}
    for parameter, value in zip(parameters, args):
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            named[parameter.name] = value
    named.update(kwargs)
    annotations = {p.name: p.annotation for p in parameters}
    for name, value in named.items():
        if name in REFUSED and value is not None:
            raise ReplayRefused(
                f"{where}: argument {name!r} reaches FlashInfer's JIT ({AUDIT[name][2]}); {_ALLOW}"
            )
        annotation = annotations.get(name, inspect.Parameter.empty)
        if _numeric_annotation(annotation) and _holds_text(value):
            raise ReplayRefused(
                f"{where}: argument {name!r} is annotated as a number but the dump holds a "
                f"{type(value).__name__}; FlashInfer formats such arguments into JIT module "
                f"names and sources, so {_ALLOW}"
            )
