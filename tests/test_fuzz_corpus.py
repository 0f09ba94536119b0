"""Every seed of the fuzz targets (tests/fuzz/corpus/TARGET/) and every input that once
crashed or misled one (tests/fuzz/regressions/TARGET/) goes through the readers the
normal build uses, and ends in a result or a clean error naming the file."""

import os
import struct
import sys
import zipfile

import pytest
import torch

from flashinfer_native import _C

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")
sys.path.insert(0, FUZZ)

import fuzz_dumptree  # noqa: E402
import fuzz_repro  # noqa: E402


def read(path):
    with open(path, "rb") as f:
        return f.read()


def load_tensor_bytes(tmp_path, name, data):
    """load_tensors on data written as file name; a clean ValueError is fine."""
    path = tmp_path / name
    path.write_bytes(data)
    try:
        _C.load_tensors(str(path))
    except ValueError as exc:
        assert str(path) in str(exc)


def replay_pt(tmp_path, data):
    load_tensor_bytes(tmp_path, "t.pt", data)


def replay_pickle(tmp_path, data):
    """data.pkl inside a zip with a correct CRC, so the interpreter sees it."""
    with zipfile.ZipFile(tmp_path / "t.pt", "w") as z:
        z.writestr("archive/data.pkl", data)
    load_tensor_bytes(tmp_path, "t.pt", (tmp_path / "t.pt").read_bytes())


def replay_safetensors(tmp_path, data):
    load_tensor_bytes(tmp_path, "t.safetensors", data)


def replay_json(tmp_path, data):
    """The parser's input as a safetensors header."""
    load_tensor_bytes(tmp_path, "t.safetensors", struct.pack("<Q", len(data)) + data)


def replay_dumptree(tmp_path, data):
    """The target itself, its audit-hook guard included."""
    import flashinfer  # noqa: F401 - its enums are what the target resolves

    sys.addaudithook(fuzz_dumptree._Guard.hook)
    fuzz_dumptree.test_one_input(data, str(tmp_path / "root"))


_VOCABULARY = {}


def replay_repro(tmp_path, data):
    """The exporter's target: every script it makes holds only allowed names."""
    import flashinfer  # noqa: F401
    from flashinfer_native import registry

    if not _VOCABULARY:
        _VOCABULARY["names"] = fuzz_repro.learn_vocabulary(str(tmp_path / "vocabulary"))
    sys.addaudithook(fuzz_dumptree._Guard.hook)
    patterns = registry.allowed_patterns(fuzz_repro.ALLOW)
    fuzz_repro.test_one_input(data, str(tmp_path / "root"), _VOCABULARY["names"], patterns)


REPLAY = {
    "pt": replay_pt,
    "pickle": replay_pickle,
    "safetensors": replay_safetensors,
    "json": replay_json,
    "dumptree": replay_dumptree,
    "repro": replay_repro,
}
# The exporter's target starts from the dump-tree seeds.
SEEDS = {"repro": "dumptree"}
CASES = [
    pytest.param(target, os.path.join(FUZZ, kind, folder, name), id=f"{kind}/{target}/{name}")
    for kind in ("corpus", "regressions")
    for target in REPLAY
    for folder in [SEEDS.get(target, target) if kind == "corpus" else target]
    if os.path.isdir(os.path.join(FUZZ, kind, folder))
    for name in sorted(os.listdir(os.path.join(FUZZ, kind, folder)))
]


@pytest.mark.parametrize("target, path", CASES)
def test_fuzz_input_is_read_cleanly(tmp_path, target, path):
    REPLAY[target](tmp_path, read(path))


@pytest.mark.parametrize(
    "line",
    [
        "import subprocess",
        "from os import system",
        "from builtins import exec",
        "from replay_helpers import TouchOnInit",
        "exec('1')",
        "os.popen('x')",
        "__import__('os')",
        "wrapper.touch('x')",
        "from repro_runtime import HERE",
        "from repro_runtime import load as exec",
    ],
)
def test_exporter_target_fails_on_a_name_that_is_not_allowed(tmp_path, line):
    import flashinfer  # noqa: F401
    from flashinfer_native import registry
    from flashinfer_native.repro import reproducer

    if not _VOCABULARY:
        _VOCABULARY["names"] = fuzz_repro.learn_vocabulary(str(tmp_path / "vocabulary"))
    patterns = registry.allowed_patterns(fuzz_repro.ALLOW)
    writer = __import__("replay_helpers").DumpWriter(tmp_path / "dumps")
    wrapper = writer.construct(__import__("replay_helpers").SegmentSumWrapper, torch.zeros(4))
    writer.method(wrapper, "plan", torch.tensor([0, 1]), 1.0)
    source = reproducer(writer.dirs[-1], allow_modules=fuzz_repro.ALLOW)[2]
    fuzz_repro.check_script(source, _VOCABULARY["names"], patterns)  # the clean one passes
    anchor = "    args = parser.parse_args()\n"
    body = source.replace(anchor, f"{anchor}    {line}\n", 1)
    assert body != source
    with pytest.raises(fuzz_repro.BadScript):
        fuzz_repro.check_script(body, _VOCABULARY["names"], patterns)
