"""The comparison rule of replay, ``flashinfer diff`` and the reproducer
(docs/replay.md#the-comparison-rule).

One C function, ``_C.tensor_difference``, judges every pair of tensors, in one pass
over their memory: floats read exactly as doubles match when both are NaN, when they
are equal, or when ``|a - b|`` is finite and at most ``atol + rtol * |b|``; integers,
bool and packed fp4 match bit for bit; complex tensors are compared as their real and
imaginary parts. ``b`` is the reference (the recording).

Replay (``replay.compare_values``) and diff (``diff.diff_sessions``) call
:func:`tensor_difference` here; the reproducer's runtime (``repro_runtime.py``, copied
next to the script) calls it too when this package is installed where the script runs.
"""

import torch

from . import _C

__all__ = ["comparable", "is_exact", "tensor_difference", "tensors_differ"]


def comparable(tensor):
    """``tensor`` as the C rule reads it in place: detached, on the CPU, with its
    negative and conjugate bits resolved, a complex tensor as its real and imaginary
    parts (``torch.view_as_real``)."""
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def tensor_difference(a, b, rtol=1e-3, atol=1e-3):
    """How tensor ``a`` differs from the reference ``b``, by the comparison rule.

    Parameters
    ----------
    a, b : torch.Tensor
        Any device; they are compared on the CPU.
    rtol, atol : float
        Finite and non-negative.

    Returns
    -------
    dict
        ``shape``, ``dtype`` (of b), ``numel``, ``max_abs``, ``max_rel`` (over elements
        where b is not 0), ``mismatched`` (elements outside the rule) and ``diverged``;
        ``reason`` when shapes or dtypes differ (then the counts are None).

    Raises
    ------
    ValueError
        A negative or non-finite tolerance.
    """
    out = {"shape": list(b.shape), "dtype": str(b.dtype), "numel": b.numel()}
    if a.shape != b.shape or a.dtype != b.dtype:
        out.update(
            diverged=True,
            reason=f"{a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}",
            max_abs=None,
            max_rel=None,
            mismatched=None,
        )
        return out
    max_abs, max_rel, mismatched = _C.tensor_difference(comparable(a), comparable(b), rtol, atol)
    out.update(max_abs=max_abs, max_rel=max_rel, mismatched=mismatched, diverged=mismatched > 0)
    return out


_PACKED_FP4 = getattr(torch, "float4_e2m1fn_x2", None)


def is_exact(dtype):
    """Whether tensors of ``dtype`` are compared bit for bit (no tolerance): integers,
    bool and packed fp4 (two codes per byte)."""
    return not (dtype.is_floating_point or dtype.is_complex) or dtype == _PACKED_FP4


def tensors_differ(actual, expected, rtol=1e-3, atol=1e-3):
    """Replay's verdict on a replayed tensor against the recorded one: None when they
    match, else a short reason (shape, dtype, or the values by the rule)."""
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {tuple(actual.shape)} != recorded {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != recorded {expected.dtype}"
    result = tensor_difference(actual, expected, rtol, atol)
    if not result["diverged"]:
        return None
    if is_exact(actual.dtype):
        return "values differ (exact comparison)"
    return f"values differ beyond rtol={rtol}, atol={atol} (max abs diff {result['max_abs']:g})"
