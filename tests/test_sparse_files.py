"""Sparse tensor files (docs/dump-format.md): only the kept byte ranges of a tensor's span are
written, the rest are holes that read as zeros, and the zip CRCs cover those zeros."""

import os
import zipfile

import pytest
import safetensors.torch
import torch

from flashinfer_native import _C

PAGES, KEPT = 64, [3, 10, 11, 40, 63]


def paged_cache():
    torch.manual_seed(0)
    return torch.randn(PAGES, 2, 16, 8, 16)  # 16 KiB a page


def page_ranges(cache, pages):
    nb = cache[0].numel() * cache.element_size()
    return [(p * nb, (p + 1) * nb) for p in pages]


def expected(cache, pages):
    want = torch.zeros_like(cache)
    want[pages] = cache[pages]
    return want


def allocated(path):
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("fmt,ext", [("torch", "pt"), ("safetensors", "safetensors")])
def test_kept_pages_come_back_and_the_rest_reads_as_zeros(tmp_path, fmt, ext):
    cache, small = paged_cache(), torch.arange(10.0)
    path = str(tmp_path / f"inputs.{ext}")
    _C.save_tensors(
        path, {"cache": cache, "q": small}, fmt, keep={"cache": page_ranges(cache, KEPT)}
    )
    if fmt == "torch":
        got = torch.load(path, weights_only=True)
        with zipfile.ZipFile(path) as z:
            assert z.testzip() is None  # every record's CRC, the holes' zeros included
    else:
        got = safetensors.torch.load_file(path)
    assert torch.equal(got["cache"], expected(cache, KEPT))
    assert torch.equal(got["q"], small)
    assert torch.equal(_C.load_tensors(path)["cache"], expected(cache, KEPT))
    full = cache.numel() * 4
    assert os.path.getsize(path) > full
    kept = len(KEPT) * full // PAGES
    assert allocated(path) <= kept + 64 * 1024


def test_the_crc_of_a_sparse_file_is_that_of_the_dense_one(tmp_path):
    cache = paged_cache()
    _C.save_tensors(str(tmp_path / "s.pt"), {"c": cache}, keep={"c": page_ranges(cache, KEPT)})
    _C.save_tensors(str(tmp_path / "d.pt"), {"c": expected(cache, KEPT)})
    crcs = []
    for name in ("s.pt", "d.pt"):
        with zipfile.ZipFile(tmp_path / name) as z:
            crcs.append({i.filename.split("/", 1)[1]: i.CRC for i in z.infolist()})
    assert crcs[0]["data/0"] == crcs[1]["data/0"]


def test_packed_bytes_stand_for_the_tensors_memory(tmp_path):
    """How a device tensor's pages are written: copied to the host one after another."""
    cache = paged_cache()
    packed = cache[KEPT].contiguous().view(torch.uint8).reshape(-1)
    decoy = torch.full_like(cache, 7.0)  # its own memory must not be read
    path = str(tmp_path / "p.pt")
    _C.save_tensors(path, {"c": decoy}, keep={"c": (page_ranges(cache, KEPT), packed)})
    assert torch.equal(torch.load(path, weights_only=True)["c"], expected(cache, KEPT))


def test_a_hole_at_the_end_of_the_file_keeps_its_size(tmp_path):
    cache = paged_cache()
    path = str(tmp_path / "end.safetensors")
    _C.save_tensors(path, {"c": cache}, "safetensors", keep={"c": page_ranges(cache, [0])})
    assert torch.equal(safetensors.torch.load_file(path)["c"], expected(cache, [0]))


def test_nothing_kept_is_all_holes(tmp_path):
    cache = paged_cache()
    path = str(tmp_path / "none.pt")
    _C.save_tensors(path, {"c": cache}, keep={"c": []})
    assert torch.equal(torch.load(path, weights_only=True)["c"], torch.zeros_like(cache))
    assert allocated(path) <= 64 * 1024


def test_unsorted_ranges_are_refused(tmp_path):
    cache = paged_cache()
    with pytest.raises(ValueError, match="sorted and disjoint"):
        _C.save_tensors(str(tmp_path / "x.pt"), {"c": cache}, keep={"c": [(100, 200), (0, 50)]})
