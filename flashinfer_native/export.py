"""``flashinfer dumps --export SRC OUT``: a session of the compact layout in FlashInfer's layout.

Every call directory of SRC is written to OUT (docs/dump-format.md): its ``metadata.jsonl``
with ``"tensor_format": "torch"``, each ``inputs.chunks.json`` / ``outputs.chunks.json``
manifest as a sparse ``.pt`` whose unrecorded bytes (pages the call did not read) are holes
that read as zeros, and its tensor files already in FlashInfer's layout (``.pt``,
``.safetensors``, graph snapshots) copied. ``session.jsonl`` is rewritten the same way. The
chunk packs are not copied: each exported call stands alone, and FlashInfer's own
``replay_from_dump`` / ``replay_sequence`` read it.

SRC is only read, as untrusted input: its records through the bounded readers of
``dumpdir``, its manifests and packs through the strict C reader; symbolic links are
refused, not followed. OUT must not exist yet (or be an empty directory).
"""

import json
import os
import shutil
import stat

from . import _C, dumpdir
from . import record as rec

__all__ = ["export_session"]

# FlashInfer's tensor files, copied as they are; a manifest becomes a torch file
_TORCH = "torch"
_COPIED_SUFFIXES = (rec.TENSOR_SUFFIXES[_TORCH], rec.TENSOR_SUFFIXES["safetensors"])


def _entries(path):
    """(name, lstat) of path's entries; a symbolic link is refused, never followed."""
    out = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        dumpdir.refuse_link(full)
        out.append((name, os.lstat(full)))
    return out


def _records(path):
    """The JSON records of a metadata.jsonl or session.jsonl, lines in order, each as a dict
    (None for a line that is not one: it is dropped)."""
    with dumpdir.open_regular(path) as f:
        for lineno, line in rec.bounded_lines(f):
            if line is None:
                raise ValueError(
                    f"{path}: line {lineno} is longer than {dumpdir.size_text(rec.MAX_LINE_BYTES)}"
                )
            if line.strip():
                try:
                    yield rec.parse_record(line)
                except ValueError:
                    yield None


def _export_records(src, dst):
    """src's records with FlashInfer's tensor_format, one JSON line each, to dst."""
    lines = []
    for record in _records(src):
        if record is None:
            continue
        if record.get("tensor_format") == rec.COMPACT_FORMAT:
            record = dict(record, tensor_format=_TORCH)
        lines.append(json.dumps(record) + "\n")
    with open(dst, "x") as f:
        f.writelines(lines)


def _merged(ranges):
    out = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _export_manifest(src, dst):
    tensors, ranges = _C.load_chunks(src, ranges=True)
    keep = {key: _merged(r) for key, r in ranges.items()}
    _C.save_tensors(dst, tensors, "torch", keep=keep)


def _export_dir(src, dst, counts):
    """A call directory (or a folder inside one, such as graph_flushes/)."""
    os.mkdir(dst, 0o700)
    for name, st in _entries(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if stat.S_ISDIR(st.st_mode):
            _export_dir(s, d, counts)
        elif not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{s}: not a regular file")
        elif name == dumpdir.METADATA_FILE:
            _export_records(s, d)
        elif name.endswith(dumpdir.CHUNKS_SUFFIX):
            _export_manifest(s, d[: -len(dumpdir.CHUNKS_SUFFIX)] + rec.TENSOR_SUFFIXES[_TORCH])
            counts["converted"] += 1
        elif name.endswith(_COPIED_SUFFIXES):
            shutil.copyfile(s, d)


def export_session(src, out):
    """Write the session at SRC to OUT in FlashInfer's layout.

    Returns
    -------
    dict
        ``calls`` (call directories written) and ``converted`` (manifests written as
        ``.pt`` files).

    Raises
    ------
    ValueError, OSError
        SRC is not a dump root or holds something refused (the message names it); OUT
        exists and is not empty.
    """
    src, out = os.fspath(src), os.fspath(out)
    if not os.path.isdir(src):
        raise ValueError(f"{src}: not a dump root directory")
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"{out}: exists and is not an empty directory; export writes a new one")
    os.makedirs(out, 0o700, exist_ok=True)
    counts = {"calls": 0, "converted": 0}
    for name, st in _entries(src):
        s = os.path.join(src, name)
        if name == rec.SESSION_FILE and stat.S_ISREG(st.st_mode):
            _export_records(s, os.path.join(out, name))
        elif stat.S_ISDIR(st.st_mode) and os.path.isfile(os.path.join(s, dumpdir.METADATA_FILE)):
            _export_dir(s, os.path.join(out, name), counts)
            counts["calls"] += 1
    return counts
