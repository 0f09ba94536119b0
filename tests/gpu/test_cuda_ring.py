"""The in-memory flight recorder ring with CUDA tensors: copies go to pinned host memory
on a side stream that waits for the producing stream, never through a device-wide
synchronize, and each recorded call keeps the values it was called with."""

import os

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0

from flashinfer_native import dumpdir, staging


@pytest.fixture
def ring(monkeypatch, tmp_path):
    yield lambda **extra: reload_api_logging(
        monkeypatch,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        FLASHINFER_DUMP_RING="4",
        FLASHINFER_DUMP_ON="exception",
        **extra,
    )
    restore_level_0()


@pytest.fixture
def no_device_sync(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the ring synchronized the whole device")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)


def load(path, stem):
    """A call's inputs or outputs in either layout (the ring's default is the compact one)."""
    (name,) = [n for n in os.listdir(path) if n.startswith(stem + ".")]
    return dumpdir.load_tensor_file(os.path.join(path, name))


def test_reused_cuda_buffer_is_recorded_with_each_calls_values(ring, no_device_sync, tmp_path):
    m = ring()

    @m.flashinfer_api
    def double(x):
        return x * 2

    @m.flashinfer_api
    def fail(x):
        raise ValueError("refused")

    buf = torch.empty(1 << 20, device="cuda")
    for i in range(3):
        torch.cuda._sleep(20_000_000)  # a slow producer: the copy must wait for it
        buf.fill_(float(i))
        double(buf)
    with pytest.raises(ValueError):
        fail(buf)
    dumps = dumpdir.ordered_dumps(tmp_path / "dumps")
    assert [recs[-1]["function_name"] for _, recs in dumps] == ["double"] * 3 + ["fail"]
    for i, (path, recs) in enumerate(dumps[:3]):
        assert recs[0]["tensor_details"]["arg_0"]["device"] == "cuda:0"
        x = load(path, "inputs")["arg_0"]
        assert torch.equal(x, torch.full((1 << 20,), float(i)))
        y = load(path, "outputs")["result"]
        assert torch.equal(y, torch.full((1 << 20,), 2.0 * i))


def test_to_host_keeps_strides_and_pins_the_copies():
    base = torch.arange(64.0, device="cuda").reshape(8, 8)
    view = base.t()
    host = staging.to_host({"view": view, "cpu": torch.ones(2)})
    assert host["view"].is_pinned() and host["view"].stride() == view.stride()
    assert torch.equal(host["view"], view.cpu())
    assert host["cpu"].device.type == "cpu"


def test_side_stream_waits_for_a_non_default_producing_stream(no_device_sync):
    producer = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    with torch.cuda.stream(producer):
        torch.cuda._sleep(20_000_000)
        x.fill_(7.0)
        host = staging.to_host({"x": x})
    assert torch.equal(host["x"], torch.full((1 << 20,), 7.0))
