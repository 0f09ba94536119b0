"""Scratch parameters (workspaces) at level 10 (docs/dump-format.md#scratch-tensors): recorded
as shape and dtype only, read back as fresh zeros by replay, diff, report and repro; recorded
whole with FLASHINFER_DUMP_SCRATCH=1; the encoding is untrusted input."""

import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from serving_loop import record

from flashinfer_native import _C
from flashinfer_native.dumpdir import read_metadata
from flashinfer_native.replay import classify, replay_from_dump, replay_sequence
from flashinfer_native.repro import export_repro

WORKSPACE = 16 << 20  # 16 MiB, as the session below allocates

# a decode session whose wrapper holds a 16 MiB workspace filled with a pattern
SESSION = f"""
ws = (torch.arange({WORKSPACE}, dtype=torch.int64) % 251).to(torch.uint8)
serving_loop.run(steps=2, layers=2, workspace=ws)
"""


def call_dir(root, api):
    (found,) = [
        d for d in glob.glob(os.path.join(root, "*")) if d.endswith("_" + api + "_call0001")
    ]
    return found


def zip_sizes(path):
    """{name in the archive without its folder: uncompressed size} of a .pt file."""
    with zipfile.ZipFile(path) as z:
        return {i.filename.split("/", 1)[1]: i.file_size for i in z.infolist()}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return record(tmp_path_factory.mktemp("scratch"), SESSION)


def test_the_workspace_is_recorded_as_shape_and_dtype_only(session):
    init = call_dir(session, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    last = read_metadata(init)[-1]
    assert last["tensor_details"]["arg_1"] == {
        "shape": [WORKSPACE],
        "dtype": "torch.uint8",
        "stride": [1],
        "device": "cpu",
        "scratch": True,
    }
    assert last["tensor_info"]["input_tensor_keys"] == ["arg_1"]
    assert last["tensor_info"]["input_size_bytes"] == 1  # one zero of uint8
    inputs = os.path.join(init, "inputs.pt")
    assert zip_sizes(inputs)["data/0"] == 1
    assert os.path.getsize(inputs) < 4096
    # torch's own loader reads a zero broadcast to the workspace's shape
    view = torch.load(inputs, weights_only=True)["arg_1"]
    assert view.shape == (WORKSPACE,) and view.stride() == (0,) and view.dtype == torch.uint8
    assert view.untyped_storage().nbytes() == 1 and int(view[0]) == 0


def test_the_session_replays_bit_exact_with_a_fresh_zero_workspace(session):
    results = replay_sequence(str(session), device="cpu")
    assert [classify(r) for r in results] == ["passed"] * len(results)
    assert len(results) == 1 + 2 * 3  # __init__, then a plan and two runs a step
    runs = [r for r in results if r["metadata"]["function_name"].endswith(".run")]
    assert len(runs) == 4
    for r in runs:
        assert torch.equal(r["execution_result"], r["expected_result"])
    init = call_dir(session, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    ws = replay_from_dump(init, device="cpu")["args"][1]
    assert ws.shape == (WORKSPACE,) and ws.is_contiguous() and ws.dtype == torch.uint8
    assert ws.untyped_storage().nbytes() == WORKSPACE and not ws.any()


def test_the_option_records_the_workspace_whole(tmp_path):
    root = record(tmp_path, SESSION, FLASHINFER_DUMP_SCRATCH="1")
    init = call_dir(root, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    last = read_metadata(init)[-1]
    assert "scratch" not in last["tensor_details"]["arg_1"]
    assert last["tensor_info"]["input_size_bytes"] == WORKSPACE
    inputs = os.path.join(init, "inputs.pt")
    assert zip_sizes(inputs)["data/0"] == WORKSPACE
    ws = torch.load(inputs, weights_only=True)["arg_1"]
    assert torch.equal(ws, (torch.arange(WORKSPACE, dtype=torch.int64) % 251).to(torch.uint8))
    assert all(classify(r) == "passed" for r in replay_sequence(str(root), device="cpu"))


def test_safetensors_leave_the_scratch_out_of_the_file_and_replay(tmp_path):
    root = record(tmp_path, SESSION, FLASHINFER_DUMP_SAFETENSORS="1")
    init = call_dir(root, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    assert _C.load_tensors(os.path.join(init, "inputs.safetensors")) == {}
    assert read_metadata(init)[-1]["tensor_details"]["arg_1"]["scratch"] is True
    results = replay_sequence(str(root), device="cpu")
    assert [classify(r) for r in results] == ["passed"] * 7


def test_both_rings_record_the_workspace_as_shape_and_dtype(tmp_path):
    memory = record(
        tmp_path, SESSION, name="memory", FLASHINFER_DUMP_RING="64", FLASHINFER_DUMP_ON="exit"
    )
    init = call_dir(memory, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    with open(os.path.join(init, "inputs.chunks.json")) as f:
        manifest = json.load(f)["tensors"]["arg_1"]
    assert manifest["shape"] == [WORKSPACE] and manifest["stride"] == [0]
    assert manifest["span_bytes"] == 1
    assert [classify(r) for r in replay_sequence(str(memory), device="cpu")] == ["passed"] * 7
    disk = record(tmp_path, SESSION, name="disk", FLASHINFER_DUMP_RING="64")
    init = call_dir(disk, "BatchDecodeWithPagedKVCacheWrapper.__init__")
    assert zip_sizes(os.path.join(init, "inputs.pt"))["data/0"] == 1
    assert [classify(r) for r in replay_sequence(str(disk), device="cpu")] == ["passed"] * 7


def test_repro_makes_the_workspace_as_zeros_and_passes(session, tmp_path):
    run = call_dir(session, "BatchDecodeWithPagedKVCacheWrapper.run")
    out = tmp_path / "repro"
    done = export_repro(run, out)
    assert done["tensor_bytes"] < 1 << 20
    with open(out / "repro.py") as f:
        script = f.read()
    assert (
        f"torch.zeros(({WORKSPACE},), dtype=torch.uint8, device=device),"
        "  # scratch: made afresh, its recorded bytes are not needed"
    ) in script
    r = subprocess.run(
        [sys.executable, "repro.py"], cwd=out, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


HOSTILE = [
    (
        {"shape": [1 << 62]},
        "scratch tensor of 4611686018427387904 bytes is larger than the 1099511627776 a reader makes",
    ),
    (
        {"shape": [1 << 20, 1 << 21]},
        "scratch tensor of 2199023255552 bytes is larger than the 1099511627776 a reader makes",
    ),
    (
        {"shape": [-4]},
        "scratch tensor shape [-4] is not a list of at most 64 non-negative integers",
    ),
    ({"shape": "16"}, "scratch tensor shape 16 is not a list of at most 64 non-negative integers"),
    ({"shape": [1] * 65}, "is not a list of at most 64 non-negative integers"),
    (
        {"shape": [True]},
        "scratch tensor shape [True] is not a list of at most 64 non-negative integers",
    ),
    ({"dtype": "torch.bogus"}, "scratch tensor has an unknown torch dtype 'torch.bogus'"),
    ({"dtype": "os.system"}, "scratch tensor has an unknown torch dtype 'os.system'"),
    ({"dtype": None}, "scratch tensor has an unknown torch dtype 'None'"),
]


@pytest.mark.parametrize("change,message", HOSTILE)
def test_a_hostile_scratch_entry_is_refused_with_one_line(session, tmp_path, change, message):
    import shutil

    root = tmp_path / "s"
    shutil.copytree(session, root)
    init = call_dir(str(root), "BatchDecodeWithPagedKVCacheWrapper.__init__")
    path = os.path.join(init, "metadata.jsonl")
    with open(path) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        r["tensor_details"]["arg_1"].update(change)
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError) as exc:
        replay_from_dump(init, device="cpu")
    text = str(exc.value)
    assert "\n" not in text and message in text
    assert text.startswith(f"{path}: tensor_details['arg_1']: scratch tensor")
    results = replay_sequence(str(root), device="cpu")
    assert results[0]["error"] == f"ValueError: {text}"
    r = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "replay", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and message in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_the_documented_table_is_the_cores():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "dump-format.md")) as f:
        text = f.read()
    section = text.split("### The table of scratch parameters")[1].split("\n## ")[0]
    documented = []
    for line in section.splitlines():
        if line.startswith("| `"):
            api, params = line.strip("|").split("|")
            for item in params.split(","):
                name, rule = item.strip().split(" (", 1)
                documented.append((api.strip().strip("`"), name.strip("`"), rule.rstrip(")")))
    assert documented == list(_C.SCRATCH_PARAMETERS)


def test_a_broadcast_zero_of_a_large_workspace_loads_and_a_larger_one_is_refused(tmp_path):
    """vLLM's 128 MiB workspace is a view of 2^27 elements over one stored element: the
    readers take a broadcast of one element up to 2^34 elements, and no further."""
    path = str(tmp_path / "inputs.pt")
    _C.save_tensors(path, {"arg_1": torch.zeros((), dtype=torch.uint8).expand(128 << 20)})
    (view,) = _C.load_tensors(path).values()
    assert view.shape == (128 << 20,) and view.stride() == (0,)
    _C.save_tensors(path, {"arg_1": torch.zeros((), dtype=torch.uint8).expand(1 << 35)})
    with pytest.raises(ValueError) as exc:
        _C.load_tensors(path)
    assert str(exc.value) == (
        f"{path}: tensor 'arg_1': a view of 34359738368 elements over a storage of 1 elements "
        "is refused (a view may repeat stored elements up to 64 times plus 16777216, and hold "
        "at most 17179869184 elements)"
    )


def test_report_shows_the_scratch_and_diff_never_compares_it(session, tmp_path):
    from flashinfer_native.diff import diff_sessions
    from flashinfer_native.report import write_report

    out = tmp_path / "report.html"
    write_report(str(session), out)
    page = out.read_text()
    assert (
        "<td>input</td><td><code>float_workspace_buffer (arg_1)</code></td><td>[16777216]</td>"
        '<td>uint8</td><td class="stats">scratch: recorded as shape and dtype only</td>'
    ) in page
    _, entries = diff_sessions(session, session)
    init = next(e for e in entries if e["inputs"] and e["inputs"][0]["key"] == "arg_1")
    assert init["inputs"] == [{"key": "arg_1", "scratch": True, "diverged": False}]
