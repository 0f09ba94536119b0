"""The build's CUDA attributes and architectures (a build without nvcc,
FLASHINFER_NO_CUDA=1, is tests/test_packaging.py's: it builds both wheels so)."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import flashinfer_native
from flashinfer import _kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cuda_attributes_have_their_types():
    assert isinstance(_kernels.cuda_built, bool)
    assert isinstance(_kernels.cuda_archs, str)
    assert (_kernels.cuda_archs != "") == _kernels.cuda_built


def test_cpu_attention_still_refuses_meta_tensors():
    q = torch.zeros(1, 1, 64)
    i32 = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="k is on meta"):
        _kernels.attention(q, q.to("meta"), q, q.clone(), None, i32, i32)


@pytest.mark.parametrize("folder", [".", "native"])
def test_setup_reads_its_project_without_deprecation_warnings(folder):
    # setuptools >= 77 warns about a project.license table; the SPDX string is the form
    proc = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=os.path.join(ROOT, folder),
        env=dict(os.environ, FLASHINFER_NO_CUDA="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == flashinfer_native.__version__, (
        proc.stderr
    )
    assert "Deprecat" not in proc.stderr and "warning" not in proc.stderr.lower(), proc.stderr


def test_cuda_archs_take_sm_100a_and_nvcc_accepts_them(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "native"))
    import build_extensions

    monkeypatch.setenv("FLASHINFER_CUDA_ARCHS", "80; 90a,100a")
    archs = build_extensions.cuda_archs()
    flags = build_extensions.gencode_flags(archs)
    assert flags == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_100a,code=sm_100a",
    ]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return  # the flags are checked; a machine with nvcc also checks that it takes them
    proc = subprocess.run(
        [nvcc, *flags, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
