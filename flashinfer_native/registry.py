"""The replay allow-list: what a dump may make replay call (docs/security.md).

A dump is untrusted input. Its ``module``, ``function_name`` and enum ``class`` fields
are names, and replay turns names into objects only through this module:

- ``@flashinfer_api`` registers every object it decorates, at every level (0 too), keyed
  by ``(obj.__module__, obj.__qualname__)``. Only registered objects are ever called.
- A registered object is used only when its module is allowed: ``flashinfer`` and its
  submodules by default (this repository's mirror, or FlashInfer's own package when the
  native core serves it), plus the patterns the user passes (``allow_modules=[...]``,
  ``flashinfer replay --allow-module PATTERN``).
- Names are looked up in ``sys.modules`` and in module and class ``__dict__`` s, so no
  ``__getattr__`` runs and nothing is imported because a dump names it. Replay imports
  only the modules that the allow patterns themselves name (:func:`import_allowed`).

Anything refused raises :class:`ReplayRefused` with a one-line message naming the field,
its value and how to allow it.
"""

import enum
import fnmatch
import importlib
import importlib.machinery
import sys

from .record import dotted_name

__all__ = [
    "DEFAULT_ALLOWED",
    "ReplayRefused",
    "allowed_patterns",
    "check_names",
    "home_of",
    "enum_member",
    "import_allowed",
    "locate_enum",
    "module_allowed",
    "register",
    "registered_api",
    "resolve_call",
    "resolve_enum",
    "verified_method",
]

# FlashInfer's package name: this repository's mirror, or FlashInfer's own when the
# native core serves it. Allowed by default.
PACKAGE = "flashinfer"
DEFAULT_ALLOWED = (PACKAGE,)
_WILDCARDS = frozenset("*?[")
_MAX_WRAPPED = 16  # how many __wrapped__ links are followed from a found object

_registered = {}  # (module, qualname) -> the decorated object its module holds


class ReplayRefused(ValueError):
    """Replay refused to call or rebuild something a dump names; the message says how to
    allow it."""


def register(original, decorated):
    """Record that ``decorated`` is the ``@flashinfer_api`` object for ``original``.

    Called by the decorator at decoration time. The key is ``(original.__module__,
    original.__qualname__)``; a later decoration under the same key (a re-imported
    module) replaces the earlier one, as the module attribute would.
    """
    module = getattr(original, "__module__", None)
    qualname = getattr(original, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        _registered[(module, qualname)] = decorated


def _is_registered(obj):
    """True when ``obj`` is the object registered under its own module and qualname."""
    try:
        key = (obj.__module__, obj.__qualname__)
        return _registered.get(key) is obj
    except (AttributeError, TypeError):  # no such attributes, or unhashable ones
        return False


# ---------------------------------------------------------------------- patterns


def allowed_patterns(allow_modules=None):
    """The module patterns replay accepts: ``DEFAULT_ALLOWED`` plus ``allow_modules``.

    Parameters
    ----------
    allow_modules : str or iterable of str, optional
        fnmatch patterns of module names. A pattern also allows the submodules of what
        it matches (``mypkg`` allows ``mypkg.ops``).

    Returns
    -------
    tuple of str

    Raises
    ------
    TypeError
        A pattern is not a non-empty string.
    """
    if allow_modules is None:
        extra = ()
    elif isinstance(allow_modules, str):
        extra = (allow_modules,)
    else:
        extra = tuple(allow_modules)
    for pattern in extra:
        if not isinstance(pattern, str) or not pattern.strip():
            raise TypeError(f"allow_modules: {pattern!r} is not a module name pattern")
    return DEFAULT_ALLOWED + tuple(p.strip() for p in extra)


def module_allowed(module, patterns):
    """True when module name ``module`` matches one of ``patterns`` (or is under one)."""
    if not isinstance(module, str):
        return False
    return any(
        fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*") for p in patterns
    )


def _literal_root(pattern):
    """The dotted module name a pattern starts with, up to its first wildcard component."""
    parts = []
    for part in pattern.split("."):
        if not part.isidentifier() or _WILDCARDS & set(part):
            break
        parts.append(part)
    return ".".join(parts)


def import_allowed(allow_modules=None):
    """Import the modules the allow patterns name, so that their APIs get registered.

    Only names written in the patterns are imported, never a module a dump names:
    ``mypkg.*`` imports ``mypkg``; a pattern starting with a wildcard imports nothing.
    The default ``flashinfer`` is skipped quietly when it cannot be imported.

    Parameters
    ----------
    allow_modules : str or iterable of str, optional
        The user's patterns, as given to :func:`allowed_patterns`.

    Raises
    ------
    ImportError
        A user pattern names a module that cannot be imported.
    """
    patterns = allowed_patterns(allow_modules)
    for index, pattern in enumerate(patterns):
        name = _literal_root(pattern)
        if not name or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            if index < len(DEFAULT_ALLOWED):
                continue
            raise ImportError(
                f"allowed module pattern {pattern!r}: cannot import module {name!r} "
                f"({type(exc).__name__}: {exc})"
            ) from None


# ---------------------------------------------------------------------- lookups


def _static_member(namespace, name):
    """``namespace.__dict__[name]`` without running any ``__getattr__``; None if absent."""
    try:
        return vars(namespace).get(name)
    except TypeError:  # an object without a __dict__
        return None


def _static_class_attr(cls, name):
    """(raw class-dict value, defining class) through the MRO, or (None, None)."""
    for klass in type.__getattribute__(cls, "__mro__"):
        value = _static_member(klass, name)
        if value is not None:
            return value, klass
    return None, None


def _wrapped_chain(obj):
    """``obj`` and the objects it wraps (``__wrapped__``), unwrapping static/classmethods."""
    for _ in range(_MAX_WRAPPED):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if obj is None:
            return
        yield obj
        obj = getattr(obj, "__wrapped__", None)


def registered_api(obj, patterns):
    """The registered ``@flashinfer_api`` object of an allowed module that ``obj`` is or
    wraps (through ``__wrapped__``), or None. Its ``__module__`` and ``__qualname__`` are
    the API's registered name."""
    for o in _wrapped_chain(obj):
        if _is_registered(o) and module_allowed(o.__module__, patterns):
            return o
    return None


def _registered_in_chain(obj, patterns):
    """True when ``obj`` or an object it wraps is a registered API of an allowed module."""
    return any(
        _is_registered(o) and module_allowed(o.__module__, patterns) for o in _wrapped_chain(obj)
    )


def _allow_hint(module):
    return (
        f"to allow it, pass --allow-module {module} (Python: allow_modules=[{module!r}]) "
        f"if you trust that module"
    )


_DECORATE_HINT = "to allow it, decorate it with @flashinfer_api in its module"


def _quoted(value):
    """A dump's value in a message: its repr (control characters escaped), shortened."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_names(module, name, where):
    """The record's ``module`` and ``function_name`` are dotted names of ASCII identifiers.

    ASCII only: Python folds identifiers by NFKC, so a fullwidth name could stand for
    another one in a generated script; and a name that is no identifier can be no API.

    Raises
    ------
    ReplayRefused
        Naming the field and its value.
    """
    for field, value in (("module", module), ("function_name", name)):
        if not dotted_name(value):
            raise ReplayRefused(
                f"{where}: {field} {_quoted(value)} is not a dotted name of ASCII "
                "identifiers; replay calls only @flashinfer_api functions of allowed modules"
            )


def _check_module(module, patterns, where, field="module"):
    if not module_allowed(module, patterns):
        raise ReplayRefused(
            f"{where}: {field} {module!r} is not an allowed module (allowed: "
            f"{', '.join(patterns)}); replay calls only @flashinfer_api functions of allowed "
            f"modules; {_allow_hint(module)}"
        )


def _not_registered(module, name, where):
    return ReplayRefused(
        f"{where}: function_name {name!r} of module {module!r} is not a registered "
        f"@flashinfer_api function or method; replay calls nothing else; {_DECORATE_HINT}"
    )


def _not_imported(module, name, where):
    return ReplayRefused(
        f"{where}: module {module!r} of function_name {name!r} is not imported (replay "
        f"imports only the modules that allow patterns name); {_allow_hint(module)}"
    )


def _in_package(module):
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _module_file_exists(module):
    """Whether ``module`` (a submodule of an imported package) exists on disk: found by
    path lookups only, so no package ``__init__`` runs."""
    parts = module.split(".")
    parent = sys.modules.get(parts[0])
    paths = getattr(parent, "__path__", None)
    for part in parts[1:]:
        spec = importlib.machinery.PathFinder.find_spec(part, paths) if paths else None
        if spec is None:
            return False
        paths = spec.submodule_search_locations
    return parent is not None


def _missing(module, name, where):
    """The error for a recorded name that no imported module defines."""
    if module not in sys.modules and (not _in_package(module) or _module_file_exists(module)):
        return _not_imported(module, name, where)
    if not _in_package(module):
        return _not_registered(module, name, where)
    top = sys.modules.get(PACKAGE)
    return LookupError(
        f"{where}: {module}.{name} is not implemented by the installed {PACKAGE} "
        f"({getattr(top, '__version__', 'unknown')}, {getattr(top, '__file__', '?')}): "
        "no implementation of this API on this machine"
    )


def _module_level(module, path):
    """``module.path`` read from ``__dict__`` s; for a module of FlashInfer's package that
    lacks it, the package's top-level name (its APIs are also ``flashinfer.NAME``, so a
    dump of ``flashinfer.gemm.gemm_base.mm_fp4`` replays where only ``flashinfer.gemm``
    exists). None when neither has it."""
    return home_of(module, path)[0]


def home_of(module, path):
    """``(object, name of the module that holds it)`` for ``module.path`` as
    :func:`resolve_call` finds it: in ``module``, or for FlashInfer's package in its top
    level; ``(None, None)`` when neither has it. A reproducer imports it from there."""
    for namespace in (module, PACKAGE if _in_package(module) else None):
        obj = sys.modules.get(namespace) if namespace else None
        for part in path.split(".") if obj is not None else ():
            obj = _static_member(obj, part)
            if obj is None:
                break
        if obj is not None:
            return obj, namespace
    return None, None


def _find_class(module, owner_path, name, patterns, where):
    """The class ``owner_path`` of ``module`` (or of the package's top level)."""
    owner = _module_level(module, owner_path)
    if owner is None:
        raise _missing(module, name, where)
    if not isinstance(owner, type):
        raise ReplayRefused(
            f"{where}: function_name {name!r}: {owner_path!r} of module {module!r} is not a "
            f"class; replay calls only registered @flashinfer_api methods; {_DECORATE_HINT}"
        )
    _check_module(owner.__module__, patterns, where, field=f"class {owner_path!r} of module")
    return owner


def verified_method(cls, attr, patterns, module, name, where, instance=None):
    """``cls.attr`` (bound to ``instance`` when given) after checking it is a registered API.

    The attribute is read from the class ``__dict__`` s along the MRO and bound by its own
    ``__get__``, so an instance attribute or a metaclass cannot substitute another object.

    Raises
    ------
    ReplayRefused
        ``cls`` has no such attribute, or it is not a registered ``@flashinfer_api``.
    """
    raw, _ = _static_class_attr(cls, attr)
    if raw is None or not _registered_in_chain(raw, patterns):
        raise _not_registered(module, name, where)
    bind = getattr(type(raw), "__get__", None)
    return raw if bind is None else bind(raw, instance, cls)


def resolve_call(module, name, patterns, where):
    """Turn a dump's ``module`` + ``function_name`` into what replay may call.

    Parameters
    ----------
    module, name : str
        The record's ``module`` and ``function_name`` (``func``, or ``Class.method``).
    patterns : tuple of str
        Allowed module patterns (:func:`allowed_patterns`).
    where : str
        The metadata file, for messages.

    Returns
    -------
    tuple
        ``("function", callable)``: a registered function, or the module attribute that
        wraps it (decorators over the API, such as FlashInfer's backend checks, run as an
        import-based replay would run them); ``("class", cls, attr)``: a method ``attr``
        of class ``cls`` whose attribute is registered (``__init__`` builds an object).

    Raises
    ------
    ReplayRefused
        The module is not allowed, or not imported, or the name is not a registered API.
    LookupError
        FlashInfer's package (as installed) has no such API at all.
    """
    check_names(module, name, where)
    _check_module(module, patterns, where)
    owner_path, _, attr = name.rpartition(".")
    if owner_path:
        cls = _find_class(module, owner_path, name, patterns, where)
        verified_method(cls, attr, patterns, module, name, where)
        return ("class", cls, attr)
    registered = _registered.get((module, name))
    attribute = _module_level(module, name)
    if any(obj is registered for obj in _wrapped_chain(attribute)):
        return ("function", attribute)
    if registered is not None:
        return ("function", registered)
    if attribute is None:
        raise _missing(module, name, where)
    if _registered_in_chain(attribute, patterns):
        return ("function", attribute)
    raise _not_registered(module, name, where)


def locate_enum(class_path, patterns, field):
    """The ``enum.Enum`` subclass a dump names as ``module.Qualname``, found statically,
    with where it was found: ``(cls, module name, path inside the module)``.

    The module part must be an allowed module that is already imported (for FlashInfer's
    package, its top-level name stands in, as for APIs); the class is read from
    ``__dict__`` s. Nothing is imported or called.

    Raises
    ------
    ReplayRefused
        ``class_path`` is not an enum class of an imported allowed module.
    """
    if not isinstance(class_path, str):
        raise ReplayRefused(
            f"{field}: enum 'class' {_quoted(class_path)} is not a string naming an enum class"
        )
    if not dotted_name(class_path):
        raise ReplayRefused(
            f"{field}: enum 'class' {_quoted(class_path)} is not a dotted name of ASCII "
            "identifiers naming an enum class; enums are rebuilt only from allowed modules"
        )
    parts = class_path.split(".")
    seen_allowed = False
    for split in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:split])
        if not module_allowed(module, patterns):
            continue
        seen_allowed = True
        obj, home = home_of(module, ".".join(parts[split:]))
        if isinstance(obj, type) and issubclass(obj, enum.Enum):
            if module_allowed(obj.__module__, patterns):
                return obj, home, ".".join(parts[split:])
    if not seen_allowed:
        module = class_path.rpartition(".")[0] or class_path
        raise ReplayRefused(
            f"{field}: enum class {class_path!r} is not in an allowed module (allowed: "
            f"{', '.join(patterns)}); enums are rebuilt only from allowed modules; "
            f"{_allow_hint(module)}"
        )
    raise ReplayRefused(
        f"{field}: enum class {class_path!r} is not an enum.Enum subclass of an imported "
        f"allowed module; to allow it, import its module before replaying (reading a dump "
        f"imports nothing)"
    )


def resolve_enum(class_path, patterns, field):
    """The ``enum.Enum`` subclass a dump names as ``module.Qualname`` (see
    :func:`locate_enum`)."""
    return locate_enum(class_path, patterns, field)[0]


def enum_member(cls, name, value):
    """The member of enum class ``cls`` called ``name``, else the one whose value equals
    ``value``; read from ``__members__``, None when there is none."""
    members = cls.__members__
    member = members.get(name) if isinstance(name, str) else None
    if member is not None:
        return member
    for member in members.values():
        try:
            if member.value == value:
                return member
        except Exception:  # noqa: BLE001 - an odd __eq__ of a member value is no match
            continue
    return None
