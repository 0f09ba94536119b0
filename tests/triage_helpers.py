"""Recorded sessions for the triage tools' tests (repro, diff, report).

``record`` runs Python source at level 10 in a child process and returns the dump root;
``MIRROR_SESSION`` calls every API the mirror implements, small enough for CPU.
"""

import json
import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

# One call (or __init__/plan/run chain) of every mirror API, on CPU, seeded.
MIRROR_SESSION = """
import torch
import flashinfer
from flashinfer import SfLayout

torch.manual_seed(int(SEED))
f16 = dict(dtype=torch.float16)
q = torch.randn(8, 64, **f16)
k = torch.randn(40, 2, 64, **f16)
v = torch.randn(40, 2, 64, **f16)
flashinfer.single_decode_with_kv_cache(q, k, v, logits_soft_cap=30.0)
flashinfer.single_prefill_with_kv_cache(torch.randn(12, 8, 64, **f16), k, v, causal=True)

batch, page = 3, 4
kv_lens = [9, 4, 12]
pages = [(n + page - 1) // page for n in kv_lens]
indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
indices = torch.randperm(sum(pages)).to(torch.int32)
last = torch.tensor([(n - 1) % page + 1 for n in kv_lens], dtype=torch.int32)
cache = torch.randn(sum(pages), 2, page, 2, 64, **f16)
workspace = torch.zeros(1 << 20, dtype=torch.int8)

dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
dec.plan(indptr, indices, last, 8, 2, 64, page, data_type=torch.float16)
dec.run(torch.randn(batch, 8, 64, **f16), cache, return_lse=True)

qo_indptr = torch.tensor([0, 2, 3, 7], dtype=torch.int32)
pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
pre.plan(qo_indptr, indptr, indices, last, 8, 2, 64, page, causal=True)
pre.run(torch.randn(7, 8, 64, **f16), cache)

kv_indptr = torch.tensor([0, 5, 9, 20], dtype=torch.int32)
rag = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace)
rag.plan(qo_indptr, kv_indptr, 8, 2, 64, causal=True, q_data_type=torch.bfloat16)
rag.run(
    torch.randn(7, 8, 64).to(torch.bfloat16),
    torch.randn(20, 2, 64).to(torch.bfloat16),
    torch.randn(20, 2, 64).to(torch.bfloat16),
)

def to_fp8(x):
    scale = 448.0 / x.abs().max().float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

a, a_inv = to_fp8(torch.randn(2, 16, 128))
b, b_inv = to_fp8(torch.randn(2, 32, 128).transpose(-2, -1))
flashinfer.bmm_fp8(a, b, a_inv, b_inv, torch.bfloat16, backend="cublas")

x8, x_inv = to_fp8(torch.randn(8, 256))
w8, w_inv = to_fp8(torch.randn(64, 256))
flashinfer.mm_fp8(x8, flashinfer.prepare_low_latency_gemm_weights(w8), x_inv * w_inv)

x = torch.randn(16, 128, dtype=torch.bfloat16)
w = torch.randn(64, 128, dtype=torch.bfloat16)
gx = (448 * 6) / x.float().abs().max()
gw = (448 * 6) / w.float().abs().max()
xq, xs = flashinfer.nvfp4_quantize(x, gx, sfLayout=SfLayout.layout_128x4)
wq, ws = flashinfer.fp4_quantize(w, gw, is_sf_swizzled_layout=True)
flashinfer.mm_fp4(xq, wq.T, xs, ws.T, 1.0 / (gx * gw), torch.bfloat16, backend="cudnn")
try:
    flashinfer.fp4_quantize(w, gw, backend="bogus")
except ValueError:
    pass
"""

MIRROR_APIS = [
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper.run",
    "BatchPrefillWithPagedKVCacheWrapper.run",
    "BatchPrefillWithRaggedKVCacheWrapper.run",
    "bmm_fp8",
    "mm_fp8",
    "prepare_low_latency_gemm_weights",
    "mm_fp4",
    "nvfp4_quantize",
    "fp4_quantize",
]


_SESSIONS = {}


def mirror_session(tmp_path_factory, seed=0):
    """MIRROR_SESSION recorded once per test run and seed (shared by the test modules)."""
    if seed not in _SESSIONS:
        root = tmp_path_factory.mktemp(f"mirror{seed}") / "dumps"
        _SESSIONS[seed] = record(root, MIRROR_SESSION, seed=seed)
    return _SESSIONS[seed]


def clean_env(**extra):
    """The environment without FLASHINFER_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def record(root, body, seed=0, **env_extra):
    """Run ``body`` (Python source; ``SEED`` is defined) at level 10; return the dump root."""
    root = str(root)
    env = clean_env(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=root + ".log",
        FLASHINFER_DUMP_DIR=root,
        PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
    )
    env.update(env_extra)
    src = f"SEED = {seed}\nimport torch\nimport replay_helpers as h\n" + textwrap.dedent(body)
    r = subprocess.run(
        [sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    return root


# Runs each repro.py given on the command line in its own directory, in one process
# (one torch import for all), and prints {folder: [exit status, output]} as JSON. Each
# script imports the repro_runtime.py of its own folder (the current directory).
RUN_SCRIPTS = r"""
import contextlib, io, json, os, runpy, sys
results = {}
for folder in sys.argv[1:]:
    os.chdir(folder)
    sys.modules.pop("repro_runtime", None)
    out = io.StringIO()
    sys.argv = ["repro.py"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path("repro.py", run_name="__main__")
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    results[folder] = [status, out.getvalue()]
print(json.dumps(results))
"""


def run_scripts(folders):
    """Run the repro.py of each folder (cwd there, clean environment) in one child."""
    r = subprocess.run(
        [sys.executable, "-c", RUN_SCRIPTS, *map(str, folders)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def dump_of(root, api, nth=-1):
    """The dump directory of the nth recorded call of ``api`` (directory-name order)."""
    found = [
        os.path.join(root, d)
        for d in sorted(os.listdir(root))
        if d.split("_pid", 1)[-1].split("_", 1)[-1].rsplit("_call", 1)[0] == api
    ]
    assert found, f"no {api} dump in {root}"
    return found[nth]
