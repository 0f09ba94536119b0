"""A recorded session: its calls in one order, and what they need (docs/replay.md#from-python).

This is the one session model. :func:`load_session` reads a dump root (or one call's
directory) into a :class:`Session` of :class:`Call` entries in the call order of
``dumpdir.ordered_dumps``, each with its place in the session (process, position,
occurrence of its API). ``replay`` and ``dumps`` select from it, ``repro`` takes the
chain that built a wrapper from it (:meth:`Session.setup_chain`), ``diff`` matches two
of them and ``report`` draws one. Like ``dumpdir`` it only reads: nothing a dump names
is imported or called (docs/security.md).
"""

import fnmatch
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from . import dumpdir

__all__ = [
    "PLAN_METHODS",
    "Call",
    "NoDumpError",
    "Session",
    "load_session",
    "parse_timestamp",
    "session_calls",
]

# Methods that set a wrapper object up for its runs: replay and repro rebuild an object
# with its __init__ and the latest of these before a method call on it.
PLAN_METHODS = ("plan", "begin_forward")


class NoDumpError(ValueError):
    """A directory given as a recorded session holds no dump."""


@dataclass
class Call:
    """One dumped call of a session.

    Attributes
    ----------
    index : int
        Position in the session's call order (0-based).
    path : str
        The dump directory.
    api : str
        ``function_name`` (``"?"`` when the metadata cannot be read).
    pid : int or None
        ``process_id``.
    process : int
        Index of the process, in the order of its first call.
    position : int
        Position among the calls of its process (0-based).
    occurrence : int
        1-based count of this API within its process.
    sequence : int or None
        The recorder's ``sequence`` (absent in FlashInfer's dumps).
    call_sequence : int or None
        The per-process, per-API counter of the directory name.
    status : str
        ``execution_status`` of the last record, ``"unreadable"`` when none could be read.
    self_id : int or None
        ``id(self)`` for method calls.
    timestamp : str or None
        The recorded start, ``YYYYmmdd_HHMMSS_mmm``.
    record : dict or None
        The last metadata record (None when not kept or unreadable).
    error : str or None
        Why the metadata could not be read.
    """

    index: int
    path: str
    api: str
    pid: object
    process: int = 0
    position: int = 0
    occurrence: int = 1
    sequence: object = None
    call_sequence: object = None
    status: str = "unreadable"
    self_id: object = None
    timestamp: object = None
    record: dict = field(default=None, repr=False)
    error: object = None

    @property
    def dir_name(self):
        """The dump directory's name."""
        return os.path.basename(self.path.rstrip("/"))

    @property
    def is_method(self):
        """A method of a recorded object (``Class.method`` with a ``self_id``)."""
        return "." in self.api and self.self_id is not None

    @property
    def method(self):
        """The method's name (``run`` of ``Wrapper.run``); the API name for a function."""
        return self.api.rsplit(".", 1)[1] if "." in self.api else self.api

    def row(self):
        """The call as one flat record (what :meth:`Session.records` lists)."""
        record = self.record or {}
        info = _dict(record.get("tensor_info"))
        exc = _dict(record.get("exception"))
        rank = _dict(record.get("distributed")).get("rank")
        start = parse_timestamp(self.timestamp)
        return {
            "index": self.index,
            "api": self.api,
            "status": self.status,
            "time": None if start is None else datetime.fromtimestamp(start),
            "duration_us": _number(record.get("duration_us")),
            "pid": self.pid,
            "rank": rank if isinstance(rank, int) else None,
            "sequence": self.sequence,
            "occurrence": self.occurrence,
            "self_id": self.self_id,
            "input_bytes": _as_int(info.get("input_size_bytes")),
            "output_bytes": _as_int(info.get("output_size_bytes")),
            "inputs": len(_list(info.get("input_tensor_keys"))),
            "outputs": len(_list(info.get("output_tensor_keys"))),
            "exception": exc.get("type") if isinstance(exc.get("type"), str) else None,
            "dir": self.path,
        }


def _dict(value):
    return value if isinstance(value, dict) else {}


def _list(value):
    return value if isinstance(value, list) else []


def _number(value):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def _as_int(value):
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _read_one(path):
    try:
        return dumpdir.read_metadata(path), None
    except (OSError, ValueError) as exc:
        return None, str(exc)


def _matches(api, patterns):
    return any(fnmatch.fnmatchcase(api, p) for p in patterns)


@dataclass
class Session:
    """A recorded session: its calls in call order, and what ``session.jsonl`` adds.

    A ``Session`` is a sequence of :class:`Call` (``len``, indexing, iteration).

    Attributes
    ----------
    root : str
        The dump root, or the one call directory given.
    calls : list of Call
    single : bool
        ``root`` is one call's directory.
    triggers : list of dict
        The flight recorder's trigger records (``record_type: "trigger"``; also a
        record that is no call's line, without ``dump_dir``, holding a ``trigger`` key or
        ``execution_status: "trigger"``).
    skipped : list of dict
        The recorder's records of calls it did not dump (``record_type: "skipped"``:
        ``reason``, ``calls_skipped``, per process).
    session_file : str or None
        ``session.jsonl`` when there is one.
    unreadable_records : int
        Lines of ``session.jsonl`` that are not JSON objects (a process killed mid-write
        cuts its last line).
    oversized_lines : list of int
        Line numbers of ``session.jsonl`` skipped unread, longer than the bound.
    """

    root: str
    calls: list
    single: bool = False
    triggers: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    session_file: object = None
    unreadable_records: int = 0
    oversized_lines: list = field(default_factory=list)

    def __len__(self):
        return len(self.calls)

    def __getitem__(self, index):
        return self.calls[index]

    def __iter__(self):
        return iter(self.calls)

    def records(self):
        """Every call as one flat dict (:meth:`Call.row`), in call order."""
        return [call.row() for call in self.calls]

    def to_pandas(self):
        """The calls as a ``pandas.DataFrame``, one row per call (the columns of
        :meth:`Call.row`).

        Raises
        ------
        ImportError
            pandas is not installed.
        """
        try:
            import pandas
        except ImportError:
            raise ImportError(
                "Session.to_pandas() needs pandas (pip install pandas); "
                "Session.records() gives the same rows as dicts"
            ) from None
        columns = list(Call(0, "", "").row())
        return pandas.DataFrame(self.records(), columns=columns)

    def skipped_calls(self):
        """``{reason: calls skipped}``, the latest count of each recording process."""
        latest = {}
        for record in self.skipped:
            key = (record.get("process_id"), record.get("reason"))
            latest[key] = max(latest.get(key, 0), _as_int(record.get("calls_skipped")) or 0)
        out = Counter()
        for (_, reason), n in latest.items():
            out[str(reason)] += n
        return dict(out)

    def setup_chain(self, call, full_chain=False):
        """The calls that set up ``call``'s object before it, in order: the object's
        ``__init__`` and its latest plan (``full_chain``: every call on it since the
        ``__init__``). Empty for a function, or for an ``__init__``.

        Raises
        ------
        ValueError
            A method call whose object's ``__init__`` was not dumped before it.
        """
        if not call.is_method or call.method == "__init__":
            return []
        cls = call.api.rsplit(".", 1)[0]
        same_object = [
            c
            for c in self.calls[: call.index]
            if c.pid == call.pid
            and c.self_id == call.self_id
            and c.api.startswith(cls + ".")
            and c.status == "completed"
        ]
        inits = [c for c in same_object if c.api == f"{cls}.__init__"]
        if not inits:
            raise ValueError(
                f"{call.path}: no {cls}.__init__ dump of this object (process_id={call.pid}, "
                f"self_id={call.self_id}) precedes the call in {self.root}; record with "
                "FLASHINFER_DUMP_INCLUDE/EXCLUDE letting __init__ and plan through"
            )
        since = [c for c in same_object if c.index > inits[-1].index]
        if not full_chain:
            since = [c for c in since if c.method in PLAN_METHODS][-1:]
        return [inits[-1], *since]

    def select(self, include=None, exclude=None):
        """The calls passing the API-name filters (fnmatch, include first, then
        exclude), with the calls that set up their objects pulled in.

        Returns
        -------
        list of (Call, bool)
            In call order; the flag is True for a call that did not pass the filters
            but sets up the object of one that did (its ``__init__`` and latest plan).
            A method whose ``__init__`` was not dumped is kept without setup: replaying
            it says what is missing.
        """
        include = dumpdir.split_patterns(include)
        exclude = dumpdir.split_patterns(exclude)
        if not include and not exclude:
            return [(c, False) for c in self.calls]
        chosen = {
            c.index
            for c in self.calls
            if (not include or _matches(c.api, include)) and not _matches(c.api, exclude)
        }
        setup = set()
        for index in sorted(chosen):
            try:
                setup.update(c.index for c in self.setup_chain(self.calls[index]))
            except ValueError:
                continue
        setup -= chosen
        return [(c, c.index in setup) for c in self.calls if c.index in chosen | setup]


def _holds_dumps(root):
    return bool(dumpdir.find_dump_dirs(root)) or os.path.lexists(
        os.path.join(root, dumpdir.SESSION_FILE)
    )


def load_session(path, keep_records=True, session_file=True):
    """Read a recorded session: its calls in call order, with their place in it.

    ``path`` may also be one call's dump directory (a session of one call). Call order
    is that of docs/dump-format.md#call-order. Occurrences count each API within its
    process ordered by the recorded ``call_sequence`` (the per-process, per-API counter
    of the directory names), so they stay right for FlashInfer's dumps whose order
    across APIs within one millisecond is unknown.

    Parameters
    ----------
    path : str or os.PathLike
        A dump root (``FLASHINFER_DUMP_DIR``) or one call's dump directory.
    keep_records : bool
        Keep each call's last metadata record in ``Call.record``; ``diff`` drops them
        so a session of thousands of calls stays small in memory.
    session_file : bool
        Also read ``session.jsonl`` for the trigger and skip records (``diff`` needs only
        the calls).

    Returns
    -------
    Session
        A sequence of :class:`Call`; ``Session.to_pandas()`` makes a DataFrame of it
        when pandas is installed.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    NoDumpError
        ``path`` holds no dump: it is not a call directory, has no call directory
        (a sub-directory holding ``metadata.jsonl``) and no ``session.jsonl``.
    ValueError
        ``session.jsonl`` has a record with a field of the wrong type.
    """
    root = os.fspath(path)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"dump root directory not found: {root}")
    single = os.path.lexists(os.path.join(root, dumpdir.METADATA_FILE))
    if single:
        entries = [(root, _read_one(root)[0])]
    elif _holds_dumps(root):
        entries = dumpdir.ordered_dumps(root)
    else:
        raise NoDumpError(
            f"{root}: holds no dump (no {dumpdir.METADATA_FILE} in it or in a sub-directory, "
            f"no {dumpdir.SESSION_FILE}); pass a dump root (FLASHINFER_DUMP_DIR) or one "
            "call's directory"
        )
    calls = []
    processes = {}
    for index, (where, records) in enumerate(entries):
        error = None if records else _read_one(where)[1]
        last = records[-1] if records else {}
        pid = _as_int(last.get("process_id"))
        process = processes.setdefault(pid, len(processes))
        calls.append(
            Call(
                index=index,
                path=where,
                api=str(last.get("function_name", "?")),
                pid=pid,
                process=process,
                sequence=_as_int(last.get("sequence")),
                call_sequence=_as_int(last.get("call_sequence")),
                status=str(last.get("execution_status", "unreadable")) if records else "unreadable",
                self_id=_as_int(last.get("self_id")),
                timestamp=last.get("timestamp"),
                record=last if (records and keep_records) else None,
                error=error,
            )
        )
    _number_calls(calls)
    session = Session(root, calls, single)
    if session_file and not single:
        _read_session_file(session)
    return session


def _read_session_file(session):
    """Trigger and skip records, and the reader's counts, of ``session.jsonl``."""
    found = dumpdir.read_session(session.root)
    if found is None:
        return
    session.session_file = found.path
    session.unreadable_records = found.unreadable
    session.oversized_lines = found.oversized
    for _, record in found.records:
        kind = record.get("record_type")
        if kind == "skipped":
            session.skipped.append(record)
        elif kind == "trigger" or (
            kind is None
            and "dump_dir" not in record
            and ("trigger" in record or record.get("execution_status") == "trigger")
        ):
            session.triggers.append(record)


def session_calls(root, keep_records=True):
    """The calls of :func:`load_session` as a list, ``session.jsonl`` left unread (an
    empty list for a directory that holds no dump)."""
    try:
        return load_session(root, keep_records, session_file=False).calls
    except NoDumpError:
        return []


def _number_calls(calls):
    """Fill ``position`` and ``occurrence`` (per process, per API by call_sequence)."""
    per_process = {}
    per_api = {}
    for call in calls:
        call.position = per_process.get(call.process, 0)
        per_process[call.process] = call.position + 1
        per_api.setdefault((call.process, call.api), []).append(call)
    for group in per_api.values():
        ranked = sorted(
            group,
            key=lambda c: (c.call_sequence is None, c.call_sequence or 0, c.index),
        )
        for occurrence, call in enumerate(ranked, 1):
            call.occurrence = occurrence


def parse_timestamp(text):
    """Seconds since the epoch (local time) of a ``YYYYmmdd_HHMMSS_mmm`` stamp; None if not one."""
    if not isinstance(text, str):
        return None
    try:
        base = datetime.strptime(text[:15], "%Y%m%d_%H%M%S")
    except ValueError:
        return None
    millis = text[16:19]
    extra = int(millis) / 1000.0 if millis.isdigit() else 0.0
    return base.timestamp() + extra


# ------------------------------------------------------------------ the summary


def summarize(session):
    """What ``dumps`` prints of a session: calls per API, completed / exception /
    incomplete / unreadable calls, the metadata-only ones (``metadata_only``: a ring kept
    their records, not their tensors), bytes recorded and on disk, the flight recorder's
    triggers (what fired, the triggering call, the calls written and lost) and the calls the
    recorder skipped (by reason)."""
    completed, exceptions, incomplete, unreadable, metadata_only = [], [], [], [], []
    recorded = 0
    for call in session.calls:
        record = call.record or {}
        info = _dict(record.get("tensor_info"))
        if record.get("tensors_skipped"):
            metadata_only.append({"dir": call.dir_name, "reason": str(record["tensors_skipped"])})
        if call.status == "unreadable":
            unreadable.append({"dir": call.dir_name, "error": call.error})
        elif call.status == "completed":
            completed.append(call.dir_name)
            recorded += _as_int(info.get("total_size_bytes") or info.get("input_size_bytes")) or 0
        elif call.status == "exception":
            exc = _dict(record.get("exception"))
            exceptions.append(
                {"dir": call.dir_name, "type": exc.get("type"), "message": exc.get("message")}
            )
            recorded += _as_int(info.get("input_size_bytes")) or 0
        else:
            incomplete.append(call.dir_name)
            recorded += _as_int(info.get("input_size_bytes")) or 0
    per_api = Counter(c.api for c in session.calls)
    source = session.session_file or "metadata.jsonl files (no session.jsonl)"
    return {
        "root": os.path.abspath(session.root),
        "source": "metadata.jsonl (one call)" if session.single else source,
        "calls": len(session.calls),
        "per_api": dict(per_api.most_common()),
        "completed": sorted(completed),
        "exception": sorted(exceptions, key=lambda e: e["dir"]),
        "incomplete": sorted(incomplete),
        "unreadable": sorted(unreadable, key=lambda e: e["dir"]),
        "metadata_only": sorted(metadata_only, key=lambda m: m["dir"]),
        "recorded_bytes": recorded,
        "disk_bytes": _disk_bytes(session),
        "unreadable_records": session.unreadable_records,
        "oversized_lines": session.oversized_lines,
        "triggers": [_trigger_summary(r) for r in session.triggers],
        "skipped": session.skipped_calls(),
    }


def summarize_session(root):
    """:func:`summarize` of :func:`load_session` (``root``)."""
    return summarize(load_session(root))


def _disk_bytes(session):
    """Bytes of the session's own files: its call directories and ``session.jsonl``
    (never the rest of a directory that merely holds them)."""
    paths = [c.path for c in session.calls]
    if session.session_file:
        paths.append(session.session_file)
    total = 0
    for path in paths:
        if os.path.isfile(path):
            total += os.path.getsize(path)
            continue
        for dirpath, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    pass
    return total


def _trigger_summary(record):
    """A flight-recorder trigger record: what fired, at which call (directory name)."""
    return {
        "trigger": record.get("trigger"),
        "signal": record.get("signal"),
        "dir": os.path.basename(str(record.get("dump_dir", "")).rstrip("/")),
        "function_name": record.get("function_name"),
        "time": record.get("time"),
        "process_id": record.get("process_id"),
        "calls_written": record.get("calls_written"),
        "calls_lost": record.get("calls_lost", 0),
        "error": record.get("error"),
    }
