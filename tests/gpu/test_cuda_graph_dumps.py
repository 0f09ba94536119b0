"""Level 10 with real CUDA graphs: capture records tensor references without copies,
every replay writes a snapshot of the replayed graph's calls only (tests/test_graph_dumps.py
covers the same on CPU with a stand-in graph)."""

import json

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0


@pytest.fixture
def level10(monkeypatch, tmp_path):
    yield lambda: reload_api_logging(
        monkeypatch,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
    )
    restore_level_0()


def call_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def load(path):
    return torch.load(path, weights_only=True)


def test_capture_writes_no_tensor_files_until_a_replay(level10, tmp_path):
    m = level10()
    add = m.flashinfer_api(lambda x, y: x + y)
    x, y = torch.full((4, 4), 1.0, device="cuda"), torch.full((4, 4), 2.0, device="cuda")
    add(x, y)  # eager, before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        add(x, y)
    eager, captured = call_dirs(tmp_path / "dumps")
    assert (eager / "inputs.pt").exists()
    assert sorted(p.name for p in captured.iterdir()) == ["metadata.jsonl"]
    g.replay()
    assert torch.equal(load(captured / "inputs.pt")["arg_0"], torch.full((4, 4), 1.0))
    assert torch.equal(load(captured / "outputs.pt")["result"], torch.full((4, 4), 3.0))
    assert m.clear_graph_dumps() == 2


def test_every_replay_keeps_its_snapshot(level10, tmp_path):
    m = level10()
    add = m.flashinfer_api(lambda x, y: x + y)
    x, y = torch.full((4, 4), 1.0, device="cuda"), torch.full((4, 4), 2.0, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        add(x, y)
    (d,) = call_dirs(tmp_path / "dumps")
    g.replay()
    x.fill_(10.0)
    y.fill_(20.0)
    g.replay()
    for n, (a, r) in ((1, (1.0, 3.0)), (2, (10.0, 30.0))):
        snap = d / "graph_flushes" / f"flush_{n:04d}"
        assert torch.equal(load(snap / "inputs.pt")["arg_0"], torch.full((4, 4), a))
        assert torch.equal(load(snap / "outputs.pt")["result"], torch.full((4, 4), r))
    assert torch.equal(load(d / "outputs.pt")["result"], torch.full((4, 4), 30.0))
    m.clear_graph_dumps()


def test_capture_without_warm_up_keeps_nested_tensors(level10, tmp_path):
    m = level10()
    ident = m.flashinfer_api(lambda x, cache: x)
    x = torch.zeros(8, device="cuda")
    k, v = torch.zeros(2, 4, device="cuda"), torch.ones(2, 4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ident(x, (k, v))
    x.fill_(7)
    g.replay()
    (d,) = call_dirs(tmp_path / "dumps")
    inputs = load(d / "inputs.pt")
    assert torch.equal(inputs["arg_0"], torch.full((8,), 7.0))
    assert torch.equal(inputs["arg_1__1"], torch.ones(2, 4))
    line1 = json.loads((d / "metadata.jsonl").read_text().splitlines()[0])
    assert line1["input_metadata"]["arg_1"]["items"][0]["tensor_key"] == "arg_1__0"
    m.clear_graph_dumps()


def test_replay_flushes_only_its_own_graph(level10, tmp_path):
    m = level10()
    ident = m.flashinfer_api(lambda x: x)
    x1, x2 = torch.full((4,), 1.0, device="cuda"), torch.full((4,), 5.0, device="cuda")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        ident(x1)
    with torch.cuda.graph(g2):
        ident(x2)
    d1, d2 = call_dirs(tmp_path / "dumps")
    x1.fill_(2.0)
    g1.replay()
    assert torch.equal(load(d1 / "graph_flushes" / "flush_0001" / "inputs.pt")["arg_0"], x1.cpu())
    assert not (d2 / "graph_flushes").exists()
    x2.fill_(7.0)
    g2.replay()
    assert torch.equal(load(d2 / "graph_flushes" / "flush_0001" / "inputs.pt")["arg_0"], x2.cpu())
    assert not (d1 / "graph_flushes" / "flush_0002").exists()
    assert m.clear_graph_dumps() == 4
