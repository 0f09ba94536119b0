"""``flashinfer-native report``: a recorded session as one static HTML file.

The page needs nothing but a browser: no network, no script, no server. It shows a
per-API summary (calls, statuses, input shapes, bytes, durations, NaN/Inf counts), a
timeline of the calls (one lane per API, coloured by status: completed, exception,
incomplete, triggered; trigger records of ``session.jsonl`` as markers; above
``TIMELINE_BARS`` calls each lane is aggregated into time bins, so that 10k calls stay
readable), a table of every call with its input shapes, and for each detailed call its
arguments by parameter name and its tensors with shape, dtype, the level-5 statistics
and a histogram drawn as inline SVG. Statistics and histograms are computed by the
core's C code over the memory-mapped dump files. With the JSON report of ``replay
--json``, each call also shows its replay result.

Building the report only reads the dump: nothing it names is imported or called.
"""

import html
import json
import os
from collections import Counter, defaultdict
from datetime import datetime

from . import _C, dumpdir
from . import record as rec
from .calls import load_session, parse_timestamp
from .repro import parameter_of, parse_signature

__all__ = ["render_report", "write_report"]

STATUS_COLOURS = {
    "completed": "#2e7d32",
    "exception": "#c62828",
    "incomplete": "#ef6c00",
    "triggered": "#6a1b9a",
    "unreadable": "#757575",
}
HISTOGRAM_BINS = 24
# Up to this many calls the timeline draws one bar per call; above, each lane shows
# TIMELINE_BINS bins of time, shaded by how many calls fall in each.
TIMELINE_BARS = 400
TIMELINE_BINS = 300
# Worst first: a bin takes the colour of its worst call.
_SEVERITY = ("exception", "incomplete", "triggered", "unreadable", "completed")


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
    the record has one, ``duration_us`` (line 2 of metadata.jsonl), ``duration_s`` or
    ``end_timestamp``."""
    record = call.record or {}
    start = parse_timestamp(call.timestamp)
    for key, scale in (("duration_us", 1e-6), ("duration_s", 1.0)):
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return start, float(value) * scale
    end = parse_timestamp(record.get("end_timestamp"))
    if start is not None and end is not None:
        return start, max(end - start, 0.0)
    return start, None


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


def _tensor_rows(call, record, role, stem, counts):
    """One table row per tensor of a call's inputs or outputs file, and per input recorded
    as scratch (its shape and dtype, docs/dump-format.md#scratch-tensors); adds the NaN and
    Inf counts to ``counts``."""
    where = os.path.join(call.path, dumpdir.METADATA_FILE)
    try:
        scratch = dumpdir.scratch_specs(record, where) if stem == "inputs" else {}
        if dumpdir.tensor_file(call.path, stem, record) is None and not scratch:
            return []
        tensors = dumpdir.load_call_tensors(call.path, stem, record, scratch=False)[0]
    except (OSError, ValueError) as exc:
        return [f'<tr><td colspan="6" class="error">{_esc(exc)}</td></tr>']
    params = parse_signature(record.get("function_signature")) or []
    rows = [
        "<tr>"
        f"<td>{_esc(role)}</td><td><code>{_esc(_key_label(key, params))}</code></td>"
        f"<td>{_esc(_shape_text(shape))}</td><td>{_esc(_dtype_text(dtype))}</td>"
        '<td class="stats">scratch: recorded as shape and dtype only</td><td></td>'
        "</tr>"
        for key, (shape, dtype) in scratch.items()
    ]
    for key, tensor in tensors.items():
        try:
            stats = _C.tensor_stats(tensor)
            hist = _C.tensor_histogram(tensor, bins=HISTOGRAM_BINS)
        except (TypeError, ValueError) as exc:
            stats, hist = {"error": str(exc)}, None
        counts["nan"] += _int(stats.get("nan_count"))
        counts["inf"] += _int(stats.get("inf_count"))
        rows.append(
            "<tr>"
            f"<td>{_esc(role)}</td><td><code>{_esc(_key_label(key, params))}</code></td>"
            f"<td>{_esc(_shape_text(tensor.shape))}</td><td>{_esc(_dtype_text(tensor.dtype))}</td>"
            f'<td class="stats">{_esc(stats.get("error") or _stats_text(stats))}</td>'
            f"<td>{_histogram_svg(hist) if hist else ''}</td>"
            "</tr>"
        )
    return rows


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ------------------------------------------------------------ readable values


def _key_label(key, params):
    """``q (arg_1)``: the parameter's name from the recorded signature, and the key;
    the key alone when the signature does not tell."""
    name = parameter_of(key, params)
    if name is None or key == rec.kwarg_key(name):
        return name or key
    return f"{name} ({key})"


def _dtype_text(dtype):
    """``float16`` for ``torch.float16``."""
    return str(dtype).rpartition(".")[2]


def _shape_text(shape):
    """``[2, 8, 64]``."""
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def _value_text(value, limit=200):
    """A decoded recorded value (``record.Value``) as a reader writes it: ``torch.float16``
    rather than its JSON encoding."""
    if isinstance(value, rec.Plain):
        text = repr(value.value) if not isinstance(value.value, dict) else json.dumps(value.value)
    elif isinstance(value, rec.TensorRef):
        text = f"tensor {value.key}"
    elif isinstance(value, rec.DType):
        text = value.text
    elif isinstance(value, rec.Device):
        text = f"device({value.text!r})"
    elif isinstance(value, rec.EnumRef):
        text = f"{str(value.class_path).rpartition('.')[2]}.{value.member}"
    elif isinstance(value, rec.Sequence):
        items = ", ".join(_value_text(v, limit) for v in value.items[:16])
        more = ", ..." if value.truncated or len(value.items) > 16 else ""
        text = f"({items}{more})" if value.kind == "tuple" else f"[{items}{more}]"
    elif isinstance(value, rec.Mapping):
        items = ", ".join(f"{_value_text(k)}: {_value_text(v)}" for k, v in value.items[:16])
        text = "{" + items + "}"
    else:
        text = value.repr
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _argument_items(record, where):
    """``[(label, text)]`` of a call's non-tensor inputs, by parameter name."""
    info = record.get("tensor_info") or {}
    params = parse_signature(record.get("function_signature")) or []
    try:
        arguments = rec.decode_inputs(
            record.get("input_metadata") or {}, info.get("input_tensor_keys") or [], where
        )
    except ValueError as exc:
        return [("error", str(exc))]
    found = [p for p in arguments.positional if p is not None]
    found += [(key, value) for _, key, value in arguments.keywords]
    return [
        (_key_label(key, params), _value_text(value))
        for key, value in found
        if not isinstance(value, (rec.TensorRef, rec.Opaque))
    ]


def _input_shapes(record, limit=4):
    """``q [2, 8, 64] float16; ...``: the call's input tensors from ``tensor_details``."""
    details = record.get("tensor_details") or {}
    keys = (record.get("tensor_info") or {}).get("input_tensor_keys") or []
    params = parse_signature(record.get("function_signature")) or []
    parts = []
    for key in keys[:limit]:
        d = details.get(key) if isinstance(details, dict) else None
        if not isinstance(d, dict) or not isinstance(d.get("shape"), list):
            continue
        name = parameter_of(key, params) or key
        shape = _shape_text(n for n in d["shape"] if isinstance(n, int))
        parts.append(f"{name} {shape} {_dtype_text(d.get('dtype', ''))}")
    if len(keys) > limit:
        parts.append(f"+{len(keys) - limit} more")
    return "; ".join(parts)


# ------------------------------------------------------------------ the page


def _trigger_time(record):
    """Seconds since the epoch of a trigger record: the ring's ``time`` (a number), or a
    ``timestamp`` stamp; None without either."""
    when = record.get("time")
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return float(when)
    return parse_timestamp(record.get("timestamp"))


def _timeline_svg(calls, timings, triggers):
    """One lane per API: a bar per call from its start, as wide as its duration; above
    ``TIMELINE_BARS`` calls, each lane in ``TIMELINE_BINS`` bins of time, each bin shaded
    by its share of the lane's busiest bin and coloured by its worst status."""
    starts = [t[0] for t in timings if t[0] is not None]
    trigger_times = [_trigger_time(r) for r in triggers]
    moments = starts + [t[0] + (t[1] or 0) for t in timings if t[0] is not None]
    moments += [t for t in trigger_times if t is not None]
    if not moments:
        return "<p>No call has a readable timestamp.</p>"
    t0, t1 = min(moments), max(moments)
    span = max(t1 - t0, 1e-3)
    lanes = list(dict.fromkeys(c.api for c in calls))
    lane_of = {api: i for i, api in enumerate(lanes)}
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
    geometry = (t0, span, label_w, plot_w, lane_h, lane_of)
    if len(calls) > TIMELINE_BARS:
        parts += _timeline_bins(calls, timings, geometry)
    else:
        parts += _timeline_bars(calls, timings, geometry)
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


def _timeline_bars(calls, timings, geometry):
    t0, span, label_w, plot_w, lane_h, lane_of = geometry
    parts = []
    for call, (start, duration) in zip(calls, timings):
        if start is None:
            continue
        status = _status(call)
        x = label_w + (start - t0) / span * plot_w
        w = max((duration or 0) / span * plot_w, 3)
        y = lane_of[call.api] * lane_h + 4
        took = f", {duration * 1e3:.3f} ms" if duration is not None else ""
        parts.append(
            f'<a href="#call-{call.index + 1}"><rect class="call {status}" x="{x:.1f}" '
            f'y="{y}" width="{w:.1f}" height="{lane_h - 8}" fill="{STATUS_COLOURS[status]}">'
            f"<title>[{call.index + 1}] {_esc(call.api)}: {status}{took}</title></rect></a>"
        )
    return parts


def _timeline_bins(calls, timings, geometry):
    """The aggregated lanes: one rectangle per API and bin of time that holds calls."""
    t0, span, label_w, plot_w, lane_h, lane_of = geometry
    bins = defaultdict(Counter)
    for call, (start, _) in zip(calls, timings):
        if start is None:
            continue
        slot = min(int((start - t0) / span * TIMELINE_BINS), TIMELINE_BINS - 1)
        bins[(call.api, slot)][_status(call)] += 1
    busiest = Counter()
    for (api, _), counts in bins.items():
        busiest[api] = max(busiest[api], sum(counts.values()))
    width = plot_w / TIMELINE_BINS
    parts = []
    for (api, slot), counts in sorted(bins.items(), key=lambda item: item[0][1]):
        total = sum(counts.values())
        worst = next(s for s in _SEVERITY if counts.get(s))
        opacity = 0.25 + 0.75 * total / busiest[api]
        x = label_w + slot * width
        y = lane_of[api] * lane_h + 4
        offset = slot * span / TIMELINE_BINS
        what = ", ".join(f"{n} {status}" for status, n in counts.most_common())
        parts.append(
            f'<rect class="bin {worst}" x="{x:.1f}" y="{y}" width="{max(width, 1):.2f}" '
            f'height="{lane_h - 8}" fill="{STATUS_COLOURS[worst]}" '
            f'fill-opacity="{opacity:.2f}"><title>{_esc(api)}: {total} calls from '
            f"+{offset * 1e3:.1f} ms ({what})</title></rect>"
        )
    return parts


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
    start, duration = timing
    exc = record.get("exception") or {}
    note = f"{exc.get('type')}: {exc.get('message')}" if exc else call.error or ""
    if record.get("tensors_skipped"):
        note = f"{_metadata_only(record)}; {note}" if note else _metadata_only(record)
    cells = [
        f'<td><a href="#detail-{call.index + 1}">{call.index + 1}</a></td>',
        f"<td>{_esc(_clock(start)[11:] if start else '')}</td>",
        f"<td><code>{_esc(call.api)}</code></td>",
        f'<td><span class="badge" style="background:{STATUS_COLOURS[status]}">{status}</span></td>',
    ]
    if with_duration:
        cells.append(f"<td>{'' if duration is None else f'{duration * 1e3:.3f} ms'}</td>")
    cells.append(f"<td>{_esc(call.pid)}</td>")
    cells.append(f'<td class="shapes">{_esc(_input_shapes(record))}</td>')
    if replay is not False:
        cells.append(_replay_cell(replay))
    cells.append(f"<td>{_esc(note)}</td>")
    return f'<tr id="call-{call.index + 1}">' + "".join(cells) + "</tr>"


def _metadata_only(record):
    """The note of a call a ring kept the records of, not the tensors (docs/ring.md)."""
    return f"metadata only: tensors not kept ({record['tensors_skipped']})"


def _call_detail(call, counts):
    record = call.record or {}
    if record.get("tensors_skipped"):
        rows = [f'<tr><td colspan="6">{_esc(_metadata_only(record))}</td></tr>']
    else:
        rows = _tensor_rows(call, record, "input", "inputs", counts)
        if call.status == "completed":
            rows += _tensor_rows(call, record, "output", "outputs", counts)
    where = os.path.join(call.path, dumpdir.METADATA_FILE)
    args = "".join(
        f"<li><code>{_esc(label)}</code> = <code>{_esc(text)}</code></li>"
        for label, text in _argument_items(record, where)
    )
    return (
        f'<details id="detail-{call.index + 1}"><summary>[{call.index + 1}] '
        f"<code>{_esc(call.api)}</code> — {_esc(call.dir_name)}</summary>"
        f"<p>module <code>{_esc(record.get('module'))}</code>, signature "
        f"<code>{_esc(record.get('function_signature'))}</code></p>"
        + (f"<ul>{args}</ul>" if args else "")
        + '<table class="tensors"><tr><th>role</th><th>parameter</th><th>shape</th>'
        "<th>dtype</th><th>statistics</th><th>histogram</th></tr>"
        + "".join(rows)
        + "</table></details>"
    )


def _bytes_text(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _api_summary(calls, timings, nonfinite):
    """The per-API table: calls by status, input shapes, bytes, durations, NaN/Inf."""
    groups = defaultdict(list)
    for call, timing in zip(calls, timings):
        groups[call.api].append((call, timing))
    rows = []
    for api, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        statuses = Counter(_status(c) for c, _ in members)
        shapes = Counter(_input_shapes(c.record or {}, limit=3) for c, _ in members)
        shown = [f"{text} ×{n}" if n > 1 else text for text, n in shapes.most_common(3) if text]
        if len(shapes) > 3:
            shown.append(f"{len(shapes) - 3} more shapes")
        size = 0
        for c, _ in members:
            info = (c.record or {}).get("tensor_info") or {}
            size += _int(info.get("total_size_bytes") or info.get("input_size_bytes"))
        durations = [d for _, (_, d) in members if d is not None]
        took = ""
        if durations:
            mean = sum(durations) / len(durations)
            took = f"{mean * 1e3:.3f} / {max(durations) * 1e3:.3f} ms"
        counts = nonfinite.get(api)
        bad = f"{counts['nan']} / {counts['inf']}" if counts is not None else ""
        rows.append(
            f"<tr><td><code>{_esc(api)}</code></td><td>{len(members)}</td>"
            f"<td>{_esc(', '.join(f'{n} {s}' for s, n in statuses.most_common()))}</td>"
            f'<td class="shapes">{"<br>".join(_esc(x) for x in shown)}</td>'
            f"<td>{_bytes_text(size)}</td><td>{took}</td><td>{bad}</td></tr>"
        )
    return (
        '<table class="apis"><tr><th>API</th><th>calls</th><th>status</th>'
        "<th>input shapes</th><th>bytes recorded</th><th>duration mean / max</th>"
        "<th>NaN / Inf (detailed calls)</th></tr>" + "".join(rows) + "</table>"
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
.shapes { font: 12px monospace; }
.legend span { margin-right: 14px; }
"""


def render_report(root, replay_json=None, max_calls=200):
    """The HTML page of :func:`write_report` and its summary (``calls``, ``detailed``,
    ``statuses``, ``triggers``, ``skipped``), without writing anything."""
    root = os.fspath(root)
    session = load_session(root)
    calls = session.calls
    timings = [_timing(c) for c in calls]
    triggers = session.triggers
    skipped = session.skipped_calls()
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
    head += ["pid", "input shapes"] + ["replay"] * bool(replays) + ["exception"]
    rows = "".join(
        _call_row(c, t, replays.get(c.dir_name) if replays else False, with_duration)
        for c, t in zip(calls, timings)
    )
    nonfinite = {}
    details = []
    for c in calls[:max_calls]:
        details.append(_call_detail(c, nonfinite.setdefault(c.api, Counter(nan=0, inf=0))))
    more = len(calls) - min(len(calls), max_calls)
    not_dumped = "".join(
        f'<p class="skipped">{n} calls were not dumped: {_esc(reason)}.</p>'
        for reason, n in skipped.items()
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>FlashInfer session report: {_esc(os.path.basename(os.path.abspath(root)))}</title>
<style>{_CSS}</style></head><body>
<h1>FlashInfer session report</h1>
<p>Session <code>{_esc(os.path.abspath(root))}</code>: {len(calls)} calls in
{len({c.pid for c in calls})} process(es), {len(triggers)} trigger record(s).
{_esc(", ".join(f"{k} {v}" for k, v in versions.items()))}</p>
{not_dumped}
<p class="legend">{legend}</p>
<h2>APIs</h2>
{_api_summary(calls, timings, nonfinite)}
<h2>Timeline</h2>
{_timeline_svg(calls, timings, triggers)}
<h2>Calls</h2>
<table class="calls"><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{rows}</table>
<h2>Tensors</h2>
{"".join(details)}
{f"<p>{more} more calls are not detailed (raise --max-calls).</p>" if more else ""}
</body></html>
"""
    return page, {
        "calls": len(calls),
        "detailed": min(len(calls), max_calls),
        "statuses": dict(statuses),
        "triggers": len(triggers),
        "skipped": skipped,
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
        ``replay_json`` is not a replay report, the session cannot be read, or ``root``
        holds no dump (``calls.NoDumpError``).
    """
    page, summary = render_report(root, replay_json, max_calls)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return {"path": os.path.abspath(out), **summary}
