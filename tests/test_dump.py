"""Level 10: the flight recorder's directories, records, tensor files, caps and
filters (docs/dump-format.md)."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0

NAME_RE = re.compile(r"^\d{8}_\d{6}_\d{3}_pid(\d+)_(.+)_call(\d{4,})$")
LINE1_KEYS = {
    "function_name",
    "module",
    "call_sequence",
    "timestamp",
    "process_id",
    "input_metadata",
    "output_metadata",
    "tensor_info",
    "tensor_details",
    "tensor_format",
    "function_signature",
    "versions",
    "execution_status",
    "graph_capture",
    "dump_dir",
    "sequence",
}


@pytest.fixture
def level10(monkeypatch, tmp_path):
    def make(**env):
        base = {
            "FLASHINFER_LOGLEVEL": "10",
            "FLASHINFER_LOGDEST": str(tmp_path / "log.txt"),
            "FLASHINFER_DUMP_DIR": str(tmp_path / "dumps"),
        }
        base.update(env)
        return reload_api_logging(monkeypatch, **base)

    yield make
    restore_level_0()


def call_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def log_text(tmp_path):
    return (tmp_path / "log.txt").read_text()


class Scale:
    pass


def test_directory_name_and_files(level10, tmp_path):
    m = level10()

    @m.flashinfer_api
    def mm_fp8(a, b):
        return a @ b

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    mm_fp8(a, b)
    mm_fp8(a, b)
    dirs = call_dirs(tmp_path / "dumps")
    assert len(dirs) == 2
    for i, d in enumerate(dirs, 1):
        match = NAME_RE.match(d.name)
        assert match, d.name
        assert match.group(1) == str(os.getpid())
        assert match.group(2) == "mm_fp8"
        assert int(match.group(3)) == i and len(match.group(3)) == 4
        assert sorted(p.name for p in d.iterdir()) == ["inputs.pt", "metadata.jsonl", "outputs.pt"]


def test_api_name_is_sanitised_in_directory_name(level10, tmp_path):
    m = level10()

    def f():
        return None

    f.__name__ = "we ird/näme"
    m.flashinfer_api(f)()
    (d,) = call_dirs(tmp_path / "dumps")
    assert NAME_RE.match(d.name).group(2) == "we_ird_n_me"


def test_dump_root_created_with_mode_0700(level10, tmp_path):
    m = level10(FLASHINFER_DUMP_DIR=str(tmp_path / "a" / "root"))
    m.flashinfer_api(lambda: None)()
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "root").st_mode) == 0o700


def test_pid_substitution_in_dump_dir(level10, tmp_path):
    m = level10(FLASHINFER_DUMP_DIR=str(tmp_path / "d_%i"))
    m.flashinfer_api(lambda: None)()
    assert (tmp_path / f"d_{os.getpid()}" / "session.jsonl").exists()


def test_metadata_lines_schema(level10, tmp_path):
    m = level10()

    @m.flashinfer_api
    def api(x, scale, dtype, *, mode="a", out=None):
        return x * scale, 3

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    api(x, 2.0, torch.bfloat16, mode="b", out=[torch.ones(2), None])
    (d,) = call_dirs(tmp_path / "dumps")
    line1, line2 = records(d / "metadata.jsonl")
    assert set(line1) == LINE1_KEYS
    assert set(line2) == LINE1_KEYS | {"duration_us"}
    assert line1["function_name"] == "api"
    assert line1["module"] == __name__
    assert line1["call_sequence"] == 1
    assert line1["process_id"] == os.getpid()
    assert line1["execution_status"] == "inputs_saved"
    assert line2["execution_status"] == "completed"
    assert line1["tensor_format"] == "torch"
    assert line1["graph_capture"] is False
    assert line1["dump_dir"] == str(d)
    assert line1["function_signature"] == "(x, scale, dtype, *, mode='a', out=None)"
    assert line1["versions"]["torch"] == torch.__version__
    assert set(line1["versions"]) == {"torch", "python", "flashinfer"}
    assert line1["timestamp"] == d.name[:19]
    assert line1["input_metadata"] == {
        "arg_1": 2.0,
        "arg_2": {"type": "torch.dtype", "value": "torch.bfloat16"},
        "kwarg_mode": "b",
        "kwarg_out": {
            "type": "list",
            "length": 2,
            "items": [
                {
                    "type": "torch.Tensor",
                    "shape": [2],
                    "dtype": "torch.float32",
                    "stride": [1],
                    "device": "cpu",
                    "requires_grad": False,
                    "is_contiguous": True,
                    "tensor_key": "kwarg_out__0",
                },
                None,
            ],
            "truncated": False,
        },
    }
    info1 = line1["tensor_info"]
    assert info1["input_tensor_keys"] == ["arg_0", "kwarg_out__0"]
    assert info1["output_tensor_keys"] == []
    assert info1["input_size_bytes"] == 24 + 8
    assert info1["input_size_mb"] == pytest.approx(32 / 1024 / 1024)
    assert set(info1) == {
        "input_tensor_keys",
        "output_tensor_keys",
        "input_size_bytes",
        "input_size_mb",
    }
    assert line1["tensor_details"] == {
        "arg_0": {"shape": [2, 3], "dtype": "torch.float32", "stride": [3, 1], "device": "cpu"},
        "kwarg_out__0": {"shape": [2], "dtype": "torch.float32", "stride": [1], "device": "cpu"},
    }
    info2 = line2["tensor_info"]
    assert info2["output_tensor_keys"] == ["result_0"]
    assert info2["output_size_bytes"] == 24
    assert info2["total_size_bytes"] == 56
    assert info2["total_size_mb"] == pytest.approx(56 / 1024 / 1024)
    assert line2["output_metadata"] == {"result_1": 3}
    assert line2["tensor_details"]["result_0"]["shape"] == [2, 3]
    inputs = torch.load(d / "inputs.pt", weights_only=True)
    assert set(inputs) == {"arg_0", "kwarg_out__0"}
    assert torch.equal(inputs["arg_0"], x)
    outputs = torch.load(d / "outputs.pt", weights_only=True)
    assert torch.equal(outputs["result_0"], x * 2.0)


def test_enum_device_and_other_values_encoding(level10, tmp_path):
    import enum

    class Layout(enum.IntEnum):
        NHD = 0

    m = level10()
    m.flashinfer_api(lambda *a: None)(Layout.NHD, torch.device("cpu"), Scale(), {"k": 1.5})
    (d,) = call_dirs(tmp_path / "dumps")
    meta = records(d / "metadata.jsonl")[0]["input_metadata"]
    assert meta["arg_0"] == {
        "type": "enum",
        "name": "Layout.NHD",
        "value": 0,
        "class": f"{__name__}.test_enum_device_and_other_values_encoding.<locals>.Layout",
    }
    assert meta["arg_1"] == {"type": "torch.device", "value": "cpu"}
    assert meta["arg_2"]["type"] == "Scale"
    assert meta["arg_2"]["repr"].startswith("<test_dump.Scale object at")
    assert meta["arg_3"] == {
        "type": "dict",
        "length": 1,
        "items": [{"key": "k", "value": 1.5}],
        "truncated": False,
    }


def test_non_finite_floats_written_like_python_json(level10, tmp_path):
    m = level10()
    m.flashinfer_api(lambda a, b: None)(float("nan"), float("-inf"))
    (d,) = call_dirs(tmp_path / "dumps")
    line = (d / "metadata.jsonl").read_text().splitlines()[0]
    assert '"arg_0": NaN, "arg_1": -Infinity' in line


def test_method_records_self_id_and_self_as_arg_0(level10, tmp_path):
    m = level10()

    class DemoWrapper:
        @m.flashinfer_api
        def run(self, q):
            return q

    w = DemoWrapper()
    w.run(torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    rec = records(d / "metadata.jsonl")[0]
    assert rec["function_name"] == "DemoWrapper.run"
    assert rec["self_id"] == id(w)
    assert rec["input_metadata"]["arg_0"]["type"] == "DemoWrapper"
    assert rec["tensor_info"]["input_tensor_keys"] == ["arg_1"]


def test_method_of_a_class_without_wrapper_in_its_name_records_no_self_id(level10, tmp_path):
    m = level10()

    class Demo:
        @m.flashinfer_api
        def run(self, q):
            return q

    Demo().run(torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    rec = records(d / "metadata.jsonl")[0]
    assert NAME_RE.match(d.name).group(2) == "run"
    assert rec["function_name"] == "run"
    assert "self_id" not in rec
    assert rec["input_metadata"]["arg_0"]["type"] == "Demo"


def test_session_jsonl_has_every_record_and_sequence_increases(level10, tmp_path):
    m = level10()
    f = m.flashinfer_api(lambda x: x)
    g = m.flashinfer_api(lambda x: x)
    for i in range(5):
        f(torch.full((2,), i))
        g(i)
    recs = records(tmp_path / "dumps" / "session.jsonl")
    assert len(recs) == 20
    assert [r["execution_status"] for r in recs] == ["inputs_saved", "completed"] * 10
    seqs = [r["sequence"] for r in recs[::2]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    for d in call_dirs(tmp_path / "dumps"):
        mine = records(d / "metadata.jsonl")
        assert all(r in recs for r in mine)


def test_exception_writes_line_2_and_propagates(level10, tmp_path):
    m = level10()

    @m.flashinfer_api
    def bad(x):
        raise ValueError("head_dim 96 not supported")

    with pytest.raises(ValueError, match="head_dim 96"):
        bad(torch.ones(1))
    (d,) = call_dirs(tmp_path / "dumps")
    line1, line2 = records(d / "metadata.jsonl")
    assert line2["execution_status"] == "exception"
    assert line2["exception"] == {"type": "ValueError", "message": "head_dim 96 not supported"}
    assert not (d / "outputs.pt").exists()


def test_count_cap_logs_one_line_in_flashinfers_words_and_counts_every_skipped_call(
    level10, tmp_path
):
    m = level10(FLASHINFER_DUMP_MAX_COUNT="2")
    f = m.flashinfer_api(lambda x: x + 1)
    assert [f(i) for i in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    assert len(call_dirs(tmp_path / "dumps")) == 2
    warnings = [ln for ln in log_text(tmp_path).splitlines() if "limit reached" in ln]
    assert warnings == [
        "Dump limit reached (2 dumps). Skipping dump for <lambda>. "
        "Increase FLASHINFER_DUMP_MAX_COUNT if needed."
    ]
    skipped = [r for r in records(tmp_path / "dumps" / "session.jsonl") if "record_type" in r]
    # at 1, 2, 4 skipped calls; the fifth is written at exit (write_skipped)
    assert [r["calls_skipped"] for r in skipped] == [1, 2, 4]
    assert skipped[0]["reason"] == "FLASHINFER_DUMP_MAX_COUNT=2 reached"
    assert set(skipped[0]) == {"record_type", "reason", "calls_skipped", "process_id", "time"}
    assert skipped[0]["record_type"] == "skipped" and skipped[0]["process_id"] == os.getpid()


def test_the_skipped_count_at_exit_reaches_dumps_and_the_report(tmp_path):
    code = textwrap.dedent(
        """
        import flashinfer.api_logging as m
        f = m.flashinfer_api(lambda x: x + 1)
        for i in range(2000):
            f(i)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_MAX_COUNT="1000",
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert log_text(tmp_path).count("Dump limit reached") == 1
    skipped = [r for r in records(tmp_path / "dumps" / "session.jsonl") if "record_type" in r]
    counts = [r["calls_skipped"] for r in skipped]
    assert counts == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    from click.testing import CliRunner

    from flashinfer_native.cli import cli

    out = CliRunner().invoke(cli, ["dumps", str(tmp_path / "dumps"), "--quiet"]).output
    assert "1000 calls: 1000 completed, 0 exception, 0 incomplete\n" in out
    assert "Calls not dumped: 1000 (FLASHINFER_DUMP_MAX_COUNT=1000 reached)\n" in out
    report = tmp_path / "report.html"
    CliRunner().invoke(cli, ["report", str(tmp_path / "dumps"), "-o", str(report)])
    page = report.read_text()
    assert (
        '<p class="skipped">1000 calls were not dumped: FLASHINFER_DUMP_MAX_COUNT=1000 '
        "reached.</p>" in page
    )


def test_line_2_carries_the_host_time_of_the_call(level10, tmp_path):
    m = level10()
    f = m.flashinfer_api(lambda x: time.sleep(0.05) or x)
    f(torch.ones(1))
    (d,) = call_dirs(tmp_path / "dumps")
    line1, line2 = records(d / "metadata.jsonl")
    assert "duration_us" not in line1
    assert 50_000 <= line2["duration_us"] < 5_000_000
    assert line2["duration_us"] == round(line2["duration_us"], 3)


def test_size_cap_counts_inputs(level10, tmp_path):
    cap = 3000 / 1024**3
    m = level10(FLASHINFER_DUMP_MAX_SIZE_GB=str(cap))
    f = m.flashinfer_api(lambda x: None)
    f(torch.zeros(256))  # 1 KB
    f(torch.zeros(256))  # 2 KB written so far (+ file overhead)
    f(torch.zeros(1024))  # would cross the cap
    dirs = call_dirs(tmp_path / "dumps")
    assert 1 <= len(dirs) <= 2
    warnings = [ln for ln in log_text(tmp_path).splitlines() if "limit reached" in ln]
    assert warnings[-1] == (
        f"Dump size limit reached ({cap!r} GB). Skipping dump for <lambda>. "
        "Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed."
    )


def test_size_capped_call_still_takes_its_number(level10, tmp_path):
    m = level10(FLASHINFER_DUMP_MAX_SIZE_GB=str(2048 / 1024**3))
    f = m.flashinfer_api(lambda x: None)
    f(torch.zeros(1024))  # 4 KB: over the cap, not dumped
    f(torch.zeros(4))
    (d,) = call_dirs(tmp_path / "dumps")
    assert d.name.endswith("_call0002")


def test_size_cap_message_prints_the_cap_as_python_does(level10, tmp_path):
    m = level10(FLASHINFER_DUMP_MAX_SIZE_GB="0")
    m.flashinfer_api(lambda x: None)(torch.zeros(1))
    assert "Dump size limit reached (0.0 GB)." in log_text(tmp_path)


def test_size_cap_crossed_by_outputs_skips_outputs_file(level10, tmp_path):
    m = level10(FLASHINFER_DUMP_MAX_SIZE_GB=str(8192 / 1024**3))
    f = m.flashinfer_api(lambda x: torch.zeros(4096))
    f(torch.zeros(4))
    (d,) = call_dirs(tmp_path / "dumps")
    line2 = records(d / "metadata.jsonl")[1]
    assert line2["execution_status"] == "completed"
    assert line2["outputs_skipped"] == "size cap"
    assert not (d / "outputs.pt").exists()
    assert "Skipping the outputs of <lambda>. Increase FLASHINFER_DUMP_MAX_SIZE_GB" in (
        log_text(tmp_path)
    )


@pytest.mark.parametrize(
    "include, exclude, dumped",
    [
        ("*decode*", "", ["single_decode_with_kv_cache"]),
        (
            "",
            "*.__init__,*.plan",
            [
                "single_decode_with_kv_cache",
                "single_prefill_with_kv_cache",
                "mm_fp8",
                "fp8_quantize",
                "DecodeWrapper.run",
            ],
        ),
        ("*Decode*", "", ["DecodeWrapper.__init__", "DecodeWrapper.plan", "DecodeWrapper.run"]),
        ("*Wrapper.run", "", ["DecodeWrapper.run"]),
        ("single_*", "*prefill*", ["single_decode_with_kv_cache"]),
        ("DecodeWrapper.run", "", ["DecodeWrapper.run"]),
        ("*fp8*,*FP8*", "*quantize*", ["mm_fp8"]),
    ],
)
def test_seed_filter_examples(level10, tmp_path, include, exclude, dumped):
    m = level10(FLASHINFER_DUMP_INCLUDE=include, FLASHINFER_DUMP_EXCLUDE=exclude)
    api = m.flashinfer_api

    def named(name):
        def f(*a):
            return None

        f.__name__ = f.__qualname__ = name
        return api(f)

    class DecodeWrapper:
        @api
        def __init__(self):
            pass

        @api
        def plan(self):
            pass

        @api
        def run(self):
            pass

    named("single_decode_with_kv_cache")()
    named("single_prefill_with_kv_cache")()
    named("mm_fp8")()
    named("fp8_quantize")()
    w = DecodeWrapper()
    w.plan()
    w.run()
    names = [r["function_name"] for r in records(tmp_path / "dumps" / "session.jsonl")][::2]
    assert names == dumped


BANNER_HEAD = (
    "WARNING: FlashInfer API Logging is set to Level 10 (Tensor Dumping).\n"
    "This will dump ALL input and outputs including tensors for FlashInfer APIs to disk in\n"
    "the configured dump directory. Ensure that you are NOT processing sensitive data\n"
    "or that the dump directory is secure. To disable dumping, unset FLASHINFER_LOGLEVEL or\n"
    "set it to below 10. For more information, see https://docs.flashinfer.ai/logging.html\n"
)
BANNER_TAIL = (
    "CUDA graph replay hook enabled: flush_graph_dumps() will run after every "
    "torch.cuda.CUDAGraph.replay().\n"
    "CUDA graph capture stores tensor references and materializes snapshots after every "
    "replay.\n" + "=" * 80 + "\n"
)


def test_level_10_banner_is_flashinfers_on_stdout(level10, capfd, tmp_path):
    level10(FLASHINFER_DUMP_INCLUDE="*run, plan", FLASHINFER_DUMP_EXCLUDE="x*")
    out, err = capfd.readouterr()
    assert out == (
        "=" * 80
        + "\n"
        + BANNER_HEAD
        + f"Current dump directory is: {tmp_path / 'dumps'}\n"
        + "Include filter: ['*run', 'plan']\n"
        + "Exclude filter: ['x*']\n"
        + BANNER_TAIL
    )
    assert "Level 10" not in err


def test_level_10_banner_names_safetensors_mode(level10, capfd, tmp_path):
    level10(FLASHINFER_DUMP_SAFETENSORS="1")
    out = capfd.readouterr().out
    assert (
        f"Current dump directory is: {tmp_path / 'dumps'}\n"
        "\u26a0\ufe0f  SAFETENSORS mode enabled: tensor stride/non-contiguity will NOT be "
        "preserved.\n    Tensors will be saved as contiguous. Use torch.save (default) to "
        "preserve strides.\nCUDA graph replay hook enabled"
    ) in out


def test_level_10_log_names_each_dump_in_flashinfers_lines(level10, tmp_path):
    m = level10()
    m.flashinfer_api(lambda x: x + 1)(torch.zeros(262144))  # 1 MB in, 1 MB out
    (d,) = call_dirs(tmp_path / "dumps")
    text = log_text(tmp_path)
    before = (
        f"Dumped inputs to: {d} (size: 1.00 MB, total: 1/1000 dumps)\n"
        f"Inputs dumped to: {d}\n" + "=" * 80 + "\n"
    )
    after = (
        "=" * 80 + "\n\n"
        f"Dumped outputs to: {d} (output size: 1.00 MB, total dump size: 2.00 MB)\n"
        f"Outputs dumped to: {d}\n"
    )
    assert before in text and text.endswith(after)
    assert text.index(before) < text.index("FlashInfer API Call: <lambda>")


def test_level_10_call_that_raises_has_no_outputs_lines(level10, tmp_path):
    m = level10()

    @m.flashinfer_api
    def boom(x):
        raise ValueError("no")

    with pytest.raises(ValueError):
        boom(torch.zeros(2))
    text = log_text(tmp_path)
    assert "Inputs dumped to: " in text
    assert "Outputs dumped to" not in text and "Dumped outputs" not in text


def test_level_10_also_writes_level_5_text(level10, tmp_path):
    m = level10()
    m.flashinfer_api(lambda x: x)(torch.ones(3))
    text = log_text(tmp_path)
    assert "Positional input arguments:" in text
    assert "Output value:" in text


def test_suspend_dumps_writes_nothing(level10, tmp_path):
    m = level10()
    f = m.flashinfer_api(lambda: 1)
    with m._suspend_dumps():
        assert f() == 1
    assert not (tmp_path / "dumps").exists() or not call_dirs(tmp_path / "dumps")


def test_safetensors_format(level10, tmp_path):
    from safetensors.torch import load_file

    m = level10(FLASHINFER_DUMP_SAFETENSORS="1")
    x = torch.randn(4, 6)[:, ::2]
    m.flashinfer_api(lambda t: t.sum())(x)
    (d,) = call_dirs(tmp_path / "dumps")
    assert sorted(p.name for p in d.iterdir()) == [
        "inputs.safetensors",
        "metadata.jsonl",
        "outputs.safetensors",
    ]
    assert records(d / "metadata.jsonl")[0]["tensor_format"] == "safetensors"
    assert torch.equal(load_file(d / "inputs.safetensors")["arg_0"], x)
    back = m.load_tensors(str(d / "inputs.safetensors"))["arg_0"]
    assert back.stride() == x.stride() and torch.equal(back, x)


def test_threads_dump_into_one_root_without_collisions(level10, tmp_path):
    m = level10()
    f = m.flashinfer_api(lambda x: x * 2)

    def worker():
        for i in range(25):
            f(torch.full((16,), float(i)))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dirs = call_dirs(tmp_path / "dumps")
    assert len(dirs) == 100
    assert len(records(tmp_path / "dumps" / "session.jsonl")) == 200
    for d in dirs:
        assert [r["execution_status"] for r in records(d / "metadata.jsonl")] == [
            "inputs_saved",
            "completed",
        ]


CHILD = textwrap.dedent(
    """
    import sys, torch
    import flashinfer
    from flashinfer.api_logging import flashinfer_api

    @flashinfer_api
    def big_call(x):
        return x
    n = int(sys.argv[1])
    size = int(sys.argv[2])
    for i in range(n):
        big_call(torch.full((size,), float(i)))
    print("done", flush=True)
    """
)


def child_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "child.log"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    env.update(extra)
    return env


def test_two_processes_dump_into_one_root(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, "20", "64"], env=child_env(tmp_path))
        for _ in range(2)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    dirs = call_dirs(tmp_path / "dumps")
    assert len(dirs) == 40
    recs = records(tmp_path / "dumps" / "session.jsonl")
    assert len(recs) == 80
    assert {r["process_id"] for r in recs} == {p.pid for p in procs}


def test_sigkill_mid_dump_leaves_only_whole_files_and_lines(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "1000", str(4 * 1024 * 1024)],
        env=child_env(tmp_path),
        stdout=subprocess.DEVNULL,
    )
    root = tmp_path / "dumps"
    deadline = time.time() + 60
    while time.time() < deadline:
        if root.exists() and len(call_dirs(root)) >= 3:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with open(root / "session.jsonl", "rb") as f:
        data = f.read()
    assert data.endswith(b"\n")
    for line in data.splitlines():
        json.loads(line)
    for d in call_dirs(root):
        for name in ("inputs.pt", "outputs.pt"):
            p = d / name
            if p.exists():
                t = torch.load(p, weights_only=True)
                x = t["arg_0" if name == "inputs.pt" else "result"]
                assert x.numel() == 4 * 1024 * 1024
                assert torch.all(x == x[0])


FULL_CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys, torch
    import flashinfer
    from flashinfer.api_logging import flashinfer_api
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    @flashinfer_api
    def call(x):
        return x + 1

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
    r = call(torch.zeros(128 * 1024))  # 512 KB input: cannot be written
    assert torch.equal(r, torch.ones(128 * 1024))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    r = call(torch.zeros(1024))
    assert torch.equal(r, torch.ones(1024))
    print("ok")
    """
)


def test_disk_full_logs_one_error_and_later_calls_work(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", FULL_CHILD],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "ok"  # after the level-10 warning
    log = (tmp_path / "child.log").read_text()
    errors = [ln for ln in log.splitlines() if ln.startswith("[DUMP ERROR (inputs) in call]")]
    assert len(errors) == 1
    dirs = call_dirs(tmp_path / "dumps")
    finals = [p for d in dirs for p in d.iterdir() if p.name.endswith(".pt")]
    for p in finals:
        torch.load(p, weights_only=True)
    assert len(dirs) == 1
    recs = records(dirs[0] / "metadata.jsonl")
    assert [r["execution_status"] for r in recs] == ["inputs_saved", "completed"]


def test_unwritable_dump_dir_logs_an_error_and_the_call_still_runs(level10, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    m = level10(FLASHINFER_DUMP_DIR=str(blocker / "dumps"))
    f = m.flashinfer_api(lambda x: x + 1)
    assert f(1) == 2
    errors = [ln for ln in log_text(tmp_path).splitlines() if ln.startswith("[DUMP ERROR")]
    assert len(errors) == 1
    assert errors[0].startswith("[DUMP ERROR (inputs) in <lambda>]: cannot create dump directory")
    assert "Output value:\n  2\n" in log_text(tmp_path)
