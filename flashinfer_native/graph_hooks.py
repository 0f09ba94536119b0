"""CUDA-graph hooks of the level-10 recorder, installed as FlashInfer installs them.

While a CUDA graph is captured no device-to-host copy may run, so level 10 records the
calls made during capture with references to their tensors and writes them later. At
level 10 ``install`` wraps three methods of ``torch.cuda.CUDAGraph``:

- ``capture_begin``/``capture_end`` keep a stack of the graphs being captured, so each
  recorded call belongs to the graph it was captured into;
- ``replay`` writes, after each replay, a snapshot of the calls of that graph only.

Each wrapper keeps the method it replaced under FlashInfer's attribute names
(``_flashinfer_original_replay`` ...), so a re-import wraps the true original once, and
``restore`` (a re-import below level 10) puts the originals back. ``install`` also
registers, once per process, an ``atexit`` flush and a SIGTERM handler that flushes
and then chains to the handler it replaced.
"""

import atexit
import contextlib
import functools
import os
import signal
import sys

import torch

__all__ = ["current_graph", "install", "restore"]

_HOOKED = ("replay", "capture_begin", "capture_end")

# id() of the torch.cuda.CUDAGraph objects being captured, innermost last.
_CAPTURE_STACK = []
_autoflush_installed = False


def _original_key(method):
    return f"_flashinfer_original_{method}"


def _graph_class():
    try:
        return torch.cuda.CUDAGraph
    except Exception:  # a torch without the CUDA module: nothing to hook
        return None


def current_graph():
    """id() of the innermost CUDA graph being captured, or None."""
    return _CAPTURE_STACK[-1] if _CAPTURE_STACK else None


def _drop(graph_id):
    """Remove the innermost entry of graph_id (a capture that ended or failed)."""
    for i in range(len(_CAPTURE_STACK) - 1, -1, -1):
        if _CAPTURE_STACK[i] == graph_id:
            del _CAPTURE_STACK[i]
            return


def _recording_module(module_name):
    """The api_logging module of that name when it records at level 10, else None."""
    module = sys.modules.get(module_name)
    return module if module is not None and getattr(module, "_API_LOG_LEVEL", 0) >= 10 else None


def _tell_logger(module_name):
    """Passes the graph being captured to the recorder of the current import."""
    module = _recording_module(module_name)
    if module is not None:
        module._LOGGER.capture_graph = current_graph()


def _hooks(module_name, originals):
    def replay(self, *args, **kwargs):
        result = originals["replay"](self, *args, **kwargs)
        module = _recording_module(module_name)
        if module is not None:
            module._flush_logged("CUDAGraph.replay", graph_id=id(self))
        return result

    def capture_begin(self, *args, **kwargs):
        _CAPTURE_STACK.append(id(self))
        _tell_logger(module_name)
        try:
            return originals["capture_begin"](self, *args, **kwargs)
        except BaseException:
            _drop(id(self))
            _tell_logger(module_name)
            raise

    def capture_end(self, *args, **kwargs):
        try:
            return originals["capture_end"](self, *args, **kwargs)
        finally:
            _drop(id(self))
            _tell_logger(module_name)

    return {"replay": replay, "capture_begin": capture_begin, "capture_end": capture_end}


def install(module_name):
    """Wrap CUDAGraph's replay/capture_begin/capture_end for the api_logging module
    ``module_name`` (replacing the wrappers of an earlier import), and register the
    exit-time flushes once per process."""
    graph_cls = _graph_class()
    if graph_cls is None:
        return
    originals = {}
    for method in _HOOKED:
        current = getattr(graph_cls, method)
        originals[method] = getattr(current, _original_key(method), current)
    for method, hook in _hooks(module_name, originals).items():
        functools.update_wrapper(hook, originals[method])
        setattr(hook, _original_key(method), originals[method])
        setattr(graph_cls, method, hook)
    _install_autoflush(module_name)


def restore():
    """Put CUDAGraph's own methods back and forget the capture stack."""
    graph_cls = _graph_class()
    if graph_cls is None:
        return
    for method in _HOOKED:
        original = getattr(getattr(graph_cls, method), _original_key(method), None)
        if original is not None:
            setattr(graph_cls, method, original)
    _CAPTURE_STACK.clear()


def _install_autoflush(module_name):
    """atexit and SIGTERM flushes of the calls still pending (once per process): an
    inference server stopped by its launcher keeps the snapshot of its last replay."""
    global _autoflush_installed
    if _autoflush_installed:
        return
    _autoflush_installed = True

    def flush(reason):
        module = _recording_module(module_name)
        if module is not None:
            module._flush_logged(reason)

    atexit.register(flush, "atexit")
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        flush("SIGTERM")
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    # only the main thread may set handlers; atexit still covers a normal exit
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, on_sigterm)
