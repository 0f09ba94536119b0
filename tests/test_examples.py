"""The seed's example scripts (examples/*.py) run as its usage lines say, in a fresh cwd."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


def run(cwd, script, *args, **env_extra):
    """Run ``python script args`` in ``cwd`` with a clean FLASHINFER_* environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    cmd = [sys.executable, *([os.path.join(EXAMPLES, script)] if script else []), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def cli(cwd, *args):
    return run(cwd, None, "-m", "flashinfer", *args)


def lines_after(text, header, count):
    lines = text.splitlines()
    i = lines.index(header)
    return lines[i + 1 : i + 1 + count]


@pytest.fixture(scope="module")
def bmm(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("bmm")
    r = run(
        cwd,
        "bmm_fp8_producer.py",
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR="./bmm_fp8_dumps",
    )
    return cwd, r


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("decode")
    r = run(
        cwd,
        "batch_decode_producer.py",
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR="./batch_decode_dumps",
    )
    return cwd, r


def test_bmm_fp8_producer_prints_output_and_dumps_one_call(bmm):
    cwd, r = bmm
    assert r.returncode == 0, r.stderr
    assert "Output shape: torch.Size([4, 64, 128])" in r.stdout
    dumps = [d for d in os.listdir(cwd / "bmm_fp8_dumps") if "bmm_fp8" in d]
    assert len(dumps) == 1 and re.fullmatch(r"\d{8}_\d{6}_\d{3}_pid\d+_bmm_fp8_call0001", dumps[0])
    assert sorted(os.listdir(cwd / "bmm_fp8_dumps" / dumps[0])) == [
        "inputs.pt",
        "metadata.jsonl",
        "outputs.pt",
    ]


def test_bmm_fp8_reproducer_output_matches(bmm):
    cwd, producer = bmm
    r = run(cwd, "bmm_fp8_reproducer.py")
    assert r.returncode == 0, r.stderr
    assert "✅ Output matches expected result!" in r.stdout
    assert "❌" not in r.stdout
    assert r.stdout.startswith("Loading dump from: bmm_fp8_dumps/")
    # The replayed slice prints exactly as the producer's.
    want = lines_after(producer.stdout, "Output[0, :3, :3]:", 3)
    assert lines_after(r.stdout, "Replayed output[0, :3, :3]:", 3) == want


def test_manual_replay_lists_metadata_and_tensors(bmm):
    cwd, _ = bmm
    r = run(cwd, "manual_replay.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "Function: bmm_fp8",
        "Module: flashinfer.gemm",
        "Status: completed",
        "Input tensors: ['arg_0', 'arg_1', 'arg_2', 'arg_3', 'arg_5']",
        "Output tensors: ['result']",
        "  arg_0: shape=torch.Size([4, 64, 256]), dtype=torch.float8_e4m3fn",
        "  arg_1: shape=torch.Size([4, 256, 128]), dtype=torch.float8_e4m3fn",
        "  arg_2: shape=torch.Size([]), dtype=torch.float32",
        "  arg_3: shape=torch.Size([]), dtype=torch.float32",
        "  arg_5: shape=torch.Size([4, 64, 128]), dtype=torch.bfloat16",
    ]


def test_cli_replay_of_bmm_fp8_dumps_passes(bmm):
    cwd, _ = bmm
    r = cli(cwd, "replay", "--dir", "./bmm_fp8_dumps")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Replaying session from ./bmm_fp8_dumps..."
    assert re.fullmatch(r"\[1\] bmm_fp8 \(\S+_bmm_fp8_call0001\): ✅ Passed", lines[1])
    assert lines[2:] == ["Summary: 1 passed, 0 failed/mismatch"]


def test_batch_decode_producer_prints_output_and_lse(decode):
    cwd, r = decode
    assert r.returncode == 0, r.stderr
    assert "Output shape: torch.Size([4, 32, 128])" in r.stdout
    assert "LSE shape: torch.Size([4, 32])" in r.stdout
    names = sorted(
        d.split("_pid")[1].split("_", 1)[1]
        for d in os.listdir(cwd / "batch_decode_dumps")
        if d != "session.jsonl"
    )
    assert names == [
        "BatchDecodeWithPagedKVCacheWrapper.__init___call0001",
        "BatchDecodeWithPagedKVCacheWrapper.plan_call0001",
        "BatchDecodeWithPagedKVCacheWrapper.run_call0001",
    ]


def test_batch_decode_reproducer_replays_init_plan_run(decode):
    cwd, producer = decode
    r = run(cwd, "batch_decode_reproducer.py")
    assert r.returncode == 0, r.stderr
    calls = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert [re.sub(r" \(.*\)", "", c) for c in calls] == [
        "[1] BatchDecodeWithPagedKVCacheWrapper.__init__: ✅ Passed",
        "[2] BatchDecodeWithPagedKVCacheWrapper.plan: ✅ Passed",
        "[3] BatchDecodeWithPagedKVCacheWrapper.run: ✅ Passed",
    ]
    assert "Summary: 3 passed, 0 failed" in r.stdout.splitlines()
    want = lines_after(producer.stdout, "Output[0, :3, :3]:", 3)
    assert lines_after(r.stdout, "Replayed output[0, :3, :3]:", 3) == want
    lse = [x for x in producer.stdout.splitlines() if x.startswith("LSE[0, :5]:")]
    assert [x for x in r.stdout.splitlines() if x.startswith("Replayed LSE")] == [
        "Replayed " + lse[0]
    ]


def test_cli_replay_of_batch_decode_dumps_passes(decode):
    cwd, _ = decode
    r = cli(cwd, "replay", "--dir", "./batch_decode_dumps")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("✅ Passed") == 3
    assert r.stdout.splitlines()[-1] == "Summary: 3 passed, 0 failed/mismatch"


def test_scan_session_default_root_is_my_dumps(decode):
    cwd, _ = decode
    if not (cwd / "my_dumps").exists():
        shutil.copytree(cwd / "batch_decode_dumps", cwd / "my_dumps")
    r = run(cwd, "scan_session.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "Total completed calls: 3",
        "",
        "Calls by function:",
        "  BatchDecodeWithPagedKVCacheWrapper.__init__: 1",
        "  BatchDecodeWithPagedKVCacheWrapper.plan: 1",
        "  BatchDecodeWithPagedKVCacheWrapper.run: 1",
    ]


def test_scan_session_reports_incomplete_calls(tmp_path):
    root = tmp_path / "crashed"
    root.mkdir()
    records = [
        {"function_name": "mm_fp4", "execution_status": "inputs_saved", "dump_dir": "a"},
        {"function_name": "mm_fp4", "execution_status": "completed", "dump_dir": "a"},
        {"function_name": "bmm_fp8", "execution_status": "inputs_saved", "dump_dir": "b"},
    ]
    (root / "session.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = run(tmp_path, "scan_session.py", str(root))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "Total completed calls: 1"
    assert "⚠️ Found 1 incomplete calls (potential crashes):" in r.stdout
    assert r.stdout.splitlines()[-1] == "  - bmm_fp8 at b"
