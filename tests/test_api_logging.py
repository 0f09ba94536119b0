"""The @flashinfer_api decorator and log text of levels 0, 1 and 3 (docs/logging.md)."""

import contextlib
import enum
import inspect
import io
import json
import os
import re
import subprocess
import sys
import threading

import pytest
import torch
from logging_utils import DASH, SEP, normalize, reload_api_logging, restore_level_0, strip_header


@pytest.fixture
def logmod(monkeypatch):
    """Factory: re-import api_logging with the given env; restores level 0 afterwards."""

    def make(**env):
        return reload_api_logging(monkeypatch, **env)

    yield make
    restore_level_0()


def read(path):
    with open(path) as f:
        return f.read()


class Mode(enum.IntEnum):
    FAST = 1


def test_level_0_returns_the_original_object(logmod):
    m = logmod()

    def f(x):
        return x

    assert m.flashinfer_api(f) is f
    assert m.flashinfer_api()(f) is f
    assert m.flashinfer_api(trace=object())(f) is f


def test_level_0_writes_nothing(logmod, capsys):
    m = logmod(FLASHINFER_LOGLEVEL="0")
    m.flashinfer_api(lambda: 1)()
    assert capsys.readouterr() == ("", "")


def test_level_1_line_to_file(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api
    def my_api(x):
        return x * 2

    assert my_api(21) == 42
    assert normalize(strip_header(read(log))) == "[TS] FlashInfer API Call: my_api\n"


def test_level_1_line_is_on_disk_before_the_call_runs(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))
    seen = []

    @m.flashinfer_api
    def probe():
        seen.append(read(log))

    probe()
    assert "FlashInfer API Call: probe" in seen[0]
    assert "(No explicit arguments)" in seen[0]
    assert "Output value" not in seen[0]


def test_system_information_header(logmod, tmp_path):
    log = tmp_path / "log.txt"
    logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(log))
    lines = normalize(read(log)).split("\n")
    assert lines[0] == SEP
    assert lines[1] == "[TS] FlashInfer API Logging - System Information"
    assert lines[2] == SEP
    assert lines[3].startswith("FlashInfer version: ")
    assert lines[4].startswith("CUDA toolkit version: ")
    assert lines[5].startswith("cuDNN version: ")
    if not torch.cuda.is_available():
        assert lines[4] == "CUDA toolkit version: <unavailable - CPU-only build?>"
        assert lines[5] == "cuDNN version: <not available>"
        assert lines[6] == "CUDA: Not available (CPU-only mode)"
    assert f"PyTorch version: {torch.__version__}" in lines
    assert read(log).endswith(SEP + "\n\n")
    assert read(log).count("System Information") == 1


def test_level_3_exact_block(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api
    def api(a, b, scale, mode=Mode.FAST, name="x", *, out=None):
        return a

    a = torch.zeros(2, 3, 4)
    b = torch.zeros(4, 3).t()
    api(a, b, 0.5)
    expected = "\n".join(
        [
            SEP,
            "[TS] FlashInfer API Call: api",
            DASH,
            "Positional input arguments:",
            "  arg[0]:",
            "    Tensor(",
            "      shape=(2, 3, 4)",
            "      stride=(12, 4, 1)",
            "      dtype=torch.float32",
            "      device=cpu",
            "      requires_grad=False",
            "      is_contiguous=True",
            "    )",
            "  arg[1]:",
            "    Tensor(",
            "      shape=(3, 4)",
            "      stride=(1, 3)",
            "      dtype=torch.float32",
            "      device=cpu",
            "      requires_grad=False",
            "      is_contiguous=False",
            "    )",
            "  arg[2]:",
            "    0.5",
            "Default parameters (not explicitly provided):",
            "  mode= [DEFAULT]",
            "    Mode.FAST (value=1)",
            "  name= [DEFAULT]",
            "    'x'",
            "  out= [DEFAULT]",
            "    None",
            "Output value:",
            "  Tensor(",
            "    shape=(2, 3, 4)",
            "    stride=(12, 4, 1)",
            "    dtype=torch.float32",
            "    device=cpu",
            "    requires_grad=False",
            "    is_contiguous=True",
            "  )",
            SEP,
            "",
            "",
        ]
    )
    assert normalize(strip_header(read(log))) == expected


def test_level_3_keyword_arguments_and_no_arguments(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api
    def kw(*, flag=True, count=3):
        return None

    @m.flashinfer_api
    def none():
        return "done"

    kw(count=7)
    none()
    text = normalize(strip_header(read(log)))
    assert (
        "Keyword input arguments:\n  count=\n    7\n"
        "Default parameters (not explicitly provided):\n  flag= [DEFAULT]\n    True\n"
        "Output value:\n  None\n" in text
    )
    assert "Positional input arguments" not in text
    assert (
        f"[TS] FlashInfer API Call: none\n{DASH}\n(No explicit arguments)\n"
        f"Output value:\n  'done'\n{SEP}\n\n" in text
    )


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_defaults_show_their_value_at_each_call(logmod, tmp_path, log_format):
    # scalar defaults are formatted once per parameter; a mutable one every time
    log = tmp_path / "log.txt"
    m = logmod(
        FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log), FLASHINFER_LOGFORMAT=log_format
    )
    shared = []

    @m.flashinfer_api
    def f(eps=1e-06, layout="NHD", items=shared):
        return None

    f()
    shared.append(7)
    f()
    text = read(log)
    if log_format == "json":
        calls = [json.loads(line) for line in text.splitlines() if '"call"' in line]
        assert [c["defaults"] for c in calls] == [
            {"eps": 1e-06, "layout": "NHD", "items": {"type": "list", "length": n, "items": i}}
            for n, i in ((0, []), (1, [7]))
        ]
    else:
        assert text.count("  eps= [DEFAULT]\n    1e-06\n  layout= [DEFAULT]\n    'NHD'\n") == 2
        assert "  items= [DEFAULT]\n    []\n" in text
        assert "  items= [DEFAULT]\n    [\n      [0]:       7\n    ]\n" in text


def test_value_formatting_containers_and_scalars(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api
    def api(x):
        return None

    api([1, (2.5, "s"), {"k": None, 3: True}, [], (), {}, torch.float16])
    text = normalize(strip_header(read(log)))
    # FlashInfer's layout: each item keeps its own indentation after "[i]: "
    expected = "\n".join(
        [
            "  arg[0]:",
            "    [",
            "      [0]:       1",
            "      [1]:       (",
            "        [0]:         2.5",
            "        [1]:         's'",
            "      )",
            "      [2]:       {",
            "        'k':         None",
            "        3:         True",
            "      }",
            "      [3]:       []",
            "      [4]:       ()",
            "      [5]:       {}",
            "      [6]:       torch.float16",
            "    ]",
            "",
        ]
    )
    assert expected in text


def test_tensor_inside_a_list_is_a_nested_block(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))
    m.flashinfer_api(lambda x: None)([torch.ones(3, dtype=torch.int32)])
    text = strip_header(read(log))
    assert (
        "    [\n      [0]:       Tensor(\n        shape=(3,)\n        stride=(1,)\n"
        "        dtype=torch.int32\n" in text
    )


def test_raising_repr_prints_type_name(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    class Nasty:
        def __repr__(self):
            raise RuntimeError("no repr for you")

    @m.flashinfer_api
    def api(x):
        return x

    obj = Nasty()
    assert api(obj) is obj
    text = strip_header(read(log))
    assert "  arg[0]:\n    <Nasty object>\n" in text
    assert "Output value:\n  <Nasty object>\n" in text


def test_logging_failure_never_breaks_the_call(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    class BadTensor(torch.Tensor):
        @property
        def shape(self):
            raise RuntimeError("shape is broken")

    t = torch.zeros(2).as_subclass(BadTensor)

    @m.flashinfer_api
    def api(x):
        return 7

    assert api(t) == 7
    text = strip_header(read(log))
    assert "[LOGGING ERROR in api (pre-execution)]: shape is broken\n" in text
    assert "Output value:\n  7\n" in text


def test_exception_propagates_unchanged_and_nothing_is_logged_after(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))
    err = ValueError("boom")

    @m.flashinfer_api
    def api():
        raise err

    with pytest.raises(ValueError) as info:
        api()
    assert info.value is err
    text = strip_header(read(log))
    assert "FlashInfer API Call: api" in text
    assert "Output value" not in text


def test_names_follow_flashinfers_rule_for_stateful_classes(logmod, tmp_path):
    """FlashInfer prefixes the class of the first positional argument when its name
    contains "Wrapper" or is "MoELayer"; every other call logs the bare __name__."""
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(log))
    api = m.flashinfer_api

    class MyWrapper:
        @api
        def __init__(self, x):
            self.x = x

        @api
        def run(self, y):
            return self.x + y

        @staticmethod
        @api
        def helper(y):
            return y

        @classmethod
        @api
        def make(cls, x):
            return cls(x)

    class Sub(MyWrapper):
        pass

    class MoELayer:
        @api
        def __call__(self):
            return 0

    class Other:
        @api
        def go(self):
            return 0

    @api
    def plain(x):
        return x

    def outer():
        @api
        def inner():
            return 1

        return inner

    w = MyWrapper(1)
    assert w.run(2) == 3
    assert MyWrapper.run(w, 3) == 4
    assert MyWrapper.helper(5) == 5
    assert isinstance(MyWrapper.make(1), MyWrapper)
    Sub(2).run(1)
    MoELayer()()
    Other().go()
    plain(0)
    plain(w)
    outer()()
    names = re.findall(r"FlashInfer API Call: (\S+)", read(log))
    assert names == [
        "MyWrapper.__init__",
        "MyWrapper.run",
        "MyWrapper.run",
        "helper",
        "make",
        "MyWrapper.__init__",
        "__init__",
        "run",
        "MoELayer.__call__",
        "go",
        "plain",
        "MyWrapper.plain",
        "inner",
    ]


def test_metadata_and_signature_preserved(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST="stderr")

    def original(a, b: int = 2, *, c=None):
        """Original docstring."""
        return a

    wrapped = m.flashinfer_api(original)
    assert wrapped is not original
    assert wrapped.__wrapped__ is original
    assert wrapped.__name__ == "original"
    assert wrapped.__qualname__ == original.__qualname__
    assert wrapped.__doc__ == "Original docstring."
    assert wrapped.__module__ == original.__module__
    assert inspect.signature(wrapped) == inspect.signature(original)

    class K:
        @m.flashinfer_api
        def method(self, q, k=1):
            return q

    assert str(inspect.signature(K().method)) == "(q, k=1)"
    assert K().method.__name__ == "method"


def test_decorator_forms_above_level_0(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api()
    def a():
        return "a"

    @m.flashinfer_api(trace=lambda: None)
    def b():
        return "b"

    assert (a(), b()) == ("a", "b")
    assert re.findall(r"Call: (\w+)", read(log)) == ["a", "b"]


def test_non_callable_raises_type_error_naming_the_type(logmod):
    for level in ("0", "3"):
        m = logmod(FLASHINFER_LOGLEVEL=level)
        with pytest.raises(TypeError, match="expects a callable, got int"):
            m.flashinfer_api(42)


@pytest.mark.parametrize(
    "value, level", [("2", 1), ("4", 3), ("6", 5), ("9", 5), ("11", 10), ("-3", 0), (" 3 ", 3)]
)
def test_levels_round_down(logmod, value, level):
    m = logmod(FLASHINFER_LOGLEVEL=value, FLASHINFER_LOGDEST="stderr")
    assert m._API_LOG_LEVEL == level


@pytest.mark.parametrize(
    "var, value, default",
    [
        ("FLASHINFER_LOGLEVEL", "abc", "0"),
        ("FLASHINFER_DUMP_MAX_SIZE_GB", "-1", "20"),
        ("FLASHINFER_DUMP_MAX_COUNT", "ten", "1000"),
        ("FLASHINFER_DUMP_SAFETENSORS", "yes", "0"),
    ],
)
def test_bad_environment_value_warns_once_and_uses_default(logmod, capfd, var, value, default):
    m = logmod(**{var: value})
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if var in line]
    assert len(warnings) == 1
    assert value in warnings[0] and f"default {default}" in warnings[0]
    assert m._LOGGER.level == 0
    assert m._LOGGER.max_size_gb == 20.0
    assert m._LOGGER.max_count == 1000


def test_bad_level_never_breaks_import_flashinfer():
    env = dict(os.environ, FLASHINFER_LOGLEVEL="abc")
    r = subprocess.run(
        [sys.executable, "-c", "import flashinfer; print('ok')"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0
    assert r.stdout.strip() == "ok"
    assert "FLASHINFER_LOGLEVEL=abc" in r.stderr


def test_pid_substitution_in_logdest(logmod, tmp_path):
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(tmp_path / "sub" / "log_%i.txt"))
    m.flashinfer_api(lambda: None)()
    expected = tmp_path / "sub" / f"log_{os.getpid()}.txt"
    assert m._LOGGER.logdest == str(expected)
    assert "FlashInfer API Call: <lambda>" in read(expected)


def test_stdout_destination_goes_through_sys_stdout(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="1")
    f = m.flashinfer_api(lambda: 5)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert f() == 5
    assert normalize(buf.getvalue()) == "[TS] FlashInfer API Call: <lambda>\n"


def test_stderr_destination_seen_by_capsys(logmod, capsys):
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST="stderr")
    capsys.readouterr()
    m.flashinfer_api(lambda: 5)()
    assert normalize(capsys.readouterr().err) == "[TS] FlashInfer API Call: <lambda>\n"


def test_unwritable_logdest_warns_once_then_uses_stderr(logmod, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(blocker / "log.txt"))
    f = m.flashinfer_api(lambda: 1)
    assert f() == 1 and f() == 1
    err = capsys.readouterr().err
    assert err.count("cannot open FLASHINFER_LOGDEST") == 1
    assert err.count("FlashInfer API Call: <lambda>") == 2
    assert m._LOGGER.sink == "stderr"


def test_reimport_switches_level_and_old_wrappers_keep_working(logmod, tmp_path):
    log1, log3 = tmp_path / "one.txt", tmp_path / "three.txt"
    m1 = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(log1))
    old = m1.flashinfer_api(lambda: "old")
    m3 = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log3))
    assert m3 is not m1 and m3._API_LOG_LEVEL == 3
    new = m3.flashinfer_api(lambda: "new")
    assert old() == "old" and new() == "new"
    assert "Output value" not in read(log1)
    assert "FlashInfer API Call: <lambda>" in read(log1)
    assert "Output value:\n  'new'" in read(log3)
    m0 = logmod()
    g = lambda: 0  # noqa: E731
    assert m0.flashinfer_api(g) is g


def named_calls_under_filters(logmod, tmp_path, level):
    """Calls single_decode, single_prefill, batch_decode, mm_fp8 with the filters
    include "*decode*, single_*" and exclude "*prefill*"; returns the log text."""
    log = tmp_path / "log.txt"
    m = logmod(
        FLASHINFER_LOGLEVEL=level,
        FLASHINFER_LOGDEST=str(log),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        FLASHINFER_DUMP_INCLUDE="*decode*, single_*",
        FLASHINFER_DUMP_EXCLUDE="*prefill*",
    )
    for name in ("single_decode", "single_prefill", "batch_decode", "mm_fp8"):

        def f():
            return None

        f.__name__ = f.__qualname__ = name
        m.flashinfer_api(f)()
    return normalize(strip_header(read(log)))


CALL_LINE = re.compile(r"^\[TS\] FlashInfer API Call: (\S+)$", re.M)


@pytest.mark.parametrize("level", ["3", "5", "10"])
def test_calls_the_filters_leave_out_log_nothing_at_level_3_and_above(logmod, tmp_path, level):
    text = named_calls_under_filters(logmod, tmp_path, level)
    assert CALL_LINE.findall(text) == ["single_decode", "batch_decode"]
    assert "prefill" not in text and "mm_fp8" not in text


def test_level_1_names_every_call_whatever_the_filters(logmod, tmp_path):
    text = named_calls_under_filters(logmod, tmp_path, "1")
    assert CALL_LINE.findall(text) == ["single_decode", "single_prefill", "batch_decode", "mm_fp8"]


def test_eight_threads_to_one_file_every_record_whole(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(log))

    @m.flashinfer_api
    def api(i, t):
        return i

    t = torch.zeros(4, 4)

    def worker(k):
        for i in range(500):
            api(k * 1000 + i, t)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    text = normalize(strip_header(read(log)))
    records = text.split(SEP + "\n[TS] FlashInfer API Call: api\n")
    assert records[0] == ""
    records = records[1:]
    assert len(records) == 4000
    pre = re.compile(
        r"^" + DASH + r"\nPositional input arguments:\n  arg\[0\]:\n    (\d+)\n"
        r"  arg\[1\]:\n    Tensor\(\n(      .*\n){6}    \)\n$"
    )
    post = re.compile(r"Output value:\n  (\d+)\n" + SEP + r"\n\n")
    seen_in, seen_out = set(), set()
    for rec in records:
        outs = post.findall(rec)
        body = post.sub("", rec)
        mm = pre.match(body)
        assert mm, rec
        seen_in.add(int(mm.group(1)))
        seen_out.update(int(o) for o in outs)
    expected = {k * 1000 + i for k in range(8) for i in range(500)}
    assert seen_in == expected
    assert seen_out == expected


def test_level_5_adds_statistics_inside_tensor_blocks(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="5", FLASHINFER_LOGDEST=str(log))
    x = torch.tensor([[1.0, float("nan")], [float("inf"), -2.0]])
    m.flashinfer_api(lambda t, i: i)(x, torch.tensor([3, -1, 7], dtype=torch.int32))
    text = strip_header(read(log))
    assert (
        "    Tensor(\n"
        "      shape=(2, 2)\n"
        "      stride=(2, 1)\n"
        "      dtype=torch.float32\n"
        "      device=cpu\n"
        "      requires_grad=False\n"
        "      is_contiguous=True\n"
        "      min=nan\n"  # a NaN makes min, max and mean NaN (FlashInfer's torch reductions)
        "      max=nan\n"
        "      mean=nan\n"
        "      nan_count=1\n"
        "      inf_count=1\n"
        "    )\n" in text
    )
    assert "      min=-1\n      max=7\n      mean=3.000000\n    )\n" in text
    assert "Output value:\n  Tensor(\n" in text
    assert "    min=-1\n    max=7\n    mean=3.000000\n  )\n" in text


def test_level_5_empty_and_complex_tensors_have_no_statistics(logmod, tmp_path):
    log = tmp_path / "log.txt"
    m = logmod(FLASHINFER_LOGLEVEL="5", FLASHINFER_LOGDEST=str(log))
    m.flashinfer_api(lambda a, b: None)(torch.empty(0), torch.zeros(2, dtype=torch.complex64))
    text = strip_header(read(log))
    assert "min=" not in text
    assert text.count("is_contiguous=True\n    )\n") == 2
