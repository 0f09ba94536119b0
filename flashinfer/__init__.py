"""flashinfer-c: FlashInfer-compatible kernels with a native C logging core."""

import torch  # noqa: F401  (the C extension reads torch objects at import)

from . import (
    _kernels,  # noqa: F401
    api_logging,  # noqa: F401  (reads FLASHINFER_* at import)
)
from .autotuner import autotune
from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from .fi_trace import fi_trace as fi_trace  # the function shadows the submodule, as in FlashInfer
from .fp4_quantization import SfLayout, fp4_quantize, nvfp4_quantize
from .gemm import bmm_fp8, mm_fp4, mm_fp8, prepare_low_latency_gemm_weights
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from .version import __version__

__all__ = [
    "__version__",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "autotune",
    "bmm_fp8",
    "fi_trace",
    "fp4_quantize",
    "mm_fp4",
    "mm_fp8",
    "nvfp4_quantize",
    "prepare_low_latency_gemm_weights",
    "SfLayout",
]
