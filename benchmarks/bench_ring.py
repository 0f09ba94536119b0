"""The flight recorder's ring cost per call. Not a test: prints a table; --json PATH writes it.

A call with two float32 inputs of --mb MB each that returns its second input (so the
recorder copies inputs + outputs: 3 x --mb MB), and a call with 8 tensors of 4 KB, each in
its own child process, one per mode:
  * level 5 (the same log text, no recorder): the baseline the recorder's cost is over;
  * in-memory ring (FLASHINFER_DUMP_RING=8, FLASHINFER_DUMP_ON=nan, never firing);
  * disk ring (FLASHINFER_DUMP_RING=8);
  * plain level 10 (every call written);
and, as references, one memcpy of the recorded bytes into warm buffers (Tensor.copy_)
and the raw write(2) of them to a new file. Costs are per call, best of --repeats (after
warm-up calls that fill the ring), with the median to show the spread.
The big call records the same two tensors at every repeat, so the compact rings store
their chunks once and each later call costs their hashes; --fresh changes every element
of both before each call (outside the timing, in every mode alike): the worst case, where
all 96 MB are new.
FLASHINFER_CPU_ISA in the environment (portable or avx2, docs/logging.md) is passed on to
the children; every other FLASHINFER_ variable is theirs to set.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
import torch
from flashinfer.api_logging import flashinfer_api

mb, repeats, what, fresh = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"

@flashinfer_api
def big(x, y):
    return y

@flashinfer_api
def small(a, b, c, d, e, f, g, h):
    return None

def timed(fn, before=None):
    for _ in range(10):  # fills the ring: its buffers are reused from here on
        if before:
            before()
        fn()
    times = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times

n = mb * (1 << 20) // 4
x, y = torch.rand(n), torch.rand(n)
smalls = [torch.rand(1024) for _ in range(8)]
out = {}
if what == "call":
    out["big"] = timed(lambda: big(x, y), (lambda: (x.add_(1.0), y.add_(1.0))) if fresh else None)
    out["small"] = timed(lambda: small(*smalls))
elif what == "memcpy":
    dst = [torch.empty(n) for _ in range(3)]
    out["big"] = timed(lambda: [d.copy_(s) for d, s in zip(dst, (x, y, y))])
elif what == "write":
    path = os.path.join(os.environ["FLASHINFER_DUMP_DIR"], "raw.bin")
    def raw():
        fd = os.open(path + str(time.perf_counter_ns()), os.O_WRONLY | os.O_CREAT, 0o600)
        for t in (x, y, y):
            os.write(fd, t.numpy().view("uint8").data)
        os.close(fd)
    out["big"] = timed(raw)
print(json.dumps(out))
"""

MODES = {
    "level 5 (baseline)": {"FLASHINFER_LOGLEVEL": "5"},
    "in-memory ring": {
        "FLASHINFER_LOGLEVEL": "10",
        "FLASHINFER_DUMP_RING": "8",
        "FLASHINFER_DUMP_ON": "nan",
    },
    "disk ring": {"FLASHINFER_LOGLEVEL": "10", "FLASHINFER_DUMP_RING": "8"},
    "plain level 10": {"FLASHINFER_LOGLEVEL": "10", "FLASHINFER_DUMP_MAX_COUNT": "1000000"},
}


def run(env_extra, what, args, scratch):
    keep = ("FLASHINFER_CPU_ISA",)  # the kernels' ISA, passed on (see the docstring)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_") or k in keep}
    env.update(
        FLASHINFER_LOGDEST=os.devnull,
        FLASHINFER_DUMP_DIR=tempfile.mkdtemp(dir=scratch),
        FLASHINFER_DUMP_MAX_SIZE_GB="1000",
        **env_extra,
    )
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.mb), str(args.repeats), what, str(int(args.fresh))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=32, help="MB per input tensor (default 32)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--dir",
        default=None,
        help="scratch directory, kept (default: a new temp dir, removed at the end)",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--fresh", action="store_true", help="new values in the big call's inputs each call"
    )
    args = p.parse_args()
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_ring_")
    try:  # the raw writes alone leave 2 x --repeats files of 3 x --mb MB
        res = {name: run(env, "call", args, scratch) for name, env in MODES.items()}
        memcpy = run({}, "memcpy", args, scratch)["big"]
        write = run({}, "write", args, scratch)["big"]
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    base = res["level 5 (baseline)"]

    def cost(times, kind):  # recorder cost: best and median over the level-5 call
        return min(times) - min(base[kind]), statistics.median(times) - statistics.median(
            base[kind]
        )

    rows = {}
    print(
        f"big call: 2 x {args.mb} MB float32 in, {args.mb} MB out (recorded bytes "
        f"{3 * args.mb} MB{', all new at each call' if args.fresh else ''}); cost over level 5, "
        f"best / median of {args.repeats}"
    )
    for name in list(MODES)[1:]:
        b, m = cost(res[name]["big"], "big")
        sb, sm = cost(res[name]["small"], "small")
        rows[name] = {
            "big_s": b,
            "big_median_s": m,
            "small_us": sb * 1e6,
            "small_median_us": sm * 1e6,
        }
    mc, wr = min(memcpy), min(write)
    for name, r in rows.items():
        print(
            f"  {name:16s} {r['big_s'] * 1e3:8.2f} ms ({r['big_median_s'] * 1e3:8.2f})  "
            f"x{r['big_s'] / mc:5.2f} memcpy  x{r['big_s'] / wr:5.2f} write(2)   "
            f"small call {r['small_us']:7.1f} us ({r['small_median_us']:7.1f})"
        )
    print(f"  {'memcpy':16s} {mc * 1e3:8.2f} ms ({statistics.median(memcpy) * 1e3:8.2f})")
    print(f"  {'raw write(2)':16s} {wr * 1e3:8.2f} ms ({statistics.median(write) * 1e3:8.2f})")
    ring, plain = rows["in-memory ring"]["big_s"], rows["plain level 10"]["big_s"]
    print(
        f"in-memory ring / memcpy: {ring / mc:.2f} (target <= 1.2); "
        f"plain level 10 / in-memory ring: {plain / ring:.1f} (target >= 3)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "memcpy_s": memcpy, "write_s": write, "raw": res}, f, indent=1)


if __name__ == "__main__":
    main()
