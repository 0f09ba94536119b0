"""``flashinfer repro``: one recorded call as a self-contained folder with a ``repro.py``.

The folder holds the call's tensors (``data/*.pt``, PyTorch's own format, read back with
``torch.load(weights_only=True)``: safetensors dumps are converted), a script that
needs only ``torch`` and ``flashinfer``, and next to it ``repro_runtime.py``, a copy of
this package's module of that name: the script's helpers (loading, the comparison rule
of replay and diff, checking a raised exception), fixed text the script imports. For a
method of a stateful wrapper the script first rebuilds the object: its ``__init__`` and
the latest ``plan`` recorded on the same object (same ``process_id`` and ``self_id``)
before the call. The script compares the
result with the recorded outputs, or the raised exception with the recorded one, and
exits 1 on a mismatch.

The script calls only what replay would call (docs/security.md): the record is decoded
by ``record.decode_inputs`` as replay decodes it, its APIs and enums are resolved
through the same allow-list (``registry``: registered ``@flashinfer_api`` objects of
allowed modules, ``flashinfer`` plus ``allow_modules``) and refused with replay's own
message. Every name written into the script is the name of an object found there, every
value a literal (strings through ``ascii``), and dump text in comments is printable
ASCII without quotes: no text of the dump becomes code. Exporting imports only the
allowed modules and calls nothing the dump names.
"""

import fnmatch
import inspect
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass

import torch

from . import _C, dumpdir, jit_args, registry, repro_runtime
from . import record as rec
from .calls import load_session
from .record import dotted_name

__all__ = ["export_repro", "parse_signature", "reproducer"]

# inspect.Parameter kinds, by name
POSITIONAL_ONLY = "positional_only"
POSITIONAL_OR_KEYWORD = "positional_or_keyword"
VAR_POSITIONAL = "var_positional"
KEYWORD_ONLY = "keyword_only"
VAR_KEYWORD = "var_keyword"

# Parameters holding scratch memory whose content before the call does not matter
# (workspace buffers), for dumps that hold them whole (FlashInfer's): the core's table of
# them, (API, parameter) pairs (docs/dump-format.md#scratch-tensors), and for APIs it does
# not know any parameter named like a workspace. The script makes them afresh as zeros
# instead of shipping their recorded bytes (often hundreds of MB).
SCRATCH_PARAMETERS = frozenset((api, param) for api, param, _ in _C.SCRATCH_PARAMETERS)
WORKSPACE_PARAMETERS = ("*workspace*",)

# The reproducer's runtime (repro_runtime.py, this package's module) is copied under this
# name next to the script, which imports its helpers from there.
RUNTIME_MODULE = "repro_runtime"
RUNTIME_HELPERS = tuple(repro_runtime.__all__)

_NESTED_KEY = rec.NESTED_KEY
_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_TOP_KEY = rec.TOP_KEY
_CLOSERS = {"(": ")", "[": "]", "{": "}", "<": ">"}


# ------------------------------------------------------------------- signature


def _split_top_level(text):
    """Split ``text`` at commas outside brackets and quotes; None when unbalanced."""
    parts, depth, quote, start, i = [], [], None, 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in _CLOSERS:
            depth.append(_CLOSERS[ch])
        elif depth and ch == depth[-1]:
            depth.pop()
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quote or depth:
        return None
    parts.append(text[start:])
    return parts


def _parameter_region(text):
    """The text between the signature's outer parentheses, or None."""
    text = text.strip()
    if not text.startswith("("):
        return None
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1] == "-"):
            depth -= 1
            if depth == 0:
                return text[1:i] if ch == ")" else None
    return None


def parse_signature(text):
    """Parameter names and kinds from ``str(inspect.signature(f))`` without evaluating it.

    Defaults and annotations may be reprs that are not Python (``<SfLayout.x: 0>``);
    only the names and the ``/``, ``*``, ``*args``, ``**kwargs`` markers are read.

    Parameters
    ----------
    text : str
        The recorded ``function_signature``.

    Returns
    -------
    list of (str, str) or None
        ``(name, kind)`` per parameter, kind one of ``positional_only``,
        ``positional_or_keyword``, ``var_positional``, ``keyword_only``, ``var_keyword``;
        None when the text cannot be read.
    """
    if not isinstance(text, str):
        return None
    region = _parameter_region(text)
    parts = _split_top_level(region) if region is not None else None
    if parts is None:
        return None
    params, keyword_only = [], False
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if part == "/":
            params = [(n, POSITIONAL_ONLY) for n, _ in params]
            continue
        if part == "*":
            keyword_only = True
            continue
        match = re.match(r"(\*{0,2})([A-Za-z_]\w*)\s*(?:[:=]|$)", part)
        if match is None:
            return None
        stars, name = match.groups()
        if stars == "**":
            params.append((name, VAR_KEYWORD))
        elif stars == "*":
            params.append((name, VAR_POSITIONAL))
            keyword_only = True
        else:
            params.append((name, KEYWORD_ONLY if keyword_only else POSITIONAL_OR_KEYWORD))
    return params


def parameter_of(key, params):
    """The parameter a recorded key belongs to (``arg_2__0`` -> the third parameter).

    Parameters
    ----------
    key : str
        An input key (docs/dump-format.md#argument-keys: ``arg_{i}``, ``kwarg_{name}``, nested ``{parent}__...``).
    params : list of (str, str)
        :func:`parse_signature` of the recorded signature.

    Returns
    -------
    str or None
        The parameter name, None when the signature does not tell.
    """
    match = _TOP_KEY.match(key)
    if match is None:
        return None
    if match.group(3) is not None:
        return match.group(3)
    index = int(match.group(2))
    return params[index][0] if index < len(params) else None


def is_scratch(api, name):
    """True when parameter ``name`` of the API named ``api`` is in ``SCRATCH_PARAMETERS``
    or is named like one of ``WORKSPACE_PARAMETERS``."""
    if name is None:
        return False
    return (api, name) in SCRATCH_PARAMETERS or any(
        fnmatch.fnmatchcase(name, p) for p in WORKSPACE_PARAMETERS
    )


# ---------------------------------------------------------------- value source


def _identifier(text):
    return dotted_name(text) and "." not in text


def _dotted(text, what):
    """Split a dotted name of ASCII identifiers; ValueError otherwise (a guard: every
    name written comes from an object the allow-list resolved)."""
    if not dotted_name(text):
        raise ValueError(f"{what} {text!r} is not a dotted Python name; refusing to write it")
    return text.split(".")


# Names the script defines or imports itself; imports never shadow them.
_SCRIPT_NAMES = {
    "argparse",
    "os",
    "sys",
    "torch",
    RUNTIME_MODULE,
    "load",
    "compare",
    "compare_tensor",
    "check_exception",
    "on_device",
    "main",
    "args",
    "device",
    "inputs",
    "expected",
    "outputs",
    "result",
    "wrapper",
    "exc",
    "ok",
    "parser",
    "traceback",
}


class _Script:
    """What the generated script needs: imports, helper functions, notes for the reader."""

    def __init__(self):
        self.from_imports = {}  # local name -> module
        self.module_imports = {}  # module -> the name it is bound to
        self.needs_on_device = False
        self.needs_compare = False
        self.notes = []

    def _taken(self, name):
        return name in _SCRIPT_NAMES or name in self.module_imports.values()

    def name_of(self, module, attr):
        """An expression naming ``module.attr``: ``from module import attr`` when the name
        is free, else ``import module as alias`` and ``alias.attr``."""
        _dotted(module, "module")
        _dotted(attr, "name")
        if self.from_imports.get(attr) == module:
            return attr
        if attr not in self.from_imports and not self._taken(attr):
            self.from_imports[attr] = module
            return attr
        alias = self.module_imports.get(module)
        if alias is None:
            alias = "_" + module.replace(".", "_")
            while alias in self.from_imports or self._taken(alias):
                alias += "_"
            self.module_imports[module] = alias
        return f"{alias}.{attr}"

    def import_lines(self):
        lines = [f"import {m} as {a}" for m, a in sorted(self.module_imports.items())]
        by_module = {}
        for name, module in self.from_imports.items():
            by_module.setdefault(module, []).append(name)
        lines += [f"from {m} import {', '.join(sorted(n))}" for m, n in sorted(by_module.items())]
        return lines


def _safe_text(text, limit=200):
    """Untrusted text for a comment or docstring: printable ASCII, no backslash or quotes."""
    text = str(text)[:limit]
    return "".join(c if " " <= c <= "~" and c not in '\\"' else "?" for c in text)


def _float_source(value):
    if value != value:
        return "float('nan')"
    if value in (float("inf"), float("-inf")):
        return "float('inf')" if value > 0 else "-float('inf')"
    return repr(value)


def _literal(value):
    """Source of plain JSON data: only literals; strings through ascii() so the script
    stays ASCII (no bidirectional or look-alike characters from the dump)."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return _float_source(value)
    if isinstance(value, str):
        return ascii(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{ascii(str(k))}: {_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"{type(value).__name__} is no JSON value")


class _Renderer:
    """Source text of decoded values (``record.Value``), by the rules replay builds them
    with: tensors by key from the loaded files, dtypes from torch's own table, enums and
    APIs only through the allow-list (``registry``). Every name written is the name of an
    object found there, never text of the dump."""

    def __init__(self, script, patterns, tensors, scratch, var, where):
        self.script = script
        self.patterns = patterns
        self.tensors = tensors
        self.scratch = scratch
        self.var = var
        self.where = where

    def source(self, value, field):
        if isinstance(value, rec.Plain):
            return _literal(value.value)
        if isinstance(value, rec.TensorRef):
            if value.key in self.scratch:
                return self.scratch[value.key]
            if not isinstance(value.key, str) or value.key not in self.tensors:
                raise ValueError(
                    f"{self.where}: {field}: tensor {value.key!r} is not in the tensor file"
                )
            return f"{self.var}[{ascii(value.key)}]"
        if isinstance(value, rec.DType):
            dtype = _DTYPES.get(f"torch.{value.name}")
            if dtype is None:
                raise ValueError(f"{self.where}: {field}: unknown torch dtype {value.text!r}")
            return str(dtype)
        if isinstance(value, rec.Device):
            try:
                device = torch.device(value.text)
            except (RuntimeError, ValueError):
                raise ValueError(
                    f"{self.where}: {field}: {value.text!r} is not a torch device"
                ) from None
            self.script.needs_on_device = True
            return f"on_device({ascii(str(device))}, device)"
        if isinstance(value, rec.EnumRef):
            return self.enum(value, field)
        if isinstance(value, rec.Sequence):
            items = [self.source(v, f"{field}[{i}]") for i, v in enumerate(value.items)]
            if value.truncated:
                self.script.notes.append(
                    f"{self.where}: {field}: the recorded {value.kind} was truncated to "
                    f"{len(items)} items"
                )
            if value.kind == "tuple":
                return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
            return "[" + ", ".join(items) + "]"
        if isinstance(value, rec.Mapping):
            pairs = [
                f"{self.source(k, f'{field}[{i}].key')}: {self.source(v, f'{field}[{i}].value')}"
                for i, (k, v) in enumerate(value.items)
            ]
            return "{" + ", ".join(pairs) + "}"
        self.script.notes.append(
            f"{self.where}: {field} was recorded only as its repr ({value.repr[:120]!r}); "
            "None is passed instead"
        )
        return "None"

    def enum(self, value, field):
        cls, home, path = registry.locate_enum(
            value.class_path, self.patterns, f"{self.where}: {field}"
        )
        member = registry.enum_member(cls, value.member, value.value)
        if member is None:
            raise ValueError(
                f"{self.where}: {field}: {value.class_path} has no member {value.member!r}"
            )
        first, _, rest = path.partition(".")
        name = self.script.name_of(home, first) + (f".{rest}" if rest else "")
        if _identifier(member.name):
            return f"{name}.{member.name}"
        return f"{name}[{ascii(member.name)}]"


# ------------------------------------------------------------------ call steps


@dataclass
class _Step:
    """One call of the chain: where its files come from and what the script calls it."""

    number: int
    call: object  # calls.Call
    record: dict
    label: str  # file stem in data/: "1_init", "2_plan", "3_run"
    inputs: dict  # key -> tensor (loaded, memory-mapped), workspaces left out
    scratch: dict  # key -> source making a workspace buffer afresh


def _parameters(function):
    """``[(name, kind)]`` of the resolved API's own signature (never the recorded text);
    empty when it has none to show."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD: POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL: VAR_POSITIONAL,
        inspect.Parameter.KEYWORD_ONLY: KEYWORD_ONLY,
        inspect.Parameter.VAR_KEYWORD: VAR_KEYWORD,
    }
    return [(p.name, kinds[p.kind]) for p in signature.parameters.values()]


def _ordered_arguments(step, target, renderer):
    """``(positional sources, [(name, source)])`` of a recorded call, named where allowed.

    The arguments are the record's, decoded by ``record.decode_inputs`` as replay
    decodes them. A source is ``(Python text, comment or None)``; tensors get their
    recorded dtype and shape as the comment. Positional arguments become
    ``name=value`` when the API's own signature says the parameter may be passed by
    keyword; any argument before one that cannot be named stays positional.
    """
    record = step.record
    arguments = rec.decode_inputs(
        record.get("input_metadata") or {}, [*step.inputs, *step.scratch], renderer.where
    )
    details = record.get("tensor_details") or {}
    keywords = {name: (key, value) for name, key, value in arguments.keywords}

    def source(key, value):
        if key in step.scratch:
            return step.scratch[key], "scratch: made afresh, its recorded bytes are not needed"
        text = renderer.source(value, key)
        info = details.get(key)
        if key in step.inputs and isinstance(info, dict):
            shape = tuple(info.get("shape") or ())
            return text, _safe_text(f"{info.get('dtype')} {shape}")
        return text, None

    start = 1 if target.drops_self else 0
    count = len(arguments.positional)
    params = target.parameters
    names = []
    for i in range(start, count):
        name, kind = params[i] if i < len(params) else (None, None)
        names.append(name if kind == POSITIONAL_OR_KEYWORD and name not in keywords else None)
    last_unnamed = max((k for k, n in enumerate(names) if n is None), default=-1)
    names = [None] * (last_unnamed + 1) + names[last_unnamed + 1 :]
    args, kwargs = [], []
    for name, i in zip(names, range(start, count)):
        key, value = arguments.positional[i] or (f"arg_{i}", rec.Plain(None))
        if name is None:
            args.append(source(key, value))
        else:
            kwargs.append((name, source(key, value)))
    order = {name: n for n, (name, _) in enumerate(params)}
    for name in sorted(keywords, key=lambda k: order.get(k, len(order))):
        kwargs.append((name, source(*keywords[name])))
    return args, kwargs


def _call_lines(callee, args, kwargs, assign, indent):
    """``assign = callee(args..., name=value...)`` as source lines, one argument a line."""
    pad = " " * indent
    head = f"{pad}{assign} = {callee}(" if assign else f"{pad}{callee}("
    if not args and not kwargs:
        return [head + ")"]
    items = list(args)
    for name, (text, comment) in kwargs:
        text = f"{name}={text}" if _identifier(name) else f"**{{{ascii(name)}: {text}}}"
        items.append((text, comment))
    lines = [head]
    for text, comment in items:
        lines.append(f"{pad}    {text}," + (f"  # {comment}" if comment else ""))
    lines.append(f"{pad})")
    return lines


# --------------------------------------------------------------------- script


def _pretty_time(stamp):
    if isinstance(stamp, str) and re.fullmatch(r"\d{8}_\d{6}_\d{3}", stamp):
        return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}.{stamp[16:]}"
    return str(stamp)


@dataclass
class _Target:
    """What one recorded call reaches, resolved through the allow-list: the expression
    naming the callee in the script and the API's own parameters."""

    callee: str
    assign_wrapper: bool  # a wrapper's __init__: the object is built
    drops_self: bool  # args[0] is the recorded ``self`` placeholder
    parameters: list
    function: object  # what replay calls: its signature names the arguments
    first: int  # the first recorded position ``function`` takes


def _resolve(record, script, patterns, where):
    """The recorded ``module`` + ``function_name`` resolved as replay resolves them
    (``registry.resolve_call``: registered ``@flashinfer_api`` objects of allowed modules,
    refused with replay's own message otherwise); the script names the object by the
    module that holds it."""
    module, name = record.get("module"), record.get("function_name")
    if not module or not name:
        raise ValueError(f"{where}: record has no 'module'/'function_name' to reproduce")
    target = registry.resolve_call(module, name, patterns, where)
    if target[0] == "function":
        home = registry.home_of(module, name)[1] or module
        parameters = _parameters(target[1])
        return _Target(script.name_of(home, name), False, False, parameters, target[1], 0)
    _, cls, attr = target
    owner_path = name.rpartition(".")[0]
    home = registry.home_of(module, owner_path)[1] or module
    first, _, rest = owner_path.partition(".")
    cls_name = script.name_of(home, first) + (f".{rest}" if rest else "")
    method = registry.verified_method(cls, attr, patterns, module, name, where)
    parameters = _parameters(method)
    if attr == "__init__":
        return _Target(cls_name, True, True, parameters, cls, 1)
    if record.get("self_id") is not None:
        return _Target(f"wrapper.{attr}", False, True, parameters, method, 0)
    return _Target(f"{cls_name}.{attr}", False, False, parameters, method, 0)


def _shadow(value):
    """A decoded value as the JIT check (``jit_args.check_arguments``) sees it: plain
    data as itself, containers of their items, anything else (a tensor, dtype, enum) as
    an object that holds no text."""
    if isinstance(value, rec.Plain):
        return value.value
    if isinstance(value, rec.Sequence):
        return [_shadow(v) for v in value.items]
    if isinstance(value, rec.Mapping):
        return {i: _shadow(v) for i, (_, v) in enumerate(value.items)}
    if isinstance(value, rec.Opaque):
        return value.raw
    return object()


def _check_jit_arguments(step, target, where):
    """Refuse, as replay does, arguments that reach FlashInfer's JIT (docs/security.md)."""
    record = step.record
    arguments = rec.decode_inputs(record.get("input_metadata") or {}, step.inputs, where)
    args = [None if p is None else _shadow(p[1]) for p in arguments.positional]
    kwargs = {name: _shadow(value) for name, _, value in arguments.keywords}
    jit_args.check_arguments(target.function, args[target.first :], kwargs, where)


def _step_source(step, total, script, is_target, patterns, allow_jit_args=False):
    """Source lines of one step inside ``main()``; the target's result goes to ``result``."""
    record = step.record
    where = os.path.join(step.call.path, dumpdir.METADATA_FILE)
    target = _resolve(record, script, patterns, where)
    if not allow_jit_args:
        _check_jit_arguments(step, target, where)
    what = "the call reproduced" if is_target else "rebuilds the object"
    lines = [
        f"    # Step {step.number} of {total}: {_safe_text(step.call.api)} ({what}; recorded "
        f"{_safe_text(_pretty_time(step.call.timestamp))})"
    ]
    if step.inputs:
        lines.append(f'    inputs = load("{step.label}_inputs", device)')
    renderer = _Renderer(script, patterns, step.inputs, step.scratch, "inputs", where)
    args, kwargs = _ordered_arguments(step, target, renderer)
    if target.assign_wrapper:
        assign = "wrapper"
    else:
        assign = "result" if is_target else None
    exception = record.get("exception") if record.get("execution_status") == "exception" else None
    if is_target and exception is not None:
        lines.append("    try:")
        lines += _call_lines(target.callee, args, kwargs, assign, 8)
        lines.append("    except Exception as exc:  # the recording raised: so should this")
        lines.append(
            f"        return check_exception(exc, {ascii(str(exception.get('type')))}, "
            f"{ascii(str(exception.get('message')))})"
        )
        return lines
    return lines + _call_lines(target.callee, args, kwargs, assign, 4)


def _expected_source(record, tensors, script, patterns, where):
    """Source of the recorded return value, from output_metadata and outputs.pt keys."""
    value = rec.decode_result(record.get("output_metadata") or {}, tensors, where)
    if value is None:
        return "None"
    return _Renderer(script, patterns, tensors, {}, "outputs", where).source(value, "result")


def _ending(target, record, outputs, script, patterns):
    """The lines after the target call: compare with the recording, return the exit status."""
    status = record.get("execution_status")
    if status == "exception":
        exc = record.get("exception") or {}
        message = (
            "FAIL: the call returned normally; the recording raised "
            f"{exc.get('type')}: {exc.get('message')}"
        )
        return [f"    print({ascii(message)})", "    return 1"]
    if status != "completed" or record.get("outputs_skipped"):
        why = (
            f"its outputs were not recorded ({record['outputs_skipped']})"
            if status == "completed"
            else "the recording holds no outcome of this call"
        )
        message = f"The call returned; {why}, so there is nothing to compare with."
        return [f"    print({ascii(message)})", "    return 0"]
    if target.call.api.endswith(".__init__"):
        return ['    print("PASS: the object was constructed as recorded")', "    return 0"]
    lines = []
    if outputs:
        lines.append(f'    outputs = load("{target.label}_outputs", device)')
    where = os.path.join(target.call.path, dumpdir.METADATA_FILE)
    expected = _expected_source(record, outputs, script, patterns, where)
    lines.append(f"    expected = {expected}")
    script.needs_compare = True
    lines.append('    ok = compare("result", result, expected, args.rtol, args.atol)')
    lines.append(
        '    print("PASS: the result matches the recording" if ok else '
        '"FAIL: the result differs from the recording")'
    )
    lines.append("    return 0 if ok else 1")
    return lines


def _docstring(steps, record, device, rtol, atol):
    target = steps[-1].call
    versions = record.get("versions") or {}
    recorded = ", ".join(f"{k} {v}" for k, v in versions.items() if isinstance(v, str))
    chain = ", ".join(s.call.method for s in steps)
    status = record.get("execution_status")
    exc = record.get("exception") or {}
    outcome = {
        "completed": "It compares the result with the recorded outputs and exits 0 when they\n"
        "match, 1 when they do not.",
        "exception": f"The recorded call raised {exc.get('type')}; the script exits 0 when the "
        "call raises\nthe same exception type, 1 otherwise.",
    }.get(
        status,
        "The recording holds no outcome of this call: the process ended during it, or its\n"
        "recorder wrote none (FlashInfer's writes none for a call that raised). The script\n"
        "runs the call; an exception it raises ends the script with exit status 1.",
    )
    lines = [
        f"Reproducer of one recorded FlashInfer API call: {target.api}.",
        "",
        f"Exported by `flashinfer repro` from {target.dir_name}",
        f"(recorded {_pretty_time(target.timestamp)}, process {target.pid}"
        + (f"; {recorded}" if recorded else "")
        + ").",
    ]
    if len(steps) > 1:
        lines.append(f"The object is rebuilt as recorded before the call: {chain}.")
    lines += [
        "",
        "Needs torch and flashinfer only (and repro_runtime.py, next to this file).",
        "Run it from anywhere:",
        "",
        f"    python repro.py [--device {device}] [--rtol {rtol:g}] [--atol {atol:g}]",
        "",
        *outcome.split("\n"),
    ]
    return "\n".join(_safe_text(line, 400) for line in lines)


def _script_source(steps, outputs, device, rtol, atol, patterns, allow_jit_args=False):
    script = _Script()
    body = []
    for step in steps:
        body += _step_source(step, len(steps), script, step is steps[-1], patterns, allow_jit_args)
        body.append("")
    record = steps[-1].record
    if record.get("execution_status") == "exception":
        body.pop()
    body += _ending(steps[-1], record, outputs, script, patterns)
    status = record.get("execution_status")
    runtime = ["load"] + (["on_device"] if script.needs_on_device else [])
    runtime += (["compare"] if script.needs_compare else []) + (
        ["check_exception"] if status == "exception" else []
    )
    notes = [f"    # NOTE: {_safe_text(note, 400)}" for note in dict.fromkeys(script.notes)]
    head = [
        "#!/usr/bin/env python3",
        f'"""{_docstring(steps, record, device, rtol, atol)}\n"""',
        "",
        "import argparse",
        "import sys",
        "",
        "import torch",
        "",
        *script.import_lines(),
        f"from {RUNTIME_MODULE} import {', '.join(sorted(runtime))}",
        "",
    ]
    main = [
        "",
        "def main():",
        '    parser = argparse.ArgumentParser(description=__doc__.split("\\n")[0])',
        f'    parser.add_argument("--device", default={ascii(device)}, help="where to run (default: %(default)s)")',
        f'    parser.add_argument("--rtol", type=float, default={rtol!r}, help="relative tolerance")',
        f'    parser.add_argument("--atol", type=float, default={atol!r}, help="absolute tolerance")',
        "    args = parser.parse_args()",
        "    device = torch.device(args.device)",
        '    if device.type == "cuda" and not torch.cuda.is_available():',
        '        sys.exit("CUDA is not available here; run with --device cpu")',
        f"    print({ascii('Reproducing ' + steps[-1].call.api + ' on')}, device)",
        "",
        *notes,
        *body,
        "",
        "",
        'if __name__ == "__main__":',
        "    sys.exit(main())",
        "",
    ]
    text = "\n".join(head) + "\n" + "\n".join(main)
    compile(text, "repro.py", "exec")  # a bug here must never ship a broken script
    return text, list(dict.fromkeys(script.notes))


# --------------------------------------------------------------------- export


def _recorded_device(record):
    details = record.get("tensor_details") or {}
    kinds = {
        str(d.get("device", "cpu")).split(":")[0] for d in details.values() if isinstance(d, dict)
    }
    return "cuda" if "cuda" in kinds else "cpu"


def _load_step_tensors(call, stem):
    """The call's inputs/outputs (memory-mapped), checked against the keys it lists, without
    the inputs it records as scratch (``dumpdir.load_call_tensors``)."""
    return dumpdir.load_call_tensors(call.path, stem, call.record, scratch=False)[0]


def _zeros_source(shape, dtype, key):
    text = str(dtype)
    _dotted(text, f"{key}: dtype")
    return f"torch.zeros({tuple(int(n) for n in shape)!r}, dtype={text}, device=device)"


def _split_workspaces(call, tensors):
    """(tensors to ship, {key: torch.zeros source}): the inputs recorded as scratch
    (docs/dump-format.md#scratch-tensors) and workspace buffers recorded whole are made
    afresh as zeros, the state every workspace may start in."""
    record = call.record
    where = os.path.join(call.path, dumpdir.METADATA_FILE)
    scratch = {
        key: _zeros_source(shape, dtype, key)
        for key, (shape, dtype) in dumpdir.scratch_specs(record, where).items()
    }
    params = parse_signature(record.get("function_signature")) or []
    for key, tensor in tensors.items():
        if _NESTED_KEY.search(key) or not is_scratch(
            record.get("function_name"), parameter_of(key, params)
        ):
            continue
        scratch[key] = _zeros_source(tensor.shape, tensor.dtype, key)
    return {k: t for k, t in tensors.items() if k not in scratch}, scratch


def _step(number, call):
    """One step of the chain: its inputs loaded, workspaces split off."""
    inputs = _load_step_tensors(call, "inputs")
    kept, scratch = _split_workspaces(call, inputs)
    return _Step(number, call, call.record, _label(number, call.api), kept, scratch)


def _label(number, api):
    name = (api.rsplit(".", 1)[1] if "." in api else api).strip("_") or "call"
    return f"{number}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


def _target_call(dump_dir):
    """The session around the call of ``dump_dir`` (its parent directory) and the call."""
    dump_dir = os.path.abspath(os.fspath(dump_dir))
    if not os.path.isfile(os.path.join(dump_dir, dumpdir.METADATA_FILE)):
        found = dumpdir.find_dump_dirs(dump_dir) if os.path.isdir(dump_dir) else []
        if found:
            raise ValueError(
                f"{dump_dir} is a session root ({len(found)} calls); repro takes one call's "
                f"directory, such as {found[-1]}"
            )
        dumpdir.read_metadata(dump_dir)  # raises the reader's message
    session = load_session(os.path.dirname(dump_dir))
    for call in session:
        if os.path.abspath(call.path) == dump_dir:
            if call.record is None:
                dumpdir.read_metadata(dump_dir)  # raises the reader's message
            return session, call
    session = load_session(dump_dir)
    return session, session[0]


def _write_folder(folder, steps, outputs):
    data = os.path.join(folder, "data")
    os.makedirs(data)
    total = 0
    for step in steps:
        if step.inputs:
            total += _C.save_tensors(os.path.join(data, f"{step.label}_inputs.pt"), step.inputs)
        shutil.copyfile(
            os.path.join(step.call.path, dumpdir.METADATA_FILE),
            os.path.join(data, f"{step.label}_metadata.jsonl"),
        )
    if outputs:
        total += _C.save_tensors(os.path.join(data, f"{steps[-1].label}_outputs.pt"), outputs)
    shutil.copyfile(repro_runtime.__file__, os.path.join(folder, RUNTIME_MODULE + ".py"))
    return total


def _prepare_destination(out, tar):
    out = os.path.abspath(os.fspath(out))
    if tar:
        archive = out if out.endswith(".tar.gz") else out + ".tar.gz"
        if os.path.exists(archive):
            raise FileExistsError(f"{archive} exists; choose another -o or remove it")
        return archive, os.path.basename(archive)[: -len(".tar.gz")] or "repro"
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} exists and is not an empty directory; choose another -o")
    return out, os.path.basename(out)


def reproducer(
    dump_dir,
    device=None,
    rtol=1e-3,
    atol=1e-3,
    full_chain=False,
    allow_modules=None,
    allow_jit_args=False,
):
    """The reproducer of one recorded call, before anything is written (parameters as
    :func:`export_repro`): ``(steps, outputs, source, notes)``, the chain of calls with
    their loaded inputs, the target's recorded outputs, the script's text and the notes
    on arguments it cannot rebuild. Only reads: the fuzz target of the exporter
    (tests/fuzz/fuzz_repro.py) checks every script it makes."""
    patterns = registry.allowed_patterns(allow_modules)
    registry.import_allowed(allow_modules)
    session, target = _target_call(dump_dir)
    chain = [*session.setup_chain(target, full_chain), target]
    steps = [_step(n, call) for n, call in enumerate(chain, 1)]
    record = target.record
    outputs = {}
    if record.get("execution_status") == "completed" and not record.get("outputs_skipped"):
        outputs = _load_step_tensors(target, "outputs")
    device = device or _recorded_device(record)
    source, notes = _script_source(
        steps, outputs, str(device), rtol, atol, patterns, allow_jit_args
    )
    return steps, outputs, source, notes


def export_repro(
    dump_dir,
    out,
    device=None,
    tar=False,
    rtol=1e-3,
    atol=1e-3,
    full_chain=False,
    allow_modules=None,
    allow_jit_args=False,
):
    """Write a self-contained reproducer of one recorded call.

    Parameters
    ----------
    dump_dir : str or os.PathLike
        One call's dump directory; its parent (the dump root) is searched for the
        ``__init__`` and ``plan`` of a wrapper method's object.
    out : str or os.PathLike
        The folder to create (it must not exist or be empty); with ``tar``, the
        ``.tar.gz`` archive to write (the suffix is added when missing).
    device : str, optional
        The script's default device; default: where the call's tensors were recorded.
    tar : bool
        Write one ``.tar.gz`` holding the folder instead of the folder.
    rtol, atol : float
        The script's default tolerances.
    full_chain : bool
        Replay every call made on the wrapper object since its ``__init__`` instead of
        only its latest ``plan``.
    allow_modules : str or list of str, optional
        Module patterns whose registered APIs and enums the script may call, besides
        ``flashinfer``: the same allow-list as replay (``replay_from_dump``); their
        modules are imported first, never a module the dump names.
    allow_jit_args : bool
        Write a call whose arguments reach FlashInfer's JIT compiler; refused by
        default, as replay refuses it (``jit_args``, docs/security.md).

    Returns
    -------
    dict
        ``path`` (folder or archive), ``script``, ``steps`` (API names in order),
        ``tensor_bytes`` written and ``notes`` (arguments the script cannot rebuild).

    Raises
    ------
    ReplayRefused
        The dump names a function, class or enum that replay would refuse (a
        ``ValueError``; the message is replay's, saying how to allow it).
    FileNotFoundError, ValueError
        Missing or unreadable dump, a wrapper method without its ``__init__`` dump.
    ImportError
        A module of ``allow_modules`` cannot be imported.
    FileExistsError
        ``out`` exists (and is not an empty folder).
    """
    destination, folder_name = _prepare_destination(out, tar)
    steps, outputs, source, notes = reproducer(
        dump_dir, device, rtol, atol, full_chain, allow_modules, allow_jit_args
    )
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".repro-", dir=os.path.dirname(destination))
    try:
        folder = os.path.join(staging, folder_name)
        os.makedirs(folder)
        size = _write_folder(folder, steps, outputs)
        with open(os.path.join(folder, "repro.py"), "w") as f:
            f.write(source)
        os.chmod(os.path.join(folder, "repro.py"), 0o755)
        if tar:
            with tarfile.open(destination, "w:gz") as archive:
                archive.add(folder, arcname=folder_name)
        else:
            if os.path.isdir(destination):
                os.rmdir(destination)
            os.rename(folder, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "path": destination,
        "script": os.path.join(folder_name if tar else destination, "repro.py"),
        "steps": [s.call.api for s in steps],
        "tensor_bytes": size,
        "notes": notes,
    }
