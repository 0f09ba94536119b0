"""The level-10 one-pass write: statistics taken while the bytes are checksummed and
written (per 256 KB block) are bit-identical to the level-5 pass over the whole tensor."""

import math
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from flashinfer_native import _C


def _tensor(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g) * torch.logspace(-8, 8, n)
    t[n // 3] = float("nan")
    t[n // 2] = float("-inf")
    return t.to(dtype)


def _same(a, b):
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a
    )


@pytest.fixture(autouse=True)
def _forget():
    yield
    _C._forget_stats()


# 256 KB blocks: these sizes give one block, several blocks, and tails of 1-7 elements
SIZES = [16, 23, 65536, 65536 + 5, 3 * 65536 + 8 * 1000 + 3, 131072 * 2 + 1]


@pytest.mark.parametrize("safetensors", [False, True], ids=["pt", "safetensors"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_statistics_equal_the_separate_pass_bit_for_bit(tmp_path, dtype, safetensors):
    tensors = {f"t{n}": _tensor(dtype, n, n) for n in SIZES}
    taken = _C._save_tensors_taking_stats(tmp_path / "x", tensors, safetensors)
    assert taken == len(tensors)
    fused = {k: _C.tensor_stats(t) for k, t in tensors.items()}
    _C._forget_stats()
    for k, t in tensors.items():
        assert _same(fused[k], _C.tensor_stats(t)), k


def test_the_file_written_in_the_fused_pass_is_whole(tmp_path):
    tensors = {"a": _tensor(torch.float32, 300001, 1), "b": _tensor(torch.bfloat16, 70001, 2)}
    _C._save_tensors_taking_stats(tmp_path / "x.pt", tensors)
    with zipfile.ZipFile(tmp_path / "x.pt") as z:
        assert z.testzip() is None
    loaded = torch.load(tmp_path / "x.pt")
    for k, t in tensors.items():
        torch.testing.assert_close(loaded[k], t, rtol=0, atol=0, equal_nan=True)


def test_other_dtypes_views_and_small_tensors_are_left_to_the_level5_pass(tmp_path):
    base = torch.randn(64, 64)
    tensors = {
        "f64": torch.randn(1000, dtype=torch.float64),
        "int": torch.arange(1000),
        "small": torch.randn(15),
        "strided": base[:, ::2],
        "neg": torch.randn(100)._neg_view(),
    }
    assert _C._save_tensors_taking_stats(tmp_path / "x.pt", tensors) == 0


def test_a_tensor_changed_in_place_after_the_write_is_read_again(tmp_path):
    t = _tensor(torch.float32, 1000, 3)
    _C._save_tensors_taking_stats(tmp_path / "x.pt", {"t": t})
    t.add_(1000.0)
    assert _C.tensor_stats(t)["min"] == pytest.approx(float(t[~t.isnan()].min()))


def test_level10_log_text_equals_level5_text(tmp_path):
    """End to end: the level-10 call takes its input statistics from the dump's pass."""
    script = (
        "import torch\n"
        "from flashinfer.api_logging import flashinfer_api\n"
        "@flashinfer_api\n"
        "def api(x, y, z):\n"
        "    return None\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(100003, generator=g) * 1e3\n"
        "x[5] = float('nan'); x[77] = float('inf')\n"
        "y = torch.randn(4096, 33, generator=g).to(torch.bfloat16)\n"
        "z = torch.randn(70001, generator=g).half()\n"
        "api(x, y, z)\n"
        "x.add_(1)\n"
        "api(x, y, z)\n"
    )
    lines = {}
    for level in ("5", "10"):
        log = tmp_path / f"log{level}.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
        env.update(
            FLASHINFER_LOGLEVEL=level,
            FLASHINFER_LOGDEST=str(log),
            FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        )
        subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)
        stat_names = ("min=", "max=", "mean=", "nan_count=", "inf_count=")
        lines[level] = [
            s.strip() for s in log.read_text().splitlines() if s.strip().startswith(stat_names)
        ]
    assert len(lines["5"]) == 2 * 3 * 5
    assert lines["10"] == lines["5"]
