"""One owner of the dump format (docs/dump-format.md): the core's writer names its files,
directories, keys and bounds in csrc/core/dump_format.h and exports them as
_C.DUMP_FORMAT; the Python reader (flashinfer_native/record.py) takes its names from
there, and so does the tests' own writer (replay_helpers.DumpWriter, through record.py's
writer side). These tests hold a dump the core writes to what the reader accepts and to
what the tests' writer writes."""

import json
import os

import pytest
import replay_helpers as h
import torch
from logging_utils import reload_api_logging, restore_level_0

from flashinfer_native import _C, dumpdir
from flashinfer_native import record as rec

FORMAT = _C.DUMP_FORMAT


def fmt_probe(a, pair, table, scale=1.0):
    return a * scale, [t + 1 for t in pair], len(table)


def fmt_raises(x):
    raise ValueError("no")


def probe_args():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    return (a, [torch.ones(2), torch.zeros(3)], {"k": torch.ones(1), 3: "v"}), {"scale": 2.0}


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """A level-10 session of one function with positional, keyword, nested list, dict
    and tuple-result arguments, and of one that raises."""
    m = reload_api_logging(
        monkeypatch,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
    )
    try:
        args, kwargs = probe_args()
        m.flashinfer_api(fmt_probe)(*args, **kwargs)
        with pytest.raises(ValueError):
            m.flashinfer_api(fmt_raises)(torch.ones(1))
    finally:
        restore_level_0()
    return tmp_path / "dumps"


@pytest.fixture
def written(tmp_path):
    """The same two calls written by the tests' DumpWriter."""
    writer = h.DumpWriter(tmp_path / "written")
    args, kwargs = probe_args()
    writer.call(fmt_probe, *args, **kwargs)
    with pytest.raises(ValueError):
        writer.call(fmt_raises, torch.ones(1))
    return tmp_path / "written"


def call_dirs(root):
    """The call directories of a dump root (by the core's pattern: not chunks/)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and rec.DIR_NAME.match(p.name))


def last_records(root):
    return [dumpdir.read_metadata(str(d))[-1] for d in call_dirs(root)]


def test_the_reader_takes_its_names_from_the_core():
    assert rec.FORMAT is FORMAT
    assert dumpdir.METADATA_FILE == FORMAT["metadata_file"] == "metadata.jsonl"
    assert dumpdir.SESSION_FILE == FORMAT["session_file"] == "session.jsonl"
    assert dumpdir._DIR_NAME is rec.DIR_NAME
    # the pattern the reader builds from the core's stamp format, marks and digits
    assert (
        rec.DIR_NAME.pattern
        == r"^(\d{4}\d{2}\d{2}_\d{2}\d{2}\d{2}_\d{3})_pid(\d+)_(.+)_call\d{4,}$"
    )
    # the key grammar, from the core's prefixes, marks and separator
    assert rec._INDEXED_KEY.pattern == r"(arg_|result_)([0-9]{1,9})"
    assert rec.NESTED_KEY.pattern == r"__([0-9]+|key_[0-9]+|value_[0-9]+)$"
    assert rec.TOP_KEY.pattern == r"^(arg_(\d+)|kwarg_(.+?))(__.*)?$"
    assert rec.index_of("arg_3", "arg") == 3 and rec.index_of("result_3", "arg") is None
    assert rec.index_of("result_2", "result") == 2 and rec.index_of("arg_٣", "arg") is None


def test_directories_and_files_are_those_the_core_names(recorded):
    dirs = sorted(p for p in recorded.iterdir() if p.is_dir())
    assert [rec.DIR_NAME.match(d.name).group(3) for d in dirs] == ["fmt_probe", "fmt_raises"]
    ext = FORMAT["tensor_extensions"]["torch"]
    probe, raises = dirs
    assert sorted(p.name for p in probe.iterdir()) == sorted(
        [FORMAT["metadata_file"], f"{FORMAT['inputs']}.{ext}", f"{FORMAT['outputs']}.{ext}"]
    )
    assert sorted(p.name for p in raises.iterdir()) == sorted(
        [FORMAT["metadata_file"], f"{FORMAT['inputs']}.{ext}"]
    )
    assert (recorded / FORMAT["session_file"]).is_file()
    # the reader finds and orders the two calls by the directory pattern
    assert [p for p, _ in dumpdir.ordered_dumps(recorded)] == [str(d) for d in dirs]


def test_every_field_written_is_one_the_core_lists(recorded):
    listed = set(FORMAT["record_fields"])
    with open(recorded / FORMAT["session_file"]) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == 4  # two lines per call
    for record in lines:
        assert set(record) - listed == set(), record.get("function_name")
        assert rec.field_problem(record) is None
    # the reader checks the fields the core writes, and two more that it reads from
    # records written elsewhere (a report's durations): none it checks is unknown
    assert set(rec._FIELDS) - listed == {"end_timestamp", "duration_s"}


def test_the_key_grammar_reads_back_what_the_core_wrote(recorded):
    from flashinfer_native.replay import replay_from_dump

    probe = sorted(p for p in recorded.iterdir() if p.is_dir())[0]
    last = dumpdir.read_metadata(str(probe))[-1]
    arg, kwarg, sep = FORMAT["arg_prefix"], FORMAT["kwarg_prefix"], FORMAT["nested_separator"]
    result, value = FORMAT["result_key"], FORMAT["dict_value_mark"]
    assert set(last["input_metadata"]) == {f"{arg}1", f"{arg}2", f"{kwarg}scale"}
    assert last["tensor_info"]["input_tensor_keys"] == [
        f"{arg}0",
        f"{arg}1{sep}0",
        f"{arg}1{sep}1",
        f"{arg}2{sep}{value}0",
    ]
    assert last["tensor_info"]["output_tensor_keys"] == [
        f"{result}_0",
        f"{result}_1{sep}0",
        f"{result}_1{sep}1",
    ]
    # the reader (record.py's grammar, through replay's loader) rebuilds the call
    loaded = replay_from_dump(probe, compare_outputs=True, device="cpu")
    a, pair, table = loaded["args"]
    assert torch.equal(a, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(pair[0], torch.ones(2)) and torch.equal(pair[1], torch.zeros(3))
    assert list(table) == ["k", 3] and torch.equal(table["k"], torch.ones(1))
    assert table[3] == "v" and loaded["kwargs"] == {"scale": 2.0}
    out, plus_one, n = loaded["expected_result"]
    assert torch.equal(out, a * 2) and torch.equal(plus_one[1], torch.ones(3)) and n == 2


def test_the_writer_bounds_are_exported():
    assert FORMAT["max_items"] == 10000 and FORMAT["repr_limit"] == 1000
    assert FORMAT["call_digits"] == 4 and FORMAT["flush_digits"] == 4


def test_the_writer_side_names_what_the_core_wrote(recorded):
    for d, record in zip(call_dirs(recorded), last_records(recorded)):
        stamp, pid, _ = rec.DIR_NAME.match(d.name).groups()
        assert d.name == rec.call_dir_name(
            stamp, pid, record["function_name"], record["call_sequence"]
        )
        fmt = record["tensor_format"]
        assert (d / rec.tensor_file_name("inputs", fmt)).is_file()
    assert (
        rec.call_dir_name("S", 7, "Wrapper.run<lambda>", 3) == "S_pid7_Wrapper.run_lambda__call0003"
    )
    assert [rec.arg_key(0), rec.kwarg_key("x"), rec.result_key(), rec.result_key(1)] == [
        "arg_0",
        "kwarg_x",
        "result",
        "result_1",
    ]
    assert rec.item_key("arg_1", 2) == "arg_1__2"
    assert rec.dict_item_keys("arg_2", 0) == ("arg_2__key_0", "arg_2__value_0")


def test_the_fields_inside_a_record_are_those_the_core_lists(recorded):
    probe, raises = last_records(recorded)
    assert set(probe["tensor_info"]) == set(FORMAT["tensor_info_fields"])
    assert all(
        list(details) == list(FORMAT["tensor_detail_fields"])
        for details in probe["tensor_details"].values()
    )
    assert list(raises["exception"]) == list(FORMAT["exception_fields"])
    assert [probe["execution_status"], raises["execution_status"]] == [
        rec.STATUS.completed,
        rec.STATUS.exception,
    ]
    assert set(FORMAT["execution_statuses"]) == {
        "inputs_saved",
        "completed",
        "exception",
        "graph_capture_pending_flush",
    }
    assert rec.FIELDS.function_name == "function_name"
    with pytest.raises(AttributeError):
        rec.FIELDS.no_such_field  # noqa: B018


def test_the_tests_writer_writes_what_the_core_writes(recorded, written):
    """replay_helpers.DumpWriter, the third writer, names everything through record.py:
    the same files, directory names (up to the stamp and pid), keys and fields as the
    core, and the reader takes both the same way."""
    core, tests = call_dirs(recorded), call_dirs(written)
    assert [rec.DIR_NAME.match(d.name).group(3) for d in tests] == ["fmt_probe", "fmt_raises"]
    assert [d.name.split("_pid")[1].split("_", 1)[1] for d in tests] == [
        d.name.split("_pid")[1].split("_", 1)[1] for d in core
    ]
    assert [sorted(os.listdir(d)) for d in tests] == [sorted(os.listdir(d)) for d in core]
    assert (written / FORMAT["session_file"]).is_file()
    for mine, theirs in zip(last_records(written), last_records(recorded)):
        # the core adds what only it knows (the recorder's own fields)
        assert set(mine) <= set(theirs) and rec.field_problem(mine) is None
        for name in ("input_metadata", "output_metadata"):
            assert set(mine[name]) == set(theirs[name]), name
        for name in ("tensor_info", "tensor_details", "exception"):
            assert (mine.get(name) or {}).keys() == (theirs.get(name) or {}).keys(), name
        for name in ("input_tensor_keys", "output_tensor_keys"):
            assert mine["tensor_info"][name] == theirs["tensor_info"][name], name
    assert [p for p, _ in dumpdir.ordered_dumps(written)] == [str(d) for d in tests]


def test_the_tests_writer_spells_no_name_of_the_format():
    """replay_helpers.py takes every file name, directory mark, key prefix and record
    field from record.py: none is a string literal there (docstrings aside). The value
    encodings' tags ("type", "shape", ...) are the encoder's own and not checked."""
    import ast

    names = {
        FORMAT["session_file"],
        FORMAT["metadata_file"],
        FORMAT["stamp_format"],
        FORMAT["pid_mark"],
        FORMAT["call_mark"],
        FORMAT["arg_prefix"],
        FORMAT["kwarg_prefix"],
        FORMAT["result_key"],
        *FORMAT["record_fields"],
        *FORMAT["tensor_info_fields"],
        *FORMAT["execution_statuses"],
        *(
            f"{FORMAT[w]}.{ext}"
            for w in ("inputs", "outputs")
            for ext in FORMAT["tensor_extensions"].values()
        ),
        *(f".{ext}" for ext in FORMAT["tensor_extensions"].values()),
    }
    with open(h.__file__) as f:
        tree = ast.parse(f.read())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    spelled = sorted(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and any(name in node.value for name in names)
    )
    assert spelled == []


# --------------------------------------------------------------- the compact layout


@pytest.fixture
def compact(monkeypatch, tmp_path):
    """The two calls of ``recorded`` at level 10 in the compact layout."""
    m = reload_api_logging(
        monkeypatch,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "compact"),
        FLASHINFER_DUMP_LAYOUT="compact",
    )
    try:
        args, kwargs = probe_args()
        m.flashinfer_api(fmt_probe)(*args, **kwargs)
        with pytest.raises(ValueError):
            m.flashinfer_api(fmt_raises)(torch.ones(1))
    finally:
        restore_level_0()
    return tmp_path / "compact"


def test_the_compact_layout_is_named_by_the_core(compact):
    assert FORMAT["tensor_extensions"] == {
        "torch": "pt",
        "safetensors": "safetensors",
        "chunks": "chunks.json",
    }
    assert (FORMAT["chunks_dir"], FORMAT["pack_ext"], FORMAT["ring_pack_prefix"]) == (
        "chunks",
        "pack",
        "ring-",
    )
    assert rec.CHUNKS_SUFFIX == dumpdir.CHUNKS_SUFFIX == ".chunks.json"
    assert rec.TENSOR_SUFFIXES == {
        "torch": ".pt",
        "safetensors": ".safetensors",
        "chunks": ".chunks.json",
    }
    # the root: session.jsonl, the call directories and the chunks folder of packs
    dirs = call_dirs(compact)
    assert sorted(p.name for p in compact.iterdir()) == sorted(
        [FORMAT["session_file"], FORMAT["chunks_dir"], *(d.name for d in dirs)]
    )
    packs = list((compact / rec.CHUNKS_DIR).iterdir())
    assert packs and all(p.name.endswith(rec.PACK_SUFFIX) for p in packs)
    probe, raises = dirs
    ext = FORMAT["tensor_extensions"][rec.COMPACT_FORMAT]
    assert sorted(p.name for p in probe.iterdir()) == sorted(
        [FORMAT["metadata_file"], f"{FORMAT['inputs']}.{ext}", f"{FORMAT['outputs']}.{ext}"]
    )
    assert sorted(p.name for p in raises.iterdir()) == sorted(
        [FORMAT["metadata_file"], f"{FORMAT['inputs']}.{ext}"]
    )
    assert [r["tensor_format"] for r in last_records(compact)] == [rec.COMPACT_FORMAT] * 2


def test_a_compact_session_holds_only_listed_fields(compact):
    listed = set(FORMAT["record_fields"])
    with open(compact / FORMAT["session_file"]) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == 4
    for record in lines:
        assert set(record) - listed == set(), record.get("function_name")
        assert rec.field_problem(record) is None
        assert set(record["tensor_info"]) <= set(FORMAT["tensor_info_fields"])
    for d in call_dirs(compact):
        with open(d / f"{FORMAT['inputs']}{rec.CHUNKS_SUFFIX}") as f:
            manifest = json.load(f)
        assert list(manifest) == list(FORMAT["manifest_fields"])
        assert manifest["format"] == FORMAT["manifest_format"] == "flashinfer-native chunks"
        assert manifest["version"] == FORMAT["manifest_version"] == 1
        assert all(name.endswith(rec.PACK_SUFFIX) for name in manifest["packs"])
        for tensor in manifest["tensors"].values():
            assert set(tensor) <= set(FORMAT["manifest_tensor_fields"]), tensor


def test_the_readers_take_a_compact_session_as_the_core_wrote_it(compact, recorded):
    """dumpdir finds the manifests by the core's suffix, the order is the directory
    pattern's, and replay rebuilds the same call from chunks as from the torch files."""
    from flashinfer_native.replay import replay_from_dump

    dirs = call_dirs(compact)
    assert [p for p, _ in dumpdir.ordered_dumps(compact)] == [str(d) for d in dirs]
    probe = dirs[0]
    record = last_records(compact)[0]
    path = dumpdir.tensor_file(str(probe), FORMAT["inputs"], record)
    assert path == str(probe / f"{FORMAT['inputs']}{rec.CHUNKS_SUFFIX}")
    from_chunks = replay_from_dump(probe, compare_outputs=True, device="cpu")
    from_torch = replay_from_dump(call_dirs(recorded)[0], compare_outputs=True, device="cpu")
    a, pair, table = from_chunks["args"]
    b, pair_b, table_b = from_torch["args"]
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(pair, pair_b))
    assert list(table) == list(table_b) and torch.equal(table["k"], table_b["k"])
    assert from_chunks["kwargs"] == from_torch["kwargs"] == {"scale": 2.0}
    out, plus_one, n = from_chunks["expected_result"]
    assert torch.equal(out, a * 2) and torch.equal(plus_one[1], torch.ones(3)) and n == 2
