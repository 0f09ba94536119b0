"""The NVFP4 4over6 recipe as FlashInfer names it: its configuration, the environment
variables an omitted ``nvfp4_4over6=`` argument reads, and the scales it implies. The
arithmetic is the quantizer's (``kernels/cpu/fp4_quantize.c``)."""

import os
from dataclasses import dataclass
from enum import IntEnum

import torch

FLOAT4_E2M1_MAX = 6.0
FLOAT8_E4M3_MAX = 448.0


class NVFP44Over6ErrMode(IntEnum):
    """How the two candidates' errors are measured: sum of |d| or of d^2."""

    MAE = 0
    MSE = 1


@dataclass(frozen=True)
class NVFP44Over6Config:
    """A 4over6 recipe.

    Parameters
    ----------
    e4m3_max : int
        448 (the full E4M3 range) or 256; fixes the global scale at ``1 / (e4m3_max * 6)``.
    err_mode : NVFP44Over6ErrMode or str
        ``"MAE"`` (default) or ``"MSE"``.
    err_use_fast_math : bool
        Measure the error against ``x * global_scale`` instead of dequantizing.
    """

    e4m3_max: int = 448
    err_mode: NVFP44Over6ErrMode | str = NVFP44Over6ErrMode.MAE
    err_use_fast_math: bool = False

    def __post_init__(self):
        if self.e4m3_max not in (256, 448):
            raise ValueError("NVFP4 4over6 E4M3 max must be either 256 or 448.")
        try:
            if isinstance(self.err_mode, str):
                mode = NVFP44Over6ErrMode[self.err_mode.upper()]
            else:
                mode = NVFP44Over6ErrMode(self.err_mode)
        except (KeyError, ValueError):
            raise ValueError("NVFP4 4over6 error mode must be MAE or MSE.") from None
        object.__setattr__(self, "err_mode", mode)

    @property
    def err_mode_name(self):
        return self.err_mode.name


class _UnsetType:
    """The default of ``nvfp4_4over6``: not passed (the ``FLASHINFER_NVFP4_4OVER6*``
    environment variables then decide)."""

    def __repr__(self):
        return "<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>"

    def __reduce__(self):
        return "_UNSET"


_UNSET = _UnsetType()


def current_nvfp4_4over6_config():
    """The recipe the environment asks for, or None (``FLASHINFER_NVFP4_4OVER6`` not "1")."""
    if os.environ.get("FLASHINFER_NVFP4_4OVER6") != "1":
        return None
    use_256 = os.environ.get("FLASHINFER_NVFP4_4OVER6_E4M3_USE_256") == "1"
    return NVFP44Over6Config(
        e4m3_max=256 if use_256 else 448,
        err_mode=os.environ.get("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "MAE"),
        err_use_fast_math=os.environ.get("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH") == "1",
    )


def resolve_nvfp4_4over6(setting=_UNSET):
    """The recipe a public ``nvfp4_4over6=`` argument means: omitted, the environment's;
    None, off; a config, that one."""
    if setting is _UNSET:
        return current_nvfp4_4over6_config()
    if setting is None or isinstance(setting, NVFP44Over6Config):
        return setting
    raise TypeError(
        f"nvfp4_4over6: expected None or an NVFP44Over6Config, got {type(setting).__name__}"
    )


def nvfp4_e4m3_max(nvfp4_4over6_config):
    """The largest block scale a recipe uses (448 without one)."""
    if nvfp4_4over6_config is not None:
        return float(nvfp4_4over6_config.e4m3_max)
    return FLOAT8_E4M3_MAX


def make_nvfp4_global_scale(
    input_tensor, per_token_activation, global_scale=None, nvfp4_4over6_config=None
):
    """FlashInfer's global scale for a recipe: ``1 / (e4m3_max * 6)`` per token, the given
    one, else ``e4m3_max * 6 / amax`` (float32 max for an all-zero input)."""
    e4m3_max = nvfp4_e4m3_max(nvfp4_4over6_config)
    if per_token_activation:
        scale = 1.0 / (e4m3_max * FLOAT4_E2M1_MAX)
    elif global_scale is not None:
        scale = global_scale
    else:
        amax = input_tensor.abs().max().to(torch.float32)
        if amax == 0:
            return torch.full(
                (1,),
                torch.finfo(torch.float32).max,
                dtype=torch.float32,
                device=input_tensor.device,
            )
        return (e4m3_max * FLOAT4_E2M1_MAX / amax).reshape(1).to(input_tensor.device)
    return torch.tensor([scale], dtype=torch.float32, device=input_tensor.device)


def nvfp4_4over6_mode_label(per_token_activation, nvfp4_4over6_config):
    """A short text naming the recipe, as FlashInfer's benchmarks print it."""
    parts = ["per-token"] if per_token_activation else []
    if nvfp4_4over6_config is not None:
        parts.append(f"4over6-{nvfp4_4over6_config.err_mode_name.lower()}")
        parts.append(f"e4m3-{nvfp4_4over6_config.e4m3_max}")
        fast = nvfp4_4over6_config.err_use_fast_math
        parts.append("err-fastmath" if fast else "err-exactmath")
    return ", ".join(parts) if parts else "standard"


def _kernel_recipe(config):
    """The recipe as the C entry point takes it: None or (e4m3_max, mse, fast)."""
    if config is None:
        return None
    mse = config.err_mode == NVFP44Over6ErrMode.MSE
    return (int(config.e4m3_max), mse, bool(config.err_use_fast_math))
