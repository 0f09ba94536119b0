"""``flashinfer diff``: matching two sessions call by call and finding the first divergence."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import replay_helpers as h
import torch
import triage_helpers as t
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native.diff import diff_sessions, tensor_difference


def session(root, flashinfer_style=False, alpha=2.0, extra_call=False, bump=0.0):
    """scale_add, a wrapper's __init__/plan/run, reduce_rows: deterministic values."""
    writer = h.DumpWriter(root, flashinfer_style=flashinfer_style)
    x = torch.arange(12.0).reshape(3, 4)
    writer.call(h.scale_add, x, torch.ones(3, 4), alpha=alpha)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.empty(64, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2, 3]), 0.5)
    if extra_call:
        writer.call(h.concat, [torch.ones(2), torch.zeros(1)])
    writer.method(wrapper, "run", x + bump)
    writer.call(h.reduce_rows, x)
    return writer


def invoke(*args, prog_name="flashinfer"):
    return CliRunner().invoke(cli, ["diff", *map(str, args)], prog_name=prog_name)


def test_identical_sessions_exit_0_and_say_nothing_diverged(tmp_path):
    session(tmp_path / "a")
    session(tmp_path / "b")
    result = invoke(tmp_path / "a", tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"Comparing A {tmp_path / 'a'} (5 calls) with B {tmp_path / 'b'} (5 calls), "
        "matched by sequence",
        "Summary: 5 matched calls, 5 same, 0 diverged; 0 only in A, 0 only in B",
    ]


def test_first_divergence_names_the_call_and_the_max_differences(tmp_path):
    a = session(tmp_path / "a")
    b = session(tmp_path / "b", bump=0.25)
    result = invoke(tmp_path / "a", tmp_path / "b")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    reason = (
        "    input arg_1: max abs diff 0.25, max rel diff 1, 12 of 12 elements outside "
        "rtol=0.001, atol=0.001"
    )
    assert lines[1:3] == ["[4] SegmentSumWrapper.run: ❌ Diverged", reason]
    at = lines.index("First divergence: [4] SegmentSumWrapper.run")
    assert lines[at + 1 : at + 3] == [
        f"    A: {os.path.join(tmp_path / 'a', os.path.basename(a.dirs[3]))}",
        f"    B: {os.path.join(tmp_path / 'b', os.path.basename(b.dirs[3]))}",
    ]
    assert lines[at + 3] == reason
    assert lines[at + 5] == f"Reproduce it: flashinfer repro {lines[at + 1][7:]} -o repro_a"
    assert lines[-1] == "Summary: 5 matched calls, 4 same, 1 diverged; 0 only in A, 0 only in B"


@pytest.mark.parametrize("prog", ["flashinfer-native", "python -m flashinfer_native"])
def test_repro_hint_names_the_command_as_it_was_run(tmp_path, prog):
    # next to flashinfer-python, "flashinfer" is FlashInfer's own command, without repro
    a = session(tmp_path / "a")
    session(tmp_path / "b", bump=0.25)
    result = invoke(tmp_path / "a", tmp_path / "b", prog_name=prog)
    where = os.path.join(tmp_path / "a", os.path.basename(a.dirs[3]))
    assert f"Reproduce it: {prog} repro {where} -o repro_a" in result.output.splitlines()


def test_differences_within_tolerance_do_not_diverge(tmp_path):
    session(tmp_path / "a")
    session(tmp_path / "b", bump=0.25)
    assert invoke(tmp_path / "a", tmp_path / "b", "--atol", "0.3").exit_code == 0


def test_changed_plain_argument_is_reported_as_an_input_difference(tmp_path):
    session(tmp_path / "a")
    session(tmp_path / "b", alpha=3.0)
    result = invoke(tmp_path / "a", tmp_path / "b")
    assert result.exit_code == 1
    assert "    input kwarg_alpha: 2.0 vs 3.0" in result.output
    assert "First divergence: [1] scale_add" in result.output


def test_flashinfer_style_sessions_match_by_api_occurrence(tmp_path):
    session(tmp_path / "a", flashinfer_style=True)
    b = session(tmp_path / "b", flashinfer_style=True, extra_call=True)
    header, entries = diff_sessions(tmp_path / "a", tmp_path / "b")
    entries = list(entries)
    assert header["match"] == "occurrence"
    assert [(e["api"], e["status"]) for e in entries] == [
        ("scale_add", "same"),
        ("SegmentSumWrapper.__init__", "same"),
        ("SegmentSumWrapper.plan", "same"),
        ("concat", "only_b"),
        ("SegmentSumWrapper.run", "same"),
        ("reduce_rows", "same"),
    ]
    assert entries[3]["b"]["dir"] == os.path.basename(b.dirs[3])


def test_sequence_matched_sessions_report_a_different_api_at_the_same_position(tmp_path):
    session(tmp_path / "a")
    session(tmp_path / "b", extra_call=True)
    _, entries = diff_sessions(tmp_path / "a", tmp_path / "b")
    entries = list(entries)
    assert entries[3]["status"] == "diverged"
    assert entries[3]["reasons"] == ["API SegmentSumWrapper.run vs concat"]
    assert [e["status"] for e in entries][-1] == "only_b"


def test_status_difference_diverges(tmp_path):
    wa = h.DumpWriter(tmp_path / "a")
    wa.call(h.check_positive, torch.ones(2))
    wb = h.DumpWriter(tmp_path / "b")
    with pytest.raises(ValueError):
        wb.call(h.check_positive, torch.ones(2) - 3)
    _, entries = diff_sessions(tmp_path / "a", tmp_path / "b")
    (entry,) = list(entries)
    assert entry["reasons"][0] == "status completed vs exception"


def test_scratch_buffers_are_compared_but_never_diverge(tmp_path):
    wa = h.DumpWriter(tmp_path / "a")
    wa.construct(h.SegmentSumWrapper, torch.zeros(16))
    wb = h.DumpWriter(tmp_path / "b")
    wb.construct(h.SegmentSumWrapper, torch.full((16,), 7.0))
    _, entries = diff_sessions(tmp_path / "a", tmp_path / "b")
    (entry,) = list(entries)
    assert entry["status"] == "same"
    (workspace,) = entry["inputs"]
    assert workspace["scratch"] is True and workspace["max_abs"] == 7.0


def test_json_report_holds_every_call_and_the_first_divergence(tmp_path):
    session(tmp_path / "a")
    session(tmp_path / "b", bump=0.25)
    report = tmp_path / "diff.json"
    assert invoke(tmp_path / "a", tmp_path / "b", "--json", report).exit_code == 1
    data = json.loads(report.read_text())
    assert [c["status"] for c in data["calls"]] == ["same"] * 3 + ["diverged", "same"]
    assert data["first_divergence"]["index"] == 4
    outputs = {o["key"]: o for o in data["calls"][3]["outputs"]}
    # segments [0, 2) and [2, 3) of x + 0.25, summed and halved: 0.25 and 0.125 more
    assert outputs["result"]["max_abs"] == 0.25
    assert outputs["result"]["max_rel"] == pytest.approx(0.25 / 2.25)  # column 0, B = 2.25
    assert data["summary"] == {"matched": 5, "same": 4, "diverged": 1, "only_a": 0, "only_b": 0}


def test_tensor_difference_is_relative_to_b_and_counts_nan_mismatches():
    a = torch.tensor([1.0, 2.0, float("nan"), float("nan"), 0.0])
    b = torch.tensor([1.0, 4.0, float("nan"), 1.0, 0.0])
    d = tensor_difference(a, b)
    assert (d["max_abs"], d["max_rel"], d["mismatched"], d["diverged"]) == (2.0, 0.5, 2, True)


def test_tensor_difference_of_integers_is_bit_exact():
    d = tensor_difference(torch.tensor([1, 5, 7]), torch.tensor([1, 5, 8]), atol=10)
    assert (d["max_abs"], d["mismatched"]) == (1.0, 1)


def test_tensor_difference_reports_shape_and_dtype_changes():
    d = tensor_difference(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.float16))
    assert d["diverged"] and d["reason"] == "torch.float32 (2, 3) vs torch.float16 (3, 2)"


def test_diff_never_imports_modules_named_by_the_dumps(tmp_path):
    for side in ("a", "b"):
        writer = h.DumpWriter(tmp_path / side)
        writer.call(h.scale_add, torch.ones(2), torch.ones(2))
        meta = os.path.join(writer.dirs[0], "metadata.jsonl")
        with open(meta) as f:
            text = f.read().replace('"replay_helpers"', '"planted_module"')
        with open(meta, "w") as f:
            f.write(text)
    planted = tmp_path / "planted_module.py"
    planted.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert invoke(tmp_path / "a", tmp_path / "b").exit_code == 0
    finally:
        sys.path.remove(str(tmp_path))
    assert not (tmp_path / "imported").exists()
    assert "planted_module" not in sys.modules


def test_sessions_recorded_by_the_recorder_with_the_same_seed_match(tmp_path_factory, tmp_path):
    a = t.mirror_session(tmp_path_factory, seed=0)
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    result = invoke(a, b)
    assert result.exit_code == 0, result.output
    assert "0 diverged; 0 only in A, 0 only in B" in result.output


def test_sessions_recorded_with_other_inputs_diverge_at_the_first_call(tmp_path_factory):
    a = t.mirror_session(tmp_path_factory, seed=0)
    b = t.mirror_session(tmp_path_factory, seed=1)
    result = invoke(a, b)
    assert result.exit_code == 1
    assert "First divergence: [1] single_decode_with_kv_cache" in result.output


MEMORY_CHILD = """
import resource, sys, time, weakref
import flashinfer_native.diff as diff
from flashinfer_native import dumpdir

alive, peak = [0], [0]
original = dumpdir.load_tensor_file

def counting_loader(path):
    tensors = original(path)
    for tensor in tensors.values():
        alive[0] += 1
        weakref.finalize(tensor, lambda: alive.__setitem__(0, alive[0] - 1))
    peak[0] = max(peak[0], alive[0])
    return tensors

dumpdir.load_tensor_file = counting_loader
header, entries = diff.diff_sessions(sys.argv[1], sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
count = sum(1 for e in entries if e["status"] == "same")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(count, peak[0], (after - before) // 1024, time.perf_counter() - start, file=sys.stderr)
print(count, peak[0], (after - before) // 1024)
"""


def test_diff_of_thousands_of_calls_keeps_one_pair_of_tensors_alive(tmp_path):
    calls = 2000
    a = t.record(
        tmp_path / "a",
        f"""
        x = torch.randn(64, 64)
        for i in range({calls}):
            h.scale_add(x, x, alpha=float(i))
        """,
        FLASHINFER_DUMP_MAX_COUNT=str(calls),
    )
    shutil.copytree(a, tmp_path / "b")
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEMORY_CHILD), a, str(tmp_path / "b")],
        env=t.clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    same, peak_alive, rss_growth_mb = map(int, r.stdout.split())
    assert same == calls
    assert peak_alive <= 4  # two inputs per side; the 3 x 16 KB x 2000 x 2 = 384 MB never add up
    assert rss_growth_mb < 64
