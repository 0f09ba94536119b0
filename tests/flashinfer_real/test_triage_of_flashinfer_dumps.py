"""The triage commands on dumps that FlashInfer's own decorator wrote (no ``sequence``,
torch.save files), and the JSON log of the core serving FlashInfer."""

import glob
import json
import os
import subprocess
import sys

import pytest
from conftest import run_json, run_python

SESSION_OUTCOMES = {
    "rmsnorm": "AssertionError",
    "shuffle_matrix_a": "ok",
    "BatchMLAPagedAttentionWrapper": "ok",
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """session.py at level 10 with FlashInfer's decorator and with the core's."""
    out = {}
    for native in (False, True):
        cwd = tmp_path_factory.mktemp("native" if native else "flashinfer")
        outcomes, _ = run_json("session.py", cwd, native=native, level=10)
        assert outcomes == SESSION_OUTCOMES
        out["native" if native else "flashinfer"] = os.path.join(cwd, "dumps")
    return out


def core(*args, cwd):
    """``python -m flashinfer_native ARGS`` (the switch off: nothing is served)."""
    return subprocess.run(
        [sys.executable, "-m", "flashinfer_native", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_diff_matches_flashinfers_dump_with_the_cores_call_by_call(dumps, tmp_path):
    proc = core("diff", dumps["flashinfer"], dumps["native"], "--json", "d.json", cwd=tmp_path)
    with open(tmp_path / "d.json") as f:
        data = json.load(f)
    assert data["match"] == "occurrence"  # FlashInfer's records carry no sequence
    calls = {e["api"]: e for e in data["calls"]}
    assert {api: e["status"] for api, e in calls.items()} == {
        "rmsnorm": "diverged",
        "shuffle_matrix_a": "same",
        "BatchMLAPagedAttentionWrapper.__init__": "same",
    }
    # FlashInfer writes no second record for a call that raised: its outcome is unknown
    # there (a crash looks the same), where the core records the exception
    assert calls["rmsnorm"]["reasons"] == ["status inputs_saved vs exception"]
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == (
        "Summary: 3 matched calls, 2 same, 1 diverged; 0 only in A, 0 only in B"
    )


def test_report_renders_flashinfers_dump(dumps, tmp_path):
    proc = core("report", dumps["flashinfer"], "-o", "report.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "report.html") as f:
        html = f.read()
    for api in SESSION_OUTCOMES:
        assert api in html
    assert "<script" not in html and "http://" not in html and "https://" not in html


def repro_of(dumps, api, tmp_path):
    (call_dir,) = glob.glob(os.path.join(dumps["flashinfer"], f"*_{api}_call0001"))
    proc = core("repro", call_dir, "-o", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a fresh directory, the switch off: the script needs torch and flashinfer only
    return run_python(str(tmp_path / "out" / "repro.py"), tmp_path / "out", native=False)


def test_repro_of_a_flashinfer_dumped_call_runs_and_passes(dumps, tmp_path):
    proc = repro_of(dumps, "shuffle_matrix_a", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "PASS: the result matches the recording"


def test_repro_of_a_flashinfer_call_that_raised_runs_it_and_shows_what_it_raises(dumps, tmp_path):
    # FlashInfer recorded no outcome for it (no second record): the script cannot compare,
    # it runs the call, which raises here as it did when recorded
    proc = repro_of(dumps, "rmsnorm", tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "AssertionError: Torch not compiled with CUDA enabled"
    )
    with open(tmp_path / "out" / "repro.py") as f:
        assert "The recording holds no outcome of this call" in f.read()


def test_json_log_of_served_flashinfer_has_one_record_per_event(tmp_path):
    outcomes, _ = run_json(
        "session.py", tmp_path, native=True, level=3, extra_env={"FLASHINFER_LOGFORMAT": "json"}
    )
    assert outcomes == SESSION_OUTCOMES
    with open(tmp_path / "log.txt") as f:
        lines = f.read().splitlines()
    # FlashInfer's own import writes its version line there, outside any decorator
    assert [line for line in lines if not line.startswith("{")] == [
        "FlashInfer 0.7.2.post1 (commit beabf500)"
    ]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    events = [(r["event"], r.get("api")) for r in records if r["event"] != "system_info"]
    assert events == [
        ("call", "rmsnorm"),
        ("exception", "rmsnorm"),
        ("call", "shuffle_matrix_a"),
        ("return", "shuffle_matrix_a"),
        ("call", "BatchMLAPagedAttentionWrapper.__init__"),
        ("return", "BatchMLAPagedAttentionWrapper.__init__"),
    ]
    rms = records[[r.get("api") for r in records].index("rmsnorm")]
    assert rms["args"][0]["shape"] == [4, 64] and rms["kwargs"] == {"eps": 1e-05}
