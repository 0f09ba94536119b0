"""The in-memory ring's small call (docs/dump-format.md#chunk-statistics and "Chunks met
again at the same address"): a chunk captured again from the address it came from is
compared with the stored bytes instead of hashed, and a tensor of one chunk takes the
statistics kept with that chunk. Both must leave what the ring writes and what the
level-5 text says exactly as hashing and summing would. Every recording runs in a real
child process."""

import os
import subprocess
import sys
import textwrap

import torch

from flashinfer_native import dumpdir

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

PRELUDE = """
import torch
import flashinfer.api_logging as al
from flashinfer.api_logging import flashinfer_api

@flashinfer_api
def pair(a, b):
    return None
"""


def run_child(tmp_path, body, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
    )
    env.update(extra)
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r


def test_a_chunk_changed_in_place_is_hashed_again_and_the_ring_keeps_each_calls_bytes(tmp_path):
    # a 4 KB tensor (one chunk) and a 200 KB one (chunks of 64 KB, 64 KB, 64 KB, 3392 B);
    # between calls one element changes in place: the last one of the small tensor, then
    # one in the big one's last chunk. Unchanged chunks take their hash from the bytes the
    # ring stored (same address, equal bytes); the changed one is hashed.
    body = """
    torch.manual_seed(0)
    x, big = torch.rand(1024), torch.rand(50000)
    seen = []
    for i in range(4):
        pair(x, big)
        seen.append((x.clone(), big.clone()))
        if i == 1:
            x[1023] += 1.0
        if i == 2:
            big[49157] = -1.0
    torch.save(seen, os.environ["SEEN"])
    print(al._LOGGER._ring_chunk_hashes())
    """
    r = run_child(
        tmp_path,
        "import os\n" + textwrap.dedent(body),
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_RING="8",
        FLASHINFER_DUMP_ON="exit",
        SEEN=str(tmp_path / "seen.pt"),
    )
    # call 0: 5 chunks hashed; call 1: 5 from the stored bytes; calls 2 and 3: 1 hashed, 4 not
    assert r.stdout.strip().splitlines()[-1] == "(7, 13)"
    seen = torch.load(tmp_path / "seen.pt")
    dumps = dumpdir.ordered_dumps(str(tmp_path / "dumps"))
    assert len(dumps) == 4
    for (path, records), (x, big) in zip(dumps, seen):
        tensors, where = dumpdir.load_call_tensors(path, "inputs", records[0])
        assert where.endswith("inputs.chunks.json")
        assert torch.equal(tensors["arg_0"], x) and torch.equal(tensors["arg_1"], big)
    assert not torch.equal(seen[1][0], seen[2][0]) and not torch.equal(seen[2][1], seen[3][1])


def level5_text(tmp_path, name, **env):
    """The log text of the script below, without its timestamped lines (the call headers and
    the trigger's line)."""
    body = """
    torch.manual_seed(0)
    x, y = torch.rand(1024), torch.rand(3000)
    pair(x, y)
    pair(x, y)
    pair(x.view(torch.bfloat16), y.view(torch.float16))  # the same bytes as other dtypes
    pair(x, y.view(torch.float16))
    x[1023] = float("nan")
    pair(x, y)
    pair(x.view(torch.bfloat16), y)
    x[1023] = 7.0
    pair(x, y)
    pair(x[:512], y)  # the first half of a chunk the ring holds
    z = torch.randn(2048, dtype=torch.float16)
    pair(z, y)
    pair(z.view(torch.bfloat16), y)  # as many elements, the same bytes, another dtype
    """
    d = tmp_path / name
    d.mkdir()
    run_child(d, body, **env)
    lines = (d / "log.txt").read_text().splitlines()
    return [line for line in lines if not line.startswith("[")]  # timestamps, the trigger


def test_a_tensor_of_one_chunk_takes_its_statistics_from_the_chunk_only_as_the_same_dtype(
    tmp_path,
):
    # the ring's level-5 text (statistics taken by the capture, kept with each one-chunk
    # tensor's chunk and taken again by later calls) is the plain level-5 text, line for
    # line, through dtype views of the same bytes and in-place changes
    plain = level5_text(tmp_path, "plain", FLASHINFER_LOGLEVEL="5")
    ring = level5_text(
        tmp_path,
        "ring",
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_RING="8",
        FLASHINFER_DUMP_ON="exit",
    )
    assert sum(line.strip() == "nan_count=1" for line in plain) == 2  # x's NaN, as f32 and bf16
    assert sum("dtype=torch.bfloat16" in line for line in plain) == 3
    assert ring == plain


def test_a_forked_child_records_its_own_process_id(tmp_path):
    # the process id (and the thread id a ring slot keeps) is read once, and again after a
    # fork: each call's record names the process whose directory holds it
    body = """
    import os, sys
    x = torch.ones(16)
    pair(x, x)
    pid = os.fork()
    if pid == 0:
        pair(x, x)
        pair(x, x)
        sys.exit(0)
    os.waitpid(pid, 0)
    pair(x, x)
    """
    run_child(
        tmp_path,
        body,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_RING="8",
        FLASHINFER_DUMP_ON="exit",
    )
    pids = []
    for path, records in dumpdir.ordered_dumps(str(tmp_path / "dumps")):
        name_pid = int(os.path.basename(path).split("_pid")[1].split("_")[0])
        assert {r["process_id"] for r in records} == {name_pid}, path
        pids.append(name_pid)
    assert len(pids) == 4 and len(set(pids)) == 2
