"""flashinfer-c demo (``make demo``): record an API session with the level-10 flight
recorder, then replay it and check every call reproduces its recorded outputs.

Steps:
1. a child process runs several APIs with ``FLASHINFER_LOGLEVEL=10`` and
   ``FLASHINFER_DUMP_DIR=./demo_dumps`` (removed first, so each run starts fresh);
2. an excerpt of its level-10 log and the dump tree are printed;
3. ``python -m flashinfer replay --dir ./demo_dumps`` and
   ``python -m flashinfer dumps --dir ./demo_dumps`` run and their output is printed.

Exit status 0 only when every recorded call replayed with a match.
"""

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMP_DIR = "./demo_dumps"
LOG_FILE = "./demo_flashinfer.log"
EXCERPT_LINES = 24


def session():
    """The recorded session (runs in the child process, at level 10)."""
    import torch

    import flashinfer
    from flashinfer import SfLayout

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    f16 = dict(device=device, dtype=torch.float16)

    # single-request decode and causal prefill, grouped-query attention (8 qo / 2 kv heads)
    q = torch.randn(8, 128, **f16)
    k = torch.randn(512, 2, 128, **f16)
    v = torch.randn(512, 2, 128, **f16)
    o = flashinfer.single_decode_with_kv_cache(q, k, v)
    print(f"single_decode_with_kv_cache -> {tuple(o.shape)}")
    qp = torch.randn(64, 8, 128, **f16)
    o = flashinfer.single_prefill_with_kv_cache(qp, k, v, causal=True)
    print(f"single_prefill_with_kv_cache(causal=True) -> {tuple(o.shape)}")

    # batched decode over a paged KV cache: __init__, plan, run
    batch, kv_len, page = 4, 200, 16
    pages = (kv_len + page - 1) // page
    kv_cache = torch.randn(batch * pages, 2, page, 2, 128, **f16)
    indptr = torch.arange(batch + 1, device=device, dtype=torch.int32) * pages
    indices = torch.randperm(batch * pages).to(device=device, dtype=torch.int32)
    last = torch.full((batch,), (kv_len - 1) % page + 1, device=device, dtype=torch.int32)
    workspace = torch.empty(1024 * 1024, dtype=torch.int8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last, 8, 2, 128, page, data_type=torch.float16)
    o, lse = wrapper.run(torch.randn(batch, 8, 128, **f16), kv_cache, return_lse=True)
    print(f"BatchDecodeWithPagedKVCacheWrapper.run -> {tuple(o.shape)}, lse {tuple(lse.shape)}")

    # FP8 batched GEMM (column-major B), per-tensor scales
    def to_fp8(x):
        scale = 448.0 / x.abs().max().float().clamp(min=1e-12)
        return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

    a, a_inv = to_fp8(torch.randn(2, 64, 256, device=device))
    b, b_inv = to_fp8(torch.randn(2, 128, 256, device=device).transpose(-2, -1))
    o = flashinfer.bmm_fp8(a, b, a_inv, b_inv, torch.bfloat16, backend="cublas")
    print(f"bmm_fp8 -> {tuple(o.shape)} {o.dtype}")

    # NVFP4: quantize activations and weights, then the FP4 GEMM
    x = torch.randn(16, 512, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    gx = (448 * 6) / x.float().abs().max()
    gw = (448 * 6) / w.float().abs().max()
    xq, xs = flashinfer.nvfp4_quantize(x, gx, sfLayout=SfLayout.layout_128x4)
    wq, ws = flashinfer.nvfp4_quantize(w, gw, sfLayout=SfLayout.layout_128x4)
    o = flashinfer.mm_fp4(xq, wq.T, xs, ws.T, 1.0 / (gx * gw), torch.bfloat16, backend="cudnn")
    print(f"mm_fp4 -> {tuple(o.shape)} {o.dtype}")


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def heading(text):
    print(f"\n=== {text} " + "=" * max(0, 74 - len(text)))


def run(argv, **env):
    """Run a child, echo its output, return its exit status."""
    shown = [os.path.basename(a) if a == os.path.abspath(__file__) else a for a in argv]
    print("$ python " + " ".join(shown), flush=True)
    r = subprocess.run(
        [sys.executable, *argv], env=child_env(**env), capture_output=True, text=True
    )
    sys.stdout.write(r.stdout)
    if r.returncode != 0 and r.stderr:
        sys.stdout.write(r.stderr)
    sys.stdout.flush()
    return r.returncode


def log_excerpt(path):
    """The head of the first call's block and one line per logged call."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    calls = [i for i, line in enumerate(lines) if "FlashInfer API Call:" in line]
    if not calls:
        return lines[:EXCERPT_LINES]
    first = calls[0]
    out = lines[first : first + EXCERPT_LINES]
    out.append(f"... ({len(lines)} log lines in all; calls logged:)")
    out += ["  " + lines[i].split("FlashInfer API Call: ", 1)[1] for i in calls]
    return out


def dump_tree(root):
    lines = [f"{root}/"]
    entries = sorted(os.listdir(root))
    for n, name in enumerate(entries):
        last = n == len(entries) - 1
        path = os.path.join(root, name)
        if os.path.isdir(path):
            lines.append(("└── " if last else "├── ") + name + "/")
            files = sorted(os.listdir(path))
            for m, f in enumerate(files):
                size = os.path.getsize(os.path.join(path, f))
                branch = "└── " if m == len(files) - 1 else "├── "
                lines.append(("    " if last else "│   ") + branch + f"{f} ({size} bytes)")
        else:
            size = os.path.getsize(path)
            lines.append(("└── " if last else "├── ") + f"{name} ({size} bytes)")
    return lines


def main():
    shutil.rmtree(DUMP_DIR, ignore_errors=True)
    if os.path.exists(LOG_FILE):
        os.remove(LOG_FILE)

    heading("1. record a session at FLASHINFER_LOGLEVEL=10")
    status = run(
        [os.path.abspath(__file__), "--child"],
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR=DUMP_DIR,
        FLASHINFER_LOGDEST=LOG_FILE,
    )
    if status != 0:
        print(f"demo: the recording process failed (exit status {status})")
        return 1

    heading(f"2. level-10 log excerpt ({LOG_FILE})")
    print("\n".join(log_excerpt(LOG_FILE)))

    heading("3. dump tree")
    print("\n".join(dump_tree(DUMP_DIR)))

    heading("4. replay")
    replay_status = run(["-m", "flashinfer", "replay", "--dir", DUMP_DIR])

    heading("5. session summary")
    dumps_status = run(["-m", "flashinfer", "dumps", "--dir", DUMP_DIR])

    ok = replay_status == 0 and dumps_status == 0
    print("\ndemo: " + ("every recorded call replayed and matched" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        session()
    else:
        sys.exit(main())
