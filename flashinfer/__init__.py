"""flashinfer-c: FlashInfer-compatible kernels with a native C logging core."""

import torch  # noqa: F401  (the C extension reads torch objects at import)

from . import _C  # noqa: F401
from . import api_logging  # noqa: F401  (reads FLASHINFER_* at import)
from .version import __version__

__all__ = ["__version__"]
