"""``flashinfer diff``: where two recorded sessions start to disagree.

Two dump roots (two library versions, two devices, a CPU run against a GPU recording)
are walked call by call. Calls are matched by their position in their process when
both sessions carry the recorder's ``sequence``, else by (API name, occurrence of that
API in its process); processes are paired in the order of their first call. For each
matched pair the inputs and outputs are compared tensor by tensor (max abs and max rel
difference, elements outside ``rtol``/``atol`` by the comparison rule replay uses,
``compare.tensor_difference``; side B is the reference), together with the non-tensor
inputs and the call status.

It streams: one pair's tensors (memory-mapped by the core's loader) are alive at a
time, compared in one pass by the core's C code without temporary copies. It only reads
the dumps: nothing named by them is imported or called (docs/security.md).
"""

import math
import os
import re

from . import dumpdir
from .calls import session_calls
from .compare import tensor_difference
from .repro import is_scratch, parameter_of, parse_signature
from .terminal import brief

__all__ = ["diff_sessions", "tensor_difference"]

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")

# Input tensors whose content before the call is undefined (torch.empty buffers the
# call writes or uses as scratch): compared, reported, never counted as divergence.
# These output buffers and the scratch parameters of repro.SCRATCH_PARAMETERS.
SCRATCH_OUTPUTS = ("out", "lse")


# ------------------------------------------------------------------- values


def _normalized(value):
    """A recorded value with object addresses blanked (reprs of ``self`` differ by run)."""
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k != "tensor_key"}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, str):
        return _ADDRESS.sub("0x…", value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _metadata_differences(meta_a, meta_b, what):
    """Lines naming each non-tensor value that differs between two recordings."""
    lines = []
    for key in sorted(set(meta_a) | set(meta_b)):
        if key not in meta_a or key not in meta_b:
            side = "A" if key in meta_a else "B"
            lines.append(f"{what} {key}: only in {side}")
            continue
        va, vb = _normalized(meta_a[key]), _normalized(meta_b[key])
        if va != vb:
            lines.append(f"{what} {key}: {brief(va, 60, True)} vs {brief(vb, 60, True)}")
    return lines


# -------------------------------------------------------------------- calls


def _side(call):
    return {"dir": call.dir_name, "pid": call.pid, "status": call.status}


def _tensors(call, record, stem):
    """The inputs/outputs tensors of a call ({} when it has none), without the inputs it
    records as scratch; raises on a bad file."""
    return dumpdir.load_call_tensors(call.path, stem, record, scratch=False)[0]


def _scratch(key, params, api):
    name = parameter_of(key, params)
    return name in SCRATCH_OUTPUTS or is_scratch(api, name)


def _compare_tensor_sets(ta, tb, what, rtol, atol, params=(), marked=(), api=None):
    """(per-tensor results, divergence lines) for two dicts of tensors.

    Inputs bound to a scratch parameter (``SCRATCH_OUTPUTS`` or a workspace, found
    through the recorded signature ``params`` of the API ``api``) are reported with ``scratch: true`` and
    never diverge; so are the keys ``marked`` (recorded as scratch by either side,
    docs/dump-format.md#scratch-tensors), which are not compared.
    """
    results, lines = [], []
    for key in sorted(set(ta) | set(tb) | set(marked)):
        if key in marked:
            results.append({"key": key, "scratch": True, "diverged": False})
            continue
        if key not in ta or key not in tb:
            lines.append(f"{what} {key}: only in {'A' if key in ta else 'B'}")
            results.append({"key": key, "diverged": True, "only_in": "A" if key in ta else "B"})
            continue
        result = dict(key=key, **tensor_difference(ta[key], tb[key], rtol, atol))
        results.append(result)
        if what == "input" and _scratch(key, params, api):
            result.update(scratch=True, diverged=False)
        elif result.get("reason"):
            lines.append(f"{what} {key}: {result['reason']}")
        elif result["diverged"]:
            lines.append(
                f"{what} {key}: max abs diff {result['max_abs']:.6g}, max rel diff "
                f"{result['max_rel']:.6g}, {result['mismatched']} of {result['numel']} elements "
                f"outside rtol={rtol:g}, atol={atol:g}"
            )
    return results, lines


def _compare_status(ra, rb, ca, cb):
    lines = []
    if ca.status != cb.status:
        lines.append(f"status {ca.status} vs {cb.status}")
    elif ca.status == "exception":
        ea, eb = ra.get("exception") or {}, rb.get("exception") or {}
        if ea.get("type") != eb.get("type"):
            lines.append(f"exception {ea.get('type')} vs {eb.get('type')}")
    return lines


def _compare_side(ca, cb, ra, rb, what, rtol, atol, params, reasons):
    """Compare the inputs or outputs (``what``) of a pair: non-tensor values, then tensors.
    Appends the divergence lines to ``reasons``; returns the per-tensor results."""
    key = f"{what}_metadata"
    reasons += _metadata_differences(ra.get(key) or {}, rb.get(key) or {}, what)
    stem = f"{what}s"
    marked = (
        set(dumpdir.scratch_keys(ra)) | set(dumpdir.scratch_keys(rb)) if what == "input" else ()
    )
    results, lines = _compare_tensor_sets(
        _tensors(ca, ra, stem),
        _tensors(cb, rb, stem),
        what,
        rtol,
        atol,
        params,
        marked,
        ra.get("function_name"),
    )
    reasons += lines
    return results


def _compare_pair(ca, cb, rtol, atol):
    """The entry of one matched pair; the tensors are released when it returns."""
    entry = {"api": ca.api, "a": _side(ca), "b": _side(cb)}
    if cb.api != ca.api:
        entry.update(status="diverged", reasons=[f"API {ca.api} vs {cb.api}"])
        return entry
    try:
        ra, rb = dumpdir.read_metadata(ca.path)[-1], dumpdir.read_metadata(cb.path)[-1]
    except (OSError, ValueError) as exc:
        entry.update(status="diverged", reasons=[f"unreadable metadata: {exc}"])
        return entry
    reasons = _compare_status(ra, rb, ca, cb)
    try:
        params = parse_signature(ra.get("function_signature")) or ()
        entry["inputs"] = _compare_side(ca, cb, ra, rb, "input", rtol, atol, params, reasons)
        if ca.status == cb.status == "completed":
            entry["outputs"] = _compare_side(ca, cb, ra, rb, "output", rtol, atol, (), reasons)
    except (OSError, ValueError) as exc:
        reasons.append(f"unreadable tensors: {exc}")
    entry.update(status="diverged" if reasons else "same", reasons=reasons)
    return entry


def _match_mode(calls_a, calls_b):
    every = calls_a + calls_b
    return "sequence" if every and all(c.sequence is not None for c in every) else "occurrence"


def _key(call, mode):
    if mode == "sequence":
        return (call.process, call.position)
    return (call.process, call.api, call.occurrence)


def _one_sided(call, side):
    return {
        "api": call.api,
        side.lower(): _side(call),
        "status": f"only_{side.lower()}",
        "reasons": [f"only in {side}"],
    }


def _entries(calls_a, calls_b, mode, rtol, atol):
    """Matched pairs and one-sided calls in A's order, B-only calls placed where B has them."""
    by_key = {_key(c, mode): c for c in calls_b}
    matched = {by_key[_key(c, mode)].index for c in calls_a if _key(c, mode) in by_key}
    pointer = 0
    for ca in calls_a:
        cb = by_key.get(_key(ca, mode))
        if cb is None:
            yield _one_sided(ca, "A")
            continue
        for other in calls_b[pointer : cb.index]:
            if other.index not in matched:
                yield _one_sided(other, "B")
        pointer = max(pointer, cb.index + 1)
        yield _compare_pair(ca, cb, rtol, atol)
    for other in calls_b[pointer:]:
        if other.index not in matched:
            yield _one_sided(other, "B")


def diff_sessions(a, b, rtol=1e-3, atol=1e-3):
    """Compare two recorded sessions call by call.

    Parameters
    ----------
    a, b : str or os.PathLike
        Dump roots (or single dump directories). B is the reference of relative
        differences.
    rtol, atol : float
        Tolerances deciding whether a tensor diverged.

    Returns
    -------
    (dict, iterator of dict)
        The header (``a``, ``b``, ``match``: ``"sequence"`` or ``"occurrence"``, call and
        process counts) and a lazy iterator of one entry per call: ``index``, ``api``,
        ``status`` (``same``, ``diverged``, ``only_a``, ``only_b``), ``reasons``, the
        sides ``a``/``b`` (``dir``, ``pid``, ``status``) and, for pairs, ``inputs`` and
        ``outputs`` (one :func:`tensor_difference` per tensor key).

    Raises
    ------
    FileNotFoundError
        A or B does not exist.
    """
    calls_a = session_calls(a, keep_records=False)
    calls_b = session_calls(b, keep_records=False)
    mode = _match_mode(calls_a, calls_b)
    header = {
        "a": os.path.abspath(a),
        "b": os.path.abspath(b),
        "match": mode,
        "calls_a": len(calls_a),
        "calls_b": len(calls_b),
        "processes_a": len({c.process for c in calls_a}),
        "processes_b": len({c.process for c in calls_b}),
        "rtol": rtol,
        "atol": atol,
    }

    def numbered():
        for index, entry in enumerate(_entries(calls_a, calls_b, mode, rtol, atol), 1):
            yield {"index": index, **entry}

    return header, numbered()
