"""Page-aware capture on a serving loop (docs/flight-recorder.md#page-aware-capture): level 5
statistics, level-10 files and the in-memory ring hold the pages each call reads, in both
layouts, and every call replays from them, from an exported session too."""

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from serving_loop import record

from flashinfer.__main__ import cli
from flashinfer.api_logging import replay_sequence
from flashinfer_native import _C

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

# a NaN page that no call reads: written before every step, into a page no table names
STALE_NAN = """
def stale(step, caches, referenced):
    free = [p for p in range(caches[0].shape[0]) if p not in referenced]
    for c in caches:
        c[free[step]] = float("nan")
"""


def all_match(results):
    return all(r.get("comparison_match", True) and "error" not in r for r in results)


def run_dirs(root):
    return sorted(d for d in os.listdir(root) if ".run_call" in d)


@pytest.mark.parametrize("layout", ["flashinfer", "compact"])
def test_every_call_of_the_loop_replays_from_both_layouts(tmp_path, layout):
    root = record(tmp_path, "serving_loop.run(steps=3)\n", FLASHINFER_DUMP_LAYOUT=layout)
    results = replay_sequence(str(root), device="cpu")
    assert len(results) == 1 + 3 * 3
    assert all_match(results), [r.get("error") for r in results]
    stem = "inputs.chunks.json" if layout == "compact" else "inputs.pt"
    assert all(os.path.exists(root / d / stem) for d in run_dirs(root))


def test_flashinfer_layout_writes_only_the_read_pages_and_keeps_the_shape(tmp_path):
    root = record(tmp_path, STALE_NAN + "serving_loop.run(steps=2, stale=stale)\n")
    for d in run_dirs(root):
        cache = torch.load(root / d / "inputs.pt", weights_only=True)["arg_2"]
        assert cache.shape == (64, 2, 4, 2, 64)
        assert not torch.isnan(cache.float()).any()  # the stale NaN page did not reach it
        kept = (cache.flatten(1) != 0).any(1).sum().item()
        assert kept in (9, 10)  # the pages the plan listed; the rest are holes
        size = os.path.getsize(root / d / "inputs.pt")
        assert os.stat(root / d / "inputs.pt").st_blocks * 512 < size // 2


def test_an_exported_compact_session_replays_the_same(tmp_path):
    root = record(tmp_path, "serving_loop.run(steps=3)\n", FLASHINFER_DUMP_LAYOUT="compact")
    out = tmp_path / "exported"
    r = CliRunner().invoke(cli, ["dumps", "--export", str(root), str(out)])
    assert r.exit_code == 0, r.output
    results = replay_sequence(str(out), device="cpu")
    assert len(results) == 10 and all_match(results)
    for d in run_dirs(out):
        got = torch.load(out / d / "inputs.pt", weights_only=True)["arg_2"]
        ours = _C.load_chunks(str(root / d / "inputs.chunks.json"))["arg_2"]
        assert torch.equal(got, ours)


def test_compact_level_10_writes_each_changed_page_once(tmp_path):
    root = record(tmp_path, "serving_loop.run(steps=4)\n", FLASHINFER_DUMP_LAYOUT="compact")
    (pack,) = os.listdir(root / "chunks")
    page = 2 * 4 * 2 * 64 * 2  # bytes of one page of the loop's bf16 caches
    manifests = [json.load(open(root / d / "inputs.chunks.json")) for d in run_dirs(root)]
    referenced = {c[3] for m in manifests for c in m["tensors"]["arg_2"]["chunks"]}
    # every page a run read is in the pack, and no chunk of the caches twice
    records = (os.path.getsize(root / "chunks" / pack)) // (page + 16)
    assert len(referenced) <= records
    assert manifests[0]["tensors"]["arg_2"]["pages"]["total"] == 64


def test_level_5_statistics_are_of_the_read_pages_and_say_so(tmp_path):
    record(tmp_path, STALE_NAN + "serving_loop.run(steps=2, stale=stale)\n", level="5")
    log = (tmp_path / "dumps.log").read_text()
    blocks = log.split("FlashInfer API Call: BatchDecodeWithPagedKVCacheWrapper.run")[1:]
    assert len(blocks) == 4
    for block in blocks:
        cache = block.split("arg[2]:")[1].split("\n    )")[0]
        assert "pages=9/64" in cache or "pages=10/64" in cache
        assert "nan_count=0" in cache


def test_json_log_says_which_pages_the_statistics_cover(tmp_path):
    record(tmp_path, "serving_loop.run(steps=1)\n", level="5", FLASHINFER_LOGFORMAT="json")
    records = [json.loads(line) for line in open(tmp_path / "dumps.log") if line.startswith("{")]
    runs = [r for r in records if r.get("api") == "BatchDecodeWithPagedKVCacheWrapper.run"]
    cache = runs[0]["args"][2]
    assert cache["pages"] == {"kept": 9, "total": 64, "out_of_range": 0}
    assert cache["stats"]["nan_count"] == 0


def test_an_unread_page_neither_triggers_nan_input_nor_reaches_the_ring(tmp_path):
    root = record(
        tmp_path,
        STALE_NAN + "serving_loop.run(steps=3, stale=stale)\n",
        FLASHINFER_DUMP_RING="64",
        FLASHINFER_DUMP_ON="nan,nan_input,exit",
    )
    session = [json.loads(line) for line in open(root / "session.jsonl")]
    triggers = [r["trigger"] for r in session if r.get("record_type") == "trigger"]
    assert triggers == ["exit"]  # no nan: the NaN pages were never read
    results = replay_sequence(str(root), device="cpu")
    assert len(results) == 10 and all_match(results)
    for d in run_dirs(root):
        cache = _C.load_chunks(str(root / d / "inputs.chunks.json"))["arg_2"]
        assert not torch.isnan(cache.float()).any()


def test_a_read_page_with_a_nan_triggers_nan_input(tmp_path):
    body = """
    def poison(step, caches, referenced):
        if step == 1:
            caches[0][referenced[0], 0, 0, 0, 0] = float("nan")
    serving_loop.run(steps=3, stale=poison)
    """
    root = record(tmp_path, body, FLASHINFER_DUMP_RING="64", FLASHINFER_DUMP_ON="nan,nan_input")
    session = [json.loads(line) for line in open(root / "session.jsonl")]
    (trigger,) = [r for r in session if r.get("record_type") == "trigger"]
    assert trigger["trigger"] == "nan"  # nan_input: found in the inputs (docs/ring.md)
    assert trigger["function_name"] == "BatchDecodeWithPagedKVCacheWrapper.run"


@pytest.mark.parametrize("layout", ["flashinfer", "compact"])
def test_a_recorded_out_of_range_page_id_reproduces_the_error(tmp_path, layout):
    body = """
    try:
        serving_loop.run(steps=1, bad_page=64)
    except ValueError as e:
        print("raised", e)
    """
    root = record(tmp_path, body, FLASHINFER_DUMP_LAYOUT=layout)
    (bad,) = [d for d in run_dirs(root)][:1]
    lines = [json.loads(x) for x in open(root / bad / "metadata.jsonl")]
    assert lines[-1]["execution_status"] == "exception"
    assert "64" in lines[-1]["exception"]["message"]
    results = replay_sequence(str(root), device="cpu")
    run = [r for r in results if r["metadata"]["function_name"].endswith(".run")][0]
    assert run.get("comparison_match") is True, run  # the same exception, replayed
    assert "kv_indices" in str(run.get("execution_result", "")) or run.get("comparison_match")
    out = tmp_path / "repro"
    r = CliRunner().invoke(cli, ["repro", str(root / bad), "-o", str(out)])
    assert r.exit_code == 0, r.output
    p = subprocess.run(
        [sys.executable, str(out / "repro.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ValueError" in p.stdout


def test_the_disk_ring_keeps_flashinfers_layout_even_when_compact_is_asked(tmp_path):
    # it deletes old calls one by one: a chunk pack they shared would only grow
    root = record(
        tmp_path,
        "serving_loop.run(steps=3)\n",
        FLASHINFER_DUMP_RING="4",
        FLASHINFER_DUMP_LAYOUT="compact",
    )
    assert not os.path.exists(root / "chunks")
    dirs = run_dirs(root)
    assert dirs and all(os.path.exists(root / d / "inputs.pt") for d in dirs)
