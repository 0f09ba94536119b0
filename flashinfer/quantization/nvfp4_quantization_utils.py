"""FlashInfer's module of the NVFP4 4over6 recipe; the definitions live in
``flashinfer._nvfp4_recipe`` (which the quantizers import without this package)."""

from .._nvfp4_recipe import (  # noqa: F401
    FLOAT4_E2M1_MAX,
    FLOAT8_E4M3_MAX,
    NVFP44Over6Config,
    NVFP44Over6ErrMode,
    current_nvfp4_4over6_config,
    make_nvfp4_global_scale,
    nvfp4_4over6_mode_label,
    nvfp4_e4m3_max,
    resolve_nvfp4_4over6,
)
