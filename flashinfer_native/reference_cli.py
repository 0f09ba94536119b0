"""The command-line side of reference checks: ``replay --against reference``
(docs/replay.md). The checking itself is ``reference.py``."""

import json
import os
from collections import Counter

import click
import torch

from . import reference
from .replay import reference_entry
from .terminal import escape


def _say(text):
    """One line holding a dump's text, escaped (docs/security.md)."""
    click.echo(escape(text, limit=4000))


_MARKS = {
    "match": ("✅ match", "green"),
    "mismatch": ("❌ MISMATCH", "red"),
    "no_reference": ("➖ no reference", "yellow"),
    "error": ("❌ Error", "red"),
    "incomplete": ("⚠️ Incomplete: the process ended during this call (inputs only)", "yellow"),
    "skipped": ("⏭️ Skipped: metadata only, not checked", "yellow"),
}


def _how(outcome):
    """How a matching or mismatching call was judged, in words."""
    method, template = outcome.get("method"), outcome.get("template", "?")
    if method == "property":
        return f"property of {template}: {outcome.get('rule', '')}"
    if method == "template check":
        return f"{template}'s check of random outputs"
    return f"reference {template}"


def call_line(index, result, status, color=False, setup=False):
    """The summary line of one call (and its indented detail lines); a call the filters
    pulled in to set up a selected one ends in ``[setup]``, as plain replay's do."""
    name = (result.get("metadata") or {}).get("function_name", "unknown")
    mark, colour = _MARKS[status]
    outcome = result.get("reference") or {}
    if status == "match":
        text = f"{mark} ({_how(outcome)})"
    elif status == "mismatch":
        text = f"{mark} ({_how(outcome)})"
    elif status == "no_reference":
        text = f"{mark}: {outcome.get('reason', '')}"
    elif status == "error":
        text = f"{mark}: {str(result.get('error', '')).splitlines()[0]}"
    elif status == "skipped":
        text = f"{mark} ({result['skipped']})"
    else:
        text = mark
    styled = click.style(text, fg=colour) if color else text
    dir_name = os.path.basename(result.get("dump_dir", ""))
    return f"[{index}] {name} ({dir_name}): {styled}" + (" [setup]" if setup else "")


def _setup_counts(counts):
    return {k[6:]: n for k, n in sorted(counts.items()) if k.startswith("setup ") and n}


def summary_line(counts):
    text = (
        f"Summary: {counts['match']} match, {counts['mismatch']} mismatch, "
        f"{counts['no_reference']} no reference, {counts['error']} error"
    )
    if counts["property"]:
        text += f" ({counts['property']} matched by property)"
    if counts["incomplete"]:
        text += f", {counts['incomplete']} incomplete"
    if counts["skipped"]:
        text += f", {counts['skipped']} skipped (metadata only)"
    setup = _setup_counts(counts)
    if setup:
        parts = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in setup.items())
        text += f"; {sum(setup.values())} setup calls ({parts})"
    return text


def _report_entry(index, result, status, setup=False):
    metadata = result.get("metadata") or {}
    entry = {
        "index": index,
        "function_name": metadata.get("function_name"),
        "dump_dir": result.get("dump_dir"),
        "status": status,
    }
    if setup:
        entry["setup"] = True
    if status == "error":
        entry["message"] = result.get("error")
    if status == "skipped":
        entry["skipped"] = result["skipped"]
    for key in ("template", "method", "rule", "reason", "tensors", "mismatches", "differences"):
        if key in (result.get("reference") or {}):
            entry[key] = result["reference"][key]
    return entry


def replay_against_reference(
    dump_dir, entries, single, device, thresholds, json_path, verbose, allow
):
    """Check ``entries`` (``(path, records, setup)`` in call order; ``setup``: the call
    was pulled in by the filters to set up a selected one) against their references,
    print one line per call and the summary; returns the exit status. ``allow`` is
    ``(allow_modules, allow_jit_args)``."""
    allow_modules, allow_jit_args = allow
    device = torch.device("cpu") if device is None else device
    where = "single dump" if single else "session"
    click.echo(f"Checking {where} from {dump_dir} against the references on {device}...")
    objects = {}
    counts = Counter()
    report = []
    for index, (path, records, setup) in enumerate(entries, 1):
        result = reference_entry(
            path, records, objects, device, thresholds, allow_modules, allow_jit_args
        )
        status = reference.classify(result)
        counts[f"setup {status}" if setup else status] += 1
        if status == "match" and result["reference"].get("method") == "property" and not setup:
            counts["property"] += 1
        _say(call_line(index, result, status, setup=setup))
        lines = (result.get("reference") or {}).get("mismatches") or []
        for line in lines if verbose else lines[:3]:
            _say(f"    {line}")
        report.append(_report_entry(index, result, status, setup))
    if not entries:
        click.echo(f"No dumps (sub-directories holding metadata.jsonl) found in {dump_dir}")
    click.echo(summary_line(counts))
    if json_path:
        data = {
            "dir": os.path.abspath(dump_dir),
            "mode": "single" if single else "session",
            "against": "reference",
            "device": str(device),
            "thresholds": thresholds,
            "summary": {
                k: counts[k]
                for k in (
                    "match",
                    "mismatch",
                    "no_reference",
                    "error",
                    "incomplete",
                    "skipped",
                    "property",
                )
            },
            "results": report,
        }
        data["summary"]["total"] = sum(1 for *_, setup in entries if not setup)
        data["summary"]["setup"] = _setup_counts(counts)
        try:
            with open(json_path, "w") as f:
                json.dump(data, f, indent=2, default=str)
                f.write("\n")
        except OSError as exc:
            raise click.FileError(json_path, hint=exc.strerror) from None
    failed = sum(
        counts[prefix + k] for prefix in ("", "setup ") for k in ("mismatch", "error", "incomplete")
    )
    return 0 if entries and not failed else 1


def dumps_coverage(dump_dir, as_json, allow_modules):
    """``dumps --coverage``: one line per recorded API, then the totals."""
    from .coverage import session_coverage

    try:
        data = session_coverage(dump_dir, allow_modules)
    except (OSError, ValueError) as exc:
        raise click.ClickException(escape(str(exc))) from None
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    kind = "this repository's mirror" if data["mirror"] else "FlashInfer (flashinfer-python)"
    click.echo(f"Coverage of {dump_dir} with flashinfer {data['flashinfer']} ({kind}):")
    width = max([len(a["api"]) for a in data["apis"]] + [3])
    click.echo(f"  {'API':<{width}}  calls  checked by")
    for a in data["apis"]:
        _say(f"  {a['api']:<{width}}  {a['calls']:>5}  {', '.join(a['checked_by'])}")
    calls = sum(a["calls"] for a in data["apis"])
    totals = data["totals"]
    click.echo(
        f"{calls} calls of {len(data['apis'])} APIs: "
        + ", ".join(
            f"{totals.get(k, 0)} {k}" for k in ("mirror kernel", "reference", "property", "none")
        )
    )


def dumps_export_bench(root, out, allow_modules):
    """``dumps DIR --export-bench OUT``."""
    from .bench_export import BENCH_VERSION, export_bench

    if not os.path.isdir(root):
        raise click.BadParameter(f"{root!r} is not a directory", param_hint="DIR")
    try:
        done = export_bench(root, out, allow_modules)
    except (OSError, ValueError) as exc:
        raise click.ClickException(escape(str(exc))) from None
    total = sum(done["workloads"].values())
    click.echo(
        f"Wrote {total} workloads of {len(done['definitions'])} definitions to {out} "
        f"(flashinfer-bench {BENCH_VERSION} dataset layout)"
    )
    for name, count in done["workloads"].items():
        click.echo(f"  {name}: {count}")
    for s in done["skipped"]:
        _say(f"  skipped {s['dir']} ({s['api']}): {s['reason']}")
