"""The runtime of a reproducer written by ``flashinfer repro`` (docs/triage.md).

``flashinfer repro`` copies this file, unchanged, next to the ``repro.py`` it writes,
which imports what it uses from here (``from repro_runtime import load, compare``): the
script itself holds only the recorded calls. It needs ``torch`` alone.

Tensors are judged by the comparison rule of replay and ``flashinfer diff``
(docs/replay.md#the-comparison-rule): through the core's C function when
``flashinfer_native`` is installed where the script runs, else through
:func:`torch_difference`, the same rule in torch's float64 (tests/test_compare.py holds
the two to the same counts on values around the tolerance and the special values).
"""

import math
import os
import traceback

import torch

try:
    from flashinfer_native.compare import tensor_difference as core_difference
except ImportError:  # a machine with FlashInfer but without the core
    core_difference = None

__all__ = [
    "check_exception",
    "compare",
    "compare_tensor",
    "difference",
    "exact",
    "load",
    "on_device",
    "torch_difference",
]

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, device):
    """The tensors saved in data/NAME.pt next to this file, on ``device`` with their
    recorded strides (``torch.load(weights_only=True)``: no pickled code runs)."""
    path = os.path.join(HERE, "data", name + ".pt")
    return torch.load(path, map_location=device, weights_only=True)


def on_device(recorded, device):
    """A recorded ``torch.device``, moved to the run device when their kinds differ."""
    recorded = torch.device(recorded)
    return recorded if recorded.type == device.type else device


_PACKED_FP4 = getattr(torch, "float4_e2m1fn_x2", None)


def exact(dtype):
    """Whether tensors of ``dtype`` match bit for bit: integers, bool, packed fp4."""
    return not (dtype.is_floating_point or dtype.is_complex) or dtype == _PACKED_FP4


def _real_cpu(tensor):
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _bytes(tensor):
    tensor = tensor.contiguous()
    return (tensor.reshape(1) if tensor.dim() == 0 else tensor).view(torch.uint8)


def _largest(values):
    values = values[~torch.isnan(values)]
    return values.max().item() if values.numel() else 0.0


def torch_difference(actual, expected, rtol, atol):
    """``(max_abs, max_rel, mismatched)`` of ``actual`` against the reference ``expected``
    (same shape and dtype) by the comparison rule, in torch's float64: floats match when
    both are NaN, equal, or ``|a - b|`` is finite and at most ``atol + rtol * |b|``
    (``torch.isclose(equal_nan=True)``); integers, bool and packed fp4 bit for bit;
    complex as real and imaginary parts. ``max_rel`` is over elements where b is not 0."""
    if not (math.isfinite(rtol) and rtol >= 0 and math.isfinite(atol) and atol >= 0):
        raise ValueError(
            f"rtol and atol must be finite and non-negative (rtol={rtol:g}, atol={atol:g})"
        )
    a, b = _real_cpu(actual), _real_cpu(expected)
    if a.numel() == 0:
        return 0.0, 0.0, 0
    if not exact(a.dtype):
        x, y = a.to(torch.float64), b.to(torch.float64)
        mismatched = int((~torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)).sum())
        differ = x != y
    else:
        width = a.element_size()
        a_bytes, b_bytes = (_bytes(t).reshape(-1, width) for t in (a, b))
        differ = (a_bytes != b_bytes).any(dim=1).reshape(a.shape)
        mismatched = int(differ.sum())
        if a.dtype == _PACKED_FP4:  # two codes per byte: no value to subtract
            return 0.0, 0.0, mismatched
        x, y = a.to(torch.float64), b.to(torch.float64)
    d = (x - y).abs()[differ]
    y = y.abs()[differ]
    return _largest(d), _largest(d[y != 0] / y[y != 0]), mismatched


def difference(actual, expected, rtol, atol):
    """``(max_abs, max_rel, mismatched)`` by the core's C function when it is installed,
    else by :func:`torch_difference`."""
    if core_difference is not None:
        d = core_difference(actual, expected, rtol, atol)
        return d["max_abs"], d["max_rel"], d["mismatched"]
    return torch_difference(actual, expected, rtol, atol)


def compare_tensor(where, actual, expected, rtol, atol):
    """Print how a tensor compares with the recorded one; True when it matches."""
    if not isinstance(actual, torch.Tensor):
        print(f"  {where}: expected a tensor, got {type(actual).__name__}")
        return False
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        print(
            f"  {where}: got {actual.dtype} {tuple(actual.shape)}, "
            f"recorded {expected.dtype} {tuple(expected.shape)}"
        )
        return False
    max_abs, max_rel, bad = difference(actual, expected, rtol, atol)
    shape, numel = tuple(actual.shape), actual.numel()
    if exact(actual.dtype):
        print(f"  {where}: {actual.dtype} {shape}: {bad} of {numel} elements differ")
    else:
        print(
            f"  {where}: {actual.dtype} {shape}: max abs diff {max_abs:.6g}, "
            f"max rel diff {max_rel:.6g}, {bad} of {numel} elements outside "
            f"rtol={rtol:g}, atol={atol:g}"
        )
    return bad == 0


def compare(where, actual, expected, rtol, atol):
    """Print how a value compares with the recorded one; True when it matches."""
    if isinstance(expected, torch.Tensor):
        return compare_tensor(where, actual, expected, rtol, atol)
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            print(f"  {where}: expected {len(expected)} items, got {type(actual).__name__}")
            return False
        pairs = enumerate(zip(actual, expected))
        return all([compare(f"{where}[{i}]", a, e, rtol, atol) for i, (a, e) in pairs])
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            print(f"  {where}: expected a dict with keys {sorted(map(str, expected))}")
            return False
        items = expected.items()
        return all([compare(f"{where}[{k!r}]", actual[k], v, rtol, atol) for k, v in items])
    if isinstance(actual, torch.Tensor):
        print(f"  {where}: got a tensor, recorded {expected!r}")
        return False
    same = actual == expected or (actual != actual and expected != expected)  # NaN == NaN
    print(f"  {where}: {actual!r} {'==' if same else '!='} recorded {expected!r}")
    return bool(same)


def check_exception(exc, recorded_type, recorded_message):
    """The call raised, as recorded: 0 when the exception type is the recorded one."""
    traceback.print_exception(type(exc), exc, exc.__traceback__)
    if type(exc).__name__ == recorded_type:
        print(f"PASS: reproduced {recorded_type}: {exc}")
        print(f"      recorded {recorded_type}: {recorded_message}")
        return 0
    print(f"FAIL: raised {type(exc).__name__}: {exc}")
    print(f"      recorded {recorded_type}: {recorded_message}")
    return 1
