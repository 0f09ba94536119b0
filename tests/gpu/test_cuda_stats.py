"""The CUDA statistics kernel against torch, and level 5 with CUDA tensors and graphs."""

import re

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0

from flashinfer_native import _C

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def expected(t):
    x = t.double()
    nan = torch.isnan(x)
    finite = x[~nan]
    if finite.numel() == 0:
        return None
    return dict(
        min=finite.min().item(),
        max=finite.max().item(),
        mean=finite.sum().item() / finite.numel(),
        nan_count=int(nan.sum()),
        inf_count=int(torch.isinf(x).sum()),
    )


def check(t):
    got = _C.tensor_stats(t)
    want = expected(t.cpu())
    assert got["nan_count"] == want["nan_count"]
    assert got["inf_count"] == want["inf_count"]
    assert got["min"] == want["min"]
    assert got["max"] == want["max"]
    if want["inf_count"] == 0:
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-9, abs=1e-12)
    # the CPU kernel gives the same numbers
    cpu = _C.tensor_stats(t.cpu())
    assert (cpu["min"], cpu["max"], cpu["nan_count"]) == (got["min"], got["max"], got["nan_count"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_stats_kernel_matches_torch(dtype):
    torch.manual_seed(0)
    check((torch.randn(1000, 37, device="cuda") * 5).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_stats_kernel_counts_nan_and_inf(dtype):
    t = torch.randn(513, device="cuda").to(dtype)
    t[3] = float("nan")
    t[100] = float("inf")
    t[200] = float("-inf")
    t[511] = float("nan")
    got = _C.tensor_stats(t)
    assert (got["nan_count"], got["inf_count"]) == (2, 2)
    assert got["min"] == float("-inf") and got["max"] == float("inf")


@pytest.mark.parametrize("dtype", FP8)
def test_stats_kernel_fp8_every_code(dtype):
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").view(dtype)
    check(codes)


@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_stats_kernel_strided_views(dtype):
    base = (torch.randn(64, 48, device="cuda") * 3).to(dtype)
    check(base[::3, 5:40:2])
    check(base.t())
    check(base[:, 7])
    check(base.unsqueeze(1).expand(64, 4, 48))


def test_stats_kernel_all_nan_gives_nan():
    got = _C.tensor_stats(torch.full((10,), float("nan"), device="cuda"))
    assert got["nan_count"] == 10
    assert all(got[k] != got[k] for k in ("min", "max", "mean"))


def test_stats_kernel_large_tensor_uses_many_blocks():
    t = torch.arange(3_000_001, device="cuda", dtype=torch.float64)
    got = _C.tensor_stats(t)
    assert (got["min"], got["max"], got["mean"]) == (0.0, 3_000_000.0, 1_500_000.0)


def test_format_lines_for_cuda_tensor():
    # as on the CPU (and in FlashInfer): with a NaN present, min/max/mean print nan
    t = torch.tensor([1.0, 2.0, float("nan"), float("inf")], device="cuda")
    assert _C.format_tensor_stats(t, 0) == (
        "min=nan\nmax=nan\nmean=nan\nnan_count=1\ninf_count=1\n"
    )
    assert _C.format_tensor_stats(t, 0) == _C.format_tensor_stats(t.cpu(), 0)
    finite = torch.tensor([1.0, 2.0, -3.5, float("inf")], device="cuda")
    assert _C.format_tensor_stats(finite, 0) == (
        "min=-3.500000\nmax=inf\nmean=inf\nnan_count=0\ninf_count=1\n"
    )


@pytest.fixture
def logmod(monkeypatch):
    yield lambda **env: reload_api_logging(monkeypatch, **env)
    restore_level_0()


def test_level_5_with_cuda_tensor_prints_statistics(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="5", FLASHINFER_LOGDEST=str(log))
    f = m.flashinfer_api(lambda x: x + 1)
    f(torch.tensor([1.0, 3.0], device="cuda"))
    text = log.read_text()
    assert "min=1.000000" in text and "max=3.000000" in text and "mean=2.000000" in text


def test_level_3_with_cuda_tensor_logs_device(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))
    f = m.flashinfer_api(lambda x: x + 1)
    f(torch.ones(2, 3, device="cuda", dtype=torch.float16))
    text = log.read_text()
    assert "device=cuda:0" in text and "shape=(2, 3)" in text and "min=" not in text


def test_level_5_during_graph_capture_defers_to_device_printf(logmod, tmp_path, capfd):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="5", FLASHINFER_LOGDEST=str(log))
    f = m.flashinfer_api(lambda x: x * 2)
    x = torch.tensor([1.0, -2.0, 4.0, float("nan")], device="cuda")
    f(x)  # warm-up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f(x)
    text = log.read_text()
    found = re.findall(
        r"\[stats deferred to GPU kernel: id=(\d+); look for "
        r"'\[flashinfer stats\] id=\1 \.\.\.' in graph replay output\]",
        text,
    )
    assert found, text
    capfd.readouterr()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    out = capfd.readouterr().out
    # the captured call's input (x) and output (x * 2), each printed at both replays
    x_id, y_id = found
    x_line = (
        f"[flashinfer stats] id={x_id} numel=4 min=-2.000000 max=4.000000 mean=1.000000 nan=1 inf=0"
    )
    y_line = (
        f"[flashinfer stats] id={y_id} numel=4 min=-4.000000 max=8.000000 mean=2.000000 nan=1 inf=0"
    )
    assert out.count(x_line) == 2 and out.count(y_line) == 2, out


def test_graph_capture_of_int_tensor_keeps_skip_line(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="5", FLASHINFER_LOGDEST=str(log))
    f = m.flashinfer_api(lambda x: x + 1)
    x = torch.arange(4, device="cuda")
    f(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f(x)
    assert "[statistics skipped: CUDA graph capture in progress]" in log.read_text()


# CPU kernel against CUDA kernel on the same tensors. Both read every element exactly
# into float64 and take min, max and the NaN/Inf counts exactly, so those must be equal.
# Only the sums differ, in the order of the additions (lanes and rows on the CPU, a tree
# on the GPU). Any order of summing n float64 values lands within (n - 1) * u * sum|x| of
# the exact sum (u = 2**-53; Higham, Accuracy and Stability of Numerical Algorithms, 4.2),
# and each side's division by the count adds at most u * |mean|, so the two means differ
# by at most 2 * n * u * sum|x| / count.
U = 2.0**-53

VIEWS = {
    "contiguous": lambda t: t,
    "strided": lambda t: t[::3, 5:40:2],
    "transposed": lambda t: t.t(),
    "column": lambda t: t[:, 7],
    "expanded": lambda t: t.unsqueeze(1).expand(64, 4, 48),
    "reversed": lambda t: t.flip(0),
    "unaligned": lambda t: t.reshape(-1)[3:-5],  # dense, not on a 16-byte boundary, a tail
}


def mean_tolerance(t):
    x = t.cpu().double()
    x = x[~torch.isnan(x)]
    return 2 * t.numel() * U * x.abs().sum().item() / max(x.numel(), 1)


def assert_cpu_matches_cuda(t):
    gpu = _C.tensor_stats(t)
    cpu = _C.tensor_stats(t.cpu())
    for k in ("min", "max", "nan_count", "inf_count"):
        assert cpu[k] == gpu[k] or (cpu[k] != cpu[k] and gpu[k] != gpu[k]), (k, cpu, gpu)
    if cpu["inf_count"] or cpu["nan_count"] == t.numel():
        assert str(cpu["mean"]) == str(gpu["mean"])  # inf, -inf or nan on both
    else:
        assert abs(cpu["mean"] - gpu["mean"]) <= mean_tolerance(t), (cpu, gpu)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_cpu_and_cuda_statistics_agree(dtype, view):
    torch.manual_seed(1)
    base = (torch.randn(64, 48, device="cuda") * 7 + 3).to(dtype)
    assert_cpu_matches_cuda(VIEWS[view](base))


@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_cpu_and_cuda_statistics_agree_with_nan_and_inf(dtype):
    x = torch.randn(4099, device="cuda") * 100
    x[5] = float("nan")
    x[77] = float("inf")  # float8_e4m3fn has no Inf: it stores what .to() makes of it
    x[4000] = float("nan")
    t = x.to(dtype)
    assert_cpu_matches_cuda(t)
    assert_cpu_matches_cuda(t[:70])  # a NaN, no Inf
    assert_cpu_matches_cuda(torch.full((9,), float("nan"), device="cuda").to(dtype))


def test_cpu_and_cuda_statistics_agree_on_many_blocks():
    torch.manual_seed(2)
    assert_cpu_matches_cuda(torch.randn(1 << 21, device="cuda") * 1e3 + 1e6)


def test_cpu_and_cuda_statistics_agree_on_negative_view():
    z = torch.complex(torch.randn(300, device="cuda"), torch.randn(300, device="cuda"))
    imag = z.conj().imag
    assert imag.is_neg()
    assert_cpu_matches_cuda(imag)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool])
def test_cpu_and_cuda_statistics_agree_on_integers(dtype):
    # integer sums are exact on both sides (CPU in 128 bits, torch in float64 below 2**53)
    t = torch.randint(-100, 100, (1000,), device="cuda").to(dtype)
    assert _C.tensor_stats(t) == _C.tensor_stats(t.cpu())
