"""The ``flashinfer`` command line (docs/replay.md, docs/flight-recorder.md, docs/install.md): replay, dumps, info."""

import json
import os
import subprocess
import sys

import pytest
import replay_helpers as h
import torch
from click.testing import CliRunner

import flashinfer_native
from flashinfer.__main__ import cli
from flashinfer.version import __version__

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "dumps")


@pytest.fixture
def session(root):
    """Five passing calls: a function, a wrapper's __init__/plan/run, a recorded exception."""
    writer = h.DumpWriter(root)
    writer.call(h.scale_add, torch.randn(4), torch.randn(4), alpha=2.0)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(8, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2, 4]), 0.5)
    writer.method(wrapper, "run", torch.randn(4, 3))
    with pytest.raises(ValueError):
        writer.call(h.check_positive, -torch.ones(2))
    return writer


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


# The test APIs live in module replay_helpers, which replay must be told to trust.
ALLOW = ["--allow-module", "replay_helpers"]


def replay(*args):
    return invoke("replay", *ALLOW, *args)


def names(writer):
    return [os.path.basename(d) for d in writer.dirs]


def test_replay_session_all_passed_exits_0(session, root):
    result = replay("--dir", root, "--device", "cpu")
    n = names(session)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"Replaying session from {root}...",
        f"[1] scale_add ({n[0]}): ✅ Passed",
        f"[2] SegmentSumWrapper.__init__ ({n[1]}): ✅ Passed",
        f"[3] SegmentSumWrapper.plan ({n[2]}): ✅ Passed",
        f"[4] SegmentSumWrapper.run ({n[3]}): ✅ Passed",
        f"[5] check_positive ({n[4]}): ✅ Passed",
        "Summary: 5 passed, 0 failed/mismatch",
    ]


def test_replay_single_dump(session):
    result = replay("--dir", session.dirs[0], "--device", "cpu")
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == f"Replaying single dump from {session.dirs[0]}..."
    assert result.output.splitlines()[-1] == "Summary: 1 passed, 0 failed/mismatch"


def test_tampered_outputs_exit_1_and_name_the_call(session, root):
    torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    result = replay("--dir", root, "--device", "cpu")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[1] == f"[1] scale_add ({names(session)[0]}): ❌ Mismatch"
    assert lines[2].startswith("    result: values differ beyond rtol=0.001, atol=0.001")
    assert lines[-1] == "Summary: 4 passed, 1 failed/mismatch"


def test_error_line_has_message_and_no_traceback(session, root):
    os.remove(os.path.join(session.dirs[0], "inputs.pt"))
    result = replay("--dir", root, "--device", "cpu")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[1].startswith(f"[1] scale_add ({names(session)[0]}): ❌ Error: ")
    assert "inputs file (inputs.pt or inputs.safetensors) is missing" in lines[1]
    assert "Traceback" not in result.output
    assert lines[2].endswith("✅ Passed") and len(lines) == 7


def test_verbose_shows_traceback(session, root):
    os.remove(os.path.join(session.dirs[2], "inputs.pt"))
    result = replay("--dir", root, "--device", "cpu", "--verbose")
    assert "Traceback (most recent call last)" in result.output


def test_incomplete_call_marked_and_fails(root):
    writer = h.DumpWriter(root)
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    writer.crash(h.scale_add, torch.ones(2), torch.ones(2))
    result = replay("--dir", root, "--device", "cpu")
    assert result.exit_code == 1
    assert result.output.splitlines()[2] == (
        f"[2] scale_add ({names(writer)[1]}): ⚠️ Incomplete: the process ended during this "
        "call (inputs only, not run)"
    )
    assert result.output.splitlines()[-1] == "Summary: 1 passed, 0 failed/mismatch, 1 incomplete"


def test_include_and_exclude_select_calls(session, root):
    result = replay(
        "--dir",
        root,
        "--device",
        "cpu",
        "--include",
        "*Wrapper*, scale_*",
        "--exclude",
        "*.run",
    )
    lines = result.output.splitlines()
    assert [line.split(" (")[0] for line in lines[1:-1]] == [
        "[1] scale_add",
        "[2] SegmentSumWrapper.__init__",
        "[3] SegmentSumWrapper.plan",
    ]
    assert result.exit_code == 0


def test_json_report_content(session, root, tmp_path):
    torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    report_path = tmp_path / "report.json"
    result = replay("--dir", root, "--device", "cpu", "--json", str(report_path))
    assert result.exit_code == 1
    report = json.loads(report_path.read_text())
    assert report["mode"] == "session" and report["device"] == "cpu"
    assert report["summary"] == {
        "total": 5,
        "passed": 4,
        "failed": 1,
        "mismatch": 1,
        "error": 0,
        "incomplete": 0,
    }
    first = report["results"][0]
    assert first["status"] == "mismatch" and first["function_name"] == "scale_add"
    assert first["dir_name"] == names(session)[0]
    assert first["mismatches"][0].startswith("result: values differ")
    assert [r["status"] for r in report["results"][1:]] == ["passed"] * 4


def test_empty_root_exits_1(tmp_path):
    result = replay("--dir", str(tmp_path), "--device", "cpu")
    assert result.exit_code == 1
    assert "No dumps (sub-directories holding metadata.jsonl) found" in result.output


def test_missing_directory_exits_2(tmp_path):
    result = replay("--dir", str(tmp_path / "absent"))
    assert result.exit_code == 2
    assert "does not exist" in result.output


@pytest.mark.parametrize(
    "args",
    [["--rtol", "abc"], ["--device", "not_a_device"], ["--bogus"]],
    ids=["rtol", "device", "unknown-option"],
)
def test_bad_arguments_exit_2(session, root, args):
    result = replay("--dir", root, *args)
    assert result.exit_code == 2


def test_dir_is_required(tmp_path):
    result = invoke("replay")
    assert result.exit_code == 2 and "Missing option '--dir'" in result.output


def test_no_colour_codes_when_not_a_terminal(session, root):
    torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    result = replay("--dir", root, "--device", "cpu")
    assert "\x1b[" not in result.output


def test_colour_and_progress_when_a_terminal(session, root, monkeypatch):
    import flashinfer_native.cli as main

    monkeypatch.setattr(main, "_stdout_is_terminal", lambda: True)
    result = CliRunner().invoke(
        cli, ["replay", *ALLOW, "--dir", root, "--device", "cpu"], color=True
    )
    assert f"  replaying 1/5 {names(session)[0]}...\r\x1b[K[1] scale_add" in result.output
    assert "\x1b[32m✅ Passed\x1b[0m" in result.output


def test_dumps_summary_text(session, root):
    session.crash(h.scale_add, torch.ones(2), torch.ones(2))
    n = names(session)
    result = invoke("dumps", "--dir", root)
    assert result.exit_code == 0
    out = result.output
    assert "6 calls: 4 completed, 1 exception, 1 incomplete" in out
    assert "  scale_add: 2\n" in out and "  SegmentSumWrapper.run: 1\n" in out
    assert f"  {n[4]}: ValueError: check_positive: x has negative elements" in out
    assert out.endswith(f"Incomplete calls (the process ended during the call):\n  {n[5]}\n")


def test_dumps_summary_json(session, root):
    session.crash(h.scale_add, torch.ones(2), torch.ones(2))
    data = json.loads(invoke("dumps", "--dir", root, "--json").output)
    n = names(session)
    assert data["calls"] == 6 and data["per_api"]["scale_add"] == 2
    assert data["completed"] == sorted(n[:4]) and data["incomplete"] == [n[5]]
    assert data["exception"] == [
        {"dir": n[4], "type": "ValueError", "message": "check_positive: x has negative elements"}
    ]
    recorded = 4 * 4 * 3 + 8 + 3 * 8 + 4 * 3 * 4 + 2 * 3 * 4 + 2 * 4 + 2 * 4 * 2
    assert data["recorded_bytes"] == recorded
    assert data["disk_bytes"] > recorded


def test_dumps_skips_unreadable_session_lines(session, root):
    with open(os.path.join(root, "session.jsonl"), "a") as f:
        f.write('{"truncated": \n[1]\n')
    result = invoke("dumps", "--dir", root)
    assert result.exit_code == 0
    assert "Unreadable records skipped: 2" in result.output
    assert "5 calls: 4 completed, 1 exception, 0 incomplete" in result.output


def test_dumps_without_session_file_reads_dump_dirs(session, root):
    os.remove(os.path.join(root, "session.jsonl"))
    data = json.loads(invoke("dumps", "--dir", root, "--json").output)
    assert data["calls"] == 5 and len(data["completed"]) == 4
    assert data["source"] == "metadata.jsonl files (no session.jsonl)"


def test_info_reports_build_and_versions():
    result = invoke("info")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == f"flashinfer: {__version__} (this repository's mirror)"
    assert lines[1] == f"flashinfer_native: {flashinfer_native.__version__}"
    assert lines[2] == f"torch: {torch.__version__}"
    assert lines[3].startswith("CUDA kernels built: ")
    assert lines[4].startswith("CUDA statistics kernel built: ")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert f"GPUs visible: {gpus}" in lines


def test_help_texts():
    top = invoke("--help")
    assert top.exit_code == 0
    for command in ("replay", "dumps", "info"):
        assert command in top.output
    replay = invoke("replay", "--help").output
    for option in (
        "--dir",
        "--device",
        "--include",
        "--exclude",
        "--rtol",
        "--atol",
        "--json",
        "--allow-module",
        "--verbose",
    ):
        assert option in replay
    assert "Exit status: 0 when every call passed" in replay


def test_version_option():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output == f"flashinfer, version {__version__}\n"


def _python_m(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    return subprocess.run(
        [sys.executable, "-m", "flashinfer", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.parametrize("case, code", [("pass", 0), ("mismatch", 1), ("missing", 2)])
def test_python_m_flashinfer_exit_status(session, root, case, code):
    if case == "mismatch":
        torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    target = root if case != "missing" else os.path.join(root, "absent")
    proc = _python_m("replay", *ALLOW, "--dir", target, "--device", "cpu")
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code != 2:
        assert proc.stdout.splitlines()[0] == f"Replaying session from {root}..."
    else:
        assert "does not exist" in proc.stderr
