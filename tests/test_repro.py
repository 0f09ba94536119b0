"""``flashinfer repro``: exported reproducers run alone and judge against the recording."""

import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import replay_helpers as h
import torch
import triage_helpers as t
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native import repro_runtime
from flashinfer_native.repro import export_repro, parse_signature

ALLOW = ["replay_helpers"]


@pytest.fixture(scope="module")
def mirror_session(tmp_path_factory):
    """Every mirror API recorded once at level 10."""
    return t.mirror_session(tmp_path_factory)


def run_fresh(folder, tmp_path, *args, env=None):
    """Copy an exported folder to a fresh directory and run its repro.py there."""
    fresh = tmp_path / "fresh"
    shutil.copytree(folder, fresh / "case")
    return subprocess.run(
        [sys.executable, "repro.py", *args],
        cwd=fresh / "case",
        env=env or t.clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def edit_metadata(dump_dir, old, new):
    """Replace text in a dump's metadata.jsonl (a hostile or damaged dump)."""
    meta = os.path.join(dump_dir, "metadata.jsonl")
    with open(meta) as f:
        text = f.read()
    with open(meta, "w") as f:
        f.write(text.replace(old, new))


def script_of(folder):
    with open(os.path.join(folder, "repro.py")) as f:
        return f.read()


def test_exported_script_of_every_mirror_api_passes_in_a_fresh_directory(mirror_session, tmp_path):
    folders = {}
    for api in t.MIRROR_APIS:
        out = tmp_path / "exports" / api
        export_repro(t.dump_of(mirror_session, api, 0), out)
        folders[api] = tmp_path / "fresh" / api
        shutil.copytree(out, folders[api])
    results = t.run_scripts(folders.values())
    for api, folder in folders.items():
        status, output = results[str(folder)]
        assert status == 0, output
        assert f"Reproducing {api} on cpu" in output
        assert "PASS: the result matches the recording" in output


def test_script_passes_arguments_by_name_and_loads_with_torch_only(mirror_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(mirror_session, "single_decode_with_kv_cache"), out)
    text = script_of(out)
    assert "from flashinfer.decode import single_decode_with_kv_cache" in text
    assert "        q=inputs['arg_0'],  # torch.float16 (8, 64)" in text
    assert "        logits_soft_cap=30.0," in text
    assert "from repro_runtime import compare, load" in text
    assert "pickle" not in text and "flashinfer_native" not in text
    with open(out / "repro_runtime.py") as f:
        runtime = f.read()
    with open(repro_runtime.__file__) as f:
        assert runtime == f.read()  # the package's module, copied as it is
    assert "torch.load(path, map_location=device, weights_only=True)" in runtime
    assert sorted(os.listdir(out)) == ["data", "repro.py", "repro_runtime.py"]
    assert sorted(os.listdir(out / "data")) == [
        "1_single_decode_with_kv_cache_inputs.pt",
        "1_single_decode_with_kv_cache_metadata.jsonl",
        "1_single_decode_with_kv_cache_outputs.pt",
    ]


def test_enum_arguments_are_written_as_members_of_their_class(mirror_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(mirror_session, "nvfp4_quantize"), out)
    text = script_of(out)
    assert "from flashinfer.fp4_quantization import SfLayout, nvfp4_quantize" in text
    assert "        sfLayout=SfLayout.layout_128x4," in text


def test_wrapper_run_exports_its_init_and_plan_chain(mirror_session, tmp_path):
    out = tmp_path / "repro"
    done = export_repro(t.dump_of(mirror_session, "BatchPrefillWithRaggedKVCacheWrapper.run"), out)
    assert done["steps"] == [
        "BatchPrefillWithRaggedKVCacheWrapper.__init__",
        "BatchPrefillWithRaggedKVCacheWrapper.plan",
        "BatchPrefillWithRaggedKVCacheWrapper.run",
    ]
    text = script_of(out)
    assert "    wrapper = BatchPrefillWithRaggedKVCacheWrapper(" in text
    assert "    wrapper.plan(" in text
    assert "    result = wrapper.run(" in text


def test_workspace_buffers_are_made_afresh_not_shipped(mirror_session, tmp_path):
    out = tmp_path / "repro"
    done = export_repro(t.dump_of(mirror_session, "BatchDecodeWithPagedKVCacheWrapper.run"), out)
    assert "1_init_inputs.pt" not in os.listdir(out / "data")
    assert done["tensor_bytes"] < 1 << 20  # the 1 MB workspace stays behind
    assert (
        "        float_workspace_buffer=torch.zeros((1048576,), dtype=torch.int8, device=device),"
        "  # scratch: made afresh, its recorded bytes are not needed"
    ) in script_of(out)


MIDDLE_OF_SESSION = """
import flashinfer
page = 4
cache = torch.randn(6, 2, page, 2, 64).to(torch.float16)
ws = torch.zeros(1 << 20, dtype=torch.int8)
w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws)
other = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws)
other.plan(torch.tensor([0, 6], dtype=torch.int32), torch.arange(6, dtype=torch.int32),
           torch.tensor([1], dtype=torch.int32), 2, 2, 64, page)
w.plan(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32),
       torch.tensor([4, 2], dtype=torch.int32), 4, 2, 64, page)
for _ in range(2):
    w.run(torch.randn(2, 4, 64).to(torch.float16), cache)
w.plan(torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([5, 4, 3, 2, 1, 0], dtype=torch.int32),
       torch.tensor([3, 1], dtype=torch.int32), 4, 2, 64, page, logits_soft_cap=10.0)
w.run(torch.randn(2, 4, 64).to(torch.float16), cache)
other.run(torch.randn(1, 2, 64).to(torch.float16), cache)
w.run(torch.randn(2, 4, 64).to(torch.float16), cache)
"""


@pytest.fixture(scope="module")
def middle_session(tmp_path_factory):
    """Two wrappers, two plans of one of them, runs between and after the plans."""
    return t.record(tmp_path_factory.mktemp("middle") / "dumps", MIDDLE_OF_SESSION)


def plan_inputs_equal(exported, plan_dir):
    got = torch.load(exported, weights_only=True)
    want = torch.load(os.path.join(plan_dir, "inputs.pt"), weights_only=True)
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_run_from_the_middle_of_a_session_rebuilds_with_its_own_latest_plan(
    middle_session, tmp_path
):
    run_dir = t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.run", 2)
    out = tmp_path / "repro"
    done = export_repro(run_dir, out)
    assert [s.rsplit(".", 1)[1] for s in done["steps"]] == ["__init__", "plan", "run"]
    second_plan = t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.plan", 2)
    assert plan_inputs_equal(out / "data" / "2_plan_inputs.pt", second_plan)
    assert "        logits_soft_cap=10.0," in script_of(out)
    r = run_fresh(out, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_run_before_the_second_plan_takes_the_first_plan(middle_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.run", 0), out)
    first_plan = t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.plan", 1)
    assert plan_inputs_equal(out / "data" / "2_plan_inputs.pt", first_plan)
    assert "logits_soft_cap" not in script_of(out)


def test_other_wrapper_of_the_session_takes_its_own_chain(middle_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.run", 3), out)
    first_plan = t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.plan", 0)
    assert plan_inputs_equal(out / "data" / "2_plan_inputs.pt", first_plan)


def test_full_chain_replays_every_call_on_the_object(middle_session, tmp_path):
    out = tmp_path / "repro"
    done = export_repro(
        t.dump_of(middle_session, "BatchDecodeWithPagedKVCacheWrapper.run", -1),
        out,
        full_chain=True,
    )
    assert [s.rsplit(".", 1)[1] for s in done["steps"]] == [
        "__init__",
        "plan",
        "run",
        "run",
        "plan",
        "run",
        "run",
    ]
    r = run_fresh(out, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tampered_recorded_output_makes_the_script_fail(mirror_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(mirror_session, "single_prefill_with_kv_cache"), out)
    path = out / "data" / "1_single_prefill_with_kv_cache_outputs.pt"
    outputs = torch.load(path, weights_only=True)
    outputs["result"][0, 0, 0] += 1.0
    torch.save(outputs, path)
    r = run_fresh(out, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL: the result differs from the recording" in r.stdout
    assert "1 of 6144 elements outside rtol=0.001, atol=0.001" in r.stdout


def test_recorded_exception_is_reproduced_by_the_script(mirror_session, tmp_path):
    out = tmp_path / "repro"
    export_repro(t.dump_of(mirror_session, "fp4_quantize", -1), out)
    assert "    except Exception as exc:  # the recording raised: so should this" in script_of(out)
    r = run_fresh(out, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "PASS: reproduced BackendSupportedError: fp4_quantize does not support backend 'bogus'"
        in r.stdout
    )
    assert "Traceback" in r.stderr


def test_script_fails_when_the_recorded_exception_does_not_happen(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps")
    with pytest.raises(ValueError):
        writer.call(h.check_positive, torch.tensor([-1.0]))
    torch.save({"arg_0": torch.tensor([1.0])}, os.path.join(writer.dirs[-1], "inputs.pt"))
    out = tmp_path / "repro"
    export_repro(writer.dirs[-1], out, allow_modules=ALLOW)
    r = run_fresh(out, tmp_path, env=t.clean_env(PYTHONPATH=t.TESTS))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL: the call returned normally; the recording raised ValueError" in r.stdout


def test_flashinfer_style_safetensors_dumps_export_as_pt(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps", fmt="safetensors", flashinfer_style=True)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(8, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2, 5]), 0.5)
    writer.method(wrapper, "run", torch.randn(5, 3).t().contiguous().t(), return_lse=True)
    out = tmp_path / "repro"
    done = export_repro(writer.dirs[-1], out, allow_modules=ALLOW)
    assert len(done["steps"]) == 3
    assert all(not f.endswith(".safetensors") for f in os.listdir(out / "data"))
    x = torch.load(out / "data" / "3_run_inputs.pt", weights_only=True)["arg_1"]
    assert x.stride() == (1, 5)  # strides kept from the safetensors metadata
    r = run_fresh(out, tmp_path, env=t.clean_env(PYTHONPATH=t.TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_method_without_its_init_dump_is_refused_with_the_reason(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps")
    wrapper = writer.construct(h.SegmentSumWrapper, torch.empty(4))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    writer.method(wrapper, "run", torch.ones(2, 3))
    shutil.rmtree(writer.dirs[0])  # as when FLASHINFER_DUMP_INCLUDE left __init__ out
    with pytest.raises(ValueError, match=r"no SegmentSumWrapper.__init__ dump of this object"):
        export_repro(writer.dirs[-1], tmp_path / "repro", allow_modules=ALLOW)


def test_names_that_are_not_identifiers_are_refused(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps")
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    edit_metadata(writer.dirs[-1], '"replay_helpers"', '"os; import subprocess"')
    with pytest.raises(ValueError, match=r"module 'os; import subprocess' is not a dotted name"):
        export_repro(writer.dirs[-1], tmp_path / "repro", allow_modules=ALLOW)


def test_untrusted_text_cannot_escape_a_comment(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps")
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    edit_metadata(writer.dirs[-1], '"torch.float32"', '"x\\nraise SystemExit(3)"')
    out = tmp_path / "repro"
    export_repro(writer.dirs[-1], out, allow_modules=ALLOW)  # the exporter compiles what it writes
    lines = script_of(out).splitlines()
    assert "        x=inputs['arg_0'],  # x?raise SystemExit(3) (2,)" in lines
    assert not any(line.lstrip().startswith("raise SystemExit") for line in lines)


def test_cli_tar_writes_one_archive_that_runs(mirror_session, tmp_path):
    archive = tmp_path / "bug.tar.gz"
    result = CliRunner().invoke(
        cli, ["repro", t.dump_of(mirror_session, "bmm_fp8"), "-o", str(archive), "--tar"]
    )
    assert result.exit_code == 0, result.output
    assert f"Wrote archive {archive}" in result.output
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    assert "bug/repro.py" in names and "bug/data/1_bmm_fp8_inputs.pt" in names
    r = run_fresh(tmp_path / "x" / "bug", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_refuses_an_existing_output_folder(mirror_session, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    result = CliRunner().invoke(
        cli, ["repro", t.dump_of(mirror_session, "bmm_fp8"), "-o", str(tmp_path / "taken")]
    )
    assert result.exit_code == 1
    assert "exists and is not an empty directory" in result.output


def test_parse_signature_reads_flashinfer_annotations_and_enum_defaults():
    text = (
        "(a: torch.Tensor, /, b: Optional[Tuple[int, int]] = None, "
        "sfLayout=<SfLayout.layout_128x4: 0>, *rest, kv_layout: str = 'N,HD', "
        "**kwargs) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]"
    )
    assert parse_signature(text) == [
        ("a", "positional_only"),
        ("b", "positional_or_keyword"),
        ("sfLayout", "positional_or_keyword"),
        ("rest", "var_positional"),
        ("kv_layout", "keyword_only"),
        ("kwargs", "var_keyword"),
    ]


def test_parse_signature_gives_none_for_text_it_cannot_read():
    assert parse_signature("(a, b=[1, 2") is None
    assert parse_signature("not a signature") is None
