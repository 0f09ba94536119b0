"""Level-5 statistics on CUDA: the statistics kernel's read rate against a device copy.

Each of float16, bfloat16 and float32 over 2^28 elements (0.5-1 GB). The figure held to a
target is the slowest dtype's read rate over the rate of a 1 GB device-to-device copy
(read plus written bytes). Run: python3 benchmarks/bench_gpu_stats.py [--json PATH]
"""

import argparse
import json

import torch
from gpu_timing import copy_rate, time_cuda


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_stats: no CUDA device; nothing to measure")
        return 0
    from flashinfer_native import _C

    copy = copy_rate(1 << 30, iters=10)
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(1 << 28, device="cuda").to(dtype)
        t = time_cuda(lambda x=x: _C.tensor_stats(x), 5, warmup=1)
        nbytes = x.numel() * x.element_size()
        rows.append({"dtype": str(dtype), "bytes": nbytes, "s": t, "GB_s": nbytes / t / 1e9})
        print(f"stats {dtype}: {nbytes / t / 1e9:.0f} GB/s ({t * 1e3:.2f} ms)")
        del x
    worst = min(r["GB_s"] for r in rows) * 1e9
    print(f"D2D copy {copy / 1e9:.0f} GB/s (read+write); worst stats/copy {worst / copy:.2f}")
    if args.json:
        data = {"copy_GB_s": copy / 1e9, "rows": rows, "read_vs_copy": worst / copy}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
