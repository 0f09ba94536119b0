"""How each recorded API of a session can be checked here (``flashinfer dumps --coverage``,
docs/replay.md): by the mirror's kernel (replay), by its trace template's reference
(``replay --against reference``), by a property of its random outputs, or not at all,
and why. It reads the dumps and resolves their APIs through replay's gate; nothing runs.
"""

import importlib.util
import sys
from collections import Counter

from . import registry
from .calls import load_session
from .dumpdir import METADATA_FILE
from .reference import api_templates, is_random, is_standard_check, template_name

__all__ = ["session_coverage"]


def _returns_nothing(record):
    info = record.get("tensor_info") or {}
    outputs = record.get("output_metadata") or {}
    return not info.get("output_tensor_keys") and outputs.get("result") is None


def _ways(record, patterns, where, mirror):
    """The ways one recorded API can be checked here, as a list of strings."""
    module, name = record.get("module"), record.get("function_name")
    try:
        target = registry.resolve_call(module, name, patterns, where)
    except registry.ReplayRefused as exc:
        return [f"none: refused by replay's gate ({str(exc).split(': ', 1)[-1]})"]
    except LookupError:
        return [f"none: {module}.{name} is not in the installed flashinfer"]
    obj = target[1]
    if target[0] == "class":
        obj = registry.verified_method(target[1], target[2], patterns, module, name, where)
    api = registry.registered_api(obj, patterns)
    key = (getattr(api, "__module__", None), getattr(api, "__qualname__", None))
    ways = ["mirror kernel"] if mirror else []
    templates, dispatcher = api_templates(key)
    with_reference = [t for t in templates if getattr(t, "reference", None) is not None]
    attr = str(name).rpartition(".")[2]
    if target[0] == "class" and attr in ("__init__", "plan") and not with_reference:
        why = f"{attr}() configures the object (its run calls are checked)"
    elif not templates and dispatcher is None:
        why = "no trace template"
    elif any(is_random(t) and is_standard_check(t.check) for t in templates):
        ways.append("property")
        why = None
    elif not with_reference and dispatcher is None:
        why = f"template {template_name(templates[0])} has no reference"
    elif record.get("execution_status") == "completed" and _returns_nothing(record):
        why = "returns nothing (writes its outputs in place; a recording holds the inputs)"
    else:
        ways.append("reference")
        why = None
    if why and not ways:
        return [f"none: {why}"]
    return ways


def session_coverage(root, allow_modules=None):
    """Per recorded API of the session ``root`` (a dump root or one call's directory, read
    by ``calls.load_session``): its call count and the ways it can be checked here.
    ``NoDumpError`` (a ValueError) when it holds no dump.

    Returns
    -------
    dict
        ``apis``: list of ``{"api", "calls", "checked_by"}`` in first-call order;
        ``totals``: calls per way (``mirror kernel``, ``reference``, ``property``,
        ``none``); ``flashinfer``: the installed package's version and kind.
    """
    registry.import_allowed(allow_modules)
    patterns = registry.allowed_patterns(allow_modules)
    mirror = importlib.util.find_spec(f"{registry.PACKAGE}._kernels") is not None
    seen, counts = {}, Counter()
    for call in load_session(root, session_file=False):
        record = call.record or {}
        api = f"{record.get('module')}.{record.get('function_name')}"
        counts[api] += 1
        if api not in seen:
            where = f"{call.path}/{METADATA_FILE}"
            seen[api] = (record.get("function_name") or "?", _ways(record, patterns, where, mirror))
    totals = Counter()
    apis = []
    for api, (name, ways) in seen.items():
        apis.append(
            {"api": name, "module": api[: -len(name) - 1], "calls": counts[api], "checked_by": ways}
        )
        for way in ways:
            totals["none" if way.startswith("none") else way] += counts[api]
    package = sys.modules.get(registry.PACKAGE)
    return {
        "flashinfer": getattr(package, "__version__", None),
        "mirror": mirror,
        "apis": apis,
        "totals": dict(totals),
    }
