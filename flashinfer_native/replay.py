"""Replay of level-10 flight-recorder dumps (docs/replay.md).

Reads a dump directory through ``dumpdir`` (metadata.jsonl + inputs/outputs tensor
files), rebuilds the call's arguments, optionally runs it again and compares the result
with the recording. Level-10 dumping is suspended process-wide while a replay runs.
"""

import contextlib
import math
import os
import traceback

import torch

from . import _C, jit_args, reference, registry
from . import record as rec
from .calls import NoDumpError, load_session
from .compare import tensors_differ
from .dumpdir import METADATA_FILE, load_call_tensors, read_metadata
from .terminal import brief

__all__ = ["reference_entry", "replay_from_dump", "replay_sequence", "suspended_dumps"]

# ----------------------------------------------------------------------- tensors


def _to_device(tensor, device):
    """Move a tensor to ``device`` keeping its shape, strides and storage offset."""
    if tensor.device == device:
        return tensor
    storage = tensor.untyped_storage()
    count = storage.nbytes() // tensor.element_size()
    # the flat view lives on the storage's own device: a scratch input made on "cuda" is
    # on cuda:0, which is not torch.device("cuda"), and set_ refuses a device change
    flat = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(storage, 0, (count,), (1,))
    moved = flat.to(device).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    if tensor.requires_grad:
        moved.requires_grad_(True)
    return moved


def _load_tensors(dump_dir, stem, record, device):
    """Load inputs or outputs of a dump onto ``device``: the keys listed in
    ``tensor_info`` checked, scratch inputs made afresh (``dumpdir.load_call_tensors``)."""
    tensors, path = load_call_tensors(dump_dir, stem, record, device)
    return {key: _to_device(t, device) for key, t in tensors.items()}, path


# ------------------------------------------------------------------------ building

_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class _Builder:
    """Turns the decoded record tree (``record.Value``) back into objects, never
    importing or calling anything a dump names: dtypes come from a fixed table, enums
    from :func:`registry.resolve_enum`, devices from ``torch.device(str)``."""

    def __init__(self, tensors, device, where, patterns):
        self.tensors = tensors
        self.device = device
        self.where = where
        self.patterns = patterns

    def error(self, field, problem):
        return ValueError(f"{self.where}: {field}: {problem}")

    def build(self, value, field):
        """Encodings of objects that cannot be rebuilt (``record.Opaque``, e.g. the
        ``self`` placeholder) are returned as read, as FlashInfer's replay does."""
        if isinstance(value, rec.Plain):
            return value.value
        if isinstance(value, rec.TensorRef):
            if not isinstance(value.key, str) or value.key not in self.tensors:
                raise self.error(field, f"tensor {value.key!r} is not in the tensor file")
            return self.tensors[value.key]
        if isinstance(value, rec.DType):
            return self.dtype(value, field)
        if isinstance(value, rec.Device):
            return self.torch_device(value.text, field)
        if isinstance(value, rec.EnumRef):
            return self.enum(value, field)
        if isinstance(value, rec.Sequence):
            items = [self.build(v, f"{field}[{i}]") for i, v in enumerate(value.items)]
            return tuple(items) if value.kind == "tuple" else items
        if isinstance(value, rec.Mapping):
            return self.mapping(value, field)
        return value.raw

    def dtype(self, value, field):
        dtype = _DTYPES.get(f"torch.{value.name}")
        if dtype is None:
            raise self.error(field, f"unknown torch dtype {value.text!r}")
        return dtype

    def torch_device(self, text, field):
        try:
            recorded = torch.device(text)
        except (RuntimeError, ValueError):
            raise self.error(field, f"{text!r} is not a torch device") from None
        # A device of another kind than the replay device (cuda:0 replayed on cpu)
        # would send the replay back to hardware it does not run on.
        return self.device if recorded.type != self.device.type else recorded

    def enum(self, value, field):
        cls = registry.resolve_enum(value.class_path, self.patterns, f"{self.where}: {field}")
        member = registry.enum_member(cls, value.member, value.value)
        if member is None:
            raise self.error(field, f"{value.class_path} has no member {value.member!r}")
        return member

    def mapping(self, value, field):
        out = {}
        for i, (key, item) in enumerate(value.items):
            key = self.build(key, f"{field}[{i}].key")
            try:
                out[key] = self.build(item, f"{field}[{i}].value")
            except TypeError:
                raise self.error(f"{field}[{i}].key", "dict key is not hashable") from None
        return out


def _build_args(arguments, builder):
    """``(args, kwargs)`` of a call from its decoded ``record.Arguments``."""
    args = [None if p is None else builder.build(p[1], p[0]) for p in arguments.positional]
    kwargs = {name: builder.build(value, key) for name, key, value in arguments.keywords}
    return args, kwargs


def _expected_result(metadata, builder, where):
    """The recorded return value, from ``output_metadata`` and the output tensors."""
    value = rec.decode_result(metadata, builder.tensors, where)
    return None if value is None else builder.build(value, "result")


# ---------------------------------------------------------------------- comparison


def compare_values(actual, expected, rtol=1e-3, atol=1e-3, path="result"):
    """Compare a replayed value with the recorded one.

    Tensors by shape, dtype and the comparison rule shared with ``flashinfer diff``
    (``compare.tensor_difference``, docs/replay.md#the-comparison-rule), recursively
    through tuples, lists and dicts; other values by ``==`` (NaN equals NaN).
    A recorded value that could only be stored as its repr matches any value of the
    same type name.

    Returns
    -------
    list of str
        One line per difference, naming where it is; empty when they match.
    """
    out = []
    _compare(actual, expected, rtol, atol, path, out)
    return out


def _compare(actual, expected, rtol, atol, path, out):
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            out.append(f"{path}: expected a tensor, got {type(actual).__name__}")
            return
        reason = tensors_differ(actual, expected, rtol, atol)
        if reason:
            out.append(f"{path}: {reason}")
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            out.append(f"{path}: expected a sequence of {len(expected)}, got {brief(actual)}")
            return
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, rtol, atol, f"{path}[{i}]", out)
    elif isinstance(expected, dict) and "repr" in expected and "type" in expected:
        if type(actual).__name__ != expected["type"]:
            out.append(f"{path}: expected a {expected['type']}, got {type(actual).__name__}")
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            out.append(f"{path}: expected a dict with keys {sorted(map(str, expected))}")
            return
        for k in expected:
            _compare(actual[k], expected[k], rtol, atol, f"{path}[{k!r}]", out)
    elif isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected):
        if not math.isnan(actual):
            out.append(f"{path}: {actual!r} != recorded nan")
    else:
        try:
            same = bool(actual == expected)
        except Exception:  # noqa: BLE001 - an unorderable/odd __eq__ is a mismatch
            same = False
        if not same:
            out.append(f"{path}: {brief(actual)} != recorded {brief(expected)}")


# -------------------------------------------------------------------------- replay


@contextlib.contextmanager
def suspended_dumps():
    """Pause level-10 dumping in every logger of the process (replay never writes into
    the directory it reads, nor records its own calls)."""
    _C.suspend_dumps()
    try:
        yield
    finally:
        _C.resume_dumps()


def _prepare_call(record, args, kwargs, objects, patterns, where, allow_jit_args=False):
    """Resolve the recorded function through the registry; return a no-argument callable
    running it.

    Only registered ``@flashinfer_api`` objects of allowed modules are reached (see
    ``registry``). Methods go through the shared object registry ``objects``:
    ``Cls.__init__`` builds and registers the object, ``Cls.method`` runs on the
    registered one with the ``self`` placeholder (``args[0]``) dropped. Arguments that
    reach FlashInfer's JIT are refused unless ``allow_jit_args`` (``jit_args``).
    """
    module_name, name = record.get("module"), record.get("function_name")
    if not module_name or not name:
        raise ValueError(f"{where}: record has no 'module'/'function_name' to replay")
    target = registry.resolve_call(module_name, name, patterns, where)

    def checked(function, call_args):
        if not allow_jit_args:
            jit_args.check_arguments(function, call_args, kwargs, where)
        return lambda: function(*call_args, **kwargs)

    if target[0] == "function":
        return checked(target[1], args)
    _, cls, attr = target
    key = (record.get("process_id"), record.get("self_id"))
    if attr == "__init__":
        build = checked(cls, args[1:])

        def construct():
            objects[key] = build()

        return construct
    if record.get("self_id") is None:
        function = registry.verified_method(cls, attr, patterns, module_name, name, where)
        return checked(function, args)
    if key not in objects:
        raise LookupError(
            f"{where}: no {cls.__name__} object for {name} (process_id={key[0]}, "
            f"self_id={key[1]}): its {cls.__name__}.__init__ dump was not replayed before it"
        )
    obj = objects[key]
    # The object may be of another class than the one the record names: check its own.
    method = registry.verified_method(type(obj), attr, patterns, module_name, name, where, obj)
    return checked(method, args[1:])


def _resolve_device(device):
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def replay_from_dump(
    dump_dir,
    compare_outputs=False,
    device=None,
    run=False,
    object_registry=None,
    rtol=1e-3,
    atol=1e-3,
    allow_modules=None,
    allow_jit_args=False,
):
    """Load one level-10 dump and optionally run it again.

    A dump is untrusted input (docs/security.md): loading it never imports a module or calls
    anything it names, and running it calls only registered ``@flashinfer_api``
    functions and classes of allowed modules (see ``flashinfer_native.registry``).

    Parameters
    ----------
    dump_dir : str or os.PathLike
        A dump directory (holding ``metadata.jsonl``).
    compare_outputs : bool
        Also load the recorded outputs (``expected_tensors``, ``expected_metadata``) and,
        with ``run``, compare them with the replayed result (``comparison_match``).
    device : str or torch.device, optional
        Where tensors are loaded; ``None`` means ``"cuda"`` when available, else ``"cpu"``.
    run : bool
        Call the recorded function or method: the registered ``@flashinfer_api`` object
        of that name. Before resolving it, the modules the allow patterns name are
        imported (``flashinfer`` and ``allow_modules``), never the module the dump names.
    object_registry : dict, optional
        ``{(process_id, self_id): object}`` shared between calls so that a wrapper's
        ``__init__``, ``plan`` and ``run`` replay on the same object.
    rtol, atol : float
        Tolerances of the tensor comparison.
    allow_modules : str or list of str, optional
        Module name patterns (fnmatch; a name also allows its submodules) whose
        registered APIs and enums may be replayed, besides ``flashinfer``.
    allow_jit_args : bool
        Run a call whose arguments reach FlashInfer's JIT compiler (``jit_args`` and the
        others of ``jit_args.AUDIT``, or text where a number belongs); refused by
        default, as they are code or paths rather than data (docs/security.md).

    Returns
    -------
    dict
        ``args``, ``kwargs``, ``metadata`` (the last record); with ``compare_outputs``
        ``expected_tensors``, ``expected_metadata`` and ``expected_result`` (the
        recorded return value, decoded); with ``run`` ``execution_result``
        (and ``comparison_match``, ``mismatches``) or ``execution_error``. A dump whose
        process died during the call (status ``inputs_saved``) gets ``incomplete: True``
        and no comparison. A metadata-only dump (``tensors_skipped``: a ring kept its
        records, not its tensors) gives only ``metadata`` and ``skipped``, the reason.

    Raises
    ------
    ReplayRefused
        The dump names a function, class or enum that is not a registered API of an
        allowed module (a ``ValueError``; the message says how to allow it).
    FileNotFoundError, ValueError, ImportError, LookupError
        The dump cannot be read, or an ``allow_modules`` module cannot be imported, or a
        method's object was not built; the message names the file.
    """
    dump_dir = os.fspath(dump_dir)
    device = _resolve_device(device)
    patterns = registry.allowed_patterns(allow_modules)
    last = read_metadata(dump_dir)[-1]
    where = os.path.join(dump_dir, METADATA_FILE)
    status = last.get("execution_status")
    if last.get("tensors_skipped"):
        # a ring kept this call's records only (docs/ring.md): there is nothing to run
        return {"metadata": last, "skipped": f"tensors not recorded ({last['tensors_skipped']})"}
    with suspended_dumps():
        if run:
            registry.import_allowed(allow_modules)
        tensors, _ = _load_tensors(dump_dir, "inputs", last, device)
        arguments = rec.decode_inputs(last.get("input_metadata") or {}, tensors, where)
        builder = _Builder(tensors, device, where, patterns)
        args, kwargs = _build_args(arguments, builder)
        result = {"args": args, "kwargs": kwargs, "metadata": last}
        if status == "inputs_saved":
            result["incomplete"] = True
        expected = None
        if compare_outputs:
            out_tensors, _ = _load_tensors(dump_dir, "outputs", last, device)
            expected_metadata = last.get("output_metadata") or {}
            result["expected_tensors"] = out_tensors
            result["expected_metadata"] = expected_metadata
            expected = _expected_result(
                expected_metadata, _Builder(out_tensors, device, where, patterns), where
            )
            result["expected_result"] = expected
        if not run:
            return result
        if object_registry is None:
            object_registry = {}
        call = _prepare_call(last, args, kwargs, object_registry, patterns, where, allow_jit_args)
        try:
            value = call()
        except Exception as exc:  # noqa: BLE001 - the replayed call may raise anything
            _record_error(result, exc)
        else:
            result["execution_result"] = value
        if compare_outputs and status in ("completed", "exception"):
            _judge(result, last, expected, rtol, atol)
    return result


def _record_error(result, exc):
    result["execution_error"] = f"{type(exc).__name__}: {exc}"
    result["execution_error_type"] = type(exc).__name__
    result["traceback"] = traceback.format_exc()


def _judge(result, record, expected, rtol, atol):
    """Set ``comparison_match`` (and ``mismatches``) for a finished recorded call."""
    if record.get("execution_status") == "exception":
        want = (record.get("exception") or {}).get("type")
        got = result.get("execution_error_type")
        if got is None:
            result["mismatches"] = [f"recorded {want} exception, replay returned normally"]
        elif got != want:
            result["mismatches"] = [f"recorded {want} exception, replay raised {got}"]
        result["comparison_match"] = got == want
        return
    if "execution_error" in result:
        result["comparison_match"] = False
        result["mismatches"] = [f"replay raised {result['execution_error']}"]
        return
    if record.get("outputs_skipped"):
        result["comparison_skipped"] = f"outputs not recorded ({record['outputs_skipped']})"
        return
    mismatches = compare_values(result["execution_result"], expected, rtol, atol)
    result["comparison_match"] = not mismatches
    if mismatches:
        result["mismatches"] = mismatches


# ------------------------------------------------------------------------ sequence


def reference_entry(
    path, records, objects, device, thresholds=None, allow_modules=None, allow_jit_args=False
):
    """Check one dump of a replay order against its trace template's reference; never
    raises. The dump is loaded as replay loads it, and no API is run.

    ``objects`` is the dict a replay order shares (here it holds each wrapper object's
    recorded ``__init__``/``plan`` arguments). Returns a replay result (``dump_dir``,
    ``metadata``, and ``error``, ``incomplete`` or ``skipped`` (a metadata-only dump)) with
    ``reference``, the outcome of ``reference.check_call``.
    """
    last = records[-1] if records else {}
    result = {"dump_dir": path, "metadata": last}
    if last.get("execution_status") == "inputs_saved":
        result["incomplete"] = True
        return result
    if last.get("tensors_skipped"):  # a ring kept the records only (docs/ring.md)
        result["skipped"] = f"tensors not recorded ({last['tensors_skipped']})"
        return result
    try:
        loaded = replay_from_dump(
            path, compare_outputs=True, device=device, allow_modules=allow_modules
        )
        record = loaded["metadata"]
        result["metadata"] = record
        result["reference"] = reference.check_call(
            record,
            loaded["args"],
            loaded["kwargs"],
            loaded.get("expected_result"),
            reference.SessionState(objects),
            f"{path}/{METADATA_FILE}",
            registry.allowed_patterns(allow_modules),
            thresholds,
            allow_jit_args,
        )
    except Exception as exc:  # noqa: BLE001 - one bad dump must not stop the run
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def replay_entry(
    path,
    records,
    objects,
    device=None,
    rtol=1e-3,
    atol=1e-3,
    allow_modules=None,
    allow_jit_args=False,
    against="recording",
    thresholds=None,
    run_incomplete=False,
):
    """Replay one dump of a sequence; never raises (failures become ``{"error"}``).

    ``objects`` is the object registry shared by the sequence; ``allow_modules`` and
    ``allow_jit_args`` as in :func:`replay_from_dump`. ``against="reference"`` checks the
    call against its trace template's reference instead
    (:func:`reference_entry`, with ``thresholds`` for the template's check). A call
    recorded with inputs only (status ``inputs_saved``) is loaded, not run, unless
    ``run_incomplete``: then it runs, with nothing to compare (``ran`` when it returns).
    """
    if against == "reference":
        return reference_entry(
            path, records, objects, device, thresholds, allow_modules, allow_jit_args
        )
    last = records[-1] if records else {}
    incomplete = last.get("execution_status") == "inputs_saved"
    try:
        result = replay_from_dump(
            path,
            compare_outputs=not incomplete,
            device=device,
            run=run_incomplete or not incomplete,
            object_registry=objects,
            rtol=rtol,
            atol=atol,
            allow_modules=allow_modules,
            allow_jit_args=allow_jit_args,
        )
    except Exception as exc:  # noqa: BLE001 - one bad dump must not stop the run
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "metadata": last,
            "traceback": traceback.format_exc(),
        }
    result["dump_dir"] = path
    return result


def replay_sequence(
    root_dir,
    device=None,
    rtol=None,
    atol=None,
    include=None,
    exclude=None,
    allow_modules=None,
    allow_jit_args=False,
    against="recording",
):
    """Replay every dump under ``root_dir`` in call order with one object registry.

    Parameters
    ----------
    root_dir : str or os.PathLike
        A dump root (``FLASHINFER_DUMP_DIR``).
    device : str or torch.device, optional
        As in :func:`replay_from_dump`; with ``against="reference"``, None means the CPU.
    rtol, atol : float, optional
        Tolerances of the tensor comparison (1e-3 when None). With
        ``against="reference"`` the template's check judges, and given values are
        passed to it.
    include, exclude : str or list of str, optional
        fnmatch patterns (a string is split on ``,``) on the API name: include first,
        then exclude; the ``__init__`` and latest ``plan`` that a selected method call
        needs are replayed too, before it (``calls.Session.select``).
    allow_modules : str or list of str, optional
        Module patterns whose registered APIs may be replayed besides ``flashinfer``
        (see :func:`replay_from_dump`).
    allow_jit_args : bool
        As in :func:`replay_from_dump`.
    against : {"recording", "reference"}
        ``"recording"`` runs each call again and compares with its recorded outputs;
        ``"reference"`` runs no kernel: each recorded call of a traced API is checked
        against its trace template's reference (docs/replay.md); the result's
        ``reference`` holds the outcome (``match``, ``mismatch``, ``no_reference``).

    Returns
    -------
    list of dict
        One :func:`replay_from_dump` result per dump (run with ``compare_outputs``),
        each with ``dump_dir``. A dump that fails, or names something replay refuses
        (``ReplayRefused``), gives ``{"error", "dump_dir", "metadata"}`` and the run
        goes on. Calls whose process died (status ``inputs_saved``) are loaded, not run,
        and marked ``incomplete``; metadata-only calls are not run and say ``skipped``.
        A call replayed only to set up a selected one has ``setup: True``.

    Raises
    ------
    ImportError
        A module named by ``allow_modules`` cannot be imported.
    """
    if against not in ("recording", "reference"):
        raise ValueError(f"against={against!r}: expected 'recording' or 'reference'")
    thresholds = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
    rtol, atol = (1e-3 if rtol is None else rtol), (1e-3 if atol is None else atol)
    device = _resolve_device("cpu" if device is None and against == "reference" else device)
    registry.import_allowed(allow_modules)
    try:
        selected = load_session(root_dir, session_file=False).select(include, exclude)
    except NoDumpError:
        return []
    objects = {}
    results = []
    for call, setup in selected:
        records = [call.record] if call.record else None
        result = replay_entry(
            call.path,
            records,
            objects,
            device,
            rtol,
            atol,
            allow_modules,
            allow_jit_args,
            against,
            thresholds,
        )
        if setup:
            result["setup"] = True
        results.append(result)
    return results


def classify(result):
    """Outcome of one replay result: ``passed``, ``mismatch``, ``error``, ``incomplete``
    (recorded with inputs only, not run), ``ran`` (recorded with inputs only, run with
    ``run_incomplete``, returned) or ``skipped`` (a metadata-only dump: nothing to run)."""
    if "error" in result:
        return "error"
    if result.get("skipped"):
        return "skipped"
    if result.get("incomplete"):
        if "execution_error" in result:
            return "error"
        return "ran" if "execution_result" in result else "incomplete"
    if result.get("comparison_match") is False:
        if (
            "execution_error" in result
            and result.get("metadata", {}).get("execution_status") != "exception"
        ):
            return "error"
        return "mismatch"
    if "execution_error" in result and "comparison_match" not in result:
        return "error"
    return "passed"
