"""tools/gpu_check.sh on a machine without a GPU: it builds, runs every step that needs no
device, names the steps it skipped, and one failing step does not stop the others."""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_STEPS = [
    "graph",
    "ring-nan",
    "bench-attention",
    "bench-gemm",
    "bench-stats",
    "bench-level10",
    "bench-serving",
]
HOST_STEPS = ["build", "tests-gpu", "examples", "mm-fp4-level10"]

pytestmark = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this test is the check without a GPU"
)


def tracked_copy(dest):
    """The repository's files as a fresh clone has them (no builds, no virtualenvs)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for f in files:
        src = os.path.join(REPO, f)
        if os.path.isfile(src) or os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f), follow_symlinks=False)
    return dest


def run_check(tree, out, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_", "GPU_CHECK"))}
    e.update(PYTHON=sys.executable, **env)
    return subprocess.run(
        [os.path.join(tree, "tools", "gpu_check.sh"), str(out)],
        env=e,
        capture_output=True,
        text=True,
        timeout=1500,
    )


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    tree = tracked_copy(str(tmp_path_factory.mktemp("tree")))
    out = tmp_path_factory.mktemp("out")
    return tree, out, run_check(tree, out)


def test_runs_the_host_steps_and_skips_the_device_steps(checked):
    tree, out, r = checked
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    status = {s["step"]: s["status"] for s in summary["steps"]}
    assert status == {**{s: "passed" for s in HOST_STEPS}, **{s: "skipped" for s in DEVICE_STEPS}}
    assert summary["skipped"] == DEVICE_STEPS and summary["failed"] == []
    assert summary["machine"].startswith("no CUDA device")
    assert sorted(os.listdir(out)) == ["gpu_check.log", "junit.xml", "summary.json"]


def test_prints_the_table_last(checked):
    tree, out, r = checked
    lines = r.stdout.rstrip("\n").splitlines()
    assert lines[-1] == "steps: 4 passed, 0 failed, 7 skipped"
    table = lines[-12:-1]
    assert [line.split()[0] for line in table] == HOST_STEPS + DEVICE_STEPS
    assert all(line.split()[1] == "skipped" for line in table[4:])
    assert all(line.endswith("needs a CUDA device") for line in table[4:])
    assert (out / "gpu_check.log").read_text().rstrip("\n").endswith(lines[-1])


def test_collects_tests_gpu_into_junit(checked):
    tree, out, r = checked
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    gpu_tests = int(suite.get("tests"))
    assert gpu_tests > 50 and int(suite.get("skipped")) == gpu_tests
    assert int(suite.get("errors")) == 0 and int(suite.get("failures")) == 0


def test_a_failing_step_does_not_stop_the_rest(checked, tmp_path):
    tree, _, _ = checked
    broken = os.path.join(tree, "examples", "batch_decode_reproducer.py")
    saved = open(broken).read()
    try:
        with open(broken, "w") as f:
            f.write("raise SystemExit(3)\n")
        r = run_check(tree, tmp_path, GPU_CHECK_STEPS="examples,mm-fp4-level10,graph")
    finally:
        with open(broken, "w") as f:
            f.write(saved)
    assert r.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [
        ("examples", "FAILED"),
        ("mm-fp4-level10", "passed"),
        ("graph", "skipped"),
    ]
    assert r.stdout.rstrip().splitlines()[-1] == "steps: 1 passed, 1 failed, 1 skipped"
