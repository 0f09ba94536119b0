"""Where a recorded decode call's time goes on a GPU (tools/gpu_check.sh runs it): one layer
of bench_serving.py's default loop (4096 pages, 518 referenced), each part of the recorder's
work timed alone, 20 repeats, median. Prints one JSON line."""

import json
import os
import statistics
import time

import torch

from flashinfer_native import _C

dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
cache = torch.randn(4096, 2, 16, 8, 128, generator=gen).to(torch.bfloat16).to(dev)
pages = torch.randperm(4096, generator=gen)[:518].sort().values
key = os.urandom(4 * (64 * 1024 // 4 + 12))


def timed(fn, n=20):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


gathered = cache[pages.to(dev)]
ids = pages.tolist()
figures = {
    "gather_us": timed(lambda: cache.index_select(0, pages.to(dev))),
    "stats_gathered_us": timed(lambda: _C.tensor_stats(gathered)),
    "page_stats_us": timed(lambda: _C._page_stats(cache, ids, 0)),
    "hash_gathered_32k_chunks_us": timed(lambda: _C._chunk_hash_device(gathered, key, 32768)),
    "d2h_21mb_pinned_us": timed(
        lambda: torch.empty(21 << 20, dtype=torch.uint8, pin_memory=True).copy_(
            gathered.view(torch.uint8).flatten()[: 21 << 20]
        )
    ),
    "bytes_referenced": gathered.numel() * 2,
}
print(json.dumps(figures))
