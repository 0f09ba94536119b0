"""Cross-device triage: FlashInfer's recordings replayed on a CPU machine with the mirror.

standin_record.py records, under the real FlashInfer served by the core, calls of
``single_decode_with_kv_cache`` (module ``flashinfer.decode``) and ``bmm_fp8`` (module
``flashinfer.gemm.gemm_base``, which the mirror does not have), with outputs from a
torch reference since no GPU is here, and a real ``rmsnorm`` call. The repository's
.venv (the mirror, CPU kernels) replays them with ``--device cpu``. What this proves:
FlashInfer's recorded names, signatures and argument encodings resolve to the mirror's
implementations and its CPU kernels agree with the reference on those exact inputs; it
does not compare with FlashInfer's GPU kernels.
"""

import os
import subprocess

import pytest
from conftest import run_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIRROR_PYTHON = os.environ.get("MIRROR_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))


@pytest.fixture(scope="module")
def replayed(module_tmp):
    run_json("standin_record.py", module_tmp, native=True, level=10)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run(
        [MIRROR_PYTHON, "-m", "flashinfer", "replay", "--dir", "dumps", "--device", "cpu"],
        cwd=module_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def line_of(proc, api):
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("[") and f"] {api} (" in x]
    return line


def test_recorded_flashinfer_calls_replay_on_cpu_with_the_mirrors_kernels(replayed):
    assert line_of(replayed, "single_decode_with_kv_cache").endswith("✅ Passed")
    assert line_of(replayed, "bmm_fp8").endswith("✅ Passed")


def test_a_call_with_no_implementation_here_says_so(replayed):
    line = line_of(replayed, "rmsnorm")
    assert "❌ Error" in line
    assert "flashinfer.norm.rmsnorm is not implemented by the installed flashinfer" in line
    assert "no implementation of this API on this machine" in line


def test_summary_counts_the_unimplemented_call_as_failed(replayed):
    assert replayed.returncode == 1
    assert replayed.stdout.strip().splitlines()[-1] == "Summary: 2 passed, 1 failed/mismatch"
