"""CPU kernels against plain torch on the same problems. Not a test: prints a table;
``--json PATH`` writes the figures.

- decode attention, fp16, 32 qo heads, 8 kv heads, head_dim 128, kv_len 4096:
  ``single_decode_with_kv_cache`` and a batch of ``--batch`` requests through
  ``BatchDecodeWithPagedKVCacheWrapper`` against
  ``torch.nn.functional.scaled_dot_product_attention`` (GQA heads expanded, fp16);
- ``bmm_fp8`` (e4m3, b=4, m=n=k=1024, bf16 out) against dequantize-then-``torch.bmm``
  (bf16).

Ratio = torch time / ours: above 1 means flashinfer-c is faster. Times are the median
of ``--repeats`` calls after two warm-up calls, on the threads torch uses. torch's inputs
(layout change, GQA expansion, page gather) are prepared once, outside its timing.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

try:
    import flashinfer
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashinfer


def median_ms(fn, repeats):
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def expand_gqa(x, hq):
    """``[B, Hk, S, D]`` -> ``[B, Hq, S, D]`` (each kv head repeated for its query group)."""
    return x.repeat_interleave(hq // x.shape[1], dim=1).contiguous()


def sdpa_decode(q, k, v):
    """torch's attention for decode: q ``[B, Hq, 1, D]``, k/v ``[B, Hq, S, D]``."""
    return F.scaled_dot_product_attention(q, k, v)


def bench_single_decode(repeats, kv_len):
    hq, hk, d = 32, 8, 128
    q = torch.randn(hq, d, dtype=torch.float16)
    k = torch.randn(kv_len, hk, d, dtype=torch.float16)
    v = torch.randn(kv_len, hk, d, dtype=torch.float16)
    # torch's layout: [1, H, S, D]; the transposes are done once, outside the timing
    tq = q.view(1, hq, 1, d)
    tk = expand_gqa(k.permute(1, 0, 2).unsqueeze(0), hq)
    tv = expand_gqa(v.permute(1, 0, 2).unsqueeze(0), hq)
    ours = median_ms(lambda: flashinfer.single_decode_with_kv_cache(q, k, v), repeats)
    theirs = median_ms(lambda: sdpa_decode(tq, tk, tv), repeats)
    diff = (
        (flashinfer.single_decode_with_kv_cache(q, k, v).float() - sdpa_decode(tq, tk, tv)[0, :, 0])
        .abs()
        .max()
        .item()
    )
    return {
        "case": f"single_decode fp16 qo32/kv8 d128 kv_len {kv_len}",
        "ours_ms": ours,
        "torch_ms": theirs,
        "max_abs_diff": diff,
    }


def bench_batch_decode(repeats, batch, kv_len, page_size=16):
    hq, hk, d = 32, 8, 128
    pages = kv_len // page_size
    cache = torch.randn(batch * pages, 2, page_size, hk, d, dtype=torch.float16)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), page_size, dtype=torch.int32)
    q = torch.randn(batch, hq, d, dtype=torch.float16)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.int8))
    w.plan(indptr, indices, last, hq, hk, d, page_size, data_type=torch.float16)
    # torch gets the same K/V gathered into dense [B, Hk, S, D] tensors, outside the timing
    kv = cache.view(batch, pages, 2, page_size, hk, d)
    tk = expand_gqa(kv[:, :, 0].reshape(batch, kv_len, hk, d).transpose(1, 2), hq)
    tv = expand_gqa(kv[:, :, 1].reshape(batch, kv_len, hk, d).transpose(1, 2), hq)
    tq = q.unsqueeze(2)
    ours = median_ms(lambda: w.run(q, cache), repeats)
    theirs = median_ms(lambda: sdpa_decode(tq, tk, tv), repeats)
    diff = (w.run(q, cache).float() - sdpa_decode(tq, tk, tv)[:, :, 0]).abs().max().item()
    return {
        "case": f"batch_decode fp16 batch {batch} qo32/kv8 d128 kv_len {kv_len} page {page_size}",
        "ours_ms": ours,
        "torch_ms": theirs,
        "max_abs_diff": diff,
    }


def bench_bmm_fp8(repeats, b=4, m=1024, n=1024, k=1024):
    def to_fp8(x):
        scale = 448.0 / x.abs().max().float()
        return (x * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

    a, a_inv = to_fp8(torch.randn(b, m, k))
    w, w_inv = to_fp8(torch.randn(b, n, k).transpose(-2, -1))
    out = torch.empty(b, m, n, dtype=torch.bfloat16)

    def ours():
        return flashinfer.bmm_fp8(a, w, a_inv, w_inv, torch.bfloat16, out)

    def theirs():
        da = (a.to(torch.bfloat16) * a_inv.to(torch.bfloat16)).to(torch.bfloat16)
        dw = (w.to(torch.bfloat16) * w_inv.to(torch.bfloat16)).to(torch.bfloat16)
        return torch.bmm(da, dw)

    t_ours = median_ms(ours, repeats)
    t_theirs = median_ms(theirs, repeats)
    ref = torch.bmm(a.float(), w.float()) * (a_inv * w_inv)
    diff = (ours().float() - ref).abs().max().item()
    return {
        "case": f"bmm_fp8 e4m3 b={b} m={m} n={n} k={k} bf16 out",
        "ours_ms": t_ours,
        "torch_ms": t_theirs,
        "max_abs_diff": diff,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--kv_len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--json", default=None, help="Write the figures to this file.")
    args = p.parse_args(argv)
    rows = [
        bench_single_decode(args.repeats, args.kv_len),
        bench_batch_decode(args.repeats, args.batch, args.kv_len),
        bench_bmm_fp8(args.repeats),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'case':<66} {'ours ms':>9} {'torch ms':>9} {'ratio':>7}")
    for r in rows:
        r["ratio_torch_over_ours"] = r["torch_ms"] / r["ours_ms"]
        print(
            f"{r['case']:<66} {r['ours_ms']:>9.3f} {r['torch_ms']:>9.3f} "
            f"{r['ratio_torch_over_ours']:>7.2f}"
        )
    print("ratio = torch time / ours (> 1: flashinfer-c faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"torch": torch.__version__, "threads": torch.get_num_threads(), "results": rows},
                f,
                indent=2,
            )
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
