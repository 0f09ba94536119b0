"""Level 10 under CUDA graph capture, as today's FlashInfer does it: calls belong to the
graph they were captured into, each replay snapshots that graph's calls, metadata keys
and per-snapshot metadata.jsonl, flush/clear counts, the atexit and SIGTERM flushes,
and the hooks removed by an import below level 10.

No GPU here: torch.cuda.CUDAGraph is replaced by a stand-in with the same three
methods, and Logger._force_graph_capture makes the recorder treat calls as captured
(tests/gpu/test_cuda_graph_dumps.py does the same with real graphs)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0


class FakeGraph:
    """torch.cuda.CUDAGraph's hooked methods, without a GPU."""

    fail_begin = False

    def capture_begin(self, *args, **kwargs):
        if self.fail_begin:
            raise RuntimeError("capture_begin failed")

    def capture_end(self):
        pass

    def replay(self):
        pass


@pytest.fixture
def graphs(monkeypatch, tmp_path):
    """Factory: api_logging at a level (10 by default) with FakeGraph as CUDAGraph."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    originals = {k: FakeGraph.__dict__[k] for k in ("capture_begin", "capture_end", "replay")}

    def make(level="10", **env):
        base = {
            "FLASHINFER_LOGLEVEL": level,
            "FLASHINFER_LOGDEST": str(tmp_path / "log.txt"),
            "FLASHINFER_DUMP_DIR": str(tmp_path / "dumps"),
        }
        return reload_api_logging(monkeypatch, **{**base, **env})

    make.originals = originals
    yield make
    restore_level_0()
    for name, fn in originals.items():
        setattr(FakeGraph, name, fn)


@contextlib.contextmanager
def captured(m, graph):
    """What torch.cuda.graph(graph) does around its body, on the stand-in."""
    graph.capture_begin()
    m._LOGGER._force_graph_capture = 1
    try:
        yield
    finally:
        m._LOGGER._force_graph_capture = 0
        graph.capture_end()


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def call_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def add_api(m):
    @m.flashinfer_api
    def add(x, y):
        return x + y

    return add


def test_a_replay_snapshots_only_the_calls_of_that_graph(graphs, tmp_path):
    m = graphs()
    ident = m.flashinfer_api(lambda x: x.clone())
    x1, x2 = torch.full((4,), 1.0), torch.full((4,), 5.0)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with captured(m, g1):
        ident(x1)
    with captured(m, g2):
        ident(x2)
    d1, d2 = call_dirs(tmp_path / "dumps")
    x1.fill_(2.0)
    g1.replay()
    assert (d1 / "graph_flushes" / "flush_0001" / "inputs.pt").exists()
    assert not (d2 / "graph_flushes").exists()
    snap = torch.load(d1 / "graph_flushes" / "flush_0001" / "inputs.pt")
    assert torch.equal(snap["arg_0"], torch.full((4,), 2.0))
    g2.replay()
    assert (d2 / "graph_flushes" / "flush_0001" / "inputs.pt").exists()
    assert not (d1 / "graph_flushes" / "flush_0002").exists()


def test_captured_call_has_both_lines_pending_and_no_tensor_files(graphs, tmp_path):
    m = graphs()
    add = add_api(m)
    with captured(m, torch.cuda.CUDAGraph()):
        add(torch.ones(2), torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    assert sorted(p.name for p in d.iterdir()) == ["metadata.jsonl"]
    line1, line2 = records(d / "metadata.jsonl")
    assert [line1["execution_status"], line2["execution_status"]] == 2 * [
        "graph_capture_pending_flush"
    ]
    assert line1["graph_capture"] is True and line2["graph_capture"] is True
    assert line2["tensor_info"]["output_tensor_keys"] == ["result"]
    assert "result" in line2["tensor_details"]
    assert records(tmp_path / "dumps" / "session.jsonl") == [line1, line2]


def test_flush_writes_flashinfers_records_and_a_metadata_file_per_snapshot(graphs, tmp_path):
    m = graphs()
    add = add_api(m)
    g = torch.cuda.CUDAGraph()
    with captured(m, g):
        add(torch.ones(2), torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    g.replay()
    snap = d / "graph_flushes" / "flush_0001"
    pending = records(d / "metadata.jsonl")[1]
    inputs_line, outputs_line = records(d / "metadata.jsonl")[2:]
    flushed = {
        "graph_capture_flushed": True,
        "graph_capture_flush_index": 1,
        "graph_capture_snapshot_dir": str(snap),
    }
    assert inputs_line == {**pending, **flushed, "execution_status": "inputs_saved"}
    assert outputs_line == {**pending, **flushed, "execution_status": "completed"}
    in_snap, out_snap = records(snap / "metadata.jsonl")
    extra = {"dump_dir": str(snap), "graph_capture_base_dump_dir": str(d)}
    assert in_snap == {**inputs_line, **extra}
    assert out_snap == {**outputs_line, **extra}
    session = records(tmp_path / "dumps" / "session.jsonl")
    assert session[2:] == [inputs_line, in_snap, outputs_line, out_snap]


def test_session_summary_counts_a_flushed_call_once(graphs, tmp_path):
    from flashinfer_native.calls import summarize_session

    m = graphs()
    add = add_api(m)
    g = torch.cuda.CUDAGraph()
    with captured(m, g):
        add(torch.ones(2), torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    assert summarize_session(tmp_path / "dumps")["incomplete"] == [d.name]
    g.replay()
    g.replay()
    summary = summarize_session(tmp_path / "dumps")
    assert (summary["calls"], summary["completed"]) == (1, [d.name])


def test_each_replay_keeps_its_own_snapshot_and_the_root_files_the_latest(graphs, tmp_path):
    m = graphs()
    add = add_api(m)
    x, y = torch.full((4, 4), 1.0), torch.full((4, 4), 2.0)
    g = torch.cuda.CUDAGraph()
    with captured(m, g):
        out = add(x, y)
    (d,) = call_dirs(tmp_path / "dumps")
    g.replay()
    x.fill_(10.0)
    y.fill_(20.0)
    out.copy_(x + y)  # what replaying the graph does to its output buffer
    g.replay()
    for n, (a, r) in ((1, (1.0, 3.0)), (2, (10.0, 30.0))):
        snap = d / "graph_flushes" / f"flush_{n:04d}"
        assert torch.equal(torch.load(snap / "inputs.pt")["arg_0"], torch.full((4, 4), a))
        assert torch.equal(torch.load(snap / "outputs.pt")["result"], torch.full((4, 4), r))
    assert torch.equal(torch.load(d / "inputs.pt")["arg_0"], torch.full((4, 4), 10.0))
    assert torch.equal(torch.load(d / "outputs.pt")["result"], torch.full((4, 4), 30.0))
    index = [r.get("graph_capture_flush_index") for r in records(d / "metadata.jsonl")]
    assert index == [None, None, 1, 1, 2, 2]


def test_flush_and_clear_count_inputs_and_outputs_entries(graphs):
    m = graphs()
    add = add_api(m)
    nothing = m.flashinfer_api(lambda x: None)
    with captured(m, torch.cuda.CUDAGraph()):
        add(torch.ones(2), torch.ones(2))  # inputs and outputs: 2 entries
        nothing(torch.ones(2))  # inputs only: 1 entry
    assert m.flush_graph_dumps() == 3
    assert m.flush_graph_dumps(synchronize=False) == 3
    assert m.clear_graph_dumps() == 3
    assert m.flush_graph_dumps() == 0
    assert m.clear_graph_dumps() == 0


def test_explicit_flush_writes_calls_of_every_graph(graphs, tmp_path):
    m = graphs()
    ident = m.flashinfer_api(lambda x: x)
    for g in (torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()):
        with captured(m, g):
            ident(torch.ones(1))
    assert m.flush_graph_dumps() == 4
    assert all((d / "graph_flushes" / "flush_0001").is_dir() for d in call_dirs(tmp_path / "dumps"))


def test_replay_logs_how_many_entries_it_wrote(graphs, tmp_path):
    m = graphs()
    add = add_api(m)
    g = torch.cuda.CUDAGraph()
    with captured(m, g):
        add(torch.ones(2), torch.ones(2))
    g.replay()
    torch.cuda.CUDAGraph().replay()  # a graph without calls: nothing to say
    log = (tmp_path / "log.txt").read_text()
    assert log.count("flush_graph_dumps (CUDAGraph.replay): wrote 2 pending entries\n") == 1
    assert log.count("flush_graph_dumps (CUDAGraph.replay)") == 1


def test_captured_dump_lines_say_graph_deferred(graphs, tmp_path):
    m = graphs()
    add = add_api(m)
    with captured(m, torch.cuda.CUDAGraph()):
        add(torch.ones(2), torch.ones(2))
    (d,) = call_dirs(tmp_path / "dumps")
    log = (tmp_path / "log.txt").read_text()
    assert f"Dumped inputs to: {d} (size: 0.00 MB, total: 1/1000 dumps, graph-deferred)\n" in log
    assert (
        f"Dumped outputs to: {d} (output size: 0.00 MB, total dump size: 0.00 MB, graph-deferred)\n"
    ) in log


def test_hooks_wrap_the_original_once_across_imports(graphs):
    graphs()
    graphs()
    for name, original in graphs.originals.items():
        hook = getattr(FakeGraph, name)
        assert hook is not original
        assert getattr(hook, f"_flashinfer_original_{name}") is original


@pytest.mark.parametrize("level", ["0", "5"])
def test_an_import_below_level_10_restores_the_methods(graphs, level):
    graphs()
    graphs(level=level)
    for name, original in graphs.originals.items():
        assert getattr(FakeGraph, name) is original


def test_restore_cuda_graph_hooks_puts_the_methods_back(graphs):
    m = graphs()
    m._restore_cuda_graph_hooks()
    for name, original in graphs.originals.items():
        assert getattr(FakeGraph, name) is original


def test_a_failed_capture_begin_leaves_no_graph_behind(graphs, monkeypatch):
    m = graphs()
    g = torch.cuda.CUDAGraph()
    monkeypatch.setattr(FakeGraph, "fail_begin", True)
    with pytest.raises(RuntimeError, match="capture_begin failed"):
        g.capture_begin()
    assert m._LOGGER.capture_graph is None


def test_the_logger_knows_the_graph_being_captured(graphs):
    m = graphs()
    outer, inner = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    outer.capture_begin()
    inner.capture_begin()
    assert m._LOGGER.capture_graph == id(inner)
    inner.capture_end()
    assert m._LOGGER.capture_graph == id(outer)
    outer.capture_end()
    assert m._LOGGER.capture_graph is None


# ------------------------------------------------------------------- at process end

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time, torch

    class FakeGraph:
        def capture_begin(self, *a, **k): pass
        def capture_end(self): pass
        def replay(self): pass

    torch.cuda.CUDAGraph = FakeGraph
    mode = sys.argv[1]
    if mode == "chain":
        def previous(signum, frame):
            open(os.environ["MARKER"], "w").write("previous handler ran")
            os._exit(3)
        signal.signal(signal.SIGTERM, previous)
    import flashinfer.api_logging as m
    f = m.flashinfer_api(lambda x: x + 1)
    g = FakeGraph()
    g.capture_begin()
    m._LOGGER._force_graph_capture = 1
    f(torch.ones(3))
    m._LOGGER._force_graph_capture = 0
    g.capture_end()
    print("ready", flush=True)
    if mode != "exit":
        time.sleep(60)
    """
)


def child(tmp_path, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        MARKER=str(tmp_path / "marker"),
    )
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True
    )


def wait_ready(proc):
    assert "ready" in (line.strip() for line in iter(proc.stdout.readline, ""))


def snapshot_of_the_call(tmp_path):
    (d,) = call_dirs(tmp_path / "dumps")
    snap = d / "graph_flushes" / "flush_0001"
    return torch.load(snap / "inputs.pt")["arg_0"], torch.load(snap / "outputs.pt")["result"]


def test_pending_calls_are_flushed_at_exit(tmp_path):
    proc = child(tmp_path, "exit")
    wait_ready(proc)
    assert proc.wait(timeout=120) == 0
    inputs, outputs = snapshot_of_the_call(tmp_path)
    assert torch.equal(inputs, torch.ones(3)) and torch.equal(outputs, torch.full((3,), 2.0))
    log = (tmp_path / "log.txt").read_text()
    assert "flush_graph_dumps (atexit): wrote 2 pending entries" in log


def test_sigterm_flushes_then_runs_the_handler_it_replaced(tmp_path):
    proc = child(tmp_path, "chain")
    wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 3
    assert (tmp_path / "marker").read_text() == "previous handler ran"
    snapshot_of_the_call(tmp_path)
    assert "flush_graph_dumps (SIGTERM): wrote 2 pending entries" in (
        (tmp_path / "log.txt").read_text()
    )


def test_sigterm_with_the_default_handler_flushes_then_terminates(tmp_path):
    proc = child(tmp_path, "default")
    wait_ready(proc)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == -signal.SIGTERM
    snapshot_of_the_call(tmp_path)
