"""Chunk statistics partials (docs/dump-format.md#chunk-statistics): the compact capture
keeps with each chunk the statistics partial of its bytes, and a later capture that meets
the same chunk adds the partial instead of reading the bytes again. The statistics must be
the bits of one stream over the elements in order (those of tensor_stats of the kept
pages) on every kernel path, whether partials were added, refused or never made."""

import math
import os

import pytest
import torch

from flashinfer_native import _C

PAGES = 300


def _cache(dtype, seed=3):
    """A paged KV cache of 64 KB bfloat16/float16 pages, as the serving loop's."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(PAGES, 2, 16, 8, 128, generator=g).to(dtype)


def _keep(cache, pages):
    nb = cache[0].numel() * cache.element_size()
    return {"cache": [(p * nb, (p + 1) * nb) for p in pages]}


def _bits_equal(got, want):
    """(min, max, mean, nan_count, inf_count) against tensor_stats, every bit (the sign of a
    zero and NaN included)."""
    want = (want["min"], want["max"], want["mean"], want["nan_count"], want["inf_count"])
    return all(
        (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        for a, b in zip(got, want)
    )


class _Saver:
    def __init__(self, root):
        self.root, self.n = root, 0
        self.w = _C.CompactWriter(str(root))

    def stats(self, tensors, keep=None, threads=1):
        """The capture's statistics of each tensor, and how many chunks' partials it added."""
        self.n += 1
        os.makedirs(self.root / str(self.n))
        before, st = self.w._partials_added(), {}
        path = str(self.root / str(self.n) / "inputs.chunks.json")
        self.w.save(path, tensors, keep=keep, threads=threads, stats=st)
        return st, self.w._partials_added() - before


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 3])
def test_unchanged_pages_add_their_partials_with_the_in_order_bits(
    tmp_path, monkeypatch, isa, dtype, threads
):
    """Step by step as a decode loop: the first capture reads every page, the second adds
    every page's partial, a changed page is read and the others added; a NaN ends the
    adding at its page (the later pages are fed in order, on threads too), and so does a
    bfloat16 subnormal, whose grain leaves the lane sums unprovable (float16's exponent
    range is too narrow for that: its partials are always exact)."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    cache = _cache(dtype)
    pages = sorted(torch.randperm(PAGES, generator=torch.Generator().manual_seed(1))[:260].tolist())
    keep, s, n = _keep(cache, pages), _Saver(tmp_path), len(pages)
    at = (pages[200], 1, 3, 2, 1)
    steps = [
        (None, None, 0),  # every chunk new: partials made, none added
        (None, None, n),  # nothing changed: every partial added
        ((pages[5], 0, 3), 7.5, n - 1),  # one page changed
        (at, float("nan"), 200),
        (at, 1e-38 if dtype == torch.bfloat16 else 1e-7, 200 if dtype == torch.bfloat16 else n - 1),
        (at, 0.5, n - 1),  # provable again
    ]
    for where, value, added in steps:
        if where is not None:
            cache[where] = value
        st, got = s.stats({"cache": cache}, keep, threads)
        assert _bits_equal(st[cache], _C.tensor_stats(cache[pages])), value
        assert got == added, value


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_a_partial_whose_sum_cannot_be_shown_exact_is_refused(tmp_path, monkeypatch, isa, threads):
    """The first pages hold equal powers of two whose lane sums reach 2^54, the later ones
    threes: fed in order each three is lost against 2^54; the threes' partials (exact on
    their own) added at once would not lose them. Every such add must be refused (and the
    later threads' joins), the pages fed in order, on the first capture and the second."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    n = 240
    cache = torch.full((n, 2, 16, 8, 128), 3.0, dtype=torch.bfloat16)
    cache[:30] = 2.0 ** (54 - math.ceil(math.log2(30 * 32768 // 8)))
    pages = list(range(n))
    s = _Saver(tmp_path)
    want = _C.tensor_stats(cache)
    lane = float(cache[0, 0, 0, 0, 0]) * (30 * 32768 // 8)
    assert lane + 3.0 == lane + 4.0  # the in-order run does round the threes
    for _ in range(2):
        st, added = s.stats({"cache": cache}, _keep(cache, pages), threads)
        assert _bits_equal(st[cache], want)
    # only the big pages' partials were added; a fork of threes adds its own partials,
    # but its join is refused and its pages are fed again in order
    assert added == 30


@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_a_partial_is_not_added_to_another_dtype(tmp_path, monkeypatch, isa):
    """The same bytes seen as bfloat16 then float16 are the same chunks, but the bfloat16
    partials are not the float16 sums: the float16 view is read, not added."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(40 * 32768, generator=g) + 0.5).to(torch.bfloat16)  # finite as float16 too
    s = _Saver(tmp_path)
    st, added = s.stats({"x": x})
    assert added == 0 and _bits_equal(st[x], _C.tensor_stats(x))
    y = x.view(torch.float16)
    st, added = s.stats({"y": y})
    assert added == 0 and _bits_equal(st[y], _C.tensor_stats(y))
    st, added = s.stats({"x": x})
    assert added == 40 and _bits_equal(st[x], _C.tensor_stats(x))


def test_the_recorders_stats_dict_hook_refuses_what_is_not_a_dict(tmp_path):
    w = _C.CompactWriter(str(tmp_path))
    with pytest.raises(TypeError, match="stats must be a dict or None"):
        w.save(str(tmp_path / "m.json"), {}, stats=[])
