"""The chunk store and the compact layout (docs/dump-format.md): the keyed 256-bit chunk hash
against a short reference, each distinct chunk written once, manifests read back bit-exact
with zeros where no chunk lies, and hostile manifests and packs refused with one line."""

import json
import os
import struct

import pytest
import torch

from flashinfer_native import _C

KEY_WORDS = 65536 // 4 + 12
KEY = os.urandom(4 * KEY_WORDS)
MASK32, MASK64 = (1 << 32) - 1, (1 << 64) - 1


def reference_hash(data, key=KEY):
    """NH iterated four times with keys shifted by four words, modulo 2^64."""
    data = data + bytes(-len(data) % 32)
    m = struct.unpack(f"<{len(data) // 4}I", data)
    k = struct.unpack(f"<{KEY_WORDS}I", key)
    out = []
    for t in range(4):
        h = 0
        for i in range(0, len(m), 2):
            h += ((m[i] + k[i + 4 * t]) & MASK32) * ((m[i + 1] + k[i + 1 + 4 * t]) & MASK32)
        out.append(h & MASK64)
    return struct.pack("<4Q", *out)


@pytest.mark.parametrize("isa", ["portable", "avx2", None])
def test_every_path_computes_the_reference_hash(monkeypatch, isa):
    if isa:
        monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    data = os.urandom(65536)
    for n in list(range(0, 70)) + [255, 256, 257, 4096, 65535, 65536]:
        assert _C._chunk_hash(data[:n], KEY) == reference_hash(data[:n]), n


def test_one_changed_byte_changes_the_hash():
    data = bytearray(os.urandom(65536))
    before = _C._chunk_hash(bytes(data), KEY)
    data[40000] ^= 1
    assert _C._chunk_hash(bytes(data), KEY) != before


def test_chunks_larger_than_64k_are_refused():
    with pytest.raises(ValueError, match="at most 65536 bytes"):
        _C._chunk_hash(bytes(65537), KEY)


def cache_and_pages():
    torch.manual_seed(0)
    cache = torch.randn(256, 2, 16, 2, 64).to(torch.bfloat16)  # 8 KiB a page
    nb = cache[0].numel() * 2
    pages = [1, 5, 6, 100, 255]
    return cache, pages, {"cache": [(p * nb, (p + 1) * nb) for p in pages]}


def pack_files(root):
    return sorted(os.listdir(os.path.join(root, "chunks")))


def test_a_manifest_reads_back_with_zeros_where_no_page_was_kept(tmp_path):
    cache, pages, keep = cache_and_pages()
    q = torch.randn(4, 8, 64)[:, ::2]  # a strided view keeps its strides
    w = _C.CompactWriter(str(tmp_path))
    os.mkdir(tmp_path / "call")
    path = str(tmp_path / "call" / "inputs.chunks.json")
    w.save(path, {"cache": cache, "q": q}, keep=keep)
    got, ranges = _C.load_chunks(path, ranges=True)
    want = torch.zeros_like(cache)
    want[pages] = cache[pages]
    assert torch.equal(got["cache"], want) and got["cache"].dtype == torch.bfloat16
    assert torch.equal(got["q"], q) and got["q"].stride() == q.stride()
    assert ranges["cache"] == keep["cache"]


def test_each_distinct_chunk_is_written_once(tmp_path):
    cache, pages, keep = cache_and_pages()
    w = _C.CompactWriter(str(tmp_path))
    for d in ("a", "b", "c"):
        os.mkdir(tmp_path / d)
    first = w.save(str(tmp_path / "a" / "inputs.chunks.json"), {"cache": cache}, keep=keep)
    again = w.save(str(tmp_path / "b" / "inputs.chunks.json"), {"cache": cache}, keep=keep)
    cache[pages[2], 1, 3] += 1  # one page changes
    changed = w.save(str(tmp_path / "c" / "inputs.chunks.json"), {"cache": cache}, keep=keep)
    page = 8192 + 16  # a chunk and its pack record header
    manifest = os.path.getsize(tmp_path / "b" / "inputs.chunks.json")
    assert first == 5 * page + manifest
    assert again == manifest
    assert changed == page + manifest
    assert w.chunks() == 6 and w.unique_bytes() == 6 * 8192
    assert len(pack_files(str(tmp_path))) == 1
    got = _C.load_chunks(str(tmp_path / "c" / "inputs.chunks.json"))["cache"]
    assert torch.equal(got[pages], cache[pages])


def test_a_deleted_pack_is_written_anew(tmp_path):
    cache, _, keep = cache_and_pages()
    w = _C.CompactWriter(str(tmp_path))
    os.mkdir(tmp_path / "a")
    path = str(tmp_path / "a" / "inputs.chunks.json")
    w.save(path, {"cache": cache}, keep=keep)
    (pack,) = pack_files(str(tmp_path))
    os.unlink(tmp_path / "chunks" / pack)
    w.save(path, {"cache": cache}, keep=keep)
    assert torch.equal(_C.load_chunks(path)["cache"][1], cache[1])


def write_manifest(tmp_path, doc):
    os.makedirs(tmp_path / "call", exist_ok=True)
    path = tmp_path / "call" / "inputs.chunks.json"
    path.write_text(doc)
    return str(path)


def good_manifest(tmp_path):
    cache, _, keep = cache_and_pages()
    os.makedirs(tmp_path / "call", exist_ok=True)
    path = str(tmp_path / "call" / "inputs.chunks.json")
    _C.CompactWriter(str(tmp_path)).save(path, {"cache": cache}, keep=keep)
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d.replace('"packs": ["', '"packs": ["../'), "is not a file name of the chunks"),
        (lambda d: d.replace('"version": 1', '"version": 2'), "version is not 1"),
        (lambda d: d.replace("[2088960, 8192", "[2093056, 8192"), "chunk 4 is not"),
        (lambda d: d.replace('"span_bytes": 2097152', '"span_bytes": 2'), "spans more than"),
        (
            lambda d: d.replace('"span_bytes": 2097152', '"span_bytes": 99999999999999999'),
            "out of range",
        ),
        (lambda d: d.replace("[8192, 8192, 0, ", "[8192, 8192, 7, "), "chunk 0 is not"),
        (lambda d: d.replace("[8192, 8192, 0, 1]", "[8192, 8192, 0, 999]"), "not in its pack"),
        (lambda d: d.replace('"torch.bfloat16"', '"torch.os.system"'), "dtype missing or unknown"),
        (
            lambda d: d.replace("[256, 2, 16, 2, 64]", "[256, 2, 16, 2, 64, " + "1, " * 20 + "1]"),
            "shape and stride",
        ),
        (lambda d: d[: len(d) // 2], "chunk manifest|JSON|Expecting|unterminated|invalid"),
    ],
)
def test_hostile_manifests_are_refused_with_one_line(tmp_path, edit, message):
    doc = edit(good_manifest(tmp_path))
    path = write_manifest(tmp_path, doc)
    with pytest.raises(ValueError, match=message) as e:
        _C.load_chunks(path)
    assert "\n" not in str(e.value)


def test_a_pack_that_is_not_a_regular_file_is_not_opened(tmp_path):
    doc = good_manifest(tmp_path)
    (pack,) = pack_files(str(tmp_path))
    os.unlink(tmp_path / "chunks" / pack)
    os.mkfifo(tmp_path / "chunks" / pack)
    with pytest.raises(ValueError, match="not a regular file"):
        _C.load_chunks(write_manifest(tmp_path, doc))


def test_a_pack_cut_short_loses_only_its_last_chunks(tmp_path):
    doc = good_manifest(tmp_path)
    (pack,) = pack_files(str(tmp_path))
    p = tmp_path / "chunks" / pack
    os.truncate(p, os.path.getsize(p) - 100)
    with pytest.raises(ValueError, match="not in its pack"):
        _C.load_chunks(write_manifest(tmp_path, doc))


def test_links_inside_a_dump_are_not_followed(tmp_path):
    doc = good_manifest(tmp_path)
    (pack,) = pack_files(str(tmp_path))
    os.rename(tmp_path / "chunks" / pack, tmp_path / "elsewhere.pack")
    os.symlink(tmp_path / "elsewhere.pack", tmp_path / "chunks" / pack)
    path = write_manifest(tmp_path, doc)
    with pytest.raises(ValueError, match="is a symbolic link"):
        _C.load_chunks(path)
    os.rename(path, tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", path)
    with pytest.raises(ValueError, match="is a symbolic link"):
        _C.load_chunks(path)


@pytest.mark.parametrize("threads", [2, 5])
def test_chunks_hashed_on_threads_are_the_chunks_of_one_thread(tmp_path, threads):
    """A large tensor's chunks are hashed on several threads, then stored and packed in
    order: the same manifest and pack bytes as one thread, and a second save of the same
    tensor on the other thread count finds every chunk already stored."""
    g = torch.Generator().manual_seed(threads)
    cache = torch.randn(520, 2, 16, 8, 128, generator=g).to(torch.bfloat16)  # 64 KiB pages
    nb = cache[0].numel() * 2
    pages = sorted(torch.randperm(520, generator=g)[:450].tolist())
    keep = {"cache": [(p * nb, (p + 1) * nb) for p in pages]}
    whole = torch.randn(3 << 20, generator=g)  # 12 MiB float32, no pages
    roots = []
    for first, second in ((1, threads), (threads, 1)):
        root = tmp_path / f"t{first}"
        w = _C.CompactWriter(str(root))
        for d in ("a", "b"):
            os.makedirs(root / d)
        tensors = {"cache": cache, "whole": whole}
        w.save(str(root / "a" / "inputs.chunks.json"), tensors, keep=keep, threads=first)
        again = w.save(str(root / "b" / "inputs.chunks.json"), tensors, keep=keep, threads=second)
        assert again == os.path.getsize(root / "b" / "inputs.chunks.json")  # no new chunk
        roots.append(root)
    # each writer has its own key, so the two sessions are compared through what they hold
    for root in roots:
        got = _C.load_chunks(str(root / "b" / "inputs.chunks.json"))
        assert torch.equal(got["cache"][pages], cache[pages]) and torch.equal(got["whole"], whole)
        a = json.loads((root / "a" / "inputs.chunks.json").read_text())
        b = json.loads((root / "b" / "inputs.chunks.json").read_text())
        assert a == b
