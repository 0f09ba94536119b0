"""Readers of a dump tree facing hostile input: FIFOs, deep nesting, huge lines, fields of
the wrong type (docs/security.md). Each ends in a one-line error, never a hang or a traceback."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import replay_helpers as h
import torch
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native import dumpdir, record
from flashinfer_native.replay import replay_from_dump

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOW = ["replay_helpers"]


@pytest.fixture
def root(tmp_path):
    return tmp_path / "dumps"


@pytest.fixture
def writer(root):
    return h.DumpWriter(str(root))


def rewrite_last_record(dump_dir, **changes):
    path = os.path.join(dump_dir, "metadata.jsonl")
    with open(path) as f:
        record = json.loads(f.read().splitlines()[-1])
    record.update(changes)
    with open(path, "w") as f:
        f.write(json.dumps(record) + "\n")


def run_python(source, timeout=60):
    """Run source in a child (a regression would hang: the child is killed instead)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def deep_json(levels):
    return "[" * levels + "]" * levels


# ---------------------------------------------------------------------------- FIFOs


def read_in_child(function, path):
    """What ``dumpdir.function(path)`` raises, from a child process (a hang is killed)."""
    proc = run_python(
        f"""
        from flashinfer_native import dumpdir
        try:
            dumpdir.{function}({str(path)!r})
        except ValueError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_load_tensors_on_a_fifo_refuses_instead_of_hanging(tmp_path):
    fifo = tmp_path / "inputs.pt"
    os.mkfifo(fifo)
    message = read_in_child("load_tensors", fifo)
    assert message == f"{fifo}: not a tensor file (not a regular file)\n"


def test_read_metadata_on_a_fifo_refuses_instead_of_hanging(tmp_path):
    os.mkfifo(tmp_path / "metadata.jsonl")
    message = read_in_child("read_metadata", tmp_path)
    assert message == f"{tmp_path}/metadata.jsonl: not a regular file (a FIFO)\n"


def test_dumps_on_a_fifo_session_file_is_a_one_line_error(tmp_path):
    os.mkfifo(tmp_path / "session.jsonl")
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer", "dumps", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert proc.stderr == f"Error: {tmp_path}/session.jsonl: not a regular file (a FIFO)\n"


def test_fifo_inputs_file_is_an_error_naming_it(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    path = os.path.join(writer.dirs[0], "inputs.pt")
    os.remove(path)
    os.mkfifo(path)
    with pytest.raises(ValueError, match=r"inputs\.pt: not a tensor file \(not a regular file\)"):
        replay_from_dump(writer.dirs[0], device="cpu", allow_modules=ALLOW)


# ------------------------------------------------------------------- deep nesting


def test_replay_of_metadata_nested_100k_deep_is_one_line(writer):
    writer.call(h.scale_add, 1.0, 2.0)
    with open(os.path.join(writer.dirs[0], "metadata.jsonl"), "w") as f:
        f.write('{"function_name": "scale_add", "input_metadata": {"arg_0": ')
        f.write(deep_json(100_000) + "}}\n")
    result = CliRunner().invoke(cli, ["replay", "--dir", writer.dirs[0], "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 3 and lines[1].endswith(
        "metadata.jsonl: line 1 is nested deeper than 100 levels"
    )


def test_metadata_nested_past_the_bound_is_refused_naming_line(writer):
    writer.call(h.scale_add, 1.0, 2.0)
    rewrite_last_record(writer.dirs[0], input_metadata={"arg_0": json.loads(deep_json(150))})
    with pytest.raises(ValueError, match=r"metadata\.jsonl: line 1 is nested deeper than 100"):
        dumpdir.read_metadata(writer.dirs[0])


def test_dumps_skips_a_session_line_nested_100k_deep(writer, root):
    writer.call(h.scale_add, 1.0, 2.0)
    with open(root / "session.jsonl", "a") as f:
        f.write(deep_json(100_000) + "\n")
    result = CliRunner().invoke(cli, ["dumps", "--dir", str(root)])
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "Unreadable records skipped: 1" in result.output
    assert "1 calls: 1 completed, 0 exception, 0 incomplete" in result.output


# --------------------------------------------------------------------- long lines


def test_session_line_longer_than_the_bound_is_skipped_and_reported(writer, root, monkeypatch):
    monkeypatch.setattr(record, "MAX_LINE_BYTES", 1000)
    writer.call(h.scale_add, 1.0, 2.0)
    with open(root / "session.jsonl", "a") as f:
        f.write(json.dumps({"function_name": "x" * 5000}) + "\n")
    writer.call(h.scale_add, 3.0, 4.0)
    result = CliRunner().invoke(cli, ["dumps", "--dir", str(root)])
    assert result.exit_code == 0
    assert "Lines longer than 1000 bytes skipped unread: 1 (line 3)" in result.output
    assert "2 calls: 2 completed, 0 exception, 0 incomplete" in result.output


def test_session_line_of_64_mib_is_never_held_in_memory(tmp_path):
    with open(tmp_path / "session.jsonl", "wb") as f:
        f.write(b'{"function_name": "' + b"x" * (64 << 20) + b'"}\n')
    proc = run_python(
        f"""
        import resource
        from flashinfer_native import calls
        peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        before = peak()
        summary = calls.summarize_session({str(tmp_path)!r})
        print(summary["oversized_lines"], (peak() - before) // 1024)
        """
    )
    lines, grown_mib = proc.stdout.split("]")
    assert lines == "[1", proc.stderr
    assert int(grown_mib) < 48  # the line is 64 MiB; at most 16 MiB of it is read at once


def test_metadata_line_longer_than_the_bound_is_an_error(writer, monkeypatch):
    writer.call(h.scale_add, 1.0, 2.0)
    monkeypatch.setattr(record, "MAX_LINE_BYTES", 100)
    with pytest.raises(ValueError, match=r"metadata\.jsonl: line 1 is longer than 100 bytes"):
        dumpdir.read_metadata(writer.dirs[0])


def test_metadata_file_larger_than_the_bound_is_an_error(writer, monkeypatch):
    writer.call(h.scale_add, 1.0, 2.0)
    size = os.path.getsize(os.path.join(writer.dirs[0], "metadata.jsonl"))
    monkeypatch.setattr(record, "MAX_METADATA_BYTES", size - 1)
    with pytest.raises(ValueError, match=rf"metadata file is larger than {size - 1} bytes"):
        dumpdir.read_metadata(writer.dirs[0])


# ----------------------------------------------------------------------- log level


def test_negative_log_level_warns_and_means_0():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    proc = subprocess.run(
        [sys.executable, "-c", "import flashinfer.api_logging as m; print(m._API_LOG_LEVEL)"],
        env=dict(env, FLASHINFER_LOGLEVEL="-3"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.stdout == "0\n"
    assert proc.stderr == (
        "[flashinfer] WARNING: invalid value FLASHINFER_LOGLEVEL=-3; using the default 0\n"
    )


@pytest.mark.parametrize(
    "value, in_effect",
    [
        ("nan,bogus", "the triggers in effect: nan"),
        ("bogus, exception,signal", "the triggers in effect: exception, signal"),
        ("bogus", "no trigger is in effect"),
    ],
)
def test_an_unknown_trigger_is_ignored_and_the_warning_names_those_in_effect(value, in_effect):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    proc = subprocess.run(
        [sys.executable, "-c", "import flashinfer.api_logging"],
        env=dict(env, FLASHINFER_LOGLEVEL="1", FLASHINFER_DUMP_ON=value),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.stderr == (
        "[flashinfer] WARNING: FLASHINFER_DUMP_ON: 'bogus' is not a trigger (known: exception, "
        f"nan, inf, nan_input, signal, exit) and is ignored; {in_effect}\n"
    )


# ------------------------------------------------------------- fields of wrong type


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"function_name": 7}, "field 'function_name' is a JSON number (7), expected string"),
        ({"module": ["os"]}, "field 'module' is a JSON array (['os']), expected string"),
        ({"self_id": [1]}, "field 'self_id' is a JSON array ([1]), expected number or string"),
        ({"process_id": {}}, "field 'process_id' is a JSON object ({}), expected number or"),
        ({"exception": "boom"}, "field 'exception' is a JSON string ('boom'), expected object"),
        ({"tensor_info": {"input_tensor_keys": 7}}, "'tensor_info.input_tensor_keys' is not a"),
        ({"tensor_info": {"output_tensor_keys": [1]}}, "'tensor_info.output_tensor_keys' is no"),
        ({"input_metadata": "x"}, "field 'input_metadata' is a JSON string ('x'), expected obj"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_record_field_of_wrong_type_is_named(writer, changes, message):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    rewrite_last_record(writer.dirs[0], **changes)
    with pytest.raises(ValueError) as info:
        replay_from_dump(writer.dirs[0], device="cpu", run=True, allow_modules=ALLOW)
    assert str(info.value).startswith(f"{writer.dirs[0]}/metadata.jsonl: line 1: ")
    assert message in str(info.value)


def test_cli_names_the_field_of_wrong_type_on_one_line(writer):
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    rewrite_last_record(writer.dirs[0], function_name=7)
    result = CliRunner().invoke(cli, ["replay", "--dir", writer.dirs[0], "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.splitlines()[1].endswith(
        "metadata.jsonl: line 1: field 'function_name' is a JSON number (7), expected string"
    )


@pytest.mark.parametrize(
    "arg, message",
    [
        ({"type": "list", "items": 7}, "arg_0: 'items' is a JSON int, expected a list"),
        ({"type": "dict", "items": [1]}, "arg_0[0]: dict item is not a {key, value} object"),
        (
            {"type": "dict", "items": [{"key": {"type": "list", "items": []}, "value": 1}]},
            "arg_0[0].key: dict key is not hashable",
        ),
        ({"type": "torch.device", "value": 7}, "arg_0: torch.device value 7 is not a string"),
        ({"type": "torch.device", "value": "gpu:x"}, "arg_0: 'gpu:x' is not a torch device"),
        ({"type": "torch.dtype", "value": "torch.nope"}, "arg_0: unknown torch dtype 'torch.nope'"),
        ({"type": "enum", "class": 7}, "arg_0: enum 'class' 7 is not a string naming an enum"),
        ({"type": "torch.Tensor", "tensor_key": ["x"]}, "arg_0: tensor ['x'] is not in the"),
    ],
    ids=lambda v: v["type"] if isinstance(v, dict) else None,
)
def test_encoded_argument_of_wrong_shape_is_named(writer, arg, message):
    writer.call(h.scale_add, 1.0, 2.0)
    rewrite_last_record(writer.dirs[0], input_metadata={"arg_0": arg})
    with pytest.raises(ValueError, match=r"metadata\.jsonl: ") as info:
        replay_from_dump(writer.dirs[0], device="cpu", allow_modules=ALLOW)
    assert message in str(info.value)


@pytest.mark.parametrize("section, key", [("input_metadata", "arg"), ("output_metadata", "result")])
def test_huge_positional_index_is_refused_not_allocated(writer, section, key):
    writer.call(h.scale_add, 1.0, 2.0)
    rewrite_last_record(writer.dirs[0], **{section: {f"{key}_999999999": 1}})
    with pytest.raises(ValueError, match=rf"{section}: {key}_999999999: position 999999999 is"):
        replay_from_dump(writer.dirs[0], device="cpu", compare_outputs=True, allow_modules=ALLOW)
