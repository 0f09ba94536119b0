"""Replaying a stranger's dump runs nothing it names (docs/security.md).

Every hostile dump below would create the file ``PWNED`` if replay imported or called
what it names. Each is tried through ``replay_from_dump(run=False)``, ``run=True`` and
the ``flashinfer replay`` command, and the file must never appear.
"""

import json
import os
import subprocess
import sys

import pytest
import replay_helpers as h
import torch
from click.testing import CliRunner
from logging_utils import reload_api_logging, restore_level_0

from flashinfer.__main__ import cli
from flashinfer_native import registry
from flashinfer_native.registry import ReplayRefused
from flashinfer_native.replay import replay_from_dump, replay_sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER_MODULE = "h10_marker_module"


@pytest.fixture
def logmod(monkeypatch):
    """Factory: re-import api_logging with the given env; restores level 0 afterwards."""
    yield lambda **env: reload_api_logging(monkeypatch, **env)
    restore_level_0()


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The file a successful attack creates, and a module that creates it on import."""
    path = tmp_path / "PWNED"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{MARKER_MODULE}.py").write_text(
        f"import enum\nopen({str(path)!r}, 'w').close()\n\nclass Color(enum.Enum):\n    RED = 1\n"
    )
    monkeypatch.syspath_prepend(str(lib))
    yield path
    sys.modules.pop(MARKER_MODULE, None)


def write_dump(root, module, function_name, input_metadata, name="call0001", **extra):
    """A one-record dump directory (no tensors) under ``root``."""
    d = root / f"20250101_000000_000_pid1_{name}"
    d.mkdir(parents=True)
    record = {
        "function_name": function_name,
        "module": module,
        "call_sequence": 1,
        "timestamp": "20250101_000000_000",
        "process_id": 1,
        "input_metadata": input_metadata,
        "output_metadata": {},
        "tensor_info": {"input_tensor_keys": [], "output_tensor_keys": []},
        "execution_status": "completed",
        **extra,
    }
    (d / "metadata.jsonl").write_text(json.dumps(record) + "\n")
    return str(d)


def self_placeholder(cls_name):
    return {"type": cls_name, "repr": f"<{cls_name} object>"}


def seq(*items):
    return {"type": "list", "length": len(items), "items": list(items), "truncated": False}


def enum_of(cls_path, value):
    return {"type": "enum", "name": "X.Y", "value": value, "class": cls_path}


# (module, function_name, input_metadata, extra record fields) per attack; marker -> case.
FUNCTION_ATTACKS = {
    "os.system": lambda m: ("os", "system", {"arg_0": f"touch {m}"}, {}),
    "posix.system": lambda m: ("posix", "system", {"arg_0": f"touch {m}"}, {}),
    "builtins.eval": lambda m: ("builtins", "eval", {"arg_0": f"open({str(m)!r}, 'w')"}, {}),
    "subprocess.Popen": lambda m: ("subprocess", "Popen", {"arg_0": seq("touch", str(m))}, {}),
    "subprocess.Popen.__init__": lambda m: (
        "subprocess",
        "Popen.__init__",
        {"arg_0": self_placeholder("Popen"), "arg_1": seq("touch", str(m))},
        {"self_id": 7},
    ),
    "importlib.import_module": lambda m: (
        "importlib",
        "import_module",
        {"arg_0": MARKER_MODULE},
        {},
    ),
    "module named by the dump": lambda m: (MARKER_MODULE, "anything", {}, {}),
    "side-effect __init__ of an allowed module": lambda m: (
        "replay_helpers",
        "TouchOnInit.__init__",
        {"arg_0": self_placeholder("TouchOnInit"), "arg_1": str(m)},
        {"self_id": 7},
    ),
    "undecorated method of an API class": lambda m: (
        "replay_helpers",
        "SegmentSumWrapper.touch",
        {"arg_0": self_placeholder("SegmentSumWrapper"), "arg_1": str(m)},
        {"self_id": 7},
    ),
}

ENUM_ATTACKS = {
    "os.system": lambda m: enum_of("os.system", f"touch {m}"),
    "posix.system": lambda m: enum_of("posix.system", f"touch {m}"),
    "builtins.eval": lambda m: enum_of("builtins.eval", f"open({str(m)!r}, 'w')"),
    "subprocess.Popen": lambda m: enum_of("subprocess.Popen", ["touch", str(m)]),
    "importlib.import_module": lambda m: enum_of("importlib.import_module", MARKER_MODULE),
    "enum of a module named by the dump": lambda m: enum_of(f"{MARKER_MODULE}.Color", 1),
    "non-enum class of an allowed module": lambda m: enum_of("replay_helpers.TouchOnInit", str(m)),
    "API function of an allowed module": lambda m: enum_of("replay_helpers.scale_add", 1),
}


def function_dump(tmp_path, marker, attack):
    module, name, metadata, extra = FUNCTION_ATTACKS[attack](marker)
    return write_dump(tmp_path / "dumps", module, name, metadata, **extra)


def enum_dump(tmp_path, marker, attack):
    metadata = {"arg_0": ENUM_ATTACKS[attack](marker)}
    return write_dump(tmp_path / "dumps", "replay_helpers", "reduce_rows", metadata)


def assert_nothing_ran(marker):
    assert not marker.exists(), "the attack ran"
    assert MARKER_MODULE not in sys.modules, "the module a dump named was imported"


def cli_replay(dump_dir, *extra):
    return CliRunner().invoke(cli, ["replay", "--dir", dump_dir, "--device", "cpu", *extra])


def assert_one_refusal_line(result, dump_dir):
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Replaying single dump from {dump_dir}..."
    assert "❌ Error: ReplayRefused: " in lines[1] and "; to allow it, " in lines[1]
    assert lines[2:] == ["Summary: 0 passed, 1 failed/mismatch"]


# ------------------------------------------------------- functions and classes named


@pytest.mark.parametrize("attack", sorted(FUNCTION_ATTACKS))
def test_loading_a_dump_naming_a_function_runs_nothing(tmp_path, marker, attack):
    dump = function_dump(tmp_path, marker, attack)
    result = replay_from_dump(dump, device="cpu", allow_modules=["replay_helpers"])
    assert result["metadata"]["function_name"] == FUNCTION_ATTACKS[attack](marker)[1]
    assert_nothing_ran(marker)


@pytest.mark.parametrize("attack", sorted(FUNCTION_ATTACKS))
def test_running_a_dump_naming_an_unregistered_function_is_refused(tmp_path, marker, attack):
    dump = function_dump(tmp_path, marker, attack)
    with pytest.raises(ReplayRefused, match=r"metadata\.jsonl: .*(allow|registered)"):
        replay_from_dump(dump, device="cpu", run=True, allow_modules=["replay_helpers"])
    assert_nothing_ran(marker)


@pytest.mark.parametrize(
    "kind, attack",
    [("function", a) for a in sorted(FUNCTION_ATTACKS)]
    + [("enum", a) for a in sorted(ENUM_ATTACKS)],
)
def test_cli_replay_of_a_hostile_dump_is_refused_on_one_line(tmp_path, marker, kind, attack):
    dump = (function_dump if kind == "function" else enum_dump)(tmp_path, marker, attack)
    result = cli_replay(dump, "--allow-module", "replay_helpers")
    assert_one_refusal_line(result, dump)
    assert_nothing_ran(marker)


@pytest.mark.parametrize(
    "attack", [a for a in sorted(FUNCTION_ATTACKS) if a != "module named by the dump"]
)
def test_allowing_the_module_still_refuses_what_is_not_registered(tmp_path, marker, attack):
    dump = function_dump(tmp_path, marker, attack)
    trusted = ["os", "posix", "builtins", "subprocess", "importlib", "replay_helpers"]
    with pytest.raises(ReplayRefused, match="is not a registered @flashinfer_api"):
        replay_from_dump(dump, device="cpu", run=True, allow_modules=trusted)
    assert_nothing_ran(marker)


def test_unregistered_method_refused_on_an_object_replay_built(tmp_path, marker):
    writer = h.DumpWriter(str(tmp_path / "dumps"))
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    path = writer.dirs[1] + "/metadata.jsonl"
    record = json.loads(open(path).read().splitlines()[-1])
    record["function_name"] = "SegmentSumWrapper.touch"
    record["input_metadata"] = {"arg_0": record["input_metadata"]["arg_0"], "arg_1": str(marker)}
    record["tensor_info"]["input_tensor_keys"] = []
    with open(path, "w") as f:
        f.write(json.dumps(record) + "\n")
    results = replay_sequence(writer.root, device="cpu", allow_modules=["replay_helpers"])
    assert "comparison_match" in results[0] and results[0]["comparison_match"] is True
    assert results[1]["error"].startswith("ReplayRefused: ")
    assert "'SegmentSumWrapper.touch'" in results[1]["error"]
    assert not marker.exists()


def test_instance_attribute_cannot_stand_in_for_a_registered_method(tmp_path, marker):
    writer = h.DumpWriter(str(tmp_path / "dumps"))
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2]), 1.0)
    planned = h.SegmentSumWrapper(torch.zeros(4, dtype=torch.int8))
    planned.plan = lambda *args: marker.touch()
    objects = {(os.getpid(), id(wrapper)): planned}
    replay_from_dump(
        writer.dirs[1],
        device="cpu",
        run=True,
        object_registry=objects,
        allow_modules=["replay_helpers"],
    )
    assert planned.indptr == [0, 2]
    assert_nothing_ran(marker)


def test_allowed_module_that_is_not_imported_is_refused_not_imported(tmp_path, marker):
    dump = write_dump(tmp_path / "dumps", MARKER_MODULE, "anything", {})
    with pytest.raises(
        ReplayRefused,
        match=rf"module '{MARKER_MODULE}' of function_name 'anything' is not imported \(replay "
        rf"imports only the modules that allow patterns name\); to allow it, pass "
        rf"--allow-module {MARKER_MODULE} ",
    ):
        replay_from_dump(dump, device="cpu", run=True, allow_modules=["h10_*"])
    assert_nothing_ran(marker)


def test_replay_helpers_need_allowing(tmp_path):
    writer = h.DumpWriter(str(tmp_path / "dumps"))
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    with pytest.raises(
        ReplayRefused,
        match=r"module 'replay_helpers' is not an allowed module \(allowed: flashinfer\); "
        r".*pass --allow-module replay_helpers \(Python: allow_modules=\['replay_helpers'\]\)",
    ):
        replay_from_dump(writer.dirs[0], device="cpu", run=True)


def test_cli_without_allow_module_refuses_user_module_and_says_how(tmp_path):
    writer = h.DumpWriter(str(tmp_path / "dumps"))
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    result = cli_replay(writer.dirs[0])
    assert_one_refusal_line(result, writer.dirs[0])
    assert "--allow-module replay_helpers" in result.output


# ----------------------------------------------------------------------- enum classes


@pytest.mark.parametrize("attack", sorted(ENUM_ATTACKS))
@pytest.mark.parametrize("run", [False, True])
def test_enum_naming_anything_but_an_allowed_enum_is_refused(tmp_path, marker, attack, run):
    dump = enum_dump(tmp_path, marker, attack)
    with pytest.raises(ReplayRefused, match=r"metadata\.jsonl: arg_0: enum class "):
        replay_from_dump(dump, device="cpu", run=run, allow_modules=["replay_helpers"])
    assert_nothing_ran(marker)


def test_enum_of_an_unallowed_module_message_names_field_and_how_to_allow(tmp_path, marker):
    dump = enum_dump(tmp_path, marker, "os.system")
    with pytest.raises(ReplayRefused) as info:
        replay_from_dump(dump, device="cpu")
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith(
        "arg_0: enum class 'os.system' is not in an allowed module (allowed: flashinfer); "
        "enums are rebuilt only from allowed modules; to allow it, pass --allow-module os "
        "(Python: allow_modules=['os']) if you trust that module"
    )


def decoded_enum(tmp_path, encoded, allow_modules=None):
    """The argument replay_from_dump(run=False) rebuilds from one encoded enum."""
    dump = write_dump(tmp_path / "dumps", "replay_helpers", "reduce_rows", {"arg_0": encoded})
    return replay_from_dump(dump, device="cpu", allow_modules=allow_modules)["args"][0]


def test_allowed_enum_is_rebuilt_by_name(tmp_path):
    encoded = enum_of("replay_helpers.Reduction", "max") | {"name": "Reduction.MAX"}
    assert decoded_enum(tmp_path, encoded, ["replay_helpers"]) is h.Reduction.MAX


def test_allowed_enum_is_rebuilt_by_value_when_the_name_is_unknown(tmp_path):
    encoded = enum_of("replay_helpers.Reduction", "sum")
    assert decoded_enum(tmp_path, encoded, ["replay_helpers"]) is h.Reduction.SUM


def test_flashinfer_enums_need_no_allowing(tmp_path):
    import flashinfer

    encoded = enum_of("flashinfer.fp4_quantization.SfLayout", 1)
    assert decoded_enum(tmp_path, encoded) is flashinfer.SfLayout.layout_8x4


# ------------------------------------------------------------------ the real command


def test_real_command_refuses_os_system_in_module_and_in_enum(tmp_path, marker):
    module_dump = function_dump(tmp_path, marker, "os.system")
    enum_d = write_dump(
        tmp_path / "dumps",
        "flashinfer.gemm",
        "bmm_fp8",
        {"arg_0": ENUM_ATTACKS["os.system"](marker)},
        name="call0002",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer", "replay", "--dir", str(tmp_path / "dumps")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and "Traceback" not in proc.stdout + proc.stderr
    assert f"({os.path.basename(module_dump)}): ❌ Error: ReplayRefused: " in lines[1]
    assert f"({os.path.basename(enum_d)}): ❌ Error: ReplayRefused: " in lines[2]
    assert lines[3] == "Summary: 0 passed, 2 failed/mismatch"
    assert not marker.exists()


def test_allow_module_that_cannot_be_imported_is_one_line_and_exit_1(tmp_path):
    dump = write_dump(tmp_path / "dumps", "flashinfer", "anything", {})
    result = cli_replay(dump, "--allow-module", "no_such_module_h10")
    assert result.exit_code == 1
    assert "cannot import module 'no_such_module_h10'" in result.output
    assert len(result.output.splitlines()) == 1


# -------------------------------------------------------------------------- registry


def test_decorator_registers_at_level_0_and_returns_the_function(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="0")

    def probe():
        return 1

    assert m.flashinfer_api(probe) is probe
    assert registry._registered[(__name__, probe.__qualname__)] is probe


def test_replay_calls_the_logging_wrapper_above_level_0(logmod, tmp_path, capfd):
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST="stderr")
    m.flashinfer_api(_plain_double)
    dump = write_dump(tmp_path / "dumps", __name__, "_plain_double", {"arg_0": 21})
    result = replay_from_dump(dump, device="cpu", run=True, allow_modules=[__name__])
    assert result["execution_result"] == 42
    assert "FlashInfer API Call: _plain_double" in capfd.readouterr().err


def _plain_double(x):
    return 2 * x


def test_decorator_over_an_api_is_kept_when_replayed(logmod, tmp_path, monkeypatch):
    m = logmod(FLASHINFER_LOGLEVEL="0")
    seen = []
    api = m.flashinfer_api(_plain_double)

    def outer(*args, **kwargs):
        seen.append(args)
        return api(*args, **kwargs)

    outer.__wrapped__ = api
    monkeypatch.setattr(sys.modules[__name__], "_plain_double", outer)
    dump = write_dump(tmp_path / "dumps", __name__, "_plain_double", {"arg_0": 4})
    result = replay_from_dump(dump, device="cpu", run=True, allow_modules=[__name__])
    assert result["execution_result"] == 8 and seen == [(4,)]


def test_patterns_allow_submodules_and_wildcards():
    patterns = registry.allowed_patterns(["mypkg", "other_*"])
    assert patterns == ("flashinfer", "mypkg", "other_*")
    for name in ("flashinfer", "flashinfer.gemm", "mypkg.ops.x", "other_lib"):
        assert registry.module_allowed(name, patterns), name
    for name in ("flashinfer_evil", "mypkgx", "os", "", None, 7):
        assert not registry.module_allowed(name, patterns), name


def test_allow_module_pattern_that_is_not_a_string_is_a_type_error():
    with pytest.raises(TypeError, match=r"allow_modules: 3 is not a module name pattern"):
        registry.allowed_patterns(["ok", 3])


def test_import_allowed_imports_only_names_written_in_patterns(marker):
    registry.import_allowed([f"{MARKER_MODULE[:4]}*", "*"])
    assert not marker.exists()
    registry.import_allowed([MARKER_MODULE])
    assert marker.exists()


# ------------------------------------------------- FlashInfer's top-level API names

PATTERNS = registry.allowed_patterns()


def test_api_recorded_in_a_module_this_flashinfer_lacks_resolves_by_top_level_name():
    import flashinfer

    kind, target = registry.resolve_call("flashinfer.gemm.gemm_base", "bmm_fp8", PATTERNS, "w")
    assert kind == "function" and target is flashinfer.bmm_fp8


def test_class_recorded_in_a_module_this_flashinfer_lacks_resolves_by_top_level_name():
    import flashinfer

    name = "BatchDecodeWithPagedKVCacheWrapper.__init__"
    kind, cls, attr = registry.resolve_call("flashinfer.attention.decode", name, PATTERNS, "w")
    assert cls is flashinfer.BatchDecodeWithPagedKVCacheWrapper and attr == "__init__"


def test_enum_recorded_in_a_module_this_flashinfer_lacks_resolves_by_top_level_name(tmp_path):
    import flashinfer

    encoded = enum_of("flashinfer.quantization.fp4_quantization.SfLayout", 2)
    assert decoded_enum(tmp_path, encoded) is flashinfer.SfLayout.layout_linear


def test_api_this_flashinfer_lacks_is_reported_as_not_implemented():
    import flashinfer

    with pytest.raises(LookupError) as info:
        registry.resolve_call("flashinfer.norm", "rmsnorm", PATTERNS, "w")
    assert str(info.value) == (
        f"w: flashinfer.norm.rmsnorm is not implemented by the installed flashinfer "
        f"({flashinfer.__version__}, {flashinfer.__file__}): no implementation of this API on "
        "this machine"
    )


@pytest.mark.parametrize("name", ["torch", "__builtins__", "gemm", "version"])
def test_top_level_name_that_is_not_an_api_is_refused(name):
    with pytest.raises(ReplayRefused, match=rf"function_name '{name}' .* not a registered"):
        registry.resolve_call("flashinfer.no_such_module", name, PATTERNS, "w")
