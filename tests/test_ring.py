"""The flight recorder's ring (FLASHINFER_DUMP_RING, FLASHINFER_DUMP_ON): the last N calls,
on disk or in memory, written when a trigger fires. Every recording runs in a real child
process (signals, exits and crashes are the point)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest
import torch

from flashinfer_native import dumpdir
from flashinfer_native.replay import replay_from_dump, replay_sequence

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
PRELUDE = "import os, signal, sys, torch\nimport ring_helpers as h\n"
ALLOW = ["ring_helpers"]  # replay runs only APIs of allowed modules


def wait_for_line(stream, line):
    """Reads stream until line (the level-10 banner comes first on stdout); False at EOF."""
    for got in stream:
        if got == line + "\n":
            return True
    return False


def child_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_child(tmp_path, body, expect_rc=0, **env):
    """Runs body in a child at level 10 with env; returns the CompletedProcess."""
    src = PRELUDE + textwrap.dedent(body)
    r = subprocess.run(
        [sys.executable, "-c", src],
        env=child_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if expect_rc is not None:
        assert r.returncode == expect_rc, r.stderr
    return r


def session_lines(root):
    with open(root / "session.jsonl") as f:
        return [json.loads(line) for line in f]


def triggers(root):
    return [r for r in session_lines(root) if r.get("record_type") == "trigger"]


def dumped_indices(root):
    """The index argument of each dumped step call, in call order."""
    return [recs[0]["input_metadata"]["arg_1"] for _, recs in dumpdir.ordered_dumps(root)]


def assert_whole_dumps(root):
    """Every dump directory's files load with torch.load / json."""
    for path, records in dumpdir.ordered_dumps(root):
        assert records, path
        for name in os.listdir(path):
            assert not name.endswith(".tmp"), (path, name)
            if name.endswith(".pt"):  # CRCs filled in at write-out: zipfile checks them
                assert zipfile.ZipFile(os.path.join(path, name)).testzip() is None
                torch.load(os.path.join(path, name))
            if name.endswith(".chunks.json"):  # the in-memory ring's compact layout
                dumpdir.load_tensor_file(os.path.join(path, name))


def load(path, stem):
    """A call's inputs or outputs in either layout (the in-memory ring writes the compact
    one, the disk ring FlashInfer's: docs/flight-recorder.md#page-aware-capture)."""
    (name,) = [n for n in os.listdir(path) if n.startswith(stem + ".")]
    return dumpdir.load_tensor_file(os.path.join(path, name))


def has(path, stem):
    return any(n.startswith(stem + ".") for n in os.listdir(path))


STEPS = """
buf = torch.empty(8)
for i in range({n}):
    buf.fill_(i + 0.5)  # one buffer reused for every call
    h.step(buf, i, nan_at={nan_at})
"""


def test_nan_trigger_writes_the_16_calls_up_to_the_first_nan_in_order(tmp_path):
    # call 6,000 (index 5999) is the first with a NaN output
    run_child(
        tmp_path,
        STEPS.format(n=10000, nan_at=5999),
        FLASHINFER_DUMP_RING=16,
        FLASHINFER_DUMP_ON="nan",
    )
    root = tmp_path / "dumps"
    assert dumped_indices(root) == list(range(5984, 6000))
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    assert [r.get("comparison_match") for r in results] == [True] * 16
    (trig,) = triggers(root)
    assert trig["trigger"] == "nan" and trig["calls_written"] == 16
    last = dumpdir.ordered_dumps(root)[-1][0]
    assert trig["dump_dir"] == last and trig["function_name"] == "step"


def test_in_place_mutation_each_record_holds_its_call_values(tmp_path):
    run_child(
        tmp_path, STEPS.format(n=40, nan_at=-1), FLASHINFER_DUMP_RING=8, FLASHINFER_DUMP_ON="exit"
    )
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    dumps = dumpdir.ordered_dumps(root)
    assert dumped_indices(root) == list(range(32, 40))
    for i, (path, _) in zip(range(32, 40), dumps):
        x = load(path, "inputs")["arg_0"]
        assert torch.equal(x, torch.full((8,), i + 0.5))
        y = load(path, "outputs")["result"]
        assert torch.equal(y, torch.full((8,), 2 * i + 1.0))


def test_exit_trigger_writes_the_ring_at_normal_exit(tmp_path):
    run_child(
        tmp_path,
        STEPS.format(n=5, nan_at=-1),
        FLASHINFER_DUMP_RING=3,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_SAFETENSORS=1,
    )
    root = tmp_path / "dumps"
    assert dumped_indices(root) == [2, 3, 4]
    assert [t["trigger"] for t in triggers(root)] == ["exit"]
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    assert [r.get("comparison_match") for r in results] == [True] * 3


def test_nothing_is_written_before_a_trigger(tmp_path):
    run_child(
        tmp_path,
        STEPS.format(n=20, nan_at=-1),
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="nan,exception",
    )
    assert not (tmp_path / "dumps").exists()


def test_exception_trigger_includes_the_raising_call(tmp_path):
    body = (
        STEPS.format(n=10, nan_at=-1)
        + """
try:
    h.fail(torch.zeros(2, 3))
except ValueError:
    pass
"""
    )
    run_child(tmp_path, body, FLASHINFER_DUMP_RING=4, FLASHINFER_DUMP_ON="exception")
    root = tmp_path / "dumps"
    dumps = dumpdir.ordered_dumps(root)
    assert [recs[-1]["function_name"] for _, recs in dumps] == ["step"] * 3 + ["fail"]
    last = dumps[-1][1][-1]
    assert last["execution_status"] == "exception"
    assert last["exception"] == {"type": "ValueError", "message": "refused (2, 3)"}
    (trig,) = triggers(root)
    assert trig["trigger"] == "exception" and trig["dump_dir"] == dumps[-1][0]


def test_max_triggers_caps_how_often_the_ring_is_written(tmp_path):
    body = """
for i in range(6):
    h.step(torch.ones(2), i, nan_at=i if i % 2 else -1)
"""
    run_child(
        tmp_path,
        body,
        FLASHINFER_DUMP_RING=2,
        FLASHINFER_DUMP_ON="nan",
        FLASHINFER_DUMP_MAX_TRIGGERS=2,
    )
    root = tmp_path / "dumps"
    # calls 1 and 3 fire: the ring starts again after the first, so 2-3 go with the second
    assert [t["calls_written"] for t in triggers(root)] == [2, 2]
    assert dumped_indices(root) == [0, 1, 2, 3]


def test_nan_input_trigger_checks_the_inputs(tmp_path):
    body = """
h.step(torch.ones(2), 0)
h.step(torch.tensor([1.0, float("inf")]), 1)
"""
    run_child(tmp_path, body, FLASHINFER_DUMP_RING=4, FLASHINFER_DUMP_ON="inf,nan_input")
    assert dumped_indices(tmp_path / "dumps") == [0, 1]
    assert triggers(tmp_path / "dumps")[0]["trigger"] == "inf"


CRASH = STEPS.format(n=6, nan_at=-1) + "h.{func}(torch.arange(3.0))\n"


def crash_status(tmp_path, func, **env):
    """Exit status of the crash script with the given recorder settings."""
    return run_child(tmp_path, CRASH.format(func=func), expect_rc=None, **env).returncode


def check_crash_dump(tmp_path, func, sig):
    plain = crash_status(tmp_path, func, FLASHINFER_LOGLEVEL=0)
    assert plain < 0  # -sig; under ASan (make asan-test) its own handler's SIGABRT
    rc = crash_status(tmp_path, func, FLASHINFER_DUMP_RING=4, FLASHINFER_DUMP_ON="signal")
    assert rc == plain
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    dumps = dumpdir.ordered_dumps(root)
    assert [recs[-1]["function_name"] for _, recs in dumps] == ["step"] * 3 + [func]
    crashed = dumps[-1][1]
    assert [r["execution_status"] for r in crashed] == ["inputs_saved"]
    for path, _ in dumps[:-1]:
        assert replay_from_dump(
            path, compare_outputs=True, device="cpu", run=True, allow_modules=ALLOW
        )["comparison_match"]
    args = replay_from_dump(dumps[-1][0], device="cpu")["args"]
    assert torch.equal(args[0], torch.arange(3.0))
    (trig,) = triggers(root)
    assert trig["trigger"] == "signal" and trig["signal"] == signal.Signals(sig).name
    assert trig["dump_dir"] == dumps[-1][0]


def test_segfault_in_a_call_writes_the_ring_and_keeps_the_exit_status(tmp_path):
    check_crash_dump(tmp_path, "segfault", signal.SIGSEGV)


def test_stack_overflow_in_a_call_writes_the_ring_from_the_alternate_stack(tmp_path):
    check_crash_dump(tmp_path, "stack_overflow", signal.SIGSEGV)


def test_sigabrt_in_a_call_writes_the_ring_and_keeps_the_exit_status(tmp_path):
    check_crash_dump(tmp_path, "abort", signal.SIGABRT)


def test_sigusr1_dumps_a_live_process_which_goes_on(tmp_path):
    body = (
        STEPS.format(n=5, nan_at=-1)
        + """
print("ready", flush=True)
sys.stdin.readline()
h.step(torch.ones(2), 99)
print("alive", flush=True)
"""
    )
    p = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env=child_env(tmp_path, FLASHINFER_DUMP_RING=2, FLASHINFER_DUMP_ON="signal"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wait_for_line(p.stdout, "ready")
    p.send_signal(signal.SIGUSR1)
    root = tmp_path / "dumps"
    deadline = time.monotonic() + 60
    while not (root / "session.jsonl").exists() or not triggers(root):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    out, _ = p.communicate("go\n", timeout=60)
    assert p.returncode == 0 and out == "alive\n"
    assert dumped_indices(root) == [3, 4]
    assert triggers(root)[0]["signal"] == "SIGUSR1"


def test_budget_evicts_the_oldest_calls(tmp_path):
    # 1 MiB in + 1 MiB out per call, no two chunks alike (the compact layout stores equal
    # chunks once); a budget of about 5 MiB keeps 2 calls
    body = """
import flashinfer.api_logging as al
for i in range(10):
    h.step(torch.arange(float(i << 18), float((i + 1) << 18)), i)
    assert al._LOGGER.ring_bytes() <= 5 << 20, al._LOGGER.ring_bytes()
"""
    run_child(
        tmp_path,
        body,
        FLASHINFER_DUMP_RING=16,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_RING_MAX_GB=5 / 1024,
    )
    assert dumped_indices(tmp_path / "dumps") == [8, 9]


def test_call_larger_than_the_budget_keeps_its_records_only(tmp_path):
    body = """
h.step(torch.ones(4), 0)
h.step(torch.ones(1 << 20), 1)
"""
    run_child(
        tmp_path,
        body,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_RING_MAX_GB=1 / 1024,
    )
    root = tmp_path / "dumps"
    ((path, records),) = [
        d for d in dumpdir.ordered_dumps(root) if d[1][0]["input_metadata"]["arg_1"]
    ]
    assert records[0]["tensors_skipped"] == "ring budget"
    assert sorted(os.listdir(path)) == ["metadata.jsonl"]
    log = (tmp_path / "log.txt").read_text()
    assert log.count("is larger than the flight recorder's budget") == 1


def test_threads_and_processes_share_one_root(tmp_path):
    body = """
import threading
def work(t):
    for i in range(50):
        h.step(torch.full((64,), t * 1000.0 + i), t * 1000 + i)
threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
"""
    env = child_env(tmp_path, FLASHINFER_DUMP_RING=8, FLASHINFER_DUMP_ON="exit")
    src = PRELUDE + textwrap.dedent(body)
    procs = [subprocess.Popen([sys.executable, "-c", src], env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    dumps = dumpdir.ordered_dumps(root)
    per_pid = {}
    for path, recs in dumps:
        x = load(path, "inputs")["arg_0"]
        assert torch.equal(x, torch.full((64,), float(recs[0]["input_metadata"]["arg_1"])))
        per_pid.setdefault(recs[0]["process_id"], []).append(recs[-1]["execution_status"])
    assert sorted(len(v) for v in per_pid.values()) == [8, 8]
    assert all(s == ["completed"] * 8 for s in per_pid.values())
    assert len(triggers(root)) == 2


def test_threads_racing_evictions_and_triggers_keep_each_call_whole(tmp_path):
    # A thread that drops the GIL inside a call (a tiny switch interval forces it) must
    # not find its slot taken over by other threads' calls, or freed by their triggers:
    # every written call's tensors are its own (this once mixed calls' files).
    body = """
import threading
sys.setswitchinterval(1e-6)
def work(t):
    for i in range(150):
        h.step(torch.full((64,), t * 1000.0 + i), t * 1000 + i)
        if i % 7 == 3:
            try:
                h.fail(torch.ones(1))
            except ValueError:
                pass
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for t in threads: t.start()
for t in threads: t.join()
"""
    run_child(
        tmp_path,
        body,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="exception",
        FLASHINFER_DUMP_MAX_TRIGGERS=100000,
    )
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    steps = 0
    for path, recs in dumpdir.ordered_dumps(root):
        if recs[0]["function_name"] != "step":
            continue
        steps += 1
        v = float(recs[0]["input_metadata"]["arg_1"])
        assert all(r["input_metadata"]["arg_1"] == v for r in recs), path
        x = load(path, "inputs")["arg_0"]
        assert torch.equal(x, torch.full((64,), v)), path
        if has(path, "outputs"):
            y = load(path, "outputs")["result"]
            assert torch.equal(y, torch.full((64,), 2 * v)), path
    assert steps > 100  # about 3 steps per trigger, 8 * 21 triggers


def test_disk_ring_keeps_exactly_the_last_n_directories(tmp_path):
    run_child(tmp_path, STEPS.format(n=50, nan_at=-1), FLASHINFER_DUMP_RING=5)
    root = tmp_path / "dumps"
    assert len(os.listdir(root)) == 5  # no session.jsonl: the directories are the record
    assert dumped_indices(root) == list(range(45, 50))
    results = replay_sequence(str(root), device="cpu", allow_modules=ALLOW)
    assert [r.get("comparison_match") for r in results] == [True] * 5


def test_disk_ring_killed_at_any_point_leaves_whole_dumps(tmp_path):
    body = """
i = 0
while True:
    h.step(torch.full((1 << 14,), float(i)), i)
    if i == 3:
        print("recording", flush=True)
    i += 1
"""
    env = child_env(tmp_path, FLASHINFER_DUMP_RING=3)
    root = tmp_path / "dumps"
    for delay in (0.0, 0.05, 0.3, 0.7):
        p = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert wait_for_line(p.stdout, "recording")
        time.sleep(delay)
        p.kill()
        p.wait()
        p.stdout.close()
        dumps = dumpdir.ordered_dumps(root)
        assert dumps
        for path, recs in dumps:
            assert recs, path
            x = load(path, "inputs")["arg_0"]
            assert torch.equal(x, torch.full((1 << 14,), float(recs[0]["input_metadata"]["arg_1"])))
            if recs[-1]["execution_status"] == "completed":
                load(path, "outputs")


def test_bad_ring_settings_warn_once_and_fall_back(tmp_path):
    r = run_child(
        tmp_path,
        "h.step(torch.ones(2), 0)\nh.step(torch.ones(2), 1)\n",
        FLASHINFER_DUMP_RING="-3",
        FLASHINFER_DUMP_ON="nan,bogus",
        FLASHINFER_DUMP_RING_MAX_GB="lots",
        FLASHINFER_DUMP_MAX_TRIGGERS="x",
    )
    for var, value in [
        ("FLASHINFER_DUMP_RING", "-3"),
        ("FLASHINFER_DUMP_RING_MAX_GB", "lots"),
        ("FLASHINFER_DUMP_MAX_TRIGGERS", "x"),
    ]:
        assert r.stderr.count(f"invalid value {var}={value};") == 1, r.stderr
    assert r.stderr.count("FLASHINFER_DUMP_ON: 'bogus' is not a trigger") == 1, r.stderr
    # no ring: plain level 10 dumps every call
    assert dumped_indices(tmp_path / "dumps") == [0, 1]


def test_dumps_shows_the_trigger_and_marks_the_triggering_call(tmp_path):
    from click.testing import CliRunner

    from flashinfer_native.cli import cli

    body = (
        STEPS.format(n=3, nan_at=-1)
        + """
try:
    h.fail(torch.zeros(1))
except ValueError:
    pass
"""
    )
    run_child(tmp_path, body, FLASHINFER_DUMP_RING=2, FLASHINFER_DUMP_ON="exception")
    root = tmp_path / "dumps"
    failing = os.path.basename(dumpdir.ordered_dumps(root)[-1][0])
    out = CliRunner().invoke(cli, ["dumps", "--dir", str(root)]).output
    pid = dumpdir.ordered_dumps(root)[-1][1][0]["process_id"]
    assert f"  exception at {failing} (pid {pid}): 2 calls written\n" in out
    assert f"  {failing}: ValueError: refused (1,)  <- trigger: exception\n" in out
    summary = json.loads(CliRunner().invoke(cli, ["dumps", "--dir", str(root), "--json"]).output)
    assert [(t["trigger"], t["dir"]) for t in summary["triggers"]] == [("exception", failing)]
    assert summary["calls"] == 2


def test_report_marks_the_ring_trigger_on_the_timeline(tmp_path):
    from flashinfer_native.report import write_report

    run_child(
        tmp_path, STEPS.format(n=8, nan_at=5), FLASHINFER_DUMP_RING=4, FLASHINFER_DUMP_ON="nan"
    )
    out = tmp_path / "report.html"
    done = write_report(tmp_path / "dumps", out)
    page = out.read_text()
    assert done["triggers"] == 1
    assert re.search(r'<text class="trigger" [^>]*>nan</text>', page)


def test_host_staging_passes_cpu_tensors_through_uncopied():
    # the CUDA path (side stream, pinned copies) runs in tests/gpu/test_cuda_ring.py
    from flashinfer_native import staging

    x = torch.ones(3)
    host = staging.to_host({"x": x})
    assert host["x"] is x


CONJ_VIEWS = """
z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
h.checksum(z.conj())  # the conj bit, on a complex view
h.checksum(z.conj().imag)  # the neg bit, on a float32 view
"""


@pytest.mark.parametrize(
    "env",
    [
        {"FLASHINFER_DUMP_RING": 4, "FLASHINFER_DUMP_ON": "exit"},
        {
            "FLASHINFER_DUMP_RING": 4,
            "FLASHINFER_DUMP_ON": "exit",
            "FLASHINFER_DUMP_LAYOUT": "flashinfer",
        },
        {},
    ],
    ids=["memory ring", "memory ring, flashinfer layout", "plain level 10"],
)
def test_conj_and_neg_views_are_recorded_by_value(tmp_path, env):
    # the recorder reads each tensor's bits once per call (fi_tensor_seen): a view with the
    # conj or the neg bit is still written as the values it stands for
    run_child(tmp_path, CONJ_VIEWS, **env)
    (conj, _), (neg, _) = dumpdir.ordered_dumps(tmp_path / "dumps")
    z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    assert torch.equal(load(conj, "inputs")["arg_0"], z.conj().resolve_conj())
    assert torch.equal(load(neg, "inputs")["arg_0"], torch.tensor([-2.0, 4.0]))
