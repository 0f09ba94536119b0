"""Reading a level-10 dump tree: metadata records, tensor files, call order, session.jsonl.

Everything here only reads: it never imports a module or calls anything named by a
dump (docs/security.md). The session model (``calls.py``) is built on it.
"""

import errno
import fnmatch
import math
import os
import stat
from dataclasses import dataclass, field

import torch

from . import _C
from . import record as rec
from .record import field_problem, parse_record

__all__ = [
    "CHUNKS_SUFFIX",
    "METADATA_FILE",
    "find_dump_dirs",
    "load_call_tensors",
    "load_tensor_file",
    "load_tensors",
    "open_regular",
    "ordered_dumps",
    "parse_record",
    "read_metadata",
    "read_session",
    "record_type_problem",
    "refuse_link",
    "scratch_keys",
    "scratch_specs",
    "scratch_tensors",
    "size_text",
    "tensor_file",
]

METADATA_FILE = rec.METADATA_FILE
SESSION_FILE = rec.SESSION_FILE
# the compact layout's manifest of a call's tensors, in place of inputs.pt / outputs.pt
CHUNKS_SUFFIX = rec.CHUNKS_SUFFIX
_DIR_NAME = rec.DIR_NAME


# --------------------------------------------------------------------- records

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path, mode):
    kind = next((name for test, name in _FILE_KINDS if test(mode)), f"mode {mode:o}")
    return ValueError(f"{path}: not a regular file ({kind})")


def open_regular(path):
    """Open ``path`` for reading in binary mode, refusing anything but a regular file.

    A FIFO, device or socket in a dump would block a reader forever or have side effects
    when opened, so the type is checked before opening and again on the open file (the
    open itself is non-blocking, in case the path changed in between). A symbolic link
    is refused, never followed (docs/security.md): its target may lie outside the dump.

    Raises
    ------
    FileNotFoundError, OSError
        The file is missing or unreadable.
    ValueError
        It is not a regular file, or it is a symbolic link.
    """
    refuse_link(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link(path) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _link(path):
    return ValueError(
        f"{path}: is a symbolic link; links inside a dump are not followed (copy the file "
        "into the dump instead)"
    )


def refuse_link(path):
    """ValueError when ``path`` itself is a symbolic link (its target is never read)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise _link(path)
    except FileNotFoundError:
        pass


record_type_problem = field_problem


def read_metadata(dump_dir):
    """Read every record of ``DUMP_DIR/metadata.jsonl``.

    The file is read with bounds (``record.MAX_METADATA_BYTES`` in all,
    ``record.MAX_LINE_BYTES`` per line), must be a regular file, and each record's fields
    that replay uses must have their JSON types (``function_name`` a string, ...).

    Parameters
    ----------
    dump_dir : str or os.PathLike
        One dump directory.

    Returns
    -------
    list of dict
        The records in file order (line 1 ``inputs_saved``, line 2 if the call ended).
        A last line without its newline that is not JSON was cut short when the
        process was killed mid-write, and is left out.

    Raises
    ------
    FileNotFoundError
        The directory or its metadata file does not exist.
    ValueError
        The file is empty, too large, not a regular file, or a line is not a JSON
        object with fields of the right types; the message names the file and line.
    """
    dump_dir = os.fspath(dump_dir)
    if not os.path.isdir(dump_dir):
        raise FileNotFoundError(f"dump directory not found: {dump_dir}")
    path = os.path.join(dump_dir, METADATA_FILE)
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: metadata file is missing") from None
    except OSError as exc:
        raise OSError(f"{path}: cannot read metadata file ({exc.strerror})") from None
    records = []
    total = 0
    with f:
        for lineno, line in rec.bounded_lines(f):
            if line is None:
                raise ValueError(
                    f"{path}: line {lineno} is longer than {size_text(rec.MAX_LINE_BYTES)}"
                )
            total += len(line)
            if total > rec.MAX_METADATA_BYTES:
                raise ValueError(
                    f"{path}: metadata file is larger than {size_text(rec.MAX_METADATA_BYTES)}"
                )
            if not line.strip():
                continue
            try:
                record = parse_record(line)
            except ValueError as exc:
                if not line.endswith(b"\n"):
                    break  # the last record, cut short by a kill: the call is incomplete
                raise ValueError(f"{path}: line {lineno} {exc}") from None
            problem = record_type_problem(record)
            if problem:
                raise ValueError(f"{path}: line {lineno}: {problem}")
            records.append(record)
    if not records:
        raise ValueError(f"{path}: metadata file is empty (no JSON records)")
    return records


def size_text(n):
    """``16 MiB`` for whole mebibytes, else ``N bytes``: the bounds as messages name them."""
    return f"{n >> 20} MiB" if n and n % (1 << 20) == 0 else f"{n} bytes"


# ---------------------------------------------------------------- tensor files


def load_tensors(path):
    """Load a dumped ``.pt`` or ``.safetensors`` file into a dict of tensors.

    A strict native reader: it never executes pickle code, restores the recorded
    shape, stride, dtype and ``requires_grad`` (strides of safetensors files from
    their ``__metadata__``) and memory-maps the file where it can.

    Parameters
    ----------
    path : str or os.PathLike
        The tensor file.

    Returns
    -------
    dict[str, torch.Tensor]

    Raises
    ------
    ValueError, OSError
        For a missing, truncated, corrupt or hostile file; the message names the file
        and the problem.
    """
    return _C.load_tensors(os.fspath(path))


def load_tensor_file(path):
    """Load a dump tensor file into ``{key: tensor}`` on CPU, naming the file on failure.

    Raises
    ------
    ValueError
        The file is truncated, corrupt, or not a dict of tensors; the message names it.
    """
    refuse_link(path)
    try:
        tensors = _C.load_chunks(path) if path.endswith(CHUNKS_SUFFIX) else _C.load_tensors(path)
    except Exception as exc:
        if path in str(exc):
            raise
        raise ValueError(
            f"{path}: cannot read tensor file, truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(t, torch.Tensor) for t in tensors.values()
    ):
        raise ValueError(f"{path}: tensor file does not hold a dict of tensors")
    return tensors


def tensor_file(dump_dir, stem, record):
    """Path of the inputs/outputs file, preferring the recorded ``tensor_format``; None if
    absent. Whatever is there is returned (the reader refuses what is not a regular file).
    The compact layout's manifest (``inputs.chunks.json``, docs/dump-format.md) is read
    like a tensor file."""
    order = list(rec.TENSOR_SUFFIXES.values())
    tensor_format = record.get("tensor_format")
    first = rec.TENSOR_SUFFIXES.get(tensor_format) if isinstance(tensor_format, str) else None
    if first:
        order.remove(first)
        order.insert(0, first)
    for ext in order:
        path = os.path.join(dump_dir, stem + ext)
        if os.path.lexists(path):
            return path
    return None


# ------------------------------------------------------------ scratch tensors

_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def scratch_keys(record):
    """The input keys a record marks as scratch (``"scratch": true`` in ``tensor_details``,
    docs/dump-format.md#scratch-tensors), in the order ``input_tensor_keys`` lists them."""
    details = record.get("tensor_details")
    listed = (record.get("tensor_info") or {}).get("input_tensor_keys") or []
    if not isinstance(details, dict):
        return []
    return [
        k for k in listed if isinstance(details.get(k), dict) and details[k].get("scratch") is True
    ]


def _scratch_shape(shape):
    if not isinstance(shape, list) or len(shape) > rec.MAX_SCRATCH_DIMS:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return None
    return tuple(shape)


def scratch_specs(record, where):
    """``{key: (shape, dtype)}`` of the inputs a record marks as scratch, checked.

    The record is untrusted: the shape must be a list of at most ``record.MAX_SCRATCH_DIMS``
    non-negative integers of at most ``record.MAX_SCRATCH_BYTES`` bytes, the dtype one of
    torch's.

    Raises
    ------
    ValueError
        One line naming ``where``, the key and the problem.
    """
    out = {}
    for key in scratch_keys(record):
        d = record["tensor_details"][key]
        problem = f"{where}: tensor_details[{key!r}]: scratch tensor"
        dtype = _DTYPES.get(d.get("dtype")) if isinstance(d.get("dtype"), str) else None
        if dtype is None:
            raise ValueError(f"{problem} has an unknown torch dtype {str(d.get('dtype'))[:60]!r}")
        shape = _scratch_shape(d.get("shape"))
        if shape is None:
            raise ValueError(
                f"{problem} shape {str(d.get('shape'))[:60]} is not a list of at most "
                f"{rec.MAX_SCRATCH_DIMS} non-negative integers"
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > rec.MAX_SCRATCH_BYTES:
            raise ValueError(
                f"{problem} of {nbytes} bytes is larger than the {rec.MAX_SCRATCH_BYTES} "
                "a reader makes"
            )
        out[key] = (shape, dtype)
    return out


def scratch_tensors(record, where, device="cpu"):
    """Fresh zero tensors for the inputs a record marks as scratch, ``{key: tensor}``.

    A scratch input is recorded as its shape and dtype only (the tensor file holds a zero
    view of it, or nothing); replay, diff and report read it as a new contiguous zero tensor
    of that shape and dtype on ``device`` (:func:`scratch_specs` checks the record).
    """
    return {
        key: torch.zeros(shape, dtype=dtype, device=device)
        for key, (shape, dtype) in scratch_specs(record, where).items()
    }


def load_call_tensors(dump_dir, stem, record, device="cpu", scratch=True):
    """A call's inputs or outputs (``stem``): ``({key: tensor}, path)``.

    The file (``tensor_file``) is checked against the keys ``tensor_info`` lists, and the
    inputs the record marks as scratch are fresh zero tensors on ``device``
    (:func:`scratch_tensors`), or, with ``scratch=False``, left out (the caller makes them
    from :func:`scratch_specs`); the other tensors are as the file holds them, on the CPU.
    ``({}, None)`` when the call has no such file and lists no tensors.

    Raises
    ------
    FileNotFoundError, ValueError
        The file is missing, unreadable or lacks a listed key, or a scratch entry is
        refused; the message names the file.
    """
    where = os.path.join(os.fspath(dump_dir), METADATA_FILE)
    list_name = "input_tensor_keys" if stem == "inputs" else "output_tensor_keys"
    listed = (record.get("tensor_info") or {}).get(list_name) or []
    made = {}
    if stem == "inputs":
        made = scratch_tensors(record, where, device) if scratch else scratch_specs(record, where)
    path = tensor_file(dump_dir, stem, record)
    if path is None:
        stored = [k for k in listed if k not in made]
        if stored:
            raise FileNotFoundError(
                f"{dump_dir}: {stem} file ({stem}.pt or {stem}.safetensors) is missing "
                f"but metadata lists tensors {stored[:5]}"
            )
        return (made if scratch else {}), None
    tensors = load_tensor_file(path)
    missing = [key for key in listed if key not in tensors and key not in made]
    if missing:
        raise ValueError(f"{path}: tensors {missing[:5]} listed in metadata are missing")
    for key in made:
        tensors.pop(key, None)
    if scratch:
        tensors.update(made)
    return tensors, path


# ------------------------------------------------------------------ call order


def find_dump_dirs(root_dir):
    """Sub-directories of ``root_dir`` holding ``metadata.jsonl``, sorted by name.

    A symbolic link under the root is not a dump directory: it is never followed. A hidden
    one is skipped: a ring's write-out fills a call's directory under a hidden name and
    renames it once whole (docs/ring.md#write-outs)."""
    root_dir = os.fspath(root_dir)
    if not os.path.isdir(root_dir):
        raise FileNotFoundError(f"dump root directory not found: {root_dir}")
    return sorted(
        os.path.join(root_dir, name)
        for name in os.listdir(root_dir)
        if not name.startswith(".")
        and not os.path.islink(os.path.join(root_dir, name))
        and os.path.lexists(os.path.join(root_dir, name, METADATA_FILE))
    )


def _order_key(first_record, dir_name):
    """Sort key ``(timestamp, process_id, sequence, name)``; None without ``sequence``."""
    if first_record is None or "sequence" not in first_record:
        return None
    ts = first_record.get("timestamp")
    ts_key = (0, float(ts), "") if isinstance(ts, (int, float)) else (1, 0.0, str(ts))
    try:
        pid = int(first_record.get("process_id") or 0)
        sequence = int(first_record["sequence"])
    except (TypeError, ValueError):
        return None
    return (ts_key, pid, sequence, dir_name)


def _fallback_key(dir_name):
    """Key for a dump whose metadata cannot be read: its place from the directory name."""
    match = _DIR_NAME.match(dir_name)
    if match is None:
        return ((2, 0.0, dir_name), 0, math.inf, dir_name)
    return ((1, 0.0, match.group(1)), int(match.group(2)), math.inf, dir_name)


def _session_positions(root_dir):
    """Line number of each call directory's first record in the root's session.jsonl,
    by directory name: without ``sequence`` (FlashInfer's dumps), the only record of the
    order of calls made in the same millisecond. Empty when the file is missing or
    cannot be read."""
    positions = {}
    try:
        session = read_session(root_dir)
    except (OSError, ValueError):
        return positions
    for lineno, record in session.records if session else ():
        where = record.get("dump_dir")
        if isinstance(where, str):
            positions.setdefault(os.path.basename(where.rstrip("/")), lineno)
    return positions


def _name_key(dir_name, positions):
    """Sort key of a dump without ``sequence``: (timestamp, pid) from its name, then its
    place in session.jsonl, then the name."""
    match = _DIR_NAME.match(dir_name)
    place = positions.get(dir_name, math.inf)
    if match is None:
        return (dir_name, 0, place, dir_name)
    return (match.group(1), int(match.group(2)), place, dir_name)


def split_patterns(patterns):
    """fnmatch patterns from a comma-separated string or a list; blanks dropped."""
    if not patterns:
        return []
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    return [p.strip() for p in patterns if p and p.strip()]


def _api_name(records, dir_name):
    if records:
        return str(records[-1].get("function_name", ""))
    match = _DIR_NAME.match(dir_name)
    return match.group(3) if match else dir_name


def ordered_dumps(root_dir, include=None, exclude=None):
    """Dumps under ``root_dir`` passing the filters, in call order.

    Order: ``(timestamp, process_id, sequence)`` when every readable dump has
    ``sequence`` (unreadable ones take their place from the directory name), else the
    timestamp and process id of the directory name, calls of the same millisecond in
    the order of the root's session.jsonl.

    Returns
    -------
    list of (str, list or None)
        Dump path and its metadata records (None when they cannot be read).
    """
    include, exclude = split_patterns(include), split_patterns(exclude)
    entries = []
    for path in find_dump_dirs(root_dir):
        name = os.path.basename(path)
        try:
            records = read_metadata(path)
        except (OSError, ValueError):
            records = None
        api = _api_name(records, name)
        if include and not any(fnmatch.fnmatchcase(api, p) for p in include):
            continue
        if any(fnmatch.fnmatchcase(api, p) for p in exclude):
            continue
        entries.append((path, records))
    keys = [_order_key(r[0] if r else None, os.path.basename(p)) for p, r in entries]
    if all(k is not None for k, (_, r) in zip(keys, entries) if r):
        keys = [
            k if k is not None else _fallback_key(os.path.basename(p))
            for k, (p, _) in zip(keys, entries)
        ]
    else:
        positions = _session_positions(root_dir)
        keys = [_name_key(os.path.basename(p), positions) for p, _ in entries]
    return [e for _, e in sorted(zip(keys, entries), key=lambda pair: pair[0])]


# ------------------------------------------------------------- session.jsonl


@dataclass
class SessionFile:
    """What :func:`read_session` read: ``records`` as ``(line number, record)``, lines
    that are not JSON objects (a process killed mid-write cuts its last line) counted in
    ``unreadable``, the numbers of lines longer than ``record.MAX_LINE_BYTES`` (skipped
    unread) in ``oversized``."""

    path: str
    records: list = field(default_factory=list)
    unreadable: int = 0
    oversized: list = field(default_factory=list)


def read_session(root):
    """Read ``ROOT/session.jsonl`` through the bounded line reader; None when it is
    missing.

    Every reader of the session file (``dumps``, ``report``, the call order) goes
    through here, so each gets the same bounds.

    Raises
    ------
    ValueError
        The file is not a regular file, or a record parses but has a field no consumer
        may use (a non-finite or huge number, a wrong JSON type); the message names the
        file, the line and the field.
    """
    path = os.path.join(os.fspath(root), SESSION_FILE)
    if not os.path.lexists(path):
        return None
    session = SessionFile(path)
    with open_regular(path) as f:
        for lineno, line in rec.bounded_lines(f):
            if line is None:
                session.oversized.append(lineno)
                continue
            if not line.strip():
                continue
            try:
                record = parse_record(line)
            except ValueError:
                session.unreadable += 1
                continue
            problem = field_problem(record)
            if problem:
                raise ValueError(f"{path}: line {lineno}: {problem}")
            session.records.append((lineno, record))
    return session
