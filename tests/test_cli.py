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
        f"[5] check_positive ({n[4]}): ✅ Passed (raised ValueError, as recorded)",
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
        "ran": 0,
        "setup": {},
        "skipped": 0,
    }
    first = report["results"][0]
    assert first["status"] == "mismatch" and first["function_name"] == "scale_add"
    assert first["dir_name"] == names(session)[0]
    assert first["mismatches"][0].startswith("result: values differ")
    assert [r["status"] for r in report["results"][1:]] == ["passed"] * 4


def test_a_directory_holding_no_dump_is_one_line_and_exit_1(tmp_path):
    for command in (["replay", *ALLOW, "--device", "cpu"], ["dumps"], ["report"]):
        result = invoke(*command, str(tmp_path))
        assert result.exit_code == 1, (command, result.output)
        assert result.output == (
            f"Error: {tmp_path}: holds no dump (no metadata.jsonl in it or in a "
            "sub-directory, no session.jsonl); pass a dump root (FLASHINFER_DUMP_DIR) or one "
            "call's directory\n"
        )


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
    assert result.exit_code == 2 and "Missing argument 'DIR'" in result.output


@pytest.mark.parametrize("command", ["replay", "dumps"])
def test_the_directory_is_positional_and_dir_is_still_accepted(session, root, command):
    extra = [*ALLOW, "--device", "cpu"] if command == "replay" else []
    positional = invoke(command, root, *extra)
    option = invoke(command, "--dir", root, *extra)
    assert positional.exit_code == option.exit_code == 0, positional.output
    assert positional.output == option.output
    both = invoke(command, root, "--dir", session.dirs[0], *extra)
    assert both.exit_code == 2
    assert "give the directory once: as DIR or with --dir, not both" in both.output


def test_include_pulls_in_the_init_and_plan_a_method_call_needs(session, root):
    result = replay(root, "--device", "cpu", "--include", "*.run")
    n = names(session)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        f"[1] SegmentSumWrapper.__init__ ({n[1]}): ✅ Passed [setup]",
        f"[2] SegmentSumWrapper.plan ({n[2]}): ✅ Passed [setup]",
        f"[3] SegmentSumWrapper.run ({n[3]}): ✅ Passed",
        "Summary: 1 passed, 0 failed/mismatch; 2 setup calls (2 passed)",
    ]


def test_a_filter_matching_nothing_is_one_line_and_exit_1(session, root):
    result = replay(root, "--device", "cpu", "--include", "nothing*")
    assert result.exit_code == 1
    assert result.output.startswith(
        f"Error: no call of {root} matches --include 'nothing*' --exclude '' (5 calls of "
        "5 APIs: SegmentSumWrapper.__init__, "
    )


def test_quiet_prints_the_summary_only(session, root):
    torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    result = replay(root, "--device", "cpu", "--quiet")
    assert result.exit_code == 1
    assert result.output == "Summary: 4 passed, 1 failed/mismatch\n"


def test_failures_only_prints_the_calls_that_did_not_pass(session, root):
    torch.save({"result": torch.zeros(4)}, os.path.join(session.dirs[0], "outputs.pt"))
    result = replay(root, "--device", "cpu", "--failures-only")
    lines = result.output.splitlines()
    assert result.exit_code == 1
    assert lines[0] == f"Replaying session from {root}..."
    assert lines[1] == f"[1] scale_add ({names(session)[0]}): ❌ Mismatch"
    assert lines[2].startswith("    result: values differ")
    assert lines[-1] == "Summary: 4 passed, 1 failed/mismatch"
    assert len(lines) == 4


def test_run_incomplete_runs_a_call_recorded_with_inputs_only(root):
    writer = h.DumpWriter(root)
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    writer.crash(h.scale_add, torch.ones(2), torch.ones(2))
    result = replay(root, "--device", "cpu", "--run-incomplete")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2] == (
        f"[2] scale_add ({names(writer)[1]}): ✅ Ran (recorded with inputs only: nothing to "
        "compare)"
    )
    assert result.output.splitlines()[-1] == (
        "Summary: 1 passed, 0 failed/mismatch, 1 incomplete ran (nothing to compare)"
    )


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


def test_dumps_of_one_call_directory_counts_that_call(session):
    result = invoke("dumps", session.dirs[0])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:2] == [
        f"Session {session.dirs[0]} (metadata.jsonl (one call))",
        "1 calls: 1 completed, 0 exception, 0 incomplete",
    ]


def test_dumps_never_walks_a_directory_that_holds_no_dump(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "file").write_text("x")

    def no_walk(*args):
        raise AssertionError("os.walk over a directory holding no dump")

    monkeypatch.setattr(os, "walk", no_walk)
    result = invoke("dumps", str(tmp_path))
    assert result.exit_code == 1 and "holds no dump" in result.output


def test_dumps_quiet_and_failures_only(session, root):
    quiet = invoke("dumps", root, "--quiet").output
    assert "Calls per API:" not in quiet and "Completed calls:" not in quiet
    assert "5 calls: 4 completed, 1 exception, 0 incomplete\n" in quiet
    failures = invoke("dumps", root, "--failures-only").output
    assert "Completed calls:" not in failures and "Calls per API:" not in failures
    assert failures.endswith(
        f"Exception calls:\n  {names(session)[4]}: ValueError: check_positive: x has "
        "negative elements\n"
    )


def test_repro_of_a_session_root_names_a_call_directory(session, root, tmp_path):
    result = invoke("repro", root, "-o", str(tmp_path / "out"), *ALLOW)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {os.path.abspath(root)} is a session root (5 calls); repro takes one call's "
        f"directory, such as {os.path.join(os.path.abspath(root), names(session)[4])}\n"
    )


def test_dumps_without_session_file_reads_dump_dirs(session, root):
    os.remove(os.path.join(root, "session.jsonl"))
    data = json.loads(invoke("dumps", "--dir", root, "--json").output)
    assert data["calls"] == 5 and len(data["completed"]) == 4
    assert data["source"] == "metadata.jsonl files (no session.jsonl)"


def test_info_reports_build_and_versions():
    from flashinfer_native import _C

    result = invoke("info")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    core = os.path.dirname(_C.__file__)
    assert lines[0] == f"flashinfer-native: {flashinfer_native.__version__} ({core})"
    assert lines[1] == f"flashinfer: {__version__} (this repository's mirror)"
    assert lines[2] == "served by the native core in this process: yes"
    assert lines[3].startswith("import hook in this process: ")
    assert lines[4].startswith("FLASHINFER_NATIVE_LOGGING: ")
    assert lines[5].startswith("start-up hook (.pth): ")
    assert lines[6] == f"torch: {torch.__version__}"
    assert lines[7] == f"CPU paths: {_C.cpu_isa_paths} (this process: {_C.cpu_isa()})"
    assert lines[8].startswith("CUDA kernels built: ")
    assert lines[9].startswith("CUDA statistics kernel built: ")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert f"GPUs visible: {gpus}" in lines


def test_info_says_whether_the_switch_is_on_and_where_the_hook_file_is(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, FLASHINFER_NATIVE_LOGGING="0")
    script = os.path.join(os.path.dirname(sys.executable), "flashinfer-native")
    out = subprocess.run(
        [script, "info"], capture_output=True, text=True, env=env, timeout=120
    ).stdout
    assert "FLASHINFER_NATIVE_LOGGING: '0' (off for processes started here)\n" in out
    assert "import hook in this process: installed\n" in out
    # this virtualenv has ./native installed editable, which leaves the start-up hook out
    assert (
        "start-up hook (.pth): not installed (pip install ./native (from a flashinfer-c "
        "checkout) installs it)\n" in out
    )
    env["FLASHINFER_CPU_ISA"] = "portable"
    out = subprocess.run(
        [script, "info"], capture_output=True, text=True, env=env, timeout=120
    ).stdout
    assert "(this process: portable)\n" in out


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
        "--quiet",
        "--failures-only",
        "--run-incomplete",
    ):
        assert option in replay
    assert "Exit status: 0 when every call passed" in replay


def test_version_option():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output == f"flashinfer-native, version {__version__}\n"


def _console_script(name, *args, cwd=REPO, pythonpath=REPO):
    script = os.path.join(os.path.dirname(sys.executable), name)
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run(
        [script, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "command, name",
    [
        (["flashinfer-native"], "flashinfer-native"),
        (["flashinfer"], "flashinfer"),
        ([sys.executable, "-m", "flashinfer_native"], "python -m flashinfer_native"),
        ([sys.executable, "-m", "flashinfer"], "python -m flashinfer"),
    ],
)
def test_every_message_names_the_program_as_it_was_run(command, name):
    if not os.path.isabs(command[0]):
        command = [os.path.join(os.path.dirname(sys.executable), command[0])]
    env = dict(os.environ, PYTHONPATH=REPO)

    def run(*args):
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
        )

    version = run("--version")
    assert version.returncode == 0 and version.stdout == f"{name}, version {__version__}\n"
    usage = run("replay", "--bogus")
    assert usage.returncode == 2
    assert f"Try '{name} replay --help' for help." in usage.stderr, usage.stderr


def test_allow_module_finds_a_module_of_the_current_directory(session, root):
    # the console script's sys.path lacks the current directory; python -m has it
    proc = _console_script(
        "flashinfer-native", "replay", root, *ALLOW, "--device", "cpu", cwd=TESTS
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "Summary: 5 passed, 0 failed/mismatch"


def test_allow_module_that_does_not_import_is_one_line_and_exit_1(session, root):
    result = invoke("replay", root, "--allow-module", "no_such_module_h26")
    assert result.exit_code == 1
    assert result.output.startswith(
        "Error: --allow-module: allowed module pattern 'no_such_module_h26': cannot import "
        "module 'no_such_module_h26' (ModuleNotFoundError: "
    )
    assert len(result.output.splitlines()) == 1


def test_run_of_a_module_that_does_not_exist_is_one_line_and_exit_1():
    proc = _console_script("flashinfer-native", "run", "-m", "no_such_module_h26")
    assert proc.returncode == 1
    assert proc.stderr == (
        "Error: no module named 'no_such_module_h26' (run -m takes a module name)\n"
    )


def test_run_options_set_the_variables_for_the_script(tmp_path):
    script = tmp_path / "show.py"
    names_ = [
        "FLASHINFER_NATIVE_LOGGING",
        "FLASHINFER_LOGLEVEL",
        "FLASHINFER_DUMP_DIR",
        "FLASHINFER_DUMP_RING",
        "FLASHINFER_DUMP_ON",
        "FLASHINFER_DUMP_INCLUDE",
    ]
    script.write_text(f"import os\nprint([os.environ.get(n) for n in {names_!r}])\n")
    args = ["--level", "10", "--dump-dir", "d", "--ring", "4", "--dump-on", "nan,signal"]
    proc = _console_script(
        "flashinfer-native", "run", *args, "--include", "*.run", str(script), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['1', '10', 'd', '4', 'nan,signal', '*.run']\n"


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
