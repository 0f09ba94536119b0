"""replay --against reference on the mirror's own sessions (docs/replay.md): the demo's
calls match their templates' references with no kernel run, a perturbed output is a
MISMATCH naming the tensor, and the reference path goes through replay's gate."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from flashinfer_native import _C
from flashinfer_native.replay import replay_sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGURES = "configures the object; its arguments are used to check the object's later calls"


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = REPO
    env.update(extra)
    return env


def flashinfer_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "flashinfer", *map(str, args)],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def demo_dumps(tmp_path_factory):
    """The session `make demo` records (examples/demo.py --child at level 10)."""
    cwd = tmp_path_factory.mktemp("demo")
    subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "demo.py"), "--child"],
        cwd=cwd,
        env=child_env(FLASHINFER_LOGLEVEL="10", FLASHINFER_DUMP_DIR="dumps"),
        capture_output=True,
        check=True,
        timeout=300,
    )
    return cwd / "dumps"


def dump_of(root, name):
    (path,) = [p for p in sorted(os.listdir(root)) if f"_{name}_call" in p]
    return root / path


def test_demo_session_matches_its_references(demo_dumps, tmp_path):
    proc = flashinfer_cli(
        "replay", demo_dumps, "--against", "reference", "--json", "r.json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"Checking session from {demo_dumps} against the references on cpu..."
    assert lines[-1] == "Summary: 7 match, 0 mismatch, 2 no reference, 0 error"
    with open(tmp_path / "r.json") as f:
        report = json.load(f)
    outcomes = [(r["function_name"], r["status"], r.get("template")) for r in report["results"]]
    assert outcomes == [
        ("single_decode_with_kv_cache", "match", "single_decode"),
        ("single_prefill_with_kv_cache", "match", "single_prefill"),
        ("BatchDecodeWithPagedKVCacheWrapper.__init__", "no_reference", None),
        ("BatchDecodeWithPagedKVCacheWrapper.plan", "no_reference", None),
        ("BatchDecodeWithPagedKVCacheWrapper.run", "match", "gqa_paged_decode"),
        ("bmm_fp8", "match", "bmm_fp8"),
        ("nvfp4_quantize", "match", "nvfp4_quantize"),
        ("nvfp4_quantize", "match", "nvfp4_quantize"),
        ("mm_fp4", "match", "gemm_fp4"),
    ]
    assert report["results"][3]["reason"] == f"plan() {CONFIGURES}"
    # the paged run: its plan's page table (partial last pages) and the output and LSE
    run = report["results"][4]
    assert [d["tensor"] for d in run["differences"]] == ["output (result_0)", "lse (result_1)"]


def test_calls_the_filters_pull_in_are_marked_setup(demo_dumps, tmp_path):
    proc = flashinfer_cli(
        "replay", demo_dumps, "--against", "reference", "--include", "*.run", "--json", "r.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    init, plan, run = (
        dump_of(demo_dumps, f"BatchDecodeWithPagedKVCacheWrapper.{m}").name
        for m in ("__init__", "plan", "run")
    )
    assert proc.stdout.splitlines()[1:] == [
        f"[1] BatchDecodeWithPagedKVCacheWrapper.__init__ ({init}): ➖ no reference: "
        f"__init__() {CONFIGURES} [setup]",
        f"[2] BatchDecodeWithPagedKVCacheWrapper.plan ({plan}): ➖ no reference: "
        f"plan() {CONFIGURES} [setup]",
        f"[3] BatchDecodeWithPagedKVCacheWrapper.run ({run}): ✅ match (reference gqa_paged_decode)",
        "Summary: 1 match, 0 mismatch, 0 no reference, 0 error; 2 setup calls (2 no reference)",
    ]
    with open(tmp_path / "r.json") as f:
        report = json.load(f)
    assert [r.get("setup", False) for r in report["results"]] == [True, True, False]
    assert report["summary"]["total"] == 1
    assert report["summary"]["setup"] == {"no_reference": 2}


def test_a_perturbed_output_is_a_mismatch_naming_the_tensor(demo_dumps, tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(demo_dumps, root)
    outputs = dump_of(root, "BatchDecodeWithPagedKVCacheWrapper.run") / "outputs.pt"
    tensors = {k: v.clone() for k, v in _C.load_tensors(str(outputs)).items()}
    tensors["result_1"][2, 5] += 0.5  # one LSE value
    _C.save_tensors(str(outputs), tensors)
    proc = flashinfer_cli("replay", root, "--against", "reference", cwd=tmp_path)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    (at,) = [i for i, x in enumerate(lines) if "BatchDecodeWithPagedKVCacheWrapper.run" in x]
    assert lines[at].endswith("❌ MISMATCH (reference gqa_paged_decode)")
    assert lines[at + 1].startswith("    lse (result_1): max abs err 0.5")
    assert lines[at + 1].endswith("first differing index [2, 5]")
    assert lines[-1] == "Summary: 6 match, 1 mismatch, 2 no reference, 0 error"


def test_a_run_without_its_plan_says_what_is_missing(demo_dumps, tmp_path):
    run = dump_of(demo_dumps, "BatchDecodeWithPagedKVCacheWrapper.run")
    proc = flashinfer_cli("replay", run, "--against", "reference", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[1].endswith(
        "➖ no reference: the reference needs 'kv_indptr', which the recording lacks; a "
        "wrapper's plan() gives it: check the session root, which holds the object's plan call"
    )


def test_replay_sequence_against_reference_runs_no_kernel(demo_dumps, monkeypatch):
    import flashinfer

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel ran")

    for name in dir(flashinfer._kernels):
        if not name.startswith("_") and callable(getattr(flashinfer._kernels, name)):
            monkeypatch.setattr(flashinfer._kernels, name, no_kernel)
    results = replay_sequence(demo_dumps, against="reference")
    statuses = [r["reference"]["status"] for r in results]
    assert statuses.count("match") == 7 and statuses.count("no_reference") == 2
    assert results[0]["reference"]["method"] == "reference"
    with pytest.raises(ValueError, match="against='kernel': expected 'recording' or 'reference'"):
        replay_sequence(demo_dumps, against="kernel")


def test_a_dump_naming_an_unregistered_function_is_refused(demo_dumps, tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(demo_dumps, root)
    meta = dump_of(root, "bmm_fp8") / "metadata.jsonl"
    records = [json.loads(line) for line in meta.read_text().splitlines()]
    for record in records:
        record["module"], record["function_name"] = "os", "system"
    meta.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = flashinfer_cli("replay", root, "--against", "reference", cwd=tmp_path)
    assert proc.returncode == 1
    (line,) = [x for x in proc.stdout.splitlines() if "] system (" in x]
    assert "❌ Error: ReplayRefused: " in line
    assert "module 'os' is not an allowed module (allowed: flashinfer)" in line
    assert proc.stdout.splitlines()[-1] == "Summary: 6 match, 0 mismatch, 2 no reference, 1 error"


def test_hnd_paged_prefill_and_ragged_prefill_match(tmp_path):
    """The other wrappers: an HND paged cache as a (k, v) tuple, partial pages, causal and
    not; the ragged wrapper; fp4_quantize; mm_fp8 on a prepared weight."""
    script = """
import torch, flashinfer
torch.manual_seed(0)
f16 = dict(dtype=torch.float16)
ws = torch.empty(1 << 20, dtype=torch.uint8)
k = torch.randn(6, 2, 16, 64, **f16)  # HND: [pages, kv_heads, page_size, head_dim]
v = torch.randn(6, 2, 16, 64, **f16)
w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
for causal in (True, False):
    w.plan(torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 3, 6], dtype=torch.int32),
           torch.tensor([5, 1, 2, 0, 4, 3], dtype=torch.int32), torch.tensor([7, 16], dtype=torch.int32),
           4, 2, 64, 16, causal=causal)
    w.run(torch.randn(7, 4, 64, **f16), (k, v))
r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws)
r.plan(torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 9, 20], dtype=torch.int32),
       4, 2, 64, causal=True)
r.run(torch.randn(5, 4, 64, **f16), torch.randn(20, 2, 64, **f16), torch.randn(20, 2, 64, **f16))
flashinfer.fp4_quantize(torch.randn(3, 64, dtype=torch.bfloat16), torch.tensor([2.0]))
wt = (torch.randn(32, 256) * 8).to(torch.float8_e4m3fn)
b = flashinfer.prepare_low_latency_gemm_weights(wt)
flashinfer.mm_fp8((torch.randn(4, 256) * 8).to(torch.float8_e4m3fn), b, torch.tensor(0.01))
"""
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=child_env(FLASHINFER_LOGLEVEL="10", FLASHINFER_DUMP_DIR="dumps"),
        check=True,
        timeout=300,
    )
    results = replay_sequence(tmp_path / "dumps", against="reference")
    got = [(r["metadata"]["function_name"], r["reference"]["status"]) for r in results]
    runs = [status for name, status in got if not name.endswith(("__init__", "plan"))]
    assert runs == ["match"] * 6, got
    assert torch.get_default_device() == torch.device("cpu")


def test_coverage_of_the_demo_session(demo_dumps, tmp_path):
    proc = flashinfer_cli("dumps", demo_dumps, "--coverage", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"Coverage of {demo_dumps} with flashinfer ")
    assert lines[0].endswith(" (this repository's mirror):")
    rows = [line.split() for line in lines[2:-1]]
    assert rows[4] == [
        "BatchDecodeWithPagedKVCacheWrapper.run",
        "1",
        "mirror",
        "kernel,",
        "reference",
    ]
    assert rows[3] == ["BatchDecodeWithPagedKVCacheWrapper.plan", "1", "mirror", "kernel"]
    assert rows[6] == ["nvfp4_quantize", "2", "mirror", "kernel,", "reference"]
    assert lines[-1] == "9 calls of 8 APIs: 9 mirror kernel, 7 reference, 0 property, 0 none"


def test_coverage_and_export_bench_read_one_calls_directory_as_a_session(demo_dumps, tmp_path):
    """Both take the session model (calls.load_session): one call's directory is a session
    of one call, and a directory that holds no dump is refused."""
    one = dump_of(demo_dumps, "single_decode_with_kv_cache")
    proc = flashinfer_cli("dumps", one, "--coverage", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2].split() == [
        "single_decode_with_kv_cache", "1", "mirror", "kernel,", "reference"
    ]  # fmt: skip
    assert proc.stdout.splitlines()[-1] == (
        "1 calls of 1 APIs: 1 mirror kernel, 1 reference, 0 property, 0 none"
    )
    proc = flashinfer_cli("dumps", one, "--export-bench", "bench", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        "Wrote 1 workloads of 1 definitions to bench (flashinfer-bench 0.1.2 dataset layout)"
    )
    (tmp_path / "empty").mkdir()
    for option in (["--coverage"], ["--export-bench", "out"]):
        proc = flashinfer_cli("dumps", tmp_path / "empty", *option, cwd=tmp_path)
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [
            f"Error: {tmp_path / 'empty'}: holds no dump (no metadata.jsonl in it or in a "
            "sub-directory, no session.jsonl); pass a dump root (FLASHINFER_DUMP_DIR) or one "
            "call's directory"
        ]


def test_export_bench_writes_the_dataset_layout(demo_dumps, tmp_path):
    proc = flashinfer_cli("dumps", demo_dumps, "--export-bench", "bench", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "Wrote 4 workloads of 4 definitions to bench (flashinfer-bench 0.1.2 dataset layout)"
    )
    assert "quantized has dtype 'uint8', which flashinfer-bench lacks" in lines[-2]
    name = "gqa_paged_decode_h8_kv2_d128_ps16"
    with open(tmp_path / "bench" / "definitions" / "gqa_paged" / f"{name}.json") as f:
        definition = json.load(f)
    assert definition["reference"].endswith(
        "\n\ndef run(*args, **kwargs):\n    return _gqa_paged_decode_reference(*args, **kwargs)\n"
    )
    with open(tmp_path / "bench" / "workloads" / "gqa_paged" / f"{name}.jsonl") as f:
        (trace,) = [json.loads(line) for line in f]
    assert trace["definition"] == name and trace["solution"] is None
    assert trace["workload"]["axes"] == {
        "batch_size": 4,
        "num_pages": 52,
        "len_indptr": 5,
        "num_kv_indices": 52,
    }
    inputs = trace["workload"]["inputs"]
    assert inputs["sm_scale"] == {"type": "scalar", "value": 1 / math.sqrt(128)}
    blob = _C.load_tensors(str(tmp_path / "bench" / inputs["q"]["path"]))
    recorded = _C.load_tensors(
        str(dump_of(demo_dumps, "BatchDecodeWithPagedKVCacheWrapper.run") / "inputs.pt")
    )
    cache = recorded["arg_2"]  # [pages, 2, page_size, kv_heads, head_dim]
    assert torch.equal(blob["q"], recorded["arg_1"])
    assert torch.equal(blob["k_cache"], cache[:, 0]) and torch.equal(blob["v_cache"], cache[:, 1])
    plan = _C.load_tensors(
        str(dump_of(demo_dumps, "BatchDecodeWithPagedKVCacheWrapper.plan") / "inputs.pt")
    )
    assert torch.equal(blob["kv_indices"], plan["arg_2"])
    again = flashinfer_cli("dumps", demo_dumps, "--export-bench", "bench", cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.strip() == "Error: bench: the output folder exists and is not empty"


@pytest.mark.parametrize("bad", ["gqa\n", "a/b", "", "x" * 201])
def test_a_definition_name_that_is_not_one_file_name_is_skipped(bad):
    """The definition's name and op_type become file names under OUT: fi_trace builds
    them from the call's values, so one that is not a plain name (a final newline
    included, which a ``$``-anchored pattern lets through) skips the call."""
    from flashinfer_native import bench_export

    def ref(q):
        return q

    class Template:
        reference = staticmethod(ref)
        inputs = {}

    class Api:
        @staticmethod
        def fi_trace(**kwargs):
            return {
                "name": bad,
                "op_type": "gemm",
                "reference": "def ref(q): return q",
                "inputs": {},
                "outputs": {},
                "axes": {},
            }

    with pytest.raises(bench_export._Skip) as info:
        bench_export._bench_definition(Template, Api, reference_args())
    assert str(info.value) == f"definition name {bad!r} is not a file name"


def reference_args():
    from flashinfer_native.reference import CallArguments

    return CallArguments({}, {}, [])
