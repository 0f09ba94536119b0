"""The compact capture's device path (docs/flight-recorder.md#chunk-dedup-on-the-device): a
CUDA tensor's chunks are hashed where they live and only the chunks the store lacks are
copied to the host. Here the test device (``_C._device_chunks(test=True)``) takes CPU tensors
through the same steps as the CUDA one; tests/gpu/test_cuda_device_chunks.py runs the CUDA
one. Sessions recorded through it must be the host path's, byte for byte, and the copies must
be exactly the chunks that were new."""

import json
import os
import struct

import pytest
import torch
from serving_loop import record

from flashinfer.api_logging import replay_sequence
from flashinfer_native import _C

# the loop, then the device path's counters in a file beside the dumps
BODY = """
import json, os
from flashinfer_native import _C
_C._device_chunks(test={test!r})
serving_loop.run(steps=4)
with open(os.environ["FLASHINFER_DUMP_DIR"] + ".counters", "w") as f:
    json.dump(_C._device_chunks(), f)
"""


def recorded(tmp_path, test, **env):
    root = record(tmp_path, BODY.format(test=test), name="device" if test else "host", **env)
    with open(str(root) + ".counters") as f:
        return root, json.load(f)


def call_dirs(root):
    return sorted(
        (d for d in os.listdir(root) if os.path.isfile(root / d / "metadata.jsonl")),
        key=lambda d: d.split("_", 4)[4],  # by name and call number: stamps and pids differ
    )


def pack_records(path):
    """(id, length) of each chunk record of a pack (docs/dump-format.md#compact-layout)."""
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        magic, length, ident = struct.unpack_from("<4sIQ", data, at)
        assert magic == b"FIck"
        out.append((ident, length))
        at += 16 + length
    return out


# without the test device: the CUDA one in a build with the CUDA kernels, else none
BUILT = "cuda" if _C._device_chunks()["device"] == "cuda" else None


def test_the_switch_and_its_counters():
    assert _C._device_chunks() == {"device": BUILT, "hashed": 0, "copied": 0, "failures": 0}
    try:
        assert _C._device_chunks(test=True)["device"] == "test"
    finally:
        assert _C._device_chunks(test=False)["device"] == BUILT


def test_compact_level_10_through_the_device_path_writes_the_host_paths_bytes(tmp_path):
    host, none = recorded(tmp_path, False, FLASHINFER_DUMP_LAYOUT="compact")
    device, counters = recorded(tmp_path, True, FLASHINFER_DUMP_LAYOUT="compact")
    assert none == {"device": BUILT, "hashed": 0, "copied": 0, "failures": 0}  # none taken
    assert counters["device"] == "test"
    names = call_dirs(host)
    assert [d.split("_", 4)[4] for d in names] == [d.split("_", 4)[4] for d in call_dirs(device)]
    for a, b in zip(names, call_dirs(device)):
        for stem in ("inputs.chunks.json", "outputs.chunks.json"):
            if os.path.exists(host / a / stem):
                ma, mb = json.load(open(host / a / stem)), json.load(open(device / b / stem))
                ma.pop("packs"), mb.pop("packs")  # named by pid
                assert ma == mb, (a, stem)
    (pa,), (pb,) = os.listdir(host / "chunks"), os.listdir(device / "chunks")
    assert open(host / "chunks" / pa, "rb").read() == open(device / "chunks" / pb, "rb").read()
    results = replay_sequence(str(device), device="cpu")
    assert len(results) == 1 + 4 * 3
    assert all(r.get("comparison_match", True) and "error" not in r for r in results)


def test_the_device_path_copies_exactly_the_chunks_that_were_new(tmp_path):
    root, counters = recorded(tmp_path, True, FLASHINFER_DUMP_LAYOUT="compact")
    (pack,) = os.listdir(root / "chunks")
    written = sum(length for _, length in pack_records(root / "chunks" / pack))
    # every chunk copied to the host was written to the pack once: random pages, no repeats
    assert counters["copied"] == written
    referenced = 0
    for d in call_dirs(root):
        for stem in ("inputs.chunks.json", "outputs.chunks.json"):
            if os.path.exists(root / d / stem):
                m = json.load(open(root / d / stem))
                referenced += sum(c[1] for t in m["tensors"].values() for c in t["chunks"])
    assert counters["hashed"] == referenced
    # 4 steps reading ~9 pages of two caches: after the first, only appended tokens' pages,
    # the queries and the outputs are new
    assert counters["copied"] < 0.6 * counters["hashed"], counters


def test_the_in_memory_ring_through_the_device_path_holds_the_same_tensors(tmp_path):
    ring = {"FLASHINFER_DUMP_RING": "64", "FLASHINFER_DUMP_ON": "exit"}
    host, _ = recorded(tmp_path, False, **ring)
    device, counters = recorded(tmp_path, True, **ring)
    assert counters["device"] == "test" and 0 < counters["copied"] < counters["hashed"]
    results = replay_sequence(str(device), device="cpu")
    assert len(results) == 1 + 4 * 3
    assert all(r.get("comparison_match", True) and "error" not in r for r in results)
    names = call_dirs(host)
    assert len(names) == len(call_dirs(device)) == 1 + 4 * 3
    for a, b in zip(names, call_dirs(device)):
        for stem in ("inputs.chunks.json", "outputs.chunks.json"):
            assert os.path.exists(host / a / stem) == os.path.exists(device / b / stem)
            if os.path.exists(host / a / stem):
                ta = _C.load_chunks(str(host / a / stem))
                tb = _C.load_chunks(str(device / b / stem))
                assert ta.keys() == tb.keys()
                for k in ta:
                    assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), (a, k)


@pytest.mark.parametrize(
    "env",
    [
        {"FLASHINFER_DUMP_LAYOUT": "compact"},
        {"FLASHINFER_DUMP_RING": "64", "FLASHINFER_DUMP_ON": "exit"},
    ],
    ids=["compact", "ring"],
)
def test_a_failed_device_call_sends_the_capture_to_the_host_and_loses_no_call(tmp_path, env):
    root, counters = recorded(tmp_path, "fail", **env)
    assert counters["failures"] == 1 and counters["hashed"] == 0
    log = (tmp_path / "device.log").read_text().splitlines()
    assert [line for line in log if "WARNING" in line] == [
        "[flashinfer] WARNING: hashing chunks on the test device failed (as asked); the flight "
        "recorder copies tensors to the host from now on"
    ]
    results = replay_sequence(str(root), device="cpu")
    assert len(results) == 1 + 4 * 3  # the failed call's capture was taken on the host
    assert all(r.get("comparison_match", True) and "error" not in r for r in results)
