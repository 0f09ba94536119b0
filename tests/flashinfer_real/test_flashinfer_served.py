"""An installed FlashInfer (flashinfer-python 0.7.2.post1) served by the native core.

Every test compares against FlashInfer's own decorator in the same environment: the
same script run with FLASHINFER_NATIVE_LOGGING=1 (the installed start-up hook) and with
it off.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import run_json, run_python

TIMESTAMP = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]")
ADDRESS = re.compile(r" at 0x[0-9a-f]+>")
DUMPED_TO = re.compile(
    r"^(Dumped inputs to|Inputs dumped to|Dumped outputs to|Outputs dumped to): \S+"
)
# FlashInfer's own decorator adds this line: a note of its CUDA statistics kernel at
# level >= 5, which the core does not have to build.
FLASHINFER_ONLY_LINE = re.compile(r"^Failed to build api_log_stats kernel")


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    """census.py with the native core on and off (level 1), run side by side."""
    out = {}
    for native in (True, False):
        cwd = tmp_path_factory.mktemp("census")
        out[native], _ = run_json("census.py", cwd, native=native, level=1)
    return out


def test_every_decoration_of_flashinfer_made_a_native_wrapper(census):
    ours = census[True]
    scanned = ours["scanned_flashinfer_api"] + ours["scanned_experimental"]
    assert ours["scanned_flashinfer_api"] > 400
    assert ours["native_wrappers"] == scanned
    assert len(ours["apis"]) == scanned
    assert all(api["chain_has_native"] for api in ours["apis"].values())


def test_plain_flashinfer_api_decorations_are_the_native_wrapper_itself(census):
    ours, theirs = census[True]["apis"], census[False]["apis"]
    plain = [k for k, api in theirs.items() if api["type"] == "function"]
    plain = [k for k in plain if theirs[k]["decorator"] == "flashinfer_api"]
    not_native = [k for k in plain if ours[k]["type"] != "APIWrapper"]
    # the rest are wrapped again by FlashInfer's own decorators above @flashinfer_api
    assert len(plain) - len(not_native) > 300
    assert all(ours[k]["chain_has_native"] for k in not_native)


def test_signature_wrapped_fi_trace_fi_init_and_backend_checks_are_unchanged(census):
    def visible(api):
        return {k: v for k, v in api.items() if k not in ("type", "chain_has_native")}

    ours, theirs = census[True]["apis"], census[False]["apis"]
    assert ours.keys() == theirs.keys()
    assert {k: visible(v) for k, v in ours.items()} == {k: visible(v) for k, v in theirs.items()}
    assert sum(api["fi_trace"] for api in ours.values()) > 200
    assert sum(api["fi_init"] for api in ours.values()) > 100
    assert sum(api["is_backend_supported"] for api in ours.values()) > 50


def test_switch_off_imports_nothing_of_the_core(census):
    assert census[False]["native_imported"] is False
    assert census[False]["native_wrappers"] == 0


# ----------------------------------------------------------------------- one session


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """session.py at levels 1, 3, 5 and 10 with each decorator: {(level, native): dir}."""
    runs = {}
    for level in (1, 3, 5, 10):
        for native in (True, False):
            cwd = tmp_path_factory.mktemp(f"level{level}_{'native' if native else 'flashinfer'}")
            outcomes, _ = run_json("session.py", cwd, native=native, level=level)
            assert outcomes == {
                "rmsnorm": "AssertionError",
                "shuffle_matrix_a": "ok",
                "BatchMLAPagedAttentionWrapper": "ok",
            }
            runs[level, native] = cwd
    return runs


def log_text(cwd):
    with open(os.path.join(cwd, "log.txt")) as f:
        lines = f.read().splitlines()
    lines = [ADDRESS.sub(" at 0x?>", TIMESTAMP.sub("[TS]", line)) for line in lines]
    lines = [DUMPED_TO.sub(r"\1: DIR", line) for line in lines]  # times and pids differ
    return [line for line in lines if not FLASHINFER_ONLY_LINE.match(line)]


@pytest.mark.parametrize("level", [1, 3, 5, 10])
def test_log_text_is_the_one_flashinfer_writes(sessions, level):
    ours = log_text(sessions[level, True])
    assert ours == log_text(sessions[level, False])
    assert sum("FlashInfer API Call: rmsnorm" in line for line in ours) == 1


def test_level_5_log_has_statistics_of_the_failing_call(sessions):
    ours = log_text(sessions[5, True])
    start = ours.index("[TS] FlashInfer API Call: rmsnorm")
    assert any(line.strip().startswith("nan_count=") for line in ours[start : start + 30])


def dump_tree(cwd):
    """{api dir name without time and pid: (files, [metadata records])}."""
    tree = {}
    for path in glob.glob(os.path.join(cwd, "dumps", "*", "metadata.jsonl")):
        folder = os.path.dirname(path)
        name = re.sub(r"^\d{8}_\d{6}_\d{3}_pid\d+_", "", os.path.basename(folder))
        with open(path) as f:
            records = [json.loads(line) for line in f]
        tree[name] = (sorted(os.listdir(folder)), records)
    return tree


def test_level_10_dump_tree_has_flashinfers_shape(sessions):
    ours, theirs = dump_tree(sessions[10, True]), dump_tree(sessions[10, False])
    assert (
        sorted(ours)
        == sorted(theirs)
        == [
            "BatchMLAPagedAttentionWrapper.__init___call0001",
            "rmsnorm_call0001",
            "shuffle_matrix_a_call0001",
        ]
    )
    assert {k: v[0] for k, v in ours.items()} == {k: v[0] for k, v in theirs.items()}
    assert sorted(os.listdir(os.path.join(sessions[10, True], "dumps")))[-1] == "session.jsonl"


def key_shape(record):
    """The record's keys, with the keys of its object values (one level down)."""
    return {
        k: sorted(v) if isinstance(v, dict) and k not in ("input_metadata",) else None
        for k, v in record.items()
    }


def test_level_10_metadata_keys_are_flashinfers_plus_sequence_and_duration(sessions):
    ours, theirs = dump_tree(sessions[10, True]), dump_tree(sessions[10, False])
    for name, (_, their_records) in theirs.items():
        our_records = ours[name][1]
        for line, (mine, their) in enumerate(zip(our_records, their_records), 1):
            ours_only = {"sequence"} | ({"duration_us"} if line == 2 else set())
            assert set(mine) - set(their) == ours_only
            shape = key_shape(mine)
            for key in ours_only:
                del shape[key]
            assert shape == key_shape(their)
            for key in ("function_name", "module", "function_signature"):
                assert mine[key] == their[key]
            # ours marks a workspace recorded as shape and dtype only (docs/dump-format.md)
            scratch = {k for k, d in mine["tensor_details"].items() if d.pop("scratch", False)}
            assert scratch == ({"arg_1"} if name.startswith("BatchMLAPaged") else set())
            assert mine["tensor_details"] == their["tensor_details"]


def test_level_10_failing_call_is_recorded_with_exception_status(sessions):
    records = dump_tree(sessions[10, True])["rmsnorm_call0001"][1]
    assert [r["execution_status"] for r in records] == ["inputs_saved", "exception"]
    assert records[1]["exception"]["type"] == "AssertionError"
    assert records[1]["module"] == "flashinfer.norm"
    assert records[0]["tensor_info"]["input_tensor_keys"] == ["arg_0", "arg_1"]


def test_native_replay_of_the_session_reproduces_every_call(sessions, tmp_path):
    dumps = os.path.join(sessions[10, True], "dumps")
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "replay", "--dir", dumps, "--device", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BatchMLAPagedAttentionWrapper.__init__" in proc.stdout
    assert "rmsnorm" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "Summary: 3 passed, 0 failed/mismatch"


def test_flashinfers_replay_reads_a_native_dump(sessions, tmp_path):
    (folder,) = glob.glob(os.path.join(sessions[10, True], "dumps", "*shuffle_matrix_a*"))
    code = (
        "import json, sys\n"
        "from flashinfer.api_logging import replay_from_dump\n"
        "r = replay_from_dump(sys.argv[1], compare_outputs=True, device='cpu', run=True)\n"
        "print(json.dumps([r.get('comparison_match'), replay_from_dump.__module__]))\n"
    )
    proc = run_python(code.replace("sys.argv[1]", repr(folder)), tmp_path, native=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # FlashInfer's own replay (the hook only lends api_logging load_tensors without the switch)
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, "flashinfer.api_logging"]
