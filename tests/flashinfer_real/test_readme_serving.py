"""The README's quick start 3, serving an installed FlashInfer, run as written.

Every command of the block runs in a shell of this virtualenv (flashinfer-python
0.7.2.post1 and ``pip install ./native``), in a folder where the two things a reader
brings are stand-ins: ``serve.py`` and the module ``vllm.entrypoints.openai.api_server``
both run ``session.py`` (FlashInfer calls that run on a CPU). ``pip install ./native``
is what ``make test-flashinfer`` did already; the test checks its start-up hook instead.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")


def quick_start_commands():
    """The command lines of the README's serving quick start (comments dropped)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Quick start 3") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme")
    shutil.copy(os.path.join(HERE, "session.py"), cwd / "serve.py")
    server = cwd / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for folder in (cwd / "vllm", cwd / "vllm" / "entrypoints", server):
        (folder / "__init__.py").write_text("")
    shutil.copy(os.path.join(HERE, "session.py"), server / "api_server.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    env["FLASHINFER_LOGDEST"] = str(cwd / "log.txt")
    out = {}
    for command in quick_start_commands():
        if command.startswith("pip install"):
            continue
        out[command] = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    return cwd, out


def result(ran, start):
    (command,) = [c for c in ran[1] if c.startswith(start)]
    proc = ran[1][command]
    assert proc.returncode == 0, f"{command}\n{proc.stdout}{proc.stderr}"
    return proc


def test_the_block_is_the_commands_this_test_runs():
    commands = quick_start_commands()
    assert commands[0] == "pip install ./native"
    assert [c.split()[0] for c in commands[1:]] == [
        "flashinfer-native",
        "FLASHINFER_NATIVE_LOGGING=1",
        "flashinfer-native",
        "flashinfer-native",
        "flashinfer-native",
    ]


def test_info_says_the_core_serves_flashinfer_and_where_the_hook_is(ran):
    out = result(ran, "flashinfer-native info").stdout
    assert "flashinfer: 0.7.2.post1 (FlashInfer (flashinfer-python))\n" in out
    assert "served by the native core in this process: yes\n" in out
    hook = re.search(r"^start-up hook \(\.pth\): (.*)$", out, re.M).group(1)
    assert hook.endswith("flashinfer_native_hook.pth") and os.path.isfile(hook)
    assert "FLASHINFER_NATIVE_LOGGING: unset (off for processes started here)\n" in out


def test_the_switch_logs_every_call_through_the_core(ran):
    result(ran, "FLASHINFER_NATIVE_LOGGING=1")
    with open(ran[0] / "log.txt") as f:
        log = f.read()
    assert "FlashInfer API Call: rmsnorm" in log
    assert "FlashInfer API Call: shuffle_matrix_a" in log


def test_run_records_the_module_at_level_10_and_dumps_summarises_it(ran):
    result(ran, "flashinfer-native run")
    out = result(ran, "flashinfer-native dumps").stdout
    assert "3 calls: 2 completed, 1 exception, 0 incomplete\n" in out
    assert "  rmsnorm: 1\n" in out


def test_replay_of_the_recording_passes(ran):
    out = result(ran, "flashinfer-native replay").stdout
    assert out.splitlines() == [
        "Replaying session from dumps...",
        "Summary: 3 passed, 0 failed/mismatch",
    ]
