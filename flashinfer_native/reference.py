"""Recorded calls checked against their trace template's reference (docs/replay.md).

``flashinfer replay --against reference`` needs no kernel of the recorded API: for each
recorded call of a traced API it runs the plain-torch ``reference`` of the API's
``TraceTemplate`` on the recorded inputs, on any device, and compares the recorded
outputs with it by the template's ``check``.

How a call is checked:

1. the dump is read by replay's reader (bounded records, the C tensor readers, enums
   only from allowed modules) and the API is resolved by replay's gate
   (:func:`registry.resolve_call`: registered ``@flashinfer_api`` objects of allowed
   modules, never anything else a dump names);
2. the template is looked up in the installed package's fi_trace registry
   (``flashinfer.api_logging._TRACE_REGISTRY``: FlashInfer's, or the mirror's) by the
   registered API's own module and qualified name, never by a string from the dump;
3. the recorded arguments are bound to the API's signature; a wrapper method also gets
   what its object's recorded ``__init__`` and ``plan`` were given (replay order shares
   one :class:`SessionState`), then mapped to the template's inputs;
4. the reference runs on the chosen device and the template's check judges the recorded
   outputs; random outputs (sampling) are judged by the template's own check where it
   has one, else by properties (:func:`_sampling_property`).

Each call gets ``match``, ``mismatch`` (naming the tensor, with max abs/rel error and
the first differing index) or ``no_reference`` (with the reason).
"""

import inspect
import math
import sys

import torch

from . import jit_args, registry
from .terminal import brief

__all__ = [
    "MATCH",
    "MISMATCH",
    "NOT_GIVEN",
    "NO_REFERENCE",
    "CallArguments",
    "NoReference",
    "SessionState",
    "api_of",
    "api_templates",
    "bind_arguments",
    "check_call",
    "classify",
    "difference",
    "input_value",
    "pick_template",
    "reference_arguments",
    "template_name",
]

MATCH = "match"
MISMATCH = "mismatch"
NO_REFERENCE = "no_reference"

# Wrappers take some of the template's inputs in plan(), under their own names.
_PLAN_ALIASES = {
    "kv_indptr": ("indptr", "paged_kv_indptr"),
    "kv_indices": ("indices", "paged_kv_indices"),
    "kv_last_page_len": ("last_page_len", "paged_kv_last_page_len"),
}
# Axes that precede num_kv_heads in the NHD layout the references assume.
_TOKEN_AXES = ("page_size", "kv_len", "total_kv", "num_tokens", "seq_len")
NOT_GIVEN = object()


class NoReference(Exception):
    """This call cannot be checked against a reference here; the message says why."""


# ------------------------------------------------------------------- templates


def _registry_lists():
    """(entries, dispatchers) of the installed package's fi_trace registry, read from the
    module's ``__dict__`` (no attribute hooks run)."""
    module = sys.modules.get(f"{registry.PACKAGE}.api_logging")
    namespace = vars(module) if module is not None else {}
    entries = namespace.get("_TRACE_REGISTRY")
    dispatchers = namespace.get("_TRACE_DISPATCHERS")
    return (
        entries if isinstance(entries, list) else [],
        dispatchers if isinstance(dispatchers, dict) else {},
    )


def _key(function):
    return getattr(function, "__module__", None), getattr(function, "__qualname__", None)


def api_templates(key):
    """``(templates, dispatcher)`` registered for the API ``key`` = (module, qualname).

    ``templates`` lists every TraceTemplate attached to the API (a dispatching API lists
    each it can pick); ``dispatcher`` is FlashInfer's per-call selector or None.
    """
    entries, dispatchers = _registry_lists()
    templates = []
    for entry in entries:
        if isinstance(entry, tuple) and len(entry) == 3 and _key(entry[0]) == key:
            if all(entry[1] is not t for t in templates):
                templates.append(entry[1])
    dispatcher = next((d for f, d in dispatchers.items() if _key(f) == key), None)
    return templates, dispatcher


def template_name(template):
    """A template's label: its ``name_prefix``, else its ``op_type``."""
    return getattr(template, "name_prefix", None) or getattr(template, "op_type", "?")


def is_standard_check(check):
    return getattr(check, "__name__", "") in ("standard_check", "default_check")


def pick_template(key, params, configures=False):
    """The template for a call; a wrapper's ``__init__``/``plan`` without one of its own
    only configures the object."""
    templates, dispatcher = api_templates(key)
    if configures and not any(getattr(t, "reference", None) for t in templates):
        raise NoReference(
            f"{key[1].rpartition('.')[2]}() configures the object; its arguments are used to "
            "check the object's later calls"
        )
    if dispatcher is not None:
        try:
            chosen = dispatcher(save_dir=None, name=None, **params)
        except Exception as exc:  # noqa: BLE001 - FlashInfer's selector may reject the call
            raise NoReference(
                f"the template selector of {key[1]} rejected the call "
                f"({type(exc).__name__}: {first_line(exc)})"
            ) from None
        if chosen is None:
            raise NoReference(f"the template selector of {key[1]} has no template for this call")
        return chosen
    if not templates:
        raise NoReference(f"{key[0]}.{key[1]} has no trace template")
    with_reference = [t for t in templates if getattr(t, "reference", None) is not None]
    return (with_reference or templates)[0]


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------ arguments


class SessionState:
    """What replay order carries from call to call: the arguments each wrapper object's
    ``__init__`` and latest ``plan`` were given, keyed by ``(process_id, self_id)``."""

    def __init__(self, objects=None):
        self.objects = {} if objects is None else objects

    def object_arguments(self, record):
        """``[(explicit, defaults)]`` of the object's plan and __init__, plan first."""
        calls = self.objects.get((record.get("process_id"), record.get("self_id")), {})
        return [calls[m] for m in ("plan", "__init__") if m in calls]

    def remember(self, record, method, explicit, defaults):
        key = (record.get("process_id"), record.get("self_id"))
        if method == "__init__":
            self.objects[key] = {}
        self.objects.setdefault(key, {})[method] = (explicit, defaults)


def bind_arguments(api, args, kwargs, where):
    """(explicit, defaults): the recorded arguments by parameter name, and the defaults of
    the parameters not passed; a ``**kwargs`` parameter's items count as parameters."""
    try:
        signature = inspect.signature(api)
    except (TypeError, ValueError) as exc:
        raise NoReference(f"the API's signature cannot be read ({exc})") from None
    try:
        # partial: a missing argument matters only if the reference needs it, and then
        # the message names it
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as exc:
        raise NoReference(
            f"{where}: the recorded arguments do not fit {signature} ({exc})"
        ) from None
    explicit = dict(bound.arguments)
    defaults = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            nested = explicit.pop(name, None)
            if isinstance(nested, dict):
                explicit.update({k: v for k, v in nested.items() if isinstance(k, str)})
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            explicit.pop(name, None)
        elif name not in explicit and parameter.default is not inspect.Parameter.empty:
            defaults[name] = parameter.default
    explicit.pop("self", None)
    return explicit, defaults


class CallArguments:
    """A call's arguments by name: those it was given, then those its object's ``plan``
    and ``__init__`` were given, then the defaults of each in the same order."""

    def __init__(self, explicit, defaults, object_calls):
        self.layers = [explicit] + [c[0] for c in object_calls]
        self.layers += [defaults] + [c[1] for c in object_calls]
        self.from_object = bool(object_calls)

    def get(self, name):
        for layer in self.layers:
            if name in layer:
                return layer[name]
        return NOT_GIVEN

    def flat(self):
        out = {}
        for layer in reversed(self.layers):
            out.update(layer)
        return out


def _select_part(value, tuple_idx):
    """Item ``tuple_idx`` of a (k, v) pair, or of a combined cache tensor whose dimension 1
    holds K and V ([pages, 2, ...])."""
    if isinstance(value, (tuple, list)):
        return value[tuple_idx] if len(value) > tuple_idx else None
    if isinstance(value, torch.Tensor) and value.dim() >= 4 and value.shape[1] == 2:
        return value.select(1, tuple_idx)
    return None


def _to_nhd(value, descriptor, layout):
    """An HND tensor turned to the NHD layout the references assume (a view)."""
    if layout != "HND" or not isinstance(value, torch.Tensor):
        return value
    dims = list(getattr(descriptor, "dim_names", None) or [])
    if "num_kv_heads" not in dims:
        return value
    heads = dims.index("num_kv_heads")
    if heads == 0 or dims[heads - 1] not in _TOKEN_AXES or value.dim() != len(dims):
        return value
    return value.transpose(heads - 1, heads)


def input_value(name, descriptor, arguments):
    """The value of template input ``name`` (a Tensor/Scalar descriptor or None)."""
    param = getattr(descriptor, "param", None) or name
    value = arguments.get(param)
    for alias in _PLAN_ALIASES.get(name, ()) if value is NOT_GIVEN else ():
        value = arguments.get(alias)
        if value is not NOT_GIVEN:
            break
    tuple_idx = getattr(descriptor, "tuple_idx", None)
    if value is not NOT_GIVEN and value is not None and tuple_idx is not None:
        value = _select_part(value, tuple_idx)
    layout = arguments.get("kv_layout")
    return _to_nhd(value, descriptor, layout if isinstance(layout, str) else None)


def head_dim_of(arguments, inputs):
    for name in ("head_dim", "head_dim_qk"):
        value = arguments.get(name)
        if isinstance(value, int) and value > 0:
            return value
    q = inputs.get("q")
    return q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else None


def reference_arguments(template, arguments, where_plan):
    """(args, kwargs) of the template's reference for these arguments."""
    reference = template.reference
    try:
        parameters = inspect.signature(reference).parameters
    except (TypeError, ValueError) as exc:
        raise NoReference(f"the reference's signature cannot be read ({exc})") from None
    inputs = {
        name: input_value(name, descriptor, arguments)
        for name, descriptor in (template.inputs or {}).items()
    }
    args, kwargs = [], {}
    for name, parameter in parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        value = inputs[name] if name in inputs else input_value(name, None, arguments)
        if name == "sm_scale" and value in (None, NOT_GIVEN):
            head_dim = head_dim_of(arguments, inputs)
            value = 1.0 / math.sqrt(head_dim) if head_dim else value
        if value is NOT_GIVEN:
            if parameter.default is not inspect.Parameter.empty:
                continue
            hint = (
                ""
                if arguments.from_object or not where_plan
                else "; a wrapper's plan() gives it: check the session root, which holds "
                "the object's plan call"
            )
            raise NoReference(f"the reference needs {name!r}, which the recording lacks{hint}")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[name] = value
    return args, kwargs


# -------------------------------------------------------------------- outputs


def _as_items(value):
    """A recorded or reference output as (kind, [items], keys)."""
    if value is None:
        return "none", [], None
    if isinstance(value, dict):
        return "dict", list(value.values()), list(value)
    if isinstance(value, (tuple, list)):
        return type(value).__name__, list(value), None
    return "single", [value], None


def _recorded_keys(expected):
    if isinstance(expected, torch.Tensor):
        return ["result"]
    if isinstance(expected, (tuple, list)):
        return [f"result_{i}" for i in range(len(expected))]
    return ["result"]


def _pair_outputs(template, reference_out, expected):
    """(reference structure, actual structure, names) aligned for the check.

    The reference may return optional outputs the API returned only on request (the LSE
    of attention without ``return_lse``): those are dropped from the end until both
    sides have as many items."""
    ref_kind, refs, ref_keys = _as_items(reference_out)
    _, recorded, _ = _as_items(expected)
    names = list(template.outputs or {})
    recorded_keys = _recorded_keys(expected)
    if not recorded:
        in_place = [n for n, d in (template.outputs or {}).items() if getattr(d, "param", None)]
        if in_place:
            raise NoReference(
                f"the API writes {', '.join(in_place)} in place and returned nothing: a "
                "recording holds its inputs before the call only"
            )
        raise NoReference("the call returned nothing to compare")
    if ref_kind == "none":
        raise NoReference("the reference returned nothing")
    keep = list(range(len(refs)))
    optional = [
        i for i, n in enumerate(names[: len(refs)]) if getattr(template.outputs[n], "optional", 0)
    ]
    while len(keep) > len(recorded) and optional:
        keep.remove(optional.pop())
    if len(keep) != len(recorded):
        raise NoReference(
            f"the reference returns {len(refs)} outputs, the recording {len(recorded)}"
        )
    refs = [refs[i] for i in keep]
    labels = [
        f"{names[i] if i < len(names) else f'output {i}'} ({recorded_keys[n]})"
        for n, i in enumerate(keep)
    ]
    if ref_kind == "dict":
        keys = [ref_keys[i] for i in keep]
        return dict(zip(keys, refs)), dict(zip(keys, recorded)), labels
    if ref_kind == "single":
        return refs[0], recorded[0], labels
    return tuple(refs), tuple(recorded), labels


def _items(structure):
    return _as_items(structure)[1]


def _rebuild(structure, items):
    if isinstance(structure, dict):
        return dict(zip(structure, items))
    if isinstance(structure, (tuple, list)):
        return type(structure)(items)
    return items[0]


def _tolerances(dtype):
    name = str(dtype).replace("torch.", "")
    table = {"float64": 1e-7, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
    if name in table:
        return table[name], table[name]
    if name.startswith("float8"):
        return 1e-1, 1e-1
    return 0.0, 0.0


def _index_text(flat_index, shape):
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index //= size if size else 1
    return "[" + ", ".join(map(str, reversed(index))) + "]"


def difference(label, reference, actual):
    """How ``actual`` differs from ``reference``: a dict with ``tensor``, ``max_abs``,
    ``max_rel`` and ``first_index`` (the first element outside the dtype's default
    tolerances, else the first that differs at all), or ``problem`` for a shape or
    type that does not fit."""
    out = {"tensor": label}
    if not isinstance(reference, torch.Tensor) or not isinstance(actual, torch.Tensor):
        same = type(reference) is type(actual) and bool(reference == actual)
        if not same:
            out["problem"] = f"recorded {brief(actual, 60)}, reference {brief(reference, 60)}"
        return out
    if tuple(reference.shape) != tuple(actual.shape):
        out["problem"] = f"shape {tuple(actual.shape)} != reference {tuple(reference.shape)}"
        return out
    if actual.numel() == 0:
        return out
    if actual.is_complex() or reference.is_complex():
        a, r = torch.view_as_real(actual.cdouble()), torch.view_as_real(reference.cdouble())
    else:
        a, r = actual.detach().double().cpu(), reference.detach().double().cpu()
    a, r = a.reshape(-1), r.reshape(-1)
    both_nan = torch.isnan(a) & torch.isnan(r)
    diff = (a - r).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
    rel = (diff / r.abs()).masked_fill(diff == 0, 0.0).nan_to_num(nan=math.inf)
    rtol, atol = _tolerances(actual.dtype if actual.is_floating_point() else reference.dtype)
    outside = (diff > atol + rtol * r.abs()).nonzero()
    differ = outside if outside.numel() else (diff > 0).nonzero()
    out["max_abs"] = diff.max().item()
    out["max_rel"] = rel.max().item()
    if differ.numel():
        out["first_index"] = _index_text(int(differ[0, 0]), tuple(actual.shape))
    return out


def difference_text(d):
    if "problem" in d:
        return f"{d['tensor']}: {d['problem']}"
    if "max_abs" not in d:
        return f"{d['tensor']}: equal"
    text = f"{d['tensor']}: max abs err {d['max_abs']:.6g}, max rel err {d['max_rel']:.6g}"
    if "first_index" in d:
        text += f", first differing index {d['first_index']}"
    return text


def _run_check(check, reference_out, actual, thresholds):
    try:
        return bool(check(reference_out, actual, **thresholds))
    except Exception as exc:  # noqa: BLE001 - a check that cannot judge the pair fails it
        return f"{type(exc).__name__}: {first_line(exc)}"


def _judge(template, reference_out, actual, labels, thresholds):
    """The check's verdict, with the tensors that make it fail named."""
    check = template.check
    verdict = _run_check(check, reference_out, actual, thresholds)
    refs, actuals = _items(reference_out), _items(actual)
    diffs = [difference(label, r, a) for label, r, a in zip(labels, refs, actuals)]
    if verdict is True:
        return {"status": MATCH, "differences": diffs}
    # One output at a time in the recorded value, the others at the reference's: the
    # outputs whose recorded values alone fail the check are the ones to name.
    culprits = []
    for i in range(len(refs)):
        alone = [actuals[j] if j == i else refs[j] for j in range(len(refs))]
        if _run_check(check, reference_out, _rebuild(actual, alone), thresholds) is not True:
            culprits.append(i)
    named = [diffs[i] for i in culprits] or [d for d in diffs if "max_abs" in d or "problem" in d]
    result = {"status": MISMATCH, "differences": diffs, "tensors": [d["tensor"] for d in named]}
    result["mismatches"] = [difference_text(d) for d in named] or [
        f"{getattr(check, '__name__', 'check')} failed"
    ]
    if verdict is not False:
        result["mismatches"].append(f"{getattr(check, '__name__', 'check')} raised {verdict}")
    return result


# ------------------------------------------------------------------ sampling

_SAMPLING_FILTERS = ("top_k", "top_p", "min_p")


def is_random(template):
    """Templates of sampling APIs: their outputs are draws, not values to compare."""
    return getattr(template, "op_type", None) == "sampling" and "sampling" in template_name(
        template
    )


def _per_row(value, rows, cast):
    if value is None or value is NOT_GIVEN:
        return None
    if isinstance(value, torch.Tensor):
        flat = value.reshape(-1)
        if flat.numel() == 1:
            return [cast(flat[0].item())] * rows
        if flat.numel() != rows:
            raise NoReference(f"a filter tensor of {flat.numel()} values for {rows} rows")
        return [cast(v) for v in flat.tolist()]
    return [cast(value)] * rows


def _sampling_property(template, arguments, expected):
    """The recorded tokens checked by what sampling allows: each row's token has a
    non-zero probability and passes the row's top-k, top-p and min-p under the recorded
    probabilities (softmax of the recorded logits)."""
    names = list(template.outputs or {})
    if names != ["samples"]:
        raise NoReference(
            f"random outputs ({', '.join(names)}), and {template_name(template)} has no check "
            "of its own nor a property check here"
        )
    probs = input_value("probs", (template.inputs or {}).get("probs"), arguments)
    if not isinstance(probs, torch.Tensor):
        logits = input_value("logits", (template.inputs or {}).get("logits"), arguments)
        if not isinstance(logits, torch.Tensor):
            raise NoReference("sampling call without recorded probs or logits")
        probs = torch.softmax(logits.double(), dim=-1)
    probs = probs.detach().double().cpu()
    indices = input_value("indices", None, arguments)
    if isinstance(indices, torch.Tensor):
        probs = probs[indices.long().cpu()]
    if not isinstance(expected, torch.Tensor):
        raise NoReference("the recording holds no sampled tokens")
    tokens = expected.reshape(-1).long().cpu().tolist()
    rows = probs.shape[0]
    if len(tokens) != rows:
        return {
            "status": MISMATCH,
            "tensors": ["samples (result)"],
            "mismatches": [f"samples (result): {len(tokens)} tokens for {rows} rows"],
        }
    top_k = _per_row(input_value("top_k", None, arguments), rows, int)
    top_p = _per_row(input_value("top_p", None, arguments), rows, float)
    min_p = _per_row(input_value("min_p", None, arguments), rows, float)
    used = [n for n, v in zip(_SAMPLING_FILTERS, (top_k, top_p, min_p)) if v is not None]
    problems = []
    for row, token in enumerate(tokens):
        problem = _token_problem(
            probs[row],
            token,
            top_k and top_k[row],
            top_p and top_p[row],
            min_p and min_p[row],
        )
        if problem:
            problems.append(f"samples (result): row {row}: token {token} {problem}")
    rule = "non-zero probability" + "".join(f", {n.replace('_', '-')}" for n in used)
    result = {"status": MATCH if not problems else MISMATCH, "rule": rule}
    if problems:
        result["tensors"] = ["samples (result)"]
        result["mismatches"] = problems[:5] + (
            [f"... {len(problems) - 5} more rows"] if len(problems) > 5 else []
        )
    return result


def _token_problem(p, token, top_k, top_p, min_p, slack=1e-6):
    """Why ``token`` could not have been drawn from row ``p`` (None when it could)."""
    vocab = p.numel()
    if not 0 <= token < vocab:
        return f"is outside the vocabulary of {vocab}"
    total = p.sum().item()
    chance = p[token].item()
    if not chance > 0:
        return "has probability 0"
    above = p > chance
    if top_k and 0 < top_k < vocab and int(above.sum()) >= top_k:
        return f"(p={chance:.4g}) is not among the top-{top_k}"
    if top_p is not None and top_p < 1.0:
        kept = total
        if top_k and 0 < top_k < vocab:
            kept = p.topk(top_k).values.sum().item()
        mass_above = p[above].sum().item()
        if mass_above >= top_p * kept + slack:
            return f"(p={chance:.4g}) is outside top-p {top_p:g} (mass above it {mass_above:.4g})"
    if min_p is not None and chance < min_p * p.max().item() - slack:
        return f"(p={chance:.4g}) is below min-p {min_p:g} of the largest"
    return None


# ---------------------------------------------------------------------- a call


def api_of(record, patterns, where):
    """The registered API object the record names, through replay's gate."""
    target = registry.resolve_call(
        record.get("module"), record.get("function_name"), patterns, where
    )
    if target[0] == "function":
        obj = target[1]
    else:
        _, cls, attr = target
        obj = registry.verified_method(
            cls, attr, patterns, record.get("module"), record.get("function_name"), where
        )
    api = registry.registered_api(obj, patterns)
    if api is None:
        raise registry.ReplayRefused(
            f"{where}: {record.get('function_name')!r} is not a registered API"
        )
    return api, target[0] == "class"


def check_call(
    record, args, kwargs, expected, state, where, patterns, thresholds=None, allow_jit_args=False
):
    """Check one recorded call against its template's reference.

    Parameters
    ----------
    record : dict
        The call's last metadata record.
    args, kwargs
        The recorded arguments, decoded (``args[0]`` the ``self`` placeholder of a method).
    expected
        The recorded return value, decoded (None when nothing was returned).
    state : SessionState
        Shared by the calls of one replay, in call order.
    where : str
        The metadata file, for messages.
    patterns : tuple of str
        Allowed module patterns (:func:`registry.allowed_patterns`).
    thresholds : dict, optional
        Keyword arguments for the template's check (``rtol``, ``atol``) given by the user.
    allow_jit_args : bool
        As replay's: without it, arguments that reach FlashInfer's JIT are refused
        (``jit_args``), here too, though no API runs.

    Returns
    -------
    dict
        ``status`` (``match``, ``mismatch``, ``no_reference``), ``template`` and
        ``method`` (``reference``, ``template check`` or ``property``) when one was used,
        ``reason`` for no reference; for a mismatch ``tensors`` (the outputs named) and
        ``mismatches`` (one line each); ``differences`` per output.

    Raises
    ------
    ReplayRefused, LookupError
        The gate refused what the record names or its arguments, or the package lacks
        the API.
    """
    api, is_method = api_of(record, patterns, where)
    if not allow_jit_args:
        jit_args.check_arguments(api, args, kwargs, where)
    key = _key(api)
    name = record.get("function_name") or key[1]
    attr = name.rpartition(".")[2]
    object_calls = state.object_arguments(record) if is_method else []
    try:
        explicit, defaults = bind_arguments(api, args, kwargs, where)
        arguments = CallArguments(explicit, defaults, object_calls)
        configures = is_method and attr in ("__init__", "plan")
        if configures:
            state.remember(record, attr, explicit, defaults)
        template = pick_template(key, arguments.flat(), configures)
    except NoReference as exc:
        return {"status": NO_REFERENCE, "reason": str(exc)}
    label = template_name(template)
    result = {"template": label}
    try:
        result.update(_check_with(template, record, arguments, expected, is_method, thresholds))
    except NoReference as exc:
        result.update(status=NO_REFERENCE, reason=str(exc))
    return result


def _check_with(template, record, arguments, expected, is_method, thresholds):
    status = record.get("execution_status")
    if status == "exception":
        exc_type = (record.get("exception") or {}).get("type", "an exception")
        raise NoReference(f"the recorded call raised {exc_type}: no outputs to compare")
    if record.get("outputs_skipped"):
        raise NoReference(f"outputs not recorded ({record['outputs_skipped']})")
    random = is_random(template)
    if random and is_standard_check(template.check):
        result = _sampling_property(template, arguments, expected)
        result["method"] = "property"
        return result
    if getattr(template, "reference", None) is None:
        raise NoReference(f"template {template_name(template)} has no reference")
    args, kwargs = reference_arguments(template, arguments, is_method)
    try:
        with torch.no_grad():
            reference_out = template.reference(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the reference runs on recorded inputs
        raise NoReference(
            f"the reference of {template_name(template)} failed on these inputs "
            f"({type(exc).__name__}: {first_line(exc)})"
        ) from None
    reference_out, actual, labels = _pair_outputs(template, reference_out, expected)
    accepted = _accepted_thresholds(template.check, thresholds)
    result = _judge(template, reference_out, actual, labels, accepted)
    result["method"] = "template check" if random else "reference"
    return result


def _accepted_thresholds(check, thresholds):
    if not thresholds:
        return {}
    try:
        parameters = inspect.signature(check).parameters
    except (TypeError, ValueError):
        return {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    accepted = {k: v for k, v in thresholds.items() if takes_any or k in parameters}
    if accepted and "min_cos_sim" in parameters:
        accepted.setdefault("min_cos_sim", None)  # explicit tolerances replace the cosine
    return accepted


def classify(result):
    """``match``, ``mismatch``, ``no_reference``, ``error``, ``incomplete`` or ``skipped``
    (a metadata-only dump: nothing to check)."""
    if "error" in result:
        return "error"
    if result.get("incomplete"):
        return "incomplete"
    if result.get("skipped"):
        return "skipped"
    return result["reference"]["status"]
