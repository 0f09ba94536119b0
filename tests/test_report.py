"""``flashinfer report``: one static HTML page per session, rendered by headless Chromium.

The rendering tests need a Chromium binary (Debian/Ubuntu: ``apt-get install -y
chromium``); they are skipped only when none is installed.
"""

import json
import os
import re
import shutil
import subprocess

import pytest
import replay_helpers as h
import torch
import triage_helpers as t
from click.testing import CliRunner

from flashinfer.__main__ import cli
from flashinfer_native.report import write_report

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium binary: install it with `apt-get install -y chromium`"
)


def chromium(*args):
    """Run headless Chromium offline (every host name fails to resolve). The browser is
    not under test: sanitizer runtimes preloaded for our extension (make asan-test) are
    kept out of it."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    r = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.fixture
def mixed_session(tmp_path):
    """FlashInfer-style dumps: completed, exception, incomplete calls and a trigger record."""
    root = tmp_path / "dumps"
    writer = h.DumpWriter(root, flashinfer_style=True)
    writer.call(h.scale_add, torch.arange(6.0), torch.ones(6), alpha=0.5)
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4, dtype=torch.int8))
    writer.method(wrapper, "plan", torch.tensor([0, 2, 4]), 2.0)
    writer.method(wrapper, "run", torch.randn(4, 3))
    with pytest.raises(ValueError):
        writer.call(h.check_positive, -torch.ones(2))
    writer.crash(h.slow_identity, torch.ones(3))
    stamp = os.path.basename(writer.dirs[-1])[:19]
    with open(root / "session.jsonl", "a") as f:
        f.write(json.dumps({"trigger": "nan_in_output", "timestamp": stamp}) + "\n")
    return root, writer


def test_page_is_static_with_every_call_and_status(mixed_session, tmp_path):
    root, writer = mixed_session
    out = tmp_path / "report.html"
    done = write_report(root, out)
    page = out.read_text()
    assert done["statuses"] == {"completed": 4, "exception": 1, "incomplete": 1}
    assert done["triggers"] == 1
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for n in range(1, 7):
        assert f'id="call-{n}"' in page and f'id="detail-{n}"' in page
    assert "ValueError: check_positive: x has negative elements" in page
    assert ">nan_in_output</text>" in page


def test_each_tensor_gets_statistics_and_an_svg_histogram(mixed_session, tmp_path):
    root, writer = mixed_session
    out = tmp_path / "report.html"
    write_report(root, out)
    page = out.read_text()
    # scale_add: x = arange(6) -> level-5 statistics from the core
    assert "min=0 max=5 mean=2.5 nan_count=0 inf_count=0" in page
    tensors = sum(
        len(json.loads(open(os.path.join(d, "metadata.jsonl")).readlines()[-1])["tensor_details"])
        for d in writer.dirs
    )
    assert page.count('<svg class="hist"') == tensors


def test_max_calls_limits_the_detailed_calls_not_the_table(mixed_session, tmp_path):
    root, _ = mixed_session
    out = tmp_path / "report.html"
    done = write_report(root, out, max_calls=2)
    page = out.read_text()
    assert done["detailed"] == 2
    assert page.count("<details") == 2 and 'id="call-6"' in page
    assert "4 more calls are not detailed (raise --max-calls)." in page


def test_replay_results_join_the_call_table(mixed_session, tmp_path):
    root, _ = mixed_session
    replay_json = tmp_path / "replay.json"
    # the session's functions are test-defined: replay runs them only when allowed
    args = ["replay", "--allow-module", "replay_helpers", "--dir", str(root)]
    CliRunner().invoke(cli, [*args, "--json", str(replay_json)])
    out = tmp_path / "report.html"
    result = CliRunner().invoke(
        cli, ["report", str(root), "-o", str(out), "--replay-json", str(replay_json)]
    )
    assert result.exit_code == 0, result.output
    assert f"Wrote {out}: 6 calls (4 completed, 1 exception, 1 incomplete), 6 detailed" in (
        result.output
    )
    page = out.read_text()
    assert page.count('<td class="replay passed">') == 5
    assert page.count('<td class="replay incomplete">') == 1


def test_a_file_that_is_not_a_replay_report_is_refused(mixed_session, tmp_path):
    root, _ = mixed_session
    bogus = tmp_path / "bogus.json"
    bogus.write_text("[1, 2]")
    result = CliRunner().invoke(cli, ["report", str(root), "--replay-json", str(bogus)])
    assert result.exit_code == 1
    assert "not a `flashinfer replay --json` report" in result.output


@needs_chromium
def test_chromium_renders_the_page_offline_to_a_png(mixed_session, tmp_path):
    root, _ = mixed_session
    out = tmp_path / "report.html"
    write_report(root, out)
    png = tmp_path / "report.png"
    chromium(f"--screenshot={png}", "--window-size=1400,1200", out.as_uri())
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000


@needs_chromium
def test_chromium_dom_holds_the_timeline_table_and_histograms(tmp_path_factory, tmp_path):
    root = t.mirror_session(tmp_path_factory)
    out = tmp_path / "report.html"
    write_report(root, out)
    dom = chromium("--dump-dom", out.as_uri())
    text = re.sub(r"<[^>]+>", " ", dom)
    assert "FlashInfer session report" in text
    for api in t.MIRROR_APIS:
        assert f"{api} " in text or f"{api}<" in dom
    assert dom.count('class="call completed"') == 17
    assert dom.count('class="call exception"') == 1
    assert "fp4_quantize: exception" in dom  # the bar's tooltip
    assert dom.count('<svg class="hist"') > 40
    assert re.search(r"min=-?\d[\d.e+-]* max=", text)


def test_recorded_durations_get_a_column_and_bar_widths(tmp_path):
    writer = h.DumpWriter(tmp_path / "dumps")
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    writer.call(h.scale_add, torch.ones(2), torch.ones(2))
    meta = os.path.join(writer.dirs[0], "metadata.jsonl")
    lines = open(meta).read().splitlines()
    record = dict(json.loads(lines[-1]), duration_s=0.0125)
    with open(meta, "w") as f:
        f.write("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")
    out = tmp_path / "report.html"
    write_report(tmp_path / "dumps", out)
    page = out.read_text()
    assert "<th>duration</th>" in page and "<td>12.500 ms</td>" in page
    assert "[1] scale_add: completed, 12.500 ms</title>" in page


def test_without_recorded_durations_there_is_no_duration_column(mixed_session, tmp_path):
    root, _ = mixed_session
    out = tmp_path / "report.html"
    write_report(root, out)
    assert "<th>duration</th>" not in out.read_text()


# ------------------------------------------------------------ summary, names, scale


def test_api_summary_shapes_and_parameter_names(mixed_session, tmp_path):
    root, _ = mixed_session
    out = tmp_path / "report.html"
    write_report(root, out)
    page = out.read_text()
    summary = page[page.index('<table class="apis">') : page.index("<h2>Timeline</h2>")]
    # one row per API, the most frequent first, with its input shapes by parameter name
    assert summary.count("<tr><td><code>") == 6
    assert "<td><code>scale_add</code></td><td>1</td><td>1 completed</td>" in summary
    assert '<td class="shapes">x [6] float32; y [6] float32</td>' in summary
    assert "<td>0 / 0</td>" in summary  # NaN / Inf of the detailed calls
    # the calls table has the shape column; the details name parameters, not arg_i
    assert "<th>input shapes</th>" in page
    assert '<td class="shapes">indptr [3] int64</td>' in page
    assert "<li><code>alpha</code> = <code>0.5</code></li>" in page
    assert "<li><code>scale (arg_2)</code> = <code>2.0</code></li>" in page
    assert "<code>x (arg_0)</code></td><td>[6]</td><td>float32</td>" in page
    assert "arg_1</code> =" not in page and '{"type": ' not in page


def synthetic_session(root, calls, apis=("rmsnorm", "Wrapper.plan", "Wrapper.run")):
    """``calls`` call directories with metadata only (no tensor files), 2 ms apart."""
    os.makedirs(root)
    for i in range(calls):
        api = apis[i % len(apis)]
        second, millis = divmod(2 * i, 1000)
        stamp = f"20261126_10{second // 60:02d}{second % 60:02d}_{millis:03d}"
        name = f"{stamp}_pid7_{api}_call{i + 1:05d}"
        status = "exception" if i == calls // 2 else "completed"
        record = {
            "function_name": api,
            "module": "flashinfer.norm",
            "call_sequence": i + 1,
            "timestamp": stamp,
            "process_id": 7,
            "sequence": i + 1,
            "input_metadata": {"kwarg_eps": 1e-6},
            "output_metadata": {},
            "tensor_info": {
                "input_tensor_keys": ["arg_0"],
                "output_tensor_keys": [],
                "input_size_bytes": 2048,
            },
            "tensor_details": {
                "arg_0": {"shape": [4, 256], "stride": [256, 1], "dtype": "torch.bfloat16"}
            },
            "function_signature": "(input, weight, eps=1e-06)",
            "execution_status": status,
            "duration_us": 40 + i % 7,
        }
        if status == "exception":
            record["exception"] = {"type": "ValueError", "message": "bad"}
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "metadata.jsonl"), "w") as f:
            f.write(json.dumps(record) + "\n")


def test_the_timeline_of_10k_calls_is_binned_per_api_and_the_page_stays_small(tmp_path):
    root = tmp_path / "big"
    synthetic_session(str(root), 10_000)
    out = tmp_path / "report.html"
    done = write_report(root, out, max_calls=0)
    page = out.read_text()
    timeline = page[page.index('<svg class="timeline"') : page.index("</svg>")]
    assert done["calls"] == 10_000
    assert 'class="call ' not in timeline  # no bar per call
    bins = re.findall(r'<rect class="bin (\w+)"', timeline)
    assert 3 * 250 <= len(bins) <= 3 * 300  # three lanes, at most 300 bins each
    assert bins.count("exception") == 1  # the bin holding the one exception shows it
    counts = [int(n) for n in re.findall(r": (\d+) calls from \+", timeline)]
    assert sum(counts) == 10_000
    assert len(page) < 3_000_000
    # durations (duration_us) reach the table and the per-API summary
    assert "<th>duration</th>" in page and "<td>0.040 ms</td>" in page
    assert "<td>0.043 / 0.046 ms</td>" in page


def test_durations_come_from_duration_us(tmp_path):
    root = tmp_path / "small"
    synthetic_session(str(root), 3)
    out = tmp_path / "report.html"
    write_report(root, out, max_calls=0)
    page = out.read_text()
    assert "[1] rmsnorm: completed, 0.040 ms</title>" in page
    assert "[2] Wrapper.plan: exception, 0.041 ms</title>" in page


def test_calls_the_recorder_skipped_are_counted_at_the_top(tmp_path):
    root = tmp_path / "capped"
    synthetic_session(str(root), 3)
    with open(root / "session.jsonl", "w") as f:
        for n in (1, 2, 4, 7):
            record = {"record_type": "skipped", "reason": "count cap", "calls_skipped": n}
            f.write(json.dumps(dict(record, process_id=7)) + "\n")
    out = tmp_path / "report.html"
    done = write_report(root, out, max_calls=0)
    assert done["skipped"] == {"count cap": 7}
    assert '<p class="skipped">7 calls were not dumped: count cap.</p>' in out.read_text()


@needs_chromium
def test_chromium_renders_a_binned_timeline_of_2000_calls(tmp_path):
    root = tmp_path / "big"
    synthetic_session(str(root), 2000)
    out = tmp_path / "report.html"
    write_report(root, out, max_calls=0)
    dom = chromium("--dump-dom", out.as_uri())
    assert dom.count('class="bin completed"') + dom.count('class="bin exception"') > 600
    assert dom.count('<tr id="call-') == 2000
    assert re.search(r"rmsnorm: \d+ calls from \+", dom)
