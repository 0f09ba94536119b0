"""The ``flashinfer.api_logging`` surface, served by the native core.

``install(namespace, flashinfer_version=..., attach_trace=None)`` fills a module
namespace (the globals of ``flashinfer.api_logging``) with a fresh native logger
configured from the ``FLASHINFER_*`` environment variables, the ``flashinfer_api``
decorator (which hands each function to the served package's trace attacher, when
given), the replay entry points and the CUDA-graph dump functions (``graph_hooks``). It
runs every time that module is executed, so a re-import (after removing it from
``sys.modules``) starts a fresh logger, as docs/logging.md#environment-variables says. The work per call is done by
``flashinfer_native._C``: this module only builds decorators and the header text.

Levels: 0 off (the decorator returns the function itself), 1 API names, 3 inputs and
outputs with tensor metadata, 5 plus tensor statistics, 10 plus the flight recorder
(every call's tensors and metadata dumped to ``FLASHINFER_DUMP_DIR``).
"""

import functools
import inspect
import json
import os
import sys
import time

import torch

from . import _C, distributed, graph_hooks, registry, replay
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


def _system_info(flashinfer_version):
    """The facts of the system-information header: versions and GPUs."""
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken cuDNN install must not stop logging
        cudnn = None
    gpus = None
    if torch.cuda.is_available():
        gpus = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            gpus.append(
                {"name": torch.cuda.get_device_name(i), "compute_capability": [major, minor]}
            )
    return {
        "flashinfer_version": flashinfer_version,
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn,
        "gpus": gpus,
        "torch_version": torch.__version__,
    }


def _system_info_text(logger, info):
    lines = [
        _SEP,
        f"{logger.timestamp()} FlashInfer API Logging - System Information",
        _SEP,
        f"FlashInfer version: {info['flashinfer_version']}",
        f"CUDA toolkit version: {info['cuda_version'] or '<unavailable - CPU-only build?>'}",
        f"cuDNN version: {info['cudnn_version'] or '<not available>'}",
    ]
    if info["gpus"] is not None:
        lines.append(f"Number of GPUs: {len(info['gpus'])}")
        for i, gpu in enumerate(info["gpus"]):
            major, minor = gpu["compute_capability"]
            lines.append(f"  GPU {i}: {gpu['name']}")
            lines.append(f"    Compute capability: {major}.{minor} (SM{major}{minor})")
    else:
        lines.append("CUDA: Not available (CPU-only mode)")
    lines.append(f"PyTorch version: {info['torch_version']}")
    lines.append(_SEP)
    return "\n".join(lines) + "\n\n"


def _system_info_json(info):
    """The header as one JSON record (FLASHINFER_LOGFORMAT=json). ``native_core: true``
    says the native core writes this log (docs/logging.md#json-log): FlashInfer's own
    decorator writes no JSON log, so a worker whose switch did not take effect shows none."""
    record = {"event": "system_info", "timestamp": round(time.time(), 6), "pid": os.getpid()}
    return json.dumps(dict(record, **info, native_core=True)) + "\n"


def _dump_banner_text(logger):
    """The level-10 warning FlashInfer prints on stdout at import, line for line, then
    what the ring recorder (FLASHINFER_DUMP_RING, ours) keeps, when it is on."""
    lines = [
        _SEP,
        "WARNING: FlashInfer API Logging is set to Level 10 (Tensor Dumping).\n"
        "This will dump ALL input and outputs including tensors for FlashInfer APIs to disk in\n"
        "the configured dump directory. Ensure that you are NOT processing sensitive data\n"
        "or that the dump directory is secure. To disable dumping, unset FLASHINFER_LOGLEVEL or\n"
        "set it to below 10. For more information, see https://docs.flashinfer.ai/logging.html",
        f"Current dump directory is: {logger.dump_dir}",
    ]
    if logger.safetensors:
        lines.append(
            "\u26a0\ufe0f  SAFETENSORS mode enabled: tensor stride/non-contiguity will NOT be "
            "preserved.\n    Tensors will be saved as contiguous. Use torch.save (default) to "
            "preserve strides."
        )
    if logger.include:
        lines.append(f"Include filter: {list(logger.include)}")
    if logger.exclude:
        lines.append(f"Exclude filter: {list(logger.exclude)}")
    lines += [
        "CUDA graph replay hook enabled: flush_graph_dumps() will run after every "
        "torch.cuda.CUDAGraph.replay().",
        "CUDA graph capture stores tensor references and materializes snapshots after every "
        "replay.",
        *(logger.ring_banner() or ()),
        _SEP,
    ]
    return "\n".join(lines) + "\n"


def _print_banner(text):
    """print() as FlashInfer does; an unencodable stdout gets the text with replacements."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        encoding = getattr(sys.stdout, "encoding", None) or "ascii"
        sys.stdout.write(text.encode(encoding, "replace").decode(encoding))
    sys.stdout.flush()


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
            ``attach_trace`` returns for it, when ``install`` was given one (the mirror's:
            the same object with ``fi_trace``, or a trace-dumping wrapper of it while
            ``FLASHINFER_TRACE_DUMP`` is on). At every level the result is registered as
            a replayable API (``flashinfer_native.registry``): replay calls nothing else.

        Raises
        ------
        TypeError
            If ``func`` is not callable.
        """
        if func is None:
            return functools.partial(flashinfer_api, trace=trace)
        if isinstance(func, (staticmethod, classmethod)):
            # the inner call registers the function (level 0 included)
            inner = flashinfer_api(func.__func__, trace=trace)
            return func if inner is func.__func__ else type(func)(inner)
        if not callable(func):
            raise TypeError(f"flashinfer_api expects a callable, got {type(func).__name__}")
        decorated = func if level == 0 else wrap(func)
        # the trace attacher runs at decoration time only: level 0 still costs nothing
        # per call unless it returned a wrapper
        if attach_trace is not None:
            decorated = attach_trace(decorated, func, trace)
        registry.register(func, decorated)  # replay calls only registered APIs (docs/security.md)
        return decorated

    return flashinfer_api


def _graph_functions(logger):
    """flush_graph_dumps, clear_graph_dumps and the private helpers of graph_hooks."""

    def _flush_graph_dumps(synchronize=True, graph_id=None):
        if logger.pending_graph_dumps(graph_id) == 0:
            return 0
        if synchronize and torch.cuda.is_available():
            torch.cuda.synchronize()
        return logger.flush_graph_dumps(graph_id)

    def flush_graph_dumps(synchronize=True):
        """Write the calls recorded while a CUDA graph was being captured.

        At level 10 no device-to-host copy may enter a graph, so calls recorded during
        capture hold references to their tensors (status ``graph_capture_pending_flush``).
        A flush writes their current values to ``graph_flushes/flush_NNNN/`` under each
        call's directory (with its own ``metadata.jsonl``), refreshes the call's root
        ``inputs``/``outputs`` files to this latest snapshot and appends metadata lines
        with ``graph_capture_flushed``. ``CUDAGraph.replay()`` flushes the calls of the
        replayed graph by itself; the pending calls are also flushed at exit and on
        SIGTERM.

        Parameters
        ----------
        synchronize : bool
            Synchronize CUDA first, so the latest replay has finished (default True).

        Returns
        -------
        int
            The number of entries written: one per inputs and one per outputs of each
            pending call.
        """
        return _flush_graph_dumps(synchronize=synchronize)

    def clear_graph_dumps():
        """Forget the calls recorded during CUDA graph capture (drops their tensors).

        Returns
        -------
        int
            The number of pending entries dropped (inputs and outputs of each call).
        """
        return logger.clear_graph_dumps()

    def _flush_logged(reason, graph_id=None):
        """A flush whose outcome goes to the log (replay hook, atexit, SIGTERM)."""
        try:
            n = _flush_graph_dumps(graph_id=graph_id)
        except Exception as exc:
            logger.write(f"flush_graph_dumps ({reason}) failed: {exc}\n")
            return
        if n > 0:
            logger.write(f"flush_graph_dumps ({reason}): wrote {n} pending entries\n")

    return {
        "flush_graph_dumps": flush_graph_dumps,
        "clear_graph_dumps": clear_graph_dumps,
        "_flush_graph_dumps": _flush_graph_dumps,
        "_flush_logged": _flush_logged,
        "_restore_cuda_graph_hooks": graph_hooks.restore,
    }


def install(namespace, flashinfer_version, attach_trace=None):
    """Make ``namespace`` (a module's globals) a ``flashinfer.api_logging``.

    Creates a native logger from the environment, writes the system-information header
    (level > 0) and prints the flight-recorder warning on stdout (level 10), installs
    the CUDA-graph hooks of ``graph_hooks`` (level 10; an import below 10 removes them),
    and defines
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
            info = _system_info(flashinfer_version)
            if logger.log_format == "json":
                logger.write(_system_info_json(info))
            else:
                logger.write(_system_info_text(logger, info))
        except Exception as e:  # logging must never break the import
            logger.write(f"[LOGGING ERROR in system information]: {e}\n")
    if level >= 10:
        logger.static_meta["versions"] = {
            "torch": torch.__version__,
            "python": sys.version,
            "flashinfer": flashinfer_version,
        }
        logger.static_meta["record_extras"] = distributed.record_extras
        _print_banner(_dump_banner_text(logger))
    namespace.update(
        _LOGGER=logger,
        _API_LOG_LEVEL=level,
        _NATIVE_CORE=True,
        _suspend_dumps=replay.suspended_dumps,
        flashinfer_api=_make_decorator(logger, attach_trace),
        load_tensors=load_tensors,
        replay_from_dump=replay.replay_from_dump,
        replay_sequence=replay.replay_sequence,
        __all__=list(PUBLIC_NAMES),
        **_graph_functions(logger),
    )
    if level >= 10:
        graph_hooks.install(namespace["__name__"])
    else:
        graph_hooks.restore()


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
