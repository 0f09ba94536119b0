"""flashinfer.quantization, as FlashInfer lays it out: the FP4 quantizers
(``flashinfer.fp4_quantization``) and the NVFP4 4over6 recipe."""

from ..fp4_quantization import (  # noqa: F401
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
)
from .nvfp4_quantization_utils import (  # noqa: F401
    NVFP44Over6Config,
    NVFP44Over6ErrMode,
    current_nvfp4_4over6_config,
    resolve_nvfp4_4over6,
)
