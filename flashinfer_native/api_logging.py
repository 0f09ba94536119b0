"""The ``flashinfer.api_logging`` surface, served by the native core.

``install(namespace, flashinfer_version=...)`` fills a module namespace (the globals of
``flashinfer.api_logging``) with a fresh native logger configured from the
``FLASHINFER_*`` environment variables, the ``flashinfer_api`` decorator and the replay
entry points. It runs every time that module is executed, so a re-import (after
removing it from ``sys.modules``) starts a fresh logger, as SPEC 1 asks. The work per
call is done by ``flashinfer_native._C``: this module only builds decorators and the
header text.

Levels: 0 off (the decorator returns the function itself), 1 API names, 3 inputs and
outputs with tensor metadata, 5 plus tensor statistics, 10 plus the flight recorder
(every call's tensors and metadata dumped to ``FLASHINFER_DUMP_DIR``).
"""

import functools
import inspect
import os
import platform
import sys

import torch

from . import _C, distributed, registry, replay
from .dumpdir import load_tensors

__all__ = ["install"]

_SEP = "=" * 80

# What a flashinfer.api_logging module exports once install() ran.
PUBLIC_NAMES = [
    "clear_graph_dumps",
    "flashinfer_api",
    "flush_graph_dumps",
    "load_tensors",
    "replay_from_dump",
    "replay_sequence",
]


def _system_info_text(logger, flashinfer_version):
    lines = [
        _SEP,
        f"{logger.timestamp()} FlashInfer API Logging - System Information",
        _SEP,
        f"FlashInfer version: {flashinfer_version}",
    ]
    cuda_version = torch.version.cuda
    lines.append(
        f"CUDA toolkit version: {cuda_version if cuda_version else '<unavailable - CPU-only build?>'}"
    )
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken cuDNN install must not stop logging
        cudnn = None
    lines.append(f"cuDNN version: {cudnn if cudnn else '<not available>'}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        lines.append(f"Number of GPUs: {count}")
        for i in range(count):
            major, minor = torch.cuda.get_device_capability(i)
            lines.append(f"  GPU {i}: {torch.cuda.get_device_name(i)}")
            lines.append(f"    Compute capability: {major}.{minor} (SM{major}{minor})")
    else:
        lines.append("CUDA: Not available (CPU-only mode)")
    lines.append(f"PyTorch version: {torch.__version__}")
    lines.append(_SEP)
    return "\n".join(lines) + "\n\n"


def _dump_banner_text(logger):
    fmt = "safetensors" if logger.safetensors else "torch (.pt)"
    include = ", ".join(logger.include) or "(all)"
    exclude = ", ".join(logger.exclude) or "(none)"
    ring = logger.ring_banner()
    what, caps = ring or (
        "All inputs and outputs of FlashInfer API calls are written to disk.",
        f"  caps: {logger.max_count} calls, {logger.max_size_gb:g} GB",
    )
    lines = [
        _SEP,
        "[flashinfer] WARNING: FLASHINFER_LOGLEVEL=10 (flight recorder) is on.",
        what,
        f"  dump directory: {logger.dump_dir}",
        f"  format: {fmt}",
        f"  include: {include}",
        f"  exclude: {exclude}",
        caps,
        _SEP,
    ]
    return "\n".join(lines) + "\n"


def _parameters_of(func):
    """(name, kind, has_default, default) per parameter, and str(signature)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None, None
    params = tuple(
        (
            p.name,
            int(p.kind),
            p.default is not inspect.Parameter.empty,
            None if p.default is inspect.Parameter.empty else p.default,
        )
        for p in sig.parameters.values()
    )
    return params, str(sig)


def _make_decorator(logger, attach_trace=None):
    level = logger.level

    def wrap(func):
        params, signature_text = _parameters_of(func)
        wrapper = _C.APIWrapper(func, logger, params, signature_text)
        functools.update_wrapper(wrapper, func)
        return wrapper

    def flashinfer_api(func=None, *, trace=None):
        """Decorate a FlashInfer API so its calls are logged at ``FLASHINFER_LOGLEVEL``.

        Usable as ``@flashinfer_api``, ``@flashinfer_api()`` or
        ``@flashinfer_api(trace=...)``.

        Parameters
        ----------
        func : callable
            The function or method to decorate.
        trace : optional
            An fi_trace template (or a callable choosing one), handed with the decorated
            object to the ``attach_trace`` given to ``install``; ignored without one.

        Returns
        -------
        callable
            At level 0, ``func`` itself. Above 0, a native wrapper that logs each call and
            otherwise behaves like ``func`` (same result, same exceptions, same name,
            docstring, ``__wrapped__`` and signature; binds as a method). What
            ``attach_trace`` returns for it, when ``install`` was given one. At every
            level the result is registered as a replayable API
            (``flashinfer_native.registry``): replay calls nothing else.

        Raises
        ------
        TypeError
            If ``func`` is not callable.
        """
        if func is None:
            return functools.partial(flashinfer_api, trace=trace)
        if isinstance(func, (staticmethod, classmethod)):
            if level == 0:
                registry.register(func.__func__, func.__func__)
                return func
            return type(func)(flashinfer_api(func.__func__, trace=trace))
        if not callable(func):
            raise TypeError(f"flashinfer_api expects a callable, got {type(func).__name__}")
        decorated = func if level == 0 else wrap(func)
        if attach_trace is not None:
            decorated = attach_trace(decorated, func, trace)
        registry.register(func, decorated)  # replay calls only registered APIs (SPEC 5.1a)
        return decorated

    return flashinfer_api


def _graph_functions(logger):
    def flush_graph_dumps(synchronize=True):
        """Write the calls recorded while a CUDA graph was being captured.

        At level 10 no device-to-host copy may enter a graph, so calls recorded during
        capture hold references to their tensors (status ``graph_capture_pending_flush``).
        Each flush writes their current values to ``graph_flushes/flush_NNNN/`` under
        each call's directory, refreshes the call's root ``inputs``/``outputs`` files to
        this latest snapshot and appends a ``completed`` metadata line. It runs
        automatically after every ``torch.cuda.CUDAGraph.replay()``.

        Parameters
        ----------
        synchronize : bool
            Accepted for FlashInfer's signature; the tensors are always read after the
            device finished writing them.

        Returns
        -------
        int
            The number of calls written.
        """
        return logger.flush_graph_dumps()

    def clear_graph_dumps():
        """Forget the calls recorded during CUDA graph capture (drops their tensors).

        Returns
        -------
        int
            The number of calls dropped.
        """
        return logger.clear_graph_dumps()

    return flush_graph_dumps, clear_graph_dumps


def _install_graph_replay_hook(module_name):
    """Flush captured level-10 calls after every CUDAGraph.replay() (once per process).

    The hook looks the api_logging module up at each replay, so the logger of the
    latest import is the one flushed.
    """
    graph_cls = getattr(torch.cuda, "CUDAGraph", None)
    if graph_cls is None or getattr(graph_cls.replay, "_flashinfer_hook", False):
        return
    original = graph_cls.replay

    def replay_graph(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "_API_LOG_LEVEL", 0) >= 10:
            module.flush_graph_dumps()
        return result

    replay_graph._flashinfer_hook = True
    graph_cls.replay = replay_graph


def install(namespace, flashinfer_version, attach_trace=None):
    """Make ``namespace`` (a module's globals) a ``flashinfer.api_logging``.

    Creates a native logger from the environment, writes the system-information header
    (level > 0) and the flight-recorder banner (level 10), and defines
    ``flashinfer_api``, ``load_tensors``, ``flush_graph_dumps``, ``clear_graph_dumps``,
    ``replay_from_dump`` and ``replay_sequence`` in it.

    Parameters
    ----------
    namespace : dict
        The globals of the module being executed; ``__name__`` names it.
    flashinfer_version : str
        The version of the flashinfer package served (header and dump metadata).
    attach_trace : callable, optional
        ``attach_trace(decorated, func, trace) -> callable``: called for every decorated
        API with what ``flashinfer_api`` made of ``func`` (``func`` itself at level 0, else
        its native wrapper) and the decorator's ``trace=`` argument (None when not
        given); what it returns is what the decorator returns. It attaches ``fi_trace`` /
        ``fi_init``. Without it ``trace=`` is accepted and ignored.
    """
    logger = _C.Logger()
    level = logger.level
    if level > 0:
        try:
            logger.write(_system_info_text(logger, flashinfer_version))
        except Exception as e:  # logging must never break the import
            logger.write(f"[LOGGING ERROR in system information]: {e}\n")
    if level >= 10:
        logger.static_meta["versions"] = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "flashinfer": flashinfer_version,
        }
        logger.static_meta["record_extras"] = distributed.record_extras
        sys.stderr.write(_dump_banner_text(logger))
        sys.stderr.flush()
        _install_graph_replay_hook(namespace["__name__"])
    flush_graph_dumps, clear_graph_dumps = _graph_functions(logger)
    namespace.update(
        _LOGGER=logger,
        _API_LOG_LEVEL=level,
        _NATIVE_CORE=True,
        _suspend_dumps=replay.suspended_dumps,
        flashinfer_api=_make_decorator(logger, attach_trace),
        load_tensors=load_tensors,
        flush_graph_dumps=flush_graph_dumps,
        clear_graph_dumps=clear_graph_dumps,
        replay_from_dump=replay.replay_from_dump,
        replay_sequence=replay.replay_sequence,
        __all__=list(PUBLIC_NAMES),
    )


# ------------------------------------------------------------ an installed FlashInfer


def _trace_dump_enabled():
    """FlashInfer's FLASHINFER_TRACE_DUMP switch, as its trace package reads it."""
    try:
        from flashinfer.trace.template import _is_trace_dump_enabled
    except Exception:  # noqa: BLE001 - an older FlashInfer: read the variable itself
        return os.environ.get("FLASHINFER_TRACE_DUMP", "0") not in ("0", "")
    return _is_trace_dump_enabled()


def flashinfer_trace_attacher(attach_fi_trace):
    """An ``attach_trace`` for ``install`` over FlashInfer's own ``_attach_fi_trace``.

    FlashInfer's function sets ``fi_trace`` / ``fi_init`` on the object it is given and,
    for a template, returns a Python function around it that writes a trace file per
    call when ``FLASHINFER_TRACE_DUMP`` is set. That function is kept where FlashInfer
    itself would run it: at level 0 (the API is not wrapped by the core) and when
    ``FLASHINFER_TRACE_DUMP`` is set at decoration time. Otherwise the native wrapper,
    carrying ``fi_trace`` / ``fi_init``, is what the decorator returns.
    """

    def attach_trace(decorated, func, trace):
        result = attach_fi_trace(decorated, func, trace)
        if decorated is func or result is decorated:
            return result
        return result if _trace_dump_enabled() else decorated

    return attach_trace


def serve_flashinfer(namespace, flashinfer_version):
    """Put the native logging surface over an executed FlashInfer ``api_logging``.

    Everything FlashInfer's module defined and the core does not replace stays
    (``flashinfer_experimental_api`` finds the native ``flashinfer_api`` through the
    module's globals); its ``__all__``, if it had none, stays absent.

    Parameters
    ----------
    namespace : dict
        The globals of FlashInfer's executed ``flashinfer.api_logging``.
    flashinfer_version : str
        FlashInfer's version (header and dump metadata).
    """
    had_all = "__all__" in namespace
    attach_fi_trace = namespace.get("_attach_fi_trace")
    install(
        namespace,
        flashinfer_version,
        attach_trace=flashinfer_trace_attacher(attach_fi_trace) if attach_fi_trace else None,
    )
    if not had_all:
        del namespace["__all__"]
