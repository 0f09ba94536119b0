"""The 16-bit statistics' exact-sum path (kernels/cpu/stats.c, half_lanes_run_avx2): blocks
summed in float32 when every addition is provably exact, the in-order double additions
otherwise. Whichever path a block takes, min, max and mean must be the bits of the one
fixed order (docs/logging.md: level-5 statistics do not depend on the machine), on the
AVX2 and the portable path, whole tensors and the one-pass writer's stream alike. The
data below is built to cross every branch: blocks the float32 sum cannot hold, lane sums
that stop being exact, NaN and Inf mid-block, signed zeros, subnormals, ragged tails."""

import math

import numpy as np
import pytest
import torch

from flashinfer_native import _C


def _reference(t):
    """min, max and mean in the kernels' order: of each group of eight elements lanes 0-3
    take elements 0, 2, 4, 6 and lanes 4-7 elements 1, 3, 5, 7, each lane adds in float64
    from zero in order, the lanes reduce as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + ...),
    then the n % 8 tail one by one. NaNs add zero; min and max keep the first of equals."""
    v = t.float().numpy().astype(np.float64)
    n = v.size
    clean = np.where(np.isnan(v), 0.0, v)
    body = n // 8 * 8
    groups = clean[:body].reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]]
    with np.errstate(invalid="ignore"):  # inf - inf is NaN here as in the kernels
        lanes = np.add.accumulate(groups, axis=0)[-1] if body else np.zeros(8)
    total = 0.0
    total += (float(lanes[0]) + float(lanes[1])) + (float(lanes[2]) + float(lanes[3]))
    total += (float(lanes[4]) + float(lanes[5])) + (float(lanes[6]) + float(lanes[7]))
    for x in clean[body:]:
        total += float(x)
    finite = v[~np.isnan(v)]
    return total, finite, int(np.isnan(v).sum()), int(np.isinf(v).sum())


def _check(name, got, t):
    total, finite, nans, infs = _reference(t)
    mean = total / (t.numel() - nans)
    assert (math.isnan(got["mean"]) and math.isnan(mean)) or got["mean"] == mean, name
    assert (got["nan_count"], got["inf_count"]) == (nans, infs), name
    assert (got["min"], got["max"]) == (finite.min(), finite.max()), name
    # a zero minimum or maximum keeps the sign of the first zero in the kernels' order
    for key, value in (("min", finite.min()), ("max", finite.max())):
        if value == 0:
            assert math.copysign(1.0, got[key]) == _first_zero_sign(t), (name, key)


def _first_zero_sign(t):
    """The sign of the zero the kernels' min/max keep: each lane keeps its first zero,
    lanes are reduced in order 0..7, so lane 0's first zero unless lane 0 has none."""
    v = t.float().numpy()
    body = v.size // 8 * 8
    groups = v[:body].reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]]
    for lane in range(8):
        zeros = groups[:, lane][groups[:, lane] == 0]
        if zeros.size:
            return math.copysign(1.0, float(zeros[0]))
    tail = v[body:][v[body:] == 0]
    return math.copysign(1.0, float(tail[0]))


def _cases(dtype):
    g = torch.Generator().manual_seed(7)
    n = 128 * 40 + 40 + 7  # whole blocks, a partial block, a group of 8 and a 7-element tail
    base = torch.randn(n, generator=g)
    cases = {"randn": base.clone()}
    # every fourth block spans too many binades for a float32 block sum
    wide = base.clone()
    for b in range(0, 40, 4):
        wide[128 * b + 5] = 1e-6 if dtype == torch.bfloat16 else 1e-4
    cases["wide-blocks"] = wide
    big = 2.0**53 if dtype == torch.bfloat16 else 2.0**15
    # a lane sum where adding ones one by one loses them (2^53 + 1 rounds to 2^53) but
    # adding their block sum at once would not: the double test must refuse the block
    lost = torch.ones(n)
    lost[128 * 3 : 128 * 3 + 8] = big  # after three blocks on the float32 path
    cases["lost-ones"] = lost
    ties = torch.ones(n)
    ties[128 * 3 : 128 * 3 + 8] = big
    ties[128 * 3 + 8 : 128 * 3 + 16] = 3.0  # odd: 2^53 + 3 rounds up, so rounding is seen at once
    cases["rounding"] = ties
    nan = base.clone()
    nan[128 * 10 + 77] = float("nan")
    cases["nan-mid-block"] = nan
    inf = base.clone()
    inf[128 * 20 + 3] = float("-inf")
    cases["inf-mid-block"] = inf
    zeros = torch.zeros(n)
    zeros[::3] = -0.0
    zeros[128 * 5 :: 7] = 2.5
    cases["signed-zeros"] = zeros
    only_zeros = torch.zeros(n)
    only_zeros[1::2] = -0.0
    cases["only-zeros"] = only_zeros
    if dtype == torch.bfloat16:
        cases["subnormal"] = base * 1e-39
        cases["huge"] = base * 1e37
    else:
        cases["subnormal"] = base * 1e-7
        cases["huge"] = base * 3e4
    cases["biased"] = base + 300.0
    return {k: v.to(dtype) for k, v in cases.items()}


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_whole_tensors_keep_the_in_order_bits(monkeypatch, isa, dtype):
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    for name, t in _cases(dtype).items():
        _check(name, _C.tensor_stats(t), t)


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_one_pass_stream_keeps_the_in_order_bits(tmp_path, monkeypatch, isa, dtype):
    """The stream carries the exact path's state across blocks of the writer."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    cases = {k: t.repeat(30) for k, t in _cases(dtype).items()}  # several 256 KB blocks
    try:
        assert _C._save_tensors_taking_stats(tmp_path / "x.pt", cases) == len(cases)
        for name, t in cases.items():
            _check(name, _C.tensor_stats(t), t)
    finally:
        _C._forget_stats()
