"""Per-call overhead of @flashinfer_api at levels 0, 1, 3 and 5, and level-5
statistics throughput. Not a test: prints a table; --json PATH writes the figures.

Each level runs in a fresh subprocess (the level is read at import), logging to a
file in a temporary directory. Overhead = decorated minus undecorated time per call,
best of several repeats.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, timeit, json, torch
import flashinfer
from flashinfer.api_logging import flashinfer_api

def api(a, b, scale, mode="fast", window=-1):
    return None

wrapped = flashinfer_api(api)
a = torch.randn(64, 64); b = torch.randn(64, 64)
n = int(sys.argv[1]); repeats = int(sys.argv[2])
def best(fn):
    return min(timeit.repeat(lambda: fn(a, b, 0.5), number=n, repeat=repeats)) / n
base = best(api)
dec = best(wrapped)
print(json.dumps({"base_us": base * 1e6, "decorated_us": dec * 1e6}))
"""

STATS = r"""
import sys, time, json, torch
import flashinfer_native._C as C
import flashinfer
x = torch.randn(16 * 1024 * 1024)  # 64 MB float32
view = x.view(4096, 4096)[:, ::2]   # strided, half the elements
out = {}
for name, t in (("contiguous_f32", x), ("strided_f32", view)):
    C.tensor_stats(t)
    best = min(
        (lambda s: (C.tensor_stats(t), time.perf_counter() - s)[1])(time.perf_counter())
        for _ in range(5)
    )
    out[name] = t.numel() * t.element_size() / best / 1e9
print(json.dumps(out))
"""


def run_level(level, n, repeats, tmp):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("FLASHINFER_"):
            del env[k]
    env["FLASHINFER_LOGLEVEL"] = str(level)
    env["FLASHINFER_LOGDEST"] = os.path.join(tmp, f"level{level}.log")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=20000, help="calls per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = p.parse_args()
    results = {"overhead_us": {}, "stats_gb_per_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'level':>6} {'undecorated us':>15} {'decorated us':>13} {'overhead us':>12}")
        for level in (0, 1, 3, 5):
            n = args.calls if level < 3 else max(args.calls // 4, 1000)
            r = run_level(level, n, args.repeats, tmp)
            over = r["decorated_us"] - r["base_us"]
            results["overhead_us"][str(level)] = over
            print(f"{level:>6} {r['base_us']:>15.3f} {r['decorated_us']:>13.3f} {over:>12.3f}")
    r = subprocess.run([sys.executable, "-c", STATS], capture_output=True, text=True, check=True)
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    results["stats_gb_per_s"] = stats
    print()
    print("level-5 statistics throughput (64 MB float32):")
    for k, v in stats.items():
        print(f"  {k:<16} {v:8.2f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
