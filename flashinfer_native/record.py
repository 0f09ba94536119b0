"""One level-10 record, read with bounds and decoded into a typed tree (docs/security.md).

A dump is untrusted input. Everything a consumer takes from ``metadata.jsonl`` and
``session.jsonl`` passes through here once: the bounded line reader, the JSON types and
numeric ranges of the record's fields, the grammar of its keys (``arg_{i}``,
``kwarg_{name}``, ``result_{i}``, nested ``{parent}__{i}``) and of the names it carries,
and the decoding of the recorded values (docs/dump-format.md) into :class:`Value` nodes.
``replay`` builds objects from that tree, ``repro`` renders source from it; neither
reads the JSON encoding itself, so both apply the same bounds.

Nothing here imports a module or calls anything a record names.
"""

import json
import keyword
import math
import re
import types
from dataclasses import dataclass, field

from . import _C
from .terminal import brief

__all__ = [
    "CHUNKS_DIR",
    "CHUNKS_SUFFIX",
    "COMPACT_FORMAT",
    "DIR_NAME",
    "FIELDS",
    "FORMAT",
    "METADATA_FILE",
    "NESTED_KEY",
    "PACK_SUFFIX",
    "SESSION_FILE",
    "STATUS",
    "TENSOR_SUFFIXES",
    "TOP_KEY",
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_POSITION",
    "Arguments",
    "DType",
    "Device",
    "EnumRef",
    "Mapping",
    "Opaque",
    "Plain",
    "Sequence",
    "TensorRef",
    "Value",
    "arg_key",
    "bounded_lines",
    "call_dir_name",
    "decode_inputs",
    "decode_result",
    "dict_item_keys",
    "dotted_name",
    "field_problem",
    "index_of",
    "item_key",
    "kwarg_key",
    "parse_record",
    "result_key",
    "stamp",
    "tensor_file_name",
]

# ------------------------------------------------------------------------ layout

# The writer's names, taken from the core (csrc/core/dump_format.h exports them as
# _C.DUMP_FORMAT): the file names, the call directory pattern, the argument keys and the
# writer's bounds (docs/dump-format.md). tests/test_dump_format.py holds a written dump to
# them.
FORMAT = _C.DUMP_FORMAT
METADATA_FILE = FORMAT["metadata_file"]
SESSION_FILE = FORMAT["session_file"]
_STRFTIME_DIGITS = {"%Y": 4, "%m": 2, "%d": 2, "%H": 2, "%M": 2, "%S": 2}


def _stamp_pattern(strftime_format):
    """A regex of what strftime(``strftime_format``) prints, for the numeric fields the
    stamp uses."""
    parts = re.split(r"(%[YmdHMS])", strftime_format)
    return "".join(
        rf"\d{{{_STRFTIME_DIGITS[p]}}}" if p in _STRFTIME_DIGITS else re.escape(p) for p in parts
    )


# A call directory: STAMP _pid PID _ NAME _call N (groups: stamp, pid, name).
DIR_NAME = re.compile(
    rf"^({_stamp_pattern(FORMAT['stamp_format'])}_\d{{3}})"
    rf"{re.escape(FORMAT['pid_mark'])}(\d+)_(.+)"
    rf"{re.escape(FORMAT['call_mark'])}\d{{{FORMAT['call_digits']},}}$",
    re.ASCII,
)


def _names(key):
    """A namespace whose attribute ``x`` is ``"x"`` for each name of ``FORMAT[key]``: a
    field the core does not list is an AttributeError, not a silently new key."""
    return types.SimpleNamespace(**{name: name for name in FORMAT[key]})


# The tensor files: ``tensor_format`` -> the suffix of CALL/inputs<suffix> (``.pt``,
# ``.safetensors``, and the compact layout's manifest, ``.chunks.json``), in the order a
# reader tries them when the record does not say.
TENSOR_SUFFIXES = {name: f".{ext}" for name, ext in FORMAT["tensor_extensions"].items()}
# The compact layout: a call's tensors as a manifest (``tensor_format`` COMPACT_FORMAT) of
# chunks in packs (``*PACK_SUFFIX``) under ROOT/CHUNKS_DIR/.
COMPACT_FORMAT = "chunks"
CHUNKS_SUFFIX = TENSOR_SUFFIXES[COMPACT_FORMAT]
CHUNKS_DIR = FORMAT["chunks_dir"]
PACK_SUFFIX = f".{FORMAT['pack_ext']}"

# The fields of a record (``FIELDS.function_name``), of its ``tensor_info`` and of each
# ``tensor_details`` entry, and of its ``exception``, as the core lists them.
FIELDS = _names("record_fields")
TENSOR_INFO_FIELDS = _names("tensor_info_fields")
TENSOR_DETAIL_FIELDS = _names("tensor_detail_fields")
EXCEPTION_FIELDS = _names("exception_fields")
# The values of ``execution_status`` (``STATUS.completed``).
STATUS = _names("execution_statuses")

# ------------------------------------------------------------------ writer side

# What a writer of dumps other than the core (the tests' DumpWriter) names through here,
# so that every name of a dump is the core's.


def stamp(when):
    """The STAMP of a call directory for the datetime ``when``: strftime of the core's
    format, then ``_`` and the milliseconds in 3 digits."""
    return f"{when.strftime(FORMAT['stamp_format'])}_{when.microsecond // 1000:03d}"


def call_dir_name(stamp_text, pid, name, count):
    """The directory of call ``count`` of ``name``: ``STAMP _pid PID _ NAME _call N``, with
    every character of ``name`` the core does not keep replaced by ``_``."""
    safe = "".join(c if c in FORMAT["name_chars"] else "_" for c in name)
    return (
        f"{stamp_text}{FORMAT['pid_mark']}{pid}_{safe}"
        f"{FORMAT['call_mark']}{count:0{FORMAT['call_digits']}d}"
    )


def tensor_file_name(which, tensor_format):
    """``inputs.pt``: the tensor file of ``which`` (``"inputs"`` or ``"outputs"``) in
    ``tensor_format`` (``"torch"`` or ``"safetensors"``)."""
    return f"{FORMAT[which]}.{FORMAT['tensor_extensions'][tensor_format]}"


def arg_key(i):
    """The key of positional argument ``i``."""
    return f"{FORMAT['arg_prefix']}{i}"


def kwarg_key(name):
    """The key of keyword argument ``name``."""
    return f"{FORMAT['kwarg_prefix']}{name}"


def result_key(i=None):
    """The key of the return value, or of item ``i`` of a returned tuple."""
    return FORMAT["result_key"] if i is None else f"{FORMAT['result_key']}_{i}"


def item_key(parent, i):
    """The key of item ``i`` of a list or tuple recorded under ``parent``."""
    return f"{parent}{FORMAT['nested_separator']}{i}"


def dict_item_keys(parent, i):
    """The keys of the key and of the value of item ``i`` of a dict under ``parent``."""
    sep = FORMAT["nested_separator"]
    return (
        f"{parent}{sep}{FORMAT['dict_key_mark']}{i}",
        f"{parent}{sep}{FORMAT['dict_value_mark']}{i}",
    )


# ------------------------------------------------------------------------ bounds

# A record is a few KB, a metadata file holds two lines plus one per CUDA-graph flush:
# longer lines and larger files are refused.
MAX_LINE_BYTES = 16 << 20
MAX_METADATA_BYTES = 64 << 20
# Records nest far less; the bound keeps every later walk over a record (decoding,
# printing, comparing) clear of Python's recursion limit.
MAX_DEPTH = 100
# Highest arg_{i} / result_{i} index: the list of positions is built densely.
MAX_POSITION = 4096
# Integers a record counts with (sequence, process id, sizes): non-negative int64.
MAX_COUNT = (1 << 63) - 1
# Seconds since the epoch of a trigger's ``time``: up to the end of year 9999, the
# last moment a clock can print.
MAX_EPOCH_SECONDS = 253402300799.0
MAX_DURATION_SECONDS = 1e9
# A scratch tensor (docs/dump-format.md#scratch-tensors) a reader makes afresh from its
# recorded shape: at most 2^40 bytes (the compact layout's span bound) and 64 dimensions.
MAX_SCRATCH_BYTES = 1 << 40
MAX_SCRATCH_DIMS = 64

# ----------------------------------------------------------------------- grammar

# Keys are ASCII: a Unicode digit would pass str.isdigit() and int() (arg_٣ is arg_3).
# Built from the core's prefixes (docs/dump-format.md#argument-keys).
_ARG, _KWARG = FORMAT["arg_prefix"], FORMAT["kwarg_prefix"]
_RESULT, _SEP = FORMAT["result_key"], FORMAT["nested_separator"]
_POSITION_PREFIX = {"arg": _ARG, "result": f"{_RESULT}_"}
# arg_{i} or result_{i} (groups: the prefix, i)
_INDEXED_KEY = re.compile(
    rf"({re.escape(_ARG)}|{re.escape(_RESULT)}_)([0-9]{{1,9}})",
    re.ASCII,
)
# the last level of a nested key: __{i}, __key_{i}, __value_{i}
NESTED_KEY = re.compile(
    rf"{re.escape(_SEP)}([0-9]+|{re.escape(FORMAT['dict_key_mark'])}[0-9]+"
    rf"|{re.escape(FORMAT['dict_value_mark'])}[0-9]+)$",
    re.ASCII,
)
# an input key: arg_{i} or kwarg_{name}, then nested levels (groups: the top key, i, name,
# the nested rest)
TOP_KEY = re.compile(rf"^({re.escape(_ARG)}(\d+)|{re.escape(_KWARG)}(.+?))({re.escape(_SEP)}.*)?$")
_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def dotted_name(text):
    """True for ``a.b.c`` whose every part is an ASCII identifier and no keyword.

    ASCII only: Python folds identifiers by NFKC, so a fullwidth ``ｔｏｒｃｈ`` in a
    generated script would rebind the script's own ``torch``.
    """
    if not isinstance(text, str) or not text or len(text) > 512:
        return False
    return all(_ASCII_NAME.fullmatch(p) and not keyword.iskeyword(p) for p in text.split("."))


def index_of(key, prefix):
    """i of an ``{prefix}_{i}`` key (prefix ``arg`` or ``result``), None for other keys.

    Raises
    ------
    ValueError
        The index is :data:`MAX_POSITION` or more.
    """
    match = _INDEXED_KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None or match.group(1) != _POSITION_PREFIX[prefix]:
        return None
    index = int(match.group(2))
    if index >= MAX_POSITION:
        raise ValueError(f"{key}: position {index} is beyond the {MAX_POSITION} accepted")
    return index


# ------------------------------------------------------------------- line reader


def bounded_lines(f, limit=None):
    """Yield ``(line_number, line)`` from binary file ``f``, never holding more than
    ``limit`` (default :data:`MAX_LINE_BYTES`) bytes of one line: a longer line is
    skipped and yielded as ``None``."""
    limit = MAX_LINE_BYTES if limit is None else limit
    lineno = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) <= limit or line.endswith(b"\n"):
            yield lineno, line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(1 << 20)
        yield lineno, None


def _json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def parse_record(line):
    """One JSONL line as a dict nested at most :data:`MAX_DEPTH` deep; ValueError
    describing the problem otherwise."""
    try:
        # Records are UTF-8: decoding here keeps json from guessing UTF-16/32 from the
        # bytes (and importing a codec on a dump's say-so).
        record = json.loads(line.decode("utf-8"))
    except RecursionError:
        record = None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"is not valid JSON ({exc})") from None
    if record is None or _nested_deeper_than(record, MAX_DEPTH):
        raise ValueError(f"is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(record, dict):
        raise ValueError(f"is a JSON {_json_type(record)}, expected an object")
    return record


def _nested_deeper_than(value, limit):
    """Iteratively (no recursion): whether lists/dicts in ``value`` nest beyond ``limit``."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


# ------------------------------------------------------------------ field types


def _count(value):
    """None when ``value`` is an int in [0, MAX_COUNT], else what is expected."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return None
    return "an integer in [0, 2**63)"


def _id(value):
    """process_id / self_id: a count, or a string (FlashInfer's dumps write some as text)."""
    if isinstance(value, str):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return _count(value)
    return "number or string"


def _seconds(limit):
    def check(value):
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and 0 <= value <= limit
        ):
            return None
        return f"a number of seconds in [0, {limit:g}]"

    return check


def _of_type(*types):
    names = " or ".join(dict.fromkeys(_json_type(t()) for t in types))

    def check(value):
        if isinstance(value, types) and not isinstance(value, bool):
            return None
        return names

    return check


# Record fields consumers use, with what they must hold (null counts as absent). Anything
# else in a record is carried, never interpreted.
_FIELDS = {
    "function_name": _of_type(str),
    "module": _of_type(str),
    "execution_status": _of_type(str),
    "tensor_format": _of_type(str),
    "dump_dir": _of_type(str),
    "timestamp": _of_type(str),
    "end_timestamp": _of_type(str),
    "record_type": _of_type(str),
    "trigger": _of_type(str),
    "signal": _of_type(str),
    "function_signature": _of_type(str),
    "graph_capture_base_dump_dir": _of_type(str),
    "input_metadata": _of_type(dict),
    "output_metadata": _of_type(dict),
    "tensor_info": _of_type(dict),
    "tensor_details": _of_type(dict),
    "exception": _of_type(dict),
    "versions": _of_type(dict),
    "process_id": _id,
    "self_id": _id,
    "sequence": _count,
    "call_sequence": _count,
    "calls_written": _count,
    "time": _seconds(MAX_EPOCH_SECONDS),
    "duration_s": _seconds(MAX_DURATION_SECONDS),
    "duration_us": _seconds(MAX_DURATION_SECONDS * 1e6),
    "calls_skipped": _count,
    "reason": _of_type(str),
}
_KEY_LISTS = ("input_tensor_keys", "output_tensor_keys")
_SIZES = ("input_size_bytes", "output_size_bytes", "total_size_bytes")


def field_problem(record):
    """The first field of ``record`` whose value no consumer may use, described; or None.

    Names the field, the value seen (shortened) and what is accepted: a non-finite or
    huge number, a string where an object belongs, a key list that is not strings.
    """
    for name, check in _FIELDS.items():
        value = record.get(name)
        if value is None:
            continue
        expected = check(value)
        if expected:
            return f"field {name!r} is {_shown(value)}, expected {expected}"
    info = record.get("tensor_info") or {}
    for name in _KEY_LISTS:
        keys = info.get(name)
        if keys is not None and (
            not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)
        ):
            return f"field 'tensor_info.{name}' is not a JSON array of strings"
    for name in _SIZES:
        value = info.get(name)
        if value is not None and _count(value):
            return f"field 'tensor_info.{name}' is {_shown(value)}, expected {_count(value)}"
    return None


def _shown(value):
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    return f"a JSON {_json_type(value)} ({brief(value, 40)})"


# ---------------------------------------------------------------- the value tree


class Value:
    """A recorded value, decoded: one of the node classes below."""


@dataclass
class Plain(Value):
    """JSON data passed as it is: null, booleans, numbers (NaN and infinities too: they
    are data here), strings, and objects without a ``type`` key."""

    value: object


@dataclass
class TensorRef(Value):
    """A tensor of the call's inputs/outputs file, by key (as recorded: a key that is no
    string names no tensor, which the consumer reports)."""

    key: object


@dataclass
class DType(Value):
    """A ``torch.dtype`` as its recorded text (``torch.bfloat16``); checked against
    torch's own dtypes where it is built."""

    text: str

    @property
    def name(self):
        """The dtype's name without ``torch.`` (``bfloat16``)."""
        return self.text.rpartition(".")[2]


@dataclass
class Device(Value):
    """A ``torch.device`` as its text (``cuda:0``)."""

    text: str


@dataclass
class EnumRef(Value):
    """A member of an ``enum.Enum`` class named ``module.Qualname`` (resolved only through
    the allow-list, ``registry.resolve_enum``, which refuses a class path that is no
    dotted ASCII name)."""

    class_path: object
    member: str
    value: object


@dataclass
class Sequence(Value):
    """A list or tuple (``kind``) of values; ``truncated`` when the recorder cut it."""

    kind: str
    items: list
    truncated: bool = False


@dataclass
class Mapping(Value):
    """A dict as ``(key, value)`` pairs of values."""

    items: list


@dataclass
class Opaque(Value):
    """An object recorded only as its type name and repr (the ``self`` placeholder of a
    method, an object of no JSON form); ``raw`` is the encoding as read."""

    type_name: str
    repr: str
    raw: dict


class _Decoder:
    def __init__(self, where):
        self.where = where

    def error(self, path, problem):
        return ValueError(f"{self.where}: {path}: {problem}")

    def items(self, enc, path):
        items = enc.get("items", [])
        if not isinstance(items, list):
            raise self.error(path, f"'items' is a JSON {type(items).__name__}, expected a list")
        return items

    def decode(self, enc, path):
        if isinstance(enc, list):
            return Sequence("list", [self.decode(v, f"{path}[{i}]") for i, v in enumerate(enc)])
        if not isinstance(enc, dict) or "type" not in enc:
            return Plain(enc)
        kind = enc["type"]
        if kind == "torch.Tensor":
            return TensorRef(enc.get("tensor_key", path))
        if kind == "torch.dtype":
            return DType(str(enc.get("value")))
        if kind == "torch.device":
            text = enc.get("value")
            if not isinstance(text, str):
                raise self.error(path, f"torch.device value {text!r} is not a string")
            return Device(text)
        if kind == "enum":
            member = enc.get("name", "")
            member = member.rpartition(".")[2] if isinstance(member, str) else ""
            return EnumRef(enc.get("class"), member, enc.get("value"))
        if kind in ("list", "tuple"):
            items = self.items(enc, path)
            decoded = [self.decode(v, f"{path}[{i}]") for i, v in enumerate(items)]
            return Sequence(kind, decoded, bool(enc.get("truncated")))
        if kind == "dict":
            pairs = []
            for i, item in enumerate(self.items(enc, path)):
                if not isinstance(item, dict) or "key" not in item or "value" not in item:
                    raise self.error(f"{path}[{i}]", "dict item is not a {key, value} object")
                pairs.append(
                    (
                        self.decode(item["key"], f"{path}[{i}].key"),
                        self.decode(item["value"], f"{path}[{i}].value"),
                    )
                )
            return Mapping(pairs)
        return Opaque(str(kind), str(enc.get("repr", kind)), enc)


# ------------------------------------------------------------------- arguments


@dataclass
class Arguments:
    """A call's inputs: ``positional[i]`` is ``(key, Value)`` or None for a position the
    record skips; ``keywords`` is ``[(name, key, Value)]`` in record order."""

    positional: list = field(default_factory=list)
    keywords: list = field(default_factory=list)


def _with_tensors(metadata, tensor_keys):
    """``metadata`` with each top-level tensor key of the tensor file as a TensorRef
    encoding (a tensor file's key wins over a metadata entry of the same name)."""
    encoded = dict(metadata)
    for key in tensor_keys:
        if not NESTED_KEY.search(key):
            encoded[key] = {"type": "torch.Tensor", "tensor_key": key}
    return encoded


def decode_inputs(metadata, tensor_keys, where):
    """Decode ``input_metadata`` plus the inputs file's keys into :class:`Arguments`.

    Parameters
    ----------
    metadata : dict
        The record's ``input_metadata``.
    tensor_keys : iterable of str
        Keys of the inputs file (workspaces a reproducer makes afresh included).
    where : str
        The metadata file, for messages.

    Raises
    ------
    ValueError
        A position of :data:`MAX_POSITION` or more, or a value whose encoding is broken;
        the message names the key.
    """
    decoder = _Decoder(where)
    positional, keywords = {}, []
    for key, enc in _with_tensors(metadata, tensor_keys).items():
        try:
            index = index_of(key, "arg")
        except ValueError as exc:
            raise decoder.error("input_metadata", exc) from None
        if index is not None:
            positional[index] = (key, decoder.decode(enc, key))
        elif key.startswith(_KWARG):
            keywords.append((key[len(_KWARG) :], key, decoder.decode(enc, key)))
    count = max(positional) + 1 if positional else 0
    return Arguments([positional.get(i) for i in range(count)], keywords)


def decode_result(metadata, tensor_keys, where):
    """The recorded return value from ``output_metadata`` and the outputs file's keys:
    a Value, or None when the record holds none. A returned tuple is recorded as
    ``{"type": "tuple", "length": n}`` plus ``result_{i}`` keys."""
    decoder = _Decoder(where)
    tensor_keys = set(tensor_keys)
    if _RESULT in tensor_keys:
        return TensorRef(_RESULT)
    marker = metadata.get(_RESULT)
    if _RESULT in metadata and not (
        isinstance(marker, dict) and "length" in marker and "items" not in marker
    ):
        return decoder.decode(marker, _RESULT)
    items = {}
    for key, enc in _with_tensors(metadata, tensor_keys).items():
        try:
            index = index_of(key, "result")
        except ValueError as exc:
            raise decoder.error("output_metadata", exc) from None
        if index is not None:
            items[index] = decoder.decode(enc, key)
    if not items:
        return None
    return Sequence("tuple", [items.get(i, Plain(None)) for i in range(max(items) + 1)])
