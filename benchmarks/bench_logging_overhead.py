"""Per-call overhead of @flashinfer_api at levels 0, 1, 3 and 5, in the text and the
JSON log format (FLASHINFER_LOGFORMAT), and level-5 statistics throughput. Not a test:
prints a table; --json PATH writes the figures.

Each level runs in a fresh subprocess, logging to files in a temporary directory. The
child imports flashinfer.api_logging once per format (the configuration is read at
import; each import makes its own logger) and times the undecorated function and the
text- and JSON-logging wrappers in turn, so all three see the same machine load, and
counts the thread's CPU time (user + system: the write(2) of each record included), so
time the thread spends descheduled on a busy machine is left out. Overhead = decorated
minus undecorated time per call, best of the repeats.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import importlib, os, sys, time, timeit, json, torch
import flashinfer

def api(a, b, scale, mode="fast", window=-1):
    return None

def wrapper_for(log_format):
    os.environ["FLASHINFER_LOGFORMAT"] = log_format
    os.environ["FLASHINFER_LOGDEST"] = os.path.join(sys.argv[3], log_format + ".log")
    sys.modules.pop("flashinfer.api_logging", None)
    return importlib.import_module("flashinfer.api_logging").flashinfer_api(api)

functions = {"base": api, "text": wrapper_for("text"), "json": wrapper_for("json")}
a = torch.randn(64, 64); b = torch.randn(64, 64)
n = int(sys.argv[1]); repeats = int(sys.argv[2])
best = dict.fromkeys(functions, float("inf"))
for _ in range(repeats):
    for name, fn in functions.items():
        t = timeit.Timer(lambda: fn(a, b, 0.5), timer=time.thread_time).timeit(n) / n
        best[name] = min(best[name], t)
print(json.dumps({k: v * 1e6 for k, v in best.items()}))
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
    """Best per-call microseconds of the undecorated, text- and JSON-logging calls."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["FLASHINFER_LOGLEVEL"] = str(level)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(repeats), os.path.join(tmp, f"level{level}")],
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
    results = {
        "overhead_us": {},
        "json_overhead_us": {},
        "json_over_text": {},
        "stats_gb_per_s": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        print(
            f"{'level':>6} {'undecorated us':>15} {'text us':>9} {'json us':>9} "
            f"{'text overhead':>14} {'json overhead':>14} {'json/text':>10}"
        )
        for level in (0, 1, 3, 5):
            n = args.calls if level < 3 else max(args.calls // 4, 1000)
            r = run_level(level, n, args.repeats, tmp)
            over_text = r["text"] - r["base"]
            over_json = r["json"] - r["base"]
            ratio = over_json / over_text if level else float("nan")
            results["overhead_us"][str(level)] = over_text
            results["json_overhead_us"][str(level)] = over_json
            results["json_over_text"][str(level)] = ratio
            print(
                f"{level:>6} {r['base']:>15.3f} {r['text']:>9.3f} "
                f"{r['json']:>9.3f} {over_text:>14.3f} {over_json:>14.3f} {ratio:>10.2f}"
            )
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
