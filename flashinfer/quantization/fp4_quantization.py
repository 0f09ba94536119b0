"""FlashInfer's path of the FP4 quantizers; they live in ``flashinfer.fp4_quantization``."""

from ..fp4_quantization import *  # noqa: F401,F403
from ..fp4_quantization import __all__  # noqa: F401
