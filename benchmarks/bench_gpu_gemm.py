"""GPU GEMM timings: bmm_fp8 (cuBLASLt and native backends) against torch._scaled_mm on
the same shapes, mm_fp8, mm_fp4 and fp4 quantization. Not a test: prints a table;
--json PATH writes the figures. Exits with a message when there is no CUDA device.

Times are medians of CUDA-event timings over --iters calls after --warmup calls, each
call through the public API (logging level 0). Target: bmm_fp8 "cublas" >= 0.9x the
speed of torch._scaled_mm (batched shapes: one _scaled_mm per batch entry), and so
mm_fp8 with backend "cublas". mm_fp8's "trtllm_low_latency" weight layout runs the
package's own WMMA kernel (fp8 tiles widened to fp16): its figure is reported, not held
to that target.
"""

import argparse
import json
import statistics
import sys

import torch

BMM_SHAPES = [  # (batch, m, n, k)
    (1, 16, 4096, 4096),
    (1, 128, 4096, 4096),
    (1, 1024, 4096, 4096),
    (1, 4096, 4096, 4096),
    (1, 8192, 8192, 8192),
    (4, 64, 128, 256),
    (8, 512, 1024, 1024),
    (16, 256, 2048, 2048),
]
FP4_SHAPES = [  # (m, n, k)
    (16, 4096, 4096),
    (128, 4096, 4096),
    (1024, 4096, 4096),
    (4096, 4096, 4096),
]


def shapes(args, table):
    """The table's shapes, or with --short its second and last (a small and a large one)."""
    return [table[1], table[-1]] if args.short else table


def time_ms(fn, warmup, iters):
    """Median milliseconds of fn() measured with CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def bmm_fp8_row(args, b, m, n, k):
    from flashinfer.gemm import bmm_fp8

    A = torch.randn(b, m, k, device="cuda").to(torch.float8_e4m3fn)
    B = torch.randn(b, n, k, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(2.0, device="cuda")
    out = torch.empty(b, m, n, device="cuda", dtype=torch.bfloat16)

    def torch_mm():
        for i in range(b):
            torch._scaled_mm(A[i], B[i], sa, sb, out_dtype=torch.bfloat16, out=out[i])

    def ours(backend):
        return lambda: bmm_fp8(A, B, sa, sb, torch.bfloat16, out, backend)

    t_torch = time_ms(torch_mm, args.warmup, args.iters)
    t_lt = time_ms(ours("cublas"), args.warmup, args.iters)
    t_native = time_ms(ours("cutlass"), args.warmup, args.iters)
    return {
        "op": "bmm_fp8",
        "shape": [b, m, n, k],
        "torch_scaled_mm_ms": t_torch,
        "cublas_ms": t_lt,
        "native_ms": t_native,
        "cublas_speed_vs_torch": t_torch / t_lt,
        "native_speed_vs_torch": t_torch / t_native,
        "cublas_tflops": tflops(2.0 * b * m * n * k, t_lt),
    }


def bench_bmm_fp8(args, rows):
    print(
        f"{'bmm_fp8 b x m x n x k':>28} {'torch ms':>9} {'cublas ms':>9} {'native ms':>9} "
        f"{'cublas/torch':>12} {'native/torch':>12} {'cublas TF/s':>11}"
    )
    for b, m, n, k in shapes(args, BMM_SHAPES):
        row = bmm_fp8_row(args, b, m, n, k)
        rows.append(row)
        print(
            f"{f'{b} x {m} x {n} x {k}':>28} {row['torch_scaled_mm_ms']:9.4f} "
            f"{row['cublas_ms']:9.4f} {row['native_ms']:9.4f} "
            f"{row['cublas_speed_vs_torch']:11.2f}x {row['native_speed_vs_torch']:11.2f}x "
            f"{row['cublas_tflops']:11.1f}"
        )


def mm_fp8_row(args, m, n, k):
    from flashinfer.gemm import mm_fp8, prepare_low_latency_gemm_weights

    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    wp = prepare_low_latency_gemm_weights(w)
    alpha = torch.tensor(1.0, device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: mm_fp8(a, wp, alpha, torch.bfloat16, out), args.warmup, args.iters)
    # the unprocessed [n, k] weight through backend "cublas" (cuBLASLt)
    ms_lt = time_ms(
        lambda: mm_fp8(a, w, alpha, torch.bfloat16, out, backend="cublas"), args.warmup, args.iters
    )
    one = torch.tensor(1.0, device="cuda")
    t_torch = time_ms(
        lambda: torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, out=out),
        args.warmup,
        args.iters,
    )
    return {
        "op": "mm_fp8",
        "shape": [m, n, k],
        "ms": ms,
        "tflops": tflops(2.0 * m * n * k, ms),
        "cublas_ms": ms_lt,
        "torch_scaled_mm_ms": t_torch,
        "speed_vs_torch": t_torch / ms,
        "cublas_speed_vs_torch": t_torch / ms_lt,
    }


def bench_mm_fp8(args, rows):
    print(
        f"\n{'mm_fp8 m x n x k':>28} {'low-lat ms':>10} {'TF/s':>9} {'cublas ms':>9} "
        f"{'torch ms':>9} {'low-lat/torch':>13} {'cublas/torch':>12}"
    )
    for m, n, k in shapes(args, FP4_SHAPES):
        row = mm_fp8_row(args, m, n, k)
        rows.append(row)
        print(
            f"{f'{m} x {n} x {k}':>28} {row['ms']:10.4f} {row['tflops']:9.1f} "
            f"{row['cublas_ms']:9.4f} {row['torch_scaled_mm_ms']:9.4f} "
            f"{row['speed_vs_torch']:12.2f}x {row['cublas_speed_vs_torch']:11.2f}x"
        )


def fp4_row(args, m, n, k):
    from flashinfer.fp4_quantization import nvfp4_quantize
    from flashinfer.gemm import mm_fp4

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a_gsf = (448.0 * 6 / a.float().abs().max()).float()
    w_gsf = (448.0 * 6 / w.float().abs().max()).float()
    a_q, a_sf = nvfp4_quantize(a, a_gsf)
    w_q, w_sf = nvfp4_quantize(w, w_gsf)
    alpha = 1.0 / (a_gsf * w_gsf)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t_q = time_ms(lambda: nvfp4_quantize(a, a_gsf), args.warmup, args.iters)
    t_mm = time_ms(
        lambda: mm_fp4(a_q, w_q.T, a_sf, w_sf.T, alpha, torch.bfloat16, out),
        args.warmup,
        args.iters,
    )
    t_bf16 = time_ms(lambda: torch.mm(a, w.T), args.warmup, args.iters)
    return {
        "op": "nvfp4",
        "shape": [m, n, k],
        "quantize_ms": t_q,
        "mm_fp4_ms": t_mm,
        "mm_fp4_tflops": tflops(2.0 * m * n * k, t_mm),
        "torch_bf16_mm_ms": t_bf16,
    }


def bench_fp4(args, rows):
    print(
        f"\n{'nvfp4 m x n x k':>28} {'quant ms':>9} {'mm_fp4 ms':>9} {'TF/s':>9} {'bf16 mm ms':>10}"
    )
    for m, n, k in shapes(args, FP4_SHAPES):
        row = fp4_row(args, m, n, k)
        rows.append(row)
        print(
            f"{f'{m} x {n} x {k}':>28} {row['quantize_ms']:9.4f} {row['mm_fp4_ms']:9.4f} "
            f"{row['mm_fp4_tflops']:9.1f} {row['torch_bf16_mm_ms']:10.4f}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--short", action="store_true", help="two shapes per table (gpu_check)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "bench_gpu_gemm: no CUDA device (torch.cuda.is_available() is False); nothing to time",
            file=sys.stderr,
        )
        return 2
    from flashinfer import _kernels
    from flashinfer.gemm import _cublas_lib_dir

    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"cuBLASLt: {_kernels.cublaslt_library(_cublas_lib_dir())}"
    )
    rows = []
    bench_bmm_fp8(args, rows)
    bench_mm_fp8(args, rows)
    bench_fp4(args, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
