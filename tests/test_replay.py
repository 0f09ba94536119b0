"""Replay of level-10 dumps (docs/replay.md), on dumps written as docs/dump-format.md describes."""

import json
import os

import pytest
import replay_helpers as h
import torch

import flashinfer_native
from flashinfer_native import dumpdir
from flashinfer_native import replay as rp
from flashinfer_native.replay import classify

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The test APIs and enums live in module replay_helpers, which replay must be told to trust.
ALLOW = ["replay_helpers"]


def replay_from_dump(dump_dir, **kwargs):
    return rp.replay_from_dump(dump_dir, allow_modules=ALLOW, **kwargs)


def replay_sequence(root_dir, **kwargs):
    return rp.replay_sequence(root_dir, allow_modules=ALLOW, **kwargs)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "dumps")


@pytest.fixture
def writer(root):
    return h.DumpWriter(root)


def _last_record(dump_dir):
    with open(os.path.join(dump_dir, "metadata.jsonl")) as f:
        return json.loads(f.read().splitlines()[-1])


def _rewrite_last_record(dump_dir, **changes):
    path = os.path.join(dump_dir, "metadata.jsonl")
    with open(path) as f:
        lines = f.read().splitlines()
    record = json.loads(lines[-1])
    record.update(changes)
    lines[-1] = json.dumps(record)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _snapshot(path):
    tree = {}
    for dirpath, dirnames, files in os.walk(path):
        tree[dirpath] = sorted(dirnames)
        for name in files:
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            with open(full, "rb") as f:
                tree[full] = (st.st_size, st.st_mtime_ns, f.read())
    return tree


# ------------------------------------------------------------------ replay_from_dump


def test_args_and_kwargs_rebuilt_from_inputs_and_metadata(writer):
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    writer.call(h.scale_add, x, y, alpha=2.5)
    result = replay_from_dump(writer.dirs[0], device="cpu")
    assert set(result) == {"args", "kwargs", "metadata"}
    assert len(result["args"]) == 2
    assert torch.equal(result["args"][0], x) and torch.equal(result["args"][1], y)
    assert result["kwargs"] == {"alpha": 2.5}
    assert result["metadata"]["function_name"] == "scale_add"
    assert result["metadata"]["execution_status"] == "completed"


def test_missing_arg_index_becomes_none(writer):
    writer.call(h.scale_add, torch.ones(2), 7, 3)
    record = _last_record(writer.dirs[0])
    del record["input_metadata"]["arg_1"]
    _rewrite_last_record(writer.dirs[0], input_metadata=record["input_metadata"])
    args = replay_from_dump(writer.dirs[0], device="cpu")["args"]
    assert args[1] is None and args[2] == 3


def test_dtype_enum_and_device_decoded(writer):
    writer.call(
        h.reduce_rows,
        torch.randn(2, 3),
        h.Reduction.MAX,
        dtype=torch.float64,
        device=torch.device("cpu"),
    )
    result = replay_from_dump(writer.dirs[0], device="cpu")
    assert result["args"][1] is h.Reduction.MAX
    assert result["kwargs"]["dtype"] is torch.float64
    assert result["kwargs"]["device"] == torch.device("cpu")


def test_recorded_device_of_other_kind_maps_to_replay_device(writer):
    writer.call(h.reduce_rows, torch.randn(2, 3), device=torch.device("cpu"))
    record = _last_record(writer.dirs[0])
    record["input_metadata"]["kwarg_device"] = {"type": "torch.device", "value": "meta"}
    _rewrite_last_record(writer.dirs[0], input_metadata=record["input_metadata"])
    result = replay_from_dump(writer.dirs[0], device="cpu")
    assert result["kwargs"]["device"] == torch.device("cpu")


def test_nested_tensors_in_list_rebuilt(writer):
    a, b = torch.randn(2), torch.randn(3)
    writer.call(h.concat, [a, b], dim=0)
    arg = replay_from_dump(writer.dirs[0], device="cpu")["args"][0]
    assert isinstance(arg, list) and len(arg) == 2
    assert torch.equal(arg[0], a) and torch.equal(arg[1], b)


def test_tuple_and_dict_values_rebuilt(writer):
    writer.crash(h.scale_add, (torch.ones(1), 2), {"k": torch.zeros(2), 3: "v"})
    args = replay_from_dump(writer.dirs[0], device="cpu")["args"]
    assert isinstance(args[0], tuple) and args[0][1] == 2 and torch.equal(args[0][0], torch.ones(1))
    assert set(args[1]) == {"k", 3} and args[1][3] == "v"
    assert torch.equal(args[1]["k"], torch.zeros(2))


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_recorded_strides_restored(root, fmt):
    writer = h.DumpWriter(root, fmt=fmt)
    transposed = torch.arange(12.0).reshape(4, 3).t()
    expanded = torch.arange(4.0).reshape(1, 4).expand(3, 4)
    writer.call(h.scale_add, transposed, expanded)
    args = replay_from_dump(writer.dirs[0], device=DEVICE)["args"]
    assert args[0].stride() == (1, 3) and args[1].stride() == (0, 1)
    assert torch.equal(args[0].cpu(), transposed) and torch.equal(args[1].cpu(), expanded)
    assert args[0].device.type == DEVICE


def test_tensors_moved_to_another_device_keep_strides_and_offset(writer):
    base = torch.arange(40.0).reshape(5, 8)
    view = base[1:, 2:].t()
    writer.call(h.scale_add, view, view)
    arg = replay_from_dump(writer.dirs[0], device="meta")["args"][0]
    assert arg.device.type == "meta" and arg.shape == view.shape
    assert arg.stride() == view.stride() and arg.storage_offset() == view.storage_offset()


def test_safetensors_requires_grad_restored(root):
    writer = h.DumpWriter(root, fmt="safetensors")
    writer.crash(h.scale_add, torch.ones(3, requires_grad=True), torch.ones(3))
    args = replay_from_dump(writer.dirs[0], device="cpu")["args"]
    assert args[0].requires_grad and not args[1].requires_grad


def test_default_device_is_cuda_when_available_else_cpu(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    args = replay_from_dump(writer.dirs[0])["args"]
    assert args[0].device.type == DEVICE


def test_self_placeholder_kept_as_its_encoding(writer):
    writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    args = replay_from_dump(writer.dirs[0], device="cpu")["args"]
    assert args[0]["type"] == "SegmentSumWrapper" and "repr" in args[0]


def test_compare_outputs_returns_expected_tensors_and_metadata(writer):
    out = writer.call(h.split_halves, torch.arange(6.0))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu")
    assert set(result["expected_tensors"]) == {"result_0", "result_1"}
    assert torch.equal(result["expected_tensors"]["result_1"], out[1])
    assert result["expected_metadata"] == {"result_2": 6}
    assert "execution_result" not in result


def test_run_returns_result_and_comparison_match(writer):
    writer.call(h.scale_add, torch.randn(4), torch.randn(4), alpha=0.5)
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is True
    assert torch.equal(result["execution_result"], result["expected_tensors"]["result"])


def test_run_compares_tuple_with_non_tensor_item(writer):
    writer.call(h.split_halves, torch.arange(6.0))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is True
    assert result["execution_result"][2] == 6


def test_run_compares_dict_result(writer):
    writer.call(h.summarize, torch.ones(3, 2))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is True


def test_out_argument_call_replays(writer):
    writer.call(h.fill_out, torch.ones(3), torch.empty(3))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is True
    assert torch.equal(result["args"][1], torch.full((3,), 2.0))


def test_run_without_compare_has_no_comparison(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    result = replay_from_dump(writer.dirs[0], device="cpu", run=True)
    assert torch.equal(result["execution_result"], torch.full((2,), 2.0))
    assert "comparison_match" not in result and "expected_tensors" not in result


def test_tampered_outputs_mismatch(writer):
    writer.call(h.scale_add, torch.ones(4), torch.ones(4))
    torch.save({"result": torch.full((4,), 9.0)}, os.path.join(writer.dirs[0], "outputs.pt"))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is False
    assert result["mismatches"] == [
        "result: values differ beyond rtol=0.001, atol=0.001 (max abs diff 7)"
    ]


def test_dtype_difference_is_mismatch(writer):
    writer.call(h.scale_add, torch.ones(4), torch.ones(4))
    torch.save({"result": torch.full((4,), 2.0).double()}, writer.dirs[0] + "/outputs.pt")
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["mismatches"] == ["result: dtype torch.float32 != recorded torch.float64"]


def test_tolerances_are_overridable(writer):
    writer.call(h.scale_add, torch.ones(4), torch.ones(4))
    torch.save({"result": torch.full((4,), 2.05)}, os.path.join(writer.dirs[0], "outputs.pt"))
    strict = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    loose = replay_from_dump(
        writer.dirs[0], compare_outputs=True, device="cpu", run=True, rtol=0.0, atol=0.1
    )
    assert strict["comparison_match"] is False and loose["comparison_match"] is True


def test_integer_results_compare_exactly(writer):
    writer.call(h.scale_add, torch.arange(4), torch.arange(4), alpha=1)
    torch.save({"result": torch.tensor([0, 2, 4, 7])}, os.path.join(writer.dirs[0], "outputs.pt"))
    result = replay_from_dump(
        writer.dirs[0], compare_outputs=True, device="cpu", run=True, atol=10.0
    )
    assert result["mismatches"] == ["result: values differ (exact comparison)"]


def test_recorded_exception_passes_when_same_type_raised(writer):
    with pytest.raises(ValueError):
        writer.call(h.check_positive, -torch.ones(2))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["execution_error"] == "ValueError: check_positive: x has negative elements"
    assert result["comparison_match"] is True
    assert classify(result) == "passed"


def test_recorded_exception_mismatch_when_replay_returns(writer):
    with pytest.raises(ValueError):
        writer.call(h.check_positive, -torch.ones(2))
    torch.save({"arg_0": torch.ones(2)}, os.path.join(writer.dirs[0], "inputs.pt"))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_match"] is False
    assert result["mismatches"] == ["recorded ValueError exception, replay returned normally"]


def test_completed_call_that_now_raises_is_an_error(writer):
    writer.call(h.check_positive, torch.ones(2))
    torch.save({"arg_0": -torch.ones(2)}, os.path.join(writer.dirs[0], "inputs.pt"))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["execution_error"].startswith("ValueError: check_positive")
    assert result["comparison_match"] is False and classify(result) == "error"


def test_crashed_call_loads_inputs_and_is_incomplete(writer):
    x = torch.randn(3)
    writer.crash(h.scale_add, x, x)
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu")
    assert result["incomplete"] is True
    assert torch.equal(result["args"][0], x)
    assert result["expected_tensors"] == {}


def test_outputs_skipped_by_size_cap_is_not_compared(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    os.remove(os.path.join(writer.dirs[0], "outputs.pt"))
    info = dict(_last_record(writer.dirs[0])["tensor_info"], output_tensor_keys=[])
    _rewrite_last_record(writer.dirs[0], outputs_skipped="size cap", tensor_info=info)
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["comparison_skipped"] == "outputs not recorded (size cap)"
    assert "comparison_match" not in result and classify(result) == "passed"


def test_wrapper_init_plan_run_replay_on_one_object(writer):
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(8, dtype=torch.int8), "HND")
    writer.method(wrapper, "plan", torch.tensor([0, 2, 5]), 0.5)
    writer.method(wrapper, "run", torch.randn(5, 3), return_lse=True)
    registry = {}
    results = [
        replay_from_dump(d, compare_outputs=True, device="cpu", run=True, object_registry=registry)
        for d in writer.dirs
    ]
    assert [r["comparison_match"] for r in results] == [True, True, True]
    (obj,) = registry.values()
    assert isinstance(obj, h.SegmentSumWrapper) and obj.layout == "HND"
    assert list(registry) == [(os.getpid(), id(wrapper))]


def test_method_without_replayed_init_is_an_error_naming_the_call(writer):
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(8, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    with pytest.raises(LookupError, match=r"no SegmentSumWrapper object for .*plan.*__init__"):
        replay_from_dump(writer.dirs[1], device="cpu", run=True, object_registry={})


def test_replay_suspends_dumping_while_running(writer):
    writer.call(h.dumps_suspended_now)
    assert flashinfer_native._C.dumps_suspended() is False
    result = replay_from_dump(writer.dirs[0], device="cpu", run=True)
    assert result["execution_result"] is True
    assert flashinfer_native._C.dumps_suspended() is False


def test_native_reader_used_when_extension_has_one(writer, monkeypatch):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    seen = []

    def fake_load(path):
        seen.append(os.path.basename(path))
        return {"arg_0": torch.zeros(2), "arg_1": torch.zeros(2)}

    monkeypatch.setattr(flashinfer_native._C, "load_tensors", fake_load, raising=False)
    args = replay_from_dump(writer.dirs[0], device="cpu")["args"]
    assert seen == ["inputs.pt"] and torch.equal(args[0], torch.zeros(2))


def test_replay_never_writes_into_the_dump_tree(writer, root):
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(8, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 1, 3]), 2.0)
    writer.method(wrapper, "run", torch.randn(3, 2))
    writer.crash(h.scale_add, torch.ones(1), torch.ones(1))
    before = _snapshot(root)
    replay_sequence(root, device="cpu")
    replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert _snapshot(root) == before


# ------------------------------------------------------------------------ errors


def test_missing_directory_error_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dump directory not found: .*nowhere"):
        replay_from_dump(str(tmp_path / "nowhere"))


def test_missing_metadata_error_names_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"metadata\.jsonl: metadata file is missing"):
        replay_from_dump(str(tmp_path))


def test_empty_metadata_error_names_file(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    open(os.path.join(writer.dirs[0], "metadata.jsonl"), "w").close()
    with pytest.raises(ValueError, match=r"metadata\.jsonl: metadata file is empty"):
        replay_from_dump(writer.dirs[0])


def test_garbage_metadata_error_names_file_and_line(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    with open(os.path.join(writer.dirs[0], "metadata.jsonl"), "ab") as f:
        f.write(b"\x00\xffnot json{\n")
    with pytest.raises(ValueError, match=r"metadata\.jsonl: line 3 is not valid JSON"):
        replay_from_dump(writer.dirs[0])


def test_completion_record_cut_short_by_a_kill_leaves_the_call_incomplete(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    path = os.path.join(writer.dirs[0], "metadata.jsonl")
    with open(path, "rb") as f:
        first, second = f.read().splitlines(keepends=True)
    with open(path, "wb") as f:
        f.write(first + second[: len(second) // 2])
    assert [r["execution_status"] for r in dumpdir.read_metadata(writer.dirs[0])] == [
        "inputs_saved"
    ]
    with open(path, "ab") as f:
        f.write(b"\n")  # a whole line that is not JSON is damage, not a kill
    with pytest.raises(ValueError, match=r"metadata\.jsonl: line 2 is not valid JSON"):
        dumpdir.read_metadata(writer.dirs[0])


def test_metadata_line_that_is_not_an_object_is_an_error(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    with open(os.path.join(writer.dirs[0], "metadata.jsonl"), "w") as f:
        f.write("[1, 2]\n")
    with pytest.raises(ValueError, match=r"line 1 is a JSON array, expected an object"):
        replay_from_dump(writer.dirs[0])


def test_malformed_record_field_error_names_file(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    _rewrite_last_record(writer.dirs[0], input_metadata=[1, 2])
    with pytest.raises(
        ValueError, match=r"metadata\.jsonl: line 2: field 'input_metadata' is a JSON array"
    ):
        replay_from_dump(writer.dirs[0])


def test_sequence_with_malformed_sequence_values_orders_by_name(root):
    writer = h.DumpWriter(root)
    for _ in range(3):
        writer.call(h.scale_add, torch.ones(1), torch.ones(1))
    _rewrite_last_record(writer.dirs[0], sequence="first")
    with open(os.path.join(writer.dirs[0], "metadata.jsonl")) as f:
        lines = f.read().splitlines()
    with open(os.path.join(writer.dirs[0], "metadata.jsonl"), "w") as f:
        f.write(lines[-1] + "\n")
    results = replay_sequence(root, device="cpu")
    assert [r["dump_dir"] for r in results] == sorted(writer.dirs)


def test_missing_inputs_file_error_names_dump(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    os.remove(os.path.join(writer.dirs[0], "inputs.pt"))
    with pytest.raises(FileNotFoundError, match=r"call0001: inputs file .* is missing"):
        replay_from_dump(writer.dirs[0])


def test_call_without_tensors_needs_no_inputs_file(writer):
    writer.call(h.scale_add, 2, 3, alpha=4)
    os.remove(os.path.join(writer.dirs[0], "inputs.pt"))
    result = replay_from_dump(writer.dirs[0], compare_outputs=True, device="cpu", run=True)
    assert result["execution_result"] == 11 and result["comparison_match"] is True


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_truncated_tensor_file_error_names_file(root, fmt):
    writer = h.DumpWriter(root, fmt=fmt)
    writer.call(h.scale_add, torch.randn(64), torch.randn(64))
    ext = ".pt" if fmt == "torch" else ".safetensors"
    path = os.path.join(writer.dirs[0], "inputs" + ext)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(
        ValueError, match=rf"inputs\{ext}: not a valid (PyTorch zip|safetensors) file"
    ):
        replay_from_dump(writer.dirs[0])


def test_garbage_tensor_file_error_names_file(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    with open(os.path.join(writer.dirs[0], "outputs.pt"), "wb") as f:
        f.write(b"PK\x03\x04" + b"\xff" * 100)
    with pytest.raises(ValueError, match=r"outputs\.pt: not a valid PyTorch zip file"):
        replay_from_dump(writer.dirs[0], compare_outputs=True)


def test_tensor_listed_but_absent_error(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    torch.save({"arg_0": torch.ones(2)}, os.path.join(writer.dirs[0], "inputs.pt"))
    with pytest.raises(ValueError, match=r"inputs\.pt: tensors \['arg_1'\] listed in metadata"):
        replay_from_dump(writer.dirs[0])


def test_unknown_module_is_refused_naming_it(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    _rewrite_last_record(writer.dirs[0], module="no_such_module_xyz")
    with pytest.raises(
        rp.registry.ReplayRefused,
        match=r"metadata\.jsonl: module 'no_such_module_xyz' is not an allowed module",
    ):
        replay_from_dump(writer.dirs[0], run=True)


def test_unknown_function_is_refused_naming_it(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    _rewrite_last_record(writer.dirs[0], function_name="no_such_function")
    with pytest.raises(
        rp.registry.ReplayRefused,
        match=r"function_name 'no_such_function' of module 'replay_helpers' is not a registered",
    ):
        replay_from_dump(writer.dirs[0], run=True)


def test_unknown_enum_class_error_names_the_field(writer):
    writer.call(h.reduce_rows, torch.ones(2, 2), h.Reduction.SUM)
    record = _last_record(writer.dirs[0])
    record["input_metadata"]["arg_1"]["class"] = "replay_helpers.NoSuchEnum"
    _rewrite_last_record(writer.dirs[0], input_metadata=record["input_metadata"])
    with pytest.raises(
        ValueError, match=r"arg_1: enum class 'replay_helpers.NoSuchEnum' is not an enum"
    ):
        replay_from_dump(writer.dirs[0])


# ---------------------------------------------------------------------- sequence


def test_sequence_of_200_calls_replays_in_call_order(root):
    writer = h.DumpWriter(root, timestamp="20250101_000000_000")
    expected = []
    for i in range(200):
        func = h.scale_add if i % 3 else h.check_positive
        writer.call(func, torch.full((2,), float(i)), *([torch.ones(2)] if i % 3 else []))
        expected.append(writer.dirs[-1])
    assert sorted(expected) != expected
    results = replay_sequence(root, device="cpu")
    assert [r["dump_dir"] for r in results] == expected
    assert [classify(r) for r in results] == ["passed"] * 200


def test_sequence_orders_processes_then_sequence(root):
    first = h.DumpWriter(root, timestamp="20250101_000000_001", pid=20)
    second = h.DumpWriter(root, timestamp="20250101_000000_001", pid=3)
    second.call(h.scale_add, torch.ones(1), torch.ones(1))
    first.call(h.scale_add, torch.ones(1), torch.ones(1))
    second.call(h.check_positive, torch.ones(1))
    order = [r["dump_dir"] for r in replay_sequence(root, device="cpu")]
    assert order == [second.dirs[0], second.dirs[1], first.dirs[0]]


def test_flashinfer_dumps_of_one_millisecond_replay_in_session_order(root):
    # no sequence, one timestamp: the names sort plan_call0002 before run_call0001, and
    # only session.jsonl knows that run came first
    writer = h.DumpWriter(root, flashinfer_style=True, timestamp="20250101_000000_000")
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 3, 6]), 1.0)
    writer.method(wrapper, "run", torch.randn(6, 2))
    writer.method(wrapper, "plan", torch.tensor([0, 6]), 3.0)
    writer.method(wrapper, "run", torch.randn(6, 2))
    assert sorted(writer.dirs) != writer.dirs
    results = replay_sequence(root, device="cpu")
    assert [r["dump_dir"] for r in results] == writer.dirs
    assert [classify(r) for r in results] == ["passed"] * 5


def test_wrapper_used_twice_with_different_plans(writer, root):
    first = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    second = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    x = torch.randn(6, 2)
    writer.method(first, "plan", torch.tensor([0, 3, 6]), 1.0)
    writer.method(second, "plan", torch.tensor([0, 1, 2, 6]), -2.0, out_dtype=torch.float64)
    writer.method(first, "run", x)
    writer.method(second, "run", x)
    writer.method(first, "plan", torch.tensor([0, 6]), 3.0)
    writer.method(first, "run", x, return_lse=True)
    results = replay_sequence(root, device="cpu")
    assert [classify(r) for r in results] == ["passed"] * 8
    runs = [
        r["execution_result"] for r in results if r["metadata"]["function_name"].endswith("run")
    ]
    assert [tuple(r.shape) for r in runs[:2]] == [(2, 2), (3, 2)]
    assert runs[1].dtype == torch.float64 and isinstance(runs[2], tuple)


def test_sequence_reports_broken_dumps_and_replays_the_rest(root):
    writer = h.DumpWriter(root)
    for _ in range(7):
        writer.call(h.scale_add, torch.ones(3), torch.ones(3))
    d = writer.dirs
    os.remove(os.path.join(d[0], "inputs.pt"))
    open(os.path.join(d[1], "metadata.jsonl"), "w").close()
    with open(os.path.join(d[2], "metadata.jsonl"), "w") as f:
        f.write("garbage\n")
    with open(os.path.join(d[3], "outputs.pt"), "r+b") as f:
        f.truncate(40)
    _rewrite_last_record(d[4], module="no_such_module_xyz")
    _rewrite_last_record(d[5], function_name="missing_fn")
    by_dir = {r["dump_dir"]: r for r in replay_sequence(root, device="cpu")}
    results = [by_dir[path] for path in d]
    assert [classify(r) for r in results] == ["error"] * 6 + ["passed"]
    assert "inputs file" in results[0]["error"] and "metadata file is empty" in results[1]["error"]
    assert "not valid JSON" in results[2]["error"] and "outputs.pt" in results[3]["error"]
    assert "no_such_module_xyz" in results[4]["error"] and "missing_fn" in results[5]["error"]
    assert results[4]["metadata"]["module"] == "no_such_module_xyz"


def test_sequence_marks_crashed_call_incomplete_without_running(root, monkeypatch):
    writer = h.DumpWriter(root)
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    writer.crash(h.check_positive, torch.ones(2))
    monkeypatch.setattr(h, "check_positive", None)
    results = replay_sequence(root, device="cpu")
    assert [classify(r) for r in results] == ["passed", "incomplete"]
    assert "execution_result" not in results[1] and "comparison_match" not in results[1]


def test_sequence_include_and_exclude_filters(root):
    writer = h.DumpWriter(root)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    writer.method(wrapper, "run", torch.ones(2, 2))
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    names = [
        r["metadata"]["function_name"]
        for r in replay_sequence(root, device="cpu", include="*Wrapper*", exclude=["*.run"])
    ]
    assert names == ["SegmentSumWrapper.__init__", "SegmentSumWrapper.plan"]


def test_sequence_include_of_a_method_replays_the_calls_that_set_up_its_object(root):
    writer = h.DumpWriter(root)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    writer.method(wrapper, "run", torch.ones(2, 2))
    results = replay_sequence(root, device="cpu", include="*.run")
    assert [(r["metadata"]["function_name"], r.get("setup", False)) for r in results] == [
        ("SegmentSumWrapper.__init__", True),
        ("SegmentSumWrapper.plan", True),
        ("SegmentSumWrapper.run", False),
    ]
    assert [classify(r) for r in results] == ["passed"] * 3


def test_sequence_missing_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dump root directory not found"):
        replay_sequence(str(tmp_path / "absent"))


# --------------------------------------------------------------- interoperability


def test_flashinfer_style_dumps_replay_in_directory_order(root):
    writer = h.DumpWriter(root, flashinfer_style=True)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2, 3]), 1.5)
    writer.method(wrapper, "run", torch.randn(3, 4), return_lse=True)
    writer.call(h.reduce_rows, torch.randn(2, 2), h.Reduction.SUM, dtype=torch.float64)
    assert all("sequence" not in _last_record(d) for d in writer.dirs)
    results = replay_sequence(root, device="cpu")
    assert [r["dump_dir"] for r in results] == sorted(writer.dirs)
    assert [classify(r) for r in results] == ["passed"] * 4


def _flashinfer_style_replay(dump_dir, fmt):
    """What FlashInfer's own replay does: last record, torch.load/load_file, arg_i keys."""
    import importlib

    from safetensors.torch import load_file

    with open(os.path.join(dump_dir, "metadata.jsonl")) as f:
        meta = json.loads([line for line in f if line.strip()][-1])
    if fmt == "torch":
        inputs = torch.load(os.path.join(dump_dir, "inputs.pt"), map_location="cpu")
        outputs = torch.load(os.path.join(dump_dir, "outputs.pt"), map_location="cpu")
    else:
        inputs = load_file(os.path.join(dump_dir, "inputs.safetensors"))
        outputs = load_file(os.path.join(dump_dir, "outputs.safetensors"))
    values = dict(meta["input_metadata"], **inputs)
    args = [
        values.get(f"arg_{i}")
        for i in range(
            1 + max(int(k[4:]) for k in values if k.startswith("arg_") and k[4:].isdigit())
        )
    ]
    kwargs = {k[6:]: v for k, v in values.items() if k.startswith("kwarg_")}
    func = getattr(importlib.import_module(meta["module"]), meta["function_name"])
    return func(*args, **kwargs), outputs


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_our_dumps_replay_with_a_flashinfer_style_replayer(root, fmt):
    writer = h.DumpWriter(root, fmt=fmt)
    writer.call(h.scale_add, torch.randn(3, 5).t(), torch.randn(5, 3), alpha=0.25)
    writer.call(h.split_halves, torch.randn(8))
    assert _last_record(writer.dirs[0])["sequence"] == 1
    value, outputs = _flashinfer_style_replay(writer.dirs[0], fmt)
    assert torch.allclose(value, outputs["result"])
    value, outputs = _flashinfer_style_replay(writer.dirs[1], fmt)
    assert torch.equal(value[0], outputs["result_0"]) and torch.equal(value[1], outputs["result_1"])


def test_compare_values_reports_each_difference():
    diffs = rp.compare_values(
        (torch.ones(2), [1, 2], {"a": float("nan")}), (torch.ones(3), [1, 3], {"a": float("nan")})
    )
    assert diffs == ["result[0]: shape (2,) != recorded (3,)", "result[1][1]: 2 != recorded 3"]


def test_compare_values_handles_low_precision_and_nan():
    fp8 = torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn)
    assert rp.compare_values(fp8, fp8.clone()) == []
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.bfloat16)
    assert rp.compare_values(nan, nan.clone()) == []
    other = torch.tensor([float("nan"), 1.5], dtype=torch.bfloat16)
    assert rp.compare_values(other, nan) == [
        "result: values differ beyond rtol=0.001, atol=0.001 (max abs diff 0.5)"
    ]
