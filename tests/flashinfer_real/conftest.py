"""Tests against the real FlashInfer (flashinfer-python) served by the native core.

They run in a virtualenv of their own, made by ``make test-flashinfer`` (torch==2.13.0
CPU, flashinfer-python==0.7.2.post1 from the package index, ``pip install ./native``).
In any other environment (the repository's .venv, whose ``flashinfer`` is the mirror)
this folder holds no tests to collect.
"""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    importlib.metadata.version("flashinfer-python")
except importlib.metadata.PackageNotFoundError:
    collect_ignore_glob = ["test_*.py"]


def run_python(script, cwd, native=True, level=0, extra_env=None, timeout=600):
    """Run ``script`` (a file in this folder, or code text) in a fresh interpreter of this
    virtualenv, in ``cwd``; FLASHINFER_NATIVE_LOGGING switches the core on through the
    installed start-up hook. Returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_NATIVE_LOGGING="1" if native else "0",
        FLASHINFER_LOGLEVEL=str(level),
        FLASHINFER_LOGDEST=os.path.join(str(cwd), "log.txt"),
        FLASHINFER_DUMP_DIR=os.path.join(str(cwd), "dumps"),
        PYTHONPATH=HERE,
    )
    env.update(extra_env or {})
    path = os.path.join(HERE, script)
    cmd = [sys.executable, path] if os.path.exists(path) else [sys.executable, "-c", script]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_json(script, cwd, **kwargs):
    """``run_python`` for a script that prints one JSON document as its last line."""
    proc = run_python(script, cwd, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fi")
