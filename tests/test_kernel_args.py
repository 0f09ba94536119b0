"""The argument tables of flashinfer._kernels (csrc/ops/args.c): CPython's errors for a
missing, repeated, unknown or mistyped argument, and the attention rules exported from C."""

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
