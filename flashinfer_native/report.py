"""``flashinfer report``: a recorded session as one static HTML file.

The page needs nothing but a browser: no network, no script, no server. It shows a
timeline of the calls (one lane per API, coloured by status: completed, exception,
incomplete, triggered; trigger records of ``session.jsonl`` as markers), a table of
every call, and for each detailed call its tensors with shape, dtype, the level-5
statistics and a histogram drawn as inline SVG. Statistics and histograms are
computed by the core's C code over the memory-mapped dump files. With the JSON report
of ``flashinfer replay --json``, each call also shows its replay result.

Building the report only reads the dump: nothing it names is imported or called.
"""

import html
import json
import os
from collections import Counter
from datetime import datetime

from . import _C, dumpdir
from .calls import parse_timestamp, session_calls

__all__ = ["render_report", "write_report"]

STATUS_COLOURS = {
    "completed": "#2e7d32",
    "exception": "#c62828",
    "incomplete": "#ef6c00",
    "triggered": "#6a1b9a",
    "unreadable": "#757575",
}
HISTOGRAM_BINS = 24


def _status(call):
    """Display status: triggered for a call a ring recorder wrote because a trigger
    fired; incomplete for a call that never got its final line (the process died in it,
    or a CUDA graph captured it and was never replayed)."""
    record = call.record or {}
    if call.status in ("triggered", "trigger") or "trigger" in record:
        return "triggered"
    if call.status in ("completed", "exception", "unreadable"):
        return call.status
    return "incomplete"


def _esc(value):
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------- timing


def _timing(call):
    """(start seconds, duration seconds or None): the recorded ``timestamp`` and, where
    the record has one, ``duration_s`` or ``end_timestamp``."""
    record = call.record or {}
    start = parse_timestamp(call.timestamp)
    if isinstance(record.get("duration_s"), (int, float)):
        return start, float(record["duration_s"])
    end = parse_timestamp(record.get("end_timestamp"))
    if start is not None and end is not None:
        return start, max(end - start, 0.0)
    return start, None


def _triggers(root):
    """Trigger markers of ``session.jsonl`` (read by ``dumpdir.read_session``, with its
    bounds): the ring recorder's ``record_type: "trigger"`` records (they name the
    triggering call's ``dump_dir``), and records that are not a call's own line (no
    ``dump_dir``) with a ``trigger`` key or ``execution_status: "trigger"``."""
    session = dumpdir.read_session(root)
    found = []
    for _, record in session.records if session else ():
        if record.get("record_type") == "trigger" or (
            "dump_dir" not in record
            and ("trigger" in record or record.get("execution_status") == "trigger")
        ):
            found.append(record)
    return found


# ---------------------------------------------------------------- tensors


def _histogram_svg(hist, width=168, height=36):
    """A bar chart of bin counts (inline SVG) with the range under it."""
    counts = hist["counts"]
    top = max(counts) or 1
    bar = width / len(counts)
    bars = []
    for i, n in enumerate(counts):
        h = 0 if n == 0 else max(1.0, n / top * height)
        bars.append(
            f'<rect x="{i * bar:.1f}" y="{height - h:.1f}" width="{max(bar - 1, 1):.1f}" '
            f'height="{h:.1f}"><title>{n}</title></rect>'
        )
    extra = [f"{hist[k]} {k}" for k in ("nan", "inf", "outside") if hist.get(k)]
    caption = f"{hist['lo']:.4g} … {hist['hi']:.4g}" + (f" ({', '.join(extra)})" if extra else "")
    return (
        f'<svg class="hist" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="histogram">{"".join(bars)}</svg>'
        f'<div class="range">{_esc(caption)}</div>'
    )


def _stats_text(stats):
    if not stats:
        return ""
    parts = []
    for key in ("min", "max", "mean"):
        value = stats.get(key)
        parts.append(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}")
    for key in ("nan_count", "inf_count"):
        if key in stats:
            parts.append(f"{key}={stats[key]}")
    return " ".join(parts)


def _tensor_rows(call, record, role, stem):
    """One table row per tensor of a call's inputs or outputs file."""
    path = dumpdir.tensor_file(call.path, stem, record)
    if path is None:
        return []
    try:
        tensors = dumpdir.load_tensor_file(path)
    except (OSError, ValueError) as exc:
        return [f'<tr><td colspan="6" class="error">{_esc(exc)}</td></tr>']
    rows = []
    for key, tensor in tensors.items():
        try:
            stats = _C.tensor_stats(tensor)
            hist = _C.tensor_histogram(tensor, bins=HISTOGRAM_BINS)
        except (TypeError, ValueError) as exc:
            stats, hist = {"error": str(exc)}, None
        rows.append(
            "<tr>"
            f"<td>{_esc(role)}</td><td><code>{_esc(key)}</code></td>"
            f"<td>{_esc(tuple(tensor.shape))}</td><td>{_esc(tensor.dtype)}</td>"
            f'<td class="stats">{_esc(stats.get("error") or _stats_text(stats))}</td>'
            f"<td>{_histogram_svg(hist) if hist else ''}</td>"
            "</tr>"
        )
    return rows


# ------------------------------------------------------------------ the page


def _trigger_time(record):
    """Seconds since the epoch of a trigger record: the ring's ``time`` (a number), or a
    ``timestamp`` stamp; None without either."""
    when = record.get("time")
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return float(when)
    return parse_timestamp(record.get("timestamp"))


def _timeline_svg(calls, timings, triggers):
    """One lane per API; each call a bar from its start, as wide as its duration."""
    starts = [t[0] for t in timings if t[0] is not None]
    trigger_times = [_trigger_time(r) for r in triggers]
    moments = starts + [t[0] + (t[1] or 0) for t in timings if t[0] is not None]
    moments += [t for t in trigger_times if t is not None]
    if not moments:
        return "<p>No call has a readable timestamp.</p>"
    t0, t1 = min(moments), max(moments)
    span = max(t1 - t0, 1e-3)
    lanes = list(dict.fromkeys(c.api for c in calls))
    label_w = min(max(len(api) for api in lanes) * 7.3 + 16, 420)
    plot_w, lane_h = 900, 22
    height = lane_h * len(lanes) + 30
    parts = [
        f'<svg class="timeline" width="{label_w + plot_w + 20}" height="{height}" '
        f'viewBox="0 0 {label_w + plot_w + 20} {height}" role="img" aria-label="timeline">'
    ]
    for i, api in enumerate(lanes):
        y = i * lane_h
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_esc(_tail(api))}</text>'
            f'<line x1="{label_w}" x2="{label_w + plot_w}" y1="{y + lane_h}" '
            f'y2="{y + lane_h}" class="lane"/>'
        )
    for call, (start, duration) in zip(calls, timings):
        if start is None:
            continue
        status = _status(call)
        x = label_w + (start - t0) / span * plot_w
        w = max((duration or 0) / span * plot_w, 3)
        y = lanes.index(call.api) * lane_h + 4
        took = f", {duration * 1e3:.3f} ms" if duration is not None else ""
        parts.append(
            f'<a href="#call-{call.index + 1}"><rect class="call {status}" x="{x:.1f}" '
            f'y="{y}" width="{w:.1f}" height="{lane_h - 8}" fill="{STATUS_COLOURS[status]}">'
            f"<title>[{call.index + 1}] {_esc(call.api)}: {status}{took}</title></rect></a>"
        )
    for record, when in zip(triggers, trigger_times):
        if when is None:
            continue
        x = label_w + (when - t0) / span * plot_w
        reason = record.get("trigger") or record.get("reason") or "trigger"
        parts.append(
            f'<line class="trigger" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height - 24}"/>'
            f'<text class="trigger" x="{x:.1f}" y="{height - 8}">{_esc(reason)}</text>'
        )
    parts.append(
        f'<text x="{label_w}" y="{height - 8}">{_esc(_clock(t0))}</text>'
        f'<text x="{label_w + plot_w}" y="{height - 8}" text-anchor="end">'
        f"+{span * 1e3:.1f} ms</text></svg>"
    )
    return "".join(parts)


def _tail(name, limit=56):
    """A long API name shortened from the left (the method name is what tells lanes apart)."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def _clock(seconds):
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _replay_results(path):
    """dir name -> replay result entry of ``flashinfer replay --json``."""
    if path is None:
        return {}
    with open(path) as f:
        data = json.load(f)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise ValueError(f"{path}: not a `flashinfer replay --json` report (no results list)")
    return {
        str(r.get("dir_name") or os.path.basename(str(r.get("dump_dir", "")))): r
        for r in results
        if isinstance(r, dict)
    }


REPLAY_COLOURS = {"passed": "#2e7d32", "mismatch": "#c62828", "error": "#c62828"}


def _replay_cell(result):
    if result is None:
        return "<td></td>"
    status = str(result.get("status", "?"))
    detail = result.get("message") or "; ".join(map(str, result.get("mismatches") or []))
    colour = REPLAY_COLOURS.get(status, STATUS_COLOURS["incomplete"])
    return (
        f'<td class="replay {_esc(status)}"><span class="badge" style="background:{colour}">'
        f"{_esc(status)}</span> {_esc(detail)}</td>"
    )


def _call_row(call, timing, replay, with_duration):
    """One row of the call table; ``replay`` is False when no replay report was given."""
    record = call.record or {}
    status = _status(call)
    info = record.get("tensor_info") or {}
    start, duration = timing
    exc = record.get("exception") or {}
    note = f"{exc.get('type')}: {exc.get('message')}" if exc else call.error or ""
    cells = [
        f'<td><a href="#detail-{call.index + 1}">{call.index + 1}</a></td>',
        f"<td>{_esc(_clock(start)[11:] if start else '')}</td>",
        f"<td><code>{_esc(call.api)}</code></td>",
        f'<td><span class="badge" style="background:{STATUS_COLOURS[status]}">{status}</span></td>',
    ]
    if with_duration:
        cells.append(f"<td>{'' if duration is None else f'{duration * 1e3:.3f} ms'}</td>")
    cells.append(f"<td>{_esc(call.pid)}</td>")
    cells.append(
        f"<td>{len(info.get('input_tensor_keys') or [])} / "
        f"{len(info.get('output_tensor_keys') or [])}</td>"
    )
    if replay is not False:
        cells.append(_replay_cell(replay))
    cells.append(f"<td>{_esc(note)}</td>")
    return f'<tr id="call-{call.index + 1}">' + "".join(cells) + "</tr>"


def _call_detail(call):
    record = call.record or {}
    rows = _tensor_rows(call, record, "input", "inputs")
    if call.status == "completed":
        rows += _tensor_rows(call, record, "output", "outputs")
    args = "".join(
        f"<li><code>{_esc(k)}</code> = <code>{_esc(json.dumps(v)[:300])}</code></li>"
        for k, v in (record.get("input_metadata") or {}).items()
    )
    return (
        f'<details id="detail-{call.index + 1}"><summary>[{call.index + 1}] '
        f"<code>{_esc(call.api)}</code> — {_esc(call.dir_name)}</summary>"
        f"<p>module <code>{_esc(record.get('module'))}</code>, signature "
        f"<code>{_esc(record.get('function_signature'))}</code></p>"
        + (f"<ul>{args}</ul>" if args else "")
        + '<table class="tensors"><tr><th>role</th><th>key</th><th>shape</th><th>dtype</th>'
        "<th>statistics</th><th>histogram</th></tr>" + "".join(rows) + "</table></details>"
    )


_CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.badge { color: #fff; border-radius: 3px; padding: 1px 6px; font-size: 12px; }
.timeline text { font: 12px monospace; fill: #333; }
.timeline .lane { stroke: #eee; }
.timeline .trigger { stroke: #6a1b9a; stroke-dasharray: 4 3; fill: #6a1b9a; }
.hist rect { fill: #1565c0; }
.range { font: 11px monospace; color: #555; }
.stats { font: 12px monospace; }
.error { color: #c62828; }
details { margin: 6px 0; }
.legend span { margin-right: 14px; }
"""


def render_report(root, replay_json=None, max_calls=200):
    """The HTML page of :func:`write_report` and its summary (``calls``, ``detailed``,
    ``statuses``, ``triggers``), without writing anything."""
    root = os.fspath(root)
    calls = session_calls(root)
    timings = [_timing(c) for c in calls]
    triggers = _triggers(root)
    replays = _replay_results(replay_json)
    statuses = Counter(_status(c) for c in calls)
    versions = next(((c.record or {}).get("versions") for c in calls if c.record), None) or {}
    legend = "".join(
        f'<span><span class="badge" style="background:{colour}">{name}</span> '
        f"{statuses.get(name, 0)}</span>"
        for name, colour in STATUS_COLOURS.items()
    )
    with_duration = any(d is not None for _, d in timings)
    head = ["#", "time", "API", "status"] + ["duration"] * with_duration
    head += ["pid", "tensors in / out"] + ["replay"] * bool(replays) + ["exception"]
    rows = "".join(
        _call_row(c, t, replays.get(c.dir_name) if replays else False, with_duration)
        for c, t in zip(calls, timings)
    )
    details = "".join(_call_detail(c) for c in calls[:max_calls])
    more = len(calls) - min(len(calls), max_calls)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>FlashInfer session report: {_esc(os.path.basename(os.path.abspath(root)))}</title>
<style>{_CSS}</style></head><body>
<h1>FlashInfer session report</h1>
<p>Session <code>{_esc(os.path.abspath(root))}</code>: {len(calls)} calls in
{len({c.pid for c in calls})} process(es), {len(triggers)} trigger record(s).
{_esc(", ".join(f"{k} {v}" for k, v in versions.items()))}</p>
<p class="legend">{legend}</p>
<h2>Timeline</h2>
{_timeline_svg(calls, timings, triggers)}
<h2>Calls</h2>
<table class="calls"><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{rows}</table>
<h2>Tensors</h2>
{details}
{f"<p>{more} more calls are not detailed (raise --max-calls).</p>" if more else ""}
</body></html>
"""
    return page, {
        "calls": len(calls),
        "detailed": min(len(calls), max_calls),
        "statuses": dict(statuses),
        "triggers": len(triggers),
    }


def write_report(root, out, replay_json=None, max_calls=200):
    """Write the HTML report of a recorded session.

    Parameters
    ----------
    root : str or os.PathLike
        A dump root (or one dump directory).
    out : str or os.PathLike
        The HTML file to write.
    replay_json : str, optional
        The report of ``flashinfer replay --json`` for the same session.
    max_calls : int
        Calls whose tensors (statistics, histograms) are detailed; the timeline and
        the call table always show every call.

    Returns
    -------
    dict
        ``path``, ``calls``, ``detailed``, ``statuses`` (count per display status),
        ``triggers``.

    Raises
    ------
    FileNotFoundError
        ``root`` does not exist.
    ValueError
        ``replay_json`` is not a replay report, or the session cannot be read.
    """
    page, summary = render_report(root, replay_json, max_calls)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return {"path": os.path.abspath(out), **summary}
