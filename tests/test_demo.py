"""examples/demo.py (``make demo``): records, replays and summarises a level-10 session."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_records_fresh_session_and_every_call_replays(tmp_path):
    # A stale dump left by an earlier run would fail the replay if it were kept.
    stale = tmp_path / "demo_dumps" / "20200101_000000_000_pid1_bmm_fp8_call0001"
    stale.mkdir(parents=True)
    (stale / "metadata.jsonl").write_text("not json\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "demo.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert not stale.exists()
    calls = re.findall(r"^\[\d+\] (\S+) \(\S+\): ✅ Passed$", out, flags=re.M)
    assert calls == [
        "single_decode_with_kv_cache",
        "single_prefill_with_kv_cache",
        "BatchDecodeWithPagedKVCacheWrapper.__init__",
        "BatchDecodeWithPagedKVCacheWrapper.plan",
        "BatchDecodeWithPagedKVCacheWrapper.run",
        "bmm_fp8",
        "nvfp4_quantize",
        "nvfp4_quantize",
        "mm_fp4",
    ]
    assert "Summary: 9 passed, 0 failed/mismatch" in out.splitlines()
    assert "9 calls: 9 completed, 0 exception, 0 incomplete" in out.splitlines()
    assert "FlashInfer API Call: single_decode_with_kv_cache" in out
    assert "└── session.jsonl (" in out
    assert out.rstrip().endswith("demo: every recorded call replayed and matched")
