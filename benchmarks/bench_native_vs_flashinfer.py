"""FlashInfer's own @flashinfer_api against the native core's, on a real FlashInfer.

Not a test: prints a table; --json PATH writes the figures. Run it with the Python of a
virtualenv holding flashinfer-python and flashinfer-native (``make bench-flashinfer``).

1. Per-call overhead at levels 1, 3 and 5, both decorators in one process. FlashInfer
   reads the level when its api_logging module executes, so its module is executed
   once per level into a namespace of its own (its file, unchanged), and the core's
   ``install`` likewise; each decorates the same two functions:
   - ``shuffle_matrix_a``: a real FlashInfer API (the undecorated function: it runs
     on the CPU), on a 64x32 float32 matrix;
   - a no-op with ``rmsnorm``'s identity and signature (``functools.wraps`` of the
     undecorated FlashInfer function; the real one needs CUDA), on a 64x1024 input
     and a 1024 weight, as FlashInfer's decorator wraps every API the same way.
   Overhead = decorated minus undecorated time per call, best of several repeats;
   logging goes to a file in a temporary directory.
2. ``import flashinfer`` time with FLASHINFER_NATIVE_LOGGING off and on (level 0 and
   3), each a fresh interpreter, best of several.
"""

import argparse
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit

import torch

import flashinfer
import flashinfer.api_logging as flashinfer_api_logging
from flashinfer.quantization.fp4_quantization import shuffle_matrix_a
from flashinfer_native.api_logging import serve_flashinfer


def undecorated(api):
    while hasattr(api, "__wrapped__"):
        api = api.__wrapped__
    return api


def decorators(level, log_path):
    """(FlashInfer's flashinfer_api, the core's) with FLASHINFER_LOGLEVEL=level."""
    path = flashinfer_api_logging.__file__

    def execute(name, env_level):
        os.environ.update(FLASHINFER_LOGLEVEL=str(env_level), FLASHINFER_LOGDEST=log_path)
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
        module.__spec__.loader.exec_module(module)
        return module

    # as the hook does: FlashInfer's module with its own logging off, then the core's
    # surface over it; FlashInfer's own last (both share the "flashinfer.api" logger)
    ours = execute(f"flashinfer.api_logging_native_l{level}", 0)
    os.environ["FLASHINFER_LOGLEVEL"] = str(level)
    serve_flashinfer(vars(ours), flashinfer.__version__)
    theirs = execute(f"flashinfer.api_logging_l{level}", level)
    return theirs.flashinfer_api, ours.flashinfer_api


def best_per_call(fn, args, number, repeats):
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeats)) / number


def overhead_table(number, repeats, tmp):
    shuffle = undecorated(shuffle_matrix_a)
    rmsnorm_like = functools.wraps(undecorated(flashinfer.norm.rmsnorm))(
        lambda input, weight, eps=1e-6, out=None, enable_pdl=None: input
    )
    cases = {
        "shuffle_matrix_a": (shuffle, (torch.randn(64, 32), 128)),
        "rmsnorm (no-op)": (rmsnorm_like, (torch.randn(64, 1024), torch.ones(1024))),
    }
    rows = []
    for level in (1, 3, 5):
        theirs, ours = decorators(level, os.path.join(tmp, f"level{level}.log"))
        for name, (func, args) in cases.items():
            base = best_per_call(func, args, number, repeats)
            t = best_per_call(theirs(func), args, number, repeats) - base
            o = best_per_call(ours(func), args, number, repeats) - base
            rows.append(
                {"level": level, "api": name, "flashinfer_us": t * 1e6, "native_us": o * 1e6}
            )
    os.environ["FLASHINFER_LOGLEVEL"] = "0"
    return rows


def import_time(native, level, repeats):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_NATIVE_LOGGING="1" if native else "0",
        FLASHINFER_LOGLEVEL=str(level),
        FLASHINFER_LOGDEST=os.devnull,
    )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import flashinfer"], env=env, check=True)
        times.append(time.perf_counter() - start)
    return min(times), max(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per figure (best)")
    parser.add_argument("--import-repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this file")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = overhead_table(opts.number, opts.repeats, tmp)
    print(f"FlashInfer {flashinfer.__version__}, torch {torch.__version__}")
    print("per-call overhead (us), best of repeats:")
    print(f"{'level':>5}  {'api':<18} {'FlashInfer':>11} {'native':>8} {'ratio':>7}")
    for r in rows:
        ratio = r["flashinfer_us"] / r["native_us"] if r["native_us"] > 0 else float("inf")
        r["ratio"] = ratio
        print(
            f"{r['level']:>5}  {r['api']:<18} {r['flashinfer_us']:>11.1f} "
            f"{r['native_us']:>8.2f} {ratio:>6.1f}x"
        )
    imports = {}
    for label, native, level in (
        ("switch off", False, 0),
        ("switch on, level 0", True, 0),
        ("switch on, level 3", True, 3),
        ("switch off, level 3", False, 3),
    ):
        imports[label] = import_time(native, level, opts.import_repeats)
    print("import flashinfer (s), best / worst of repeats:")
    for label, (low, high) in imports.items():
        print(f"  {label:<20} {low:6.2f} / {high:6.2f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"overhead": rows, "import_s": imports}, f, indent=2)


if __name__ == "__main__":
    main()
