"""Imports every FlashInfer module holding a decoration and describes what it decorated.

Prints one JSON document: the decorations found by scanning the installed sources
(module and class level, where importing the module runs them), how many native wrappers
exist, and per decorated API what a user sees of it (type, signature, fi_trace, fi_init,
is_backend_supported, the innermost __wrapped__).
"""

import ast
import gc
import importlib
import inspect
import json
import os
import sys

import flashinfer

ROOT = os.path.dirname(flashinfer.__file__)
DECORATORS = {"flashinfer_api", "flashinfer_experimental_api"}


def decorator_name(node):
    node = node.func if isinstance(node, ast.Call) else node
    return getattr(node, "id", None) or getattr(node, "attr", None)


def scan(tree):
    """(qualname, decorator) of decorated defs at module or class level."""
    found = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    if decorator_name(d) in DECORATORS:
                        found.append((prefix + node.name, decorator_name(d)))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", []), prefix)

    visit(tree.body, "")
    return found


def innermost(obj):
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"


def describe(obj):
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError) as exc:
        signature = f"<{type(exc).__name__}>"
    return {
        "type": type(obj).__name__,
        "signature": signature,
        "fi_trace": callable(getattr(obj, "fi_trace", None)),
        "fi_init": callable(getattr(obj, "fi_init", None)),
        "is_backend_supported": callable(getattr(obj, "is_backend_supported", None)),
        "innermost": innermost(obj),
        "chain_has_native": chain_has_native(obj),
    }


def chain_has_native(obj):
    while obj is not None:
        if type(obj).__name__ == "APIWrapper":
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False


scanned, failed, apis = [], [], {}
for dirpath, _, files in os.walk(ROOT):
    for file in sorted(files):
        if not file.endswith(".py"):
            continue
        path = os.path.join(dirpath, file)
        with open(path, encoding="utf-8") as f:
            decorated = scan(ast.parse(f.read()))
        if not decorated:
            continue
        name = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
        name = name[: -len(".__init__")] if name.endswith(".__init__") else name
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # optional dependencies (triton, quack) are absent here
            failed.append(f"{name}: {type(exc).__name__}")
            continue
        for qualname, decorator in decorated:
            scanned.append(decorator)
            owner, _, attr = qualname.rpartition(".")
            holder = module
            for part in owner.split(".") if owner else []:
                holder = getattr(holder, part, None)
            raw = None if holder is None else vars(holder).get(attr)
            if isinstance(raw, staticmethod):
                raw = raw.__func__
            if raw is not None:
                apis[f"{name}:{qualname}"] = dict(describe(raw), decorator=decorator)

wrapper_type = None
if "flashinfer_native._C" in sys.modules:
    wrapper_type = sys.modules["flashinfer_native._C"].APIWrapper
native_objects = sum(1 for o in gc.get_objects() if wrapper_type and type(o) is wrapper_type)
print(
    json.dumps(
        {
            "scanned_flashinfer_api": scanned.count("flashinfer_api"),
            "scanned_experimental": scanned.count("flashinfer_experimental_api"),
            "failed_modules": failed,
            "native_wrappers": native_objects,
            # the core itself: without the switch the start-up hook imports only its
            # lightweight flashinfer_native.hook, to lend api_logging load_tensors
            "native_imported": "flashinfer_native._C" in sys.modules,
            "apis": apis,
        }
    )
)
