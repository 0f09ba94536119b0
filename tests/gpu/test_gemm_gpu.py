"""bmm_fp8 and mm_fp8 on CUDA against the CPU kernel and dequantize-then-matmul.

Tolerance: every kernel sums exact fp8 products in float32 (in different orders) and
rounds once to bf16/fp16, so results agree with the float32 reference, and with each
other, within 1e-2 relative to the reference's max.
"""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from flashinfer import _kernels  # noqa: E402
from flashinfer.gemm import (  # noqa: E402
    _cublas_lib_dir,
    bmm_fp8,
    mm_fp8,
    prepare_low_latency_gemm_weights,
)

FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e5m2]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE, CUBLASLT_ONLY = 0, 2


def _fp8(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _close(out, ref):
    ref = ref.float().cpu()
    err = (out.float().cpu() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item(), err


def _scales(a, b):
    return torch.tensor(a), torch.tensor(b)


def _raw_bmm(A, B, a_scale, b_scale, dtype, backend):
    """_kernels.bmm_fp8 on CUDA tensors with an explicit backend (0 native, 2 cuBLASLt only)."""
    out = torch.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=dtype, device=A.device)
    ws = torch.empty(32 << 20, dtype=torch.uint8, device=A.device)
    stream = torch.cuda.current_stream(A.device).cuda_stream
    _kernels.bmm_fp8(A, B, a_scale, b_scale, out, 1, stream, backend, ws, _cublas_lib_dir())
    return out


@pytest.mark.parametrize("a_dtype", FP8_KINDS)
@pytest.mark.parametrize("b_dtype", FP8_KINDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_native_bmm_fp8_matches_cpu_kernel_and_reference(a_dtype, b_dtype, out_dtype):
    A = _fp8((3, 37, 200), a_dtype, 1)
    B = _fp8((3, 45, 200), b_dtype, 2).transpose(1, 2)
    sa, sb = _scales(0.5, 3.0)
    cpu = bmm_fp8(A, B, sa, sb, out_dtype)
    gpu = bmm_fp8(A.cuda(), B.cuda(), sa.cuda(), sb.cuda(), out_dtype, backend="cutlass")
    assert gpu.is_cuda and gpu.dtype == out_dtype and gpu.shape == (3, 37, 45)
    _close(gpu, cpu.float())
    _close(gpu, (A.float() @ B.float()) * 1.5)


@pytest.mark.parametrize(
    "a_dtype,b_dtype",
    [
        (torch.float8_e4m3fn, torch.float8_e4m3fn),
        (torch.float8_e4m3fn, torch.float8_e5m2),
        (torch.float8_e5m2, torch.float8_e4m3fn),
    ],
)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_cublaslt_bmm_fp8_runs_and_matches_reference(a_dtype, b_dtype, out_dtype):
    A = _fp8((2, 64, 256), a_dtype, 3).cuda()
    B = _fp8((2, 128, 256), b_dtype, 4).transpose(1, 2).cuda()
    sa, sb = _scales(0.25, 2.0)
    out = _raw_bmm(A, B, sa.cuda(), sb.cuda(), out_dtype, CUBLASLT_ONLY)
    _close(out, (A.float() @ B.float()) * 0.5)


def test_cublaslt_library_is_found():
    assert _kernels.cublaslt_library(_cublas_lib_dir()) is not None


def test_cublaslt_and_native_agree():
    A = _fp8((4, 100, 512), torch.float8_e4m3fn, 5).cuda()
    B = _fp8((4, 136, 512), torch.float8_e4m3fn, 6).transpose(1, 2).cuda()
    one = torch.ones((), device="cuda")
    lt = _raw_bmm(A, B, one, one, torch.bfloat16, CUBLASLT_ONLY)
    native = _raw_bmm(A, B, one, one, torch.bfloat16, NATIVE)
    _close(lt, native.float())


def test_cublaslt_only_refuses_row_major_b_by_name():
    A = _fp8((1, 16, 64), torch.float8_e4m3fn, 7).cuda()
    B = _fp8((1, 64, 32), torch.float8_e4m3fn, 8).cuda()
    one = torch.ones((), device="cuda")
    with pytest.raises(RuntimeError, match="cuBLASLt did not run: A must be row-major"):
        _raw_bmm(A, B, one, one, torch.bfloat16, CUBLASLT_ONLY)


@pytest.mark.parametrize("backend", ["cublas", "cublaslt", "auto"])
def test_cublas_backends_fall_back_to_native_for_row_major_b(backend):
    A = _fp8((2, 20, 64), torch.float8_e4m3fn, 9)
    B = _fp8((2, 64, 300), torch.float8_e4m3fn, 10)
    one = torch.ones(())
    out = bmm_fp8(A.cuda(), B.cuda(), one.cuda(), one.cuda(), torch.float16, backend=backend)
    _close(out, A.float() @ B.float())


def test_native_bmm_fp8_strided_a_and_unaligned_k():
    # a k-stride of 2 and k = 200 take the byte-by-byte loads instead of 16-byte ones
    A = _fp8((2, 70, 400), torch.float8_e4m3fn, 11).cuda()[:, :, ::2]
    B = _fp8((2, 130, 200), torch.float8_e5m2, 12).transpose(1, 2).cuda()
    one = torch.ones((), device="cuda")
    out = bmm_fp8(A, B, one, one, torch.bfloat16, backend="cudnn")
    _close(out, A.float() @ B.float())


def test_native_bmm_fp8_tiles_past_128_and_batch_of_five():
    A = _fp8((5, 300, 512), torch.float8_e4m3fn, 13)
    B = _fp8((5, 260, 512), torch.float8_e4m3fn, 14).transpose(1, 2)
    sa, sb = _scales(0.125, 4.0)
    out = bmm_fp8(A.cuda(), B.cuda(), sa.cuda(), sb.cuda(), torch.bfloat16, backend="cutlass")
    _close(out, (A.float() @ B.float()) * 0.5)


@pytest.mark.parametrize("backend", ["cublas", "cutlass"])
def test_bmm_fp8_writes_into_out_and_returns_it(backend):
    A = _fp8((1, 130, 256), torch.float8_e4m3fn, 15).cuda()
    B = _fp8((1, 272, 256), torch.float8_e4m3fn, 16).transpose(1, 2).cuda()
    out = torch.full((1, 130, 272), 7.0, dtype=torch.bfloat16, device="cuda")
    sa, sb = _scales(2.0, 0.25)
    got = bmm_fp8(A, B, sa.cuda(), sb.cuda(), torch.bfloat16, out=out, backend=backend)
    assert got is out
    _close(out, (A.float() @ B.float()) * 0.5)


def test_bmm_fp8_k_zero_gives_zeros():
    A = torch.empty((1, 3, 0), dtype=torch.float8_e4m3fn, device="cuda")
    B = torch.empty((1, 0, 5), dtype=torch.float8_e4m3fn, device="cuda")
    one = torch.ones((), device="cuda")
    out = bmm_fp8(A, B, one, one, torch.bfloat16)
    assert torch.equal(out.cpu(), torch.zeros((1, 3, 5), dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", ["cublas", "cutlass"])
def test_bmm_fp8_runs_on_the_current_stream(backend):
    A = _fp8((2, 64, 256), torch.float8_e4m3fn, 17)
    B = _fp8((2, 128, 256), torch.float8_e4m3fn, 18).transpose(1, 2)
    one = torch.ones(())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # inputs made on the side stream: correct only if the GEMM is ordered after them
        Ad, Bd, od = A.cuda(), B.cuda(), one.cuda()
        out = bmm_fp8(Ad, Bd, od, od, torch.bfloat16, backend=backend)
    side.synchronize()
    _close(out, A.float() @ B.float())


def test_bmm_fp8_mixed_devices_name_the_argument():
    A = _fp8((1, 8, 32), torch.float8_e4m3fn, 19).cuda()
    B = _fp8((1, 16, 32), torch.float8_e4m3fn, 20).transpose(1, 2)
    one = torch.ones((), device="cuda")
    with pytest.raises(ValueError, match=r"B is on cpu:0 but A is on cuda:0"):
        bmm_fp8(A, B, one, one, torch.bfloat16)


def test_bmm_fp8_scale_on_cpu_is_rejected():
    A = _fp8((1, 8, 32), torch.float8_e4m3fn, 21).cuda()
    B = _fp8((1, 16, 32), torch.float8_e4m3fn, 22).transpose(1, 2).cuda()
    with pytest.raises(ValueError, match=r"A_scale is on cpu:0 but A is on cuda:0"):
        bmm_fp8(A, B, torch.ones(()), torch.ones((), device="cuda"), torch.bfloat16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("backend", ["cublas", "cutlass"])
def test_bmm_fp8_on_second_device_leaves_current_device(backend):
    A = _fp8((1, 64, 128), torch.float8_e4m3fn, 23)
    B = _fp8((1, 64, 128), torch.float8_e4m3fn, 24).transpose(1, 2)
    one = torch.ones((), device="cuda:1")
    before = torch.cuda.current_device()
    out = bmm_fp8(A.to("cuda:1"), B.to("cuda:1"), one, one, torch.bfloat16, backend=backend)
    assert out.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == before
    _close(out, A.float() @ B.float())


@pytest.mark.parametrize("with_alpha", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_mm_fp8_matches_cpu_kernel_and_reference(with_alpha, out_dtype):
    a = _fp8((37, 384), torch.float8_e4m3fn, 25)
    w = _fp8((200, 384), torch.float8_e4m3fn, 26)
    alpha = torch.tensor(0.75) if with_alpha else None
    cpu = mm_fp8(a, prepare_low_latency_gemm_weights(w), alpha, out_dtype)
    wp = prepare_low_latency_gemm_weights(w.cuda())
    gpu = mm_fp8(a.cuda(), wp, alpha.cuda() if with_alpha else None, out_dtype)
    assert gpu.is_cuda and gpu.shape == (37, 200) and gpu.dtype == out_dtype
    ref = (a.float() @ w.float().T) * (0.75 if with_alpha else 1.0)
    _close(gpu, cpu.float())
    _close(gpu, ref)


PRODUCER = """
import torch
from flashinfer import bmm_fp8

def to_float8(x, dtype=torch.float8_e4m3fn):
    finfo = torch.finfo(dtype)
    min_val, max_val = x.aminmax()
    amax = torch.maximum(min_val.abs(), max_val.abs()).clamp(min=1e-12)
    scale = finfo.max / amax
    x_scl_sat = (x * scale).clamp(min=finfo.min, max=finfo.max)
    return x_scl_sat.to(dtype), scale.float().reciprocal()

torch.manual_seed(0)
b, m, n, k = 4, 64, 128, 256
input_bf16 = torch.randn([b, m, k], device="cuda", dtype=torch.bfloat16)
input_fp8, input_inv_s = to_float8(input_bf16)
mat2_bf16 = torch.randn([b, n, k], device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
mat2_fp8, mat2_inv_s = to_float8(mat2_bf16)
res = torch.empty([b, m, n], device="cuda", dtype=torch.bfloat16)
bmm_fp8(input_fp8, mat2_fp8, input_inv_s, mat2_inv_s, torch.bfloat16, res, backend="cublas")
torch.cuda.synchronize()
"""


def test_seed_bmm_fp8_producer_dumps_and_replays_on_cuda(tmp_path):
    from flashinfer.api_logging import replay_from_dump

    env = dict(os.environ, FLASHINFER_LOGLEVEL="10", FLASHINFER_DUMP_DIR=str(tmp_path / "d"))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", PRODUCER], cwd=ROOT, env=env, check=True, timeout=300)
    dumps = sorted(d for d in (tmp_path / "d").iterdir() if d.is_dir() and "bmm_fp8" in d.name)
    assert len(dumps) == 1
    result = replay_from_dump(str(dumps[0]), compare_outputs=True, device="cuda")
    args, kwargs = result["args"], result["kwargs"]
    assert args[0].is_cuda and args[0].dtype == torch.float8_e4m3fn
    res = bmm_fp8(*args, **kwargs)
    _close(res, result["expected_tensors"]["result"].float())
    ref = (args[0].float() @ args[1].float()) * args[2] * args[3]
    _close(res, ref)
