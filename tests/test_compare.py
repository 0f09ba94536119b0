"""One comparison rule for replay, diff and the reproducer (docs/replay.md#the-comparison-rule).

The pairs near the tolerance are the ones where the three used to disagree: replay took
``torch.allclose`` in float32, diff the C rule in double, the reproducer its own
``torch.isclose`` in float64.
"""

import itertools
import os
import shutil
import subprocess
import sys

import pytest
import replay_helpers as h
import torch
import triage_helpers as t
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native import _C, repro_runtime
from flashinfer_native.compare import tensor_difference
from flashinfer_native.diff import diff_sessions
from flashinfer_native.replay import compare_values
from flashinfer_native.repro import export_repro

RTOL = ATOL = 1e-3

# float32 values: |a - b| is above atol + rtol * |b| in exact arithmetic, but float32
# arithmetic rounds the difference down to the allowed error.
NEAR_A, NEAR_B = 0.027164699509739876, 0.026138560846447945


def near_pair():
    a = torch.tensor([1.0, NEAR_A, -2.0], dtype=torch.float32)
    b = torch.tensor([1.0, NEAR_B, -2.0], dtype=torch.float32)
    return a, b


def verdicts(a, b):
    """Each consumer's verdict, True for 'matches'."""
    return {
        "replay": compare_values(a, b, RTOL, ATOL) == [],
        "diff": not tensor_difference(a, b, RTOL, ATOL)["diverged"],
        "repro (core)": repro_runtime.difference(a, b, RTOL, ATOL)[2] == 0,
        "repro (torch only)": repro_runtime.torch_difference(a, b, RTOL, ATOL)[2] == 0,
    }


def test_the_near_pair_is_where_float32_arithmetic_disagreed():
    a, b = near_pair()
    assert torch.allclose(a, b, rtol=RTOL, atol=ATOL)  # replay's rule before
    assert not torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL)


def test_replay_diff_and_repro_give_one_verdict_near_the_tolerance():
    a, b = near_pair()
    assert verdicts(a, b) == dict.fromkeys(verdicts(a, b), False)
    inside = b.clone()
    inside[1] = torch.nextafter(torch.tensor(NEAR_A), torch.tensor(0.0)) - 1e-6
    assert verdicts(inside, b) == dict.fromkeys(verdicts(a, b), True)
    assert tensor_difference(a, b, RTOL, ATOL)["mismatched"] == 1


def test_a_finite_value_never_matches_an_infinite_reference():
    # diff's C rule matched them before (Inf <= atol + rtol * Inf); replay did not
    a = torch.tensor([5.0, float("inf"), float("-inf")])
    b = torch.tensor([float("inf"), float("inf"), float("inf")])
    assert _C.tensor_difference(a, b) == (float("inf"), 0.0, 2)
    assert set(verdicts(a, b).values()) == {False}
    assert set(verdicts(b, b).values()) == {True}


def test_tolerances_must_be_finite_and_non_negative():
    a = torch.zeros(2)
    for rtol, atol in ((-1e-3, 1e-3), (1e-3, float("nan")), (float("inf"), 0.0)):
        with pytest.raises(ValueError, match="rtol and atol must be finite and non-negative"):
            _C.tensor_difference(a, a, rtol, atol)
        with pytest.raises(ValueError, match="rtol and atol must be finite and non-negative"):
            repro_runtime.torch_difference(a, a, rtol, atol)


SPECIAL = [
    float("nan"),
    float("inf"),
    float("-inf"),
    0.0,
    -0.0,
    1.0,
    -1.0,
    1e-3,
    2e-3,
    1.001,
    1.002,
    65504.0,
    3e38,
    1e-40,
]


def special_pairs(dtype):
    pairs = list(itertools.product(SPECIAL, repeat=2))
    a = torch.tensor([p[0] for p in pairs], dtype=torch.float64).to(dtype)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.float64).to(dtype)
    return a, b


def near_tolerance(dtype, n=20000, seed=0):
    """References b and values a placed within a few ulps of b +- (atol + rtol * |b|)."""
    gen = torch.Generator().manual_seed(seed)
    b = ((torch.rand(n, generator=gen, dtype=torch.float64) * 8 - 4) ** 3).to(dtype)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    edge = b.double() + sign * (ATOL + RTOL * b.double().abs())
    jitter = torch.randint(-3, 4, (n,), generator=gen).double()
    a = (edge * (1 + jitter * torch.finfo(dtype).eps / 2)).to(dtype)
    return a, b


FLOATS = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_torch_only_rule_of_the_reproducer_gives_the_core_s_counts(dtype):
    for a, b in (near_tolerance(dtype), special_pairs(dtype)):
        core = _C.tensor_difference(a, b, RTOL, ATOL)
        assert repro_runtime.torch_difference(a, b, RTOL, ATOL) == core
        assert 0 < core[2] < a.numel()


@pytest.mark.parametrize(
    "a, b",
    [
        (torch.tensor([1, 5, -7], dtype=torch.int64), torch.tensor([1, 6, -7], dtype=torch.int64)),
        (torch.tensor([0, 255], dtype=torch.uint8), torch.tensor([1, 255], dtype=torch.uint8)),
        (torch.tensor([True, False]), torch.tensor([True, True])),
        (
            torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64),
            torch.tensor([1 + 1j, 2 - 1.01j], dtype=torch.complex64),
        ),
        (
            torch.tensor([[0x12, 0x34]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
            torch.tensor([[0x12, 0x35]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        ),
    ],
    ids=["int64", "uint8", "bool", "complex64", "fp4x2"],
)
def test_exact_and_complex_dtypes_have_one_rule_too(a, b):
    core = tensor_difference(a, b, RTOL, ATOL)
    counts = (core["max_abs"], core["max_rel"], core["mismatched"])
    assert repro_runtime.torch_difference(a, b, RTOL, ATOL) == counts
    assert core["mismatched"] == 1
    assert set(verdicts(a, b).values()) == {False}
    assert set(verdicts(b, b).values()) == {True}


def test_integer_tensors_match_bit_for_bit_whatever_the_tolerance():
    a, b = torch.tensor([100], dtype=torch.int32), torch.tensor([101], dtype=torch.int32)
    assert compare_values(a, b, rtol=1.0, atol=10.0) == ["result: values differ (exact comparison)"]
    assert tensor_difference(a, b, 1.0, 10.0)["diverged"]


# ----------------------------------------------- the three commands on one recording


def record(root, x):
    writer = h.DumpWriter(root)
    writer.call(h.scale_add, x, torch.zeros_like(x), alpha=1.0)
    return writer.dirs[-1]


@pytest.fixture
def near_sessions(tmp_path):
    """Session A returns a, session B returns b; A's recorded outputs replaced by B's,
    so that replaying A compares a (computed again) with b (recorded)."""
    a, b = near_pair()
    call_a, call_b = record(tmp_path / "a", a), record(tmp_path / "b", b)
    shutil.copyfile(os.path.join(call_b, "outputs.pt"), os.path.join(call_a, "outputs.pt"))
    return tmp_path, call_a, call_b


def test_replay_diff_and_the_exported_script_fail_the_same_near_pair(near_sessions):
    tmp_path, call_a, call_b = near_sessions
    runner = CliRunner()
    replayed = runner.invoke(
        cli, ["replay", "--dir", call_a, "--device", "cpu", "--allow-module", "replay_helpers"]
    )
    assert replayed.exit_code == 1, replayed.output
    assert "result: values differ beyond rtol=0.001, atol=0.001" in replayed.output
    _, entries = diff_sessions(call_a, call_b)  # the pair is A's and B's input x
    (entry,) = entries
    assert entry["status"] == "diverged"
    assert [(i["key"], i["mismatched"]) for i in entry["inputs"]] == [("arg_0", 1), ("arg_1", 0)]
    out = tmp_path / "repro"
    export_repro(call_a, out, allow_modules=["replay_helpers"])
    proc = subprocess.run(
        [sys.executable, str(out / "repro.py")],
        cwd=tmp_path,
        env=t.clean_env(PYTHONPATH=t.TESTS),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 of 3 elements outside rtol=0.001, atol=0.001" in proc.stdout
    assert "FAIL: the result differs from the recording" in proc.stdout
