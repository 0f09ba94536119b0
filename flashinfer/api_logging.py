"""API logging, flight recorder and replay for flashinfer.

The configuration is read from the ``FLASHINFER_*`` environment variables every time
this module is executed (first import, or a re-import after removing it from
``sys.modules``); each execution starts a fresh native logger. The work per call is
done by ``flashinfer_native._C``: this module only builds decorators and the header text.

Levels: 0 off (the decorator returns the function itself), 1 API names, 3 inputs and
outputs with tensor metadata, 5 plus tensor statistics, 10 plus the flight recorder
(every call's tensors and metadata dumped to ``FLASHINFER_DUMP_DIR``).
"""

import contextlib
import functools
import inspect
import os
import platform
import sys

import torch

from flashinfer_native import _C

from .version import __version__

_LOGGER = _C.Logger()
_API_LOG_LEVEL = _LOGGER.level

_SEP = "=" * 80


def _system_info_text():
    lines = [
        _SEP,
        f"{_LOGGER.timestamp()} FlashInfer API Logging - System Information",
        _SEP,
        f"FlashInfer version: {__version__}",
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


def _dump_banner_text():
    fmt = "safetensors" if _LOGGER.safetensors else "torch (.pt)"
    include = ", ".join(_LOGGER.include) or "(all)"
    exclude = ", ".join(_LOGGER.exclude) or "(none)"
    lines = [
        _SEP,
        "[flashinfer] WARNING: FLASHINFER_LOGLEVEL=10 (flight recorder) is on.",
        "All inputs and outputs of FlashInfer API calls are written to disk.",
        f"  dump directory: {_LOGGER.dump_dir}",
        f"  format: {fmt}",
        f"  include: {include}",
        f"  exclude: {exclude}",
        f"  caps: {_LOGGER.max_count} calls, {_LOGGER.max_size_gb:g} GB",
        _SEP,
    ]
    return "\n".join(lines) + "\n"


if _API_LOG_LEVEL > 0:
    try:
        _LOGGER.write(_system_info_text())
    except Exception as e:  # logging must never break the import
        _LOGGER.write(f"[LOGGING ERROR in system information]: {e}\n")
if _API_LOG_LEVEL >= 10:
    _LOGGER.static_meta["versions"] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "flashinfer": __version__,
    }
    sys.stderr.write(_dump_banner_text())
    sys.stderr.flush()


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


def _wrap(func):
    params, signature_text = _parameters_of(func)
    wrapper = _C.APIWrapper(func, _LOGGER, params, signature_text)
    functools.update_wrapper(wrapper, func)
    return wrapper


def flashinfer_api(func=None, *, trace=None):
    """Decorate a FlashInfer API so its calls are logged at ``FLASHINFER_LOGLEVEL``.

    Usable as ``@flashinfer_api``, ``@flashinfer_api()`` or ``@flashinfer_api(trace=...)``
    (``trace`` is accepted for compatibility and ignored).

    Parameters
    ----------
    func : callable
        The function or method to decorate.

    Returns
    -------
    callable
        At level 0, ``func`` itself. Above 0, a native wrapper that logs each call and
        otherwise behaves like ``func`` (same result, same exceptions, same name,
        docstring, ``__wrapped__`` and signature; binds as a method).

    Raises
    ------
    TypeError
        If ``func`` is not callable.
    """
    if func is None:
        return functools.partial(flashinfer_api, trace=trace)
    if isinstance(func, (staticmethod, classmethod)):
        if _API_LOG_LEVEL == 0:
            return func
        return type(func)(flashinfer_api(func.__func__))
    if not callable(func):
        raise TypeError(f"flashinfer_api expects a callable, got {type(func).__name__}")
    if _API_LOG_LEVEL == 0:
        return func
    return _wrap(func)


def load_tensors(path):
    """Load a dumped ``.pt`` or ``.safetensors`` file into a dict of tensors.

    A strict native reader: it never executes pickle code, restores the recorded
    shape, stride, dtype and ``requires_grad`` (strides of safetensors files from
    their ``__metadata__``) and memory-maps the file where it can.

    Parameters
    ----------
    path : str or os.PathLike
        The tensor file.

    Returns
    -------
    dict[str, torch.Tensor]

    Raises
    ------
    ValueError, OSError
        For a missing, truncated, corrupt or hostile file; the message names the file
        and the problem.
    """
    return _C.load_tensors(os.fspath(path))


def flush_graph_dumps():
    """Write the calls recorded while a CUDA graph was being captured.

    At level 10 no device-to-host copy may enter a graph, so calls recorded during
    capture hold references to their tensors (status ``graph_capture_pending_flush``).
    Each flush writes their current values to ``graph_flushes/flush_NNNN/`` under each
    call's directory, refreshes the call's root ``inputs``/``outputs`` files to this
    latest snapshot and appends a ``completed`` metadata line. It runs automatically
    after every ``torch.cuda.CUDAGraph.replay()``.

    Returns
    -------
    int
        The number of calls written.
    """
    return _LOGGER.flush_graph_dumps()


def clear_graph_dumps():
    """Forget the calls recorded during CUDA graph capture (drops their tensors).

    Returns
    -------
    int
        The number of calls dropped.
    """
    return _LOGGER.clear_graph_dumps()


def _install_graph_replay_hook():
    """Flush captured level-10 calls after every CUDAGraph.replay() (once per process)."""
    graph_cls = getattr(torch.cuda, "CUDAGraph", None)
    if graph_cls is None or getattr(graph_cls.replay, "_flashinfer_hook", False):
        return
    original = graph_cls.replay

    def replay(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        module = sys.modules.get(__name__)
        if module is not None and module._API_LOG_LEVEL >= 10:
            module.flush_graph_dumps()
        return result

    replay._flashinfer_hook = True
    graph_cls.replay = replay


if _API_LOG_LEVEL >= 10:
    _install_graph_replay_hook()


@contextlib.contextmanager
def _suspend_dumps():
    """Suspend level-10 dumping (replay uses it so it never writes into its input)."""
    _LOGGER.suspended += 1
    try:
        yield
    finally:
        _LOGGER.suspended -= 1


from .replay import replay_from_dump, replay_sequence  # noqa: E402  (replay uses this module)

__all__ = [
    "clear_graph_dumps",
    "flashinfer_api",
    "flush_graph_dumps",
    "load_tensors",
    "replay_from_dump",
    "replay_sequence",
]
