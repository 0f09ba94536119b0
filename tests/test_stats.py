"""Level-5 tensor statistics (docs/logging.md#what-the-text-log-looks-like): flashinfer_native._C.tensor_stats and format_tensor_stats
checked against torch computed in float64."""

import math

import pytest
import torch

import flashinfer  # noqa: F401  (loads torch before the extension)
from flashinfer_native import _C

FLOAT8_DTYPES = [
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]
FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16] + FLOAT8_DTYPES
INT_DTYPES = [
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
]


def float_reference(t):
    x = t.double().flatten()
    nan = x.isnan()
    valid = x[~nan]
    if valid.numel() == 0:
        lo = hi = mean = math.nan
    else:
        lo, hi = valid.min().item(), valid.max().item()
        mean = valid.sum().item() / valid.numel()
    return {
        "min": lo,
        "max": hi,
        "mean": mean,
        "nan_count": int(nan.sum()),
        "inf_count": int(x.isinf().sum()),
    }


def int_reference(t):
    values = [int(v) for v in t.flatten().tolist()]
    return {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}


def same_float(a, b, scale=1.0):
    if math.isnan(b):
        return math.isnan(a)
    if math.isinf(b):
        return a == b
    return a == pytest.approx(b, rel=1e-9, abs=1e-12 * scale)


def assert_float_stats(t):
    got = _C.tensor_stats(t)
    want = float_reference(t)
    assert set(got) == set(want)
    assert got["nan_count"] == want["nan_count"]
    assert got["inf_count"] == want["inf_count"]
    finite = t.double()[t.double().isfinite()]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    for key in ("min", "max", "mean"):
        assert same_float(got[key], want[key], scale), (key, got, want)


def with_specials(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10
    x[3::17] = math.nan
    x[5::29] = math.inf
    x[7::31] = -math.inf
    return x.to(dtype)


def test_float32_random_matches_float64_reference():
    g = torch.Generator().manual_seed(1)
    assert_float_stats(torch.randn(1000, 37, generator=g) * 100 + 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_wide_float_dtypes_with_nan_and_inf_match_reference(dtype):
    assert_float_stats(with_specials(5003, dtype))


@pytest.mark.parametrize("dtype", FLOAT8_DTYPES, ids=str)
def test_every_float8_code_decodes_exactly(dtype):
    for code in range(256):
        assert_float_stats(torch.full((3,), code, dtype=torch.uint8).view(dtype))


@pytest.mark.parametrize("dtype", FLOAT8_DTYPES, ids=str)
def test_all_float8_codes_together_match_reference(dtype):
    assert_float_stats(torch.arange(256, dtype=torch.uint8).repeat(3).view(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_float_code_matches_reference(dtype):
    # rows of 256 consecutive codes, so each row's min/max/mean pins its decoding
    codes = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(256, 256)
    for row in codes.view(dtype):
        assert_float_stats(row)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_every_row_length_up_to_40_matches_reference(dtype):
    for n in range(1, 41):
        assert_float_stats(with_specials(n, dtype, seed=n))


def test_nan_excluded_from_min_max_mean_and_counted():
    t = torch.tensor([1.0, math.nan, 3.0, math.nan])
    assert _C.tensor_stats(t) == {
        "min": 1.0,
        "max": 3.0,
        "mean": 2.0,
        "nan_count": 2,
        "inf_count": 0,
    }


def test_inf_counted_and_included_in_min_max_mean():
    st = _C.tensor_stats(torch.tensor([1.0, math.inf, -math.inf, 2.0]))
    assert (st["min"], st["max"], st["inf_count"]) == (-math.inf, math.inf, 2)
    assert math.isnan(st["mean"])
    assert _C.tensor_stats(torch.tensor([1.0, math.inf]))["mean"] == math.inf


def test_all_nan_gives_nan_min_max_mean():
    st = _C.tensor_stats(torch.full((5,), math.nan, dtype=torch.bfloat16))
    assert all(math.isnan(st[k]) for k in ("min", "max", "mean"))
    assert (st["nan_count"], st["inf_count"]) == (5, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool], ids=str)
def test_empty_tensor_has_no_statistics(dtype):
    t = torch.empty(3, 0, 2, dtype=dtype)
    assert _C.tensor_stats(t) is None
    assert _C.format_tensor_stats(t, 2) == ""


def test_zero_dim_tensor():
    assert _C.tensor_stats(torch.tensor(-2.5, dtype=torch.float16)) == {
        "min": -2.5,
        "max": -2.5,
        "mean": -2.5,
        "nan_count": 0,
        "inf_count": 0,
    }
    assert _C.tensor_stats(torch.tensor(7, dtype=torch.int16)) == {"min": 7, "max": 7, "mean": 7.0}


def base_3d(dtype):
    return with_specials(6 * 50 * 40, dtype, seed=5).view(6, 50, 40)


@pytest.mark.parametrize(
    "view",
    [
        lambda b: b.transpose(0, 2),
        lambda b: b.permute(1, 2, 0),
        lambda b: b[:, 3:41, 5:9],
        lambda b: b[::2, ::3, ::7],
        lambda b: b[1, :, 17],
        lambda b: b[:, :, :2],
        lambda b: b[2, 7:8, :].expand(1000, 40),
        lambda b: b[0, 0, :3].view(3, 1, 1).expand(3, 500, 7),
        lambda b: b.as_strided((4, 9), (0, 3)),
    ],
    ids=[
        "transposed",
        "permuted",
        "sliced",
        "stepped",
        "picked",
        "narrow_rows",
        "expanded",
        "expanded_middle",
        "stride0_outer",
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
def test_non_contiguous_views_match_reference(view, dtype):
    assert_float_stats(view(base_3d(dtype)))


def test_non_contiguous_float8_and_int_views_match_reference():
    b = torch.arange(256 * 6, dtype=torch.int64).view(16, 96) % 256
    assert_float_stats(b.to(torch.uint8).t()[::3].view(torch.float8_e5m2))
    assert _C.tensor_stats(b.t()[5:40:2]) == int_reference(b.t()[5:40:2])
    expanded = b[3, :4].to(torch.int8).expand(100, 4)
    assert _C.tensor_stats(expanded) == int_reference(expanded)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_dtypes_with_extremes_match_reference(dtype):
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(3)
    lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    t = torch.randint(lo, hi, (1001,), generator=g, dtype=torch.int64).to(dtype)
    t[10] = info.min
    if dtype == torch.uint64:
        t.view(torch.int64)[500] = -1  # 2**64 - 1, written through its bits
    else:
        t[500] = info.max
    st = _C.tensor_stats(t)
    want = int_reference(t)
    assert (st["min"], st["max"]) == (want["min"], want["max"])
    assert st["mean"] == pytest.approx(want["mean"], rel=1e-12)
    assert type(st["min"]) is int and type(st["max"]) is int


def test_int64_extremes_exact():
    t = torch.tensor([-(2**63), 2**63 - 1, 0, 2**63 - 1])
    assert _C.tensor_stats(t) == {"min": -(2**63), "max": 2**63 - 1, "mean": (2**63 - 2) / 4}


def test_uint64_max_exact():
    t = torch.tensor([-1, 5, -1], dtype=torch.int64).view(torch.uint64)
    st = _C.tensor_stats(t)
    assert (st["min"], st["max"]) == (5, 2**64 - 1)
    assert st["mean"] == pytest.approx((2 * (2**64 - 1) + 5) / 3, rel=1e-15)


def test_bool_counts_as_zero_and_one():
    t = torch.tensor([True, False, True, True])
    assert _C.tensor_stats(t) == {"min": 0, "max": 1, "mean": 0.75}
    assert _C.tensor_stats(torch.ones(3, dtype=torch.bool)) == {"min": 1, "max": 1, "mean": 1.0}


def test_format_float_lines_exact():
    t = torch.tensor([[1.5, -0.0], [math.inf, -2.25]])
    assert _C.format_tensor_stats(t, 1) == (
        "  min=-2.250000\n  max=inf\n  mean=inf\n  nan_count=0\n  inf_count=1\n"
    )


def fixed6_cases():
    """Doubles of every magnitude, decimal halfway points (k + 0.5) / 1e6 that binary
    floats straddle, exact binary halves, signed zeros and values past the fast path."""
    gen = torch.Generator().manual_seed(6)
    mags = torch.rand(3000, generator=gen, dtype=torch.float64) * 22 - 12
    signs = torch.where(torch.rand(3000, generator=gen) < 0.5, -1.0, 1.0).double()
    values = (signs * 10**mags).tolist()
    ks = torch.randint(0, 10**9, (2000,), generator=gen).tolist()
    values += [(k + 0.5) / 1e6 for k in ks] + [-(k + 0.5) / 1e6 for k in ks[:200]]
    values += [k / 2**20 for k in ks[:500]]  # exactly representable, some ties at 1e-6
    values += [0.0, -0.0, 5e-7, -5e-7, 2.5e-6, 1.0000005, 0.1, 1e15, -3e18, 2**52 / 1e6]
    return values


def test_format_float_lines_match_pythons_fixed_6_digits():
    # the C core formats %.6f without printf where it can prove the digits
    for v in fixed6_cases():
        line = _C.format_tensor_stats(torch.tensor([v], dtype=torch.float64), 0).split("\n")[0]
        assert line == f"min={v:.6f}", v


def test_format_with_a_nan_prints_nan_min_max_mean_as_flashinfer_does():
    t = torch.tensor([[1.5, math.nan], [math.inf, -2.25]])
    assert _C.format_tensor_stats(t, 1) == (
        "  min=nan\n  max=nan\n  mean=nan\n  nan_count=1\n  inf_count=1\n"
    )
    assert _C.tensor_stats(t)["min"] == -2.25  # the statistics themselves skip NaNs


def test_format_all_nan_prints_nan():
    t = torch.full((3,), math.nan)
    assert _C.format_tensor_stats(t, 0) == "min=nan\nmax=nan\nmean=nan\nnan_count=3\ninf_count=0\n"


def test_format_inf_minus_inf_mean_prints_nan():
    text = _C.format_tensor_stats(torch.tensor([math.inf, -math.inf]), 0)
    assert text == "min=-inf\nmax=inf\nmean=nan\nnan_count=0\ninf_count=2\n"


def test_format_integer_lines_exact():
    t = torch.tensor([-(2**63), 2**63 - 1, 1])
    assert _C.format_tensor_stats(t, 2) == (
        "    min=-9223372036854775808\n    max=9223372036854775807\n    mean=0.000000\n"
    )
    u8 = torch.tensor([0, 255, 3], dtype=torch.uint8)
    assert _C.format_tensor_stats(u8, 1) == "  min=0\n  max=255\n  mean=86.000000\n"


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
        torch.float8_e8m0fnu,
    ],
    ids=str,
)
def test_dtypes_flashinfer_logs_no_statistics_for_print_none(dtype):
    t = torch.ones(3).to(dtype)
    assert _C.tensor_stats(t) is not None  # computed (tensor_stats), not logged
    assert _C.format_tensor_stats(t, 1) == ""


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(4, dtype=torch.complex64),
        lambda: torch.ones(4, dtype=torch.complex128),
        lambda: torch.ones(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        lambda: torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8),
    ],
    ids=["complex64", "complex128", "float4_e2m1fn_x2", "qint8"],
)
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_dtypes_without_statistics_give_no_lines(make):
    t = make()
    assert _C.tensor_stats(t) is None
    assert _C.format_tensor_stats(t, 1) == ""


def test_meta_tensor_gives_no_lines():
    assert _C.tensor_stats(torch.empty(4, device="meta")) is None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.bool], ids=str)
def test_tensor_unchanged_after_statistics(dtype):
    t = with_specials(300, torch.float64).nan_to_num(0.0).abs().to(dtype)
    before = t.view(torch.uint8).clone()
    _C.tensor_stats(t)
    _C.format_tensor_stats(t, 0)
    assert torch.equal(t.view(torch.uint8), before)


def test_large_tensor_counts_exact():
    # over the chunk size and the size at which the GIL is released
    t = torch.zeros(600_003)
    t[::7] = math.nan
    t[1::11] = -math.inf
    t[-1] = 4.0
    assert_float_stats(t)
    assert_float_stats(t.view(3, 200_001)[:, 1:].t())


def test_negative_view_of_conjugate_reports_negated_values():
    z = torch.complex(torch.tensor([1.0, 2.0]), torch.tensor([3.0, -5.0])).conj()
    imag = z.imag
    assert imag.is_neg()
    assert _C.tensor_stats(imag) == {
        "min": -3.0,
        "max": 5.0,
        "mean": 1.0,
        "nan_count": 0,
        "inf_count": 0,
    }


def test_negative_view_of_zeros_has_torch_signed_zeros():
    # torch: min and max of the negated zeros are -0.0, their mean is +0.0
    imag = torch.zeros(4, dtype=torch.complex64).conj().imag
    stats = _C.tensor_stats(imag)
    assert math.copysign(1.0, stats["mean"]) == 1.0
    assert math.copysign(1.0, stats["min"]) == math.copysign(1.0, imag.min().item())
    assert math.copysign(1.0, stats["max"]) == math.copysign(1.0, imag.max().item())


@pytest.mark.parametrize(
    "t",
    [
        with_specials(777, torch.float32),
        with_specials(777, torch.bfloat16).view(7, 111).t(),
        torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn),
        torch.full((4,), math.nan),
        torch.tensor([-5, 9, 3], dtype=torch.int32),
        torch.tensor([True, False]),
    ],
    ids=["float32", "bfloat16_t", "e4m3fn", "all_nan", "int32", "bool"],
)
def test_torch_ops_path_agrees_with_c_path(t):
    got, want = _C._tensor_stats_torch_ops(t), _C.tensor_stats(t)
    assert set(got) == set(want)
    for key in want:
        assert same_float(float(got[key]), float(want[key]), 1e3), key


def test_failure_becomes_statistics_error_line():
    sparse = torch.eye(3).to_sparse()
    text = _C.format_tensor_stats(sparse, 1)
    assert text.startswith("  [statistics error: ") and text.endswith("]\n")


def test_tensor_stats_rejects_non_tensor():
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        _C.tensor_stats([1.0])


def test_format_tensor_stats_rejects_bad_indent():
    with pytest.raises(ValueError, match="indent -1 is not in"):
        _C.format_tensor_stats(torch.ones(1), -1)
    with pytest.raises(TypeError, match="expected a torch.Tensor, got str"):
        _C.format_tensor_stats("x", 0)


def _eight_lane_sum(values):
    """The C kernel's summation order: lane j adds elements j, j + 8, ... in float64 from
    zero; the lanes are reduced as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)),
    then the n % 8 tail is added one by one."""
    import numpy as np

    body = len(values) // 8 * 8
    lanes = [0.0] * 8
    for row in np.asarray(values[:body], dtype=np.float64).reshape(-1, 8):
        lanes = [s + float(v) for s, v in zip(lanes, row)]
    total = 0.0
    total += (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
    total += (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
    for v in values[body:]:
        total += float(v)
    return total


@pytest.mark.parametrize("n", [16, 17, 23, 1000, 65536 + 8 * 3 + 5])
def test_contiguous_float32_mean_is_bit_identical_to_the_eight_lane_order(n):
    """Whatever vector width the CPU offers, the sum keeps one fixed order (so the
    level-5 text of a tensor never depends on the machine or on how it was passed)."""
    g = torch.Generator().manual_seed(n)
    t = torch.randn(n, generator=g) * torch.logspace(-20, 20, n).float()
    values = t.tolist()
    got = _C.tensor_stats(t)
    assert got["mean"] == _eight_lane_sum(values) / n
    assert (got["min"], got["max"]) == (min(values), max(values))


def _sixteen_bit_lane_sum(values):
    """The 16-bit kernels' order: of each group of eight elements, lanes 0-3 take elements
    0, 2, 4, 6 and lanes 4-7 elements 1, 3, 5, 7; then the eight-lane reduction and tail."""
    body = len(values) // 8 * 8
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    permuted = [values[g + k] for g in range(0, body, 8) for k in order]
    return _eight_lane_sum(permuted + list(values[body:]))


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [16, 24, 31, 1000, 65536 * 2 + 8 * 3 + 5])
def test_sixteen_bit_mean_is_the_same_on_every_path(monkeypatch, isa, dtype, n):
    """The AVX2 path (pairs of eight-element groups in 256-bit registers) keeps the 128-bit
    code's lanes and order: the same bits, with NaN and Inf counted alike."""
    monkeypatch.setenv("FLASHINFER_CPU_ISA", isa)
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 100).to(dtype)
    t[n // 3] = float("nan")
    values = [v for v in t.float().tolist()]
    clean = [0.0 if v != v else v for v in values]
    got = _C.tensor_stats(t)
    assert got["mean"] == _sixteen_bit_lane_sum(clean) / (n - 1)  # over the non-NaN ones
    assert got["nan_count"] == 1
    finite = [v for v in values if v == v]
    assert (got["min"], got["max"]) == (min(finite), max(finite))
    t[n // 2] = float("inf")
    assert _C.tensor_stats(t)["inf_count"] == 1
