"""A dump mailed by an attacker, through every door (issue 21, docs/security.md).

Each hostile dump is built here from nothing: records written as JSON text, tensor files
written by hand. Each test checks that the effect is gone: no marker file, nothing
written outside the dump, an error within 5 s, one escaped line on stderr.
"""

import ast
import json
import os
import struct
import time
import tracemalloc
import zipfile

import pytest
import replay_helpers as h
import torch
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native import _C, dumpdir, record, registry
from flashinfer_native.replay import replay_from_dump
from flashinfer_native.repro import export_repro
from flashinfer_native.terminal import escape

DIR = "20250101_000000_000_pid1_{}_call0001"
ALLOW = ["replay_helpers"]
SECONDS = 5.0


# ------------------------------------------------------------------------ writing


def base_record(module, function_name, **extra):
    """A completed call's record as the recorder writes it, with nothing in it yet."""
    rec = {
        "function_name": function_name,
        "module": module,
        "call_sequence": 1,
        "timestamp": "20250101_000000_000",
        "process_id": 1,
        "input_metadata": {},
        "output_metadata": {},
        "tensor_info": {"input_tensor_keys": [], "output_tensor_keys": []},
        "tensor_details": {},
        "tensor_format": "torch",
        "function_signature": "(x)",
        "execution_status": "completed",
        "sequence": 1,
    }
    rec.update(extra)
    return rec


def write_dump(root, name, rec, inputs=None, session=True):
    """One call directory under ``root`` holding ``rec`` (a dict, or raw JSON text) and
    optional inputs; the record goes to the root's session.jsonl too."""
    path = os.path.join(root, DIR.format(name))
    os.makedirs(path)
    text = rec if isinstance(rec, str) else json.dumps(rec)
    with open(os.path.join(path, "metadata.jsonl"), "w") as f:
        f.write(text + "\n")
    if session:
        with open(os.path.join(root, "session.jsonl"), "a") as f:
            f.write(text + "\n")
    if inputs is not None:
        _C.save_tensors(os.path.join(path, "inputs.pt"), inputs)
    return path


def stride0_pt(path, size=(1 << 20, 1 << 20)):
    """A 1.5 KB .pt file: {'arg_0': a stride-0 float32 view of ``size`` over 32 bytes}."""
    out = [b"\x80\x02}q\x00(X\x05\x00\x00\x00arg_0"]
    out.append(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage")
    out.append(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu")
    out.append(b"\x8a\x08" + struct.pack("<q", 8) + b"tQ" + b"\x8a\x08" + struct.pack("<q", 0))
    for tup in (size, (0,) * len(size)):
        out.append(b"(" + b"".join(b"\x8a\x08" + struct.pack("<q", v) for v in tup) + b"t")
    out.append(b"\x89ccollections\nOrderedDict\n)RtRu.")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"".join(out))
        z.writestr("archive/data/0", b"\0" * 32)


# ------------------------------------------------------------------------ running


def invoke(*args):
    """Run the command line in-process: (exit code, stdout, stderr, seconds)."""
    start = time.monotonic()
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr, time.monotonic() - start


def assert_one_line_error(code, out, err, seconds, *fragments):
    """Exit status 1 or 2, one line on stderr holding ``fragments``, no traceback, in time."""
    assert code in (1, 2), out + err
    assert seconds < SECONDS, seconds
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err, err


def assert_printable(text):
    """Every line of the output holds no control character but the newline ending it."""
    for line in text.splitlines():
        assert line.isprintable(), repr(line)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "dumps"
    path.mkdir()
    return path


@pytest.fixture
def marker(tmp_path):
    """A file the attack would create; it must never exist."""
    path = tmp_path / "marker"
    yield path
    assert not path.exists(), "the dump ran code"


# --------------------------------------------------- finding 1: code in repro.py

REPRO_ATTACKS = {
    "enum_class_builtins_exec": lambda m: base_record(
        "replay_helpers",
        "reduce_rows",
        input_metadata={
            "kwarg_mode": {
                "type": "enum",
                "class": "builtins.exec",
                "name": "x",
                "value": f"open({str(m)!r}, 'w')",
            }
        },
    ),
    "module_os_function_system": lambda m: base_record("os", "system"),
    "function_os_system_of_flashinfer": lambda m: base_record("flashinfer.utils", "os.system"),
    "fullwidth_torch": lambda m: base_record("replay_helpers", "\uff54\uff4f\uff52\uff43\uff48"),
    "dunder_debug": lambda m: base_record("replay_helpers", "__debug__"),
    "unregistered_method": lambda m: base_record(
        "replay_helpers", "SegmentSumWrapper.touch", self_id=None
    ),
}


@pytest.mark.parametrize("attack", REPRO_ATTACKS)
def test_repro_refuses_what_replay_refuses_with_replay_s_message(root, tmp_path, marker, attack):
    call = write_dump(root, "a", REPRO_ATTACKS[attack](marker))
    out = tmp_path / "out"
    code, stdout, err, seconds = invoke(
        "repro", call, "-o", out, "--allow-module", "replay_helpers"
    )
    assert_one_line_error(code, stdout, err, seconds, "metadata.jsonl")
    assert not out.exists()


@pytest.mark.parametrize("attack", REPRO_ATTACKS)
def test_repro_and_replay_refuse_with_the_same_message(root, tmp_path, marker, attack):
    call = write_dump(root, "a", REPRO_ATTACKS[attack](marker))
    with pytest.raises(ValueError) as replayed:
        replay_from_dump(call, run=True, device="cpu", allow_modules=ALLOW)
    with pytest.raises(ValueError) as exported:
        export_repro(call, tmp_path / "out", allow_modules=ALLOW)
    assert str(exported.value) == str(replayed.value)
    assert not (tmp_path / "out").exists()


HOSTILE = '"); __import__("os").system("touch HOSTILE") #\n\x1b]52;c;SE9TVElMRQ==\x07\u202e'


def identifiers(tree):
    """Every name a script binds, reads, imports or passes by keyword."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.update(filter(None, [node.name, node.asname]))
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.arg)):
            out.add(getattr(node, "name", None) or node.arg)
    return out


def string_leaves(value, path=()):
    """Paths to every string in a parsed record, and to every key of its objects."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, ("key", key))
            yield from string_leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_leaves(item, (*path, i))
    elif isinstance(value, str):
        yield path


def with_hostile_text(rec, path):
    rec = json.loads(json.dumps(rec))
    *parents, last = path
    holder = rec
    for step in parents:
        holder = holder[step]
    if isinstance(last, tuple):
        holder[HOSTILE + last[1]] = holder.pop(last[1])
    else:
        holder[last] = HOSTILE
    return rec


@pytest.fixture(scope="module")
def clean_call(tmp_path_factory):
    """A recorded call with a tensor, an enum, a dtype, a device and a keyword argument,
    and the names its exported scripts use (as completed, raised and crashed calls)."""
    root = tmp_path_factory.mktemp("clean") / "dumps"
    writer = h.DumpWriter(root)
    writer.call(h.reduce_rows, torch.ones(2, 3), h.Reduction.MAX, dtype=torch.float64)
    path = writer.dirs[-1]
    with open(os.path.join(path, "metadata.jsonl")) as f:
        rec = json.loads(f.read().splitlines()[-1])
    names = set()
    for n, status in enumerate(("completed", "exception", "inputs_saved")):
        variant = dict(rec, execution_status=status, exception={"type": "E", "message": "m"})
        with open(os.path.join(path, "metadata.jsonl"), "w") as f:
            f.write(json.dumps(variant) + "\n")
        out = tmp_path_factory.mktemp("clean_out") / str(n)
        export_repro(path, out, allow_modules=ALLOW)
        with open(out / "repro.py") as f:
            names |= identifiers(ast.parse(f.read()))
    return path, rec, names


def test_hostile_text_in_any_field_never_becomes_code_in_repro(clean_call, tmp_path):
    path, rec, names = clean_call
    paths = list(string_leaves(rec))
    assert len(paths) > 30
    written = refused = 0
    for n, leaf in enumerate(paths):
        with open(os.path.join(path, "metadata.jsonl"), "w") as f:
            f.write(json.dumps(with_hostile_text(rec, leaf)) + "\n")
        out = tmp_path / str(n)
        try:
            export_repro(path, out, allow_modules=ALLOW)
        except ValueError as exc:
            assert "\n" not in str(exc) or "HOSTILE" in str(exc), (leaf, exc)
            assert not out.exists()
            refused += 1
            continue
        with open(out / "repro.py") as f:
            tree = ast.parse(f.read())
        extra = identifiers(tree) - names
        assert not extra, (leaf, extra)
        written += 1
    assert written > 10 and refused > 3, (written, refused)
    assert not os.path.exists("HOSTILE")


# ------------------------------------------- finding 2: arguments that reach the JIT


def jit_args_record(target):
    """BatchDecodeWithPagedKVCacheWrapper.__init__ whose jit_args write C++ into ``target``."""
    source = 'extern "C" int pwn() { return system("touch MARKER"); }'
    return base_record(
        "flashinfer.decode",
        "BatchDecodeWithPagedKVCacheWrapper.__init__",
        self_id=1,
        input_metadata={
            "arg_0": {"type": "BatchDecodeWithPagedKVCacheWrapper", "repr": "<object>"},
            "kwarg_jit_args": {
                "type": "list",
                "items": [str(target), "torch.float16", source, [], [], [], [], [], [], []],
            },
        },
        tensor_info={"input_tensor_keys": ["arg_1"], "output_tensor_keys": []},
    )


def test_replay_refuses_jit_args_of_a_wrapper_naming_the_argument(root, tmp_path):
    target = tmp_path / "outside"
    write_dump(root, "a", jit_args_record(target), inputs={"arg_1": torch.zeros(8)})
    code, out, err, seconds = invoke("replay", "--dir", root, "--device", "cpu")
    assert code == 1 and seconds < SECONDS and err == ""
    line = out.splitlines()[1]
    assert "ReplayRefused" in line and "argument 'jit_args' reaches FlashInfer's JIT" in line
    assert "--allow-jit-args" in line
    assert not target.exists()


def test_allow_jit_args_lets_the_call_through(root, tmp_path):
    call = write_dump(root, "a", jit_args_record(tmp_path / "x"), inputs={"arg_1": torch.zeros(8)})
    result = replay_from_dump(call, run=True, device="cpu", allow_jit_args=True)
    # the mirror implements no JIT: the call itself says so, the allow-list let it run
    assert result["execution_error"].startswith("NotImplementedError: jit_args")


def test_repro_refuses_jit_args_as_replay_does(root, tmp_path):
    call = write_dump(root, "a", jit_args_record(tmp_path / "x"), inputs={"arg_1": torch.zeros(8)})
    code, out, err, seconds = invoke("repro", call, "-o", tmp_path / "out")
    assert_one_line_error(code, out, err, seconds, "argument 'jit_args' reaches FlashInfer's JIT")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["../../x", ["x"], {"type": "T", "repr": "../../x"}])
def test_text_where_a_number_belongs_is_refused(root, value):
    rec = base_record(
        "replay_helpers",
        "pad_rows",
        input_metadata={"kwarg_multiple": value},
        tensor_info={"input_tensor_keys": ["arg_0"], "output_tensor_keys": []},
    )
    call = write_dump(root, "a", rec, inputs={"arg_0": torch.ones(3, 2)})
    with pytest.raises(registry.ReplayRefused, match="'multiple' is annotated as a number"):
        replay_from_dump(call, run=True, device="cpu", allow_modules=ALLOW)


def test_numbers_where_numbers_belong_replay(root):
    rec = base_record(
        "replay_helpers",
        "pad_rows",
        input_metadata={"kwarg_multiple": 4},
        tensor_info={"input_tensor_keys": ["arg_0"], "output_tensor_keys": []},
    )
    call = write_dump(root, "a", rec, inputs={"arg_0": torch.ones(3, 2)})
    result = replay_from_dump(call, run=True, device="cpu", allow_modules=ALLOW)
    assert result["execution_result"].shape == (4, 2)


# ------------------------------------------------ finding 3: work bounded per tensor


def test_stride0_view_of_2_to_the_40_elements_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "inputs.pt"
    stride0_pt(path)
    assert path.stat().st_size < 2048
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        _C.load_tensors(str(path))
    assert time.monotonic() - start < SECONDS
    assert str(info.value) == (
        f"{path}: tensor 'arg_0': a view of 1099511627776 elements over a storage of 8 "
        "elements is refused (a view may repeat stored elements up to 64 times plus "
        "16777216, and hold at most 17179869184 elements)"
    )


def test_broadcast_within_the_bound_loads(tmp_path):
    path = tmp_path / "inputs.pt"
    stride0_pt(path, size=(1 << 12, 1 << 12))
    assert _C.load_tensors(str(path))["arg_0"].shape == (4096, 4096)


def stride0_session(root, name="a"):
    call = write_dump(
        root,
        name,
        base_record(
            "replay_helpers",
            "scale_add",
            tensor_info={"input_tensor_keys": ["arg_0"], "output_tensor_keys": []},
        ),
    )
    stride0_pt(os.path.join(call, "inputs.pt"))
    return call


def test_report_and_diff_of_a_stride0_view_end_in_seconds(root, tmp_path):
    stride0_session(root)
    other = tmp_path / "other"
    other.mkdir()
    stride0_session(other)
    code, out, err, seconds = invoke("report", root, "-o", tmp_path / "r.html")
    assert code == 0 and seconds < SECONDS, out + err
    assert "a view of 1099511627776 elements" in (tmp_path / "r.html").read_text()
    code, out, err, seconds = invoke("diff", root, other)
    assert code == 1 and seconds < SECONDS and "Traceback" not in out + err
    assert "unreadable tensors" in out and "a view of 1099511627776 elements" in out


def test_statistics_walk_a_broadcast_once_and_count_it_whole():
    x = torch.tensor([1.0, float("nan"), 3.0])
    view = x.expand(1 << 20, 3)
    stats = _C.tensor_stats(view)
    assert stats["nan_count"] == 1 << 20 and stats["min"] == 1.0 and stats["max"] == 3.0
    hist = _C.tensor_histogram(view, bins=2)
    assert hist["counts"] == [1 << 20, 1 << 20] and hist["nan"] == 1 << 20
    assert _C.tensor_difference(view, view.contiguous()) == (0.0, 0.0, 0)


def test_overlapping_view_beyond_its_storage_is_not_walked():
    x = torch.arange(16.0)
    view = x.as_strided((4, 13), (1, 1))  # 52 elements over 16
    with pytest.raises(ValueError, match="a view of 52 elements over 16 stored elements"):
        _C.tensor_stats(view)
    with pytest.raises(ValueError, match="tensor_histogram: a view of 52 elements"):
        _C.tensor_histogram(view)
    with pytest.raises(ValueError, match="tensor_difference: a and b: a view of 52"):
        _C.tensor_difference(view, view)


# ------------------------------------------- finding 4: one bounded session reader


def test_report_skips_a_session_line_100k_deep(root, tmp_path):
    write_dump(root, "a", base_record("replay_helpers", "scale_add"))
    with open(root / "session.jsonl", "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    code, out, err, seconds = invoke("report", root, "-o", tmp_path / "r.html")
    assert code == 0 and seconds < SECONDS and "Traceback" not in out + err


def test_report_reads_a_long_session_line_in_bounded_memory(root, tmp_path, monkeypatch):
    from flashinfer_native.report import write_report

    write_dump(root, "a", base_record("replay_helpers", "scale_add"))
    with open(root / "session.jsonl", "a") as f:
        f.write('{"trigger": "' + "x" * (24 << 20) + '"}\n')
    monkeypatch.setattr(record, "MAX_LINE_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        done = write_report(root, tmp_path / "r.html")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done["triggers"] == 0
    assert peak < 8 << 20, peak


# ------------------------------------- finding 5: numbers, and one-line errors

NUMBER_ATTACKS = {
    "sequence": ("Infinity", "field 'sequence' is Infinity"),
    "call_sequence": ("Infinity", "field 'call_sequence' is Infinity"),
    "process_id": ("1e400", "field 'process_id' is Infinity"),
    "self_id": ("-1", "field 'self_id' is a JSON number (-1)"),
    "sequence ": ("123456789012345678901234567890", "field 'sequence' is a JSON number"),
}


def numbers_dump(root, field, text):
    rec = base_record("replay_helpers", "scale_add")
    line = json.dumps(rec).replace('"sequence": 1', f'"{field.strip()}": {text}')
    if field.strip() not in ("sequence",):
        line = line[:-1] + f', "{field.strip()}": {text}' + "}"
    return write_dump(root, "a", line)


@pytest.mark.parametrize("field", NUMBER_ATTACKS)
@pytest.mark.parametrize("command", ["replay", "repro", "report", "dumps", "diff"])
def test_a_non_finite_or_huge_number_is_one_line_naming_the_field(root, tmp_path, field, command):
    text, message = NUMBER_ATTACKS[field]
    call = numbers_dump(root, field, text)
    args = {
        "replay": ("replay", "--dir", call),
        "repro": ("repro", call, "-o", tmp_path / "out"),
        "report": ("report", root, "-o", tmp_path / "r.html"),
        "dumps": ("dumps", "--dir", root),
        "diff": ("diff", root, root),
    }[command]
    code, out, err, seconds = invoke(*args)
    assert seconds < SECONDS and "Traceback" not in out + err
    if command in ("replay", "diff"):  # a line per call on stdout, as for any failed call
        assert code == 1 and message in out and err == "", out + err
    else:
        assert_one_line_error(code, out, err, seconds, message)


@pytest.mark.parametrize(
    "trigger, message",
    [
        ({"record_type": "trigger", "trigger": "nan", "time": -1e300}, "field 'time' is a JSON"),
        ({"record_type": "trigger", "trigger": "nan", "time": 1e300}, "field 'time' is a JSON"),
        ({"record_type": "trigger", "trigger": "nan", "time": "soon"}, "field 'time' is a JSON"),
    ],
)
@pytest.mark.parametrize("command", ["report", "dumps"])
def test_a_trigger_record_with_a_bad_time_is_one_line(root, tmp_path, trigger, message, command):
    write_dump(root, "a", base_record("replay_helpers", "scale_add"))
    with open(root / "session.jsonl", "a") as f:
        f.write(json.dumps(trigger) + "\n")
    args = (
        ("report", root, "-o", tmp_path / "r.html")
        if command == "report"
        else ("dumps", "--dir", root)
    )
    assert_one_line_error(*invoke(*args), message)


def test_a_trigger_record_without_trigger_is_shown(root):
    write_dump(root, "a", base_record("replay_helpers", "scale_add"))
    with open(root / "session.jsonl", "a") as f:
        f.write(json.dumps({"record_type": "trigger", "dump_dir": "x", "time": 1.0}) + "\n")
    code, out, err, _ = invoke("dumps", "--dir", root)
    assert code == 0 and "  trigger at x (pid None)" in out, out + err


def test_a_huge_position_is_refused_in_replay_and_repro_alike(root, tmp_path):
    rec = base_record("replay_helpers", "scale_add", input_metadata={"arg_3000000": 1})
    call = write_dump(root, "a", rec)
    message = "arg_3000000: position 3000000 is beyond the 4096 accepted"
    with pytest.raises(ValueError, match=message):
        replay_from_dump(call, allow_modules=ALLOW)
    with pytest.raises(ValueError, match=message):
        export_repro(call, tmp_path / "out", allow_modules=ALLOW)


def test_a_unicode_digit_is_no_position(root):
    rec = base_record(
        "replay_helpers", "scale_add", input_metadata={"arg_\u00b2": 1, "arg_\u0663": 2}
    )
    call = write_dump(root, "a", rec)
    assert replay_from_dump(call, allow_modules=ALLOW)["args"] == []


# --------------------------------------------------- finding 6: terminal injection

FORGED = "x\nSummary: 1 passed, 0 failed/mismatch\n\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J"


def test_replay_prints_a_hostile_name_and_message_escaped_on_one_line(root):
    rec = base_record("replay_helpers" + FORGED, "scale_add" + FORGED)
    write_dump(root, "a", rec)
    code, out, err, _ = invoke("replay", "--dir", root, "--device", "cpu")
    assert code == 1 and err == ""
    assert_printable(out)
    lines = out.splitlines()
    assert len(lines) == 3 and lines[-1] == "Summary: 0 passed, 1 failed/mismatch"
    assert "\\x0aSummary: 1 passed" in lines[1] and "\\x1b]52;c;" in lines[1]


def test_dumps_prints_hostile_names_and_messages_escaped(root):
    rec = base_record(
        "replay_helpers",
        "scale_add" + FORGED,
        execution_status="exception",
        exception={"type": "E" + FORGED, "message": FORGED},
    )
    write_dump(root, "a", rec)
    code, out, err, _ = invoke("dumps", "--dir", root)
    assert code == 0 and err == ""
    assert_printable(out)
    assert not any(line.startswith("Summary") for line in out.splitlines())


def test_escape_turns_every_control_character_into_a_visible_code():
    assert escape("a\nb\x1b[0m\x07\x9b\u202e\u2028c") == "a\\x0ab\\x1b[0m\\x07\\x9b\\u202e\\u2028c"
    assert escape("ok ✅ ünïcode") == "ok ✅ ünïcode"
    assert escape("x" * 10, limit=4) == "xxxx... (6 more characters)"


# --------------------------------------------------------------------- symlinks

SECRET = "SECRET-BYTES-OF-ANOTHER-FILE"


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside.txt"
    path.write_text(SECRET + "\n")
    return path


def test_a_metadata_file_that_is_a_link_is_refused_without_reading_it(root, tmp_path, outside):
    call = root / DIR.format("a")
    call.mkdir()
    (call / "metadata.jsonl").symlink_to(outside)
    for args in (
        ("replay", "--dir", call),
        ("repro", call, "-o", tmp_path / "out"),
        ("dumps", "--dir", root),
        ("report", root, "-o", tmp_path / "r.html"),
        ("diff", root, root),
    ):
        code, out, err, seconds = invoke(*args)
        assert SECRET not in out + err, args
        assert seconds < SECONDS and "Traceback" not in out + err
    with pytest.raises(ValueError, match="is a symbolic link; links inside a dump are not"):
        dumpdir.read_metadata(call)


def test_a_tensor_file_that_is_a_link_is_refused(root, tmp_path):
    elsewhere = tmp_path / "elsewhere.pt"
    _C.save_tensors(str(elsewhere), {"arg_0": torch.ones(2)})
    rec = base_record(
        "replay_helpers",
        "scale_add",
        tensor_info={"input_tensor_keys": ["arg_0"], "output_tensor_keys": []},
    )
    call = write_dump(root, "a", rec)
    os.symlink(elsewhere, os.path.join(call, "inputs.pt"))
    with pytest.raises(ValueError, match=r"inputs\.pt: is a symbolic link"):
        replay_from_dump(call, allow_modules=ALLOW)


def test_a_session_file_that_is_a_link_is_refused(root, outside):
    write_dump(root, "a", base_record("replay_helpers", "scale_add"), session=False)
    (root / "session.jsonl").symlink_to(outside)
    code, out, err, seconds = invoke("dumps", "--dir", root)
    assert_one_line_error(code, out, err, seconds, "session.jsonl: is a symbolic link")
    assert SECRET not in out + err


def test_a_dump_directory_that_is_a_link_is_not_a_dump(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_dump(elsewhere if elsewhere.mkdir() is None else elsewhere, "a", base_record("x", "y"))
    (root / DIR.format("b")).symlink_to(elsewhere / DIR.format("a"))
    assert dumpdir.find_dump_dirs(root) == []


# ------------------------------------------- the corpus, through every subcommand

CORPUS = {
    "enum_exec": lambda root, m: write_dump(
        root, "a", REPRO_ATTACKS["enum_class_builtins_exec"](m)
    ),
    "os_system": lambda root, m: write_dump(root, "a", base_record("os", "system")),
    "jit_args": lambda root, m: write_dump(
        root, "a", jit_args_record(m), inputs={"arg_1": torch.zeros(8)}
    ),
    "stride0": lambda root, m: stride0_session(root),
    "sequence_inf": lambda root, m: numbers_dump(root, "sequence", "Infinity"),
    "forged_name": lambda root, m: write_dump(root, "a", base_record("m" + FORGED, "f" + FORGED)),
    "deep_metadata": lambda root, m: write_dump(root, "a", "[" * 100_000 + "]" * 100_000),
    "not_json": lambda root, m: write_dump(root, "a", '{"function_name": "x", \x1b[2J'),
    "wrong_types": lambda root, m: write_dump(
        root, "a", base_record("replay_helpers", "scale_add", input_metadata="x" + FORGED)
    ),
}
COMMANDS = ("replay", "repro", "diff", "report", "dumps")


@pytest.mark.parametrize("case", CORPUS)
def test_every_subcommand_over_the_hostile_corpus(root, tmp_path, marker, case):
    call = CORPUS[case](root, marker)
    for command in COMMANDS:
        args = {
            "replay": ("replay", "--dir", root, "--device", "cpu"),
            "repro": ("repro", call, "-o", tmp_path / f"out_{case}"),
            "report": ("report", root, "-o", tmp_path / "r.html"),
            "dumps": ("dumps", "--dir", root),
            "diff": ("diff", root, root),
        }[command]
        code, out, err, seconds = invoke(*args)
        where = f"{command} over {case}: {out}{err}"
        assert seconds < SECONDS, where
        assert "Traceback" not in out + err, where
        assert_printable(out + err)
        assert err.count("\n") <= 1, where
        if command in ("replay", "repro"):
            assert code in (1, 2), where
        else:
            assert code in (0, 1, 2), where
