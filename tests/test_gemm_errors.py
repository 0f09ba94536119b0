"""Bad arguments to the GEMM and fp4 APIs raise errors naming the argument, the value
seen and what is accepted, before any kernel runs."""

import pytest
import torch

from flashinfer.fp4_quantization import fp4_quantize, nvfp4_quantize
from flashinfer.gemm import bmm_fp8, mm_fp4, mm_fp8, prepare_low_latency_gemm_weights
from flashinfer.utils import BackendSupportedError

E4M3 = torch.float8_e4m3fn
ONE = torch.tensor(1.0)


def _ab(b=2, m=4, k=32, n=8):
    return torch.zeros(b, m, k, dtype=E4M3), torch.zeros(b, n, k, dtype=E4M3).transpose(1, 2)


def test_bmm_fp8_unknown_backend_lists_accepted():
    A, B = _ab()
    with pytest.raises(
        BackendSupportedError, match=r"support backend 'cuBLAS'; accepted: cudnn, cublas, cutlass"
    ):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="cuBLAS")


def test_bmm_fp8_unknown_backend_with_skip_check_still_refused():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"backend: 'cuBLAS' .*'cublas'.*'cutlass'"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="cuBLAS", skip_check=True)


def test_bmm_fp8_bad_input_dtype_names_argument():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"A: dtype float16 .*float8_e4m3fn, float8_e5m2"):
        bmm_fp8(A.half(), B, ONE, ONE, torch.bfloat16)


def test_bmm_fp8_k_mismatch():
    A, _ = _ab(k=32)
    _, B = _ab(k=48)
    with pytest.raises(ValueError, match=r"B: k = 48 .*A's k = 32"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16)


def test_bmm_fp8_batch_mismatch():
    A, _ = _ab(b=2)
    _, B = _ab(b=3)
    with pytest.raises(ValueError, match=r"B: batch size 3 .*A's batch size 2"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16)


def test_bmm_fp8_scale_must_be_one_float32():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"B_scale: expected one float32 value, got 2"):
        bmm_fp8(A, B, ONE, torch.ones(2), torch.bfloat16)
    with pytest.raises(ValueError, match=r"A_scale: dtype float64"):
        bmm_fp8(A, B, ONE.double(), ONE, torch.bfloat16)


def test_bmm_fp8_bad_out_dtype_argument():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"dtype: torch.float32 is not accepted"):
        bmm_fp8(A, B, ONE, ONE, torch.float32)


def test_bmm_fp8_out_shape_checked():
    A, B = _ab()
    out = torch.empty(2, 4, 9, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"out: shape \[2, 4, 9\] .*\[2, 4, 8\]"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, out=out)


def test_bmm_fp8_non_contiguous_out_shows_its_strides():
    A, B = _ab()
    out = torch.empty(2, 8, 4, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(
        ValueError, match=r"out: shape \[2, 4, 8\] with strides \[32, 1, 4\] is not contiguous"
    ):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, out=out)


def test_bmm_fp8_wrong_ndim():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"A: expected a 3-D tensor"):
        bmm_fp8(A[0], B, ONE, ONE, torch.bfloat16)


def test_bmm_fp8_non_tensor_names_argument():
    _, B = _ab()
    with pytest.raises(TypeError, match=r"A: expected a torch.Tensor, got list"):
        bmm_fp8([1], B, ONE, ONE, torch.bfloat16)


def test_bmm_fp8_meta_device_rejected():
    A, B = _ab()
    with pytest.raises(ValueError, match=r"A_scale is on meta; this build runs bmm_fp8 on cpu"):
        bmm_fp8(A, B, torch.empty((), device="meta"), ONE, torch.bfloat16)


def test_mm_fp8_backend_and_shape_errors():
    a = torch.zeros(4, 256, dtype=E4M3)
    w = prepare_low_latency_gemm_weights(torch.zeros(8, 128, dtype=E4M3))
    with pytest.raises(ValueError, match=r"b: backend 'cutlass' takes the unprocessed weight"):
        mm_fp8(a, w, backend="cutlass")
    with pytest.raises(ValueError, match=r"b: shape \[1, 8, 128\] does not fit a's k = 256"):
        mm_fp8(a, w)


def test_mm_fp8_prepared_backend_refuses_the_unprocessed_weight():
    a = torch.zeros(4, 128, dtype=E4M3)
    with pytest.raises(ValueError, match=r"b: backend 'trtllm_low_latency' takes prepare_low"):
        mm_fp8(a, torch.zeros(8, 128, dtype=E4M3))


def test_mm_fp8_unprocessed_weight_k_mismatch_names_b():
    a = torch.zeros(4, 128, dtype=E4M3)
    with pytest.raises(ValueError, match=r"b: k = 64 \(b.shape\[1\]\) does not match a's k = 128"):
        mm_fp8(a, torch.zeros(8, 64, dtype=E4M3), backend="cublas")


def test_prepare_weights_k_multiple_of_128():
    with pytest.raises(ValueError, match=r"w: k = 100"):
        prepare_low_latency_gemm_weights(torch.zeros(4, 100, dtype=E4M3))


def test_fp4_quantize_k_multiple_of_16():
    with pytest.raises(ValueError, match=r"input: k = 40 .*multiple of sf_vec_size = 16"):
        nvfp4_quantize(torch.zeros(4, 40), ONE)


def test_fp4_quantize_input_dtype():
    with pytest.raises(ValueError, match=r"input: dtype int32 .*float16, bfloat16, float32"):
        fp4_quantize(torch.zeros(4, 32, dtype=torch.int32), ONE)


def test_fp4_quantize_unsupported_options():
    with pytest.raises(ValueError, match=r"input: 4 rows; accepted: a multiple of 32"):
        nvfp4_quantize(torch.zeros(4, 32), ONE, do_shuffle=True)
    with pytest.raises(NotImplementedError, match=r"sf_vec_size: 64"):
        fp4_quantize(torch.zeros(4, 64), ONE, sf_vec_size=64)


def test_mm_fp4_k_mismatch_and_block_size():
    a, a_sf = nvfp4_quantize(torch.ones(4, 64), ONE)
    w, w_sf = nvfp4_quantize(torch.ones(8, 32), ONE)
    with pytest.raises(ValueError, match=r"b: k/2 = 16 .*a's k/2 = 32"):
        mm_fp4(a, w.T, a_sf, w_sf.T)
    with pytest.raises(ValueError, match=r"block_size: 32 does not fit use_nvfp4=True"):
        mm_fp4(a, w.T, a_sf, w_sf.T, block_size=32)


def test_mm_fp4_scale_size_checked():
    a, a_sf = nvfp4_quantize(torch.ones(4, 64), ONE)
    w, w_sf = nvfp4_quantize(torch.ones(8, 64), ONE)
    with pytest.raises(ValueError, match=r"a_descale: holds 3 scale bytes but the layout needs"):
        mm_fp4(a, w.T, a_sf.reshape(-1)[:3], w_sf.T)


def test_mm_fp4_unknown_backend():
    a, a_sf = nvfp4_quantize(torch.ones(4, 64), ONE)
    with pytest.raises(BackendSupportedError, match=r"'cublas'; accepted: cudnn, trtllm"):
        mm_fp4(a, a.T, a_sf, a_sf.T, backend="cublas")
