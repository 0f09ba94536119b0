"""CPU kernels against this machine's roofline. Not a test: prints a table; ``--json PATH``
writes the figures.

Two probes are measured in the same process, before and after the kernels (the best of
each is kept): the read bandwidth (``torch.sum`` over a 512 MiB float32 tensor, on torch's
threads) and the float32 rate of torch's own ``bmm`` (b=4, 1024^3; its BLAS stands in for
the FMA peak). Every kernel figure is then given as a fraction of one of them:

- decode (``single_decode_with_kv_cache`` and batch paged decode; fp16 / bf16 / fp8 KV;
  GQA groups 1, 4, 8; 1k to 32k tokens): bytes of K and V read per second, against the
  read bandwidth (a KV cache that fits in the 8 MiB L3 can beat it);
- causal prefill (``single_prefill_with_kv_cache``, 1k to 8k tokens): useful FLOP/s (the
  visible half of QK^T and PV), against the bmm rate;
- ``bmm_fp8``, ``mm_fp8``, ``mm_fp4`` with m >= 256: FLOP/s against the bmm rate; with m = 4
  (weight-bound): bytes of the operands per second against the read bandwidth;
- ``nvfp4_quantize``: bytes read and written per second against the read bandwidth.

Decode and the m = 4 GEMMs also do arithmetic on every byte they read (GQA group g: 2g
FLOP per K or V element; m = 4: 8 FLOP per fp8 weight byte, 16 per NVFP4 one), so each is
given against its attainable roofline too: the lower of the read bandwidth and the bmm
rate divided by the case's FLOP per byte. "bound" names the lower one: "bw" (memory) or
"fma" (where even the FMA peak cannot keep up with the bandwidth).

Times are the best of ``--repeats`` calls after one warm-up, on ``torch.get_num_threads()``
threads (set OMP_NUM_THREADS to change it). Run it twice to see the spread.
"""

import argparse
import json
import os
import platform
import sys
import time

import torch

try:
    import flashinfer
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashinfer

from bench_cpu_gemm import nvfp4_mm_operands, to_fp8  # noqa: E402 (that benchmark's operands)

GB = 1e9
BANDWIDTH, BMM = "read bandwidth", "f32 bmm rate"


def best_s(fn, repeats, budget_s=20.0):
    """Best wall time and best CPU time (all threads) of up to ``repeats`` calls after a
    warm-up, stopping early once the calls have taken ``budget_s`` in all. CPU time is
    the steadier of the two when other work shares the machine."""
    fn()
    wall = cpu = float("inf")
    spent = 0.0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        wall, cpu, spent = min(wall, t), min(cpu, c), spent + t
        if spent > budget_s:
            break
    return wall, cpu


def machine_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
            else:
                model = platform.processor()
    except OSError:
        model = platform.processor()
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        have = [x for x in ("avx512f", "avx2", "fma", "f16c") if f" {x}" in text]
        flags = " (" + " ".join(have) + ")" if have else ""
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cpus{flags}, {torch.get_num_threads()} threads"


def rates(amount, times):
    """amount per second of wall time and per second of CPU time."""
    return amount / times[0], amount / times[1]


def probe_bandwidth(repeats):
    x = torch.ones(128 * 1024 * 1024, dtype=torch.float32)  # 512 MiB, far past any cache
    return rates(x.numel() * 4, best_s(lambda: x.sum(), repeats))


def probe_bmm(repeats):
    a, b = torch.randn(4, 1024, 1024), torch.randn(4, 1024, 1024)
    out = torch.empty(4, 1024, 1024)
    return rates(2 * 4 * 1024**3, best_s(lambda: torch.bmm(a, b, out=out), repeats))


def kv_tensor(shape, dtype, gen):
    x = torch.randn(shape, generator=gen)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.clamp(-8, 8).to(dtype)
    return x.to(dtype)


DTYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


def case_single_decode(kv_dtype, group, kv_len, hk=8, d=128):
    gen = torch.Generator().manual_seed(0)
    q_dtype = kv_dtype if kv_dtype in (torch.float16, torch.bfloat16) else torch.float16
    q = torch.randn(hk * group, d, generator=gen).to(q_dtype)
    k = kv_tensor((kv_len, hk, d), kv_dtype, gen)
    v = kv_tensor((kv_len, hk, d), kv_dtype, gen)
    name = f"single_decode {DTYPE_NAMES[kv_dtype]} kv {kv_len} group {group} ({hk} kv heads)"
    flops = 4 * d * group * hk * kv_len  # q.k and p*v for every query head and key
    run = lambda: flashinfer.single_decode_with_kv_cache(q, k, v)  # noqa: E731
    return name, run, k.nbytes * 2, BANDWIDTH, flops


def case_batch_decode(kv_dtype, group, kv_len, batch=8, page_size=16, hk=8, d=128):
    gen = torch.Generator().manual_seed(1)
    q_dtype = kv_dtype if kv_dtype in (torch.float16, torch.bfloat16) else torch.float16
    pages = kv_len // page_size
    cache = kv_tensor((batch * pages, 2, page_size, hk, d), kv_dtype, gen)
    # pages of a request scattered over the cache, as a serving session leaves them
    indices = torch.randperm(batch * pages, generator=gen).to(torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    last = torch.full((batch,), page_size, dtype=torch.int32)
    q = torch.randn(batch, hk * group, d, generator=gen).to(q_dtype)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.int8))
    w.plan(
        indptr, indices, last, hk * group, hk, d, page_size, data_type=kv_dtype, q_data_type=q_dtype
    )
    name = (
        f"batch_decode {DTYPE_NAMES[kv_dtype]} {batch}x kv {kv_len} group {group} page {page_size}"
    )
    flops = 4 * d * group * hk * kv_len * batch
    return name, lambda: w.run(q, cache), cache.nbytes, BANDWIDTH, flops


def case_prefill(n, hq=8, hk=2, d=128):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(n, hq, d, generator=gen).to(torch.float16)
    k = torch.randn(n, hk, d, generator=gen).to(torch.float16)
    v = torch.randn(n, hk, d, generator=gen).to(torch.float16)
    flops = 4 * hq * d * (n * (n + 1) // 2)  # QK^T and PV over the visible (causal) half
    name = f"single_prefill fp16 causal {n} tokens qo{hq}/kv{hk} d{d}"
    run = lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)  # noqa: E731
    return name, run, flops, BMM, flops


def case_bmm_fp8(b, m, n, k):
    a, a_inv = to_fp8(torch.randn(b, m, k))
    w, w_inv = to_fp8(torch.randn(b, n, k).transpose(-2, -1))
    out = torch.empty(b, m, n, dtype=torch.bfloat16)
    name = f"bmm_fp8 e4m3 b={b} m={m} n={n} k={k}"

    def run():
        return flashinfer.bmm_fp8(a, w, a_inv, w_inv, torch.bfloat16, out)

    if m < 256:
        return name, run, a.nbytes + w.nbytes, BANDWIDTH, 2 * b * m * n * k
    return name, run, 2 * b * m * n * k, BMM, 2 * b * m * n * k


def case_mm_fp8(m, n, k):
    a, a_inv = to_fp8(torch.randn(m, k))
    w, w_inv = to_fp8(torch.randn(n, k))
    wp = flashinfer.prepare_low_latency_gemm_weights(w, None)
    alpha = (a_inv * w_inv).float()
    out = torch.empty(m, n, dtype=torch.bfloat16)
    name = f"mm_fp8 e4m3 m={m} n={n} k={k}"

    def run():
        return flashinfer.mm_fp8(a, wp, alpha, torch.bfloat16, out)

    if m < 256:
        return name, run, a.nbytes + w.nbytes, BANDWIDTH, 2 * m * n * k
    return name, run, 2 * m * n * k, BMM, 2 * m * n * k


def case_mm_fp4(m, n, k):
    _, _, run, moved = nvfp4_mm_operands(m, n, k)
    name = f"mm_fp4 nvfp4 m={m} n={n} k={k}"
    if m < 256:
        return name, run, moved, BANDWIDTH, 2 * m * n * k
    return name, run, 2 * m * n * k, BMM, 2 * m * n * k


def case_nvfp4_quantize(m, k):
    x = torch.randn(m, k, dtype=torch.bfloat16)
    gsf = (448 * 6) / x.float().abs().max()
    moved = x.nbytes + m * k // 2 + m * k // 16  # read x, write codes and scales
    name = f"nvfp4_quantize bf16 m={m} k={k}"
    run = lambda: flashinfer.nvfp4_quantize(x, gsf, do_shuffle=False)  # noqa: E731
    return name, run, moved, BANDWIDTH, 0


def attainable_roof(row, bandwidth, bmm):
    """(attainable rate, "bw" or "fma" or "", FLOP per byte or None) of one case, wall time.
    Byte-rated cases that compute (decode, m = 4 GEMMs) can be held below the bandwidth by
    the FMA rate; FLOP-rated ones and the quantizer have a single roof."""
    if row["against"] != BANDWIDTH:
        return bmm, "fma", None
    if not row["flops"]:
        return bandwidth, "bw", None
    intensity = row["flops"] / row["amount"]
    compute = bmm / intensity
    return (compute, "fma", intensity) if compute < bandwidth else (bandwidth, "bw", intensity)


def cases(quick):
    lens = (1024, 4096) if quick else (1024, 4096, 32768)
    dtypes = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
    for dtype in dtypes:
        for group in (1, 4, 8):
            for kv_len in lens:
                yield lambda dtype=dtype, g=group, n=kv_len: case_single_decode(dtype, g, n)
    for dtype in dtypes:
        for kv_len in lens[:-1] if not quick else lens:
            yield lambda dtype=dtype, n=kv_len: case_batch_decode(dtype, 4, n)
    yield lambda: case_batch_decode(torch.float16, 1, 4096)
    yield lambda: case_batch_decode(torch.float16, 8, 4096)
    for n in (1024, 4096) if quick else (1024, 4096, 8192):
        yield lambda n=n: case_prefill(n)
    yield lambda: case_bmm_fp8(4, 1024, 1024, 1024)
    yield lambda: case_mm_fp8(256, 2048, 7168)
    yield lambda: case_mm_fp4(256, 2048, 7168)
    yield lambda: case_mm_fp4(1024, 1024, 1024)
    yield lambda: case_bmm_fp8(4, 4, 1024, 1024)
    yield lambda: case_mm_fp8(4, 2048, 7168)
    yield lambda: case_mm_fp4(4, 1024, 7168)
    yield lambda: case_nvfp4_quantize(4096, 7168)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="skip the 32k decode and 8k prefill")
    p.add_argument("--only", help="run only cases whose name contains this")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    machine = machine_name()
    print(machine, flush=True)
    bandwidth, bmm = probe_bandwidth(args.repeats * 2), probe_bmm(args.repeats)
    rows = []
    for make in cases(args.quick):
        name, run, amount, roof, flops = make()
        if args.only and args.only not in name:
            continue
        t = best_s(run, args.repeats)
        rows.append(
            {"case": name, "ms": t[0] * 1e3, "cpu_ms": t[1] * 1e3, "amount": amount}
            | {"per_s": amount / t[0], "per_cpu_s": amount / t[1], "against": roof}
            | {"flops": flops}
        )
        del run
    # the probes again, after the kernels: the best of both keeps a busy moment out
    b2, m2 = probe_bandwidth(args.repeats * 2), probe_bmm(args.repeats)
    bandwidth = (max(bandwidth[0], b2[0]), max(bandwidth[1], b2[1]))
    bmm = (max(bmm[0], m2[0]), max(bmm[1], m2[1]))
    print(
        f"probes (best of two): {BANDWIDTH} {bandwidth[0] / GB:.1f} GB/s "
        f"({bandwidth[1] / GB:.1f} per CPU-second), "
        f"{BMM} {bmm[0] / GB:.1f} GFLOP/s ({bmm[1] / GB:.1f} per CPU-second)"
    )
    print(
        "fraction: of the roofline in wall time (and in CPU time: both rates per CPU-second);"
        " attainable: the lower of the bandwidth and bmm rate / FLOP per byte (wall)"
    )
    print(
        f"{'case':58s} {'ms':>9s} {'rate':>15s} {'fraction':>9s} {'(cpu)':>7s} "
        f"{'FLOP/B':>7s} {'attainable':>10s} {'bound':>5s} {'of attainable':>14s}"
    )
    for r in rows:
        wall_roof, cpu_roof = bandwidth if r["against"] == BANDWIDTH else bmm
        unit = "GB/s" if r["against"] == BANDWIDTH else "GFLOP/s"
        r["fraction"] = r["per_s"] / wall_roof
        r["fraction_cpu"] = r["per_cpu_s"] / cpu_roof
        attainable, bound, intensity = attainable_roof(r, bandwidth[0], bmm[0])
        r |= {"flop_per_byte": intensity, "attainable_per_s": attainable, "bound": bound}
        r["fraction_of_attainable"] = r["per_s"] / attainable
        shown = f"{intensity:7.1f}" if intensity else f"{'':7s}"
        print(
            f"{r['case']:58s} {r['ms']:9.2f} {r['per_s'] / GB:7.1f} {unit:7s} "
            f"{r['fraction']:8.1%} {r['fraction_cpu']:7.1%} {shown} {attainable / GB:10.1f} "
            f"{bound:>5s} {r['fraction_of_attainable']:13.1%}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": machine,
                    "threads": torch.get_num_threads(),
                    "read_bandwidth_gb_s": bandwidth[0] / GB,
                    "read_bandwidth_gb_per_cpu_s": bandwidth[1] / GB,
                    "f32_bmm_gflop_s": bmm[0] / GB,
                    "f32_bmm_gflop_per_cpu_s": bmm[1] / GB,
                    "cases": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
