"""The build's CUDA attributes, and a build without nvcc (FLASHINFER_NO_CUDA=1)."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

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


def test_build_without_cuda_imports_and_runs_attention(tmp_path):
    """Copies the sources, builds with FLASHINFER_NO_CUDA=1 and runs CPU attention."""
    src = tmp_path / "src"
    for part in ("csrc", "kernels", "flashinfer", "flashinfer_native", "native"):
        shutil.copytree(
            os.path.join(ROOT, part),
            src / part,
            symlinks=True,  # native/'s links to the sources stay links
            ignore=shutil.ignore_patterns("*.so", "__pycache__", "build", "*.egg-info"),
        )
    for name in ("setup.py", "pyproject.toml"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), src / name)
    env = dict(os.environ, FLASHINFER_NO_CUDA="1", CCACHE_DISABLE="1")
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", "bt"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a generous bound against a hang, not a speed check (shared machines build slowly)
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert "CUDA kernels not built" in build.stdout
    code = (
        "import torch; from flashinfer import _kernels; from flashinfer_native import _C\n"
        "assert _C.cuda_built is False and _C.cuda_archs == ''\n"
        "assert _kernels.cuda_built is False and _kernels.cuda_archs == ''\n"
        "q = torch.ones(1, 1, 64); i = torch.tensor([0, 1], dtype=torch.int32)\n"
        "out = torch.empty_like(q); _kernels.attention(q, q, q, out, None, i, i)\n"
        "assert torch.equal(out, q)\n"
        "try:\n"
        "    _kernels.attention(q.to('meta'), q, q, out, None, i, i)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "q is on meta; this build runs attention on cpu tensors only" in run.stdout


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
    assert proc.returncode == 0 and proc.stdout.strip() == "0.1.0", proc.stderr
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
