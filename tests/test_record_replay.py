"""End to end: calls recorded by the real level-10 recorder replay and compare."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer.api_logging import replay_from_dump, replay_sequence

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The recorded APIs live in module replay_helpers, which replay must be told to trust.
ALLOW = ["replay_helpers"]


def record(tmp_path, body, **env_extra):
    """Run body (Python source) at level 10 in a child process; return the dump root."""
    root = tmp_path / "dumps"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(root),
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
    )
    env.update(env_extra)
    src = "import torch\nimport replay_helpers as h\n" + textwrap.dedent(body)
    r = subprocess.run(
        [sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return root


def tree(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[p] = (os.path.getsize(p), os.path.getmtime(p))
    return out


@pytest.mark.parametrize("fmt", ["0", "1"])
def test_recorded_session_replays_in_order_and_passes(tmp_path, fmt):
    root = record(
        tmp_path,
        """
        for i in range(200):
            h.scale_add(torch.full((3, 4), float(i)).t(), torch.ones(4, 3), alpha=0.5)
        """,
        FLASHINFER_DUMP_SAFETENSORS=fmt,
    )
    before = tree(root)
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    assert len(results) == 200
    assert all(r.get("comparison_match") for r in results), [r.get("error") for r in results]
    seqs = [r["metadata"]["sequence"] for r in results]
    assert seqs == sorted(seqs)
    first = results[0]["execution_result"]
    assert first.stride() == (1, 4) or first.is_contiguous()
    assert tree(root) == before


def test_wrapper_used_twice_with_different_plans_replays(tmp_path):
    root = record(
        tmp_path,
        """
        w = h.SegmentSumWrapper(torch.empty(16))
        x = torch.arange(12.0)
        w.plan(torch.tensor([0, 4, 12]), 2.0)
        w.run(x)
        w.plan(torch.tensor([0, 6, 12]), 0.5)
        w.run(x, return_lse=True)
        """,
    )
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    names = [r["metadata"]["function_name"] for r in results]
    assert names == [
        "SegmentSumWrapper.__init__",
        "SegmentSumWrapper.plan",
        "SegmentSumWrapper.run",
        "SegmentSumWrapper.plan",
        "SegmentSumWrapper.run",
    ]
    assert all(r.get("comparison_match", True) and "error" not in r for r in results)


def test_prefill_wrappers_replay_their_plans(tmp_path):
    root = record(
        tmp_path,
        """
        from flashinfer.prefill import (
            BatchPrefillWithPagedKVCacheWrapper,
            BatchPrefillWithRaggedKVCacheWrapper,
        )
        i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
        ws = torch.empty(16, dtype=torch.int8)
        q = torch.randn(5, 4, 64).half()
        paged = BatchPrefillWithPagedKVCacheWrapper(ws)
        paged.plan(i32(0, 2, 5), i32(0, 1, 3), i32(2, 0, 1), i32(3, 4), 4, 2, 64, 4, causal=True)
        paged.run(q, torch.randn(3, 2, 4, 2, 64).half())
        ragged = BatchPrefillWithRaggedKVCacheWrapper(ws)
        ragged.plan(i32(0, 2, 5), i32(0, 3, 9), 4, 2, 64, custom_mask=torch.rand(24) > 0.5)
        kv = torch.randn(9, 2, 64).half()
        ragged.run(q, kv, kv, return_lse=True)
        """,
    )
    results = replay_sequence(str(root), device="cpu")
    names = [r["metadata"]["function_name"].split(".")[-1] for r in results]
    assert names == ["__init__", "plan", "run"] * 2
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    runs = [r for r, name in zip(results, names) if name == "run"]
    assert [r["comparison_match"] for r in runs] == [True, True]


def test_recorded_exception_replays_as_passed(tmp_path):
    root = record(
        tmp_path,
        """
        try:
            h.check_positive(torch.tensor([-1.0]))
        except ValueError:
            pass
        """,
    )
    (result,) = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    assert result["metadata"]["execution_status"] == "exception"
    assert result["comparison_match"] is True


def test_tampered_outputs_fail_the_cli_and_name_the_call(tmp_path):
    import torch

    root = record(
        tmp_path,
        """
        h.scale_add(torch.ones(4), torch.ones(4))
        h.reduce_rows(torch.ones(2, 3))
        """,
    )
    target = next(d for d in sorted(os.listdir(root)) if "reduce_rows" in d)
    outputs = root / target / "outputs.pt"
    t = torch.load(outputs, weights_only=True)
    t["result"] = t["result"] + 1
    torch.save(t, outputs)
    r = CliRunner().invoke(
        cli, ["replay", "--allow-module", *ALLOW, "--dir", str(root), "--device", "cpu"]
    )
    assert r.exit_code != 0
    assert f"reduce_rows ({target}): ❌ Mismatch" in r.output
    assert "Summary: 1 passed, 1 failed/mismatch" in r.output


def test_process_killed_mid_call_is_reported_incomplete(tmp_path):
    root = tmp_path / "dumps"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(root),
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
    )
    src = textwrap.dedent(
        """
        import torch
        import replay_helpers as h
        h.scale_add(torch.ones(2), torch.ones(2))
        print("ready", flush=True)
        h.slow_identity(torch.ones(3))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", src], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.time() + 30
    while time.time() < deadline:
        dirs = [d for d in os.listdir(root) if "slow_identity" in d]
        if dirs and os.path.exists(root / dirs[0] / "metadata.jsonl"):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    r = CliRunner().invoke(cli, ["dumps", "--dir", str(root)])
    assert r.exit_code == 0
    assert "slow_identity" in r.output and "incomplete" in r.output.lower()
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    crashed = [r for r in results if r["metadata"]["function_name"] == "slow_identity"]
    assert crashed and crashed[0].get("incomplete") is True
    assert crashed[0]["args"][0].shape == (3,)
    line = (root / dirs[0] / "metadata.jsonl").read_text().splitlines()
    assert len(line) == 1 and json.loads(line[0])["execution_status"] == "inputs_saved"


def test_replay_single_dump_dir_through_the_cli(tmp_path):
    root = record(tmp_path, "h.summarize(torch.arange(6.0))\n")
    (d,) = [p for p in root.iterdir() if p.is_dir()]
    r = CliRunner().invoke(
        cli, ["replay", "--allow-module", *ALLOW, "--dir", str(d), "--device", "cpu"]
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"Replaying single dump from {d}...")
    assert "✅ Passed" in r.output


def test_replay_from_dump_returns_loaded_arguments(tmp_path):
    root = record(tmp_path, "h.scale_add(torch.arange(4.0), torch.ones(4), alpha=2.0)\n")
    (d,) = [p for p in root.iterdir() if p.is_dir()]
    res = replay_from_dump(
        str(d), compare_outputs=True, device="cpu", run=True, allow_modules=ALLOW
    )
    assert res["kwargs"] == {"alpha": 2.0}
    assert res["comparison_match"] is True
    assert set(res["expected_tensors"]) == {"result"}
