"""FLASHINFER_LOGFORMAT=json: one JSON object per record, checked against the text log."""

import enum
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch
from logging_utils import normalize, reload_api_logging, restore_level_0, strip_header


@pytest.fixture(autouse=True)
def default_logging_afterwards():
    """Each test re-imports api_logging; later tests see level 0 again."""
    yield
    restore_level_0()


def json_logger(monkeypatch, tmp_path, level, **env):
    """api_logging at level with the JSON format, logging to a file; (module, path)."""
    log = tmp_path / "log.jsonl"
    env.update(FLASHINFER_LOGLEVEL=level, FLASHINFER_LOGDEST=str(log), FLASHINFER_LOGFORMAT="json")
    return reload_api_logging(monkeypatch, **env), log


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class Mode(enum.IntEnum):
    FAST = 1


class Opaque:
    def __repr__(self):
        return "<Opaque 'x'>"


def sample_api(q, kv, mode=Mode.FAST, scale=0.5, layout="NHD", window=-1, extras=None):
    return {"out": q[:1] * 2, "lse": (torch.tensor([1, -3, 7], dtype=torch.int32), None)}


def sample_calls(api):
    q = torch.tensor([[1.0, float("nan")], [float("inf"), -2.5]], dtype=torch.float16)
    kv = torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2)
    api(q, kv, Mode.FAST, extras=[torch.ones(2, dtype=torch.bool), torch.float32, Opaque()])
    api(q, kv, layout="HND", extras={"k": 3, 2: "v"}, window=torch.zeros(0))
    api(torch.zeros(1, 1, dtype=torch.complex64), kv)


# ------------------------------------------------------ JSON -> text (docs/logging.md)


def stats_lines(stats, pad):
    if not stats:
        return []

    def f6(v):
        return (
            "nan"
            if v != v
            else ("inf" if v == float("inf") else "-inf" if v == -float("inf") else f"{v:.6f}")
        )

    if "nan_count" in stats:
        # the text, as FlashInfer's torch reductions, says nan once a NaN is present;
        # the JSON record keeps the extremes of the other values
        nan = stats["nan_count"] > 0
        return [
            f"{pad}min={'nan' if nan else f6(stats['min'])}",
            f"{pad}max={'nan' if nan else f6(stats['max'])}",
            f"{pad}mean={'nan' if nan else f6(stats['mean'])}",
            f"{pad}nan_count={stats['nan_count']}",
            f"{pad}inf_count={stats['inf_count']}",
        ]
    return [
        f"{pad}min={stats['min']}",
        f"{pad}max={stats['max']}",
        f"{pad}mean={f6(stats['mean'])}",
    ]


# the dtypes whose statistics the text log shows (FlashInfer's); JSON records have all
TEXT_STATS_DTYPES = {
    f"torch.{n}"
    for n in "float64 float32 float16 bfloat16 float8_e4m3fn float8_e5m2 int8 int16 int32 "
    "int64 uint8".split()
}


def text_has_stats(dtype):
    return dtype in TEXT_STATS_DTYPES


def render(value, indent):
    """The text lines docs/logging.md#what-the-text-log-looks-like gives a JSON-encoded value (first line unindented)."""
    pad = "  " * indent
    if isinstance(value, bool) or value is None:
        return [str(value)]
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, str):
        return [repr(value)]
    kind = value["type"]
    if kind == "torch.Tensor":
        inner = pad + "  "
        shape, stride = tuple(value["shape"]), tuple(value["stride"])
        return [
            "Tensor(",
            f"{inner}shape={shape}",
            f"{inner}stride={stride}",
            f"{inner}dtype={value['dtype']}",
            f"{inner}device={value['device']}",
            f"{inner}requires_grad={value['requires_grad']}",
            f"{inner}is_contiguous={value['is_contiguous']}",
            *(stats_lines(value.get("stats"), inner) if text_has_stats(value["dtype"]) else []),
            f"{pad})",
        ]
    if kind == "enum":
        return [f"{value['name']} (value={value['value']})"]
    if kind in ("list", "tuple"):
        if not value["items"]:
            return ["[]" if kind == "list" else "()"]
        lines = ["[" if kind == "list" else "("]
        for i, item in enumerate(value["items"]):
            sub = render(item, indent + 1)
            # the item keeps its own indentation after "[i]: " (FlashInfer's layout)
            lines += [f"{pad}  [{i}]: {pad}  {sub[0]}", *sub[1:]]
        return lines + [f"{pad}{']' if kind == 'list' else ')'}"]
    if kind == "dict":
        lines = ["{"]
        for item in value["items"]:
            sub = render(item["value"], indent + 1)
            lines += [f"{pad}  {render(item['key'], 0)[0]}: {pad}  {sub[0]}", *sub[1:]]
        return lines + [f"{pad}}}"]
    if kind == "torch.dtype":
        return [value["value"]]
    return [value["repr"]]


def block(call, ret):
    """The text block of one call from its JSON call and return records."""
    lines = ["=" * 80, f"[TS] FlashInfer API Call: {call['api']}", "-" * 80]
    if not call["args"] and not call["kwargs"]:
        lines.append("(No explicit arguments)")
    for title, items in (
        ("Positional input arguments:", [(f"arg[{i}]:", v) for i, v in enumerate(call["args"])]),
        ("Keyword input arguments:", [(f"{k}=", v) for k, v in call["kwargs"].items()]),
        (
            "Default parameters (not explicitly provided):",
            [(f"{k}= [DEFAULT]", v) for k, v in call["defaults"].items()],
        ),
    ):
        if items:
            lines.append(title)
        for head, value in items:
            sub = render(value, 2)
            lines += [f"  {head}", f"    {sub[0]}", *sub[1:]]
    sub = render(ret["result"], 1)
    lines += ["Output value:", f"  {sub[0]}", *sub[1:], "=" * 80, ""]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("level", ["3", "5"])
def test_json_records_render_to_the_text_log_of_the_same_calls(monkeypatch, tmp_path, level):
    text_log = tmp_path / "log.txt"
    text = reload_api_logging(
        monkeypatch, FLASHINFER_LOGLEVEL=level, FLASHINFER_LOGDEST=str(text_log)
    )
    sample_calls(text.flashinfer_api(sample_api))
    js, json_log = json_logger(monkeypatch, tmp_path, level)
    sample_calls(js.flashinfer_api(sample_api))
    recs = records(json_log)
    assert recs[0]["event"] == "system_info"
    calls = [r for r in recs if r["event"] == "call"]
    returns = {r["call_id"]: r for r in recs if r["event"] == "return"}
    assert [c["level"] for c in calls] == [int(level)] * 3
    rendered = "".join(block(c, returns[c["call_id"]]) for c in calls)
    assert rendered == normalize(strip_header(text_log.read_text()))


def test_level_5_json_statistics_are_full_precision(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "5")
    m.flashinfer_api(lambda x: None)(torch.tensor([0.1, 0.2, float("nan"), float("inf")]))
    (call,) = [r for r in records(log) if r["event"] == "call"]
    stats = call["args"][0]["stats"]
    assert stats == {
        "min": float(torch.tensor(0.1)),
        "max": float("inf"),
        "mean": float("inf"),
        "nan_count": 1,
        "inf_count": 1,
    }


def test_level_1_json_is_one_call_record_per_call(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "1")
    api = m.flashinfer_api(lambda x: x)
    api(1)
    api(2)
    system, first, second = records(log)
    assert system["event"] == "system_info" and system["torch_version"] == torch.__version__
    assert system["native_core"] is True
    assert set(first) == {"event", "api", "call_id", "timestamp", "pid", "level"}
    assert (first["event"], first["api"], first["level"], first["pid"]) == (
        "call",
        "<lambda>",
        1,
        os.getpid(),
    )
    assert (first["call_id"], second["call_id"]) == (1, 2)
    assert first["timestamp"] <= second["timestamp"]


def test_call_record_is_on_disk_before_the_call_runs(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "3")
    seen = []
    m.flashinfer_api(lambda x: seen.append(records(log)))(torch.ones(2))
    last = seen[0][-1]
    assert (last["event"], last["args"][0]["shape"]) == ("call", [2])


def test_exception_gets_an_exception_record_and_propagates_unchanged(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "3")
    err = ValueError('bad "value"\n')

    @m.flashinfer_api
    def api():
        raise err

    with pytest.raises(ValueError) as info:
        api()
    assert info.value is err
    call, exc = records(log)[1:]
    assert exc == {
        "event": "exception",
        "api": "api",
        "call_id": call["call_id"],
        "timestamp": exc["timestamp"],
        "pid": os.getpid(),
        "type": "ValueError",
        "message": 'bad "value"\n',
    }


def test_filtered_api_gets_no_record_at_level_5(monkeypatch, tmp_path):
    # FlashInfer's rule: at levels 3+ a call the filters leave out logs nothing
    m, log = json_logger(monkeypatch, tmp_path, "5", FLASHINFER_DUMP_EXCLUDE="quiet")

    def quiet(x):
        return x

    m.flashinfer_api(quiet)(torch.ones(1))
    assert [r["event"] for r in records(log)] == ["system_info"]


def test_logging_error_is_a_json_record_and_the_call_still_runs(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "3")

    class BadTensor(torch.Tensor):
        @property
        def shape(self):
            raise RuntimeError("shape is broken")

    assert m.flashinfer_api(lambda x: 7)(torch.zeros(2).as_subclass(BadTensor)) == 7
    error, ret = records(log)[1:]
    assert (error["event"], error["where"], error["message"]) == (
        "logging_error",
        "pre-execution",
        "shape is broken",
    )
    assert ret["result"] == 7


def test_text_warnings_of_the_core_become_message_records(monkeypatch, tmp_path):
    m, log = json_logger(
        monkeypatch,
        tmp_path,
        "10",
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        FLASHINFER_DUMP_MAX_COUNT="0",
    )
    m.flashinfer_api(lambda x: x)(torch.ones(1))
    messages = [r for r in records(log) if r["event"] == "message"]
    assert len(messages) == 1
    assert messages[0]["text"].startswith(
        "Dump limit reached (0 dumps). Skipping dump for <lambda>."
    )


def test_call_ids_pair_records_of_eight_threads(monkeypatch, tmp_path):
    m, log = json_logger(monkeypatch, tmp_path, "3")
    api = m.flashinfer_api(lambda i, t: i)
    t = torch.zeros(4, 4)
    threads = [
        threading.Thread(target=lambda k=k: [api(k * 1000 + i, t) for i in range(300)])
        for k in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    recs = records(log)[1:]
    calls = {r["call_id"]: r["args"][0] for r in recs if r["event"] == "call"}
    returns = {r["call_id"]: r["result"] for r in recs if r["event"] == "return"}
    assert len(recs) == 4800 and calls == returns
    assert set(calls.values()) == {k * 1000 + i for k in range(8) for i in range(300)}


@pytest.mark.parametrize(("value", "warned"), [("JSON", False), ("xml", True)])
def test_logformat_values(monkeypatch, capfd, value, warned):
    m = reload_api_logging(monkeypatch, FLASHINFER_LOGFORMAT=value)
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "FLASHINFER_LOGFORMAT" in line]
    assert len(warnings) == int(warned)
    if warned:
        assert f"FLASHINFER_LOGFORMAT={value}; using the default text" in warnings[0]
    assert m._LOGGER.log_format == ("text" if warned else "json")


STRACE_CHILD = """
import torch
from flashinfer.api_logging import flashinfer_api
api = flashinfer_api(lambda x, y=2: x)
for i in range(5):
    api(torch.ones(3))
"""


@pytest.mark.skipif(
    shutil.which("strace") is None, reason="strace is not installed (apt-get install -y strace)"
)
@pytest.mark.parametrize("level", ["1", "5"])
def test_each_record_is_one_write(tmp_path, level):
    log = tmp_path / "log.jsonl"
    trace = tmp_path / "trace.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(FLASHINFER_LOGLEVEL=level, FLASHINFER_LOGDEST=str(log), FLASHINFER_LOGFORMAT="json")
    subprocess.run(
        ["strace", "-f", "-y", "-e", "trace=write", "-s", "0", "-o", str(trace)]
        + [sys.executable, "-c", STRACE_CHILD],
        env=env,
        check=True,
        timeout=300,
    )
    writes = [line for line in trace.read_text().splitlines() if f"<{log}>" in line]
    recs = records(log)
    assert len(recs) == (6 if level == "1" else 11)  # system_info + 5 calls (+ 5 returns)
    assert len(writes) == len(recs)
    assert sum(int(w.rsplit("=", 1)[1]) for w in writes) == log.stat().st_size
