"""The 16-bit statistics' exact-sum path (kernels/cpu/stats.c, half_lanes_run_avx2): blocks
summed in float32 when every addition is provably exact, the in-order double additions
otherwise. Whichever path a block takes, min, max and mean must be the bits of the one
fixed order (docs/logging.md: level-5 statistics do not depend on the machine), on the
AVX2 and the portable path, whole tensors and the one-pass writer's stream alike. The
data below is built to cross every branch: blocks the float32 sum cannot hold, lane sums
that stop being exact, NaN and Inf mid-block, signed zeros, subnormals, ragged tails."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from flashinfer_native import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _cache(dtype, pages=520, seed=3):
    """A paged KV cache of 64 KB bfloat16 pages (128 KB float32), as the serving loop's."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(pages, 2, 16, 8, 128, generator=g).to(dtype)


def _same(a, b):
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or (a[k] == b[k] and str(a[k]) == str(b[k]))
        for k in a
    )


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_page_statistics_on_threads_are_the_in_order_bits(monkeypatch, isa, dtype, threads):
    """Level 5 splits a large page set over torch's threads and joins the lane sums only
    where the join is provably exact: the bits of one stream over the pages in order,
    which are those of the gathered pages' statistics."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    cache = _cache(dtype)
    pages = sorted(torch.randperm(520, generator=torch.Generator().manual_seed(1))[:480].tolist())
    want = _C.tensor_stats(cache[pages])
    assert _same(_C._page_stats(cache, pages, threads), want)
    # a NaN, an infinity and a zero-signed minimum in the pages of the later threads
    cache[pages[-1], 1, 3, 2, 5] = float("nan")
    cache[pages[-5], 0, 0, 0, 0] = float("inf")
    assert _same(_C._page_stats(cache, pages, threads), _C.tensor_stats(cache[pages]))


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_a_join_that_cannot_be_shown_exact_is_summed_again_in_order(threads):
    """The first thread's pages hold equal powers of two whose lane sums reach 2^54 (each
    thread exact on its own), the later threads' ones: added one by one in order, each one
    is lost (half an ulp of 2^54 is 2); the later threads' sums added at once would not
    be. The join must be refused and the pages summed again in order."""
    n = 480
    first = n // threads  # the first thread's pages
    per_lane = first * 32768 // 8
    cache = torch.ones(n, 2, 16, 8, 128, dtype=torch.bfloat16)
    cache[:first] = 2.0 ** (54 - math.ceil(math.log2(per_lane)))
    pages = list(range(n))
    want = _C.tensor_stats(cache[pages])
    assert _same(_C._page_stats(cache, pages, threads), want)
    lane = float(cache[0, 0, 0, 0, 0]) * per_lane
    assert lane + 1.0 == lane  # the in-order run does lose the ones


def test_signed_zero_minimum_keeps_the_first_pages_zero():
    """Every value is a zero; the first pages hold -0.0, the later +0.0: min and max keep
    the first zero of each lane in page order, whichever thread read it."""
    cache = torch.zeros(480, 2, 16, 8, 128, dtype=torch.bfloat16)
    cache[:100] = -0.0
    pages = list(range(480))
    want = _C.tensor_stats(cache[pages])
    assert math.copysign(1.0, want["min"]) == -1.0
    for threads in (2, 7):
        assert _same(_C._page_stats(cache, pages, threads), want)


CHILD = """
import torch
from flashinfer.api_logging import flashinfer_api

@flashinfer_api
def observe(x):
    return None

g = torch.Generator().manual_seed(5)
x = torch.randn(480 * 32768, generator=g).to(torch.bfloat16)  # 30 MB: several threads
y = torch.full((480 * 32768,), 3.0, dtype=torch.bfloat16)
y[: 60 * 32768] = 2.0**36  # lanes of 2^54 and threes: the first thread's join is refused
for threads in (1, 4):
    torch.set_num_threads(threads)
    observe(x)
    observe(y)
"""


def test_level_10_compact_statistics_on_threads_are_the_in_order_bits(tmp_path):
    """The compact capture hashes a large tensor's chunks and takes its statistics on
    torch's threads: the level-10 log's statistics (JSON, every bit) are those of one
    thread and of tensor_stats, a refused join included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGFORMAT="json",
        FLASHINFER_DUMP_LAYOUT="compact",
        FLASHINFER_LOGDEST=str(tmp_path / "log.jsonl"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        PYTHONPATH=ROOT,
    )
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "log.jsonl") as f:
        calls = [json.loads(line) for line in f if line.startswith("{")]
    stats = [c["args"][0]["stats"] for c in calls if c.get("api") == "observe" and "args" in c]
    assert len(stats) == 4
    g = torch.Generator().manual_seed(5)
    x = torch.randn(480 * 32768, generator=g).to(torch.bfloat16)
    y = torch.full((480 * 32768,), 3.0, dtype=torch.bfloat16)
    y[: 60 * 32768] = 2.0**36
    for got, t in zip(stats, (x, y, x, y)):
        want = _C.tensor_stats(t)
        assert (got["min"], got["max"], got["mean"]) == (want["min"], want["max"], want["mean"])
