"""The flight recorder's ring on the worst day (docs/ring.md): threads, signals during a
write-out, fork, a full disk, one call over the budget and a memory limit. Each test runs
a real child process; each guards one way the ring once broke."""

import ctypes
import json
import os
import platform
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from test_ring import (
    PRELUDE,
    assert_whole_dumps,
    child_env,
    has,
    load,
    run_child,
    session_lines,
    triggers,
)

from flashinfer_native import dumpdir

# tgkill(2), which signals one thread of another process
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[platform.machine()]


def last_line(text):
    """The child's own last line of output (the level-10 banner comes first on stdout)."""
    return text.splitlines()[-1]


def dumps_by_pid(root):
    """{pid: [step index, or the API name for other calls]} in call order."""
    out = {}
    for path, recs in dumpdir.ordered_dumps(root):
        first = recs[0]
        name = first["function_name"]
        key = first["input_metadata"]["arg_1"] if name == "step" else name
        assert f"_pid{first['process_id']}_" in os.path.basename(path), path
        out.setdefault(first["process_id"], []).append(key)
    return out


def assert_each_call_holds_its_own_tensors(root):
    """Every step call's files hold the values of its own index (x = i + 0.5, y = 2x)."""
    for path, recs in dumpdir.ordered_dumps(root):
        if recs[0]["function_name"] != "step" or recs[0].get("tensors_skipped"):
            continue
        i = recs[0]["input_metadata"]["arg_1"]
        assert all(r["input_metadata"]["arg_1"] == i for r in recs), path
        x = load(path, "inputs")["arg_0"]
        assert torch.all(x == i + 0.5), path
        if has(path, "outputs"):
            y = load(path, "outputs")["result"]
            assert torch.all(y == 2 * i + 1.0), path


def assert_records_once(root):
    """session.jsonl holds each call's record of each status once."""
    seen = [
        (r["dump_dir"], r["execution_status"])
        for r in session_lines(root)
        if r.get("record_type") != "trigger"
    ]
    assert len(seen) == len(set(seen)), [s for s in seen if seen.count(s) > 1][:4]


def no_hidden_entries(root):
    return [n for n in os.listdir(root) if n.startswith(".")]


# ------------------------------------------------ write-outs, one at a time


def read_byte(fd, timeout=120):
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "the child did not get there"
    return os.read(fd, 1)


HELD = """
import threading, time
import flashinfer.api_logging as al
lg = al._LOGGER
for i in range(4):  # 1 MB tensors: their copies are mappings of their own, unmapped when freed
    h.step(torch.full((1 << 18,), i + 0.5), i)
lg._hold_ring_writeouts(int(os.environ["HOLD_FD"]), int(os.environ["NOTE_FD"]))
victim = threading.Thread(target=time.sleep, args=(300,), daemon=True)
victim.start()
# the signal lands on a thread asleep without the GIL: its handler's write-out is held
# open there while this thread goes on
stat = f"/proc/self/task/{victim.native_id}/stat"
while open(stat).read().rsplit(")", 1)[1].split()[0] != "S":
    time.sleep(0.01)
signal.pthread_kill(victim.ident, signal.SIGUSR1)
sys.stdin.readline()  # the write-out wrote its first call and is held
for i in range(4, 10):  # new calls, once evicting and freeing what the write-out read
    h.step(torch.full((1 << 18,), i + 0.5), i)
print("manual", lg.dump_ring("manual"), flush=True)
"""


def test_a_second_trigger_waits_for_a_held_write_out_and_new_calls_free_nothing(tmp_path):
    hold_r, hold_w = os.pipe()
    note_r, note_w = os.pipe()
    env = child_env(
        tmp_path,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal",
        FLASHINFER_DUMP_MAX_TRIGGERS=10,
        HOLD_FD=hold_r,
        NOTE_FD=note_w,
    )
    p = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(HELD)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(hold_r, note_w),
    )
    os.close(hold_r)
    os.close(note_w)
    try:
        assert read_byte(note_r) == b"h"  # the signal's write-out, held after one call
        p.stdin.write("go\n")
        p.stdin.flush()
        assert read_byte(note_r) == b"w"  # the manual trigger waits for it
        os.write(hold_w, b"xxx")  # the signal's write-out; the manual one's, and its freeing
        out, _ = p.communicate(timeout=120)
    finally:
        p.kill()
        os.close(hold_w)
        os.close(note_r)
    assert p.returncode == 0 and last_line(out) == "manual 0", (p.returncode, out)
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    assert_each_call_holds_its_own_tensors(root)
    assert_records_once(root)
    # the signal wrote the four calls; the manual trigger merged into it; the calls made
    # meanwhile were not kept (the ring starts again after a write-out)
    assert dumps_by_pid(root) == {p.pid: [0, 1, 2, 3]}
    sig, manual = triggers(root)
    assert (sig["signal"], sig["calls_written"]) == ("SIGUSR1", 4)
    assert (manual["trigger"], manual["calls_written"], manual["calls_written_before"]) == (
        "manual",
        0,
        4,
    )


FREEING = """
import threading, time
import flashinfer.api_logging as al
lg = al._LOGGER
for i in range(4):
    h.step(torch.full((64,), i + 0.5), i)
victim = threading.Thread(target=time.sleep, args=(300,), daemon=True)
victim.start()
print("victim", victim.native_id, flush=True)
lg._hold_ring_writeouts(int(os.environ["HOLD_FD"]), int(os.environ["NOTE_FD"]))
print("manual", lg.dump_ring("manual"), flush=True)
"""


def thread_settled(pid, tid):
    """The thread has no signal pending and sleeps (S): a handler that ran has returned."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return status["State"].split()[0] == "S" and int(status["SigPnd"], 16) == 0


def test_a_signal_while_a_write_out_frees_what_it_wrote_does_not_wait_for_it(tmp_path):
    # free() in the write-out may wait for a malloc lock that the signalled thread holds:
    # a handler that waited for the write-out there would hang both threads for good
    hold_r, hold_w = os.pipe()
    note_r, note_w = os.pipe()
    env = child_env(
        tmp_path,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal",
        FLASHINFER_DUMP_MAX_TRIGGERS=10,
        HOLD_FD=hold_r,
        NOTE_FD=note_w,
    )
    p = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(FREEING)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(hold_r, note_w),
    )
    os.close(hold_r)
    os.close(note_w)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        victim = None
        for line in p.stdout:
            if line.startswith("victim "):
                victim = int(line.split()[1])
                break
        assert read_byte(note_r) == b"h"  # the manual write-out, after its first call
        os.write(hold_w, b"x")
        assert read_byte(note_r) == b"f"  # held before it frees the calls it wrote
        assert libc.syscall(SYS_TGKILL, p.pid, victim, signal.SIGUSR1) == 0
        for _ in range(6000):  # the failure this guards against is a handler spinning forever
            if thread_settled(p.pid, victim):
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the signal handler waits for the write-out that frees")
        os.write(hold_w, b"x")
        out, _ = p.communicate(timeout=120)
    finally:
        p.kill()
        os.close(hold_w)
        os.close(note_r)
    assert p.returncode == 0 and last_line(out) == "manual 4", (p.returncode, out)
    # the ring was on disk already: the signal's turn was given up, not written twice
    assert [t["trigger"] for t in triggers(tmp_path / "dumps")] == ["manual"]


SIGNAL_STORM = """
import random, threading, time
sys.setswitchinterval(1e-5)
def work(t):
    for i in range(120):
        v = t * 1000 + i
        h.step(torch.full((1 << 14,), v + 0.5), v)
        if i % 9 == 4:
            try:
                h.fail(torch.ones(1))
            except ValueError:
                pass
h.step(torch.full((1 << 14,), -0.5), -1)  # the ring, and its handlers, exist from here on
threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
rng = random.Random(0)
while alive := [t for t in threads if t.is_alive()]:
    try:
        signal.pthread_kill(rng.choice(alive).ident, signal.SIGUSR1)
    except ProcessLookupError:
        pass
    time.sleep(0.0005)  # lets the workers run: a loop that never sleeps starved them
for t in threads:
    t.join()
"""


def test_signals_on_every_thread_during_write_outs_never_crash_the_process(tmp_path):
    run_child(
        tmp_path,
        SIGNAL_STORM,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal,exception",
        FLASHINFER_DUMP_MAX_TRIGGERS=1000000,
    )
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    assert_each_call_holds_its_own_tensors(root)
    assert_records_once(root)
    assert no_hidden_entries(root) == []
    assert len(triggers(root)) > 36  # 4 threads x 13 exceptions, and the signals


def test_a_signal_before_the_first_recorded_call_does_not_end_the_process(tmp_path):
    # the handlers come with the recorder (made at import), not with the first call: before,
    # SIGUSR1's default action ended the process here
    body = """
    os.kill(os.getpid(), signal.SIGUSR1)
    h.step(torch.full((64,), 0.5), 0)
    os.kill(os.getpid(), signal.SIGUSR1)
    print("alive")
    """
    r = run_child(
        tmp_path,
        body,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal",
        FLASHINFER_DUMP_MAX_TRIGGERS=2,
    )
    assert last_line(r.stdout) == "alive"
    root = tmp_path / "dumps"
    fired = triggers(root)
    assert [(t["trigger"], t["calls_written"]) for t in fired] == [("signal", 0), ("signal", 1)]
    assert_whole_dumps(root)


SMALL_ALT_STACK = """
import ctypes, mmap, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
class stack_t(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]
PAGE, SIZE = mmap.PAGESIZE, 16 * 1024
base = libc.mmap(None, PAGE + SIZE, 3, 0x22, -1, 0)  # read/write, private anonymous
assert libc.mprotect(base, PAGE, 0) == 0  # a guard page below the stack: overflow faults
st = stack_t(base + PAGE, 0, SIZE)
assert libc.sigaltstack(ctypes.byref(st), None) == 0
for i in range(3):
    h.step(torch.full((64,), i + 0.5), i)
signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
print("alive")
"""


def test_a_signal_write_out_fits_a_16_kb_alternate_stack(tmp_path):
    # faulthandler.enable() after the import gives the thread its own alternate stack of
    # twice SIGSTKSZ; the write-out runs on it. Its path and line buffers used to be on
    # that stack (about 17 KB) and overflowed it
    r = run_child(
        tmp_path,
        SMALL_ALT_STACK,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal",
        FLASHINFER_DUMP_LAYOUT="compact",
    )
    assert last_line(r.stdout) == "alive"
    root = tmp_path / "dumps"
    assert [(t["trigger"], t["calls_written"]) for t in triggers(root)] == [("signal", 3)]
    assert_whole_dumps(root)


def test_a_process_that_records_nothing_writes_nothing_at_exit(tmp_path):
    run_child(tmp_path, "print('no call')", FLASHINFER_DUMP_RING=4, FLASHINFER_DUMP_ON="exit")
    assert not (tmp_path / "dumps").exists()


# ------------------------------------------------------------------------- fork

FORK_DISK = """
for i in range(4):
    h.step(torch.full((64,), i + 0.5), i)
pid = os.fork()
if pid == 0:
    for i in range(100, 104):
        h.step(torch.full((64,), i + 0.5), i)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
for i in range(4, 6):
    h.step(torch.full((64,), i + 0.5), i)
print(pid)
"""


def test_a_forked_child_keeps_its_own_disk_ring_and_leaves_the_parents(tmp_path):
    r = run_child(tmp_path, FORK_DISK, FLASHINFER_DUMP_RING=4)
    child = int(last_line(r.stdout))
    root = tmp_path / "dumps"
    assert_each_call_holds_its_own_tensors(root)
    by_pid = dumps_by_pid(root)
    assert by_pid.pop(child) == [100, 101, 102, 103]
    assert list(by_pid.values()) == [[2, 3, 4, 5]]  # the parent's newest four, its own


FORK_MEMORY = """
def failing():
    try:
        h.fail(torch.ones(1))
    except ValueError:
        pass
for i in range(5):
    h.step(torch.full((64,), i + 0.5), i)
pid = os.fork()
if pid == 0:
    for i in range(100, 102):
        h.step(torch.full((64,), i + 0.5), i)
    failing()
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
h.step(torch.full((64,), 5.5), 5)
failing()
print(pid)
"""


def test_a_forked_child_writes_only_its_own_calls_from_memory(tmp_path):
    r = run_child(tmp_path, FORK_MEMORY, FLASHINFER_DUMP_RING=8, FLASHINFER_DUMP_ON="exception")
    child = int(last_line(r.stdout))
    root = tmp_path / "dumps"
    assert_whole_dumps(root)
    assert_each_call_holds_its_own_tensors(root)
    assert_records_once(root)
    by_pid = dumps_by_pid(root)
    assert by_pid.pop(child) == [100, 101, "fail"]
    assert list(by_pid.values()) == [[0, 1, 2, 3, 4, 5, "fail"]]
    assert sorted(t["calls_written"] for t in triggers(root)) == [3, 7]


POOLS = """
import multiprocessing as mp
for i in range(3):
    h.step(torch.full((64,), i + 0.5), i)
workers = {}
for n, method in enumerate(["fork", "spawn", "forkserver"]):
    with mp.get_context(method).Pool(1) as pool:
        workers[method] = pool.apply(h.record_in_worker, ((n + 1) * 100, 6))
h.step(torch.full((64,), 3.5), 3)
try:
    h.fail(torch.ones(1))
except ValueError:
    pass
print(json.dumps(workers))
"""


def check_pools(tmp_path, ring, **env):
    r = run_child(tmp_path, "import json\n" + POOLS, FLASHINFER_DUMP_RING=ring, **env)
    workers = json.loads(last_line(r.stdout))
    root = tmp_path / "dumps"
    assert_each_call_holds_its_own_tensors(root)
    by_pid = dumps_by_pid(root)
    return workers, by_pid, root


def test_pool_workers_of_every_start_method_keep_their_own_memory_rings(tmp_path):
    workers, by_pid, root = check_pools(tmp_path, 16, FLASHINFER_DUMP_ON="exception")
    assert_whole_dumps(root)
    assert_records_once(root)
    for n, method in enumerate(["fork", "spawn", "forkserver"]):
        first = (n + 1) * 100
        assert by_pid.pop(workers[method]) == list(range(first, first + 6)) + ["fail"], method
    assert list(by_pid.values()) == [[0, 1, 2, 3, "fail"]]


def test_pool_workers_of_every_start_method_keep_their_own_disk_rings(tmp_path):
    workers, by_pid, _ = check_pools(tmp_path, 4)
    for n, method in enumerate(["fork", "spawn", "forkserver"]):
        first = (n + 1) * 100
        # each worker keeps its newest four (the failing call is the newest)
        assert by_pid.pop(workers[method]) == [first + 3, first + 4, first + 5, "fail"], method
    assert list(by_pid.values()) == [[1, 2, 3, "fail"]]


# ------------------------------------------------------------ disk ring, threads

DISK_THREADS = """
import threading
sys.setswitchinterval(1e-6)
def work(t):
    for i in range(60):
        v = t * 1000 + i
        h.step(torch.full((1 << 15,), v + 0.5), v)
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_threads_never_evict_a_directory_still_being_written(tmp_path):
    run_child(tmp_path, DISK_THREADS, FLASHINFER_DUMP_RING=3)
    root = tmp_path / "dumps"
    assert len(os.listdir(root)) == 3
    assert_each_call_holds_its_own_tensors(root)
    assert [recs[-1]["execution_status"] for _, recs in dumpdir.ordered_dumps(root)] == [
        "completed"
    ] * 3
    assert "DUMP ERROR" not in (tmp_path / "log.txt").read_text()


# ---------------------------------------------------------------- a full disk

FULL_DISK = """
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, (200 << 10, 200 << 10))
for i in range(15):  # the even calls' tensor files are larger than any file may be
    h.step(torch.full((1 << 16 if i % 2 == 0 else 64,), i + 0.5), i)
try:
    h.fail(torch.ones(1))
except ValueError:
    pass
"""


@pytest.mark.parametrize("layout", ["flashinfer", "compact"])
def test_a_full_disk_keeps_the_triggering_call_and_says_what_was_lost(tmp_path, layout):
    run_child(
        tmp_path,
        FULL_DISK,
        FLASHINFER_DUMP_RING=16,
        FLASHINFER_DUMP_ON="exception",
        FLASHINFER_DUMP_LAYOUT=layout,
    )
    root = tmp_path / "dumps"
    assert no_hidden_entries(root) == []
    assert_whole_dumps(root)
    assert_each_call_holds_its_own_tensors(root)
    # each even call's tensor files pass the file size limit; in the compact layout a
    # constant tensor is one 64 KB chunk, and the calls' chunks share one pack: the newest
    # even call's fit in it beside the triggering call's, the older ones' no longer do
    kept = [14] if layout == "compact" else []
    calls = dumps_by_pid(root)
    assert list(calls.values()) == [[1, 3, 5, 7, 9, 11, 13] + kept + ["fail"]]
    # no empty directories; and session.jsonl (and the compact layout's chunks/, one pack)
    assert len(os.listdir(root)) == 8 + len(kept) + 1 + (layout == "compact")
    # written the triggering call first, then newest first
    order = [
        r["function_name"] if r["function_name"] == "fail" else r["input_metadata"]["arg_1"]
        for r in session_lines(root)
        if r.get("execution_status") == "inputs_saved"
    ]
    assert order == ["fail"] + kept + [13, 11, 9, 7, 5, 3, 1]
    written, lost = 8 + len(kept), 8 - len(kept)
    (trig,) = triggers(root)
    assert (trig["calls_written"], trig["calls_lost"], trig["error"]) == (
        written,
        lost,
        "File too large",
    )
    assert trig["function_name"] == "fail"
    log = (tmp_path / "log.txt").read_text()
    line = f"trigger exception in fail: {written} calls written to \\S+; {lost} calls lost: "
    assert re.search(line + "File too large\n", log), log


# ------------------------------------------------------- the trigger record itself

LONG_ROOT = """
try:
    h.fail(torch.ones(1))
except ValueError:
    pass
import flashinfer.api_logging as al
print(al._LOGGER.dump_ring('say "hi"\\n'), flush=True)
try:
    al._LOGGER.dump_ring("x" * 129)
except ValueError as e:
    print(e, flush=True)
"""


def test_a_trigger_record_too_long_for_one_line_is_written_without_the_call_keys(tmp_path):
    # a dump root this long makes the trigger record pass its 4096 bytes (the dump_dir key)
    root = tmp_path / "dumps"
    while len(str(root)) < 3900:
        root = root / ("d" * min(200, 3900 - len(str(root)) - 1))
    r = run_child(
        tmp_path,
        LONG_ROOT,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="exception",
        FLASHINFER_DUMP_MAX_TRIGGERS=2,
        FLASHINFER_DUMP_DIR=root,
    )
    assert r.stdout.splitlines()[-2:] == [
        "0",  # the ring started again after the exception's write-out
        "dump_ring: the trigger name must be 1 to 128 bytes, not 129",
    ]
    ((path, recs),) = dumpdir.ordered_dumps(root)
    call = recs[-1]
    keys = json.dumps(
        {k: call[k] for k in ("function_name", "dump_dir", "call_sequence", "sequence")}
    )
    exception, manual = triggers(root)
    assert "dump_dir" not in exception and "function_name" not in exception
    assert (exception["trigger"], exception["calls_written"]) == ("exception", 1)
    assert exception["call_keys_left_out"] == len(keys) - 2  # the members, without the braces
    # the name dump_ring was given, escaped as JSON
    assert manual == {
        "record_type": "trigger",
        "trigger": 'say "hi"\n',
        "time": manual["time"],
        "process_id": exception["process_id"],
        "calls_written": 0,
    }
    log = (tmp_path / "log.txt").read_text()
    assert (
        "trigger exception in fail: 1 calls written to "
        f"{root}; its record in session.jsonl leaves out the triggering call's keys "
        f"({len(keys) - 2} bytes: the record would pass 4096 bytes)\n"
    ) in log


# ------------------------------------------------------------------ the budget

ONE_TOO_BIG = """
for i in range(3):
    h.step(torch.full((1 << 14,), i + 0.5), i)
h.step(torch.full((1 << 19,), 3.5), 3)  # 2 MB in, over the whole 1 MB budget
"""


def test_one_call_over_the_budget_evicts_nothing(tmp_path):
    run_child(
        tmp_path,
        ONE_TOO_BIG,
        FLASHINFER_DUMP_RING=8,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_RING_MAX_GB=1 / 1024,
    )
    root = tmp_path / "dumps"
    assert_each_call_holds_its_own_tensors(root)
    dumps = dumpdir.ordered_dumps(root)
    assert [recs[0]["input_metadata"]["arg_1"] for _, recs in dumps] == [0, 1, 2, 3]
    path, recs = dumps[-1]
    assert [r.get("tensors_skipped") for r in recs] == ["ring budget"] * 2
    assert os.listdir(path) == ["metadata.jsonl"]


# -------------------------------------------------------------- memory limits

# The address space in use now plus room, as this process's RLIMIT_AS; set before the
# recorder is imported, so that its Logger (and the ring's default budget) sees the limit.
LIMIT = """
import os, resource, torch
torch.set_num_threads(1)
torch.ones(1 << 20).sum()  # the allocator's first arenas, before the limit is measured
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + ({room} << 20), resource.RLIM_INFINITY))
import ring_helpers as h
import flashinfer.api_logging as al
"""


def run_limited(tmp_path, room_mb, body, **env):
    src = LIMIT.format(room=room_mb) + textwrap.dedent(body)
    if "ASAN_OPTIONS" in os.environ:  # make asan-test: a failed malloc returns NULL, and a
        # freed block is free again at once, as without the sanitizer
        env["ASAN_OPTIONS"] = (
            os.environ["ASAN_OPTIONS"] + ":allocator_may_return_null=1:quarantine_size_mb=0"
        )
    r = subprocess.run(
        [sys.executable, "-c", src],
        env=child_env(tmp_path, OMP_NUM_THREADS=1, MALLOC_ARENA_MAX=1, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r


USER_CALLS = """
failed = 0
for i in range(200):
    try:
        h.step(torch.full((6 << 18,), i + 0.5), i)  # 6 MB in, 6 MB out
    except RuntimeError:
        failed += 1
print(failed, al._LOGGER.ring_banner()[1], flush=True)
"""


def test_under_rlimit_as_the_default_budget_leaves_the_calls_their_memory(tmp_path):
    r = run_limited(
        tmp_path, 700, USER_CALLS, FLASHINFER_DUMP_RING=64, FLASHINFER_DUMP_ON="exception"
    )
    failed, banner = last_line(r.stdout).split(" ", 1)
    assert failed == "0", r.stdout
    # a quarter of the 700 MB the process may still map
    budget = float(re.search(r"budget (\S+) GB", banner).group(1))
    assert abs(budget - 700 / 4 / 1024) < 0.01, banner


EVICT_AND_RETRY = """
for i in range(5):  # 52 MB each: the fifth's copy does not fit beside the four before it
    x = torch.full((13 << 20,), i + 0.5)
    h.checksum(x)
    del x
print(al._LOGGER.dump_ring("manual"), flush=True)
x = torch.full((40 << 20,), 5.5)  # 160 MB: its copy does not fit, even in an empty ring
h.checksum(x)
print("alive", flush=True)
"""


def test_a_failed_allocation_evicts_then_keeps_the_records_only(tmp_path):
    r = run_limited(
        tmp_path,
        290,
        EVICT_AND_RETRY,
        FLASHINFER_DUMP_RING=16,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_MAX_TRIGGERS=2,
        FLASHINFER_DUMP_RING_MAX_GB=4,
        # tensor file images: in the compact layout a constant tensor is one stored chunk
        FLASHINFER_DUMP_LAYOUT="flashinfer",
    )
    # the manual trigger wrote the fifth call only: memory ran out for its copy, the four
    # before it were evicted, and the copy was made again
    assert r.stdout.splitlines()[-2:] == ["1", "alive"]
    ((path4, _), (path5, recs5)) = dumpdir.ordered_dumps(tmp_path / "dumps")
    x = load(path4, "inputs")["arg_0"]
    assert x.numel() == 13 << 20 and torch.all(x == 4.5)
    assert [r.get("tensors_skipped") for r in recs5] == ["memory"] * 2
    assert os.listdir(path5) == ["metadata.jsonl"]
    log = (tmp_path / "log.txt").read_text()
    assert log.count("WARNING: out of memory recording the inputs of a checksum call") == 1


# --------------------------------------------------------------------- readers

METADATA_ONLY = """
h.step(torch.ones(4), 0)
h.step(torch.ones(1 << 19), 1)  # 2 MB: over the 1 MB budget
"""


def test_readers_list_a_metadata_only_call_and_replay_skips_it(tmp_path):
    from click.testing import CliRunner

    from flashinfer_native.cli import cli
    from flashinfer_native.report import write_report

    run_child(
        tmp_path,
        METADATA_ONLY,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="exit",
        FLASHINFER_DUMP_RING_MAX_GB=1 / 1024,
    )
    root = tmp_path / "dumps"
    big = os.path.basename(dumpdir.ordered_dumps(root)[-1][0])
    out = CliRunner().invoke(cli, ["dumps", "--dir", str(root)]).output
    assert (
        "Metadata-only calls (records kept, tensors not; replay skips them):\n"
        f"  {big}: ring budget\n"
    ) in out
    replayed = CliRunner().invoke(
        cli, ["replay", "--dir", str(root), "--allow-module", "ring_helpers"]
    )
    assert replayed.exit_code == 0, replayed.output
    assert (
        f"[2] step ({big}): ⏭️ Skipped: metadata only, not run "
        "(tensors not recorded (ring budget))\n"
    ) in replayed.output
    assert "Summary: 1 passed, 0 failed/mismatch, 1 skipped (metadata only)\n" in replayed.output
    checked = CliRunner().invoke(
        cli,
        ["replay", "--dir", str(root), "--against", "reference", "--allow-module", "ring_helpers"],
    )
    assert checked.exit_code == 0, checked.output
    assert (
        f"[2] step ({big}): ⏭️ Skipped: metadata only, not checked "
        "(tensors not recorded (ring budget))\n"
    ) in checked.output
    write_report(root, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert page.count("metadata only: tensors not kept (ring budget)") == 2  # table, detail


# ---------------------------------- the compact layout's packs across write-outs

SIGNAL_MID_CALL = """
import json, threading
import flashinfer.api_logging as al
from flashinfer.api_logging import flashinfer_api

@flashinfer_api
def mid(x):
    # the signal's write-out writes this call with its inputs only
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    return x.clone(), x + 1

x = torch.arange(1 << 18, dtype=torch.float32)
mid(x)
print("manual", al._LOGGER.dump_ring("manual"), flush=True)
"""


def test_a_later_write_out_packs_again_the_chunks_its_manifests_need(tmp_path):
    # the outputs written by the manual trigger repeat the inputs' chunks, packed by the
    # signal's write-out, and add their own: a manifest names one pack, so the second
    # write-out's pack must hold both
    r = run_child(
        tmp_path,
        SIGNAL_MID_CALL,
        FLASHINFER_DUMP_RING=4,
        FLASHINFER_DUMP_ON="signal",
        FLASHINFER_DUMP_MAX_TRIGGERS=5,
    )
    assert last_line(r.stdout) == "manual 1", r.stdout
    root = tmp_path / "dumps"
    ((path, recs),) = dumpdir.ordered_dumps(root)
    assert sorted(os.listdir(path)) == [
        "inputs.chunks.json",
        "metadata.jsonl",
        "outputs.chunks.json",
    ]
    packs = sorted(os.listdir(root / "chunks"))
    assert len(packs) == 2, packs
    with open(os.path.join(path, "inputs.chunks.json")) as f:
        assert json.load(f)["packs"] == [packs[0]]  # the signal's, write-out 1
    with open(os.path.join(path, "outputs.chunks.json")) as f:
        assert json.load(f)["packs"] == [packs[1]]  # the manual trigger's, write-out 2
    x = torch.arange(1 << 18, dtype=torch.float32)
    assert torch.equal(load(path, "inputs")["arg_0"], x)
    out = load(path, "outputs")
    assert [torch.equal(t, e) for t, e in zip(out.values(), (x, x + 1))] == [True, True], out.keys()
    sig, manual = triggers(root)
    assert (sig["calls_written"], manual["calls_written"]) == (1, 1)
    assert_records_once(root)
