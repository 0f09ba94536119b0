"""flashinfer-c: FlashInfer-compatible kernels with a native C logging core."""

import torch  # noqa: F401  (the C extension reads torch objects at import)

from . import (
    _kernels,  # noqa: F401
    api_logging,  # noqa: F401  (reads FLASHINFER_* at import)
    sparse,  # noqa: F401  (flashinfer.sparse.BlockSparseAttentionWrapper, as in FlashInfer)
)
from .activation import (
    gelu_and_mul,
    gelu_tanh_and_mul,
    silu_and_mul,
    silu_and_mul_scaled_nvfp4_experts_quantize,
)
from .autotuner import autotune
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
    single_decode_with_kv_cache,
)
from .fi_trace import fi_trace as fi_trace  # the function shadows the submodule, as in FlashInfer
from .fp4_quantization import (
    SfLayout,
    block_scale_interleave,
    e2m1_and_ufp8sf_scale_to_float,
    fp4_quantize,
    mxfp4_dequantize,
    mxfp4_dequantize_host,
    mxfp4_quantize,
    nvfp4_batched_quantize,
    nvfp4_block_scale_interleave,
    nvfp4_kv_dequantize,
    nvfp4_kv_quantize,
    nvfp4_quantize,
    scaled_fp4_grouped_quantize,
    silu_and_mul_nvfp4_quantize,
)
from .gemm import bmm_fp8, mm_fp4, mm_fp8, prepare_low_latency_gemm_weights
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .version import __version__

__all__ = [
    "__version__",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "autotune",
    "block_scale_interleave",
    "e2m1_and_ufp8sf_scale_to_float",
    "fast_decode_plan",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "mxfp4_dequantize",
    "mxfp4_dequantize_host",
    "mxfp4_quantize",
    "nvfp4_batched_quantize",
    "nvfp4_block_scale_interleave",
    "nvfp4_kv_dequantize",
    "nvfp4_kv_quantize",
    "scaled_fp4_grouped_quantize",
    "silu_and_mul",
    "silu_and_mul_nvfp4_quantize",
    "silu_and_mul_scaled_nvfp4_experts_quantize",
    "bmm_fp8",
    "fi_trace",
    "fp4_quantize",
    "mm_fp4",
    "mm_fp8",
    "nvfp4_quantize",
    "prepare_low_latency_gemm_weights",
    "SfLayout",
]
