"""PyTorch zip files written by _C.save_tensors and read by torch.load and _C.load_tensors."""

import os
import subprocess
import sys
import zipfile

import pytest
import torch
from tensor_helpers import ALL_DTYPES, assert_same_tensor, random_tensor

from flashinfer_native import _C

LOADERS = {
    "torch_weights_only": lambda p: torch.load(p, weights_only=True),
    "torch_mmap": lambda p: torch.load(p, mmap=True, weights_only=True),
    "ours": _C.load_tensors,
}


def views_of(dtype):
    base = random_tensor((6, 8), dtype, seed=1)
    return {
        "full": base,
        "transposed": base.t(),
        "sliced": base[2:5, 3:],
        "stepped": base[::2, 1::3],
        "offset_row": base[4],
        "scalar": random_tensor((), dtype, seed=2),
        "empty": random_tensor((0, 3), dtype),
        "expanded": base[:, :1].expand(6, 4),
    }


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_pt_round_trip_every_dtype_and_view(tmp_path, dtype, loader):
    tensors = views_of(dtype)
    path = tmp_path / "t.pt"
    _C.save_tensors(str(path), tensors)
    got = LOADERS[loader](str(path))
    assert list(got) == list(tensors)
    for key, want in tensors.items():
        assert_same_tensor(got[key], want)


@pytest.mark.parametrize("loader", LOADERS)
def test_pt_keeps_requires_grad(tmp_path, loader):
    tensors = {"w": torch.randn(3, 4, requires_grad=True), "x": torch.randn(2)}
    path = tmp_path / "g.pt"
    _C.save_tensors(path, tensors)
    got = LOADERS[loader](path)
    assert got["w"].requires_grad and not got["x"].requires_grad
    assert_same_tensor(got["w"], tensors["w"])


def test_pt_returns_bytes_written_equal_to_file_size(tmp_path):
    path = tmp_path / "n.pt"
    n = _C.save_tensors(path, {"a": torch.arange(100)})
    assert n == os.path.getsize(path)


def test_pt_is_a_valid_zip_with_correct_crcs_and_aligned_data(tmp_path):
    path = tmp_path / "z.pt"
    _C.save_tensors(path, {"a": torch.randn(1000), "b": torch.arange(7, dtype=torch.int16)})
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        names = z.namelist()
        assert "archive/data.pkl" in names and "archive/data/0" in names
        assert z.read("archive/byteorder") == b"little"
        assert z.read("archive/version") == b"3\n"
        for info in z.infolist():
            with open(path, "rb") as f:
                f.seek(info.header_offset + 26)
                name_len = int.from_bytes(f.read(2), "little")
                extra_len = int.from_bytes(f.read(2), "little")
            data_start = info.header_offset + 30 + name_len + extra_len
            assert data_start % 64 == 0
            assert info.compress_type == zipfile.ZIP_STORED


def test_pt_slice_of_big_tensor_stores_only_its_bytes(tmp_path):
    big = torch.empty(16 << 20, dtype=torch.float32)  # 64 MB
    piece = big[4 << 20 : (4 << 20) + (256 << 10)]  # 1 MB
    path = tmp_path / "slice.pt"
    _C.save_tensors(path, {"piece": piece})
    size = os.path.getsize(path)
    assert (1 << 20) <= size < (1 << 20) + 4096
    got = torch.load(path, weights_only=True)["piece"]
    assert got.storage_offset() == 0 and torch.equal(got.view(torch.int32), piece.view(torch.int32))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_torch_save_files_load_through_our_reader(tmp_path, dtype):
    tensors = views_of(dtype)
    path = tmp_path / "ts.pt"
    torch.save(tensors, path)
    got = _C.load_tensors(path)
    for key, want in tensors.items():
        assert_same_tensor(got[key], want)


def test_torch_save_requires_grad_and_ordered_dict_load_through_our_reader(tmp_path):
    from collections import OrderedDict

    tensors = OrderedDict(w=torch.randn(2, 3, requires_grad=True), b=torch.randn(3))
    path = tmp_path / "od.pt"
    torch.save(tensors, path)
    got = _C.load_tensors(path)
    assert list(got) == ["w", "b"]
    assert_same_tensor(got["w"], tensors["w"])


def test_our_reader_memory_maps_pt_data(tmp_path):
    path = tmp_path / "m.pt"
    _C.save_tensors(path, {"a": torch.arange(1 << 16, dtype=torch.int32)})
    got = _C.load_tensors(path)["a"]
    got[0] = 7  # copy-on-write mapping: writable, file unchanged
    assert _C.load_tensors(path)["a"][0].item() == 0


def test_empty_dict_round_trips(tmp_path):
    path = tmp_path / "e.pt"
    _C.save_tensors(path, {})
    assert torch.load(path, weights_only=True) == {}
    assert _C.load_tensors(path) == {}


def test_save_rejects_non_str_key(tmp_path):
    with pytest.raises(TypeError, match="keys must be str, got int"):
        _C.save_tensors(tmp_path / "k.pt", {1: torch.ones(1)})


def test_save_rejects_non_tensor_value(tmp_path):
    with pytest.raises(TypeError, match=r"tensors\['x'\] is not a torch.Tensor \(got list\)"):
        _C.save_tensors(tmp_path / "v.pt", {"x": [1]})


def test_save_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="format must be 'torch' or 'safetensors', got 'npz'"):
        _C.save_tensors(tmp_path / "f.pt", {}, format="npz")


def test_save_into_missing_directory_raises_oserror_naming_path(tmp_path):
    path = tmp_path / "missing" / "x.pt"
    with pytest.raises(FileNotFoundError, match="missing/x.pt"):
        _C.save_tensors(path, {"a": torch.ones(2)})


def test_failed_rename_leaves_no_temp_file_and_keeps_target(tmp_path):
    target = tmp_path / "target.pt"
    target.mkdir()
    with pytest.raises(OSError, match="target.pt"):
        _C.save_tensors(target, {"a": torch.ones(1000)})
    assert sorted(os.listdir(tmp_path)) == ["target.pt"]
    assert target.is_dir()


def test_file_size_limit_raises_oserror_and_leaves_no_temp_file(tmp_path):
    script = f"""
import resource, os, torch
from flashinfer_native import _C
resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
try:
    _C.save_tensors({str(tmp_path / "big.pt")!r}, {{"a": torch.ones(1 << 20)}})
except OSError as e:
    print("OSError", e.errno, "big.pt" in str(e))
print(sorted(os.listdir({str(tmp_path)!r})))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=root, check=True
    ).stdout
    assert out.split("\n")[:2] == ["OSError 27 True", "[]"]


def test_existing_file_replaced_atomically(tmp_path):
    path = tmp_path / "r.pt"
    _C.save_tensors(path, {"old": torch.zeros(3)})
    _C.save_tensors(path, {"new": torch.ones(3)})
    assert list(_C.load_tensors(path)) == ["new"]
    assert os.listdir(tmp_path) == ["r.pt"]


def test_conjugate_view_saves_its_values(tmp_path):
    z = torch.randn(4, dtype=torch.complex64)
    path = tmp_path / "c.pt"
    _C.save_tensors(path, {"z": z.conj()})
    assert torch.equal(_C.load_tensors(path)["z"], z.conj().resolve_conj())


def test_record_crcs_are_right_with_and_without_the_system_zlib(tmp_path):
    """CRC-32 comes from libz.so.1 when present, else our tables: both must agree."""
    import subprocess
    import sys
    import zipfile

    script = (
        "import sys, torch, flashinfer_native._C\n"
        "t = torch.arange(100003, dtype=torch.int32)[3:]\n"
        "flashinfer_native._C.save_tensors(sys.argv[1], {'a': t, 'b': t[::7]})\n"
    )
    for no_zlib in ("", "1"):
        path = tmp_path / f"x{no_zlib}.pt"
        env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_NO_ZLIB_CRC"}
        if no_zlib:
            env["FLASHINFER_NO_ZLIB_CRC"] = no_zlib
        subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True)
        with zipfile.ZipFile(path) as z:
            assert z.testzip() is None
