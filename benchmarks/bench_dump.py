"""Level-10 flight recorder cost. Not a test: prints a table; --json PATH writes it.

For calls whose inputs total 1 MB, 64 MB and 512 MB (two float32 tensors of half the
size each), in both formats, it measures:
  * a level-10 call (level-5 text + inputs file + metadata lines), per call and MB/s;
  * a raw write(2) of the same bytes to a new file on the same filesystem (the
    physical reference);
  * torch.save of the same tensors plus a json.dumps line appended to a file (how
    FlashInfer's recorder writes);
  * FlashInfer's whole level-10 recipe emulated: its level-5 statistics as separate
    torch passes per tensor (min, max, mean, isnan, isinf), then torch.save + json;
and the per-call cost of a level-10 call with 8 tensors of 4 KB, on the benchmark
directory's filesystem and on /dev/shm (file creation dominates on a slow disk; the
raw floor there, mkdir + create + write + rename, is printed too). Best of --repeats.

--plain64 measures only the 1.2x target of docs/benchmarks.md#level-10-dumps instead: a plain level-10 call (.pt) of
2 x 32 MB float32 inputs against the raw write(2) of the same bytes to two new files,
timed alternately in one process, best of --repeats with the spread (max/min - 1); with
--baseline DIR also the same figures for an older source tree built in place there
(git worktree add DIR main && cd DIR && export FLASHINFER_NO_CUDA=1 && (cd native && python
setup.py build_ext --inplace) && python setup.py build_ext --inplace), run alternately with this one so that both see the same machine load; and
the CRC-32 throughput of each path (PCLMULQDQ folding, system zlib, tables) on 64 MB.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, shutil, sys, tempfile, time
import torch
import flashinfer
from flashinfer.api_logging import flashinfer_api

root = os.environ["FLASHINFER_DUMP_DIR"]
scratch = sys.argv[1]
sizes_mb = [int(s) for s in sys.argv[2].split(",")]
repeats = int(sys.argv[3])

@flashinfer_api
def api(x, y):
    return None

def clear():
    if os.path.isdir(root):
        for name in os.listdir(root):
            p = os.path.join(root, name)
            if os.path.isdir(p):
                shutil.rmtree(p)

def best(fn, before=None):
    times = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)

def raw_write(tensors):
    path = os.path.join(scratch, "raw.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for t in tensors:
        os.write(fd, t.numpy().view("uint8").data)
    os.close(fd)

def flashinfer_style(tensors):
    path = os.path.join(scratch, "inputs.pt")
    torch.save({f"arg_{i}": t for i, t in enumerate(tensors)}, path)
    record = {"function_name": "api", "tensor_info": {"input_tensor_keys": ["arg_0", "arg_1"]}}
    with open(os.path.join(scratch, "session.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")

def flashinfer_level10(tensors):
    for t in tensors:
        [t.min().item(), t.max().item(), t.float().mean().item(),
         torch.isnan(t).sum().item(), torch.isinf(t).sum().item()]
    flashinfer_style(tensors)

out = {"sizes": {}}
for mb in sizes_mb:
    n = mb * 1024 * 1024 // 4 // 2
    x, y = torch.randn(n), torch.randn(n)
    r = {
        "level10_s": best(lambda: api(x, y), clear),
        "raw_write_s": best(lambda: raw_write([x, y])),
        "torch_save_json_s": best(lambda: flashinfer_style([x, y])),
        "flashinfer_level10_s": best(lambda: flashinfer_level10([x, y])),
    }
    out["sizes"][str(mb)] = r
    clear()
small = [torch.randn(1024) for _ in range(8)]

@flashinfer_api
def small_api(a, b, c, d, e, f, g, h):
    return None

def median_us(fn, n=200):
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
        if i % 50 == 49:
            clear()
    return sorted(times)[len(times) // 2] * 1e6

def raw_small(i, base):
    d = os.path.join(base, f"raw{i}")
    os.mkdir(d)
    fd = os.open(os.path.join(d, "tmp"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    for t in small:
        os.write(fd, t.numpy().view("uint8").data)
    os.close(fd)
    os.rename(os.path.join(d, "tmp"), os.path.join(d, "inputs"))

out["small_8x4KB_us"] = median_us(lambda i: small_api(*small))
out["small_raw_floor_us"] = median_us(lambda i: raw_small(i, scratch))
shm = "/dev/shm"
if os.path.isdir(shm) and os.access(shm, os.W_OK):
    import flashinfer.api_logging as al
    shm_root = tempfile.mkdtemp(dir=shm)
    os.environ["FLASHINFER_DUMP_DIR"] = root = os.path.join(shm_root, "dumps")
    del sys.modules["flashinfer.api_logging"]
    import flashinfer.api_logging as al
    shm_api = al.flashinfer_api(small_api.__wrapped__)
    out["small_8x4KB_shm_us"] = median_us(lambda i: shm_api(*small))
    out["small_raw_floor_shm_us"] = median_us(lambda i: raw_small(i, shm_root))
    shutil.rmtree(shm_root)
print(json.dumps(out))
"""


PLAIN64 = r"""
import json, os, shutil, sys, time
import torch
from flashinfer.api_logging import flashinfer_api
from flashinfer_native import _C

root = os.environ["FLASHINFER_DUMP_DIR"]
scratch, repeats = sys.argv[1], int(sys.argv[2])

@flashinfer_api
def api(x, y):
    return None

n = 64 * 1024 * 1024 // 4 // 2
x, y = torch.randn(n), torch.randn(n)

def raw_write():
    for i, t in enumerate((x, y)):
        path = os.path.join(scratch, f"raw{i}.bin")
        if os.path.exists(path):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, t.numpy().view("uint8").data)
        os.close(fd)

level10, raw = [], []
for _ in range(repeats):
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    api(x, y)
    level10.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    raw_write()
    raw.append(time.perf_counter() - t0)
crc = {}
if hasattr(_C, "_crc32"):
    data = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8).numpy()
    for impl in _C._crc32_impls():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _C._crc32(data, 0, impl)
            times.append(time.perf_counter() - t0)
        crc[impl] = 64 / 1024 / min(times)
print(json.dumps({"level10": level10, "raw": raw, "crc_gbps": crc}))
"""


def plain64_child(tree, work, repeats):
    """Runs PLAIN64 with tree's flashinfer packages first on sys.path; the samples."""
    os.makedirs(work, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        PYTHONPATH=tree,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=os.path.join(work, "log.txt"),
        FLASHINFER_DUMP_DIR=os.path.join(work, "dumps"),
        FLASHINFER_DUMP_MAX_COUNT="1000000",
        FLASHINFER_DUMP_MAX_SIZE_GB="1000",
    )
    r = subprocess.run(
        [sys.executable, "-c", PLAIN64, work, str(repeats)], env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        sys.exit(f"benchmark child failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_plain64(args, base):
    """Prints plain level 10 over raw write for this tree (and --baseline), alternating."""
    trees = {"this tree": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if args.baseline:
        trees["baseline"] = os.path.abspath(args.baseline)
    samples = {name: {"level10": [], "raw": []} for name in trees}
    crc = {}
    for round_ in range(3):
        for name, tree in trees.items():
            r = plain64_child(tree, os.path.join(base, f"p{round_}"), args.repeats)
            samples[name]["level10"] += r["level10"]
            samples[name]["raw"] += r["raw"]
            if name == "this tree":
                for impl, gbps in r["crc_gbps"].items():
                    crc[impl] = max(crc.get(impl, 0.0), gbps)
    subprocess.run(["rm", "-rf", base])
    print("plain level 10, 2 x 32 MB float32 inputs (.pt), against write(2) to new files")
    print(f"{'code':<11}{'level-10 ms':>13}{'spread':>8}{'raw ms':>9}{'spread':>8}{'ratio':>7}")
    results = {}
    for name, s in samples.items():
        l10, raw = min(s["level10"]), min(s["raw"])
        results[name] = {"level10_ms": l10 * 1e3, "raw_ms": raw * 1e3, "ratio": l10 / raw}
        print(
            f"{name:<11}{l10 * 1e3:>13.1f}{max(s['level10']) / l10 - 1:>8.0%}"
            f"{raw * 1e3:>9.1f}{max(s['raw']) / raw - 1:>8.0%}{l10 / raw:>6.2f}x"
        )
    print("CRC-32 on 64 MB, GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in crc.items()))
    results["crc_gbps"] = crc
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1,64,512", help="input sizes in MB (comma-separated)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="directory to write in (default: a temp dir here)")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--plain64", action="store_true", help="only the 64 MB plain level-10 ratio")
    p.add_argument("--baseline", metavar="DIR", help="--plain64: an older tree built in place")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench_dump_", dir=os.getcwd())
    if args.plain64:
        return run_plain64(args, base)
    results = {}
    for fmt in ("torch", "safetensors"):
        work = os.path.join(base, fmt)
        os.makedirs(work, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
        env.update(
            FLASHINFER_LOGLEVEL="10",
            FLASHINFER_LOGDEST=os.path.join(work, "log.txt"),
            FLASHINFER_DUMP_DIR=os.path.join(work, "dumps"),
            FLASHINFER_DUMP_SAFETENSORS="1" if fmt == "safetensors" else "0",
            FLASHINFER_DUMP_MAX_COUNT="1000000",
            FLASHINFER_DUMP_MAX_SIZE_GB="1000",
        )
        r = subprocess.run(
            [sys.executable, "-c", CHILD, work, args.sizes, str(args.repeats)],
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            sys.exit(f"benchmark child failed:\n{r.stderr}")
        results[fmt] = json.loads(r.stdout.strip().splitlines()[-1])
    subprocess.run(["rm", "-rf", base])

    header = (
        f"{'format':<12}{'MB':>6}{'level-10 ms':>13}{'MB/s':>9}{'raw write ms':>14}"
        f"{'of raw':>8}{'save+json ms':>14}{'FlashInfer L10 ms':>19}{'speed-up':>10}"
    )
    print(header)
    for fmt, res in results.items():
        for mb, r in res["sizes"].items():
            mbps = float(mb) / r["level10_s"]
            print(
                f"{fmt:<12}{mb:>6}{r['level10_s'] * 1e3:>13.2f}{mbps:>9.0f}"
                f"{r['raw_write_s'] * 1e3:>14.2f}{r['raw_write_s'] / r['level10_s']:>8.0%}"
                f"{r['torch_save_json_s'] * 1e3:>14.2f}"
                f"{r['flashinfer_level10_s'] * 1e3:>19.2f}"
                f"{r['flashinfer_level10_s'] / r['level10_s']:>9.1f}x"
            )
    print("speed-up = FlashInfer's level-10 recipe time / ours")
    for fmt, res in results.items():
        line = (
            f"{fmt}: level-10 call with 8 tensors of 4 KB: {res['small_8x4KB_us']:.0f} us "
            f"(raw floor {res['small_raw_floor_us']:.0f} us)"
        )
        if "small_8x4KB_shm_us" in res:
            line += (
                f"; on /dev/shm {res['small_8x4KB_shm_us']:.0f} us "
                f"(raw floor {res['small_raw_floor_shm_us']:.0f} us)"
            )
        print(line + " (medians)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
