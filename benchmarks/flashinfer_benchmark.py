"""FlashInfer's benchmark driver, for flashinfer-c (docs/kernels.md).

Usage::

    python3 benchmarks/flashinfer_benchmark.py --routine mm_fp4 --m 4 --n 1024 --k 7168 \\
        --out_dtype bfloat16 --backends cudnn --use_128x4_sf_layout --use_nvfp4 --refcheck \\
        -vv --generate_repro_command --use_cupti --no_cuda_graph --num_iters 5

Routines: mm_fp4, bmm_fp8, mm_fp8, single_decode_with_kv_cache,
single_prefill_with_kv_cache, BatchDecodeWithPagedKVCacheWrapper,
BatchPrefillWithPagedKVCacheWrapper. FlashInfer's flags are accepted; those that cannot
apply on this device (CUPTI, CUDA graphs, backend choice on CPU) are reported as ignored
in one line. Per backend it prints the median time per call, TFLOP/s and TB/s, and with
``--refcheck`` the result of a check against a short torch reference (dequantize then
matmul for GEMMs, float32 softmax attention for attention). Under
``FLASHINFER_LOGLEVEL=10`` every API call is recorded and can be replayed with
``flashinfer replay --dir DUMP_DIR``.
"""

import argparse
import csv
import math
import os
import shlex
import statistics
import sys
import time

import torch

try:
    import flashinfer
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashinfer
from flashinfer.fp4_quantization import SfLayout

GEMM_ROUTINES = ("mm_fp4", "bmm_fp8", "mm_fp8")
ATTENTION_ROUTINES = (
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
)
ROUTINES = GEMM_ROUTINES + ATTENTION_ROUTINES

BACKENDS = {
    "mm_fp4": ("cudnn", "trtllm", "cutlass", "auto"),
    "bmm_fp8": ("cudnn", "cublas", "cublaslt", "cutlass", "auto"),
    "mm_fp8": ("trtllm_low_latency", "trtllm"),
}
ATTENTION_BACKENDS = ("fa2", "fa2_tc", "fa3", "cudnn", "cutlass", "trtllm-gen", "auto")
DEFAULT_BACKENDS = {
    "mm_fp4": ["cudnn"],
    "bmm_fp8": ["cublas"],
    "mm_fp8": ["trtllm_low_latency"],
}

DTYPES = {
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn,
    "e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "e5m2": torch.float8_e5m2,
}

# Flags each routine reads (beyond the common ones); the repro command lists these.
ROUTINE_FLAGS = {
    "mm_fp4": ["m", "n", "k", "out_dtype", "use_128x4_sf_layout", "use_nvfp4", "autotune"],
    "bmm_fp8": ["batch_size", "m", "n", "k", "input_dtype", "mat2_dtype", "out_dtype"],
    "mm_fp8": ["m", "n", "k", "out_dtype"],
    "single_decode_with_kv_cache": [
        "s_kv",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo",
        "q_dtype",
        "kv_dtype",
    ],
    "single_prefill_with_kv_cache": [
        "s_qo",
        "s_kv",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo",
        "q_dtype",
        "kv_dtype",
        "causal",
    ],
    "BatchDecodeWithPagedKVCacheWrapper": [
        "batch_size",
        "s_kv",
        "page_size",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo",
        "q_dtype",
        "kv_dtype",
        "random_actual_seq_len",
    ],
    "BatchPrefillWithPagedKVCacheWrapper": [
        "batch_size",
        "s_qo",
        "s_kv",
        "page_size",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo",
        "q_dtype",
        "kv_dtype",
        "causal",
        "random_actual_seq_len",
    ],
}
COMMON_FLAGS = [
    "backends",
    "refcheck",
    "allow_output_mismatch",
    "use_cupti",
    "no_cuda_graph",
    "num_iters",
    "dry_run_iters",
    "random_seed",
    "output_path",
    "case_tag",
]


def build_parser():
    """The argument parser: FlashInfer's flag names, defaults where FlashInfer requires."""
    p = argparse.ArgumentParser(
        prog="flashinfer_benchmark.py",
        description="Benchmark and check one FlashInfer API (flashinfer-c).",
    )
    p.add_argument("--routine", required=True, choices=ROUTINES)
    p.add_argument("--backends", nargs="+", default=None, help="Backends to run, in order.")
    p.add_argument("--refcheck", action="store_true", help="Check outputs against torch.")
    p.add_argument("--allow_output_mismatch", action="store_true", help="Exit 0 on mismatch.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v, -vv: more output.")
    p.add_argument("--generate_repro_command", action="store_true")
    p.add_argument("--repro_command", default="", help=argparse.SUPPRESS)
    p.add_argument("--use_cupti", action="store_true", help="CUPTI timing (CUDA only).")
    p.add_argument("--no_cuda_graph", action="store_true", help="Do not use CUDA graphs.")
    p.add_argument("--num_iters", "-n", type=int, default=30, help="Timed calls per backend.")
    p.add_argument("--dry_run_iters", "-d", type=int, default=5, help="Warm-up calls.")
    p.add_argument("--random_seed", type=int, default=42)
    p.add_argument("--output_path", default=None, help="Append results to this CSV file.")
    p.add_argument("--case_tag", default=None, help="Tag written to the CSV row.")
    # GEMM
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--k", type=int, default=512)
    p.add_argument("--input_dtype", default="fp8_e4m3")
    p.add_argument("--mat2_dtype", default="fp8_e4m3")
    p.add_argument("--out_dtype", default="bfloat16")
    p.add_argument("--use_128x4_sf_layout", action="store_true")
    p.add_argument("--use_nvfp4", action="store_true")
    p.add_argument("--autotune", action="store_true", help="Run under flashinfer.autotune().")
    p.add_argument("--tile_size", type=int, default=128, help="Accepted (FlashInfer flag).")
    p.add_argument("--group_size", type=int, default=1, help="Accepted (FlashInfer flag).")
    p.add_argument("--scale_major_mode", default="MN", help="Accepted (FlashInfer flag).")
    p.add_argument("--mma_sm", type=int, default=1, help="Accepted (FlashInfer flag).")
    # attention
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--s_qo", type=int, default=64)
    p.add_argument("--s_kv", type=int, default=512)
    p.add_argument("--num_qo_heads", type=int, default=8)
    p.add_argument("--num_kv_heads", type=int, default=2)
    p.add_argument("--head_dim_qk", type=int, default=128)
    p.add_argument("--head_dim_vo", type=int, default=None)
    p.add_argument("--head_dim_ckv", type=int, default=None, help="Accepted (MLA flag).")
    p.add_argument("--head_dim_kpe", type=int, default=None, help="Accepted (MLA flag).")
    p.add_argument("--page_size", type=int, default=16)
    p.add_argument("--q_dtype", default="bfloat16")
    p.add_argument("--kv_dtype", default=None, help="Default: --q_dtype.")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--random_actual_seq_len", action="store_true")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = _given_flags(parser, args)
    if args.batch_size is None:
        args.batch_size = 1 if args.routine in GEMM_ROUTINES else 4
    if args.head_dim_vo is None:
        args.head_dim_vo = args.head_dim_qk
    if args.kv_dtype is None:
        args.kv_dtype = args.q_dtype
    if args.backends is None:
        args.backends = list(DEFAULT_BACKENDS.get(args.routine, ["fa2"]))
    accepted = BACKENDS.get(args.routine, ATTENTION_BACKENDS)
    for b in args.backends:
        if b not in accepted:
            parser.error(
                f"--backends: {b!r} is not a backend of {args.routine}; "
                f"expected one of {list(accepted)}"
            )
    for name in ("input_dtype", "mat2_dtype", "out_dtype", "q_dtype", "kv_dtype"):
        if getattr(args, name) not in DTYPES:
            parser.error(
                f"--{name}: {getattr(args, name)!r} is not a dtype; expected one of {list(DTYPES)}"
            )
    for name in (
        "m",
        "n",
        "k",
        "batch_size",
        "s_qo",
        "s_kv",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "page_size",
        "num_iters",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} must be at least 1")
    if args.dry_run_iters < 0:
        parser.error(f"--dry_run_iters: {args.dry_run_iters} must be at least 0")
    if args.routine in ATTENTION_ROUTINES:
        if args.head_dim_vo != args.head_dim_qk:
            parser.error(
                f"--head_dim_vo: {args.head_dim_vo} must equal --head_dim_qk "
                f"({args.head_dim_qk}) for {args.routine}"
            )
        if args.num_qo_heads % args.num_kv_heads:
            parser.error(
                f"--num_qo_heads: {args.num_qo_heads} must be a multiple of "
                f"--num_kv_heads ({args.num_kv_heads})"
            )
        if args.causal and args.s_qo > args.s_kv:
            parser.error(f"--s_qo: {args.s_qo} must not exceed --s_kv ({args.s_kv}) with --causal")
    return args


def _given_flags(parser, args):
    """Names of the flags whose values differ from the parser's defaults."""
    return {
        a.dest
        for a in parser._actions
        if a.dest not in ("help", "routine") and getattr(args, a.dest) != a.default
    }


def repro_command(args):
    """The command line reproducing this run, with every flag the routine uses."""
    parts = ["python3", "benchmarks/flashinfer_benchmark.py", "--routine", args.routine]
    for name in ROUTINE_FLAGS[args.routine] + COMMON_FLAGS:
        value = getattr(args, name)
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f"--{name}")
        elif isinstance(value, list):
            parts += [f"--{name}", *map(str, value)]
        else:
            parts += [f"--{name}", str(value)]
    if args.verbose:
        parts.append("-" + "v" * args.verbose)
    return shlex.join(parts)


def ignored_flags(args, device):
    """One description per flag that cannot apply here."""
    out = []
    cuda = device.type == "cuda"
    if args.use_cupti:
        out.append(
            "--use_cupti (" + ("timing uses CUDA events" if cuda else "no CUDA device") + ")"
        )
    if args.no_cuda_graph:
        out.append(
            "--no_cuda_graph ("
            + (
                "CUDA graphs are not used by this driver"
                if cuda
                else "CUDA graphs need a CUDA device"
            )
            + ")"
        )
    if not cuda:
        out.append(
            f"--backends {' '.join(args.backends)} (every backend runs the same CPU "
            "kernel; the name is passed to the API)"
        )
    used = set(ROUTINE_FLAGS[args.routine] + COMMON_FLAGS) | {
        "verbose",
        "generate_repro_command",
        "repro_command",
        "use_cupti",
        "no_cuda_graph",
    }
    for name in sorted(args.given - used):
        out.append(f"--{name} (not used by {args.routine})")
    return out


# --------------------------------------------------------------------------- FP4 helpers

E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def unpack_e2m1(x_q):
    """Packed FP4 ``[rows, k // 2]`` uint8 -> float32 ``[rows, k]`` (low nibble first)."""
    table = E2M1.to(x_q.device)
    low = table[(x_q & 0xF).long()]
    high = table[(x_q >> 4).long()]
    return torch.stack((low, high), dim=-1).reshape(x_q.shape[0], -1)


def scale_index(rows, blocks, layout):
    """Byte offsets of (row, block) scales in ``layout`` (docs/kernels.md#fp4-quantization)."""
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(blocks).unsqueeze(0)
    kp4 = (blocks + 3) // 4
    if layout == SfLayout.layout_128x4:
        return ((r // 128) * kp4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    if layout == SfLayout.layout_8x4:
        return ((r // 8) * kp4 + c // 4) * 32 + (r % 8) * 4 + c % 4
    return r * blocks + c


def dequantize_fp4(x_q, sf, block, layout, ue8m0):
    """Float32 values of an FP4 tensor ``[rows, k // 2]`` with its block scales."""
    values = unpack_e2m1(x_q)
    rows, k = values.shape
    codes = sf.contiguous().reshape(-1)[scale_index(rows, k // block, layout).to(sf.device)]
    if ue8m0:
        scales = torch.exp2(codes.float() - 127.0)
    else:
        scales = codes.view(torch.float8_e4m3fn).float()
    return values * scales.repeat_interleave(block, dim=1)


def to_float8(x, dtype):
    """Per-tensor scaled FP8 (the seed's helper): returns (x_fp8, inverse scale)."""
    finfo = torch.finfo(dtype)
    amax = x.abs().max().float().clamp(min=1e-12)
    scale = finfo.max / amax
    return (x.float() * scale).clamp(finfo.min, finfo.max).to(dtype), scale.reciprocal()


# --------------------------------------------------------------------------- routines


class Case:
    """One benchmark problem: ``call(backend)`` runs the API, ``reference()`` the check."""

    def __init__(self, call, reference, flops, nbytes, tensors, kind):
        self.call = call
        self.reference = reference
        self.flops = flops
        self.nbytes = nbytes
        self.tensors = tensors
        self.kind = kind


def setup_mm_fp4(args, device):
    m, n, k = args.m, args.n, args.k
    block = 16 if args.use_nvfp4 else 32
    if k % block:
        raise SystemExit(f"--k: {k} must be a multiple of {block} for mm_fp4")
    out_dtype = DTYPES[args.out_dtype]
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    a_layout = SfLayout.layout_128x4 if args.use_128x4_sf_layout else SfLayout.layout_8x4
    if args.use_nvfp4:
        gsf_a = (448 * 6) / a.float().abs().nan_to_num().max()
        gsf_w = (448 * 6) / w.float().abs().nan_to_num().max()
        a_q, a_sf = flashinfer.nvfp4_quantize(a, gsf_a, sfLayout=a_layout, do_shuffle=False)
        w_q, w_sf = flashinfer.nvfp4_quantize(
            w, gsf_w, sfLayout=SfLayout.layout_128x4, do_shuffle=False
        )
        alpha = 1.0 / (gsf_a * gsf_w)
    else:
        a_q, a_sf = flashinfer.fp4_quantize(
            a, None, 32, True, True, a_layout == SfLayout.layout_8x4
        )
        w_q, w_sf = flashinfer.fp4_quantize(w, None, 32, True, True, False)
        alpha = None

    def call(backend):
        return flashinfer.mm_fp4(
            a_q,
            w_q.T,
            a_sf,
            w_sf.T,
            alpha,
            out_dtype,
            block_size=block,
            use_8x4_sf_layout=not args.use_128x4_sf_layout,
            backend=backend,
            use_nvfp4=args.use_nvfp4,
        )

    def reference():
        ue8m0 = not args.use_nvfp4
        da = dequantize_fp4(a_q, a_sf, block, a_layout, ue8m0)
        dw = dequantize_fp4(w_q, w_sf, block, SfLayout.layout_128x4, ue8m0)
        ref = da @ dw.T
        return ref * alpha.float() if alpha is not None else ref

    nbytes = (m * k + n * k) // 2 + (m + n) * (k // block) + m * n * out_dtype.itemsize
    tensors = {"a": a_q, "a_descale": a_sf, "b": w_q.T, "b_descale": w_sf.T}
    return Case(call, reference, 2 * m * n * k, nbytes, tensors, "gemm")


def setup_bmm_fp8(args, device):
    b, m, n, k = args.batch_size, args.m, args.n, args.k
    out_dtype = DTYPES[args.out_dtype]
    a_dtype, b_dtype = DTYPES[args.input_dtype], DTYPES[args.mat2_dtype]
    a, a_inv = to_float8(torch.randn(b, m, k, device=device, dtype=torch.bfloat16), a_dtype)
    w = torch.randn(b, n, k, device=device, dtype=torch.bfloat16).transpose(-2, -1)
    w, w_inv = to_float8(w, b_dtype)

    def call(backend):
        return flashinfer.bmm_fp8(a, w, a_inv, w_inv, out_dtype, backend=backend)

    def reference():
        return torch.bmm(a.float() * a_inv, w.float() * w_inv)

    nbytes = b * (m * k * a.element_size() + k * n * w.element_size() + m * n * out_dtype.itemsize)
    tensors = {"A": a, "B": w, "A_scale": a_inv, "B_scale": w_inv}
    return Case(call, reference, 2 * b * m * n * k, nbytes, tensors, "gemm")


def setup_mm_fp8(args, device):
    m, n, k = args.m, args.n, args.k
    if k % 128:
        raise SystemExit(f"--k: {k} must be a multiple of 128 for mm_fp8")
    out_dtype = DTYPES[args.out_dtype]
    a, a_inv = to_float8(
        torch.randn(m, k, device=device, dtype=torch.bfloat16), torch.float8_e4m3fn
    )
    w, w_inv = to_float8(
        torch.randn(n, k, device=device, dtype=torch.bfloat16), torch.float8_e4m3fn
    )
    prepared = flashinfer.prepare_low_latency_gemm_weights(w)
    alpha = (a_inv * w_inv).float()

    def call(backend):
        return flashinfer.mm_fp8(a, prepared, alpha, out_dtype, backend="trtllm_low_latency")

    def reference():
        return (a.float() @ w.float().T) * alpha

    nbytes = m * k + n * k + m * n * out_dtype.itemsize
    tensors = {"a": a, "b": prepared, "alpha": alpha}
    return Case(call, reference, 2 * m * n * k, nbytes, tensors, "gemm")


def _qkv(args, device, q_rows, kv_rows):
    q_dtype, kv_dtype = DTYPES[args.q_dtype], DTYPES[args.kv_dtype]
    hq, hk, d = args.num_qo_heads, args.num_kv_heads, args.head_dim_qk
    q = torch.randn(*q_rows, hq, d, device=device).to(q_dtype)
    k = torch.randn(*kv_rows, hk, d, device=device).to(kv_dtype)
    v = torch.randn(*kv_rows, hk, d, device=device).to(kv_dtype)
    return q, k, v


def attention_reference(q, k, v, causal):
    """Float32 softmax attention of one request: q ``[L, Hq, D]``, k/v ``[S, Hk, D]``."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = qf @ kf.transpose(1, 2) / math.sqrt(q.shape[-1])
    if causal:
        qo_len, kv_len = q.shape[0], k.shape[0]
        i = torch.arange(qo_len, device=q.device).unsqueeze(1)
        j = torch.arange(kv_len, device=q.device).unsqueeze(0)
        scores = scores.masked_fill(j > i + kv_len - qo_len, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).transpose(0, 1)


def _visible_keys(qo_len, kv_len, causal):
    if not causal:
        return qo_len * kv_len
    return sum(min(kv_len, i + kv_len - qo_len + 1) for i in range(qo_len))


def _attention_cost(args, pairs, q, kv_elem):
    """FLOPs and bytes of attention over (qo_len, kv_len) pairs."""
    d = args.head_dim_qk + args.head_dim_vo
    visible = sum(_visible_keys(lq, lk, args.causal) for lq, lk in pairs)
    flops = 2 * args.num_qo_heads * d * visible
    kv_bytes = sum(lk for _, lk in pairs) * args.num_kv_heads * d * kv_elem
    return flops, 2 * q.numel() * q.element_size() + kv_bytes


def setup_single_decode(args, device):
    q, k, v = _qkv(args, device, (), (args.s_kv,))

    def call(backend):
        return flashinfer.single_decode_with_kv_cache(q, k, v, use_tensor_cores=backend == "fa2_tc")

    def reference():
        return attention_reference(q.unsqueeze(0), k, v, False)[0]

    flops, nbytes = _attention_cost(args, [(1, args.s_kv)], q, k.element_size())
    return Case(call, reference, flops, nbytes, {"q": q, "k": k, "v": v}, "attention")


def _api_backend(backend):
    return backend if backend in ("fa2", "fa3", "auto", "trtllm-gen", "cudnn") else "auto"


def setup_single_prefill(args, device):
    q, k, v = _qkv(args, device, (args.s_qo,), (args.s_kv,))

    def call(backend):
        return flashinfer.single_prefill_with_kv_cache(
            q, k, v, causal=args.causal, backend=_api_backend(backend)
        )

    def reference():
        return attention_reference(q, k, v, args.causal)

    flops, nbytes = _attention_cost(args, [(args.s_qo, args.s_kv)], q, k.element_size())
    return Case(call, reference, flops, nbytes, {"q": q, "k": k, "v": v}, "attention")


def _seq_lens(args, limit, low=1):
    if not args.random_actual_seq_len:
        return [limit] * args.batch_size
    return [int(x) for x in torch.randint(low, limit + 1, (args.batch_size,))]


def _paged_cache(args, device, kv_lens):
    """A shuffled page table and a ``[pages, 2, page_size, Hk, D]`` NHD cache."""
    ps = args.page_size
    pages = [(n + ps - 1) // ps for n in kv_lens]
    total = sum(pages)
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0).to(torch.int32)
    indices = torch.randperm(total).to(torch.int32)
    last = torch.tensor([(n - 1) % ps + 1 for n in kv_lens], dtype=torch.int32)
    shape = (total, 2, ps, args.num_kv_heads, args.head_dim_qk)
    cache = torch.randn(*shape, device=device).to(DTYPES[args.kv_dtype])
    return cache, indptr.to(device), indices.to(device), last.to(device)


def _request_kv(cache, indptr, indices, i, kv_len):
    pages = indices[indptr[i] : indptr[i + 1]].long()
    kv = cache[pages]  # [p, 2, page_size, Hk, D]
    k = kv[:, 0].reshape(-1, *kv.shape[-2:])[:kv_len]
    v = kv[:, 1].reshape(-1, *kv.shape[-2:])[:kv_len]
    return k, v


def _workspace(device):
    size = 128 * 1024 * 1024 if device.type == "cuda" else 1024 * 1024
    return torch.empty(size, dtype=torch.int8, device=device)


def setup_batch_decode(args, device):
    kv_lens = _seq_lens(args, args.s_kv)
    cache, indptr, indices, last = _paged_cache(args, device, kv_lens)
    q = torch.randn(args.batch_size, args.num_qo_heads, args.head_dim_qk, device=device)
    q = q.to(DTYPES[args.q_dtype])
    wrappers = {}

    def wrapper(backend):
        if backend not in wrappers:
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(device),
                "NHD",
                use_tensor_cores=backend == "fa2_tc",
                backend=_api_backend(backend),
            )
            w.plan(
                indptr,
                indices,
                last,
                args.num_qo_heads,
                args.num_kv_heads,
                args.head_dim_qk,
                args.page_size,
                q_data_type=q.dtype,
                kv_data_type=cache.dtype,
            )
            wrappers[backend] = w
        return wrappers[backend]

    def call(backend):
        return wrapper(backend).run(q, cache)

    def reference():
        outs = []
        for i, n in enumerate(kv_lens):
            k, v = _request_kv(cache, indptr, indices, i, n)
            outs.append(attention_reference(q[i : i + 1], k, v, False)[0])
        return torch.stack(outs)

    flops, nbytes = _attention_cost(args, [(1, n) for n in kv_lens], q, cache.element_size())
    tensors = {
        "q": q,
        "paged_kv_cache": cache,
        "kv_indptr": indptr,
        "kv_indices": indices,
        "kv_last_page_len": last,
    }
    return Case(call, reference, flops, nbytes, tensors, "attention")


def setup_batch_prefill(args, device):
    qo_lens = _seq_lens(args, args.s_qo)
    if args.random_actual_seq_len:
        kv_lens = [max(n, int(torch.randint(1, args.s_kv + 1, ()))) for n in qo_lens]
    else:
        kv_lens = [args.s_kv] * args.batch_size
    cache, indptr, indices, last = _paged_cache(args, device, kv_lens)
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).to(torch.int32).to(device)
    q = torch.randn(sum(qo_lens), args.num_qo_heads, args.head_dim_qk, device=device)
    q = q.to(DTYPES[args.q_dtype])
    wrappers = {}

    def wrapper(backend):
        if backend not in wrappers:
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                _workspace(device), "NHD", backend=_api_backend(backend)
            )
            w.plan(
                qo_indptr,
                indptr,
                indices,
                last,
                args.num_qo_heads,
                args.num_kv_heads,
                args.head_dim_qk,
                args.page_size,
                causal=args.causal,
                q_data_type=q.dtype,
                kv_data_type=cache.dtype,
            )
            wrappers[backend] = w
        return wrappers[backend]

    def call(backend):
        return wrapper(backend).run(q, cache)

    def reference():
        outs = []
        for i, n in enumerate(kv_lens):
            k, v = _request_kv(cache, indptr, indices, i, n)
            qi = q[qo_indptr[i] : qo_indptr[i + 1]]
            outs.append(attention_reference(qi, k, v, args.causal))
        return torch.cat(outs)

    flops, nbytes = _attention_cost(args, list(zip(qo_lens, kv_lens)), q, cache.element_size())
    tensors = {
        "q": q,
        "paged_kv_cache": cache,
        "qo_indptr": qo_indptr,
        "kv_indptr": indptr,
        "kv_indices": indices,
        "kv_last_page_len": last,
    }
    return Case(call, reference, flops, nbytes, tensors, "attention")


SETUP = {
    "mm_fp4": setup_mm_fp4,
    "bmm_fp8": setup_bmm_fp8,
    "mm_fp8": setup_mm_fp8,
    "single_decode_with_kv_cache": setup_single_decode,
    "single_prefill_with_kv_cache": setup_single_prefill,
    "BatchDecodeWithPagedKVCacheWrapper": setup_batch_decode,
    "BatchPrefillWithPagedKVCacheWrapper": setup_batch_prefill,
}


# --------------------------------------------------------------------------- timing, check


def time_calls(fn, iters, dry_run_iters, device):
    """Milliseconds of each of ``iters`` calls after ``dry_run_iters`` warm-up calls."""
    for _ in range(dry_run_iters):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return times
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def check(out, ref, kind):
    """(passed, max abs diff, cosine similarity) of ``out`` against the float32 reference.

    The reference is exact up to float32 summation order, so the output may differ from
    it by its own rounding: a few units in the last place of its dtype (relative to the
    reference's magnitude for GEMMs, whose values grow with k).
    """
    out_f = out.float()
    ref = ref.float().to(out_f.device)
    diff = (out_f - ref).abs().max().item() if out_f.numel() else 0.0
    cos = torch.nn.functional.cosine_similarity(out_f.reshape(-1), ref.reshape(-1), dim=0).item()
    eps = {torch.bfloat16: 2**-8, torch.float16: 2**-11}.get(out.dtype, 2**-20)
    rtol = 4 * eps
    atol = 4 * eps * (ref.abs().max().item() if kind == "gemm" else 1.0)
    ok = out_f.shape == ref.shape and torch.allclose(out_f, ref, rtol=rtol, atol=atol)
    return ok, diff, cos


def describe(name, t):
    if not isinstance(t, torch.Tensor):
        return f"[VVERBOSE] {name} = {t!r}"
    return (
        f"[VVERBOSE] {name}.shape = {list(t.shape)}, dtype = {t.dtype}, "
        f"stride = {list(t.stride())}, device = {t.device}"
    )


def write_csv(path, rows):
    fields = list(rows[0])
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(rows)


def run(args):
    """Run the benchmark; returns the process exit status."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.random_seed)
    if args.generate_repro_command:
        print(
            f"[INFO] To reproduce this test case, run the following command: {repro_command(args)}"
        )
    if args.verbose >= 1:
        threads = f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""
        print(
            f"[INFO] Running {args.routine} on {device}{threads}; "
            f"{args.num_iters} timed calls after {args.dry_run_iters} warm-up calls"
        )
    ignored = ignored_flags(args, device)
    if ignored:
        print(f"[INFO] Ignored on {device.type}: " + "; ".join(ignored))
    case = SETUP[args.routine](args, device)
    if args.verbose >= 2:
        for name, t in case.tensors.items():
            print(describe(name, t))
    status = 0
    rows = []
    reference = case.reference() if args.refcheck else None
    tune = flashinfer.autotune() if args.autotune else None
    width = max(len(b) for b in args.backends)
    for backend in args.backends:
        with tune if tune is not None else _nothing():
            out = case.call(backend)
            times = time_calls(
                lambda b=backend: case.call(b), args.num_iters, args.dry_run_iters, device
            )
        median = statistics.median(times)
        std = statistics.stdev(times) if len(times) > 1 else 0.0
        tflops = case.flops / (median * 1e-3) / 1e12
        tbps = case.nbytes / (median * 1e-3) / 1e12
        if args.verbose >= 2:
            print(describe(f"{backend} output", out))
        print(
            f"[PERF] {backend:<{width}} :: median time {median:.4f} ms; std {std:.4f} ms; "
            f"achieved tflops {tflops:.4g} TFLOPs/sec; achieved tb_per_sec {tbps:.4g} TB/sec"
        )
        ref_result = "skipped"
        if reference is not None:
            ok, diff, cos = check(out, reference, case.kind)
            ref_result = "passed" if ok else "failed"
            what = "dequantize-then-matmul" if case.kind == "gemm" else "float32 softmax attention"
            print(
                f"[REFCHECK] {backend}: {'PASSED' if ok else 'FAILED'} against {what} "
                f"(max abs diff {diff:.4g}, cosine similarity {cos:.6f})"
            )
            if not ok:
                print(f"[ERROR] Output tensor mismatch between backend {backend} and the reference")
                if not args.allow_output_mismatch:
                    status = 1
        rows.append(
            {
                "routine": args.routine,
                "backend": backend,
                "device": str(device),
                "median_time_ms": median,
                "std_time_ms": std,
                "tflops": tflops,
                "tb_per_sec": tbps,
                "refcheck": ref_result,
                "case_tag": args.case_tag or "",
                "repro_command": repro_command(args),
            }
        )
    if args.output_path:
        write_csv(args.output_path, rows)
    return status


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
