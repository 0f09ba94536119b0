"""The flight recorder on a vLLM-shaped decode loop. Not a test: prints a table; --json PATH
writes the figures.

The loop (docs/flight-recorder.md, "At serving scale"): --layers layers, each with its own
paged KV cache of --pages pages ([pages, 2, page_size, kv_heads, head_dim], NHD, bf16);
--batch sequences of about --tokens tokens each on pages drawn at random from the cache
(the rest of the cache holds stale values no kernel reads); every step appends one token
per sequence (written into the cache with plain torch indexing, as a serving engine's own
cache kernel does), plans BatchDecodeWithPagedKVCacheWrapper once and runs it once a layer.

Each mode runs in a child process of its own (the environment is read at import):
  level0, level5                      FLASHINFER_LOGLEVEL=0 / 5
  level10                             plain level 10 (the default layout)
  level10-flashinfer, level10-compact the same with FLASHINFER_DUMP_LAYOUT set
  ring-memory                         FLASHINFER_DUMP_RING=--ring calls in memory, never firing
  ring-disk                           FLASHINFER_DUMP_RING=--ring call directories on disk
Per step it reports the median and best time, the bytes the dump directory grew by
(allocated blocks: holes of sparse files do not count; "apparent" is the files' sizes),
and the process's resident memory over its own before the loop. The referenced bytes
(the pages the step's kernels read, plus q, outputs and the plan's tables) and the new
bytes (pages changed since the step before, plus the same) are computed by the loop.

--flashinfer-python PY also runs the loop in a virtualenv holding flashinfer-python and
flashinfer-native (make bench-flashinfer builds one) with FlashInfer's own decorator
(fi-level0/5/10) and the native core serving FlashInfer (native-level5/10). On the CPU
the wrapper there is a plain-torch decode with FlashInfer's class and method names (the
real kernels need CUDA); with --device cuda it is FlashInfer's own wrapper.

--baseline DIR runs every mode of this tree and of an older tree built in place in DIR
(git worktree add DIR main; cd DIR; (cd native; python setup.py build_ext --inplace);
python setup.py build_ext --inplace), alternating,
so that both see the same machine load; ratios are then read within one run.

FLASHINFER_CPU_ISA in the environment (portable or avx2, docs/logging.md) is passed on to
every child, so that both kernel paths can be timed; every other FLASHINFER_ variable is
the mode's own.

--real-size is a GPU run's shape: 32 layers of 16384 pages (about 34 GB of bf16 KV cache),
64 sequences of about 2k tokens (flags given as well override it).
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
import json, os, statistics, sys, time
import torch

cfg = json.loads(sys.argv[1])
device = torch.device(cfg["device"])
dtype = getattr(torch, cfg["dtype"])
flavour = cfg["flavour"]  # "mirror": this repository's flashinfer; "fi": flashinfer-python

if flavour == "mirror" or cfg["device"] == "cuda":
    import flashinfer
    Wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper
else:
    # flashinfer-python's kernels need CUDA: on the CPU a plain-torch decode with its class
    # and method names, decorated by the flashinfer_api in force (FlashInfer's or the core's)
    import flashinfer
    from flashinfer.api_logging import flashinfer_api

    class BatchDecodeWithPagedKVCacheWrapper:
        @flashinfer_api
        def __init__(self, float_workspace_buffer, kv_layout="NHD"):
            self._ws = float_workspace_buffer

        @flashinfer_api
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                 page_size, q_data_type=None, kv_data_type=None):
            self._p = (indptr.tolist(), indices, last_page_len.tolist(), num_qo_heads,
                       num_kv_heads, head_dim, page_size)

        @flashinfer_api
        def run(self, q, paged_kv_cache):
            indptr, indices, last, hq, hk, d, ps = self._p
            out = torch.empty_like(q)
            for b in range(len(last)):
                pages = indices[indptr[b] : indptr[b + 1]]
                n = (len(pages) - 1) * ps + last[b]
                kv = paged_kv_cache[pages]  # [p, 2, ps, hk, d]
                k = kv[:, 0].reshape(-1, hk, d)[:n].transpose(0, 1)[None]
                v = kv[:, 1].reshape(-1, hk, d)[:n].transpose(0, 1)[None]
                o = torch.nn.functional.scaled_dot_product_attention(
                    q[b][None, :, None], k, v, enable_gqa=True
                )
                out[b] = o[0, :, 0]
            return out

    Wrapper = BatchDecodeWithPagedKVCacheWrapper


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(root):
    alloc = apparent = files = 0
    for base, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(base, name))
            except OSError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return alloc, apparent, files


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


L, P, PS, HK, HQ, D, B = (cfg[k] for k in ("layers", "pages", "page_size", "kv_heads",
                                          "qo_heads", "head_dim", "batch"))
gen = torch.Generator().manual_seed(0)
caches = [torch.randn(P, 2, PS, HK, D, generator=gen, dtype=torch.float32).to(dtype).to(device)
          for _ in range(L)]
page_bytes = caches[0][0].numel() * caches[0].element_size()
free = torch.randperm(P, generator=gen).tolist()
lengths = [cfg["tokens"] - B // 2 + i for i in range(B)]
tables = [[free.pop() for _ in range((n + PS - 1) // PS)] for n in lengths]
workspace = torch.empty(1 << 20, dtype=torch.uint8, device=device)
wrapper = Wrapper(workspace, "NHD")


def step():
    # append one token per sequence (a new page when the last one is full)
    touched = set()
    for b in range(B):
        if lengths[b] % PS == 0:
            tables[b].append(free.pop())
        page, slot = tables[b][-1], lengths[b] % PS
        lengths[b] += 1
        touched.add(page)
        for cache in caches:
            cache[page, :, slot] = torch.randn(2, HK, D, generator=gen).to(dtype).to(device)
    indptr = torch.tensor([0] + [sum(len(t) for t in tables[: b + 1]) for b in range(B)],
                          dtype=torch.int32, device=device)
    indices = torch.tensor([p for t in tables for p in t], dtype=torch.int32, device=device)
    last = torch.tensor([(n - 1) % PS + 1 for n in lengths], dtype=torch.int32, device=device)
    qs = [torch.randn(B, HQ, D, generator=gen).to(dtype).to(device) for _ in range(L)]
    sync()
    t0 = time.perf_counter()
    wrapper.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type=dtype, kv_data_type=dtype)
    outs = [wrapper.run(qs[l], caches[l]) for l in range(L)]
    sync()
    dt = time.perf_counter() - t0
    small = sum(t.numel() * t.element_size() for t in (indptr, indices, last))
    qo = 2 * L * B * HQ * D * caches[0].element_size()
    referenced = L * indices.numel() * page_bytes + qo + small
    new = L * len(touched) * page_bytes + qo + small
    return dt, referenced, new, indices.numel()


# (hashed, copied) bytes of the compact capture's device path so far (CUDA tensors hashed
# on the GPU, only new chunks copied; docs/flight-recorder.md), (0, 0) without it
def device_chunks():
    if "flashinfer_native._C" not in sys.modules:
        return 0, 0
    d = sys.modules["flashinfer_native._C"]._device_chunks()
    return d["hashed"], d["copied"]


root = os.environ.get("FLASHINFER_DUMP_DIR", "")
rss_start = rss_bytes()
for _ in range(cfg["warmup"]):
    step()
rss0 = rss_bytes()
bytes0 = dir_bytes(root) if root else (0, 0, 0)
device0 = device_chunks()
times, refs, news = [], [], []
for _ in range(cfg["steps"]):
    dt, ref, new, npages = step()
    times.append(dt)
    refs.append(ref)
    news.append(new)
bytes1 = dir_bytes(root) if root else (0, 0, 0)
device1 = device_chunks()
print(json.dumps({
    "device_hashed_bytes": (device1[0] - device0[0]) / cfg["steps"],
    "device_copied_bytes": (device1[1] - device0[1]) / cfg["steps"],
    "times": times,
    "referenced_bytes": statistics.mean(refs),
    "new_bytes": statistics.mean(news),
    "pages_referenced": npages,
    "disk_bytes": (bytes1[0] - bytes0[0]) / cfg["steps"],
    "apparent_bytes": (bytes1[1] - bytes0[1]) / cfg["steps"],
    "files": (bytes1[2] - bytes0[2]) / cfg["steps"],
    "rss_growth_bytes": rss_bytes() - rss_start,
    "rss_growth_measured_bytes": rss_bytes() - rss0,
    "rss_bytes": rss_bytes(),
}))
"""

LEVEL10 = {"FLASHINFER_LOGLEVEL": "10", "FLASHINFER_DUMP_MAX_COUNT": "100000000"}
MODES = {
    "level0": {"FLASHINFER_LOGLEVEL": "0"},
    "level5": {"FLASHINFER_LOGLEVEL": "5"},
    "level10": LEVEL10,
    "level10-flashinfer": {**LEVEL10, "FLASHINFER_DUMP_LAYOUT": "flashinfer"},
    "level10-compact": {**LEVEL10, "FLASHINFER_DUMP_LAYOUT": "compact"},
    "ring-memory": {"FLASHINFER_LOGLEVEL": "10", "FLASHINFER_DUMP_ON": "exception", "RING": ""},
    "ring-disk": {"FLASHINFER_LOGLEVEL": "10", "RING": ""},
}
FI_MODES = {
    "fi-level0": {"FLASHINFER_LOGLEVEL": "0"},
    "fi-level5": {"FLASHINFER_LOGLEVEL": "5"},
    "fi-level10": {"FLASHINFER_LOGLEVEL": "10"},
    "native-level5": {"FLASHINFER_LOGLEVEL": "5", "FLASHINFER_NATIVE_LOGGING": "1"},
    "native-level10": {"FLASHINFER_LOGLEVEL": "10", "FLASHINFER_NATIVE_LOGGING": "1"},
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(python, tree, mode_env, cfg, scratch, ring):
    keep = ("FLASHINFER_CPU_ISA",)  # the kernels' ISA, passed on (see the docstring)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_") or k in keep}
    if tree:
        env["PYTHONPATH"] = tree
    dump_dir = tempfile.mkdtemp(dir=scratch)
    env.update(
        FLASHINFER_LOGDEST=os.path.join(dump_dir, "log.txt"),
        FLASHINFER_DUMP_DIR=os.path.join(dump_dir, "dumps"),
        FLASHINFER_DUMP_MAX_SIZE_GB="100000",
        **{k: v for k, v in mode_env.items() if k != "RING"},
    )
    if "RING" in mode_env:
        env["FLASHINFER_DUMP_RING"] = str(ring)
    child_cfg = dict(cfg)
    if "FLASHINFER_DUMP_RING" in env:  # warm up until the ring is full: 2 calls a layer a step
        child_cfg["warmup"] = max(cfg["warmup"], -(-ring // (cfg["layers"] + 1)) + 1)
    try:
        r = subprocess.run(
            [python, "-c", CHILD, json.dumps(child_cfg)],
            env=env,
            capture_output=True,
            text=True,
            cwd=scratch,
        )
        if r.returncode != 0:
            sys.exit(f"benchmark child failed ({mode_env}):\n{r.stderr[-4000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--layers", type=int, help="layers, each with its own KV cache (default 4)")
    p.add_argument("--pages", type=int, help="pages per layer's cache (default 4096)")
    p.add_argument("--page-size", type=int, help="tokens per page (default 16)")
    p.add_argument("--kv-heads", type=int, help="KV heads (default 8)")
    p.add_argument("--qo-heads", type=int, help="query heads (default 32)")
    p.add_argument("--head-dim", type=int, help="head dimension (default 128)")
    p.add_argument("--batch", type=int, help="sequences (default 8)")
    p.add_argument("--tokens", type=int, help="tokens per sequence at the start (default 1024)")
    p.add_argument("--steps", type=int, default=6, help="measured steps (default 6)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    p.add_argument("--ring", type=int, default=64, help="calls the rings keep (default 64)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--real-size", action="store_true", help="32 layers x 16384 pages, 64 x 2k")
    p.add_argument("--modes", default=",".join(MODES), help="comma list (default: all)")
    p.add_argument("--flashinfer-python", metavar="PY", help="also FlashInfer's decorator (above)")
    p.add_argument("--baseline", metavar="DIR", help="an older tree built in place, alternated")
    p.add_argument("--rounds", type=int, default=1, help="alternations with --baseline")
    p.add_argument("--dir", help="scratch directory (default: a temporary one here)")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = p.parse_args()
    shape = dict(
        layers=4,
        pages=4096,
        page_size=16,
        kv_heads=8,
        qo_heads=32,
        head_dim=128,
        batch=8,
        tokens=1024,
    )
    if args.real_size:
        shape.update(layers=32, pages=16384, batch=64, tokens=2048)
    for key in shape:
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    cfg = dict(shape, steps=args.steps, warmup=args.warmup, device=args.device, dtype=args.dtype)
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_serving_", dir=os.getcwd())
    os.makedirs(scratch, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r}; accepted: {', '.join(MODES)}")
    trees = {"this tree": ROOT}
    if args.baseline:
        trees["baseline"] = os.path.abspath(args.baseline)
    results = {tree: {} for tree in trees}
    for _ in range(args.rounds):
        for mode in modes:
            for name, tree in trees.items():
                r = run_child(
                    sys.executable,
                    tree,
                    MODES[mode],
                    dict(cfg, flavour="mirror"),
                    scratch,
                    args.ring,
                )
                times = sorted(r.get("times") or [0.0])
                print(  # progress, so that a run cut short still says how far it got
                    f"{mode} ({name}): median {times[len(times) // 2] * 1e3:.1f} ms a step",
                    file=sys.stderr,
                    flush=True,
                )
                prev = results[name].get(mode)
                if prev:
                    r["times"] = prev["times"] + r["times"]
                results[name][mode] = r
    if args.flashinfer_python:
        results["flashinfer-python"] = {}
        for mode, env in FI_MODES.items():
            results["flashinfer-python"][mode] = run_child(
                args.flashinfer_python, None, env, dict(cfg, flavour="fi"), scratch, args.ring
            )
    if not args.dir:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(cfg, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "results": results}, f, indent=1)


def print_table(cfg, results):
    mb = 1 << 20
    any_run = next(r for rs in results.values() for r in rs.values())
    print(
        f"{cfg['layers']} layers x {cfg['pages']} pages of {cfg['page_size']} tokens, "
        f"{cfg['kv_heads']} KV heads, d{cfg['head_dim']}, {cfg['dtype']}, {cfg['device']}; "
        f"{cfg['batch']} sequences of ~{cfg['tokens']} tokens: pages referenced "
        f"{any_run['pages_referenced']}/{cfg['pages']} a layer; per step referenced "
        f"{any_run['referenced_bytes'] / mb:.1f} MB, new {any_run['new_bytes'] / mb:.1f} MB"
    )
    print(
        f"{'tree':<18}{'mode':<20}{'step ms':>9}{'best':>8}{'x level0':>9}"
        f"{'disk MB':>9}{'x ref':>7}{'x new':>7}{'files':>7}{'RSS +MB':>9}"
    )
    for tree, rs in results.items():
        base = rs.get("level0") or rs.get("fi-level0")
        base_ms = statistics.median(base["times"]) * 1e3 if base else None
        for mode, r in rs.items():
            ms = statistics.median(r["times"]) * 1e3
            ratio = f"{ms / base_ms:>9.2f}" if base_ms else f"{'':>9}"
            disk = r["disk_bytes"]
            print(
                f"{tree:<18}{mode:<20}{ms:>9.1f}{min(r['times']) * 1e3:>8.1f}{ratio}"
                f"{disk / mb:>9.1f}{disk / r['referenced_bytes']:>7.2f}"
                f"{disk / r['new_bytes']:>7.2f}{r['files']:>7.0f}"
                f"{r['rss_growth_bytes'] / mb:>9.0f}"
            )


if __name__ == "__main__":
    main()
