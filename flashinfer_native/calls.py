"""A recorded session as a list of light call entries: order, process, occurrence, status.

``repro`` (the chain that built a wrapper), ``diff`` (matching two sessions) and
``report`` (the timeline) share it. Like ``dumpdir`` it only reads: nothing named by a
dump is imported or called (docs/security.md).
"""

import os
from dataclasses import dataclass, field
from datetime import datetime

from . import dumpdir

__all__ = ["Call", "session_calls", "parse_timestamp"]


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


def _as_int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _read_one(path):
    try:
        return dumpdir.read_metadata(path), None
    except (OSError, ValueError) as exc:
        return None, str(exc)


def session_calls(root, keep_records=True):
    """The calls dumped under ``root`` in call order, with their place in the session.

    ``root`` may also be one dump directory (a session of one call). Occurrences count
    each API within its process ordered by the recorded ``call_sequence`` (the
    per-process, per-API counter of the directory names), so they stay right for
    FlashInfer's dumps whose order across APIs within one millisecond is unknown.

    Parameters
    ----------
    root : str or os.PathLike
        A dump root (``FLASHINFER_DUMP_DIR``) or one dump directory.
    keep_records : bool
        Keep each call's last metadata record in ``Call.record``; ``diff`` drops them
        so a session of thousands of calls stays small in memory.

    Returns
    -------
    list of Call

    Raises
    ------
    FileNotFoundError
        ``root`` does not exist.
    """
    root = os.fspath(root)
    if os.path.isfile(os.path.join(root, dumpdir.METADATA_FILE)):
        entries = [(root, _read_one(root)[0])]
    else:
        entries = dumpdir.ordered_dumps(root)
    calls = []
    processes = {}
    for index, (path, records) in enumerate(entries):
        error = None if records else _read_one(path)[1]
        last = records[-1] if records else {}
        pid = _as_int(last.get("process_id"))
        process = processes.setdefault(pid, len(processes))
        calls.append(
            Call(
                index=index,
                path=path,
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
    _number(calls)
    return calls


def _number(calls):
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
