"""A small vLLM-shaped decode loop for the recorder's tests (benchmarks/bench_serving.py is
the full-size one): layers of paged KV caches, one plan and a run per layer a step, each step
appending one token per sequence into the cache with plain torch indexing."""

import os
import subprocess
import sys
import textwrap

import torch

import flashinfer

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def record(tmp_path, body, name="dumps", level="10", **env_extra):
    """Runs body (after ``import torch, serving_loop``) in a child at FLASHINFER_LOGLEVEL=level
    with its dumps under tmp_path/name and env_extra set; returns that dump root."""
    root = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL=level,
        FLASHINFER_LOGDEST=str(tmp_path / f"{name}.log"),
        FLASHINFER_DUMP_DIR=str(root),
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
        **env_extra,
    )
    src = "import torch\nimport serving_loop\n" + textwrap.dedent(body)
    r = subprocess.run(
        [sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return root


def run(
    steps=3,
    layers=2,
    pages=64,
    page_size=4,
    kv_heads=2,
    qo_heads=4,
    head_dim=64,
    batch=3,
    tokens=9,
    dtype=torch.bfloat16,
    stale=None,
    bad_page=None,
    seed=0,
    workspace=None,
    device="cpu",
):
    """Runs the loop; returns the outputs of every run call, in order.

    stale(step, caches, referenced): called before each step to change pages the step does
    not read. bad_page: an out-of-range page id given to the last sequence's table.
    workspace: the wrapper's workspace (4 KiB of uint8 when None). device: where the caches,
    tables and queries live (their values are drawn on the CPU, the same on every device)."""
    gen = torch.Generator().manual_seed(seed)
    caches = [
        torch.randn(pages, 2, page_size, kv_heads, head_dim, generator=gen).to(dtype).to(device)
        for _ in range(layers)
    ]
    free = torch.randperm(pages, generator=gen).tolist()
    lengths = [tokens + i for i in range(batch)]
    tables = [[free.pop() for _ in range((n + page_size - 1) // page_size)] for n in lengths]
    if workspace is None:
        # the workspace as serving engines allocate it: uint8 (FlashInfer's examples); a float
        # torch.empty may hold NaN bit patterns, which fire nan_input at __init__ by chance
        workspace = torch.empty(4096, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    outs = []
    for step in range(steps):
        for b in range(batch):
            if lengths[b] % page_size == 0:
                tables[b].append(free.pop())
            slot = lengths[b] % page_size
            lengths[b] += 1
            for cache in caches:
                cache[tables[b][-1], :, slot] = (
                    torch.randn(2, kv_heads, head_dim, generator=gen).to(dtype).to(device)
                )
        referenced = sorted({p for t in tables for p in t})
        if stale:
            stale(step, caches, referenced)
        ids = [p for t in tables for p in t]
        if bad_page is not None:
            ids[-1] = bad_page
        indptr = torch.tensor(
            [0] + [sum(len(t) for t in tables[: b + 1]) for b in range(batch)],
            dtype=torch.int32,
            device=device,
        )
        last = torch.tensor(
            [(n - 1) % page_size + 1 for n in lengths], dtype=torch.int32, device=device
        )
        wrapper.plan(
            indptr,
            torch.tensor(ids, dtype=torch.int32, device=device),
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            kv_data_type=dtype,
        )
        for layer in range(layers):
            q = torch.randn(batch, qo_heads, head_dim, generator=gen).to(dtype).to(device)
            outs.append(wrapper.run(q, caches[layer]))
    return outs
