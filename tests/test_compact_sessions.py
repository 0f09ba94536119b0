"""Sessions in the compact layout (docs/dump-format.md) through every reader: replay, repro,
diff and report read manifests as they read tensor files, and ``dumps --export`` turns a
compact session into FlashInfer's layout (sparse .pt files) that replays the same."""

import json
import os
import shutil
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


def rewrite_records(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(path, "w") as f:
        for r in records:
            if r.get("tensor_format") == "torch":
                r["tensor_format"] = "chunks"
            f.write(json.dumps(r) + "\n")


def to_compact(root):
    """A session of FlashInfer's layout rewritten in the compact one, chunk by chunk."""
    writer = _C.CompactWriter(str(root))
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isfile(os.path.join(d, "metadata.jsonl")):
            continue
        for stem in ("inputs", "outputs"):
            pt = os.path.join(d, stem + ".pt")
            if os.path.exists(pt):
                writer.save(os.path.join(d, stem + ".chunks.json"), _C.load_tensors(pt))
                os.unlink(pt)
        rewrite_records(os.path.join(d, "metadata.jsonl"))
    rewrite_records(os.path.join(root, "session.jsonl"))
    return writer


LOOP = "serving_loop.run(steps=3)\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two sessions of the loop (seeds 0 and 1), recorded once for the module."""
    base = tmp_path_factory.mktemp("recorded")
    return record(base, LOOP, name="a"), record(
        base, "serving_loop.run(steps=3, seed=1)\n", name="b"
    )


def session(recorded, tmp_path, which=0):
    root = tmp_path / ("a", "b")[which]
    shutil.copytree(recorded[which], root)
    return root


def test_a_compact_session_replays_call_for_call(recorded, tmp_path):
    root = session(recorded, tmp_path)
    dense = replay_sequence(str(root), device="cpu")
    writer = to_compact(root)
    assert not any(f.endswith(".pt") for _, _, fs in os.walk(root) for f in fs)
    compact = replay_sequence(str(root), device="cpu")
    assert len(compact) == len(dense) == 1 + 3 * 3  # __init__, then a plan and 2 runs a step
    assert all(r.get("comparison_match", True) and "error" not in r for r in compact), [
        r.get("error") for r in compact
    ]
    assert writer.chunks() > 0


def test_export_writes_flashinfers_layout_that_replays_the_same(recorded, tmp_path):
    root = session(recorded, tmp_path)
    to_compact(root)
    out = tmp_path / "exported"
    r = CliRunner().invoke(cli, ["dumps", "--export", str(root), str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Exported 10 calls (")
    assert not os.path.exists(out / "chunks")
    pts = [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".pt")]
    assert pts and not any(f.endswith(".chunks.json") for _, _, fs in os.walk(out) for f in fs)
    for line in open(out / "session.jsonl"):
        assert json.loads(line)["tensor_format"] == "torch"
    results = replay_sequence(str(out), device="cpu")
    assert len(results) == 10
    assert all(r.get("comparison_match", True) and "error" not in r for r in results)
    for name in os.listdir(out):
        for stem in ("inputs.pt", "outputs.pt"):
            p = out / name / stem
            if p.exists():
                assert torch.load(p, weights_only=True) is not None


def test_export_refuses_to_write_into_a_folder_that_holds_something(recorded, tmp_path):
    root = session(recorded, tmp_path)
    to_compact(root)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    r = CliRunner().invoke(cli, ["dumps", "--export", str(root), str(tmp_path / "busy")])
    assert r.exit_code == 1
    assert "exists and is not an empty directory" in r.output


def test_export_does_not_follow_a_symbolic_link(recorded, tmp_path):
    root = session(recorded, tmp_path)
    to_compact(root)
    os.symlink("/etc", root / "elsewhere")
    r = CliRunner().invoke(cli, ["dumps", "--export", str(root), str(tmp_path / "out")])
    assert r.exit_code == 1
    assert "symbolic link" in r.output


def test_repro_diff_and_report_read_a_compact_session(recorded, tmp_path):
    a, b = session(recorded, tmp_path), session(recorded, tmp_path, 1)
    to_compact(a)
    runner = CliRunner()
    run_dir = sorted(d for d in os.listdir(a) if "run_call0003" in d)[0]
    out = tmp_path / "repro"
    r = runner.invoke(cli, ["repro", str(a / run_dir), "-o", str(out)])
    assert r.exit_code == 0, r.output
    p = subprocess.run(
        [sys.executable, str(out / "repro.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    r = runner.invoke(cli, ["diff", str(a), str(b)])
    assert "BatchDecodeWithPagedKVCacheWrapper.run" in r.output, r.output
    r = runner.invoke(cli, ["report", str(a / run_dir), "-o", str(tmp_path / "report.html")])
    assert r.exit_code == 0, r.output
