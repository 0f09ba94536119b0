"""Shared helpers for the tensor-file tests: random tensors of every dtype, bit compare."""

import torch

ALL_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex32,
    torch.complex64,
    torch.complex128,
]


def random_tensor(shape, dtype, seed=0):
    """A tensor of `shape` whose bytes are random (NaNs included), any dtype."""
    gen = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    """Equal shape, dtype and bytes (NaN-safe)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ab = a.detach().reshape(-1).contiguous().view(torch.uint8)
    bb = b.detach().reshape(-1).contiguous().view(torch.uint8)
    return torch.equal(ab, bb)


def assert_same_tensor(got, want, strides=True):
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if strides:
        assert got.stride() == want.stride()
        assert got.is_contiguous() == want.is_contiguous()
    assert got.requires_grad == want.requires_grad
    assert same_bits(got, want)
