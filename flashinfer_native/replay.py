"""Replay of level-10 flight-recorder dumps (SPEC 5.1, 5.2).

Reads a dump directory through ``dumpdir`` (metadata.jsonl + inputs/outputs tensor
files), rebuilds the call's arguments, optionally runs it again and compares the result
with the recording. Level-10 dumping is suspended process-wide while a replay runs.
"""

import contextlib
import importlib
import math
import os
import re
import traceback

import torch

from . import _C
from .dumpdir import METADATA_FILE, load_tensor_file, ordered_dumps, read_metadata, tensor_file

__all__ = ["replay_from_dump", "replay_sequence", "suspended_dumps"]

_NESTED_KEY = re.compile(r"__(\d+|key_\d+|value_\d+)$")
_EXACT_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ----------------------------------------------------------------------- tensors


def _to_device(tensor, device):
    """Move a tensor to ``device`` keeping its shape, strides and storage offset."""
    if tensor.device == device:
        return tensor
    storage = tensor.untyped_storage()
    count = storage.nbytes() // tensor.element_size()
    flat = torch.empty(0, dtype=tensor.dtype).set_(storage, 0, (count,), (1,))
    moved = flat.to(device).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    if tensor.requires_grad:
        moved.requires_grad_(True)
    return moved


def _load_tensors(dump_dir, stem, record, key_list_name, device):
    """Load inputs or outputs of a dump; checks the keys listed in ``tensor_info``."""
    listed = (record.get("tensor_info") or {}).get(key_list_name) or []
    path = tensor_file(dump_dir, stem, record)
    if path is None:
        if listed:
            raise FileNotFoundError(
                f"{dump_dir}: {stem} file ({stem}.pt or {stem}.safetensors) is missing "
                f"but metadata lists tensors {listed[:5]}"
            )
        return {}, None
    tensors = load_tensor_file(path)
    missing = [key for key in listed if key not in tensors]
    if missing:
        raise ValueError(f"{path}: tensors {missing[:5]} listed in metadata are missing")
    return {key: _to_device(t, device) for key, t in tensors.items()}, path


# ------------------------------------------------------------------------ decoding


def _decode(value, key, tensors, device, where):
    """Turn one SPEC 4.3 JSON-encoded value back into a Python object.

    Encodings of objects that cannot be rebuilt (``{"type", "repr"}``, e.g. the ``self``
    placeholder) are returned unchanged, as FlashInfer's replay does.
    """
    if isinstance(value, list):
        return [_decode(v, key, tensors, device, where) for v in value]
    if not isinstance(value, dict) or "type" not in value:
        return value
    kind = value["type"]
    if kind == "torch.Tensor":
        tensor_key = value.get("tensor_key", key)
        if tensor_key not in tensors:
            raise ValueError(f"{where}: tensor {tensor_key!r} is not in the tensor file")
        return tensors[tensor_key]
    if kind == "torch.dtype":
        dtype = getattr(torch, str(value.get("value", "")).rsplit(".", 1)[-1], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{where}: {key}: unknown torch dtype {value.get('value')!r}")
        return dtype
    if kind == "torch.device":
        recorded = torch.device(value["value"])
        # A device of another kind than the replay device (cuda:0 replayed on cpu)
        # would send the replay back to hardware it does not run on.
        return device if recorded.type != device.type else recorded
    if kind == "enum":
        return _decode_enum(value, key, where)
    if kind in ("list", "tuple"):
        items = [_decode(v, key, tensors, device, where) for v in value.get("items", [])]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {
            _decode(item["key"], key, tensors, device, where): _decode(
                item["value"], key, tensors, device, where
            )
            for item in value.get("items", [])
        }
    return value


def _decode_enum(value, key, where):
    try:
        module_name, _, qualname = value["class"].rpartition(".")
        _, cls = _resolve_recorded(module_name, qualname, where)
    except (ImportError, AttributeError, KeyError) as exc:
        raise ValueError(f"{where}: {key}: cannot import enum class ({exc})") from None
    member = str(value.get("name", "")).rsplit(".", 1)[-1]
    try:
        return cls[member]
    except (KeyError, TypeError):
        pass
    try:
        return cls(value.get("value"))
    except (ValueError, TypeError):
        raise ValueError(
            f"{where}: {key}: {value.get('class')} has no member {value.get('name')!r}"
        ) from None


def _build_args(metadata, tensors, device, where):
    """Rebuild ``(args, kwargs)`` from ``input_metadata`` and the input tensors."""
    encoded = dict(metadata)
    for key in tensors:
        if not _NESTED_KEY.search(key):
            encoded.setdefault(key, {"type": "torch.Tensor", "tensor_key": key})
    positional, kwargs = {}, {}
    for key, value in encoded.items():
        if key in tensors:
            value = {"type": "torch.Tensor", "tensor_key": key}
        if key.startswith("arg_") and key[4:].isdigit():
            positional[int(key[4:])] = _decode(value, key, tensors, device, where)
        elif key.startswith("kwarg_"):
            kwargs[key[6:]] = _decode(value, key, tensors, device, where)
    count = max(positional) + 1 if positional else 0
    return [positional.get(i) for i in range(count)], kwargs


def _expected_result(metadata, tensors, device, where):
    """The recorded return value, from ``output_metadata`` and the output tensors."""
    if "result" in tensors:
        return tensors["result"]
    marker = metadata.get("result")
    # A returned tuple is recorded as {"type": "tuple", "length": n} plus result_{i} keys.
    if "result" in metadata and not (
        isinstance(marker, dict) and "length" in marker and "items" not in marker
    ):
        return _decode(marker, "result", tensors, device, where)
    items = {}
    for key in list(metadata) + list(tensors):
        if key.startswith("result_") and key[7:].isdigit():
            value = {"type": "torch.Tensor", "tensor_key": key} if key in tensors else metadata[key]
            items[int(key[7:])] = _decode(value, key, tensors, device, where)
    if not items:
        return None
    return tuple(items.get(i) for i in range(max(items) + 1))


# ---------------------------------------------------------------------- comparison


def _tensors_differ(actual, expected, rtol, atol):
    """None when equal within tolerance, else a short reason."""
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {tuple(actual.shape)} != recorded {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != recorded {expected.dtype}"
    actual = actual.detach()
    expected = expected.detach().to(actual.device)
    if actual.numel() == 0:
        return None
    if actual.dtype in _EXACT_DTYPES or not (actual.is_floating_point() or actual.is_complex()):
        bits = _BITS_VIEW.get(actual.element_size())
        if actual.dtype not in _EXACT_DTYPES and bits is not None:
            actual, expected = actual.contiguous().view(bits), expected.contiguous().view(bits)
        if torch.equal(actual, expected):
            return None
        return "values differ (exact comparison)"
    if actual.dtype not in (torch.float64, torch.complex64, torch.complex128):
        actual, expected = actual.float(), expected.float()
    if torch.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (actual - expected).abs()
    diff = diff[~torch.isnan(diff)]
    worst = diff.max().item() if diff.numel() else float("nan")
    return f"values differ beyond rtol={rtol}, atol={atol} (max abs diff {worst:g})"


def compare_values(actual, expected, rtol=1e-3, atol=1e-3, path="result"):
    """Compare a replayed value with the recorded one.

    Tensors by shape, dtype and ``torch.allclose`` (integer and bool dtypes exactly),
    recursively through tuples, lists and dicts; other values by ``==`` (NaN equals NaN).
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
        reason = _tensors_differ(actual, expected, rtol, atol)
        if reason:
            out.append(f"{path}: {reason}")
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            out.append(f"{path}: expected a sequence of {len(expected)}, got {_brief(actual)}")
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
            out.append(f"{path}: {_brief(actual)} != recorded {_brief(expected)}")


def _brief(value):
    text = repr(value) if not isinstance(value, torch.Tensor) else f"tensor{tuple(value.shape)}"
    return text if len(text) <= 80 else text[:77] + "..."


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


def _lookup(module, dotted):
    """module.a.b.c, or None when a part is missing."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _resolve_recorded(module_name, name, where):
    """The recorded ``module`` + ``name`` (``func``, ``Cls.method`` or ``Cls``): (owner, target).

    FlashInfer's APIs are also its top-level names (``flashinfer.mm_fp4``, defined in
    ``flashinfer.gemm.gemm_base``). A call recorded under one flashinfer package whose
    module path the installed one does not have (a dump of FlashInfer replayed with the
    flashinfer-c mirror, which implements fewer APIs in fewer modules) is looked up
    there too, so that it runs under its real API name.

    Raises
    ------
    ImportError
        The module cannot be imported (and no top-level name stands in for it).
    LookupError
        The API is implemented by neither (for a flashinfer module: this flashinfer
        has no implementation of it on this machine).
    """
    module = error = None
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - reported below when nothing stands in
        error = exc
    owner_path, _, attr = name.rpartition(".")
    found = module is not None and _lookup(module, name) is not None
    if not found and (module_name == "flashinfer" or module_name.startswith("flashinfer.")):
        try:
            top = importlib.import_module("flashinfer")
        except Exception:  # noqa: BLE001 - the recorded module's error says more
            top = None
        if top is not None and _lookup(top, name) is not None:
            module, found = top, True
        elif error is None or isinstance(error, ModuleNotFoundError):
            version = getattr(top, "__version__", "unknown")
            raise LookupError(
                f"{where}: {module_name}.{name} is not implemented by the installed "
                f"flashinfer ({version}, {getattr(top, '__file__', '?')}): "
                "no implementation of this API on this machine"
            ) from None
    if module is None:
        raise ImportError(
            f"{where}: cannot import module {module_name!r} ({type(error).__name__}: {error})"
        ) from None
    if not found:
        raise AttributeError(f"{where}: module {module_name!r} has no {name!r}")
    owner = _lookup(module, owner_path) if owner_path else module
    return owner, getattr(owner, attr)


def _prepare_call(record, args, kwargs, registry, where):
    """Resolve the recorded function by import; return a no-argument callable running it.

    Methods go through the shared object registry: ``Cls.__init__`` builds and registers
    the object, ``Cls.method`` runs on the registered one with the ``self`` placeholder
    (``args[0]``) dropped.
    """
    module_name = record.get("module")
    name = record.get("function_name")
    if not module_name or not name:
        raise ValueError(f"{where}: record has no 'module'/'function_name' to replay")
    owner_path, _, attr = name.rpartition(".")
    owner, target = _resolve_recorded(module_name, name, where)
    if not owner_path or not isinstance(owner, type):
        return lambda: target(*args, **kwargs)
    key = (record.get("process_id"), record.get("self_id"))
    if attr == "__init__":

        def construct():
            registry[key] = owner(*args[1:], **kwargs)

        return construct
    if record.get("self_id") is None:
        return lambda: target(*args, **kwargs)
    if key not in registry:
        raise LookupError(
            f"{where}: no {owner.__name__} object for {name} (process_id={key[0]}, "
            f"self_id={key[1]}): its {owner.__name__}.__init__ dump was not replayed before it"
        )
    method = getattr(registry[key], attr)
    return lambda: method(*args[1:], **kwargs)


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
):
    """Load one level-10 dump and optionally run it again.

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
        Import the recorded module and call the recorded function or method.
    object_registry : dict, optional
        ``{(process_id, self_id): object}`` shared between calls so that a wrapper's
        ``__init__``, ``plan`` and ``run`` replay on the same object.
    rtol, atol : float
        Tolerances of the tensor comparison.

    Returns
    -------
    dict
        ``args``, ``kwargs``, ``metadata`` (the last record); with ``compare_outputs``
        ``expected_tensors``, ``expected_metadata``; with ``run`` ``execution_result``
        (and ``comparison_match``, ``mismatches``) or ``execution_error``. A dump whose
        process died during the call (status ``inputs_saved``) gets ``incomplete: True``
        and no comparison.

    Raises
    ------
    FileNotFoundError, ValueError, ImportError, AttributeError, LookupError
        The dump cannot be read or its function resolved; the message names the file.
    """
    dump_dir = os.fspath(dump_dir)
    device = _resolve_device(device)
    records = read_metadata(dump_dir)
    record = records[-1]
    where = os.path.join(dump_dir, METADATA_FILE)
    for key in ("input_metadata", "output_metadata", "tensor_info"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            raise ValueError(
                f"{where}: {key!r} is a JSON {type(record[key]).__name__}, expected an object"
            )
    status = record.get("execution_status")
    with suspended_dumps():
        tensors, inputs_path = _load_tensors(
            dump_dir, "inputs", record, "input_tensor_keys", device
        )
        args, kwargs = _build_args(
            record.get("input_metadata") or {}, tensors, device, inputs_path or where
        )
        result = {"args": args, "kwargs": kwargs, "metadata": record}
        if status == "inputs_saved":
            result["incomplete"] = True
        expected = None
        if compare_outputs:
            out_tensors, outputs_path = _load_tensors(
                dump_dir, "outputs", record, "output_tensor_keys", device
            )
            expected_metadata = record.get("output_metadata") or {}
            result["expected_tensors"] = out_tensors
            result["expected_metadata"] = expected_metadata
            expected = _expected_result(
                expected_metadata, out_tensors, device, outputs_path or where
            )
        if not run:
            return result
        if object_registry is None:
            object_registry = {}
        call = _prepare_call(record, args, kwargs, object_registry, where)
        try:
            value = call()
        except Exception as exc:  # noqa: BLE001 - the replayed call may raise anything
            _record_error(result, exc)
        else:
            result["execution_result"] = value
        if compare_outputs and status in ("completed", "exception"):
            _judge(result, record, expected, rtol, atol)
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


def replay_entry(path, records, registry, device=None, rtol=1e-3, atol=1e-3):
    """Replay one dump of a sequence; never raises (failures become ``{"error"}``)."""
    last = records[-1] if records else {}
    incomplete = last.get("execution_status") == "inputs_saved"
    try:
        result = replay_from_dump(
            path,
            compare_outputs=not incomplete,
            device=device,
            run=not incomplete,
            object_registry=registry,
            rtol=rtol,
            atol=atol,
        )
    except Exception as exc:  # noqa: BLE001 - one bad dump must not stop the run
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "metadata": last,
            "traceback": traceback.format_exc(),
        }
    result["dump_dir"] = path
    return result


def replay_sequence(root_dir, device=None, rtol=1e-3, atol=1e-3, include=None, exclude=None):
    """Replay every dump under ``root_dir`` in call order with one object registry.

    Parameters
    ----------
    root_dir : str or os.PathLike
        A dump root (``FLASHINFER_DUMP_DIR``).
    device : str or torch.device, optional
        As in :func:`replay_from_dump`.
    rtol, atol : float
        Tolerances of the tensor comparison.
    include, exclude : str or list of str, optional
        fnmatch patterns (a string is split on ``,``) on the API name: include first,
        then exclude.

    Returns
    -------
    list of dict
        One :func:`replay_from_dump` result per dump (run with ``compare_outputs``),
        each with ``dump_dir``. A dump that fails gives ``{"error", "dump_dir",
        "metadata"}`` and the run goes on. Calls whose process died (status
        ``inputs_saved``) are loaded, not run, and marked ``incomplete``.
    """
    device = _resolve_device(device)
    registry = {}
    return [
        replay_entry(path, records, registry, device, rtol, atol)
        for path, records in ordered_dumps(root_dir, include, exclude)
    ]


def classify(result):
    """Outcome of one replay result: ``passed``, ``mismatch``, ``error`` or ``incomplete``."""
    if "error" in result:
        return "error"
    if result.get("incomplete"):
        return "incomplete"
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
