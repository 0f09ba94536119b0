"""flashinfer_native: FlashInfer's API logging, flight recorder and replay on a native C core.

The C extension ``flashinfer_native._C`` holds the decorated-function type, the log
text, tensor statistics, the recorder and the PyTorch-zip/safetensors writers and
readers. It serves the ``flashinfer`` mirror package of this repository, and an
installed FlashInfer (``flashinfer-python``) when switched on.
"""

from .version import __version__

__all__ = ["__version__", "load_session", "load_tensors"]


def __getattr__(name):
    """``load_session`` (``flashinfer_native.calls``) and ``load_tensors``
    (``flashinfer_native.dumpdir``), imported on first use: the start-up hook imports this
    package in every process, and those need torch and the extension."""
    if name == "load_session":
        from .calls import load_session

        return load_session
    if name == "load_tensors":
        from .dumpdir import load_tensors

        return load_tensors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
