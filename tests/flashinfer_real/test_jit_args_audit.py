"""The audit of FlashInfer's JIT arguments holds for the installed flashinfer-python.

``flashinfer_native.jit_args.AUDIT`` lists every ``@flashinfer_api`` parameter whose name
says it could be code, a path, a module or flags (``SUSPECT_NAME``), with what it
reaches and whether replay refuses it (docs/security.md). A FlashInfer version that adds
such a parameter fails here until the table says what it is. The installed package's
sources are read with ``ast``: nothing of FlashInfer is imported.
"""

import ast
import importlib.util
import json
import os

from conftest import run_python

from flashinfer_native import jit_args


def flashinfer_sources():
    spec = importlib.util.find_spec("flashinfer")
    for base in spec.submodule_search_locations:
        for folder, _, files in os.walk(base):
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def api_parameters():
    """{parameter name: ["file:function", ...]} of every @flashinfer_api definition."""
    found = {}
    for path in flashinfer_sources():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not any("flashinfer_api" in ast.unparse(d) for d in node.decorator_list):
                continue
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    found.setdefault(arg.arg, []).append(f"{path}:{node.name}")
    return found


def test_every_suspect_parameter_of_an_api_is_in_the_audit():
    parameters = api_parameters()
    assert len(parameters) > 100  # the walk found FlashInfer's APIs
    suspects = {name for name in parameters if jit_args.SUSPECT_NAME.search(name)}
    missing = {name: parameters[name][:3] for name in suspects - set(jit_args.AUDIT)}
    assert not missing, (
        "parameters of @flashinfer_api that may reach FlashInfer's JIT are not audited in "
        f"flashinfer_native/jit_args.py (AUDIT) and docs/security.md: {missing}"
    )


def test_the_refused_parameters_are_still_there():
    parameters = api_parameters()
    assert jit_args.REFUSED <= set(parameters), jit_args.REFUSED - set(parameters)


REPLAY_JIT_ARGS = """
import json, os, sys, torch
import flashinfer
from flashinfer_native.replay import replay_from_dump

target = sys.argv[1]
f16 = {"type": "torch.dtype", "value": "torch.float16"}
dump = os.path.join(os.getcwd(), "dumps", "20250101_000000_000_pid1_init_call0001")
os.makedirs(dump)
record = {
    "function_name": "BatchDecodeWithPagedKVCacheWrapper.__init__",
    "module": "flashinfer.decode",
    "process_id": 1,
    "self_id": 1,
    "execution_status": "completed",
    "input_metadata": {
        "arg_0": {"type": "BatchDecodeWithPagedKVCacheWrapper", "repr": "<object>"},
        "kwarg_jit_args": {"type": "list", "items": [
            target, f16, f16, f16, {"type": "torch.dtype", "value": "torch.int32"}, 64, 64,
            [], [], [], [], "Variant", 'extern "C" int pwn() { return 0; }'
        ]},
    },
    "tensor_info": {"input_tensor_keys": ["arg_1"], "output_tensor_keys": []},
}
with open(os.path.join(dump, "metadata.jsonl"), "w") as f:
    f.write(json.dumps(record) + "\\n")
from flashinfer_native import _C
_C.save_tensors(os.path.join(dump, "inputs.pt"), {"arg_1": torch.zeros(1 << 10, dtype=torch.uint8)})
try:
    replay_from_dump(dump, run=True, device="cpu")
except ValueError as exc:
    print(json.dumps({"refused": str(exc)}))
else:
    print(json.dumps({"refused": None}))
"""


def test_replaying_jit_args_of_the_real_wrapper_is_refused_and_writes_nothing(tmp_path):
    target = tmp_path / "outside" / "pwn"
    proc = run_python(REPLAY_JIT_ARGS.replace("sys.argv[1]", repr(str(target))), tmp_path)
    assert proc.returncode == 0, proc.stderr
    refused = json.loads(proc.stdout.splitlines()[-1])["refused"]
    assert refused and "argument 'jit_args' reaches FlashInfer's JIT" in refused
    assert "--allow-jit-args" in refused
    assert not (tmp_path / "outside").exists()
