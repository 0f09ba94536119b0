"""safetensors files written by _C.save_tensors(format='safetensors') and read back."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from tensor_helpers import assert_same_tensor, random_tensor

from flashinfer_native import _C

ST_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
]


def views_of(dtype):
    base = random_tensor((6, 8), dtype, seed=3)
    return {
        "full": base,
        "transposed": base.t(),
        "sliced": base[2:5, 3:],
        "stepped": base[::2, 1::3],
        "row": base[4],
        "scalar": random_tensor((), dtype, seed=4),
        "empty": random_tensor((0, 3), dtype),
        "expanded": base[:, :1].expand(6, 4),
    }


def save(tmp_path, tensors, name="t.safetensors"):
    path = tmp_path / name
    _C.save_tensors(path, tensors, format="safetensors")
    return path


@pytest.mark.parametrize("dtype", ST_DTYPES, ids=str)
def test_safetensors_loads_with_safetensors_library(tmp_path, dtype):
    tensors = views_of(dtype)
    got = load_file(save(tmp_path, tensors))
    for key, want in tensors.items():
        assert_same_tensor(got[key], want.contiguous(), strides=False)
        assert got[key].is_contiguous()


@pytest.mark.parametrize("dtype", ST_DTYPES, ids=str)
def test_safetensors_our_reader_restores_strides(tmp_path, dtype):
    tensors = views_of(dtype)
    got = _C.load_tensors(save(tmp_path, tensors))
    assert list(got) == list(tensors)
    for key, want in tensors.items():
        assert_same_tensor(got[key], want)


def test_safetensors_keeps_requires_grad_in_metadata(tmp_path):
    tensors = {"w": torch.randn(2, 3, requires_grad=True), "x": torch.ones(2)}
    got = _C.load_tensors(save(tmp_path, tensors))
    assert got["w"].requires_grad and not got["x"].requires_grad


def test_safetensors_header_is_padded_json_with_metadata(tmp_path):
    path = save(tmp_path, {"a": torch.ones(2, 3).t()})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}
    assert json.loads(header["__metadata__"]["flashinfer.strides"]) == {"a": [1, 3]}
    assert json.loads(header["__metadata__"]["flashinfer.requires_grad"]) == []
    assert len(raw) == 8 + n + 24


def test_safetensors_bytes_written_equal_file_size(tmp_path):
    path = tmp_path / "n.safetensors"
    n = _C.save_tensors(path, {"a": torch.arange(10)[::3]}, format="safetensors")
    assert n == os.path.getsize(path)


@pytest.mark.parametrize(
    "dtype", [torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.complex32, torch.complex128]
)
def test_safetensors_rejects_dtype_it_cannot_store(tmp_path, dtype):
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=f"tensor 'bad' has dtype torch.{name}, which safetensors"):
        save(tmp_path, {"ok": torch.ones(1), "bad": random_tensor((2,), dtype)})
    assert os.listdir(tmp_path) == []


def test_files_from_safetensors_library_load_through_our_reader(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int16)}
    path = tmp_path / "lib.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    got = _C.load_tensors(path)
    for key, want in tensors.items():
        assert_same_tensor(got[key], want)


def test_unicode_keys_round_trip(tmp_path):
    tensors = {'caf\u00e9 "q" \U0001f600': torch.ones(2)}
    path = save(tmp_path, tensors)
    assert list(load_file(path)) == list(tensors)
    assert list(_C.load_tensors(path)) == list(tensors)
