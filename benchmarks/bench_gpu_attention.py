"""Decode attention on CUDA: achieved memory bandwidth and logging overhead per level.

Batch 64 x 4096 KV tokens (paged, page size 16), fp16, 32 query / 8 KV heads of 128 dims.
Bandwidth is (K + V + q + o bytes) / time against the GPU's peak (table by name, else a
measured device-to-device copy). Run: python3 benchmarks/bench_gpu_attention.py [--json PATH]
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from gpu_timing import copy_rate, time_cuda

PEAK_TB_S = {"H100 SXM": 3.35, "H100 80GB HBM3": 3.35, "H200": 4.8}
BATCH, KV_LEN, HQ, HKV, D, PAGE = 64, 4096, 32, 8, 128, 16


def peak_bandwidth():
    name = torch.cuda.get_device_name()
    for key, tb in PEAK_TB_S.items():
        if key in name:
            return tb * 1e12, f"{name} (table)"
    return copy_rate(), f"{name} (measured copy)"


def setup():
    import flashinfer

    pages = BATCH * KV_LEN // PAGE
    kc = torch.randn(pages, PAGE, HKV, D, dtype=torch.float16, device="cuda")
    vc = torch.randn(pages, PAGE, HKV, D, dtype=torch.float16, device="cuda")
    indptr = torch.arange(BATCH + 1, dtype=torch.int32) * (KV_LEN // PAGE)
    indices = torch.arange(pages, dtype=torch.int32)
    last = torch.full((BATCH,), PAGE, dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device="cuda"))
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    q = torch.randn(BATCH, HQ, D, dtype=torch.float16, device="cuda")
    return lambda: w.run(q, (kc, vc)), 2 * kc.numel() * 2 + 2 * q.numel() * 2


def child(level):
    """One level per process: api_logging reads FLASHINFER_LOGLEVEL at import."""
    fn, _ = setup()
    print(time_cuda(fn, 50))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_attention: no CUDA device; nothing to measure")
        return 0
    from flashinfer import _kernels

    if not _kernels.cuda_built:
        print("bench_gpu_attention: flashinfer was built without CUDA kernels")
        return 0
    fn, nbytes = setup()
    t = time_cuda(fn, 50)
    peak, source = peak_bandwidth()
    copy = copy_rate()
    print(
        f"decode {BATCH}x{KV_LEN} fp16 Hq={HQ} Hkv={HKV} D={D}: {t * 1e6:.1f} us, "
        f"{nbytes / t / 1e12:.3f} TB/s = {100 * nbytes / t / peak:.1f}% of peak "
        f"{peak / 1e12:.2f} TB/s [{source}], {nbytes / t / copy:.2f}x a measured D2D copy "
        f"({copy / 1e12:.2f} TB/s read+write)"
    )
    times = {}
    for level in (0, 1, 3, 5):
        env = dict(os.environ, FLASHINFER_LOGLEVEL=str(level), FLASHINFER_LOGDEST=os.devnull)
        r = subprocess.run(
            [sys.executable, __file__, "--child", str(level)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        times[level] = float(r.stdout.strip().splitlines()[-1])
    for level in (0, 1, 3, 5):
        extra = (times[level] - times[0]) * 1e6
        print(
            f"logging level {level}: {times[level] * 1e6:.1f} us per call "
            f"({extra:+.1f} us vs level 0, {100 * extra / 1e6 / times[0]:+.1f}% of the step)"
        )
    if args.json:
        figures = {
            "device": torch.cuda.get_device_name(),
            "decode_s": t,
            "bytes": nbytes,
            "TB_s": nbytes / t / 1e12,
            "copy_TB_s": copy / 1e12,
            "bandwidth_vs_copy": nbytes / t / copy,
            "level_s": {str(k): v for k, v in times.items()},
            "level1_share": (times[1] - times[0]) / times[0],
            "level3_share": (times[3] - times[0]) / times[0],
            "level5_ratio": times[5] / times[0],
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
