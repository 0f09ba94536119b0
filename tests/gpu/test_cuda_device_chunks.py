"""The compact capture's device path on CUDA (docs/flight-recorder.md#chunk-dedup-on-the-device):
the chunk hash kernel gives the CPU's bits, CUDA tensors are hashed on their GPU with only new
chunks copied to the host, and the sessions it records replay. tests/test_device_chunks.py
runs the same steps through the test device on the CPU."""

import json
import os
import struct

import torch
from serving_loop import record

from flashinfer.api_logging import replay_sequence
from flashinfer_native import _C

KEY_BYTES = 4 * (64 * 1024 // 4 + 12)

BODY = """
import json, os
from flashinfer_native import _C
serving_loop.run(steps=4, device="{device}")
with open(os.environ["FLASHINFER_DUMP_DIR"] + ".counters", "w") as f:
    json.dump(_C._device_chunks(), f)
"""


def recorded(tmp_path, device, name, **env):
    root = record(tmp_path, BODY.format(device=device), name=name, **env)
    with open(str(root) + ".counters") as f:
        return root, json.load(f)


def call_dirs(root):
    return sorted(
        (d for d in os.listdir(root) if os.path.isfile(root / d / "metadata.jsonl")),
        key=lambda d: d.split("_", 4)[4],
    )


def pack_payload(path):
    data, at, total = open(path, "rb").read(), 0, 0
    while at < len(data):
        magic, length, _ = struct.unpack_from("<4sIQ", data, at)
        assert magic == b"FIck"
        total += length
        at += 16 + length
    return total


def host_written_bytes(root):
    """Bytes of the chunks whose first holder, in recording order (session.jsonl), is a CPU
    tensor or a scratch placeholder: the host path wrote those; a CUDA tensor holding the
    same bytes later found them stored."""
    first = {}
    dirs = []
    for line in open(root / "session.jsonl"):
        d = os.path.basename(json.loads(line)["dump_dir"])
        if d not in dirs:
            dirs.append(d)
    for d in dirs:
        record = [json.loads(x) for x in open(root / d / "metadata.jsonl")][-1]
        details = record.get("tensor_details") or {}
        for stem in ("inputs", "outputs"):
            path = root / d / f"{stem}.chunks.json"
            if path.exists():
                for key, t in json.load(open(path))["tensors"].items():
                    detail = details.get(key, {})
                    # a scratch input is kept as a 1-byte placeholder the recorder makes on
                    # the CPU (docs/dump-format.md#scratch-tensors), whatever its device
                    on_cpu = detail.get("device", "cpu") == "cpu" or detail.get("scratch")
                    for c in t["chunks"]:
                        first.setdefault(c[3], (on_cpu, c[1]))
    return sum(n for on_cpu, n in first.values() if on_cpu)


def assert_all_match(results):
    bad = [
        (r["metadata"]["function_name"], r.get("error"))
        for r in results
        if not r.get("comparison_match", True) or "error" in r
    ]
    assert not bad, bad


def test_the_device_kernel_gives_the_cpu_hash_bits():
    key = os.urandom(KEY_BYTES)
    data = torch.randint(0, 256, (3 * 65536 + 1003,), dtype=torch.uint8)
    for view in (data, data[3:]):  # 4-byte aligned, then byte loads
        for chunk in (65536, 4096, 1000):
            got = _C._chunk_hash_device(view.cuda(), key, chunk)
            raw = view.numpy().tobytes()
            want = [_C._chunk_hash(raw[i : i + chunk], key) for i in range(0, len(raw), chunk)]
            assert got == want, chunk


def test_compact_level_10_on_cuda_copies_only_new_chunks_and_replays(tmp_path):
    root, counters = recorded(tmp_path, "cuda", "cuda", FLASHINFER_DUMP_LAYOUT="compact")
    host, _ = recorded(tmp_path, "cpu", "cpu", FLASHINFER_DUMP_LAYOUT="compact")
    assert counters["device"] == "cuda"
    (pack,) = os.listdir(root / "chunks")
    # every chunk copied from the GPU was written once; CPU tensors of the calls (the
    # wrapper's own) went the host path
    assert counters["copied"] == pack_payload(root / "chunks" / pack) - host_written_bytes(root)
    assert counters["copied"] < 0.6 * counters["hashed"], counters
    # the inputs are the CPU session's, bit for bit
    for a, b in zip(call_dirs(root), call_dirs(host)):
        if os.path.exists(root / a / "inputs.chunks.json"):
            ta = _C.load_chunks(str(root / a / "inputs.chunks.json"))
            tb = _C.load_chunks(str(host / b / "inputs.chunks.json"))
            for k in tb:
                assert torch.equal(ta[k], tb[k]), (a, k)
    results = replay_sequence(str(root), device="cuda")
    assert len(results) == 1 + 4 * 3
    assert_all_match(results)


def test_the_in_memory_ring_on_cuda_goes_through_the_device_path(tmp_path):
    root, counters = recorded(
        tmp_path, "cuda", "ring", FLASHINFER_DUMP_RING="64", FLASHINFER_DUMP_ON="exit"
    )
    assert counters["device"] == "cuda" and 0 < counters["copied"] < 0.6 * counters["hashed"]
    results = replay_sequence(str(root), device="cuda")
    assert len(results) == 1 + 4 * 3
    assert_all_match(results)
