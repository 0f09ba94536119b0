"""The argument tables of flashinfer._kernels (csrc/ops/args.c): CPython's errors for a
missing, repeated, unknown or mistyped argument, and the attention rules exported from C."""

import subprocess
import sys

import pytest
import torch

from flashinfer import _kernels


def small_call():
    q = torch.randn(1, 2, 64)
    k = v = torch.randn(3, 2, 64)
    out = torch.empty(1, 2, 64)
    idx = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    return (q, k, v, out, None) + idx


def test_missing_required_argument():
    with pytest.raises(TypeError, match=r"attention\(\) missing required argument 'v' \(pos 3\)"):
        _kernels.attention(*small_call()[:2])


def test_unknown_keyword():
    with pytest.raises(
        TypeError, match=r"attention\(\) got an unexpected keyword argument 'caual'"
    ):
        _kernels.attention(*small_call(), caual=True)


def test_argument_given_twice():
    with pytest.raises(TypeError, match=r"got multiple values for argument 'q'"):
        _kernels.attention(*small_call(), q=small_call()[0])


def test_wrong_type_names_the_argument():
    with pytest.raises(TypeError, match=r"argument 'window_left' must be an int, not str"):
        _kernels.attention(*small_call(), window_left="3")
    with pytest.raises(TypeError, match=r"argument 'window_left' must be an int, not bool"):
        _kernels.attention(*small_call(), window_left=True)


def test_too_many_positional_arguments():
    with pytest.raises(TypeError, match=r"attention\(\) takes at most 32 arguments \(33 given\)"):
        _kernels.attention(*([None] * 33))


def test_keywords_and_positions_reach_the_same_call():
    args = small_call()
    a, b = torch.empty(1, 2, 64), torch.empty(1, 2, 64)
    _kernels.attention(*args[:3], a, None, args[5], args[6], causal=True)
    names = ("q", "k", "v", "out", "lse", "qo_indptr", "kv_indptr")
    _kernels.attention(**dict(zip(names, args[:3] + (b, None) + args[5:])), causal=True)
    assert torch.equal(a, b)


def test_rules_come_from_c():
    assert _kernels.KV_LAYOUTS == ("NHD", "HND")
    assert _kernels.POS_ENCODING_MODES == ("NONE", "ROPE_LLAMA", "ALIBI")
    assert (192, 128) in _kernels.HEAD_DIMS and (512, 512) in _kernels.HEAD_DIMS
    assert _kernels.check_attention_plan(8, 2, 192, 128, "HND", "ALIBI") is None
    with pytest.raises(ValueError, match="num_kv_heads: 3 does not divide num_qo_heads 8"):
        _kernels.check_attention_plan(8, 3, 128, 128, "NHD", "NONE")
    with pytest.raises(
        ValueError, match="kv_layout: 'NDH' is not supported; accepted: 'NHD', 'HND'"
    ):
        _kernels.check_attention_plan(8, 2, 128, 128, "NDH", "NONE")


def gemm_fp8_operands():
    A = torch.randn(1, 4, 32).to(torch.float8_e4m3fn)
    B = torch.randn(1, 32, 8).to(torch.float8_e4m3fn)
    one = torch.ones(1)
    return A, B, one, one.clone(), torch.empty(1, 4, 8, dtype=torch.bfloat16)


def test_gemm_entry_points_take_keywords_from_their_tables():
    A, B, sa, sb, out = gemm_fp8_operands()
    _kernels.bmm_fp8(A, B, sa, sb, out, 1)
    by_name = torch.empty_like(out)
    _kernels.bmm_fp8(
        B=B, A=A, A_scale=sa, B_scale=sb, out=by_name, num_threads=1, workspace=None, lib_dir=None
    )
    assert torch.equal(out, by_name)
    w = torch.randn(1, 8, 128).to(torch.float8_e4m3fn)
    a = torch.randn(4, 128).to(torch.float8_e4m3fn)
    o1, o2 = torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(4, 8, dtype=torch.bfloat16)
    _kernels.mm_fp8(a, w, None, o1, 1)
    _kernels.mm_fp8(a=a, b=w, alpha=None, out=o2, num_threads=1, stream=0)
    assert torch.equal(o1, o2)
    assert _kernels.cublaslt_library(lib_dir=None) is _kernels.cublaslt_library()


def test_gemm_entry_points_name_what_is_wrong():
    A, B, sa, sb, out = gemm_fp8_operands()
    with pytest.raises(TypeError, match=r"mm_fp8\(\) missing required argument 'out' \(pos 4\)"):
        _kernels.mm_fp8(A[0], B, None)
    with pytest.raises(
        TypeError, match=r"mm_fp4\(\): argument 'block_size' must be an int, not str"
    ):
        _kernels.mm_fp4(A, B, sa, sb, None, out, "16", 0, False, 1)
    with pytest.raises(TypeError, match=r"bmm_fp8\(\) got an unexpected keyword argument 'strem'"):
        _kernels.bmm_fp8(A, B, sa, sb, out, 1, strem=0)
    with pytest.raises(TypeError, match=r"argument 'lib_dir' must be a str or None, not int"):
        _kernels.cublaslt_library(3)
    with pytest.raises(
        TypeError, match=r"cublaslt_library\(\) takes at most 1 arguments \(2 given"
    ):
        _kernels.cublaslt_library(None, None)


def test_a_tensor_given_as_none_is_a_type_error():
    """A None where a tensor is required is named, not read: it crashed fp4_quantize, so
    the calls run in a child process."""
    script = """if True:
        from flashinfer import _kernels
        calls = [
            lambda: _kernels.bmm_fp8(None, None, None, None, None, 1),
            lambda: _kernels.mm_fp8(None, None, None, None, 1),
            lambda: _kernels.mm_fp4(None, None, None, None, None, None, 16, 0, False, 1),
            lambda: _kernels.fp4_quantize(None, None, None, None, 16, False, 0, False, 1),
        ]
        for call in calls:
            try:
                call()
            except TypeError as e:
                print(e)
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "A: expected a torch.Tensor, got NoneType",
        "a: expected a torch.Tensor, got NoneType",
        "a: expected a torch.Tensor, got NoneType",
        "input: expected a torch.Tensor, got NoneType",
    ]
