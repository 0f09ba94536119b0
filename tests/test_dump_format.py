"""One owner of the dump format (docs/dump-format.md): the core's writer names its files,
directories, keys and bounds in csrc/core/dump_format.h and exports them as
_C.DUMP_FORMAT; the Python reader (flashinfer_native/record.py) takes its names from
there. These tests hold a dump the core writes to what the reader accepts."""

import json

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0

from flashinfer_native import _C, dumpdir
from flashinfer_native import record as rec

FORMAT = _C.DUMP_FORMAT


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

        @m.flashinfer_api
        def fmt_probe(a, pair, table, scale=1.0):
            return a * scale, [t + 1 for t in pair], len(table)

        @m.flashinfer_api
        def fmt_raises(x):
            raise ValueError("no")

        a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        fmt_probe(a, [torch.ones(2), torch.zeros(3)], {"k": torch.ones(1), 3: "v"}, scale=2.0)
        with pytest.raises(ValueError):
            fmt_raises(torch.ones(1))
    finally:
        restore_level_0()
    return tmp_path / "dumps"


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
