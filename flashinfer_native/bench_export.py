"""Recorded calls as flashinfer-bench workloads (``flashinfer dumps --export-bench D OUT``,
docs/replay.md).

Each completed call of a traced API becomes a workload of the dataset layout that
flashinfer-bench 0.1.2's ``TraceSet.from_path`` reads:

- ``definitions/<op_type>/<name>.json``: the definition fi_trace gives for the call,
  its ``reference`` given the ``run`` entry point flashinfer-bench calls;
- ``workloads/<op_type>/<name>.jsonl``: one workload trace per call (``definition``,
  ``workload`` with the variable axes, the inputs and a ``uuid``; ``solution`` and
  ``evaluation`` null);
- ``blob/workloads/<op_type>/<name>/<name>_<uuid>.safetensors``: the call's input tensors
  under the definition's input names; scalar inputs are ``{"type": "scalar"}`` entries.

The dump is read by replay's reader and its API resolved by replay's gate, as
``replay --against reference`` does; nothing a dump names is imported or run, and every
file name comes from the template (its op_type and definition name), never from the dump.
"""

import contextlib
import json
import math
import os
import re
import uuid

import torch

from . import _C, reference, registry
from .calls import load_session
from .dumpdir import METADATA_FILE

__all__ = ["BENCH_VERSION", "export_bench"]

BENCH_VERSION = "0.1.2"
# flashinfer-bench 0.1.2's DType values.
_BENCH_DTYPES = {
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1",
    "int64",
    "int32",
    "int16",
    "int8",
    "bool",
}
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}")  # fullmatch: "$" passes a final "\n"


class _Skip(Exception):
    """This call cannot be a flashinfer-bench workload; the message says why."""


@contextlib.contextmanager
def _no_trace_autodump():
    """fi_trace writes a definition file where FLASHINFER_TRACE_DUMP_DIR points; an
    export writes only under its own output folder."""
    saved = os.environ.pop("FLASHINFER_TRACE_DUMP_DIR", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["FLASHINFER_TRACE_DUMP_DIR"] = saved


def _trace_arguments(template, arguments):
    """The call's arguments for fi_trace, each template input as the template reads it:
    a (k, v) pair for a combined cache, NHD for an HND layout, plan() values under
    run's names."""
    kwargs = arguments.flat()
    pairs = {}
    for name, spec in (template.inputs or {}).items():
        value = reference.input_value(name, spec, arguments)
        if value is reference.NOT_GIVEN:
            continue
        param = getattr(spec, "param", None) or name
        if getattr(spec, "tuple_idx", None) is not None:
            pairs.setdefault(param, {})[spec.tuple_idx] = value
        else:
            kwargs[param] = value
    for param, parts in pairs.items():
        kwargs[param] = tuple(parts.get(i) for i in range(max(parts) + 1))
    return kwargs


def _bench_definition(template, api, arguments):
    """The call's definition, made loadable by flashinfer-bench 0.1.2."""
    fi_trace = getattr(api, "fi_trace", None)
    if fi_trace is None:
        raise _Skip("the API has no fi_trace")
    with _no_trace_autodump():
        definition = dict(fi_trace(**_trace_arguments(template, arguments)))
    if not definition:
        raise _Skip("fi_trace gave no definition for this call")
    if getattr(template, "reference", None) is None or "reference" not in definition:
        raise _Skip(f"template {reference.template_name(template)} has no reference")
    entry = template.reference.__name__
    definition["reference"] += (
        f"\n\ndef run(*args, **kwargs):\n    return {entry}(*args, **kwargs)\n"
    )
    for name in ("name", "op_type"):
        if not _SAFE_NAME.fullmatch(str(definition.get(name, ""))):
            raise _Skip(f"definition {name} {definition.get(name)!r} is not a file name")
    overlap = set(definition["inputs"]) & set(definition["outputs"])
    if overlap:
        raise _Skip(f"{sorted(overlap)} are inputs and outputs (in place)")
    for section in ("inputs", "outputs"):
        for key, spec in definition[section].items():
            if spec.get("dtype") not in _BENCH_DTYPES:
                raise _Skip(f"{key} has dtype {spec.get('dtype')!r}, which flashinfer-bench lacks")
            for axis in spec.get("shape") or ():
                if axis not in definition["axes"]:
                    raise _Skip(f"{key}'s axis {axis!r} is not among the definition's axes")
    return definition


def _workload_inputs(template, definition, arguments):
    """(tensors, scalar entries, variable axis values) of the call's inputs."""
    tensors, scalars, axes = {}, {}, {}
    for name, spec in definition["inputs"].items():
        value = reference.input_value(name, template.inputs.get(name), arguments)
        if name == "sm_scale" and value in (None, reference.NOT_GIVEN):
            head_dim = reference.head_dim_of(arguments, tensors)
            value = 1.0 / math.sqrt(head_dim) if head_dim else value  # the APIs' default
        if isinstance(value, torch.Tensor) and spec.get("shape") is None and value.numel() == 1:
            value = value.item()  # a number the API takes as a one-value tensor
        if isinstance(value, torch.Tensor):
            shape = spec.get("shape")
            if shape is not None and value.dim() == 0 and len(shape) == 1:
                value = value.reshape(1)  # a one-value scale the definition shapes [1]
            if shape is None or len(shape) != value.dim():
                raise _Skip(f"input {name} has shape {tuple(value.shape)}, the definition {shape}")
            for axis, size in zip(shape, value.shape):
                if definition["axes"][axis].get("type") == "var":
                    axes.setdefault(axis, int(size))
            tensors[name] = value.detach().cpu().contiguous()
        elif isinstance(value, (bool, int, float)) and spec.get("shape") is None:
            scalars[name] = {"type": "scalar", "value": value}
    # flashinfer-bench sizes every input, passed or not: an axis only an absent optional
    # input has is 0 (the input is empty)
    for axis, spec in definition["axes"].items():
        if spec.get("type") == "var":
            axes.setdefault(axis, 0)
    return tensors, scalars, axes


def export_bench(root, out, allow_modules=None):
    """Write every completed call of a traced API of the session ``root`` (a dump root or
    one call's directory, read by ``calls.load_session``) as a flashinfer-bench workload
    under ``out`` (created).

    Raises
    ------
    ValueError
        ``out`` exists and is not empty, or ``root`` holds no dump (``NoDumpError``).

    Returns
    -------
    dict
        ``workloads`` (per definition name, the number written), ``definitions``
        written, and ``skipped``: ``[{"dir", "api", "reason"}]`` for the calls left out.
    """
    registry.import_allowed(allow_modules)
    patterns = registry.allowed_patterns(allow_modules)
    from .replay import replay_from_dump

    if os.path.isdir(out) and os.listdir(out):
        raise ValueError(f"{out}: the output folder exists and is not empty")
    os.makedirs(out, exist_ok=True)
    state = reference.SessionState()
    written, definitions, skipped = {}, set(), []
    for call in load_session(root, session_file=False):
        path, record = call.path, call.record or {}
        name = record.get("function_name")
        try:
            if record.get("execution_status") != "completed":
                raise _Skip(f"status {record.get('execution_status')}")
            loaded = replay_from_dump(path, device="cpu", allow_modules=allow_modules)
            where = f"{path}/{METADATA_FILE}"
            api, is_method = reference.api_of(record, patterns, where)
            explicit, defaults = reference.bind_arguments(
                api, loaded["args"], loaded["kwargs"], where
            )
            attr = str(name).rpartition(".")[2]
            object_calls = state.object_arguments(record) if is_method else []
            if is_method and attr in ("__init__", "plan"):
                state.remember(record, attr, explicit, defaults)
            arguments = reference.CallArguments(explicit, defaults, object_calls)
            key = (api.__module__, api.__qualname__)
            template = reference.pick_template(
                key, arguments.flat(), is_method and attr in ("__init__", "plan")
            )
            definition = _bench_definition(template, api, arguments)
            tensors, scalars, axes = _workload_inputs(template, definition, arguments)
        except (_Skip, reference.NoReference) as exc:
            skipped.append({"dir": os.path.basename(path), "api": name, "reason": str(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - one unreadable dump must not stop the export
            skipped.append(
                {
                    "dir": os.path.basename(path),
                    "api": name,
                    "reason": f"{type(exc).__name__}: {exc}",
                }
            )
            continue
        _write_workload(out, definition, tensors, scalars, axes, path, definitions)
        written[definition["name"]] = written.get(definition["name"], 0) + 1
    return {"workloads": written, "definitions": sorted(definitions), "skipped": skipped}


def _write_workload(out, definition, tensors, scalars, axes, path, definitions):
    op_type, name = definition["op_type"], definition["name"]
    workload_id = str(uuid.uuid5(uuid.NAMESPACE_URL, os.path.abspath(path)))
    if name not in definitions:
        folder = os.path.join(out, "definitions", op_type)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            json.dump(definition, f, indent=2)
            f.write("\n")
        definitions.add(name)
    inputs = dict(scalars)
    if tensors:
        blob = os.path.join("blob", "workloads", op_type, name, f"{name}_{workload_id}.safetensors")
        os.makedirs(os.path.dirname(os.path.join(out, blob)), exist_ok=True)
        _C.save_tensors(os.path.join(out, blob), tensors, format="safetensors")
        for key in tensors:
            inputs[key] = {"type": "safetensors", "path": blob, "tensor_key": key}
    trace = {
        "definition": name,
        "workload": {"axes": axes, "inputs": inputs, "uuid": workload_id},
        "solution": None,
        "evaluation": None,
    }
    folder = os.path.join(out, "workloads", op_type)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.jsonl"), "a") as f:
        f.write(json.dumps(trace) + "\n")
