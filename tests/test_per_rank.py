"""Multi-rank sessions: rank metadata at record time, ``replay --per-rank`` under torchrun.

Two ranks on the CPU with the gloo backend: each calls a decorated function that runs
``all_reduce``, so a replay only completes when both ranks replay their own calls.
"""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The recorded API lives in module rank_ops, which replay must be told to trust.
REPLAY = ["-m", "flashinfer", "replay", "--allow-module", "rank_ops"]


def torchrun(args, cwd, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(PYTHONPATH=os.pathsep.join([TESTS, ROOT]), OMP_NUM_THREADS="1", **env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return subprocess.run(cmd + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    dumps = root / "dumps"
    proc = torchrun(
        [os.path.join(TESTS, "rank_record.py")],
        root,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR=str(dumps),
        FLASHINFER_LOGDEST=str(root / "log_%i.txt"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dumps


def records_by_rank(dumps):
    out = {}
    for path in glob.glob(os.path.join(dumps, "*", "metadata.jsonl")):
        with open(path) as f:
            last = [json.loads(line) for line in f][-1]
        out.setdefault(last["distributed"]["rank"], []).append((path, last))
    return out


def test_records_carry_rank_world_size_and_backend(session):
    by_rank = records_by_rank(session)
    assert sorted(by_rank) == [0, 1]
    for rank, entries in by_rank.items():
        assert len(entries) == 2
        for _, record in entries:
            assert record["distributed"] == {"rank": rank, "world_size": 2, "backend": "gloo"}


def test_per_rank_replay_passes_with_one_merged_summary(session, tmp_path):
    proc = torchrun([*REPLAY, "--dir", str(session), "--per-rank"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines.count("Rank 0 (cpu): 2 calls") == 1
    assert lines.count("Rank 1 (cpu): 2 calls") == 1
    assert lines[-1] == "Summary: 4 passed, 0 failed/mismatch (2 ranks)"
    assert sum("Summary" in line for line in lines) == 1


def test_per_rank_replay_fails_every_rank_when_one_rank_mismatches(session, tmp_path):
    broken = tmp_path / "dumps"
    subprocess.run(["cp", "-r", str(session), str(broken)], check=True)
    path, _ = records_by_rank(broken)[1][0]
    outputs = os.path.join(os.path.dirname(path), "outputs.pt")
    torch.save({"result": torch.zeros(4)}, outputs)
    proc = torchrun([*REPLAY, "--dir", str(broken), "--per-rank"], tmp_path)
    assert proc.returncode != 0
    assert "Summary: 3 passed, 1 failed/mismatch (2 ranks)" in proc.stdout
    assert proc.stdout.count("❌ Mismatch") == 1


def test_per_rank_outside_a_launcher_is_a_usage_error(session, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer", "replay", "--dir", str(session), "--per-rank"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "--per-rank needs a launcher such as torchrun" in proc.stderr
