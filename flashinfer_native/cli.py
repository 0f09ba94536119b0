"""Command line: ``replay`` (docs/replay.md), ``dumps`` (docs/flight-recorder.md), ``info``,
``run`` (docs/serving-flashinfer.md); ``repro``, ``diff``, ``report`` (docs/triage.md).

``cli`` is the click group: the ``flashinfer-native`` command (``python -m
flashinfer_native``), and the ``flashinfer`` command of the mirror package (``python -m
flashinfer``). Messages name the program as it was run (docs/install.md#the-command-line).
"""

import importlib.util
import json
import os
import runpy
import sys
import traceback
from collections import Counter

import click
import torch

from . import __version__, calls, dumpdir, hook, record, registry
from . import replay as _replay
from .terminal import escape

# Longest line of dump text printed (terminal.escape counts what is left out).
_MAX_LINE = 4000

_MARKS = {
    "passed": ("✅ Passed", "green"),
    "mismatch": ("❌ Mismatch", "red"),
    "error": ("❌ Error", "red"),
    "incomplete": (
        "⚠️ Incomplete: the process ended during this call (inputs only, not run)",
        "yellow",
    ),
    "ran": ("✅ Ran (recorded with inputs only: nothing to compare)", "green"),
    "skipped": ("⏭️ Skipped: metadata only, not run", "yellow"),
}


class _Commands(click.Group):
    """The command group. A dump is untrusted input: whatever a reader of it raises ends
    the command with one escaped line on stderr and exit status 1, never a traceback
    (``run`` excepted: the script it runs is the user's own)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if ctx.invoked_subcommand == "run":
                raise
            raise _failure(f"{type(exc).__name__}: {exc}") from None


@click.group(
    "flashinfer-native",
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version")
def cli():
    """Replay, inspect and triage level-10 flight-recorder dumps."""


def _stdout_is_terminal():
    """Colour and progress only for a person watching, never in pipes or files."""
    return sys.stdout.isatty()


def _device_option(ctx, param, value):
    if value is None:
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise click.BadParameter(f"{value!r} is not a torch device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter(f"{value!r}: CUDA is not available on this machine")
    return device


def _allow_module_option(ctx, param, value):
    """The patterns, once their modules imported: a module that does not import is one
    line and exit status 1, not N refusals. The current directory is searched first, as
    ``python -m`` searches it (a console script's ``sys.path`` lacks it)."""
    if value and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        registry.import_allowed(value)
    except (ImportError, TypeError) as exc:
        raise _failure(f"--allow-module: {exc}") from None
    return list(value)


_allow_modules_option = click.option(
    "--allow-module",
    "allow_modules",
    metavar="PATTERN",
    multiple=True,
    callback=_allow_module_option,
    help="Also call @flashinfer_api functions of modules matching PATTERN (fnmatch; "
    "a name includes its submodules; imported first). Repeatable. Only flashinfer is "
    "allowed by default: dumps are untrusted input.",
)


_allow_jit_args_option = click.option(
    "--allow-jit-args",
    is_flag=True,
    help="Also pass arguments that reach FlashInfer's JIT compiler (jit_args and the others "
    "of docs/security.md, or text where a number belongs): they are code or paths, not "
    "data; refused by default.",
)


def _device_name(ctx, param, value):
    """A torch device name, not necessarily present here (a script may run elsewhere)."""
    if value is None:
        return None
    try:
        return str(torch.device(value))
    except (RuntimeError, ValueError) as exc:
        raise click.BadParameter(f"{value!r} is not a torch device ({exc})") from None


def _first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else text


def _say(text):
    """Print one line holding a dump's text: escaped, so that it stays one line and
    drives no terminal (docs/security.md)."""
    click.echo(escape(text, limit=_MAX_LINE))


def _failure(exc):
    """A ClickException (exit status 1, ``Error: ...`` on one stderr line) from an error
    whose message may quote a dump."""
    return click.ClickException(escape(str(exc), limit=_MAX_LINE))


def _message(result, status):
    if status == "error":
        return _first_line(result.get("error") or result.get("execution_error", ""))
    return ""


def _passed_note(result):
    """What a passed call's line adds: the exception it raised as recorded, or why its
    outputs were not compared."""
    metadata = result.get("metadata") or {}
    if metadata.get("execution_status") == "exception":
        raised = (metadata.get("exception") or {}).get("type") or "an exception"
        return f"raised {raised}, as recorded"
    return result.get("comparison_skipped") or ""


def _call_line(index, result, status, color, setup=False):
    """The line of one replayed call; the dump's text in it escaped (``terminal.escape``)
    before the colour is added."""
    name = (result.get("metadata") or {}).get("function_name", "unknown")
    mark, colour = _MARKS[status]
    text = mark
    if status == "error":
        text = f"{mark}: {escape(_message(result, status))}"
    elif status == "passed" and _passed_note(result):
        text = f"{mark} ({escape(_passed_note(result))})"
    elif status == "skipped":
        text = f"{mark} ({escape(result['skipped'])})"
    dir_name = escape(os.path.basename(result.get("dump_dir", "")))
    styled = click.style(text, fg=colour) if color else text
    return f"[{index}] {escape(name)} ({dir_name}): {styled}" + (" [setup]" if setup else "")


def _report_entry(index, result, status, setup=False):
    metadata = result.get("metadata") or {}
    entry = {
        "index": index,
        "function_name": metadata.get("function_name"),
        "dump_dir": result.get("dump_dir"),
        "dir_name": os.path.basename(result.get("dump_dir", "")),
        "status": status,
        "execution_status": metadata.get("execution_status"),
    }
    if setup:
        entry["setup"] = True
    if status == "error":
        entry["message"] = result.get("error") or result.get("execution_error")
    if result.get("mismatches"):
        entry["mismatches"] = result["mismatches"]
    if result.get("comparison_skipped"):
        entry["comparison_skipped"] = result["comparison_skipped"]
    if status == "skipped":
        entry["skipped"] = result["skipped"]
    return entry


def _dir_argument(command):
    """DIR as a positional argument, with ``--dir DIR`` still accepted (the former
    spelling): every command takes its directory the same way."""
    command = click.option(
        "--dir",
        "dir_option",
        metavar="DIR",
        default=None,
        type=click.Path(exists=True, file_okay=False, dir_okay=True),
        help="The same as the DIR argument (the former spelling, still accepted).",
    )(command)
    return click.argument(
        "dump_dir",
        metavar="DIR",
        required=False,
        type=click.Path(exists=True, file_okay=False, dir_okay=True),
    )(command)


def _one_dir(dump_dir, dir_option):
    """The directory given as DIR or --dir (a usage error when neither or both differ)."""
    if dump_dir is not None and dir_option is not None and dump_dir != dir_option:
        raise click.UsageError("give the directory once: as DIR or with --dir, not both")
    chosen = dump_dir if dump_dir is not None else dir_option
    if chosen is None:
        raise click.UsageError("Missing argument 'DIR' (a dump root, or one call's directory).")
    return chosen


def _load_session(dump_dir):
    """The session of DIR; a directory holding no dump is a one-line error (exit 1)."""
    try:
        return calls.load_session(dump_dir)
    except (OSError, ValueError) as exc:
        raise _failure(exc) from None


@cli.command()
@_dir_argument
@click.option(
    "--device",
    callback=_device_option,
    default=None,
    help="Device for the replay (default: cuda when available, else cpu).",
)
@click.option(
    "--include",
    default=None,
    help="Comma-separated fnmatch patterns of API names; the __init__ and plan that a "
    "selected method call needs come along as setup.",
)
@click.option("--exclude", default=None, help="Comma-separated fnmatch patterns to skip.")
@click.option("--rtol", type=float, default=1e-3, show_default=True, help="Relative tolerance.")
@click.option("--atol", type=float, default=1e-3, show_default=True, help="Absolute tolerance.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a machine-readable report to this file.",
)
@_allow_modules_option
@_allow_jit_args_option
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks and every mismatch.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the summary line.")
@click.option(
    "--failures-only",
    is_flag=True,
    help="Print only the calls that did not pass (and the summary).",
)
@click.option(
    "--run-incomplete",
    is_flag=True,
    help="Also run the calls recorded with inputs only (the process ended during the "
    "call): nothing to compare, they pass when they return.",
)
@click.option(
    "--against",
    type=click.Choice(["recording", "reference"]),
    default="recording",
    show_default=True,
    help="recording: run each call again and compare with its recorded outputs. "
    "reference: run no kernel; check each recorded call of a traced API against its "
    "trace template's reference, on --device (default cpu), by the template's check "
    "(--rtol/--atol, when given, are passed to it).",
)
@click.option(
    "--per-rank",
    is_flag=True,
    help="Under torchrun: each rank replays the calls recorded by the process of its rank "
    "(on cuda:LOCAL_RANK, or the CPU); rank 0 prints one merged summary.",
)
def replay(
    dump_dir,
    dir_option,
    device,
    include,
    exclude,
    rtol,
    atol,
    json_path,
    allow_modules,
    allow_jit_args,
    verbose,
    quiet,
    failures_only,
    run_incomplete,
    against,
    per_rank,
):
    """Replay recorded API calls and compare them with their recorded outputs.

    DIR is one call's dump directory, or a dump root (FLASHINFER_DUMP_DIR) replayed in
    call order. Only registered @flashinfer_api functions and classes of allowed
    modules are called (flashinfer, plus --allow-module); a dump naming anything else
    is refused.

    Exit status: 0 when every call passed (or was skipped: a metadata-only call, whose
    tensors a ring did not keep), 1 when any call failed, mismatched, was refused or
    incomplete, or DIR holds no dump or no call matches the filters, 2 for bad arguments
    or a missing directory. With --per-rank every rank exits 1 when any rank had a
    failure. With --against reference: 0 when no call mismatched or failed to load
    (calls without a reference are listed, not failed), 1 otherwise.
    """
    dump_dir = _one_dir(dump_dir, dir_option)
    session = _load_session(dump_dir)
    selected = session.select(include, exclude)
    if not selected:
        raise _failure(_nothing_selected(session, dump_dir, include, exclude))
    if against == "reference":
        if per_rank:
            raise click.UsageError("--per-rank replays calls; --against reference runs no kernel")
        from .reference_cli import replay_against_reference

        source = click.get_current_context().get_parameter_source
        given = {n: v for n, v in (("rtol", rtol), ("atol", atol)) if source(n).name != "DEFAULT"}
        entries = [
            (call.path, [call.record] if call.record else None, setup) for call, setup in selected
        ]
        status = replay_against_reference(
            dump_dir,
            entries,
            session.single,
            device,
            given,
            json_path,
            verbose,
            (allow_modules, allow_jit_args),
        )
        sys.exit(status)
    options = _ReplayOptions(rtol, atol, verbose, (allow_modules, allow_jit_args), run_incomplete)
    if per_rank:
        _replay_per_rank(dump_dir, selected, session.single, device, json_path, options)
        return
    device = _replay._resolve_device(device)
    header = "single dump" if session.single else "session"
    shown = "all"
    if quiet:
        shown = "none"
    elif failures_only:
        shown = "failures"
    if shown != "none":
        _say(f"Replaying {header} from {dump_dir}...")
    counts, report = _replay_entries(selected, device, options, click.echo, shown)
    click.echo(_summary_line(counts))
    if json_path:
        _write_json(
            json_path,
            _json_report(dump_dir, session.single, str(device), options, counts, report),
        )
    sys.exit(0 if _all_passed(counts) else 1)


class _ReplayOptions:
    """What every replayed call of one command shares."""

    def __init__(self, rtol, atol, verbose, allow, run_incomplete):
        self.rtol, self.atol, self.verbose = rtol, atol, verbose
        self.allow, self.run_incomplete = allow, run_incomplete


def _nothing_selected(session, dump_dir, include, exclude):
    apis = sorted({c.api for c in session})
    listed = ", ".join(apis[:8]) + (", ..." if len(apis) > 8 else "")
    return (
        f"no call of {dump_dir} matches --include {include or '*'!r} --exclude "
        f"{exclude or ''!r} ({len(session)} calls of {len(apis)} APIs: {listed})"
    )


def _all_passed(counts):
    total = sum(counts.values())
    good = (
        counts["passed"]
        + counts["ran"]
        + counts["skipped"]
        + counts["setup passed"]
        + counts["setup skipped"]
    )
    return total > 0 and good == total


def _replay_entries(selected, device, options, echo, shown="all"):
    """Replay the ``(Call, setup)`` pairs in order with one object registry; ``echo``
    takes each output line, ``shown`` says which (``all``, ``failures``, ``none``).
    Returns (Counter of outcomes, list of report entries)."""
    tty = echo is click.echo and _stdout_is_terminal()
    objects = {}
    counts = Counter()
    report = []
    for index, (call, setup) in enumerate(selected, 1):
        if tty:
            click.echo(f"  replaying {index}/{len(selected)} {escape(call.dir_name)}...", nl=False)
        result = _replay.replay_entry(
            call.path,
            [call.record] if call.record else None,
            objects,
            device,
            options.rtol,
            options.atol,
            *options.allow,
            run_incomplete=options.run_incomplete,
        )
        if tty:
            click.echo("\r\x1b[K", nl=False)
        status = _replay.classify(result)
        counts[f"setup {status}" if setup else status] += 1
        report.append(_report_entry(index, result, status, setup))
        if shown == "none" or (shown == "failures" and status in ("passed", "ran")):
            continue
        echo(_call_line(index, result, status, tty, setup))
        mismatches = (result.get("mismatches") or []) if status == "mismatch" else []
        for line in mismatches if options.verbose else mismatches[:3]:
            echo(escape(f"    {line}", limit=_MAX_LINE))
        if options.verbose and status == "error" and result.get("traceback"):
            for line in result["traceback"].rstrip().splitlines():
                echo(escape(line, limit=_MAX_LINE))
    return counts, report


def _summary_line(counts):
    failed = counts["mismatch"] + counts["error"]
    summary = f"Summary: {counts['passed']} passed, {failed} failed/mismatch"
    if counts["incomplete"]:
        summary += f", {counts['incomplete']} incomplete"
    if counts["ran"]:
        summary += f", {counts['ran']} incomplete ran (nothing to compare)"
    if counts["skipped"]:
        summary += f", {counts['skipped']} skipped (metadata only)"
    setup = {k[6:]: n for k, n in counts.items() if k.startswith("setup ") and n}
    if setup:
        parts = ", ".join(f"{n} {status}" for status, n in sorted(setup.items()))
        summary += f"; {sum(setup.values())} setup calls ({parts})"
    return summary


def _json_report(dump_dir, single, device, options, counts, report):
    setup = {k[6:]: n for k, n in counts.items() if k.startswith("setup ")}
    return {
        "dir": os.path.abspath(dump_dir),
        "mode": "single" if single else "session",
        "device": device,
        "rtol": options.rtol,
        "atol": options.atol,
        "summary": {
            "total": sum(n for k, n in counts.items() if not k.startswith("setup ")),
            "passed": counts["passed"],
            "failed": counts["mismatch"] + counts["error"],
            "mismatch": counts["mismatch"],
            "error": counts["error"],
            "incomplete": counts["incomplete"],
            "ran": counts["ran"],
            "skipped": counts["skipped"],
            "setup": dict(sorted(setup.items())),
        },
        "results": report,
    }


def _replay_per_rank(dump_dir, selected, single, device, json_path, options):
    """``replay --per-rank``: this rank's calls, then one merged summary from rank 0."""
    from .distributed import RankSession

    try:
        session = RankSession(device)
    except RuntimeError as exc:
        raise click.UsageError(str(exc)) from None
    by_path = {call.path: (call, setup) for call, setup in selected}
    entries = [(c.path, [c.record] if c.record else None) for c, _ in selected]
    try:
        mine, problems = session.mine(entries)
        lines = []
        counts, report = _replay_entries(
            [by_path[path] for path, _ in mine], session.device, options, lines.append
        )
        outcomes = session.gather((str(session.device), len(mine), lines, counts, report))
    finally:
        session.close()
    total = Counter()
    for counts_of_rank in (o[3] for o in outcomes):
        total.update(counts_of_rank)
    replayed = sum(o[1] for o in outcomes)
    ok = replayed > 0 and not problems and _all_passed(total)
    if session.rank == 0:
        header = "single dump" if single else "session"
        _say(f"Replaying {header} from {dump_dir} on {session.world_size} ranks...")
        for rank, (rank_device, count, rank_lines, _, _) in enumerate(outcomes):
            click.echo(f"Rank {rank} ({rank_device}): {count} calls")
            for line in rank_lines:
                _say(f"  {line}")
        for problem in problems:
            _say(f"Not replayed: {problem}")
        click.echo(f"{_summary_line(total)} ({session.world_size} ranks)")
        if json_path:
            data = _json_report(dump_dir, single, "per-rank", options, total, [])
            data["ranks"] = [
                {"rank": rank, "device": o[0], "calls": o[1], "results": o[4]}
                for rank, o in enumerate(outcomes)
            ]
            data["not_replayed"] = problems
            del data["results"]
            _write_json(json_path, data)
    sys.exit(0 if ok else 1)


def _write_json(path, data):
    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    except OSError as exc:
        raise click.FileError(path, hint=exc.strerror) from None


@cli.command()
@_dir_argument
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the counts, no list of calls.")
@click.option(
    "--failures-only",
    is_flag=True,
    help="List only the calls that raised, did not finish or cannot be read.",
)
@click.option(
    "--coverage",
    is_flag=True,
    help="Per recorded API: its call count and how it can be checked here (mirror kernel, "
    "reference, property, or none and why).",
)
@click.option(
    "--export-bench",
    "export_bench",
    type=click.Path(),
    metavar="OUT",
    default=None,
    help="Write each completed call of a traced API under DIR as a flashinfer-bench "
    "workload (definition JSON, workload JSONL, safetensors inputs) into the new folder OUT.",
)
@click.option(
    "--allow-module",
    "allow_modules",
    metavar="PATTERN",
    multiple=True,
    callback=_allow_module_option,
    help="With --coverage or --export-bench: also resolve @flashinfer_api functions of "
    "modules matching PATTERN (as replay's option).",
)
@click.option(
    "--export",
    nargs=2,
    type=click.Path(file_okay=False),
    default=None,
    metavar="SRC OUT",
    help="Write the session at SRC (compact layout) to the new folder OUT in FlashInfer's "
    "layout: one .pt per manifest, holes for unrecorded pages (DIR is not needed).",
)
def dumps(
    dump_dir,
    dir_option,
    as_json,
    quiet,
    failures_only,
    coverage,
    export_bench,
    allow_modules,
    export,
):
    """Summarise a recorded session: calls per API, completed, exception and crashed calls,
    the flight recorder's triggers (the triggering call is marked) and the calls the
    recorder skipped. With --export SRC OUT, convert a compact-layout session into
    FlashInfer's layout instead (docs/dump-format.md).

    --coverage lists how each recorded API can be checked here; --export-bench OUT
    writes the calls as flashinfer-bench workloads.

    Exit status: 0 when the session was read (or exported), 1 when it cannot be read, DIR
    holds no dump or the export fails (a one-line error says why), 2 for bad arguments or
    a missing directory.
    """
    if export:
        from .export import export_session

        try:
            n = export_session(*export)
        except (OSError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(
            f"Exported {n['calls']} calls ({n['converted']} manifests as .pt) from "
            f"{export[0]} to {export[1]}"
        )
        return
    dump_dir = _one_dir(dump_dir, dir_option)
    if export_bench is not None or coverage:
        from .reference_cli import dumps_coverage, dumps_export_bench

        if export_bench is not None:
            dumps_export_bench(dump_dir, export_bench, allow_modules)
        else:
            dumps_coverage(dump_dir, as_json, allow_modules)
        return
    s = calls.summarize(_load_session(dump_dir))
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    _say(f"Session {s['root']} ({s['source']})")
    counts = (
        f"{s['calls']} calls: {len(s['completed'])} completed, {len(s['exception'])} "
        f"exception, {len(s['incomplete'])} incomplete"
    )
    if s["unreadable"]:
        counts += f", {len(s['unreadable'])} unreadable"
    click.echo(counts)
    for reason, n in s["skipped"].items():
        _say(f"Calls not dumped: {n} ({reason})")
    click.echo(f"Tensor bytes recorded: {s['recorded_bytes']}, on disk: {s['disk_bytes']}")
    if s["unreadable_records"]:
        click.echo(f"Unreadable records skipped: {s['unreadable_records']}")
    if s["oversized_lines"]:
        lines = ", ".join(map(str, s["oversized_lines"][:5]))
        more = ", ..." if len(s["oversized_lines"]) > 5 else ""
        click.echo(
            f"Lines longer than {dumpdir.size_text(record.MAX_LINE_BYTES)} skipped unread: "
            f"{len(s['oversized_lines'])} (line {lines}{more})"
        )
    fired = {}
    if s["triggers"]:
        click.echo("Flight recorder triggers:")
        for t in s["triggers"]:
            what = str(t["trigger"] or "trigger") + (f" ({t['signal']})" if t.get("signal") else "")
            fired.setdefault(t["dir"], what)
            lost = f", {t['calls_lost']} lost ({t['error']})" if t.get("calls_lost") else ""
            _say(
                f"  {what} at {t['dir']} (pid {t['process_id']}): "
                f"{t['calls_written']} calls written{lost}"
            )
    if quiet:
        return
    if not failures_only:
        click.echo("Calls per API:")
        for api, n in s["per_api"].items():
            _say(f"  {api}: {n}")

    def mark(name):
        return f"  <- trigger: {fired[name]}" if name in fired else ""

    if s["completed"] and not failures_only:
        click.echo("Completed calls:")
        for name in s["completed"]:
            _say(f"  {name}{mark(name)}")
    if s["exception"]:
        click.echo("Exception calls:")
        for e in s["exception"]:
            _say(f"  {e['dir']}: {e['type']}: {e['message']}{mark(e['dir'])}")
    if s["incomplete"]:
        click.echo("Incomplete calls (the process ended during the call):")
        for name in s["incomplete"]:
            _say(f"  {name}{mark(name)}")
    if s["unreadable"]:
        click.echo("Unreadable calls:")
        for e in s["unreadable"]:
            _say(f"  {e['dir']}: {_first_line(e['error'])}")
    if s["metadata_only"]:
        click.echo("Metadata-only calls (records kept, tensors not; replay skips them):")
        for m in s["metadata_only"]:
            _say(f"  {m['dir']}: {m['reason']}")


def _tolerances(command):
    """--rtol and --atol of the triage commands (defaults as replay's)."""
    command = click.option(
        "--atol", type=float, default=1e-3, show_default=True, help="Absolute tolerance."
    )(command)
    return click.option(
        "--rtol", type=float, default=1e-3, show_default=True, help="Relative tolerance."
    )(command)


@cli.command()
@click.argument("dump_call_dir", type=click.Path(exists=True, file_okay=False, dir_okay=True))
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(),
    help="Folder to create (or, with --tar, the .tar.gz to write).",
)
@click.option(
    "--device",
    callback=_device_name,
    default=None,
    help="The script's default device (default: where the call was recorded); it may "
    "name a device this machine lacks.",
)
@click.option("--tar", is_flag=True, help="Write one .tar.gz holding the folder.")
@_tolerances
@click.option(
    "--full-chain",
    is_flag=True,
    help="For a wrapper method: replay every call on the object since its __init__, "
    "not only its latest plan.",
)
@_allow_modules_option
@_allow_jit_args_option
def repro(dump_call_dir, out, device, tar, rtol, atol, full_chain, allow_modules, allow_jit_args):
    """Export one recorded call as a folder with its tensors and a standalone repro.py.

    The script needs only torch and flashinfer; it rebuilds a wrapper's object
    (__init__, plan) before a method call, runs the call, compares with the recorded
    outputs (or exception) and exits 1 on a mismatch. It calls only what replay would
    call: registered @flashinfer_api functions of allowed modules (flashinfer, plus
    --allow-module); a dump naming anything else is refused.

    Exit status: 0 when the folder (or archive) was written, 1 when the call cannot be
    exported or is refused (a one-line error says why), 2 for bad arguments or a
    missing directory.
    """
    from .repro import export_repro

    try:
        done = export_repro(
            dump_call_dir,
            out,
            device,
            tar,
            rtol,
            atol,
            full_chain,
            allow_modules,
            allow_jit_args,
        )
    except (OSError, ValueError) as exc:
        raise _failure(exc) from None
    kind = "archive" if tar else "folder"
    _say(f"Wrote {kind} {done['path']} ({done['tensor_bytes']} bytes of tensors)")
    _say(f"Calls: {' -> '.join(done['steps'])}")
    for note in done["notes"]:
        _say(f"Note: {note}")
    run = (
        f"tar xzf {done['path']} && python {done['script']}" if tar else f"python {done['script']}"
    )
    _say(f"Run: {run}")


_DIFF_MARKS = {
    "same": "✅ Same",
    "diverged": "❌ Diverged",
    "only_a": "❌ Only in A",
    "only_b": "❌ Only in B",
}


def _command():
    """The command as the user ran it (``flashinfer-native``, ``python -m flashinfer``, ...),
    for the commands a message suggests."""
    return click.get_current_context().find_root().info_name


def _diff_sides(entry, roots):
    """Indented lines naming the call's dump directory on each side."""
    return [
        f"    {side.upper()}: {os.path.join(roots[side], entry[side]['dir'])}"
        for side in ("a", "b")
        if side in entry
    ]


def _diff_line(entry, roots, verbose):
    """The terminal lines of one diff entry (none for a matching call unless verbose)."""
    status = entry["status"]
    if status == "same" and not verbose:
        return []
    lines = [f"[{entry['index']}] {entry['api']}: {_DIFF_MARKS[status]}"]
    if status == "same":
        worst = [t["max_abs"] for t in entry.get("outputs", []) if t.get("max_abs") is not None]
        if worst:
            lines[0] += f" (outputs max abs diff {max(worst):.6g})"
    if verbose or status.startswith("only"):
        lines += _diff_sides(entry, roots)
    reasons = entry.get("reasons") or []
    if status == "diverged":
        lines += [f"    {r}" for r in (reasons if verbose else reasons[:3])]
        if len(reasons) > 3 and not verbose:
            lines.append(f"    ... {len(reasons) - 3} more (-v shows all)")
    return lines


class _JsonStream:
    """A diff report written as it goes: header keys, then each call, then the summary."""

    def __init__(self, path, header):
        self.path = path
        try:
            self.file = open(path, "w")
        except OSError as exc:
            raise click.FileError(path, hint=exc.strerror) from None
        self.file.write("{\n")
        for key, value in header.items():
            self.file.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        self.file.write('  "calls": [')
        self.first = True

    def add(self, entry):
        self.file.write(("\n    " if self.first else ",\n    ") + json.dumps(entry))
        self.first = False

    def close(self, tail):
        self.file.write("\n  ],\n")
        items = list(tail.items())
        for n, (key, value) in enumerate(items):
            comma = "," if n + 1 < len(items) else ""
            self.file.write(f"  {json.dumps(key)}: {json.dumps(value)}{comma}\n")
        self.file.write("}\n")
        self.file.close()


@cli.command()
@click.argument("a", type=click.Path(exists=True, file_okay=False, dir_okay=True))
@click.argument("b", type=click.Path(exists=True, file_okay=False, dir_okay=True))
@_tolerances
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    help="Write every call's comparison to this file (streamed).",
)
@click.option("--verbose", "-v", is_flag=True, help="Show matching calls and every reason.")
def diff(a, b, rtol, atol, json_path, verbose):
    """Compare two recorded sessions A and B call by call; B is the reference.

    Calls are matched by their position in their process when both sessions carry
    `sequence`, else by (API name, occurrence in the process). For each pair: max abs
    and max rel difference of every input and output tensor, differing non-tensor
    inputs and status. Prints the divergent calls and the first divergence. Reads the
    dumps only: nothing they name is imported or run.

    Exit status: 0 when nothing diverged, 1 otherwise, 2 for bad arguments or a missing
    directory.
    """
    from .diff import diff_sessions

    header, entries = diff_sessions(a, b, rtol, atol)
    _say(
        f"Comparing A {a} ({header['calls_a']} calls) with B {b} ({header['calls_b']} calls), "
        f"matched by {header['match']}"
    )
    stream = _JsonStream(json_path, header) if json_path else None
    counts = Counter()
    first = None
    roots = {"a": a, "b": b}
    for entry in entries:
        counts[entry["status"]] += 1
        if first is None and entry["status"] != "same":
            first = entry
        for line in _diff_line(entry, roots, verbose):
            _say(line)
        if stream:
            stream.add(entry)
    if first is not None:
        _say(f"First divergence: [{first['index']}] {first['api']}")
        for line in _diff_sides(first, roots):
            _say(line)
        for reason in first.get("reasons", [])[:5]:
            _say(f"    {reason}")
        side = "a" if "a" in first else "b"
        where = os.path.join(roots[side], first[side]["dir"])
        _say(f"Reproduce it: {_command()} repro {where} -o repro_{side}")
    summary = {
        "matched": counts["same"] + counts["diverged"],
        "same": counts["same"],
        "diverged": counts["diverged"],
        "only_a": counts["only_a"],
        "only_b": counts["only_b"],
    }
    click.echo(
        f"Summary: {summary['matched']} matched calls, {summary['same']} same, "
        f"{summary['diverged']} diverged; {summary['only_a']} only in A, "
        f"{summary['only_b']} only in B"
    )
    if stream:
        stream.close({"first_divergence": first, "summary": summary})
    sys.exit(0 if first is None else 1)


@cli.command()
@click.argument(
    "dump_dir", metavar="DIR", type=click.Path(exists=True, file_okay=False, dir_okay=True)
)
@click.option(
    "-o",
    "--output",
    "out",
    default="report.html",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The HTML file to write.",
)
@click.option(
    "--replay-json",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The report of `replay --json` for this session: adds each call's result.",
)
@click.option(
    "--max-calls",
    type=click.IntRange(min=0),
    default=200,
    show_default=True,
    help="Calls whose tensors get statistics and histograms (the timeline and table show all).",
)
def report(dump_dir, out, replay_json, max_calls):
    """Write a session as one static HTML page (no network, no JavaScript).

    A summary per API, a timeline of the calls per API coloured by status (aggregated
    over time for large sessions), a table of every call with its input shapes, and per
    call its arguments by name and its tensors with shape, dtype, level-5 statistics and
    a histogram (computed in C from the dump files). Reads the dumps only.

    Exit status: 0 when the page was written, 1 when the session cannot be read, DIR
    holds no dump or the page cannot be written (a one-line error says why), 2 for bad
    arguments or a missing directory.
    """
    from .report import write_report

    try:
        done = write_report(dump_dir, out, replay_json, max_calls)
    except (OSError, ValueError) as exc:
        raise _failure(exc) from None
    counts = ", ".join(f"{n} {s}" for s, n in done["statuses"].items())
    _say(f"Wrote {done['path']}: {done['calls']} calls ({counts}), {done['detailed']} detailed")


def _flashinfer_package():
    """(version, which) of the importable flashinfer package, or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    import flashinfer

    ours = importlib.util.find_spec("flashinfer._kernels") is not None
    which = "this repository's mirror" if ours else "FlashInfer (flashinfer-python)"
    return getattr(flashinfer, "__version__", "unknown"), which, ours


@cli.command()
def info():
    """Show whether the native core serves FlashInfer here, versions, the core's build
    and the GPUs visible.

    Exit status: 0.
    """
    from . import _C

    package = _flashinfer_package()
    state = hook.status()
    click.echo(f"flashinfer-native: {__version__} ({os.path.dirname(_C.__file__)})")
    if package is None:
        click.echo("flashinfer: not installed")
    else:
        click.echo(f"flashinfer: {package[0]} ({package[1]})")
    served = {True: "yes", False: "no (FlashInfer's own decorator)", None: "not imported"}
    click.echo(f"served by the native core in this process: {served[state['served']]}")
    click.echo(f"import hook in this process: {'installed' if state['hook_installed'] else 'no'}")
    variable = state["variable"]
    meaning = "on" if state["switched_on"] else "off"
    shown = "unset" if variable is None else repr(variable)
    click.echo(f"FLASHINFER_NATIVE_LOGGING: {shown} ({meaning} for processes started here)")
    where = state["hook_file"] or f"not installed ({hook.INSTALL_HINT} installs it)"
    click.echo(f"start-up hook (.pth): {where}")
    click.echo(f"torch: {torch.__version__}")
    click.echo(f"CPU paths: {_C.cpu_isa_paths} (this process: {_C.cpu_isa()})")
    built = [("CUDA statistics kernel built", _C)]
    if package is not None and package[2]:
        from flashinfer import _kernels

        built.insert(0, ("CUDA kernels built", _kernels))
    for what, ext in built:
        archs = f" ({ext.cuda_archs})" if ext.cuda_archs else ""
        click.echo(f"{what}: {'yes' if ext.cuda_built else 'no'}{archs}")
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver still lets info print the rest
        count = 0
        click.echo(f"GPU query failed: {traceback.format_exc(limit=0).strip()}")
    click.echo(f"GPUs visible: {count}")
    for i in range(count):
        click.echo(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "-m",
    "as_module",
    is_flag=True,
    help="TARGET is a module to run as __main__ (like python -m), not a script path.",
)
@click.option(
    "--level",
    type=click.Choice(["0", "1", "3", "5", "10"]),
    default=None,
    help="Sets FLASHINFER_LOGLEVEL.",
)
@click.option("--dump-dir", metavar="DIR", default=None, help="Sets FLASHINFER_DUMP_DIR.")
@click.option("--ring", type=click.IntRange(min=1), default=None, help="Sets FLASHINFER_DUMP_RING.")
@click.option("--dump-on", metavar="TRIGGERS", default=None, help="Sets FLASHINFER_DUMP_ON.")
@click.option("--include", metavar="PATTERNS", default=None, help="Sets FLASHINFER_DUMP_INCLUDE.")
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(as_module, level, dump_dir, ring, dump_on, include, target, args):
    """Run a Python script (or -m module) with FlashInfer served by the native core.

    The same as FLASHINFER_NATIVE_LOGGING=1: every @flashinfer_api of the installed
    FlashInfer logs, records and replays through the core, at FLASHINFER_LOGLEVEL. The
    variable is set for the processes the script starts, too, and so are the variables
    the options set. ARGS go to the script.

    Exit status: the script's own; 1 when the core's extension is not installed or the
    -m module cannot be found; 2 when TARGET is not a file.
    """
    # each option sets its variable (docs/logging.md#environment-variables)
    if level is not None:
        os.environ["FLASHINFER_LOGLEVEL"] = level
    if dump_dir is not None:
        os.environ["FLASHINFER_DUMP_DIR"] = dump_dir
    if ring is not None:
        os.environ["FLASHINFER_DUMP_RING"] = str(ring)
    if dump_on is not None:
        os.environ["FLASHINFER_DUMP_ON"] = dump_on
    if include is not None:
        os.environ["FLASHINFER_DUMP_INCLUDE"] = include
    os.environ["FLASHINFER_NATIVE_LOGGING"] = "1"
    if as_module:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError) as exc:
            raise _failure(f"cannot run module {target!r}: {exc}") from None
        if not found:
            raise _failure(f"no module named {target!r} (run -m takes a module name)")
    elif not os.path.isfile(target):
        raise click.BadParameter(f"{target!r} is not a file", param_hint="TARGET")
    if not hook.activate():
        sys.exit(1)
    sys.argv = [target, *args]
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    cli()
