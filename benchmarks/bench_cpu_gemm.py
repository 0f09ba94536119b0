"""CPU fp8 / fp4 GEMM timings. Not a test: prints one line per case (best of ``--repeats``
calls after one warm-up, on torch's thread count) next to dequantize-then-torch.

Cases: ``bmm_fp8`` e4m3 b=4 m=n=k=1024 with column-major B (large), ``bmm_fp8`` with
m=4 (small m), ``mm_fp8`` m=4 n=2048 k=7168 (prepared weight), and ``mm_fp4`` NVFP4
m=4 n=1024 k=7168 (the seed's benchmark size). ``--save PATH`` stores the outputs and
``--check PATH`` compares against stored ones (max relative difference).
"""

import argparse
import os
import sys
import time

import torch

try:
    import flashinfer
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashinfer


def best_ms(fn, repeats):
    """Best wall time and best CPU time (all threads; steadier on a shared machine), in ms."""
    fn()
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, (time.perf_counter() - t0) * 1e3)
        cpu = min(cpu, (time.process_time() - c0) * 1e3)
    return wall, cpu


def to_fp8(x):
    scale = 448.0 / x.abs().max().float()
    return (x * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()


def case_bmm_fp8(b, m, n, k):
    a, a_inv = to_fp8(torch.randn(b, m, k))
    w, w_inv = to_fp8(torch.randn(b, n, k).transpose(-2, -1))
    out = torch.empty(b, m, n, dtype=torch.bfloat16)

    def ours():
        return flashinfer.bmm_fp8(a, w, a_inv, w_inv, torch.bfloat16, out)

    def theirs():
        return ((a.float() @ w.float()) * (a_inv * w_inv)).to(torch.bfloat16)

    return f"bmm_fp8 b={b} m={m} n={n} k={k} B col-major", ours, theirs, 2 * b * m * n * k


def case_mm_fp8(m, n, k):
    a, a_inv = to_fp8(torch.randn(m, k))
    w, w_inv = to_fp8(torch.randn(n, k))
    wp = flashinfer.prepare_low_latency_gemm_weights(w, None)
    alpha = (a_inv * w_inv).float()
    out = torch.empty(m, n, dtype=torch.bfloat16)

    def ours():
        return flashinfer.mm_fp8(a, wp, alpha, torch.bfloat16, out)

    def theirs():
        return ((a.float() @ w.float().T) * alpha).to(torch.bfloat16)

    return f"mm_fp8 m={m} n={n} k={k}", ours, theirs, 2 * m * n * k


def nvfp4_mm_operands(m, n, k):
    """Random bf16 a [m, k] and w [n, k], and mm_fp4(a, w^T) as a call on their NVFP4
    quantizations into a preallocated output; returns (a, w, call, nvfp4 bytes read)."""
    a = torch.randn(m, k, dtype=torch.bfloat16)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    gsf_a = (448 * 6) / a.float().abs().max()
    gsf_w = (448 * 6) / w.float().abs().max()
    a_q, a_sf = flashinfer.nvfp4_quantize(a, gsf_a, do_shuffle=False)
    w_q, w_sf = flashinfer.nvfp4_quantize(w, gsf_w, do_shuffle=False)
    alpha = 1.0 / (gsf_a * gsf_w)
    out = torch.empty(m, n, dtype=torch.bfloat16)

    def call():
        return flashinfer.mm_fp4(a_q, w_q.T, a_sf, w_sf.T, alpha, torch.bfloat16, out)

    return a, w, call, a_q.nbytes + w_q.nbytes + a_sf.nbytes + w_sf.nbytes


def case_mm_fp4(m, n, k):
    a, w, ours, _ = nvfp4_mm_operands(m, n, k)
    wf = w.float()

    def theirs():  # not the same values (no quantization), only the matmul cost
        return (a.float() @ wf.T).to(torch.bfloat16)

    return f"mm_fp4 nvfp4 m={m} n={n} k={k}", ours, theirs, 2 * m * n * k


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--save", help="store the outputs here")
    ap.add_argument("--check", help="compare the outputs with ones stored here")
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args()
    torch.manual_seed(0)
    cases = [
        case_bmm_fp8(4, 1024, 1024, 1024),
        case_bmm_fp8(4, 4, 1024, 1024),
        case_mm_fp8(4, 2048, 7168),
        case_mm_fp4(4, 1024, 7168),
        case_mm_fp4(64, 512, 1024),
    ]
    saved = torch.load(args.check) if args.check else {}
    outs = {}
    print(f"threads {torch.get_num_threads()}")
    for name, ours, theirs, flops in cases:
        if args.only and args.only not in name:
            continue
        t_ours, c_ours = best_ms(ours, args.repeats)
        t_torch, c_torch = best_ms(theirs, args.repeats)
        got = ours().float().clone()
        outs[name] = got
        line = (
            f"{name:36s} ours {t_ours:7.2f} ms (cpu {c_ours:7.2f}, "
            f"{flops / t_ours / 1e6:6.1f} GFLOP/s)  torch {t_torch:7.2f} ms (cpu {c_torch:7.2f})"
        )
        if name in saved:
            ref = saved[name]
            rel = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            line += f"  max rel diff vs saved {rel:.2e}"
        print(line, flush=True)
    if args.save:
        torch.save(outs, args.save)


if __name__ == "__main__":
    main()
