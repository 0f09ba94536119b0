"""Hostile tensor files: each raises ValueError/OSError naming the file, never crashes."""

import io
import random
import struct
import zipfile

import pytest
import torch

from flashinfer_native import _C


def make_pt(tmp_path, pickle_bytes, records=None, name="h.pt"):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        for key, data in (records or {}).items():
            z.writestr(f"archive/data/{key}", data)
    return path


def tensor_pickle(numel=4, offset=0, size=(4,), stride=(1,), storage="FloatStorage"):
    """data.pkl for {'a': tensor} in torch's layout with chosen (possibly lying) fields."""
    out = io.BytesIO()
    out.write(b"\x80\x02}q\x00(X\x01\x00\x00\x00a")
    out.write(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage")
    out.write(b"ctorch\n" + storage.encode() + b"\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu")
    out.write(b"\x8a\x08" + struct.pack("<q", numel) + b"tQ")
    out.write(b"\x8a\x08" + struct.pack("<q", offset))
    for tup in (size, stride):
        out.write(b"(" + b"".join(b"\x8a\x08" + struct.pack("<q", v) for v in tup) + b"t")
    out.write(b"\x89ccollections\nOrderedDict\n)RtRu.")
    return out.getvalue()


def test_crafted_pickle_helper_builds_a_loadable_file(tmp_path):
    path = make_pt(tmp_path, tensor_pickle(), {"0": struct.pack("<4f", 1, 2, 3, 4)})
    assert _C.load_tensors(path)["a"].tolist() == [1, 2, 3, 4]


PT_CASES = {
    "forbidden_global": (b"\x80\x02cos\nsystem\n.", "pickle global 'os.system' is not allowed"),
    "bad_opcode": (b"\x80\x02}q\x00(\xffu.", "unsupported pickle opcode 0xff"),
    "truncated_pickle": (tensor_pickle()[:60], "truncated|stack underflow"),
    "not_a_dict": (b"\x80\x02K\x01.", "not a dict"),
    "memo_never_set": (b"\x80\x02h\x05.", "memo index 5 was never set"),
    "storage_larger_than_record": (tensor_pickle(numel=1000), "storage record data/0 is too short"),
    "view_beyond_storage": (
        tensor_pickle(size=(4,), stride=(2,)),
        "does not fit its storage",
    ),
    "offset_beyond_storage": (tensor_pickle(offset=3, size=(2,)), "does not fit its storage"),
    "huge_shape": (tensor_pickle(size=(1 << 40, 1 << 40), stride=(1, 1)), "overflows 64 bits"),
    "negative_size": (tensor_pickle(size=(-4,)), "negative size or stride"),
    "numel_overflow_storage": (tensor_pickle(numel=1 << 62), "storage size .* out of range"),
    "reduce_of_dict": (b"\x80\x02}q\x00)R.", "REDUCE of something that is not a known global"),
    "odd_setitems": (b"\x80\x02}q\x00(K\x01u.", "odd number of items"),
    "protocol_1": (b"\x80\x01}.", "pickle protocol 1 not supported"),
    "unknown_storage_type": (tensor_pickle(storage="QInt8Storage"), "QInt8Storage' is not allowed"),
}


@pytest.mark.parametrize("case", PT_CASES)
def test_hostile_pt_pickle_raises_value_error_naming_file(tmp_path, case):
    pickle_bytes, message = PT_CASES[case]
    path = make_pt(tmp_path, pickle_bytes, {"0": b"\0" * 16}, name=f"{case}.pt")
    with pytest.raises(ValueError, match=message) as info:
        _C.load_tensors(path)
    assert f"{case}.pt" in str(info.value)


def valid_pt(tmp_path):
    path = tmp_path / "valid.pt"
    _C.save_tensors(path, {"a": torch.arange(12.0).reshape(3, 4).t(), "b": torch.ones(3)})
    return path


ZIP_CORRUPTIONS = {
    "truncated_half": (lambda raw: raw[: len(raw) // 2], "end of central directory"),
    "wrong_magic": (lambda raw: b"XX" + raw[2:], "safetensors"),
    "cd_offset_lies": (
        lambda raw: raw[:-50] + struct.pack("<Q", 1 << 50) + raw[-42:],
        "central directory lies outside the file",
    ),
    "pickle_crc_broken": (lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], "CRC-32"),
}


@pytest.mark.parametrize("case", ZIP_CORRUPTIONS)
def test_corrupt_zip_raises_value_error_naming_file(tmp_path, case):
    corrupt, message = ZIP_CORRUPTIONS[case]
    path = tmp_path / f"{case}.pt"
    path.write_bytes(corrupt(valid_pt(tmp_path).read_bytes()))
    with pytest.raises(ValueError, match=message) as info:
        _C.load_tensors(path)
    assert f"{case}.pt" in str(info.value)


def make_st(tmp_path, header, data=b"", name="h.safetensors", length=None):
    raw = header if isinstance(header, bytes) else header.encode()
    n = len(raw) if length is None else length
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


ST_CASES = {
    "length_beyond_file": ('{"a": 1}', b"", 1 << 40, "header length"),
    "bad_json": ('{"a": {"dtype": "F32",', b"", None, "invalid JSON"),
    "not_object": ("[1, 2]", b"", None, "not a JSON object"),
    "offsets_beyond_data": (
        '{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
        b"\0" * 8,
        None,
        "data_offsets lie outside the data",
    ),
    "shape_mismatch": (
        '{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}',
        b"\0" * 16,
        None,
        "do not match shape and dtype",
    ),
    "huge_shape": (
        '{"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}',
        b"",
        None,
        "overflows 64 bits",
    ),
    "unknown_dtype": (
        '{"a": {"dtype": "F3", "shape": [1], "data_offsets": [0, 4]}}',
        b"\0" * 4,
        None,
        "unknown dtype",
    ),
    "negative_shape": (
        '{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}',
        b"\0" * 4,
        None,
        "shape is not a list",
    ),
    "missing_fields": ('{"a": {"dtype": "F32"}}', b"", None, "lacks dtype, shape or data_offsets"),
    "bad_metadata_json": (
        '{"__metadata__": {"flashinfer.strides": "{oops"}}',
        b"",
        None,
        "flashinfer.strides.*invalid JSON",
    ),
}


@pytest.mark.parametrize("case", ST_CASES)
def test_hostile_safetensors_raises_value_error_naming_file(tmp_path, case):
    header, data, length, message = ST_CASES[case]
    path = make_st(tmp_path, header, data, name=f"{case}.safetensors", length=length)
    with pytest.raises(ValueError, match=message) as info:
        _C.load_tensors(path)
    assert f"{case}.safetensors" in str(info.value)


def test_hostile_strides_in_metadata_do_not_allocate_beyond_file(tmp_path):
    strides = '{\\"a\\": [1000000000000]}'
    header = (
        '{"__metadata__": {"flashinfer.strides": "' + strides + '"}, '
        '"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    )
    got = _C.load_tensors(make_st(tmp_path, header, b"\0" * 8))["a"]
    assert got.stride() == (1,) and got.tolist() == [0.0, 0.0]


def test_tiny_file_raises_value_error(tmp_path):
    path = tmp_path / "tiny.pt"
    path.write_bytes(b"PK")
    with pytest.raises(ValueError, match="tiny.pt: not a tensor file"):
        _C.load_tensors(path)


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        _C.load_tensors(tmp_path / "nope.pt")


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_random_bit_flips_and_truncations_never_crash(tmp_path, fmt):
    src = tmp_path / f"src.{fmt}"
    tensors = {"a": torch.arange(24.0).reshape(4, 6)[:, ::2], "b": torch.ones(3, dtype=torch.int8)}
    _C.save_tensors(src, tensors, format=fmt)
    raw = src.read_bytes()
    rng = random.Random(1234)
    path = tmp_path / f"fuzz.{fmt}"
    for i in range(400):
        data = bytearray(raw)
        if i % 4 == 0:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(data))
                data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        try:
            got = _C.load_tensors(path)
        except (ValueError, OSError) as e:
            assert "fuzz." in str(e)
            continue
        for t in got.values():
            t.sum() if t.dtype != torch.bool else t.any()
