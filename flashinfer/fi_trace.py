"""fi_trace: flashinfer-bench definitions of FlashInfer API calls.

Every API decorated with a trace template (all of this package's APIs; see
``flashinfer.trace.attach``) has ``api.fi_trace(save_dir=None, name=None, **kwargs)``:
pass the arguments you would pass to the API and get the definition dict (name with the
model's constant sizes, ``op_type``, ``tags`` with ``fi_api:<qualified name>``,
``axes``, ``constraints``, ``inputs``, ``outputs``, ``reference``, ``check``, ``init``)
without running a kernel. ``save_dir`` writes ``<save_dir>/<name>.json``.

Auto-dump: with ``FLASHINFER_TRACE_DUMP=1`` and ``FLASHINFER_TRACE_DUMP_DIR=DIR`` set
before ``import flashinfer``, every traced API writes ``DIR/<name>.json`` on its first
call with each distinct definition name, before its kernel runs.

:func:`fi_trace` is the same for any decorated function or bound method; a bound method
passes its object as ``self``.
"""

__all__ = ["fi_trace", "register_fi_trace"]

# qualname -> TraceTemplate for functions decorated without trace= (FlashInfer's
# legacy registry; decoration looks here after the trace= argument).
_REGISTRY = {}


def register_fi_trace(qualname, spec):
    """Give the function with ``__qualname__`` ``qualname`` a trace template.

    FlashInfer's older interface; ``@flashinfer_api(trace=template)`` is the current
    one. It applies to functions decorated after this call.

    Parameters
    ----------
    qualname : str
        The function's ``__qualname__`` (``"MyWrapper.run"`` for a method).
    spec : flashinfer.trace.TraceTemplate
        Its template.
    """
    _REGISTRY[qualname] = spec


def fi_trace(func_or_method, save_dir=None, **kwargs):
    """The flashinfer-bench definition of a call of a traced FlashInfer API.

    Parameters
    ----------
    func_or_method : callable
        A traced API (``flashinfer.mm_fp4``), an unbound method
        (``BatchDecodeWithPagedKVCacheWrapper.run``) or a bound one (``wrapper.run``).
    save_dir : str or os.PathLike, optional
        Also write ``<save_dir>/<name>.json``; without it the file goes to
        ``FLASHINFER_TRACE_DUMP_DIR`` when that is set.
    **kwargs
        The API's arguments by name.

    Returns
    -------
    dict
        The definition.

    Raises
    ------
    ValueError
        If ``func_or_method`` has no trace template.
    """
    bound_to = getattr(func_or_method, "__self__", None)
    func = getattr(func_or_method, "__func__", func_or_method)
    trace = getattr(func, "fi_trace", None)
    if trace is None:
        qualname = getattr(func, "__qualname__", repr(func))
        raise ValueError(
            f"No fi_trace spec is registered for '{qualname}'. "
            "Only @flashinfer_api(trace=...)-decorated functions support fi_trace."
        )
    if bound_to is not None:
        kwargs["self"] = bound_to
    return trace(save_dir=save_dir, **kwargs)
