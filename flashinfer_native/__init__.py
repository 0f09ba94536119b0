"""flashinfer_native: FlashInfer's API logging, flight recorder and replay on a native C core.

The C extension ``flashinfer_native._C`` holds the decorated-function type, the log
text, tensor statistics, the recorder and the PyTorch-zip/safetensors writers and
readers. It serves the ``flashinfer`` mirror package of this repository, and an
installed FlashInfer (``flashinfer-python``) when switched on.
"""

__version__ = "0.1.0"
