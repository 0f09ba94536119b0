"""The core's C triage functions: tensor_histogram and tensor_difference, against torch."""

import pytest
import torch

from flashinfer_native import _C

FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def reference_histogram(x, bins):
    values = x.to(torch.float64).reshape(-1)
    finite = values[torch.isfinite(values)]
    lo, hi = finite.min().item(), finite.max().item()
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    index = torch.bucketize(finite, edges, right=True) - 1
    return torch.bincount(index.clamp(0, bins - 1), minlength=bins).tolist(), lo, hi


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
def test_histogram_of_a_strided_view_matches_a_torch_reference(dtype):
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(64, 96, generator=gen) * 20
    base = base.to(dtype) if dtype.is_floating_point else base.round().to(dtype)
    view = base.t()[::3, 1:]
    hist = _C.tensor_histogram(view, bins=16)
    counts, lo, hi = reference_histogram(view, 16)
    assert (hist["lo"], hist["hi"]) == (lo, hi)
    assert hist["counts"] == counts
    assert sum(hist["counts"]) == view.numel()


def test_histogram_leaves_out_nan_and_inf_and_counts_them():
    x = torch.tensor([0.0, 1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    hist = _C.tensor_histogram(x, bins=2)
    assert hist == {"counts": [1, 2], "lo": 0.0, "hi": 2.0, "nan": 1, "inf": 2, "outside": 0}


def test_histogram_of_a_constant_tensor_centres_one_bin():
    hist = _C.tensor_histogram(torch.full((5,), 3, dtype=torch.int32), bins=3)
    assert (hist["lo"], hist["hi"], hist["counts"]) == (2.5, 3.5, [0, 5, 0])


def test_histogram_with_an_explicit_range_counts_what_is_outside():
    hist = _C.tensor_histogram(torch.arange(10.0), bins=2, range=(2.0, 5.0))
    assert (hist["counts"], hist["outside"]) == ([2, 2], 6)


def test_histogram_of_an_empty_or_complex_tensor_is_none():
    assert _C.tensor_histogram(torch.zeros(0)) is None
    assert _C.tensor_histogram(torch.zeros(3, dtype=torch.complex64)) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bins": 0}, r"bins=0 is not in \[1, 4096\]"),
        ({"range": (1.0, 0.0)}, r"range must be finite \(lo, hi\) with lo <= hi"),
    ],
)
def test_histogram_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _C.tensor_histogram(torch.ones(3), **kwargs)


def test_histogram_refuses_a_negative_view():
    with pytest.raises(ValueError, match="negative or conjugate view"):
        _C.tensor_histogram(torch._neg_view(torch.ones(3)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_difference_matches_a_torch_reference_on_strided_views(dtype):
    gen = torch.Generator().manual_seed(5)
    b = (torch.randn(40, 30, generator=gen)).to(dtype)
    a = (b.to(torch.float32) + 0.01 * torch.randn(40, 30, generator=gen)).to(dtype)
    a, b = a.t()[:, ::2], b.t()[:, ::2]
    max_abs, max_rel, mismatched = _C.tensor_difference(a, b, rtol=1e-2, atol=1e-3)
    x, y = a.to(torch.float64), b.to(torch.float64)
    diff = (x - y).abs()
    assert max_abs == diff.max().item()
    nonzero = y != 0
    assert max_rel == (diff[nonzero] / y[nonzero].abs()).max().item()
    assert mismatched == int((~torch.isclose(x, y, rtol=1e-2, atol=1e-3)).sum())


def test_difference_treats_nan_on_both_sides_as_equal_and_one_sided_nan_as_a_mismatch():
    a = torch.tensor([float("nan"), float("nan"), float("inf"), 1.0])
    b = torch.tensor([float("nan"), 0.0, float("inf"), 1.0])
    assert _C.tensor_difference(a, b) == (0.0, 0.0, 1)


def test_difference_of_integers_is_bit_exact_whatever_the_tolerance():
    a, b = torch.tensor([1, 5, 7], dtype=torch.int64), torch.tensor([1, 5, 9], dtype=torch.int64)
    assert _C.tensor_difference(a, b, rtol=1.0, atol=100.0) == (2.0, 2.0 / 9.0, 1)


def test_difference_refuses_tensors_of_different_shapes():
    with pytest.raises(ValueError, match="a and b differ in shape or dtype"):
        _C.tensor_difference(torch.zeros(2, 3), torch.zeros(3, 2))


def test_difference_refuses_non_tensors_by_name():
    with pytest.raises(TypeError, match="tensor_difference: expected a torch.Tensor, got list"):
        _C.tensor_difference([1.0], torch.zeros(1))
