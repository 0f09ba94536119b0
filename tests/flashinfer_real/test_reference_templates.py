"""Every trace template of the real FlashInfer, checked end to end on CPU.

template_dumps.py records, with FlashInfer's own decorator at level 10, one call per
template that has an ``init``: inputs from the init, outputs from the template's
reference. A copy of the dump tree gets one output tensor of each checked call
perturbed. ``python -m flashinfer_native replay --against reference`` must report every
clean call as a match and every perturbed one as a MISMATCH naming that tensor.

A template works end to end when both hold. reference_census.json records how many
do and, for the rest, why not (docs/replay.md carries the table). The census test
fails when a template that worked stops working or the count drops; after a change
that makes more work, ``UPDATE_REFERENCE_CENSUS=1 make test-flashinfer`` rewrites it.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import HERE, run_json

CENSUS = os.path.join(HERE, "reference_census.json")
OK = "end to end"


def replay(root, cwd, modules):
    allow = [arg for m in sorted(modules) for arg in ("--allow-module", m)]
    report = os.path.join(cwd, os.path.basename(root) + ".json")
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "replay", root]
        + ["--against", "reference", "--json", report, *allow],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    with open(report) as f:
        results = json.load(f)["results"]
    return proc, {os.path.basename(r["dump_dir"]): r for r in results}


def perturb(path):
    """Turn the first output tensor of a dump into values no check accepts; its key."""
    tensors = torch.load(path, weights_only=True)
    key = sorted(tensors)[0]
    t = tensors[key]
    if t.dtype == torch.bool:
        tensors[key] = ~t
    elif t.is_floating_point():
        wide = t.float()
        tensors[key] = (-wide - 16 * (1 + wide.abs())).to(t.dtype)
    else:
        tensors[key] = -1 - t
    torch.save(tensors, path)
    return key


def without_paths(text):
    """A reason without the file paths in it (they differ from run to run)."""
    return re.sub(r"/[^\s:,()]+", "<path>", text)


def outcome(entry, clean, perturbed):
    """``end to end``, or why this template is not checked end to end."""
    return without_paths(judge(entry, clean, perturbed))


def judge(entry, clean, perturbed):
    if "reason" in entry:
        return entry["reason"]
    last = entry["dirs"][-1]
    first = clean[last]
    if first["status"] == "no_reference":
        return f"no reference: {first['reason']}"
    if first["status"] != "match":
        detail = first.get("message") or "; ".join(first.get("mismatches", []))
        return f"clean recording: {first['status']}: {detail}"
    second = perturbed[last]
    if second["status"] != "mismatch":
        return f"perturbed recording: {second['status']}"
    if not any(f"({entry['perturbed']})" in t for t in second.get("tensors", [])):
        return f"perturbed recording: mismatch names {second.get('tensors')}"
    return OK


@pytest.fixture(scope="module")
def census(module_tmp):
    run_json("template_dumps.py", module_tmp, native=False, level=10, timeout=900)
    with open(module_tmp / "manifest.json") as f:
        manifest = json.load(f)
    clean_root = str(module_tmp / "dumps")
    perturbed_root = str(module_tmp / "perturbed")
    shutil.copytree(clean_root, perturbed_root)
    for entry in manifest.values():
        if "reason" not in entry:
            path = os.path.join(perturbed_root, entry["dirs"][-1], "outputs.pt")
            entry["perturbed"] = perturb(path) if os.path.exists(path) else None
    # the modules of the APIs, which `import flashinfer` alone does not all import
    modules = {e["module"] for e in manifest.values() if "module" in e}
    _, clean = replay(clean_root, module_tmp, modules)
    _, perturbed = replay(perturbed_root, module_tmp, modules)
    outcomes = {label: outcome(e, clean, perturbed) for label, e in manifest.items()}
    return outcomes, manifest, clean_root, modules


def test_every_template_is_accounted_for(census):
    outcomes, manifest = census[:2]
    assert len(outcomes) >= 213
    assert all(isinstance(v, str) and v for v in outcomes.values())
    recorded = [label for label, e in manifest.items() if "reason" not in e]
    assert recorded, "no template dump was recorded"


def test_clean_dumps_match_and_perturbed_ones_name_the_tensor(census):
    outcomes = census[0]
    working = [label for label, v in outcomes.items() if v == OK]
    assert len(working) >= 60, sorted(outcomes.items())


def test_census_holds(census):
    outcomes = census[0]
    if os.environ.get("UPDATE_REFERENCE_CENSUS") == "1":
        data = {
            "flashinfer": "0.7.2.post1",
            "templates": len(outcomes),
            "end_to_end": sum(v == OK for v in outcomes.values()),
            "outcomes": dict(sorted(outcomes.items())),
            "apis": {label: e.get("api") for label, e in sorted(census[1].items())},
        }
        with open(CENSUS, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    with open(CENSUS) as f:
        recorded = json.load(f)
    was_ok = {label for label, v in recorded["outcomes"].items() if v == OK}
    now_ok = {label for label, v in outcomes.items() if v == OK}
    lost = {label: outcomes.get(label, "gone") for label in sorted(was_ok - now_ok)}
    assert not lost, f"templates no longer checked end to end: {lost}"
    assert len(now_ok) >= recorded["end_to_end"]


def test_exported_workloads_load_with_flashinfer_benchs_own_loader(census, tmp_path):
    from flashinfer_bench.bench.utils import load_safetensors
    from flashinfer_bench.data.trace_set import TraceSet

    _, manifest, clean_root, modules = census
    allow = [arg for m in sorted(modules) for arg in ("--allow-module", m)]
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "dumps", clean_root]
        + ["--export-bench", "bench", *allow],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    trace_set = TraceSet.from_path(str(tmp_path / "bench"))
    assert len(trace_set.workloads) >= 30, proc.stdout
    for name, traces in trace_set.workloads.items():
        definition = trace_set.definitions[name]
        for trace in traces:
            tensors = load_safetensors(definition, trace.workload, tmp_path / "bench")
            assert set(tensors) <= set(definition.inputs)
    # one workload's tensors are the recorded ones, bit for bit
    (rmsnorm,) = [e for e in manifest.values() if e["label"] == "rmsnorm"]
    recorded = torch.load(
        os.path.join(clean_root, rmsnorm["dirs"][-1], "inputs.pt"), weights_only=True
    )
    (name,) = [n for n in trace_set.workloads if n.startswith("rmsnorm_h")]
    (trace,) = trace_set.workloads[name]
    tensors = load_safetensors(trace_set.definitions[name], trace.workload, tmp_path / "bench")
    assert torch.equal(tensors["hidden_states"], recorded["kwarg_input"])
    assert torch.equal(tensors["weight"], recorded["kwarg_weight"])


def test_coverage_says_how_each_recorded_api_can_be_checked(census, tmp_path):
    _, _, clean_root, modules = census
    allow = [arg for m in sorted(modules) for arg in ("--allow-module", m)]
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "dumps", clean_root]
        + ["--coverage", "--json", *allow],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mirror"] is False and data["flashinfer"] == "0.7.2.post1"
    ways = {a["api"]: a["checked_by"] for a in data["apis"]}
    assert ways["rmsnorm"] == ["reference"]
    assert ways["top_k_sampling_from_probs"] == ["property"]
    assert ways["fused_add_rmsnorm"] == [
        "none: returns nothing (writes its outputs in place; a recording holds the inputs)"
    ]
    assert ways["BatchDecodeWithPagedKVCacheWrapper.plan"] == [
        "none: plan() configures the object (its run calls are checked)"
    ]
    assert ways["BatchDecodeWithPagedKVCacheWrapper.run"] == ["reference"]
